// The LLM blocks' cases (harness/cases.hpp): weights as torch's nn.Linear initialises them, norm
// weights drawn around transformers' 1 (so that a norm weight's semantics show), inputs N(0, 1),
// every value rounded to float32.
#include <fmt/format.h>

#include <cmath>

#include "tparity/harness/cases.hpp"
#include "tparity/harness/io.hpp"
#include "tparity/harness/llm.hpp"
#include "tparity/harness/rng.hpp"

namespace tparity {

namespace {

// One default case, as data (ggml's one line per case).
struct LlmCase {
  const char* name;
  ModuleKind module;
  int64_t batch, seq, dim, heads, kv_heads, head_dim, ffn;
  bool attention_bias;
  MaskKind mask;
  int64_t decode_steps, position_offset;
  const char* config;  // JSON object over the class's config keys ("" none)
  uint64_t seed;
};

// name, kind, B, T, hidden, heads, kv heads, head dim, ffn, attention bias, mask, decode steps,
// position offset, config, seed
const LlmCase kLlmCases[] = {
    {"llama", ModuleKind::LlamaDecoderLayer, 2, 9, 64, 4, 2, 24, 172, false, MaskKind::None, 2, 3, "", 16},
    {"gpt2", ModuleKind::GPT2Block, 2, 10, 64, 4, 0, 0, 256, true, MaskKind::Padding, 0, -1, "", 17},
    {"mistral", ModuleKind::MistralDecoderLayer, 2, 10, 64, 4, 2, 16, 128, false, MaskKind::None, 3, 2,
     R"({"sliding_window": 4})", 18},
    {"qwen3", ModuleKind::Qwen3DecoderLayer, 2, 8, 64, 4, 2, 32, 96, false, MaskKind::None, 2, 1, "", 19},
    {"gemma2", ModuleKind::Gemma2DecoderLayer, 2, 10, 64, 4, 2, 16, 128, false, MaskKind::None, 3, 0,
     R"({"sliding_window": 4, "query_pre_attn_scalar": 24, "attn_logit_softcapping": 1.5})", 20},
};

}  // namespace

std::vector<CaseSpec> llm_default_cases() {
  std::vector<CaseSpec> out;
  for (const LlmCase& l : kLlmCases) {
    CaseSpec s;
    s.name = l.name, s.module = l.module, s.batch = l.batch, s.seq = l.seq, s.dim = l.dim, s.heads = l.heads;
    s.kv_heads = l.kv_heads, s.head_dim = l.head_dim, s.ffn = l.ffn, s.bias = l.attention_bias, s.mask = l.mask;
    s.decode_steps = l.decode_steps, s.position_offset = l.position_offset, s.seed = l.seed;
    if (*l.config) s.config = parse_json(l.config, std::string("case ") + l.name + " config");
    out.push_back(s);
  }
  return out;
}

std::string llm_describe(const CaseSpec& s) {
  std::string d = module_name(s.module) + fmt::format(" B={} T={} hidden={} heads={}", s.batch, s.seq, s.dim, s.heads);
  const LlmBlock block = llm_row(s.module).block;
  if (block != LlmBlock::Gpt2) {
    d += fmt::format(" kv_heads={} head_dim={}", s.kv_heads ? s.kv_heads : s.heads,
                     s.head_dim ? s.head_dim : s.dim / s.heads);
    d += fmt::format(" rope={}", rope_style_name(s.rope));
    if (s.rotary_fraction != 1) d += fmt::format(" rotary={:g}", s.rotary_fraction);
    if (s.bias) d += " attention_bias";
  }
  if (block != LlmBlock::Attention) d += fmt::format(" ffn={}", s.ffn);
  for (auto it = s.config.begin(); it != s.config.end(); ++it) d += " " + it.key() + "=" + it.value().dump();
  d += s.mask != MaskKind::Padding ? " mask=causal" : s.pad_left ? " mask=causal+left-padding" : " mask=causal+padding";
  if (s.position_offset >= 0) d += fmt::format(" positions+{}", s.position_offset);
  if (s.decode_steps) d += fmt::format(" decode={} steps", s.decode_steps);
  return d;
}

namespace {

DTensor uniform(Rng& rng, Shape shape, double bound) {
  DTensor t{DType::Float64, shape, {}};
  t.data.resize(size_t(numel(shape)));
  for (double& x : t.data) x = round_to_float(rng.uniform(-bound, bound));
  return t;
}

}  // namespace

Problem make_llm_problem(const CaseSpec& s) {
  auto fail = [&](const std::string& what) { throw InputError(fmt::format("case {}: {}", s.name, what)); };
  if (s.batch < 1) fail(fmt::format("batch must be >= 1 (the LLM blocks take (B, T, hidden)), got {}", s.batch));
  if (s.mask == MaskKind::Random) fail("mask random: the LLM blocks are causal; padding adds a key padding mask");
  if (s.kv_seq && s.kv_seq != s.seq) fail("kv-seq does not apply to a decoder's self-attention");
  Rng rng(s.seed);
  Problem p;
  p.name = s.name;
  p.description = s.describe();
  p.module = s.module;
  p.decode_steps = s.decode_steps;
  const int64_t B = s.batch, Tn = s.seq, C = s.dim;
  auto linear = [&](const std::string& name, int64_t out, int64_t in, bool bias) {
    const double bound = 1.0 / std::sqrt(double(in));  // nn.Linear's kaiming_uniform_(a=sqrt(5))
    p.state_dict[name + ".weight"] = uniform(rng, {out, in}, bound);
    if (bias) p.state_dict[name + ".bias"] = uniform(rng, {out}, bound);
  };
  auto around_one = [&](int64_t n) {
    DTensor t = uniform(rng, {n}, 0.2);
    for (double& x : t.data) x = round_to_float(1.0 + x);
    return t;
  };
  auto config_fail = [&](const std::string& field, const std::string& what) {
    throw InputError(fmt::format("case {}: --config {}: {}", s.name, field.substr(field.find('.') + 1), what));
  };
  const LlmBlock block = llm_row(s.module).block;
  if (block == LlmBlock::Gpt2) {
    if (s.dim % s.heads) fail(fmt::format("heads {} does not divide hidden {}", s.heads, s.dim));
    Gpt2Config& c = p.gpt2;
    c.hidden_size = C, c.num_heads = s.heads, c.inner_dim = s.ffn > 0 ? s.ffn : 4 * C;
    c.max_position_embeddings = std::max<int64_t>(1024, Tn);
    apply_llm_config(s.config, p, config_fail);
    const int64_t F = c.inner_dim;
    // Conv1D(nf, nx): weight (nx, nf), drawn as a Linear of fan_in nx would be
    auto conv1d = [&](const std::string& name, int64_t in, int64_t out) {
      const double bound = 1.0 / std::sqrt(double(in));
      p.state_dict[name + ".weight"] = uniform(rng, {in, out}, bound);
      p.state_dict[name + ".bias"] = uniform(rng, {out}, bound);
    };
    p.state_dict["ln_1.weight"] = around_one(C);
    p.state_dict["ln_1.bias"] = uniform(rng, {C}, 0.2);
    conv1d("attn.c_attn", C, 3 * C);
    conv1d("attn.c_proj", C, C);
    p.state_dict["ln_2.weight"] = around_one(C);
    p.state_dict["ln_2.bias"] = uniform(rng, {C}, 0.2);
    conv1d("mlp.c_fc", C, F);
    conv1d("mlp.c_proj", F, C);
  } else {
    LlamaConfig& c = p.llama;
    c.hidden_size = C, c.num_heads = s.heads, c.num_kv_heads = s.kv_heads ? s.kv_heads : s.heads;
    if (!s.head_dim && s.dim % s.heads) fail(fmt::format("heads {} does not divide hidden {}", s.heads, s.dim));
    c.head_dim = s.head_dim ? s.head_dim : s.dim / s.heads;
    c.intermediate_size = s.ffn;
    c.rope = s.rope, c.partial_rotary_factor = s.rotary_fraction, c.rope_theta = s.rope_theta;
    if (s.bias && !llm_takes(s.module, "attention_bias"))
      fail("bias on: " + module_name(s.module) + " has no attention_bias (its projections have no bias)");
    c.attention_bias = s.bias;
    c.max_position_embeddings = std::max<int64_t>(2048, std::max<int64_t>(s.position_offset, 0) + 5 * B + Tn);
    if (const LlmRow& row = llm_row(s.module); row.preset) row.preset(c);
    apply_llm_config(s.config, p, config_fail);
    if (c.num_heads % c.num_kv_heads)
      fail(fmt::format("kv_heads {} does not divide heads {}", c.num_kv_heads, c.num_heads));
    const int64_t H = c.num_heads, K = c.num_kv_heads, D = c.head_dim;
    // the weights about to be drawn, before they are: --config may have made them any size
    const long double widest =
        std::max((long double)H * D * C, (long double)std::max<int64_t>(c.intermediate_size, 0) * C);
    if (widest > (long double)max_elements())
      fail(fmt::format("its weights would hold {:.3g} elements, above --max-elements {}", double(widest),
                       max_elements()));
    const bool layer = block == LlmBlock::Layer || block == LlmBlock::Gemma2Layer;
    const std::string pre = layer ? "self_attn." : "";
    linear(pre + "q_proj", H * D, C, c.attention_bias);
    linear(pre + "k_proj", K * D, C, c.attention_bias);
    linear(pre + "v_proj", K * D, C, c.attention_bias);
    linear(pre + "o_proj", C, H * D, c.attention_bias);
    if (c.qk_norm)
      p.state_dict[pre + "q_norm.weight"] = around_one(D), p.state_dict[pre + "k_norm.weight"] = around_one(D);
    if (layer) {
      if (s.ffn <= 0) fail(fmt::format("ffn (intermediate_size) must be positive, got {}", s.ffn));
      linear("mlp.gate_proj", s.ffn, C, false);
      linear("mlp.up_proj", s.ffn, C, false);
      linear("mlp.down_proj", C, s.ffn, false);
      if (block == LlmBlock::Gemma2Layer) {  // Gemma2RMSNorm's weight is an offset from 1 (init zeros)
        for (const char* n :
             {"input_layernorm", "post_attention_layernorm", "pre_feedforward_layernorm", "post_feedforward_layernorm"})
          p.state_dict[std::string(n) + ".weight"] = uniform(rng, {C}, 0.2);
      } else {
        p.state_dict["input_layernorm.weight"] = around_one(C);
        p.state_dict["post_attention_layernorm.weight"] = around_one(C);
      }
    }
  }
  DTensor x{DType::Float64, {B, Tn, C}, {}};
  x.data.resize(size_t(B * Tn * C));
  for (double& v : x.data) v = round_to_float(rng.normal());
  p.inputs["hidden_states"] = x;
  if (s.position_offset >= 0) {
    DTensor pos{DType::Int64, {B, Tn}, {}};
    for (int64_t b = 0; b < B; ++b)
      for (int64_t t = 0; t < Tn; ++t) pos.data.push_back(double(s.position_offset + 5 * b + t));
    p.inputs["position_ids"] = pos;
  }
  // Right padding: element b's last (b * 3 + 1) % ceil(T / 2) tokens; left padding: as many first
  // tokens (a left-padded query row sees no key: transformers gives it uniform weights).
  if (s.mask == MaskKind::Padding) {
    DTensor m{DType::Bool, {B, Tn}, Storage<double>(size_t(B * Tn), 0.0)};
    for (int64_t b = 0; b < B; ++b) {
      const int64_t pad = (b * 3 + 1) % ((Tn + 1) / 2);
      for (int64_t t = s.pad_left ? 0 : Tn - pad; t < (s.pad_left ? pad : Tn); ++t) m.data[size_t(b * Tn + t)] = 1.0;
    }
    p.inputs["key_padding_mask"] = m;
  }
  validate(p, "case " + s.name);
  return p;
}

}  // namespace tparity
