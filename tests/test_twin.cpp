// The core in double against its long-double scalar twin (tests/twin.hpp) over a seeded grid of
// configurations: an oracle that needs neither torch nor Python.
#include <catch2/catch.hpp>

#include "support.hpp"
#include "tparity/compare/metrics.hpp"
#include "tparity/harness/rng.hpp"
#include "twin.hpp"

using namespace tparity;
using test::divisor_of;
using test::randn;
using test::random_bool;

namespace {

MhaWeights<double> random_weights(Rng& rng, const MhaConfig& c) {
  const int64_t E = c.embed_dim;
  const double s = 1 / std::sqrt(double(E));
  MhaWeights<double> w;
  if (c.packed())
    w.in_proj_weight = randn(rng, {3 * E, E}, s);
  else {
    w.q_proj_weight = randn(rng, {E, E}, s);
    w.k_proj_weight = randn(rng, {E, c.key_dim()}, s);
    w.v_proj_weight = randn(rng, {E, c.value_dim()}, s);
  }
  if (c.bias) w.in_proj_bias = randn(rng, {3 * E}, 0.2), w.out_proj_bias = randn(rng, {E}, 0.2);
  if (c.add_bias_kv) w.bias_k = randn(rng, {1, 1, E}), w.bias_v = randn(rng, {1, 1, E});
  w.out_proj_weight = randn(rng, {E, E}, s);
  return w;
}

// Masks as torch 1.13 accepts them (no float key padding mask with a float attn_mask).
void random_masks(Rng& rng, int64_t B, int64_t H, int64_t L, int64_t S, Mask<double>& attn, Mask<double>& kpm) {
  switch (rng.integer(0, 4)) {
    case 1:
      attn = Mask<double>::of_float(randn(rng, {L, S}));
      break;
    case 2:
      attn = Mask<double>::of_bool(random_bool(rng, {L, S}, 0.3));
      break;
    case 3:
      attn = Mask<double>::of_float(randn(rng, {B * H, L, S}));
      break;
    case 4:
      attn = Mask<double>::of_bool(random_bool(rng, {B * H, L, S}, 0.3));
      break;
    default:
      break;
  }
  switch (rng.integer(0, 2)) {
    case 1:
      kpm = Mask<double>::of_bool(random_bool(rng, {B, S}, 0.3));
      break;
    case 2:
      if (!(attn.present() && !attn.is_bool())) kpm = Mask<double>::of_float(randn(rng, {B, S}));
      break;
    default:
      break;
  }
}

void same(const Tensor<double>& core, const Tensor<double>& twin_value) {
  const Metrics m = measure(core, twin_value);
  CAPTURE(m.shape_mismatch, m.rel_l2, m.max_abs, m.nonfinite_mismatch);
  // double against long double: a few roundings of 2^-53 per op, compounded over at most ~10 ops.
  CHECK(m.clean());
  CHECK(m.rel_l2 <= 1e-13);
}

}  // namespace

TEST_CASE("twin: multi-head attention over a seeded grid of options", "[twin]") {
  for (uint64_t seed = 1; seed <= 300; ++seed) {
    Rng rng(seed);
    MhaConfig c;
    c.embed_dim = std::vector<int64_t>{4, 6, 8, 12}[size_t(rng.integer(0, 3))];
    c.num_heads = divisor_of(rng, c.embed_dim);
    c.bias = rng.coin();
    c.add_bias_kv = rng.coin(0.3);
    c.add_zero_attn = rng.coin(0.3);
    if (rng.coin(0.3)) c.kdim = rng.integer(1, 9), c.vdim = rng.integer(1, 9);
    c.batch_first = true;
    const int64_t B = rng.integer(1, 3), L = rng.integer(1, 6), S = rng.integer(1, 7);
    const MhaWeights<double> w = random_weights(rng, c);
    const Tensor<double> q = randn(rng, {B, L, c.embed_dim}), k = randn(rng, {B, S, c.key_dim()}),
                         v = randn(rng, {B, S, c.value_dim()});
    MhaInputs<double> in{q, k, v, {}, {}};
    random_masks(rng, B, c.num_heads, L, S, in.attn_mask, in.key_padding_mask);
    CAPTURE(seed, c.embed_dim, c.num_heads, c.bias, c.add_bias_kv, c.add_zero_attn, c.key_dim(), c.value_dim(), B, L, S,
            in.attn_mask.present(), in.key_padding_mask.present());
    const MhaOutputs<double> got = mha_forward(c, MhaForward{true, false}, w, in);
    const twin::MhaResult want = twin::mha(c, w, q, k, v, in.attn_mask, in.key_padding_mask);
    same(got.output, want.output);
    same(got.attn_weights, want.weights);
  }
}

namespace {

EncoderConfig random_layer_config(Rng& rng) {
  EncoderConfig c;
  c.d_model = std::vector<int64_t>{4, 8, 12}[size_t(rng.integer(0, 2))];
  c.nhead = divisor_of(rng, c.d_model);
  c.dim_feedforward = rng.integer(1, 20);
  c.activation = rng.coin() ? Activation::Gelu : Activation::Relu;
  c.layer_norm_eps = std::vector<double>{1e-5, 1e-3, 0.5}[size_t(rng.integer(0, 2))];
  c.norm_first = rng.coin();
  c.batch_first = true;
  return c;
}

void random_norm(Rng& rng, int64_t d, Tensor<double>& g, Tensor<double>& b) {
  g = randn(rng, {d}, 0.2);
  for (double& x : g.data) x += 1;
  b = randn(rng, {d}, 0.2);
}

EncoderWeights<double> random_layer(Rng& rng, const EncoderConfig& c) {
  const int64_t d = c.d_model, F = c.dim_feedforward;
  EncoderWeights<double> w;
  w.self_attn = random_weights(rng, c.self_attn());
  w.linear1_weight = randn(rng, {F, d}, 1 / std::sqrt(double(d)));
  w.linear1_bias = randn(rng, {F}, 0.2);
  w.linear2_weight = randn(rng, {d, F}, 1 / std::sqrt(double(F)));
  w.linear2_bias = randn(rng, {d}, 0.2);
  random_norm(rng, d, w.norm1_weight, w.norm1_bias);
  random_norm(rng, d, w.norm2_weight, w.norm2_bias);
  return w;
}

}  // namespace

TEST_CASE("twin: the encoder layer over a seeded grid of options", "[twin]") {
  for (uint64_t seed = 1; seed <= 150; ++seed) {
    Rng rng(seed);
    const EncoderConfig c = random_layer_config(rng);
    const EncoderWeights<double> w = random_layer(rng, c);
    const int64_t B = rng.integer(1, 3), T = rng.integer(1, 6);
    EncoderInputs<double> in{randn(rng, {B, T, c.d_model}), {}, {}};
    random_masks(rng, B, c.nhead, T, T, in.src_mask, in.src_key_padding_mask);
    CAPTURE(seed, c.d_model, c.nhead, c.dim_feedforward, c.norm_first, c.layer_norm_eps, int(c.activation), B, T);
    same(encoder_layer_forward(c, w, in), twin::encoder(c, w, in.src, in.src_mask, in.src_key_padding_mask));
  }
}

TEST_CASE("twin: the encoder stack / layers in order then the final norm", "[twin]") {
  for (uint64_t seed = 1; seed <= 60; ++seed) {
    Rng rng(seed);
    EncoderStackConfig sc{random_layer_config(rng), rng.integer(1, 3), rng.coin()};
    EncoderStackWeights<double> w;
    for (int64_t i = 0; i < sc.num_layers; ++i) w.layers.push_back(random_layer(rng, sc.layer));
    random_norm(rng, sc.layer.d_model, w.norm_weight, w.norm_bias);
    const int64_t B = rng.integer(1, 3), T = rng.integer(1, 6);
    EncoderInputs<double> in{randn(rng, {B, T, sc.layer.d_model}), {}, {}};
    random_masks(rng, B, sc.layer.nhead, T, T, in.src_mask, in.src_key_padding_mask);
    CAPTURE(seed, sc.num_layers, sc.norm, sc.layer.norm_first);
    Tensor<double> x = in.src;
    for (const EncoderWeights<double>& lw : w.layers)
      x = twin::encoder(sc.layer, lw, x, in.src_mask, in.src_key_padding_mask);
    if (sc.norm) {
      const auto y = twin::layer_norm(twin::widen(x), w.norm_weight, w.norm_bias, sc.layer.layer_norm_eps, B * T,
                                      sc.layer.d_model);
      for (size_t i = 0; i < y.size(); ++i) x.data[i] = double(y[i]);
    }
    same(encoder_forward(sc, w, in), x);
  }
}

TEST_CASE("twin: the decoder layer over a seeded grid of options", "[twin]") {
  for (uint64_t seed = 1; seed <= 150; ++seed) {
    Rng rng(seed);
    const EncoderConfig c = random_layer_config(rng);
    const EncoderWeights<double> base = random_layer(rng, c);
    DecoderWeights<double> w;
    w.self_attn = base.self_attn;
    w.multihead_attn = random_weights(rng, c.self_attn());
    w.linear1_weight = base.linear1_weight, w.linear1_bias = base.linear1_bias;
    w.linear2_weight = base.linear2_weight, w.linear2_bias = base.linear2_bias;
    w.norm1_weight = base.norm1_weight, w.norm1_bias = base.norm1_bias;
    w.norm2_weight = base.norm2_weight, w.norm2_bias = base.norm2_bias;
    random_norm(rng, c.d_model, w.norm3_weight, w.norm3_bias);
    const int64_t B = rng.integer(1, 3), T = rng.integer(1, 6), S = rng.integer(1, 7);
    DecoderInputs<double> in{randn(rng, {B, T, c.d_model}), randn(rng, {B, S, c.d_model}), {}, {}, {}, {}};
    random_masks(rng, B, c.nhead, T, T, in.tgt_mask, in.tgt_key_padding_mask);
    random_masks(rng, B, c.nhead, T, S, in.memory_mask, in.memory_key_padding_mask);
    CAPTURE(seed, c.d_model, c.nhead, c.dim_feedforward, c.norm_first, c.layer_norm_eps, int(c.activation), B, T, S);
    same(decoder_layer_forward(c, w, in), twin::decoder(c, w, in.tgt, in.memory, in.tgt_mask, in.memory_mask,
                                                        in.tgt_key_padding_mask, in.memory_key_padding_mask));
  }
}

TEST_CASE("twin: scaled dot-product attention / every leading slice on its own", "[twin]") {
  Rng rng(7);
  const int64_t G1 = 2, G2 = 3, L = 5, S = 7, E = 3, Ev = 4;
  const Tensor<double> q = randn(rng, {G1, G2, L, E}), k = randn(rng, {G1, G2, S, E}), v = randn(rng, {G1, G2, S, Ev});
  const Tensor<double> out = sdpa_forward(q, k, v);
  REQUIRE(out.shape == Shape{G1, G2, L, Ev});
  for (int64_t g = 0; g < G1 * G2; ++g) {
    CAPTURE(g);
    const std::vector<twin::LD> want = twin::sdpa(twin::widen(q, g * L * E, L * E), twin::widen(k, g * S * E, S * E),
                                                  twin::widen(v, g * S * Ev, S * Ev), L, S, E, Ev);
    for (int64_t i = 0; i < L * Ev; ++i)
      CHECK(out.data[size_t(g * L * Ev + i)] == Approx(double(want[size_t(i)])).epsilon(1e-14).margin(1e-15));
  }
}
