// The transformer encoder layer with torch 1.13's semantics.
#pragma once

#include <cstdint>
#include <vector>

#include "tparity/core/attention.hpp"
#include "tparity/core/ops.hpp"

namespace tparity {

// Constructor arguments of torch.nn.TransformerEncoderLayer (dropout is always 0).
struct EncoderConfig {
  int64_t d_model = 0;
  int64_t nhead = 1;
  int64_t dim_feedforward = 2048;
  Activation activation = Activation::Relu;  // torch takes relu or gelu; the core computes any
  double layer_norm_eps = 1e-5;
  bool batch_first = false;
  bool norm_first = false;
  TorchSemantics semantics = TorchSemantics::Torch113;  // its attentions' (attention.hpp)

  MhaConfig self_attn() const {
    MhaConfig c;
    c.embed_dim = d_model;
    c.num_heads = nhead;
    c.batch_first = batch_first;
    c.semantics = semantics;
    return c;
  }
};

// The parameters by state_dict name: self_attn.*, linear1.*, linear2.*, norm1.*, norm2.*.
template <class T>
struct EncoderWeights {
  MhaWeights<T> self_attn;
  Tensor<T> linear1_weight, linear1_bias;  // (F, d), (F)
  Tensor<T> linear2_weight, linear2_bias;  // (d, F), (d)
  Tensor<T> norm1_weight, norm1_bias;      // (d), (d)
  Tensor<T> norm2_weight, norm2_bias;      // (d), (d)
};

// src: (T, B, d) sequence-first, (B, T, d) batch_first, or (T, d) unbatched.
// src_mask: (T, T) or (B*nhead, T, T); src_key_padding_mask: (B, T) or (T); bool or float, as for
// multi-head attention.
template <class T>
struct EncoderInputs {
  Tensor<T> src;
  Mask<T> src_mask, src_key_padding_mask;
};

// mirrors torch.nn.TransformerEncoderLayer.forward, torch 1.13 (eval, dropout 0):
//   post-norm: x = norm1(x + sa(x)); x = norm2(x + ff(x))
//   pre-norm (norm_first): x = x + sa(norm1(x)); x = x + ff(norm2(x))
//   sa(x) = self_attn(x, x, x, src_mask, src_key_padding_mask, need_weights=False)
//   ff(x) = linear2(activation(linear1(x)))
// Returns the output in src's layout.
// Components (batched, batch-first; B = 1 unbatched), in dataflow order:
//   post-norm: sa.q sa.k sa.v sa.scores sa.attn_weights sa.context sa_output norm1 ffn_hidden
//              ffn_output output
//   pre-norm:  norm1 (the attention's input) sa.* sa_output norm2 (the feed-forward's input)
//              ffn_hidden ffn_output output
// ffn_hidden is after the activation.
template <class T>
Tensor<T> encoder_layer_forward(const EncoderConfig& cfg, const EncoderWeights<T>& w, const EncoderInputs<T>& in,
                                Observer<T>* obs = nullptr);

// ---- the stack: torch.nn.TransformerEncoder ----------------------------------------------------

struct EncoderStackConfig {
  EncoderConfig layer;  // every layer's configuration
  int64_t num_layers = 1;
  bool norm = false;  // a final LayerNorm(d_model, eps = layer.layer_norm_eps)
};

// state_dict: layers.N.* (each an encoder layer's names), norm.weight and norm.bias when norm.
template <class T>
struct EncoderStackWeights {
  std::vector<EncoderWeights<T>> layers;
  Tensor<T> norm_weight, norm_bias;
};

// mirrors torch.nn.TransformerEncoder.forward(src, mask, src_key_padding_mask), torch 1.13, on its
// documented path (no nested tensors): every layer gets the same mask and key padding mask, then
// the final norm. Inputs as for the encoder layer (src_mask is forward()'s `mask`).
// Components: layers.N.<the layer's components>, norm (when present), output.
template <class T>
Tensor<T> encoder_forward(const EncoderStackConfig& cfg, const EncoderStackWeights<T>& w, const EncoderInputs<T>& in,
                          Observer<T>* obs = nullptr);

}  // namespace tparity
