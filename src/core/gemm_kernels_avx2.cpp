// The GEMM's AVX2 path: 8 floats or 4 doubles per ymm register, compiled with -mavx2 -mfma
// (CMakeLists.txt) and called only when the CPU has AVX2 and FMA (gemm.cpp).
#include <immintrin.h>

#include "gemm_driver.hpp"

#if !defined(__AVX2__) || !defined(__FMA__)
#error "gemm_kernels_avx2.cpp needs -mavx2 -mfma (set in CMakeLists.txt)"
#endif

namespace tparity::gemm_impl {
namespace {

struct F32x8 {
  using T = float;
  using V = __m256;
  static constexpr int width = 8;
  static V zero() { return _mm256_setzero_ps(); }
  static V load(const T* p) { return _mm256_loadu_ps(p); }
  static void store(T* p, V v) { _mm256_storeu_ps(p, v); }
  static __m256i first(int n) {
    return _mm256_cmpgt_epi32(_mm256_set1_epi32(n), _mm256_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7));
  }
  static V load_first(const T* p, int n) { return _mm256_maskload_ps(p, first(n)); }
  static void store_first(T* p, V v, int n) { _mm256_maskstore_ps(p, first(n), v); }
  static V broadcast(T x) { return _mm256_set1_ps(x); }
  static V mul(V a, V b) { return _mm256_mul_ps(a, b); }
  static V fma(V a, V b, V c) { return _mm256_fmadd_ps(a, b, c); }
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
  static V zero() { return _mm256_setzero_pd(); }
  static V load(const T* p) { return _mm256_loadu_pd(p); }
  static void store(T* p, V v) { _mm256_storeu_pd(p, v); }
  static __m256i first(int n) { return _mm256_cmpgt_epi64(_mm256_set1_epi64x(n), _mm256_setr_epi64x(0, 1, 2, 3)); }
  static V load_first(const T* p, int n) { return _mm256_maskload_pd(p, first(n)); }
  static void store_first(T* p, V v, int n) { _mm256_maskstore_pd(p, first(n), v); }
  static V broadcast(T x) { return _mm256_set1_pd(x); }
  static V mul(V a, V b) { return _mm256_mul_pd(a, b); }
  static V fma(V a, V b, V c) { return _mm256_fmadd_pd(a, b, c); }
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

template <>
Path<float> avx2_path<float>() {
  return SimdPath<F32x8, Blocks::avx2_float>::path();
}
template <>
Path<double> avx2_path<double>() {
  return SimdPath<F64x4, Blocks::avx2_double>::path();
}

}  // namespace tparity::gemm_impl
