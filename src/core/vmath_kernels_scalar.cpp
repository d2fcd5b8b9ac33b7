// vmath's scalar path, for CPUs without AVX2 (and builds that are not x86-64): the same algorithms
// one element at a time, with the project's baseline flags.
#include "simd_scalar.hpp"
#include "vmath_kernels.hpp"
#include "vmath_simd.hpp"

namespace tparity::vmath_impl {

template <>
VmathKernels<float> scalar_kernels<float>() {
  return {&exp_array<simd::F32x1>, &softmax_rows<simd::F32x1>, &layernorm_rows<simd::F32x1>, simd::F32x1::width};
}
template <>
VmathKernels<double> scalar_kernels<double>() {
  return {&exp_array<simd::F64x1>, &softmax_rows<simd::F64x1>, &layernorm_rows<simd::F64x1>, simd::F64x1::width};
}

}  // namespace tparity::vmath_impl
