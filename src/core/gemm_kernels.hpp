// What the GEMM's dispatcher (gemm.cpp) and its per-instruction-set files (gemm_kernels_<isa>.cpp)
// share: the block sizes of every path, the problem as the five loops see it, and the entry points
// each file defines.
#pragma once

#include <cstdint>

#include "tparity/core/gemm.hpp"

namespace tparity::gemm_impl {

using gemm_detail::GemmBlocking;
using gemm_detail::MicroKernel;

// Every path's block sizes, in one place. {mr, nr, kc, mc, nc}: see GemmBlocking. The register tile
// (mr x nr) fills the vector registers with accumulators: AVX-512 has 32 zmm, 12 x 2 = 24 hold C and
// 2 hold the row of B; AVX2 has 16 ymm, 6 x 2 = 12 for C. kc keeps the kc x nr micro-panel of B in
// the 48 KiB L1 beside the streaming A; mc x kc of packed A stays in L2 (1 MiB on the machines this
// was tuned on, AMD Zen 5); nc x kc of packed B in L3.
struct Blocks {
  static constexpr GemmBlocking avx512_float{12, 32, 256, 144, 3072};
  static constexpr GemmBlocking avx512_double{12, 16, 256, 144, 3072};
  static constexpr GemmBlocking avx2_float{6, 16, 256, 144, 3072};
  static constexpr GemmBlocking avx2_double{6, 8, 256, 144, 3072};
  static constexpr GemmBlocking scalar_float{4, 4, 256, 128, 2048};
  static constexpr GemmBlocking scalar_double{4, 4, 256, 128, 2048};
};

// One call, as the five loops see it: C = alpha op(A) op(B) + beta C, then the epilogue.
template <class T>
struct Problem {
  bool trans_a, trans_b;
  int64_t M, N, K;
  T alpha;
  const T* A;
  int64_t lda;
  const T* B;
  int64_t ldb;
  T beta;
  T* C;
  int64_t ldc;
  const GemmEpilogue<T>* epilogue;  // or null
};

// Packing buffers, 64-byte aligned: packed_b holds kc x round_up(min(nc, N), nr) (shared by the
// threads); thread t packs its A into packed_a + t * packed_a_stride, room for round_up(min(mc, M),
// mr) x kc.
template <class T>
struct Workspace {
  T* packed_b;
  T* packed_a;
  int64_t packed_a_stride;
};

// Where the threads of one call meet (gemm.cpp): barrier_wait returns once all of them have called it.
class Barrier;
void barrier_wait(Barrier* barrier);

// One path: its block sizes, its micro-kernel (for the tests) and the five loops instantiated with it.
// run() is thread tid's share of a problem with M, N, K > 0 and alpha != 0; every thread of the call
// runs it with the same problem, workspace and barrier (null when nthreads is 1).
template <class T>
struct Path {
  GemmBlocking blocking;
  MicroKernel<T> kernel;
  void (*run)(const Problem<T>& p, const Workspace<T>& ws, int tid, int nthreads, Barrier* barrier);
};

// Defined in gemm_kernels_scalar.cpp, gemm_kernels_avx2.cpp and gemm_kernels_avx512.cpp; the last two
// are compiled for their instruction set, so call them only once the CPU is known to have it.
template <class T>
Path<T> scalar_path();
template <class T>
Path<T> avx2_path();
template <class T>
Path<T> avx512_path();

}  // namespace tparity::gemm_impl
