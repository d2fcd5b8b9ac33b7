"""run.py with one classic low-precision mistake: the linear layers' dot products accumulate in float16
(every product and every partial sum rounded to float16) instead of float32, as a hand-written float16
kernel without a float32 accumulator does. The error grows with the reduction's length, where a float32
accumulator's stays at one rounding of the result. tparity exec --dtype float16 should fail it against
LibTorch's own float16 error.

    tparity exec --dtype float16 -- python3 examples/numpy_attention/half_accumulate.py {problem} {out} {dtype}
"""

import os
import sys

import numpy as np

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import attention  # noqa: E402
import run  # noqa: E402


def linear(x, weight, bias=None):
    # x is (..., IN), weight is (OUT, IN), bias is (OUT); out will be (..., OUT)
    x16, w16 = x.astype(np.float16), weight.astype(np.float16)
    acc = np.zeros(x.shape[:-1] + (weight.shape[0],), np.float16)
    for k in range(x.shape[-1]):  # the mistake: a float16 accumulator
        acc = acc + x16[..., k:k + 1] * w16[:, k]
    y = acc.astype(x.dtype)
    return y if bias is None else y + bias


attention.linear = linear

if __name__ == "__main__":
    sys.exit(run.main(sys.argv[1:]))
