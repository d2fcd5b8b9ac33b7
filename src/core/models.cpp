#include "tparity/core/models.hpp"

#include <string>

#include "blocks.hpp"

namespace tparity {

namespace {

std::string str(int64_t v) { return std::to_string(v); }

// The positional encoding's requirement: an even embedding size (P[:, 0::2] and P[:, 1::2] share
// their angles; torch raises on an odd size in the seed's code).
void need_even(int64_t d, const char* what) {
  if (d <= 0 || d % 2)
    throw ShapeError(std::string("config: ") + what + " must be positive and even for the positional encoding, got " +
                     str(d));
}

template <class T>
void check_layers(const EncoderConfig& lc, const std::vector<EncoderWeights<T>>& layers, int64_t num_layers) {
  if (num_layers <= 0) throw ShapeError("config: num_layers must be positive, got " + str(num_layers));
  if (int64_t(layers.size()) != num_layers)
    throw ShapeError("state_dict.layers: expected " + str(num_layers) + " layers, got " + str(layers.size()));
  for (int64_t i = 0; i < num_layers; ++i) detail::check_layer(lc, layers[size_t(i)], "layers." + str(i) + ".");
}

// The encoder layers in turn on batch-first x, components under layers.N.
template <class T>
Tensor<T> run_layers(const EncoderConfig& lc, const std::vector<EncoderWeights<T>>& layers, Tensor<T> x,
                     Observer<T>* obs) {
  for (size_t i = 0; i < layers.size(); ++i) {
    PrefixObserver<T> scoped(obs, "layers." + std::to_string(i) + ".");
    x = detail::encoder_layer(lc, layers[i], x, Mask<T>{}, Mask<T>{}, PrefixObserver<T>::wrap(obs, scoped));
  }
  return x;
}

}  // namespace

template <class T>
Tensor<T> matmul(const Tensor<T>& input, const Tensor<T>& other, Observer<T>* obs) {
  Tensor<T> out(matmul_shape(input.shape, other.shape));
  matmul_forward(out.ptr(), input.ptr(), other.ptr(), input.shape, other.shape);
  if (obs) obs->on("output", out);
  return out;
}

template <class T>
Tensor<T> softmax_lastdim(const Tensor<T>& input, Observer<T>* obs) {
  if (input.dim() < 1) throw ShapeError("input: expected at least 1 dim, got a scalar");
  Tensor<T> out(input.shape);
  const int64_t C = input.size(-1);
  softmax_forward(out.ptr(), input.ptr(), C ? input.numel() / C : 0, C);
  if (obs) obs->on("output", out);
  return out;
}

template <class T>
Tensor<T> layer_norm_lastdim(const Tensor<T>& input, const Tensor<T>& weight, const Tensor<T>& bias, double eps,
                             Observer<T>* obs) {
  if (input.dim() < 1) throw ShapeError("input: expected at least 1 dim, got a scalar");
  const int64_t C = input.size(-1);
  if (weight.empty() != bias.empty())
    throw ShapeError("state_dict: weight and bias come together (elementwise_affine), got only one");
  if (!weight.empty()) {
    detail::need(weight, "weight", {C});
    detail::need(bias, "bias", {C});
  }
  const Shape lead(input.shape.begin(), input.shape.end() - 1);
  Tensor<T> out(input.shape), mean(lead), rstd(lead);
  layernorm_forward(out.ptr(), input.ptr(), weight.empty() ? nullptr : weight.ptr(),
                    bias.empty() ? nullptr : bias.ptr(), T(eps), mean.numel(), C, mean.ptr(), rstd.ptr());
  if (obs) {
    obs->on("mean", mean);
    obs->on("rstd", rstd);
    obs->on("output", out);
  }
  return out;
}

template <class T>
Tensor<T> token_encoder_forward(const TokenEncoderConfig& cfg, const TokenEncoderWeights<T>& w,
                                const Tensor<int64_t>& tokens, Observer<T>* obs) {
  const EncoderConfig& lc = cfg.layer;
  const int64_t d = lc.d_model, V = cfg.vocab;
  need_even(d, "d_model");
  if (V <= 0) throw ShapeError("config: vocab must be positive, got " + str(V));
  detail::need(w.embedding_weight, "embedding.weight", {V, d});
  check_layers(lc, w.layers, cfg.num_layers);
  if (tokens.dim() != 2) throw ShapeError("tokens: expected 2 dims (B, T), got shape " + to_string(tokens.shape));
  const int64_t B = tokens.size(0), Tn = tokens.size(1);
  for (int64_t i = 0; i < tokens.numel(); ++i) {
    const int64_t id = tokens.data[size_t(i)];
    if (id < 0 || id >= V)
      throw ShapeError("tokens: id " + str(id) + " at [" + str(i / Tn) + ", " + str(i % Tn) +
                       "] is out of range for an embedding of " + str(V) + " rows (expected 0 <= id < " + str(V) + ")");
  }
  Tensor<T> x({B, Tn, d});
  embedding_forward(x.ptr(), tokens.ptr(), w.embedding_weight.ptr(), B * Tn, V, d);
  if (obs) obs->on("embedding", x);
  positional_encoding_forward(x.ptr(), x.ptr(), B, Tn, d);
  if (obs) obs->on("pos_encoding", x);
  x = run_layers(lc, w.layers, std::move(x), obs);
  if (obs) obs->on("output", x);
  return x;
}

template <class T>
Tensor<T> patcher_forward(const Tensor<T>& image, int64_t p) {
  if (image.dim() != 4) throw ShapeError("image: expected 4 dims (B, C, H, W), got shape " + to_string(image.shape));
  const int64_t B = image.size(0), C = image.size(1), H = image.size(2), W = image.size(3);
  if (p <= 0 || H % p || W % p)
    throw ShapeError("image: expected H and W multiples of the patch size " + str(p) + ", got shape " +
                     to_string(image.shape));
  const int64_t rows = H / p, cols = W / p, F = C * p * p;
  Tensor<T> out({B, rows * cols, F});
  for (int64_t b = 0; b < B; ++b)
    for (int64_t r = 0; r < rows; ++r)
      for (int64_t c = 0; c < cols; ++c) {
        T* patch = out.ptr() + ((b * rows + r) * cols + c) * F;
        for (int64_t ch = 0; ch < C; ++ch)
          for (int64_t i = 0; i < p; ++i)
            for (int64_t j = 0; j < p; ++j)
              patch[(ch * p + i) * p + j] = image.data[size_t(((b * C + ch) * H + r * p + i) * W + c * p + j)];
      }
  return out;
}

template <class T>
Tensor<T> vit_forward(const VitConfig& cfg, const VitWeights<T>& w, const Tensor<T>& image, Observer<T>* obs) {
  const EncoderConfig& lc = cfg.layer;
  const int64_t d = cfg.d_model(), n = cfg.num_patches();
  if (cfg.channels <= 0 || cfg.patch <= 0 || cfg.image_height <= 0 || cfg.image_width <= 0)
    throw ShapeError("config: channels, image size and patch size must be positive");
  if (cfg.image_height % cfg.patch || cfg.image_width % cfg.patch)
    throw ShapeError("config: image size " + str(cfg.image_height) + "x" + str(cfg.image_width) +
                     " is not a multiple of the patch size " + str(cfg.patch));
  if (lc.d_model != d)
    throw ShapeError("config: d_model must be channels * patch^2 = " + str(d) + ", got " + str(lc.d_model));
  need_even(d, "d_model (channels * patch^2)");
  check_layers(lc, w.layers, cfg.num_layers);
  if (cfg.head.empty()) throw ShapeError("config: the head needs at least one width (the output's)");
  const size_t hidden = cfg.head.size() - 1;
  if (w.head.size() != hidden)
    throw ShapeError("state_dict.head: expected " + str(hidden) + " hidden blocks, got " + str(w.head.size()));
  int64_t in = n * d;
  for (size_t i = 0; i < hidden; ++i) {
    const std::string pre = "head." + std::to_string(i) + ".";
    const int64_t width = cfg.head[i];
    const VitHeadBlock<T>& hb = w.head[i];
    detail::need(hb.linear_weight, pre + "linear.weight", {width, in});
    detail::need(hb.linear_bias, pre + "linear.bias", {width});
    detail::need(hb.bn_weight, pre + "bn.weight", {width});
    detail::need(hb.bn_bias, pre + "bn.bias", {width});
    detail::need(hb.bn_running_mean, pre + "bn.running_mean", {width});
    detail::need(hb.bn_running_var, pre + "bn.running_var", {width});
    in = width;
  }
  detail::need(w.out_weight, "head.out.weight", {cfg.head.back(), in});
  detail::need(w.out_bias, "head.out.bias", {cfg.head.back()});
  if (image.dim() != 4 || image.size(1) != cfg.channels || image.size(2) != cfg.image_height ||
      image.size(3) != cfg.image_width)
    throw ShapeError("image: expected shape (B, " + str(cfg.channels) + ", " + str(cfg.image_height) + ", " +
                     str(cfg.image_width) + "), got " + to_string(image.shape));
  const int64_t B = image.size(0);

  Tensor<T> x = patcher_forward(image, cfg.patch);
  if (obs) obs->on("patches", x);
  positional_encoding_forward(x.ptr(), x.ptr(), B, n, d);
  if (obs) obs->on("pos_encoding", x);
  x = run_layers(lc, w.layers, std::move(x), obs);
  x.shape = {B, n * d};  // X.view(B, -1): the (B, n, d) buffer is already row-major
  for (size_t i = 0; i < hidden; ++i) {
    const std::string pre = "head." + std::to_string(i) + ".";
    const VitHeadBlock<T>& hb = w.head[i];
    const int64_t width = cfg.head[i], fan_in = x.size(1);
    Tensor<T> y({B, width});
    linear_forward(y.ptr(), x.ptr(), hb.linear_weight.ptr(), hb.linear_bias.ptr(), B, fan_in, width);
    if (obs) obs->on(pre + "linear", y);
    batchnorm_eval_forward(y.ptr(), y.ptr(), hb.bn_running_mean.ptr(), hb.bn_running_var.ptr(), hb.bn_weight.ptr(),
                           hb.bn_bias.ptr(), T(cfg.bn_eps), B, width);
    if (obs) obs->on(pre + "bn", y);
    activation_forward(cfg.head_activation, y.ptr(), y.ptr(), y.numel());
    if (obs) obs->on(pre + "act", y);
    x = std::move(y);
  }
  Tensor<T> logits({B, cfg.head.back()});
  linear_forward(logits.ptr(), x.ptr(), w.out_weight.ptr(), w.out_bias.ptr(), B, x.size(1), cfg.head.back());
  if (obs) obs->on("output", logits);
  return logits;
}

#define TPARITY_INSTANTIATE(T)                                                                           \
  template Tensor<T> matmul<T>(const Tensor<T>&, const Tensor<T>&, Observer<T>*);                        \
  template Tensor<T> softmax_lastdim<T>(const Tensor<T>&, Observer<T>*);                                 \
  template Tensor<T> layer_norm_lastdim<T>(const Tensor<T>&, const Tensor<T>&, const Tensor<T>&, double, \
                                           Observer<T>*);                                                \
  template Tensor<T> token_encoder_forward<T>(const TokenEncoderConfig&, const TokenEncoderWeights<T>&,  \
                                              const Tensor<int64_t>&, Observer<T>*);                     \
  template Tensor<T> patcher_forward<T>(const Tensor<T>&, int64_t);                                      \
  template Tensor<T> vit_forward<T>(const VitConfig&, const VitWeights<T>&, const Tensor<T>&, Observer<T>*);
TPARITY_INSTANTIATE(float)
TPARITY_INSTANTIATE(double)
#undef TPARITY_INSTANTIATE

}  // namespace tparity
