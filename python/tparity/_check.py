"""tparity.check: one call, the CLI's verdict as a Result."""

import json
import re
from dataclasses import dataclass, field

from . import _cli, _run

DTYPES = ("float64", "float32", "bfloat16", "float16")


@dataclass
class CaseResult:
    """One report of `tparity exec`: a case or fixture (`name`), or its components against LibTorch's
    decomposition (`name/components`)."""
    name: str
    passed: bool
    summary: str
    first_divergence: str = ""
    failures: list = field(default_factory=list)  # [{"component", "leg", "text"}]
    diagnoses: list = field(default_factory=list)
    not_checked: list = field(default_factory=list)
    notes: list = field(default_factory=list)
    json: dict = field(default_factory=dict, repr=False)

    @property
    def failing_components(self):
        return [f["component"] for f in self.failures if f.get("component")]


@dataclass
class Result:
    passed: bool
    cases: list
    skipped: list  # [{"name", "reason"}]
    exit_code: int
    stderr: str = field(repr=False, default="")
    json: dict = field(default_factory=dict, repr=False)

    @property
    def failures(self):
        return [f for c in self.cases for f in c.failures]

    @property
    def failing_components(self):
        seen = []
        for c in self.cases:
            seen += [n for n in c.failing_components if n not in seen]
        return seen

    def case(self, name):
        for c in self.cases:
            if c.name == name:
                return c
        raise KeyError(f"no report named {name!r} (there are: {', '.join(c.name for c in self.cases)})")

    def __str__(self):
        lines = []
        for c in self.cases:
            lines.append(c.summary)
            lines += ["  " + f["text"] for f in c.failures]
            lines += ["  " + d["text"] for d in c.diagnoses if d.get("text")]
            if c.not_checked:
                lines.append("  not checked: " + ", ".join(c.not_checked))
        lines += [f"skipped {s['name']}: {s['reason']}" for s in self.skipped]
        n = sum(c.passed for c in self.cases)
        lines.append(f"{len(self.cases)} report(s): {n} passed, {len(self.cases) - n} failed")
        return "\n".join(lines)

    def tables(self):
        """Every component's legs, as the JSON report has them: one line per component and leg."""
        lines = []
        for c in self.cases:
            lines.append(f"case {c.name}: {'PASS' if c.passed else 'FAIL'}")
            for comp in c.json.get("components", []):
                for leg, m in comp.get("legs", {}).items():
                    bound = m.get("bound")
                    lines.append(f"  {comp['name']:<34} {leg:<26} rel_l2 {m.get('rel_l2', float('nan')):.3g}"
                                 + (f"  bound {bound:.3g}" if isinstance(bound, (int, float)) else "")
                                 + ("" if m.get("pass", True) else "  FAIL"))
        return "\n".join(lines)


class TparityFailure(AssertionError):
    """A check that did not pass: its message is the report."""


_FAILURE = re.compile(r"component (\S+): leg (\S+):")


def _failure(text):
    """A failure line as {"component", "leg", "text"} (the JSON report holds the lines)."""
    m = _FAILURE.search(text)
    return {"component": m.group(1) if m else "", "leg": m.group(2) if m else "", "text": text}


def _case(doc):
    fd = doc.get("first_divergence") or ""
    if isinstance(fd, dict):
        fd = fd.get("component", "")
    failures = [f if isinstance(f, dict) else _failure(f) for f in doc.get("failures", [])]
    passed = bool(doc.get("pass"))
    summary = doc.get("summary") or (
        f"{'PASS' if passed else 'FAIL'}  {doc.get('name')}"
        + (f"  first divergence: {fd}" if fd else ""))
    return CaseResult(name=doc.get("name", ""), passed=passed, summary=summary,
                      first_divergence=fd, failures=failures,
                      diagnoses=doc.get("diagnoses", []), not_checked=doc.get("not_checked", []),
                      notes=doc.get("notes", []), json=doc)


_ON_OFF = {"bias"}  # exec's options that take on or off (the rest of the booleans are flags)


def _flag(key):
    return "--" + key.replace("_", "-")


def exec_args(case=None, cases=(), fixture=None, fixtures=(), dtypes=("float64", "float32"), without=(),
              accept=(), options=None, config=None, name=None, junit=None, baseline=None, update_baseline=False,
              timeout=None, keep=None, tensors="safetensors"):
    """The arguments of `tparity exec` for a check."""
    args = []
    for c in ([case] if case else []) + list(cases):
        args += ["--case", c]
    for f in ([fixture] if fixture else []) + list(fixtures):
        args += ["--fixture", str(f)]
    if isinstance(dtypes, str):
        dtypes = [dtypes]
    bad = [d for d in dtypes if d not in DTYPES]
    if bad or not dtypes:
        raise _cli.UsageError(f"dtypes: expected some of {', '.join(DTYPES)}, got {dtypes!r}")
    args += ["--dtype", ",".join(dtypes)]
    if isinstance(without, str):
        without = [without]
    if without:
        args += ["--without", ",".join(without)]
    if isinstance(accept, str):
        accept = [accept]
    for a in accept:
        args += ["--accept", a]
    for k, v in (options or {}).items():
        if k in _ON_OFF and isinstance(v, bool):  # {"bias": False} is --bias off, not the case's default
            args += [_flag(k), "on" if v else "off"]
        elif v is True:
            args.append(_flag(k))
        elif v is not False and v is not None:
            args += [_flag(k), str(v)]
    for k, v in (config or {}).items():
        args += ["--config", f"{k}={json.dumps(v)}"]
    args += ["--tensors", tensors]
    if name:
        args += ["--name", name]
    if junit:
        args += ["--junit", str(junit)]
    if baseline:
        args += ["--baseline", str(baseline)] + (["--update-baseline"] if update_baseline else [])
    if timeout is not None:  # 0 too: exec refuses it by name, not taken as its default
        args += ["--timeout", str(timeout)]
    if keep:
        args += ["--keep", str(keep)]
    return args


def _arguments(module, weights, transpose, hooks):
    """The loading arguments' types, checked before anything runs: a wrong one would fail every case
    with an AttributeError far from the call."""
    if (module is not None and not isinstance(module, type) and hasattr(module, "named_parameters")
            and hasattr(module, "forward")):  # an instance; the class itself is a factory
        raise TypeError(f"module=: expected a factory (config -> torch.nn.Module), got the module "
                        f"{type(module).__name__} itself: give module=lambda config: {type(module).__name__}(...) "
                        f"(it is built anew for each case and precision)")
    if module is not None and not callable(module):
        raise TypeError(f"module=: expected a factory (config -> torch.nn.Module), got {type(module).__name__}")
    if weights is not None and not (callable(weights) or isinstance(weights, dict)):
        raise TypeError(f"weights=: expected a dict {{reference name: yours}} or a function of the name, "
                        f"got {type(weights).__name__}")
    if isinstance(transpose, str) or not all(isinstance(n, str) for n in (transpose or ())):
        raise TypeError(f"transpose=: expected a list of reference names, got {transpose!r}")
    if hooks is not None and not (isinstance(hooks, dict) and all(isinstance(k, str) and isinstance(v, str)
                                                                  for k, v in hooks.items())):
        raise TypeError(f"hooks=: expected a dict {{component: submodule path}}, got {hooks!r}")


def check(*, module=None, function=None, case=None, cases=(), fixture=None, fixtures=(),
          dtypes=("float64", "float32"), without=(), accept=(), options=None, config=None,
          weights=None, transpose=(), call=None, outputs=None, hooks=None, local=True,
          name=None, junit=None, baseline=None, update_baseline=False, timeout=600, keep=None,
          tparity=None, echo=False):
    """Check your code against PyTorch on tparity's cases or fixtures; returns a Result.

    What is checked (one of):
      module    a factory: config (the problem's config dict: the class's constructor arguments or its
                transformers config keys) -> torch.nn.Module. Built with torch's default dtype set to
                the precision, moved to it, loaded with the reference's state_dict.
      function  function(problem, dtype) -> the outputs (an array, a tuple in the problem's output
                order, or a dict by name); problem is tparity_io's (numpy arrays by PyTorch's names).
    Against what: case= / cases= (tparity run's default cases, shaped by options= and config=),
      fixture= / fixtures= (fixture or problem files).
    dtypes     precisions to run: float64 (the semantic gate), float32 (against LibTorch's own float32
               error), bfloat16, float16.
    without    features your code lacks (padding, decode, positions, head-dim, gqa, bias, ...): the case
               runs without them where it can, and the report says they were not checked.
    accept     diagnoses to accept rather than fail, e.g. "precision-slip".
    options    case options by name: {"seq": 16, "head_dim": 16} is --seq 16 --head-dim 16.
    config     LLM config keys: {"sliding_window": 4} is --config sliding_window=4.
    weights    reference state_dict name -> your parameter name (a dict; unlisted names are the same),
               or a function of the name (None drops it).
    transpose  reference names whose 2-D weight is transposed for you (GPT-2's Conv1D into nn.Linear).
    call       call(module, inputs) -> the forward's result; default module(**inputs) when forward names
               every input, module(x) when there is one.
    outputs    a function of the forward's result picking the outputs (default: as returned).
    hooks      canonical component -> submodule path: its output is that component ("path:input": its
               first argument; "": the module itself).
    local      also run each hooked or recorded op on the reference's inputs (the local legs: the first
               wrong op is named).
    name, junit, baseline, update_baseline, timeout, keep: as tparity exec's options.
    tparity    the executable (default $TPARITY_BIN, PATH, or this checkout's build/tparity).
    Raises UsageError when tparity refuses the request (its one line says what).
    """
    if (module is None) == (function is None):
        raise TypeError("check: give exactly one of module= (a factory of a torch.nn.Module) and "
                        "function= (a function of problem and dtype)")
    _arguments(module, weights, transpose, hooks)
    if module is not None:
        compute = _run.module_runner(module, weights, transpose, call, outputs, hooks, local)
        label = name or getattr(module, "__qualname__", "module")
    else:
        if weights or transpose or call or hooks:
            raise TypeError("check: weights=, transpose=, call= and hooks= are for module=, not function=")
        compute = _run.function_runner(function, outputs, local)
        label = name or getattr(function, "__qualname__", "function")
    args = exec_args(case, cases, fixture, fixtures, dtypes, without, accept, options, config, label, junit,
                     baseline, update_baseline, timeout, keep)
    code, doc, stderr, errors = _cli.run_exec(compute, args, tparity, echo)
    if code not in (0, 1) or doc is None:
        lines = [ln for ln in stderr.splitlines() if ln.strip()]
        skipped = (doc or {}).get("skipped", []) if code == 2 else []
        why = "".join(f" (skipped {s['name']}: {s['reason']})" for s in skipped)
        line = lines[-1] if lines else f"tparity exec exited with code {code}"
        if code == 2 and str(_cli.RELAY) in line:  # the relay's words named: an option exec does not take
            line = _cli.option_error(args, tparity) or line
        raise _cli.UsageError(line + why, skipped)
    cases_ = [_case(c) for c in doc.get("cases", [])]
    for c in cases_:  # "the program exited with code 1" says nothing: what the code raised does
        for f in c.failures:
            for (case_name, dtype), error in errors.items():
                if f["text"].startswith(f"case {case_name} ({dtype}): the program exited with code 1"):
                    f["text"] += f" ({error})"
    return Result(passed=code == 0 and bool(cases_), cases=cases_, skipped=doc.get("skipped", []), exit_code=code,
                  stderr=stderr, json=doc)
