"""model.py's GPT-2 block against transformers' GPT2Block, through tparity: one test per precision,
and the exact-GELU slip named at its component. The model has no padding: the case runs without it."""
import pytest
import tparity
from model import HOOK_INPUTS, HOOKS, TRANSPOSE, from_config

HOW = dict(transpose=TRANSPOSE, hooks={**HOOKS, **{c: m + ":input" for c, m in HOOK_INPUTS.items()}})
CASE = dict(case="gpt2", options={"mask": "causal"})


@pytest.mark.tparity(**CASE)
def test_block(tparity_case):
    tparity_case.check(module=from_config, **HOW)


def test_exact_gelu_is_named_at_mlp_act():
    r = tparity.check(module=lambda config: from_config(config, slip="exact-gelu"), **CASE, **HOW)
    assert not r.passed
    assert r.cases[0].first_divergence == "mlp.act"
