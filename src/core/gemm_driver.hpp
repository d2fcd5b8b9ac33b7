// The GEMM's loops around the micro-kernel (BLISlab's five loops) and the macro-kernel, templated on
// the micro-kernel and instantiated by each instruction-set file.
// Anonymous namespace: see gemm_microkernel.hpp (each ISA file compiles its own copy). For the same
// reason nothing here calls into the standard library's templates.
#pragma once

#include <cstdint>

#include "gemm_kernels.hpp"
#include "gemm_microkernel.hpp"
#include "gemm_pack.hpp"

namespace tparity::gemm_impl {
namespace {

inline int64_t min64(int64_t a, int64_t b) { return a < b ? a : b; }
inline int64_t round_up(int64_t x, int64_t m) { return (x + m - 1) / m * m; }

// The epilogue on an m x n tile of C at C(i0, j0): bias, activation, residual, row by row.
template <class T>
void apply_epilogue(const GemmEpilogue<T>& ep, T* C, int64_t ldc, int64_t i0, int64_t j0, int64_t m, int64_t n) {
  for (int64_t r = 0; r < m; ++r) {
    T* c = C + r * ldc;
    if (ep.bias)
      for (int64_t j = 0; j < n; ++j) c[j] += ep.bias[j0 + j];
    if (ep.activation) ep.activation(c, c, n);
    if (ep.residual) {
      const T* res = ep.residual + (i0 + r) * ep.ldr + j0;
      for (int64_t j = 0; j < n; ++j) c[j] += res[j];
    }
  }
}

// Loops 2 and 1: C(mc x nc) = alpha * Ap(mc x kc) * Bp(kc x nc) + beta * C, C pointing at C(ic, jc).
// Walks the NR-wide panels of Bp (each stays in L1 while every MR-tall panel of Ap streams past it),
// then the MR-tall panels of Ap. Tiles on the bottom and right edges run through a temporary MR x NR
// tile, so the micro-kernel only ever sees whole tiles. ep (or null): applied to each tile as soon as
// it is final.
template <class T, int MR, int NR, MicroKernel<T> kernel>
void macro_kernel(int64_t mc, int64_t nc, int64_t kc, const T* Ap, const T* Bp, T* C, int64_t ldc, T alpha, T beta,
                  const GemmEpilogue<T>* ep, int64_t ic, int64_t jc) {
  for (int64_t jr = 0; jr < nc; jr += NR) {  // loop 2: NR columns of C, one micro-panel of Bp
    const int n = int(min64(NR, nc - jr));
    for (int64_t ir = 0; ir < mc; ir += MR) {  // loop 1: MR rows of C, one micro-panel of Ap
      const int m = int(min64(MR, mc - ir));
      T* c = C + ir * ldc + jr;
      if (m == MR && n == NR) {
        kernel(kc, Ap + ir * kc, Bp + jr * kc, c, ldc, alpha, beta);
      } else {
        alignas(64) T tile[MR * NR];
        if (beta != T(0))
          for (int r = 0; r < MR; ++r)
            for (int j = 0; j < NR; ++j) tile[r * NR + j] = r < m && j < n ? c[r * ldc + j] : T(0);
        kernel(kc, Ap + ir * kc, Bp + jr * kc, tile, NR, alpha, beta);
        for (int r = 0; r < m; ++r)
          for (int j = 0; j < n; ++j) c[r * ldc + j] = tile[r * NR + j];
      }
      if (ep) apply_epilogue(*ep, c, ldc, ic + ir, jc + jr, m, n);
    }
  }
}

// BLISlab's five loops, as run by thread tid of nthreads (0 of 1 when serial; the threads meet at
// barrier). The threads share the packed B and split the rows of C; each packs its own A.
template <class T, int MR, int NR, MicroKernel<T> kernel>
void five_loops(const Problem<T>& p, const GemmBlocking& bs, const Workspace<T>& ws, int tid, int nthreads,
                Barrier* barrier) {
  const int64_t KC = bs.kc, MC = bs.mc, NC = bs.nc;
  // This thread's rows of C, a whole number of MR-tall panels.
  const int64_t rows = round_up((p.M + nthreads - 1) / nthreads, MR);
  const int64_t m_begin = min64(p.M, tid * rows), m_end = min64(p.M, m_begin + rows);
  T* const Ap = ws.packed_a + tid * ws.packed_a_stride;
  T* const Bp = ws.packed_b;

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
        pack_b_panel<NR>(int(min64(NR, p.N - j)), kc, src, p.ldb, p.trans_b, Bp + q * NR * kc);
      }
      if (nthreads > 1) barrier_wait(barrier);
      for (int64_t ic = m_begin; ic < m_end; ic += MC) {  // loop 3: MC rows of C and op(A)
        const int64_t mc = min64(MC, m_end - ic);
        // Pack op(A)(ic : ic+mc, pc : pc+kc) into Ap, MR-tall panels.
        for (int64_t i = 0; i < mc; i += MR) {
          const T* src = p.trans_a ? p.A + pc * p.lda + ic + i : p.A + (ic + i) * p.lda + pc;
          pack_a_panel<MR>(int(min64(MR, mc - i)), kc, src, p.lda, p.trans_a, Ap + i * kc);
        }
        macro_kernel<T, MR, NR, kernel>(mc, nc, kc, Ap, Bp, p.C + ic * p.ldc + jc, p.ldc, p.alpha, beta, ep, ic,
                                        jc);
      }
      if (nthreads > 1) barrier_wait(barrier);  // every thread is done with Bp before the next slice repacks it
    }
  }
}

// A path built from a lane type and its block sizes: the SIMD micro-kernel and the five loops around it.
template <class Lanes, const GemmBlocking& BS>
struct SimdPath {
  using T = typename Lanes::T;
  static constexpr int MR = BS.mr, NR = BS.nr;
  static_assert(NR % Lanes::width == 0, "nr must be a whole number of vector registers");
  static constexpr MicroKernel<T> kernel = &simd_microkernel<Lanes, MR, NR / Lanes::width>;

  static void run(const Problem<T>& p, const Workspace<T>& ws, int tid, int nthreads, Barrier* barrier) {
    five_loops<T, MR, NR, kernel>(p, BS, ws, tid, nthreads, barrier);
  }
  static Path<T> path() { return {BS, kernel, &run}; }
};

}  // namespace
}  // namespace tparity::gemm_impl
