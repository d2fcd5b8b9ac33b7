// What the GEMM's dispatcher (gemm.cpp) and its per-instruction-set files (gemm_kernels_<isa>.cpp)
// share: the block sizes of every path, the problem as the five loops see it, and the entry points
// each file defines.
#pragma once

#include <cstdint>

#include "tparity/core/gemm.hpp"

namespace tparity::detail {
class Barrier;
void barrier_wait(Barrier* barrier);
}  // namespace tparity::detail

namespace tparity::gemm_impl {

using gemm_detail::GemmBlocking;
using gemm_detail::MicroKernel;

// Every path's block sizes, in one place. {mr, nr, kc, mc, nc}: see GemmBlocking.
// The register tile (mr x nr) fills the vector registers with accumulators: AVX-512 has 32 zmm, and
// 6 rows x 4 zmm = 24 hold C, 4 hold the row of B, 1 the broadcast of A; AVX2 has 16 ymm, 6 x 2 = 12
// hold C. Six rows, not more: the kernel reads a row-major op(A) in place through one pointer per row.
// kc 384: fewer passes over C (each slice of the sum reads and writes C once) against a kc x nr
// micro-panel of B that still streams from L2 (96 KiB at nr 64 floats); mc x kc of A stays in the
// 1 MiB L2 beside it; kc x nc of packed B in L3. Tuned on AMD Zen 5 (48 KiB L1, 1 MiB L2, 32 MiB
// L3) by interleaved timing of the candidates; within a few percent the results were flat, and
// these were at or near the best on every shape timed (M = 1024 or 5000, N and K 64 to 3072).
// mc and nc are then fitted to the caches the CPU reports (gemm.cpp, fit_to_caches): the same bytes
// of L2 for A's block, no more of L3 per core than it has for B's. Neither changes a bit of C (the
// sums run over kc-deep slices whatever mc and nc are); kc and the register tile stay.
struct Blocks {
  static constexpr GemmBlocking avx512_float{6, 64, 384, 240, 1536};
  static constexpr GemmBlocking avx512_double{6, 32, 384, 120, 1536};
  static constexpr GemmBlocking avx2_float{6, 16, 384, 240, 1536};
  static constexpr GemmBlocking avx2_double{6, 8, 384, 120, 1536};
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
  // op(A) is a weight read once from memory where it lies (the operands swapped for a few rows):
  // the micro-kernel also asks for the next panel's rows as it goes (gemm_microkernel.hpp, next_a)
  bool a_streams = false;
};

// The rows of C dealt out to a call's threads as each comes for more (gemm.cpp): on a shared machine
// one core runs slower than the other from one minute to the next, and a fixed half of the rows
// each left the faster thread waiting at every slice's barrier. next_rows gives the calling thread
// the next chunk [*begin, *end) of slice `slice`'s M rows (a whole number of mr, at most `most`,
// shrinking as the rows run out), or false when none is left. Which thread computes a tile changes
// no bit of it.
struct RowDealer;
bool next_rows(RowDealer* dealer, int64_t slice, int64_t M, int64_t mr, int64_t most, int nthreads, int64_t* begin,
               int64_t* end);

// Packing buffers, 64-byte aligned: packed_b holds kc x round_up(min(nc, N), nr) (shared by the
// threads); thread t packs its A into packed_a + t * packed_a_stride, room for round_up(min(mc, M),
// mr) x kc.
template <class T>
struct Workspace {
  T* packed_b;
  T* packed_a;
  int64_t packed_a_stride;
  int64_t a_rows;     // rows of A one thread's packed_a holds (a whole number of mr)
  RowDealer* dealer;  // null: each thread takes its fixed share of rows (see next_rows)
};

// Where the threads of one call meet (parallel_team.hpp): barrier_wait returns once all of them have
// called it.
using Barrier = detail::Barrier;
using detail::barrier_wait;

// One path: its block sizes, its micro-kernel (for the tests) and the five loops instantiated with it.
// run() is thread tid's share of a problem with M, N, K > 0 and alpha != 0; every thread of the call
// runs it with the same problem, workspace and barrier (null when nthreads is 1).
template <class T>
struct Path {
  GemmBlocking blocking;
  int lanes;
  MicroKernel<T> kernel;
  void (*run)(const Problem<T>& p, const GemmBlocking& bs, const Workspace<T>& ws, int tid, int nthreads,
              Barrier* barrier);
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
