"""A Llama decoder layer's attention in numpy, written the way the seeds' notebooks write it.

Pure numpy, no tparity in it: one function per op with its shapes, as the seeds (../../shared/seeds/)
check self-attention against PyTorch with np.linalg.norm. It is the LLM attention, not torch's
MultiheadAttention, because the case it targets has query rows that see no key at all: the committed
fixture fixtures/torch-2.13/llama_layer.json (transformers' LlamaDecoderLayer, element 1 left-padded by
two tokens, so its first two query rows see no key). transformers fills masked scores with
finfo(dtype).min, not -inf: such a row's scores are all equal and its softmax is uniform over every key.

slip="nan-masked-rows" plants the classic slip: masked scores filled with -inf, so a row with every key
masked is exp(-inf - -inf) = NaN / 0 = NaN where the reference has 1/S.

Supports: RMSNorm, rotary at the given position ids (half-split pairs, the whole head), grouped-query
attention (kv heads shared by blocks of query heads), attention biases, causal plus key padding mask,
SwiGLU MLP; one call (no KV cache).
"""
import numpy as np

SLIPS = (None, "nan-masked-rows")


def rms_norm(x, weight, eps):
    # x (B, T, C), weight (C,) -> (B, T, C): weight * x / sqrt(mean(x^2) + eps)
    return weight * (x / np.sqrt((x * x).mean(axis=-1, keepdims=True) + eps))


def linear(x, W, b=None):
    # x (B, T, in), W (out, in) as nn.Linear stores it, b (out,) -> (B, T, out)
    y = x @ W.T
    return y if b is None else y + b


def split_heads(x, heads):
    # (B, T, heads * D) -> (B, heads, T, D)
    B, T, n = x.shape
    return x.reshape(B, T, heads, n // heads).transpose(0, 2, 1, 3)


def merge_heads(x):
    # (B, H, T, D) -> (B, T, H * D), heads side by side
    B, H, T, D = x.shape
    return x.transpose(0, 2, 1, 3).reshape(B, T, H * D)


def rotary(x, positions, theta):
    # x (B, H, T, D), positions (B, T) -> (B, H, T, D): pairs (i, i + D/2) rotated by position * inv_freq
    D = x.shape[-1]
    inv_freq = 1.0 / theta ** (np.arange(0, D, 2, dtype=x.dtype) / D)  # (D/2,)
    angles = positions[:, None, :, None].astype(x.dtype) * inv_freq  # (B, 1, T, D/2)
    cos = np.concatenate([np.cos(angles)] * 2, axis=-1)  # (B, 1, T, D)
    sin = np.concatenate([np.sin(angles)] * 2, axis=-1)
    half = D // 2
    rotated = np.concatenate([-x[..., half:], x[..., :half]], axis=-1)  # rotate_half
    return x * cos + rotated * sin


def repeat_kv(x, rep):
    # (B, Hkv, T, D) -> (B, Hkv * rep, T, D): query head h reads kv head h // rep
    return np.repeat(x, rep, axis=1)


def attention_mask(key_padding_mask, T):
    # key_padding_mask (B, T) bool, True at padding -> (B, 1, T, T) bool, True where query t may not see key s
    causal = np.triu(np.ones((T, T), dtype=bool), 1)  # key after the query
    masked = causal[None, None] | key_padding_mask[:, None, None, :]
    return masked


def softmax(Z):
    Z = np.exp(Z - Z.max(axis=-1, keepdims=True))  # always the softmax of the last axis
    return Z / Z.sum(axis=-1, keepdims=True)


def scores_and_weights(q, k, masked, slip=None):
    # q (B, H, T, D), k (B, H, S, D), masked (B, 1, T, S) -> scores with -inf at masked keys, weights
    D = q.shape[-1]
    raw = q @ k.transpose(0, 1, 3, 2) / np.sqrt(q.dtype.type(D))  # (B, H, T, S); sqrt in q's dtype
    scores = np.where(masked, -np.inf, raw)  # the canonical scores: -inf where masked
    if slip == "nan-masked-rows":
        with np.errstate(invalid="ignore"):
            weights = softmax(scores)  # a row of -inf only: (-inf) - (-inf) = NaN
    else:
        # transformers adds finfo(dtype).min: a fully masked row has equal scores, hence uniform weights
        weights = softmax(np.where(masked, np.finfo(q.dtype).min, raw))
    return scores, weights


def llama_layer(x, positions, key_padding_mask, sd, cfg, slip=None):
    # x (B, T, C); returns the output (B, T, C) and every component by tparity's canonical names
    if slip not in SLIPS:
        raise ValueError(f"slip: expected one of {SLIPS}, got {slip!r}")
    H, Hkv = cfg["num_attention_heads"], cfg["num_key_value_heads"]
    eps, theta = cfg["rms_norm_eps"], cfg["rope_theta"]
    B, T, _ = x.shape
    c = {}
    b = lambda name: sd.get(name)  # biases when attention_bias / mlp_bias
    c["input_layernorm"] = h = rms_norm(x, sd["input_layernorm.weight"], eps)
    c["attn.q"] = q = split_heads(linear(h, sd["self_attn.q_proj.weight"], b("self_attn.q_proj.bias")), H)
    c["attn.k"] = k = split_heads(linear(h, sd["self_attn.k_proj.weight"], b("self_attn.k_proj.bias")), Hkv)
    c["attn.v"] = v = split_heads(linear(h, sd["self_attn.v_proj.weight"], b("self_attn.v_proj.bias")), Hkv)
    c["attn.q_rot"] = q = rotary(q, positions, theta)
    c["attn.k_rot"] = k = rotary(k, positions, theta)
    k, v = repeat_kv(k, H // Hkv), repeat_kv(v, H // Hkv)  # (B, H, T, D)
    kpm = np.zeros((B, T), dtype=bool) if key_padding_mask is None else key_padding_mask
    c["attn.scores"], c["attn.attn_weights"] = scores_and_weights(q, k, attention_mask(kpm, T), slip)
    c["attn.context"] = ctx = merge_heads(c["attn.attn_weights"] @ v)  # (B, T, H * D)
    c["attn.output"] = a = linear(ctx, sd["self_attn.o_proj.weight"], b("self_attn.o_proj.bias"))
    c["attn_residual"] = x = x + a
    c["post_attention_layernorm"] = h = rms_norm(x, sd["post_attention_layernorm.weight"], eps)
    c["mlp.gate"] = g = linear(h, sd["mlp.gate_proj.weight"], b("mlp.gate_proj.bias"))
    c["mlp.up"] = u = linear(h, sd["mlp.up_proj.weight"], b("mlp.up_proj.bias"))
    c["mlp.act"] = act = g / (1 + np.exp(-g)) * u  # silu(gate) * up
    c["mlp.down"] = d = linear(act, sd["mlp.down_proj.weight"], b("mlp.down_proj.bias"))
    c["output"] = y = x + d
    return y, c


# How a check feeds a problem to it: the problem's input name -> llama_layer's argument. The state dict
# goes in by transformers' own names (no renaming, no transposes: numpy reads (out, in) as nn.Linear
# stores it), the config by transformers' keys; every component comes back by tparity's canonical name.
FORWARD = {"hidden_states": "x", "position_ids": "positions", "key_padding_mask": "key_padding_mask"}
WEIGHTS = {name: name for name in (
    "input_layernorm.weight", "self_attn.q_proj.weight", "self_attn.q_proj.bias", "self_attn.k_proj.weight",
    "self_attn.k_proj.bias", "self_attn.v_proj.weight", "self_attn.v_proj.bias", "self_attn.o_proj.weight",
    "self_attn.o_proj.bias", "post_attention_layernorm.weight", "mlp.gate_proj.weight", "mlp.up_proj.weight",
    "mlp.down_proj.weight")}
TRANSPOSE = []
