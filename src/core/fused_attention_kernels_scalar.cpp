// The fused attention's scalar path, for CPUs without AVX2 (and builds that are not x86-64): the
// same algorithm with one element per "register", blocks of 4 queries, 4 x 4 register tiles, and the
// products and sums rounded apart (simd_scalar.hpp).
#include "fused_attention_simd.hpp"
#include "simd_scalar.hpp"

namespace tparity::fused_impl {

template <>
FusedPath<float> scalar_path<float>() {
  return wide_and_narrow<FusedKernel<simd::F32x1, 4, 4, 64>, FusedKernel<simd::F32x1, 1, 4, 64>>();
}
template <>
FusedPath<double> scalar_path<double>() {
  return wide_and_narrow<FusedKernel<simd::F64x1, 4, 4, 64>, FusedKernel<simd::F64x1, 1, 4, 64>>();
}

}  // namespace tparity::fused_impl
