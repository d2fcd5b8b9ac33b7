// The GEMM's AVX2 path: 8 floats or 4 doubles per ymm register (simd_avx2.hpp's lanes, the ones
// vmath and the fused attention use), compiled with -mavx2 -mfma (CMakeLists.txt) and called only
// when the CPU has AVX2 and FMA (gemm.cpp).
#include "gemm_driver.hpp"
#include "simd_avx2.hpp"

namespace tparity::gemm_impl {

template <>
Path<float> avx2_path<float>() {
  return SimdPath<simd::F32x8, Blocks::avx2_float>::path();
}
template <>
Path<double> avx2_path<double>() {
  return SimdPath<simd::F64x4, Blocks::avx2_double>::path();
}

}  // namespace tparity::gemm_impl
