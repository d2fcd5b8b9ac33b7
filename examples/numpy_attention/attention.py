"""Transformer attention layers in plain numpy, one function per op, written for tparity's exec protocol.

Each op names the PyTorch function it mirrors and opens with its shapes. Everything computes in the
dtype of its inputs (float32 or float64 throughout: Python scalars never widen an array). Conventions:

  - inside, everything is batch-first, (B, T, E); the module functions at the bottom convert the
    module's own layout (batch_first, sequence-first (T, B, E), unbatched (T, E)) at their edges;
  - masks: a bool mask is True where a key is MASKED OUT (MultiheadAttention's attn_mask and
    key_padding_mask, the book's causal buffer), except scaled_dot_product_attention's bool attn_mask,
    True where a key TAKES PART (torch's convention for that function); a float mask is added;
  - torch2: True for torch 2.x's semantics, False for 1.13's (README "Semantics: torch 1.13 and 2.13"):
    how attn_mask and key_padding_mask merge, and whether a row whose every key is masked gives NaN
    (1.13; 2.x with weights) or zero weights (2.x's scaled_dot_product_attention, hence 2.x's
    MultiheadAttention with need_weights=False and every encoder and decoder layer);
  - every intermediate result goes through a Tape under its canonical name and layout (README
    "Components"): batched and batch-first, B = 1 for unbatched input, per head where heads exist.
"""

import math

import numpy as np


class Unsupported(Exception):
    """A module or an option this implementation does not compute (the program says so, exit 0)."""


class Tape:
    """The components of one forward pass, by canonical name.

    Given the reference's components (`forced`, float64), the tape teacher-forces: it returns the
    reference's value of each component it holds, in the run's dtype, in place of the one just computed,
    so that the next op reads the reference's input. The values recorded then are each op's local result
    on the reference's own inputs."""

    def __init__(self, forced=None):
        self.forced = forced
        self.values = {}

    def __call__(self, name, value):
        self.values[name] = value
        if self.forced is None or name not in self.forced:
            return value
        ref = self.forced[name]
        if ref.shape != value.shape:
            raise ValueError(f"components.{name}: the reference's shape {list(ref.shape)} is not the "
                             f"computed {list(value.shape)}")
        return ref.astype(value.dtype)


# ---- ops -------------------------------------------------------------------------------------------

def linear(x, weight, bias=None):
    # mirrors torch.nn.functional.linear
    # x is (..., IN), weight is (OUT, IN), bias is (OUT); out will be (..., OUT)
    y = x @ weight.T
    return y if bias is None else y + bias


def relu(x):
    # mirrors torch.relu (NaN stays NaN)
    return np.maximum(x, 0)


_erf = np.frompyfunc(math.erf, 1, 1)


def gelu(x):
    # mirrors torch.nn.functional.gelu(approximate="none"): x / 2 * (1 + erf(x / sqrt(2)))
    # erf is math.erf element by element (double), rounded to x's dtype
    e = _erf(x / math.sqrt(2.0)).astype(x.dtype)
    return 0.5 * x * (1 + e)


def layer_norm_rstd(x, mean, eps):
    # x is (..., C), mean is (...); out will be (...): 1 / sqrt(biased variance + eps)
    var = np.mean((x - mean[..., None]) ** 2, axis=-1)
    return 1 / np.sqrt(var + eps)


def layer_norm_apply(x, mean, rstd, weight=None, bias=None):
    # x is (..., C), mean and rstd are (...), weight and bias are (C); out will be (..., C)
    y = (x - mean[..., None]) * rstd[..., None]
    if weight is not None:
        y = y * weight
    return y if bias is None else y + bias


def layer_norm(x, weight, bias, eps):
    # mirrors torch.nn.functional.layer_norm over the last dim: x is (..., C); out will be (..., C)
    mean = np.mean(x, axis=-1)
    return layer_norm_apply(x, mean, layer_norm_rstd(x, mean, eps), weight, bias)


def softmax(x):
    # mirrors torch.softmax(x, dim=-1): x is (..., S); out will be (..., S)
    # a row whose every entry is -inf gives NaN, as torch's does
    with np.errstate(invalid="ignore"):
        e = np.exp(x - np.max(x, axis=-1, keepdims=True))
        return e / np.sum(e, axis=-1, keepdims=True)


def safe_softmax(x):
    # mirrors torch 2.x's _safe_softmax (scaled_dot_product_attention's math path; its CPU flash kernel
    # agrees): softmax, but a row whose every score is -inf gets zero weights, not NaN
    dead = np.all(x == -np.inf, axis=-1, keepdims=True)
    return np.where(dead, 0, softmax(x))


def score_scale(embed_dim, num_heads):
    """The factor the attention scores are multiplied by: 1 / sqrt(E / heads), a head's width
    (torch: q / sqrt(head_dim); the book: / keys.shape[-1] ** 0.5)."""
    return 1.0 / math.sqrt(embed_dim // num_heads)


def scaled_scores(q, k, scale, mask=None):
    # QDotK, einsum '...LD,...SD->...LS', as multi_head_attention_forward's baddbmm(mask, q * scale, k^T)
    # q is (..., L, D), k is (..., S, D), mask is additive and broadcasts to (..., L, S)
    # out will be (..., L, S): scaled, then masked
    s = (q * scale) @ np.swapaxes(k, -1, -2)
    return s if mask is None else s + mask


def weighted_sum(w, v):
    # WeightedSumV, einsum '...LS,...SD->...LD': w is (..., L, S), v is (..., S, D); out will be (..., L, D)
    return w @ v


def split_heads(x, num_heads):
    # x is (B, T, E); out will be (B, H, T, E/H), head h holding features h*E/H .. (h+1)*E/H - 1
    B, T, E = x.shape
    return x.reshape(B, T, num_heads, E // num_heads).transpose(0, 2, 1, 3)


def merge_heads(x):
    # x is (B, H, T, D); out will be (B, T, H*D), the heads concatenated
    B, H, T, D = x.shape
    return x.transpose(0, 2, 1, 3).reshape(B, T, H * D)


def additive(mask, dtype):
    # a bool mask (True = masked out) as -inf / 0; a float mask as it is
    if mask.dtype == np.bool_:
        return np.where(mask, -np.inf, 0).astype(dtype)
    return mask.astype(dtype)


def merge_masks(attn_mask, key_padding_mask, B, H, L, S, torch2, dtype):
    # mirrors multi_head_attention_forward's merge of the two masks into one additive mask
    # attn_mask is (L, S) or (B*H, L, S), key_padding_mask is (B, S); bool (True = masked) or float
    # out will broadcast to (B, H, L, S), or None without masks
    # torch 2.x (_canonical_mask): each made additive on its own, then summed. torch 1.13: the key
    # padding mask ORed into a bool attn_mask (a nonzero float key counts as True), filled as -inf into
    # a float one (masked_fill replaces the value), added alone when it is alone.
    if attn_mask is not None and attn_mask.shape not in ((L, S), (B * H, L, S)):
        raise ValueError(f"attn_mask: expected shape {[L, S]} or {[B * H, L, S]}, got {list(attn_mask.shape)}")
    if key_padding_mask is not None and key_padding_mask.shape != (B, S):
        raise ValueError(f"key_padding_mask: expected shape {[B, S]}, got {list(key_padding_mask.shape)}")
    a = None if attn_mask is None else attn_mask.reshape((B, H, L, S) if attn_mask.ndim == 3 else (1, 1, L, S))
    k = None if key_padding_mask is None else key_padding_mask.reshape(B, 1, 1, S)
    if a is None or k is None or torch2:
        parts = [additive(m, dtype) for m in (a, k) if m is not None]
        return None if not parts else parts[0] if len(parts) == 1 else parts[0] + parts[1]
    if a.dtype == np.bool_:
        return additive(a | (k != 0), dtype)
    if k.dtype == np.bool_:
        return np.where(k, -np.inf, a.astype(dtype))
    raise Unsupported("a float key_padding_mask beside a float attn_mask under torch 1.13, whose masked_fill "
                      "reads the floats as a byte mask and ignores most values (torch 2.x adds them)")


# ---- multi-head attention ------------------------------------------------------------------------

def mha_attend(query, key, value, sd, num_heads, attn_mask=None, key_padding_mask=None, need_weights=True,
               average_attn_weights=True, add_zero_attn=False, torch2=True, tape=None, prefix="",
               output_name="output"):
    # mirrors torch.nn.functional.multi_head_attention_forward (eval, dropout 0) on batch-first input
    # query is (B, L, E), key is (B, S, kdim), value is (B, S, vdim); masks as merge_masks takes them
    # sd: in_proj_weight (3E, E) packed [Wq; Wk; Wv], or q_proj_weight (E, E), k_proj_weight (E, kdim),
    #     v_proj_weight (E, vdim); in_proj_bias (3E); bias_k, bias_v (1, 1, E) (add_bias_kv); out_proj.*
    # out will be output (B, L, E) and the weights: (B, L, S') averaged, (B, H, L, S') per head or None,
    # S' = S plus one key for bias_kv and one for zero_attn
    # components (tape): q, k, v (B, H, L|S', E/H) with q not yet scaled; scores (B, H, L, S'); attn_weights
    # (B, H, L, S'); attn_weights_avg (B, L, S') when averaged weights are returned; context (B, L, E);
    # output (B, L, E) named output_name
    tape = tape or Tape()
    B, L, E = query.shape
    S, H = key.shape[1], num_heads
    if E % H:
        raise ValueError(f"config: embed_dim {E} is not divisible by num_heads {H}")
    if "in_proj_weight" in sd:
        wq, wk, wv = np.split(sd["in_proj_weight"], 3)
    else:
        wq, wk, wv = sd["q_proj_weight"], sd["k_proj_weight"], sd["v_proj_weight"]
    bq, bk, bv = np.split(sd["in_proj_bias"], 3) if "in_proj_bias" in sd else (None, None, None)
    q, k, v = linear(query, wq, bq), linear(key, wk, bk), linear(value, wv, bv)
    extra = 0  # keys appended to the S given
    if "bias_k" in sd:  # add_bias_kv: one more key and value, the same for every batch element
        k = np.concatenate([k, np.broadcast_to(sd["bias_k"], (B, 1, E))], axis=1)
        v = np.concatenate([v, np.broadcast_to(sd["bias_v"], (B, 1, E))], axis=1)
        extra += 1
    q, k, v = split_heads(q, H), split_heads(k, H), split_heads(v, H)
    if add_zero_attn:  # a zero key and value per head
        zero = np.zeros((B, H, 1, E // H), dtype=q.dtype)
        k, v = np.concatenate([k, zero], axis=2), np.concatenate([v, zero], axis=2)
        extra += 1
    q, k, v = tape(prefix + "q", q), tape(prefix + "k", k), tape(prefix + "v", v)

    mask = merge_masks(attn_mask, key_padding_mask, B, H, L, S, torch2, q.dtype)
    if mask is not None and extra:  # torch pads both masks with zeros (False) for the appended keys
        mask = np.broadcast_to(mask, (B, H, L, S))
        mask = np.concatenate([mask, np.zeros((B, H, L, extra), dtype=mask.dtype)], axis=-1)
    scores = tape(prefix + "scores", scaled_scores(q, k, score_scale(E, H), mask))
    # torch 2.x without weights runs scaled_dot_product_attention, whose softmax zeroes a row of -inf
    weights = tape(prefix + "attn_weights", (safe_softmax if torch2 and not need_weights else softmax)(scores))
    context = tape(prefix + "context", merge_heads(weighted_sum(weights, v)))
    output = tape(output_name, linear(context, sd["out_proj.weight"], sd.get("out_proj.bias")))
    if not need_weights:
        return output, None
    if not average_attn_weights:
        return output, weights
    return output, tape(prefix + "attn_weights_avg", np.mean(weights, axis=1))  # torch: mean over heads


def to_batch_first(x, batched, batch_first):
    # x is (B, T, E) batch_first, (T, B, E) sequence-first or (T, E) unbatched; out will be (B, T, E)
    return x if batched and batch_first else x.transpose(1, 0, 2) if batched else x[None]


def from_batch_first(x, batched, batch_first):
    # x is (B, T, E); out will be in the module's layout (to_batch_first's inverse)
    return x if batched and batch_first else x.transpose(1, 0, 2) if batched else x[0]


def batch_key_padding(mask, batched):
    # a key padding mask of an unbatched call, (S), as (1, S)
    return mask if mask is None or batched else mask[None]


def sub_dict(sd, prefix):
    # the entries of sd under prefix ("self_attn."), without it
    return {k[len(prefix):]: v for k, v in sd.items() if k.startswith(prefix)}


def no_dropout(config):
    if config.get("dropout", 0) != 0:
        raise Unsupported(f"dropout {config['dropout']} (this implementation is eval-only: dropout 0)")


def multihead_attention(config, forward, sd, inputs, torch2, tape):
    # mirrors torch.nn.MultiheadAttention(**config).forward(**inputs, **forward), eval
    # query (L, B, E) or (B, L, E) batch_first or (L, E) unbatched; key, value alike with S;
    # attn_mask (L, S) or (B*H, L, S) (unbatched: (H, L, S)); key_padding_mask (B, S), (S) unbatched
    no_dropout(config)
    query, key, value = inputs["query"], inputs["key"], inputs["value"]
    batched, batch_first = query.ndim == 3, config.get("batch_first", False)
    need_weights = forward.get("need_weights", True)
    if config.get("add_bias_kv", False) != ("bias_k" in sd):
        raise ValueError("state_dict: bias_k and bias_v expected exactly when config.add_bias_kv is true")
    out, weights = mha_attend(
        to_batch_first(query, batched, batch_first), to_batch_first(key, batched, batch_first),
        to_batch_first(value, batched, batch_first), sd, config["num_heads"], inputs.get("attn_mask"),
        batch_key_padding(inputs.get("key_padding_mask"), batched), need_weights=need_weights,
        average_attn_weights=forward.get("average_attn_weights", True),
        add_zero_attn=config.get("add_zero_attn", False), torch2=torch2, tape=tape)
    outputs = {"output": from_batch_first(out, batched, batch_first)}
    if need_weights:
        outputs["attn_weights"] = weights if batched else weights[0]
    return outputs


# ---- encoder and decoder layers -------------------------------------------------------------------

def feed_forward(x, sd, activation, tape, prefix):
    # mirrors TransformerEncoderLayer._ff_block: linear2(activation(linear1(x))), dropout 0
    # x is (B, T, d), linear1 (F, d), linear2 (d, F); out will be (B, T, d)
    # components: ffn_hidden (B, T, F) after the activation, ffn_output (B, T, d)
    act = {"relu": relu, "gelu": gelu}[activation]
    hidden = tape(prefix + "ffn_hidden", act(linear(x, sd["linear1.weight"], sd["linear1.bias"])))
    return tape(prefix + "ffn_output", linear(hidden, sd["linear2.weight"], sd["linear2.bias"]))


def layer_config(config):
    no_dropout(config)
    activation = config.get("activation", "relu")
    if activation not in ("relu", "gelu"):
        raise Unsupported(f"activation {activation!r} (relu and gelu are implemented)")
    return config["nhead"], activation, config.get("layer_norm_eps", 1e-5), config.get("norm_first", False)


def encoder_layer(x, sd, config, mask, key_padding_mask, torch2, tape, prefix=""):
    # mirrors torch.nn.TransformerEncoderLayer.forward on batch-first x (B, T, d), masks batched
    # post-norm: x = norm1(x + sa(x)); x = norm2(x + ff(x))
    # norm_first: x = x + sa(norm1(x)); x = x + ff(norm2(x))
    # components: sa.q .. sa.context, sa_output, norm1, (norm2 with norm_first), ffn_hidden, ffn_output, output
    nhead, activation, eps, norm_first = layer_config(config)

    def sa(y):  # _sa_block: self_attn(y, y, y, need_weights=False)[0]
        return mha_attend(y, y, y, sub_dict(sd, "self_attn."), nhead, mask, key_padding_mask, need_weights=False,
                          torch2=torch2, tape=tape, prefix=prefix + "sa.", output_name=prefix + "sa_output")[0]

    def norm(y, name):
        return layer_norm(y, sd[name + ".weight"], sd[name + ".bias"], eps)

    if norm_first:
        x = x + sa(tape(prefix + "norm1", norm(x, "norm1")))
        x = x + feed_forward(tape(prefix + "norm2", norm(x, "norm2")), sd, activation, tape, prefix)
    else:
        x = tape(prefix + "norm1", norm(x + sa(x), "norm1"))
        x = norm(x + feed_forward(x, sd, activation, tape, prefix), "norm2")
    return tape(prefix + "output", x)


def transformer_encoder_layer(config, forward, sd, inputs, torch2, tape):
    # torch.nn.TransformerEncoderLayer(**config)(src, src_mask, src_key_padding_mask), eval
    src = inputs["src"]
    batched, batch_first = src.ndim == 3, config.get("batch_first", False)
    x = encoder_layer(to_batch_first(src, batched, batch_first), sd, config, inputs.get("src_mask"),
                      batch_key_padding(inputs.get("src_key_padding_mask"), batched), torch2, tape)
    return {"output": from_batch_first(x, batched, batch_first)}


def transformer_encoder(config, forward, sd, inputs, torch2, tape):
    # torch.nn.TransformerEncoder(layer, num_layers, norm)(src, mask, src_key_padding_mask), eval:
    # the layers in turn (state_dict layers.N.*), then the final LayerNorm (norm.*) when config.norm
    # components: layers.N.<the layer's>, norm (when present), output
    src = inputs["src"]
    batched, batch_first = src.ndim == 3, config.get("batch_first", False)
    x = to_batch_first(src, batched, batch_first)
    kpm = batch_key_padding(inputs.get("src_key_padding_mask"), batched)
    for i in range(config["num_layers"]):
        x = encoder_layer(x, sub_dict(sd, f"layers.{i}."), config, inputs.get("mask"), kpm, torch2, tape,
                          f"layers.{i}.")
    if config.get("norm", False):
        x = tape("norm", layer_norm(x, sd["norm.weight"], sd["norm.bias"], config.get("layer_norm_eps", 1e-5)))
    return {"output": from_batch_first(tape("output", x), batched, batch_first)}


def transformer_decoder_layer(config, forward, sd, inputs, torch2, tape):
    # mirrors torch.nn.TransformerDecoderLayer(**config)(tgt, memory, tgt_mask, memory_mask,
    # tgt_key_padding_mask, memory_key_padding_mask), eval; tgt (T, d) and memory (S, d) batch-first inside
    # post-norm: x = norm1(x + sa(x)); x = norm2(x + ca(x, mem)); x = norm3(x + ff(x))
    # norm_first: x = x + sa(norm1(x)); x = x + ca(norm2(x), mem); x = x + ff(norm3(x))
    # components: sa.*, sa_output, norm1, ca.*, ca_output, norm2, (norm3 with norm_first), ffn_*, output
    nhead, activation, eps, norm_first = layer_config(config)
    tgt = inputs["tgt"]
    batched, batch_first = tgt.ndim == 3, config.get("batch_first", False)
    x = to_batch_first(tgt, batched, batch_first)
    mem = to_batch_first(inputs["memory"], batched, batch_first)
    tgt_kpm = batch_key_padding(inputs.get("tgt_key_padding_mask"), batched)
    mem_kpm = batch_key_padding(inputs.get("memory_key_padding_mask"), batched)

    def sa(y):  # _sa_block
        return mha_attend(y, y, y, sub_dict(sd, "self_attn."), nhead, inputs.get("tgt_mask"), tgt_kpm,
                          need_weights=False, torch2=torch2, tape=tape, prefix="sa.", output_name="sa_output")[0]

    def ca(y):  # _mha_block: attention over the memory
        return mha_attend(y, mem, mem, sub_dict(sd, "multihead_attn."), nhead, inputs.get("memory_mask"), mem_kpm,
                          need_weights=False, torch2=torch2, tape=tape, prefix="ca.", output_name="ca_output")[0]

    def norm(y, name):
        return layer_norm(y, sd[name + ".weight"], sd[name + ".bias"], eps)

    if norm_first:
        x = x + sa(tape("norm1", norm(x, "norm1")))
        x = x + ca(tape("norm2", norm(x, "norm2")))
        x = x + feed_forward(tape("norm3", norm(x, "norm3")), sd, activation, tape, "")
    else:
        x = tape("norm1", norm(x + sa(x), "norm1"))
        x = tape("norm2", norm(x + ca(x), "norm2"))
        x = norm(x + feed_forward(x, sd, activation, tape, ""), "norm3")
    return {"output": from_batch_first(tape("output", x), batched, batch_first)}


# ---- scaled dot-product attention ------------------------------------------------------------------

def scaled_dot_product_attention(config, forward, sd, inputs, torch2, tape):
    # mirrors torch.nn.functional.scaled_dot_product_attention (dropout 0), seed 004's DotProductAttention
    # query is (..., L, E), key is (..., S, E), value is (..., S, Ev); out will be (..., L, Ev)
    # attn_mask broadcasts to (..., L, S): bool True = the key TAKES PART, float added;
    # config: is_causal (key j <= query i, top-left), scale (default 1/sqrt(E)), enable_gqa (k and v
    # with fewer heads, dim -3, each repeated for consecutive query heads: repeat_interleave)
    # components: scores (..., L, S) scaled and masked, attn_weights (..., L, S), output (..., L, Ev)
    q, k, v, mask = inputs["query"], inputs["key"], inputs["value"], inputs.get("attn_mask")
    L, E, S = q.shape[-2], q.shape[-1], k.shape[-2]
    if config.get("enable_gqa", False) and q.ndim >= 3 and k.shape[-3] != q.shape[-3]:
        if k.shape[-3] == 0 or q.shape[-3] % k.shape[-3]:
            raise ValueError(f"key: {k.shape[-3]} heads do not divide the query's {q.shape[-3]} (enable_gqa)")
        k = np.repeat(k, q.shape[-3] // k.shape[-3], axis=-3)
        v = np.repeat(v, q.shape[-3] // v.shape[-3], axis=-3)
    if mask is not None and mask.dtype == np.bool_:
        mask = ~mask  # to this file's convention, True = masked out
    if config.get("is_causal", False):
        if mask is not None:
            raise ValueError("config.is_causal: given with inputs.attn_mask; torch refuses the two together")
        mask = ~np.tril(np.ones((L, S), dtype=bool))
    if mask is not None:
        try:
            np.broadcast_shapes(mask.shape, q.shape[:-2] + (L, S))
        except ValueError:
            raise ValueError(f"attn_mask: shape {list(mask.shape)} does not broadcast to the scores' "
                             f"{list(q.shape[:-2] + (L, S))}") from None
        mask = additive(mask, q.dtype)
    scale = config.get("scale")
    scale = score_scale(E, 1) if scale is None else scale
    scores = tape("scores", scaled_scores(q, k, scale, mask))
    weights = tape("attn_weights", (safe_softmax if torch2 else softmax)(scores))
    return {"output": tape("output", weighted_sum(weights, v))}


# ---- the book's attention classes (LLMs-from-scratch, chapter 3) ----------------------------------

BOOK_CLASSES = ("SelfAttention_v1", "SelfAttention_v2", "CausalAttention", "MultiHeadAttentionWrapper",
                "MultiHeadAttention")


def book_attention(module, config, sd, x, tape):
    # mirrors the forward() of the book's classes, dropout 0 (README "The book's attention classes")
    # x is (T, d_in) for SelfAttention_v1 and _v2, (B, T, d_in) for the others
    # out will be (T, d_out), (B, T, d_out), or (B, T, heads * d_out) for the wrapper
    # components: q, k, v (B, H, T, D); scores (B, H, T, T) masked and divided; attn_weights; context
    # (B, T, H*D, the two multi-head classes); output (B, T, .); B = 1 and H = 1 where the class has none
    no_dropout(config)
    d_out, heads = config["d_out"], config.get("num_heads", 1)
    batched = module not in ("SelfAttention_v1", "SelfAttention_v2")
    if x.ndim != (3 if batched else 2):
        raise ValueError(f"inputs.x: expected {'(B, T, d_in)' if batched else '(T, d_in)'} for {module}, "
                         f"got shape {list(x.shape)}")
    xb = x if batched else x[None]  # (B, T, d_in)
    T = xb.shape[1]

    def proj(name, pre=""):  # nn.Linear(d_in, d_out, bias=qkv_bias): (B, T, d_out)
        return linear(xb, sd[pre + name + ".weight"], sd.get(pre + name + ".bias"))

    names = ("W_query", "W_key", "W_value")
    if module == "SelfAttention_v1":  # raw (d_in, d_out) parameters, used as x @ W
        q, k, v = ((xb @ sd[n])[:, None] for n in names)
    elif module == "MultiHeadAttentionWrapper":  # one CausalAttention of width d_out per head
        q, k, v = (np.stack([proj(n, f"heads.{h}.") for h in range(heads)], axis=1) for n in names)
    elif module == "MultiHeadAttention":  # one projection, split into heads of d_out / heads
        q, k, v = (split_heads(proj(n), heads) for n in names)
    else:
        q, k, v = (proj(n)[:, None] for n in names)
    q, k, v = tape("q", q), tape("k", k), tape("v", v)

    # the causal buffer, data as in the book: mask.bool()[:T, :T], nonzero = masked out
    buffers = {"CausalAttention": ["mask"], "MultiHeadAttention": ["mask"],
               "MultiHeadAttentionWrapper": [f"heads.{h}.mask" for h in range(heads)]}.get(module, [])
    for b in buffers:
        if min(sd[b].shape) < T:
            raise ValueError(f"state_dict.{b}: a buffer of shape {list(sd[b].shape)} for {T} tokens")
    mask = np.stack([sd[b][:T, :T] != 0 for b in buffers]) if buffers else None  # (1 or H, T, T)
    # scores divided by a head's width: d_out, the wrapper's d_out per head, or MHA's d_out / heads
    width = {"MultiHeadAttentionWrapper": (d_out * heads, heads), "MultiHeadAttention": (d_out, heads)}
    scale = score_scale(*width.get(module, (d_out, 1)))
    scores = tape("scores", scaled_scores(q, k, scale, None if mask is None else additive(mask, q.dtype)))
    weights = tape("attn_weights", softmax(scores))
    ctx = weighted_sum(weights, v)  # (B, H, T, D)
    if module in width:  # heads concatenated, then out_proj
        context = tape("context", merge_heads(ctx))
        out = tape("output", linear(context, sd["out_proj.weight"], sd["out_proj.bias"]))
    else:
        out = tape("output", ctx[:, 0])
    return out if batched else out[0]


def book_module(module):
    def forward(config, _forward, sd, inputs, torch2, tape):
        return {"output": book_attention(module, config, sd, inputs["x"], tape)}
    return forward


# ---- single ops ----------------------------------------------------------------------------------

def matmul(config, forward, sd, inputs, torch2, tape):
    # mirrors torch.matmul(input, other), broadcasting batch dims; component: output
    return {"output": tape("output", np.matmul(inputs["input"], inputs["other"]))}


def softmax_module(config, forward, sd, inputs, torch2, tape):
    # mirrors torch.softmax(input, dim=-1); component: output
    if config.get("dim", -1) != -1:
        raise Unsupported(f"softmax over dim {config['dim']} (only dim=-1)")
    return {"output": tape("output", softmax(inputs["input"]))}


def layer_norm_module(config, forward, sd, inputs, torch2, tape):
    # mirrors torch.nn.LayerNorm(normalized_shape=[C], eps, elementwise_affine) over the last dim
    # input is (..., C); components: mean (...), rstd (...) = 1/sqrt(var + eps), output (..., C)
    x, shape = inputs["input"], list(config["normalized_shape"])
    if len(shape) != 1 or x.shape[-1:] != tuple(shape):
        raise ValueError(f"config.normalized_shape: expected [last dim of input {list(x.shape)}], got {shape}")
    mean = tape("mean", np.mean(x, axis=-1))
    rstd = tape("rstd", layer_norm_rstd(x, mean, config.get("eps", 1e-5)))
    return {"output": tape("output", layer_norm_apply(x, mean, rstd, sd.get("weight"), sd.get("bias")))}


# Each: forward(config, forward, state_dict, inputs, torch2, tape) -> {"output", "attn_weights"?}, the
# arrays (state_dict and float inputs) already in the run's dtype.
MODULES = {
    "MultiheadAttention": multihead_attention,
    "TransformerEncoderLayer": transformer_encoder_layer,
    "TransformerEncoder": transformer_encoder,
    "TransformerDecoderLayer": transformer_decoder_layer,
    "ScaledDotProductAttention": scaled_dot_product_attention,
    "Matmul": matmul,
    "Softmax": softmax_module,
    "LayerNorm": layer_norm_module,
    **{name: book_module(name) for name in BOOK_CLASSES},
}
