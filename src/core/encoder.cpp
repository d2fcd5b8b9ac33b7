#include "tparity/core/encoder.hpp"

#include <string>

#include "layout.hpp"
#include "tparity/core/ops.hpp"

namespace tparity {

namespace {

template <class T>
void need(const Tensor<T>& t, const std::string& name, const Shape& s) {
  if (t.shape != s)
    throw ShapeError("state_dict." + name + ": expected shape " + to_string(s) + ", got " +
                     (t.empty() ? std::string("none") : to_string(t.shape)));
}

}  // namespace

template <class T>
Tensor<T> encoder_layer_forward(const EncoderConfig& cfg, const EncoderWeights<T>& w, const EncoderInputs<T>& in,
                                Observer<T>* obs) {
  const int64_t d = cfg.d_model, F = cfg.dim_feedforward;
  if (F <= 0) throw ShapeError("config: dim_feedforward must be positive, got " + std::to_string(F));
  if (in.src.dim() != 2 && in.src.dim() != 3)
    throw ShapeError("src: expected 2 dims (T, d_model) or 3 dims, got shape " + to_string(in.src.shape));
  if (in.src.size(-1) != d)
    throw ShapeError("src: expected last dim d_model = " + std::to_string(d) + ", got shape " +
                     to_string(in.src.shape));
  need(w.linear1_weight, "linear1.weight", {F, d});
  need(w.linear1_bias, "linear1.bias", {F});
  need(w.linear2_weight, "linear2.weight", {d, F});
  need(w.linear2_bias, "linear2.bias", {d});
  need(w.norm1_weight, "norm1.weight", {d});
  need(w.norm1_bias, "norm1.bias", {d});
  need(w.norm2_weight, "norm2.weight", {d});
  need(w.norm2_bias, "norm2.bias", {d});

  // Work batched and batch-first: x (B, T, d). The attention is called in that layout too.
  const bool batched = in.src.dim() == 3;
  Tensor<T> x = detail::to_batch_first(in.src, batched, cfg.batch_first);
  const int64_t B = x.size(0), N = B * x.size(1);
  MhaConfig acfg = cfg.self_attn();
  acfg.batch_first = true;
  MhaInputs<T> ain;
  ain.attn_mask = in.src_mask;
  ain.key_padding_mask = in.src_key_padding_mask;
  if (!batched && ain.key_padding_mask.present()) {  // (T) -> (1, T)
    Mask<T>& m = ain.key_padding_mask;
    if (m.shape() != Shape{x.size(1)})
      throw ShapeError("src_key_padding_mask: expected shape " + to_string({x.size(1)}) +
                       " (T) for unbatched src, got shape " + to_string(m.shape()));
    Shape& s = m.is_bool() ? m.bools.shape : m.floats.shape;
    s.insert(s.begin(), 1);
  }
  PrefixObserver<T> sa_obs(obs, "sa.", "output", "sa_output");
  auto self_attention = [&](const Tensor<T>& inp) {
    ain.query = inp;
    ain.key = inp;
    ain.value = inp;
    return mha_forward(acfg, MhaForward{false, true}, w.self_attn, ain, PrefixObserver<T>::wrap(obs, sa_obs)).output;
  };
  const T eps = T(cfg.layer_norm_eps);
  auto layer_norm = [&](const Tensor<T>& inp, const Tensor<T>& g, const Tensor<T>& b) {
    Tensor<T> out(inp.shape);
    layernorm_forward(out.ptr(), inp.ptr(), g.ptr(), b.ptr(), eps, N, d);
    return out;
  };
  auto feed_forward = [&](const Tensor<T>& inp) {
    Tensor<T> hidden(Shape{inp.size(0), inp.size(1), F});
    linear_forward(hidden.ptr(), inp.ptr(), w.linear1_weight.ptr(), w.linear1_bias.ptr(), N, d, F);
    if (cfg.activation == Activation::Relu)
      relu_forward(hidden.ptr(), hidden.ptr(), hidden.numel());
    else
      gelu_forward(hidden.ptr(), hidden.ptr(), hidden.numel());
    if (obs) obs->on("ffn_hidden", hidden);
    Tensor<T> out(inp.shape);
    linear_forward(out.ptr(), hidden.ptr(), w.linear2_weight.ptr(), w.linear2_bias.ptr(), N, F, d);
    if (obs) obs->on("ffn_output", out);
    return out;
  };
  auto add = [](const Tensor<T>& a, const Tensor<T>& b) {
    Tensor<T> out(a.shape);
    add_forward(out.ptr(), a.ptr(), b.ptr(), a.numel());
    return out;
  };

  // An unbatched src_mask, (T, T) or (nhead, T, T), is already right for the (1, T, d) batch.
  if (cfg.norm_first) {
    Tensor<T> n1 = layer_norm(x, w.norm1_weight, w.norm1_bias);
    if (obs) obs->on("norm1", n1);
    x = add(x, self_attention(n1));
    Tensor<T> n2 = layer_norm(x, w.norm2_weight, w.norm2_bias);
    if (obs) obs->on("norm2", n2);
    x = add(x, feed_forward(n2));
  } else {
    x = layer_norm(add(x, self_attention(x)), w.norm1_weight, w.norm1_bias);
    if (obs) obs->on("norm1", x);
    x = layer_norm(add(x, feed_forward(x)), w.norm2_weight, w.norm2_bias);
  }
  if (obs) obs->on("output", x);
  return detail::from_batch_first(std::move(x), batched, cfg.batch_first);
}

template Tensor<float> encoder_layer_forward<float>(const EncoderConfig&, const EncoderWeights<float>&,
                                                    const EncoderInputs<float>&, Observer<float>*);
template Tensor<double> encoder_layer_forward<double>(const EncoderConfig&, const EncoderWeights<double>&,
                                                      const EncoderInputs<double>&, Observer<double>*);

}  // namespace tparity
