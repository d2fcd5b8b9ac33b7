// The GEMM's AVX-512 path: 16 floats or 8 doubles per zmm register, compiled with -mavx512f -mfma
// (CMakeLists.txt) and called only when the CPU has AVX-512 F (gemm.cpp).
#include <immintrin.h>

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
  static V broadcast(T x) { return _mm512_set1_ps(x); }
  static V mul(V a, V b) { return _mm512_mul_ps(a, b); }
  static V fma(V a, V b, V c) { return _mm512_fmadd_ps(a, b, c); }
};

struct F64x8 {
  using T = double;
  using V = __m512d;
  static constexpr int width = 8;
  static V zero() { return _mm512_setzero_pd(); }
  static V load(const T* p) { return _mm512_loadu_pd(p); }
  static void store(T* p, V v) { _mm512_storeu_pd(p, v); }
  static V broadcast(T x) { return _mm512_set1_pd(x); }
  static V mul(V a, V b) { return _mm512_mul_pd(a, b); }
  static V fma(V a, V b, V c) { return _mm512_fmadd_pd(a, b, c); }
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
