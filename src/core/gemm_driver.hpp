// The GEMM's loops around the micro-kernel (BLISlab's five loops) and the macro-kernel, templated on
// a lane type (see gemm_microkernel.hpp) and instantiated by each instruction-set file.
// Anonymous namespace: see gemm_microkernel.hpp (each ISA file compiles its own copy). For the same
// reason nothing here calls into the standard library's templates.
#pragma once

#include <cstdint>
#include <utility>

#include "gemm_kernels.hpp"
#include "gemm_microkernel.hpp"
#include "gemm_pack.hpp"

namespace tparity::gemm_impl {
namespace {

inline int64_t min64(int64_t a, int64_t b) { return a < b ? a : b; }
inline int64_t round_up(int64_t x, int64_t m) { return (x + m - 1) / m * m; }

// Whether the micro-kernel reads op(A) where it lies instead of from a packed copy: whenever op(A)
// is row-major (not trans_a), its MR rows each read forward from a pointer of their own. Packing
// would cost a pass over A per NC columns of C, a fifth of the time at N = 64; in place was as fast
// or faster on every shape timed (K up to 4096, row strides of 8 and 16 KiB included). A transposed
// A is packed: read in place, each k would touch a new cache line for MR elements.
template <class T>
bool read_a_in_place(const Problem<T>& p) {
  return !p.trans_a;
}

// The first kAheadLines (4) cache lines of each of the next in-place A panel's MR rows, towards
// L2, before the micro-kernel runs on this one. On the first pass over a block of A (jr = 0) its
// rows come from memory: an MR-row panel starts MR new streams of kc elements each, and the
// hardware prefetcher only follows a stream after its first misses, which the kernel would
// otherwise wait for. Measured with `tparity bench --gemm --case llama7b_prefill` (the weight read
// in place after the operand swap, M = 128: each block of it serves two micro-panels): the four
// products' time 2-9% lower (median of four interleaved rounds about 5%) than without; the next
// panel's whole rows, or its first two or eight lines, or the panel after it, did no better. The micro-kernel asks for the
// rest of a streaming weight's rows a line at a time as its k loop runs (next_a,
// gemm_microkernel.hpp): on Zen 5 the prefill's gate and up products 3-9% faster than with these
// first lines alone (performance.md), where asking for every line here at once did no better.
template <int MR, class T>
void prefetch_rows(const T* a, int64_t rs, int64_t kc) {
  constexpr int64_t line = 64 / int64_t(sizeof(T));
  const int64_t end = min64(kc, kAheadLines * line);
  for (int r = 0; r < MR; ++r)
    for (int64_t k = 0; k < end; k += line) __builtin_prefetch(a + r * rs + k, 0, 2);
}

// The epilogue on an m x n tile of C at C(i0, j0): bias, ReLU or activation, residual, row by row.
template <class T>
void apply_epilogue(const GemmEpilogue<T>& ep, T* C, int64_t ldc, int64_t i0, int64_t j0, int64_t m, int64_t n) {
  for (int64_t r = 0; r < m; ++r) {
    T* c = C + r * ldc;
    if (ep.bias)
      for (int64_t j = 0; j < n; ++j) c[j] += ep.bias[j0 + j];
    if (ep.relu)
      for (int64_t j = 0; j < n; ++j) c[j] = c[j] <= T(0) ? T(0) : c[j];  // relu_forward's
    if (ep.activation) ep.activation(c, c, n);
    if (ep.residual) {
      const T* res = ep.residual + (i0 + r) * ep.ldr + j0;
      for (int64_t j = 0; j < n; ++j) c[j] += res[j];
    }
  }
}

// The micro-kernels of one path, by width: by_vectors[v - 1] computes MR x n tiles, n up to
// v * width, from B panels packed NR = NV * width wide. The narrow ones serve the right edge of C.
template <class Lanes, int MR, int NR, class VectorCounts>
struct KernelsByWidth;
template <class Lanes, int MR, int NR, int... I>
struct KernelsByWidth<Lanes, MR, NR, std::integer_sequence<int, I...>> {
  using T = typename Lanes::T;
  // (kc, A, rs_a, cs_a, B, C, ldc, n, alpha, beta, the tile's epilogue, the next in-place A panel)
  using Whole = void (*)(int64_t, const T*, int64_t, int64_t, const T*, T*, int64_t, int, T, T,
                         const TileEpilogue<T>*, const T*);
  static constexpr MicroKernel<T> by_vectors[] = {&simd_microkernel<Lanes, MR, I + 1, NR>...};
  // whole MR-row tiles: with the epilogue (ep), or without (plain: its epilogue argument unread)
  static constexpr Whole by_vectors_ep[] = {&simd_microkernel_ep<Lanes, MR, I + 1, NR, true>...};
  static constexpr Whole by_vectors_plain[] = {&simd_microkernel_ep<Lanes, MR, I + 1, NR, false>...};
};

// op(A)'s rows as the macro-kernel hands them to the micro-kernel: the MR-tall panel starting at row
// i is at base + i * row_step, its entry (r, k) at [r * rs + k * cs]. Packed by columns: row_step kc,
// rs 1, cs MR. Read in place (row-major op(A)): row_step = rs = lda, cs 1.
template <class T>
struct APanels {
  const T* base;
  int64_t row_step, rs, cs;
  bool in_place;
  bool streams = false;  // in place and Problem::a_streams
};

// Loops 2 and 1: C(mc x nc) = alpha * A(mc x kc) * Bp(kc x nc) + beta * C, C pointing at C(ic, jc).
// Walks the NR-wide panels of Bp (each stays close while every MR-tall panel of A streams past it),
// then the MR-tall panels of A. At the right edge a narrower micro-kernel covers the columns left,
// its last vector masked; tiles at the bottom edge, short of rows, run through a temporary MR x NR
// tile. An in-place A panel at the bottom edge is first packed into edge_a (its missing rows zero),
// so no row past op(A)'s end is read. ep (or null): applied to each tile as soon as it is final; in
// the micro-kernel's registers for whole tiles when it has no activation function (bias, ReLU and
// residual only), else by apply_epilogue on the stored tile. The seed block's four products, K = 64
// and 128, took 7-38% longer with their epilogues applied on the stored tiles than without any (the
// ReLU as a call per row segment: 38%); the same bits either way (tested).
template <class Lanes, int MR, int NV>
void macro_kernel(int64_t mc, int64_t nc, int64_t kc, const APanels<typename Lanes::T>& A, const typename Lanes::T* Bp,
                  typename Lanes::T* C, int64_t ldc, typename Lanes::T alpha, typename Lanes::T beta,
                  const GemmEpilogue<typename Lanes::T>* ep, int64_t ic, int64_t jc, typename Lanes::T* edge_a) {
  using T = typename Lanes::T;
  constexpr int W = Lanes::width, NR = NV * W;
  using Kernels = KernelsByWidth<Lanes, MR, NR, std::make_integer_sequence<int, NV>>;
  const bool fuse = ep && !ep->activation;
  // the tile at C(ic + i, jc + jr)'s epilogue for the micro-kernel
  auto tile_ep = [&](int64_t i, int64_t jr) {
    return TileEpilogue<T>{ep->bias ? ep->bias + jc + jr : nullptr, ep->relu,
                           ep->residual ? ep->residual + (ic + i) * ep->ldr + jc + jr : nullptr, ep->ldr};
  };
  for (int64_t jr = 0; jr < nc; jr += NR) {  // loop 2: NR columns of C, one micro-panel of Bp
    const int n = int(min64(NR, nc - jr));
    const int nv = (n + W - 1) / W;
    const MicroKernel<T> kernel = Kernels::by_vectors[nv - 1];
    const auto kernel_ep = Kernels::by_vectors_ep[nv - 1];
    const auto kernel_plain = Kernels::by_vectors_plain[nv - 1];
    const T* b = Bp + jr * kc;
    int64_t ir = 0;
    if (nv == 1 && A.in_place)
      // One vector wide, MR rows give MR accumulators, too few to cover the FMA latency: take two
      // panels of A at once where both are whole.
      for (; ir + 2 * MR <= mc; ir += 2 * MR) {
        T* c = C + ir * ldc + jr;
        const T* a = A.base + ir * A.row_step;
        if (fuse) {
          const TileEpilogue<T> te = tile_ep(ir, jr);
          simd_microkernel_ep<Lanes, 2 * MR, 1, NR>(kc, a, A.rs, A.cs, b, c, ldc, n, alpha, beta, &te, nullptr);
          continue;
        }
        simd_microkernel<Lanes, 2 * MR, 1, NR>(kc, a, A.rs, A.cs, b, c, ldc, n, alpha, beta);
        if (ep) apply_epilogue(*ep, c, ldc, ic + ir, jc + jr, 2 * MR, n);
      }
    for (; ir < mc; ir += MR) {  // loop 1: MR rows of C, one micro-panel of A
      const int m = int(min64(MR, mc - ir));
      const T* a = A.base + ir * A.row_step;
      int64_t rs = A.rs, cs = A.cs;
      if (A.in_place && m < MR) {
        pack_a_panel<MR>(m, kc, a, A.rs, false, edge_a);
        a = edge_a, rs = 1, cs = MR;
      }
      T* c = C + ir * ldc + jr;
      // on the first pass over an in-place block, the next panel's rows: their first lines now; for
      // a weight streaming from memory, the rest from the micro-kernel as its k loop goes
      const T* next_panel = A.in_place && jr == 0 && ir + 2 * MR <= mc ? A.base + (ir + MR) * A.row_step : nullptr;
      if (next_panel) prefetch_rows<MR>(next_panel, A.rs, kc);
      const T* next_a = A.streams ? next_panel : nullptr;
      if (m == MR && fuse) {
        const TileEpilogue<T> te = tile_ep(ir, jr);
        kernel_ep(kc, a, rs, cs, b, c, ldc, n, alpha, beta, &te, next_a);
        continue;
      }
      if (m == MR) {
        kernel_plain(kc, a, rs, cs, b, c, ldc, n, alpha, beta, nullptr, next_a);
      } else {
        alignas(64) T tile[MR * NR];
        if (beta != T(0))
          for (int r = 0; r < MR; ++r)
            for (int j = 0; j < n; ++j) tile[r * NR + j] = r < m ? c[r * ldc + j] : T(0);
        kernel(kc, a, rs, cs, b, tile, NR, n, alpha, beta);
        for (int r = 0; r < m; ++r)
          for (int j = 0; j < n; ++j) c[r * ldc + j] = tile[r * NR + j];
      }
      if (ep) apply_epilogue(*ep, c, ldc, ic + ir, jc + jr, m, n);
    }
  }
}

// BLISlab's five loops, as run by thread tid of nthreads (0 of 1 when serial; the threads meet at
// barrier). The threads share the packed B and split the rows of C; each packs its own A, or reads
// a row-major op(A) in place (see read_a_in_place).
template <class Lanes, int MR, int NV>
void five_loops(const Problem<typename Lanes::T>& p, const GemmBlocking& bs, const Workspace<typename Lanes::T>& ws,
                int tid, int nthreads, Barrier* barrier) {
  using T = typename Lanes::T;
  constexpr int NR = NV * Lanes::width;
  // MC no taller than one thread's packing buffer (ws.a_rows, sized for the threads asked for; fewer
  // may have started, each then with more rows than that)
  const int64_t KC = bs.kc, MC = min64(bs.mc, ws.a_rows), NC = bs.nc;
  // This thread's rows of C, a whole number of MR-tall panels.
  const int64_t rows = round_up((p.M + nthreads - 1) / nthreads, MR);
  const int64_t m_begin = min64(p.M, tid * rows), m_end = min64(p.M, m_begin + rows);
  T* const Ap = ws.packed_a + tid * ws.packed_a_stride;
  T* const Bp = ws.packed_b;
  const bool in_place = read_a_in_place(p);

  for (int64_t jc = 0; jc < p.N; jc += NC) {  // loop 5: NC columns of C and op(B)
    const int64_t nc = min64(NC, p.N - jc);
    const int64_t panels = (nc + NR - 1) / NR;
    for (int64_t pc = 0; pc < p.K; pc += KC) {  // loop 4: a KC-deep slice of the sum over k
      const int64_t kc = min64(KC, p.K - pc);
      const T beta = pc == 0 ? p.beta : T(1);  // later slices add to what the first one wrote
      const GemmEpilogue<T>* ep = pc + kc == p.K ? p.epilogue : nullptr;
      // Pack op(B)(pc : pc+kc, jc : jc+nc) into Bp, NR-wide panels; the threads share the panels out.
      for (int64_t q = tid; q < panels; q += nthreads) {
        const int64_t j = jc + q * NR;
        const T* src = p.trans_b ? p.B + j * p.ldb + pc : p.B + pc * p.ldb + j;
        pack_b_panel<Lanes, NR>(int(min64(NR, p.N - j)), kc, src, p.ldb, p.trans_b, Bp + q * NR * kc);
      }
      if (nthreads > 1) barrier_wait(barrier);
      const int64_t slice = (jc / NC) * ((p.K + KC - 1) / KC) + pc / KC;
      int64_t ic = m_begin, block_end = m_end;
      // loop 3: MC rows of C and op(A) at a time, of this thread's share or as the dealer hands them
      while (ws.dealer ? next_rows(ws.dealer, slice, p.M, MR, MC, nthreads, &ic, &block_end) : ic < m_end) {
        const int64_t mc = min64(MC, block_end - ic);
        APanels<T> A{Ap, kc, 1, MR, false};
        if (in_place) {
          A = {p.A + ic * p.lda + pc, p.lda, p.lda, 1, true, p.a_streams};
        } else {
          // Pack op(A)(ic : ic+mc, pc : pc+kc) into Ap, MR-tall panels.
          for (int64_t i = 0; i < mc; i += MR) {
            const T* src = p.trans_a ? p.A + pc * p.lda + ic + i : p.A + (ic + i) * p.lda + pc;
            pack_a_panel<MR>(int(min64(MR, mc - i)), kc, src, p.lda, p.trans_a, Ap + i * kc);
          }
        }
        macro_kernel<Lanes, MR, NV>(mc, nc, kc, A, Bp, p.C + ic * p.ldc + jc, p.ldc, p.alpha, beta, ep, ic, jc, Ap);
        if (!ws.dealer) ic += mc;
      }
      if (nthreads > 1) barrier_wait(barrier);  // every thread is done with Bp before the next slice repacks it
    }
  }
}

// A path built from a lane type and its block sizes: the SIMD micro-kernels and the loops around them.
template <class Lanes, const GemmBlocking& BS>
struct SimdPath {
  using T = typename Lanes::T;
  static constexpr int MR = BS.mr, NV = BS.nr / Lanes::width;
  static_assert(BS.nr % Lanes::width == 0, "nr must be a whole number of vector registers");
  static constexpr MicroKernel<T> kernel = &simd_microkernel<Lanes, MR, NV, BS.nr>;

  // bs: BS with mc and nc fitted to this CPU's caches (gemm.cpp); mr, nr and kc are BS's.
  static void run(const Problem<T>& p, const GemmBlocking& bs, const Workspace<T>& ws, int tid, int nthreads,
                  Barrier* barrier) {
    five_loops<Lanes, MR, NV>(p, bs, ws, tid, nthreads, barrier);
  }
  static Path<T> path() { return {BS, Lanes::width, kernel, &run}; }
};

}  // namespace
}  // namespace tparity::gemm_impl
