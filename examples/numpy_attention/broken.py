"""run.py with one classic mistake: the attention scores scaled by 1/sqrt(E), the whole embedding width,
instead of 1/sqrt(E / heads), a head's. Invisible with one head; with more, every softmax is too flat.
tparity should fail it and name `scores` as the first local divergence.

    tparity exec -- python3 examples/numpy_attention/broken.py {problem} {out} {dtype}
"""

import math
import os
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import attention  # noqa: E402
import run  # noqa: E402


def score_scale(embed_dim, num_heads):
    return 1.0 / math.sqrt(embed_dim)  # the mistake: should be embed_dim // num_heads


attention.score_scale = score_scale

if __name__ == "__main__":
    sys.exit(run.main(sys.argv[1:]))
