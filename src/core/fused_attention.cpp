// The fused attention's front: the path (the GEMM's, gemm_isa()), the work split into (group, block
// of queries) units over the threads, and each thread's scratch. The block algorithm is in
// fused_attention_simd.hpp, instantiated by fused_attention_kernels_<isa>.cpp.
#include "tparity/core/fused_attention.hpp"

#include <algorithm>
#include <atomic>
#include <cassert>
#include <cstdlib>
#include <limits>
#include <new>
#include <stdexcept>
#include <string>
#include <vector>

#include "fused_attention_kernels.hpp"
#include "parallel_team.hpp"
#include "scratch.hpp"
#include "tparity/core/parallel.hpp"

#if defined(__x86_64__) && defined(__GNUC__)
#define TPARITY_FUSED_X86 1
#else
#define TPARITY_FUSED_X86 0
#endif

namespace tparity {
namespace fused_impl {
namespace {

template <class T>
FusedPath<T> make_path(GemmIsa isa) {
  switch (isa) {
#if TPARITY_FUSED_X86
    case GemmIsa::Avx512:
      return avx512_path<T>();
    case GemmIsa::Avx2:
      return avx2_path<T>();
#endif
    default:
      return scalar_path<T>();
  }
}

// The path's entry points; isa must be available (the AVX files' code runs only after that check).
template <class T>
const FusedPath<T>& path_for(GemmIsa isa) {
  switch (isa) {
    case GemmIsa::Avx512: {
      static const FusedPath<T> p = make_path<T>(GemmIsa::Avx512);
      return p;
    }
    case GemmIsa::Avx2: {
      static const FusedPath<T> p = make_path<T>(GemmIsa::Avx2);
      return p;
    }
    default: {
      static const FusedPath<T> p = make_path<T>(GemmIsa::Scalar);
      return p;
    }
  }
}

// One per thread (scratch.hpp), apart from the GEMM's: the blocks' (every thread's), and the
// transposed mask's (the calling thread's).
thread_local Scratch scratch;
thread_local Scratch mask_scratch;

std::atomic<bool> skip_masked_blocks{true};
std::atomic<bool> few_queries{true};
std::atomic<int> unit_order{0};  // set_unit_order's: 0 by the mask's size, 1 block-major, -1 group-major

int64_t round_up(int64_t x, int64_t m) { return (x + m - 1) / m * m; }

// A RowLayout with its zeros replaced by the contiguous layout's values: rows of `width`, `rows` a
// group, n groups per batch element.
RowLayout resolved(RowLayout r, int64_t width, int64_t rows, int64_t n) {
  if (r.ld == 0) r.ld = width;
  if (r.head == 0) r.head = rows * r.ld;
  if (r.batch == 0) r.batch = n * r.head;
  return r;
}

// Where group x = b * n + h of an operand laid out as r starts.
int64_t group_offset(const RowLayout& r, int64_t x, int64_t n) { return x / n * r.batch + x % n * r.head; }

// mask_t (S, ld) = mask (L, S) transposed, its columns L..ld-1 zero; 16 rows of the mask at a time,
// so that each row of mask_t is written 16 contiguous elements at a time.
template <class T>
void transpose_mask(const T* mask, int64_t L, int64_t S, int64_t ld, T* mask_t) {
  for (int64_t i0 = 0; i0 < ld; i0 += 16) {
    const int64_t i1 = std::min(i0 + 16, ld);
    for (int64_t j = 0; j < S; ++j)
      for (int64_t i = i0; i < i1; ++i) mask_t[j * ld + i] = i < L ? mask[i * S + j] : T(0);
  }
}

// For block of queries i (rows i br .. of the (L, S) mask) and key block kb (keys kb bc ..), at
// [i * ceil(S / bc) + kb]: one past the block's last key that the mask leaves open to some row of the
// block (not -inf: a NaN is open), 0 when it closes all of them (open_keys' scan, once).
template <class T>
std::vector<int64_t> open_keys_of_mask(const T* mask, int64_t L, int64_t S, int64_t br, int64_t bc) {
  const int64_t blocks = (L + br - 1) / br, key_blocks = (S + bc - 1) / bc;
  std::vector<int64_t> open(size_t(blocks * key_blocks), 0);
  for (int64_t i = 0; i < L; ++i)
    for (int64_t kb = 0; kb < key_blocks; ++kb) {
      int64_t& o = open[size_t(i / br * key_blocks + kb)];
      const T* x = mask + i * S + kb * bc;
      for (int64_t c = std::min(bc, S - kb * bc); c > o; --c)
        if (!(x[c - 1] == -std::numeric_limits<T>::infinity())) {
          o = c;
          break;
        }
    }
  return open;
}

// The parts of a BlockScratch, each rounded up to 64 bytes, carved from one buffer.
// The few-query kernel's st holds kFewBlocks blocks' scores, its ot rows are Dv rounded up to whole
// vectors (the allocation to a line per row), and it has a kt (D, bc).
template <class T>
struct ScratchShape {
  int64_t qt, st, ot, vec, kt;  // elements
  ScratchShape(const FusedBlocking& bs, int64_t D, int64_t Dv, bool few) {
    const int64_t line = 64 / int64_t(sizeof(T));
    qt = round_up(std::max<int64_t>(D, 1) * bs.br, line);
    st = round_up(int64_t(bs.bc) * bs.br * (few ? kFewBlocks : 1), line);
    ot = few ? round_up(Dv, line) * bs.br : round_up(Dv * bs.br, line);
    vec = round_up(bs.br, line);
    kt = few ? round_up(std::max<int64_t>(D, 1) * bs.bc, line) : 0;
  }
  int64_t total() const { return qt + st + ot + 3 * vec + kt; }
  BlockScratch<T> carve(T* base) const {
    T* const m = base + qt + st + ot;
    return {base, base + qt, base + qt + st, m, m + vec, m + 2 * vec, kt ? m + 3 * vec : nullptr};
  }
};

}  // namespace
}  // namespace fused_impl

using namespace fused_impl;

template <class T>
void fused_attention(T* out, const T* q, const T* k, const T* v, int64_t G, int64_t L, int64_t S, int64_t D, int64_t Dv,
                     T scale, const AttentionMasks<T>& masks, int threads, const AttentionLayout& layout, T q_divisor) {
  // q is (G, L, D), k is (G / repeat, S, D), v is (G / repeat, S, Dv); out will be (G, L, Dv); each as
  // `layout` lays its rows out
  assert(G >= 0 && L >= 0 && S >= 0 && D >= 0 && Dv >= 0);
  const int64_t rep = layout.repeat, kvG = G / rep, heads = layout.heads ? layout.heads : G > 0 ? G : rep;
  assert(rep >= 1 && G % rep == 0 && heads >= 1 && G % heads == 0 && heads % rep == 0);
  const int64_t kv_heads = heads / rep;  // kv groups per batch element
  const RowLayout ql = resolved(layout.q, D, L, heads), ol = resolved(layout.out, Dv, L, heads);
  const RowLayout kl = resolved(layout.k, D, S, kv_heads), vl = resolved(layout.v, Dv, S, kv_heads);
  assert(!masks.key_bias || masks.heads >= 1);
  if (G == 0 || L == 0 || Dv == 0) return;
  if (S == 0) {  // softmax over no keys, then an empty sum: zeros, as the reference path and torch give
    for (int64_t g = 0; g < G; ++g)
      for (int64_t i = 0; i < L; ++i) {
        T* row = out + group_offset(ol, g, heads) + i * ol.ld;
        std::fill(row, row + Dv, T(0));
      }
    return;
  }
  const FusedPath<T>& path = path_for<T>(gemm_isa());
  // Decoding (one query per head): the heads that share a kv group are stacked as the rows of one
  // block, so that their keys and values are read once for all of them, not once per head. Their
  // q and out rows are equally spaced (head after head: the layout's head stride, the heads of one
  // batch element since heads % repeat == 0); they must share the mask's row (one (1, S) mask, read
  // with row stride 0) and the key bias (heads of one batch element).
  int64_t rows_per_group = L, groups = G, rep_left = rep, mask_ld = S, q_ld = ql.ld, out_ld = ol.ld;
  if (L == 1 && rep > 1 && (!masks.attn || masks.attn_group_stride == 0) && (!masks.key_bias || masks.heads % rep == 0))
    rows_per_group = rep, groups = kvG, rep_left = 1, mask_ld = 0, q_ld = ql.head, out_ld = ol.head;
  // Few queries per group (more than the few-query kernel's, below): the narrow blocks (one vector of
  // queries), which compute no empty rows.
  // Also up to two wide blocks' worth under a mask: narrow blocks leave out more of the keys a mask
  // closes (a causal mask's diagonal, the run's open_keys), and fewer lanes go empty (measured at
  // the seed block's L = 100, causal: 7-9% faster in all on AVX-512; the same bits either way).
  // In double with wide blocks of 32 rows or more (AVX-512), up to 127 rows at head dims up to 64:
  // double's exp is libm's, one call per lane (vmath_simd.hpp, vexp), so the masked lanes of a wide
  // block on a causal diagonal cost most there. The fused attention alone, 200 groups of L = 100,
  // causal, on an Emerald Rapids Xeon: 35%, 30% and 14% faster at D = 16, 32 and 64 (L = 64, D = 64:
  // 11%); at D = 128, L = 128 (D = 64) or L = 1024 the wide blocks stayed ahead, as they did on AVX2.
  const bool masked = masks.attn || masks.key_bias;
  const bool libm_exp = sizeof(T) == 8 && path.blocking.br >= 32 && rows_per_group < 128 && D <= 64;
  const bool narrow = rows_per_group <= path.narrow_blocking.br ||
                      (masked && (rows_per_group < 2 * path.blocking.br || libm_exp));
  // the key statistics below are per key block of path.blocking.bc keys: the narrow blocks' too
  assert(path.narrow_blocking.bc == path.blocking.bc);
  // At most a few queries per group (decoding's): the few-query kernel, lanes over keys and value
  // columns instead of the queries (FewKernel); the same bits once more.
  const bool few = rows_per_group <= path.few_blocking.br && few_queries.load(std::memory_order_relaxed);
  const FusedBlocking& blocking = few ? path.few_blocking : narrow ? path.narrow_blocking : path.blocking;
  const auto run_block = few ? path.run_few : narrow ? path.run_narrow : path.run;
  const int64_t br = blocking.br, blocks = (rows_per_group + br - 1) / br;
  const ScratchShape<T> shape(blocking, D, Dv, few);
  // The units, (group, block of queries) pairs, in order: group by group, so that a group's keys and
  // values stay in cache while its blocks of queries pass; but block of queries by block of queries
  // when one (L, S) mask is shared and larger than a quarter of L2, so that its rows for a block
  // (br x S) are read from memory once for all the groups, not once per group (at L = S = 4096 the
  // mask is 64 MiB, more than the cache). A mask that small stays in L2 whatever the order, and the
  // groups' keys and values are what would leave it: block-major, the seed block's (200 groups of
  // 100 keys, 2.5 MiB of k and v in rows of 768 bytes) were read from L3 once per block of queries,
  // 3% of the layer's time on an Emerald Rapids Xeon (interleaved runs, the same bits).
  // The units are dealt out in order to whichever thread comes for more (next_units), not cut into
  // fixed shares: the threads share the work evenly when it is not even (a causal mask's early blocks
  // of queries skip most key blocks) and when their cores are not (on a shared machine one core runs
  // slower than the other from one minute to the next). Each unit is computed alone: neither the
  // order nor the thread count changes a bit.
  const int64_t l2 = cpu_caches().l2_per_core();  // 0 when unknown: block-major, as before
  const int order = unit_order.load(std::memory_order_relaxed);  // the tests' override, or 0
  const bool block_major = masks.attn && masks.attn_group_stride == 0 &&
                           (order != 0 ? order > 0 : L * S * int64_t(sizeof(T)) > l2 / 4);
  const int64_t units = groups * blocks;
  // Under one shared mask, run group by group over many groups, its transpose (S, blocks * br), once:
  // every block then adds its rows of the mask with plain vector loads instead of transposing its
  // tiles again for every group (the seed block's 200 groups: add_mask was 3% of the layer).
  // Likewise how many keys of each key block the mask leaves open to each block of queries, which the
  // blocks would otherwise each scan the mask for (open_keys).
  T* mask_t = nullptr;
  const int64_t mask_t_ld = blocks * br, key_blocks = (S + path.blocking.bc - 1) / path.blocking.bc;
  std::vector<int64_t> mask_open;
  const bool skip = skip_masked_blocks.load(std::memory_order_relaxed) && masked;
  if (masks.attn && masks.attn_group_stride == 0 && !block_major && mask_ld == S && groups > 1 && !few) {
    mask_t = static_cast<T*>(mask_scratch.get(size_t(S * mask_t_ld) * sizeof(T)));
    transpose_mask(masks.attn, L, S, mask_t_ld, mask_t);
    if (skip) mask_open = open_keys_of_mask(masks.attn, L, S, br, path.blocking.bc);  // open_keys' only use
  }
  // Key blocks can be skipped only where a mask may close them; their keys' and values' statistics
  // (key_stats) first. Group by group, each thread computes a group's own as it comes to the group,
  // so that the group's keys and values are brought into cache once, for the statistics and the
  // blocks alike (the seed block's separate pass over them was 3.6% of its layer; with n threads
  // dealing a group's blocks out, each of them computes its statistics: n times the arithmetic of
  // one pass, on data in cache); block by block, in one pass over k and v before the blocks (the
  // groups over the threads).
  std::vector<KeyBlockStats<T>> stats;
  auto group_stats = [&](int64_t kg, KeyBlockStats<T>* to) {
    path.key_stats(k + group_offset(kl, kg, kv_heads), v + group_offset(vl, kg, kv_heads), S, D, Dv, kl.ld, vl.ld,
                   to);
  };
  if (skip && block_major) {
    stats.resize(size_t(kvG * key_blocks));  // per kv group: the query groups that share it share them
    auto some_groups = [&](int64_t g0, int64_t g1) {
      for (int64_t g = g0; g < g1; ++g) group_stats(g, stats.data() + g * key_blocks);
    };
    if (threads <= 1 || kvG == 1)
      some_groups(0, kvG);
    else
      parallel_for(kvG, threads, some_groups);
  }
  // Guided chunks of units (detail::Dealer). Group by group over many groups (16 per thread or
  // more), a granule is a whole group, so that each thread computes the key statistics of its own
  // groups only (with single units, every thread computed every group's: the seed block's 200 groups
  // of 7 blocks). With few groups a granule is one unit: whole groups would leave a thread idle for up
  // to a group at the end.
  const int64_t n = std::min<int64_t>(threads, units);
  const int64_t granule = !block_major && groups >= 16 * n ? blocks : 1;
  detail::Dealer dealer;
  const int64_t all_units = (units + granule - 1) / granule * granule;  // no cap on a chunk but the units left
  auto next_units = [&](int64_t* begin, int64_t* end) {
    return dealer.take(units, granule, 1, all_units, int(n), begin, end);
  };
  auto run_units = [&](int64_t first, int64_t last) {
    const BlockScratch<T> s = shape.carve(static_cast<T*>(scratch.get(size_t(shape.total()) * sizeof(T))));
    std::vector<KeyBlockStats<T>> own(skip && !block_major ? size_t(key_blocks) : 0);  // of kv group own_kg
    int64_t own_kg = -1;
    for (int64_t w = first;; ++w) {
      if (w == last && !(n > 1 && next_units(&w, &last))) break;
      // g: the group (stacked: the kv group, its heads g * rep ...), i0: the block's first row in it;
      // h: the (query) group of that row; kg: the kv group
      const int64_t g = block_major ? w % groups : w / blocks, i0 = (block_major ? w / groups : w % blocks) * br;
      const int64_t h = rep_left == 1 && rep > 1 ? g * rep : g, kg = g / rep_left;
      QueryBlock<T> b;
      b.q = q + group_offset(ql, h, heads) + i0 * q_ld;
      b.k = k + group_offset(kl, kg, kv_heads);
      b.v = v + group_offset(vl, kg, kv_heads);
      b.mask = masks.attn ? masks.attn + h * masks.attn_group_stride + i0 * mask_ld : nullptr;
      b.mask_ld = mask_ld;
      b.mask_t = mask_t ? mask_t + i0 : nullptr;
      b.mask_t_ld = mask_t_ld;
      b.mask_open = mask_open.empty() ? nullptr : mask_open.data() + i0 / br * key_blocks;
      b.bias = masks.key_bias ? masks.key_bias + h / masks.heads * S : nullptr;
      b.out = out + group_offset(ol, h, heads) + i0 * out_ld;
      b.nq = std::min(br, rows_per_group - i0);
      b.S = S, b.D = D, b.Dv = Dv;
      b.q_ld = q_ld, b.k_ld = kl.ld, b.v_ld = vl.ld, b.out_ld = out_ld;
      b.q_divisor = q_divisor;
      b.scale = scale;
      b.key_stats = nullptr;
      if (!stats.empty()) b.key_stats = stats.data() + kg * key_blocks;
      if (!own.empty()) {
        if (kg != own_kg) group_stats(kg, own.data()), own_kg = kg;
        b.key_stats = own.data();
      }
      b.zero_dead_rows = masks.zero_dead_rows;
      run_block(b, s);
    }
  };
  if (n <= 1) return run_units(0, units);
  parallel_for(n, int(n), [&](int64_t, int64_t) { run_units(0, 0); });
}

namespace fused_attention_detail {

template <class T>
FusedBlocking blocking(GemmIsa isa) {
  if (!gemm_isa_available(isa))
    throw std::invalid_argument(std::string("fused_attention: the ") + to_string(isa) +
                                " path is not available on this machine");
  return path_for<T>(isa).blocking;
}

void set_skip_masked_blocks(bool skip) { skip_masked_blocks.store(skip, std::memory_order_relaxed); }

void set_unit_order(int order) { unit_order.store(order, std::memory_order_relaxed); }

void set_few_queries(bool on) { few_queries.store(on, std::memory_order_relaxed); }

}  // namespace fused_attention_detail

#define TPARITY_INSTANTIATE(T)                                                                                       \
  template void fused_attention<T>(T*, const T*, const T*, const T*, int64_t, int64_t, int64_t, int64_t, int64_t, T, \
                                   const AttentionMasks<T>&, int, const AttentionLayout&, T);                        \
  template fused_attention_detail::FusedBlocking fused_attention_detail::blocking<T>(GemmIsa);
TPARITY_INSTANTIATE(float)
TPARITY_INSTANTIATE(double)
#undef TPARITY_INSTANTIATE

}  // namespace tparity
