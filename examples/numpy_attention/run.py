"""The numpy attention layers (attention.py) as a program for tparity's exec protocol.

    tparity exec -- python3 examples/numpy_attention/run.py {problem} {out} {dtype}

reads the problem file, computes the module in dtype (float32 or float64 throughout) and writes the
outputs file. In bfloat16 or float16 (tparity exec --dtype bfloat16,float16) it computes as CPU kernels
of those precisions do: the weights and inputs rounded to it, arithmetic in float32, every component
stored in it (rounded as it goes through the Tape), the outputs too. The outputs file holds: the module's outputs, its own components and, when the problem holds the reference's
float64 components, the local ones (each op on the reference's inputs: attention.Tape). A module or an
option it does not implement is written as "unsupported" (exit 0). Exit codes: 0 written, 1 the problem
could not be computed (one line on stderr), 2 bad usage.

The semantics (how masks merge, what a fully masked row gives) are those of the torch that produced
the problem's results: its reference.torch, 1.13 for a version 1 problem (README "Semantics").
"""

import os
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..", "python"))

import attention  # noqa: E402
import tparity_io  # noqa: E402

import numpy as np  # noqa: E402

USAGE = "usage: run.py PROBLEM OUT DTYPE   (DTYPE: float32, float64, bfloat16 or float16)"

# A low precision: stored in it, computed in float32.
STORE = {
    "bfloat16": tparity_io.round_bfloat16,
    "float16": lambda a: a.astype(np.float16).astype(np.float32),
}


def is_torch2(problem):
    """torch 2.x's semantics unless the problem came from torch 1.x (or is a version 1 fixture)."""
    return not problem.reference.get("torch", "1.13").startswith("1.")


def compute(problem, dtype):
    """(outputs, components, local) of problem's module in dtype; raises attention.Unsupported."""
    forward = attention.MODULES.get(problem.module)
    if forward is None:
        raise attention.Unsupported(f"module {problem.module} is not implemented by examples/numpy_attention")

    store = STORE.get(dtype)
    compute_dtype = "float32" if store else dtype

    def cast(tensors):  # floats into the run's dtype; bool masks and int64 ids as they are
        return {k: (store or (lambda a: a))(v.astype(compute_dtype)) if v.dtype.kind == "f" else v
                for k, v in tensors.items()}

    args = (problem.config, problem.forward, cast(problem.state_dict), cast(problem.inputs), is_torch2(problem))
    own = attention.Tape(store=store)
    outputs = forward(*args, own)
    if store:
        outputs = {k: store(v) for k, v in outputs.items()}
    local = None
    if problem.components and not store:  # again, teacher-forced by the reference's float64 components
        forced = attention.Tape(problem.components)
        forward(*args, forced)
        # the components the reference holds, and "output" always: the last op on the reference's inputs,
        # which tparity judges locally even where the problem's components leave the output out (the
        # transformers fixtures keep it in "outputs" alone)
        local = {k: v for k, v in forced.values.items() if k in problem.components or k == "output"}
    for group, tensors in (("outputs", outputs), ("components", own.values), ("local", local or {})):
        for name, a in tensors.items():  # a float64 intermediate in a float32 run is this program's bug
            if a.dtype != compute_dtype:
                raise AssertionError(f"{group}.{name}: computed in {a.dtype}, the run is {compute_dtype}")
    if dtype == "float16":  # written as float16 arrays; the values are float16's already
        outputs, components = ({k: v.astype(np.float16) for k, v in m.items()} for m in (outputs, own.values))
        return outputs, components, local
    return outputs, own.values, local


def main(argv):
    if len(argv) != 3 or argv[2] not in ("float32", "float64", "bfloat16", "float16"):
        print(USAGE, file=sys.stderr)
        return 2
    problem_path, out_path, dtype = argv
    try:
        problem = tparity_io.load_problem(problem_path)  # its messages name the file and the field
        outputs, components, local = compute(problem, dtype)
    except attention.Unsupported as e:
        tparity_io.write_unsupported(out_path, str(e))
        return 0
    except ValueError as e:
        what = str(e) if str(e).startswith(problem_path) else f"{problem_path}: {e}"
        print(f"run.py: {what}", file=sys.stderr)
        return 1
    except KeyError as e:  # a state_dict entry, input or config key the module reads is absent
        print(f"run.py: {problem_path}: missing {e} (a state_dict entry, input or config key)", file=sys.stderr)
        return 1
    # Answered in the form asked: tensors in a safetensors file when the problem's came in one.
    tparity_io.write_outputs(out_path, dtype, outputs, components, local,
                             tensors="safetensors" if problem.tensor_file else "inline")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
