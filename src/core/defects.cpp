#include "tparity/core/defects.hpp"

#include <atomic>
#include <stdexcept>

namespace tparity {

namespace {

std::atomic<Defect> g_defect{Defect::None};

struct Entry {
  Defect d;
  const char* name;
  const char* description;
};

const Entry kEntries[] = {
    {Defect::ScaleByFullDim, "scale-full-dim", "scores scaled by 1/sqrt(E) instead of 1/sqrt(E/heads)"},
    {Defect::SwapQK, "swap-qk", "q and k projections swapped"},
    {Defect::IgnoreMask, "ignore-mask", "attn_mask and key_padding_mask ignored"},
    {Defect::SoftmaxWrongAxis, "softmax-wrong-axis", "softmax over the queries instead of the keys"},
    {Defect::WrongHeadInterleave, "head-interleave", "heads split as (E/H, H) instead of (H, E/H)"},
    {Defect::OutProjTransposed, "out-proj-transposed", "out_proj.weight used transposed"},
    {Defect::LayerNormEps, "layernorm-eps", "layer norm eps 1e-6 instead of 1e-5"},
    {Defect::UnbiasedVariance, "unbiased-variance", "layer norm with the unbiased variance"},
    {Defect::DropResidual, "drop-residual", "the residual around self-attention dropped"},
    {Defect::DropBias, "drop-bias", "linear layers' biases dropped"},
    {Defect::GeluTanh, "gelu-tanh", "GELU's tanh approximation instead of erf"},
    {Defect::SumHeadWeights, "sum-head-weights", "attention weights summed over heads, not averaged"},
    {Defect::BookScaleByDIn, "book-scale-d-in", "the book's classes' scores divided by sqrt(d_in), not sqrt(d_out)"},
    {Defect::RopeConvention, "rope-convention", "rotary pairs of the other convention (half-split vs interleaved)"},
    {Defect::RopeDecodeOffset, "rope-decode-offset", "decode steps rotated at position + 1"},
    {Defect::RmsEpsOutside, "rmsnorm-eps-outside", "RMSNorm eps outside the square root"},
    {Defect::KvRepeatInterleaved, "kv-repeat-interleaved", "kv heads repeated interleaved (h % Hkv), not blocked"},
    {Defect::GateUpSwapped, "gate-up-swapped", "SwiGLU gate_proj and up_proj swapped"},
    {Defect::Conv1dUntransposed, "conv1d-untransposed", "GPT-2 Conv1D (in, out) weight read as (out, in)"},
    {Defect::CacheBeforeRotary, "cache-before-rotary", "KV cache appended before the rotary embedding"},
    {Defect::WindowOffByOne, "window-off-by-one", "sliding window of w keys sees w + 1"},
    {Defect::WindowPrefillOnly, "window-prefill-only", "sliding window not applied in the decode steps"},
    {Defect::QkNormAfterRotary, "qk-norm-after-rotary", "Qwen3's q_norm and k_norm after rotary, not before"},
    {Defect::GemmaNormWeight, "gemma-norm-weight", "Gemma 2's RMSNorm by weight, not 1 + weight"},
    {Defect::SoftcapMissing, "softcap-missing", "Gemma 2's attention logits not soft-capped"},
    {Defect::SoftcapAfterMask, "softcap-after-mask", "soft-cap after the mask: masked keys at -cap"},
    {Defect::Bf16Accumulate, "bf16-accumulate", "float32 dot products accumulated in bfloat16"},
    {Defect::Fp16Accumulate, "fp16-accumulate", "float32 dot products accumulated in float16"},
    {Defect::SoftmaxNoMax, "softmax-no-max", "float32 softmax without subtracting the row maximum"},
    {Defect::SingleRunningSum, "single-running-sum", "float32 weighted sum of values in one running sum"},
    {Defect::NaiveVariance, "naive-variance", "float32 layer norm variance as E[x^2] - E[x]^2"},
};

}  // namespace

const std::vector<Defect>& all_defects() {
  static const std::vector<Defect> all = [] {
    std::vector<Defect> v;
    for (const Entry& e : kEntries) v.push_back(e.d);
    return v;
  }();
  return all;
}

std::string defect_name(Defect d) {
  for (const Entry& e : kEntries)
    if (e.d == d) return e.name;
  return "none";
}

std::string defect_description(Defect d) {
  for (const Entry& e : kEntries)
    if (e.d == d) return e.description;
  return "no defect";
}

Defect defect_from_name(const std::string& name) {
  std::string names;
  for (const Entry& e : kEntries) {
    if (name == e.name) return e.d;
    names += (names.empty() ? "" : ", ") + std::string(e.name);
  }
  if (name == "none") return Defect::None;
  throw std::invalid_argument("expected one of none, " + names + ", got \"" + name + "\"");
}

bool numeric_defect(Defect d) {
  return d == Defect::Bf16Accumulate || d == Defect::Fp16Accumulate || d == Defect::SoftmaxNoMax ||
         d == Defect::SingleRunningSum || d == Defect::NaiveVariance;
}

Defect injected_defect() { return g_defect.load(std::memory_order_relaxed); }
void inject_defect(Defect d) { g_defect.store(d, std::memory_order_relaxed); }

}  // namespace tparity
