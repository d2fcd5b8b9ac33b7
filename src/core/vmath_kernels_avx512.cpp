// vmath's AVX-512 path: 16 floats or 8 doubles per zmm register, compiled with -mavx512f -mfma
// (CMakeLists.txt) and called only when the CPU has AVX-512 F (vmath.cpp).
#include "simd_avx512.hpp"
#include "vmath_kernels.hpp"
#include "vmath_simd.hpp"

namespace tparity::vmath_impl {

template <>
VmathKernels<float> avx512_kernels<float>() {
  return {&exp_array<simd::F32x16>, &softmax_rows<simd::F32x16>, &layernorm_rows<simd::F32x16>, simd::F32x16::width};
}
template <>
VmathKernels<double> avx512_kernels<double>() {
  return {&exp_array<simd::F64x8>, &softmax_rows<simd::F64x8>, &layernorm_rows<simd::F64x8>, simd::F64x8::width};
}

}  // namespace tparity::vmath_impl
