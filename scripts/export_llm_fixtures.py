#!/usr/bin/env python3
"""Export the LLM blocks' fixtures from Hugging Face transformers itself.

    HF_HUB_OFFLINE=1 .venv/bin/python scripts/export_llm_fixtures.py [--out fixtures/torch-2.13] [--only NAME ...]

Each fixture (format v2, inline tensors) is one call or one decode session of transformers' own
module, built from a small config with random weights (nothing is loaded from a hub):

  llama_layer            LlamaDecoderLayer: grouped-query (4 heads, 2 kv heads), head_dim 12 != 32 / 4,
                         attention bias, position ids with an offset, a right-padded element
  llama_mqa_positions    LlamaDecoderLayer: multi-query (1 kv head), rope_theta 500000, positions 1990..
  llama_decode           LlamaDecoderLayer decode session: a left-padded prompt of 5 prefilled in one call,
                         then 3 steps of one token through transformers' DynamicCache
  llama3_rope_decode     LlamaDecoderLayer decode session with Llama 3.1's rope scaling (llama3: factor 8,
                         8192 original positions), positions 8188..8195 across the original context
  gpt2_block             GPT2Block: Conv1D weights (in, out), fused c_attn, gelu_new, a padded element
  gptj_attention         GPTJAttention (interleaved rotary pairs, rotary_dim 4 of 8) as a LlamaAttention
  neox_attention         GPTNeoXAttention (fused per-head query_key_value, rotary_pct 0.25, bias) as a
                         LlamaAttention
  qwen3_layer            Qwen3DecoderLayer: per-head q_norm / k_norm before rotary, 4 heads over 2 kv heads,
                         head_dim 12 != 32 / 4, full attention, position ids with offsets, a right-padded element
  qwen3_decode           Qwen3DecoderLayer decode session: a padded prompt of 5 prefilled, then 3 steps
  mistral_layer          MistralDecoderLayer: sliding window 3, a right-padded element
  mistral_decode         MistralDecoderLayer decode session, sliding window 3: a padded prompt of 5, then 4 steps
                         past the window (DynamicCache's DynamicSlidingWindowLayer keeps only 2 keys)
  gemma2_layer_sliding   Gemma2DecoderLayer layer 0 (sliding_attention, window 4): query_pre_attn_scalar 12 !=
                         head_dim 8, attn_logit_softcapping 1.5, RMSNorm (1 + weight) before and after attention
                         and MLP, gelu_pytorch_tanh, a right-padded element
  gemma2_layer_full      Gemma2DecoderLayer layer 1 (full_attention: no window), the same sizes and soft-cap
  gemma2_decode          Gemma2DecoderLayer layer 0 decode session, sliding window 3: a padded prompt of 5,
                         then 4 steps

Precision policy. transformers computes in float32 in places even for a float64 module: LlamaRMSNorm,
Qwen3RMSNorm and MistralRMSNorm (hidden_states.to(torch.float32)), Gemma2RMSNorm (x.float() and
1.0 + weight.float()), the rotary angles (inv_freq and position_ids .float()), eager attention's
softmax(dtype=torch.float32) (Llama, NeoX, Qwen3, Mistral, Gemma2 after its soft-cap), GPT-J's _attn
(query and key .to(float32)) and its float32 sincos table. The fixtures' float64 results ("outputs",
"components") are the mathematics in float64: the same modules run with those casts patched to the
input's dtype, every other line transformers' own. The script checks that the patched modules run
in float32 give transformers' float32 results bit for bit (so the patches change the casts and
nothing else), and records in each fixture's "reference" block how far transformers' own float64
module (with its casts) lies from that float64 truth ("hf_float64_casts_rel_l2"). "outputs_float32"
and "components_float32" are transformers' float32 module as is.

Components come from a line-by-line replay of each module with transformers' own submodules and
functions (apply_rotary_pos_emb, repeat_kv, the Linear / Conv1D / RMSNorm modules), checked bit
for bit against the module's output and, in decode, against the DynamicCache's contents.

The masks: the modules take transformers' 4-D additive mask, built here as masking_utils builds it
for eager attention: 0 where a key is visible, torch.finfo(dtype).min where it is causal-masked or
padding, or (a layer with a sliding window w) where key j <= i - w for query i, both absolute indices
(masking_utils.sliding_window_overlay). In a decode session a sliding layer's DynamicCache layer
(DynamicSlidingWindowLayer) keeps only the last w - 1 keys and values and hands the attention those
plus the step's own; the module gets the mask's columns for those keys, as masking_utils slices them.
The replays keep every key (the components cache.k / cache.v), check the cache's contents against
their tail, run the attention over the same keys as transformers and widen scores / attn_weights
back to all keys with -inf / 0.
"""
import argparse
import copy
import json
import math
import os
import sys

os.environ.setdefault("HF_HUB_OFFLINE", "1")

import torch  # noqa: E402
import transformers  # noqa: E402
from transformers import (Gemma2Config, GPT2Config, GPTJConfig, GPTNeoXConfig, LlamaConfig,  # noqa: E402
                          MistralConfig, Qwen3Config)
from transformers.cache_utils import DynamicCache, DynamicSlidingWindowLayer  # noqa: E402
from transformers.models.gemma2 import modeling_gemma2 as MG2  # noqa: E402
from transformers.models.gpt2 import modeling_gpt2 as MG  # noqa: E402
from transformers.models.gpt_neox import modeling_gpt_neox as MN  # noqa: E402
from transformers.models.gptj import modeling_gptj as MJ  # noqa: E402
from transformers.models.llama import modeling_llama as ML  # noqa: E402
from transformers.models.mistral import modeling_mistral as MM  # noqa: E402
from transformers.models.qwen3 import modeling_qwen3 as MQ  # noqa: E402

torch.set_num_threads(1)
ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def rel_l2(a, b):
    """Over the positions finite in both (transformers' float64 with its casts gives NaN rows where the
    float64 lowest value, cast to float32, becomes -inf)."""
    a, b = a.double(), b.double()
    ok = torch.isfinite(a) & torch.isfinite(b)
    a, b = a[ok], b[ok]
    d = float(torch.linalg.vector_norm(b))
    return float(torch.linalg.vector_norm(a - b)) / d if d else float(torch.linalg.vector_norm(a - b))


# ---- the float64 truth: transformers' casts patched to the input's dtype -----------------------

def rms_true(self, hidden_states):  # LlamaRMSNorm.forward without .to(torch.float32)
    variance = hidden_states.pow(2).mean(-1, keepdim=True)
    hidden_states = hidden_states * torch.rsqrt(variance + self.variance_epsilon)
    return self.weight * hidden_states


def gemma2_rms_true(self, x):  # Gemma2RMSNorm.forward without .float(): x and (1 + weight) in x's dtype
    output = self._norm(x)
    output = output * (1.0 + self.weight)
    return output.type_as(x)


def eager_true(module, query, key, value, attention_mask, scaling, dropout=0.0, **kwargs):
    # modeling_llama.eager_attention_forward with softmax in the query's dtype (not dtype=torch.float32)
    key_states = ML.repeat_kv(key, module.num_key_value_groups)
    value_states = ML.repeat_kv(value, module.num_key_value_groups)
    attn_weights = torch.matmul(query, key_states.transpose(2, 3)) * scaling
    if attention_mask is not None:
        attn_weights = attn_weights + attention_mask
    attn_weights = torch.nn.functional.softmax(attn_weights, dim=-1)
    attn_output = torch.matmul(attn_weights, value_states)
    return attn_output.transpose(1, 2).contiguous(), attn_weights


def neox_eager_true(module, query, key, value, attention_mask, scaling, dropout=0.0, **kwargs):
    attn_weights = torch.matmul(query, key.transpose(2, 3)) * scaling
    if attention_mask is not None:
        attn_weights = attn_weights + attention_mask
    attn_weights = torch.nn.functional.softmax(attn_weights, dim=-1)
    attn_output = torch.matmul(attn_weights, value)
    return attn_output.transpose(1, 2).contiguous(), attn_weights


def gemma2_eager_true(module, query, key, value, attention_mask, dropout=0.0, scaling=None, softcap=None, **kwargs):
    # modeling_gemma2.eager_attention_forward (scaling, then the soft-cap, then the mask) with softmax in the
    # query's dtype
    if scaling is None:
        scaling = module.head_dim**-0.5
    key_states = MG2.repeat_kv(key, module.num_key_value_groups)
    value_states = MG2.repeat_kv(value, module.num_key_value_groups)
    attn_weights = torch.matmul(query, key_states.transpose(2, 3)) * scaling
    if softcap is not None:
        attn_weights = attn_weights / softcap
        attn_weights = torch.tanh(attn_weights)
        attn_weights = attn_weights * softcap
    if attention_mask is not None:
        attn_weights = attn_weights + attention_mask
    attn_weights = torch.nn.functional.softmax(attn_weights, dim=-1)
    attn_output = torch.matmul(attn_weights, value_states)
    return attn_output.transpose(1, 2).contiguous(), attn_weights


def gptj_attn_true(self, query, key, value, attention_mask=None):  # GPTJAttention._attn without .to(float32)
    attn_weights = torch.matmul(query, key.transpose(-1, -2))
    attn_weights = attn_weights / self.scale_attn
    if attention_mask is not None:
        attn_weights = attn_weights + attention_mask
    attn_weights = torch.nn.functional.softmax(attn_weights, dim=-1)
    attn_weights = attn_weights.to(value.dtype)
    return torch.matmul(attn_weights, value), attn_weights


class Patched:
    """transformers' float32 casts replaced by the input's dtype, for the duration."""

    def __enter__(self):
        self.saved = [(ML.LlamaRMSNorm, "forward", ML.LlamaRMSNorm.forward),
                      (ML, "eager_attention_forward", ML.eager_attention_forward),
                      (MN, "eager_attention_forward", MN.eager_attention_forward),
                      (MJ.GPTJAttention, "_attn", MJ.GPTJAttention._attn),
                      (MQ.Qwen3RMSNorm, "forward", MQ.Qwen3RMSNorm.forward),
                      (MQ, "eager_attention_forward", MQ.eager_attention_forward),
                      (MM.MistralRMSNorm, "forward", MM.MistralRMSNorm.forward),
                      (MM, "eager_attention_forward", MM.eager_attention_forward),
                      (MG2.Gemma2RMSNorm, "forward", MG2.Gemma2RMSNorm.forward),
                      (MG2, "eager_attention_forward", MG2.eager_attention_forward)]
        ML.LlamaRMSNorm.forward = rms_true
        ML.eager_attention_forward = eager_true
        MN.eager_attention_forward = neox_eager_true
        MJ.GPTJAttention._attn = gptj_attn_true
        MQ.Qwen3RMSNorm.forward = rms_true  # Qwen3's and Mistral's RMSNorm and eager attention are Llama's
        MQ.eager_attention_forward = eager_true
        MM.MistralRMSNorm.forward = rms_true
        MM.eager_attention_forward = eager_true
        MG2.Gemma2RMSNorm.forward = gemma2_rms_true
        MG2.eager_attention_forward = gemma2_eager_true
        return self

    def __exit__(self, *exc):
        for obj, name, value in self.saved:
            setattr(obj, name, value)


ROTARY = {LlamaConfig: ML.LlamaRotaryEmbedding, GPTNeoXConfig: MN.GPTNeoXRotaryEmbedding,
          Qwen3Config: MQ.Qwen3RotaryEmbedding, MistralConfig: MM.MistralRotaryEmbedding,
          Gemma2Config: MG2.Gemma2RotaryEmbedding}


def rope(config, position_ids, dtype, true):
    """LlamaRotaryEmbedding / GPTNeoXRotaryEmbedding / Qwen3, Mistral, Gemma2RotaryEmbedding.forward (default
    rope; Llama 3's llama3 rope too): transformers' own in float32 then cast to dtype, or (true) its code in
    dtype throughout."""
    rotary = ROTARY[type(config)](config)
    if not true:
        return rotary(torch.zeros(1, dtype=dtype), position_ids)
    base = config.rope_parameters["rope_theta"]
    # the dims the class itself rotates, twice its inv_freq's length: GPTNeoX's default rope and the llama3 rope
    # read partial_rotary_factor, Llama's, Mistral's, Qwen3's and Gemma2's default rope do not
    dim = 2 * rotary.inv_freq.numel()
    inv_freq = 1.0 / (base ** (torch.arange(0, dim, 2, dtype=dtype) / dim))
    rp = config.rope_parameters
    if rp.get("rope_type", "default") == "llama3":  # _compute_llama3_parameters' lines, in dtype
        factor, low_freq_factor, high_freq_factor = rp["factor"], rp["low_freq_factor"], rp["high_freq_factor"]
        old_context_len = rp["original_max_position_embeddings"]
        low_freq_wavelen, high_freq_wavelen = old_context_len / low_freq_factor, old_context_len / high_freq_factor
        wavelen = 2 * math.pi / inv_freq
        inv_freq_llama = torch.where(wavelen > low_freq_wavelen, inv_freq / factor, inv_freq)
        smooth_factor = (old_context_len / wavelen - low_freq_factor) / (high_freq_factor - low_freq_factor)
        smoothed_inv_freq = (1 - smooth_factor) * inv_freq_llama / factor + smooth_factor * inv_freq_llama
        is_medium_freq = ~(wavelen < high_freq_wavelen) * ~(wavelen > low_freq_wavelen)
        inv_freq = torch.where(is_medium_freq, smoothed_inv_freq, inv_freq_llama)
    else:
        assert rp.get("rope_type", "default") == "default", rp
    freqs = position_ids[..., None].to(dtype) * inv_freq
    emb = torch.cat((freqs, freqs), dim=-1)
    return emb.cos(), emb.sin()


def gptj_table(module, dtype, true):
    """GPTJAttention.embed_positions: create_sinusoidal_positions in float32 (transformers') or in dtype."""
    if not true:
        return module.embed_positions
    dim, n = module.pos_embd_dim, module.max_positions
    inv_freq = 1.0 / (10000 ** (torch.arange(0, dim, 2, dtype=torch.int64).to(dtype) / dim))
    sinusoid_inp = torch.arange(n, dtype=torch.int64).to(dtype)[:, None] * inv_freq
    return torch.cat((torch.sin(sinusoid_inp), torch.cos(sinusoid_inp)), dim=1)


def additive_mask(B, L, S, padding, dtype, sliding_window=None):
    """(B, 1, L, S): 0 where query i (absolute S - L + i) sees key j, finfo(dtype).min elsewhere. With a
    sliding window w, key j is visible only if j > i - w too (masking_utils.sliding_window_overlay)."""
    past = S - L
    masked = torch.ones(L, S, dtype=torch.bool).triu(past + 1)
    if sliding_window is not None:
        masked = masked | (torch.arange(S)[None, :] <= torch.arange(past, S)[:, None] - sliding_window)
    masked = masked[None, None].expand(B, 1, L, S)
    if padding is not None:
        masked = masked | padding[:, None, None, :S]
    return torch.zeros(B, 1, L, S, dtype=dtype).masked_fill(masked, torch.finfo(dtype).min)


# ---- line-by-line replays, components collected, checked against the modules --------------------

class Sink:
    def __init__(self, comps, prefix=""):
        self.comps, self.prefix = comps, prefix

    def put(self, name, t):
        t = t.detach().clone()
        if name == "scores":  # the canonical component: -inf where masked (transformers adds finfo.min)
            t = t.masked_fill(t <= torch.finfo(t.dtype).min / 2, float("-inf"))
        self.comps[self.prefix + name] = t

    def sub(self, prefix):
        return Sink(self.comps, self.prefix + prefix)


def eager_replay(scores_mask, q, k, v, groups, scaling, sink, true, divide=None, softcap=None):
    k, v = ML.repeat_kv(k, groups), ML.repeat_kv(v, groups)
    if divide is None:
        scores = torch.matmul(q, k.transpose(2, 3)) * scaling
    else:  # GPT-J: (query.float() @ key.float()^T) / scale_attn
        qq, kk = (q, k) if true else (q.to(torch.float32), k.to(torch.float32))
        scores = torch.matmul(qq, kk.transpose(-1, -2)) / divide
    if softcap is not None:  # Gemma2: softcap * tanh(scores / softcap), before the mask
        scores = scores / softcap
        scores = torch.tanh(scores)
        scores = scores * softcap
    scores = scores + scores_mask
    sink.put("scores", scores)
    if divide is not None:
        w = torch.nn.functional.softmax(scores, dim=-1).to(v.dtype)
    elif true:
        w = torch.nn.functional.softmax(scores, dim=-1)
    else:
        w = torch.nn.functional.softmax(scores, dim=-1, dtype=torch.float32).to(q.dtype)
    sink.put("attn_weights", w)
    B, L = q.shape[0], q.shape[2]
    ctx = torch.matmul(w, v).transpose(1, 2).contiguous().reshape(B, L, -1)
    sink.put("context", ctx)
    return ctx


def llama_attention_replay(attn, h, cos, sin, mask, cache, sink, true, cached):
    B, T, _ = h.shape
    D = attn.head_dim
    q = attn.q_proj(h).view(B, T, -1, D).transpose(1, 2)
    k = attn.k_proj(h).view(B, T, -1, D).transpose(1, 2)
    v = attn.v_proj(h).view(B, T, -1, D).transpose(1, 2)
    sink.put("q", q), sink.put("k", k), sink.put("v", v)
    q_rot, k_rot = ML.apply_rotary_pos_emb(q, k, cos, sin)
    sink.put("q_rot", q_rot), sink.put("k_rot", k_rot)
    cache["k"] = k_rot if cache.get("k") is None else torch.cat([cache["k"], k_rot], dim=-2)
    cache["v"] = v if cache.get("v") is None else torch.cat([cache["v"], v], dim=-2)
    if cached:
        sink.put("cache.k", cache["k"]), sink.put("cache.v", cache["v"])
    ctx = eager_replay(mask, q_rot, cache["k"], cache["v"], attn.num_key_value_groups, attn.scaling, sink, true)
    out = attn.o_proj(ctx)
    sink.put("output", out)
    return out


def llama_layer_replay(layer, x, cos, sin, mask, cache, sink, true, cached):
    h = layer.input_layernorm(x)
    sink.put("input_layernorm", h)
    a = llama_attention_replay(layer.self_attn, h, cos, sin, mask, cache, sink.sub("attn."), true, cached)
    x1 = x + a
    sink.put("attn_residual", x1)
    h2 = layer.post_attention_layernorm(x1)
    sink.put("post_attention_layernorm", h2)
    gate, up = layer.mlp.gate_proj(h2), layer.mlp.up_proj(h2)
    sink.put("mlp.gate", gate), sink.put("mlp.up", up)
    act = layer.mlp.act_fn(gate) * up
    sink.put("mlp.act", act)
    down = layer.mlp.down_proj(act)
    sink.put("mlp.down", down)
    out = x1 + down
    sink.put("output", out)
    return out


def decoder_attention_replay(attn, M, h, cos, sin, mask, cache, sink, true, cached, visible, softcap=None):
    """Qwen3Attention (qk_norm: q_norm / k_norm on the (B, T, heads, D) view, before the transpose),
    MistralAttention, Gemma2Attention (soft-cap). cache holds every key so far; attention runs over the last
    `visible` of them, those transformers' cache hands the module (a DynamicSlidingWindowLayer keeps only
    sliding_window - 1), and scores / attn_weights are widened back to all keys (-inf / 0: the keys left out
    lie outside the window, masked)."""
    B, T, _ = h.shape
    D = attn.head_dim
    q = attn.q_proj(h).view(B, T, -1, D)
    k = attn.k_proj(h).view(B, T, -1, D)
    v = attn.v_proj(h).view(B, T, -1, D).transpose(1, 2)
    sink.put("q", q.transpose(1, 2)), sink.put("k", k.transpose(1, 2)), sink.put("v", v)
    if hasattr(attn, "q_norm"):
        q, k = attn.q_norm(q), attn.k_norm(k)
        sink.put("q_norm", q.transpose(1, 2)), sink.put("k_norm", k.transpose(1, 2))
    q_rot, k_rot = M.apply_rotary_pos_emb(q.transpose(1, 2), k.transpose(1, 2), cos, sin)
    sink.put("q_rot", q_rot), sink.put("k_rot", k_rot)
    cache["k"] = k_rot if cache.get("k") is None else torch.cat([cache["k"], k_rot], dim=-2)
    cache["v"] = v if cache.get("v") is None else torch.cat([cache["v"], v], dim=-2)
    if cached:
        sink.put("cache.k", cache["k"]), sink.put("cache.v", cache["v"])
    S = cache["k"].shape[-2]
    if visible == S:
        ctx = eager_replay(mask, q_rot, cache["k"], cache["v"], attn.num_key_value_groups, attn.scaling, sink, true,
                           softcap=softcap)
    else:
        cut = S - visible
        assert bool((mask[..., :cut] == torch.finfo(mask.dtype).min).all()), "keys left out of the cache not masked"
        inner = {}
        ctx = eager_replay(mask[..., cut:], q_rot, cache["k"][:, :, cut:].contiguous(),
                           cache["v"][:, :, cut:].contiguous(), attn.num_key_value_groups, attn.scaling, Sink(inner),
                           true, softcap=softcap)
        scores, weights = inner["scores"], inner["attn_weights"]
        sink.put("scores", torch.cat([scores.new_full(scores.shape[:-1] + (cut,), float("-inf")), scores], dim=-1))
        sink.put("attn_weights", torch.cat([weights.new_zeros(weights.shape[:-1] + (cut,)), weights], dim=-1))
        sink.put("context", inner["context"])
    out = attn.o_proj(ctx)
    sink.put("output", out)
    return out


def rms_layer_replay(layer, M, x, cos, sin, mask, cache, sink, true, cached, visible):
    """Qwen3DecoderLayer, MistralDecoderLayer (LlamaDecoderLayer's lines)."""
    h = layer.input_layernorm(x)
    sink.put("input_layernorm", h)
    a = decoder_attention_replay(layer.self_attn, M, h, cos, sin, mask, cache, sink.sub("attn."), true, cached,
                                 visible)
    x1 = x + a
    sink.put("attn_residual", x1)
    h2 = layer.post_attention_layernorm(x1)
    sink.put("post_attention_layernorm", h2)
    gate, up = layer.mlp.gate_proj(h2), layer.mlp.up_proj(h2)
    sink.put("mlp.gate", gate), sink.put("mlp.up", up)
    act = layer.mlp.act_fn(gate) * up
    sink.put("mlp.act", act)
    down = layer.mlp.down_proj(act)
    sink.put("mlp.down", down)
    out = x1 + down
    sink.put("output", out)
    return out


def gemma2_layer_replay(layer, M, x, cos, sin, mask, cache, sink, true, cached, visible):
    """Gemma2DecoderLayer: RMSNorm (1 + weight) before and after both the attention and the MLP."""
    h = layer.input_layernorm(x)
    sink.put("input_layernorm", h)
    a = decoder_attention_replay(layer.self_attn, M, h, cos, sin, mask, cache, sink.sub("attn."), true, cached,
                                 visible, softcap=layer.self_attn.attn_logit_softcapping)
    a = layer.post_attention_layernorm(a)
    sink.put("post_attention_layernorm", a)
    x1 = x + a
    sink.put("attn_residual", x1)
    h2 = layer.pre_feedforward_layernorm(x1)
    sink.put("pre_feedforward_layernorm", h2)
    gate, up = layer.mlp.gate_proj(h2), layer.mlp.up_proj(h2)
    sink.put("mlp.gate", gate), sink.put("mlp.up", up)
    act = layer.mlp.act_fn(gate) * up
    sink.put("mlp.act", act)
    down = layer.mlp.down_proj(act)
    sink.put("mlp.down", down)
    m = layer.post_feedforward_layernorm(down)
    sink.put("post_feedforward_layernorm", m)
    out = x1 + m
    sink.put("output", out)
    return out


def gpt2_replay(block, x, mask, cache, sink, cached):
    B, T, C = x.shape
    attn = block.attn
    D = attn.head_dim
    h = block.ln_1(x)
    sink.put("ln_1", h)
    s = sink.sub("attn.")
    q, k, v = attn.c_attn(h).split(attn.split_size, dim=2)
    q, k, v = (t.view(B, T, -1, D).transpose(1, 2) for t in (q, k, v))
    s.put("q", q), s.put("k", k), s.put("v", v)
    cache["k"] = k if cache.get("k") is None else torch.cat([cache["k"], k], dim=-2)
    cache["v"] = v if cache.get("v") is None else torch.cat([cache["v"], v], dim=-2)
    if cached:
        s.put("cache.k", cache["k"]), s.put("cache.v", cache["v"])
    # GPT-2's eager_attention_forward: softmax in the scores' own dtype (no float32 cast)
    ctx = eager_replay(mask, q, cache["k"], cache["v"], 1, attn.scaling, s, True)
    a = attn.c_proj(ctx)
    s.put("output", a)
    x1 = a + x
    sink.put("attn_residual", x1)
    h2 = block.ln_2(x1)
    sink.put("ln_2", h2)
    fc = block.mlp.c_fc(h2)
    sink.put("mlp.fc", fc)
    act = block.mlp.act(fc)
    sink.put("mlp.act", act)
    m = block.mlp.c_proj(act)
    sink.put("mlp.proj", m)
    out = x1 + m
    sink.put("output", out)
    return out


def gptj_replay(attn, x, position_ids, mask, sink, true, table):
    B, T, _ = x.shape
    D = attn.head_dim
    q = attn._split_heads(attn.q_proj(x), attn.num_attention_heads, D, True)
    k = attn._split_heads(attn.k_proj(x), attn.num_attention_heads, D, True)
    v = attn._split_heads(attn.v_proj(x), attn.num_attention_heads, D, False)
    sink.put("q", q.permute(0, 2, 1, 3)), sink.put("k", k.permute(0, 2, 1, 3)), sink.put("v", v)
    emb = table.repeat(position_ids.shape[0], 1, 1)
    rep = position_ids.unsqueeze(-1).repeat(1, 1, emb.shape[-1])
    sincos = torch.gather(emb, 1, rep).to(k.dtype)
    sin, cos = torch.split(sincos, sincos.shape[-1] // 2, dim=-1)
    r = attn.rotary_dim
    k = torch.cat([MJ.apply_rotary_pos_emb(k[..., :r], sin, cos), k[..., r:]], dim=-1).permute(0, 2, 1, 3)
    q = torch.cat([MJ.apply_rotary_pos_emb(q[..., :r], sin, cos), q[..., r:]], dim=-1).permute(0, 2, 1, 3)
    sink.put("q_rot", q), sink.put("k_rot", k)
    ctx = eager_replay(mask, q, k, v, 1, None, sink, true, divide=attn.scale_attn)
    out = attn.out_proj(ctx)
    sink.put("output", out)
    return out


def neox_replay(attn, x, cos, sin, mask, sink, true):
    B, T, _ = x.shape
    D = attn.head_size
    qkv = attn.query_key_value(x).view(B, T, -1, 3 * D).transpose(1, 2)
    q, k, v = qkv.chunk(3, dim=-1)
    sink.put("q", q), sink.put("k", k), sink.put("v", v)
    q_rot, k_rot = MN.apply_rotary_pos_emb(q, k, cos, sin)
    sink.put("q_rot", q_rot), sink.put("k_rot", k_rot)
    ctx = eager_replay(mask, q_rot, k_rot, v, 1, attn.scaling, sink, true)
    out = attn.dense(ctx)
    sink.put("output", out)
    return out


# ---- the fixtures ---------------------------------------------------------------------------------

def randomize(module, seed):
    """Weights drawn as nn.Linear initialises them (uniform, bound 1/sqrt(fan_in)), biases too; norm
    weights around 1 and biases around 0, so that each one's semantics shows."""
    g = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for name, p in module.named_parameters():
            if p.dim() == 2:
                fan_in = p.shape[0] if isinstance(dict(module.named_modules()).get(name.rsplit(".", 1)[0]), MG.Conv1D) else p.shape[1]
                p.copy_((torch.rand(p.shape, generator=g) * 2 - 1) / math.sqrt(fan_in))
            elif "norm" in name or name.startswith("ln_"):
                base = 1.0 if name.endswith("weight") else 0.0
                p.copy_(base + (torch.rand(p.shape, generator=g) * 2 - 1) * 0.2)
            else:
                p.copy_((torch.rand(p.shape, generator=g) * 2 - 1) * 0.2)
    return module


def tensor_json(t, dtype=None):
    t = t.detach().contiguous()
    if t.dtype == torch.bool:
        return {"dtype": "bool", "shape": list(t.shape), "data": t.reshape(-1).tolist()}
    if t.dtype == torch.int64:
        return {"dtype": "int64", "shape": list(t.shape), "data": t.reshape(-1).tolist()}
    name = dtype or {torch.float32: "float32", torch.float64: "float64"}[t.dtype]
    t = t.to(torch.float32 if name == "float32" else torch.float64)
    def value(x):
        return x if math.isfinite(x) else ("nan" if math.isnan(x) else ("inf" if x > 0 else "-inf"))
    return {"dtype": name, "shape": list(t.shape), "data": [value(float(x)) for x in t.reshape(-1).tolist()]}


def write_fixture(out_dir, fx):
    path = os.path.join(out_dir, fx["name"] + ".json")
    with open(path + ".tmp", "w") as f:
        json.dump(fx, f, separators=(",", ":"))
        f.write("\n")
    os.replace(path + ".tmp", path)
    return path


def reference_block(name, extra):
    ref = {"torch": torch.__version__, "transformers": transformers.__version__,
           "name": f"transformers {transformers.__version__} {name} (Python, eager attention)",
           "threads": "1",
           "float64": "the mathematics in float64: transformers' modules with their float32 casts patched to "
                      "the input's dtype (scripts/export_llm_fixtures.py); outputs_float32 and components_float32 "
                      "are transformers' float32 modules as they are"}
    ref.update({k: str(v) for k, v in extra.items()})
    return ref


def nonfinite_note(a):
    n = int((~torch.isfinite(a)).sum())
    return f" ({n} values NaN: its padding rows, where finfo(float64).min cast to float32 is -inf)" if n else ""


def assert_equal(a, b, what):
    same_nan = torch.equal(torch.isnan(a), torch.isnan(b))
    if not (same_nan and torch.equal(torch.nan_to_num(a), torch.nan_to_num(b))):
        raise SystemExit(f"export_llm_fixtures: {what}: the replay differs from transformers' module "
                         f"(rel_l2 {rel_l2(a, b):.3g})")


# each module runs four times: the float64 truth (casts patched), transformers' float32 and float64 as
# they are, and the patched module in float32 (which must give transformers' float32 bits)
RUNS = (("true64", torch.float64, True), ("hf32", torch.float32, False),
        ("hf64", torch.float64, False), ("patched32", torch.float32, True))


def run_session(call, T, decode_steps, cfg, comps):
    """One call over all T tokens, or (decode_steps) a decode session: the first T - decode_steps tokens
    prefilled in one call, then one-token steps through transformers' DynamicCache, the components under
    prefill. / step.N. and comps["output"] the full causal forward. call(t0, t1, cache, hf_cache, sink,
    cached) runs tokens t0..t1 through the module and its replay. Returns the full forward's output and
    the session's (the same tensor without a session)."""
    if decode_steps == 0:
        full = call(0, T, {}, None, Sink(comps), False)
        return full, full
    P = T - decode_steps
    hf_cache, cache = DynamicCache(config=cfg), {}
    parts = [call(0, P, cache, hf_cache, Sink(comps, "prefill."), True)]
    for t in range(P, T):
        parts.append(call(t, t + 1, cache, hf_cache, Sink(comps, f"step.{t - P}."), True))
    session = torch.cat(parts, dim=1)
    full = call(0, T, {}, None, Sink({}), False)  # the full causal forward over all T tokens
    comps["output"] = full
    return full, session


def check_patches(name, runs):
    # the patches change the casts and nothing else: in float32 they give transformers' bits
    for k in runs["hf32"]["comps"]:
        assert_equal(runs["patched32"]["comps"][k], runs["hf32"]["comps"][k], f"{name} patched float32 {k}")


def fidelity_extra(runs, decode_steps):
    """The reference block's distances from the float64 truth: transformers' float64 module (its casts)
    and float32 module, and in a decode session the session's outputs from the full forward's."""
    extra = {"hf_float64_casts_rel_l2": f"{rel_l2(runs['hf64']['output'], runs['true64']['output']):.3g}"
                                        + nonfinite_note(runs['hf64']['output']),
             "hf_float32_rel_l2": f"{rel_l2(runs['hf32']['output'], runs['true64']['output']):.3g}"}
    if decode_steps:
        extra["decode_vs_full_float64_rel_l2"] = f"{rel_l2(runs['true64']['session'], runs['true64']['output']):.3g}"
        extra["decode_vs_full_float32_rel_l2"] = f"{rel_l2(runs['hf32']['session'], runs['hf32']['output']):.3g}"
        extra["cache"] = "transformers' DynamicCache (cache_utils.DynamicLayer.update: torch.cat after rotary)"
    return extra


def llama3_rope(cfg):
    """A LlamaConfig's llama3 rope scaling as fixtures hold it (config.json's rope_scaling), or None."""
    rp = cfg.rope_parameters
    if rp.get("rope_type", "default") != "llama3":
        return None
    return {"rope_type": "llama3", "factor": float(rp["factor"]), "low_freq_factor": float(rp["low_freq_factor"]),
            "high_freq_factor": float(rp["high_freq_factor"]),
            "original_max_position_embeddings": int(rp["original_max_position_embeddings"])}


def llama_config_json(cfg, decode_steps, attention_only=False):
    """A LlamaDecoderLayer (or LlamaAttention) fixture's config, from a LlamaConfig."""
    config = {"hidden_size": cfg.hidden_size, "num_attention_heads": cfg.num_attention_heads,
              "num_key_value_heads": cfg.num_key_value_heads, "head_dim": cfg.head_dim,
              "rope_theta": cfg.rope_parameters["rope_theta"], "rope_convention": "half",
              "partial_rotary_factor": 1.0, "attention_bias": cfg.attention_bias,
              "max_position_embeddings": cfg.max_position_embeddings, "causal": True, "decode_steps": decode_steps}
    if not attention_only:
        config.update({"intermediate_size": cfg.intermediate_size, "rms_norm_eps": cfg.rms_norm_eps,
                       "mlp_bias": cfg.mlp_bias})
    scaling = llama3_rope(cfg)
    if scaling is not None:  # only then: the fixtures made before it hold no such key
        config["rope_scaling"] = scaling
    return config


def decoder_config_json(kind, cfg, head_dim, window, decode_steps):
    """A Qwen3DecoderLayer, MistralDecoderLayer or Gemma2DecoderLayer fixture's config: window is the layer's
    own sliding window (None on a full-attention layer)."""
    config = {"hidden_size": cfg.hidden_size, "num_attention_heads": cfg.num_attention_heads,
              "num_key_value_heads": cfg.num_key_value_heads, "head_dim": head_dim,
              "intermediate_size": cfg.intermediate_size, "rms_norm_eps": cfg.rms_norm_eps,
              "rope_theta": cfg.rope_parameters["rope_theta"]}
    if kind == "Qwen3DecoderLayer":
        config.update({"attention_bias": cfg.attention_bias, "sliding_window": window})
    elif kind == "MistralDecoderLayer":
        config.update({"sliding_window": window})
    else:
        assert cfg.hidden_activation == "gelu_pytorch_tanh"
        config.update({"attention_bias": cfg.attention_bias, "query_pre_attn_scalar": cfg.query_pre_attn_scalar,
                       "attn_logit_softcapping": cfg.attn_logit_softcapping, "sliding_window": window})
    config.update({"max_position_embeddings": cfg.max_position_embeddings, "causal": True,
                   "decode_steps": decode_steps})
    return config


def gpt2_config_json(cfg, decode_steps):
    """A GPT2Block fixture's config, from a GPT2Config (n_inner None: 4 x n_embd, as GPT2Block takes it)."""
    return {"hidden_size": cfg.n_embd, "num_attention_heads": cfg.n_head, "n_inner": cfg.n_inner or 4 * cfg.n_embd,
            "layer_norm_epsilon": cfg.layer_norm_epsilon, "max_position_embeddings": cfg.n_positions,
            "causal": True, "decode_steps": decode_steps}


def llama_fixture(name, desc, cfg, B, T, seed, positions, padding, decode_steps=0, attention_only=False):
    torch.manual_seed(seed)
    module = (ML.LlamaAttention(cfg, layer_idx=0) if attention_only else ML.LlamaDecoderLayer(cfg, layer_idx=0)).eval()
    randomize(module, seed)
    x32 = torch.randn(B, T, cfg.hidden_size)
    runs = {}
    for label, dtype, true in RUNS:
        m = copy.deepcopy(module).to(dtype)
        x = x32.to(dtype)
        ctx = Patched() if true else _Nothing()
        comps = {}
        with torch.no_grad(), ctx:
            def call(t0, t1, cache, hf_cache, sink, cached):
                pos = positions[:, t0:t1]
                cos, sin = rope(cfg, pos, dtype, true)
                mask = additive_mask(B, t1 - t0, t1, padding, dtype)
                xs = x[:, t0:t1]
                if attention_only:
                    ref, _ = m(xs, position_embeddings=(cos, sin), attention_mask=mask, past_key_values=hf_cache)
                    out = llama_attention_replay(m, xs, cos, sin, mask, cache, sink, true, cached)
                else:
                    ref = m(xs, attention_mask=mask, position_ids=pos, past_key_values=hf_cache,
                            use_cache=hf_cache is not None, position_embeddings=(cos, sin))
                    out = llama_layer_replay(m, xs, cos, sin, mask, cache, sink, true, cached)
                assert_equal(out, ref, f"{name} {label} tokens {t0}..{t1}")
                if hf_cache is not None:
                    assert_equal(cache["k"], hf_cache.layers[0].keys, f"{name} {label} cache.k")
                    assert_equal(cache["v"], hf_cache.layers[0].values, f"{name} {label} cache.v")
                return out
            full, outs = run_session(call, T, decode_steps, cfg, comps)
        runs[label] = {"module": m, "comps": comps, "output": full, "session": outs}
    check_patches(name, runs)
    extra = fidelity_extra(runs, decode_steps)
    sd = {k: tensor_json(v, "float32") for k, v in module.state_dict().items()}
    config = llama_config_json(cfg, decode_steps, attention_only)
    inputs = {"hidden_states": tensor_json(x32, "float32"), "position_ids": tensor_json(positions)}
    if padding is not None:
        inputs["key_padding_mask"] = tensor_json(padding)
    return finish(name, desc, "LlamaAttention" if attention_only else "LlamaDecoderLayer", config, sd, inputs, runs,
                  reference_block("LlamaAttention" if attention_only else "LlamaDecoderLayer", extra))


class _Nothing:
    def __enter__(self):
        return self

    def __exit__(self, *exc):
        return False


def finish(name, desc, module, config, sd, inputs, runs, reference):
    comps64 = {k: tensor_json(v, "float64") for k, v in runs["true64"]["comps"].items() if k != "output"}
    comps32 = {k: tensor_json(v, "float32") for k, v in runs["hf32"]["comps"].items() if k != "output"}
    return {"format": "tparity.fixture", "version": 2, "name": name, "description": desc, "module": module,
            "config": config, "forward": {}, "state_dict": sd, "inputs": inputs,
            "outputs": {"output": tensor_json(runs["true64"]["output"], "float64")},
            "outputs_float32": {"output": tensor_json(runs["hf32"]["output"], "float32")},
            "components": comps64, "components_float32": comps32, "reference": reference}


DECODERS = {"Qwen3DecoderLayer": (MQ, rms_layer_replay), "MistralDecoderLayer": (MM, rms_layer_replay),
            "Gemma2DecoderLayer": (MG2, gemma2_layer_replay)}


def softcap_effect(comps, scaling, groups):
    """How far Gemma2's soft-capped scores lie from the uncapped q_rot k_rot^T * scaling (visible keys)."""
    capped, raw = [], []
    for key in comps:
        if not key.endswith("attn.scores"):
            continue
        p = key[: -len("scores")]
        k = comps.get(p + "cache.k", comps[p + "k_rot"])
        s = torch.matmul(comps[p + "q_rot"], ML.repeat_kv(k, groups).transpose(2, 3)) * scaling
        ok = torch.isfinite(comps[key])
        capped.append(comps[key][ok]), raw.append(s[ok])
    capped, raw = torch.cat(capped), torch.cat(raw)
    return rel_l2(capped, raw), float(raw.abs().max())


def decoder_fixture(name, desc, kind, cfg, B, T, seed, positions, padding, decode_steps=0, layer_idx=0):
    """Qwen3DecoderLayer, MistralDecoderLayer, Gemma2DecoderLayer: one call, or a decode session (prefill, then
    one-token steps through DynamicCache) whose output is the full causal forward."""
    M, replay = DECODERS[kind]
    assert cfg.rope_parameters["rope_type"] == "default", "the rotary tables here are the default rope's"
    torch.manual_seed(seed)
    module = getattr(M, kind)(cfg, layer_idx=layer_idx).eval()
    randomize(module, seed)
    for n, p in module.named_parameters():  # Gemma2's RMSNorm weights start at zero, Qwen3's q/k norms at one
        if "norm" in n:
            assert bool((p != 0).all()) and len(set(p.tolist())) == p.numel(), f"{name}: {n} not random"
    rotary = ROTARY[type(cfg)](cfg)
    assert rotary.rope_type == "default" and rotary.attention_scaling == 1.0
    # the layer's effective window: Mistral's attention takes config.sliding_window, Qwen3's and Gemma2's
    # theirs only where config.layer_types[layer_idx] is "sliding_attention"
    window = cfg.sliding_window if kind == "MistralDecoderLayer" else module.self_attn.sliding_window
    x32 = torch.randn(B, T, cfg.hidden_size)
    runs = {}
    for label, dtype, true in RUNS:
        m = copy.deepcopy(module).to(dtype)
        x = x32.to(dtype)
        ctx = Patched() if true else _Nothing()
        comps = {}
        with torch.no_grad(), ctx:
            def call(t0, t1, cache, hf_cache, sink, cached):
                pos = positions[:, t0:t1]
                cos, sin = rope(cfg, pos, dtype, true)
                mask = additive_mask(B, t1 - t0, t1, padding, dtype, window)
                # the keys transformers' cache hands the attention (masking_utils slices the mask to them)
                visible = t1 if hf_cache is None else hf_cache.layers[layer_idx].get_mask_sizes(t1 - t0)[0]
                xs = x[:, t0:t1]
                ref = m(xs, attention_mask=mask[..., t1 - visible:], position_ids=pos, past_key_values=hf_cache,
                        use_cache=hf_cache is not None, position_embeddings=(cos, sin))
                out = replay(m, M, xs, cos, sin, mask, cache, sink, true, cached, visible)
                assert_equal(out, ref, f"{name} {label} tokens {t0}..{t1}")
                if hf_cache is not None:
                    layer = hf_cache.layers[layer_idx]
                    kept = t1 if window is None else min(t1, window - 1)
                    assert isinstance(layer, DynamicSlidingWindowLayer) == (window is not None)
                    assert layer.keys.shape[-2] == kept and layer.values.shape[-2] == kept
                    assert_equal(cache["k"][:, :, t1 - kept:], layer.keys, f"{name} {label} cache.k")
                    assert_equal(cache["v"][:, :, t1 - kept:], layer.values, f"{name} {label} cache.v")
                return out
            full, outs = run_session(call, T, decode_steps, cfg, comps)
        runs[label] = {"module": m, "comps": comps, "output": full, "session": outs}
    check_patches(name, runs)
    extra = fidelity_extra(runs, decode_steps)
    if decode_steps and window is not None:  # a sliding layer's cache: this in place of the DynamicLayer line
        extra["cache"] = (
            f"transformers' DynamicCache, whose layer here is a DynamicSlidingWindowLayer: it keeps the last "
            f"sliding_window - 1 = {window - 1} keys and values (after rotary) and hands the attention those "
            f"plus the step's own (the mask's columns sliced to them, as masking_utils does); the components "
            f"cache.k / cache.v hold every key so far (the layer's contents checked equal to their tail), "
            f"scores -inf and attn_weights 0 on the keys outside the window")
    if window is not None:
        extra["mask"] = (f"sliding window {window}: key j visible to query i (absolute indices, not position ids) "
                         f"iff i - {window} < j <= i and j is not padding (masking_utils.sliding_window_overlay)")
    sa = module.self_attn
    if getattr(sa, "attn_logit_softcapping", None) is not None:
        moved, biggest = softcap_effect(runs["true64"]["comps"], sa.scaling, sa.num_key_value_groups)
        desc += (f"; the soft-cap {sa.attn_logit_softcapping:g} moves the visible scores by rel_l2 {moved:.3g} from "
                 f"the uncapped ones (largest |uncapped score| {biggest:.3g})")
    sd = {k: tensor_json(v, "float32") for k, v in module.state_dict().items()}
    config = decoder_config_json(kind, cfg, sa.head_dim, window, decode_steps)
    inputs = {"hidden_states": tensor_json(x32, "float32"), "position_ids": tensor_json(positions)}
    if padding is not None:
        inputs["key_padding_mask"] = tensor_json(padding)
    return finish(name, desc, kind, config, sd, inputs, runs, reference_block(kind, extra))


def gpt2_fixture(name, desc, B, T, seed, padding, decode_steps=0):
    cfg = GPT2Config(n_embd=32, n_head=4, n_inner=None, n_positions=64, attn_implementation="eager",
                     layer_norm_epsilon=1e-5)
    torch.manual_seed(seed)
    block = randomize(MG.GPT2Block(cfg, layer_idx=0).eval(), seed)
    x32 = torch.randn(B, T, cfg.n_embd)
    runs = {}
    for label, dtype in (("true64", torch.float64), ("hf32", torch.float32)):
        m = copy.deepcopy(block).to(dtype)
        x = x32.to(dtype)
        comps = {}
        with torch.no_grad():
            def call(t0, t1, cache, hf_cache, sink, cached):
                mask = additive_mask(B, t1 - t0, t1, padding, dtype)
                ref = m(x[:, t0:t1], past_key_values=hf_cache, attention_mask=mask, use_cache=hf_cache is not None)
                out = gpt2_replay(m, x[:, t0:t1], mask, cache, sink, cached)
                assert_equal(out, ref, f"{name} {label} tokens {t0}..{t1}")
                if hf_cache is not None:
                    assert_equal(cache["k"], hf_cache.layers[0].keys, f"{name} {label} cache.k")
                return out
            full, session = run_session(call, T, decode_steps, cfg, comps)
        runs[label] = {"comps": comps, "output": full, "session": session}
    extra = {"hf_float64_casts_rel_l2": "0 (GPT-2's block computes in its own dtype throughout)",
             "hf_float32_rel_l2": f"{rel_l2(runs['hf32']['output'], runs['true64']['output']):.3g}",
             "masked_scores": "torch.finfo(dtype).min added (transformers' additive mask), not -inf"}
    if decode_steps:
        extra["decode_vs_full_float64_rel_l2"] = f"{rel_l2(runs['true64']['session'], runs['true64']['output']):.3g}"
    sd = {k: tensor_json(v, "float32") for k, v in block.state_dict().items()}
    config = gpt2_config_json(cfg, decode_steps)
    inputs = {"hidden_states": tensor_json(x32, "float32")}
    if padding is not None:
        inputs["key_padding_mask"] = tensor_json(padding)
    return finish(name, desc, "GPT2Block", config, sd, inputs, runs, reference_block("GPT2Block", extra))


def gptj_fixture(name, desc, B, T, seed):
    cfg = GPTJConfig(n_embd=32, n_head=4, rotary_dim=4, n_positions=64, attn_implementation="eager")
    torch.manual_seed(seed)
    attn = randomize(MJ.GPTJAttention(cfg, layer_idx=0).eval(), seed)
    x32 = torch.randn(B, T, 32)
    positions = torch.arange(T).unsqueeze(0).repeat(B, 1) + torch.tensor([[0], [7]])[:B]
    runs = {}
    for label, dtype, true in RUNS:
        m = copy.deepcopy(attn).to(dtype)
        if true:
            m.embed_positions = gptj_table(m, dtype, True)
        x = x32.to(dtype)
        comps = {}
        with torch.no_grad(), (Patched() if true else _Nothing()):
            mask = additive_mask(B, T, T, None, dtype)
            ref, _ = m(x, attention_mask=mask, position_ids=positions)
            out = gptj_replay(m, x, positions, mask, Sink(comps), true, m.embed_positions)
            assert_equal(out, ref, f"{name} {label}")
        runs[label] = {"comps": comps, "output": out}
    check_patches(name, runs)
    sd = attn.state_dict()
    sd = {"q_proj.weight": sd["q_proj.weight"], "k_proj.weight": sd["k_proj.weight"],
          "v_proj.weight": sd["v_proj.weight"], "o_proj.weight": sd["out_proj.weight"]}
    config = {"hidden_size": 32, "num_attention_heads": 4, "num_key_value_heads": 4, "head_dim": 8,
              "rope_theta": 10000.0, "rope_convention": "interleaved", "partial_rotary_factor": 0.5,
              "attention_bias": False, "max_position_embeddings": 64, "causal": True, "decode_steps": 0}
    extra = {"hf_float64_casts_rel_l2": f"{rel_l2(runs['hf64']['output'], runs['true64']['output']):.3g}",
             "hf_float32_rel_l2": f"{rel_l2(runs['hf32']['output'], runs['true64']['output']):.3g}",
             "mapping": "GPTJAttention onto LlamaAttention: out_proj -> o_proj; rotary_dim 4 of head_dim 8 -> "
                        "partial_rotary_factor 0.5, rotate_every_two -> rope_convention interleaved; scores "
                        "divided by sqrt(head_dim) where Llama multiplies by its inverse (rounding only)"}
    return finish(name, desc, "LlamaAttention", config, {k: tensor_json(v, "float32") for k, v in sd.items()},
                  {"hidden_states": tensor_json(x32, "float32"), "position_ids": tensor_json(positions)}, runs,
                  reference_block("GPTJAttention", extra))


def neox_fixture(name, desc, B, T, seed):
    cfg = GPTNeoXConfig(hidden_size=32, num_attention_heads=4, rotary_pct=0.25, max_position_embeddings=64,
                        attention_bias=True, attn_implementation="eager")
    torch.manual_seed(seed)
    attn = randomize(MN.GPTNeoXAttention(cfg, layer_idx=0).eval(), seed)
    x32 = torch.randn(B, T, 32)
    positions = torch.arange(T).unsqueeze(0).repeat(B, 1) + torch.tensor([[2], [11]])[:B]
    runs = {}
    for label, dtype, true in RUNS:
        m = copy.deepcopy(attn).to(dtype)
        x = x32.to(dtype)
        comps = {}
        with torch.no_grad(), (Patched() if true else _Nothing()):
            cos, sin = rope(cfg, positions, dtype, true)
            mask = additive_mask(B, T, T, None, dtype)
            ref, _ = m(x, attention_mask=mask, position_embeddings=(cos, sin))
            out = neox_replay(m, x, cos, sin, mask, Sink(comps), true)
            assert_equal(out, ref, f"{name} {label}")
        runs[label] = {"comps": comps, "output": out}
    check_patches(name, runs)
    sd = attn.state_dict()
    H, D = 4, 8
    w = sd["query_key_value.weight"].view(H, 3, D, 32)  # per head: q, k, v rows
    b = sd["query_key_value.bias"].view(H, 3, D)
    mapped = {}
    for i, n in enumerate(("q_proj", "k_proj", "v_proj")):
        mapped[n + ".weight"] = w[:, i].reshape(H * D, 32)
        mapped[n + ".bias"] = b[:, i].reshape(H * D)
    mapped["o_proj.weight"], mapped["o_proj.bias"] = sd["dense.weight"], sd["dense.bias"]
    config = {"hidden_size": 32, "num_attention_heads": 4, "num_key_value_heads": 4, "head_dim": 8,
              "rope_theta": 10000.0, "rope_convention": "half", "partial_rotary_factor": 0.25,
              "attention_bias": True, "max_position_embeddings": 64, "causal": True, "decode_steps": 0}
    extra = {"hf_float64_casts_rel_l2": f"{rel_l2(runs['hf64']['output'], runs['true64']['output']):.3g}",
             "hf_float32_rel_l2": f"{rel_l2(runs['hf32']['output'], runs['true64']['output']):.3g}",
             "mapping": "GPTNeoXAttention onto LlamaAttention: query_key_value's (heads, 3, head_dim) rows split "
                        "into q_proj, k_proj, v_proj (weights and biases), dense -> o_proj; rotary_pct 0.25 -> "
                        "partial_rotary_factor 0.25 (2 of 8 dims rotate, rotate_half)"}
    return finish(name, desc, "LlamaAttention", config, {k: tensor_json(v, "float32") for k, v in mapped.items()},
                  {"hidden_states": tensor_json(x32, "float32"), "position_ids": tensor_json(positions)}, runs,
                  reference_block("GPTNeoXAttention", extra))


GEMMA2_SOFTCAP = 1.5  # attn_logit_softcapping, small enough that tanh bends the scores visibly (up to |4|)


def fixtures():
    def llama_cfg(**kw):
        base = dict(hidden_size=32, num_attention_heads=4, num_key_value_heads=2, head_dim=12, intermediate_size=48,
                    rms_norm_eps=1e-6, rope_theta=10000.0, max_position_embeddings=4096, attention_bias=True,
                    attn_implementation="eager")
        base.update(kw)
        return LlamaConfig(**base)

    def right_pad(B, T, pads):
        m = torch.zeros(B, T, dtype=torch.bool)
        for b, n in enumerate(pads):
            if n:
                m[b, T - n:] = True
        return m

    B, T = 2, 6
    out = {}
    left = torch.tensor([[False] * T, [True, True] + [False] * (T - 2)])
    out["llama_layer"] = lambda: llama_fixture(
        "llama_layer", "transformers' LlamaDecoderLayer: 4 heads over 2 kv heads, head_dim 12 (hidden 32), attention "
        "bias, element 1 left-padded by 2 (its padding rows see no key: uniform weights, as transformers gives), "
        "position ids as generate() makes them plus an offset of 3", llama_cfg(), B, T, 21,
        (torch.cumsum((~left).long(), -1) - 1).masked_fill(left, 1) + 3, left)
    out["llama_mqa_positions"] = lambda: llama_fixture(
        "llama_mqa_positions", "transformers' LlamaDecoderLayer, multi-query (1 kv head), rope_theta 500000, "
        "positions 1990..1997: where transformers' float32 rotary angles show", llama_cfg(
            num_key_value_heads=1, head_dim=8, rope_theta=500000.0, attention_bias=False), B, 8, 22,
        torch.arange(8).unsqueeze(0).repeat(B, 1) + 1990, None)
    # A decode session's padding must leave every query row a key: a row that sees none (left padding)
    # gets uniform weights over all S keys in transformers, which depends on S, so a session's padded
    # rows could not equal the full forward's. Element 1 pads its prompt's second and third tokens.
    pad = torch.tensor([[False] * 8, [False, True, True] + [False] * 5])
    out["llama_decode"] = lambda: llama_fixture(
        "llama_decode", "transformers' LlamaDecoderLayer decoding: a prompt of 5 (element 1 with 2 padding tokens) "
        "prefilled in one call, then 3 steps of one token through DynamicCache; output is the full causal forward",
        llama_cfg(head_dim=8), 2, 8, 23, torch.arange(8).unsqueeze(0).repeat(2, 1) + torch.tensor([[0], [4]]),
        pad, decode_steps=3)
    llama3 = {"rope_type": "llama3", "rope_theta": 500000.0, "factor": 8.0, "low_freq_factor": 1.0,
              "high_freq_factor": 4.0, "original_max_position_embeddings": 8192}
    out["llama3_rope_decode"] = lambda: llama_fixture(
        "llama3_rope_decode", "transformers' LlamaDecoderLayer with Llama 3.1's rope scaling (theta 500000, factor "
        "8, frequency factors 1 and 4, 8192 original positions: at head_dim 16 four pairs kept, one smoothed, "
        "three slowed), positions 8188..8195 across the original context: a prompt of 5 prefilled, then 3 steps",
        llama_cfg(head_dim=16, rope_theta=500000.0, rope_parameters=llama3, max_position_embeddings=131072), 2, 8,
        34, torch.arange(8).unsqueeze(0).repeat(2, 1) + 8188, None, decode_steps=3)
    out["gpt2_block"] = lambda: gpt2_fixture(
        "gpt2_block", "transformers' GPT2Block: Conv1D (in, out) weights, fused c_attn, gelu_new, element 1 "
        "right-padded by 3", B, 7, 24, right_pad(B, 7, [0, 3]))
    out["gptj_attention"] = lambda: gptj_fixture(
        "gptj_attention", "transformers' GPTJAttention (interleaved rotary pairs on 4 of 8 dims) as a "
        "LlamaAttention", B, T, 25)
    out["neox_attention"] = lambda: neox_fixture(
        "neox_attention", "transformers' GPTNeoXAttention (fused per-head query_key_value, rotary_pct 0.25, "
        "bias) as a LlamaAttention", B, T, 26)

    common = dict(hidden_size=32, num_attention_heads=4, num_key_value_heads=2, intermediate_size=48,
                  rms_norm_eps=1e-6, rope_theta=10000.0, max_position_embeddings=4096, attn_implementation="eager")

    def qwen3_cfg(**kw):
        return Qwen3Config(**{**common, "head_dim": 12, "attention_bias": False, "num_hidden_layers": 1, **kw})

    def mistral_cfg(**kw):
        return MistralConfig(**{**common, "head_dim": 8, "num_hidden_layers": 1, **kw})

    def gemma2_cfg(**kw):
        return Gemma2Config(**{**common, "head_dim": 8, "num_hidden_layers": 2, "query_pre_attn_scalar": 12,
                               "attn_logit_softcapping": GEMMA2_SOFTCAP, **kw})

    def offset(T, offsets):
        return torch.arange(T).unsqueeze(0).repeat(len(offsets), 1) + torch.tensor(offsets)[:, None]

    # the decode sessions pad element 1's prompt tokens 1 and 2, as llama_decode does (every query row keeps a key)
    def session_pad(T):
        return torch.tensor([[False] * T, [False, True, True] + [False] * (T - 3)])

    out["qwen3_layer"] = lambda: decoder_fixture(
        "qwen3_layer", "transformers' Qwen3DecoderLayer: per-head q_norm / k_norm (RMSNorm over head_dim, before "
        "rotary), 4 heads over 2 kv heads, head_dim 12 (hidden 32), no bias, full attention, positions offset by "
        "2 and 5, element 1 right-padded by 2", "Qwen3DecoderLayer", qwen3_cfg(), B, 7, 27, offset(7, [2, 5]),
        right_pad(B, 7, [0, 2]))
    out["qwen3_decode"] = lambda: decoder_fixture(
        "qwen3_decode", "transformers' Qwen3DecoderLayer decoding: a prompt of 5 (element 1 with 2 padding tokens) "
        "prefilled in one call, then 3 steps of one token through DynamicCache; output is the full causal forward",
        "Qwen3DecoderLayer", qwen3_cfg(), B, 8, 28, offset(8, [0, 4]), session_pad(8), decode_steps=3)
    out["mistral_layer"] = lambda: decoder_fixture(
        "mistral_layer", "transformers' MistralDecoderLayer: sliding window 3 (key j visible to query i iff "
        "i - 3 < j <= i), 4 heads over 2 kv heads, head_dim 8, positions offset by 0 and 5, element 1 right-padded "
        "by 2", "MistralDecoderLayer", mistral_cfg(sliding_window=3), B, 8, 29, offset(8, [0, 5]),
        right_pad(B, 8, [0, 2]))
    out["mistral_decode"] = lambda: decoder_fixture(
        "mistral_decode", "transformers' MistralDecoderLayer decoding with sliding window 3: a prompt of 5 "
        "(element 1 with 2 padding tokens) prefilled in one call, then 4 steps of one token through DynamicCache "
        "(a DynamicSlidingWindowLayer, which keeps 2 keys); output is the full causal forward",
        "MistralDecoderLayer", mistral_cfg(sliding_window=3), B, 9, 30, offset(9, [0, 4]), session_pad(9),
        decode_steps=4)
    out["gemma2_layer_sliding"] = lambda: decoder_fixture(
        "gemma2_layer_sliding", "transformers' Gemma2DecoderLayer, layer 0 (layer_types: sliding_attention), "
        "sliding window 4, query_pre_attn_scalar 12 != head_dim 8, RMSNorm (1 + weight) around both the "
        "attention and the MLP, gelu_pytorch_tanh, positions offset by 0 and 6, element 1 right-padded by 3",
        "Gemma2DecoderLayer", gemma2_cfg(sliding_window=4), B, 8, 31, offset(8, [0, 6]), right_pad(B, 8, [0, 3]))
    out["gemma2_layer_full"] = lambda: decoder_fixture(
        "gemma2_layer_full", "transformers' Gemma2DecoderLayer, layer 1 (layer_types: full_attention, so no window "
        "though config.sliding_window is 4), query_pre_attn_scalar 12 != head_dim 8, positions offset by 0 and 6, "
        "element 1 right-padded by 3", "Gemma2DecoderLayer", gemma2_cfg(sliding_window=4), B, 8, 32,
        offset(8, [0, 6]), right_pad(B, 8, [0, 3]), layer_idx=1)
    out["gemma2_decode"] = lambda: decoder_fixture(
        "gemma2_decode", "transformers' Gemma2DecoderLayer decoding, layer 0 (sliding_attention, window 3): a "
        "prompt of 5 (element 1 with 2 padding tokens) prefilled in one call, then 4 steps of one token through "
        "DynamicCache (a DynamicSlidingWindowLayer, which keeps 2 keys); output is the full causal forward",
        "Gemma2DecoderLayer", gemma2_cfg(sliding_window=3), B, 9, 33, offset(9, [0, 4]), session_pad(9),
        decode_steps=4)
    return out


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--out", default=os.path.join(ROOT, "fixtures", "torch-2.13"))
    ap.add_argument("--only", nargs="*")
    args = ap.parse_args(argv)
    if transformers.__version__ != "5.23.0":
        print(f"export_llm_fixtures: warning: transformers {transformers.__version__}, the fixtures pin 5.23.0",
              file=sys.stderr)
    os.makedirs(args.out, exist_ok=True)
    for name, make in fixtures().items():
        if args.only and name not in args.only:
            continue
        fx = make()
        path = write_fixture(args.out, fx)
        ref = fx["reference"]
        print(f"{path}: transformers' float64 casts move the output by {ref['hf_float64_casts_rel_l2']} (rel_l2); "
              f"its float32 {ref['hf_float32_rel_l2']}" +
              (f"; decode vs full forward {ref['decode_vs_full_float64_rel_l2']} (float64)"
               if "decode_vs_full_float64_rel_l2" in ref else ""), file=sys.stderr)


if __name__ == "__main__":
    main()
