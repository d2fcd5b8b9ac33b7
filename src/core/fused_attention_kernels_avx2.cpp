// The fused attention's AVX2 path: 8 floats or 4 doubles per ymm register, compiled with -mavx2
// -mfma (CMakeLists.txt) and called only when the CPU has AVX2 and FMA (fused_attention.cpp).
// The register tiles are the GEMM's: 6 rows x 2 ymm = 12 accumulators of the 16 registers; the
// narrow blocks' (one ymm of queries), 8 rows x 1 (as on AVX-512: eight chains of FMAs).
#include "fused_attention_simd.hpp"
#include "simd_avx2.hpp"

namespace tparity::fused_impl {

template <>
FusedPath<float> avx2_path<float>() {
  return wide_narrow_few<FusedKernel<simd::F32x8, 2, 6, 64>, FusedKernel<simd::F32x8, 1, 8, 64>,
                         FewKernel<simd::F32x8, 64>>();
}
template <>
FusedPath<double> avx2_path<double>() {
  return wide_narrow_few<FusedKernel<simd::F64x4, 2, 6, 64>, FusedKernel<simd::F64x4, 1, 8, 64>,
                         FewKernel<simd::F64x4, 64>>();
}

}  // namespace tparity::fused_impl
