#!/usr/bin/env python3
"""Write a random-weight Hugging Face checkpoint, for export_model.py and its tests.

    .venv/bin/python scripts/make_checkpoint.py --arch llama|mistral|qwen3|gemma2|gpt2|bert
                                                --shape tiny|1b --out DIR [--seed N] [--max-shard-size S]

DIR gets config.json and model.safetensors (or shards and model.safetensors.index.json), written by
transformers' own save_pretrained from a config; no tokenizer. Nothing is loaded from a hub.

  tiny  3 layers, hidden 64, 4 heads (over 2 kv heads where the architecture has kv heads), head_dim 16,
        intermediate 128, vocab 256, max_position_embeddings 256. Per architecture: llama untied
        lm_head, attention_bias false; mistral sliding_window 4, untied; qwen3 tied embeddings;
        gemma2 sliding_window 4 on its sliding layers (0 and 2), query_pre_attn_scalar 16, transformers'
        soft-caps (attention 50, final 30), tied; gpt2 tied (always); bert a BertModel with its pooler.
  1b    LlamaForCausalLM: 16 layers, hidden 2048, 32 heads over 8 kv heads (head_dim 64), intermediate
        8192, vocab 32000, untied lm_head: 1.10e9 float32 parameters, 4.4 GB.

Weights: the model is built on the meta device (transformers' own init never runs: it takes minutes at 1b),
then every tensor is drawn in float32 from one torch.Generator seeded with --seed, in state_dict order, so
the checkpoint is a function of (arch, shape, seed) alone. The scales keep activations O(1) through the
depth without making a layer an identity: token and position embeddings N(0, 1); every weight matrix
N(0, 0.8 / sqrt(fan_in)) (0.1 at hidden 64, 0.018 at 2048); biases N(0, 0.02); norm weights 1 + N(0, 0.1)
(Gemma2's, which multiply by 1 + weight, N(0, 0.1)), norm biases N(0, 0.1).

Exit codes: 0 written; 2 bad arguments or output directory (one line on stderr).
"""
import argparse
import math
import os
import sys

PROG = "make_checkpoint"
ARCHS = ("llama", "mistral", "qwen3", "gemma2", "gpt2", "bert")
SHAPES = ("tiny", "1b")


class UsageError(Exception):
    pass


class OneLineParser(argparse.ArgumentParser):
    def error(self, message):
        raise UsageError(message)


def parse_args(argv):
    ap = OneLineParser(prog="make_checkpoint.py", description=__doc__.split("\n")[0])
    ap.add_argument("--arch", required=True, choices=ARCHS)
    ap.add_argument("--shape", required=True, choices=SHAPES)
    ap.add_argument("--out", required=True, metavar="DIR")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--max-shard-size", default=None, metavar="SIZE",
                    help="passed to save_pretrained (e.g. 100KB, to write shards and an index); "
                         "default: transformers' own")
    args = ap.parse_args(argv)
    if args.shape == "1b" and args.arch != "llama":
        raise UsageError(f"--shape 1b: only --arch llama has a 1b shape, got --arch {args.arch}")
    if not 0 <= args.seed < 2**63:
        raise UsageError(f"--seed {args.seed}: expected an integer in [0, 2^63)")
    if os.path.lexists(args.out):
        if not os.path.isdir(args.out) or os.path.islink(args.out):
            raise UsageError(f"--out {args.out}: exists and is not a directory")
        if os.listdir(args.out):
            raise UsageError(f"--out {args.out}: exists and is not empty")
    return args


def make_config(arch, shape):
    import transformers as T
    if shape == "1b":
        return T.LlamaConfig(vocab_size=32000, hidden_size=2048, intermediate_size=8192, num_hidden_layers=16,
                             num_attention_heads=32, num_key_value_heads=8, head_dim=64,
                             max_position_embeddings=2048, rms_norm_eps=1e-5, rope_theta=500000.0,
                             tie_word_embeddings=False, attention_bias=False, bos_token_id=1, eos_token_id=2)
    common = dict(vocab_size=256, hidden_size=64, intermediate_size=128, num_hidden_layers=3,
                  num_attention_heads=4, max_position_embeddings=256)
    decoder = dict(common, num_key_value_heads=2, head_dim=16, rms_norm_eps=1e-6, rope_theta=10000.0,
                   bos_token_id=1, eos_token_id=2)
    if arch == "llama":
        return T.LlamaConfig(**decoder, tie_word_embeddings=False, attention_bias=False)
    if arch == "mistral":
        return T.MistralConfig(**decoder, sliding_window=4, tie_word_embeddings=False)
    if arch == "qwen3":
        return T.Qwen3Config(**decoder, tie_word_embeddings=True, attention_bias=False)
    if arch == "gemma2":
        return T.Gemma2Config(**decoder, sliding_window=4, query_pre_attn_scalar=16, attn_logit_softcapping=50.0,
                              final_logit_softcapping=30.0, tie_word_embeddings=True, pad_token_id=0)
    if arch == "gpt2":
        return T.GPT2Config(vocab_size=256, n_positions=256, n_embd=64, n_layer=3, n_head=4, n_inner=128,
                            layer_norm_epsilon=1e-5, bos_token_id=1, eos_token_id=2)
    return T.BertConfig(**common, hidden_act="gelu", layer_norm_eps=1e-12, type_vocab_size=2)


def model_class(arch):
    import transformers as T
    return {"llama": T.LlamaForCausalLM, "mistral": T.MistralForCausalLM, "qwen3": T.Qwen3ForCausalLM,
            "gemma2": T.Gemma2ForCausalLM, "gpt2": T.GPT2LMHeadModel, "bert": T.BertModel}[arch]


def fill(model, arch, seed):
    """Every parameter drawn in float32 from one generator, in state_dict order (tied ones once)."""
    import torch
    import transformers as T
    g = torch.Generator().manual_seed(seed)
    modules = dict(model.named_modules())
    seen = set()
    with torch.no_grad():
        for name, p in model.named_parameters(remove_duplicate=True):
            if id(p) in seen:
                continue
            seen.add(id(p))
            owner = modules[name.rsplit(".", 1)[0]] if "." in name else model
            leaf = name.rsplit(".", 1)[-1]
            is_norm = isinstance(owner, torch.nn.LayerNorm) or "norm" in type(owner).__name__.lower()
            if isinstance(owner, torch.nn.Embedding):
                std, base = 1.0, 0.0
            elif is_norm:
                std = 0.1
                base = 1.0 if leaf == "weight" and arch != "gemma2" else 0.0
            elif p.dim() == 2:
                fan_in = p.shape[0] if isinstance(owner, T.pytorch_utils.Conv1D) else p.shape[1]
                std, base = 0.8 / math.sqrt(fan_in), 0.0
            else:
                std, base = 0.02, 0.0
            p.copy_(base + std * torch.randn(p.shape, generator=g, dtype=torch.float32))


def main(argv=None):
    try:
        args = parse_args(sys.argv[1:] if argv is None else argv)
    except UsageError as e:
        print(f"{PROG}: {e}", file=sys.stderr)
        return 2
    os.environ["HF_HUB_OFFLINE"] = "1"
    os.environ["TRANSFORMERS_OFFLINE"] = "1"
    os.environ["HF_HUB_DISABLE_PROGRESS_BARS"] = "1"
    import torch
    import transformers
    torch.set_num_threads(1)
    transformers.utils.logging.set_verbosity_error()
    transformers.utils.logging.disable_progress_bar()

    config = make_config(args.arch, args.shape)
    config.dtype = torch.float32
    with torch.device("meta"):
        model = model_class(args.arch)(config)
    model.to_empty(device="cpu")
    if getattr(config, "tie_word_embeddings", False):
        model.tie_weights()  # to_empty made every module's parameter its own
    fill(model, args.arch, args.seed)
    model.eval()
    kwargs = {} if args.max_shard_size is None else {"max_shard_size": args.max_shard_size}
    try:
        os.makedirs(args.out, exist_ok=True)
        model.save_pretrained(args.out, safe_serialization=True, **kwargs)
    except (OSError, ValueError) as e:
        print(f"{PROG}: --out {args.out}: {e}", file=sys.stderr)
        return 2
    n = sum(p.numel() for p in model.parameters())
    print(f"{PROG}: {args.arch} {args.shape} seed {args.seed}: {n} parameters written to {args.out}", file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main())
