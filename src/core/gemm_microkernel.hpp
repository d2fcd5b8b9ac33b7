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

// Lanes is one of simd_<isa>.hpp's structs of static functions over one vector register (the
// contract is written once, in simd_scalar.hpp); the kernel uses zero, load, store, load_first,
// store_first, set1, mul, fma (rounded once, or twice on the scalar path), add and relu (the tile's
// epilogue) and transpose (packing a transposed B). The core is compiled with -ffp-contract=off: the
// epilogue's adds after alpha's product are never fused into it (the tests' alpha 0.7 would see it).
//
// The contract (gemm_detail::MicroKernel): C(MR x n) = alpha * A(MR x kc) * B(kc x n) + beta * C,
// where (NV - 1) * width < n <= NV * width; A's entry (r, k) at A[r * rs_a + k * cs_a] (packed by
// columns: rs_a = 1, cs_a = MR; or op(A) read in place); B packed by rows, row k at B + k * NRB
// (NRB >= NV * width: a narrower kernel runs on a panel packed for a wider one). MR x NV accumulators
// live in registers for the whole k loop: each step loads NV vectors of B's row k, broadcasts each of
// A's MR column entries and issues MR x NV fused multiply-adds. Then alpha * acc + beta * C goes to
// C, once per call, the last vector of each row masked to the n columns asked for.
// Its three-loop twin with the same contract is gemm_detail::reference_microkernel (gemm.cpp, built
// for any CPU); the tests hold every path's kernel to it.
//
// With a TileEpilogue (simd_microkernel_ep, the last kc slice of a whole MR-row tile), each vector
// also gets, before it is stored, the bias, then ReLU, then the residual: the operations
// apply_epilogue (gemm_driver.hpp) would do on the stored tile, in the same order, rounded alike,
// without storing, reloading and storing the tile again.
//
// With next_a (the next panel of a weight read in place from memory, rows rs_a apart, on the
// macro-kernel's first pass over a block of it: Problem::a_streams), every 64 bytes' worth of k
// steps also asks for one line of each of that panel's rows, kAheadLines lines past k, into L2
// (and for each row's last line first, which an unaligned row straddles into): the next tile's
// rows, new streams from memory, arrive while this one computes (prefetch_rows in gemm_driver.hpp
// has asked for their first kAheadLines lines). A prefetch only: the same bits.
constexpr int64_t kAheadLines = 4;

template <class T>
struct TileEpilogue {
  const T* bias;  // the tile's first column's bias, or null
  bool relu;
  const T* res;  // the tile's first row's residual, rows ldr apart, or null
  int64_t ldr;
};

template <class Lanes, int MR, int NV, int NRB, bool EP = true>
void simd_microkernel_ep(int64_t kc, const typename Lanes::T* A, int64_t rs_a, int64_t cs_a,
                         const typename Lanes::T* B, typename Lanes::T* C, int64_t ldc, int n, typename Lanes::T alpha,
                         typename Lanes::T beta, const TileEpilogue<typename Lanes::T>* ep,
                         const typename Lanes::T* next_a) {
  using T = typename Lanes::T;
  using V = typename Lanes::V;
  constexpr int W = Lanes::width, NR = NV * W;
  static_assert(NR <= NRB, "the kernel is wider than B's panels");
  const int tail = n - (NV - 1) * W;  // lanes of each row's last vector, 1..W

  // The C tile is written at the end; ask for every line of it now: its rows' starts one line
  // apart, and the last element stored (n - 1), whose line an unaligned row may straddle into. From
  // the second kc slice on, each tile of C is read back from L3 or memory, and lines not asked for
  // were misses at the kernel's end (performance.md, Zen 5). Each element named is one the kernel
  // stores: e <= (NV - 1) * W < n.
  constexpr int line = int(64 / sizeof(T));
#pragma GCC unroll 32
  for (int r = 0; r < MR; ++r) {
#pragma GCC unroll 8
    for (int e = 0; e < NR - W + 1; e += line) __builtin_prefetch(C + r * ldc + e, 1);
    __builtin_prefetch(C + r * ldc + n - 1, 1);
  }

  const T* a[MR];  // (no row pointer is formed for kc == 0: A may be null then, and A + offset is UB)
#pragma GCC unroll 32
  for (int r = 0; r < MR; ++r) a[r] = kc > 0 ? A + r * rs_a : A;

  V acc[MR][NV];
#pragma GCC unroll 32
  for (int r = 0; r < MR; ++r)
#pragma GCC unroll 8
    for (int v = 0; v < NV; ++v) acc[r][v] = Lanes::zero();

  // one step of the sum: acc += A(:, k) B(k, :)
  auto step = [&](int64_t k) __attribute__((always_inline)) {
    V b[NV];
#pragma GCC unroll 8
    for (int v = 0; v < NV; ++v) b[v] = Lanes::load(B + k * NRB + v * W);
#pragma GCC unroll 32
    for (int r = 0; r < MR; ++r) {
      const V ar = Lanes::set1(a[r][k * cs_a]);
#pragma GCC unroll 8
      for (int v = 0; v < NV; ++v) acc[r][v] = Lanes::fma(ar, b[v], acc[r][v]);
    }
  };
  if (next_a) {
    // a cache line's worth of steps at a time, each line of them asking for one line of each of
    // the next panel's rows
    constexpr int64_t ahead = kAheadLines * line;
#pragma GCC unroll 32
    for (int r = 0; r < MR; ++r) __builtin_prefetch(next_a + r * rs_a + kc - 1, 0, 2);  // a row's last line
    for (int64_t k0 = 0; k0 < kc; k0 += line) {
      if (k0 + ahead < kc) {
#pragma GCC unroll 32
        for (int r = 0; r < MR; ++r) __builtin_prefetch(next_a + r * rs_a + k0 + ahead, 0, 2);
      }
      const int64_t k1 = kc - k0 < line ? kc : k0 + line;
#pragma GCC unroll 4
      for (int64_t k = k0; k < k1; ++k) step(k);
    }
  } else {
#pragma GCC unroll 4
    for (int64_t k = 0; k < kc; ++k) step(k);
  }

  // C = alpha * acc + beta * C, vector v of row r; the last vector of a row may be partial.
  const V va = Lanes::set1(alpha), vb = Lanes::set1(beta);
  auto update = [&](T* c, V x, bool partial, int r, int v) {
    V y;
    if (beta == T(0))
      y = Lanes::mul(va, x);
    else {
      const V old = partial ? Lanes::load_first(c, tail) : Lanes::load(c);
      y = Lanes::fma(va, x, beta == T(1) ? old : Lanes::mul(vb, old));
    }
    if constexpr (EP) {
      auto at = [&](const T* p) { return partial ? Lanes::load_first(p, tail) : Lanes::load(p); };
      if (ep->bias) y = Lanes::add(y, at(ep->bias + v * W));
      if (ep->relu) y = Lanes::relu(y);
      if (ep->res) y = Lanes::add(y, at(ep->res + r * ep->ldr + v * W));
    }
    if (partial)
      Lanes::store_first(c, y, tail);
    else
      Lanes::store(c, y);
  };
#pragma GCC unroll 32
  for (int r = 0; r < MR; ++r)
#pragma GCC unroll 8
    for (int v = 0; v < NV; ++v) update(C + r * ldc + v * W, acc[r][v], v == NV - 1 && tail < W, r, v);
}

// The contract above (gemm_detail::MicroKernel), without an epilogue.
template <class Lanes, int MR, int NV, int NRB>
void simd_microkernel(int64_t kc, const typename Lanes::T* A, int64_t rs_a, int64_t cs_a, const typename Lanes::T* B,
                      typename Lanes::T* C, int64_t ldc, int n, typename Lanes::T alpha, typename Lanes::T beta) {
  simd_microkernel_ep<Lanes, MR, NV, NRB, false>(kc, A, rs_a, cs_a, B, C, ldc, n, alpha, beta, nullptr, nullptr);
}

}  // namespace
}  // namespace tparity::gemm_impl
