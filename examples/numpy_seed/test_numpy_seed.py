"""attention.py's numpy Llama layer against transformers' LlamaDecoderLayer, through tparity, on the
committed fixture whose element 1 is left-padded (query rows that see no key): one test per precision,
and the NaN-on-masked-rows slip named at its component."""
import pytest
import tparity
from attention import FORWARD, llama_layer

FIXTURE = "../../fixtures/torch-2.13/llama_layer.json"


def run(problem, dtype, slip=None):
    cast = lambda a: a.astype(dtype) if a.dtype.kind == "f" else a
    args = {FORWARD[k]: cast(v) for k, v in problem.inputs.items()}
    y, components = llama_layer(**args, sd={k: cast(v) for k, v in problem.state_dict.items()},
                                cfg=problem.config, slip=slip)
    for name, value in components.items():
        tparity.record(name, value)
    return y


@pytest.mark.tparity(fixture=FIXTURE, local=False)
def test_llama_layer(tparity_case):
    tparity_case.check(function=run)


def test_nan_on_masked_rows_is_named_at_the_weights():
    r = tparity.check(function=lambda p, d: run(p, d, slip="nan-masked-rows"), fixture=FIXTURE, local=False)
    assert not r.passed
    assert r.failing_components[0] == "attn.attn_weights"
