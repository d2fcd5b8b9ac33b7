"""A GPT-2 block written from scratch, the way nanoGPT (karpathy/nanoGPT, model.py) writes it.

Pure PyTorch, no tparity in it: the maps at the bottom (WEIGHTS, TRANSPOSE, HOOKS, FORWARD) say how a
check lines it up with Hugging Face's GPT2Block (the reference tparity holds).

What it supports: causal self-attention over a whole sequence in one call, no padding mask, no KV
cache. slip="exact-gelu" plants the classic slip: the MLP's GELU is the exact erf one, where GPT-2
uses the tanh approximation (transformers' gelu_new).
"""
import math

import torch
import torch.nn as nn
import torch.nn.functional as F


class Config:
    def __init__(self, n_embd=64, n_head=4, n_inner=None, layer_norm_epsilon=1e-5, bias=True):
        self.n_embd = n_embd
        self.n_head = n_head
        self.n_inner = n_inner or 4 * n_embd
        self.layer_norm_epsilon = layer_norm_epsilon
        self.bias = bias


class CausalSelfAttention(nn.Module):
    def __init__(self, config):
        super().__init__()
        assert config.n_embd % config.n_head == 0
        # key, query, value projections for all heads, in one batch
        self.c_attn = nn.Linear(config.n_embd, 3 * config.n_embd, bias=config.bias)
        # output projection
        self.c_proj = nn.Linear(config.n_embd, config.n_embd, bias=config.bias)
        self.n_head = config.n_head
        self.n_embd = config.n_embd

    def forward(self, x):
        B, T, C = x.size()  # batch size, sequence length, embedding dimensionality (n_embd)
        q, k, v = self.c_attn(x).split(self.n_embd, dim=2)
        # (B, T, C) -> (B, nh, T, hs)
        q = q.view(B, T, self.n_head, C // self.n_head).transpose(1, 2)
        k = k.view(B, T, self.n_head, C // self.n_head).transpose(1, 2)
        v = v.view(B, T, self.n_head, C // self.n_head).transpose(1, 2)
        # causal self-attention, fused: (B, nh, T, hs) x (B, nh, hs, T) -> (B, nh, T, T) -> (B, nh, T, hs)
        y = F.scaled_dot_product_attention(q, k, v, attn_mask=None, dropout_p=0.0, is_causal=True)
        y = y.transpose(1, 2).contiguous().view(B, T, C)  # re-assemble all head outputs side by side
        return self.c_proj(y)


class NewGELU(nn.Module):
    """GPT-2's GELU: the tanh approximation."""

    def forward(self, x):
        return 0.5 * x * (1.0 + torch.tanh(math.sqrt(2.0 / math.pi) * (x + 0.044715 * torch.pow(x, 3.0))))


class MLP(nn.Module):
    def __init__(self, config, slip=None):
        super().__init__()
        self.c_fc = nn.Linear(config.n_embd, config.n_inner, bias=config.bias)
        self.act = nn.GELU() if slip == "exact-gelu" else NewGELU()  # nn.GELU(): erf, not GPT-2's
        self.c_proj = nn.Linear(config.n_inner, config.n_embd, bias=config.bias)

    def forward(self, x):
        return self.c_proj(self.act(self.c_fc(x)))


class Block(nn.Module):
    def __init__(self, config, slip=None):
        super().__init__()
        if slip not in (None, "exact-gelu"):
            raise ValueError(f"slip: expected None or 'exact-gelu', got {slip!r}")
        self.ln_1 = nn.LayerNorm(config.n_embd, eps=config.layer_norm_epsilon)
        self.attn = CausalSelfAttention(config)
        self.ln_2 = nn.LayerNorm(config.n_embd, eps=config.layer_norm_epsilon)
        self.mlp = MLP(config, slip)

    def forward(self, x):
        x = x + self.attn(self.ln_1(x))
        x = x + self.mlp(self.ln_2(x))
        return x


def from_config(config, slip=None):
    """The block for a problem's config (transformers' GPT2Config names)."""
    return Block(
        Config(
            n_embd=config["hidden_size"],
            n_head=config["num_attention_heads"],
            n_inner=config.get("n_inner"),
            layer_norm_epsilon=config.get("layer_norm_epsilon", 1e-5),
        ),
        slip,
    )


# How a check lines this model up with transformers' GPT2Block:
# the reference's state_dict name -> this model's parameter name.
WEIGHTS = {
    "ln_1.weight": "ln_1.weight",
    "ln_1.bias": "ln_1.bias",
    "attn.c_attn.weight": "attn.c_attn.weight",
    "attn.c_attn.bias": "attn.c_attn.bias",
    "attn.c_proj.weight": "attn.c_proj.weight",
    "attn.c_proj.bias": "attn.c_proj.bias",
    "ln_2.weight": "ln_2.weight",
    "ln_2.bias": "ln_2.bias",
    "mlp.c_fc.weight": "mlp.c_fc.weight",
    "mlp.c_fc.bias": "mlp.c_fc.bias",
    "mlp.c_proj.weight": "mlp.c_proj.weight",
    "mlp.c_proj.bias": "mlp.c_proj.bias",
}
# GPT-2's Conv1D stores (in, out); nn.Linear stores (out, in): these reference weights go in transposed.
TRANSPOSE = ["attn.c_attn.weight", "attn.c_proj.weight", "mlp.c_fc.weight", "mlp.c_proj.weight"]
# The forward call: the problem's input name -> the forward() argument, in order (no key_padding_mask:
# the model has no padding).
FORWARD = {"hidden_states": "x"}
# Canonical component (tparity components --case gpt2) -> the submodule whose forward output it is.
# The fused SDPA call gives no scores or weights: those components are not hooked.
HOOKS = {
    "ln_1": "ln_1",
    "attn.output": "attn.c_proj",
    "ln_2": "ln_2",
    "mlp.fc": "mlp.c_fc",
    "mlp.act": "mlp.act",
    "mlp.proj": "mlp.c_proj",
    "output": "",  # the block itself
}
# Components that are one third of the fused c_attn's output (B, T, 3 * n_embd), split into heads:
# component -> (submodule, which third); the third viewed (B, T, n_head, head_dim).transpose(1, 2)
# gives the canonical (B, heads, T, head_dim).
FUSED_SPLIT = {"attn.q": ("attn.c_attn", 0), "attn.k": ("attn.c_attn", 1), "attn.v": ("attn.c_attn", 2)}
# Components that are the input of a submodule (a forward pre-hook): component -> submodule.
HOOK_INPUTS = {
    "attn.context": "attn.c_proj",  # the heads side by side, before c_proj
    "attn_residual": "ln_2",  # x + attn(ln_1(x))
}
