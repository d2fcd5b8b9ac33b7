// The fast path (the GEMM, threads) against the plain reference path it replaced, which stays.
#include <catch2/catch.hpp>
#include <cmath>

#include "support.hpp"
#include "tparity/core/attention.hpp"
#include "tparity/core/ops.hpp"
#include "tparity/core/parallel.hpp"

using namespace tparity;
using test::randn;

namespace {

// |fast - ref| <= 2 gamma_K sum_k |a_k b_k| (+ |bias|), both computing the same sum in T in different
// orders; gamma_K = K u / (1 - K u) (Higham, 3.1).
template <class T>
double gamma(int64_t K) {
  const double u = sizeof(T) == 4 ? std::ldexp(1.0, -24) : std::ldexp(1.0, -53);
  return double(K + 1) * u / (1 - double(K + 1) * u);
}

template <class T>
void check_products() {
  Rng rng(5);
  for (auto [N, C, OC] : {std::tuple<int64_t, int64_t, int64_t>{1, 1, 1}, {7, 33, 5}, {100, 64, 192}, {31, 300, 17}}) {
    CAPTURE(N, C, OC);
    const Tensor<T> x = cast<T>(randn(rng, {N, C})), w = cast<T>(randn(rng, {OC, C})), b = cast<T>(randn(rng, {OC}));
    Tensor<T> fast({N, OC}), ref({N, OC});
    linear_forward(fast.ptr(), x.ptr(), w.ptr(), b.ptr(), N, C, OC);
    linear_forward_ref(ref.ptr(), x.ptr(), w.ptr(), b.ptr(), N, C, OC);
    for (int64_t n = 0; n < N; ++n)
      for (int64_t o = 0; o < OC; ++o) {
        double mag = std::fabs(double(b.data[size_t(o)]));
        for (int64_t c = 0; c < C; ++c)
          mag += std::fabs(double(x.data[size_t(n * C + c)]) * double(w.data[size_t(o * C + c)]));
        CHECK(std::fabs(double(fast.data[size_t(n * OC + o)]) - double(ref.data[size_t(n * OC + o)])) <=
              2 * gamma<T>(C) * mag);
      }
  }
  // Batched attention products: q k^T and w v.
  const int64_t G = 6, L = 9, S = 13, E = 16;
  const Tensor<T> q = cast<T>(randn(rng, {G, L, E})), k = cast<T>(randn(rng, {G, S, E})),
                  v = cast<T>(randn(rng, {G, S, E}));
  Tensor<T> s1({G, L, S}), s2({G, L, S}), o1({G, L, E}), o2({G, L, E});
  qdotk(s1.ptr(), q.ptr(), k.ptr(), G, L, S, E);
  qdotk_ref(s2.ptr(), q.ptr(), k.ptr(), G, L, S, E);
  for (int64_t g = 0; g < G; ++g)
    for (int64_t i = 0; i < L; ++i)
      for (int64_t j = 0; j < S; ++j) {
        double m = 0;
        for (int64_t e = 0; e < E; ++e)
          m += std::fabs(double(q.data[size_t((g * L + i) * E + e)]) * double(k.data[size_t((g * S + j) * E + e)]));
        const size_t at = size_t((g * L + i) * S + j);
        CHECK(std::fabs(double(s1.data[at]) - double(s2.data[at])) <= 2 * gamma<T>(E) * m);
      }
  weighted_sum_v(o1.ptr(), s2.ptr(), v.ptr(), G, L, S, E);
  weighted_sum_v_ref(o2.ptr(), s2.ptr(), v.ptr(), G, L, S, E);
  for (int64_t g = 0; g < G; ++g)
    for (int64_t i = 0; i < L; ++i)
      for (int64_t e = 0; e < E; ++e) {
        double m = 0;
        for (int64_t j = 0; j < S; ++j)
          m += std::fabs(double(s2.data[size_t((g * L + i) * S + j)]) * double(v.data[size_t((g * S + j) * E + e)]));
        const size_t at = size_t((g * L + i) * E + e);
        CHECK(std::fabs(double(o1.data[at]) - double(o2.data[at])) <= 2 * gamma<T>(S) * m);
      }
}

}  // namespace

TEST_CASE("fast path: linear and the attention products agree with the reference loops", "[fast]") {
  check_products<float>();
  check_products<double>();
}

TEST_CASE("fast path: a whole attention with threads equals itself on one thread bit for bit", "[fast]") {
  Rng rng(9);
  MhaConfig c;
  c.embed_dim = 64, c.num_heads = 4, c.batch_first = true;
  MhaWeights<float> w;
  w.in_proj_weight = cast<float>(randn(rng, {192, 64}, 0.1));
  w.in_proj_bias = cast<float>(randn(rng, {192}, 0.1));
  w.out_proj_weight = cast<float>(randn(rng, {64, 64}, 0.1));
  w.out_proj_bias = cast<float>(randn(rng, {64}, 0.1));
  const Tensor<float> x = cast<float>(randn(rng, {8, 100, 64}));
  const int before = num_threads();
  set_num_threads(1);
  const MhaOutputs<float> one = mha_forward(c, MhaForward{}, w, MhaInputs<float>{x, x, x, {}, {}});
  set_num_threads(3);
  const MhaOutputs<float> three = mha_forward(c, MhaForward{}, w, MhaInputs<float>{x, x, x, {}, {}});
  set_num_threads(before);
  CHECK(one.output.data == three.output.data);
  CHECK(one.attn_weights.data == three.attn_weights.data);
  // And the reference path is still there, close to the fast one.
  set_core_path(CorePath::Reference);
  const MhaOutputs<float> ref = mha_forward(c, MhaForward{}, w, MhaInputs<float>{x, x, x, {}, {}});
  set_core_path(CorePath::Fast);
  double d2 = 0, r2 = 0;
  for (size_t i = 0; i < ref.output.data.size(); ++i) {
    d2 += std::pow(double(one.output.data[i]) - double(ref.output.data[i]), 2);
    r2 += std::pow(double(ref.output.data[i]), 2);
  }
  CHECK(std::sqrt(d2 / r2) < 1e-6);  // both float32 paths are within ~2e-7 of float64 (README)
  CHECK(std::sqrt(d2 / r2) > 0);     // and they are different computations
}

namespace {

struct FusedCase {
  const char* name;
  bool batched, bias_kv, zero_attn;
  const char* attn;  // "none", "bool", "causal" (float -inf), "float", "3d", "inf" (+inf where a key is padded)
  const char* kpm;   // "none", "bool", "float"
};

// NaN where both are NaN, else |a - b|^2 summed; counts positions where only one is NaN.
struct Diff {
  double d2 = 0, r2 = 0;
  int64_t nan_mismatch = 0, nan_both = 0;
};
template <class A, class B>
Diff diff(const Storage<A>& a, const Storage<B>& b) {
  Diff d;
  for (size_t i = 0; i < a.size(); ++i) {
    const bool na = std::isnan(double(a[i])), nb = std::isnan(double(b[i]));
    if (na || nb) {
      d.nan_mismatch += na != nb, d.nan_both += na && nb;
      continue;
    }
    d.d2 += std::pow(double(a[i]) - double(b[i]), 2), d.r2 += std::pow(double(b[i]), 2);
  }
  return d;
}

}  // namespace

TEST_CASE("fast path: attention without weights (fused, the L x S scores never held) keeps torch's semantics",
          "[fast]") {
  // mha_forward with need_weights=false and no observer streams the scores (fused_attention); with
  // need_weights=true it takes the unfused path. On every mask combination torch 1.13 accepts, the
  // double outputs agree to 1e-12 relative, the float ones are as close to the double truth as the
  // unfused float path is (2x its error plus 4 roundings), and NaN rows (every key masked) are the
  // same rows. A float attn_mask with +inf where a bool key_padding_mask masks the key is torch's
  // masked_fill (-inf), not a sum (NaN): that case falls back to the unfused path, bit for bit.
  const FusedCase cases[] = {
      {"plain", true, false, false, "none", "none"},
      {"causal", true, false, false, "causal", "none"},
      {"bool", true, false, false, "bool", "none"},
      {"float", true, false, false, "float", "none"},
      {"3d", true, false, false, "3d", "none"},
      {"kpm bool", true, false, false, "none", "bool"},
      {"kpm float", true, false, false, "none", "float"},
      {"bool+kpm float", true, false, false, "bool", "float"},
      {"float+kpm bool", true, false, false, "float", "bool"},
      {"bool+kpm bool", true, false, false, "bool", "bool"},
      {"bias_kv zero_attn causal kpm", true, true, true, "causal", "bool"},
      {"unbatched 3d", false, false, false, "3d", "none"},
      {"unbatched kpm", false, true, false, "none", "bool"},
      {"+inf under padding", true, false, false, "inf", "bool"},
  };
  const double u = std::ldexp(1.0, -24);
  const test::ScopedCorePath fast(CorePath::Fast);
  for (const FusedCase& fc : cases) {
    CAPTURE(fc.name);
    Rng rng(21);
    const int64_t B = fc.batched ? 3 : 1, L = 37, S0 = 41, E = 32, H = 4;
    MhaConfig c;
    c.embed_dim = E, c.num_heads = H, c.batch_first = true, c.add_bias_kv = fc.bias_kv, c.add_zero_attn = fc.zero_attn;
    MhaWeights<double> w;
    w.in_proj_weight = randn(rng, {3 * E, E}, 0.2);
    w.in_proj_bias = randn(rng, {3 * E}, 0.1);
    w.out_proj_weight = randn(rng, {E, E}, 0.2);
    w.out_proj_bias = randn(rng, {E}, 0.1);
    if (fc.bias_kv) w.bias_k = randn(rng, {1, 1, E}), w.bias_v = randn(rng, {1, 1, E});
    auto shape = [&](Shape s) {
      if (fc.batched) s.insert(s.begin(), B);
      return s;
    };
    const Tensor<double> q = randn(rng, shape({L, E})), kv = randn(rng, shape({S0, E}));
    MhaInputs<double> in{q, kv, kv, {}, {}};
    const std::string attn = fc.attn, kpm = fc.kpm;
    if (attn == "bool") {
      Tensor<uint8_t> m = test::random_bool(rng, {L, S0}, 0.3);
      std::fill(m.data.begin() + 5 * S0, m.data.begin() + 6 * S0, uint8_t(1));  // row 5: every key masked -> NaN
      in.attn_mask = Mask<double>::of_bool(m);
    } else if (attn == "causal" || attn == "float" || attn == "inf") {
      Tensor<double> m({L, S0});
      for (int64_t i = 0; i < L; ++i)
        for (int64_t j = 0; j < S0; ++j)
          m.data[size_t(i * S0 + j)] = attn == "causal" ? (j > i ? -INFINITY : 0.0) : rng.normal();
      if (attn == "inf") m.data[size_t(2 * S0 + 7)] = INFINITY;  // key 7 is padded below
      in.attn_mask = Mask<double>::of_float(m);
    } else if (attn == "3d") {
      Tensor<double> m = randn(rng, {B * H, L, S0});
      for (int64_t j = 0; j < S0; ++j) m.data[size_t((1 * L + 3) * S0 + j)] = -INFINITY;  // group 1, row 3: NaN
      in.attn_mask = Mask<double>::of_float(m);
    }
    const Shape kshape = fc.batched ? Shape{B, S0} : Shape{S0};
    if (kpm == "bool") {
      Tensor<uint8_t> m = test::random_bool(rng, kshape, 0.2);
      for (int64_t b = 0; b < (fc.batched ? B : 1); ++b) m.data[size_t(b * S0 + 7)] = 1, m.data[size_t(b * S0)] = 0;
      in.key_padding_mask = Mask<double>::of_bool(m);
    } else if (kpm == "float") {
      Tensor<double> m = randn(rng, kshape);
      for (size_t x = 0; x < m.data.size(); x += 3) m.data[x] = 0;
      in.key_padding_mask = Mask<double>::of_float(m);
    }
    MhaWeights<float> wf{cast<float>(w.in_proj_weight),
                         {},
                         {},
                         {},
                         cast<float>(w.in_proj_bias),
                         cast<float>(w.bias_k),
                         cast<float>(w.bias_v),
                         cast<float>(w.out_proj_weight),
                         cast<float>(w.out_proj_bias)};
    const MhaInputs<float> inf{cast<float>(in.query), cast<float>(in.key), cast<float>(in.value),
                               cast<float>(in.attn_mask), cast<float>(in.key_padding_mask)};
    const MhaForward with{true, true}, without{false, true};
    const Tensor<double> d_unfused = mha_forward(c, with, w, in).output,
                         d_fused = mha_forward(c, without, w, in).output;
    const Tensor<float> f_unfused = mha_forward(c, with, wf, inf).output,
                        f_fused = mha_forward(c, without, wf, inf).output;

    // double: the same sums in other orders, a few hundred roundings of 2^-53 at most (E = 32 and
    // S <= 43 terms per sum, through two products and the softmax): 1e-12 leaves a hundredfold margin
    const Diff dd = diff(d_fused.data, d_unfused.data);
    CHECK(dd.nan_mismatch == 0);
    CHECK(std::sqrt(dd.d2) <= 1e-12 * std::sqrt(dd.r2));
    const Diff fused_err = diff(f_fused.data, d_unfused.data), unfused_err = diff(f_unfused.data, d_unfused.data);
    CHECK(fused_err.nan_mismatch == 0);
    CHECK(unfused_err.nan_mismatch == 0);
    const double e_fused = std::sqrt(fused_err.d2 / fused_err.r2),
                 e_unfused = std::sqrt(unfused_err.d2 / unfused_err.r2);
    CAPTURE(e_fused, e_unfused, fused_err.nan_both);
    CHECK(e_fused <= 2 * e_unfused + 4 * u);
    if (attn == "bool" || attn == "3d") CHECK(fused_err.nan_both > 0);  // the fully masked row is there
    const Diff bits = diff(f_fused.data, f_unfused.data);
    if (attn == "inf") {
      CHECK(bits.d2 == 0);             // the fallback: the unfused path itself
      CHECK(fused_err.nan_both == 0);  // the +inf under padding is torch's -inf, not NaN
    } else
      CHECK(bits.d2 > 0);  // the fused path ran: it rounds differently from the unfused one
  }
}
