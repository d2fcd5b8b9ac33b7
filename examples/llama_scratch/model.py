"""A Llama decoder layer written from scratch in PyTorch, as a tutorial writes it.

Pure PyTorch, no tparity in it: the maps at the bottom (WEIGHTS, TRANSPOSE, HOOKS, HEAD_SPLIT,
FORWARD) say how a check lines it up with transformers' LlamaDecoderLayer (the reference tparity
holds).

What it supports: RMSNorm, rotary (rotate_half pairs) from a precomputed cos/sin table, grouped-query
attention (kv heads repeated with repeat_interleave), a SwiGLU MLP, one fused causal
scaled_dot_product_attention call; head_dim = hidden / heads; positions 0..T-1 (no position ids, no
padding mask, no KV cache). Slips, planted on request:
  slip="float32-rope"   the rotary cos/sin table computed in float32 even when the model runs in float64
  slip="swapped-heads"  q, k, v split as view(B, T, head_dim, H) instead of view(B, T, H, head_dim)
"""
import torch
import torch.nn as nn
import torch.nn.functional as F

SLIPS = (None, "float32-rope", "swapped-heads")


class RMSNorm(nn.Module):
    def __init__(self, dim, eps=1e-6):
        super().__init__()
        self.eps = eps
        self.weight = nn.Parameter(torch.ones(dim))

    def forward(self, x):
        # x * rsqrt(mean(x^2) + eps), eps inside the root
        return self.weight * (x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + self.eps))


def rope_table(head_dim, max_seq, theta, dtype):
    """cos, sin: (max_seq, head_dim), each frequency written twice (the rotate_half convention)."""
    inv_freq = 1.0 / (theta ** (torch.arange(0, head_dim, 2, dtype=dtype) / head_dim))  # (head_dim/2,)
    t = torch.arange(max_seq, dtype=dtype)  # (max_seq,)
    freqs = torch.outer(t, inv_freq)  # (max_seq, head_dim/2)
    emb = torch.cat((freqs, freqs), dim=-1)  # (max_seq, head_dim)
    return emb.cos(), emb.sin()


def rotate_half(x):
    x1, x2 = x.chunk(2, dim=-1)
    return torch.cat((-x2, x1), dim=-1)


class Rotary(nn.Module):
    def __init__(self, head_dim, max_seq, theta, slip=None):
        super().__init__()
        self.head_dim, self.max_seq, self.theta, self.slip = head_dim, max_seq, theta, slip

    def forward(self, x):
        # x: (B, H, T, head_dim), positions 0..T-1
        T = x.shape[2]
        table_dtype = torch.float32 if self.slip == "float32-rope" else x.dtype
        cos, sin = rope_table(self.head_dim, self.max_seq, self.theta, table_dtype)
        cos, sin = cos[:T].to(x.dtype), sin[:T].to(x.dtype)  # (T, head_dim), broadcast over B and H
        return x * cos + rotate_half(x) * sin


class Attention(nn.Module):
    def __init__(self, dim, n_heads, n_kv_heads, max_seq, theta, bias=False, slip=None):
        super().__init__()
        assert dim % n_heads == 0 and n_heads % n_kv_heads == 0
        self.n_heads, self.n_kv_heads, self.head_dim = n_heads, n_kv_heads, dim // n_heads
        self.slip = slip
        self.q_proj = nn.Linear(dim, n_heads * self.head_dim, bias=bias)
        self.k_proj = nn.Linear(dim, n_kv_heads * self.head_dim, bias=bias)
        self.v_proj = nn.Linear(dim, n_kv_heads * self.head_dim, bias=bias)
        self.o_proj = nn.Linear(n_heads * self.head_dim, dim, bias=bias)
        self.rotary_q = Rotary(self.head_dim, max_seq, theta, slip)
        self.rotary_k = Rotary(self.head_dim, max_seq, theta, slip)

    def split_heads(self, x, heads):
        # (B, T, heads * head_dim) -> (B, heads, T, head_dim)
        B, T, _ = x.shape
        if self.slip == "swapped-heads":
            return x.view(B, T, self.head_dim, heads).permute(0, 3, 1, 2)
        return x.view(B, T, heads, self.head_dim).transpose(1, 2)

    def forward(self, x):
        B, T, _ = x.shape
        q = self.split_heads(self.q_proj(x), self.n_heads)  # (B, H, T, hd)
        k = self.split_heads(self.k_proj(x), self.n_kv_heads)  # (B, Hkv, T, hd)
        v = self.split_heads(self.v_proj(x), self.n_kv_heads)  # (B, Hkv, T, hd)
        q, k = self.rotary_q(q), self.rotary_k(k)
        rep = self.n_heads // self.n_kv_heads  # query head h reads kv head h // rep
        k = k.repeat_interleave(rep, dim=1)  # (B, H, T, hd)
        v = v.repeat_interleave(rep, dim=1)
        y = F.scaled_dot_product_attention(q, k, v, is_causal=True)  # (B, H, T, hd)
        y = y.transpose(1, 2).contiguous().view(B, T, self.n_heads * self.head_dim)
        return self.o_proj(y)


class MLP(nn.Module):
    def __init__(self, dim, hidden, bias=False):
        super().__init__()
        self.gate_proj = nn.Linear(dim, hidden, bias=bias)
        self.up_proj = nn.Linear(dim, hidden, bias=bias)
        self.down_proj = nn.Linear(hidden, dim, bias=bias)
        self.act = nn.SiLU()

    def forward(self, x):
        return self.down_proj(self.act(self.gate_proj(x)) * self.up_proj(x))  # SwiGLU


class DecoderLayer(nn.Module):
    def __init__(self, dim=64, n_heads=4, n_kv_heads=2, hidden=172, eps=1e-6, theta=10000.0, max_seq=2048,
                 attention_bias=False, mlp_bias=False, slip=None):
        super().__init__()
        if slip not in SLIPS:
            raise ValueError(f"slip: expected one of {SLIPS}, got {slip!r}")
        self.input_layernorm = RMSNorm(dim, eps)
        self.self_attn = Attention(dim, n_heads, n_kv_heads, max_seq, theta, attention_bias, slip)
        self.post_attention_layernorm = RMSNorm(dim, eps)
        self.mlp = MLP(dim, hidden, mlp_bias)

    def forward(self, x):
        h = x + self.self_attn(self.input_layernorm(x))
        return h + self.mlp(self.post_attention_layernorm(h))


def from_config(config, slip=None):
    """The layer for a problem's config (transformers' LlamaConfig names); refuses what it lacks."""
    dim, heads = config["hidden_size"], config["num_attention_heads"]
    if config.get("head_dim", dim // heads) != dim // heads:
        raise ValueError(f"head_dim must be hidden / heads = {dim // heads}, got {config['head_dim']}")
    if config.get("decode_steps", 0) or config.get("rope_convention", "half") != "half" or \
            config.get("partial_rotary_factor", 1.0) != 1.0:
        raise ValueError("no decode, half-split rotary over the whole head only")
    return DecoderLayer(dim, heads, config.get("num_key_value_heads", heads), config["intermediate_size"],
                        config.get("rms_norm_eps", 1e-6), config.get("rope_theta", 10000.0),
                        config.get("max_position_embeddings", 2048), config.get("attention_bias", False),
                        config.get("mlp_bias", False), slip)


# How a check lines this model up with transformers' LlamaDecoderLayer:
# the reference's state_dict name -> this model's parameter name (same names: none transposed).
WEIGHTS = {
    "input_layernorm.weight": "input_layernorm.weight",
    "self_attn.q_proj.weight": "self_attn.q_proj.weight",
    "self_attn.k_proj.weight": "self_attn.k_proj.weight",
    "self_attn.v_proj.weight": "self_attn.v_proj.weight",
    "self_attn.o_proj.weight": "self_attn.o_proj.weight",
    "post_attention_layernorm.weight": "post_attention_layernorm.weight",
    "mlp.gate_proj.weight": "mlp.gate_proj.weight",
    "mlp.up_proj.weight": "mlp.up_proj.weight",
    "mlp.down_proj.weight": "mlp.down_proj.weight",
}
# With attention_bias / mlp_bias the biases map likewise ("self_attn.q_proj.bias", ...).
TRANSPOSE = []  # nn.Linear on both sides
# The forward call: the problem's input name -> the forward() argument (no position_ids, no padding).
FORWARD = {"hidden_states": "x"}
# Canonical component (tparity components --case llama --config decode_steps=0) -> the submodule whose
# forward output it is, already in the canonical layout.
HOOKS = {
    "input_layernorm": "input_layernorm",
    "attn.q_rot": "self_attn.rotary_q",
    "attn.k_rot": "self_attn.rotary_k",
    "attn.output": "self_attn.o_proj",
    "post_attention_layernorm": "post_attention_layernorm",
    "mlp.gate": "mlp.gate_proj",
    "mlp.up": "mlp.up_proj",
    "mlp.down": "mlp.down_proj",
    "output": "",  # the layer itself
}
# Components that are a submodule's output (B, T, heads * head_dim) split into heads:
# view(B, T, heads, head_dim).transpose(1, 2) gives the canonical (B, heads, T, head_dim).
HEAD_SPLIT = {"attn.q": "self_attn.q_proj", "attn.k": "self_attn.k_proj", "attn.v": "self_attn.v_proj"}
# Components that are the input of a submodule (a forward pre-hook): component -> submodule.
HOOK_INPUTS = {
    "attn.context": "self_attn.o_proj",  # the heads side by side, before o_proj
    "attn_residual": "post_attention_layernorm",  # x + attention
    "mlp.act": "mlp.down_proj",  # silu(gate) * up
}
