"""The pytest plugin (tparity.pytest_plugin, loaded through its entry point): one test per case and
precision, each failing on its own precision's legs, the verdict in the failure's message."""

TESTS = '''
import numpy as np
import pytest
import tparity

def softmax(problem, dtype, compute="same"):
    x = problem.inputs["input"].astype(dtype if compute == "same" else compute)
    e = np.exp(x - x.max(axis=-1, keepdims=True))
    return (e / e.sum(axis=-1, keepdims=True)).astype(dtype)

@pytest.mark.tparity(cases=["softmax", "layernorm"])
def test_right(tparity_case):
    def only_softmax(problem, dtype):
        if problem.module != "Softmax":
            raise tparity.Unsupported("softmax only")
        return softmax(problem, dtype)
    tparity_case.check(function=only_softmax)

@pytest.mark.tparity(case="softmax")
def test_float32_inside(tparity_case):
    tparity_case.check(function=lambda p, d: softmax(p, d, compute="float32"))

def raises_in_float32(problem, dtype):
    if dtype == "float32":
        raise RuntimeError("no float32 kernel")
    return softmax(problem, dtype)

@pytest.mark.tparity(case="softmax")
def test_float64_inside(tparity_case):  # float32's run fails, so the case judges neither precision
    tparity_case.check(function=raises_in_float32)
'''


def test_one_test_per_case_and_precision(pytester):
    pytester.makepyfile(test_inner=TESTS)
    r = pytester.runpytest_subprocess("-v", "-rs", "-p", "no:cacheprovider")
    out = r.stdout.str()
    for passed in ("test_right[softmax-float64] PASSED", "test_right[softmax-float32] PASSED",
                   "test_float32_inside[softmax-float32] PASSED"):
        assert passed in out, out
    assert "test_right[layernorm-float64] SKIPPED" in out, out
    assert "softmax only" in out, out
    # float32 arithmetic inside the float64 run: the float64 test fails, on its own leg, and says where
    assert "test_float32_inside[softmax-float64] FAILED" in out, out
    assert "component output: leg hand64_vs_torch64" in out, out
    # a precision not judged fails its test too, saying why
    assert "test_float64_inside[softmax-float64] FAILED" in out and "test_float64_inside[softmax-float32] FAILED" in out
    assert "float64 was not judged (case softmax (float32):" in out, out
    r.assert_outcomes(passed=3, failed=3, skipped=2)


def test_a_marker_without_cases_is_a_usage_error(pytester):
    pytester.makepyfile(test_inner='''
import pytest
@pytest.mark.tparity(dtypes=["float64"])
def test_nothing(tparity_case):
    pass
''')
    r = pytester.runpytest_subprocess("-p", "no:cacheprovider")
    assert "@pytest.mark.tparity needs case=, cases= or fixtures=" in r.stderr.str() + r.stdout.str()
    assert r.ret != 0


def test_a_program_failure_is_its_runs_precision_whatever_its_message_says():
    from tparity.pytest_plugin import _precision
    text = "case softmax (float32): the program exited with code 1 (ValueError: expected a tensor (float64))"
    assert _precision({"component": "", "leg": "", "text": text}) == "float32"
    assert _precision({"component": "", "leg": "", "text": "case softmax: no component matched (float16)"}) is None
