"""One problem, one precision: the user's code run twice (its own components, then the local ones)
and turned into what tparity's outputs file holds."""

import contextlib
import dataclasses
import inspect

import numpy as np
import tparity_io

from . import _layouts, _record
from ._record import record, recording

class Unsupported(Exception):
    """Raise it from a factory, a forward or a function: the case is skipped with this reason."""


def _torch():
    import torch  # only when a torch module is checked
    return torch


def _is_torch(x):
    return type(x).__module__.startswith("torch") and hasattr(x, "detach")


def to_numpy(x):
    """A torch tensor or array as a numpy array: bfloat16 as float32 (each value a bfloat16)."""
    if _is_torch(x):
        t = x.detach().cpu()
        torch = _torch()
        if t.dtype == torch.bfloat16:
            t = t.float()
        return t.numpy()
    return np.asarray(x)


def like(a, value):
    """numpy `a` as the kind of thing `value` is (torch tensor of its dtype and device, or array)."""
    if _is_torch(value):
        torch = _torch()
        return torch.from_numpy(np.ascontiguousarray(a)).to(dtype=value.dtype, device=value.device)
    return a.astype(np.asarray(value).dtype)


def in_precision(a, dtype):
    """A component in the run's precision, as exec takes every tensor of an outputs file. What the code
    holds in another (a float32 table in the float64 run, a softmax upcast to float32 in a bfloat16
    one) is the code's own choice: widened exactly, or rounded to the run's precision, it is judged
    rather than the whole case refused for its dtype."""
    if a.dtype.kind != "f":
        return a  # not a float: tparity_io's writer names it
    if dtype == "bfloat16":
        return tparity_io.round_bfloat16(a)
    return a.astype(dtype)


class Recorder:
    """What record() and the hooks feed: each component in the canonical layout; in the local pass
    (`reference` given) it returns the reference's value to go on with."""

    def __init__(self, problem, dtype, reference=None):
        self.problem, self.dtype, self.reference = problem, dtype, reference
        self.values = {}

    def record(self, name, value):
        shapes = self.problem.components
        if name not in shapes and name in self.problem.outputs:  # an output the components leave out:
            shapes = self.problem.outputs  # judged as an output, and locally on the reference's inputs
        if name not in shapes:
            known = ", ".join(sorted(shapes)) or "none: the problem holds no components"
            raise ValueError(f"record({name!r}): not a component of {self.problem.module} in case "
                             f"{self.problem.name} (expected one of: {known})")
        if name in self.values:
            raise ValueError(f"record({name!r}): recorded twice in one run (a decode session's steps go "
                             f"under tparity.scope('step.N'))")
        mine = to_numpy(value)
        layout = _layouts.find(name, mine, shapes[name].shape, shapes[name])
        self.values[name] = in_precision(_layouts.to_canonical(layout, mine, shapes[name]), self.dtype)
        if self.reference is None or not layout.invertible:
            return value
        return like(_layouts.from_canonical(layout, self.reference[name], mine), value)


def _outputs(problem, dtype, result, pick):
    """The user's return value as {output name: canonical array}."""
    names = sorted(problem.outputs, key=lambda n: n != "output")  # "output" first, as modules return it
    if pick is not None:
        result = pick(result)
    expected = f"expected an array, a tuple in the order {', '.join(names)}, or a dict by those names"
    if result is None:
        raise ValueError(f"outputs: the code returned None ({expected})")
    if isinstance(result, list) and not all(v is None or _is_torch(v) or isinstance(v, np.ndarray) for v in result):
        result = np.asarray(result)  # an array as nested lists (.tolist()), not one output per element
    if isinstance(result, dict):
        got = {k: v for k, v in result.items() if k in names}
        if not got:
            raise ValueError(f"outputs: the code returned a dict of {', '.join(map(repr, result)) or 'nothing'} "
                             f"({expected})")
        # An output by a name the module does not have would go unjudged, whatever it holds.
        extra = [k for k, v in result.items() if k not in names and v is not None]
        if extra:
            raise ValueError(f"outputs: the code returned {', '.join(map(repr, extra))}, which the module has no "
                             f"output of ({expected}; outputs= picks them)")
    elif isinstance(result, (tuple, list)):
        # Positional, as modules return them: values past the problem's outputs are the module's own
        # extras (transformers' attention returns its weights after the output), not judged.
        got = dict(zip(names, result))
    else:
        got = {names[0]: result}
    out = {}
    for k, v in got.items():
        if v is None:
            continue
        # As returned: an output is the module's contract, no layout of it is converted (per-head
        # weights where the module returns them averaged, a batch of one dropped, are wrong answers).
        a = to_numpy(v)
        if a.shape != problem.outputs[k].shape:
            raise ValueError(f"outputs: {k}: the code returned shape {list(a.shape)}, the module's is "
                             f"{list(problem.outputs[k].shape)} (an output is judged as returned; outputs= "
                             f"picks or reshapes it)")
        out[k] = in_precision(a, dtype)
    return out


def _finish(problem, dtype, run, local):
    """(outputs, components, local) from run(recorder) -> the user's return value."""
    own = Recorder(problem, dtype)
    with recording(own):
        outputs = run(own)
    components = {k: v for k, v in own.values.items() if k in problem.components}
    if components and "output" in problem.components and "output" in outputs and "output" not in components:
        components["output"] = outputs["output"]
    lc = None
    if local and components and dtype in ("float64", "float32"):
        forced = Recorder(problem, dtype, reference=problem.components)
        with recording(forced):
            again = run(forced)
        lc = forced.values
        if "output" in again and "output" not in lc:
            lc["output"] = again["output"]
    return outputs, components, lc


def default_call(module, inputs):
    """module(**inputs) when forward names every input, module(x) when there is one; else the user
    says how with call=."""
    params = inspect.signature(module.forward).parameters
    if all(n in params for n in inputs):
        return module(**inputs)
    if len(inputs) == 1:
        return module(*inputs.values())
    raise ValueError(f"the problem's inputs are {list(inputs)} and forward takes {list(params)}: give "
                     f"call=lambda m, x: m(x[{list(inputs)[0]!r}], ...)")


@contextlib.contextmanager
def _default_dtype(dt):
    torch = _torch()
    old = torch.get_default_dtype()
    torch.set_default_dtype(dt)
    try:
        yield
    finally:
        torch.set_default_dtype(old)


def _load_weights(module, state_dict, weights, transpose, dt):
    torch = _torch()
    for what, names in (("transpose", transpose), ("weights", () if callable(weights) else weights)):
        for n in names:
            if n not in state_dict:
                raise ValueError(f"{what}: {n!r} is not in the reference's state_dict (it has: "
                                 f"{', '.join(state_dict)})")
    for n in transpose:
        if np.ndim(state_dict[n]) != 2:
            raise ValueError(f"transpose: {n!r} is {np.ndim(state_dict[n])}-D {list(np.shape(state_dict[n]))}: "
                             f"expected a 2-D weight")
    mapped, source = {}, {}
    for ref, a in state_dict.items():
        mine = weights(ref) if callable(weights) else weights.get(ref, ref)
        if mine is None:
            continue
        if mine in source:
            raise ValueError(f"weights: {source[mine]!r} and {ref!r} both go to the module's {mine!r}")
        source[mine] = ref
        if ref in transpose:
            a = a.T
        t = torch.from_numpy(np.ascontiguousarray(a))
        mapped[mine] = t.to(dt) if t.is_floating_point() else t
    own = module.state_dict()
    params = dict(module.named_parameters())
    unexpected = [k for k in mapped if k not in own]
    missing = [k for k in params if k not in mapped]
    if unexpected or missing:
        raise ValueError("weights: " + "; ".join(
            ([f"no parameter of the module is named {', '.join(unexpected)} (map the reference's names to "
              f"yours with weights={{reference name: yours}}; yours: {', '.join(own)})"] if unexpected else []) +
            ([f"the module's {', '.join(missing)} got no weight from the reference (its names: "
              f"{', '.join(state_dict)})"] if missing else [])))
    for k, t in mapped.items():
        if tuple(t.shape) != tuple(own[k].shape):
            hint = " (a Conv1D weight? name it in transpose=)" if tuple(t.shape[::-1]) == tuple(own[k].shape) else ""
            raise ValueError(f"weights: {k}: the reference's is {list(t.shape)}, the module's "
                             f"{list(own[k].shape)}{hint}")
    module.load_state_dict(mapped, strict=False)


def module_runner(factory, weights=None, transpose=(), call=None, outputs=None, hooks=None, local=True):
    """compute(problem, dtype) for a torch nn.Module built by factory(config)."""
    weights = weights or {}
    transpose = set(transpose or ())
    hooks = hooks or {}
    call = call or default_call

    def compute(problem, dtype):
        torch = _torch()
        dt = {"float64": torch.float64, "float32": torch.float32, "bfloat16": torch.bfloat16,
              "float16": torch.float16}[dtype]
        # Tables the code builds in torch's default dtype follow the precision asked for; one built
        # with an explicit dtype=torch.float32 stays float32 (the slip the float64 leg names).
        with _default_dtype(dt if dtype in ("float64", "float32") else torch.float32):
            def build():
                module = factory(dict(problem.config))
                if not isinstance(module, torch.nn.Module):
                    raise TypeError(f"module=: the factory returned {type(module).__name__}, not a torch.nn.Module")
                module = module.to(dt).eval()
                _load_weights(module, problem.state_dict, weights, transpose, dt)
                inputs = {}
                for k, a in problem.inputs.items():
                    t = torch.from_numpy(np.array(a))  # a copy: the code may change its inputs in place
                    inputs[k] = t.to(dt) if t.is_floating_point() else t
                return module, inputs

            def run(recorder):
                def hooked(comp, where, value):
                    if _record._PREFIX.get() + comp in recorder.values:
                        raise ValueError(f"hooks: {comp!r}: {where!r} ran twice in one forward (a submodule "
                                         f"called more than once: hook one that runs once, or give the value "
                                         f"with tparity.record)")
                    return record(comp, value)

                # Each pass from the same start: a module that keeps state between calls (a cache that
                # grows) or a forward that changes its inputs in place would run the local pass on
                # something else than the first.
                module, inputs = build()
                handles = []
                for comp, where in hooks.items():
                    path, _, side = where.partition(":")
                    if side not in ("", "input"):
                        raise ValueError(f"hooks: {comp!r}: expected a submodule path, or path:input, got {where!r}")
                    try:
                        sub = module.get_submodule(path)
                    except AttributeError:
                        raise ValueError(f"hooks: {comp!r}: the module has no submodule {path!r}") from None
                    if side == "input":  # the submodule's first argument
                        def pre_hook(mod, args, comp=comp, where=where):
                            if not args:
                                raise ValueError(f"hooks: {comp!r}: {where!r} was called with no positional "
                                                 f"argument (its input is passed by keyword): record it with "
                                                 f"tparity.record")
                            new = hooked(comp, where, args[0])
                            return None if new is args[0] else (new, *args[1:])
                        handles.append(sub.register_forward_pre_hook(pre_hook))
                        continue

                    def hook(mod, args, out, comp=comp, where=where):
                        first = out[0] if isinstance(out, (tuple, list)) else out
                        new = hooked(comp, where, first)
                        if new is first:
                            return None
                        return (new, *out[1:]) if isinstance(out, (tuple, list)) else new
                    handles.append(sub.register_forward_hook(hook))
                try:
                    with torch.no_grad():
                        return _outputs(problem, dtype, call(module, inputs), outputs)
                finally:
                    for h in handles:
                        h.remove()
            return _finish(problem, dtype, run, local)
    return compute


def function_runner(function, outputs=None, local=True):
    """compute(problem, dtype) for a Python function(problem, dtype) on numpy arrays."""
    def compute(problem, dtype):
        def run(recorder):  # each pass on its own copy of the inputs and weights (see module_runner)
            mine = dataclasses.replace(problem, inputs={k: np.array(a) for k, a in problem.inputs.items()},
                                       state_dict={k: np.array(a) for k, a in problem.state_dict.items()})
            return _outputs(problem, dtype, function(mine, dtype), outputs)
        return _finish(problem, dtype, run, local)
    return compute
