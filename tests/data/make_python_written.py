#!/usr/bin/env python3
"""Writes tests/data/python_written.safetensors with Python's safetensors package (safetensors.torch,
as PyTorch users save weights), so that tests/test_safetensors.cpp reads a file tparity did not write.
The values are typed by hand into that test: change both together. Every value is exact in its dtype.
Run with the project's venv (torch and safetensors): .venv/bin/python tests/data/make_python_written.py"""
import os

import torch
from safetensors.torch import save_file

OUT = os.path.join(os.path.dirname(os.path.abspath(__file__)), "python_written.safetensors")
inf, nan = float("inf"), float("nan")

tensors = {
    "f32": torch.tensor([[0.25, -1.5, 3.0], [-0.0, 1024.5, -7.75]], dtype=torch.float32),
    "f64": torch.tensor([0.1, -1e300, 2.5], dtype=torch.float64),
    # 65504 is binary16's largest finite value, 2**-24 its smallest subnormal; 0.333251953125 is
    # 1365 / 4096, the binary16 nearest 1/3.
    "f16": torch.tensor([[1.0, -2.0, 0.5], [65504.0, 2.0**-24, inf], [-0.0, 0.333251953125, nan]], dtype=torch.float16),
    # 3.140625 = 201 / 64; 2**-133 is bfloat16's smallest subnormal.
    "bf16": torch.tensor([[1.0, -5.0, 3.140625, inf], [-inf, 2.0**-133, nan, -0.0]], dtype=torch.bfloat16),
    "mask": torch.tensor([[True, False, True], [False, False, True]]),
    "ids": torch.tensor([0, -1, 2**53, -(2**53), 123456789012], dtype=torch.int64),
    "i32": torch.tensor([-2147483648, 2147483647, 7], dtype=torch.int32),
    "i16": torch.tensor([-32768, 32767], dtype=torch.int16),
    "i8": torch.tensor([-128, 127, 0], dtype=torch.int8),
    "u8": torch.tensor([0, 255, 17], dtype=torch.uint8),
    "scalar": torch.tensor(7.5, dtype=torch.float32),
    "empty": torch.zeros((0, 3), dtype=torch.float32),
}
save_file(tensors, OUT, metadata={"format": "pt", "source": "tests/data/make_python_written.py"})
print(OUT, os.path.getsize(OUT), "bytes")
