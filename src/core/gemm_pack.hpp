// The GEMM's packing: copies of op(A) and op(B) laid out in the order the micro-kernel reads them,
// zero-padded (A to whole MR-tall panels, B to whole vectors) so that the micro-kernel never reads
// past what was packed.
// Anonymous namespace: see gemm_microkernel.hpp (each ISA file compiles its own copy).
#pragma once

#include <cstdint>

namespace tparity::gemm_impl {
namespace {

// One MR-tall panel of op(A), packed by columns: dst[k * MR + r] = op(A)(r, k), r < m, k < kc; rows
// m..MR-1 are zero. A points at op(A)(0, 0) of the panel: element (r, k) is A[r * lda + k], or
// A[k * lda + r] when trans (A stored (K, M)).
template <int MR, class T>
void pack_a_panel(int m, int64_t kc, const T* A, int64_t lda, bool trans, T* dst) {
  if (trans) {
    for (int64_t k = 0; k < kc; ++k) {
      const T* src = A + k * lda;
      T* d = dst + k * MR;
      for (int r = 0; r < m; ++r) d[r] = src[r];
      for (int r = m; r < MR; ++r) d[r] = T(0);
    }
    return;
  }
  if (m == MR) {
    // A transpose: MR rows read in blocks of 8 along k, written MR apart, so that each read stream
    // moves forward a cache line at a time.
    constexpr int KB = 8;
    int64_t k = 0;
    for (; k + KB <= kc; k += KB)
#pragma GCC unroll 32
      for (int r = 0; r < MR; ++r) {
        const T* src = A + r * lda + k;
#pragma GCC unroll 8
        for (int kk = 0; kk < KB; ++kk) dst[(k + kk) * MR + r] = src[kk];
      }
    for (; k < kc; ++k)
      for (int r = 0; r < MR; ++r) dst[k * MR + r] = A[r * lda + k];
    return;
  }
  for (int64_t k = 0; k < kc; ++k) {
    T* d = dst + k * MR;
    for (int r = 0; r < m; ++r) d[r] = A[r * lda + k];
    for (int r = m; r < MR; ++r) d[r] = T(0);
  }
}

// One NR-wide panel of op(B), packed by rows: dst[k * NR + c] = op(B)(k, c), k < kc, c < n; columns
// from n to the end of n's last vector are zero (the micro-kernel for n columns reads no further). B points at op(B)(0,
// 0) of the panel: element (k, c) is B[k * ldb + c], or B[c * ldb + k] when trans (B stored (N, K), torch.nn.Linear's
// weight). The transposed copy goes through Lanes::transpose, a width x width block of registers at a time.
template <class Lanes, int NR>
void pack_b_panel(int n, int64_t kc, const typename Lanes::T* B, int64_t ldb, bool trans, typename Lanes::T* dst) {
  using T = typename Lanes::T;
  constexpr int W = Lanes::width;
  const int padded = (n + W - 1) / W * W;
  if (!trans) {
    if (n == NR) {
      for (int64_t k = 0; k < kc; ++k) {
        const T* src = B + k * ldb;
        T* d = dst + k * NR;
#pragma GCC unroll 64
        for (int c = 0; c < NR; ++c) d[c] = src[c];
      }
      return;
    }
    for (int64_t k = 0; k < kc; ++k) {
      const T* src = B + k * ldb;
      T* d = dst + k * NR;
      for (int c = 0; c < n; ++c) d[c] = src[c];
      for (int c = n; c < padded; ++c) d[c] = T(0);
    }
    return;
  }
  int64_t k = 0;
  if (n == NR)
    for (; k + W <= kc; k += W)
#pragma GCC unroll 8
      for (int c = 0; c < NR; c += W) Lanes::transpose(B + c * ldb + k, ldb, dst + k * NR + c, NR);
  for (; k < kc; ++k) {
    for (int c = 0; c < n; ++c) dst[k * NR + c] = B[c * ldb + k];
    for (int c = n; c < padded; ++c) dst[k * NR + c] = T(0);
  }
}

}  // namespace
}  // namespace tparity::gemm_impl
