// Attention against hand-worked answers and the invariants any correct implementation has.
#include <catch2/catch.hpp>
#include <cmath>
#include <limits>
#include <map>
#include <stdexcept>
#include <string>
#include <utility>

#include "support.hpp"
#include "tparity/core/attention.hpp"
#include "tparity/core/ops.hpp"
#include "tparity/harness/rng.hpp"
#include "twin.hpp"

using namespace tparity;
using test::divisor_of;
using test::randn;
using test::random_bool;

namespace {

constexpr double kInf = std::numeric_limits<double>::infinity();

MhaWeights<double> random_weights(const MhaConfig& c, Rng& rng) {
  const int64_t E = c.embed_dim;
  MhaWeights<double> w;
  if (c.packed())
    w.in_proj_weight = randn(rng, {3 * E, E}, 0.3);
  else {
    w.q_proj_weight = randn(rng, {E, E}, 0.3);
    w.k_proj_weight = randn(rng, {E, c.key_dim()}, 0.3);
    w.v_proj_weight = randn(rng, {E, c.value_dim()}, 0.3);
  }
  if (c.bias) {
    w.in_proj_bias = randn(rng, {3 * E}, 0.1);
    w.out_proj_bias = randn(rng, {E}, 0.1);
  }
  if (c.add_bias_kv) {
    w.bias_k = randn(rng, {1, 1, E});
    w.bias_v = randn(rng, {1, 1, E});
  }
  w.out_proj_weight = randn(rng, {E, E}, 0.3);
  return w;
}

struct Record final : Observer<double> {
  std::map<std::string, Tensor<double>> seen;
  void on(const std::string& name, Tensor<double>& v) override { seen[name] = v; }
};

// Row `b` of a (B, ...) tensor as its own tensor without the batch dim.
Tensor<double> row(const Tensor<double>& t, int64_t b) {
  Shape s(t.shape.begin() + 1, t.shape.end());
  const int64_t n = numel(s);
  return Tensor<double>(s, std::vector<double>(t.data.begin() + b * n, t.data.begin() + (b + 1) * n));
}

MhaConfig config(int64_t E, int64_t H, bool bias = true) {
  MhaConfig c;
  c.embed_dim = E;
  c.num_heads = H;
  c.bias = bias;
  c.batch_first = true;
  return c;
}

}  // namespace

TEST_CASE("sdpa: a hand-worked answer / with and without a mask", "[attention]") {
  // q = (1, 0), keys (1, 0), (0, 1), (0, 0), values 1, 2, 3; scores (1, 0, 0) / sqrt(2).
  const Tensor<double> q({1, 2}, {1, 0}), k({3, 2}, {1, 0, 0, 1, 0, 0}), v({3, 1}, {1, 2, 3});
  const double a = std::exp(1 / std::sqrt(2.0));
  Tensor<double> out = sdpa_forward(q, k, v);
  CHECK(out.shape == Shape{1, 1});
  CHECK(out.data[0] == Approx((a * 1 + 2 + 3) / (a + 2)).epsilon(1e-15));

  // Key 0 masked (bool true = masked out): the other two share the weight, the output is 2.5.
  out = sdpa_forward(q, k, v, Mask<double>::of_bool(Tensor<uint8_t>({1, 3}, {1, 0, 0})));
  CHECK(out.data[0] == 2.5);
  // The same mask as float -inf.
  out = sdpa_forward(q, k, v, Mask<double>::of_float(Tensor<double>({1, 3}, {-kInf, 0, 0})));
  CHECK(out.data[0] == 2.5);
}

TEST_CASE("sdpa: L != S and Ev != E / leading dims carried through", "[attention]") {
  Rng rng(5);
  Record rec;
  const Tensor<double> out =
      sdpa_forward(randn(rng, {2, 5, 3}), randn(rng, {2, 7, 3}), randn(rng, {2, 7, 4}), {}, &rec);
  CHECK(out.shape == Shape{2, 5, 4});
  CHECK(rec.seen.at("scores").shape == Shape{2, 5, 7});
  CHECK(rec.seen.at("attn_weights").shape == Shape{2, 5, 7});
  CHECK_THROWS_AS(sdpa_forward(randn(rng, {2, 5, 3}), randn(rng, {2, 7, 4}), randn(rng, {2, 7, 4})), ShapeError);
  CHECK_THROWS_AS(sdpa_forward(randn(rng, {2, 5, 3}), randn(rng, {2, 7, 3}), randn(rng, {2, 6, 4})), ShapeError);
}

TEST_CASE("sdpa: scale multiplies the scores / negative and zero included", "[attention]") {
  // The hand-worked problem above with scale -2: scores (-2, 0, 0); with 0 every key weighs 1/3.
  const Tensor<double> q({1, 2}, {1, 0}), k({3, 2}, {1, 0, 0, 1, 0, 0}), v({3, 1}, {1, 2, 3});
  SdpaOptions o;
  o.scale = -2.0;
  const double a = std::exp(-2.0);
  CHECK(sdpa_forward<double>(q, k, v, {}, nullptr, TorchSemantics::Torch2, o).data[0] ==
        Approx((a * 1 + 2 + 3) / (a + 2)).epsilon(1e-15));
  o.scale = 0.0;
  CHECK(sdpa_forward<double>(q, k, v, {}, nullptr, TorchSemantics::Torch2, o).data[0] == Approx(2.0).epsilon(1e-15));
  o.scale = std::numeric_limits<double>::quiet_NaN();
  CHECK_THROWS_AS(sdpa_forward<double>(q, k, v, {}, nullptr, TorchSemantics::Torch2, o), std::invalid_argument);
}

TEST_CASE("sdpa: is_causal is the lower-triangular mask / refused beside a mask", "[attention]") {
  // Top-left aligned as torch's ones(L, S).tril(): query i sees keys 0..i, also when L != S.
  Rng rng(6);
  for (const auto& [L, S] : {std::pair<int64_t, int64_t>{5, 5}, {4, 7}, {7, 3}}) {
    CAPTURE(L, S);
    const Tensor<double> q = randn(rng, {2, L, 3}), k = randn(rng, {2, S, 3}), v = randn(rng, {2, S, 4});
    Tensor<uint8_t> tril({L, S});
    for (int64_t i = 0; i < L; ++i)
      for (int64_t j = 0; j < S; ++j) tril.data[size_t(i * S + j)] = j > i;  // true = masked out
    SdpaOptions causal;
    causal.is_causal = true;
    const Tensor<double> flag = sdpa_forward<double>(q, k, v, {}, nullptr, TorchSemantics::Torch2, causal);
    const Tensor<double> masked =
        sdpa_forward<double>(q, k, v, Mask<double>::of_bool(tril), nullptr, TorchSemantics::Torch2);
    CHECK(flag.data == masked.data);
    CHECK_THROWS_AS(sdpa_forward<double>(q, k, v, Mask<double>::of_bool(tril), nullptr, TorchSemantics::Torch2, causal),
                    std::invalid_argument);
  }
}

TEST_CASE("sdpa: grouped-query attention is the key and value heads repeated / the heads must divide", "[attention]") {
  // enable_gqa: query head h reads kv head h / (Hq / Hkv), as repeat_interleave(Hq / Hkv, dim=-3).
  Rng rng(7);
  const int64_t B = 2, Hq = 6, L = 4, S = 5, E = 3, Ev = 2;
  for (int64_t Hkv : {1, 2, 3, 6}) {
    CAPTURE(Hkv);
    const Tensor<double> q = randn(rng, {B, Hq, L, E}), k = randn(rng, {B, Hkv, S, E}), v = randn(rng, {B, Hkv, S, Ev});
    auto repeat = [&](const Tensor<double>& t, int64_t n) {
      Tensor<double> r({B, Hq, S, n});
      for (int64_t b = 0; b < B; ++b)
        for (int64_t h = 0; h < Hq; ++h)
          for (int64_t i = 0; i < S * n; ++i)
            r.data[size_t((b * Hq + h) * S * n + i)] = t.data[size_t((b * Hkv + h / (Hq / Hkv)) * S * n + i)];
      return r;
    };
    SdpaOptions gqa;
    gqa.enable_gqa = true;
    const Tensor<double> grouped = sdpa_forward<double>(q, k, v, {}, nullptr, TorchSemantics::Torch2, gqa);
    const Tensor<double> repeated =
        sdpa_forward<double>(q, repeat(k, E), repeat(v, Ev), {}, nullptr, TorchSemantics::Torch2);
    CHECK(grouped.shape == Shape{B, Hq, L, Ev});
    CHECK(grouped.data == repeated.data);
  }
  SdpaOptions gqa;
  gqa.enable_gqa = true;
  CHECK_THROWS_AS(sdpa_forward<double>(randn(rng, {6, 4, 3}), randn(rng, {4, 5, 3}), randn(rng, {4, 5, 2}), {}, nullptr,
                                       TorchSemantics::Torch2, gqa),
                  ShapeError);
  // Without enable_gqa the heads must match.
  CHECK_THROWS_AS(sdpa_forward(randn(rng, {6, 4, 3}), randn(rng, {2, 5, 3}), randn(rng, {2, 5, 2})), ShapeError);
}

TEST_CASE("mha: masked keys get exactly zero weight and rows sum to one", "[attention]") {
  Rng rng(17);
  const int64_t B = 3, L = 6, E = 8, H = 2;
  const MhaConfig c = config(E, H);
  Tensor<uint8_t> am({L, L}), kpm({B, L});
  for (int64_t i = 0; i < L * L; ++i) am.data[size_t(i)] = (i % L != 0) && rng.coin(0.3);  // key 0 always visible
  for (int64_t b = 0; b < B; ++b)
    for (int64_t j = L - b; j < L; ++j) kpm.data[size_t(b * L + j)] = 1;
  const Tensor<double> x = randn(rng, {B, L, E});
  const MhaInputs<double> in{x, x, x, Mask<double>::of_bool(am), Mask<double>::of_bool(kpm)};
  const MhaOutputs<double> out = mha_forward(c, MhaForward{true, false}, random_weights(c, rng), in);
  REQUIRE(out.attn_weights.shape == Shape{B, H, L, L});
  for (int64_t b = 0; b < B; ++b)
    for (int64_t h = 0; h < H; ++h)
      for (int64_t i = 0; i < L; ++i) {
        double s = 0;
        for (int64_t j = 0; j < L; ++j) {
          const double wij = out.attn_weights.data[size_t(((b * H + h) * L + i) * L + j)];
          if (am.data[size_t(i * L + j)] || kpm.data[size_t(b * L + j)]) CHECK(wij == 0.0);
          s += wij;
        }
        CHECK(s == Approx(1.0).epsilon(1e-14));
      }
}

TEST_CASE("mha: the batched output equals the stacked single-sample outputs", "[attention]") {
  Rng rng(23);
  const int64_t B = 4, L = 5, S = 7, E = 12, H = 3;
  const MhaConfig c = config(E, H);
  const MhaWeights<double> w = random_weights(c, rng);
  const Tensor<double> q = randn(rng, {B, L, E}), kv = randn(rng, {B, S, E});
  Tensor<uint8_t> kpm({B, S});
  for (int64_t b = 0; b < B; ++b) kpm.data[size_t(b * S + S - 1 - b)] = 1;
  const MhaOutputs<double> all =
      mha_forward(c, MhaForward{}, w, MhaInputs<double>{q, kv, kv, {}, Mask<double>::of_bool(kpm)});
  for (int64_t b = 0; b < B; ++b) {
    CAPTURE(b);
    const Tensor<uint8_t> kb({S}, std::vector<uint8_t>(kpm.data.begin() + b * S, kpm.data.begin() + (b + 1) * S));
    const MhaOutputs<double> one = mha_forward(
        c, MhaForward{}, w, MhaInputs<double>{row(q, b), row(kv, b), row(kv, b), {}, Mask<double>::of_bool(kb)});
    // Each sample's arithmetic is the same sequence of operations batched or not: exact equality.
    CHECK(one.output.data == row(all.output, b).data);
    CHECK(one.attn_weights.data == row(all.attn_weights, b).data);
  }
}

TEST_CASE("mha: multi-head equals the per-head attentions concatenated / then out_proj", "[attention]") {
  Rng rng(29);
  const int64_t B = 2, L = 4, S = 6, E = 12, H = 3, D = E / H;
  const MhaConfig c = config(E, H);
  const MhaWeights<double> w = random_weights(c, rng);
  const Tensor<double> q = randn(rng, {B, L, E}), kv = randn(rng, {B, S, E});
  const MhaOutputs<double> out = mha_forward(c, MhaForward{}, w, MhaInputs<double>{q, kv, kv, {}, {}});

  // Independent route: per head h, project with rows [h*D, (h+1)*D) of each third of in_proj, run the
  // long-double single-head twin of scaled dot-product attention, concatenate, project.
  Tensor<double> concat({B, L, E});
  for (int64_t b = 0; b < B; ++b)
    for (int64_t h = 0; h < H; ++h) {
      const Tensor<double> qb({L, E},
                              std::vector<double>(q.data.begin() + b * L * E, q.data.begin() + (b + 1) * L * E));
      const Tensor<double> kb({S, E},
                              std::vector<double>(kv.data.begin() + b * S * E, kv.data.begin() + (b + 1) * S * E));
      const auto qh = twin::linear(twin::widen(qb), w.in_proj_weight, &w.in_proj_bias, L, E, D, 0 * E + h * D);
      const auto kh = twin::linear(twin::widen(kb), w.in_proj_weight, &w.in_proj_bias, S, E, D, 1 * E + h * D);
      const auto vh = twin::linear(twin::widen(kb), w.in_proj_weight, &w.in_proj_bias, S, E, D, 2 * E + h * D);
      const auto oh = twin::sdpa(qh, kh, vh, L, S, D, D);
      for (int64_t l = 0; l < L; ++l)
        for (int64_t d = 0; d < D; ++d)
          concat.data[size_t((b * L + l) * E + h * D + d)] = double(oh[size_t(l * D + d)]);
    }
  const auto expect = twin::linear(twin::widen(concat), w.out_proj_weight, &w.out_proj_bias, B * L, E, E);
  for (size_t i = 0; i < expect.size(); ++i) CHECK(out.output.data[i] == Approx(double(expect[i])).margin(1e-13));
}

TEST_CASE("mha: with a causal mask / appending tokens leaves earlier outputs unchanged", "[attention]") {
  Rng rng(31);
  const int64_t B = 2, T = 9, extra = 4, E = 8, H = 2;
  const MhaConfig c = config(E, H);
  const MhaWeights<double> w = random_weights(c, rng);
  const Tensor<double> longer = randn(rng, {B, T + extra, E});
  Tensor<double> shorter({B, T, E});
  for (int64_t b = 0; b < B; ++b)
    for (int64_t i = 0; i < T * E; ++i)
      shorter.data[size_t(b * T * E + i)] = longer.data[size_t(b * (T + extra) * E + i)];
  auto causal = [](int64_t n) {
    Tensor<double> m({n, n});
    for (int64_t i = 0; i < n; ++i)
      for (int64_t j = i + 1; j < n; ++j) m.data[size_t(i * n + j)] = -kInf;
    return Mask<double>::of_float(m);
  };
  const Tensor<double> a =
      mha_forward(c, MhaForward{}, w, MhaInputs<double>{shorter, shorter, shorter, causal(T), {}}).output;
  const Tensor<double> b =
      mha_forward(c, MhaForward{}, w, MhaInputs<double>{longer, longer, longer, causal(T + extra), {}}).output;
  // Masked keys contribute exp(-inf) = 0 exactly and add zeros to the sums: exact equality.
  for (int64_t bb = 0; bb < B; ++bb)
    for (int64_t i = 0; i < T * E; ++i)
      CHECK(a.data[size_t(bb * T * E + i)] == b.data[size_t(bb * (T + extra) * E + i)]);
}

TEST_CASE("mha: sequence-first / batch-first and unbatched layouts give the same numbers", "[attention]") {
  Rng rng(37);
  const int64_t B = 3, L = 4, E = 8, H = 2;
  MhaConfig c = config(E, H);
  const MhaWeights<double> w = random_weights(c, rng);
  const Tensor<double> x = randn(rng, {B, L, E});
  Tensor<double> xs({L, B, E});  // (B, L, E) -> (L, B, E)
  for (int64_t b = 0; b < B; ++b)
    for (int64_t l = 0; l < L; ++l)
      for (int64_t e = 0; e < E; ++e) xs.data[size_t((l * B + b) * E + e)] = x.data[size_t((b * L + l) * E + e)];
  const MhaOutputs<double> bf = mha_forward(c, MhaForward{}, w, MhaInputs<double>{x, x, x, {}, {}});
  c.batch_first = false;
  const MhaOutputs<double> sf = mha_forward(c, MhaForward{}, w, MhaInputs<double>{xs, xs, xs, {}, {}});
  REQUIRE(sf.output.shape == Shape{L, B, E});
  for (int64_t b = 0; b < B; ++b)
    for (int64_t l = 0; l < L; ++l)
      for (int64_t e = 0; e < E; ++e)
        CHECK(sf.output.data[size_t((l * B + b) * E + e)] == bf.output.data[size_t((b * L + l) * E + e)]);
  CHECK(sf.attn_weights.data == bf.attn_weights.data);  // weights are (B, L, S) in both layouts
  const MhaOutputs<double> un =
      mha_forward(c, MhaForward{}, w, MhaInputs<double>{row(x, 1), row(x, 1), row(x, 1), {}, {}});
  CHECK(un.output.shape == Shape{L, E});
  CHECK(un.attn_weights.shape == Shape{L, L});
  CHECK(un.output.data == row(bf.output, 1).data);
}

TEST_CASE("mha: averaged weights are the mean of the per-head weights", "[attention]") {
  Rng rng(41);
  const MhaConfig c = config(12, 4);
  const MhaWeights<double> w = random_weights(c, rng);
  const Tensor<double> x = randn(rng, {2, 5, 12});
  const MhaInputs<double> in{x, x, x, {}, {}};
  const Tensor<double> avg = mha_forward(c, MhaForward{true, true}, w, in).attn_weights;
  const Tensor<double> per = mha_forward(c, MhaForward{true, false}, w, in).attn_weights;
  REQUIRE(per.shape == Shape{2, 4, 5, 5});
  REQUIRE(avg.shape == Shape{2, 5, 5});
  for (int64_t b = 0; b < 2; ++b)
    for (int64_t i = 0; i < 25; ++i) {
      double s = 0;
      for (int64_t h = 0; h < 4; ++h) s += per.data[size_t((b * 4 + h) * 25 + i)];
      CHECK(avg.data[size_t(b * 25 + i)] == Approx(s / 4).epsilon(1e-15));
    }
  CHECK(mha_forward(c, MhaForward{false, true}, w, in).attn_weights.empty());
}

TEST_CASE("mha: add_bias_kv appends bias_k and bias_v as a key / add_zero_attn a zero key with score 0",
          "[attention]") {
  Rng rng(43);
  MhaConfig c = config(8, 2);
  c.add_bias_kv = true;
  c.add_zero_attn = true;
  const MhaWeights<double> w = random_weights(c, rng);
  const int64_t B = 2, L = 3, S = 4, D = 4;
  const Tensor<double> q = randn(rng, {B, L, 8}), kv = randn(rng, {B, S, 8});
  Record rec;
  const MhaOutputs<double> out = mha_forward(c, MhaForward{true, false}, w, MhaInputs<double>{q, kv, kv, {}, {}}, &rec);
  CHECK(out.attn_weights.shape == Shape{B, 2, L, S + 2});
  const Tensor<double>& k = rec.seen.at("k");
  const Tensor<double>& v = rec.seen.at("v");
  const Tensor<double>& scores = rec.seen.at("scores");
  REQUIRE(k.shape == Shape{B, 2, S + 2, D});
  for (int64_t b = 0; b < B; ++b)
    for (int64_t h = 0; h < 2; ++h) {
      for (int64_t d = 0; d < D; ++d) {
        CHECK(k.data[size_t(((b * 2 + h) * (S + 2) + S) * D + d)] == w.bias_k.data[size_t(h * D + d)]);
        CHECK(v.data[size_t(((b * 2 + h) * (S + 2) + S) * D + d)] == w.bias_v.data[size_t(h * D + d)]);
        CHECK(k.data[size_t(((b * 2 + h) * (S + 2) + S + 1) * D + d)] == 0.0);
      }
      for (int64_t i = 0; i < L; ++i) CHECK(scores.data[size_t(((b * 2 + h) * L + i) * (S + 2) + S + 1)] == 0.0);
    }
}

TEST_CASE("mha: a float key padding mask is added / and with a bool attn_mask its nonzeros mask (torch 1.13)",
          "[attention]") {
  Rng rng(47);
  const MhaConfig c = config(8, 2);
  const MhaWeights<double> w = random_weights(c, rng);
  const int64_t L = 3, S = 5;
  const Tensor<double> q = randn(rng, {L, 8}), kv = randn(rng, {S, 8});
  const Tensor<double> pad({S}, {0.5, -1.0, 0.0, 2.0, -0.25});
  Record plain, padded;
  mha_forward(c, MhaForward{}, w, MhaInputs<double>{q, kv, kv, {}, {}}, &plain);
  mha_forward(c, MhaForward{}, w, MhaInputs<double>{q, kv, kv, {}, Mask<double>::of_float(pad)}, &padded);
  const Tensor<double>& s0 = plain.seen.at("scores");
  const Tensor<double>& s1 = padded.seen.at("scores");
  for (int64_t i = 0; i < s0.numel(); ++i) CHECK(s1.data[size_t(i)] == s0.data[size_t(i)] + pad.data[size_t(i % S)]);

  // bool attn_mask with a float key padding mask: attn_mask.logical_or(kpm) in torch 1.13.
  const Tensor<uint8_t> none({L, S});
  const MhaOutputs<double> o =
      mha_forward(c, MhaForward{true, true}, w,
                  MhaInputs<double>{q, kv, kv, Mask<double>::of_bool(none), Mask<double>::of_float(pad)});
  for (int64_t i = 0; i < L; ++i)
    for (int64_t j = 0; j < S; ++j)
      CHECK((o.attn_weights.data[size_t(i * S + j)] == 0.0) == (pad.data[size_t(j)] != 0.0));

  // Two float masks: torch 1.13 raises; so does the core.
  CHECK_THROWS_AS(mha_forward(c, MhaForward{}, w,
                              MhaInputs<double>{q, kv, kv, Mask<double>::of_float(Tensor<double>({L, S})),
                                                Mask<double>::of_float(pad)}),
                  std::invalid_argument);
}

TEST_CASE("mha: kdim and vdim use separate projection weights", "[attention]") {
  Rng rng(53);
  MhaConfig c = config(8, 2);
  c.kdim = 5;
  c.vdim = 7;
  REQUIRE_FALSE(c.packed());
  MhaWeights<double> w = random_weights(c, rng);
  const Tensor<double> q = randn(rng, {2, 3, 8}), k = randn(rng, {2, 4, 5}), v = randn(rng, {2, 4, 7});
  const MhaOutputs<double> o = mha_forward(c, MhaForward{}, w, MhaInputs<double>{q, k, v, {}, {}});
  CHECK(o.output.shape == Shape{2, 3, 8});
  CHECK(o.attn_weights.shape == Shape{2, 3, 4});
  const twin::MhaResult want = twin::mha(c, w, q, k, v, {}, {});
  for (size_t i = 0; i < o.output.data.size(); ++i)
    CHECK(o.output.data[i] == Approx(want.output.data[i]).margin(1e-13));
  // Each projection matters: perturbing k_proj_weight or v_proj_weight moves the output.
  for (Tensor<double>* W : {&w.k_proj_weight, &w.v_proj_weight}) {
    MhaWeights<double> w2 = w;
    (W == &w.k_proj_weight ? w2.k_proj_weight : w2.v_proj_weight).data[0] += 0.5;
    CHECK(mha_forward(c, MhaForward{}, w2, MhaInputs<double>{q, k, v, {}, {}}).output.data != o.output.data);
  }
}

TEST_CASE("mha: shapes that contradict the config are refused / naming the tensor", "[attention]") {
  Rng rng(59);
  const MhaConfig c = config(8, 2);
  const MhaWeights<double> w = random_weights(c, rng);
  const Tensor<double> x = randn(rng, {2, 3, 8});
  auto msg = [&](const MhaInputs<double>& in, MhaConfig cc = MhaConfig{}) {
    try {
      mha_forward(cc.embed_dim ? cc : c, MhaForward{}, w, in);
    } catch (const ShapeError& e) {
      return std::string(e.what());
    }
    return std::string("no error");
  };
  CHECK_THAT(msg({randn(rng, {2, 3, 6}), x, x, {}, {}}), Catch::StartsWith("query: expected last dim embed_dim = 8"));
  CHECK_THAT(msg({x, randn(rng, {2, 4, 8}), x, {}, {}}), Catch::StartsWith("value:"));
  CHECK_THAT(msg({x, x, x, Mask<double>::of_float(Tensor<double>({3, 4})), {}}),
             Catch::StartsWith("attn_mask: expected shape [3, 3]"));
  CHECK_THAT(msg({x, x, x, Mask<double>::of_float(Tensor<double>({5, 3, 3})), {}}),
             Catch::StartsWith("attn_mask: expected shape [4, 3, 3]"));
  CHECK_THAT(msg({x, x, x, {}, Mask<double>::of_bool(Tensor<uint8_t>({3, 2}))}),
             Catch::StartsWith("key_padding_mask: expected shape [2, 3]"));
  CHECK_THAT(msg({randn(rng, {3}), x, x, {}, {}}), Catch::StartsWith("query: expected 2 dims"));
  MhaConfig bad = c;
  bad.num_heads = 3;
  CHECK_THAT(msg({x, x, x, {}, {}}, bad), Catch::Contains("not divisible by num_heads 3"));
}

TEST_CASE("mha: the observer sees the documented components and changes nothing", "[attention]") {
  Rng rng(61);
  const MhaConfig c = config(8, 2);
  const MhaWeights<double> w = random_weights(c, rng);
  const Tensor<double> x = randn(rng, {2, 3, 8});
  Record rec;
  const MhaOutputs<double> with = mha_forward(c, MhaForward{}, w, MhaInputs<double>{x, x, x, {}, {}}, &rec);
  const MhaOutputs<double> without = mha_forward(c, MhaForward{}, w, MhaInputs<double>{x, x, x, {}, {}});
  CHECK(with.output.data == without.output.data);
  CHECK(with.attn_weights.data == without.attn_weights.data);
  // q, k, v: the plain projections (q unscaled), split (B, L, E) -> (B, H, L, E/H).
  Tensor<double> proj({2, 3, 24});
  linear_forward(proj.ptr(), x.ptr(), w.in_proj_weight.ptr(), w.in_proj_bias.ptr(), 6, 8, 24);
  const char* names[3] = {"q", "k", "v"};
  for (int64_t part = 0; part < 3; ++part) {
    const Tensor<double>& t = rec.seen.at(names[part]);
    REQUIRE(t.shape == Shape{2, 2, 3, 4});
    for (int64_t b = 0; b < 2; ++b)
      for (int64_t h = 0; h < 2; ++h)
        for (int64_t l = 0; l < 3; ++l)
          for (int64_t d = 0; d < 4; ++d)
            CHECK(t.data[size_t(((b * 2 + h) * 3 + l) * 4 + d)] ==
                  proj.data[size_t((b * 3 + l) * 24 + part * 8 + h * 4 + d)]);
  }
  CHECK(rec.seen.at("scores").shape == Shape{2, 2, 3, 3});
  // Per-head weights are the softmax of the scores; their head mean is what the call returned.
  const Tensor<double>& sc = rec.seen.at("scores");
  const Tensor<double>& aw = rec.seen.at("attn_weights");
  REQUIRE(aw.shape == Shape{2, 2, 3, 3});
  for (int64_t r = 0; r < 12; ++r) {
    double mx = -1e300, tot = 0;
    for (int64_t j = 0; j < 3; ++j) mx = std::max(mx, sc.data[size_t(r * 3 + j)]);
    for (int64_t j = 0; j < 3; ++j) tot += std::exp(sc.data[size_t(r * 3 + j)] - mx);
    for (int64_t j = 0; j < 3; ++j)
      CHECK(aw.data[size_t(r * 3 + j)] == Approx(std::exp(sc.data[size_t(r * 3 + j)] - mx) / tot).epsilon(1e-14));
  }
  CHECK(rec.seen.at("attn_weights_avg").data == with.attn_weights.data);
  CHECK(rec.seen.at("context").shape == Shape{2, 3, 8});
  CHECK(rec.seen.at("output").data == with.output.data);
  CHECK(rec.seen.size() == 8);
}
