#!/usr/bin/python3
"""Export tparity fixtures (format v2) of the attention classes of "Build a Large Language Model
(From Scratch)", chapter 3 (public repository rasbt/LLMs-from-scratch, ch03/): SelfAttention_v1,
SelfAttention_v2, CausalAttention, MultiHeadAttentionWrapper and MultiHeadAttention, written below as
the book writes them (the wrapper with the out_proj of the book's bonus code,
ch03/02_bonus_efficient-multihead-attention/ch03.py), dropout 0.

Each fixture holds the class's constructor arguments ("config"), its state_dict (the book's names:
W_query, W_query.weight, heads.0.mask, out_proj.bias, ...), the input x, the outputs in float64 and
float32, and every component the comparator names (q, k, v, scores, attn_weights, context, output):
taken from a line-by-line replay of forward() that the script checks bit for bit against the class's
own output in both precisions. The float64 module is a copy.deepcopy(...).double() of the float32 one,
so both see the same values.

  .venv/bin/python scripts/export_book_fixtures.py    -> fixtures/torch-2.13/book_*.json
  /usr/bin/python3 scripts/export_book_fixtures.py    -> fixtures/torch-1.13/book_*.json
"""

import argparse
import copy
import os
import sys

import torch
import torch.nn as nn

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import export_fixtures as ef  # noqa: E402  (the fixture format's serialisation, threads, reference)


# ---------------------------------------------------------------------------
# The book's classes, as chapter 3 writes them
# ---------------------------------------------------------------------------

class SelfAttention_v1(nn.Module):
    def __init__(self, d_in, d_out):
        super().__init__()
        self.W_query = nn.Parameter(torch.rand(d_in, d_out))
        self.W_key = nn.Parameter(torch.rand(d_in, d_out))
        self.W_value = nn.Parameter(torch.rand(d_in, d_out))

    def forward(self, x):
        keys = x @ self.W_key
        queries = x @ self.W_query
        values = x @ self.W_value
        attn_scores = queries @ keys.T  # omega
        attn_weights = torch.softmax(attn_scores / keys.shape[-1]**0.5, dim=-1)
        context_vec = attn_weights @ values
        return context_vec


class SelfAttention_v2(nn.Module):
    def __init__(self, d_in, d_out, qkv_bias=False):
        super().__init__()
        self.W_query = nn.Linear(d_in, d_out, bias=qkv_bias)
        self.W_key = nn.Linear(d_in, d_out, bias=qkv_bias)
        self.W_value = nn.Linear(d_in, d_out, bias=qkv_bias)

    def forward(self, x):
        keys = self.W_key(x)
        queries = self.W_query(x)
        values = self.W_value(x)
        attn_scores = queries @ keys.T
        attn_weights = torch.softmax(attn_scores / keys.shape[-1]**0.5, dim=-1)
        context_vec = attn_weights @ values
        return context_vec


class CausalAttention(nn.Module):
    def __init__(self, d_in, d_out, context_length, dropout, qkv_bias=False):
        super().__init__()
        self.d_out = d_out
        self.W_query = nn.Linear(d_in, d_out, bias=qkv_bias)
        self.W_key = nn.Linear(d_in, d_out, bias=qkv_bias)
        self.W_value = nn.Linear(d_in, d_out, bias=qkv_bias)
        self.dropout = nn.Dropout(dropout)
        self.register_buffer("mask", torch.triu(torch.ones(context_length, context_length), diagonal=1))

    def forward(self, x):
        b, num_tokens, d_in = x.shape
        keys = self.W_key(x)
        queries = self.W_query(x)
        values = self.W_value(x)
        attn_scores = queries @ keys.transpose(1, 2)
        attn_scores.masked_fill_(self.mask.bool()[:num_tokens, :num_tokens], -torch.inf)
        attn_weights = torch.softmax(attn_scores / keys.shape[-1]**0.5, dim=-1)
        attn_weights = self.dropout(attn_weights)
        context_vec = attn_weights @ values
        return context_vec


class MultiHeadAttentionWrapper(nn.Module):
    def __init__(self, d_in, d_out, context_length, dropout, num_heads, qkv_bias=False):
        super().__init__()
        self.heads = nn.ModuleList(
            [CausalAttention(d_in, d_out, context_length, dropout, qkv_bias) for _ in range(num_heads)])
        self.out_proj = nn.Linear(d_out * num_heads, d_out * num_heads)

    def forward(self, x):
        context_vec = torch.cat([head(x) for head in self.heads], dim=-1)
        return self.out_proj(context_vec)


class MultiHeadAttention(nn.Module):
    def __init__(self, d_in, d_out, context_length, dropout, num_heads, qkv_bias=False):
        super().__init__()
        assert d_out % num_heads == 0, "d_out must be divisible by num_heads"
        self.d_out = d_out
        self.num_heads = num_heads
        self.head_dim = d_out // num_heads
        self.W_query = nn.Linear(d_in, d_out, bias=qkv_bias)
        self.W_key = nn.Linear(d_in, d_out, bias=qkv_bias)
        self.W_value = nn.Linear(d_in, d_out, bias=qkv_bias)
        self.out_proj = nn.Linear(d_out, d_out)
        self.dropout = nn.Dropout(dropout)
        self.register_buffer("mask", torch.triu(torch.ones(context_length, context_length), diagonal=1))

    def forward(self, x):
        b, num_tokens, d_in = x.shape
        keys = self.W_key(x)
        queries = self.W_query(x)
        values = self.W_value(x)
        keys = keys.view(b, num_tokens, self.num_heads, self.head_dim)
        values = values.view(b, num_tokens, self.num_heads, self.head_dim)
        queries = queries.view(b, num_tokens, self.num_heads, self.head_dim)
        keys = keys.transpose(1, 2)
        queries = queries.transpose(1, 2)
        values = values.transpose(1, 2)
        attn_scores = queries @ keys.transpose(2, 3)
        mask_bool = self.mask.bool()[:num_tokens, :num_tokens]
        attn_scores.masked_fill_(mask_bool, -torch.inf)
        attn_weights = torch.softmax(attn_scores / keys.shape[-1]**0.5, dim=-1)
        attn_weights = self.dropout(attn_weights)
        context_vec = (attn_weights @ values).transpose(1, 2)
        context_vec = context_vec.contiguous().view(b, num_tokens, self.d_out)
        context_vec = self.out_proj(context_vec)
        return context_vec


# ---------------------------------------------------------------------------
# The replay: forward() line by line, collecting the components (batched, per head)
# ---------------------------------------------------------------------------

def _attend(head, q, k, v, masked):
    """One head's scores (masked, divided), weights and context, as the class computes them."""
    scores = q @ k.transpose(-2, -1)
    if masked:
        n = q.shape[-2]
        scores = scores.masked_fill(head.mask.bool()[:n, :n], -torch.inf)
    scaled = scores / k.shape[-1]**0.5
    weights = torch.softmax(scaled, dim=-1)
    return scaled, weights, weights @ v


def replay(module, x):
    c = {}
    if isinstance(module, (SelfAttention_v1, SelfAttention_v2, CausalAttention)):
        if isinstance(module, SelfAttention_v1):
            q, k, v = x @ module.W_query, x @ module.W_key, x @ module.W_value
        else:
            q, k, v = module.W_query(x), module.W_key(x), module.W_value(x)
        scaled, weights, ctx = _attend(module, q, k, v, isinstance(module, CausalAttention))
        one = (lambda t: t.unsqueeze(0)) if x.dim() == 2 else (lambda t: t)
        for name, t in (("q", q), ("k", k), ("v", v), ("scores", scaled), ("attn_weights", weights)):
            c[name] = one(t).unsqueeze(1)
        c["output"] = one(ctx)
        return ctx, c
    if isinstance(module, MultiHeadAttentionWrapper):
        parts = [(h.W_query(x), h.W_key(x), h.W_value(x), h) for h in module.heads]
        att = [_attend(h, q, k, v, True) for q, k, v, h in parts]
        for i, name in enumerate(("q", "k", "v")):
            c[name] = torch.stack([p[i] for p in parts], 1)
        c["scores"] = torch.stack([a[0] for a in att], 1)
        c["attn_weights"] = torch.stack([a[1] for a in att], 1)
        c["context"] = torch.cat([a[2] for a in att], dim=-1)
        out = module.out_proj(c["context"])
        c["output"] = out
        return out, c
    b, n, _ = x.shape
    split = lambda t: t.view(b, n, module.num_heads, module.head_dim).transpose(1, 2)  # noqa: E731
    q, k, v = split(module.W_query(x)), split(module.W_key(x)), split(module.W_value(x))
    scaled, weights, ctx = _attend(module, q, k, v, True)
    c.update(q=q, k=k, v=v, scores=scaled, attn_weights=weights)
    c["context"] = ctx.transpose(1, 2).contiguous().view(b, n, module.d_out)
    out = module.out_proj(c["context"])
    c["output"] = out
    return out, c


# ---------------------------------------------------------------------------
# The fixtures
# ---------------------------------------------------------------------------

# The book's six token embeddings ("Your journey starts with one step", chapter 3).
BOOK_INPUTS = [[0.43, 0.15, 0.89], [0.55, 0.87, 0.66], [0.57, 0.85, 0.64],
               [0.22, 0.58, 0.33], [0.77, 0.25, 0.10], [0.05, 0.80, 0.55]]


def book_batch():
    inputs = torch.tensor(BOOK_INPUTS)
    return torch.stack((inputs, inputs), dim=0)  # the book's batch of two


# name -> (seed, class, config, input builder, description)
FIXTURES = {
    "book_selfattn_v1": (
        2001, SelfAttention_v1, {"d_in": 3, "d_out": 2}, lambda: torch.rand(4, 3),
        "Seed 001's experiment: the book's SelfAttention_v1 (raw (d_in, d_out) matrices used as x @ W, "
        "scores divided by sqrt(d_out)) on 4 tokens of d_in 3, weights and inputs from torch.rand."),
    "book_selfattn_v2": (
        2002, SelfAttention_v2, {"d_in": 3, "d_out": 2, "qkv_bias": True}, lambda: torch.tensor(BOOK_INPUTS),
        "The book's SelfAttention_v2 (nn.Linear projections, with qkv_bias) on its six token embeddings."),
    "book_causal": (
        2003, CausalAttention, {"d_in": 3, "d_out": 2, "context_length": 8, "qkv_bias": False}, book_batch,
        "The book's CausalAttention on its batch of two (2, 6, 3), the causal buffer of context_length 8 "
        "sliced to 6 tokens, dropout 0."),
    "book_mha_wrapper": (
        2004, MultiHeadAttentionWrapper,
        {"d_in": 3, "d_out": 2, "context_length": 6, "num_heads": 2, "qkv_bias": True}, book_batch,
        "The book's MultiHeadAttentionWrapper: two CausalAttention heads of d_out 2 (qkv_bias) "
        "concatenated to 4, then out_proj (4, 4), on its batch of two."),
    "book_mha": (
        2005, MultiHeadAttention,
        {"d_in": 3, "d_out": 4, "context_length": 10, "num_heads": 2, "qkv_bias": True}, book_batch,
        "The book's MultiHeadAttention: q/k/v nn.Linear(3, 4) with qkv_bias split into 2 heads of 2, "
        "the causal buffer of context_length 10, out_proj (4, 4), on its batch of two."),
}


def constructor_args(cls, config):
    args = dict(config)
    if cls in (CausalAttention, MultiHeadAttentionWrapper, MultiHeadAttention):
        args["dropout"] = 0.0
    return args


def make_fixture(name):
    seed, cls, config, make_input, description = FIXTURES[name]
    torch.manual_seed(seed)
    module32 = cls(**constructor_args(cls, config)).eval()
    x32 = make_input().to(torch.float32)
    module64 = copy.deepcopy(module32).double()
    x64 = x32.double()
    outputs, components = {}, {}
    with torch.no_grad():
        for label, module, x in (("float64", module64, x64), ("float32", module32, x32)):
            out = module(x)
            again, comps = replay(module, x)
            # The replay is the class's forward() line by line: the same bits.
            assert torch.equal(again, out), f"{name}: the replay differs from {cls.__name__} ({label})"
            assert torch.equal(comps["output"].reshape(out.shape), out), name
            outputs[label] = out
            components[label] = comps
    sd64 = module64.state_dict()
    for k, v in module32.state_dict().items():
        assert torch.equal(sd64[k], v.double()), k
    rel = ef.l2(outputs["float32"].double() - outputs["float64"]) / ef.l2(outputs["float64"])
    assert rel <= ef.REL_TOL, f"{name}: float32/float64 rel diff {rel:.3e}"
    reference = ef.reference_json(cls.__name__)
    reference["name"] = f"{cls.__name__} (Python, LLMs-from-scratch ch03, as the book writes it)"
    fixture = {
        "format": ef.FORMAT,
        "version": ef.VERSION,
        "name": name,
        "module": cls.__name__,
        "reference": reference,
        "config": config,
        "forward": {},
        "state_dict": {k: ef.tensor_json(v, "float64") for k, v in sd64.items()},
        "inputs": {"x": ef.tensor_json(x64, "float64")},
        "outputs": {"output": ef.tensor_json(outputs["float64"], "float64")},
        "outputs_float32": {"output": ef.tensor_json(outputs["float32"], "float32")},
        "components": {k: ef.tensor_json(v, "float64") for k, v in components["float64"].items()},
        "components_float32": {k: ef.tensor_json(v, "float32") for k, v in components["float32"].items()},
        "description": description,
    }
    return fixture, rel


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--out", default=ef.DEFAULT_OUT, help="output directory (default: %(default)s)")
    ap.add_argument("--only", nargs="+", metavar="NAME", choices=list(FIXTURES))
    args = ap.parse_args(argv)
    if ef.SEM not in ef.SUPPORTED:
        print(f"export_book_fixtures.py: torch {torch.__version__} is not one of {', '.join(ef.SUPPORTED)}",
              file=sys.stderr)
        return 2
    ef.pin_threads()
    os.makedirs(args.out, exist_ok=True)
    print(f"torch {torch.__version__} ({ef.blas_description()}; threads {torch.get_num_threads()})")
    for name in args.only or list(FIXTURES):
        fixture, rel = make_fixture(name)
        path = os.path.join(args.out, name + ".json")
        ef.write_fixture(fixture, path)
        print(f"{name}  {path}  {os.path.getsize(path)} bytes  output float32 vs float64 rel_l2 {rel:.3e}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
