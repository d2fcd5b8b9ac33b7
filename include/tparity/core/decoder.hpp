// The transformer decoder layer with torch 1.13's semantics.
#pragma once

#include "tparity/core/encoder.hpp"

namespace tparity {

// torch.nn.TransformerDecoderLayer takes the encoder layer's constructor arguments.
using DecoderConfig = EncoderConfig;

// state_dict: self_attn.*, multihead_attn.*, linear1.*, linear2.*, norm1.*, norm2.*, norm3.*
template <class T>
struct DecoderWeights {
  MhaWeights<T> self_attn, multihead_attn;
  Tensor<T> linear1_weight, linear1_bias, linear2_weight, linear2_bias;
  Tensor<T> norm1_weight, norm1_bias, norm2_weight, norm2_bias, norm3_weight, norm3_bias;
};

// tgt: (T, B, d), (B, T, d) batch_first, or (T, d) unbatched; memory likewise with S rows.
// tgt_mask (T, T) or (B*nhead, T, T); memory_mask (T, S) or (B*nhead, T, S); key padding masks
// (B, T) / (B, S), or (T) / (S) unbatched. Bool (true = masked out) or float (added).
template <class T>
struct DecoderInputs {
  Tensor<T> tgt, memory;
  Mask<T> tgt_mask, memory_mask, tgt_key_padding_mask, memory_key_padding_mask;
};

// mirrors torch.nn.TransformerDecoderLayer.forward, torch 1.13 (eval, dropout 0):
//   post-norm: x = norm1(x + sa(x)); x = norm2(x + ca(x, memory)); x = norm3(x + ff(x))
//   pre-norm:  x = x + sa(norm1(x)); x = x + ca(norm2(x), memory); x = x + ff(norm3(x))
//   sa = self_attn with tgt_mask, tgt_key_padding_mask; ca = multihead_attn(x, memory, memory) with
//   memory_mask, memory_key_padding_mask; both need_weights=False.
// Components, batch-first: post-norm sa.* sa_output norm1 ca.* ca_output norm2 ffn_hidden
// ffn_output output; pre-norm norm1 sa.* sa_output norm2 ca.* ca_output norm3 ffn_hidden
// ffn_output output.
template <class T>
Tensor<T> decoder_layer_forward(const DecoderConfig& cfg, const DecoderWeights<T>& w, const DecoderInputs<T>& in,
                                Observer<T>* obs = nullptr);

}  // namespace tparity
