#!/usr/bin/python3
"""Export tparity reference fixtures (format v2) from PyTorch 2.13 or 1.13.

Each fixture is one JSON file fixtures/torch-<major>.<minor>/<name>.json holding
the module config, forward() flags, the state_dict, the inputs and the outputs of
a torch.nn.MultiheadAttention, TransformerEncoderLayer, TransformerEncoder (a
stack of encoder layers with an optional final LayerNorm) or
TransformerDecoderLayer, computed in float64 ("outputs") and in float32
("outputs_float32"), and which PyTorch computed them ("reference").

The script runs under either PyTorch whose semantics it has been checked against:
  * torch 2.13, the project's venv (the normal one):
        .venv/bin/python scripts/export_fixtures.py      -> fixtures/torch-2.13/
  * torch 1.13, Debian's python3-torch:
        /usr/bin/python3 scripts/export_fixtures.py      -> fixtures/torch-1.13/
Any other version is refused: the per-version expectations below would be
unverified. Both sets share names, seeds and shapes, so they line up name by
name; a fixture a version cannot express is skipped there with a printed line.

Format version 2 is version 1 (README, "Fixture format v1") plus
  "version": 2,
  "reference": {"name":    "torch.nn.<Module> (Python)",
                "torch":   torch.__version__, e.g. "2.13.0+cpu" or "1.13.0a0",
                "blas":    BLAS and backends from torch.__config__.show(), e.g.
                           "mkl 2024.2, onednn v3.12.0, cpu capability AVX512" or
                           "openblas 0.3.21 Cooperlake (generic BLAS_INFO), onednn v2.6.3,
                           cpu capability AVX2" (it depends on the machine's CPU),
                "threads": str(torch.get_num_threads()), "1"}
(all values strings). Tensors stay inline {"dtype", "shape", "data"}; everything
else is as in v1.

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
Autograd stays enabled with every parameter requiring grad, so PyTorch takes the
documented Python path (F.multi_head_attention_forward) and not the fused fast
path; the script additionally traps the fast-path entry points (and the encoder
stack's nested-tensor conversion) and fails if they are hit, and under 2.13 also
switches torch.backends.mha's fast path off during the export.

What the documented path computes differs between the versions in a few places
the fixtures pin down (each fixture's expectation is asserted per version):
  * Rows whose every key is masked. With need_weights=True both give NaN there
    (plain softmax of a row of -inf). With need_weights=False, 1.13 still gives
    NaN, but 2.13 runs scaled_dot_product_attention, whose safe softmax gives a
    zero context: the attention's output there is out_proj.bias, and an
    encoder / decoder layer (whose attention always runs with
    need_weights=False) stays finite (encoder_all_masked_rows,
    mha_all_masked_rows_no_weights, decoder_layer_all_masked_memory).
  * A float key_padding_mask with a bool attn_mask: 1.13 ORs them (any nonzero
    kpm value masks the key), 2.13 adds the kpm to the scores
    (mha_bool_attn_float_kpm).
  * A float key_padding_mask with a float attn_mask: 2.13 adds both; 1.13
    silently ignores the kpm (masked_fill reads the float mask's low byte), so
    mha_float_attn_float_kpm is not exported under 1.13.
  * Rounding: 2.13 scales q by sqrt(1/E) (1.13 divides by sqrt(E)), runs
    need_weights=False attention through SDPA's flash kernel, and uses MKL and
    AVX-512 kernels instead of OpenBLAS and AVX2: float64 results differ by a
    few ulp.

Determinism: single-threaded (torch.set_num_threads(1); under 1.13 OpenBLAS's own
thread pool is pinned to 1 too), so re-runs under the same interpreter on the same
machine are byte-identical. Files are written atomically (temp file + os.replace).

Usage:
  .venv/bin/python scripts/export_fixtures.py [--out DIR] [--only NAME ...]
  /usr/bin/python3 scripts/export_fixtures.py [--out DIR] [--only NAME ...]
"""

import argparse
import contextlib
import copy
import ctypes
import json
import math
import os
import re
import sys
import tempfile
import warnings

import torch
import torch.nn as nn

FORMAT = "tparity.fixture"
VERSION = 2
REL_TOL = 1e-4  # loose float32-vs-float64 agreement check

SCRIPT_DIR = os.path.dirname(os.path.abspath(__file__))
FIXTURES_DIR = os.path.join(os.path.dirname(SCRIPT_DIR), "fixtures")

_MM = re.match(r"(\d+)\.(\d+)", torch.__version__)
TORCH_MAJOR_MINOR = f"{_MM.group(1)}.{_MM.group(2)}"
# The versions whose semantics the expectations in this script were checked against.
SUPPORTED = ("1.13", "2.13")
SEM = TORCH_MAJOR_MINOR  # the semantics version the per-version expectations key on
DEFAULT_OUT = os.path.join(FIXTURES_DIR, f"torch-{TORCH_MAJOR_MINOR}")


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


# Fused fast-path entry points, looked up as attributes of the torch module at call time by
# MultiheadAttention.forward, TransformerEncoderLayer.forward and TransformerEncoder.forward (1.13
# and 2.13 alike). The nested-tensor pair is TransformerEncoder's sparsity path (its left-aligned
# check runs whenever nested tensors are enabled and a src_key_padding_mask is given, even with
# autograd on); the decoder-only pair exists only in 1.13, where Python's TransformerDecoderLayer
# does not call it, and is trapped in case a build does.
FAST_PATH_NAMES = ("_native_multi_head_attention", "_transformer_encoder_layer_fwd",
                   "_nested_tensor_from_mask", "_nested_tensor_from_mask_left_aligned",
                   "_transformer_decoder_only_layer_fwd",
                   "_native_decoder_only_multi_head_attention")
# These must exist in every supported version, or the guard traps nothing.
FAST_PATH_REQUIRED = FAST_PATH_NAMES[:4]


def _mha_fastpath_switch():
    """torch.backends.mha.{get,set}_fastpath_enabled (2.x; absent in 1.13), or None."""
    mha = getattr(torch.backends, "mha", None)
    if mha is None or not hasattr(mha, "set_fastpath_enabled"):
        return None
    return mha


@contextlib.contextmanager
def fastpath_switch(enabled):
    """Set torch.backends.mha's fast-path switch where it exists (2.x), restoring it on exit."""
    mha = _mha_fastpath_switch()
    if mha is None:
        yield
        return
    before = mha.get_fastpath_enabled()
    mha.set_fastpath_enabled(enabled)
    try:
        yield
    finally:
        mha.set_fastpath_enabled(before)


@contextlib.contextmanager
def forbid_fast_path():
    """Replace torch's fused fast-path entry points (FAST_PATH_NAMES) by functions that raise."""
    missing = [n for n in FAST_PATH_REQUIRED if not hasattr(torch, n)]
    assert not missing, f"fast-path entry points not found in torch {torch.__version__}: {missing}"
    saved = {n: getattr(torch, n) for n in FAST_PATH_NAMES if hasattr(torch, n)}

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


@contextlib.contextmanager
def documented_path():
    """The export's guards: the traps, plus (2.x) torch.backends.mha's fast path switched off."""
    with forbid_fast_path(), fastpath_switch(False):
        yield


def self_test_fast_path_guard():
    """Make sure the guard is meaningful: under no_grad, a fast-path-eligible
    MHA / encoder layer / encoder stack (default enable_nested_tensor=True,
    left-aligned padding mask) must trip it (1.13 and 2.13 alike; under 2.13 with
    torch.backends.mha's switch on, its default). Under 2.13, the same calls with
    the switch off must not (the second guard works on its own)."""
    torch.manual_seed(0)
    mha = nn.MultiheadAttention(8, 2, dropout=0.0, batch_first=True).eval()
    enc = nn.TransformerEncoderLayer(8, 2, dim_feedforward=16, dropout=0.0,
                                     batch_first=True).eval()
    stack = nn.TransformerEncoder(enc, 2).eval()
    x = torch.randn(2, 3, 8)
    kpm = padding_mask(3, [0, 1])
    calls = ((mha, lambda: mha(x, x, x)), (enc, lambda: enc(x)),
             (stack, lambda: stack(x, src_key_padding_mask=kpm)))
    switch_states = (True, False) if _mha_fastpath_switch() is not None else (None,)
    for enabled in switch_states:
        for mod, call in calls:
            tripped = False
            with contextlib.ExitStack() as es:
                if enabled is not None:
                    es.enter_context(fastpath_switch(enabled))
                es.enter_context(forbid_fast_path())
                es.enter_context(torch.no_grad())
                try:
                    call()
                except FastPathTaken:
                    tripped = True
            if enabled is False and tripped:
                raise AssertionError(
                    f"fast-path guard self-test: {type(mod).__name__} took the fast path under "
                    "no_grad although torch.backends.mha.set_fastpath_enabled(False)")
            if enabled is not False and not tripped:
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
    # Rows whose every key is masked: NaN there in both versions (need_weights=True runs a plain
    # softmax of a row of -inf). Query 2 of the bool attn_mask masks every key; batch element 1's
    # key_padding_mask masks all keys but key 4, so every one of its rows attends to that key alone
    # (weight exactly 1) unless the attn_mask masks key 4 too. Per-head weights.
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
    # An encoder layer whose batch element 0 has every key padded. 1.13: NaN from the attention on,
    # through the residual and both layer norms, to the whole of that element's output. 2.13: the
    # layer's attention runs with need_weights=False, i.e. through scaled_dot_product_attention,
    # whose safe softmax gives a zero context there, so the attention block gives out_proj.bias and
    # the element's output is finite. (The fused fast path, which the exporter forbids, gives NaN
    # for this layer in both versions.)
    cfg = enc_config(16, 2, dim_feedforward=32, batch_first=True)
    m = _enc(cfg, affine="randomized")
    src = torch.randn(2, 5, 16)
    kpm = torch.zeros(2, 5, dtype=torch.bool)
    kpm[0, :] = True
    kpm[1, 3:] = True
    return cfg, m, {}, {"src": src, "src_key_padding_mask": kpm}


def _kpm_values(B, S):
    """Float (B, S) key padding mask drawn from {0, 0.5, -1.5}; key 0 always 0."""
    vals = torch.tensor([0.0, 0.5, -1.5])
    kpm = vals[torch.randint(0, 3, (B, S))]
    kpm[:, 0] = 0.0
    return kpm


def fx_mha_bool_attn_float_kpm():
    # A bool attn_mask with a float key_padding_mask: 1.13 ORs them (any nonzero kpm value masks
    # its key), 2.13 adds the kpm to the scores (the bool mask becoming -inf/0). Key 0 is never
    # masked, so no row is fully masked under either reading.
    cfg = mha_config(8, 2, bias=True, batch_first=True)
    fwd = {"need_weights": True, "average_attn_weights": False}
    m = _mha(cfg, affine="randomized")
    q = torch.randn(2, 4, 8)
    kv = torch.randn(2, 6, 8)
    am = random_bool_mask(4, 6)
    kpm = _kpm_values(2, 6)
    return cfg, m, fwd, {"query": q, "key": kv, "value": kv, "attn_mask": am,
                         "key_padding_mask": kpm}


def fx_mha_float_attn_float_kpm():
    # A float attn_mask with a float key_padding_mask: 2.13 adds both to the scores. 1.13 does not
    # raise but silently ignores the kpm (masked_fill reads a float mask's low byte, 0 for these
    # values): not exported under 1.13.
    cfg = mha_config(8, 2, bias=True, batch_first=True)
    fwd = {"need_weights": True, "average_attn_weights": False}
    m = _mha(cfg, affine="randomized")
    q = torch.randn(2, 4, 8)
    kv = torch.randn(2, 6, 8)
    am = torch.randn(4, 6)
    kpm = _kpm_values(2, 6)
    return cfg, m, fwd, {"query": q, "key": kv, "value": kv, "attn_mask": am,
                         "key_padding_mask": kpm}


def fx_mha_all_masked_rows_no_weights():
    # mha_all_masked_rows' masks with need_weights=False: 1.13 NaN in the fully masked rows; 2.13
    # runs scaled_dot_product_attention, whose safe softmax gives a zero context there, so the
    # output in those rows is out_proj.bias.
    cfg = mha_config(8, 2, bias=True, batch_first=True)
    fwd = {"need_weights": False, "average_attn_weights": True}
    m = _mha(cfg, affine="randomized")
    x = torch.randn(2, 6, 8)
    am = random_bool_mask(6, 6)
    am[2, :] = True
    kpm = torch.zeros(2, 6, dtype=torch.bool)
    kpm[1, :] = True
    kpm[1, 4] = False
    return cfg, m, fwd, {"query": x, "key": x, "value": x, "attn_mask": am, "key_padding_mask": kpm}


def fx_decoder_layer_all_masked_memory():
    # A decoder layer whose memory_key_padding_mask masks every memory key of batch element 0:
    # 1.13 NaN for all of that element's tokens (cross-attention, then the residual and norms);
    # 2.13 finite, its cross-attention block giving multihead_attn.out_proj.bias there.
    cfg = dec_config(8, 2, dim_feedforward=16, activation="relu", layer_norm_eps=1e-5,
                     batch_first=True, norm_first=False)
    m = _dec(cfg, affine="randomized")
    tgt = torch.randn(2, 5, 8)
    memory = torch.randn(2, 6, 8)
    mkpm = torch.zeros(2, 6, dtype=torch.bool)
    mkpm[0, :] = True
    mkpm[1, 4:] = True
    return cfg, m, {}, {"tgt": tgt, "memory": memory, "tgt_mask": causal_mask(5, 5),
                        "memory_key_padding_mask": mkpm}


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


# ---------------------------------------------------------------------------
# Per-version expectations
# ---------------------------------------------------------------------------
# Where the two versions' documented paths compute different things, each fixture states what the
# version running the export must give, and the export asserts it. An expectation gets a Run (the
# modules, inputs and outputs in both precisions) and returns {output key: bool tensor} marking the
# positions that hold NaN by design (left out of the float32-vs-float64 noise check).

class Run:
    def __init__(self, name, module_name, config, fwd, module32, module64, inputs32, inputs64):
        self.name, self.module_name, self.config, self.fwd = name, module_name, config, fwd
        self.module32, self.module64 = module32, module64
        self.inputs32, self.inputs64 = inputs32, inputs64
        self.out32 = self.out64 = None
        self.warnings = []

    def precisions(self):
        """(label, module, inputs, outputs) for float64 and float32."""
        return (("float64", self.module64, self.inputs64, self.out64),
                ("float32", self.module32, self.inputs32, self.out32))

    def call(self, module, inputs, fwd=None, hooks=()):
        """Run module on inputs on the documented path (the export's guards on), collecting the
        warnings torch gives; hooks: (submodule, list) pairs whose forward output is captured."""
        fwd = self.fwd if fwd is None else fwd
        handles = [sub.register_forward_hook(lambda mod, args, res, sink=sink: sink.append(res))
                   for sub, sink in hooks]
        try:
            with warnings.catch_warnings(record=True) as caught, documented_path():
                warnings.simplefilter("always")
                ret = module(**inputs, **fwd)
        finally:
            for h in handles:
                h.remove()
        for w in caught:
            msg = f"{w.category.__name__}: {str(w.message).splitlines()[0]}"
            if msg not in self.warnings:
                self.warnings.append(msg)
        return split_outputs(ret, self.module_name, fwd)


def fully_masked_rows(attn_mask, key_padding_mask, B, L, S):
    """Bool (B, L): the query rows whose every key is masked by bool masks (True = masked out);
    attn_mask (L, S) or None, key_padding_mask (B, S) or None."""
    masked = torch.zeros(B, L, S, dtype=torch.bool)
    if attn_mask is not None:
        assert attn_mask.dtype == torch.bool and tuple(attn_mask.shape) == (L, S)
        masked |= attn_mask[None]
    if key_padding_mask is not None:
        assert key_padding_mask.dtype == torch.bool and tuple(key_padding_mask.shape) == (B, S)
        masked |= key_padding_mask[:, None, :]
    return masked.all(dim=-1)


def assert_nan_exactly(run, key, precision, t, where, why):
    nan = torch.isnan(t)
    assert torch.equal(nan, where), (
        f"{run.name}: {precision} {key}: expected NaN exactly in {why} ({int(where.sum())} values), "
        f"got {int(nan.sum())} NaN values, {int((nan & ~where).sum())} of them elsewhere")
    assert torch.isfinite(t[~nan]).all(), f"{run.name}: {precision} {key}: non-finite besides the NaN rows"


def assert_rows_equal_bias(run, precision, t, rows, bias, what):
    n = int(rows.sum())
    assert torch.equal(t[rows], bias.detach().expand(n, -1)), (
        f"{run.name}: {precision}: {what} in the {n} fully masked rows is not exactly out_proj.bias")


def expect_mha_masked_rows(run):
    """MultiheadAttention (batch_first, bool masks) with query rows whose every key is masked.
    Weights (need_weights=True): NaN in those rows in 1.13 and 2.13 alike (plain softmax of a row of
    -inf). Output: NaN in those rows under 1.13 (either need_weights) and under 2.13 with
    need_weights=True; under 2.13 with need_weights=False (scaled_dot_product_attention, safe
    softmax: a zero context) finite and exactly out_proj.bias in those rows."""
    x = run.inputs64
    assert run.config["batch_first"] and x["query"].dim() == 3
    B, L, _ = x["query"].shape
    S = x["key"].shape[1]
    rows = fully_masked_rows(x.get("attn_mask"), x.get("key_padding_mask"), B, L, S)
    assert rows.any(), f"{run.name}: no fully masked row"
    nan = {}
    if "attn_weights" in run.out64:
        w = run.out64["attn_weights"]
        wrows = (rows[:, None, :, None] if w.dim() == 4 else rows[:, :, None]).expand(w.shape)
        for precision, _, _, out in run.precisions():
            assert_nan_exactly(run, "attn_weights", precision, out["attn_weights"], wrows,
                               "the fully masked rows (need_weights=True, 1.13 and 2.13)")
        nan["attn_weights"] = wrows
    orows = rows[:, :, None].expand(run.out64["output"].shape)
    if SEM == "1.13" or run.fwd["need_weights"]:
        why = ("the fully masked rows (torch 1.13)" if SEM == "1.13" else
               "the fully masked rows (torch 2.13, need_weights=True: plain softmax)")
        for precision, _, _, out in run.precisions():
            assert_nan_exactly(run, "output", precision, out["output"], orows, why)
        nan["output"] = orows
    else:
        for precision, module, _, out in run.precisions():
            o = out["output"]
            assert torch.isfinite(o).all(), (
                f"{run.name}: {precision} output: torch 2.13 with need_weights=False should give "
                "finite rows where every key is masked (zero context)")
            assert_rows_equal_bias(run, precision, o, rows, module.out_proj.bias,
                                   "the output (torch 2.13, need_weights=False)")
    return nan


def expect_layer_masked_rows(attn_name, query_name, mask_name, kpm_name):
    """An encoder/decoder layer (batch_first) whose attention attn_name has query rows whose every
    key is masked by the bool masks mask_name / kpm_name. 1.13: NaN in those rows from the
    attention on, through the residual and the norms, to the whole of those tokens' output.
    2.13: the layer calls its attention with need_weights=False (scaled_dot_product_attention, safe
    softmax: a zero context), so the output is finite and the attention block's output in those
    rows is exactly its out_proj.bias (captured with a forward hook on a second run, which must
    reproduce the exported output bit for bit)."""
    def expect(run):
        x = run.inputs64
        assert run.config["batch_first"] and x[query_name].dim() == 3
        B, L, _ = x[query_name].shape
        S = x[kpm_name].shape[1]
        rows = fully_masked_rows(x.get(mask_name), x[kpm_name], B, L, S)
        assert rows.any(), f"{run.name}: no fully masked row"
        orows = rows[:, :, None].expand(run.out64["output"].shape)
        if SEM == "1.13":
            for precision, _, _, out in run.precisions():
                assert_nan_exactly(run, "output", precision, out["output"], orows,
                                   "the tokens whose every key is masked (torch 1.13)")
            return {"output": orows}
        for precision, module, inputs, out in run.precisions():
            assert torch.isfinite(out["output"]).all(), (
                f"{run.name}: {precision} output: torch 2.13 should give finite tokens where "
                f"every key of {attn_name} is masked")
            attn = getattr(module, attn_name)
            captured = []
            again = run.call(module, inputs, hooks=((attn, captured),))
            assert torch.equal(again["output"], out["output"]), (
                f"{run.name}: {precision}: the hooked re-run differs from the export")
            assert len(captured) == 1, f"{run.name}: {attn_name} ran {len(captured)} times"
            assert_rows_equal_bias(run, precision, captured[0][0], rows, attn.out_proj.bias,
                                   f"the {attn_name} block's output (torch 2.13)")
        return {}
    return expect


def _merged_mask_reference(run, module, inputs, merge):
    """The module's output when its attn_mask and key_padding_mask are replaced by one 3-D
    (B * heads, L, S) attn_mask merged by hand:
      "or":  bool attn_mask OR (key_padding_mask != 0)   (1.13's merge of a float kpm into a bool mask)
      "add": additive(attn_mask) + key_padding_mask        (2.13: each mask additive, summed)
      "attn_only": attn_mask alone, the kpm dropped        (what 1.13 does with float + float)."""
    am, kpm, q = inputs["attn_mask"], inputs["key_padding_mask"], inputs["query"]
    H = run.config["num_heads"]
    B, L, S = q.shape[0], q.shape[1], inputs["key"].shape[1]
    assert run.config["batch_first"] and am.shape == (L, S) and kpm.shape == (B, S)
    if merge == "or":
        assert am.dtype == torch.bool
        merged = am[None] | (kpm != 0)[:, None, :]
    elif merge == "add":
        additive = (torch.zeros(L, S, dtype=q.dtype).masked_fill(am, float("-inf"))
                    if am.dtype == torch.bool else am)
        merged = additive[None] + kpm[:, None, :]
    else:
        merged = am[None].expand(B, L, S)
    merged = merged.repeat_interleave(H, dim=0)  # batch b, head h -> b * H + h, as torch's merge
    ins = {k: v for k, v in inputs.items() if k not in ("attn_mask", "key_padding_mask")}
    ins["attn_mask"] = merged
    return run.call(module, ins)


def _assert_merge(run, expected, other, why):
    """Outputs equal the `expected` hand-merged reference bit for bit and differ from `other`."""
    for precision, module, inputs, out in run.precisions():
        ref = _merged_mask_reference(run, module, inputs, expected)
        alt = _merged_mask_reference(run, module, inputs, other)
        for key in out:
            assert torch.isfinite(out[key]).all(), f"{run.name}: {precision} {key} not finite"
            assert torch.equal(out[key], ref[key]), (
                f"{run.name}: {precision} {key} is not the '{expected}' merge of the masks ({why})")
            assert not torch.allclose(out[key], alt[key], rtol=1e-3, atol=0), (
                f"{run.name}: {precision} {key}: the '{expected}' and '{other}' merges agree; "
                "the fixture does not tell them apart")
    return {}


def expect_bool_attn_float_kpm(run):
    """bool attn_mask + float key_padding_mask. 1.13 ORs them: any nonzero kpm value masks the
    key. 2.13 adds the kpm to the scores."""
    if SEM == "1.13":
        return _assert_merge(run, "or", "add", "torch 1.13 ORs a float kpm into a bool attn_mask")
    return _assert_merge(run, "add", "or", "torch 2.13 adds a float kpm to the scores")


def expect_float_attn_float_kpm(run):
    """float attn_mask + float key_padding_mask, exported under 2.13 only: both added."""
    assert SEM == "2.13"
    return _assert_merge(run, "add", "attn_only", "torch 2.13 adds both float masks")


def skip_float_attn_float_kpm_113(run):
    """Under 1.13 a float kpm with a float attn_mask neither raises nor masks anything for
    ordinary values: masked_fill reads the float mask's low byte (0 for 0, 0.5, -1.5). Check
    that the output is the attn_mask-only one and say so."""
    out = {}
    for precision, module, inputs, _ in run.precisions():
        try:
            out[precision] = run.call(module, inputs)
        except RuntimeError as e:
            return f"torch {torch.__version__} raises on it ({str(e).splitlines()[0]})"
        ref = _merged_mask_reference(run, module, inputs, "attn_only")
        for key in out[precision]:
            assert torch.equal(out[precision][key], ref[key]), (
                f"{run.name}: torch 1.13 neither raised nor ignored the float kpm ({precision} {key})")
    return ("torch 1.13 silently ignores a float key_padding_mask next to a float attn_mask "
            "(masked_fill reads the float's low byte; checked here: the output equals the run "
            "without the kpm), which is not the documented additive meaning")


# name -> {semantics version: expectation(run) -> {key: expected-NaN positions}}; a version absent
# from a fixture's dict has no version-dependent expectation for it.
EXPECT = {
    "mha_all_masked_rows": {"1.13": expect_mha_masked_rows, "2.13": expect_mha_masked_rows},
    "encoder_all_masked_rows": dict.fromkeys(
        SUPPORTED, expect_layer_masked_rows("self_attn", "src", "src_mask", "src_key_padding_mask")),
    "mha_bool_attn_float_kpm": dict.fromkeys(SUPPORTED, expect_bool_attn_float_kpm),
    "mha_float_attn_float_kpm": {"2.13": expect_float_attn_float_kpm},
    "mha_all_masked_rows_no_weights": dict.fromkeys(SUPPORTED, expect_mha_masked_rows),
    "decoder_layer_all_masked_memory": dict.fromkeys(
        SUPPORTED, expect_layer_masked_rows("multihead_attn", "tgt", "memory_mask",
                                            "memory_key_padding_mask")),
}

# name -> {semantics version: why(run) -> reason}: fixtures not exported under that version; the
# function may check the reason and returns it for the printed "skipped" line.
SKIP = {
    "mha_float_attn_float_kpm": {"1.13": skip_float_attn_float_kpm_113},
}


# name -> (seed, builder, description); the description is one string, or one per semantics
# version where what the fixture holds differs between them.
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
        "by a bool attn_mask (NaN in its output row and weights: need_weights=True, torch 1.13 and "
        "2.13 alike) and whose batch element 1 has every key but one padded (that key gets weight "
        "1); per-head weights."),
    "encoder_all_masked_rows": (
        1019, fx_encoder_all_masked_rows,
        {"1.13": "Post-norm ReLU TransformerEncoderLayer(16, 2, ff=32) whose batch element 0 has "
                 "every key padded by src_key_padding_mask: NaN through the residual and both "
                 "norms to its whole output (torch 1.13); batch element 1 partly padded.",
         "2.13": "Post-norm ReLU TransformerEncoderLayer(16, 2, ff=32) whose batch element 0 has "
                 "every key padded by src_key_padding_mask: torch 2.13's attention "
                 "(scaled_dot_product_attention, need_weights=False) gives a zero context there, "
                 "so the attention block is out_proj.bias and the output finite; batch element 1 "
                 "partly padded."}),
    "mha_bool_attn_float_kpm": (
        1020, fx_mha_bool_attn_float_kpm,
        {"1.13": "Cross-attention (B=2, L=4, S=6, E=8, 2 heads), randomized biases, a random 2-D "
                 "bool attn_mask and a float key_padding_mask of 0, 0.5 and -1.5, which torch 1.13 "
                 "ORs into the bool mask (every nonzero value masks its key); per-head weights.",
         "2.13": "Cross-attention (B=2, L=4, S=6, E=8, 2 heads), randomized biases, a random 2-D "
                 "bool attn_mask and a float key_padding_mask of 0, 0.5 and -1.5, which torch 2.13 "
                 "adds to the scores (the bool mask as -inf/0); per-head weights."}),
    "mha_float_attn_float_kpm": (
        1021, fx_mha_float_attn_float_kpm,
        "Cross-attention (B=2, L=4, S=6, E=8, 2 heads), randomized biases, a random 2-D float "
        "attn_mask and a float key_padding_mask of 0, 0.5 and -1.5, both added to the scores "
        "(torch 2.13; torch 1.13 silently ignores such a kpm, so it has no such fixture); per-head "
        "weights."),
    "mha_all_masked_rows_no_weights": (
        1022, fx_mha_all_masked_rows_no_weights,
        {"1.13": "Self-attention (2, 6, 8), 2 heads, randomized biases, need_weights=False, whose "
                 "query 2 has every key masked by a bool attn_mask and whose batch element 1 has "
                 "every key but one padded: NaN in the fully masked rows (torch 1.13).",
         "2.13": "Self-attention (2, 6, 8), 2 heads, randomized biases, need_weights=False, whose "
                 "query 2 has every key masked by a bool attn_mask and whose batch element 1 has "
                 "every key but one padded: torch 2.13's scaled_dot_product_attention gives a zero "
                 "context there, so the output is out_proj.bias in those rows."}),
    "decoder_layer_all_masked_memory": (
        1023, fx_decoder_layer_all_masked_memory,
        {"1.13": "Post-norm ReLU TransformerDecoderLayer(8, 2, ff=16), batch_first tgt (2, 5, 8) "
                 "with a causal float tgt_mask and memory (2, 6, 8) whose memory_key_padding_mask "
                 "masks every key of batch element 0: NaN in all of that element's output "
                 "(torch 1.13); element 1 partly padded.",
         "2.13": "Post-norm ReLU TransformerDecoderLayer(8, 2, ff=16), batch_first tgt (2, 5, 8) "
                 "with a causal float tgt_mask and memory (2, 6, 8) whose memory_key_padding_mask "
                 "masks every key of batch element 0: torch 2.13's cross-attention gives "
                 "out_proj.bias there and the output stays finite; element 1 partly padded."}),
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


# ---------------------------------------------------------------------------
# Which PyTorch computes the outputs ("reference")
# ---------------------------------------------------------------------------

def _openblas():
    """A ctypes handle on the OpenBLAS this process has loaded (Debian's torch 1.13 reaches it
    through libblas.so.3), or None."""
    try:
        with open("/proc/self/maps", encoding="utf-8") as f:
            paths = sorted({line.split()[-1] for line in f if "libopenblas" in line})
    except OSError:
        return None
    for p in paths:
        try:
            lib = ctypes.CDLL(p)  # already loaded: the same library, not a second copy
        except OSError:
            continue
        if hasattr(lib, "openblas_get_config") and hasattr(lib, "openblas_set_num_threads"):
            lib.openblas_get_config.restype = ctypes.c_char_p
            lib.openblas_get_corename.restype = ctypes.c_char_p
            lib.openblas_get_num_threads.restype = ctypes.c_int
            return lib
    return None


def _blas_info():
    m = re.search(r"BLAS_INFO=(\w+)", torch.__config__.show())
    return m.group(1) if m else "unknown"


def blas_description():
    """BLAS and backends, from torch.__config__.show() (plus OpenBLAS's own version and core where
    torch reports a generic BLAS): e.g. "mkl 2024.2, onednn v3.12.0, cpu capability AVX512"."""
    cfg = torch.__config__.show()

    def grab(pattern):
        m = re.search(pattern, cfg)
        return m.group(1) if m else None

    info = _blas_info()
    parts = []
    if info == "mkl":
        v = grab(r"Math Kernel Library Version ([0-9.]+)")
        parts.append(f"mkl {v}" if v else "mkl")
    else:
        ob = _openblas()
        if ob is not None:
            m = re.search(r"OpenBLAS ([0-9.]+)", ob.openblas_get_config().decode())
            core = ob.openblas_get_corename().decode()
            parts.append(f"openblas{' ' + m.group(1) if m else ''} {core} ({info} BLAS_INFO)")
        else:
            parts.append(f"{info} BLAS_INFO")
    dnnl = grab(r"MKL-DNN (v[0-9.]+)")
    if dnnl:
        parts.append(f"onednn {dnnl}")
    cap = grab(r"CPU capability usage: (\w+)")
    if cap:
        parts.append(f"cpu capability {cap}")
    return ", ".join(parts)


def pin_threads():
    """One thread: torch's (and MKL's, which torch.set_num_threads sets in 2.x) and, where torch
    uses OpenBLAS (Debian's 1.13), OpenBLAS's own pool, which torch.set_num_threads does not
    reach and whose thread count changes some results' last bits."""
    torch.set_num_threads(1)
    if _blas_info() != "mkl":
        ob = _openblas()
        if ob is not None:
            ob.openblas_set_num_threads(1)
            assert ob.openblas_get_num_threads() == 1
    assert torch.get_num_threads() == 1


def reference_json(module_name):
    return {"name": f"torch.nn.{module_name} (Python)",
            "torch": torch.__version__,
            "blas": blas_description(),
            "threads": str(torch.get_num_threads())}


# ---------------------------------------------------------------------------
# Export
# ---------------------------------------------------------------------------

def build_run(name):
    seed, builder, _ = FIXTURES[name]
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
    return Run(name, module_name, config, fwd, module32, module64, inputs32, inputs64)


def skip_reason(name):
    """Why the fixture is not exported under this version (its check run), or None."""
    why = SKIP.get(name, {}).get(SEM)
    return None if why is None else why(build_run(name))


def make_fixture(name):
    _, _, description = FIXTURES[name]
    if isinstance(description, dict):
        description = description[SEM]
    run = build_run(name)
    run.out32 = run.call(run.module32, run.inputs32)
    run.out64 = run.call(run.module64, run.inputs64)

    # Float64 parameters must be exact copies of the float32 ones.
    sd32 = run.module32.state_dict()
    sd64 = run.module64.state_dict()
    assert list(sd32.keys()) == list(sd64.keys())
    for k in sd32:
        assert sd64[k].dtype == torch.float64
        assert torch.equal(sd64[k], sd32[k].double()), k

    # What this version must give where the versions differ; NaN by design is only allowed there.
    expect = EXPECT.get(name, {}).get(SEM)
    expected_nan = expect(run) if expect is not None else {}

    noise = {}
    for key in run.out64:
        o32, o64 = run.out32[key], run.out64[key]
        assert o32.dtype == torch.float32 and o64.dtype == torch.float64
        assert o32.shape == o64.shape
        if key in expected_nan:  # checked by the expectation: NaN exactly there, finite elsewhere
            keep = ~expected_nan[key]
            o32, o64 = o32[keep], o64[keep]
        assert not torch.isnan(o64).any(), f"{name}: NaN in float64 {key}"
        assert torch.isfinite(o64).all(), f"{name}: non-finite float64 {key}"
        assert torch.isfinite(o32).all(), f"{name}: non-finite float32 {key}"
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
        "module": run.module_name,
        "reference": reference_json(run.module_name),
        "config": run.config,
        "forward": dict(run.fwd),
        "state_dict": {k: tensor_json(v, "float64") for k, v in sd64.items()},
        "inputs": {k: tensor_json_auto(v) for k, v in run.inputs64.items()},
        "outputs": {k: tensor_json(v, "float64") for k, v in run.out64.items()},
        "outputs_float32": {k: tensor_json(v, "float32") for k, v in run.out32.items()},
        "description": description,
    }
    return fixture, noise, run.warnings


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
    """Write atomically: a temporary file in the same directory, then os.replace."""
    fd, tmp = tempfile.mkstemp(dir=os.path.dirname(path) or ".",
                               prefix="." + os.path.basename(path) + ".", suffix=".tmp")
    try:
        with os.fdopen(fd, "w", encoding="utf-8") as f:
            json.dump(fixture, f, separators=(",", ":"), allow_nan=False)
            f.write("\n")
        os.chmod(tmp, 0o644)
        os.replace(tmp, path)
    except BaseException:
        if os.path.exists(tmp):
            os.unlink(tmp)
        raise


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--out", default=DEFAULT_OUT,
                    help="output directory (default: %(default)s, from the running torch's version)")
    ap.add_argument("--only", nargs="+", metavar="NAME", choices=list(FIXTURES),
                    help="write only these fixtures")
    args = ap.parse_args(argv)

    if SEM not in SUPPORTED:
        print(f"export_fixtures.py: torch {torch.__version__} is not one of the versions whose "
              f"semantics this script checks ({', '.join(SUPPORTED)}); run it with the venv's "
              "torch 2.13 (.venv/bin/python) or Debian's 1.13 (/usr/bin/python3)", file=sys.stderr)
        return 2

    # Single-threaded for run-to-run reproducibility of the results.
    pin_threads()
    self_test_fast_path_guard()

    os.makedirs(args.out, exist_ok=True)
    names = args.only if args.only else list(FIXTURES)
    print(f"torch {torch.__version__} ({blas_description()}; threads {torch.get_num_threads()})")
    for name in names:
        reason = skip_reason(name)
        if reason is not None:
            print(f"{name}  skipped under torch {TORCH_MAJOR_MINOR}: {reason}")
            continue
        fixture, noise, warned = make_fixture(name)
        path = os.path.join(args.out, name + ".json")
        write_fixture(fixture, path)
        size = os.path.getsize(path)
        print(f"{name}  {path}  {size} bytes")
        for key, (diff, ref) in noise.items():
            print(f"    {key:13s} |out32-out64|_2 = {diff:.3e}   |out64|_2 = {ref:.3e}   "
                  f"rel = {diff / ref:.3e}")
        for w in warned:
            print(f"    torch warned: {w}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
