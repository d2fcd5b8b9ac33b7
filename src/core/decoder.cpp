#include "tparity/core/decoder.hpp"

#include <string>
#include <utility>

#include "blocks.hpp"
#include "layout.hpp"

namespace tparity {

template <class T>
Tensor<T> decoder_layer_forward(const DecoderConfig& cfg, const DecoderWeights<T>& w, const DecoderInputs<T>& in,
                                Observer<T>* obs) {
  const int64_t d = cfg.d_model, F = cfg.dim_feedforward;
  if (F <= 0) throw ShapeError("config: dim_feedforward must be positive, got " + std::to_string(F));
  detail::need(w.linear1_weight, "linear1.weight", {F, d});
  detail::need(w.linear1_bias, "linear1.bias", {F});
  detail::need(w.linear2_weight, "linear2.weight", {d, F});
  detail::need(w.linear2_bias, "linear2.bias", {d});
  const Tensor<T>* norms[3][2] = {
      {&w.norm1_weight, &w.norm1_bias}, {&w.norm2_weight, &w.norm2_bias}, {&w.norm3_weight, &w.norm3_bias}};
  for (int i = 0; i < 3; ++i) {
    const std::string n = "norm" + std::to_string(i + 1);
    detail::need(*norms[i][0], n + ".weight", {d});
    detail::need(*norms[i][1], n + ".bias", {d});
  }
  const bool batched = detail::check_src(in.tgt, d, "tgt");
  if (detail::check_src(in.memory, d, "memory") != batched)
    throw ShapeError("memory: expected " + std::string(batched ? "3" : "2") + " dims like tgt, got shape " +
                     to_string(in.memory.shape));
  Tensor<T> x = detail::to_batch_first(in.tgt, batched, cfg.batch_first);
  const Tensor<T> mem = detail::to_batch_first(in.memory, batched, cfg.batch_first);
  if (mem.size(0) != x.size(0))
    throw ShapeError("memory: expected batch " + std::to_string(x.size(0)) + " like tgt, got shape " +
                     to_string(in.memory.shape));
  const Mask<T> tgt_kpm =
      detail::batch_key_padding(in.tgt_key_padding_mask, batched, x.size(1), "tgt_key_padding_mask");
  const Mask<T> mem_kpm =
      detail::batch_key_padding(in.memory_key_padding_mask, batched, mem.size(1), "memory_key_padding_mask");
  const MhaConfig acfg = cfg.self_attn();
  // x + _sa_block(v), x + _mha_block(v, memory), x + _ff_block(v)
  auto sa = [&](const Tensor<T>& v, const Tensor<T>& x0) {
    return detail::attention_block(acfg, w.self_attn, v, v, in.tgt_mask, tgt_kpm, x0, obs, "sa.", "sa_output");
  };
  auto ca = [&](const Tensor<T>& v, const Tensor<T>& x0) {
    return detail::attention_block(acfg, w.multihead_attn, v, mem, in.memory_mask, mem_kpm, x0, obs, "ca.",
                                   "ca_output");
  };
  auto ff = [&](const Tensor<T>& v, Tensor<T>& x0) {  // x0 = x0 + _ff_block(v)
    detail::add_feed_forward(cfg.activation, w.linear1_weight, w.linear1_bias, w.linear2_weight, w.linear2_bias, v, x0,
                             obs);
  };
  // a temporary (post-norm's sublayer output) is normalised in place
  auto norm = [&](auto&& v, const Tensor<T>& g, const Tensor<T>& b) {
    return detail::layer_norm(std::forward<decltype(v)>(v), g, b, cfg.layer_norm_eps);
  };
  if (cfg.norm_first) {
    Tensor<T> n1 = norm(x, w.norm1_weight, w.norm1_bias);
    if (obs) obs->on("norm1", n1);
    x = sa(n1, x);
    Tensor<T> n2 = norm(x, w.norm2_weight, w.norm2_bias);
    if (obs) obs->on("norm2", n2);
    x = ca(n2, x);
    Tensor<T> n3 = norm(x, w.norm3_weight, w.norm3_bias);
    if (obs) obs->on("norm3", n3);
    ff(n3, x);
  } else {
    x = norm(sa(x, x), w.norm1_weight, w.norm1_bias);
    if (obs) obs->on("norm1", x);
    x = norm(ca(x, x), w.norm2_weight, w.norm2_bias);
    if (obs) obs->on("norm2", x);
    ff(x, x);
    x = norm(std::move(x), w.norm3_weight, w.norm3_bias);
  }
  if (obs) obs->on("output", x);
  return detail::from_batch_first(std::move(x), batched, cfg.batch_first);
}

template Tensor<float> decoder_layer_forward<float>(const DecoderConfig&, const DecoderWeights<float>&,
                                                    const DecoderInputs<float>&, Observer<float>*);
template Tensor<double> decoder_layer_forward<double>(const DecoderConfig&, const DecoderWeights<double>&,
                                                      const DecoderInputs<double>&, Observer<double>*);

}  // namespace tparity
