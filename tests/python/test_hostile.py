"""tparity.check against code that misbehaves: each test fails on the package as it was before the
fix it names (the code under test does not choose the expected values)."""

import os
from pathlib import Path

import numpy as np
import pytest

import tparity

F64 = {"case": "softmax", "dtypes": ["float64"]}


def softmax(problem, dtype):
    x = problem.inputs["input"].astype(dtype)
    e = np.exp(x - x.max(axis=-1, keepdims=True))
    return e / e.sum(axis=-1, keepdims=True)


def test_an_interrupt_leaves_no_exec_or_work_directory(tmp_path, monkeypatch):
    monkeypatch.setenv("TMPDIR", str(tmp_path))  # where exec makes its work directory

    def interrupted(problem, dtype):
        raise KeyboardInterrupt
    with pytest.raises(KeyboardInterrupt):
        tparity.check(function=interrupted, **F64)
    assert [p.name for p in tmp_path.iterdir() if p.name.startswith("tparity-exec-")] == []
    assert [pid for pid in os.listdir("/proc") if pid.isdigit() and str(tmp_path) in _cmdline(pid)] == []


def _cmdline(pid):
    try:
        with open(f"/proc/{pid}/cmdline", "rb") as f:
            return f.read().decode(errors="replace")
    except OSError:
        return ""


def test_what_the_code_raised_is_in_the_report():
    def raises(problem, dtype):
        raise RuntimeError("shapes do not\nmatch")
    r = tparity.check(function=raises, **F64)
    assert not r.passed
    assert "case softmax (float64): the program exited with code 1 (RuntimeError: shapes do not match)" in str(r), r



def test_sys_exit_in_the_code_fails_its_case_and_the_run_goes_on():
    def exits(problem, dtype):
        if problem.module == "Softmax":
            raise SystemExit(3)
        raise tparity.Unsupported("softmax only")
    r = tparity.check(function=exits, cases=["softmax", "layernorm"], dtypes=["float64"])
    assert not r.passed
    assert "case softmax (float64): the program exited with code 1 (SystemExit: 3)" in str(r), r
    assert [s["name"] for s in r.skipped] == ["layernorm"]  # the next case still ran


@pytest.mark.parametrize("returned, says", [
    (lambda y: None, "(ValueError: outputs: the code returned None (expected an array, a tuple in the order "
                     "output, or a dict by those names))"),
    (lambda y: {"out": y}, "(ValueError: outputs: the code returned a dict of 'out' (expected an array"),
    # an output by a name the module lacks was dropped unjudged
    (lambda y: {"output": y, "bogus": y}, "(ValueError: outputs: the code returned 'bogus', which the module has "
                                           "no output of (expected an array"),
])
def test_a_result_with_no_output_says_what_came(returned, says):
    r = tparity.check(function=lambda p, d: returned(softmax(p, d)), **F64)
    assert not r.passed
    assert says in str(r), r


def test_an_array_as_nested_lists_is_one_output():
    r = tparity.check(function=lambda p, d: softmax(p, d).tolist(), **F64)  # was: rows read as outputs
    assert r.passed, r


@pytest.mark.parametrize("weights, transpose, says", [
    ({"linear.wieght": "linear.weight"}, (), "weights: 'linear.wieght' is not in the reference's state_dict"),
    ({"linear.bias": "linear.weight"}, (), "weights: 'linear.weight' and 'linear.bias' both go to the module's "
                                            "'linear.weight'"),
    ({}, ("linear.bias",), "transpose: 'linear.bias' is 1-D [3]: expected a 2-D weight"),
])
def test_weights_and_transpose_that_cannot_be_meant_are_named(weights, transpose, says):
    torch = pytest.importorskip("torch")
    from tparity import _run
    m = torch.nn.Sequential()
    m.add_module("linear", torch.nn.Linear(3, 3))
    sd = {"linear.weight": np.eye(3), "linear.bias": np.zeros(3)}
    with pytest.raises(ValueError) as e:
        _run._load_weights(m, sd, weights, set(transpose), torch.float64)
    assert str(e.value).startswith(says), e.value


def test_an_input_hook_on_a_call_by_keyword_says_so():
    torch = pytest.importorskip("torch")

    class ByKeyword(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.softmax = torch.nn.Softmax(dim=-1)

        def forward(self, input):
            return self.softmax(input=input)
    r = tparity.check(module=lambda c: ByKeyword(), hooks={"output": "softmax:input"}, **F64)
    assert not r.passed
    assert ("(ValueError: hooks: 'output': 'softmax:input' was called with no positional argument (its input is "
            "passed by keyword): record it with tparity.record)") in str(r), r


def test_a_component_in_another_precision_is_judged_not_refused():
    def recorded_in_float32(problem, dtype):  # the float64 run's component held in float32: a slip
        y = softmax(problem, dtype)
        tparity.record("output", y.astype(np.float32))
        return y

    def recorded_in_float64(problem, dtype):  # the float32 run's component held in float64: its own choice
        y = softmax(problem, "float64")
        tparity.record("output", y)
        return y.astype(dtype)
    r = tparity.check(function=recorded_in_float32, **F64)
    assert not r.passed
    assert r.cases[0].first_divergence == "output", r  # judged: was "components.output.dtype: expected"
    r = tparity.check(function=recorded_in_float64, case="softmax", dtypes=["float32"])
    assert r.passed, r


@pytest.mark.parametrize("how, says", [
    ({"module": "instance"}, "module=: expected a factory (config -> torch.nn.Module), got the module Softmax itself"),
    ({"module": lambda c: None, "hooks": ["output"]}, "hooks=: expected a dict {component: submodule path}, got ['output']"),
    ({"module": lambda c: None, "transpose": "weight"}, "transpose=: expected a list of reference names, got 'weight'"),
    ({"module": lambda c: None, "weights": ["a"]}, "weights=: expected a dict {reference name: yours} or a function"),
])
def test_loading_arguments_of_the_wrong_kind_are_refused_before_anything_runs(how, says):
    torch = pytest.importorskip("torch")
    if how.get("module") == "instance":
        how = {"module": torch.nn.Softmax(dim=-1)}  # the module itself, not a factory of it
    with pytest.raises(TypeError) as e:
        tparity.check(tparity="/nonexistent", **how, **F64)  # refused before exec is looked for
    assert str(e.value).startswith(says), e.value


def test_a_timeout_of_0_is_refused_not_taken_as_the_default():
    with pytest.raises(tparity.UsageError) as e:
        tparity.check(function=softmax, timeout=0, **F64)
    assert "--timeout: expected a finite number of seconds > 0, got 0" in str(e.value), e.value


def test_an_option_exec_does_not_take_is_named():
    with pytest.raises(tparity.UsageError) as e:
        tparity.check(function=softmax, options={"seq_len": 4}, **F64)
    assert "not expected: --seq-len" in str(e.value), e.value  # was: the relay's own arguments


def test_code_that_changes_its_inputs_in_place_is_run_twice_from_the_same_start():
    def in_place(problem, dtype):
        x = problem.inputs["input"]  # the problem's own array, not a copy
        x *= 2.0  # in place (as `x += residual`): the local pass must not see it doubled again
        return tparity.record("output", _softmax(x / 2.0))
    r = tparity.check(function=in_place, **F64)
    assert r.passed and "FAIL" not in r.tables(), r.tables()  # the local leg was 0.2 off

    torch = pytest.importorskip("torch")

    class Grows(torch.nn.Module):  # keeps what it saw, as a cache does: the second pass must start empty
        def __init__(self):
            super().__init__()
            self.seen = []

        def forward(self, input):
            self.seen.append(input)
            return torch.softmax(input * len(self.seen), dim=-1)
    r = tparity.check(module=lambda c: Grows(), hooks={"output": ""}, **F64)
    assert r.passed and "FAIL" not in r.tables(), r.tables()


def _softmax(x):
    e = np.exp(x - x.max(axis=-1, keepdims=True))
    return e / e.sum(axis=-1, keepdims=True)


def test_a_boolean_bias_option_is_on_or_off():
    def names(problem, dtype):
        raise tparity.Unsupported(" ".join(sorted(problem.state_dict)))
    with pytest.raises(tparity.UsageError) as e:  # every case declined: the reason holds the weights' names
        tparity.check(function=names, case="multihead", options={"batch": 2, "seq": 4, "bias": True},
                      dtypes=["float64"])
    assert "in_proj_bias" in e.value.skipped[0]["reason"], e.value
    # every case with a bias option has it off by default, so off is checked on the arguments exec gets
    from tparity._check import exec_args
    args = exec_args(case="multihead", options={"bias": False})
    assert args[args.index("--bias") + 1] == "off"



def test_an_output_is_judged_as_returned_not_converted():
    def per_head_weights(problem, dtype):  # MultiheadAttention returns the weights averaged over the heads
        c = problem.config
        H, E = c["num_heads"], c["embed_dim"]
        x, w = problem.inputs["query"].astype(dtype), problem.state_dict["in_proj_weight"].astype(dtype)
        B, T, _ = x.shape
        q, k, v = ((x @ w[i * E:(i + 1) * E].T).reshape(B, T, H, E // H).transpose(0, 2, 1, 3) for i in range(3))
        s = q @ k.transpose(0, 1, 3, 2) / np.sqrt(E // H) + problem.inputs["attn_mask"].astype(dtype)
        a = np.exp(s - s.max(axis=-1, keepdims=True))
        a /= a.sum(axis=-1, keepdims=True)
        out = (a @ v).transpose(0, 2, 1, 3).reshape(B, T, E) @ problem.state_dict["out_proj.weight"].astype(dtype).T
        return out, a  # [B, H, T, S]: was averaged for it, and passed
    r = tparity.check(function=per_head_weights, case="multihead", options={"batch": 2, "seq": 12, "heads": 4},
                      dtypes=["float64"])
    assert not r.passed
    assert ("(ValueError: outputs: attn_weights: the code returned shape [2, 4, 12, 12], the module's is "
            "[2, 12, 12]") in str(r), r


def test_a_hooked_submodule_that_runs_twice_is_named():
    torch = pytest.importorskip("torch")

    class Twice(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.softmax = torch.nn.Softmax(dim=-1)

        def forward(self, input):
            return self.softmax(self.softmax(input).log())
    r = tparity.check(module=lambda c: Twice(), hooks={"output": "softmax"}, **F64)
    assert not r.passed
    assert ("(ValueError: hooks: 'output': 'softmax' ran twice in one forward (a submodule called more than once: "
            "hook one that runs once, or give the value with tparity.record)") in str(r), r


def test_the_calling_process_killed_leaves_no_exec_or_work_directory(tmp_path):
    import shutil
    import signal
    import subprocess
    import sys
    import tempfile
    import time
    script = tmp_path / "slow.py"
    script.write_text("import time, tparity\n"
                      "def slow(problem, dtype):\n"
                      "    print('computing', flush=True)\n"
                      "    time.sleep(60)\n"
                      "tparity.check(function=slow, case='softmax', dtypes=['float64'])\n")
    # The killed process's TMPDIR, too long for a Unix socket's path: the relay's socket and its folder
    # must still be in it (they went to /tmp, where the SIGKILL left them), removed when the test ends.
    work = Path(tempfile.mkdtemp(prefix="tparity-killed-" + "x" * 100))
    assert len(os.fsencode(os.path.join(str(work), "tparity-py-XXXXXXXX", "relay.sock"))) > 107
    try:
        p = subprocess.Popen([sys.executable, str(script)], env=dict(os.environ, TMPDIR=str(work)),
                             stdout=subprocess.PIPE, text=True)
        try:
            assert p.stdout.readline() == "computing\n"
            relay = list(work.glob("tparity-py-*"))  # the relay's folder, here and not in /tmp
            assert len(relay) == 1 and (relay[0] / "relay.sock").is_socket()
        finally:
            p.send_signal(signal.SIGKILL)  # no finally of its own runs: exec must learn it from its parent's death
            p.wait()
        deadline = time.time() + 10
        while time.time() < deadline and (list(work.glob("tparity-exec-*")) or _running_in(work)):
            time.sleep(0.1)
        assert list(work.glob("tparity-exec-*")) == [] and not _running_in(work)
    finally:
        shutil.rmtree(work, ignore_errors=True)


def _running_in(folder):
    return [pid for pid in os.listdir("/proc") if pid.isdigit() and str(folder) in _cmdline(pid)]


def test_a_module_class_is_a_factory():
    torch = pytest.importorskip("torch")

    class Softmax(torch.nn.Softmax):
        def __init__(self, config):
            super().__init__(dim=-1)
    r = tparity.check(module=Softmax, **F64)
    assert r.passed, r


def test_a_long_tmpdir_does_not_break_the_socket(tmp_path, monkeypatch):
    import tempfile
    long = tmp_path / ("x" * 100)
    long.mkdir()
    monkeypatch.setenv("TMPDIR", str(long))
    monkeypatch.setattr(tempfile, "tempdir", None)  # read $TMPDIR again
    r = tparity.check(function=softmax, case="softmax", dtypes=["float64"])
    assert r.passed, r

