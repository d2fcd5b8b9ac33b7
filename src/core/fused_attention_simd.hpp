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

template <class L, int NV, int MR, int BC>
struct FusedKernel {
  using T = typename L::T;
  using V = typename L::V;
  static constexpr int W = L::width, BR = NV * W;

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

  // qt (D, BR) = the block's queries (nq, D, rows ld apart) transposed, each divided by div (one
  // rounding, as dividing q first; skipped when div is 1, which is exact); lanes nq..BR-1 zero. A
  // power of two (sqrt(D) for D = 4, 16, 64, 256) is a multiplication by its inverse, which is
  // exact, hence x * (1 / div) is x / div correctly rounded, the same bits, without a division per
  // vector (on AVX-512 a vdivps costs several times a vmulps).
  static void pack_queries(const T* q, int64_t nq, int64_t D, int64_t ld, T div, T* qt) {
    const bool divide = div != T(1);
    int exponent;
    const bool power_of_two = std::frexp(div, &exponent) == T(0.5) && exponent > -120 && exponent < 120;
    const V dv = L::set1(div), inverse = L::set1(T(1) / div);
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
          L::store(qt + (d0 + d) * BR + i0, !divide ? x : power_of_two ? L::mul(x, inverse) : L::div(x, dv));
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
      L::store(alpha + u * W, vmath_impl::vexp<L>(L::sub(mo, mu[u])));
      L::store(m + u * W, mn);
    }
    for (j = 0; j < nk; ++j)
#pragma GCC unroll 8
      for (int u = 0; u < NV; ++u) {
        T* s = st + j * BR + u * W;
        const V p = vmath_impl::vexp<L>(L::sub(L::load(s), mu[u]));
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

// A path from its wide kernel and its narrow one (FusedPath).
template <class Wide, class Narrow>
FusedPath<typename Wide::T> wide_and_narrow() {
  FusedPath<typename Wide::T> p = Wide::path();
  p.narrow_blocking = Narrow::path().blocking;
  p.run_narrow = &Narrow::run;
  return p;
}

}  // namespace
}  // namespace tparity::fused_impl
