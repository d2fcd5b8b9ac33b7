"""Components from inside user code: tparity.record(name, value) and tparity.scope(prefix).

A check runs the user's code twice per float64/float32 run. In the first pass record() stores what it
is given and returns it unchanged. In the second pass (the local one) it stores what it is given as
the *local* component and returns the reference's value instead, in the caller's layout and dtype, so
that every later op runs on the reference's inputs: the local legs then name the first wrong op.
Outside a check, record() returns its value and does nothing.
"""

import contextlib
import contextvars

_ACTIVE = contextvars.ContextVar("tparity_recorder", default=None)
_PREFIX = contextvars.ContextVar("tparity_prefix", default="")


def record(name, value):
    """Record `value` as the canonical component `name` (see `tparity components --case C`) and return
    the value to go on with: `value` itself, or in the local pass the reference's. Use the return
    value: `q = tparity.record("attn.q", q)`."""
    recorder = _ACTIVE.get()
    if recorder is None:
        return value
    return recorder.record(_PREFIX.get() + name, value)


@contextlib.contextmanager
def scope(prefix):
    """Names recorded inside get `prefix.` in front: `with tparity.scope("step.0"): ...` for the
    components of a decode session's first step."""
    token = _PREFIX.set(_PREFIX.get() + prefix.rstrip(".") + ".")
    try:
        yield
    finally:
        _PREFIX.reset(token)


@contextlib.contextmanager
def recording(recorder):
    token = _ACTIVE.set(recorder)
    try:
        yield recorder
    finally:
        _ACTIVE.reset(token)
