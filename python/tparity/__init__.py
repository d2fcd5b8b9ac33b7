"""tparity from Python: your PyTorch module or Python function checked against PyTorch in one call.

    import tparity
    result = tparity.check(module=lambda config: MyBlock(config), case="gpt2", without=["padding"],
                           weights={"attn.c_attn.weight": "attn.qkv.weight"}, transpose=["attn.c_attn.weight"],
                           hooks={"mlp.act": "mlp.gelu"})
    assert result.passed, result

The call drives the tparity CLI (`tparity exec`): the same cases, fixtures, legs, gates, report,
JUnit and baseline as any program, with your code run in this process. `tparity.record(name, value)`
inside your code gives a component by its canonical name (`tparity components --case C`); hooks=
takes them from submodules' outputs. The pytest plugin (`@pytest.mark.tparity(...)` and the
`tparity_case` fixture) makes one test per case and precision. Docs: docs/python.md.
"""

from ._check import CaseResult, Result, TparityFailure, check
from ._cli import UsageError, binary
from ._record import record, scope
from ._run import Unsupported

__all__ = ["check", "record", "scope", "Result", "CaseResult", "TparityFailure", "Unsupported", "UsageError",
           "binary"]
__version__ = "0.1.0"
