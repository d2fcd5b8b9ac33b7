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

// Where each group's keys and values lie, for grouped-query attention and a KV cache: group g reads
// the keys of kv group g / repeat, (S, D) rows starting at k + (g / repeat) * k_group_stride, and its
// values at v + (g / repeat) * v_group_stride. repeat 1 and strides 0 (meaning S * D and S * Dv) are
// the contiguous (G, S, D) layout. With q laid out (B, H, L, D) and k, v (B, Hkv, S, D), repeat =
// H / Hkv gives transformers' repeat_kv (query head h reads kv head h / repeat) without a copy; a
// cache of capacity C > S per kv group is k_group_stride C * D.
struct KvLayout {
  int64_t repeat = 1;
  int64_t k_group_stride = 0, v_group_stride = 0;
};

// mirrors the attention step of torch.nn.functional.multi_head_attention_forward, torch 1.13
// (baddbmm(attn_mask, q_scaled, k^T), softmax, bmm with v; dropout 0), on G independent
// (batch x head) groups, einsum 'GLD,GSD->GLS' then 'GLS,GSV->GLV':
//   out[g] = softmax(q[g] k[g]^T * scale + masks) v[g]
// q is (G, L, D), k is (G, S, D), v is (G, S, Dv), contiguous (or as `kv` lays them out, below);
// out will be (G, L, Dv), contiguous and not overlapping the inputs.
// scale multiplies each dot product, one rounding (1 leaves it exact): torch 1.13's MHA divides q by
// sqrt(D) before the product, so pass that q and scale 1 to get its scores.
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
// Memory: scratch of threads x br x (D + bc + Dv + 3) elements (blocking(), below), not L x S; with a
// mask, G x ceil(S / bc) statistics of the key blocks besides.
// Shapes are checked with asserts only, as the GEMM's.
template <class T>
void fused_attention(T* out, const T* q, const T* k, const T* v, int64_t G, int64_t L, int64_t S, int64_t D, int64_t Dv,
                     T scale, const AttentionMasks<T>& masks = {}, int threads = 1, const KvLayout& kv = {});

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

}  // namespace fused_attention_detail
}  // namespace tparity
