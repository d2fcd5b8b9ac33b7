"""An engine's activation dump for `tparity model --dump`, written here by transformers itself.

    python examples/model_dump/dump.py EXPORT CHECKPOINT [--gguf-file NAME] OUT.safetensors
    tparity model --export EXPORT --dump OUT.safetensors

Stands in for any engine that cannot be called a layer at a time (C++, Rust, CUDA, a llama.cpp-style
runtime): it runs the export's own token ids (input_ids and attention_mask in EXPORT/model.safetensors)
through the model in float32, once, and writes what such an engine would dump: layers.N.output, the
hidden state after each decoder layer N ([B, T, hidden], taken by a forward hook on the layer: the last
layer's is before the final norm, as the export's), and logits ([B, T, vocab]). Yours writes the same
names from its own buffers; any of a layer's components may be added under layers.N.<component>, named
and laid out as `tparity components --fixture EXPORT/layer_00N.json` lists them.
"""
import argparse
import os

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")

import torch  # noqa: E402
from safetensors.torch import load_file, save_file  # noqa: E402
from transformers import AutoModelForCausalLM  # noqa: E402


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("export")
    ap.add_argument("checkpoint")
    ap.add_argument("out")
    ap.add_argument("--gguf-file")
    a = ap.parse_args()
    t = load_file(os.path.join(a.export, "model.safetensors"))
    kw = {"gguf_file": a.gguf_file} if a.gguf_file else {}
    model = AutoModelForCausalLM.from_pretrained(a.checkpoint, dtype=torch.float32, attn_implementation="eager", **kw)
    model.eval()
    layers = model.model.layers if hasattr(model, "model") else model.transformer.h
    dump = {}
    for n, layer in enumerate(layers):
        def keep(module, args, output, n=n):
            dump[f"layers.{n}.output"] = (output[0] if isinstance(output, tuple) else output).detach().contiguous()
        layer.register_forward_hook(keep)
    with torch.no_grad():
        out = model(input_ids=t["input_ids"], attention_mask=t["attention_mask"], use_cache=False)
    dump["logits"] = out.logits.detach().contiguous()
    save_file(dump, a.out)


if __name__ == "__main__":
    main()
