"""tparity.check end to end through the CLI (TPARITY_BIN names the build under test; ./scripts/test
sets it). Each planted slip is a copy of a correct implementation with one line changed, and each
test asserts on the component tparity names, which the code under test does not choose."""

import numpy as np
import pytest
import torch

import tparity

SMALL = {"batch": 2, "seq": 12}  # the multihead case at a size that runs in a second


def softmax(problem, dtype):
    x = problem.inputs["input"].astype(dtype)
    e = np.exp(x - x.max(axis=-1, keepdims=True))
    return e / e.sum(axis=-1, keepdims=True)


def test_a_function_passes_both_precisions():
    r = tparity.check(function=softmax, case="softmax")
    assert r.passed, r
    assert [c.name for c in r.cases] == ["softmax", "softmax/components"]


def test_a_wrong_function_fails_at_its_output():
    def wrong_axis(problem, dtype):
        x = problem.inputs["input"].astype(dtype)
        e = np.exp(x - x.max(axis=0, keepdims=True))
        return e / e.sum(axis=0, keepdims=True)
    r = tparity.check(function=wrong_axis, case="softmax")
    assert not r.passed
    assert "output" in r.failing_components
    assert any(f["leg"] == "hand64_vs_torch64" for f in r.failures)


def mha(problem, dtype, scale_by_embed=False):
    """torch.nn.MultiheadAttention (batch_first, no bias, one float mask) in numpy, components in the
    user's own layouts: q, k, v as [B, T, H, D], the scores masked with -1e9 (not -inf)."""
    c = problem.config
    H, E = c["num_heads"], c["embed_dim"]
    x = problem.inputs["query"].astype(dtype)
    w = problem.state_dict["in_proj_weight"].astype(dtype)
    B, T, _ = x.shape
    q, k, v = (x @ w[i * E:(i + 1) * E].T for i in range(3))
    q, k, v = (tparity.record(n, t.reshape(B, T, H, E // H)) for n, t in (("q", q), ("k", k), ("v", v)))
    d = E if scale_by_embed else E // H
    s = np.einsum("bthd,bshd->bhts", q, k) / np.sqrt(np.asarray(d, dtype))
    mask = problem.inputs["attn_mask"].astype(dtype)
    s = tparity.record("scores", np.where(np.isneginf(mask), np.asarray(-1e9, dtype), s + mask))
    a = np.exp(s - s.max(axis=-1, keepdims=True))
    a = tparity.record("attn_weights", a / a.sum(axis=-1, keepdims=True))
    ctx = tparity.record("context", np.einsum("bhts,bshd->bthd", a, v).reshape(B, T, E))
    out = ctx @ problem.state_dict["out_proj.weight"].astype(dtype).T
    return out, a.mean(axis=1)


def test_components_in_the_users_layouts_pass():
    r = tparity.check(function=mha, case="multihead", options=SMALL)
    assert r.passed, r
    legs = {leg for comp in r.cases[0].json["components"] for leg in comp["legs"]}
    assert "local_hand64_vs_torch64" in legs  # the second, teacher-forced pass ran


def test_the_first_wrong_op_is_named():
    r = tparity.check(function=lambda p, d: mha(p, d, scale_by_embed=True), case="multihead", options=SMALL)
    assert not r.passed
    assert r.cases[0].first_divergence == "scores"  # q, k, v right; the scale is the first wrong op


def encoder(eps=None):
    def make(c):
        return torch.nn.TransformerEncoderLayer(c["d_model"], c["nhead"], c["dim_feedforward"], dropout=0.0,
                                                batch_first=True, layer_norm_eps=eps or c["layer_norm_eps"])
    return make


def run_encoder(make, **kw):
    return tparity.check(module=make, case="block", options={"batch": 2, "seq": 6},
                         hooks={"norm1": "norm1", "sa_output": "self_attn", "ffn_hidden": "linear2:input",
                                "ffn_output": "linear2", "output": ""},
                         call=lambda m, x: m(x["src"], src_mask=x["src_mask"]), **kw)


def test_a_torch_module_with_hooks_passes():
    r = run_encoder(encoder())
    assert r.passed, r


def test_a_torch_module_with_a_wrong_eps_fails_at_norm1():
    r = run_encoder(encoder(eps=1e-3))
    assert not r.passed
    assert r.cases[0].first_divergence == "norm1"


def test_weights_that_do_not_map_are_named():
    def renamed(c):
        m = torch.nn.Sequential()
        m.add_module("attention", encoder()(c))
        return m
    r = run_encoder(renamed)
    assert not r.passed
    assert "weights: no parameter of the module is named linear1.bias" in r.stderr


def test_declining_every_case_judges_nothing():
    def declines(problem, dtype):
        raise tparity.Unsupported("no softmax here")
    with pytest.raises(tparity.UsageError, match="nothing was judged") as e:
        tparity.check(function=declines, case="softmax")
    assert e.value.skipped == [{"name": "softmax", "reason": "the program does not implement it: no softmax here"}]


def test_bad_options_are_refused_with_the_clis_line():
    with pytest.raises(tparity.UsageError, match="--seq"):
        tparity.check(function=softmax, case="softmax", options={"seq": 0})
    with pytest.raises(TypeError, match="exactly one of module= .* and function="):
        tparity.check(case="softmax")


def test_a_wrong_activation_is_named_at_the_hooked_input():
    def gelu_instead(c):
        m = encoder()(c)
        m.activation = torch.nn.functional.gelu  # relu is the case's
        return m
    r = run_encoder(gelu_instead)
    assert not r.passed
    assert r.cases[0].first_divergence == "ffn_hidden"  # linear2's input: after the activation


def test_code_slower_than_the_timeout_fails_its_case_and_the_run_goes_on():
    import time

    def slow(problem, dtype):
        if dtype == "float64":
            time.sleep(3)
        return softmax(problem, dtype)
    r = tparity.check(function=slow, case="softmax", timeout=1)
    assert not r.passed
    assert any("timed out after 1 s" in f["text"] for f in r.failures), r


def test_heads_as_many_as_positions_pass():
    # q, k, v recorded as [B, T, H, D] with T == H: the same shape as the canonical [B, H, T, D]
    r = tparity.check(function=mha, case="multihead", options={"batch": 2, "seq": 4, "heads": 4}, dtypes=["float64"])
    assert r.passed, r


def test_a_float32_constant_in_float64_code_is_a_precision_slip_and_can_be_accepted():
    third = np.float64(np.float32(1 / 3))  # a constant rounded to float32, used in float64 code

    def slipped(problem, dtype):
        x = problem.inputs["input"].astype(dtype) * np.asarray(third * 3, dtype)
        e = np.exp(x - x.max(axis=-1, keepdims=True))
        return e / e.sum(axis=-1, keepdims=True)
    r = tparity.check(function=slipped, case="softmax")
    assert not r.passed
    assert [d["kind"] for d in r.cases[0].diagnoses] == ["precision-slip"], r
    assert {f["leg"] for f in r.failures} == {"hand64_vs_torch64"}  # float32's leg passes
    assert tparity.check(function=slipped, case="softmax", accept=["precision-slip"]).passed
