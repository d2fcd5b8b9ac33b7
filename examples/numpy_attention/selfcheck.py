"""Self-check of examples/numpy_attention and python/tparity_io.py against the committed fixtures.

    .venv/bin/python examples/numpy_attention/selfcheck.py [FIXTURE.json ...]

For every fixture (default: fixtures/torch-2.13 and fixtures/torch-1.13), run.py runs once in float64
and once in float32, through the protocol's files exactly as tparity exec runs it, and its results are
compared with the fixture's float64 reference:
  - float64: outputs, components and local components within rel_l2 1e-10 (the float64 gate: only
    semantics, never rounding, moves a float64 result that far);
  - float32: outputs, components and local components within rel_l2 1e-5 (~100x torch's own float32
    error at these sizes: a wrong op is off by far more);
  - NaN and +-inf exactly where the reference has them, every tensor in the run's dtype.
Modules run.py declares unsupported are listed as skipped. Then checks that must be able to fail:
teacher forcing by the program's own float64 components must reproduce each of them bit for bit (the
names and layouts the two runs use agree), and a perturbed component must move exactly its consumers;
broken.py (scores scaled by 1/sqrt(E), not 1/sqrt(E/heads)) must fail every multi-head fixture it is
run on, first at `scores` locally, and pass a one-head one; and tparity_io must read a problem whose
tensors live in a safetensors file written by the safetensors package (or, without it, by hand) to
the same bits as inline, and refuse malformed files with the file and field named.
One line per fixture and per check; exit 1 on any failure.
"""

import glob
import json
import math
import os
import subprocess
import sys
import tempfile

import numpy as np

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(os.path.dirname(HERE))
sys.path.insert(0, os.path.join(ROOT, "python"))
import tparity_io  # noqa: E402

BOUND = {"float64": 1e-10, "float32": 1e-5}


def rel_l2(got, want):
    """||got - want|| / ||want|| over the finite entries (the denominator 1 where want is 0), or a
    string saying why the two cannot be compared: shape, or NaN / inf where the other has none."""
    if got.shape != want.shape:
        return f"shape {list(got.shape)}, expected {list(want.shape)}"
    g, w = got.astype(np.float64), want.astype(np.float64)
    if not np.array_equal(np.isnan(g), np.isnan(w)):
        return f"NaN at {int(np.sum(np.isnan(g)))} positions, expected {int(np.sum(np.isnan(w)))}"
    if not np.array_equal(np.where(np.isinf(g), np.sign(g), 0), np.where(np.isinf(w), np.sign(w), 0)):
        return "+-inf where the reference has none, or the reverse"
    fin = np.isfinite(w)
    ref = float(np.linalg.norm(w[fin]))
    return float(np.linalg.norm(g[fin] - w[fin])) / (ref if ref > 0 else 1.0)


def run_program(script, problem, dtype, tmp):
    """Run script as tparity exec does; the outputs document (json), or raise RuntimeError."""
    out = os.path.join(tmp, "out.json")
    if os.path.exists(out):
        os.unlink(out)
    p = subprocess.run([sys.executable, script, problem, out, dtype], capture_output=True, text=True)
    if p.returncode != 0:
        raise RuntimeError(f"{os.path.basename(script)} exited {p.returncode}: {p.stderr.strip()[-300:]}")
    with open(out) as f:
        return json.load(f)


def tensors(doc, key):
    """doc[key] as arrays, through tparity_io's own reader (the outputs file's tensors are fixture T's)."""
    r = tparity_io._Reader("outputs file")
    return {name: r.tensor(t, f"{key}.{name}") for name, t in doc.get(key, {}).items()}


def compare(fixture, script, tmp):
    """('pass' | 'fail' | 'skip', one-line detail, {(dtype, group, name): rel_l2 or why})."""
    want = tparity_io.load_problem(fixture)
    errors, worst = {}, {}
    for dtype in ("float64", "float32"):
        try:
            doc = run_program(script, fixture, dtype, tmp)
        except RuntimeError as e:
            return "fail", str(e), errors
        if "unsupported" in doc:
            return "skip", doc["unsupported"], errors
        if doc.get("dtype") != dtype:
            return "fail", f"outputs file dtype {doc.get('dtype')!r}, expected {dtype!r}", errors
        groups = {"outputs": (tensors(doc, "outputs"), want.outputs),
                  "components": (tensors(doc, "components"), want.components),
                  "local": (tensors(doc, "local"), want.components)}
        for group, (got, ref) in groups.items():
            for name, w in ref.items():
                key = (dtype, group, name)
                if name not in got:
                    errors[key] = "missing"
                elif got[name].dtype != np.dtype(dtype):
                    errors[key] = f"written as {got[name].dtype}"
                else:
                    errors[key] = rel_l2(got[name], w)
                    if isinstance(errors[key], float) and errors[key] > worst.get(dtype, (-1, ""))[0]:
                        worst[dtype] = (errors[key], f"{group}.{name}")
    bad = [f"{d} {g}.{n}: {e if isinstance(e, str) else f'rel_l2 {e:.2e} > {BOUND[d]:g}'}"
           for (d, g, n), e in errors.items() if isinstance(e, str) or e > BOUND[d]]
    if bad:
        return "fail", "; ".join(bad[:4]) + (f"; and {len(bad) - 4} more" if len(bad) > 4 else ""), errors
    n = len({(g, name) for (_, g, name) in errors})
    detail = ", ".join(f"{d} worst {e:.1e} ({where})" for d, (e, where) in worst.items())
    return "pass", f"{n} tensors; {detail}", errors


def check_broken(tmp):
    """broken.py fails each multi-head fixture, with the first local failure at scores; passes one head."""
    lines, ok = [], True
    script = os.path.join(HERE, "broken.py")
    cases = [("torch-2.13/book_mha.json", True), ("torch-2.13/mha_multihead.json", True),
             ("torch-1.13/encoder_block.json", True), ("torch-2.13/mha_single.json", False)]
    for rel, must_fail in cases:
        status, detail, errors = compare(os.path.join(ROOT, "fixtures", rel), script, tmp)
        local = [n for (d, g, n), e in errors.items() if d == "float64" and g == "local" and not isinstance(e, str)
                 and e > BOUND[d]]
        good = (status == "fail") == must_fail and (not local or local[0] == "scores")
        ok &= good
        what = "must fail" if must_fail else "must pass (one head: 1/sqrt(E) is 1/sqrt(E/heads))"
        where = f", first local failure: {local[0]}" if local else ""
        lines.append(f"{'PASS' if good else 'FAIL'} broken.py on {rel} {what}: {status}{where}")
    return ok, lines


def check_forcing(fixtures):
    """Teacher forcing, in-process, for every supported fixture: forced with the program's own float64
    components, every local component is its own component bit for bit (names and layouts agree); and
    in the encoder stack, a perturbed layers.0.output moves the locals of exactly the ops that read it."""
    import run  # noqa: E402  (beside this file)
    lines, ok, n = [], True, 0
    for fixture in fixtures:
        p = tparity_io.load_problem(fixture)
        try:
            _, own, _ = run.compute(p, "float64")
        except run.attention.Unsupported:
            continue
        p.components = own
        _, _, local = run.compute(p, "float64")
        same = local.keys() == own.keys() and all(np.array_equal(local[k], own[k], equal_nan=True) for k in own)
        ok &= same
        n += 1
        if not same:
            lines.append(f"FAIL teacher forcing by its own components changes {os.path.basename(fixture)}")
        if os.path.basename(fixture) == "encoder_stack_norm.json" and same:
            p.components = dict(own, **{"layers.0.output": own["layers.0.output"] * 1.001})
            _, _, moved = run.compute(p, "float64")
            changed = [k for k in own if not np.array_equal(moved[k], own[k], equal_nan=True)]
            consumers = ["layers.1.sa.q", "layers.1.sa.k", "layers.1.sa.v", "layers.1.norm1"]  # read it directly
            good = changed == consumers
            ok &= good
            lines.append(f"{'PASS' if good else 'FAIL'} teacher forcing, {os.path.relpath(fixture, ROOT)}: "
                         f"layers.0.output x 1.001 moves the locals of exactly its consumers: {', '.join(changed)}")
    lines.insert(0, f"{'PASS' if ok else 'FAIL'} teacher forcing by its own components reproduces every "
                    f"component bit for bit ({n} fixtures)")
    return ok, lines


def write_safetensors(path, arrays):
    """With the safetensors package when it is installed (an independent writer), else by hand."""
    try:
        from safetensors.numpy import save_file
        save_file({k: np.ascontiguousarray(v) for k, v in arrays.items()}, path)
        return "safetensors package"
    except ImportError:
        codes = {"float64": "F64", "float32": "F32", "bool": "BOOL", "int64": "I64"}
        header, blobs, offset = {}, [], 0
        for k, v in arrays.items():
            b = np.ascontiguousarray(v).astype(v.dtype.newbyteorder("<")).tobytes()
            header[k] = {"dtype": codes[str(v.dtype)], "shape": list(v.shape),
                         "data_offsets": [offset, offset + len(b)]}
            blobs.append(b)
            offset += len(b)
        h = json.dumps(header).encode()
        h += b" " * (-len(h) % 8)
        with open(path, "wb") as f:
            f.write(len(h).to_bytes(8, "little") + h + b"".join(blobs))
        return "a hand-written writer"


def expect_error(path, *words):
    """load_problem(path) raises ValueError whose message names every word (files, fields)."""
    try:
        tparity_io.load_problem(path)
    except ValueError as e:
        return all(w in str(e) for w in words), str(e)
    return False, "no error"


def check_io(tmp):
    """tparity_io: safetensors-backed tensors read as inline ones; malformed files refused by name."""
    lines, ok = [], True
    # mha_kdim_vdim: float64 and bool tensors; llama_layer: float32 and int64 ones too, and components
    for fixture in ("llama_layer", "mha_kdim_vdim"):
        src = os.path.join(ROOT, "fixtures", "torch-2.13", fixture + ".json")
        inline = tparity_io.load_problem(src)
        with open(src) as f:
            doc = json.load(f)
        arrays = {}
        for group in ("state_dict", "inputs", "outputs", "outputs_float32", "components", "components_float32"):
            for name in doc.get(group, {}):
                a = getattr(inline, group)[name]
                arrays[f"{group}/{name}"] = a
                doc[group][name] = {"dtype": str(a.dtype), "shape": list(a.shape), "file": f"{group}/{name}"}
        doc["tensor_file"] = "t.safetensors"
        problem = os.path.join(tmp, "t.json")
        with open(problem, "w") as f:
            json.dump(doc, f)
        writer = write_safetensors(os.path.join(tmp, "t.safetensors"), arrays)
        filed = tparity_io.load_problem(problem)
        same = all(a.dtype == getattr(filed, g)[n].dtype and np.array_equal(a, getattr(filed, g)[n], equal_nan=True)
                   for k, a in arrays.items() for g, n in [k.split("/", 1)])
        ok &= same
        dtypes = ", ".join(sorted({str(a.dtype) for a in arrays.values()}))
        lines.append(f"{'PASS' if same else 'FAIL'} tparity_io reads {fixture}'s {len(arrays)} tensors ({dtypes}) "
                     f"from a safetensors file ({writer}) to the bits of the inline fixture")

    def broken(name, edit, *words):
        nonlocal ok
        d = json.loads(json.dumps(doc))
        edit(d)
        path = os.path.join(tmp, name)
        with open(path, "w") as f:
            json.dump(d, f)
        good, msg = expect_error(path, path, *words)
        ok &= good
        lines.append(f"{'PASS' if good else 'FAIL'} tparity_io refuses {name}: {msg}")

    broken("unreferenced.json", lambda d: d["outputs"].pop("attn_weights"), "tensor_file", "outputs/attn_weights")
    broken("wrong_shape.json", lambda d: d["inputs"]["key"].update(shape=[2, 6, 13]), "inputs.key.file", "[2, 6, 13]")
    broken("short_data.json", lambda d: d["state_dict"].update(
        {"out_proj.bias": {"dtype": "float64", "shape": [16], "data": [0.0] * 15}}),
        "state_dict.out_proj.bias.data", "expected 16 values")
    with open(os.path.join(tmp, "t.safetensors"), "rb") as f:
        blob = f.read()
    with open(os.path.join(tmp, "t.safetensors"), "wb") as f:
        f.write(blob[:-4])  # truncated: the last tensor's bytes stop short
    good, msg = expect_error(problem, problem, "tensor_file", os.path.join(tmp, "t.safetensors"), "end at byte")
    ok &= good
    lines.append(f"{'PASS' if good else 'FAIL'} tparity_io refuses a truncated safetensors file: {msg}")

    out = os.path.join(tmp, "o.json")
    x = np.array([1 / 3, math.inf, -math.inf, math.nan, -0.0], dtype=np.float32)
    tparity_io.write_outputs(out, "float32", {"output": x})
    with open(out) as f:
        back = tensors(json.load(f), "outputs")["output"]
    good = back.dtype == np.float32 and np.array_equal(back, x, equal_nan=True) and np.signbit(back[4])
    ok &= good
    lines.append(f"{'PASS' if good else 'FAIL'} write_outputs round-trips float32 1/3, inf, -inf, nan, -0.0 exactly")

    # round_bfloat16 on every pair of neighbouring finite bfloat16 values lo < hi: both stay, their
    # midpoint goes to the even one, a float32 step either side of it to the nearer.
    h = np.arange(0, 0x7F7F, dtype=np.uint32)
    lo, hi = (h << np.uint32(16)).view(np.float32), ((h + np.uint32(1)) << np.uint32(16)).view(np.float32)
    mid = ((lo.astype(np.float64) + hi) / 2).astype(np.float32)
    even = np.where(h % 2 == 0, lo, hi)
    r = tparity_io.round_bfloat16
    good = (np.array_equal(r(lo), lo) and np.array_equal(r(hi), hi) and np.array_equal(r(mid), even)
            and np.array_equal(r(np.nextafter(mid, np.float32(0))), lo)
            and np.array_equal(r(np.nextafter(mid, np.float32(np.inf))), hi) and np.array_equal(r(-mid), -even))
    ok &= good
    lines.append(f"{'PASS' if good else 'FAIL'} round_bfloat16: every finite bfloat16 kept, ties to even, the rest "
                 f"to the nearer")
    good, msg = True, ""
    try:
        tparity_io.write_outputs(out, "bfloat16", {"output": np.array([1 / 3], dtype=np.float32)})
        good = False
    except ValueError as e:
        msg = str(e)
        good = "not bfloat16" in msg
    tparity_io.write_outputs(out, "bfloat16", {"output": r(np.array([1 / 3], dtype=np.float32))})
    with open(out) as f:
        doc = json.load(f)
    good = good and doc["dtype"] == "bfloat16" and doc["outputs"]["output"]["dtype"] == "bfloat16"
    ok &= good
    lines.append(f"{'PASS' if good else 'FAIL'} write_outputs writes a bfloat16 run's rounded float32 arrays as "
                 f"bfloat16 and refuses unrounded ones: {msg}")

    # tensors="safetensors": every tensor in the file beside the JSON, bit for bit, read back by the
    # safetensors package (an independent reader); bfloat16 as BF16; an outputs path that would be
    # its own tensor file refused.
    try:
        from safetensors.numpy import load_file
        from safetensors.torch import load_file as load_torch  # numpy has no bfloat16
    except ImportError:
        load_file = None
    wide = np.array([1 / 3, 1e300, -0.0, math.nan], dtype=np.float64)
    for dtype, arrays in (("float32", {"output": x, "attn_weights": wide}), ("bfloat16", {"output": r(x)}),
                          ("float16", {"output": x.astype(np.float16)})):
        out = os.path.join(tmp, f"st_{dtype}.json")
        tparity_io.write_outputs(out, dtype, arrays, {"q": arrays["output"]}, tensors="safetensors")
        with open(out) as f:
            doc = json.load(f)
        st = os.path.join(tmp, f"st_{dtype}.safetensors")
        good = doc.get("tensor_file") == os.path.basename(st) and os.path.isfile(st)
        if good and load_file:
            back = load_file(st) if dtype != "bfloat16" else {
                k: v.float().numpy() for k, v in load_torch(st).items() if str(v.dtype) == "torch.bfloat16"}
            for key, group in (("outputs", arrays), ("components", {"q": arrays["output"]})):
                for name, a in group.items():
                    got = back.get(f"{key}.{name}", np.zeros(0))
                    good &= (doc[key][name] == {"dtype": dtype if a.dtype == np.float32 else a.dtype.name,
                                                "shape": list(a.shape), "file": f"{key}.{name}"}
                             and got.dtype == a.dtype and np.array_equal(got.view(np.uint8), a.view(np.uint8)))
        ok &= good
        lines.append(f"{'PASS' if good else 'FAIL'} write_outputs(tensors=\"safetensors\") in {dtype}: every tensor "
                     f"bit for bit in the file beside the JSON"
                     f"{'' if load_file else ' (safetensors not installed: file present only)'}")
    # The tensor file's name, as tparity names one beside a JSON: never the outputs file itself, never
    # the tensor file of a problem "case.json" beside an outputs file "case.out".
    names = {}
    for name in ("o.safetensors", "case.out", "x.float64.out.json", ".json"):
        tparity_io.write_outputs(os.path.join(tmp, name), "float32", {"output": x}, tensors="safetensors")
        with open(os.path.join(tmp, name)) as f:
            names[name] = json.load(f).get("tensor_file")
    good = names == {"o.safetensors": "o.safetensors.safetensors", "case.out": "case.out.safetensors",
                     "x.float64.out.json": "x.float64.out.safetensors", ".json": ".json.safetensors"}
    ok &= good
    lines.append(f"{'PASS' if good else 'FAIL'} write_outputs names the tensor file as tparity does: {names}")
    # A NaN whose payload lies in float32's low 16 bits is a NaN in bfloat16 too, not inf.
    odd = np.array([1.0, 0.0], dtype=np.float32)
    odd.view(np.uint32)[1] = 0x7F800001
    tparity_io.write_outputs(os.path.join(tmp, "nan.json"), "bfloat16", {"output": odd}, tensors="safetensors")
    good = True
    if load_file:
        back = load_torch(os.path.join(tmp, "nan.safetensors"))["outputs.output"].float().numpy()
        good = back[0] == 1.0 and np.isnan(back[1])
    ok &= good
    lines.append(f"{'PASS' if good else 'FAIL'} write_outputs keeps a low-payload NaN a NaN in bfloat16")
    return ok, lines


def main(argv):
    fixtures = argv or sorted(glob.glob(os.path.join(ROOT, "fixtures", "torch-2.13", "*.json")) +
                              glob.glob(os.path.join(ROOT, "fixtures", "torch-1.13", "*.json")))
    counts = {"pass": 0, "skip": 0, "fail": 0}
    with tempfile.TemporaryDirectory(prefix="numpy_attention-") as tmp:
        for fixture in fixtures:
            status, detail, _ = compare(fixture, os.path.join(HERE, "run.py"), tmp)
            counts[status] += 1
            name = os.path.relpath(fixture, os.path.join(ROOT, "fixtures"))
            print(f"{status.upper():4} {name}: {detail}", flush=True)
        extra_ok = True
        if not argv:
            for check in (lambda: check_forcing(fixtures), lambda: check_broken(tmp), lambda: check_io(tmp)):
                ok, lines = check()
                extra_ok &= ok
                print("\n".join(lines), flush=True)
    print(f"{counts['pass']} passed, {counts['skip']} skipped (unsupported), {counts['fail']} failed"
          + ("" if argv else f"; protocol checks {'passed' if extra_ok else 'FAILED'}"))
    return 0 if counts["fail"] == 0 and extra_ok else 1


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
