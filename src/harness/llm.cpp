// The LLM blocks as problems (harness/llm.hpp): state dicts, inputs, config, the hand core's run.
#include "tparity/harness/llm.hpp"

#include <fmt/format.h>

#include <algorithm>
#include <cmath>
#include <memory>
#include <set>
#include <stdexcept>

#include "tparity/harness/io.hpp"

namespace tparity {

bool llm_module(ModuleKind m) { return module_row(m).family == ModuleFamily::Llm; }

namespace {

// The keys every Llama-shaped attention takes, then the layer's (the MLP and the norms).
#define TP_LLAMA_ATTENTION_KEYS                                                                           \
  "hidden_size num_attention_heads num_key_value_heads head_dim rope_theta rope_scaling rope_convention " \
  "partial_rotary_factor attention_bias max_position_embeddings"
#define TP_LLAMA_LAYER_KEYS " intermediate_size rms_norm_eps mlp_bias"

// kind, block, config keys, preset
constexpr LlmRow kLlmRows[] = {
    {ModuleKind::LlamaDecoderLayer, LlmBlock::Layer, TP_LLAMA_ATTENTION_KEYS TP_LLAMA_LAYER_KEYS, nullptr},
    {ModuleKind::LlamaAttention, LlmBlock::Attention, TP_LLAMA_ATTENTION_KEYS, nullptr},
    {ModuleKind::GPT2Block, LlmBlock::Gpt2,
     "hidden_size num_attention_heads n_inner layer_norm_epsilon max_position_embeddings", nullptr},
    {ModuleKind::MistralDecoderLayer, LlmBlock::Layer,
     "hidden_size num_attention_heads num_key_value_heads head_dim intermediate_size rms_norm_eps rope_theta "
     "sliding_window max_position_embeddings",
     nullptr},
    {ModuleKind::Qwen3DecoderLayer, LlmBlock::Layer,
     "hidden_size num_attention_heads num_key_value_heads head_dim intermediate_size rms_norm_eps rope_theta "
     "attention_bias sliding_window max_position_embeddings",
     [](LlamaConfig& c) { c.qk_norm = true; }},
    {ModuleKind::Gemma2DecoderLayer, LlmBlock::Gemma2Layer,
     "hidden_size num_attention_heads num_key_value_heads head_dim intermediate_size rms_norm_eps rope_theta "
     "attention_bias query_pre_attn_scalar attn_logit_softcapping sliding_window max_position_embeddings",
     [](LlamaConfig& c) {  // Gemma2Config's defaults
       c.query_pre_attn_scalar = 256, c.attn_logit_softcapping = 50;
     }},
};

// config.rope_scaling as config.json writes Llama 3's: its five keys, rope_type "llama3" (the ranges are
// checked with the rest of the config).
Llama3RopeScaling llama3_rope_from_json(
    const nlohmann::json& v, const std::function<void(const std::string& field, const std::string& what)>& fail) {
  const std::string where = "config.rope_scaling";
  static const char* const keys[] = {"rope_type", "factor", "low_freq_factor", "high_freq_factor",
                                     "original_max_position_embeddings"};
  if (!v.is_object() || v.size() != 5 ||
      !std::all_of(std::begin(keys), std::end(keys), [&](const char* k) { return v.contains(k); }))
    fail(where,
         "expected null or {\"rope_type\": \"llama3\", \"factor\", \"low_freq_factor\", \"high_freq_factor\", "
         "\"original_max_position_embeddings\"}, got " + show_json(v));
  const nlohmann::json& type = v["rope_type"];
  if (type != "llama3") fail(where + ".rope_type", "expected \"llama3\", got " + show_json(type));
  Llama3RopeScaling r;
  auto number = [&](const char* k, double& out) {
    if (!v[k].is_number()) fail(where + "." + k, "expected a number, got " + show_json(v[k]));
    out = v[k].get<double>();
  };
  number("factor", r.factor);
  number("low_freq_factor", r.low_freq_factor);
  number("high_freq_factor", r.high_freq_factor);
  const nlohmann::json& n = v["original_max_position_embeddings"];
  if (!n.is_number_integer() || (n.is_number_unsigned() && n.get<uint64_t>() > (uint64_t(1) << 31)) ||
      n.get<int64_t>() < 1 || n.get<int64_t>() > (int64_t(1) << 31))
    fail(where + ".original_max_position_embeddings", "expected an integer in [1, 2^31], got " + show_json(n));
  r.original_max_position_embeddings = n.get<int64_t>();
  if (!r.on()) fail(where + ".factor", "expected a number in [1, 1e6], got " + show_json(v["factor"]));
  return r;
}

nlohmann::json llama3_rope_json(const Llama3RopeScaling& r) {
  if (!r.on()) return nullptr;
  return {{"rope_type", "llama3"},
          {"factor", r.factor},
          {"low_freq_factor", r.low_freq_factor},
          {"high_freq_factor", r.high_freq_factor},
          {"original_max_position_embeddings", r.original_max_position_embeddings}};
}

std::vector<std::string> split_keys(const char* keys) {
  std::vector<std::string> out;
  std::string k;
  for (const char* c = keys;; ++c) {
    if (*c == ' ' || *c == '\0') {
      if (!k.empty()) out.push_back(k), k.clear();
      if (!*c) break;
    } else {
      k += *c;
    }
  }
  return out;
}

}  // namespace

const LlmRow& llm_row(ModuleKind m) {
  for (const LlmRow& r : kLlmRows)
    if (r.kind == m) return r;
  throw std::logic_error("llm_row: " + module_name(m) + " is not an LLM block");
}

bool llm_takes(ModuleKind m, const std::string& key) {
  if (key == "causal" || key == "decode_steps") return true;
  for (const std::string& k : split_keys(llm_row(m).keys))
    if (k == key) return true;
  return false;
}

std::string llm_key_list(ModuleKind m) {
  std::set<std::string> keys{"causal", "decode_steps"};
  for (const std::string& k : split_keys(llm_row(m).keys)) keys.insert(k);
  std::string list;
  for (const std::string& k : keys) list += (list.empty() ? "" : ", ") + k;
  return list;
}

namespace {

bool gpt2_block(const Problem& p) { return llm_row(p.module).block == LlmBlock::Gpt2; }

void llama_attention_state(const LlamaConfig& c, const std::string& pre,
                           std::vector<std::pair<std::string, Shape>>& out) {
  const int64_t C = c.hidden_size, H = c.num_heads, K = c.num_kv_heads, D = c.head_dim;
  // nn.Module registration order: q_proj, k_proj, v_proj, o_proj (weight, then bias)
  const std::pair<const char*, Shape> projs[] = {
      {"q_proj", {H * D, C}}, {"k_proj", {K * D, C}}, {"v_proj", {K * D, C}}, {"o_proj", {C, H * D}}};
  for (const auto& [name, shape] : projs) {
    out.push_back({pre + name + ".weight", shape});
    if (c.attention_bias) out.push_back({pre + name + ".bias", {shape[0]}});
  }
  if (c.qk_norm) out.push_back({pre + "q_norm.weight", {D}}), out.push_back({pre + "k_norm.weight", {D}});
}

}  // namespace

void llm_state_dict(const Problem& p, std::vector<std::pair<std::string, Shape>>& out) {
  const LlamaConfig& c = p.llama;
  switch (llm_row(p.module).block) {
    case LlmBlock::Attention:
      llama_attention_state(c, "", out);
      break;
    case LlmBlock::Layer:
    case LlmBlock::Gemma2Layer: {
      const int64_t C = c.hidden_size, I = c.intermediate_size;
      llama_attention_state(c, "self_attn.", out);
      const std::pair<const char*, Shape> mlp[] = {
          {"mlp.gate_proj", {I, C}}, {"mlp.up_proj", {I, C}}, {"mlp.down_proj", {C, I}}};
      for (const auto& [name, shape] : mlp) {
        out.push_back({std::string(name) + ".weight", shape});
        if (c.mlp_bias) out.push_back({std::string(name) + ".bias", {shape[0]}});
      }
      out.push_back({"input_layernorm.weight", {C}});
      out.push_back({"post_attention_layernorm.weight", {C}});
      if (llm_row(p.module).block == LlmBlock::Gemma2Layer)  // Gemma2DecoderLayer's two more norms
        out.push_back({"pre_feedforward_layernorm.weight", {C}}),
            out.push_back({"post_feedforward_layernorm.weight", {C}});
      break;
    }
    case LlmBlock::Gpt2: {
      const int64_t C = p.gpt2.hidden_size, F = p.gpt2.inner_dim;
      // GPT2Block's order: ln_1, attn.c_attn, attn.c_proj, ln_2, mlp.c_fc, mlp.c_proj; Conv1D (in, out)
      const std::pair<const char*, Shape> w[] = {{"ln_1.weight", {C}},
                                                 {"ln_1.bias", {C}},
                                                 {"attn.c_attn.weight", {C, 3 * C}},
                                                 {"attn.c_attn.bias", {3 * C}},
                                                 {"attn.c_proj.weight", {C, C}},
                                                 {"attn.c_proj.bias", {C}},
                                                 {"ln_2.weight", {C}},
                                                 {"ln_2.bias", {C}},
                                                 {"mlp.c_fc.weight", {C, F}},
                                                 {"mlp.c_fc.bias", {F}},
                                                 {"mlp.c_proj.weight", {F, C}},
                                                 {"mlp.c_proj.bias", {C}}};
      for (const auto& [name, shape] : w) out.push_back({name, shape});
      break;
    }
  }
}

std::vector<InputSpec> llm_inputs(ModuleKind) {
  return {{"hidden_states", true, InputKind::Float},
          {"position_ids", false, InputKind::Ids},
          {"key_padding_mask", false, InputKind::Mask}};
}

int64_t llm_max_positions(const Problem& p) {
  return gpt2_block(p) ? p.gpt2.max_position_embeddings : p.llama.max_position_embeddings;
}

std::pair<int64_t, int64_t> llm_cache_heads(const Problem& p) {
  if (gpt2_block(p)) return {p.gpt2.num_heads, p.gpt2.hidden_size / p.gpt2.num_heads};
  return {p.llama.num_kv_heads, p.llama.head_dim};
}

long double llm_largest_tensor(const Problem& p) {
  const DTensor* x = p.input("hidden_states");
  const long double B = x && x->shape.size() == 3 ? (long double)x->shape[0] : 1,
                    T = x && x->shape.size() == 3 ? (long double)x->shape[1] : 1;
  const bool gpt2 = gpt2_block(p);
  const long double H = (long double)(gpt2 ? p.gpt2.num_heads : p.llama.num_heads);
  const long double width =
      gpt2 ? std::max(3.0L * (long double)p.gpt2.hidden_size, (long double)p.gpt2.inner_dim)
           : std::max(3.0L * H * (long double)p.llama.head_dim, 2.0L * (long double)p.llama.intermediate_size);
  return std::max(B * H * T * T, B * T * width);
}

void validate_llm(const Problem& p, const std::function<void(const std::string&)>& fail) {
  auto positive = [&](const char* field, int64_t v) {
    if (v <= 0) fail(fmt::format("config.{}: expected a positive integer, got {}", field, v));
  };
  if (p.decode_steps < 0) fail(fmt::format("config.decode_steps: expected 0 or more, got {}", p.decode_steps));
  if (const DTensor* x = p.input("hidden_states"); x && x->shape.size() == 3 && p.decode_steps >= x->shape[1])
    fail(
        fmt::format("config.decode_steps: expected fewer than the {} tokens of hidden_states (the prefill needs "
                    "one at least), got {}",
                    x->shape[1], p.decode_steps));
  if (gpt2_block(p)) {
    const Gpt2Config& c = p.gpt2;
    positive("hidden_size", c.hidden_size);
    positive("num_attention_heads", c.num_heads);
    positive("n_inner", c.inner_dim);
    positive("max_position_embeddings", c.max_position_embeddings);
    if (c.hidden_size % c.num_heads)
      fail(fmt::format("config.num_attention_heads: expected a divisor of hidden_size {}, got {}", c.hidden_size,
                       c.num_heads));
    if (!(c.layer_norm_epsilon > 0))
      fail(fmt::format("config.layer_norm_epsilon: expected a positive number, got {}", c.layer_norm_epsilon));
    return;
  }
  const LlamaConfig& c = p.llama;
  const ModuleKind m = p.module;
  positive("hidden_size", c.hidden_size);
  positive("num_attention_heads", c.num_heads);
  positive("num_key_value_heads", c.num_kv_heads);
  positive("head_dim", c.head_dim);
  positive("max_position_embeddings", c.max_position_embeddings);
  if (llm_takes(m, "intermediate_size")) positive("intermediate_size", c.intermediate_size);
  if (llm_takes(m, "rms_norm_eps") && !(c.rms_norm_eps > 0))
    fail(fmt::format("config.rms_norm_eps: expected a positive number, got {}", c.rms_norm_eps));
  if (c.num_heads % c.num_kv_heads)
    fail(fmt::format("config.num_key_value_heads: expected a divisor of num_attention_heads {}, got {}", c.num_heads,
                     c.num_kv_heads));
  if (!(c.rope_theta > 0)) fail(fmt::format("config.rope_theta: expected a positive number, got {}", c.rope_theta));
  if (const Llama3RopeScaling& r = c.rope_scaling; r.on()) {  // as transformers' _validate_llama3_rope_parameters
    if (!(r.factor >= 1 && r.factor <= 1e6))
      fail(fmt::format("config.rope_scaling.factor: expected a number in [1, 1e6], got {}", r.factor));
    if (!(r.low_freq_factor > 0 && r.low_freq_factor <= 1e6))
      fail(fmt::format("config.rope_scaling.low_freq_factor: expected a positive number up to 1e6, got {}",
                       r.low_freq_factor));
    if (!(r.high_freq_factor > r.low_freq_factor && r.high_freq_factor <= 1e6))
      fail(fmt::format("config.rope_scaling.high_freq_factor: expected a number above low_freq_factor {} up to "
                       "1e6, got {}",
                       r.low_freq_factor, r.high_freq_factor));
    if (r.original_max_position_embeddings < 1)
      fail(fmt::format("config.rope_scaling.original_max_position_embeddings: expected a positive integer, got {}",
                       r.original_max_position_embeddings));
  }
  if (!(c.partial_rotary_factor >= 0 && c.partial_rotary_factor <= 1))
    fail(fmt::format("config.partial_rotary_factor: expected a fraction in [0, 1], got {}", c.partial_rotary_factor));
  if (c.rotary_dim() % 2)
    fail(fmt::format("config.partial_rotary_factor: head_dim x factor = {} rotary dims, expected an even number",
                     c.rotary_dim()));
  // both reach float32 (the scale and the cap in T): bounded where float32 holds them and their use
  if (llm_takes(m, "query_pre_attn_scalar") && !(c.query_pre_attn_scalar >= 1e-30 && c.query_pre_attn_scalar <= 1e30))
    fail(fmt::format("config.query_pre_attn_scalar: expected a positive number in [1e-30, 1e30], got {}",
                     c.query_pre_attn_scalar));
  if (!(c.attn_logit_softcapping == 0 || (c.attn_logit_softcapping >= 1e-30 && c.attn_logit_softcapping <= 1e30)))
    fail(fmt::format("config.attn_logit_softcapping: expected a positive number in [1e-30, 1e30] or null, got {}",
                     c.attn_logit_softcapping));
  if (c.sliding_window && !p.causal)
    fail("config.causal: expected true with a sliding_window (the window slides over a causal mask), got false");
  // A decode step whose window holds only padding: transformers' sliding cache gives that row uniform
  // weights over the keys it kept, which the full cache and its mask do not reproduce. Refused.
  const DTensor* x = p.input("hidden_states");
  const DTensor* kpm = p.input("key_padding_mask");
  if (c.sliding_window && p.decode_steps > 0 && x && kpm && x->shape.size() == 3 &&
      kpm->shape == Shape{x->shape[0], x->shape[1]}) {
    const int64_t B = x->shape[0], Tn = x->shape[1], w = c.sliding_window;
    for (int64_t b = 0; b < B; ++b)
      for (int64_t t = Tn - p.decode_steps; t < Tn; ++t) {
        bool sees = false;
        for (int64_t j = std::max<int64_t>(0, t - w + 1); j <= t && !sees; ++j)
          sees = kpm->data[size_t(b * Tn + j)] == 0;
        if (!sees)
          fail(
              fmt::format("inputs.key_padding_mask: decode step token {} of element {} sees only padding in its "
                          "sliding window of {} (transformers' sliding cache would average the keys it kept; "
                          "tparity does not model that)",
                          t, b, w));
      }
  }
}

nlohmann::json llm_config_json(const Problem& p) {
  nlohmann::json j;
  const ModuleKind m = p.module;
  if (gpt2_block(p)) {
    const Gpt2Config& c = p.gpt2;
    j = {{"hidden_size", c.hidden_size},
         {"num_attention_heads", c.num_heads},
         {"n_inner", c.inner_dim},
         {"layer_norm_epsilon", c.layer_norm_epsilon},
         {"max_position_embeddings", c.max_position_embeddings}};
  } else {
    const LlamaConfig& c = p.llama;
    // every key the class takes, in this order
    const std::pair<const char*, nlohmann::json> values[] = {
        {"hidden_size", c.hidden_size},
        {"num_attention_heads", c.num_heads},
        {"num_key_value_heads", c.num_kv_heads},
        {"head_dim", c.head_dim},
        {"rope_theta", c.rope_theta},
        {"rope_convention", rope_style_name(c.rope)},
        {"partial_rotary_factor", c.partial_rotary_factor},
        {"attention_bias", c.attention_bias},
        {"max_position_embeddings", c.max_position_embeddings},
        {"intermediate_size", c.intermediate_size},
        {"rms_norm_eps", c.rms_norm_eps},
        {"mlp_bias", c.mlp_bias},
        {"sliding_window", c.sliding_window ? nlohmann::json(c.sliding_window) : nlohmann::json(nullptr)},
        {"query_pre_attn_scalar", c.query_pre_attn_scalar},
        {"attn_logit_softcapping",
         c.attn_logit_softcapping > 0 ? nlohmann::json(c.attn_logit_softcapping) : nlohmann::json(nullptr)},
    };
    j = nlohmann::json::object();
    for (const auto& [key, value] : values)
      if (llm_takes(m, key)) j[key] = value;
    // only when on: the fixtures written before it hold no such key
    if (c.rope_scaling.on()) j["rope_scaling"] = llama3_rope_json(c.rope_scaling);
  }
  j["causal"] = p.causal;
  j["decode_steps"] = p.decode_steps;
  return j;
}

std::string llm_summary(const Problem& p) {
  auto shape_of = [&](const char* n) {
    const DTensor* t = p.input(n);
    return t ? to_string(t->shape) : std::string("-");
  };
  std::string s = module_name(p.module);
  const ModuleKind m = p.module;
  if (gpt2_block(p)) {
    const Gpt2Config& c = p.gpt2;
    s += fmt::format(" hidden={} heads={} inner={} eps={:g}", c.hidden_size, c.num_heads, c.inner_dim,
                     c.layer_norm_epsilon);
  } else {
    const LlamaConfig& c = p.llama;
    s += fmt::format(" hidden={} heads={} kv_heads={} head_dim={}", c.hidden_size, c.num_heads, c.num_kv_heads,
                     c.head_dim);
    if (llm_takes(m, "intermediate_size"))
      s += fmt::format(" intermediate={} rms_eps={:g}", c.intermediate_size, c.rms_norm_eps);
    s += fmt::format(" rope={} theta={:g}", rope_style_name(c.rope), c.rope_theta);
    if (const Llama3RopeScaling& r = c.rope_scaling; r.on())
      s += fmt::format(" llama3_rope(factor={:g} low={:g} high={:g} original={})", r.factor, r.low_freq_factor,
                       r.high_freq_factor, r.original_max_position_embeddings);
    if (c.partial_rotary_factor != 1) s += fmt::format(" rotary_dim={}", c.rotary_dim());
    if (c.attention_bias) s += " attention_bias";
    if (c.mlp_bias) s += " mlp_bias";
    if (c.sliding_window) s += fmt::format(" sliding_window={}", c.sliding_window);
    if (c.qk_norm) s += " qk_norm";
    if (llm_takes(m, "query_pre_attn_scalar")) s += fmt::format(" query_pre_attn_scalar={:g}", c.query_pre_attn_scalar);
    if (c.attn_logit_softcapping > 0) s += fmt::format(" softcap={:g}", c.attn_logit_softcapping);
  }
  s += " hidden_states=" + shape_of("hidden_states");
  if (p.input("position_ids")) s += " position_ids";
  if (p.input("key_padding_mask")) s += " key_padding_mask";
  if (!p.causal) s += " non-causal";
  if (p.decode_steps) s += fmt::format(" decode: prefill then {} steps", p.decode_steps);
  return s;
}

void apply_llm_config(const nlohmann::json& j, Problem& p,
                      const std::function<void(const std::string& field, const std::string& what)>& fail) {
  const ModuleKind m = p.module;
  if (!j.is_object()) fail("config", "expected an object, got " + show_json(j));
  for (auto it = j.begin(); it != j.end(); ++it)
    if (!llm_takes(m, it.key()))
      fail("config." + it.key(),
           "unexpected key for " + module_name(m) + " (expected one of: " + llm_key_list(m) + ")");
  auto field = [](const char* k) { return std::string("config.") + k; };
  auto find = [&](const char* k) -> const nlohmann::json* {
    auto it = j.find(k);
    return it == j.end() ? nullptr : &*it;
  };
  auto integer = [&](const char* k, int64_t lo, int64_t& out) {
    const nlohmann::json* v = find(k);
    if (!v) return;
    if (!v->is_number_integer()) fail(field(k), "expected an integer, got " + show_json(*v));
    if (v->is_number_unsigned() && v->get<uint64_t>() > (uint64_t(1) << 31))
      fail(field(k), fmt::format("expected an integer <= {}, got {}", int64_t(1) << 31, v->get<uint64_t>()));
    const int64_t x = v->get<int64_t>();
    if (x < lo || x > (int64_t(1) << 31))
      fail(field(k), fmt::format("expected an integer in [{}, 2^31], got {}", lo, x));
    out = x;
  };
  auto number = [&](const char* k, double& out) {
    if (const nlohmann::json* v = find(k)) {
      if (!v->is_number()) fail(field(k), "expected a number, got " + show_json(*v));
      out = v->get<double>();
    }
  };
  auto boolean = [&](const char* k, bool& out) {
    if (const nlohmann::json* v = find(k)) {
      if (!v->is_boolean()) fail(field(k), "expected true or false, got " + show_json(*v));
      out = v->get<bool>();
    }
  };
  boolean("causal", p.causal);
  integer("decode_steps", 0, p.decode_steps);
  if (gpt2_block(p)) {
    Gpt2Config& c = p.gpt2;
    integer("hidden_size", 1, c.hidden_size);
    integer("num_attention_heads", 1, c.num_heads);
    if (const nlohmann::json* v = find("n_inner"); v && !v->is_null()) integer("n_inner", 1, c.inner_dim);
    number("layer_norm_epsilon", c.layer_norm_epsilon);
    integer("max_position_embeddings", 1, c.max_position_embeddings);
    return;
  }
  LlamaConfig& c = p.llama;
  integer("hidden_size", 1, c.hidden_size);
  integer("num_attention_heads", 1, c.num_heads);
  integer("num_key_value_heads", 1, c.num_kv_heads);
  integer("head_dim", 1, c.head_dim);
  integer("intermediate_size", 1, c.intermediate_size);
  number("rms_norm_eps", c.rms_norm_eps);
  boolean("mlp_bias", c.mlp_bias);
  number("rope_theta", c.rope_theta);
  if (const nlohmann::json* v = find("rope_scaling"))  // null: the default rope
    c.rope_scaling = v->is_null() ? Llama3RopeScaling{} : llama3_rope_from_json(*v, fail);
  if (const nlohmann::json* v = find("rope_convention")) {
    if (!v->is_string()) fail(field("rope_convention"), "expected \"half\" or \"interleaved\", got " + show_json(*v));
    try {
      c.rope = rope_style_from_name(v->get<std::string>());
    } catch (const std::invalid_argument& e) {
      fail(field("rope_convention"), e.what());
    }
  }
  number("partial_rotary_factor", c.partial_rotary_factor);
  boolean("attention_bias", c.attention_bias);
  integer("max_position_embeddings", 1, c.max_position_embeddings);
  number("query_pre_attn_scalar", c.query_pre_attn_scalar);
  if (const nlohmann::json* v = find("attn_logit_softcapping")) {  // null: no soft-cap
    if (v->is_null()) {
      c.attn_logit_softcapping = 0;
    } else {  // transformers caps whenever it is not None: 0 would divide by zero there
      number("attn_logit_softcapping", c.attn_logit_softcapping);
      if (!(c.attn_logit_softcapping > 0))
        fail(field("attn_logit_softcapping"), "expected a positive number or null, got " + show_json(*v));
    }
  }
  if (const nlohmann::json* v = find("sliding_window")) {  // null: full attention
    if (v->is_null())
      c.sliding_window = 0;
    else
      integer("sliding_window", 1, c.sliding_window);
  }
}

void read_llm_config(const nlohmann::json& j, Problem& p,
                     const std::function<void(const std::string& field, const std::string& what)>& fail) {
  const ModuleKind m = p.module;
  auto missing = [&](const char* k) {
    if (llm_takes(m, k) && !j.contains(k)) fail(std::string("config.") + k, "missing");
  };
  // the class's defaults (its row's preset), then the keys the file gives
  if (j.is_object()) missing("hidden_size"), missing("num_attention_heads"), missing("intermediate_size");
  if (const LlmRow& row = llm_row(m); row.preset) row.preset(p.llama);
  apply_llm_config(j, p, fail);
  if (gpt2_block(p)) {  // GPT2MLP: n_inner if not None else 4 * hidden_size
    if (auto it = j.find("n_inner"); it == j.end() || it->is_null()) p.gpt2.inner_dim = 4 * p.gpt2.hidden_size;
    return;
  }
  LlamaConfig& c = p.llama;
  // LlamaConfig: num_key_value_heads defaults to num_attention_heads, head_dim to hidden_size // heads
  if (!j.contains("num_key_value_heads")) c.num_kv_heads = c.num_heads;
  if (!j.contains("head_dim")) c.head_dim = c.hidden_size / c.num_heads;
}

namespace {

template <class T>
Tensor<T> param(const Problem& p, const std::string& name) {
  auto it = p.state_dict.find(name);
  return it == p.state_dict.end() ? Tensor<T>() : to_tensor<T>(it->second);
}

template <class T>
LlamaAttentionWeights<T> llama_attention_weights(const Problem& p, const std::string& pre) {
  LlamaAttentionWeights<T> w;
  w.q_proj_weight = param<T>(p, pre + "q_proj.weight");
  w.q_proj_bias = param<T>(p, pre + "q_proj.bias");
  w.k_proj_weight = param<T>(p, pre + "k_proj.weight");
  w.k_proj_bias = param<T>(p, pre + "k_proj.bias");
  w.v_proj_weight = param<T>(p, pre + "v_proj.weight");
  w.v_proj_bias = param<T>(p, pre + "v_proj.bias");
  w.o_proj_weight = param<T>(p, pre + "o_proj.weight");
  w.o_proj_bias = param<T>(p, pre + "o_proj.bias");
  w.q_norm = param<T>(p, pre + "q_norm.weight");
  w.k_norm = param<T>(p, pre + "k_norm.weight");
  return w;
}

template <class T>
LlamaLayerWeights<T> llama_layer_weights(const Problem& p) {
  LlamaLayerWeights<T> w;
  w.self_attn = llama_attention_weights<T>(p, "self_attn.");
  w.input_layernorm = param<T>(p, "input_layernorm.weight");
  w.post_attention_layernorm = param<T>(p, "post_attention_layernorm.weight");
  w.gate_proj_weight = param<T>(p, "mlp.gate_proj.weight");
  w.gate_proj_bias = param<T>(p, "mlp.gate_proj.bias");
  w.up_proj_weight = param<T>(p, "mlp.up_proj.weight");
  w.up_proj_bias = param<T>(p, "mlp.up_proj.bias");
  w.down_proj_weight = param<T>(p, "mlp.down_proj.weight");
  w.down_proj_bias = param<T>(p, "mlp.down_proj.bias");
  w.pre_feedforward_layernorm = param<T>(p, "pre_feedforward_layernorm.weight");
  w.post_feedforward_layernorm = param<T>(p, "post_feedforward_layernorm.weight");
  return w;
}

template <class T>
Gpt2Weights<T> gpt2_weights(const Problem& p) {
  Gpt2Weights<T> w;
  w.ln_1_weight = param<T>(p, "ln_1.weight");
  w.ln_1_bias = param<T>(p, "ln_1.bias");
  w.c_attn_weight = param<T>(p, "attn.c_attn.weight");
  w.c_attn_bias = param<T>(p, "attn.c_attn.bias");
  w.c_proj_weight = param<T>(p, "attn.c_proj.weight");
  w.c_proj_bias = param<T>(p, "attn.c_proj.bias");
  w.ln_2_weight = param<T>(p, "ln_2.weight");
  w.ln_2_bias = param<T>(p, "ln_2.bias");
  w.c_fc_weight = param<T>(p, "mlp.c_fc.weight");
  w.c_fc_bias = param<T>(p, "mlp.c_fc.bias");
  w.mlp_c_proj_weight = param<T>(p, "mlp.c_proj.weight");
  w.mlp_c_proj_bias = param<T>(p, "mlp.c_proj.bias");
  return w;
}

// The problem's inputs as the core takes them, converted once.
template <class T>
struct LlmInputs {
  Tensor<T> x;
  std::vector<int64_t> positions;
  std::vector<uint8_t> padding;
  DecoderMask mask() const {
    DecoderMask m;
    const int64_t Tn = x.size(1);
    if (!positions.empty()) m.positions = positions.data(), m.positions_stride = Tn;
    if (!padding.empty()) m.key_padding = padding.data(), m.key_padding_stride = Tn;
    return m;
  }
};

template <class T>
LlmInputs<T> llm_inputs_of(const Problem& p) {
  LlmInputs<T> in;
  const DTensor* x = p.input("hidden_states");
  if (!x) throw ShapeError("hidden_states: missing");
  if (x->shape.size() != 3)
    throw ShapeError("hidden_states: expected (B, T, hidden), got shape " + to_string(x->shape));
  in.x = to_tensor<T>(*x);
  const Shape bt{x->shape[0], x->shape[1]};
  if (const DTensor* pos = p.input("position_ids")) {
    if (pos->shape != bt)
      throw ShapeError("position_ids: expected shape " + to_string(bt) + " (B, T), got " + to_string(pos->shape));
    for (double v : pos->data) in.positions.push_back(int64_t(v));
  }
  if (const DTensor* kpm = p.input("key_padding_mask")) {
    if (kpm->dtype != DType::Bool)
      throw ShapeError("key_padding_mask: expected a bool mask (true at a padding token), got " +
                       dtype_name(kpm->dtype));
    if (kpm->shape != bt)
      throw ShapeError("key_padding_mask: expected shape " + to_string(bt) + " (B, T), got " + to_string(kpm->shape));
    for (double v : kpm->data) in.padding.push_back(v != 0);
  }
  return in;
}

// One call of the problem's module over part of the tokens.
template <class T>
struct LlmCall {
  LlmBlock block;
  LlamaConfig llama;
  Gpt2Config gpt2cfg;
  bool causal;
  std::shared_ptr<const LlamaLayerWeights<T>> layer;
  std::shared_ptr<const LlamaAttentionWeights<T>> attn;
  std::shared_ptr<const Gpt2Weights<T>> gpt2;
  explicit LlmCall(const Problem& p)
      : block(llm_row(p.module).block), llama(p.llama), gpt2cfg(p.gpt2), causal(p.causal) {
    switch (block) {
      case LlmBlock::Layer:
      case LlmBlock::Gemma2Layer:
        layer = std::make_shared<LlamaLayerWeights<T>>(llama_layer_weights<T>(p));
        break;
      case LlmBlock::Attention:
        attn = std::make_shared<LlamaAttentionWeights<T>>(llama_attention_weights<T>(p, ""));
        break;
      case LlmBlock::Gpt2:
        gpt2 = std::make_shared<Gpt2Weights<T>>(gpt2_weights<T>(p));
        break;
    }
  }
  Tensor<T> operator()(const Tensor<T>& x, const DecoderMask& m, KvCache<T>* cache, Observer<T>* obs) const {
    DecoderMask mm = m;
    mm.causal = causal;
    switch (block) {
      case LlmBlock::Layer:
        return llama_layer_forward(llama, *layer, x, mm, cache, obs);
      case LlmBlock::Gemma2Layer:
        return gemma2_layer_forward(llama, *layer, x, mm, cache, obs);
      case LlmBlock::Attention:
        return llama_attention_forward(llama, *attn, x, mm, cache, obs);
      case LlmBlock::Gpt2:
        break;
    }
    return gpt2_block_forward(gpt2cfg, *gpt2, x, mm, cache, obs);
  }
};

template <class T>
Tensor<T> run_with(const Problem& p, const LlmCall<T>& call, const LlmInputs<T>& in, Observer<T>* obs) {
  if (p.decode_steps == 0) return call(in.x, in.mask(), nullptr, obs);
  const int64_t B = in.x.size(0), Tn = in.x.size(1);
  const auto [Hkv, D] = llm_cache_heads(p);
  KvCache<T> cache = make_cache<T>(B, Hkv, Tn, D);
  auto layer = [&](const Tensor<T>& part, const DecoderMask& m, KvCache<T>& c, Observer<T>* o) {
    return call(part, m, &c, o);
  };
  return decode_session(layer, in.x, Tn - p.decode_steps, in.mask(), cache, obs);
}

// One call's components, in dataflow order.
std::vector<std::string> call_components(const Problem& p, bool cached) {
  const LlmBlock block = llm_row(p.module).block;
  std::vector<std::string> attn{"q", "k", "v"};
  if (block != LlmBlock::Gpt2 && p.llama.qk_norm) attn.insert(attn.end(), {"q_norm", "k_norm"});
  if (block != LlmBlock::Gpt2) attn.insert(attn.end(), {"q_rot", "k_rot"});
  if (cached) attn.insert(attn.end(), {"cache.k", "cache.v"});
  attn.insert(attn.end(), {"scores", "attn_weights", "context", "output"});
  std::vector<std::string> n;
  switch (block) {
    case LlmBlock::Attention:
      return attn;
    case LlmBlock::Layer:
      n.push_back("input_layernorm");
      for (const std::string& a : attn) n.push_back("attn." + a);
      n.insert(n.end(),
               {"attn_residual", "post_attention_layernorm", "mlp.gate", "mlp.up", "mlp.act", "mlp.down", "output"});
      break;
    case LlmBlock::Gemma2Layer:
      n.push_back("input_layernorm");
      for (const std::string& a : attn) n.push_back("attn." + a);
      n.insert(n.end(), {"post_attention_layernorm", "attn_residual", "pre_feedforward_layernorm", "mlp.gate", "mlp.up",
                         "mlp.act", "mlp.down", "post_feedforward_layernorm", "output"});
      break;
    case LlmBlock::Gpt2:
      n.push_back("ln_1");
      for (const std::string& a : attn) n.push_back("attn." + a);
      n.insert(n.end(), {"attn_residual", "ln_2", "mlp.fc", "mlp.act", "mlp.proj", "output"});
      break;
  }
  return n;
}

}  // namespace

template <class T>
Tensor<T> run_llm(const Problem& p, Observer<T>* obs) {
  const LlmInputs<T> in = llm_inputs_of<T>(p);
  return run_with(p, LlmCall<T>(p), in, obs);
}

template <class T>
std::function<void()> prepare_llm(const Problem& p) {
  auto call = std::make_shared<const LlmCall<T>>(p);
  auto in = std::make_shared<const LlmInputs<T>>(llm_inputs_of<T>(p));
  auto prob = std::make_shared<Problem>(p);
  prob->state_dict.clear();  // the weights live in call, converted once
  prob->inputs.clear();
  if (p.decode_steps == 0)
    return [prob, call, in] { (void)run_with(*prob, *call, *in, static_cast<Observer<T>*>(nullptr)); };
  // A decode session times its steps alone: the prefill runs once here, each timed call rewinds the
  // cache to it and runs the steps (their k and v overwrite the previous call's).
  const int64_t B = in->x.size(0), Tn = in->x.size(1), C = in->x.size(2), P = Tn - p.decode_steps;
  const auto [Hkv, D] = llm_cache_heads(p);
  auto cache = std::make_shared<KvCache<T>>(make_cache<T>(B, Hkv, Tn, D));
  auto parts = std::make_shared<std::vector<Tensor<T>>>();
  for (int64_t t0 = 0; t0 < Tn; t0 = t0 ? t0 + 1 : P) {
    const int64_t t1 = t0 ? t0 + 1 : P;
    Tensor<T> part({B, t1 - t0, C});
    for (int64_t b = 0; b < B; ++b)
      std::copy(in->x.ptr() + (b * Tn + t0) * C, in->x.ptr() + (b * Tn + t1) * C, part.ptr() + b * (t1 - t0) * C);
    parts->push_back(std::move(part));
  }
  auto mask_at = [in, Tn](int64_t t0) {
    DecoderMask m = in->mask();
    if (m.positions) m.positions += t0, m.positions_stride = Tn;
    return m;
  };
  (void)(*call)((*parts)[0], mask_at(0), cache.get(), nullptr);
  return [call, cache, parts, mask_at, P] {
    cache->length = P;
    for (size_t s = 1; s < parts->size(); ++s)
      (void)(*call)((*parts)[s], mask_at(P + int64_t(s) - 1), cache.get(), nullptr);
  };
}

std::vector<std::string> llm_component_names(const Problem& p) {
  if (p.decode_steps == 0) return call_components(p, false);
  std::vector<std::string> n;
  for (const std::string& c : call_components(p, true)) n.push_back("prefill." + c);
  for (int64_t s = 0; s < p.decode_steps; ++s)
    for (const std::string& c : call_components(p, true)) n.push_back("step." + std::to_string(s) + "." + c);
  n.push_back("output");
  return n;
}

template <class T>
LlmLayerCall<T> llm_layer_call(const Problem& p) {
  auto call = std::make_shared<const LlmCall<T>>(p);
  return [call](const Tensor<T>& x, const DecoderMask& m, KvCache<T>* cache) { return (*call)(x, m, cache, nullptr); };
}

template Tensor<float> run_llm<float>(const Problem&, Observer<float>*);
template Tensor<double> run_llm<double>(const Problem&, Observer<double>*);
template std::function<void()> prepare_llm<float>(const Problem&);
template std::function<void()> prepare_llm<double>(const Problem&);
template LlmLayerCall<float> llm_layer_call<float>(const Problem&);
template LlmLayerCall<double> llm_layer_call<double>(const Problem&);

}  // namespace tparity
