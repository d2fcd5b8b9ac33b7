#!/usr/bin/python3
"""Export tparity reference fixtures (format v1) from PyTorch.

Each fixture is one JSON file fixtures/<name>.json holding the module config,
forward() flags, the state_dict, the inputs and the outputs of a
torch.nn.MultiheadAttention or torch.nn.TransformerEncoderLayer, computed in
float64 ("outputs") and in float32 ("outputs_float32").

Procedure per fixture:
  1. torch.manual_seed(seed); build the module in float32 with dropout=0.0, .eval().
  2. Keep torch's init for weight matrices; optionally zero some biases
     ("torch init") or overwrite every bias / bias_k / bias_v / LayerNorm
     affine parameter with random float32 values ("randomized").
  3. Draw float32 inputs and masks.
  4. Run the float32 module; run copy.deepcopy(module).double() on the inputs
     cast to float64 (bool masks stay bool). Since everything started as
     float32, both runs see exactly the same values.
Autograd stays enabled, so PyTorch takes the documented Python path
(F.multi_head_attention_forward) and not the fused fast path; the script
additionally guards the fast-path entry points and fails if they are hit.

Requires the Debian PyTorch (torch 1.13): run with /usr/bin/python3.

Usage:
  scripts/export_fixtures.py [--out DIR] [--only NAME ...]
"""

import argparse
import contextlib
import copy
import json
import math
import os
import sys

import torch
import torch.nn as nn

FORMAT = "tparity.fixture"
VERSION = 1
REL_TOL = 1e-4  # loose float32-vs-float64 agreement check

SCRIPT_DIR = os.path.dirname(os.path.abspath(__file__))
DEFAULT_OUT = os.path.join(os.path.dirname(SCRIPT_DIR), "fixtures")


# ---------------------------------------------------------------------------
# Input / mask helpers (all draw from torch's global RNG, seeded per fixture)
# ---------------------------------------------------------------------------

def causal_mask(L, S):
    """Float mask: -inf above the diagonal, 0 elsewhere."""
    return torch.triu(-float("inf") * torch.ones(L, S), 1)


def random_bool_mask(L, S, p=0.25):
    """~p True (True = masked out); column 0 always False so every row keeps a key."""
    m = torch.rand(L, S) < p
    m[:, 0] = False
    return m


def padding_mask(S, pad_counts):
    """Bool (B, S) mask masking the last pad_counts[b] keys of batch element b."""
    m = torch.zeros(len(pad_counts), S, dtype=torch.bool)
    for b, k in enumerate(pad_counts):
        assert 0 <= k < S, "at least one key must stay unmasked"
        if k:
            m[b, S - k:] = True
    return m


def uniform(shape, lo, hi):
    return torch.rand(shape) * (hi - lo) + lo


# ---------------------------------------------------------------------------
# Module construction
# ---------------------------------------------------------------------------

def mha_config(embed_dim, num_heads, bias=True, add_bias_kv=False, add_zero_attn=False,
               kdim=None, vdim=None, batch_first=False):
    return {
        "embed_dim": embed_dim,
        "num_heads": num_heads,
        "bias": bias,
        "add_bias_kv": add_bias_kv,
        "add_zero_attn": add_zero_attn,
        "kdim": embed_dim if kdim is None else kdim,
        "vdim": embed_dim if vdim is None else vdim,
        "batch_first": batch_first,
    }


def enc_config(d_model, nhead, dim_feedforward=2048, activation="relu", layer_norm_eps=1e-5,
               batch_first=False, norm_first=False):
    return {
        "d_model": d_model,
        "nhead": nhead,
        "dim_feedforward": dim_feedforward,
        "activation": activation,
        "layer_norm_eps": layer_norm_eps,
        "batch_first": batch_first,
        "norm_first": norm_first,
    }


def build_module(module_name, config):
    if module_name == "MultiheadAttention":
        m = nn.MultiheadAttention(dropout=0.0, **config)
    elif module_name == "TransformerEncoderLayer":
        m = nn.TransformerEncoderLayer(dropout=0.0, **config)
    else:
        raise ValueError(module_name)
    return m.eval()


def randomize_affine(module):
    """Overwrite every bias, bias_k/bias_v and LayerNorm weight/bias with random
    float32 values (weight matrices keep torch's init)."""
    with torch.no_grad():
        for _, sub in module.named_modules():
            if isinstance(sub, nn.LayerNorm):
                sub.weight.copy_(1.0 + uniform(sub.weight.shape, -0.2, 0.2))
                sub.bias.copy_(uniform(sub.bias.shape, -0.2, 0.2))
                continue
            for pname, p in sub.named_parameters(recurse=False):
                if pname.endswith("bias") or pname in ("bias_k", "bias_v"):
                    p.copy_(uniform(p.shape, -0.2, 0.2))


def zero_params(module, names):
    params = dict(module.named_parameters())
    with torch.no_grad():
        for n in names:
            params[n].zero_()


# ---------------------------------------------------------------------------
# Fast-path guard
# ---------------------------------------------------------------------------

class FastPathTaken(RuntimeError):
    pass


@contextlib.contextmanager
def forbid_fast_path():
    """Replace torch's fused fast-path entry points (looked up as attributes of
    the torch module at call time by MultiheadAttention.forward and
    TransformerEncoderLayer.forward in 1.13) by functions that raise."""
    names = ["_native_multi_head_attention", "_transformer_encoder_layer_fwd"]
    saved = {n: getattr(torch, n) for n in names if hasattr(torch, n)}

    def make(n):
        def trap(*args, **kwargs):
            raise FastPathTaken(f"torch.{n} fast path was taken")
        return trap

    try:
        for n in saved:
            setattr(torch, n, make(n))
        yield
    finally:
        for n, f in saved.items():
            setattr(torch, n, f)


def self_test_fast_path_guard():
    """Make sure the guard is meaningful: under no_grad, a fast-path-eligible
    MHA / encoder layer must trip it."""
    torch.manual_seed(0)
    mha = nn.MultiheadAttention(8, 2, dropout=0.0, batch_first=True).eval()
    enc = nn.TransformerEncoderLayer(8, 2, dim_feedforward=16, dropout=0.0,
                                     batch_first=True).eval()
    x = torch.randn(2, 3, 8)
    for mod, call in ((mha, lambda: mha(x, x, x)), (enc, lambda: enc(x))):
        tripped = False
        with forbid_fast_path(), torch.no_grad():
            try:
                call()
            except FastPathTaken:
                tripped = True
        if not tripped:
            raise AssertionError(
                f"fast-path guard self-test: {type(mod).__name__} did not take the fast path "
                "under no_grad; the guard may not be effective with this torch version")


# ---------------------------------------------------------------------------
# Fixture definitions
# ---------------------------------------------------------------------------
# Each builder is called right after torch.manual_seed(seed) and returns
# (config, module32, forward_kwargs, inputs32) with inputs in the module's Python
# argument order.

def _mha(config, affine="torch", zero=()):
    m = build_module("MultiheadAttention", config)
    if zero:
        zero_params(m, zero)
    if affine == "randomized":
        randomize_affine(m)
    return m


def _enc(config, affine="torch", zero=()):
    m = build_module("TransformerEncoderLayer", config)
    if zero:
        zero_params(m, zero)
    if affine == "randomized":
        randomize_affine(m)
    return m


def fx_mha_single():
    cfg = mha_config(64, 1, bias=False, batch_first=True)
    fwd = {"need_weights": True, "average_attn_weights": True}
    m = _mha(cfg)
    x = torch.randn(100, 64)
    return cfg, m, fwd, {"query": x, "key": x, "value": x, "attn_mask": causal_mask(100, 100)}


def fx_mha_batched():
    cfg = mha_config(64, 1, bias=False, batch_first=True)
    fwd = {"need_weights": True, "average_attn_weights": True}
    m = _mha(cfg)
    x = torch.randn(2, 100, 64)
    return cfg, m, fwd, {"query": x, "key": x, "value": x, "attn_mask": causal_mask(100, 100)}


def fx_mha_multihead():
    cfg = mha_config(64, 4, bias=False, batch_first=True)
    fwd = {"need_weights": True, "average_attn_weights": True}
    m = _mha(cfg)
    x = torch.randn(2, 100, 64)
    return cfg, m, fwd, {"query": x, "key": x, "value": x, "attn_mask": causal_mask(100, 100)}


def fx_encoder_block():
    cfg = enc_config(64, 4, dim_feedforward=128, batch_first=True)
    m = _enc(cfg, zero=("linear1.bias", "linear2.bias"))
    src = torch.randn(2, 100, 64)
    return cfg, m, {}, {"src": src, "src_mask": causal_mask(100, 100)}


def fx_mha_seq_first_cross_perhead():
    cfg = mha_config(16, 2, bias=True, batch_first=False)
    fwd = {"need_weights": True, "average_attn_weights": False}
    m = _mha(cfg, affine="randomized")
    q = torch.randn(7, 3, 16)
    kv = torch.randn(9, 3, 16)
    kpm = padding_mask(9, [0, 3, 6])
    return cfg, m, fwd, {"query": q, "key": kv, "value": kv, "key_padding_mask": kpm}


def fx_mha_kdim_vdim():
    cfg = mha_config(16, 4, bias=True, kdim=12, vdim=20, batch_first=True)
    fwd = {"need_weights": True, "average_attn_weights": True}
    m = _mha(cfg, affine="randomized")
    q = torch.randn(2, 5, 16)
    k = torch.randn(2, 6, 12)
    v = torch.randn(2, 6, 20)
    am = random_bool_mask(5, 6)
    return cfg, m, fwd, {"query": q, "key": k, "value": v, "attn_mask": am}


def fx_mha_bias_kv_zero_attn():
    cfg = mha_config(16, 2, bias=True, add_bias_kv=True, add_zero_attn=True, batch_first=True)
    fwd = {"need_weights": True, "average_attn_weights": True}
    m = _mha(cfg, affine="randomized")
    x = torch.randn(2, 5, 16)
    am = torch.randn(2 * 2, 5, 5)
    kpm = padding_mask(5, [1, 3])
    return cfg, m, fwd, {"query": x, "key": x, "value": x, "attn_mask": am, "key_padding_mask": kpm}


def fx_mha_unbatched_perhead_floatpad():
    cfg = mha_config(16, 4, bias=True, batch_first=True)
    fwd = {"need_weights": True, "average_attn_weights": False}
    m = _mha(cfg, affine="randomized")
    q = torch.randn(6, 16)
    kv = torch.randn(8, 16)
    kpm = torch.randn(8) * 0.5
    return cfg, m, fwd, {"query": q, "key": kv, "value": kv, "key_padding_mask": kpm}


def fx_mha_no_weights():
    cfg = mha_config(16, 2, bias=True, batch_first=True)
    fwd = {"need_weights": False, "average_attn_weights": True}
    m = _mha(cfg, affine="randomized")
    x = torch.randn(2, 5, 16)
    return cfg, m, fwd, {"query": x, "key": x, "value": x, "attn_mask": causal_mask(5, 5)}


def fx_encoder_norm_first_gelu():
    cfg = enc_config(32, 4, dim_feedforward=64, activation="gelu", layer_norm_eps=1e-6,
                     batch_first=True, norm_first=True)
    m = _enc(cfg, affine="randomized")
    src = torch.randn(3, 10, 32)
    return cfg, m, {}, {"src": src, "src_mask": causal_mask(10, 10),
                   "src_key_padding_mask": padding_mask(10, [0, 4, 7])}


def fx_encoder_seq_first_gelu():
    cfg = enc_config(32, 2, dim_feedforward=48, activation="gelu", batch_first=False)
    m = _enc(cfg, affine="randomized")
    src = torch.randn(7, 2, 32)
    return cfg, m, {}, {"src": src}


def fx_encoder_unbatched_eps():
    cfg = enc_config(16, 2, dim_feedforward=32, layer_norm_eps=1e-3, batch_first=True)
    m = _enc(cfg, affine="randomized")
    src = torch.randn(9, 16)
    return cfg, m, {}, {"src": src, "src_mask": random_bool_mask(9, 9)}


# name -> (seed, builder, description)
FIXTURES = {
    "mha_single": (
        1001, fx_mha_single,
        "Seed case: unbatched (100, 64) single-head causal self-attention without biases, "
        "torch init, head-averaged weights, the baseline the harness was built around."),
    "mha_batched": (
        1002, fx_mha_batched,
        "Seed case at batch 2: batch_first (2, 100, 64) single-head causal self-attention "
        "without biases, torch init, checking batch handling against the unbatched baseline."),
    "mha_multihead": (
        1003, fx_mha_multihead,
        "Batch_first (2, 100, 64) causal self-attention with 4 heads and no biases, torch init, "
        "checking the head split/merge and head-averaged attention weights."),
    "encoder_block": (
        1004, fx_encoder_block,
        "Seed encoder case: post-norm ReLU TransformerEncoderLayer(64, 4, ff=128), batch_first "
        "(2, 100, 64) with a causal float src_mask, feed-forward biases zeroed as in the seed."),
    "mha_seq_first_cross_perhead": (
        1005, fx_mha_seq_first_cross_perhead,
        "Sequence-first cross-attention (L=7, S=9, B=3, E=16, 2 heads) with randomized biases "
        "and a per-batch bool key_padding_mask, returning per-head weights, to exercise layout, "
        "bias and padding semantics."),
    "mha_kdim_vdim": (
        1006, fx_mha_kdim_vdim,
        "Attention with kdim=12 and vdim=20 != embed_dim=16 (separate q/k/v projection weights), "
        "4 heads, randomized biases and a random 2-D bool attn_mask, checking the unpacked "
        "in-projection path."),
    "mha_bias_kv_zero_attn": (
        1007, fx_mha_bias_kv_zero_attn,
        "Self-attention with add_bias_kv and add_zero_attn, randomized biases, a 3-D per-head "
        "float attn_mask and a bool key_padding_mask, checking how both extra key/value columns "
        "pad the masks."),
    "mha_unbatched_perhead_floatpad": (
        1008, fx_mha_unbatched_perhead_floatpad,
        "Unbatched cross-attention (L=6, S=8, E=16, 4 heads) with randomized biases and an "
        "additive 1-D float key_padding_mask and no attn_mask, returning per-head weights "
        "of shape (heads, L, S)."),
    "mha_no_weights": (
        1009, fx_mha_no_weights,
        "Causal self-attention with need_weights=False and randomized biases, checking that "
        "only the attention output is returned."),
    "encoder_norm_first_gelu": (
        1010, fx_encoder_norm_first_gelu,
        "Pre-norm (norm_first) GELU TransformerEncoderLayer(32, 4, ff=64, eps=1e-6) with "
        "randomized biases and LayerNorm affine, causal float src_mask combined with a bool "
        "src_key_padding_mask."),
    "encoder_seq_first_gelu": (
        1011, fx_encoder_seq_first_gelu,
        "Post-norm GELU TransformerEncoderLayer(32, 2, ff=48) in sequence-first layout (7, 2, 32) "
        "with randomized biases and LayerNorm affine and no masks."),
    "encoder_unbatched_eps": (
        1012, fx_encoder_unbatched_eps,
        "Unbatched (9, 16) post-norm ReLU TransformerEncoderLayer(16, 2, ff=32) with "
        "layer_norm_eps=1e-3, randomized biases and LayerNorm affine and a random bool src_mask."),
}


# ---------------------------------------------------------------------------
# Serialisation
# ---------------------------------------------------------------------------

def _json_float(x):
    if math.isfinite(x):
        return x
    if math.isnan(x):
        return "nan"
    return "inf" if x > 0 else "-inf"


def tensor_json(t, dtype_name):
    t = t.detach().contiguous()
    if dtype_name == "bool":
        assert t.dtype == torch.bool
        data = t.reshape(-1).tolist()
    else:
        expected = {"float32": torch.float32, "float64": torch.float64}[dtype_name]
        assert t.dtype == expected, (t.dtype, dtype_name)
        data = [_json_float(x) for x in t.reshape(-1).tolist()]
    return {"dtype": dtype_name, "shape": list(t.shape), "data": data}


def tensor_json_auto(t):
    return tensor_json(t, {torch.bool: "bool", torch.float32: "float32",
                           torch.float64: "float64"}[t.dtype])


def to_float64(t):
    return t if t.dtype == torch.bool else t.to(torch.float64)


def split_outputs(ret, module_name, fwd):
    """Return an ordered dict of the module's returned tensors."""
    if module_name == "MultiheadAttention":
        out, weights = ret
        d = {"output": out.detach()}
        if fwd["need_weights"]:
            assert weights is not None
            d["attn_weights"] = weights.detach()
        else:
            assert weights is None
        return d
    return {"output": ret.detach()}


def l2(t):
    return float(torch.linalg.vector_norm(t.to(torch.float64)))


def make_fixture(name):
    seed, builder, description = FIXTURES[name]
    torch.manual_seed(seed)
    config, module32, fwd, inputs32 = builder()
    module_name = type(module32).__name__
    # The written config must describe the module actually built.
    assert build_config_echo(module32, module_name) == config, name

    # Every parameter must require grad so that, with autograd enabled, the
    # fast path's "grad is enabled and ... requires_grad" condition blocks it.
    assert all(p.requires_grad for p in module32.parameters())
    assert torch.is_grad_enabled()

    # float64 copy; keep "is" identity between query/key/value (self-attention).
    module64 = copy.deepcopy(module32).double()
    inputs64 = {}
    cast_cache = {}
    for k, v in inputs32.items():
        if id(v) not in cast_cache:
            cast_cache[id(v)] = to_float64(v)
        inputs64[k] = cast_cache[id(v)]

    with forbid_fast_path():
        out32 = split_outputs(module32(**inputs32, **fwd), module_name, fwd)
        out64 = split_outputs(module64(**inputs64, **fwd), module_name, fwd)

    # Float64 parameters must be exact copies of the float32 ones.
    sd32 = module32.state_dict()
    sd64 = module64.state_dict()
    assert list(sd32.keys()) == list(sd64.keys())
    for k in sd32:
        assert sd64[k].dtype == torch.float64
        assert torch.equal(sd64[k], sd32[k].double()), k

    noise = {}
    for key in out64:
        o32, o64 = out32[key], out64[key]
        assert o32.dtype == torch.float32 and o64.dtype == torch.float64
        assert o32.shape == o64.shape
        assert not torch.isnan(o64).any(), f"{name}: NaN in float64 {key}"
        assert torch.isfinite(o64).all(), f"{name}: non-finite float64 {key}"
        diff = l2(o32.double() - o64)
        ref = l2(o64)
        assert diff <= REL_TOL * ref, f"{name}: {key} float32/float64 rel diff {diff / ref:.3e}"
        max_abs = float((o32.double() - o64).abs().max())
        assert max_abs <= REL_TOL * float(o64.abs().max()), f"{name}: {key} max abs diff {max_abs}"
        noise[key] = (diff, ref)

    fixture = {
        "format": FORMAT,
        "version": VERSION,
        "name": name,
        "module": module_name,
        "config": config,
        "forward": dict(fwd),
        "state_dict": {k: tensor_json(v, "float64") for k, v in sd64.items()},
        "inputs": {k: tensor_json_auto(v) for k, v in inputs64.items()},
        "outputs": {k: tensor_json(v, "float64") for k, v in out64.items()},
        "outputs_float32": {k: tensor_json(v, "float32") for k, v in out32.items()},
        "description": description,
    }
    return fixture, noise


def build_config_echo(module, module_name):
    """Reconstruct the constructor config from a built module."""
    if module_name == "MultiheadAttention":
        return mha_config(module.embed_dim, module.num_heads,
                          bias=module.in_proj_bias is not None,
                          add_bias_kv=module.bias_k is not None,
                          add_zero_attn=module.add_zero_attn,
                          kdim=module.kdim, vdim=module.vdim,
                          batch_first=module.batch_first)
    act = module.activation
    if act is torch.nn.functional.relu:
        act_name = "relu"
    elif act is torch.nn.functional.gelu:
        act_name = "gelu"
    else:
        raise ValueError(f"unsupported activation {act!r}")
    assert module.norm1.eps == module.norm2.eps
    return enc_config(module.self_attn.embed_dim, module.self_attn.num_heads,
                      dim_feedforward=module.linear1.out_features,
                      activation=act_name, layer_norm_eps=module.norm1.eps,
                      batch_first=module.self_attn.batch_first,
                      norm_first=module.norm_first)


def write_fixture(fixture, path):
    tmp = path + ".tmp"
    with open(tmp, "w", encoding="utf-8") as f:
        json.dump(fixture, f, separators=(",", ":"), allow_nan=False)
        f.write("\n")
    os.replace(tmp, path)


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--out", default=DEFAULT_OUT,
                    help="output directory (default: %(default)s)")
    ap.add_argument("--only", nargs="+", metavar="NAME", choices=list(FIXTURES),
                    help="write only these fixtures")
    args = ap.parse_args(argv)

    # Single-threaded for run-to-run reproducibility of the float32 results.
    torch.set_num_threads(1)
    self_test_fast_path_guard()

    os.makedirs(args.out, exist_ok=True)
    names = args.only if args.only else list(FIXTURES)
    print(f"torch {torch.__version__}")
    for name in names:
        fixture, noise = make_fixture(name)
        path = os.path.join(args.out, name + ".json")
        write_fixture(fixture, path)
        size = os.path.getsize(path)
        print(f"{name}  {path}  {size} bytes")
        for key, (diff, ref) in noise.items():
            print(f"    {key:13s} |out32-out64|_2 = {diff:.3e}   |out64|_2 = {ref:.3e}   "
                  f"rel = {diff / ref:.3e}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
