// AVX2 lanes for the elementwise math (vmath) and the fused attention: 8 floats or 4 doubles per ymm
// register. Included only by files compiled with -mavx2 -mfma (CMakeLists.txt) whose code runs once
// the CPU is known to have AVX2 and FMA (gemm_isa()). The lane contract is in simd_scalar.hpp;
// anonymous namespace for the reason given in simd_avx512.hpp.
#pragma once

#include <immintrin.h>

#include <cmath>
#include <cstdint>

#if !defined(__AVX2__) || !defined(__FMA__)
#error "simd_avx2.hpp needs -mavx2 -mfma (set in CMakeLists.txt)"
#endif

namespace tparity::simd {
namespace {

struct F32x8 {
  using T = float;
  using V = __m256;
  static constexpr int width = 8;
  static __m256i first(int n) {
    return _mm256_cmpgt_epi32(_mm256_set1_epi32(n), _mm256_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7));
  }
  static V zero() { return _mm256_setzero_ps(); }
  static V set1(T x) { return _mm256_set1_ps(x); }
  static V load(const T* p) { return _mm256_loadu_ps(p); }
  static void store(T* p, V v) { _mm256_storeu_ps(p, v); }
  static V load_first(const T* p, int n) { return _mm256_maskload_ps(p, first(n)); }
  static V load_first_or(const T* p, int n, T fill) {
    const __m256i m = first(n);
    return _mm256_blendv_ps(set1(fill), _mm256_maskload_ps(p, m), _mm256_castsi256_ps(m));
  }
  static void store_first(T* p, V v, int n) { _mm256_maskstore_ps(p, first(n), v); }
  static V first_or_zero(V v, int n) { return _mm256_and_ps(v, _mm256_castsi256_ps(first(n))); }
  static V add(V a, V b) { return _mm256_add_ps(a, b); }
  static V sub(V a, V b) { return _mm256_sub_ps(a, b); }
  static V mul(V a, V b) { return _mm256_mul_ps(a, b); }
  static V div(V a, V b) { return _mm256_div_ps(a, b); }
  static V sqrt(V a) { return _mm256_sqrt_ps(a); }
  static V fma(V a, V b, V c) { return _mm256_fmadd_ps(a, b, c); }
  // vmaxps / vminps return their second operand when either is NaN.
  static V max_keep(V x, V acc) { return _mm256_max_ps(x, acc); }
  static V clamp(V x, V lo, V hi) { return _mm256_max_ps(lo, _mm256_min_ps(hi, x)); }
  static V relu(V x) { return _mm256_and_ps(x, _mm256_cmp_ps(x, zero(), _CMP_NLE_UQ)); }  // !(x <= 0): x, NaN too
  static V neg_inf_to_zero(V x) { return _mm256_andnot_ps(_mm256_cmp_ps(x, set1(-INFINITY), _CMP_EQ_OQ), x); }
  static bool all_neg_inf(V x) { return _mm256_movemask_ps(_mm256_cmp_ps(x, set1(-INFINITY), _CMP_EQ_OQ)) == 0xff; }
  static V round_nearest(V x) { return _mm256_round_ps(x, _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC); }
  // p * 2^n for integer-valued n in [-252, 254], rounded once: p * 2^(n/2) is exact (p near 1), the
  // second factor rounds (overflow to inf, gradual underflow) exactly as vscalefps does in one step.
  // A NaN n (from a NaN input, whose p is NaN too) gives NaN.
  static V scale2(V p, V n) {
    const __m256i ni = _mm256_cvtps_epi32(n), n1 = _mm256_srai_epi32(ni, 1), n2 = _mm256_sub_epi32(ni, n1);
    const __m256i bias = _mm256_set1_epi32(127);
    const V s1 = _mm256_castsi256_ps(_mm256_slli_epi32(_mm256_add_epi32(n1, bias), 23));
    const V s2 = _mm256_castsi256_ps(_mm256_slli_epi32(_mm256_add_epi32(n2, bias), 23));
    return _mm256_mul_ps(_mm256_mul_ps(p, s1), s2);
  }
  static V scale2_above(V p, V n, V x, V bound) {
    const V at_most = _mm256_cmp_ps(x, bound, _CMP_LE_OQ);
    return _mm256_andnot_ps(at_most, scale2(p, _mm256_andnot_ps(at_most, n)));  // those lanes: p * 2^0, then 0
  }
  static T hmax(V x) {
    __m128 h = _mm_max_ps(_mm256_castps256_ps128(x), _mm256_extractf128_ps(x, 1));
    h = _mm_max_ps(h, _mm_movehl_ps(h, h));
    h = _mm_max_ss(h, _mm_movehdup_ps(h));
    return _mm_cvtss_f32(h);
  }
  static T hsum(V x) {
    __m128 h = _mm_add_ps(_mm256_castps256_ps128(x), _mm256_extractf128_ps(x, 1));
    h = _mm_add_ps(h, _mm_movehl_ps(h, h));
    h = _mm_add_ss(h, _mm_movehdup_ps(h));
    return _mm_cvtss_f32(h);
  }
  // 8 x 8: pairs of 32-bit lanes, then 64-bit pairs, then the 128-bit halves.
  static void transpose(const T* src, int64_t lds, T* dst, int64_t ldd) {
    V r[8], t[8];
    for (int i = 0; i < 8; ++i) r[i] = _mm256_loadu_ps(src + i * lds);
    for (int i = 0; i < 4; ++i) {
      t[2 * i] = _mm256_unpacklo_ps(r[2 * i], r[2 * i + 1]);
      t[2 * i + 1] = _mm256_unpackhi_ps(r[2 * i], r[2 * i + 1]);
    }
    for (int i = 0; i < 2; ++i) {
      const __m256d t0 = _mm256_castps_pd(t[4 * i]), t1 = _mm256_castps_pd(t[4 * i + 1]);
      const __m256d t2 = _mm256_castps_pd(t[4 * i + 2]), t3 = _mm256_castps_pd(t[4 * i + 3]);
      r[4 * i] = _mm256_castpd_ps(_mm256_unpacklo_pd(t0, t2));
      r[4 * i + 1] = _mm256_castpd_ps(_mm256_unpackhi_pd(t0, t2));
      r[4 * i + 2] = _mm256_castpd_ps(_mm256_unpacklo_pd(t1, t3));
      r[4 * i + 3] = _mm256_castpd_ps(_mm256_unpackhi_pd(t1, t3));
    }
    for (int j = 0; j < 4; ++j) {
      _mm256_storeu_ps(dst + j * ldd, _mm256_permute2f128_ps(r[j], r[j + 4], 0x20));
      _mm256_storeu_ps(dst + (j + 4) * ldd, _mm256_permute2f128_ps(r[j], r[j + 4], 0x31));
    }
  }
};

struct F64x4 {
  using T = double;
  using V = __m256d;
  static constexpr int width = 4;
  static __m256i first(int n) { return _mm256_cmpgt_epi64(_mm256_set1_epi64x(n), _mm256_setr_epi64x(0, 1, 2, 3)); }
  static V zero() { return _mm256_setzero_pd(); }
  static V set1(T x) { return _mm256_set1_pd(x); }
  static V load(const T* p) { return _mm256_loadu_pd(p); }
  static void store(T* p, V v) { _mm256_storeu_pd(p, v); }
  static V load_first(const T* p, int n) { return _mm256_maskload_pd(p, first(n)); }
  static V load_first_or(const T* p, int n, T fill) {
    const __m256i m = first(n);
    return _mm256_blendv_pd(set1(fill), _mm256_maskload_pd(p, m), _mm256_castsi256_pd(m));
  }
  static void store_first(T* p, V v, int n) { _mm256_maskstore_pd(p, first(n), v); }
  static V first_or_zero(V v, int n) { return _mm256_and_pd(v, _mm256_castsi256_pd(first(n))); }
  static V add(V a, V b) { return _mm256_add_pd(a, b); }
  static V sub(V a, V b) { return _mm256_sub_pd(a, b); }
  static V mul(V a, V b) { return _mm256_mul_pd(a, b); }
  static V div(V a, V b) { return _mm256_div_pd(a, b); }
  static V sqrt(V a) { return _mm256_sqrt_pd(a); }
  static V fma(V a, V b, V c) { return _mm256_fmadd_pd(a, b, c); }
  static V max_keep(V x, V acc) { return _mm256_max_pd(x, acc); }
  static V relu(V x) { return _mm256_and_pd(x, _mm256_cmp_pd(x, zero(), _CMP_NLE_UQ)); }
  static V neg_inf_to_zero(V x) { return _mm256_andnot_pd(_mm256_cmp_pd(x, set1(-INFINITY), _CMP_EQ_OQ), x); }
  static bool all_neg_inf(V x) { return _mm256_movemask_pd(_mm256_cmp_pd(x, set1(-INFINITY), _CMP_EQ_OQ)) == 0xf; }
  static T hmax(V x) {
    __m128d h = _mm_max_pd(_mm256_castpd256_pd128(x), _mm256_extractf128_pd(x, 1));
    h = _mm_max_sd(h, _mm_unpackhi_pd(h, h));
    return _mm_cvtsd_f64(h);
  }
  static T hsum(V x) {
    __m128d h = _mm_add_pd(_mm256_castpd256_pd128(x), _mm256_extractf128_pd(x, 1));
    h = _mm_add_sd(h, _mm_unpackhi_pd(h, h));
    return _mm_cvtsd_f64(h);
  }
  static V exp_each(V x) {  // libm's exp per lane (see F64x8::exp_each)
    alignas(32) T b[width];
    _mm256_store_pd(b, x);
    for (T& e : b) e = ::exp(e);
    return _mm256_load_pd(b);
  }
  // 4 x 4: pairs of 64-bit lanes, then the 128-bit halves.
  static void transpose(const T* src, int64_t lds, T* dst, int64_t ldd) {
    V r[4], t[4];
    for (int i = 0; i < 4; ++i) r[i] = _mm256_loadu_pd(src + i * lds);
    for (int i = 0; i < 2; ++i) {
      t[2 * i] = _mm256_unpacklo_pd(r[2 * i], r[2 * i + 1]);
      t[2 * i + 1] = _mm256_unpackhi_pd(r[2 * i], r[2 * i + 1]);
    }
    for (int j = 0; j < 2; ++j) {
      _mm256_storeu_pd(dst + j * ldd, _mm256_permute2f128_pd(t[j], t[j + 2], 0x20));
      _mm256_storeu_pd(dst + (j + 2) * ldd, _mm256_permute2f128_pd(t[j], t[j + 2], 0x31));
    }
  }
};

}  // namespace
}  // namespace tparity::simd
