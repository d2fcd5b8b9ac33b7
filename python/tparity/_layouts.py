"""The user's layouts to tparity's canonical ones, and back.

A component's canonical layout is the reference's (`tparity components --case C`): heads split as
[B, heads, T, head_dim], key/value heads as many as the class has (grouped-query attention is not
repeated), masked scores holding -inf, MultiheadAttention's averaged weights as [B, T, S]. User code
holds them in other shapes; a Layout is found from the two shapes alone and applied to numpy arrays:

    identity                          the same shape
    [B, T, H, D]   -> [B, H, T, D]    heads split, not yet transposed
    [B, T, H*D]    -> [B, H, T, D]    heads not yet split
    [B, H, T, D]   -> [B, T, H*D]     the context before merging the heads
    [B, T, H, D]   -> [B, T, H*D]
    [B, H, T, D]   -> [B, KV, T, D]   k or v repeated for grouped-query attention (repeat_interleave or
                                      repeat_kv; checked: every copy must be equal)
    [B, H, T, S]   -> [B, T, S]       per-head weights averaged over the heads (not invertible)
    [1, ...] <-> [...]                a batch dimension of one added or dropped

When two layouts fit the shapes (heads as many as positions), the one nearest the reference is taken;
and, on top of any of them, a fill of -1e4 or below where the reference holds -inf (a mask written as
masked_fill(-1e9) or finfo.min) reads as -inf.
"""

import numpy as np

# -1e4 as bfloat16 holds it (masked_fill(-1e4) in a bfloat16 run stores its nearest, -9984); float16
# and wider hold -1e4 itself.
_FILL = -9984.0


class Layout:
    def __init__(self, name, forward, inverse=None):
        self.name, self._forward, self._inverse = name, forward, inverse

    @property
    def invertible(self):
        return self._inverse is not None

    def forward(self, a):
        return self._forward(a)

    def inverse(self, a):
        return self._inverse(a)


def _identity():
    return Layout("identity", lambda a: a, lambda a: a)


def _candidates(u, s):
    """Layouts taking shape u to shape s, simplest first."""
    u, s = tuple(u), tuple(s)
    out = []
    if u == s:
        out.append(_identity())
    if len(u) == 4 and len(s) == 4 and u == (s[0], s[2], s[1], s[3]):
        out.append(Layout("[B,T,H,D]", lambda a: a.transpose(0, 2, 1, 3), lambda a: a.transpose(0, 2, 1, 3)))
    if len(u) == 3 and len(s) == 4 and u == (s[0], s[2], s[1] * s[3]):
        out.append(Layout("[B,T,H*D]", lambda a: a.reshape(s[0], s[2], s[1], s[3]).transpose(0, 2, 1, 3),
                          lambda a: a.transpose(0, 2, 1, 3).reshape(u)))
    if len(u) == 4 and len(s) == 3 and u[0] == s[0] and u[1] * u[3] == s[2] and u[2] == s[1]:
        out.append(Layout("[B,H,T,D]", lambda a: a.transpose(0, 2, 1, 3).reshape(s),
                          lambda a: a.reshape(u[0], u[2], u[1], u[3]).transpose(0, 2, 1, 3)))
    if len(u) == 4 and len(s) == 3 and u[:2] == s[:2] and u[2] * u[3] == s[2]:
        out.append(Layout("[B,T,H,D]", lambda a: a.reshape(s), lambda a: a.reshape(u)))
    if len(u) == 4 and len(s) == 3 and (u[0], u[2], u[3]) == s:
        out.append(Layout("per-head weights, averaged", lambda a: a.mean(axis=1)))
    if len(u) + 1 == len(s) and s[0] == 1 and u == s[1:]:
        out.append(Layout("no batch dimension", lambda a: a[None], lambda a: a[0]))
    if len(u) == len(s) + 1 and u[0] == 1 and u[1:] == s:
        out.append(Layout("a batch dimension of one", lambda a: a[0], lambda a: a[None]))
    return out


def _grouped(u, s):
    """[B, H, T, D] (or [B, T, H, D]) holding each of KV heads H / KV times -> [B, KV, T, D]: the
    layouts to try, each checking that the copies are equal."""
    u, s = tuple(u), tuple(s)
    out, shapes = [], []
    if len(u) == 4 and len(s) == 4:
        if (u[0], u[2], u[3]) == (s[0], s[2], s[3]):
            shapes.append(("", lambda a: a, lambda a: a, u[1]))
        if (u[0], u[1], u[3]) == (s[0], s[2], s[3]):
            shapes.append((" [B,T,H,D]", lambda a: a.transpose(0, 2, 1, 3), lambda a: a.transpose(0, 2, 1, 3), u[2]))
    for label, pre, post, heads in shapes:
        kv = s[1]
        if heads <= kv or heads % kv:
            continue
        g = heads // kv

        def interleaved(a, pre=pre, g=g):
            b = pre(a)
            return b[:, ::g]

        def tiled(a, pre=pre, kv=kv):
            return pre(a)[:, :kv]
        out.append((Layout("repeated key/value heads (repeat_interleave)" + label, interleaved,
                           lambda a, post=post, g=g: post(np.repeat(a, g, axis=1))),
                    lambda a, pre=pre, g=g: all(np.array_equal(pre(a)[:, j::g], pre(a)[:, ::g], equal_nan=True)
                                                for j in range(g))))
        out.append((Layout("repeated key/value heads (tiled)" + label, tiled,
                           lambda a, post=post, g=g: post(np.tile(a, (1, g, 1, 1)))),
                    lambda a, pre=pre, kv=kv, g=g: all(np.array_equal(pre(a)[:, j * kv:(j + 1) * kv], pre(a)[:, :kv],
                                                                      equal_nan=True) for j in range(g))))
    return out


def _distance(a, reference):
    """How far a is from the reference: the summed difference where both are finite, every position
    where only one is (or the two differ in sign of infinity) counted as infinitely far."""
    a, r = np.asarray(a, np.float64), np.asarray(reference, np.float64)
    both = np.isfinite(a) & np.isfinite(r)
    if not np.array_equal(a[~both], r[~both], equal_nan=True):
        return np.inf
    return float(np.abs(a[both] - r[both]).sum())


def find(name, array, shape, reference=None):
    """The Layout taking `array` (the user's) to the canonical `shape`, or raise ValueError naming the
    component and both shapes. When the shapes alone fit more than one layout (heads as many as
    positions: [B, T, H, D] and [B, H, T, D] are the same shape), the one that takes the array nearest
    the reference's canonical value (its finite values; a masked -inf stays -inf in none of them) is
    the user's. Each candidate is a layout user code holds: the values judged are still the user's,
    and code that holds them in one layout and uses them as another fails at the next component."""
    c = _candidates(array.shape, shape)
    if len(c) > 1 and reference is not None and tuple(reference.shape) == tuple(shape):
        return min(c, key=lambda layout: _distance(to_canonical(layout, array, reference), reference))
    if c:
        return c[0]
    for layout, fits in _grouped(array.shape, shape):
        if fits(array):
            return layout
    raise ValueError(f"component {name}: shape {list(array.shape)} fits no layout of the canonical "
                     f"{list(shape)} (tparity components lists each one's layout)")


def to_canonical(layout, array, reference=None):
    """array in the canonical layout; with the reference, fills at its -inf read as -inf."""
    a = layout.forward(array)
    if reference is not None and a.dtype.kind == "f" and a.shape == reference.shape:
        masked = np.isneginf(reference) & (a <= _FILL)
        if masked.any():
            a = np.where(masked, -np.inf, a).astype(a.dtype)
    return a


def from_canonical(layout, reference, like):
    """The reference's canonical value in the user's layout `like` (the user's own array): where the
    reference holds -inf the user's own value stays (its fill convention)."""
    a = layout.inverse(reference).astype(like.dtype)
    if a.shape != like.shape:
        raise ValueError(f"layout {layout.name}: expected {list(like.shape)}, got {list(a.shape)}")
    masked = np.isneginf(a) & (like <= _FILL) if a.dtype.kind == "f" else None
    return np.where(masked, like, a) if masked is not None and masked.any() else a
