// The attention classes of "Build a Large Language Model (From Scratch)", chapter 3 (public repository
// rasbt/LLMs-from-scratch, ch03/01_main-chapter-code/ch03.ipynb and
// ch03/02_bonus_efficient-multihead-attention/ch03.py): what a very large number of learners write
// first. They differ from torch.nn.MultiheadAttention in ways that trip people:
//   - SelfAttention_v1 keeps raw parameter matrices W_query, W_key, W_value of shape (d_in, d_out) and
//     computes x @ W (not x @ W^T as nn.Linear does); unbatched x (T, d_in); no mask, no out_proj;
//   - SelfAttention_v2: the same with nn.Linear(d_in, d_out, bias=qkv_bias) (weight (d_out, d_in));
//   - CausalAttention: batched x (B, T, d_in); the causal mask is a buffer `mask`,
//     triu(ones(context_length, context_length), 1), whose nonzeros fill the scores with -inf
//     (mask.bool()[:T, :T]) before the scaling;
//   - MultiHeadAttentionWrapper: num_heads CausalAttention heads of d_out each, concatenated to
//     num_heads * d_out, then out_proj (num_heads * d_out, num_heads * d_out) with bias;
//   - MultiHeadAttention: separate q/k/v nn.Linear(d_in, d_out) split into num_heads heads of
//     d_out / num_heads, the causal buffer, out_proj (d_out, d_out) with bias.
// Every class divides the scores by keys.shape[-1] ** 0.5: the width of a head's keys (d_out, or
// d_out / num_heads), never d_in and never d_model as torch's heads do. Dropout is 0 (eval).
#pragma once

#include <cstdint>
#include <vector>

#include "tparity/core/observer.hpp"
#include "tparity/core/tensor.hpp"

namespace tparity {

enum class BookClass {
  SelfAttentionV1,
  SelfAttentionV2,
  CausalAttention,
  MultiHeadAttentionWrapper,
  MultiHeadAttention
};

// Constructor arguments (the book's names). context_length is the mask buffer's size (the book's
// block_size in the bonus code); T must not exceed it.
struct BookConfig {
  BookClass cls = BookClass::SelfAttentionV1;
  int64_t d_in = 0;
  int64_t d_out = 0;
  int64_t context_length = 0;  // CausalAttention, the wrapper, MultiHeadAttention
  int64_t num_heads = 1;       // the wrapper, MultiHeadAttention
  bool qkv_bias = false;       // every class but SelfAttention_v1

  bool batched() const { return cls != BookClass::SelfAttentionV1 && cls != BookClass::SelfAttentionV2; }
  bool masked() const { return batched(); }
  int64_t heads() const {
    return cls == BookClass::MultiHeadAttentionWrapper || cls == BookClass::MultiHeadAttention ? num_heads : 1;
  }
  int64_t head_dim() const { return cls == BookClass::MultiHeadAttention ? d_out / num_heads : d_out; }
  int64_t out_dim() const { return cls == BookClass::MultiHeadAttentionWrapper ? num_heads * d_out : d_out; }
  bool has_out_proj() const {
    return cls == BookClass::MultiHeadAttentionWrapper || cls == BookClass::MultiHeadAttention;
  }
};

// The parameters of one head's projections (or of MultiHeadAttention's), by state_dict name:
// SelfAttention_v1's W_query (d_in, d_out) as the class holds it; the others' W_query.weight
// (d_out, d_in) and W_query.bias (d_out) when qkv_bias. An empty tensor is an absent parameter.
template <class T>
struct BookProjections {
  Tensor<T> w_query, w_key, w_value;
  Tensor<T> b_query, b_key, b_value;
  Tensor<T> mask;  // the causal buffer (context_length, context_length), nonzero = masked
};

template <class T>
struct BookWeights {
  std::vector<BookProjections<T>> heads;  // the wrapper: one per head ("heads.N."); else one
  Tensor<T> out_proj_weight, out_proj_bias;
};

// mirrors the class's forward() (cfg.cls). x is (T, d_in) for SelfAttention_v1/v2, (B, T, d_in) for
// the others. Returns the class's output: (T, d_out), (B, T, d_out), or (B, T, num_heads * d_out) for
// the wrapper.
// Components (batched, B = 1 for the unbatched classes; H the heads, D a head's width):
//   q, k, v (B, H, T, D) projected; scores (B, H, T, T) masked and divided by sqrt(D), before the
//   softmax; attn_weights (B, H, T, T); context (B, T, H D) heads concatenated, before out_proj (the
//   wrapper and MultiHeadAttention only); output (B, T, out_dim).
// Throws ShapeError when a tensor contradicts the config (T above context_length included).
template <class T>
Tensor<T> book_attention_forward(const BookConfig& cfg, const BookWeights<T>& w, const Tensor<T>& x,
                                 Observer<T>* obs = nullptr);

}  // namespace tparity
