// vmath's AVX2 path: 8 floats or 4 doubles per ymm register, compiled with -mavx2 -mfma
// (CMakeLists.txt) and called only when the CPU has AVX2 and FMA (vmath.cpp).
#include "simd_avx2.hpp"
#include "vmath_kernels.hpp"
#include "vmath_simd.hpp"

namespace tparity::vmath_impl {

template <>
VmathKernels<float> avx2_kernels<float>() {
  return {&exp_array<simd::F32x8>, &softmax_rows<simd::F32x8>, &layernorm_rows<simd::F32x8>, simd::F32x8::width};
}
template <>
VmathKernels<double> avx2_kernels<double>() {
  return {&exp_array<simd::F64x4>, &softmax_rows<simd::F64x4>, &layernorm_rows<simd::F64x4>, simd::F64x4::width};
}

}  // namespace tparity::vmath_impl
