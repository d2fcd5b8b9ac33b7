// What the fused attention's front (fused_attention.cpp) and its per-instruction-set files
// (fused_attention_kernels_<isa>.cpp) share: one unit of work, its scratch, the entry points.
#pragma once

#include <cstdint>

#include "tparity/core/fused_attention.hpp"

namespace tparity::fused_impl {

using fused_attention_detail::FusedBlocking;

// What the skip of a masked-out key block needs to know of the block's keys and values: whether
// every entry of both is finite, and the largest |k|. Computed for every key block of every group
// (key_stats), only when a mask could close a block: in one pass before the blocks, or by each thread
// as it comes to a group (fused_attention.cpp).
template <class T>
struct KeyBlockStats {
  T kmax;
  bool finite;
};

// One unit of work: a block of nq <= br queries of one group against all S keys of the group.
template <class T>
struct QueryBlock {
  const T* q;       // (nq, D) with rows q_ld apart: the block's queries
  const T* k;       // (S, D) with rows k_ld apart: the group's keys
  const T* v;       // (S, Dv) with rows v_ld apart: the group's values
  const T* mask;    // (nq, S) with row stride mask_ld: the block's rows of the group's attn mask; or null
  int64_t mask_ld;  // S; 0 when every query of the block reads the same row (decoding's stacked heads)
  // (S, br) with rows mask_t_ld apart, or null: the same rows of the mask transposed, mask_t[j][i] =
  // mask[i][j] for i < nq and 0 for the lanes past nq; when set, the scores take the mask from it
  const T* mask_t;
  int64_t mask_t_ld;
  // (ceil(S / bc)), or null: for each key block, how many of its keys (from its first) the mask
  // leaves open to some query of the block: what open_keys would find in mask, worked out once per
  // call when the mask is one shared (L, S) mask (it is then the same for every group); open_keys
  // then reads it instead of scanning mask
  const int64_t* mask_open;
  const T* bias;    // (S): the group's key bias; or null
  T* out;           // (nq, Dv) with rows out_ld apart: the block's rows of the output
  int64_t nq, S, D, Dv;
  int64_t q_ld, k_ld, v_ld, out_ld;
  T q_divisor;  // each query element divided by it as it is packed (1: left exact)
  T scale;
  // (ceil(S / bc)): the group's key blocks, or null: then no key block is skipped
  const KeyBlockStats<T>* key_stats;
  bool zero_dead_rows;  // AttentionMasks::zero_dead_rows
};

// A thread's scratch, each part 64-byte aligned: qt (D, br) the block's queries transposed, st
// (bc, br) the scores then the weights of a key block transposed, ot (Dv, br) the output transposed,
// and m, l, alpha (br): the running maximum, the running sum, the last rescaling factor. The
// few-query kernel (FusedPath::run_few) holds its parts untransposed: qt (nq, D) the queries, st
// kFewBlocks blocks of (nq, bc) scores then weights, ot (nq, Dv rounded up to whole vectors) the
// output, m, l and alpha a whole vector each (lanes nq.. idle); and kt (D, bc) the key block
// transposed (null for the others).
// The few-query kernel computes the scores of this many key blocks before their softmax and context,
// so that the keys, then the values, are read in runs of this many blocks (its st holds them all).
constexpr int kFewBlocks = 16;

template <class T>
struct BlockScratch {
  T *qt, *st, *ot, *m, *l, *alpha, *kt;
};

// One path: its block sizes and the function that computes one QueryBlock; and the same for blocks
// one vector wide (narrow), for calls with a few queries per group: a wide block would compute br
// rows for each one it has (the fewest, decoding's, take run_few, below). Each query's row is
// computed alike in both, bit for bit (its lane's sums run in the same order whatever the block's
// width).
template <class T>
struct FusedPath {
  FusedBlocking blocking;
  void (*run)(const QueryBlock<T>& b, const BlockScratch<T>& s);
  FusedBlocking narrow_blocking;
  void (*run_narrow)(const QueryBlock<T>& b, const BlockScratch<T>& s);
  // stats[kb] for the key blocks of one group: k (S, D) rows k_ld apart, v (S, Dv) rows v_ld apart,
  // bc keys per block.
  void (*key_stats)(const T* k, const T* v, int64_t S, int64_t D, int64_t Dv, int64_t k_ld, int64_t v_ld,
                    KeyBlockStats<T>* stats);
  // For a group of at most few_blocking.br queries (0: none, the scalar path), the few-query kernel
  // (fused_attention_simd.hpp, FewKernel): the lanes over keys and value columns instead of queries;
  // the same bits again, skipping closed key blocks as the others do.
  FusedBlocking few_blocking{0, 0, 0};
  void (*run_few)(const QueryBlock<T>& b, const BlockScratch<T>& s) = nullptr;
};

// Defined in fused_attention_kernels_scalar.cpp, _avx2.cpp and _avx512.cpp; the last two are
// compiled for their instruction set, so call them only once the CPU is known to have it.
template <class T>
FusedPath<T> scalar_path();
template <class T>
FusedPath<T> avx2_path();
template <class T>
FusedPath<T> avx512_path();

}  // namespace tparity::fused_impl
