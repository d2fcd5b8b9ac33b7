// The fused attention (tparity/core/fused_attention.hpp) on every instruction-set path this machine
// has, each forced in turn: against a long-double twin of the whole attention on the edge sizes of the
// path's own blocks, every kind of mask, the -inf and NaN semantics of the reference path (qdotk, the
// masks, softmax_forward_ref, weighted_sum_v), thread-count independence, and the float32 error gate.
#include <algorithm>
#include <catch2/catch.hpp>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <limits>
#include <set>
#include <string>
#include <type_traits>
#include <vector>

#include "tparity/core/attention.hpp"
#include "tparity/core/fused_attention.hpp"
#include "tparity/core/gemm.hpp"
#include "tparity/core/ops.hpp"
#include "tparity/harness/rng.hpp"

using namespace tparity;
using fused_attention_detail::FusedBlocking;

namespace {

std::vector<GemmIsa> available_isas() {
  std::vector<GemmIsa> v;
  for (GemmIsa isa : {GemmIsa::Scalar, GemmIsa::Avx2, GemmIsa::Avx512})
    if (gemm_isa_available(isa)) v.push_back(isa);
  return v;
}

// Forces a path for one scope.
struct ForceIsa {
  explicit ForceIsa(GemmIsa isa) { gemm_force_isa(isa); }
  ~ForceIsa() { gemm_reset_isa(); }
  ForceIsa(const ForceIsa&) = delete;
  ForceIsa& operator=(const ForceIsa&) = delete;
};

enum class MaskKind { None, Shared2d, PerGroup3d, KeyBias, Causal, Shared2dAndKeyBias };
constexpr MaskKind kMaskKinds[] = {MaskKind::None,    MaskKind::Shared2d, MaskKind::PerGroup3d,
                                   MaskKind::KeyBias, MaskKind::Causal,   MaskKind::Shared2dAndKeyBias};

const char* name(MaskKind m) {
  switch (m) {
    case MaskKind::None:
      return "none";
    case MaskKind::Shared2d:
      return "2-D float";
    case MaskKind::PerGroup3d:
      return "3-D float with -inf";
    case MaskKind::KeyBias:
      return "key bias 0/-inf";
    case MaskKind::Causal:
      return "causal";
    case MaskKind::Shared2dAndKeyBias:
      return "2-D float and key bias";
  }
  return "?";
}

// One call's inputs. G = batch * heads groups; the key bias has one row per batch element.
template <class T>
struct Problem {
  int64_t G, L, S, D, Dv, heads = 2;
  T scale;
  std::vector<T> q, k, v, attn, bias;
  int64_t attn_stride = 0;

  AttentionMasks<T> masks() const {
    AttentionMasks<T> m;
    m.attn = attn.empty() ? nullptr : attn.data();
    m.attn_group_stride = attn_stride;
    m.key_bias = bias.empty() ? nullptr : bias.data();
    m.heads = heads;
    return m;
  }
  std::vector<T> run(int threads = 1) const {
    std::vector<T> out(size_t(G * L * Dv), T(-7));
    fused_attention(out.data(), q.data(), k.data(), v.data(), G, L, S, D, Dv, scale, masks(), threads);
    return out;
  }
};

template <class T>
Problem<T> make_problem(Rng& rng, int64_t G, int64_t L, int64_t S, int64_t D, int64_t Dv, MaskKind kind) {
  const T ninf = -std::numeric_limits<T>::infinity();
  Problem<T> p;
  p.G = G, p.L = L, p.S = S, p.D = D, p.Dv = Dv;
  p.scale = T(1) / std::sqrt(T(D));
  p.q.resize(size_t(G * L * D));
  p.k.resize(size_t(G * S * D));
  p.v.resize(size_t(G * S * Dv));
  for (T& x : p.q) x = T(rng.normal());
  for (T& x : p.k) x = T(rng.normal());
  for (T& x : p.v) x = T(rng.normal());
  if (kind == MaskKind::Shared2d || kind == MaskKind::Shared2dAndKeyBias || kind == MaskKind::Causal) {
    p.attn.resize(size_t(L * S));
    for (int64_t i = 0; i < L; ++i)
      for (int64_t j = 0; j < S; ++j)
        p.attn[size_t(i * S + j)] = kind == MaskKind::Causal ? (j > i ? ninf : T(0)) : T(rng.normal());
  }
  if (kind == MaskKind::PerGroup3d) {
    p.attn.resize(size_t(G * L * S));
    for (T& x : p.attn) x = rng.coin(0.2) ? ninf : T(rng.normal());
    p.attn_stride = L * S;
  }
  if (kind == MaskKind::KeyBias || kind == MaskKind::Shared2dAndKeyBias) {
    p.bias.resize(size_t((G + p.heads - 1) / p.heads * S));
    for (T& x : p.bias) x = rng.coin(0.25) ? ninf : T(0);
  }
  return p;
}

long double gamma_n(int64_t n, long double u) { return n * u / (1 - n * u); }

// The attention in long double from the T inputs, and each output's error bound for the fused path.
// Per row of queries: scores s_j = (scale * q.k_j + bias_j) + mask_ij, m = their maximum (NaN
// skipped), w_j = exp(s_j - m) / sum, out_e = sum_j w_j v_je. A NaN score, m = -inf (all masked) or
// m = +inf make the row NaN (torch 1.13); a NaN or inf in v reaches out_e through w_j v_je.
// The bound, first order in u (T's unit roundoff), every multiply-add counted as two roundings (the
// scalar path has no FMA):
//   a score is off by at most sigma_j = gamma_{2(D+3)} (|scale| sum_d |q_d k_jd| + |bias_j| + |mask_ij|);
//   a weight before normalising by e_w = 2 max_j sigma_j (its score and the maximum's) + u (2 dmax +
//   6 + 3 nb): dmax = m - min finite s_j bounds both |s_j - mu| (the subtraction's rounding) and the
//   sum of the rescalings' |m_old - m_new| (it telescopes), 2u per exp (vmath: 0.99 ulp; libm's for
//   double), over at most nb = ceil(S / bc) rescalings of the same sums (they cancel in O / l up to
//   their roundings);
//   normalised, 2 e_w; O and l each sum bc keys per block in a chain and add nb block sums:
//   gamma_{2(bc+nb+2)} each; the division u. So
//   |out_e - exact_e| <= (2 e_w + 2 gamma_{2(bc+nb+2)} + 2u) sum_j w_j |v_je| + S max|v| 4 denorm_min,
// the last term for weights that underflow to subnormals. The twin's own error (2^-64 per step) is
// added the same way.
template <class T>
struct Twin {
  std::vector<long double> out, tol;
};

template <class T>
Twin<T> twin(const Problem<T>& p, const FusedBlocking& bs) {
  const long double u = std::numeric_limits<T>::epsilon() / 2, ut = 0x1p-64L;
  const int64_t G = p.G, L = p.L, S = p.S, D = p.D, Dv = p.Dv, nb = (S + bs.bc - 1) / bs.bc;
  long double vmax = 0;
  for (T x : p.v) vmax = std::max<long double>(vmax, std::fabs(x));
  Twin<T> t;
  t.out.resize(size_t(G * L * Dv));
  t.tol.resize(size_t(G * L * Dv));
  std::vector<long double> s(static_cast<size_t>(S)), mag(static_cast<size_t>(S)), w(static_cast<size_t>(S));
  for (int64_t g = 0; g < G; ++g)
    for (int64_t i = 0; i < L; ++i) {
      bool nan_row = false;
      long double m = -INFINITY;
      for (int64_t j = 0; j < S; ++j) {
        long double dot = 0, a = 0;
        for (int64_t d = 0; d < D; ++d) {
          const long double x = (long double)p.q[size_t((g * L + i) * D + d)] * p.k[size_t((g * S + j) * D + d)];
          dot += x;
          a += std::fabs(x);
        }
        const long double b = p.bias.empty() ? 0.0L : p.bias[size_t(g / p.heads * S + j)];
        const long double am = p.attn.empty() ? 0.0L : p.attn[size_t(g * p.attn_stride + i * S + j)];
        s[size_t(j)] = (p.scale * dot + b) + am;
        mag[size_t(j)] = std::fabs(p.scale) * a + std::fabs(b) + std::fabs(am);
        if (std::isnan(s[size_t(j)])) nan_row = true;
        if (s[size_t(j)] > m) m = s[size_t(j)];
      }
      nan_row = nan_row || std::isinf(m);
      long double sum = 0, sigma = 0, dmax = 0;
      for (int64_t j = 0; j < S; ++j) {
        sum += w[size_t(j)] = nan_row ? 0.0L : std::exp(s[size_t(j)] - m);
        if (std::isfinite(s[size_t(j)])) {
          sigma = std::max(sigma, (gamma_n(2 * (D + 3), u) + gamma_n(D + 3, ut)) * mag[size_t(j)]);
          dmax = std::max(dmax, m - s[size_t(j)]);
        }
      }
      const long double ew = 2 * sigma + (u + ut) * (2 * dmax + 6 + 3 * nb);
      const long double rel = 2 * ew + 2 * gamma_n(2 * (bs.bc + nb + 2), u) + 2 * u + gamma_n(2 * S + 4, ut);
      for (int64_t e = 0; e < Dv; ++e) {
        long double o = 0, mass = 0;
        for (int64_t j = 0; j < S; ++j) {
          const long double x = p.v[size_t((g * S + j) * Dv + e)];
          o += w[size_t(j)] / sum * x;
          mass += w[size_t(j)] / sum * std::fabs(x);
        }
        const size_t at = size_t((g * L + i) * Dv + e);
        t.out[at] = nan_row ? (long double)NAN : o;
        t.tol[at] = rel * mass + S * vmax * 4 * std::numeric_limits<T>::denorm_min();
      }
    }
  return t;
}

// Elements of got outside the twin's bound, or NaN where the twin is not (and the reverse).
template <class T>
int64_t count_bad(const std::vector<T>& got, const Twin<T>& t) {
  int64_t bad = 0;
  for (size_t e = 0; e < got.size(); ++e) {
    const bool ok = std::isnan(t.out[e]) ? std::isnan(got[e]) : std::fabs(got[e] - t.out[e]) <= t.tol[e];
    if (!ok) {
      if (bad == 0)
        UNSCOPED_INFO("first bad element " << e << ": " << double(got[e]) << ", expected " << double(t.out[e])
                                           << " within " << double(t.tol[e]));
      ++bad;
    }
  }
  return bad;
}

template <class T>
bool identical(const std::vector<T>& a, const std::vector<T>& b) {
  return a.size() == b.size() && std::memcmp(a.data(), b.data(), a.size() * sizeof(T)) == 0;
}

// The fewest queries per group that a masked call computes in wide blocks on every path: below two
// wide blocks' worth, or below 128 in double with wide blocks of 32 rows (AVX-512), it takes the narrow
// ones (fused_attention.cpp).
int64_t wide_rows(const FusedBlocking& bs) { return std::max<int64_t>(2 * bs.br, 128); }

// The sizes a path's blocks make interesting: 1, 2, br +- 1, bc +- 1, 3 bc + 1.
std::vector<int64_t> edge_sizes(const FusedBlocking& bs) {
  const std::set<int64_t> s{1, 2, bs.br - 1, bs.br + 1, bs.bc - 1, bs.bc + 1, 3 * bs.bc + 1};
  std::vector<int64_t> v;
  for (int64_t x : s)
    if (x >= 1) v.push_back(x);
  return v;
}

}  // namespace

TEMPLATE_TEST_CASE("fused attention on every path matches its long-double twin on edge sizes", "[fused]", float,
                   double) {
  // Every (L, S) pair of edge sizes with (D, Dv) cycling through {1, 3, 16, 17, 64}^2, then every
  // (D, Dv) pair at L = br + 1, S = 2 bc + 3; the mask kinds cycle through both sweeps. G = 4 groups
  // of 2 heads: two batch elements for the key bias.
  using T = TestType;
  const int64_t dims[] = {1, 3, 16, 17, 64};
  for (GemmIsa isa : available_isas()) {
    const ForceIsa force(isa);
    const FusedBlocking bs = fused_attention_detail::blocking<T>(isa);
    Rng rng(606);
    int n = 0;
    auto check = [&](int64_t L, int64_t S, int64_t D, int64_t Dv) {
      const MaskKind kind = kMaskKinds[n % 6];
      ++n;
      CAPTURE(to_string(isa), L, S, D, Dv, name(kind));
      const Problem<T> p = make_problem<T>(rng, 4, L, S, D, Dv, kind);
      CHECK(count_bad(p.run(), twin(p, bs)) == 0);
    };
    for (int64_t L : edge_sizes(bs))
      for (int64_t S : edge_sizes(bs)) check(L, S, dims[n % 5], dims[(n / 5) % 5]);
    for (int64_t D : dims)
      for (int64_t Dv : dims) check(bs.br + 1, 2 * bs.bc + 3, D, Dv);
  }
}

TEMPLATE_TEST_CASE("fused attention over many groups equals one call per group bit for bit", "[fused]", float, double) {
  // The group offsets: group g reads its own q, k, v, its 3-D mask slice (g * L * S) and the key bias
  // row of its batch element (g / heads); the same work one group at a time must give the same bits,
  // and so must both orders of the units under a shared mask (block of queries by block, or group by
  // group), on one thread and on two.
  using T = TestType;
  struct Restore {
    ~Restore() { fused_attention_detail::set_unit_order(0); }
  } restore;
  Rng rng(707);
  for (GemmIsa isa : available_isas()) {
    const ForceIsa force(isa);
    const FusedBlocking bs = fused_attention_detail::blocking<T>(isa);
    // narrow blocks and wide ones (a shared mask transposed once per call for either)
    for (const int64_t L : {int64_t(bs.br) + 3, wide_rows(bs) + 3})
      for (MaskKind kind : {MaskKind::PerGroup3d, MaskKind::Shared2dAndKeyBias}) {
        CAPTURE(to_string(isa), L, name(kind));
        Problem<T> p = make_problem<T>(rng, 6, L, bs.bc + 5, 9, 7, kind);
        p.heads = 3;
        if (!p.bias.empty()) p.bias.resize(size_t(2 * p.S));
        for (T& x : p.bias) x = rng.coin(0.3) ? -std::numeric_limits<T>::infinity() : T(rng.normal());
        fused_attention_detail::set_unit_order(1);
        const std::vector<T> all = p.run(2), block_major_1 = p.run(1);
        fused_attention_detail::set_unit_order(-1);
        const std::vector<T> group_major = p.run(2), group_major_1 = p.run(1);
        std::vector<T> one_by_one(all.size());
        for (int64_t g = 0; g < p.G; ++g) {
          AttentionMasks<T> m;
          m.attn = p.attn.empty() ? nullptr : p.attn.data() + g * p.attn_stride;
          m.key_bias = p.bias.empty() ? nullptr : p.bias.data() + g / p.heads * p.S;
          fused_attention(one_by_one.data() + g * p.L * p.Dv, p.q.data() + g * p.L * p.D, p.k.data() + g * p.S * p.D,
                          p.v.data() + g * p.S * p.Dv, int64_t(1), p.L, p.S, p.D, p.Dv, p.scale, m);
        }
        CHECK(identical(all, one_by_one));
        CHECK(identical(group_major, one_by_one));
        CHECK(identical(block_major_1, one_by_one));
        CHECK(identical(group_major_1, one_by_one));
      }
  }
}

TEMPLATE_TEST_CASE("decoding's stacked kv-group heads and the narrow blocks give the wide path's bits", "[fused]",
                   float, double) {
  // One query per head, heads sharing kv groups (AttentionLayout::repeat 4): the heads of a group are computed
  // as the rows of one narrow block. Each head alone (its own call, its kv group's keys) must give
  // the same bits, with every mask kind a decoding step can have; and a wide block's rows (L past
  // the narrow block's width) the same bits as each row's own one-query call.
  // Both with the few-query kernel (which takes groups of up to half a vector of queries) and
  // without it (the narrow blocks take them).
  using T = TestType;
  const T ninf = -std::numeric_limits<T>::infinity();
  struct Restore {
    ~Restore() { fused_attention_detail::set_few_queries(true); }
  } restore;
  Rng rng(911);
  for (GemmIsa isa : available_isas())
    for (const bool few : {true, false}) {
      fused_attention_detail::set_few_queries(few);
      const ForceIsa force(isa);
      const FusedBlocking bs = fused_attention_detail::blocking<T>(isa);
      for (MaskKind kind : {MaskKind::None, MaskKind::Shared2d, MaskKind::KeyBias, MaskKind::Shared2dAndKeyBias}) {
        for (int64_t heads : {4, 8, 2}) {  // 2: a batch element's heads split a kv group, so not stacked
          CAPTURE(to_string(isa), few, name(kind), heads);
          const int64_t rep = 4, G = 8, S = 2 * bs.bc + 3, D = 9, Dv = 7;
          Problem<T> p = make_problem<T>(rng, G / rep, 1, S, D, Dv, kind);  // k and v: one per kv group
          p.G = G, p.heads = heads;
          p.q.resize(size_t(G * D));
          for (T& x : p.q) x = T(rng.normal());
          if (!p.bias.empty()) {
            p.bias.resize(size_t(G / heads * S));
            for (T& x : p.bias) x = rng.coin(0.3) ? ninf : T(rng.normal());
          }
          std::vector<T> stacked(size_t(G * Dv), T(-7)), alone(stacked.size(), T(-7));
          fused_attention(stacked.data(), p.q.data(), p.k.data(), p.v.data(), G, int64_t(1), S, D, Dv, p.scale,
                          p.masks(),
                          2, AttentionLayout{rep, 0, {}, {0, S * D}, {0, S * Dv}, {}});
          for (int64_t g = 0; g < G; ++g) {
            AttentionMasks<T> m;
            m.attn = p.attn.empty() ? nullptr : p.attn.data();
            m.key_bias = p.bias.empty() ? nullptr : p.bias.data() + g / heads * S;
            fused_attention(alone.data() + g * Dv, p.q.data() + g * D, p.k.data() + g / rep * S * D,
                            p.v.data() + g / rep * S * Dv, int64_t(1), int64_t(1), S, D, Dv, p.scale, m);
          }
          CHECK(identical(stacked, alone));
          CHECK(std::all_of(stacked.begin(), stacked.end(), [](T x) { return x != T(-7); }));
        }
      }
      // wide against narrow: rows in wide blocks under a shared mask, each row again alone
      CAPTURE(to_string(isa));
      Problem<T> p = make_problem<T>(rng, 2, wide_rows(bs) + 1, bs.bc + 5, 9, 7, MaskKind::Shared2d);
      const std::vector<T> wide = p.run();
      std::vector<T> rows(wide.size());
      for (int64_t g = 0; g < p.G; ++g)
        for (int64_t i = 0; i < p.L; ++i) {
          AttentionMasks<T> m;
          m.attn = p.attn.data() + i * p.S;
          fused_attention(rows.data() + (g * p.L + i) * p.Dv, p.q.data() + (g * p.L + i) * p.D,
                          p.k.data() + g * p.S * p.D, p.v.data() + g * p.S * p.Dv, int64_t(1), int64_t(1), p.S, p.D,
                          p.Dv,
                          p.scale, m);
        }
      CHECK(identical(wide, rows));
    }
}

TEMPLATE_TEST_CASE("the few-query kernel gives the blocks' bits", "[fused]", float, double) {
  // A group of at most half a vector of queries takes the few-query kernel (lanes over keys and
  // value columns); switched off, the narrow blocks. Both compute every number alike, so each output
  // must be the same bits (NaN: NaN in both; its payload may come from either operand of an FMA,
  // which the two kernels give in the other order: q k against k q, p v against v p). L = 1 .. 9
  // queries per group (past half a vector on every path), key counts around the blocks (1, bc - 1,
  // bc + 1, 2 bc + 3), D and Dv from 1 to 128 (vector tails, more value vectors than a tile holds),
  // every mask kind, q divided by 1, a power of two or 3, rows all -inf (NaN, or zeros with
  // zero_dead_rows), NaN in q, k or v; and decoding's stacked heads (repeat 2, 4 and 8, one query
  // each) over 16.5 and 32 key blocks (the kernel reads 16 blocks' keys at a time), a sliding
  // window's bias closing all but a block and a bit (skipped, and computed: the same bits), on one
  // thread and on two.
  using T = TestType;
  const T ninf = -std::numeric_limits<T>::infinity(), nan = std::numeric_limits<T>::quiet_NaN();
  struct Restore {
    ~Restore() { fused_attention_detail::set_few_queries(true), fused_attention_detail::set_skip_masked_blocks(true); }
  } restore;
  auto same = [](const std::vector<T>& a, const std::vector<T>& b) {
    if (a.size() != b.size()) return false;
    for (size_t e = 0; e < a.size(); ++e)
      if (std::isnan(a[e]) ? !std::isnan(b[e]) : std::memcmp(&a[e], &b[e], sizeof(T)) != 0) {
        UNSCOPED_INFO("element " << e << ": " << double(a[e]) << " against " << double(b[e]));
        return false;
      }
    return true;
  };
  const int64_t dims[] = {1, 5, 16, 17, 64, 128};
  const T divisors[] = {T(1), T(8), T(3)};
  Rng rng(2024);
  for (GemmIsa isa : available_isas()) {
    const ForceIsa force(isa);
    const FusedBlocking bs = fused_attention_detail::blocking<T>(isa);
    int n = 0;
    for (int64_t L = 1; L <= 9; ++L)
      for (const int64_t S : {int64_t(1), int64_t(bs.bc) - 1, int64_t(bs.bc) + 1, 2 * int64_t(bs.bc) + 3}) {
        const int64_t D = dims[n % 6], Dv = dims[(n / 6 + n) % 6];
        const MaskKind kind = kMaskKinds[n % 6];
        const T div = divisors[n % 3];
        const int poison = n % 5;  // 0, 1: none; 2: NaN in q; 3: in k; 4: in v
        const bool dead = n % 7 == 3, zero_dead = n % 2 == 0;
        ++n;
        CAPTURE(to_string(isa), L, S, D, Dv, name(kind), double(div), poison, dead, zero_dead);
        Problem<T> p = make_problem<T>(rng, 4, L, S, D, Dv, kind);
        if (poison == 2) p.q[size_t(rng.integer(0, int64_t(p.q.size()) - 1))] = nan;
        if (poison == 3) p.k[size_t(rng.integer(0, int64_t(p.k.size()) - 1))] = nan;
        if (poison == 4) p.v[size_t(rng.integer(0, int64_t(p.v.size()) - 1))] = nan;
        if (dead) {  // batch element 1's keys all closed: its rows all -inf
          p.bias.assign(size_t(2 * S), T(0));
          std::fill(p.bias.begin() + S, p.bias.end(), ninf);
        }
        AttentionMasks<T> m = p.masks();
        m.zero_dead_rows = zero_dead;
        auto run = [&](bool few, int threads) {
          fused_attention_detail::set_few_queries(few);
          std::vector<T> out(size_t(p.G * L * Dv), T(-7));
          fused_attention(out.data(), p.q.data(), p.k.data(), p.v.data(), p.G, L, S, D, Dv, p.scale, m, threads,
                          AttentionLayout{}, div);
          return out;
        };
        const std::vector<T> blocks = run(false, 1);
        CHECK(same(run(true, 1), blocks));
        CHECK(same(run(true, 2), blocks));
        CHECK(std::none_of(blocks.begin(), blocks.end(), [](T x) { return x == T(-7); }));
      }
    // decoding: G heads of one query, `rep` of them sharing each kv group, 2 batch elements; keys
    // in runs of 16 blocks and more (the kernel reads 16 blocks' keys at a time); batch element 1's
    // bias closes all but its last bc + 5 keys (a sliding window: its blocks skipped)
    for (const int64_t rep : {2, 4, 8}) {
      const int64_t G = 16, S = rep == 4 ? 32 * bs.bc + 3 : 16 * bs.bc + bs.bc / 2 + 1, D = 128;
      const int64_t Dv = rep == 2 ? 72 : 128;
      CAPTURE(to_string(isa), rep, S, Dv);
      Problem<T> p = make_problem<T>(rng, G / rep, 1, S, D, Dv, MaskKind::KeyBias);
      p.G = G, p.heads = 8;
      p.q.resize(size_t(G * D));
      for (T& x : p.q) x = T(rng.normal());
      p.bias.resize(size_t(2 * S));
      for (T& x : p.bias) x = rng.coin(0.3) ? ninf : T(rng.normal());
      std::fill(p.bias.begin() + S, p.bias.end() - (bs.bc + 5), ninf);
      auto run = [&](bool few) {
        fused_attention_detail::set_few_queries(few);
        std::vector<T> out(size_t(G * Dv), T(-7));
        fused_attention(out.data(), p.q.data(), p.k.data(), p.v.data(), G, int64_t(1), S, D, Dv, p.scale, p.masks(), 2,
                        AttentionLayout{rep, 8, {}, {0, S * D}, {0, S * Dv}, {}});
        return out;
      };
      const std::vector<T> blocks = run(false);
      CHECK(same(run(true), blocks));
      fused_attention_detail::set_skip_masked_blocks(false);
      const std::vector<T> computed = run(true);
      fused_attention_detail::set_skip_masked_blocks(true);
      CHECK(same(computed, blocks));
      // and both right: the twin of the same heads, each with its own copy of its kv group
      Problem<T> copies = p;
      copies.k.clear(), copies.v.clear();
      for (int64_t g = 0; g < G; ++g) {
        copies.k.insert(copies.k.end(), p.k.begin() + g / rep * S * D, p.k.begin() + (g / rep + 1) * S * D);
        copies.v.insert(copies.v.end(), p.v.begin() + g / rep * S * Dv, p.v.begin() + (g / rep + 1) * S * Dv);
      }
      CHECK(count_bad(blocks, twin(copies, bs)) == 0);
      // a NaN key inside a block the window closes to batch element 1 (kv group G / rep / 2 is its
      // first): the block cannot be skipped, and its heads' outputs are NaN
      p.k[size_t((G / rep / 2 * S + 1) * D + 3)] = nan;
      const std::vector<T> poisoned = run(false);
      CHECK(same(run(true), poisoned));
      CHECK(std::isnan(poisoned[size_t(8 * Dv)]));
    }
  }
}

TEMPLATE_TEST_CASE("fused attention reads a packed projection in place and writes the heads side by side", "[fused]",
                   float, double) {
  // AttentionLayout: q, k and v read as the thirds of one (B, L, 3E) projection, q divided by q_divisor
  // as it is read, the heads' outputs written side by side into (B, L, E); and decoding's stacked heads
  // (L = 1, kv groups shared by repeat = 2 heads) with q and out strided the same way. Each must give
  // the bits of the contiguous call on the split heads, q divided beforehand; nothing outside the
  // heads' columns written (out's other columns keep their sentinel).
  using T = TestType;
  const T ninf = -std::numeric_limits<T>::infinity();
  Rng rng(2718);
  for (GemmIsa isa : available_isas()) {
    const ForceIsa force(isa);
    const FusedBlocking bs = fused_attention_detail::blocking<T>(isa);
    for (const int64_t L : {int64_t(1), int64_t(5), int64_t(bs.br) + 7, 2 * int64_t(bs.br) + 3}) {
      // D = 16: q_divisor 4, a power of two, taken as a multiplication by 1/4 (the same bits)
      for (const int64_t D : {int64_t(9), int64_t(16)})
        for (MaskKind kind : {MaskKind::None, MaskKind::Causal, MaskKind::KeyBias, MaskKind::Shared2dAndKeyBias}) {
          const bool decode = L == 1;
          const int64_t B = 2, H = 4, rep = decode ? 2 : 1, E = H * D, S = decode ? 2 * bs.bc + 3 : L;
          const int64_t ldx = E + 2;  // out's rows: E columns of heads and two more left alone
          CAPTURE(to_string(isa), L, D, name(kind));
          std::vector<T> packed(size_t(B * L * 3 * E));
          for (T& x : packed) x = T(rng.normal());
          const T div = std::sqrt(T(D));
          // the contiguous split: q (B * H, L, D) divided; k, v (B * H / rep, S, D)
          std::vector<T> q(size_t(B * H * L * D)), k(size_t(B * H / rep * S * D)), v(k.size());
          for (int64_t b = 0; b < B; ++b)
            for (int64_t h = 0; h < H; ++h)
              for (int64_t i = 0; i < L; ++i)
                for (int64_t d = 0; d < D; ++d)
                  q[size_t(((b * H + h) * L + i) * D + d)] = packed[size_t((b * L + i) * 3 * E + h * D + d)] / div;
          if (decode) {
            for (T& x : k) x = T(rng.normal());
            for (T& x : v) x = T(rng.normal());
          } else {
            for (int64_t b = 0; b < B; ++b)
              for (int64_t h = 0; h < H; ++h)
                for (int64_t j = 0; j < S; ++j)
                  for (int64_t d = 0; d < D; ++d) {
                    const size_t at = size_t((b * L + j) * 3 * E + h * D + d);
                    k[size_t(((b * H + h) * S + j) * D + d)] = packed[at + size_t(E)];
                    v[size_t(((b * H + h) * S + j) * D + d)] = packed[at + size_t(2 * E)];
                  }
          }
          std::vector<T> attn, bias;
          AttentionMasks<T> m;
          if (kind == MaskKind::Causal || kind == MaskKind::Shared2dAndKeyBias) {
            attn.resize(size_t(L * S));
            for (int64_t i = 0; i < L; ++i)
              for (int64_t j = 0; j < S; ++j)
                attn[size_t(i * S + j)] = kind == MaskKind::Causal ? (j > i ? ninf : T(0)) : T(rng.normal());
            m.attn = attn.data();
          }
          if (kind == MaskKind::KeyBias || kind == MaskKind::Shared2dAndKeyBias) {
            bias.resize(size_t(B * S));
            for (T& x : bias) x = rng.coin(0.25) ? ninf : T(0);
            m.key_bias = bias.data(), m.heads = H;
          }
          AttentionLayout contiguous;
          contiguous.repeat = rep;
          std::vector<T> want(size_t(B * H * L * D));
          fused_attention(want.data(), q.data(), k.data(), v.data(), B * H, L, S, D, D, T(0.5), m, 1, contiguous);
          AttentionLayout in_place;
          in_place.repeat = rep, in_place.heads = H;
          in_place.q = RowLayout{3 * E, D, L * 3 * E};
          if (!decode) in_place.k = in_place.v = in_place.q;
          in_place.out = RowLayout{ldx, D, L * ldx};
          std::vector<T> out(size_t(B * L * ldx), T(-7));
          const T* kp = decode ? k.data() : packed.data() + E;
          const T* vp = decode ? v.data() : packed.data() + 2 * E;
          fused_attention(out.data(), packed.data(), kp, vp, B * H, L, S, D, D, T(0.5), m, 2, in_place, div);
          std::vector<T> got(want.size());
          for (int64_t b = 0; b < B; ++b)
            for (int64_t h = 0; h < H; ++h)
              for (int64_t i = 0; i < L; ++i)
                for (int64_t d = 0; d < D; ++d)
                  got[size_t(((b * H + h) * L + i) * D + d)] = out[size_t((b * L + i) * ldx + h * D + d)];
          CHECK(identical(got, want));
          int64_t untouched = 0;
          for (int64_t r = 0; r < B * L; ++r)
            untouched += out[size_t(r * ldx + E)] == T(-7) && out[size_t(r * ldx + E + 1)] == T(-7);
          CHECK(untouched == B * L);
        }
    }
  }
}

TEMPLATE_TEST_CASE("fused attention finds a key block's maximum at every key", "[fused]", float, double) {
  // One key's bias 1000 above the others': its weight is exactly 1 and every other one exactly 0
  // (exp of about -1000), so each row of the output is that key's value row, bit for bit, wherever
  // the key lies in its block (the maximum's chains, softmax_block). A maximum missed by the
  // kernel would leave exp(s - mu) at infinity: NaN rows. Narrow and wide blocks, every path.
  using T = TestType;
  Rng rng(1000);
  for (GemmIsa isa : available_isas()) {
    const ForceIsa force(isa);
    const FusedBlocking bs = fused_attention_detail::blocking<T>(isa);
    for (const int64_t L : {int64_t(3), wide_rows(bs) + 5}) {
      const int64_t S = 2 * bs.bc + 3, D = 5, Dv = 3;
      std::vector<T> q(size_t(L * D)), k(size_t(S * D)), v(size_t(S * Dv));
      for (std::vector<T>* x : {&q, &k, &v})
        for (T& e : *x) e = T(rng.normal());
      int64_t wrong = 0;
      for (int64_t p = 0; p < S; ++p) {
        std::vector<T> bias(size_t(S), T(0)), out(size_t(L * Dv));
        bias[size_t(p)] = T(1000);
        AttentionMasks<T> m;
        m.key_bias = bias.data();
        fused_attention(out.data(), q.data(), k.data(), v.data(), int64_t(1), L, S, D, Dv, T(1) / std::sqrt(T(D)), m);
        for (int64_t i = 0; i < L; ++i)
          wrong += !std::equal(v.begin() + p * Dv, v.begin() + (p + 1) * Dv, out.begin() + i * Dv);
      }
      CAPTURE(to_string(isa), L);
      CHECK(wrong == 0);
    }
  }
}

TEMPLATE_TEST_CASE("fused attention fully masked rows give NaN and rows masked in early blocks recover", "[fused]",
                   float, double) {
  // S = 3 bc + 1 keys: four blocks, the last of one key. Row 0 all -inf: NaN (0 / 0), torch 1.13's
  // answer. Row 1: -inf over the first two blocks only: its running maximum stays -inf for two blocks,
  // which must add nothing (not NaN) and leave the rest to the twin's bound. Row 2: only the very last
  // key open: the weight is exactly 1, the output exactly v's last row. Row 3: only key 0 open, the
  // later blocks all -inf: exactly v's first row. Row 4: two keys open in different blocks. Row 5: no
  // mask. Then a key bias that closes every key of batch element 1: its groups all NaN, element 0's
  // untouched.
  using T = TestType;
  const T ninf = -std::numeric_limits<T>::infinity();
  Rng rng(808);
  for (GemmIsa isa : available_isas()) {
    const ForceIsa force(isa);
    const FusedBlocking bs = fused_attention_detail::blocking<T>(isa);
    CAPTURE(to_string(isa));
    Problem<T> p = make_problem<T>(rng, 4, 6, 3 * bs.bc + 1, 8, 5, MaskKind::None);
    const int64_t S = p.S, Dv = p.Dv;
    p.attn.assign(size_t(p.L * S), T(0));
    auto row = [&](int64_t i) { return p.attn.data() + i * S; };
    std::fill(row(0), row(0) + S, ninf);
    std::fill(row(1), row(1) + 2 * bs.bc, ninf);
    std::fill(row(2), row(2) + S - 1, ninf);
    std::fill(row(3) + 1, row(3) + S, ninf);
    std::fill(row(4), row(4) + S, ninf);
    row(4)[5] = row(4)[2 * bs.bc + 7] = T(0);
    const std::vector<T> out = p.run();
    CHECK(count_bad(out, twin(p, bs)) == 0);
    for (int64_t g = 0; g < p.G; ++g)
      for (int64_t e = 0; e < Dv; ++e) {
        CAPTURE(g, e);
        auto o = [&](int64_t i) { return out[size_t((g * p.L + i) * Dv + e)]; };
        CHECK(std::isnan(o(0)));
        CHECK(std::isfinite(o(1)));
        CHECK(o(2) == p.v[size_t((g * S + S - 1) * Dv + e)]);
        CHECK(o(3) == p.v[size_t((g * S + 0) * Dv + e)]);
        CHECK(std::isfinite(o(4)));
        CHECK(std::isfinite(o(5)));
      }

    p.attn.clear();
    p.bias.assign(size_t(2 * S), T(0));
    std::fill(p.bias.begin() + S, p.bias.end(), ninf);
    const std::vector<T> padded = p.run(3);
    CHECK(count_bad(padded, twin(p, bs)) == 0);
    const size_t half = padded.size() / 2;
    CHECK(std::all_of(padded.begin(), padded.begin() + int64_t(half), [](T x) { return std::isfinite(x); }));
    CHECK(std::all_of(padded.begin() + int64_t(half), padded.end(), [](T x) { return std::isnan(x); }));
  }
}

namespace {

// The reference path in T: qdotk_ref, scale, + key bias, + mask, softmax_forward_ref, weighted_sum_v_ref.
template <class T>
std::vector<T> reference_path(const Problem<T>& p) {
  std::vector<T> s(size_t(p.G * p.L * p.S)), out(size_t(p.G * p.L * p.Dv));
  qdotk_ref(s.data(), p.q.data(), p.k.data(), p.G, p.L, p.S, p.D);
  for (int64_t g = 0; g < p.G; ++g)
    for (int64_t i = 0; i < p.L; ++i)
      for (int64_t j = 0; j < p.S; ++j) {
        T& x = s[size_t((g * p.L + i) * p.S + j)];
        x = p.scale * x;
        if (!p.bias.empty()) x = x + p.bias[size_t(g / p.heads * p.S + j)];
        if (!p.attn.empty()) x = x + p.attn[size_t(g * p.attn_stride + i * p.S + j)];
      }
  softmax_forward_ref(s.data(), s.data(), p.G * p.L, p.S);
  weighted_sum_v_ref(out.data(), s.data(), p.v.data(), p.G, p.L, p.S, p.Dv);
  return out;
}

template <class T>
int64_t nan_mismatches(const std::vector<T>& a, const std::vector<T>& b) {
  int64_t n = 0;
  for (size_t e = 0; e < a.size(); ++e) n += std::isnan(a[e]) != std::isnan(b[e]);
  return n;
}

}  // namespace

TEMPLATE_TEST_CASE("fused attention propagates NaN where the reference path does", "[fused]", float, double) {
  // One poisoned input at a time, over three key blocks; the NaN positions must be exactly the
  // reference path's, and each case must poison something (the test can fail both ways):
  //   q (group 1, row 3): that row; k (group 0, key 5): all of group 0; v (group 0, key 5, column 2):
  //   column 2 of group 0; v at a key the key bias closes (-inf, weight exactly 0): 0 * NaN, still
  //   NaN, as in the reference path; the mask at (2, 7): row 2 of every group; +inf in the mask at
  //   (4, 1): inf - inf, row 4 NaN.
  using T = TestType;
  const T nan = std::numeric_limits<T>::quiet_NaN(), inf = std::numeric_limits<T>::infinity();
  Rng rng(909);
  for (GemmIsa isa : available_isas()) {
    const ForceIsa force(isa);
    const FusedBlocking bs = fused_attention_detail::blocking<T>(isa);
    const Problem<T> base = make_problem<T>(rng, 4, 7, 2 * bs.bc + 5, 6, 4, MaskKind::Shared2d);
    const int64_t L = base.L, S = base.S, D = base.D, Dv = base.Dv;
    for (int c = 0; c < 6; ++c) {
      CAPTURE(to_string(isa), c);
      Problem<T> p = base;
      if (c == 0) p.q[size_t((1 * L + 3) * D + 0)] = nan;
      if (c == 1) p.k[size_t((0 * S + 5) * D + 2)] = nan;
      if (c == 2) p.v[size_t((0 * S + 5) * Dv + 2)] = nan;
      if (c == 3) {
        p.bias.assign(size_t(2 * S), T(0));
        p.bias[5] = -inf;
        p.v[size_t((0 * S + 5) * Dv + 2)] = nan;
      }
      if (c == 4) p.attn[size_t(2 * S + 7)] = nan;
      if (c == 5) p.attn[size_t(4 * S + 1)] = inf;
      const std::vector<T> fused = p.run(2), ref = reference_path(p);
      CHECK(nan_mismatches(fused, ref) == 0);
      CHECK(std::any_of(fused.begin(), fused.end(), [](T x) { return std::isnan(x); }));
      CHECK(std::any_of(fused.begin(), fused.end(), [](T x) { return std::isfinite(x); }));
    }
  }
}

TEMPLATE_TEST_CASE("fused attention skips masked-out key blocks without changing a bit", "[fused]", float, double) {
  // Key blocks closed to a whole block of queries are skipped only when that is exact; with the skip
  // switched off every block is computed. Both must give the same bits, and where an input is
  // poisoned the reference path's NaN. Masks: causal; a key bias closing one block of keys of batch
  // element 1 and all keys from 2 bc on of element 0; a 3-D mask with whole (br, bc) blocks -inf.
  // Poison, inside blocks the causal mask closes: NaN in k (the score NaN + -inf = NaN poisons every
  // row); NaN in v (0 * NaN); q and k of 1e30 whose product overflows (inf + -inf); a +inf bias
  // (+inf + -inf). And at key L + 1, which the causal mask closes to every query, inside the key
  // block of the last queries (left out of that block's computed keys, open_keys, where that is
  // exact): NaN in v, NaN in k, a +inf bias. L: wide_rows and more (the wide blocks), and fewer (a
  // masked call's narrow blocks).
  using T = TestType;
  const T ninf = -std::numeric_limits<T>::infinity(), nan = std::numeric_limits<T>::quiet_NaN();
  struct Restore {
    ~Restore() { fused_attention_detail::set_skip_masked_blocks(true); }
  } restore;
  Rng rng(1313);
  for (GemmIsa isa : available_isas()) {
    const ForceIsa force(isa);
    const FusedBlocking bs = fused_attention_detail::blocking<T>(isa);
    // and one or two queries, the few-query kernel's (its skip takes the same test)
    for (const int64_t L : {wide_rows(bs) + 3, int64_t(bs.br) + 5, int64_t(1), int64_t(2)}) {
      for (int c = 0; c < 10; ++c) {
        const int64_t G = 4, S = 3 * bs.bc + 2, D = 7, Dv = 5;
        CAPTURE(to_string(isa), L, c);
        Problem<T> p = make_problem<T>(rng, G, L, S, D, Dv, c == 2 ? MaskKind::PerGroup3d : MaskKind::Causal);
        if (c == 1) {
          p.attn.clear();
          p.bias.assign(size_t(2 * S), T(0));
          std::fill(p.bias.begin() + 2 * bs.bc, p.bias.begin() + S, ninf);
          std::fill(p.bias.begin() + S + bs.bc, p.bias.begin() + S + 2 * bs.bc, ninf);
        }
        if (c == 2)
          for (int64_t g = 0; g < G; ++g)
            for (int64_t i = 0; i < L; ++i)
              for (int64_t j = 0; j < S; ++j)
                if ((g + i / bs.br + j / bs.bc) % 2 == 0) p.attn[size_t((g * L + i) * S + j)] = ninf;
        if (c == 3) p.k[size_t((1 * S + S - 1) * D + 3)] = nan;
        if (c == 4) p.v[size_t((2 * S + S - 1) * Dv + 1)] = nan;
        if (c == 5) {
          for (int64_t d = 0; d < D; ++d) p.q[size_t(d)] = p.k[size_t((S - 1) * D + d)] = T(1e30);
          if (sizeof(T) == 8)
            for (int64_t d = 0; d < D; ++d) p.q[size_t(d)] = p.k[size_t((S - 1) * D + d)] = T(1e160);
        }
        if (c == 6) {
          p.bias.assign(size_t(2 * S), T(0));
          p.bias[size_t(S + S - 1)] = std::numeric_limits<T>::infinity();
        }
        if (c == 7) p.v[size_t((0 * S + L + 1) * Dv + 2)] = nan;
        if (c == 8) p.k[size_t((3 * S + L + 1) * D + 4)] = nan;
        if (c == 9) {
          p.bias.assign(size_t(2 * S), T(0));
          p.bias[size_t(L + 1)] = std::numeric_limits<T>::infinity();
        }
        fused_attention_detail::set_skip_masked_blocks(true);
        const std::vector<T> skipped = p.run(2);
        fused_attention_detail::set_skip_masked_blocks(false);
        const std::vector<T> computed = p.run(2);
        CHECK(identical(skipped, computed));
        const std::vector<T> ref = reference_path(p);
        CHECK(nan_mismatches(skipped, ref) == 0);
        if (c >= 3) CHECK(std::any_of(skipped.begin(), skipped.end(), [](T x) { return std::isnan(x); }));
        if (c < 3) CHECK(count_bad(skipped, twin(p, bs)) == 0);
      }
    }
  }
}

TEMPLATE_TEST_CASE("fused attention with kv groups shared by query groups skips blocks as with copies of them",
                   "[fused]", float, double) {
  // AttentionLayout::repeat 2: query groups 2g and 2g + 1 read kv group g, whose key statistics the
  // skip of masked-out blocks reads (computed per kv group, by each thread as it comes to one). The
  // same call with each query group's own copy of its kv group must give the same bits: clean, and
  // with NaN in k or v of one kv group inside blocks a causal mask closes (NaN in every row of its
  // query groups, as the reference path gives, and in no other group's).
  using T = TestType;
  const T nan = std::numeric_limits<T>::quiet_NaN();
  Rng rng(1414);
  for (GemmIsa isa : available_isas()) {
    const ForceIsa force(isa);
    const FusedBlocking bs = fused_attention_detail::blocking<T>(isa);
    for (const int64_t L : {wide_rows(bs) + 3, int64_t(bs.br) + 5})
      for (int c = 0; c < 3; ++c) {
        const int64_t G = 8, rep = 2, S = 3 * bs.bc + 2, D = 7, Dv = 5;
        CAPTURE(to_string(isa), L, c);
        const Problem<T> p0 = make_problem<T>(rng, G / rep, L, S, D, Dv, MaskKind::Causal);
        std::vector<T> k = p0.k, v = p0.v;  // G / rep kv groups
        if (c == 1) k[size_t((1 * S + S - 1) * D + 3)] = nan;   // kv group 1, its last key
        if (c == 2) v[size_t((2 * S + S - 1) * Dv + 1)] = nan;  // kv group 2
        std::vector<T> q(size_t(G * L * D)), kc(size_t(G * S * D)), vc(size_t(G * S * Dv));
        for (T& x : q) x = T(rng.normal());
        for (int64_t g = 0; g < G; ++g) {
          std::copy_n(k.begin() + g / rep * S * D, S * D, kc.begin() + g * S * D);
          std::copy_n(v.begin() + g / rep * S * Dv, S * Dv, vc.begin() + g * S * Dv);
        }
        AttentionMasks<T> m;
        m.attn = p0.attn.data();
        std::vector<T> shared(size_t(G * L * Dv)), copies(shared.size());
        AttentionLayout layout;
        layout.repeat = rep;
        fused_attention(shared.data(), q.data(), k.data(), v.data(), G, L, S, D, Dv, p0.scale, m, 2, layout);
        fused_attention(copies.data(), q.data(), kc.data(), vc.data(), G, L, S, D, Dv, p0.scale, m, 2);
        CHECK(identical(shared, copies));
        int64_t nan_rows = 0;
        const auto is_nan = [](T x) { return std::isnan(x); };
        for (int64_t r = 0; r < G * L; ++r)
          nan_rows += std::any_of(shared.begin() + r * Dv, shared.begin() + (r + 1) * Dv, is_nan);
        CHECK(nan_rows == (c == 0 ? 0 : rep * L));
      }
  }
}

TEMPLATE_TEST_CASE("fused attention gives keys masked with -inf exactly zero weight", "[fused]", float, double) {
  // Values at the keys a causal mask or the key bias closes set to 1e30 instead of 0: any weight that
  // is not exactly 0 would show (even a subnormal one, times 1e30). The outputs must be identical.
  using T = TestType;
  Rng rng(1010);
  for (GemmIsa isa : available_isas()) {
    const ForceIsa force(isa);
    const FusedBlocking bs = fused_attention_detail::blocking<T>(isa);
    CAPTURE(to_string(isa));
    Problem<T> p = make_problem<T>(rng, 4, bs.br + 2, 2 * bs.bc + 3, 5, 6, MaskKind::Causal);
    p.bias.assign(size_t(2 * p.S), T(0));
    p.bias[size_t(p.S + 1)] = -std::numeric_limits<T>::infinity();  // batch element 1 (groups 2, 3), key 1
    Problem<T> zero = p, huge = p;
    // Key 1 is closed to every row of groups 2 and 3 through the bias alone; keys beyond L - 1 to every
    // row by the causal mask.
    for (int64_t g = 0; g < p.G; ++g)
      for (int64_t j = 0; j < p.S; ++j) {
        const bool closed = j > p.L - 1 || (g >= 2 && j == 1);
        if (!closed) continue;
        for (int64_t e = 0; e < p.Dv; ++e) {
          zero.v[size_t((g * p.S + j) * p.Dv + e)] = T(0);
          huge.v[size_t((g * p.S + j) * p.Dv + e)] = T(1e30);
        }
      }
    CHECK(identical(zero.run(), huge.run()));
  }
}

TEMPLATE_TEST_CASE("fused attention gives keys biased by the lowest finite value exactly zero weight", "[fused]",
                   float, double) {
  // A mask of finfo.min (transformers' masks) rather than -inf: no block is skipped, each such score
  // is computed and its exp's argument lies far below the exp's range (s - max overflows to -inf or
  // x log2(e) does), where the softmax's exp has no clamp (vexp_nonpositive). Values at those keys
  // 1e30 instead of 0: a weight not exactly 0 would show. One and two queries per group (the few-query
  // kernel), a narrow block and a bit, and a wide call; key counts around the blocks.
  using T = TestType;
  const T lowest = std::numeric_limits<T>::lowest();
  Rng rng(2020);
  for (GemmIsa isa : available_isas()) {
    const ForceIsa force(isa);
    const FusedBlocking bs = fused_attention_detail::blocking<T>(isa);
    CAPTURE(to_string(isa));
    for (int64_t L : {int64_t(1), int64_t(2), int64_t(bs.br) + 2, wide_rows(bs) + 1})
      for (int64_t S : {int64_t(3), int64_t(bs.bc) + 1, 2 * int64_t(bs.bc) + 3}) {
        CAPTURE(L, S);
        Problem<T> p = make_problem<T>(rng, 4, L, S, 5, 6, MaskKind::None);
        p.bias.assign(size_t(2 * S), T(0));
        p.bias[size_t(S - 1)] = lowest;  // batch element 0 (groups 0, 1), its last key
        p.bias[size_t(S + 1)] = lowest;  // batch element 1 (groups 2, 3), key 1
        Problem<T> zero = p, huge = p;
        for (int64_t g = 0; g < p.G; ++g) {
          const int64_t j = g < 2 ? S - 1 : 1;
          for (int64_t e = 0; e < p.Dv; ++e) {
            zero.v[size_t((g * S + j) * p.Dv + e)] = T(0);
            huge.v[size_t((g * S + j) * p.Dv + e)] = T(1e30);
          }
        }
        const std::vector<T> a = zero.run(), b = huge.run();
        CHECK(std::none_of(a.begin(), a.end(), [](T x) { return std::isnan(x); }));
        CHECK(identical(a, b));
      }
  }
}

TEMPLATE_TEST_CASE("fused attention does not depend on the thread count", "[fused]", float, double) {
  // The units (a group's block of queries) are dealt out to the threads in chunks: single units
  // over few groups, whole groups over many (16 per thread or more, group by group). Every output
  // starts as -7, so a unit no thread ran, or ran on the wrong rows, shows. Both unit orders, forced.
  using T = TestType;
  Rng rng(1111);
  struct Restore {
    ~Restore() { fused_attention_detail::set_unit_order(0); }
  } restore;
  for (GemmIsa isa : available_isas()) {
    const ForceIsa force(isa);
    const FusedBlocking bs = fused_attention_detail::blocking<T>(isa);
    struct Shape {
      int64_t G, L, S, D, Dv;
      MaskKind kind;
    };
    for (const Shape s :
         {Shape{5, 2 * bs.br + 3, 2 * bs.bc + 1, 17, 16, MaskKind::PerGroup3d}, Shape{1, 1, 1, 1, 1, MaskKind::None},
          Shape{1, 3 * bs.br + 1, 5, 3, 3, MaskKind::Causal}, Shape{6, 100, 100, 16, 16, MaskKind::Causal},
          Shape{50, 100, 100, 16, 16, MaskKind::Causal}, Shape{49, 2 * bs.br + 1, bs.bc + 2, 8, 5, MaskKind::None}})
      for (int order : {0, 1, -1}) {
        CAPTURE(to_string(isa), s.G, s.L, s.S, s.D, s.Dv, name(s.kind), order);
        fused_attention_detail::set_unit_order(order);
        const Problem<T> p = make_problem<T>(rng, s.G, s.L, s.S, s.D, s.Dv, s.kind);
        const std::vector<T> one = p.run(1);
        CHECK(identical(one, p.run(2)));
        CHECK(identical(one, p.run(3)));
      }
  }
}

TEMPLATE_TEST_CASE("fused attention with no keys gives zeros and with no queries or groups writes nothing", "[fused]",
                   float, double) {
  // S = 0: softmax over no keys, then an empty sum: zeros, as the reference path (a K = 0 gemm) and
  // torch give.
  using T = TestType;
  const T q[6] = {1, 2, 3, 4, 5, 6}, k[1] = {0}, v[1] = {0};
  std::vector<T> out(4, T(-7));
  fused_attention(out.data(), q, k, v, int64_t(2), int64_t(1), int64_t(0), int64_t(3), int64_t(2), T(1));
  CHECK(out == std::vector<T>(4, T(0)));
  std::fill(out.begin(), out.end(), T(-7));
  fused_attention(out.data(), q, k, v, int64_t(0), int64_t(1), int64_t(1), int64_t(3), int64_t(2), T(1));
  fused_attention(out.data(), q, k, v, int64_t(2), int64_t(0), int64_t(1), int64_t(3), int64_t(2), T(1));
  CHECK(out == std::vector<T>(4, T(-7)));
}

namespace {

template <class A, class B>
double rel_l2(const std::vector<A>& a, const std::vector<B>& b) {
  long double num = 0, den = 0;
  for (size_t e = 0; e < a.size(); ++e) {
    const long double d = (long double)a[e] - (long double)b[e];
    num += d * d;
    den += (long double)b[e] * b[e];
  }
  return double(std::sqrt(num / den));
}

}  // namespace

TEST_CASE("fused attention float32 error stays within 2x of the reference path against float64", "[fused]") {
  // The README's gate on the attention step: the float32 result's rel_l2 against the float64 truth
  // within 2x the reference path's own (qdotk, softmax_forward_ref, weighted_sum_v in float); the float64
  // result within 1e-10 of the float64 reference path. q is divided by sqrt(D) first, as torch 1.13's
  // MHA does, and the scale is 1. A causal mask, three key blocks and more.
  Rng rng(1212);
  const int64_t G = 2, L = 256, S = 256, D = 64, Dv = 64;
  Problem<float> p32 = make_problem<float>(rng, G, L, S, D, Dv, MaskKind::Causal);
  Problem<double> p64;
  p64.G = G, p64.L = L, p64.S = S, p64.D = D, p64.Dv = Dv, p64.scale = 1;
  p64.q.assign(p32.q.begin(), p32.q.end());
  p64.k.assign(p32.k.begin(), p32.k.end());
  p64.v.assign(p32.v.begin(), p32.v.end());
  p64.attn.assign(p32.attn.begin(), p32.attn.end());
  for (float& x : p32.q) x = x / std::sqrt(float(D));
  for (double& x : p64.q) x = x / std::sqrt(double(D));
  p32.scale = 1;
  auto reference = [](const auto& p) {  // the fast reference path (the GEMM's products), as MHA runs it
    using T = typename std::decay_t<decltype(p.q)>::value_type;
    std::vector<T> s(size_t(p.G * p.L * p.S)), out(size_t(p.G * p.L * p.Dv));
    qdotk(s.data(), p.q.data(), p.k.data(), p.G, p.L, p.S, p.D);
    for (int64_t g = 0; g < p.G; ++g)
      for (int64_t x = 0; x < p.L * p.S; ++x)
        s[size_t(g * p.L * p.S + x)] = p.attn[size_t(x)] + s[size_t(g * p.L * p.S + x)];
    softmax_forward_ref(s.data(), s.data(), p.G * p.L, p.S);
    weighted_sum_v(out.data(), s.data(), p.v.data(), p.G, p.L, p.S, p.Dv);
    return out;
  };
  for (GemmIsa isa : available_isas()) {
    const ForceIsa force(isa);
    const std::vector<double> ref64 = reference(p64);
    const double ref_err = rel_l2(reference(p32), ref64), fused_err = rel_l2(p32.run(), ref64);
    CAPTURE(to_string(isa), ref_err, fused_err);
    CHECK(fused_err <= 2 * ref_err);
    CHECK(rel_l2(p64.run(), ref64) <= 1e-10);
  }
}
