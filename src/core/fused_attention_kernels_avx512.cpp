// The fused attention's AVX-512 path: 16 floats or 8 doubles per zmm register, compiled with
// -mavx512f -mfma (CMakeLists.txt) and called only when the CPU has AVX-512 F (fused_attention.cpp).
// The register tiles are the GEMM's: 6 rows x 4 zmm = 24 accumulators, 4 for the packed row, 1 for
// the broadcast. Blocks of 64 queries (float) against 64 keys keep Q^T, the block's scores and O^T
// (16 KiB each at D = Dv = 64) in L1 and L2 while K and V stream past. The narrow blocks (one zmm of
// queries) take 8 rows a tile: 6 chains of FMAs, each waiting on its last, kept the two FMA units
// 3/4 busy at best (the seed block's fused attention: 4-5% faster with 8 rows, as with 12).
#include "fused_attention_simd.hpp"
#include "simd_avx512.hpp"

namespace tparity::fused_impl {

template <>
FusedPath<float> avx512_path<float>() {
  return wide_narrow_few<FusedKernel<simd::F32x16, 4, 6, 64>, FusedKernel<simd::F32x16, 1, 8, 64>,
                         FewKernel<simd::F32x16, 64>>();
}
template <>
FusedPath<double> avx512_path<double>() {
  return wide_narrow_few<FusedKernel<simd::F64x8, 4, 6, 64>, FusedKernel<simd::F64x8, 1, 8, 64>,
                         FewKernel<simd::F64x8, 64>>();
}

}  // namespace tparity::fused_impl
