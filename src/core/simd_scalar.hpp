// Scalar "lanes" (one element per register) for the elementwise math (vmath) and the fused attention,
// for CPUs without AVX2 and builds that are not x86-64. Compiled with the project's baseline flags:
// fma(a, b, c) rounds the product and the sum apart, like the GEMM's scalar path (the core is
// compiled with -ffp-contract=off: the compiler may not fuse them).
//
// The lane contract, written once (simd_avx2.hpp and simd_avx512.hpp follow it):
//   using T (the element), V (the register); static constexpr int width (elements per register);
//   V zero(); V set1(T); V load(const T*), void store(T*, V), unaligned;
//   V load_first(const T*, int n) (lanes from n on zero), V load_first_or(const T*, int n, T fill)
//   (lanes from n on fill), void store_first(T*, V, int n) (the first n < width lanes only; the rest
//   neither read nor written), V first_or_zero(V, int n);
//   V add, sub, mul, div, sqrt (rounded once each, as IEEE 754 asks); V fma(a, b, c) = a * b + c, rounded once where
//   the path has FMA; V max_keep(V x, V acc) = x > acc ? x : acc (a NaN x keeps acc: std::max(acc, x) as
//   softmax_forward takes its maximum); V relu(V x) = x <= 0 ? 0 : x (relu_forward's: NaN stays, -0 becomes +0);
//   V neg_inf_to_zero(V x): lanes equal to -inf become 0; bool all_neg_inf(V x):
//   every lane is -inf; T hmax(V) (lanes never NaN), T hsum(V), in an order of the path's choosing; void
//   transpose(const T* src, int64_t lds, T* dst, int64_t ldd): dst[i * ldd + j] = src[j * lds + i], i, j < width. float
//   only: V clamp(V x, V lo, V hi) (a NaN x stays NaN); V round_nearest(V) (to the nearest integer, ties to even); V
//   scale2(V p, V n) = p * 2^n for integer-valued n in [-252, 254], rounded once (overflow to inf, gradual underflow to
//   subnormals and 0); V scale2_above(V p, V n, V x, V bound): scale2(p, n) in the lanes where x > bound or x is NaN,
//   +0 in the others, whose scale2 is never rounded (no underflow there). double only: V exp_each(V), the C library's
//   exp on each lane.
// Anonymous namespace: see simd_avx512.hpp.
#pragma once

#include <cmath>
#include <cstdint>
#include <cstring>

namespace tparity::simd {
namespace {

template <class E>
struct ScalarCommon {
  using T = E;
  using V = E;
  static constexpr int width = 1;
  static V zero() { return V(0); }
  static V set1(T x) { return x; }
  static V load(const T* p) { return *p; }
  static void store(T* p, V v) { *p = v; }
  static V load_first(const T* p, int) { return *p; }  // width 1: never partial
  static V load_first_or(const T* p, int, T) { return *p; }
  static void store_first(T* p, V v, int) { *p = v; }
  static V first_or_zero(V v, int) { return v; }
  static V add(V a, V b) { return a + b; }
  static V sub(V a, V b) { return a - b; }
  static V mul(V a, V b) { return a * b; }
  static V div(V a, V b) { return a / b; }
  static V sqrt(V a) { return std::sqrt(a); }  // the float or double overload: correctly rounded
  static V fma(V a, V b, V c) { return a * b + c; }
  static V max_keep(V x, V acc) { return x > acc ? x : acc; }
  static V relu(V x) { return x <= V(0) ? V(0) : x; }
  static V neg_inf_to_zero(V x) { return x == -INFINITY ? V(0) : x; }
  static bool all_neg_inf(V x) { return x == -INFINITY; }
  static T hmax(V x) { return x; }
  static T hsum(V x) { return x; }
  static void transpose(const T* src, int64_t, T* dst, int64_t) { *dst = *src; }
};

struct F32x1 : ScalarCommon<float> {
  static V clamp(V x, V lo, V hi) {
    const V y = hi < x ? hi : x;  // NaN: neither comparison holds, x passes
    return lo > y ? lo : y;
  }
  // |x| < 2^22: adding and removing 1.5 * 2^23 leaves x rounded to an integer, ties to even (the
  // default rounding mode); NaN stays NaN.
  static V round_nearest(V x) { return (x + 0x1.8p23f) - 0x1.8p23f; }
  static V scale2(V p, V n) {
    // A NaN n comes from a NaN input, whose p is NaN too: any exponent will do (and converting NaN to
    // an integer is undefined).
    const int32_t ni = int32_t(n == n ? n : V(0)), n1 = ni >> 1, n2 = ni - n1;
    return (p * pow2(n1)) * pow2(n2);
  }
  static V scale2_above(V p, V n, V x, V bound) { return x <= bound ? V(0) : scale2(p, n); }
  static float pow2(int32_t e) {  // 2^e, e in [-126, 127]
    const uint32_t bits = uint32_t(e + 127) << 23;
    float f;
    std::memcpy(&f, &bits, sizeof f);
    return f;
  }
};

struct F64x1 : ScalarCommon<double> {
  static V exp_each(V x) { return ::exp(x); }
};

}  // namespace
}  // namespace tparity::simd
