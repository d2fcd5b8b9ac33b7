#!/usr/bin/env python3
"""A stand-in foreign implementation for tparity exec's tests: standard library only.

    program.py MODE PROBLEM OUT DTYPE

echo          writes the reference's own results as its outputs and components (float32: the
              reference's float32 ones), and the reference's float64 components as its local ones:
              an implementation as good as the reference
echo-no-comp  the same outputs, no components
bad-scores    echo, with every score (and the local scores) times 1.001 in float64 and float32
crash         exits with code 3 after writing half a file
segv          kills itself with SIGSEGV
hang          sleeps for an hour
silent        exits 0 and writes nothing
malformed     writes a file that is not JSON
wrong-shape   echo, with "output" one element short
wrong-name    echo, with a component named "qq"
wrong-dtype   echo, its "dtype" the other precision
unsupported   declines the problem
echo-unless-sdpa  declines sdpa, echo otherwise
partial       echo with one component alone (q, where the problem has it) and no local ones
partial-bad-q partial, its q 0.1% off
coarse        echo, every output and component value kept to 4 significant bits (rel. error ~ 2^-5)
slip          echo, but in float64 every component but q, k and v (the scores and what follows them),
              and the outputs, rounded to float32: a float32 value inside float64 code (rel. error ~ 3e-8)
slip-coarse   slip in float64, coarse in float32: the float32 legs fail too
nan-masked    echo, but every row of an attention weights component (last axis) whose reference
              values are all equal (a query that sees no key: uniform weights) is NaN, in both precisions

In a bfloat16 or float16 run, echo writes the reference's float64 results under that dtype (tparity reads
them rounded to it).
"""
import json
import math
import os
import signal
import struct
import sys
import time


def main():
    mode, problem, out, dtype = sys.argv[1:5]
    if mode == "crash":
        with open(out, "w") as f:
            f.write('{"format": "tparity.outp')
        sys.exit(3)
    if mode == "segv":
        os.kill(os.getpid(), signal.SIGSEGV)
    if mode == "hang":
        time.sleep(3600)
    if mode == "silent":
        return
    if mode == "malformed":
        with open(out, "w") as f:
            f.write("this is not JSON\n")
        return
    if mode == "unsupported" or (mode == "echo-unless-sdpa" and os.path.basename(problem) == "sdpa.json"):
        doc = {"format": "tparity.outputs", "version": 1, "unsupported": "a stand-in implements nothing"}
        with open(out, "w") as f:
            json.dump(doc, f)
        return
    with open(problem) as f:
        p = json.load(f)
    f32 = dtype == "float32"
    outputs = p["outputs_float32"] if f32 else p["outputs"]
    comps = p["components_float32"] if f32 else p["components"]
    local = {k: dict(v, dtype=dtype) for k, v in p["components"].items()}
    outputs = {k: dict(v, dtype=dtype) for k, v in outputs.items()}
    comps = {k: dict(v, dtype=dtype) for k, v in comps.items()}
    doc = {"format": "tparity.outputs", "version": 1, "dtype": dtype, "outputs": outputs}
    if mode in ("partial", "partial-bad-q"):
        first = "q" if "q" in comps else next(iter(comps))
        doc["components"] = {first: comps[first]}
        if mode == "partial-bad-q":
            q = comps[first]
            q["data"] = [x * 1.001 if isinstance(x, float) else x for x in q["data"]]
    elif mode != "echo-no-comp":
        doc["components"] = comps
        doc["local"] = local
    if mode == "bad-scores":
        for d in (comps, local):
            s = d["scores"]
            s["data"] = [x * 1.001 if isinstance(x, float) else x for x in s["data"]]
    if mode in ("slip", "slip-coarse") and not f32:
        def f32_round(x):
            return struct.unpack("f", struct.pack("f", x))[0] if isinstance(x, float) and math.isfinite(x) else x
        for name, t in comps.items():  # every component from the scores on (the file's order is not dataflow's)
            if name.split(".")[-1] not in ("q", "k", "v"):
                t["data"] = [f32_round(x) for x in t["data"]]
        for t in outputs.values():
            t["data"] = [f32_round(x) for x in t["data"]]
    if mode == "nan-masked":
        for name, t in comps.items():
            if not name.endswith("attn_weights"):
                continue
            n = t["shape"][-1]
            data = t["data"]
            for r in range(0, len(data), n):
                row = data[r:r + n]
                if all(isinstance(x, float) for x in row) and max(row) == min(row):
                    data[r:r + n] = ["nan"] * n
    if mode in ("coarse", "slip-coarse") and (mode == "coarse" or f32):
        def coarse(x):
            if not isinstance(x, float) or not math.isfinite(x) or x == 0:
                return x
            m, e = math.frexp(x)
            return math.ldexp(round(m * 16) / 16, e)
        for d in (outputs, comps):
            for t in d.values():
                t["data"] = [coarse(x) for x in t["data"]]
    if mode == "wrong-shape":
        o = outputs["output"]
        o["data"] = o["data"][:-1]
        o["shape"] = [len(o["data"])]
    if mode == "wrong-name":
        comps["qq"] = comps["output"]
    if mode == "wrong-dtype":
        doc["dtype"] = "float64" if f32 else "float32"
    with open(out, "w") as f:
        json.dump(doc, f)


if __name__ == "__main__":
    main()
