"""The pytest plugin: one test per case (or fixture) and precision, the verdict on failure.

    import pytest

    @pytest.mark.tparity(cases=["gpt2"], without=["padding"])
    def test_my_block(tparity_case):
        tparity_case.check(module=lambda c: MyBlock(c), transpose=["attn.c_attn.weight", ...])

makes test_my_block[gpt2-float64] and test_my_block[gpt2-float32]. The marker takes case=/cases=,
fixtures=, dtypes= (default float64 and float32) and any option of tparity.check; check() takes the
rest (the code and how to load and call it). The first test of a case runs every precision of it at
once (so that a float64 failure is judged beside the float32 run: a precision slip); each test then
fails on its own precision's legs only. Options: --tparity-bin PATH, --tparity-full (every
component's legs in a failure's message).
"""

import re

import pytest

from ._check import TparityFailure, check
from ._cli import UsageError

_RUN = re.compile(r"case \S+ \((float64|float32|bfloat16|float16)\):")
_PRECISION_OF_LEG = (("handbf16", "bfloat16"), ("handf16", "float16"), ("hand64", "float64"), ("hand32", "float32"))


def pytest_addoption(parser):
    group = parser.getgroup("tparity")
    group.addoption("--tparity-bin", default=None, help="the tparity executable (default: $TPARITY_BIN, "
                    "tparity on PATH, or the checkout's build/tparity)")
    group.addoption("--tparity-full", action="store_true", default=False,
                    help="a failing tparity test's message holds every component's legs")


def pytest_configure(config):
    config.addinivalue_line(
        "markers", "tparity(case=, cases=, fixtures=, dtypes=, without=, options=, ...): check against tparity's "
        "cases or fixtures, one test per case and precision; the test takes the tparity_case fixture")


def _precision(failure):
    leg = failure.get("leg") or ""
    for key, dtype in _PRECISION_OF_LEG:
        if key in leg:
            return dtype
    m = _RUN.match(failure.get("text", ""))  # "case NAME (DTYPE): ...": that run's program failed
    return m.group(1) if m else None  # the case as a whole


class TparityCase:
    """One test's case and precision; check(**how) runs it (once for all the case's precisions)."""

    def __init__(self, kind, target, dtype, dtypes, marker_kwargs, cache, config):
        self.kind, self.target, self.dtype, self.dtypes = kind, target, dtype, tuple(dtypes)
        self._marker, self._cache, self._config = marker_kwargs, cache, config

    def __repr__(self):
        return f"{_label(self.target)}-{self.dtype}"

    def check(self, **how):
        """tparity.check for this case and every precision of the marker (cached for the case), then
        this test's verdict: raises TparityFailure on its precision's failures, skips when the case
        was skipped. Returns the Result."""
        key = (self.kind, self.target)
        if key not in self._cache:
            kwargs = dict(self._marker)
            kwargs.update(how)
            kwargs[self.kind] = self.target
            kwargs.setdefault("dtypes", self.dtypes)
            kwargs.setdefault("tparity", self._config.getoption("tparity_bin"))
            try:
                self._cache[key] = check(**kwargs)
            except UsageError as e:  # declined by the code, or not shaped by without=: a skip
                self._cache[key] = e
        result = self._cache[key]
        if isinstance(result, UsageError):
            if result.skipped:
                pytest.skip("; ".join(f"{s['name']}: {s['reason']}" for s in result.skipped))
            raise result
        if not result.cases and result.skipped:
            pytest.skip("; ".join(f"{s['name']}: {s['reason']}" for s in result.skipped))
        mine = [(c, f) for c in result.cases for f in c.failures if _precision(f) in (None, self.dtype)]
        legs = {leg for c in result.cases for comp in c.json.get("components", []) for leg in comp.get("legs", {})}
        if not mine and not any(_precision({"leg": leg}) == self.dtype for leg in legs):
            why = "; ".join(f["text"] for c in result.cases for f in c.failures) or "no leg of it in the report"
            mine = [(c, {"component": "", "leg": "", "text": f"case {c.name}: {self.dtype} was not judged ({why})"})
                    for c in result.cases[:1]]
        if mine:
            lines = []
            for c in result.cases:
                ours = [f for cc, f in mine if cc is c]
                if ours:
                    lines.append(c.summary)
                    lines += ["  " + f["text"] for f in ours]
                    lines += ["  " + d["text"] for d in c.diagnoses if d.get("text")]
                    if c.not_checked:
                        lines.append("  not checked: " + ", ".join(c.not_checked))
            program = [ln for ln in result.stderr.splitlines() if ln.strip()]
            if any("the program" in f["text"] for _, f in mine) and program:
                lines += ["", "the program's standard error (last lines):"] + program[-25:]
            if self._config.getoption("tparity_full"):
                lines += ["", result.tables()]
            raise TparityFailure("\n".join(lines))
        return result


def pytest_generate_tests(metafunc):
    if "tparity_case" not in metafunc.fixturenames:
        return
    marker = metafunc.definition.get_closest_marker("tparity")
    kwargs = dict(marker.kwargs) if marker else {}
    targets = [("case", c) for c in ([kwargs.pop("case")] if "case" in kwargs else []) + list(kwargs.pop("cases", ()))]
    targets += [("fixture", f) for f in ([kwargs.pop("fixture")] if "fixture" in kwargs else [])
                + list(kwargs.pop("fixtures", ()))]
    if not targets:
        raise pytest.UsageError(f"{metafunc.definition.nodeid}: @pytest.mark.tparity needs case=, cases= or fixtures=")
    dtypes = kwargs.pop("dtypes", ("float64", "float32"))
    dtypes = (dtypes,) if isinstance(dtypes, str) else tuple(dtypes)
    cache = {}
    params = [TparityCase(kind, t, d, dtypes, kwargs, cache, metafunc.config) for kind, t in targets for d in dtypes]
    metafunc.parametrize("tparity_case", params, ids=[repr(p) for p in params])


def _label(target):
    """A case's name, or a fixture's file name without .json."""
    name = str(target).replace("\\", "/").rsplit("/", 1)[-1]
    return name[:-5] if name.endswith(".json") else name
