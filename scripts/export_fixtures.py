#!/usr/bin/python3
"""Export tparity reference fixtures (format v1) from PyTorch.

Each fixture is one JSON file fixtures/<name>.json holding the module config,
forward() flags, the state_dict, the inputs and the outputs of a
torch.nn.MultiheadAttention, TransformerEncoderLayer, TransformerEncoder (a stack
of encoder layers with an optional final LayerNorm) or TransformerDecoderLayer,
computed in float64 ("outputs") and in float32 ("outputs_float32").

Procedure per fixture:
  1. torch.manual_seed(seed); build the module in float32 with dropout=0.0, .eval().
  2. Keep torch's init for weight matrices; optionally zero some biases
     ("torch init") or overwrite every bias / bias_k / bias_v / LayerNorm
     affine parameter with random float32 values ("randomized").
     TransformerEncoder deep-copies its layer, so all layers would start
     identical: layers 1..N-1 re-run the layer's own init with the next draws
     of the generator (exactly what N separately constructed layers would get),
     and "randomized" draws every layer's biases / LayerNorm affine separately,
     so a stack that swaps, skips or repeats layers is visible. The stack is
     built with enable_nested_tensor=False, and its final LayerNorm (config
     "norm": true) has the layers' layer_norm_eps.
  3. Draw float32 inputs and masks.
  4. Run the float32 module; run copy.deepcopy(module).double() on the inputs
     cast to float64 (bool masks stay bool). Since everything started as
     float32, both runs see exactly the same values.
Autograd stays enabled, so PyTorch takes the documented Python path
(F.multi_head_attention_forward) and not the fused fast path; the script
additionally guards the fast-path entry points (and the encoder stack's
nested-tensor conversion) and fails if they are hit.

Requires the Debian PyTorch (torch 1.13): run with /usr/bin/python3.

Usage:
  scripts/export_fixtures.py [--out DIR] [--only NAME ...]
"""

import argparse
import contextlib
import copy
import json
import math
import os
import sys

import torch
import torch.nn as nn

FORMAT = "tparity.fixture"
VERSION = 1
REL_TOL = 1e-4  # loose float32-vs-float64 agreement check

SCRIPT_DIR = os.path.dirname(os.path.abspath(__file__))
DEFAULT_OUT = os.path.join(os.path.dirname(SCRIPT_DIR), "fixtures")


# ---------------------------------------------------------------------------
# Input / mask helpers (all draw from torch's global RNG, seeded per fixture)
# ---------------------------------------------------------------------------

def causal_mask(L, S):
    """Float mask: -inf above the diagonal, 0 elsewhere."""
    return torch.triu(-float("inf") * torch.ones(L, S), 1)


def random_bool_mask(L, S, p=0.25):
    """~p True (True = masked out); column 0 always False so every row keeps a key."""
    m = torch.rand(L, S) < p
    m[:, 0] = False
    return m


def padding_mask(S, pad_counts):
    """Bool (B, S) mask masking the last pad_counts[b] keys of batch element b."""
    m = torch.zeros(len(pad_counts), S, dtype=torch.bool)
    for b, k in enumerate(pad_counts):
        assert 0 <= k < S, "at least one key must stay unmasked"
        if k:
            m[b, S - k:] = True
    return m


def uniform(shape, lo, hi):
    return torch.rand(shape) * (hi - lo) + lo


# ---------------------------------------------------------------------------
# Module construction
# ---------------------------------------------------------------------------

def mha_config(embed_dim, num_heads, bias=True, add_bias_kv=False, add_zero_attn=False,
               kdim=None, vdim=None, batch_first=False):
    return {
        "embed_dim": embed_dim,
        "num_heads": num_heads,
        "bias": bias,
        "add_bias_kv": add_bias_kv,
        "add_zero_attn": add_zero_attn,
        "kdim": embed_dim if kdim is None else kdim,
        "vdim": embed_dim if vdim is None else vdim,
        "batch_first": batch_first,
    }


def enc_config(d_model, nhead, dim_feedforward=2048, activation="relu", layer_norm_eps=1e-5,
               batch_first=False, norm_first=False):
    return {
        "d_model": d_model,
        "nhead": nhead,
        "dim_feedforward": dim_feedforward,
        "activation": activation,
        "layer_norm_eps": layer_norm_eps,
        "batch_first": batch_first,
        "norm_first": norm_first,
    }


def stack_config(num_layers, norm, d_model, nhead, **layer_kwargs):
    """TransformerEncoder: the encoder layer's keys, then num_layers and norm
    (True when a final LayerNorm(d_model, eps=layer_norm_eps) is present)."""
    cfg = enc_config(d_model, nhead, **layer_kwargs)
    cfg["num_layers"] = num_layers
    cfg["norm"] = norm
    return cfg


# TransformerDecoderLayer takes exactly the encoder layer's constructor keys.
dec_config = enc_config

LAYER_KEYS = ("d_model", "nhead", "dim_feedforward", "activation", "layer_norm_eps",
              "batch_first", "norm_first")


def reinit_encoder_layer(layer):
    """Re-run a TransformerEncoderLayer's own init, drawing in the order its
    constructor does: MultiheadAttention builds out_proj (Linear init: kaiming
    weight, uniform bias), then _reset_parameters (xavier_uniform_ in_proj_weight,
    zero in_proj_bias and out_proj.bias); then linear1, linear2 (Linear init),
    then the LayerNorms (1 / 0)."""
    layer.self_attn.out_proj.reset_parameters()
    layer.self_attn._reset_parameters()
    layer.linear1.reset_parameters()
    layer.linear2.reset_parameters()
    layer.norm1.reset_parameters()
    layer.norm2.reset_parameters()


def build_module(module_name, config):
    if module_name == "MultiheadAttention":
        m = nn.MultiheadAttention(dropout=0.0, **config)
    elif module_name == "TransformerEncoderLayer":
        m = nn.TransformerEncoderLayer(dropout=0.0, **config)
    elif module_name == "TransformerEncoder":
        layer_cfg = {k: config[k] for k in LAYER_KEYS}
        assert set(config) == set(LAYER_KEYS) | {"num_layers", "norm"}, sorted(config)
        layer = nn.TransformerEncoderLayer(dropout=0.0, **layer_cfg)
        norm = (nn.LayerNorm(config["d_model"], eps=config["layer_norm_eps"])
                if config["norm"] else None)
        m = nn.TransformerEncoder(layer, config["num_layers"], norm=norm,
                                  enable_nested_tensor=False)
        # The clones are identical; give layers 1.. their own draws (layer 0
        # keeps the prototype's, so the stack equals num_layers fresh layers).
        with torch.no_grad():
            for sub in list(m.layers)[1:]:
                reinit_encoder_layer(sub)
    elif module_name == "TransformerDecoderLayer":
        m = nn.TransformerDecoderLayer(dropout=0.0, **config)
    else:
        raise ValueError(module_name)
    return m.eval()


def randomize_affine(module):
    """Overwrite every bias, bias_k/bias_v and LayerNorm weight/bias with random
    float32 values (weight matrices keep torch's init)."""
    with torch.no_grad():
        for _, sub in module.named_modules():
            if isinstance(sub, nn.LayerNorm):
                sub.weight.copy_(1.0 + uniform(sub.weight.shape, -0.2, 0.2))
                sub.bias.copy_(uniform(sub.bias.shape, -0.2, 0.2))
                continue
            for pname, p in sub.named_parameters(recurse=False):
                if pname.endswith("bias") or pname in ("bias_k", "bias_v"):
                    p.copy_(uniform(p.shape, -0.2, 0.2))


def zero_params(module, names):
    params = dict(module.named_parameters())
    with torch.no_grad():
        for n in names:
            params[n].zero_()


def randomize_params(module, names):
    """Overwrite the named parameters with random float32 values in [-0.2, 0.2)."""
    params = dict(module.named_parameters())
    with torch.no_grad():
        for n in names:
            params[n].copy_(uniform(params[n].shape, -0.2, 0.2))


def assert_layers_distinct(stack):
    """No two layers of a stack may share a parameter's values (weight matrices
    always; every parameter once biases / LayerNorm affine are randomized)."""
    layers = list(stack.layers)
    for i in range(len(layers)):
        for j in range(i + 1, len(layers)):
            pi, pj = dict(layers[i].named_parameters()), dict(layers[j].named_parameters())
            for n, t in pi.items():
                if t.dim() >= 2 or t.abs().sum() > 0:  # skip torch's all-zero biases
                    if n.startswith("norm") and torch.equal(t, torch.ones_like(t)):
                        continue  # LayerNorm weight left at torch's 1
                    assert not torch.equal(t, pj[n]), f"layers {i} and {j} share {n}"


# ---------------------------------------------------------------------------
# Fast-path guard
# ---------------------------------------------------------------------------

class FastPathTaken(RuntimeError):
    pass


@contextlib.contextmanager
def forbid_fast_path():
    """Replace torch's fused fast-path entry points (looked up as attributes of
    the torch module at call time by MultiheadAttention.forward,
    TransformerEncoderLayer.forward and TransformerEncoder.forward in 1.13) by
    functions that raise. The nested-tensor pair is TransformerEncoder's sparsity
    path (its left-aligned check runs whenever enable_nested_tensor is True and a
    src_key_padding_mask is given, even with autograd on); the decoder-only pair
    is not called by Python's TransformerDecoderLayer in 1.13 and is trapped in
    case a build does."""
    names = ["_native_multi_head_attention", "_transformer_encoder_layer_fwd",
             "_nested_tensor_from_mask", "_nested_tensor_from_mask_left_aligned",
             "_transformer_decoder_only_layer_fwd", "_native_decoder_only_multi_head_attention"]
    saved = {n: getattr(torch, n) for n in names if hasattr(torch, n)}

    def make(n):
        def trap(*args, **kwargs):
            raise FastPathTaken(f"torch.{n} fast path was taken")
        return trap

    try:
        for n in saved:
            setattr(torch, n, make(n))
        yield
    finally:
        for n, f in saved.items():
            setattr(torch, n, f)


def self_test_fast_path_guard():
    """Make sure the guard is meaningful: under no_grad, a fast-path-eligible
    MHA / encoder layer / encoder stack (default enable_nested_tensor=True,
    left-aligned padding mask) must trip it."""
    torch.manual_seed(0)
    mha = nn.MultiheadAttention(8, 2, dropout=0.0, batch_first=True).eval()
    enc = nn.TransformerEncoderLayer(8, 2, dim_feedforward=16, dropout=0.0,
                                     batch_first=True).eval()
    stack = nn.TransformerEncoder(enc, 2).eval()
    x = torch.randn(2, 3, 8)
    kpm = padding_mask(3, [0, 1])
    for mod, call in ((mha, lambda: mha(x, x, x)), (enc, lambda: enc(x)),
                      (stack, lambda: stack(x, src_key_padding_mask=kpm))):
        tripped = False
        with forbid_fast_path(), torch.no_grad():
            try:
                call()
            except FastPathTaken:
                tripped = True
        if not tripped:
            raise AssertionError(
                f"fast-path guard self-test: {type(mod).__name__} did not take the fast path "
                "under no_grad; the guard may not be effective with this torch version")


# ---------------------------------------------------------------------------
# Fixture definitions
# ---------------------------------------------------------------------------
# Each builder is called right after torch.manual_seed(seed) and returns
# (config, module32, forward_kwargs, inputs32) with inputs in the module's Python
# argument order.

def _mha(config, affine="torch", zero=()):
    m = build_module("MultiheadAttention", config)
    if zero:
        zero_params(m, zero)
    if affine == "randomized":
        randomize_affine(m)
    return m


def _enc(config, affine="torch", zero=()):
    m = build_module("TransformerEncoderLayer", config)
    if zero:
        zero_params(m, zero)
    if affine == "randomized":
        randomize_affine(m)
    return m


def fx_mha_single():
    cfg = mha_config(64, 1, bias=False, batch_first=True)
    fwd = {"need_weights": True, "average_attn_weights": True}
    m = _mha(cfg)
    x = torch.randn(100, 64)
    return cfg, m, fwd, {"query": x, "key": x, "value": x, "attn_mask": causal_mask(100, 100)}


def fx_mha_batched():
    cfg = mha_config(64, 1, bias=False, batch_first=True)
    fwd = {"need_weights": True, "average_attn_weights": True}
    m = _mha(cfg)
    x = torch.randn(2, 100, 64)
    return cfg, m, fwd, {"query": x, "key": x, "value": x, "attn_mask": causal_mask(100, 100)}


def fx_mha_multihead():
    cfg = mha_config(64, 4, bias=False, batch_first=True)
    fwd = {"need_weights": True, "average_attn_weights": True}
    m = _mha(cfg)
    x = torch.randn(2, 100, 64)
    return cfg, m, fwd, {"query": x, "key": x, "value": x, "attn_mask": causal_mask(100, 100)}


def fx_encoder_block():
    cfg = enc_config(64, 4, dim_feedforward=128, batch_first=True)
    m = _enc(cfg, zero=("linear1.bias", "linear2.bias"))
    src = torch.randn(2, 100, 64)
    return cfg, m, {}, {"src": src, "src_mask": causal_mask(100, 100)}


def fx_mha_seq_first_cross_perhead():
    cfg = mha_config(16, 2, bias=True, batch_first=False)
    fwd = {"need_weights": True, "average_attn_weights": False}
    m = _mha(cfg, affine="randomized")
    q = torch.randn(7, 3, 16)
    kv = torch.randn(9, 3, 16)
    kpm = padding_mask(9, [0, 3, 6])
    return cfg, m, fwd, {"query": q, "key": kv, "value": kv, "key_padding_mask": kpm}


def fx_mha_kdim_vdim():
    cfg = mha_config(16, 4, bias=True, kdim=12, vdim=20, batch_first=True)
    fwd = {"need_weights": True, "average_attn_weights": True}
    m = _mha(cfg, affine="randomized")
    q = torch.randn(2, 5, 16)
    k = torch.randn(2, 6, 12)
    v = torch.randn(2, 6, 20)
    am = random_bool_mask(5, 6)
    return cfg, m, fwd, {"query": q, "key": k, "value": v, "attn_mask": am}


def fx_mha_bias_kv_zero_attn():
    cfg = mha_config(16, 2, bias=True, add_bias_kv=True, add_zero_attn=True, batch_first=True)
    fwd = {"need_weights": True, "average_attn_weights": True}
    m = _mha(cfg, affine="randomized")
    x = torch.randn(2, 5, 16)
    am = torch.randn(2 * 2, 5, 5)
    kpm = padding_mask(5, [1, 3])
    return cfg, m, fwd, {"query": x, "key": x, "value": x, "attn_mask": am, "key_padding_mask": kpm}


def fx_mha_unbatched_perhead_floatpad():
    cfg = mha_config(16, 4, bias=True, batch_first=True)
    fwd = {"need_weights": True, "average_attn_weights": False}
    m = _mha(cfg, affine="randomized")
    q = torch.randn(6, 16)
    kv = torch.randn(8, 16)
    kpm = torch.randn(8) * 0.5
    return cfg, m, fwd, {"query": q, "key": kv, "value": kv, "key_padding_mask": kpm}


def fx_mha_no_weights():
    cfg = mha_config(16, 2, bias=True, batch_first=True)
    fwd = {"need_weights": False, "average_attn_weights": True}
    m = _mha(cfg, affine="randomized")
    x = torch.randn(2, 5, 16)
    return cfg, m, fwd, {"query": x, "key": x, "value": x, "attn_mask": causal_mask(5, 5)}


def fx_encoder_norm_first_gelu():
    cfg = enc_config(32, 4, dim_feedforward=64, activation="gelu", layer_norm_eps=1e-6,
                     batch_first=True, norm_first=True)
    m = _enc(cfg, affine="randomized")
    src = torch.randn(3, 10, 32)
    return cfg, m, {}, {"src": src, "src_mask": causal_mask(10, 10),
                   "src_key_padding_mask": padding_mask(10, [0, 4, 7])}


def fx_encoder_seq_first_gelu():
    cfg = enc_config(32, 2, dim_feedforward=48, activation="gelu", batch_first=False)
    m = _enc(cfg, affine="randomized")
    src = torch.randn(7, 2, 32)
    return cfg, m, {}, {"src": src}


def fx_encoder_unbatched_eps():
    cfg = enc_config(16, 2, dim_feedforward=32, layer_norm_eps=1e-3, batch_first=True)
    m = _enc(cfg, affine="randomized")
    src = torch.randn(9, 16)
    return cfg, m, {}, {"src": src, "src_mask": random_bool_mask(9, 9)}


def fx_mha_all_masked_rows():
    # Rows whose every key is masked: torch 1.13 gives NaN there (softmax of a row of -inf). Query 2
    # of the bool attn_mask masks every key; batch element 1's key_padding_mask masks all keys but
    # key 4, so every one of its rows attends to that key alone (weight exactly 1). Per-head weights.
    cfg = mha_config(16, 2, bias=True, batch_first=True)
    fwd = {"need_weights": True, "average_attn_weights": False}
    m = _mha(cfg, affine="randomized")
    x = torch.randn(2, 6, 16)
    am = random_bool_mask(6, 6)
    am[2, :] = True
    kpm = torch.zeros(2, 6, dtype=torch.bool)
    kpm[1, :] = True
    kpm[1, 4] = False
    return cfg, m, fwd, {"query": x, "key": x, "value": x, "attn_mask": am, "key_padding_mask": kpm}


def fx_encoder_all_masked_rows():
    # An encoder layer whose batch element 0 has every key padded: NaN from the attention on, through
    # the residual and both layer norms, to the whole of that element's output (torch 1.13's
    # documented path; its fast path, which the exporter forbids, would zero padded positions).
    cfg = enc_config(16, 2, dim_feedforward=32, batch_first=True)
    m = _enc(cfg, affine="randomized")
    src = torch.randn(2, 5, 16)
    kpm = torch.zeros(2, 5, dtype=torch.bool)
    kpm[0, :] = True
    kpm[1, 3:] = True
    return cfg, m, {}, {"src": src, "src_key_padding_mask": kpm}


def _stack(config, affine="torch"):
    m = build_module("TransformerEncoder", config)
    if affine == "randomized":
        randomize_affine(m)
    assert_layers_distinct(m)
    return m


def _dec(config, affine="torch", zero=(), randomize=()):
    m = build_module("TransformerDecoderLayer", config)
    if zero:
        zero_params(m, zero)
    if randomize:
        randomize_params(m, randomize)
    if affine == "randomized":
        randomize_affine(m)
    return m


def fx_encoder_stack_norm():
    cfg = stack_config(3, True, 32, 4, dim_feedforward=64, activation="relu",
                       layer_norm_eps=1e-5, batch_first=True, norm_first=False)
    m = _stack(cfg, affine="randomized")
    src = torch.randn(2, 10, 32)
    return cfg, m, {}, {"src": src, "mask": causal_mask(10, 10),
                        "src_key_padding_mask": padding_mask(10, [0, 3])}


def fx_encoder_stack_prenorm_gelu_seq_first():
    cfg = stack_config(2, False, 16, 2, dim_feedforward=32, activation="gelu",
                       layer_norm_eps=1e-6, batch_first=False, norm_first=True)
    m = _stack(cfg, affine="randomized")
    src = torch.randn(7, 3, 16)
    return cfg, m, {}, {"src": src}


def fx_decoder_layer():
    cfg = dec_config(32, 4, dim_feedforward=64, activation="relu", layer_norm_eps=1e-5,
                     batch_first=True, norm_first=False)
    m = _dec(cfg, affine="randomized")
    tgt = torch.randn(2, 6, 32)
    memory = torch.randn(2, 9, 32)
    return cfg, m, {}, {"tgt": tgt, "memory": memory, "tgt_mask": causal_mask(6, 6),
                        "tgt_key_padding_mask": padding_mask(6, [0, 2]),
                        "memory_key_padding_mask": padding_mask(9, [1, 4])}


def fx_decoder_layer_norm_first_gelu():
    cfg = dec_config(16, 2, dim_feedforward=32, activation="gelu", layer_norm_eps=1e-6,
                     batch_first=False, norm_first=True)
    m = _dec(cfg, affine="randomized")
    tgt = torch.randn(5, 2, 16)
    memory = torch.randn(7, 2, 16)
    memory_mask = torch.randn(5, 7)
    tgt_mask = random_bool_mask(5, 5)
    return cfg, m, {}, {"tgt": tgt, "memory": memory, "tgt_mask": tgt_mask,
                        "memory_mask": memory_mask}


def fx_decoder_layer_unbatched():
    cfg = dec_config(16, 2, dim_feedforward=24, activation="relu", layer_norm_eps=1e-5,
                     batch_first=True, norm_first=False)
    m = _dec(cfg, randomize=("linear1.bias", "linear2.bias"))
    tgt = torch.randn(4, 16)
    memory = torch.randn(6, 16)
    return cfg, m, {}, {"tgt": tgt, "memory": memory}


# Fixtures whose outputs hold NaN by design: rows whose every key is masked (torch 1.13's policy).
EXPECT_NAN = {"mha_all_masked_rows", "encoder_all_masked_rows"}

# name -> (seed, builder, description)
FIXTURES = {
    "mha_single": (
        1001, fx_mha_single,
        "Seed case: unbatched (100, 64) single-head causal self-attention without biases, "
        "torch init, head-averaged weights, the baseline the harness was built around."),
    "mha_batched": (
        1002, fx_mha_batched,
        "Seed case at batch 2: batch_first (2, 100, 64) single-head causal self-attention "
        "without biases, torch init, checking batch handling against the unbatched baseline."),
    "mha_multihead": (
        1003, fx_mha_multihead,
        "Batch_first (2, 100, 64) causal self-attention with 4 heads and no biases, torch init, "
        "checking the head split/merge and head-averaged attention weights."),
    "encoder_block": (
        1004, fx_encoder_block,
        "Seed encoder case: post-norm ReLU TransformerEncoderLayer(64, 4, ff=128), batch_first "
        "(2, 100, 64) with a causal float src_mask, feed-forward biases zeroed as in the seed."),
    "mha_seq_first_cross_perhead": (
        1005, fx_mha_seq_first_cross_perhead,
        "Sequence-first cross-attention (L=7, S=9, B=3, E=16, 2 heads) with randomized biases "
        "and a per-batch bool key_padding_mask, returning per-head weights, to exercise layout, "
        "bias and padding semantics."),
    "mha_kdim_vdim": (
        1006, fx_mha_kdim_vdim,
        "Attention with kdim=12 and vdim=20 != embed_dim=16 (separate q/k/v projection weights), "
        "4 heads, randomized biases and a random 2-D bool attn_mask, checking the unpacked "
        "in-projection path."),
    "mha_bias_kv_zero_attn": (
        1007, fx_mha_bias_kv_zero_attn,
        "Self-attention with add_bias_kv and add_zero_attn, randomized biases, a 3-D per-head "
        "float attn_mask and a bool key_padding_mask, checking how both extra key/value columns "
        "pad the masks."),
    "mha_unbatched_perhead_floatpad": (
        1008, fx_mha_unbatched_perhead_floatpad,
        "Unbatched cross-attention (L=6, S=8, E=16, 4 heads) with randomized biases and an "
        "additive 1-D float key_padding_mask and no attn_mask, returning per-head weights "
        "of shape (heads, L, S)."),
    "mha_no_weights": (
        1009, fx_mha_no_weights,
        "Causal self-attention with need_weights=False and randomized biases, checking that "
        "only the attention output is returned."),
    "encoder_norm_first_gelu": (
        1010, fx_encoder_norm_first_gelu,
        "Pre-norm (norm_first) GELU TransformerEncoderLayer(32, 4, ff=64, eps=1e-6) with "
        "randomized biases and LayerNorm affine, causal float src_mask combined with a bool "
        "src_key_padding_mask."),
    "encoder_seq_first_gelu": (
        1011, fx_encoder_seq_first_gelu,
        "Post-norm GELU TransformerEncoderLayer(32, 2, ff=48) in sequence-first layout (7, 2, 32) "
        "with randomized biases and LayerNorm affine and no masks."),
    "encoder_unbatched_eps": (
        1012, fx_encoder_unbatched_eps,
        "Unbatched (9, 16) post-norm ReLU TransformerEncoderLayer(16, 2, ff=32) with "
        "layer_norm_eps=1e-3, randomized biases and LayerNorm affine and a random bool src_mask."),
    "encoder_stack_norm": (
        1013, fx_encoder_stack_norm,
        "TransformerEncoder of 3 independently initialised post-norm ReLU layers (32, 4, ff=64) "
        "plus a final LayerNorm with the layers' eps=1e-5, randomized biases and LayerNorm affine "
        "per layer, batch_first (2, 10, 32) with a causal float mask and a bool "
        "src_key_padding_mask."),
    "encoder_stack_prenorm_gelu_seq_first": (
        1014, fx_encoder_stack_prenorm_gelu_seq_first,
        "TransformerEncoder of 2 independently initialised pre-norm GELU layers (16, 2, ff=32, "
        "eps=1e-6) without a final norm, randomized biases and LayerNorm affine per layer, "
        "sequence-first (7, 3, 16) and no masks."),
    "decoder_layer": (
        1015, fx_decoder_layer,
        "Post-norm ReLU TransformerDecoderLayer(32, 4, ff=64) with randomized biases and "
        "LayerNorm affine, batch_first tgt (2, 6, 32) and memory (2, 9, 32), a causal float "
        "tgt_mask and bool tgt and memory key padding masks."),
    "decoder_layer_norm_first_gelu": (
        1016, fx_decoder_layer_norm_first_gelu,
        "Pre-norm GELU TransformerDecoderLayer(16, 2, ff=32, eps=1e-6) with randomized biases and "
        "LayerNorm affine, sequence-first tgt (5, 2, 16) and memory (7, 2, 16), a random bool "
        "tgt_mask and an additive float memory_mask."),
    "decoder_layer_unbatched": (
        1017, fx_decoder_layer_unbatched,
        "Unbatched post-norm ReLU TransformerDecoderLayer(16, 2, ff=24) with torch init except "
        "random feed-forward biases (linear1, linear2), tgt (4, 16) and memory (6, 16), "
        "no masks."),
    "mha_all_masked_rows": (
        1018, fx_mha_all_masked_rows,
        "Self-attention (2, 6, 16), 2 heads, randomized biases, whose query 2 has every key masked "
        "by a bool attn_mask (NaN in torch 1.13) and whose batch element 1 has every key but one "
        "padded (that key gets weight 1); per-head weights."),
    "encoder_all_masked_rows": (
        1019, fx_encoder_all_masked_rows,
        "Post-norm ReLU TransformerEncoderLayer(16, 2, ff=32) whose batch element 0 has every key "
        "padded by src_key_padding_mask: NaN through the residual and both norms to its whole "
        "output; batch element 1 partly padded."),
}


# ---------------------------------------------------------------------------
# Serialisation
# ---------------------------------------------------------------------------

def _json_float(x):
    if math.isfinite(x):
        return x
    if math.isnan(x):
        return "nan"
    return "inf" if x > 0 else "-inf"


def tensor_json(t, dtype_name):
    t = t.detach().contiguous()
    if dtype_name == "bool":
        assert t.dtype == torch.bool
        data = t.reshape(-1).tolist()
    else:
        expected = {"float32": torch.float32, "float64": torch.float64}[dtype_name]
        assert t.dtype == expected, (t.dtype, dtype_name)
        data = [_json_float(x) for x in t.reshape(-1).tolist()]
    return {"dtype": dtype_name, "shape": list(t.shape), "data": data}


def tensor_json_auto(t):
    return tensor_json(t, {torch.bool: "bool", torch.float32: "float32",
                           torch.float64: "float64"}[t.dtype])


def to_float64(t):
    return t if t.dtype == torch.bool else t.to(torch.float64)


def split_outputs(ret, module_name, fwd):
    """Return an ordered dict of the module's returned tensors."""
    if module_name == "MultiheadAttention":
        out, weights = ret
        d = {"output": out.detach()}
        if fwd["need_weights"]:
            assert weights is not None
            d["attn_weights"] = weights.detach()
        else:
            assert weights is None
        return d
    return {"output": ret.detach()}


def l2(t):
    return float(torch.linalg.vector_norm(t.to(torch.float64)))


def make_fixture(name):
    seed, builder, description = FIXTURES[name]
    torch.manual_seed(seed)
    config, module32, fwd, inputs32 = builder()
    module_name = type(module32).__name__
    # The written config must describe the module actually built.
    assert build_config_echo(module32, module_name) == config, name

    # Every parameter must require grad so that, with autograd enabled, the
    # fast path's "grad is enabled and ... requires_grad" condition blocks it.
    assert all(p.requires_grad for p in module32.parameters())
    assert torch.is_grad_enabled()

    # float64 copy; keep "is" identity between query/key/value (self-attention).
    module64 = copy.deepcopy(module32).double()
    inputs64 = {}
    cast_cache = {}
    for k, v in inputs32.items():
        if id(v) not in cast_cache:
            cast_cache[id(v)] = to_float64(v)
        inputs64[k] = cast_cache[id(v)]

    with forbid_fast_path():
        out32 = split_outputs(module32(**inputs32, **fwd), module_name, fwd)
        out64 = split_outputs(module64(**inputs64, **fwd), module_name, fwd)

    # Float64 parameters must be exact copies of the float32 ones.
    sd32 = module32.state_dict()
    sd64 = module64.state_dict()
    assert list(sd32.keys()) == list(sd64.keys())
    for k in sd32:
        assert sd64[k].dtype == torch.float64
        assert torch.equal(sd64[k], sd32[k].double()), k

    noise = {}
    for key in out64:
        o32, o64 = out32[key], out64[key]
        assert o32.dtype == torch.float32 and o64.dtype == torch.float64
        assert o32.shape == o64.shape
        if name in EXPECT_NAN:
            # NaN where every key is masked, at the same positions in both precisions, and only there
            nan64, nan32 = torch.isnan(o64), torch.isnan(o32)
            assert nan64.any(), f"{name}: expected NaN rows in float64 {key}"
            assert torch.equal(nan64, nan32), f"{name}: NaN positions differ between float32 and float64 {key}"
            assert torch.isfinite(o64[~nan64]).all(), f"{name}: non-finite float64 {key} besides the NaN rows"
            o32, o64 = o32[~nan32], o64[~nan64]
        assert not torch.isnan(o64).any(), f"{name}: NaN in float64 {key}"
        assert torch.isfinite(o64).all(), f"{name}: non-finite float64 {key}"
        diff = l2(o32.double() - o64)
        ref = l2(o64)
        assert diff <= REL_TOL * ref, f"{name}: {key} float32/float64 rel diff {diff / ref:.3e}"
        max_abs = float((o32.double() - o64).abs().max())
        assert max_abs <= REL_TOL * float(o64.abs().max()), f"{name}: {key} max abs diff {max_abs}"
        noise[key] = (diff, ref)

    fixture = {
        "format": FORMAT,
        "version": VERSION,
        "name": name,
        "module": module_name,
        "config": config,
        "forward": dict(fwd),
        "state_dict": {k: tensor_json(v, "float64") for k, v in sd64.items()},
        "inputs": {k: tensor_json_auto(v) for k, v in inputs64.items()},
        "outputs": {k: tensor_json(v, "float64") for k, v in out64.items()},
        "outputs_float32": {k: tensor_json(v, "float32") for k, v in out32.items()},
        "description": description,
    }
    return fixture, noise


def build_config_echo(module, module_name):
    """Reconstruct the constructor config from a built module."""
    if module_name == "MultiheadAttention":
        return mha_config(module.embed_dim, module.num_heads,
                          bias=module.in_proj_bias is not None,
                          add_bias_kv=module.bias_k is not None,
                          add_zero_attn=module.add_zero_attn,
                          kdim=module.kdim, vdim=module.vdim,
                          batch_first=module.batch_first)
    if module_name == "TransformerEncoder":
        layer_cfgs = [build_config_echo(l, "TransformerEncoderLayer") for l in module.layers]
        assert all(c == layer_cfgs[0] for c in layer_cfgs), "layers differ in config"
        assert module.num_layers == len(module.layers)
        assert module.enable_nested_tensor is False
        if module.norm is not None:
            assert isinstance(module.norm, nn.LayerNorm)
            assert module.norm.normalized_shape == (layer_cfgs[0]["d_model"],)
            assert module.norm.elementwise_affine
            assert module.norm.eps == layer_cfgs[0]["layer_norm_eps"]
        cfg = dict(layer_cfgs[0])
        cfg["num_layers"] = len(module.layers)
        cfg["norm"] = module.norm is not None
        return cfg
    act = module.activation
    if act is torch.nn.functional.relu:
        act_name = "relu"
    elif act is torch.nn.functional.gelu:
        act_name = "gelu"
    else:
        raise ValueError(f"unsupported activation {act!r}")
    assert module.norm1.eps == module.norm2.eps
    if module_name == "TransformerDecoderLayer":
        assert module.norm3.eps == module.norm1.eps
        sa, ca = module.self_attn, module.multihead_attn
        assert (sa.embed_dim, sa.num_heads, sa.batch_first) == \
            (ca.embed_dim, ca.num_heads, ca.batch_first)
        return dec_config(sa.embed_dim, sa.num_heads,
                          dim_feedforward=module.linear1.out_features,
                          activation=act_name, layer_norm_eps=module.norm1.eps,
                          batch_first=sa.batch_first, norm_first=module.norm_first)
    return enc_config(module.self_attn.embed_dim, module.self_attn.num_heads,
                      dim_feedforward=module.linear1.out_features,
                      activation=act_name, layer_norm_eps=module.norm1.eps,
                      batch_first=module.self_attn.batch_first,
                      norm_first=module.norm_first)


def write_fixture(fixture, path):
    tmp = path + ".tmp"
    with open(tmp, "w", encoding="utf-8") as f:
        json.dump(fixture, f, separators=(",", ":"), allow_nan=False)
        f.write("\n")
    os.replace(tmp, path)


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--out", default=DEFAULT_OUT,
                    help="output directory (default: %(default)s)")
    ap.add_argument("--only", nargs="+", metavar="NAME", choices=list(FIXTURES),
                    help="write only these fixtures")
    args = ap.parse_args(argv)

    # Single-threaded for run-to-run reproducibility of the float32 results.
    torch.set_num_threads(1)
    self_test_fast_path_guard()

    os.makedirs(args.out, exist_ok=True)
    names = args.only if args.only else list(FIXTURES)
    print(f"torch {torch.__version__}")
    for name in names:
        fixture, noise = make_fixture(name)
        path = os.path.join(args.out, name + ".json")
        write_fixture(fixture, path)
        size = os.path.getsize(path)
        print(f"{name}  {path}  {size} bytes")
        for key, (diff, ref) in noise.items():
            print(f"    {key:13s} |out32-out64|_2 = {diff:.3e}   |out64|_2 = {ref:.3e}   "
                  f"rel = {diff / ref:.3e}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
