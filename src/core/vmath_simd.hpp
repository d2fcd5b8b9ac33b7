// vmath's algorithms, written once over a lane type (simd_scalar.hpp states the contract) and
// instantiated by each instruction-set file (vmath_kernels_<isa>.cpp) and by the fused attention's.
// Anonymous namespace: see simd_avx512.hpp (each ISA file compiles its own copy).
#pragma once

#include <cmath>
#include <cstdint>
#include <type_traits>

namespace tparity::vmath_impl {
namespace {

// exp of each float lane (exp_forward's contract, vmath.hpp), Cody-Waite and a polynomial:
//   n = round(x / ln 2), r = x - n ln2_hi - n ln2_lo (|r| <= ln 2 / 2; ln2_hi has 15 significant bits,
//   so n ln2_hi is exact for |n| <= 2^9 and, without FMA, x - n ln2_hi is exact too), then
//   e^r ~ 1 + (r + r^2 P(r)) with P of degree 5 (the coefficients of SLEEF's expf, Boost Software
//   License; the 1 is added last, so that r's bits are not rounded away before the polynomial's),
//   and exp(x) = e^r 2^n by scale2, which rounds once: subnormal results are rounded, not flushed.
// exp_f32 first clamps x to [-104, 89]: below -104, exp(x) < 2^-150 rounds to 0; above 89 (> ln
// FLT_MAX = 88.72), to inf; so -inf gives 0 and +inf gives inf. NaN passes the clamp and every step:
// NaN. exp_f32_unclamped is the steps after the clamp, for lanes known to be at most 0 or NaN
// (vexp_nonpositive). The lanes at or below -104 (-inf among them) are given their 0 directly
// (scale2_above, whatever n and p came to), the same bits as
// scale2 rounds to, so that no scale2 underflows to 0: on Intel cores a result that underflows takes
// a microcode assist, about 19 times a lane's whole exp (6.6 ns against 0.35 per float on an Emerald
// Rapids Xeon; AMD's Zen 4 pays nothing), and a masked score (-inf) is such a lane, half of a causal
// block's. Subnormal results (x in (-104, -87.34)) still take it: real scores seldom fall 87 below
// their row's maximum unless masked.
// Error, measured against expl over every float in [-104, 89] (2.24e9 inputs): at most 0.988 ulp on
// the FMA paths (AVX2 and AVX-512, which agree bit for bit: scale2 rounds once on both) and 0.952 ulp
// on the scalar path (the same steps with the products and sums rounded apart). tests/test_vmath.cpp
// holds every path to 0.99 ulp on millions of points.
template <class L>
typename L::V exp_f32_unclamped(typename L::V x) {
  using V = typename L::V;
  const V lo = L::set1(-104.0f);
  const V n = L::round_nearest(L::mul(x, L::set1(1.44269504088896341f)));
  V r = L::fma(n, L::set1(-0.693145751953125f), x);
  r = L::fma(n, L::set1(-1.428606765330187045e-06f), r);
  V u = L::set1(0.000198527617612853646278381f);
  u = L::fma(u, r, L::set1(0.00139304355252534151077271f));
  u = L::fma(u, r, L::set1(0.00833336077630519866943359f));
  u = L::fma(u, r, L::set1(0.0416664853692054748535156f));
  u = L::fma(u, r, L::set1(0.166666671633720397949219f));
  u = L::fma(u, r, L::set1(0.5f));
  const V p = L::add(L::set1(1.0f), L::fma(L::mul(r, r), u, r));
  return L::scale2_above(p, n, x, lo);
}

template <class L>
typename L::V exp_f32(typename L::V x) {
  return exp_f32_unclamped<L>(L::clamp(x, L::set1(-104.0f), L::set1(89.0f)));
}

// exp of each lane: the polynomial for float, the C library's exp for double (a vector double exp
// of the same accuracy needs a degree-11 polynomial or a table; the double instantiation is the
// semantic check, not the fast path, so it keeps libm's correctly rounded-or-nearly result).
// Nonpositive: every lane is at most 0 or NaN (vexp_nonpositive, below).
template <class L, bool Nonpositive = false>
typename L::V vexp(typename L::V x) {
  if constexpr (!std::is_same<typename L::T, float>::value)
    return L::exp_each(x);
  else if constexpr (Nonpositive)
    return exp_f32_unclamped<L>(x);
  else
    return exp_f32<L>(x);
}

// exp of lanes each at most 0 or NaN: a softmax's x - max (max the largest non-NaN x, or 0 when it
// is -inf, so x - max is -inf there). exp_f32 without its clamp, the same bits on every such lane:
// the clamp leaves [-104, 0] as it is, and the lanes at or below -104 (-inf among them) get their 0
// from scale2_above whatever n and p came to. Two of the exp's 16 vector instructions fewer: a
// softmax pass over a 64 x 64 block of scores (AVX-512, a throwaway, Zen 5) 604 -> 539 ns. Every
// lane, used or not: a vector's lanes past the data are given -inf, not 0 (0 - max is positive for
// a negative max, and a large one would reach AVX2's scale2 out of its range, which may underflow
// and on Intel take a microcode assist). Not for other callers: a lane above 89 comes out wrong (NaN,
// or past 179 on AVX2 a wrapped exponent), not inf.
template <class L>
typename L::V vexp_nonpositive(typename L::V x) {
  return vexp<L, true>(x);
}

template <class L>
void exp_array(typename L::T* out, const typename L::T* in, int64_t n) {
  constexpr int W = L::width;
  int64_t i = 0;
  for (; i + W <= n; i += W) L::store(out + i, vexp<L>(L::load(in + i)));
  if (i < n) {
    const int m = int(n - i);
    L::store_first(out + i, vexp<L>(L::load_first(in + i, m)), m);
  }
}

// softmax_rows' contract (vmath.hpp): per row, the maximum (NaN entries skipped, as std::max(max, x)
// skips them), y = exp(x - max) with the row's sum kept in eight registers of lanes (vector v into
// register v % 8, combined pairwise, then across the lanes), then y / sum. Eight registers whatever
// the width, so that the scalar path sums in eight partial sums as the reference path's loops do:
// one running sum over a row of 100 keys gave twice the SIMD paths' float32 error.
template <class L>
void softmax_rows(typename L::T* out, const typename L::T* in, int64_t rows, int64_t cols) {
  using T = typename L::T;
  using V = typename L::V;
  constexpr int W = L::width;
  const int64_t full = cols / W * W;
  const int tail = int(cols - full);
  for (int64_t r = 0; r < rows; ++r) {
    const T* x = in + r * cols;
    T* y = out + r * cols;
    V acc = L::set1(-INFINITY);
    for (int64_t j = 0; j < full; j += W) acc = L::max_keep(L::load(x + j), acc);
    if (tail) acc = L::max_keep(L::load_first_or(x + full, tail, -INFINITY), acc);
    const V mx = L::set1(L::hmax(acc));
    // An all -inf row: x - max = -inf - -inf = NaN, and the row is NaN, as in torch.
    V sum[8];
    for (V& s : sum) s = L::zero();
    for (int64_t j = 0; j < full; j += W) {
      const V e = vexp_nonpositive<L>(L::sub(L::load(x + j), mx));
      L::store(y + j, e);
      sum[(j / W) & 7] = L::add(sum[(j / W) & 7], e);
    }
    if (tail) {
      const V e = vexp_nonpositive<L>(L::sub(L::load_first_or(x + full, tail, -INFINITY), mx));
      L::store_first(y + full, e, tail);
      sum[(full / W) & 7] = L::add(sum[(full / W) & 7], L::first_or_zero(e, tail));
    }
    const V all = L::add(L::add(L::add(sum[0], sum[1]), L::add(sum[2], sum[3])),
                         L::add(L::add(sum[4], sum[5]), L::add(sum[6], sum[7])));
    const V total = L::set1(L::hsum(all));
    for (int64_t j = 0; j < full; j += W) L::store(y + j, L::div(L::load(y + j), total));
    if (tail) L::store_first(y + full, L::div(L::load_first(y + full, tail), total), tail);
  }
}

// layernorm_rows' contract (vmath.hpp) on `rows`, a multiple of W: W rows at a time, transposed so
// that each lane holds a row and every sum runs lane-wise, in exactly the scalar loops' order
// (layernorm_forward_ref, ops.cpp): element c into partial sum c % 8, ascending, the eight combined
// pairwise; products and sums rounded apart (no FMA). xt is scratch of cols x W elements.
template <class L>
void layernorm_rows(typename L::T* out, const typename L::T* in, const typename L::T* weight, const typename L::T* bias,
                    typename L::T eps, int64_t rows, int64_t cols, typename L::T* mean_out, typename L::T* rstd_out,
                    typename L::T* xt) {
  using T = typename L::T;
  using V = typename L::V;
  constexpr int W = L::width;
  auto pairwise = [](const V* a) {
    return L::add(L::add(L::add(a[0], a[1]), L::add(a[2], a[3])), L::add(L::add(a[4], a[5]), L::add(a[6], a[7])));
  };
  // sum over c of value(c), element c into partial sum c % 8 (blocks of eight, then the tail)
  auto sum8 = [&](auto value) {
    V a[8];
    for (V& v : a) v = L::zero();
    int64_t c = 0;
    for (; c + 8 <= cols; c += 8)
      for (int j = 0; j < 8; ++j) a[j] = L::add(a[j], value(c + j));
    for (int j = 0; c < cols; ++c, ++j) a[j] = L::add(a[j], value(c));
    return pairwise(a);
  };
  const int64_t full = cols / W * W;
  const V n = L::set1(T(cols));
  for (int64_t r0 = 0; r0 < rows; r0 += W) {
    const T* x = in + r0 * cols;
    T* y = out + r0 * cols;
    // xt (cols, W) = the W rows' block transposed: xt[c * W + i] = x[i][c]
    for (int64_t c = 0; c < full; c += W) L::transpose(x + c, cols, xt + c * W, W);
    for (int64_t c = full; c < cols; ++c)
      for (int i = 0; i < W; ++i) xt[c * W + i] = x[i * cols + c];
    const V mean0 = L::div(sum8([&](int64_t c) { return L::load(xt + c * W); }), n);
    const V mu = L::div(sum8([&](int64_t c) { return L::sub(L::load(xt + c * W), mean0); }), n);
    const V var = L::div(sum8([&](int64_t c) {
                           const V d = L::sub(L::sub(L::load(xt + c * W), mean0), mu);
                           return L::mul(d, d);
                         }),
                         n);
    const V rstd = L::div(L::set1(T(1)), L::sqrt(L::add(var, L::set1(eps))));
    if (mean_out) L::store(mean_out + r0, L::add(mean0, mu));
    if (rstd_out) L::store(rstd_out + r0, rstd);
    for (int64_t c = 0; c < cols; ++c) {
      V v = L::mul(L::sub(L::sub(L::load(xt + c * W), mean0), mu), rstd);
      if (weight) v = L::mul(v, L::set1(weight[c]));
      if (bias) v = L::add(v, L::set1(bias[c]));
      L::store(xt + c * W, v);
    }
    for (int64_t c = 0; c < full; c += W) L::transpose(xt + c * W, W, y + c, cols);
    for (int64_t c = full; c < cols; ++c)
      for (int i = 0; i < W; ++i) y[i * cols + c] = xt[c * W + i];
  }
}

}  // namespace
}  // namespace tparity::vmath_impl
