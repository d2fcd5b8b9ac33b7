// Fused streaming attention for the handwritten core, FlashAttention-2 style on a CPU: the scores of
// a block of queries against a block of keys, an online softmax over the key blocks, and the
// weighted sum of the values, without ever holding the L x S scores. Explicit SIMD chosen at run
// time among AVX-512, AVX2 and scalar (the GEMM's switch, gemm_isa()). No BLAS, no torch.
#pragma once

#include <cstdint>

#include "tparity/core/gemm.hpp"

namespace tparity {

// The additive masks of fused_attention, both optional (a null pointer: absent). Score (g, i, j),
// already scaled, becomes (score + key_bias[j]) + attn[i, j], each addition rounded in T.
//   attn: a float (L, S) mask per group, row-major; group g reads attn + g * attn_group_stride.
//     attn_group_stride 0: one 2-D (L, S) mask shared by every group (torch's (L, S) attn_mask);
//     L * S: a 3-D (G, L, S) mask (torch's (B * num_heads, L, S)). A bool mask is the caller's to
//     turn into 0 (kept) / -inf (masked out).
//   key_bias: a float (S) row per batch element, shared by its heads: group g = b * heads + h reads
//     key_bias + (g / heads) * S. torch's key_padding_mask (B, S) as the caller has merged it: 0 /
//     -inf for a bool one, its values for a float one.
// torch 1.13 merges the two into one mask before adding it (attn_mask.masked_fill(kpm, -inf), or
// logical_or for two bool masks); adding 0 or -inf is exact, so the sum of the two here is the
// merged mask's value wherever torch accepts the combination, except for a +inf in attn at a padded
// key (torch: -inf; here: +inf + -inf = NaN).
// zero_dead_rows: what a row whose every score is -inf gets: NaN (false: 0 / 0, torch 1.13's softmax)
// or zeros (true: torch 2.x's scaled_dot_product_attention, whose flash kernel divides by a sum of 0
// replaced by 1).
template <class T>
struct AttentionMasks {
  const T* attn = nullptr;
  int64_t attn_group_stride = 0;
  const T* key_bias = nullptr;
  int64_t heads = 1;  // groups per batch element: key_bias row g / heads
  bool zero_dead_rows = false;
};

// One operand's rows, in elements: the rows of group x = b * n + h (n: the operand's groups per batch
// element) start at base + b * batch + h * head and lie ld apart. A field left 0 takes the contiguous
// layout's value: ld the row's width (D or Dv), head the group's rows times ld, batch n * head.
struct RowLayout {
  int64_t ld = 0, head = 0, batch = 0;
};

// Where q, k, v and out lie. Query group g = b * heads + h (q and out, n = heads) reads the keys and
// values of kv group g / repeat = b * (heads / repeat) + h / repeat (k and v, n = heads / repeat).
// The defaults are the contiguous (G, L, D), (G, S, D), (G, S, Dv), (G, L, Dv) layout.
//   repeat: query heads per kv head. With q (B, H, L, D) and k, v (B, Hkv, S, D), repeat = H / Hkv
//     gives transformers' repeat_kv (query head h reads kv head h / repeat) without a copy.
//   heads: query groups per batch element (0: all G, one batch element); a multiple of repeat.
//   A KV cache of capacity C > S rows per kv group: k.head = C * D, v.head = C * Dv.
//   torch's packed self-attention, read in place: q, k, v the three (B, L, E) thirds of the
//     (B, L, 3E) projection at columns 0, E, 2E (heads H, ld 3E, head D, batch L * 3E each), out the
//     heads concatenated (B, L, E) (ld E, head D, batch L * E): no split or merge of the heads.
struct AttentionLayout {
  int64_t repeat = 1;
  int64_t heads = 0;
  RowLayout q, k, v, out;
};

// mirrors the attention step of torch.nn.functional.multi_head_attention_forward, torch 1.13
// (baddbmm(attn_mask, q_scaled, k^T), softmax, bmm with v; dropout 0), on G independent
// (batch x head) groups, einsum 'GLD,GSD->GLS' then 'GLS,GSV->GLV':
//   out[g] = softmax(q[g] k[g]^T * scale + masks) v[g]
// q is (G, L, D), k is (G, S, D), v is (G, S, Dv), out (G, L, Dv), contiguous or as `layout` lays
// them out (above); out must not overlap the inputs.
// q_divisor divides each element of q before the products, one rounding (torch 1.13's MHA: q /
// sqrt(D), then scale 1); 1 leaves q exact. scale multiplies each dot product, one rounding (1: exact).
// Semantics as the reference path (qdotk, the masks, softmax_forward, weighted_sum_v): a row whose
// scores are all -inf gives NaN (0 / 0, as torch 1.13's softmax), or zeros with masks.zero_dead_rows
// (torch 2.x's scaled_dot_product_attention); a NaN in q, k, a mask or the bias
// makes the rows whose scores it reaches NaN, a NaN in v the outputs it is summed into (times a
// weight of 0 too); a key masked with -inf gets a weight of exactly 0. S = 0 gives zeros (an empty
// sum). Key blocks where a row is all -inf so far add nothing to it and leave later blocks unpoisoned.
// Numerics: every sum in T (float accumulates in float). Per block of queries and block of keys, the
// scores are one fused multiply-add chain over D ascending from 0 (the order in which the GEMM's
// micro-kernel sums each element of q k^T, for D up to its kc), the running maximum m and sum l and
// the output O are rescaled by exp(m_old - m_new) (one FMA each), O += P V sums over the block's
// keys, and O / l is the last step. exp is vmath's (exp_forward). Measured at L = S = 64, 512 and
// 4096 (D = 64, no mask): the float32 rel_l2 against float64 is 1.08, 0.76 and 0.79 times the
// reference path's.
// Key blocks that the masks close to a whole block of queries (a causal mask's upper half, padded
// keys) are skipped where that cannot change a bit (set_skip_masked_blocks, below).
// threads: (group, block of queries) pairs dealt out to up to `threads` threads (parallel.hpp); the
// result does not depend on it, bit for bit.
// A group of at most half a vector of queries (decoding's) takes the few-query kernel: the lanes over
// keys and value columns instead of queries, the same numbers computed in the same order (same bits);
// its scratch adds D x bc (a key block transposed) and holds 16 key blocks' scores.
// Memory: scratch of threads x br x (D + bc + Dv + 3) elements (blocking(), below), not L x S; with a
// mask, up to G x ceil(S / bc) statistics of the key blocks besides; one shared (L, S) mask small
// enough to stay in L2 (or any, when the tests force group-major order: set_unit_order(-1)) is also
// held transposed, S x L rounded up to br.
// Shapes are checked with asserts only, as the GEMM's.
template <class T>
void fused_attention(T* out, const T* q, const T* k, const T* v, int64_t G, int64_t L, int64_t S, int64_t D, int64_t Dv,
                     T scale, const AttentionMasks<T>& masks = {}, int threads = 1, const AttentionLayout& layout = {},
                     T q_divisor = T(1));

// --- for tests and tuning -----------------------------------------------------------------------
namespace fused_attention_detail {

// One path's block sizes: br queries per block (the SIMD lanes of every step: the queries run along
// the vector registers), bc keys per block, and mr, the rows of the register tiles (keys in the
// scores' tile, value columns in the output's).
struct FusedBlocking {
  int br, bc, mr;
};

// The path's block sizes; throws std::invalid_argument if the path is not available.
template <class T>
FusedBlocking blocking(GemmIsa isa);

// Whether fused_attention skips the key blocks that the masks close to every query of a block of
// queries (on by default: a causal mask closes about half of them). A skipped block would have added
// exactly nothing, so the result is the same bit for bit either way; the switch lets the tests show
// it. The skip is taken only when it is exact (fused_attention_simd.hpp says when).
void set_skip_masked_blocks(bool skip);

// The order the (group, block of queries) units run in under one shared (L, S) mask: 0 (the
// default) chooses by the mask's size against L2, 1 forces block of queries by block of queries, -1
// group by group. Each unit is computed alone, so the order changes no bit; the switch lets the
// tests show it on both orders whatever this machine's L2.
void set_unit_order(int order);
// Whether a group of at most a few queries (up to half a vector: decoding's one query per head, a kv
// group's heads stacked) takes the few-query kernel, whose lanes run over keys and value columns
// instead of queries (on by default; the scalar path has none). It computes every number as the
// blocks do, so the result is the same bit for bit either way; the switch lets the tests show it.
void set_few_queries(bool on);

}  // namespace fused_attention_detail
}  // namespace tparity
