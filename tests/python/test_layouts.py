"""The layouts tparity.check converts (python/tparity/_layouts.py): each found from the shapes, taken
to the canonical one and back. Expected values are built with numpy directly, not by the code."""

import numpy as np
import pytest

from tparity import _layouts

rng = np.random.default_rng(0)
B, H, KV, T, D = 2, 4, 2, 5, 3
canon = rng.standard_normal((B, H, T, D))


@pytest.mark.parametrize("user, shape, name", [
    (canon.transpose(0, 2, 1, 3).copy(), (B, H, T, D), "[B,T,H,D]"),
    (canon.transpose(0, 2, 1, 3).reshape(B, T, H * D).copy(), (B, H, T, D), "[B,T,H*D]"),
    (canon, (B, H, T, D), "identity"),
])
def test_heads_round_trip(user, shape, name):
    layout = _layouts.find("attn.q", user, shape)
    assert layout.name == name
    assert np.array_equal(_layouts.to_canonical(layout, user), canon)
    assert np.array_equal(layout.inverse(canon), user)


def test_context_before_merge():
    ctx = canon.transpose(0, 2, 1, 3).reshape(B, T, H * D)  # canonical context [B, T, H*D]
    layout = _layouts.find("attn.context", canon, ctx.shape)
    assert np.array_equal(layout.forward(canon), ctx)
    assert np.array_equal(layout.inverse(ctx), canon)


def test_grouped_query_heads_repeated():
    k = rng.standard_normal((B, KV, T, D))
    for user in (np.repeat(k, H // KV, axis=1), np.tile(k, (1, H // KV, 1, 1))):
        layout = _layouts.find("attn.k", user, k.shape)
        assert np.array_equal(layout.forward(user), k)
        assert np.array_equal(layout.inverse(k), user)


def test_grouped_heads_that_differ_fit_no_layout():
    user = rng.standard_normal((B, H, T, D))  # four distinct heads cannot be two repeated
    with pytest.raises(ValueError, match=r"attn.k: shape \[2, 4, 5, 3\] fits no layout of the canonical \[2, 2, 5, 3\]"):
        _layouts.find("attn.k", user, (B, KV, T, D))


def test_per_head_weights_averaged_and_not_invertible():
    w = rng.random((B, H, T, T))
    layout = _layouts.find("attn_weights", w, (B, T, T))
    assert np.allclose(layout.forward(w), (w[:, 0] + w[:, 1] + w[:, 2] + w[:, 3]) / 4)
    assert not layout.invertible


def test_masked_fill_reads_as_minus_inf_and_goes_back():
    ref = np.array([[0.5, -np.inf], [0.25, 0.75]])
    mine = np.array([[0.5, -1e9], [0.25, 0.75]])
    layout = _layouts.find("scores", mine, ref.shape)
    got = _layouts.to_canonical(layout, mine, ref)
    assert got[0, 1] == -np.inf and got[0, 0] == 0.5
    # unmasked by the user (a finite score where the reference masks) stays, so it shows as a difference
    unmasked = np.array([[0.5, 0.3], [0.25, 0.75]])
    assert _layouts.to_canonical(layout, unmasked, ref)[0, 1] == 0.3
    # back in the user's layout, the user's own fill stays where the reference has -inf
    assert _layouts.from_canonical(layout, ref, mine)[0, 1] == -1e9


def test_unbatched():
    x = rng.standard_normal((T, D))
    layout = _layouts.find("output", x, (1, T, D))
    assert layout.forward(x).shape == (1, T, D) and np.array_equal(layout.inverse(layout.forward(x)), x)


def test_heads_as_many_as_positions_take_the_users_layout():
    # H == T: [B, T, H, D] has the canonical shape; read as identity it would be the transpose
    ref = rng.standard_normal((B, H, H, D))
    user = ref.transpose(0, 2, 1, 3).copy()
    layout = _layouts.find("attn.q", user, ref.shape, ref)
    assert np.array_equal(_layouts.to_canonical(layout, user, ref), ref)
    assert np.array_equal(_layouts.from_canonical(layout, ref, user), user)  # the local pass feeds it back so
    # the context [B, H, T, D] against [B, T, H*D] with H == T: transposed before the merge, not reshaped alone
    ctx = ref.transpose(0, 2, 1, 3).reshape(B, H, H * D)
    assert np.array_equal(_layouts.to_canonical(_layouts.find("attn.context", ref, ctx.shape, ctx), ref), ctx)
    mine = ref.transpose(0, 2, 1, 3).copy()  # the user's context as [B, T, H, D]: merged by a reshape alone
    assert np.array_equal(_layouts.to_canonical(_layouts.find("attn.context", mine, ctx.shape, ctx), mine), ctx)


def test_a_minus_1e4_fill_in_bfloat16_reads_as_minus_inf():
    torch = pytest.importorskip("torch")
    fill = torch.tensor(-1e4, dtype=torch.bfloat16).item()  # what masked_fill(-1e4) stores in bfloat16
    ref = np.array([[0.5, -np.inf]])
    mine = np.array([[0.5, fill]], dtype=np.float32)
    layout = _layouts.find("scores", mine, ref.shape)
    assert _layouts.to_canonical(layout, mine, ref)[0, 1] == -np.inf
    assert _layouts.from_canonical(layout, ref, mine)[0, 1] == fill
