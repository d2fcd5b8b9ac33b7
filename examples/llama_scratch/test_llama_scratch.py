"""model.py's Llama layer against transformers' LlamaDecoderLayer, through tparity: one test per
precision on the llama case shaped to what the model supports, and both planted slips named."""
import pytest
import tparity
from model import HEAD_SPLIT, HOOK_INPUTS, HOOKS, from_config

HOW = dict(hooks={**HOOKS, **HEAD_SPLIT, **{c: m + ":input" for c, m in HOOK_INPUTS.items()}})
CASE = dict(case="llama", without=["positions", "decode", "head-dim"])  # what the model lacks


@pytest.mark.tparity(**CASE)
def test_layer(tparity_case):
    tparity_case.check(module=from_config, **HOW)


@pytest.mark.parametrize("slip, component, precisions", [
    ("float32-rope", "attn.q_rot", {"hand64_vs_torch64"}),  # a float32 table: float64's leg alone
    ("swapped-heads", "attn.q_rot", {"hand64_vs_torch64", "hand32_vs_torch64"}),
])
def test_slips_are_named(slip, component, precisions):
    r = tparity.check(module=lambda config: from_config(config, slip=slip), **CASE, **HOW)
    assert not r.passed and r.cases[0].first_divergence == component
    assert {f["leg"] for f in r.cases[0].failures if f["component"] == component} == precisions
