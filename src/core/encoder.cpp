#include "tparity/core/encoder.hpp"

#include <string>
#include <utility>

#include "blocks.hpp"
#include "layout.hpp"

namespace tparity {

namespace detail {

template <class T>
void check_layer(const EncoderConfig& cfg, const EncoderWeights<T>& w, const std::string& prefix) {
  const int64_t d = cfg.d_model, F = cfg.dim_feedforward;
  if (F <= 0) throw ShapeError("config: dim_feedforward must be positive, got " + std::to_string(F));
  need(w.linear1_weight, prefix + "linear1.weight", {F, d});
  need(w.linear1_bias, prefix + "linear1.bias", {F});
  need(w.linear2_weight, prefix + "linear2.weight", {d, F});
  need(w.linear2_bias, prefix + "linear2.bias", {d});
  need(w.norm1_weight, prefix + "norm1.weight", {d});
  need(w.norm1_bias, prefix + "norm1.bias", {d});
  need(w.norm2_weight, prefix + "norm2.weight", {d});
  need(w.norm2_bias, prefix + "norm2.bias", {d});
}

template <class T>
Tensor<T> encoder_layer(const EncoderConfig& cfg, const EncoderWeights<T>& w, const Tensor<T>& src, const Mask<T>& mask,
                        const Mask<T>& kpm, Observer<T>* obs, bool seq_first) {
  const MhaConfig acfg = cfg.self_attn();
  // x + _sa_block(in), x + _ff_block(in)
  auto sa = [&](const Tensor<T>& in, const Tensor<T>& x0) {
    return attention_block(acfg, w.self_attn, in, in, mask, kpm, x0, obs, "sa.", "sa_output", seq_first);
  };
  // x0 = x0 + _ff_block(in)
  auto ff = [&](const Tensor<T>& in, Tensor<T>& x0) {
    add_feed_forward(cfg.activation, w.linear1_weight, w.linear1_bias, w.linear2_weight, w.linear2_bias, in, x0, obs);
  };
  // src is only read; the attention's output is a new tensor, which the feed-forward adds to in place;
  // post-norm normalises each in place
  Tensor<T> x;
  if (cfg.norm_first) {
    Tensor<T> n1 = layer_norm(src, w.norm1_weight, w.norm1_bias, cfg.layer_norm_eps);
    if (obs) obs->on("norm1", n1);
    x = sa(n1, src);
    Tensor<T> n2 = layer_norm(x, w.norm2_weight, w.norm2_bias, cfg.layer_norm_eps);
    if (obs) obs->on("norm2", n2);
    ff(n2, x);
  } else {
    x = layer_norm(sa(src, src), w.norm1_weight, w.norm1_bias, cfg.layer_norm_eps);
    if (obs) obs->on("norm1", x);
    ff(x, x);
    x = layer_norm(std::move(x), w.norm2_weight, w.norm2_bias, cfg.layer_norm_eps);
  }
  if (obs) obs->on("output", x);
  return x;
}

// Whether a batch sequence-first is computed in its own row order: unobserved on the fast path, more
// than one element. Every step but the attention works row by row, and the attention reads and writes
// that order in place (attention.cpp, attend_in_place; its other paths make their own batch-first
// copies): no copy to batch-first and back.
template <class T>
bool in_own_row_order(const EncoderConfig& cfg, const Tensor<T>& src, bool batched, const Observer<T>* obs) {
  return batched && !cfg.batch_first && src.size(1) > 1 && !obs && core_path() == CorePath::Fast;
}

// Shape checks of src and its layout: batched or not, and the batch-first view.
template <class T>
bool check_src(const Tensor<T>& src, int64_t d, const std::string& name) {
  if (src.dim() != 2 && src.dim() != 3)
    throw ShapeError(name + ": expected 2 dims (T, d_model) or 3 dims, got shape " + to_string(src.shape));
  if (src.size(-1) != d)
    throw ShapeError(name + ": expected last dim d_model = " + std::to_string(d) + ", got shape " +
                     to_string(src.shape));
  return src.dim() == 3;
}

}  // namespace detail

template <class T>
Tensor<T> encoder_layer_forward(const EncoderConfig& cfg, const EncoderWeights<T>& w, const EncoderInputs<T>& in,
                                Observer<T>* obs) {
  detail::check_layer(cfg, w, "");
  const bool batched = detail::check_src(in.src, cfg.d_model, "src");
  if (detail::in_own_row_order(cfg, in.src, batched, obs)) {
    const Mask<T> kpm =
        detail::batch_key_padding(in.src_key_padding_mask, true, in.src.size(0), "src_key_padding_mask");
    return detail::encoder_layer(cfg, w, in.src, in.src_mask, kpm, obs, true);
  }
  // a batched, batch-first src is the layer's input as it is (read only), else a batch-first copy
  const bool as_is = batched && cfg.batch_first;
  const Tensor<T> copy = as_is ? Tensor<T>() : detail::to_batch_first(in.src, batched, cfg.batch_first);
  const Tensor<T>& x = as_is ? in.src : copy;
  // An unbatched src_mask, (T, T) or (nhead, T, T), is already right for the (1, T, d) batch.
  const Mask<T> kpm = detail::batch_key_padding(in.src_key_padding_mask, batched, x.size(1), "src_key_padding_mask");
  return detail::from_batch_first(detail::encoder_layer(cfg, w, x, in.src_mask, kpm, obs), batched, cfg.batch_first);
}

template <class T>
Tensor<T> encoder_forward(const EncoderStackConfig& cfg, const EncoderStackWeights<T>& w, const EncoderInputs<T>& in,
                          Observer<T>* obs) {
  const EncoderConfig& lc = cfg.layer;
  if (cfg.num_layers <= 0)
    throw ShapeError("config: num_layers must be positive, got " + std::to_string(cfg.num_layers));
  if (int64_t(w.layers.size()) != cfg.num_layers)
    throw ShapeError("state_dict.layers: expected " + std::to_string(cfg.num_layers) + " layers, got " +
                     std::to_string(w.layers.size()));
  for (int64_t i = 0; i < cfg.num_layers; ++i)
    detail::check_layer(lc, w.layers[size_t(i)], "layers." + std::to_string(i) + ".");
  if (cfg.norm) {
    detail::need(w.norm_weight, "norm.weight", {lc.d_model});
    detail::need(w.norm_bias, "norm.bias", {lc.d_model});
  }
  const bool batched = detail::check_src(in.src, lc.d_model, "src");
  const bool seq_first = detail::in_own_row_order(lc, in.src, batched, obs);
  Tensor<T> x = seq_first ? Tensor<T>() : detail::to_batch_first(in.src, batched, lc.batch_first);
  const Mask<T> kpm = detail::batch_key_padding(in.src_key_padding_mask, batched,
                                                seq_first ? in.src.size(0) : x.size(1), "src_key_padding_mask");
  for (int64_t i = 0; i < cfg.num_layers; ++i) {
    PrefixObserver<T> scoped(obs, "layers." + std::to_string(i) + ".");
    x = detail::encoder_layer(lc, w.layers[size_t(i)], seq_first && i == 0 ? in.src : x, in.src_mask, kpm,
                              PrefixObserver<T>::wrap(obs, scoped), seq_first);
  }
  if (cfg.norm) {
    x = detail::layer_norm(std::move(x), w.norm_weight, w.norm_bias, lc.layer_norm_eps);
    if (obs) obs->on("norm", x);
  }
  if (obs) obs->on("output", x);
  if (seq_first) return x;
  return detail::from_batch_first(std::move(x), batched, lc.batch_first);
}

#define TPARITY_INSTANTIATE(T)                                                                                         \
  template Tensor<T> encoder_layer_forward<T>(const EncoderConfig&, const EncoderWeights<T>&, const EncoderInputs<T>&, \
                                              Observer<T>*);                                                           \
  template Tensor<T> encoder_forward<T>(const EncoderStackConfig&, const EncoderStackWeights<T>&,                      \
                                        const EncoderInputs<T>&, Observer<T>*);                                        \
  template Tensor<T> detail::encoder_layer<T>(const EncoderConfig&, const EncoderWeights<T>&, const Tensor<T>&,        \
                                              const Mask<T>&, const Mask<T>&, Observer<T>*, bool);                     \
  template bool detail::check_src<T>(const Tensor<T>&, int64_t, const std::string&);                                   \
  template void detail::check_layer<T>(const EncoderConfig&, const EncoderWeights<T>&, const std::string&);
TPARITY_INSTANTIATE(float)
TPARITY_INSTANTIATE(double)
#undef TPARITY_INSTANTIATE

}  // namespace tparity
