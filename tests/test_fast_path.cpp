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
