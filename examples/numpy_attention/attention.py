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

    def __init__(self, forced=None, store=None):
        self.forced = forced
        self.store = store  # a low precision's rounding: each component is stored in it (run.py)
        self.values = {}

    def __call__(self, name, value):
        if self.store is not None and value.dtype.kind == "f":
            value = self.store(value)
        self.values[name] = value
        if self.forced is None or name not in self.forced:
            return value
        ref = self.forced[name]
        if ref.shape != value.shape:
            raise ValueError(f"components.{name}: the reference's shape {list(ref.shape)} is not the "
                             f"computed {list(value.shape)}")
        ref = ref.astype(value.dtype)
        return ref if self.store is None else self.store(ref)


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


# ---- seed 004's models: its TransformerEncoder front and its ViT -----------------------------------

def tanh(x):
    # mirrors torch.tanh
    return np.tanh(x)


def sigmoid(x):
    # mirrors torch.sigmoid: 1 / (1 + exp(-x)) (exp(-x) overflowing to inf gives 0, as torch's)
    with np.errstate(over="ignore"):
        return 1 / (1 + np.exp(-x))


def silu(x):
    # mirrors torch.nn.functional.silu: x / (1 + exp(-x)), the division torch's kernel does
    with np.errstate(over="ignore"):
        return x / (1 + np.exp(-x))


def softplus(x, beta=1.0, threshold=20.0):
    # mirrors torch.nn.functional.softplus: x where x * beta > threshold (strictly), else
    # log1p(exp(x * beta)) / beta; nn.Softplus's defaults beta 1, threshold 20
    with np.errstate(over="ignore"):
        return np.where(x * beta > threshold, x, np.log1p(np.exp(x * beta)) / beta)


def leaky_relu(x, negative_slope=0.01):
    # mirrors torch.nn.functional.leaky_relu: x > 0 ? x : x * negative_slope (nn.LeakyReLU's 0.01)
    return np.where(x > 0, x, x * negative_slope)


# the activations by the names tparity's configs use, with nn's default options (gelu exact)
ACTIVATIONS = {"relu": relu, "gelu": gelu, "tanh": tanh, "sigmoid": sigmoid, "silu": silu, "softplus": softplus,
               "leakyrelu": leaky_relu}


def embedding(ids, weight):
    # mirrors torch.nn.functional.embedding: ids is (...) int64 in [0, V), weight is (V, C); out will be (..., C)
    V = weight.shape[0]
    if ids.size and (ids.min() < 0 or ids.max() >= V):
        bad = np.argwhere((ids < 0) | (ids >= V))[0]
        raise ValueError(f"inputs.tokens: id {ids[tuple(bad)]} at {list(bad)} is out of range for an embedding "
                         f"of {V} rows (expected 0 <= id < {V})")
    return weight[ids]


def rounded(f, x):
    # f (np.power's partial, np.sin, np.cos) of dtype values, taken in double and rounded once to x's dtype:
    # the value a correctly rounded float32 libm gives (glibc's powf, sinf, cosf nearly always do; numpy's
    # own float32 loops are off by an ulp in about one case in six, which shows as error torch does not have)
    return f(x.astype(np.float64)).astype(x.dtype)


def positional_encoding(T, C, dtype):
    # seed 004's PositionalEncoding table P[:T], computed in dtype as the seed's torch code computes it,
    # every op's result a dtype value (the transcendental ones through rounded()):
    # X = arange(T)[:, None] / pow(10000, arange(0, C, 2) / C); P[:, 0::2] = sin(X); P[:, 1::2] = cos(X)
    # out will be (T, C); C even
    if C <= 0 or C % 2:
        raise ValueError(f"config: d_model must be positive and even for the positional encoding, got {C}")
    exponent = np.arange(0, C, 2).astype(dtype) / np.dtype(dtype).type(C)  # (C/2)
    inv_freq = rounded(lambda e: np.power(10000.0, e), exponent)  # (C/2)
    X = np.arange(T).astype(dtype)[:, None] / inv_freq  # (T, C/2)
    P = np.empty((T, C), dtype=dtype)
    P[:, 0::2], P[:, 1::2] = rounded(np.sin, X), rounded(np.cos, X)
    return P


def patcher(image, p):
    # mirrors seed 004's Patcher: image.unfold(-2, p, p).unfold(-2, p, p).reshape(B, C, -1, p * p)
    # .transpose(1, 2).reshape(B, -1, C * p * p)
    # image is (B, C, H, W), H and W multiples of p; out will be (B, n, C*p*p), n = (H/p)(W/p): patch (r, c)
    # is row r * (W/p) + c, its features ordered [channel][row in patch][column in patch]
    B, C, H, W = image.shape
    if p <= 0 or H % p or W % p:
        raise ValueError(f"inputs.image: expected H and W multiples of the patch size {p}, "
                         f"got shape {list(image.shape)}")
    x = image.reshape(B, C, H // p, p, W // p, p)  # [b, ch, r, i, c, j]
    return x.transpose(0, 2, 4, 1, 3, 5).reshape(B, (H // p) * (W // p), C * p * p)  # [b, (r, c), (ch, i, j)]


def batch_norm_eval(x, running_mean, running_var, weight, bias, eps):
    # mirrors torch.nn.functional.batch_norm(training=False) on (N, C), rounded in the order of torch's CPU
    # kernel: invstd = 1 / sqrt(var + eps), alpha = invstd * weight, beta = bias - mean * alpha, x * alpha + beta
    # x is (N, C); running_mean, running_var, weight, bias are (C); out will be (N, C)
    alpha = 1 / np.sqrt(running_var + eps) * weight
    beta = bias - running_mean * alpha
    return x * alpha + beta


def seed004_layers(x, sd, config, torch2, tape):
    # the encoder layers in turn (torch.nn.TransformerEncoderLayer, post-norm, batch_first, no mask)
    # x is (B, T, d); state_dict layers.N.*; out will be (B, T, d); components layers.N.<the layer's>
    if config.get("norm_first", False) or not config.get("batch_first", True):
        raise Unsupported("seed 004's models run post-norm, batch-first layers")
    for i in range(config["num_layers"]):
        x = encoder_layer(x, sub_dict(sd, f"layers.{i}."), config, None, None, torch2, tape, f"layers.{i}.")
    return x


def token_encoder(config, forward, sd, inputs, torch2, tape):
    # mirrors seed 004's TransformerEncoder.forward (eval): X = embedding(tokens); X = X + P[:T]; the
    # encoder layers in turn, batch-first, no mask
    # tokens is (B, T) int64 in [0, num_embeddings); embedding.weight is (num_embeddings, d)
    # out will be (B, T, d); components: embedding, pos_encoding (after the addition), layers.N.*, output
    tokens, weight = inputs["tokens"], sd["embedding.weight"]
    if tokens.ndim != 2:
        raise ValueError(f"inputs.tokens: expected 2 dims (B, T), got shape {list(tokens.shape)}")
    V, d = config["num_embeddings"], config["d_model"]
    if weight.shape != (V, d):
        raise ValueError(f"state_dict.embedding.weight: expected shape {[V, d]}, got {list(weight.shape)}")
    T = tokens.shape[1]
    x = tape("embedding", embedding(tokens, weight))  # (B, T, d)
    x = tape("pos_encoding", x + positional_encoding(T, d, x.dtype))
    return {"output": tape("output", seed004_layers(x, sd, config, torch2, tape))}


def vit(config, forward, sd, inputs, torch2, tape):
    # mirrors seed 004's ViT.forward in eval mode (dropout 0, BatchNorm1d on its running statistics):
    # X = patcher(image); X = X + P[:n]; the encoder layers, batch-first; X.view(B, -1) (B, n*d);
    # per hidden width of head_neurons: Linear, BatchNorm1d, activation; then the output Linear
    # image is (B, C, H, W); out will be the logits (B, head_neurons[-1])
    # state_dict: layers.N.*; head.<i>.linear.{weight,bias}, head.<i>.bn.{weight,bias,running_mean,running_var}
    #   per hidden width; head.out.{weight,bias}
    # components: patches (B, n, d), pos_encoding (B, n, d), layers.N.*, head.<i>.linear, head.<i>.bn,
    #   head.<i>.act (B, w_i), output (B, out)
    image, p, C = inputs["image"], config["patch_size"], config["channels"]
    H, W = config["image_size"]
    d, act = config["d_model"], ACTIVATIONS.get(config["head_activation"])
    if act is None:
        raise Unsupported(f"head activation {config['head_activation']!r} "
                          f"(implemented: {', '.join(ACTIVATIONS)})")
    if d != C * p * p:
        raise ValueError(f"config.d_model: expected channels x patch_size^2 = {C * p * p}, got {d}")
    if image.ndim != 4 or image.shape[1:] != (C, H, W):
        raise ValueError(f"inputs.image: expected shape (B, {C}, {H}, {W}), got {list(image.shape)}")
    B = image.shape[0]
    x = tape("patches", patcher(image, p))  # (B, n, d)
    x = tape("pos_encoding", x + positional_encoding(x.shape[1], d, x.dtype))
    x = seed004_layers(x, sd, config, torch2, tape).reshape(B, -1)  # X.view(B, -1): (B, n*d)
    eps = config.get("bn_eps", 1e-5)
    for i in range(len(config["head_neurons"]) - 1):
        pre = f"head.{i}."
        x = tape(pre + "linear", linear(x, sd[pre + "linear.weight"], sd[pre + "linear.bias"]))  # (B, w_i)
        x = tape(pre + "bn", batch_norm_eval(x, sd[pre + "bn.running_mean"], sd[pre + "bn.running_var"],
                                             sd[pre + "bn.weight"], sd[pre + "bn.bias"], eps))
        x = tape(pre + "act", act(x))
    return {"output": tape("output", linear(x, sd["head.out.weight"], sd["head.out.bias"]))}


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


# ---- the LLM blocks: transformers' LlamaDecoderLayer, LlamaAttention, GPT2Block -------------------
# Hugging Face transformers 5.23's semantics (README "The LLM blocks"), in the run's dtype throughout:
# the float64 run is the mathematics in float64 (transformers' own float64 modules compute their RMSNorm,
# rotary angles and softmax in float32; the float64 truth does not). A call sees a KV cache (B, Hkv, S, D)
# of the session's earlier calls; the masks are transformers' additive ones, the dtype's lowest value
# where a key is causal-masked or padding, which give the same weights as -inf wherever a query sees a
# key, and uniform weights over all S keys where it sees none.

def rms_norm(x, weight, eps):
    # mirrors LlamaRMSNorm.forward (in x's dtype, not float32): weight * (x * rsqrt(mean(x^2) + eps))
    # x is (..., C), weight is (C); out will be (..., C)
    variance = np.mean(x * x, axis=-1, keepdims=True)
    return weight * (x * (1 / np.sqrt(variance + eps)))


def gemma_rms_norm(x, weight, eps):
    # mirrors Gemma2RMSNorm.forward (in x's dtype, not float32): (x * rsqrt(mean(x^2) + eps)) * (1 + weight),
    # the weight an offset from 1
    # x is (..., C), weight is (C); out will be (..., C)
    variance = np.mean(x * x, axis=-1, keepdims=True)
    return (x * (1 / np.sqrt(variance + eps))) * (1 + weight)


def llama3_inv_freq(inv_freq, s):
    # Llama 3's rope scaling (config rope_scaling, rope_type "llama3"), as Meta's apply_scaling writes it:
    # wavelengths above original / low_freq_factor slowed by factor, below original / high_freq_factor kept,
    # smoothed between
    original = s["original_max_position_embeddings"]
    wavelen = 2 * np.pi / inv_freq
    smooth = (original / wavelen - s["low_freq_factor"]) / (s["high_freq_factor"] - s["low_freq_factor"])
    smoothed = (1 - smooth) * inv_freq / s["factor"] + smooth * inv_freq
    return np.where(wavelen < original / s["high_freq_factor"], inv_freq,
                    np.where(wavelen > original / s["low_freq_factor"], inv_freq / s["factor"], smoothed))


def rope_tables(positions, r, theta, dtype, scaling=None):
    # mirrors LlamaRotaryEmbedding.forward (default or llama3 rope, attention_scaling 1): inv_freq[i] =
    # 1 / theta^(2i/r) (Llama 3's scaling applied, given one), angle = position * inv_freq[i]; computed in float64
    # and rounded once to dtype, as tparity's core does
    # (the float64 run is then the mathematics; the float32 run's table is the nearest float32 to it)
    # positions is (B, T) int64; out will be cos, sin (B, T, r/2) (transformers' cat(freqs, freqs) repeats
    # these for the two halves; GPT-J's table holds them once and repeat_interleaves)
    inv_freq = 1.0 / theta ** (np.arange(0, r, 2, dtype=np.float64) / r)  # (r/2)
    if scaling is not None:
        inv_freq = llama3_inv_freq(inv_freq, scaling)
    angle = positions.astype(np.float64)[..., None] * inv_freq  # (B, T, r/2)
    return np.cos(angle).astype(dtype), np.sin(angle).astype(dtype)


def rotary(x, cos, sin, r, convention):
    # mirrors apply_rotary_pos_emb: x * cos + rotate(x) * sin on the first r dims of each head, the rest
    # passing through (GPT-NeoX's partial rotary, GPT-J's rotary_dim)
    #   "half" (rotate_half): dims (i, i + r/2) rotate together; "interleaved" (rotate_every_two): (2i, 2i+1)
    # x is (B, H, T, D), cos and sin are (B, T, r/2); out will be (B, H, T, D)
    if r == 0:
        return x
    c, s = cos[:, None], sin[:, None]  # (B, 1, T, r/2): one row per token, every head
    if convention == "half":
        x1, x2 = x[..., :r // 2], x[..., r // 2:r]
        rot = np.concatenate([x1 * c + -x2 * s, x2 * c + x1 * s], axis=-1)
    else:
        x1, x2 = x[..., 0:r:2], x[..., 1:r:2]
        rot = np.stack([x1 * c + -x2 * s, x2 * c + x1 * s], axis=-1).reshape(x.shape[:-1] + (r,))
    return np.concatenate([rot, x[..., r:]], axis=-1)


def gelu_new(x):
    # mirrors transformers' NewGELUActivation (GPT-2's gelu_new): 0.5 x (1 + tanh(sqrt(2/pi) (x + 0.044715 x^3)))
    return 0.5 * x * (1 + np.tanh(math.sqrt(2.0 / math.pi) * (x + 0.044715 * (x * x * x))))


def conv1d(x, weight, bias):
    # mirrors transformers' Conv1D.forward: torch.addmm(bias, x, weight), the weight stored (in, out)
    # x is (..., IN), weight is (IN, OUT), bias is (OUT); out will be (..., OUT)
    return x @ weight + bias


def repeat_kv(x, groups):
    # mirrors transformers' repeat_kv: (B, Hkv, S, D) -> (B, Hkv * groups, S, D), query head h reading kv
    # head h // groups (each kv head repeated for consecutive query heads: expand, then reshape)
    return x if groups == 1 else np.repeat(x, groups, axis=1)


def visible_keys(key_padding_mask, B, L, S, causal, window=0):
    # which key j each query i of a call sees: query i is token past + i of the session (past = S - L keys
    # were in the cache before the call); causal: j <= past + i; a sliding window w > 0 (Mistral's):
    # j > past + i - w (masking_utils.sliding_window_overlay); key_padding_mask is (B, T_total) bool, True
    # at a padding token, over every token of the session (key j is column j), or None
    # out will be (B, 1, L, S) bool, True where the key takes part
    past = S - L
    seen = np.ones((B, 1, L, S), dtype=bool)
    if causal:
        seen &= np.arange(S)[None, :] <= past + np.arange(L)[:, None]
    if window:
        seen &= np.arange(S)[None, :] > past + np.arange(L)[:, None] - window
    if key_padding_mask is not None:
        seen &= ~key_padding_mask[:, None, None, :S]
    return seen


def cached_attention(q, k, v, seen, tape, prefix, scaling=None, softcap=0):
    # mirrors transformers' eager_attention_forward (dropout 0) over the cache:
    # scores = matmul(q, repeat_kv(k)^T) * scaling (default head_dim^-0.5) + mask, softmax, matmul(weights,
    # repeat_kv(v)); Gemma 2's soft-caps before the mask: softcap * tanh(scores / softcap)
    # q is (B, H, L, D); k, v are (B, Hkv, S, D), the cache with this call's keys last; seen (B, 1, L, S)
    # out will be the context (B, L, H*D)
    # components: scores (B, H, L, S), -inf where a key is masked (canonical whatever the dtype), attn_weights
    # (B, H, L, S): uniform 1/S on a row that sees no key (transformers' scores all equal there), context
    groups = q.shape[1] // k.shape[1]
    k, v = repeat_kv(k, groups), repeat_kv(v, groups)
    S = k.shape[2]
    raw = (q @ np.swapaxes(k, -1, -2)) * (q.shape[-1] ** -0.5 if scaling is None else scaling)  # (B, H, L, S)
    if softcap:
        raw = np.tanh(raw / softcap) * softcap
    scores = tape(prefix + "scores", np.where(seen, raw, -np.inf))
    dead = ~np.any(seen, axis=-1, keepdims=True)  # (B, 1, L, 1): a query row that sees no key
    weights = tape(prefix + "attn_weights", np.where(dead, q.dtype.type(1 / S), softmax(scores)))
    return tape(prefix + "context", merge_heads(weighted_sum(weights, v)))


def cache_update(cache, k, v, session, tape, prefix):
    # mirrors DynamicLayer.update: torch.cat of the cache's keys and values and this call's along the sequence
    # cache is (k, v), each (B, Hkv, S0, D), or None; k, v are (B, Hkv, L, D)
    # out will be (k, v), each (B, Hkv, S0 + L, D)
    # components, in a decode session (a lone call's cache is no component): cache.k, cache.v after the update
    if cache is not None:
        k, v = np.concatenate([cache[0], k], axis=2), np.concatenate([cache[1], v], axis=2)
    return (tape(prefix + "cache.k", k), tape(prefix + "cache.v", v)) if session else (k, v)


def llama_attention(x, sd, c, positions, key_padding_mask, cache, tape, prefix=""):
    # mirrors LlamaAttention.forward (eager attention; transformers' DynamicCache when in a decode session)
    # x is (B, L, hidden); positions (B, L) int64, the rotary position of each token; cache (k, v) or None
    # (None and no session: a lone call, its cache not a component); sd: q_proj, k_proj, v_proj (weight,
    # bias with attention_bias), o_proj
    # out will be output (B, L, hidden) and the cache (k, v), each (B, Hkv, S, D), S = its keys so far
    # components: q (B, H, L, D), k, v (B, Hkv, L, D) projected; q_norm, k_norm (Qwen3); q_rot, k_rot after
    # rotary; cache.k, cache.v (in a session); scores, attn_weights (B, H, L, S); context (B, L, H*D); output (B, L, hidden)
    H, Hkv, D = c["heads"], c["kv_heads"], c["head_dim"]
    B, L, _ = x.shape
    if H % Hkv:
        raise ValueError(f"config.num_key_value_heads: expected a divisor of num_attention_heads {H}, got {Hkv}")
    for name, shape in (("q_proj", (H * D, c["hidden"])), ("k_proj", (Hkv * D, c["hidden"])),
                        ("v_proj", (Hkv * D, c["hidden"])), ("o_proj", (c["hidden"], H * D))):
        if sd[name + ".weight"].shape != shape:
            raise ValueError(f"state_dict.{c['sd_prefix']}{name}.weight: expected shape {list(shape)}, "
                             f"got {list(sd[name + '.weight'].shape)}")
    if positions.size and (positions.min() < 0 or positions.max() >= c["max_positions"]):
        raise ValueError(f"inputs.position_ids: expected positions in [0, max_position_embeddings = "
                         f"{c['max_positions']}), got {int(positions.min())} .. {int(positions.max())}")
    q = tape(prefix + "q", split_heads(linear(x, sd["q_proj.weight"], sd.get("q_proj.bias")), H))
    k = tape(prefix + "k", split_heads(linear(x, sd["k_proj.weight"], sd.get("k_proj.bias")), Hkv))
    v = tape(prefix + "v", split_heads(linear(x, sd["v_proj.weight"], sd.get("v_proj.bias")), Hkv))
    if c["qk_norm"]:  # Qwen3Attention: q_norm and k_norm (RMSNorm over each head's dims) before rotary
        q = tape(prefix + "q_norm", rms_norm(q, sd["q_norm.weight"], c["rms_norm_eps"]))
        k = tape(prefix + "k_norm", rms_norm(k, sd["k_norm.weight"], c["rms_norm_eps"]))
    cos, sin = rope_tables(positions, c["rotary_dim"], c["rope_theta"], x.dtype, c["rope_scaling"])
    q = tape(prefix + "q_rot", rotary(q, cos, sin, c["rotary_dim"], c["rope_convention"]))
    k = tape(prefix + "k_rot", rotary(k, cos, sin, c["rotary_dim"], c["rope_convention"]))
    # past_key_values.update(key_states, value_states): the cache holds k after rotary
    ks, vs = cache_update(cache, k, v, c["session"], tape, prefix)
    seen = visible_keys(key_padding_mask, B, L, ks.shape[2], c["causal"], c["sliding_window"])
    context = cached_attention(q, ks, vs, seen, tape, prefix, c["scaling"], c["softcap"])
    return tape(prefix + "output", linear(context, sd["o_proj.weight"], sd.get("o_proj.bias"))), (ks, vs)


def llama_mlp(x, sd, tape, prefix):
    # mirrors LlamaMLP: down_proj(silu(gate_proj(x)) * up_proj(x))
    # x is (B, L, hidden); out will be (B, L, hidden)
    # components: mlp.gate, mlp.up (B, L, I), mlp.act (B, L, I) silu(gate) * up, mlp.down (B, L, hidden)
    gate = tape(prefix + "mlp.gate", linear(x, sd["mlp.gate_proj.weight"], sd.get("mlp.gate_proj.bias")))
    up = tape(prefix + "mlp.up", linear(x, sd["mlp.up_proj.weight"], sd.get("mlp.up_proj.bias")))
    act = tape(prefix + "mlp.act", silu(gate) * up)
    return tape(prefix + "mlp.down", linear(act, sd["mlp.down_proj.weight"], sd.get("mlp.down_proj.bias")))


def llama_layer(x, sd, c, positions, key_padding_mask, cache, tape, prefix=""):
    # mirrors LlamaDecoderLayer.forward: h = x + attn(input_layernorm(x)); h + mlp(post_attention_layernorm(h))
    # x is (B, L, hidden); out will be output (B, L, hidden) and the cache
    # components: input_layernorm, attn.<the attention's>, attn_residual, post_attention_layernorm, mlp.*, output
    eps = c["rms_norm_eps"]
    h = tape(prefix + "input_layernorm", rms_norm(x, sd["input_layernorm.weight"], eps))
    a, cache = llama_attention(h, sub_dict(sd, "self_attn."), c, positions, key_padding_mask, cache, tape,
                               prefix + "attn.")
    x = tape(prefix + "attn_residual", x + a)
    h = tape(prefix + "post_attention_layernorm", rms_norm(x, sd["post_attention_layernorm.weight"], eps))
    return tape(prefix + "output", x + llama_mlp(h, sd, tape, prefix)), cache


def gemma2_layer(x, sd, c, positions, key_padding_mask, cache, tape, prefix=""):
    # mirrors Gemma2DecoderLayer.forward: Gemma2RMSNorm (by 1 + weight) before and after the attention and
    # the MLP: h = x + post_attention_layernorm(attn(input_layernorm(x)));
    # h + post_feedforward_layernorm(mlp(pre_feedforward_layernorm(h))), Gemma2MLP =
    # down_proj(gelu_pytorch_tanh(gate_proj(x)) * up_proj(x)) (gelu_new's formula)
    # x is (B, L, hidden); out will be output (B, L, hidden) and the cache
    # components: input_layernorm, attn.<the attention's>, post_attention_layernorm, attn_residual,
    # pre_feedforward_layernorm, mlp.gate, mlp.up, mlp.act, mlp.down, post_feedforward_layernorm, output
    eps = c["rms_norm_eps"]

    def norm(y, name):
        return tape(prefix + name, gemma_rms_norm(y, sd[name + ".weight"], eps))

    h = norm(x, "input_layernorm")
    a, cache = llama_attention(h, sub_dict(sd, "self_attn."), c, positions, key_padding_mask, cache, tape,
                               prefix + "attn.")
    x = tape(prefix + "attn_residual", x + norm(a, "post_attention_layernorm"))
    h = norm(x, "pre_feedforward_layernorm")
    gate = tape(prefix + "mlp.gate", linear(h, sd["mlp.gate_proj.weight"]))
    up = tape(prefix + "mlp.up", linear(h, sd["mlp.up_proj.weight"]))
    act = tape(prefix + "mlp.act", gelu_new(gate) * up)
    down = tape(prefix + "mlp.down", linear(act, sd["mlp.down_proj.weight"]))
    return tape(prefix + "output", x + norm(down, "post_feedforward_layernorm")), cache


def gpt2_block(x, sd, c, positions, key_padding_mask, cache, tape, prefix=""):
    # mirrors GPT2Block.forward (eager attention, no cross-attention; positions are the model's wpe, outside):
    # h = x + c_proj(attn(ln_1(x))); h + mlp.c_proj(gelu_new(mlp.c_fc(ln_2(h)))); Conv1D weights (in, out),
    # c_attn's output split into q, k, v by columns
    # x is (B, L, hidden); out will be output (B, L, hidden) and the cache (k, v), each (B, H, S, D)
    # components: ln_1, attn.q, attn.k, attn.v (B, H, L, D), attn.cache.k, attn.cache.v (in a session),
    # attn.scores, attn.attn_weights, attn.context, attn.output, attn_residual, ln_2, mlp.fc, mlp.act,
    # mlp.proj, output
    C, H, eps = c["hidden"], c["heads"], c["layer_norm_epsilon"]
    B, L, _ = x.shape
    h = tape(prefix + "ln_1", layer_norm(x, sd["ln_1.weight"], sd["ln_1.bias"], eps))
    qkv = conv1d(h, sd["attn.c_attn.weight"], sd["attn.c_attn.bias"])  # (B, L, 3C)
    q, k, v = (tape(prefix + "attn." + n, split_heads(qkv[..., i * C:(i + 1) * C], H))  # (B, H, L, D) each
               for i, n in enumerate("qkv"))
    ks, vs = cache_update(cache, k, v, c["session"], tape, prefix + "attn.")
    seen = visible_keys(key_padding_mask, B, L, ks.shape[2], c["causal"])
    context = cached_attention(q, ks, vs, seen, tape, prefix + "attn.")
    a = tape(prefix + "attn.output", conv1d(context, sd["attn.c_proj.weight"], sd["attn.c_proj.bias"]))
    x = tape(prefix + "attn_residual", a + x)
    h = tape(prefix + "ln_2", layer_norm(x, sd["ln_2.weight"], sd["ln_2.bias"], eps))
    fc = tape(prefix + "mlp.fc", conv1d(h, sd["mlp.c_fc.weight"], sd["mlp.c_fc.bias"]))
    act = tape(prefix + "mlp.act", gelu_new(fc))
    m = tape(prefix + "mlp.proj", conv1d(act, sd["mlp.c_proj.weight"], sd["mlp.c_proj.bias"]))
    return tape(prefix + "output", x + m), (ks, vs)


def llm_config(module, config):
    # the config by transformers' names, with their defaults (LlamaConfig, GPT2Config), as one dict
    c = {"hidden": config["hidden_size"], "heads": config["num_attention_heads"],
         "causal": config.get("causal", True), "decode_steps": config.get("decode_steps", 0)}
    if module == "GPT2Block":
        c.update(layer_norm_epsilon=config.get("layer_norm_epsilon", 1e-5),
                 max_positions=config.get("max_position_embeddings", 1024))
        if c["hidden"] % c["heads"]:
            raise ValueError(f"config.num_attention_heads: expected a divisor of hidden_size {c['hidden']}, "
                             f"got {c['heads']}")
        c.update(kv_heads=c["heads"], head_dim=c["hidden"] // c["heads"])
        return c
    c.update(kv_heads=config.get("num_key_value_heads", c["heads"]),
             head_dim=config.get("head_dim", c["hidden"] // c["heads"]),
             rope_theta=config.get("rope_theta", 10000.0), rope_convention=config.get("rope_convention", "half"),
             rope_scaling=config.get("rope_scaling"),  # LlamaConfig's: Llama 3's llama3 scaling, or None
             max_positions=config.get("max_position_embeddings", 2048),
             rms_norm_eps=config.get("rms_norm_eps", 1e-6),
             sliding_window=config.get("sliding_window") or 0,  # MistralConfig's; None: full attention
             qk_norm=module == "Qwen3DecoderLayer",
             # Gemma2Config's: scores scaled by query_pre_attn_scalar^-0.5 and soft-capped (defaults 256, 50)
             scaling=(config.get("query_pre_attn_scalar", 256) ** -0.5 if module == "Gemma2DecoderLayer" else None),
             softcap=(config.get("attn_logit_softcapping", 50.0) or 0) if module == "Gemma2DecoderLayer" else 0,
             sd_prefix="" if module == "LlamaAttention" else "self_attn.")
    # GPT-NeoX's rotary_ndims = int(head_dim * partial_rotary_factor): the first r dims of a head rotate
    c["rotary_dim"] = int(c["head_dim"] * config.get("partial_rotary_factor", 1.0))
    if c["rope_convention"] not in ("half", "interleaved"):
        raise ValueError(f"config.rope_convention: expected \"half\" or \"interleaved\", "
                         f"got {c['rope_convention']!r}")
    if c["rotary_dim"] % 2:
        raise ValueError(f"config.partial_rotary_factor: head_dim x factor = {c['rotary_dim']} rotary dims, "
                         f"expected an even number")
    return c


def llm_module(module):
    # forward(config, forward, sd, inputs, torch2, tape) of LlamaDecoderLayer, LlamaAttention or GPT2Block:
    # one call over hidden_states (B, T, hidden), or a decode session (config decode_steps D > 0): the first
    # T - D tokens prefilled in one call, then one call per token over the cache (transformers' generate()
    # with a DynamicCache), each call's components under prefill. and step.N.; output is the calls' outputs
    # in order (B, T, hidden)
    # inputs: position_ids (B, T) int64 (default: the cache's length + arange), key_padding_mask (B, T) bool
    # (True at a padding token: transformers' attention_mask negated)
    call = {"LlamaDecoderLayer": llama_layer, "LlamaAttention": llama_attention, "GPT2Block": gpt2_block,
            "MistralDecoderLayer": llama_layer, "Qwen3DecoderLayer": llama_layer,
            "Gemma2DecoderLayer": gemma2_layer}[module]

    def forward(config, _forward, sd, inputs, torch2, tape):
        c = llm_config(module, config)
        x, kpm = inputs["hidden_states"], inputs.get("key_padding_mask")
        if x.ndim != 3 or x.shape[2] != c["hidden"]:
            raise ValueError(f"inputs.hidden_states: expected (B, T, {c['hidden']}), got shape {list(x.shape)}")
        B, T, _ = x.shape
        positions = inputs.get("position_ids", np.broadcast_to(np.arange(T, dtype=np.int64), (B, T)))
        for name, m in (("position_ids", positions), ("key_padding_mask", kpm)):
            if m is not None and m.shape != (B, T):
                raise ValueError(f"inputs.{name}: expected shape {[B, T]} (B, T), got {list(m.shape)}")
        if kpm is not None and kpm.dtype != np.bool_:
            raise ValueError(f"inputs.key_padding_mask: expected a bool mask (True at a padding token), "
                             f"got {kpm.dtype}")
        D = c["decode_steps"]
        if not 0 <= D < T:
            raise ValueError(f"config.decode_steps: expected 0 <= decode_steps < the {T} tokens, got {D}")
        c["session"] = D > 0
        if D == 0:
            return {"output": call(x, sd, c, positions, kpm, None, tape)[0]}
        P = T - D  # tokens prefilled
        cache, outs = None, []
        for t0, t1, prefix in [(0, P, "prefill.")] + [(t, t + 1, f"step.{t - P}.") for t in range(P, T)]:
            out, cache = call(x[:, t0:t1], sd, c, positions[:, t0:t1], kpm, cache, tape, prefix)
            outs.append(out)
        return {"output": tape("output", np.concatenate(outs, axis=1))}
    return forward


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
    "TokenEncoder": token_encoder,
    "ViT": vit,
    **{name: llm_module(name) for name in ("LlamaDecoderLayer", "LlamaAttention", "GPT2Block",
                                           "MistralDecoderLayer", "Qwen3DecoderLayer", "Gemma2DecoderLayer")},
    **{name: book_module(name) for name in BOOK_CLASSES},
}
