// The GEMM's AVX-512 path: 16 floats or 8 doubles per zmm register, compiled with -mavx512f -mfma
// (CMakeLists.txt) and called only when the CPU has AVX-512 F (gemm.cpp).
// GCC 12 warns that the intrinsics' own _mm512_undefined_pd() is "used uninitialized" once the
// 64-bit unpacks and shuffles are inlined at -O3 (GCC bug 105593); the warning is about the header.
#pragma GCC diagnostic push
#pragma GCC diagnostic ignored "-Wuninitialized"
#include <immintrin.h>
#pragma GCC diagnostic pop

#include "gemm_driver.hpp"

#if !defined(__AVX512F__) || !defined(__FMA__)
#error "gemm_kernels_avx512.cpp needs -mavx512f -mfma (set in CMakeLists.txt)"
#endif

namespace tparity::gemm_impl {
namespace {

struct F32x16 {
  using T = float;
  using V = __m512;
  static constexpr int width = 16;
  static V zero() { return _mm512_setzero_ps(); }
  static V load(const T* p) { return _mm512_loadu_ps(p); }
  static void store(T* p, V v) { _mm512_storeu_ps(p, v); }
  static V load_first(const T* p, int n) { return _mm512_maskz_loadu_ps(__mmask16((1u << n) - 1), p); }
  static void store_first(T* p, V v, int n) { _mm512_mask_storeu_ps(p, __mmask16((1u << n) - 1), v); }
  static V broadcast(T x) { return _mm512_set1_ps(x); }
  static V mul(V a, V b) { return _mm512_mul_ps(a, b); }
  static V fma(V a, V b, V c) { return _mm512_fmadd_ps(a, b, c); }
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
  static V zero() { return _mm512_setzero_pd(); }
  static V load(const T* p) { return _mm512_loadu_pd(p); }
  static void store(T* p, V v) { _mm512_storeu_pd(p, v); }
  static V load_first(const T* p, int n) { return _mm512_maskz_loadu_pd(__mmask8((1u << n) - 1), p); }
  static void store_first(T* p, V v, int n) { _mm512_mask_storeu_pd(p, __mmask8((1u << n) - 1), v); }
  static V broadcast(T x) { return _mm512_set1_pd(x); }
  static V mul(V a, V b) { return _mm512_mul_pd(a, b); }
  static V fma(V a, V b, V c) { return _mm512_fmadd_pd(a, b, c); }
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

template <>
Path<float> avx512_path<float>() {
  return SimdPath<F32x16, Blocks::avx512_float>::path();
}
template <>
Path<double> avx512_path<double>() {
  return SimdPath<F64x8, Blocks::avx512_double>::path();
}

}  // namespace tparity::gemm_impl
