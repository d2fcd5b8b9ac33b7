// The fused attention's block algorithm, written once over a lane type (simd_scalar.hpp states the
// contract) and instantiated by each instruction-set file (fused_attention_kernels_<isa>.cpp).
// Anonymous namespace: see simd_avx512.hpp (each ISA file compiles its own copy). For the same reason
// nothing here calls into the standard library's templates.
//
// The layout: everything of a block of BR queries is held transposed, queries along the vector
// lanes. The scores of a key block are S^T (keys x queries) = K Q^T, so a key's row of scores is NV
// vectors; the softmax over keys is then lane-wise (the maximum and the sum run down the rows, no
// horizontal reductions), and so are the rescaling by exp(m_old - m_new) and the division by l. The
// output is held as O^T (Dv x queries) += V^T P^T. Both products are register tiles of MR rows x NV
// vectors, the GEMM's micro-kernel shape (gemm_microkernel.hpp): per step NV vector loads of a
// packed row (Q^T's row d, or P^T's row j), MR broadcasts (K's rows at column d, or V's row j), and
// MR x NV fused multiply-adds.
#pragma once

#include <cassert>
#include <cmath>
#include <cstdint>
#include <utility>

#include "fused_attention_kernels.hpp"
#include "tparity/core/profile.hpp"
#include "vmath_simd.hpp"

namespace tparity::fused_impl {
namespace {

// The profile's phases of a block (`tparity bench --profile`), through out-of-line calls only (see
// profile::enabled_here): on, when `on`, the time from here to the next switch is charged to op.
struct Phases {
  bool on = profile::enabled_here();
  bool open = false;
  profile::Op saved = profile::Op::Other;
  void to(profile::Op op) {
    if (!on) return;
    if (open) profile::detail::leave(saved);
    profile::detail::enter(op, saved);
    open = true;
  }
  void end() {
    if (on && open) profile::detail::leave(saved), open = false;
  }
};

// A query element divided by div as the kernels pack it: one rounding, as dividing q first; left
// alone when div is 1, which is exact. A power of two (sqrt(D) for D = 4, 16, 64, 256) is a
// multiplication by its inverse, which is exact, hence x * (1 / div) is x / div correctly rounded,
// the same bits, without a division per vector (on AVX-512 a vdivps costs several times a vmulps).
template <class L>
struct QueryDivisor {
  using T = typename L::T;
  using V = typename L::V;
  bool divide, power_of_two;
  V dv, inverse;
  explicit QueryDivisor(T div) : divide(div != T(1)), dv(L::set1(div)), inverse(L::set1(T(1) / div)) {
    int exponent;
    power_of_two = std::frexp(div, &exponent) == T(0.5) && exponent > -120 && exponent < 120;
  }
  V operator()(V x) const { return !divide ? x : power_of_two ? L::mul(x, inverse) : L::div(x, dv); }
};

template <class L, int NV, int MR, int BC>
struct FusedKernel {
  using T = typename L::T;
  using V = typename L::V;
  static constexpr int W = L::width, BR = NV * W, path_bc = BC;

  // S^T rows 0..M-1 of a key block: st[r][i] = scale * (k_r . q_i) + bias[r] (no bias when null).
  // k: the tile's first key, rows k_ld apart; qt: Q^T (D, BR). The dot product is one FMA chain over
  // d ascending from 0, as the GEMM's micro-kernel computes each element of q k^T.
  template <int M>
  static void qk_tile(int64_t D, const T* k, int64_t k_ld, const T* qt, T* st, T scale, const T* bias) {
    V acc[M][NV];
#pragma GCC unroll 16
    for (int r = 0; r < M; ++r)
#pragma GCC unroll 8
      for (int v = 0; v < NV; ++v) acc[r][v] = L::zero();
    const T* kr[M];
#pragma GCC unroll 16
    for (int r = 0; r < M; ++r) kr[r] = k + r * k_ld;
#pragma GCC unroll 4
    for (int64_t d = 0; d < D; ++d) {
      V b[NV];
#pragma GCC unroll 8
      for (int v = 0; v < NV; ++v) b[v] = L::load(qt + d * BR + v * W);
#pragma GCC unroll 16
      for (int r = 0; r < M; ++r) {
        const V a = L::set1(kr[r][d]);
#pragma GCC unroll 8
        for (int v = 0; v < NV; ++v) acc[r][v] = L::fma(a, b[v], acc[r][v]);
      }
    }
    const V vs = L::set1(scale);
#pragma GCC unroll 16
    for (int r = 0; r < M; ++r) {
      const V br = bias ? L::set1(bias[r]) : L::zero();
#pragma GCC unroll 8
      for (int v = 0; v < NV; ++v) {
        V x = L::mul(vs, acc[r][v]);
        if (bias) x = L::add(x, br);
        L::store(st + r * BR + v * W, x);
      }
    }
  }

  // O^T rows 0..M-1 (value columns e0..e0+M-1): ot[r] = ot[r] * alpha + sum_j v[j][r] * pt[j], the
  // sum over the block's nk keys in a register chain from 0, then one FMA with the rescaled ot.
  // v: the value row of the block's first key at column e0, rows v_ld apart; pt: P^T (nk, BR).
  template <int M>
  static void pv_tile(int64_t nk, const T* v, int64_t v_ld, const T* pt, T* ot, const T* alpha) {
    V acc[M][NV];
#pragma GCC unroll 16
    for (int r = 0; r < M; ++r)
#pragma GCC unroll 8
      for (int u = 0; u < NV; ++u) acc[r][u] = L::zero();
#pragma GCC unroll 4
    for (int64_t j = 0; j < nk; ++j) {
      V b[NV];
#pragma GCC unroll 8
      for (int u = 0; u < NV; ++u) b[u] = L::load(pt + j * BR + u * W);
      const T* vj = v + j * v_ld;
#pragma GCC unroll 16
      for (int r = 0; r < M; ++r) {
        const V a = L::set1(vj[r]);
#pragma GCC unroll 8
        for (int u = 0; u < NV; ++u) acc[r][u] = L::fma(a, b[u], acc[r][u]);
      }
    }
#pragma GCC unroll 8
    for (int u = 0; u < NV; ++u) {
      const V al = L::load(alpha + u * W);
#pragma GCC unroll 16
      for (int r = 0; r < M; ++r) {
        T* o = ot + r * BR + u * W;
        L::store(o, L::fma(L::load(o), al, acc[r][u]));
      }
    }
  }

  // The tiles by height: by_rows[m - 1] computes m rows, for the last rows of a block.
  using QkTile = void (*)(int64_t, const T*, int64_t, const T*, T*, T, const T*);
  using PvTile = void (*)(int64_t, const T*, int64_t, const T*, T*, const T*);
  template <class Rows>
  struct Tiles;
  template <int... I>
  struct Tiles<std::integer_sequence<int, I...>> {
    static constexpr QkTile qk[] = {&qk_tile<I + 1>...};
    static constexpr PvTile pv[] = {&pv_tile<I + 1>...};
  };
  using ByRows = Tiles<std::make_integer_sequence<int, MR>>;

  // tile (W, W) = src (m rows, n columns, rows lds apart) transposed: tile[c][r] = src[r][c] for
  // r < m, c < n, zero elsewhere; nothing outside the m x n block is read.
  static void transpose_tile(const T* src, int64_t lds, int64_t m, int64_t n, T* tile) {
    if (m == W && n == W) return L::transpose(src, lds, tile, W);
    alignas(64) T tmp[W * W];
    for (int64_t r = 0; r < W; ++r) {
      V x = L::zero();
      if (r < m) x = n == W ? L::load(src + r * lds) : L::load_first(src + r * lds, int(n));
      L::store(tmp + r * W, x);
    }
    L::transpose(tmp, W, tile, W);
  }

  // qt (D, BR) = the block's queries (nq, D, rows ld apart) transposed, each divided by div
  // (QueryDivisor); lanes nq..BR-1 zero.
  static void pack_queries(const T* q, int64_t nq, int64_t D, int64_t ld, T div, T* qt) {
    const QueryDivisor<L> divided(div);
    alignas(64) T tile[W * W];
    for (int64_t i0 = 0; i0 < BR; i0 += W)
      for (int64_t d0 = 0; d0 < D; d0 += W) {
        const int64_t md = D - d0 < W ? D - d0 : W;
        if (i0 >= nq) {
          for (int64_t d = 0; d < md; ++d) L::store(qt + (d0 + d) * BR + i0, L::zero());
          continue;
        }
        transpose_tile(q + i0 * ld + d0, ld, nq - i0 < W ? nq - i0 : W, md, tile);
        for (int64_t d = 0; d < md; ++d) {
          const V x = L::load(tile + d * W);
          L::store(qt + (d0 + d) * BR + i0, divided(x));
        }
      }
  }

  // st[j][i] += mask[i][j] for the block's nq queries and nk keys (mask rows S apart; S = 0: one row
  // for all); lanes from nq on get 0 added.
  static void add_mask(const T* mask, int64_t S, int64_t nq, int64_t nk, T* st) {
    alignas(64) T tile[W * W];
    for (int64_t i0 = 0; i0 < nq; i0 += W)
      for (int64_t j0 = 0; j0 < nk; j0 += W) {
        const int64_t mj = nk - j0 < W ? nk - j0 : W;
        transpose_tile(mask + i0 * S + j0, S, nq - i0 < W ? nq - i0 : W, mj, tile);
        for (int64_t j = 0; j < mj; ++j) {
          T* s = st + (j0 + j) * BR + i0;
          L::store(s, L::add(L::load(s), L::load(tile + j * W)));
        }
      }
  }

  // st[j][i] += mask_t[j][i] for the block's nk keys: the mask already transposed, its lanes past nq
  // 0 (QueryBlock::mask_t), so each key's row is NV plain vector adds: add_mask's sums.
  static void add_mask_t(const T* mask_t, int64_t ld, int64_t nk, T* st) {
    for (int64_t j = 0; j < nk; ++j)
#pragma GCC unroll 8
      for (int u = 0; u < NV; ++u) {
        T* s = st + j * BR + u * W;
        L::store(s, L::add(L::load(s), L::load(mask_t + j * ld + u * W)));
      }
  }

  // The online softmax over one key block, lane by lane (one lane, one query):
  //   m_new = max(m, the block's maximum) (NaN scores skipped, as softmax_forward's std::max does);
  //   mu = m_new, or 0 while m_new is -inf (every score so far -inf: then exp(s - mu) = 0 for them,
  //     not exp(-inf - -inf) = NaN, and the block adds nothing);
  //   alpha = exp(m - mu) (0 while m was -inf, 1 when the maximum did not move);
  //   st = P^T = exp(st - mu); l = l * alpha + the block's sum (sum down the nk rows, in T).
  // A NaN score gives a NaN weight, hence NaN in l and in O: its row ends NaN. A row whose scores are
  // all -inf ends with l = 0 and O = 0: 0 / 0 = NaN.
  // The block's maximum runs in four chains of keys j = c mod 4 (one chain waited on vmaxps's latency
  // at each key: 13% of the narrow kernel's own time at the seed block's shapes); the maximum of the
  // non-NaN scores is the same whatever the order, but for the sign of a zero, which neither
  // exp(s - mu) nor alpha can see (x - +0 and x - -0 differ only for x = -0, as -0 and +0, and exp
  // gives 1 for both).
  static void softmax_block(T* st, int64_t nk, T* m, T* l, T* alpha) {
    V mb[NV], mb1[NV], mb2[NV], mb3[NV], mu[NV], sum[NV];
#pragma GCC unroll 8
    for (int u = 0; u < NV; ++u) mb[u] = mb1[u] = mb2[u] = mb3[u] = L::set1(-INFINITY), sum[u] = L::zero();
    int64_t j = 0;
    for (; j + 4 <= nk; j += 4)
#pragma GCC unroll 8
      for (int u = 0; u < NV; ++u) {
        mb[u] = L::max_keep(L::load(st + j * BR + u * W), mb[u]);
        mb1[u] = L::max_keep(L::load(st + (j + 1) * BR + u * W), mb1[u]);
        mb2[u] = L::max_keep(L::load(st + (j + 2) * BR + u * W), mb2[u]);
        mb3[u] = L::max_keep(L::load(st + (j + 3) * BR + u * W), mb3[u]);
      }
    for (; j < nk; ++j)
#pragma GCC unroll 8
      for (int u = 0; u < NV; ++u) mb[u] = L::max_keep(L::load(st + j * BR + u * W), mb[u]);
#pragma GCC unroll 8
    for (int u = 0; u < NV; ++u) mb[u] = L::max_keep(L::max_keep(mb1[u], mb[u]), L::max_keep(mb3[u], mb2[u]));
#pragma GCC unroll 8
    for (int u = 0; u < NV; ++u) {
      const V mo = L::load(m + u * W), mn = L::max_keep(mb[u], mo);
      mu[u] = L::neg_inf_to_zero(mn);
      L::store(alpha + u * W, vmath_impl::vexp_nonpositive<L>(L::sub(mo, mu[u])));
      L::store(m + u * W, mn);
    }
    for (j = 0; j < nk; ++j)
#pragma GCC unroll 8
      for (int u = 0; u < NV; ++u) {
        T* s = st + j * BR + u * W;
        const V p = vmath_impl::vexp_nonpositive<L>(L::sub(L::load(s), mu[u]));
        L::store(s, p);
        sum[u] = L::add(sum[u], p);
      }
#pragma GCC unroll 8
    for (int u = 0; u < NV; ++u) L::store(l + u * W, L::fma(L::load(l + u * W), L::load(alpha + u * W), sum[u]));
  }

  // out (nq, Dv, rows ld apart) = O^T / l, transposed back.
  static void finish(T* ot, const T* l, int64_t nq, int64_t Dv, T* out, int64_t ld) {
    for (int64_t e = 0; e < Dv; ++e)
#pragma GCC unroll 8
      for (int u = 0; u < NV; ++u)
        L::store(ot + e * BR + u * W, L::div(L::load(ot + e * BR + u * W), L::load(l + u * W)));
    alignas(64) T tile[W * W];
    for (int64_t e0 = 0; e0 < Dv; e0 += W)
      for (int64_t i0 = 0; i0 < nq; i0 += W) {
        const int64_t me = Dv - e0 < W ? Dv - e0 : W, mi = nq - i0 < W ? nq - i0 : W;
        if (me == W && mi == W) {
          L::transpose(ot + e0 * BR + i0, BR, out + i0 * ld + e0, ld);
          continue;
        }
        transpose_tile(ot + e0 * BR + i0, BR, me, W, tile);
        for (int64_t i = 0; i < mi; ++i) {
          if (me == W)
            L::store(out + (i0 + i) * ld + e0, L::load(tile + i * W));
          else
            L::store_first(out + (i0 + i) * ld + e0, L::load(tile + i * W), int(me));
        }
      }
  }

  // --- key blocks the masks close to every query of the block --------------------------------
  // Such a block adds exactly nothing, so it is skipped: every score -inf gives weights of exactly 0
  // and a block maximum of -inf, which leaves m; alpha = exp(m - m) = 1 (or 0 while m is -inf, when O
  // and l are still 0), and O * 1 + 0 = O, l * 1 + 0 = l bit for bit (neither is ever -0). That holds
  // only if the scores really are -inf: q and k finite and small enough that no dot product
  // overflows (+inf + -inf would be NaN, which the reference path propagates), the bias neither NaN
  // nor +inf, and v finite (0 * inf = NaN). The keys and values are checked once per call
  // (key_stats); the mask at each block (open_keys). By the same argument the keys at a block's end
  // that the masks close to every query of the block (a causal mask's diagonal block: the keys past
  // the block's last query) are left out: their weights of 0 would add +0 to l and to each sum of O,
  // which are never -0, so the block's result is the same bit for bit.

  // Whether every entry of the rows x cols block (rows ld apart) is finite (x * 0 is 0 for finite x,
  // NaN otherwise); amax, the largest |entry|.
  static bool finite(const T* p, int64_t rows, int64_t cols, int64_t ld, T& amax) {
    V fin = L::zero(), mx = L::zero();
    const int64_t full = cols / W * W;
    const int tail = int(cols - full);
    for (int64_t r = 0; r < rows; ++r) {
      const T* x = p + r * ld;
      for (int64_t c = 0; c <= full; c += W) {
        if (c == full && tail == 0) break;
        const V v = c < full ? L::load(x + c) : L::load_first(x + c, tail);
        fin = L::add(fin, L::mul(v, L::zero()));
        mx = L::max_keep(L::max_keep(v, L::sub(L::zero(), v)), mx);
      }
    }
    amax = L::hmax(mx);
    return L::hsum(fin) == T(0);
  }

  // How many of keys j0..j0 + nk - 1 to compute: past the returned count, the masks close every key
  // to every query of the block (the attn mask is -inf over those columns of all nq rows; without
  // one, the bias is -inf there). 0: the whole block is closed. bmax: the largest finite |bias| over
  // the closed keys; a NaN or +inf bias there keeps them all (returns nk).
  static int64_t open_keys(const QueryBlock<T>& b, int64_t j0, int64_t nk, T& bmax) {
    bmax = T(0);
    int64_t open = 0;
    if (b.mask) {
      // each row's last open key, scanned from the end down to the furthest found so far; the last
      // row first (a causal mask's furthest); or the count the call worked out once (mask_open)
      if (b.mask_open) open = b.mask_open[j0 / BC];
      for (int64_t i = b.mask_open ? -1 : b.nq - 1; i >= 0 && open < nk; --i) {
        const T* x = b.mask + i * b.mask_ld + j0;
        for (int64_t c = nk; c > open;) {
          const int64_t c0 = c - W > open ? c - W : open;
          if (L::all_neg_inf(c - c0 == W ? L::load(x + c0) : L::load_first_or(x + c0, int(c - c0), -INFINITY))) {
            c = c0;
            continue;
          }
          while (x[c - 1] == -INFINITY) --c;  // the vector holds an open key (or a NaN) below c
          open = c;
          break;
        }
      }
      if (b.bias)
        for (int64_t j = j0 + open; j < j0 + nk; ++j) {
          const T x = b.bias[j];
          if (!(x < INFINITY)) return nk;  // NaN or +inf
          if (x != -INFINITY) bmax = x < 0 ? (-x > bmax ? -x : bmax) : (x > bmax ? x : bmax);
        }
      return open;
    }
    if (!b.bias) return nk;
    for (open = nk; open > 0 && b.bias[j0 + open - 1] == -INFINITY;) --open;
    return open;
  }

  // Whether |scale * (q . k) + bias| stays below T's largest value whatever the order of the sum:
  // each partial sum is at most D qmax kmax (1 + D u), doubled for margin. NaN anywhere: false.
  static bool no_overflow(T scale, int64_t D, T qmax, T kmax, T bmax) {
    constexpr long double big = sizeof(T) == 4 ? 0x1p126L : 0x1p1022L;
    const long double a = scale < 0 ? -(long double)scale : (long double)scale;
    return a * (long double)D * qmax * kmax * 2 + bmax < big;
  }

  // One block of queries against every key block, BC keys at a time.
  static void run(const QueryBlock<T>& b, const BlockScratch<T>& s) {
    Phases phase;
    phase.to(profile::Op::Scores);
    pack_queries(b.q, b.nq, b.D, b.q_ld, b.q_divisor, s.qt);
#pragma GCC unroll 8
    for (int u = 0; u < NV; ++u) L::store(s.m + u * W, L::set1(-INFINITY)), L::store(s.l + u * W, L::zero());
    for (int64_t e = 0; e < b.Dv * BR; e += W) L::store(s.ot + e, L::zero());
    bool q_known = false, q_finite = false;  // checked the first time a block is masked out
    T qmax = T(0);
    for (int64_t j0 = 0; j0 < b.S; j0 += BC) {
      int64_t nk = b.S - j0 < BC ? b.S - j0 : BC;
      T bmax;
      int64_t open;
      if (b.key_stats && (open = open_keys(b, j0, nk, bmax)) < nk) {
        // the queries as the products read them (divided): qt's lanes past nq are 0
        if (!q_known) q_finite = finite(s.qt, 1, b.D * BR, 0, qmax), q_known = true;
        const KeyBlockStats<T>& ks = b.key_stats[j0 / BC];
        if (q_finite && ks.finite && no_overflow(b.scale, b.D, qmax, ks.kmax, bmax)) {
          if (open == 0) continue;  // the whole block closed
          nk = open;                // the keys past it closed
        }
      }
      // S^T = K Q^T (* scale, + bias), MR keys at a time
      phase.to(profile::Op::Scores);
      const T* bias = b.bias ? b.bias + j0 : nullptr;
      int64_t j = 0;
      for (; j + MR <= nk; j += MR)
        qk_tile<MR>(b.D, b.k + (j0 + j) * b.k_ld, b.k_ld, s.qt, s.st + j * BR, b.scale, bias ? bias + j : nullptr);
      if (j < nk)
        ByRows::qk[nk - j - 1](b.D, b.k + (j0 + j) * b.k_ld, b.k_ld, s.qt, s.st + j * BR, b.scale,
                               bias ? bias + j : nullptr);
      if (b.mask_t)
        add_mask_t(b.mask_t + j0 * b.mask_t_ld, b.mask_t_ld, nk, s.st);
      else if (b.mask)
        add_mask(b.mask + j0, b.mask_ld, b.nq, nk, s.st);
      phase.to(profile::Op::Softmax);
      softmax_block(s.st, nk, s.m, s.l, s.alpha);
      phase.to(profile::Op::Context);
      // O^T = O^T * alpha + V^T P^T, MR value columns at a time
      const T* vb = b.v + j0 * b.v_ld;
      int64_t e = 0;
      for (; e + MR <= b.Dv; e += MR) pv_tile<MR>(nk, vb + e, b.v_ld, s.st, s.ot + e * BR, s.alpha);
      if (e < b.Dv) ByRows::pv[b.Dv - e - 1](nk, vb + e, b.v_ld, s.st, s.ot + e * BR, s.alpha);
    }
    // A row whose every score was -inf has added nothing: l = 0 and O = 0 (its blocks were skipped
    // or added exp(-inf) = 0). torch 2.x's flash kernel divides by 1 there instead of 0.
    if (b.zero_dead_rows)
      for (int64_t i = 0; i < BR; ++i)
        if (s.l[i] == T(0)) s.l[i] = T(1);
    phase.to(profile::Op::Context);
    finish(s.ot, s.l, b.nq, b.Dv, b.out, b.out_ld);
    phase.end();
  }

  static void key_stats(const T* k, const T* v, int64_t S, int64_t D, int64_t Dv, int64_t k_ld, int64_t v_ld,
                        KeyBlockStats<T>* stats) {
    for (int64_t j0 = 0; j0 < S; j0 += BC) {
      const int64_t nk = S - j0 < BC ? S - j0 : BC;
      T kmax, vmax;
      const bool kf = finite(k + j0 * k_ld, nk, D, k_ld, kmax), vf = finite(v + j0 * v_ld, nk, Dv, v_ld, vmax);
      stats[j0 / BC] = {kmax, kf && vf};
    }
  }

  static FusedPath<T> path() { return {{BR, BC, MR}, &run, {BR, BC, MR}, &run, &key_stats}; }
};

// --- a few queries against all the keys: decoding's ------------------------------------------
// A block of nq <= W / 2 queries (decoding's one query per head, a kv group's heads stacked) held
// one vector wide would leave most of its lanes empty, and its products broadcast one key element,
// or one value, per FMA: decoding a LLaMA-7B-shaped layer spent 6.1% of its time there, on 2.3% of
// its bytes. Here the lanes run over keys in the scores (the key block transposed once into kt) and
// over value columns in the context; each query's scores, then weights, are a row of s. Every number
// is computed as FusedKernel computes it: a score is one FMA chain over d ascending from 0, then
// * scale, + bias, + mask; the block's maximum, mu, alpha and exp as in softmax_block, the block's
// sum in key order from 0, l = l alpha + sum (one FMA); an output element one FMA chain over the
// block's keys from 0, then o alpha + that (one FMA), and o / l at the end: the same bits (tested).
// Key blocks the masks close are skipped as FusedKernel::run skips them (a sliding window's, padding);
// their keys and values are still read once, by the key statistics the skip needs.
// Decoding reads the cache from memory: the scores of kFewBlocks key blocks come first (the keys one
// stream), then each block's softmax and context (the values one stream), and each block asks for
// the next block's keys or values as it reads its own (without: 0.91-0.96 ms from memory; two or
// four blocks ahead: 0.74-0.82). LLaMA-7B's decoding attention alone (32 heads over
// 8 kv heads, 2049 keys, D 128; a throwaway, medians of 15, the kernel switched on and off) on Zen
// 5 (docs/performance.md): from memory 1.44-1.55 ms -> 0.67-0.71, with the cache in L3 0.75-0.86 ->
// 0.35-0.37; in the whole layer the profile's share 6.1% -> 4.8-5.2%.
template <class L, int BC>
struct FewKernel {
  using T = typename L::T;
  using V = typename L::V;
  static constexpr int W = L::width, ROWS = W / 2, KVECS = BC / W;
  static constexpr int block = BC;
  static_assert(ROWS >= 1 && BC % W == 0 && (KVECS & (KVECS - 1)) == 0,
                "FewKernel: a SIMD path, key blocks of a power of two of vectors");
  static_assert(sizeof(V) <= 64, "m, l and alpha hold W lanes: at most a line (ScratchShape's vec)");
  // accumulators: 16 of the 32 zmm, 8 of the 16 ymm; a power of two of key vectors per tile (BC / W
  // is a power of two, so the tiles never read past kt's row) or at most eight value vectors per row
  static constexpr int ACC = sizeof(V) >= 64 ? 16 : 8;
  static constexpr int pow2_floor(int x) { return x >= 8 ? 8 : x >= 4 ? 4 : x >= 2 ? 2 : 1; }
  static constexpr int key_vectors(int R) { return pow2_floor(ACC / R < KVECS ? ACC / R : KVECS); }
  static constexpr int value_vectors(int R) { return ACC / R < 1 ? 1 : ACC / R < 8 ? ACC / R : 8; }
  using Tiles = FusedKernel<L, 1, 1, BC>;  // its transpose_tile

  // Of n keys, how many fall in key vector c (W keys each): 0 .. W.
  static int64_t keys_of_vector(int64_t n, int64_t c) { return n - c * W < 0 ? 0 : n - c * W < W ? n - c * W : W; }
  // The next key block's keys after the block at j0 (0: none), for the prefetches.
  static int64_t next_block_keys(int64_t S, int64_t j0) {
    return S - j0 - BC < 0 ? 0 : S - j0 - BC < BC ? S - j0 - BC : BC;
  }

  static V load_n(const T* p, int64_t n) { return n >= W ? L::load(p) : L::load_first(p, int(n)); }
  static void store_n(T* p, V x, int64_t n) {
    if (n >= W)
      L::store(p, x);
    else
      L::store_first(p, x, int(n));
  }

  // qs (R, D) = the queries (rows q_ld apart), each element divided by div (QueryDivisor).
  template <int R>
  static void pack_queries(const T* q, int64_t q_ld, int64_t D, T div, T* qs) {
    const QueryDivisor<L> divided(div);
    for (int i = 0; i < R; ++i)
      for (int64_t d = 0; d < D; d += W) store_n(qs + i * D + d, divided(load_n(q + i * q_ld + d, D - d)), D - d);
  }

  // kt (D, BC) = the block's nk keys (rows k_ld apart) transposed, kt[d][j] = k_j[d], through key
  // vector `vectors` - 1; the lanes past nk 0. The next block's first next_nk keys (k + BC k_ld on)
  // are asked for into L2 tile by tile, as this block's are read.
  static void pack_keys(const T* k, int64_t k_ld, int64_t nk, int64_t D, int64_t vectors, T* kt, int64_t next_nk) {
    alignas(64) T tile[W * W];
    for (int64_t c = 0; c < vectors; ++c) {
      const int64_t m = keys_of_vector(nk, c), mn = keys_of_vector(next_nk, c);
      for (int64_t d0 = 0; d0 < D; d0 += W) {
        const int64_t md = D - d0 < W ? D - d0 : W;
        for (int64_t r = 0; r < mn; ++r) __builtin_prefetch(k + (BC + c * W + r) * k_ld + d0, 0, 2);
        if (m == W && md == W) {
          L::transpose(k + c * W * k_ld + d0, k_ld, kt + d0 * BC + c * W, BC);
          continue;
        }
        if (m == 0) {
          for (int64_t d = 0; d < md; ++d) L::store(kt + (d0 + d) * BC + c * W, L::zero());
          continue;
        }
        Tiles::transpose_tile(k + c * W * k_ld + d0, k_ld, m, md, tile);
        for (int64_t d = 0; d < md; ++d) L::store(kt + (d0 + d) * BC + c * W, L::load(tile + d * W));
      }
    }
  }

  // s rows 0..R-1 (BC apart), keys 0..nk-1: s[i][j] = scale * (q_i . k_j) (+ bias[j]) (+ mask[i][j]),
  // KV key vectors at a time; qs (R, D), kt (D, BC) as pack_keys leaves it.
  template <int R>
  static void scores(int64_t D, const T* qs, const T* kt, int64_t nk, T scale, const T* bias, const T* mask,
                     int64_t mask_ld, T* s) {
    constexpr int KV = key_vectors(R);
    const int64_t vectors = (nk + W - 1) / W;
    const V vs = L::set1(scale);
    for (int64_t c0 = 0; c0 < vectors; c0 += KV) {
      V acc[R][KV];
#pragma GCC unroll 8
      for (int i = 0; i < R; ++i)
#pragma GCC unroll 8
        for (int c = 0; c < KV; ++c) acc[i][c] = L::zero();
#pragma GCC unroll 4
      for (int64_t d = 0; d < D; ++d) {
        V kv[KV];
#pragma GCC unroll 8
        for (int c = 0; c < KV; ++c) kv[c] = L::load(kt + d * BC + (c0 + c) * W);
#pragma GCC unroll 8
        for (int i = 0; i < R; ++i) {
          const V a = L::set1(qs[i * D + d]);
#pragma GCC unroll 8
          for (int c = 0; c < KV; ++c) acc[i][c] = L::fma(a, kv[c], acc[i][c]);
        }
      }
#pragma GCC unroll 8
      for (int c = 0; c < KV; ++c) {
        const int64_t j = (c0 + c) * W, n = nk - j;
        if (n <= 0) break;
        const V bj = bias ? load_n(bias + j, n) : L::zero();
#pragma GCC unroll 8
        for (int i = 0; i < R; ++i) {
          V x = L::mul(vs, acc[i][c]);
          if (bias) x = L::add(x, bj);
          if (mask) x = L::add(x, load_n(mask + i * mask_ld + j, n));
          L::store(s + i * BC + j, x);
        }
      }
    }
  }

  // The online softmax over the block, softmax_block's with a query per row of s instead of per lane:
  // s rows 0..R-1 become the weights; m, l, alpha (lanes 0..R-1, the others idle) as there.
  template <int R>
  static void softmax(T* s, int64_t nk, T* m, T* l, T* alpha) {
    const int64_t vectors = (nk + W - 1) / W, tail = nk - (vectors - 1) * W;
    alignas(64) T mb[W], mu[W], sum[W];
    for (int i = 0; i < W; ++i) mb[i] = -INFINITY, sum[i] = T(0);
#pragma GCC unroll 8
    for (int i = 0; i < R; ++i) {
      V x = L::set1(-INFINITY);
      for (int64_t c = 0; c + 1 < vectors; ++c) x = L::max_keep(L::load(s + i * BC + c * W), x);
      x = L::max_keep(L::load_first_or(s + i * BC + (vectors - 1) * W, int(tail), -INFINITY), x);
      mb[i] = L::hmax(x);
    }
    const V mo = L::load(m), mn = L::max_keep(L::load(mb), mo);
    L::store(mu, L::neg_inf_to_zero(mn));
    L::store(alpha, vmath_impl::vexp_nonpositive<L>(L::sub(mo, L::load(mu))));
    L::store(m, mn);
#pragma GCC unroll 8
    for (int i = 0; i < R; ++i) {
      const V mui = L::set1(mu[i]);
      T* si = s + i * BC;
      for (int64_t c = 0; c + 1 < vectors; ++c)
        L::store(si + c * W, vmath_impl::vexp_nonpositive<L>(L::sub(L::load(si + c * W), mui)));
      // the lanes past nk -inf, so that every lane's argument is at most 0 (vexp_nonpositive); their
      // weights 0, never read
      const int64_t last = (vectors - 1) * W;
      L::store(si + last, vmath_impl::vexp_nonpositive<L>(L::sub(L::load_first_or(si + last, int(tail), -INFINITY), mui)));
    }
    for (int64_t j = 0; j < nk; ++j)
#pragma GCC unroll 8
      for (int i = 0; i < R; ++i) sum[i] += s[i * BC + j];
    L::store(l, L::fma(L::load(l), L::load(alpha), L::load(sum)));
  }

  // o rows 0..R-1 (o_ld apart), value vectors e0 .. e0 + n - 1 (n <= EV; the last one `last`
  // elements; Whole: n = EV and last = W): o[i][e] = o[i][e] * alpha[i] + sum over the block's keys
  // j of p[i][j] v[j][e].
  template <int R, int EV, bool Whole>
  static void context_tile(int64_t nk, const T* v, int64_t v_ld, const T* p, T* o, int64_t o_ld, const T* alpha,
                           int n, int64_t last, int64_t next_nk) {
    V acc[R][EV];
#pragma GCC unroll 8
    for (int i = 0; i < R; ++i)
#pragma GCC unroll 8
      for (int u = 0; u < EV; ++u) acc[i][u] = L::zero();
#pragma GCC unroll 2
    for (int64_t j = 0; j < nk; ++j) {
      const T* vj = v + j * v_ld;
      if (j < next_nk)
#pragma GCC unroll 8
        for (int u = 0; u < EV; ++u)
          if (Whole || u < n) __builtin_prefetch(vj + BC * v_ld + u * W, 0, 2);
      V x[EV];
#pragma GCC unroll 8
      for (int u = 0; u < EV; ++u)
        x[u] = Whole || u + 1 < n ? L::load(vj + u * W) : u < n ? load_n(vj + u * W, last) : L::zero();
#pragma GCC unroll 8
      for (int i = 0; i < R; ++i) {
        const V a = L::set1(p[i * BC + j]);
#pragma GCC unroll 8
        for (int u = 0; u < EV; ++u)
          if (Whole || u < n) acc[i][u] = L::fma(a, x[u], acc[i][u]);
      }
    }
#pragma GCC unroll 8
    for (int i = 0; i < R; ++i) {
      const V al = L::set1(alpha[i]);
#pragma GCC unroll 8
      for (int u = 0; u < EV; ++u)
        if (Whole || u < n) L::store(o + i * o_ld + u * W, L::fma(L::load(o + i * o_ld + u * W), al, acc[i][u]));
    }
  }

  template <int R>
  static void run_rows(const QueryBlock<T>& b, const BlockScratch<T>& s) {
    constexpr int EV = value_vectors(R);
    Phases phase;
    phase.to(profile::Op::Scores);
    const int64_t D = b.D, Dv = b.Dv, o_ld = (Dv + W - 1) / W * W, dvecs = o_ld / W;
    pack_queries<R>(b.q, b.q_ld, D, b.q_divisor, s.qt);
    L::store(s.m, L::set1(-INFINITY)), L::store(s.l, L::zero());
    for (int64_t e = 0; e < R * o_ld; e += W) L::store(s.ot + e, L::zero());
    // kFewBlocks key blocks at a time: the scores of all of them (K read as one stream), then each
    // block's softmax and context in turn (V as one stream). A block the masks close to every query,
    // or its closed keys at its end, are left out where FusedKernel::run leaves them out (the same
    // test, the same bits): open[] holds each block's keys computed.
    bool q_known = false, q_finite = false;
    T qmax = T(0);
    int64_t open[kFewBlocks];
    for (int64_t g0 = 0; g0 < b.S; g0 += kFewBlocks * BC) {
      const int64_t g1 = b.S - g0 < kFewBlocks * BC ? b.S : g0 + kFewBlocks * BC;
      phase.to(profile::Op::Scores);
      for (int64_t j0 = g0; j0 < g1; j0 += BC) {
        const int64_t all = b.S - j0 < BC ? b.S - j0 : BC;
        int64_t nk = all, keep;
        T bmax;
        if (b.key_stats && (keep = Tiles::open_keys(b, j0, all, bmax)) < all) {
          if (!q_known) q_finite = Tiles::finite(s.qt, 1, R * D, 0, qmax), q_known = true;
          const KeyBlockStats<T>& ks = b.key_stats[j0 / BC];
          if (q_finite && ks.finite && Tiles::no_overflow(b.scale, D, qmax, ks.kmax, bmax)) nk = keep;
        }
        open[(j0 - g0) / BC] = nk;
        if (nk == 0) continue;
        const int64_t vectors = (nk + W - 1) / W;
        pack_keys(b.k + j0 * b.k_ld, b.k_ld, nk, D, (vectors + key_vectors(R) - 1) / key_vectors(R) * key_vectors(R),
                  s.kt, next_block_keys(b.S, j0));
        scores<R>(D, s.qt, s.kt, nk, b.scale, b.bias ? b.bias + j0 : nullptr, b.mask ? b.mask + j0 : nullptr,
                  b.mask_ld, s.st + (j0 - g0) / BC * R * BC);
      }
      for (int64_t j0 = g0; j0 < g1; j0 += BC) {
        const int64_t nk = open[(j0 - g0) / BC];
        if (nk == 0) continue;
        const int64_t next_nk = next_block_keys(b.S, j0);
        T* const st = s.st + (j0 - g0) / BC * R * BC;
        phase.to(profile::Op::Softmax);
        softmax<R>(st, nk, s.m, s.l, s.alpha);
        phase.to(profile::Op::Context);
        const T* vb = b.v + j0 * b.v_ld;
        for (int64_t e0 = 0; e0 < dvecs; e0 += EV) {
          const int n = int(dvecs - e0 < EV ? dvecs - e0 : EV);
          const int64_t last = Dv - (e0 + n - 1) * W < W ? Dv - (e0 + n - 1) * W : W;
          if (n == EV && last == W)
            context_tile<R, EV, true>(nk, vb + e0 * W, b.v_ld, st, s.ot + e0 * W, o_ld, s.alpha, n, last, next_nk);
          else
            context_tile<R, EV, false>(nk, vb + e0 * W, b.v_ld, st, s.ot + e0 * W, o_ld, s.alpha, n, last, next_nk);
        }
      }
    }
    // as FusedKernel::run: a row whose every score was -inf has l = 0 and O = 0
    phase.to(profile::Op::Context);
    if (b.zero_dead_rows)
      for (int i = 0; i < R; ++i)
        if (s.l[i] == T(0)) s.l[i] = T(1);
#pragma GCC unroll 8
    for (int i = 0; i < R; ++i) {
      const V li = L::set1(s.l[i]);
      for (int64_t e = 0; e < Dv; e += W)
        store_n(b.out + i * b.out_ld + e, L::div(L::load(s.ot + i * o_ld + e), li), Dv - e);
    }
    phase.end();
  }

  template <class Rows>
  struct ByRows;
  template <int... I>
  struct ByRows<std::integer_sequence<int, I...>> {
    static constexpr void (*run[])(const QueryBlock<T>&, const BlockScratch<T>&) = {&run_rows<I + 1>...};
  };
  static void run(const QueryBlock<T>& b, const BlockScratch<T>& s) {
    assert(b.nq >= 1 && b.nq <= ROWS);
    ByRows<std::make_integer_sequence<int, ROWS>>::run[b.nq - 1](b, s);
  }
};

// A path from its wide kernel and its narrow one (FusedPath).
template <class Wide, class Narrow>
FusedPath<typename Wide::T> wide_and_narrow() {
  FusedPath<typename Wide::T> p = Wide::path();
  p.narrow_blocking = Narrow::path().blocking;
  p.run_narrow = &Narrow::run;
  return p;
}

// The same with the few-query kernel for a few queries per group (FusedPath::run_few).
template <class Wide, class Narrow, class Few>
FusedPath<typename Wide::T> wide_narrow_few() {
  static_assert(Few::block == Wide::path_bc, "the key statistics are per block of the wide kernel's bc keys");
  FusedPath<typename Wide::T> p = wide_and_narrow<Wide, Narrow>();
  p.few_blocking = {Few::ROWS, Few::block, 1};
  p.run_few = &Few::run;
  return p;
}

}  // namespace
}  // namespace tparity::fused_impl
