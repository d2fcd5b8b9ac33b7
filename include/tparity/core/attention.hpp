// Scaled dot-product attention and multi-head attention with the semantics of torch 1.13 or 2.x.
#pragma once

#include <cstdint>
#include <optional>

#include "tparity/core/observer.hpp"
#include "tparity/core/tensor.hpp"

namespace tparity {

// Where PyTorch versions differ in what tparity mirrors (README, "What changed between 1.13 and 2.13"):
//  - merging attn_mask and key_padding_mask: 1.13 ORs the key padding mask into a bool attn_mask (a
//    nonzero float key counts as true), fills it as -inf into a float one, and cannot combine two
//    float masks; 2.x makes each mask additive on its own (bool: -inf where true) and adds them;
//  - a query row whose every score is -inf: 1.13's softmax gives NaN; 2.x's
//    scaled_dot_product_attention (MultiheadAttention with need_weights=False, hence every encoder
//    and decoder layer, and F.scaled_dot_product_attention) gives zero weights, so a zero context.
//    2.x's need_weights=True path keeps the plain softmax and its NaN.
enum class TorchSemantics { Torch113, Torch2 };
const char* semantics_name(TorchSemantics s);  // "torch 1.13", "torch 2.x"

// ---- the steps, each on G independent (batch x head) groups, gemma.cpp style -------------------

// QDotK, einsum 'GLE,GSE->GLS': scores[g,i,j] = q[g,i,:] . k[g,j,:]
// Fast: a strided-batched gemm (q k^T). Reference (qdotk_ref): one dot() per score.
template <class T>
void qdotk(T* scores, const T* q, const T* k, int64_t G, int64_t L, int64_t S, int64_t E);
template <class T>
void qdotk_ref(T* scores, const T* q, const T* k, int64_t G, int64_t L, int64_t S, int64_t E);

// WeightedSumV, einsum 'GLS,GSV->GLV': out[g,i,:] = sum_j w[g,i,j] * v[g,j,:]
// Fast: a strided-batched gemm (w v). Reference (weighted_sum_v_ref): eight interleaved partial sums.
template <class T>
void weighted_sum_v(T* out, const T* w, const T* v, int64_t G, int64_t L, int64_t S, int64_t Ev);
template <class T>
void weighted_sum_v_ref(T* out, const T* w, const T* v, int64_t G, int64_t L, int64_t S, int64_t Ev);

// ---- scaled dot-product attention ----------------------------------------------------------------
// The arguments of torch.nn.functional.scaled_dot_product_attention beyond the tensors (dropout 0):
//   is_causal: only key j <= query i (ones(L, S).tril(), top-left aligned); not with a mask (the math
//     path refuses both);
//   scale: multiplies the scores (any finite value, negative and 0 included); absent: 1/sqrt(E);
//   enable_gqa: k and v carry fewer heads (dim -3) than q, each repeated for Hq / Hkv consecutive query
//     heads (repeat_interleave: query head h reads kv head h / (Hq / Hkv)). torch 2.x only.
struct SdpaOptions {
  bool is_causal = false;
  std::optional<double> scale;
  bool enable_gqa = false;
};

// mirrors seed 004's DotProductAttention: softmax(q @ k^T / sqrt(E) + mask) @ v, the scale applied to
// the scores, and torch's scaled_dot_product_attention's options (above). q is (..., L, E), k is
// (..., S, E), v is (..., S, Ev) with the same leading dims (but the heads, dim -3, with enable_gqa);
// L != S and Ev != E are allowed. mask: absent, or (L, S) bool (true = masked out, as everywhere in
// the core; the harness inverts torch's scaled_dot_product_attention convention) or float (added).
// Returns (..., L, Ev). With Torch2 semantics a row whose every score is -inf gets zero weights
// (scaled_dot_product_attention's safe softmax), with Torch113 NaN.
// Components: scores (..., L, S) scaled and masked, attn_weights (..., L, S), output (..., L, Ev).
template <class T>
Tensor<T> sdpa_forward(const Tensor<T>& q, const Tensor<T>& k, const Tensor<T>& v, const Mask<T>& mask = {},
                       Observer<T>* obs = nullptr, TorchSemantics semantics = TorchSemantics::Torch113,
                       const SdpaOptions& options = {});

// ---- multi-head attention -------------------------------------------------------------------------
// Constructor arguments of torch.nn.MultiheadAttention (dropout is always 0).
struct MhaConfig {
  int64_t embed_dim = 0;
  int64_t num_heads = 1;
  bool bias = true;
  bool add_bias_kv = false;
  bool add_zero_attn = false;
  int64_t kdim = 0;  // 0: embed_dim
  int64_t vdim = 0;  // 0: embed_dim
  bool batch_first = false;
  TorchSemantics semantics = TorchSemantics::Torch113;  // the masks' merge and fully masked rows (above)

  int64_t key_dim() const { return kdim ? kdim : embed_dim; }
  int64_t value_dim() const { return vdim ? vdim : embed_dim; }
  int64_t head_dim() const { return embed_dim / num_heads; }
  // torch's _qkv_same_embed_dim: one packed in_proj_weight, else q/k/v_proj_weight.
  bool packed() const { return key_dim() == embed_dim && value_dim() == embed_dim; }
};

// Non-tensor arguments of MultiheadAttention.forward().
struct MhaForward {
  bool need_weights = true;
  bool average_attn_weights = true;
};

// The parameters, by their state_dict names. An empty tensor is an absent parameter.
template <class T>
struct MhaWeights {
  Tensor<T> in_proj_weight;                               // (3E, E), when packed
  Tensor<T> q_proj_weight, k_proj_weight, v_proj_weight;  // (E, E), (E, kdim), (E, vdim) otherwise
  Tensor<T> in_proj_bias;                                 // (3E), when bias
  Tensor<T> bias_k, bias_v;                               // (1, 1, E), when add_bias_kv
  Tensor<T> out_proj_weight;                              // (E, E)  "out_proj.weight"
  Tensor<T> out_proj_bias;                                // (E)     "out_proj.bias", when bias
};

// forward()'s tensor arguments, laid out as the module takes them: batched (L, B, E) sequence-first
// or (B, L, E) batch_first; unbatched (L, E).
//   attn_mask: (L, S) or (B*num_heads, L, S); bool (true = masked out) or float (added).
//   key_padding_mask: (B, S), or (S) unbatched; bool (true = ignored) or float (added).
template <class T>
struct MhaInputs {
  Tensor<T> query, key, value;
  Mask<T> attn_mask, key_padding_mask;
};

template <class T>
struct MhaOutputs {
  Tensor<T> output;        // as the module returns it: (L, B, E), (B, L, E) or (L, E)
  Tensor<T> attn_weights;  // (B, L, S) averaged or (B, H, L, S) per head; batch dim dropped when
                           // unbatched; empty when need_weights is false
};

// mirrors torch.nn.functional.multi_head_attention_forward, torch 1.13 or 2.x as cfg.semantics says
// (eval, dropout 0): q/k/v projections (packed [q; k; v] or separate), bias_k/bias_v appended to the
// keys and values, heads split as (E) -> (H, E/H), a zero key/value appended per head
// (add_zero_attn), scores q / sqrt(E/H) . k plus the merged masks (1.13: key_padding_mask ORed into a
// bool attn_mask, filled as -inf into a float one; 2.x: both additive, summed), softmax (2.x with
// need_weights=False: rows whose every score is -inf get zero weights), weighted sum of v, heads
// concatenated, out_proj. S below is the key length after bias_kv and zero_attn.
// Components, batched and batch-first whatever the call's layout (B = 1 for unbatched input):
//   q, k, v (B, H, L|S, E/H) projected, per head, q not yet scaled
//   scores (B, H, L, S) scaled and masked, before softmax
//   attn_weights (B, H, L, S) per head
//   attn_weights_avg (B, L, S) only when the call returns averaged weights
//   context (B, L, E) heads concatenated, before out_proj
//   output (B, L, E)
// Throws ShapeError when a tensor's shape contradicts the config, std::invalid_argument for mask
// combinations the semantics leave undefined (1.13: a float key_padding_mask with a float attn_mask,
// whose key padding mask torch 1.13's masked_fill silently ignores for most values).
template <class T>
MhaOutputs<T> mha_forward(const MhaConfig& cfg, const MhaForward& fwd, const MhaWeights<T>& w, const MhaInputs<T>& in,
                          Observer<T>* obs = nullptr);

namespace detail {
// mha_forward's inputs by reference, for the core's own blocks (no copies of the tensors).
template <class T>
struct MhaInputRefs {
  const Tensor<T>& query;
  const Tensor<T>& key;
  const Tensor<T>& value;
  const Mask<T>& attn_mask;
  const Mask<T>& key_padding_mask;
};
// mha_forward, plus a residual: when not null, residual, laid out as the output (batched: (B, L, E)
// with cfg.batch_first, else (L, B, E)), is added to it (residual + attention, as the encoder and
// decoder layers' x + _sa_block(x)); the observer still sees the attention's own output.
template <class T>
MhaOutputs<T> mha_attend(const MhaConfig& cfg, const MhaForward& fwd, const MhaWeights<T>& w, const MhaInputRefs<T>& in,
                         Observer<T>* obs, const T* residual);
}  // namespace detail

}  // namespace tparity
