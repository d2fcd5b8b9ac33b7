// The GEMM's AVX-512 path: 16 floats or 8 doubles per zmm register (simd_avx512.hpp's lanes, the
// ones vmath and the fused attention use), compiled with -mavx512f -mfma (CMakeLists.txt) and called
// only when the CPU has AVX-512 F (gemm.cpp).
#include "gemm_driver.hpp"
#include "simd_avx512.hpp"

namespace tparity::gemm_impl {

template <>
Path<float> avx512_path<float>() {
  return SimdPath<simd::F32x16, Blocks::avx512_float>::path();
}
template <>
Path<double> avx512_path<double>() {
  return SimdPath<simd::F64x8, Blocks::avx512_double>::path();
}

}  // namespace tparity::gemm_impl
