// The GEMM's register-tile micro-kernel, written once over a vector type and instantiated by each
// instruction-set file (gemm_kernels_<isa>.cpp) with its own lanes.
//
// Everything here sits in an anonymous namespace on purpose: each ISA file compiles its own copy with
// its own -m flags, and no symbol is shared across files, so the linker can never pick an AVX-512
// copy of a function for code that runs on a CPU without AVX-512.
#pragma once

#include <cstdint>

namespace tparity::gemm_impl {
namespace {

// Lanes is a struct of static functions over one vector register:
//   using T (the element), V (the register); static constexpr int width (elements per register);
//   V zero(); V load(const T*) and void store(T*, V), unaligned; V broadcast(T);
//   V mul(V a, V b) = a * b; V fma(V a, V b, V c) = a * b + c rounded once (or twice where the
//   path has no FMA: the scalar path).
//
// The contract (gemm_detail::MicroKernel): C(MR x NR) = alpha * A(MR x kc) * B(kc x NR) + beta * C,
// A packed by columns, B packed by rows, NR = NV * width. MR x NV accumulators live in registers for
// the whole k loop: each step loads NV vectors of B's row k, broadcasts each of A's MR column entries
// and issues MR x NV fused multiply-adds. Then alpha * acc + beta * C goes to C, once per call.
template <class Lanes, int MR, int NV>
void simd_microkernel(int64_t kc, const typename Lanes::T* A, const typename Lanes::T* B, typename Lanes::T* C,
                      int64_t ldc, typename Lanes::T alpha, typename Lanes::T beta) {
  using T = typename Lanes::T;
  using V = typename Lanes::V;
  constexpr int W = Lanes::width, NR = NV * W;

  // The C tile is written at the end; ask for its lines now (the last of each row too, which an
  // unaligned row of NR elements may straddle into).
#pragma GCC unroll 32
  for (int r = 0; r < MR; ++r) {
    __builtin_prefetch(C + r * ldc, 1);
    __builtin_prefetch(C + r * ldc + NR - 1, 1);
  }

  V acc[MR][NV];
#pragma GCC unroll 32
  for (int r = 0; r < MR; ++r)
#pragma GCC unroll 8
    for (int v = 0; v < NV; ++v) acc[r][v] = Lanes::zero();

#pragma GCC unroll 4
  for (int64_t k = 0; k < kc; ++k) {
    V b[NV];
#pragma GCC unroll 8
    for (int v = 0; v < NV; ++v) b[v] = Lanes::load(B + k * NR + v * W);
#pragma GCC unroll 32
    for (int r = 0; r < MR; ++r) {
      const V a = Lanes::broadcast(A[k * MR + r]);
#pragma GCC unroll 8
      for (int v = 0; v < NV; ++v) acc[r][v] = Lanes::fma(a, b[v], acc[r][v]);
    }
  }

  const V va = Lanes::broadcast(alpha);
  if (beta == T(0)) {
#pragma GCC unroll 32
    for (int r = 0; r < MR; ++r)
#pragma GCC unroll 8
      for (int v = 0; v < NV; ++v) Lanes::store(C + r * ldc + v * W, Lanes::mul(va, acc[r][v]));
  } else if (beta == T(1)) {
#pragma GCC unroll 32
    for (int r = 0; r < MR; ++r)
#pragma GCC unroll 8
      for (int v = 0; v < NV; ++v) {
        T* c = C + r * ldc + v * W;
        Lanes::store(c, Lanes::fma(va, acc[r][v], Lanes::load(c)));
      }
  } else {
    const V vb = Lanes::broadcast(beta);
#pragma GCC unroll 32
    for (int r = 0; r < MR; ++r)
#pragma GCC unroll 8
      for (int v = 0; v < NV; ++v) {
        T* c = C + r * ldc + v * W;
        Lanes::store(c, Lanes::fma(va, acc[r][v], Lanes::mul(vb, Lanes::load(c))));
      }
  }
}

}  // namespace
}  // namespace tparity::gemm_impl
