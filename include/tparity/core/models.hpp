// Seed 004's models (its TransformerEncoder front and its ViT) and the op-level cases (matmul,
// softmax, layer norm), with torch 1.13's semantics, built from the core's ops and encoder layer.
// Every component goes to the observer as the tensor the next op reads, so a teacher may overwrite it.
#pragma once

#include <cstdint>
#include <vector>

#include "tparity/core/encoder.hpp"
#include "tparity/core/observer.hpp"
#include "tparity/core/ops.hpp"

namespace tparity {

// ---- op-level cases ----------------------------------------------------------------------------

// mirrors torch.matmul(input, other): numpy-style batch broadcasting, 1-D operands as a row / a
// column (see matmul_shape). Component: output. Throws ShapeError when the shapes do not combine.
template <class T>
Tensor<T> matmul(const Tensor<T>& input, const Tensor<T>& other, Observer<T>* obs = nullptr);

// mirrors torch.softmax(input, dim=-1) on any input of at least 1 dim. Component: output.
template <class T>
Tensor<T> softmax_lastdim(const Tensor<T>& input, Observer<T>* obs = nullptr);

// mirrors torch.nn.functional.layer_norm(input, (C,), weight, bias, eps) over the last dim, C =
// input.size(-1); weight and bias (C) or both empty (no affine). Components, as torch.native_layer_norm
// returns them: mean and rstd = 1 / sqrt(biased var + eps), each of input's leading dims; output.
template <class T>
Tensor<T> layer_norm_lastdim(const Tensor<T>& input, const Tensor<T>& weight, const Tensor<T>& bias, double eps,
                             Observer<T>* obs = nullptr);

// ---- seed 004's TransformerEncoder: nn.Embedding, PositionalEncoding, encoder layers -----------

struct TokenEncoderConfig {
  int64_t vocab = 0;    // nn.Embedding num_embeddings
  EncoderConfig layer;  // every layer's; d_model is the embedding size, and must be even
  int64_t num_layers = 1;
};

// state_dict: embedding.weight (vocab, d); layers.N.* (each an encoder layer's names).
template <class T>
struct TokenEncoderWeights {
  Tensor<T> embedding_weight;
  std::vector<EncoderWeights<T>> layers;
};

// mirrors seed 004's TransformerEncoder.forward with torch.nn.TransformerEncoderLayer blocks (its
// TransformerEncoderBlock is the post-norm relu layer): X = embedding(tokens); X = X + P[:T]; the
// layers in turn, batch-first, no mask.
// tokens is (B, T), ids in [0, vocab); returns (B, T, d).
// Components: embedding (B, T, d), pos_encoding (B, T, d) after the addition, layers.N.<the layer's
// components>, output (B, T, d).
// Throws ShapeError for a shape that contradicts the config or a token id outside [0, vocab).
template <class T>
Tensor<T> token_encoder_forward(const TokenEncoderConfig& cfg, const TokenEncoderWeights<T>& w,
                                const Tensor<int64_t>& tokens, Observer<T>* obs = nullptr);

// ---- seed 004's ViT: Patcher, PositionalEncoding, encoder layers, ViTHead -----------------------

// mirrors seed 004's Patcher: image.unfold(-2, p, p).unfold(-2, p, p).reshape(B, C, -1, p * p)
// .transpose(1, 2).reshape(B, -1, C * p * p).
// image is (B, C, H, W), H and W multiples of p; returns (B, n, C * p * p) with n = (H/p)(W/p):
// patch (r, c) is row r * (W/p) + c (row-major over the patch grid), its features ordered
// [channel][row in patch][column in patch]. Throws ShapeError otherwise.
template <class T>
Tensor<T> patcher_forward(const Tensor<T>& image, int64_t patch);

struct VitConfig {
  int64_t channels = 3, image_height = 0, image_width = 0, patch = 1;
  EncoderConfig layer;  // every layer's; d_model must be channels * patch^2, and even
  int64_t num_layers = 1;
  std::vector<int64_t> head;  // the seed's head_neurons: hidden widths, then the output width (>= 1)
  Activation head_activation = Activation::Relu;
  double bn_eps = 1e-5;  // BatchNorm1d's default

  int64_t d_model() const { return channels * patch * patch; }
  int64_t num_patches() const { return patch > 0 ? (image_height / patch) * (image_width / patch) : 0; }
};

// One hidden block of the head: Linear, BatchNorm1d (eval: running statistics), activation.
// state_dict: head.<i>.linear.weight (w_i, in_i), head.<i>.linear.bias (w_i), head.<i>.bn.weight,
// .bias, .running_mean, .running_var (w_i). (torch's bn.num_batches_tracked buffer is not kept: eval
// mode never reads it.)
template <class T>
struct VitHeadBlock {
  Tensor<T> linear_weight, linear_bias;
  Tensor<T> bn_weight, bn_bias, bn_running_mean, bn_running_var;
};

// state_dict: layers.N.*, head.<i>.* per hidden width, head.out.weight (out, in), head.out.bias.
template <class T>
struct VitWeights {
  std::vector<EncoderWeights<T>> layers;
  std::vector<VitHeadBlock<T>> head;  // one per hidden width
  Tensor<T> out_weight, out_bias;
};

// mirrors seed 004's ViT.forward in eval mode (dropout 0, BatchNorm1d on running statistics):
// X = patcher(image); X = X + P[:n]; the encoder layers, batch-first; X = X.view(B, -1) (B, n * d);
// per hidden width: Linear, BatchNorm1d, activation; the final Linear.
// image is (B, C, H, W); returns the logits (B, head.back()).
// Components: patches (B, n, d), pos_encoding (B, n, d), layers.N.*, head.<i>.linear, head.<i>.bn,
// head.<i>.act (B, w_i) for each hidden width, output (B, out).
template <class T>
Tensor<T> vit_forward(const VitConfig& cfg, const VitWeights<T>& w, const Tensor<T>& image, Observer<T>* obs = nullptr);

}  // namespace tparity
