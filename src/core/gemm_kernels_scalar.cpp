// The GEMM's scalar path: the same micro-kernel over one element per "register" (simd_scalar.hpp's
// lanes), for CPUs without AVX2 (and builds that are not x86-64). Compiled with the project's baseline flags; without
// FMA hardware, fma() here rounds the product and the sum separately (the compiler may not contract them:
// -ffp-contract=off, CMakeLists.txt).
#include "gemm_driver.hpp"
#include "simd_scalar.hpp"

namespace tparity::gemm_impl {

template <>
Path<float> scalar_path<float>() {
  return SimdPath<simd::F32x1, Blocks::scalar_float>::path();
}
template <>
Path<double> scalar_path<double>() {
  return SimdPath<simd::F64x1, Blocks::scalar_double>::path();
}

}  // namespace tparity::gemm_impl
