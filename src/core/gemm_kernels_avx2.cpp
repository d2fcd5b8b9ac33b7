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
  static V broadcast(T x) { return _mm256_set1_ps(x); }
  static V mul(V a, V b) { return _mm256_mul_ps(a, b); }
  static V fma(V a, V b, V c) { return _mm256_fmadd_ps(a, b, c); }
};

struct F64x4 {
  using T = double;
  using V = __m256d;
  static constexpr int width = 4;
  static V zero() { return _mm256_setzero_pd(); }
  static V load(const T* p) { return _mm256_loadu_pd(p); }
  static void store(T* p, V v) { _mm256_storeu_pd(p, v); }
  static V broadcast(T x) { return _mm256_set1_pd(x); }
  static V mul(V a, V b) { return _mm256_mul_pd(a, b); }
  static V fma(V a, V b, V c) { return _mm256_fmadd_pd(a, b, c); }
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
