// AVX-512 lanes for the elementwise math (vmath) and the fused attention: 16 floats or 8 doubles per
// zmm register. Included only by files compiled with -mavx512f -mfma (CMakeLists.txt) whose code
// runs once the CPU is known to have AVX-512 F (gemm_isa()).
//
// The lane contract (simd_scalar.hpp writes it once) is the GEMM's (gemm_microkernel.hpp) plus what
// exp and softmax need. Anonymous namespace: each instruction-set file compiles its own copy, so the
// linker can never hand AVX-512 code to a caller on a CPU without it (see gemm_microkernel.hpp).
#pragma once

// GCC 12 warns that the intrinsics' own _mm512_undefined_pd() is "used uninitialized" (or "may be")
// once the 64-bit unpacks, the shuffles and the _mm512_reduce_* are inlined at -O3 (GCC bug
// 105593); the warning is about the header.
#pragma GCC diagnostic push
#pragma GCC diagnostic ignored "-Wuninitialized"
#if !defined(__clang__)  // a GCC warning; clang has no such flag and would warn about the pragma
#pragma GCC diagnostic ignored "-Wmaybe-uninitialized"
#endif
#include <immintrin.h>
#pragma GCC diagnostic pop

#include <cmath>
#include <cstdint>

#if !defined(__AVX512F__) || !defined(__FMA__)
#error "simd_avx512.hpp needs -mavx512f -mfma (set in CMakeLists.txt)"
#endif

namespace tparity::simd {
namespace {

struct F32x16 {
  using T = float;
  using V = __m512;
  static constexpr int width = 16;
  static __mmask16 first(int n) { return __mmask16((1u << n) - 1); }
  static V zero() { return _mm512_setzero_ps(); }
  static V set1(T x) { return _mm512_set1_ps(x); }
  static V load(const T* p) { return _mm512_loadu_ps(p); }
  static void store(T* p, V v) { _mm512_storeu_ps(p, v); }
  static V load_first(const T* p, int n) { return _mm512_maskz_loadu_ps(first(n), p); }
  static V load_first_or(const T* p, int n, T fill) { return _mm512_mask_loadu_ps(set1(fill), first(n), p); }
  static void store_first(T* p, V v, int n) { _mm512_mask_storeu_ps(p, first(n), v); }
  static V first_or_zero(V v, int n) { return _mm512_maskz_mov_ps(first(n), v); }
  static V add(V a, V b) { return _mm512_add_ps(a, b); }
  static V sub(V a, V b) { return _mm512_sub_ps(a, b); }
  static V mul(V a, V b) { return _mm512_mul_ps(a, b); }
  static V div(V a, V b) { return _mm512_div_ps(a, b); }
  static V sqrt(V a) { return _mm512_sqrt_ps(a); }
  static V fma(V a, V b, V c) { return _mm512_fmadd_ps(a, b, c); }
  // vmaxps / vminps return their second operand when either is NaN.
  static V max_keep(V x, V acc) { return _mm512_max_ps(x, acc); }
  static V clamp(V x, V lo, V hi) { return _mm512_max_ps(lo, _mm512_min_ps(hi, x)); }
  static V relu(V x) { return _mm512_maskz_mov_ps(_mm512_cmp_ps_mask(x, zero(), _CMP_NLE_UQ), x); }  // !(x <= 0)
  static V neg_inf_to_zero(V x) {
    const __mmask16 m = _mm512_cmp_ps_mask(x, set1(-INFINITY), _CMP_EQ_OQ);
    return _mm512_mask_mov_ps(x, m, zero());
  }
  static bool all_neg_inf(V x) { return _mm512_cmp_ps_mask(x, set1(-INFINITY), _CMP_EQ_OQ) == 0xffff; }
  static V round_nearest(V x) { return _mm512_roundscale_ps(x, _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC); }
  // p * 2^n for integer-valued n, rounded once (vscalefps: overflow to inf, gradual underflow).
  static V scale2(V p, V n) { return _mm512_scalef_ps(p, n); }
  // The lanes left out of the mask are zeroed, not computed.
  static V scale2_above(V p, V n, V x, V bound) {
    return _mm512_maskz_scalef_ps(_mm512_cmp_ps_mask(x, bound, _CMP_NLE_UQ), p, n);
  }
  static T hmax(V x) { return _mm512_reduce_max_ps(x); }
  static T hsum(V x) { return _mm512_reduce_add_ps(x); }
  // 16 x 16: pairs of 32-bit lanes, then 64-bit pairs, then 128-bit quarters twice.
  static void transpose(const T* src, int64_t lds, T* dst, int64_t ldd) {
    V r[16], t[16];
    for (int i = 0; i < 16; ++i) r[i] = _mm512_loadu_ps(src + i * lds);
    for (int i = 0; i < 8; ++i) {
      t[2 * i] = _mm512_unpacklo_ps(r[2 * i], r[2 * i + 1]);
      t[2 * i + 1] = _mm512_unpackhi_ps(r[2 * i], r[2 * i + 1]);
    }
    for (int i = 0; i < 4; ++i) {
      const __m512d t0 = _mm512_castps_pd(t[4 * i]), t1 = _mm512_castps_pd(t[4 * i + 1]);
      const __m512d t2 = _mm512_castps_pd(t[4 * i + 2]), t3 = _mm512_castps_pd(t[4 * i + 3]);
      r[4 * i] = _mm512_castpd_ps(_mm512_unpacklo_pd(t0, t2));
      r[4 * i + 1] = _mm512_castpd_ps(_mm512_unpackhi_pd(t0, t2));
      r[4 * i + 2] = _mm512_castpd_ps(_mm512_unpacklo_pd(t1, t3));
      r[4 * i + 3] = _mm512_castpd_ps(_mm512_unpackhi_pd(t1, t3));
    }
    for (int i = 0; i < 2; ++i)
      for (int j = 0; j < 4; ++j) {
        t[8 * i + j] = _mm512_shuffle_f32x4(r[8 * i + j], r[8 * i + j + 4], 0x88);
        t[8 * i + j + 4] = _mm512_shuffle_f32x4(r[8 * i + j], r[8 * i + j + 4], 0xdd);
      }
    for (int j = 0; j < 8; ++j) {
      _mm512_storeu_ps(dst + j * ldd, _mm512_shuffle_f32x4(t[j], t[j + 8], 0x88));
      _mm512_storeu_ps(dst + (j + 8) * ldd, _mm512_shuffle_f32x4(t[j], t[j + 8], 0xdd));
    }
  }
};

struct F64x8 {
  using T = double;
  using V = __m512d;
  static constexpr int width = 8;
  static __mmask8 first(int n) { return __mmask8((1u << n) - 1); }
  static V zero() { return _mm512_setzero_pd(); }
  static V set1(T x) { return _mm512_set1_pd(x); }
  static V load(const T* p) { return _mm512_loadu_pd(p); }
  static void store(T* p, V v) { _mm512_storeu_pd(p, v); }
  static V load_first(const T* p, int n) { return _mm512_maskz_loadu_pd(first(n), p); }
  static V load_first_or(const T* p, int n, T fill) { return _mm512_mask_loadu_pd(set1(fill), first(n), p); }
  static void store_first(T* p, V v, int n) { _mm512_mask_storeu_pd(p, first(n), v); }
  static V first_or_zero(V v, int n) { return _mm512_maskz_mov_pd(first(n), v); }
  static V add(V a, V b) { return _mm512_add_pd(a, b); }
  static V sub(V a, V b) { return _mm512_sub_pd(a, b); }
  static V mul(V a, V b) { return _mm512_mul_pd(a, b); }
  static V div(V a, V b) { return _mm512_div_pd(a, b); }
  static V sqrt(V a) { return _mm512_sqrt_pd(a); }
  static V fma(V a, V b, V c) { return _mm512_fmadd_pd(a, b, c); }
  static V max_keep(V x, V acc) { return _mm512_max_pd(x, acc); }
  static V relu(V x) { return _mm512_maskz_mov_pd(_mm512_cmp_pd_mask(x, zero(), _CMP_NLE_UQ), x); }
  static V neg_inf_to_zero(V x) {
    const __mmask8 m = _mm512_cmp_pd_mask(x, set1(-INFINITY), _CMP_EQ_OQ);
    return _mm512_mask_mov_pd(x, m, zero());
  }
  static bool all_neg_inf(V x) { return _mm512_cmp_pd_mask(x, set1(-INFINITY), _CMP_EQ_OQ) == 0xff; }
  static T hmax(V x) { return _mm512_reduce_max_pd(x); }
  static T hsum(V x) { return _mm512_reduce_add_pd(x); }
  // exp of each lane by the C library's exp (libm's, not an inline template: no AVX-512 copy of it
  // can leak to other files).
  static V exp_each(V x) {
    alignas(64) T b[width];
    _mm512_store_pd(b, x);
    for (T& e : b) e = ::exp(e);
    return _mm512_load_pd(b);
  }
  // 8 x 8: pairs of 64-bit lanes, then 128-bit quarters twice.
  static void transpose(const T* src, int64_t lds, T* dst, int64_t ldd) {
    V r[8], t[8];
    for (int i = 0; i < 8; ++i) r[i] = _mm512_loadu_pd(src + i * lds);
    for (int i = 0; i < 4; ++i) {
      t[2 * i] = _mm512_unpacklo_pd(r[2 * i], r[2 * i + 1]);
      t[2 * i + 1] = _mm512_unpackhi_pd(r[2 * i], r[2 * i + 1]);
    }
    for (int i = 0; i < 2; ++i)
      for (int j = 0; j < 2; ++j) {
        r[4 * i + j] = _mm512_shuffle_f64x2(t[4 * i + j], t[4 * i + j + 2], 0x88);
        r[4 * i + j + 2] = _mm512_shuffle_f64x2(t[4 * i + j], t[4 * i + j + 2], 0xdd);
      }
    for (int j = 0; j < 4; ++j) {
      _mm512_storeu_pd(dst + j * ldd, _mm512_shuffle_f64x2(r[j], r[j + 4], 0x88));
      _mm512_storeu_pd(dst + (j + 4) * ldd, _mm512_shuffle_f64x2(r[j], r[j + 4], 0xdd));
    }
  }
};

}  // namespace
}  // namespace tparity::simd
