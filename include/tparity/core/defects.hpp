// A test-only injection point: the defects `tparity selftest` plants in the hand core, one at a time,
// to show that the comparator catches the bugs people really write in attention code. Off (None)
// unless set; in normal use nothing sets it. Each op reads it once per call (a relaxed atomic load),
// never per element, so it costs nothing measurable.
#pragma once

#include <string>
#include <vector>

namespace tparity {

enum class Defect {
  None,
  ScaleByFullDim,       // scores scaled by 1 / sqrt(E) instead of 1 / sqrt(E / heads)
  SwapQK,               // the q and k projections swapped (W_k for the queries, W_q for the keys)
  IgnoreMask,           // attn_mask and key_padding_mask ignored
  SoftmaxWrongAxis,     // the softmax over the queries (dim -2) instead of the keys (dim -1)
  WrongHeadInterleave,  // heads split (and merged) as (E/H, H) instead of (H, E/H)
  OutProjTransposed,    // out_proj.weight used transposed
  LayerNormEps,         // layer norm with eps 1e-6 instead of the module's (1e-5)
  UnbiasedVariance,     // layer norm with the unbiased variance (/ (C - 1)) instead of the biased one
  DropResidual,         // the residual around the attention block dropped
  DropBias,             // linear layers' biases dropped
  GeluTanh,             // GELU's tanh approximation instead of erf
  SumHeadWeights,       // averaged attention weights summed over the heads, not averaged
  BookScaleByDIn,       // the book's classes: scores divided by sqrt(d_in) instead of sqrt(d_out)
  // The LLM blocks' (core/llm.hpp), semantic too.
  RopeConvention,       // rotary pairs of the other convention (interleaved for half-split and back)
  RopeDecodeOffset,     // decode steps rotate at position + 1 (an off-by-one past the cache)
  RmsEpsOutside,        // RMSNorm's eps outside the square root: 1 / (sqrt(mean(x^2)) + eps)
  KvRepeatInterleaved,  // query head h reads kv head h % Hkv instead of h / (H / Hkv) (repeat_kv's blocks)
  GateUpSwapped,        // SwiGLU with gate_proj and up_proj swapped: silu(up(x)) * gate(x)
  Conv1dUntransposed,   // GPT-2's Conv1D (in, out) weight read as nn.Linear's (out, in)
  CacheBeforeRotary,    // the KV cache stores k before the rotary embedding is applied
  WindowOffByOne,       // a sliding window of w keys lets a query see w + 1 (j >= i - w, not j > i - w)
  WindowPrefillOnly,    // the sliding window applied in the prefill and not in the decode steps
  QkNormAfterRotary,    // Qwen3's q_norm and k_norm applied after the rotary embedding, not before
  GemmaNormWeight,      // Gemma 2's RMSNorm scaled by weight instead of 1 + weight
  SoftcapMissing,       // Gemma 2's attention logits not soft-capped
  SoftcapAfterMask,     // the soft-cap applied after the mask (masked keys get -cap, not -inf)
  // Numeric defects: the semantics intact (the float64 core is untouched), float32 computed badly.
  // What a float32 gate exists to catch.
  Bf16Accumulate,    // float32 dot products accumulated in bfloat16 (every partial sum rounded to 8 bits)
  Fp16Accumulate,    // float32 dot products accumulated in float16 (11 bits, overflow above 65504)
  SoftmaxNoMax,      // float32 softmax without subtracting the row's maximum (exp overflows above 88)
  SingleRunningSum,  // float32 attention's weighted sum of values in one running sum over the keys
  NaiveVariance,     // float32 layer norm's variance as E[x^2] - E[x]^2 (cancels around an offset)
};

// Whether the defect leaves the semantics alone and spoils float32's numerics only.
bool numeric_defect(Defect d);

// Every defect but None, in the order above; its name (kebab-case, as `selftest --defect` takes it)
// and one line of what it does.
const std::vector<Defect>& all_defects();
std::string defect_name(Defect d);
std::string defect_description(Defect d);
Defect defect_from_name(const std::string& name);  // std::invalid_argument naming the choices

Defect injected_defect();
void inject_defect(Defect d);

// Sets a defect for one scope and clears it after.
class ScopedDefect {
 public:
  explicit ScopedDefect(Defect d) { inject_defect(d); }
  ~ScopedDefect() { inject_defect(Defect::None); }
  ScopedDefect(const ScopedDefect&) = delete;
  ScopedDefect& operator=(const ScopedDefect&) = delete;
};

}  // namespace tparity
