#include "tparity/harness/problem.hpp"

#include <fmt/format.h>

#include <set>

namespace tparity {

namespace {
const ModuleKind kAllModules[] = {ModuleKind::MultiheadAttention, ModuleKind::TransformerEncoderLayer,
                                  ModuleKind::TransformerEncoder, ModuleKind::TransformerDecoderLayer,
                                  ModuleKind::ScaledDotProductAttention};
}  // namespace

std::string module_name(ModuleKind m) {
  switch (m) {
    case ModuleKind::MultiheadAttention:
      return "MultiheadAttention";
    case ModuleKind::TransformerEncoderLayer:
      return "TransformerEncoderLayer";
    case ModuleKind::TransformerEncoder:
      return "TransformerEncoder";
    case ModuleKind::TransformerDecoderLayer:
      return "TransformerDecoderLayer";
    case ModuleKind::ScaledDotProductAttention:
      return "ScaledDotProductAttention";
  }
  return "?";
}

bool fixture_module(ModuleKind m) { return m != ModuleKind::ScaledDotProductAttention; }

ModuleKind module_from_name(const std::string& name) {
  for (ModuleKind m : kAllModules)
    if (module_name(m) == name) return m;
  throw std::invalid_argument("expected one of " + fixture_module_names() + ", got \"" + name + "\"");
}

std::string fixture_module_names() {
  std::string out;
  for (ModuleKind m : kAllModules)
    if (fixture_module(m)) out += (out.empty() ? "\"" : ", \"") + module_name(m) + "\"";
  return out;
}

namespace {

void mha_state(const MhaConfig& c, const std::string& prefix, std::vector<std::pair<std::string, Shape>>& out) {
  const int64_t E = c.embed_dim;
  // torch 1.13 registers parameters in this order: in_proj_weight | q/k/v_proj_weight, in_proj_bias,
  // bias_k, bias_v, out_proj.weight, out_proj.bias.
  if (c.packed()) {
    out.push_back({prefix + "in_proj_weight", {3 * E, E}});
  } else {
    out.push_back({prefix + "q_proj_weight", {E, E}});
    out.push_back({prefix + "k_proj_weight", {E, c.key_dim()}});
    out.push_back({prefix + "v_proj_weight", {E, c.value_dim()}});
  }
  if (c.bias) out.push_back({prefix + "in_proj_bias", {3 * E}});
  if (c.add_bias_kv) {
    out.push_back({prefix + "bias_k", {1, 1, E}});
    out.push_back({prefix + "bias_v", {1, 1, E}});
  }
  out.push_back({prefix + "out_proj.weight", {E, E}});
  if (c.bias) out.push_back({prefix + "out_proj.bias", {E}});
}

}  // namespace

namespace {

// linear1, linear2, then norm1..norm<n>: the feed-forward and norms of an encoder or decoder layer.
void layer_state(const EncoderConfig& c, const std::string& prefix, int norms,
                 std::vector<std::pair<std::string, Shape>>& out) {
  out.push_back({prefix + "linear1.weight", {c.dim_feedforward, c.d_model}});
  out.push_back({prefix + "linear1.bias", {c.dim_feedforward}});
  out.push_back({prefix + "linear2.weight", {c.d_model, c.dim_feedforward}});
  out.push_back({prefix + "linear2.bias", {c.d_model}});
  for (int i = 1; i <= norms; ++i) {
    out.push_back({prefix + "norm" + std::to_string(i) + ".weight", {c.d_model}});
    out.push_back({prefix + "norm" + std::to_string(i) + ".bias", {c.d_model}});
  }
}

}  // namespace

std::vector<std::pair<std::string, Shape>> expected_state_dict(const Problem& p) {
  std::vector<std::pair<std::string, Shape>> out;
  const EncoderConfig& c = p.encoder;
  switch (p.module) {
    case ModuleKind::MultiheadAttention:
      mha_state(p.mha, "", out);
      break;
    case ModuleKind::TransformerEncoderLayer:
      mha_state(c.self_attn(), "self_attn.", out);
      layer_state(c, "", 2, out);
      break;
    case ModuleKind::TransformerEncoder:
      for (int64_t i = 0; i < p.num_layers; ++i) {
        const std::string prefix = "layers." + std::to_string(i) + ".";
        mha_state(c.self_attn(), prefix + "self_attn.", out);
        layer_state(c, prefix, 2, out);
      }
      if (p.final_norm) {
        out.push_back({"norm.weight", {c.d_model}});
        out.push_back({"norm.bias", {c.d_model}});
      }
      break;
    case ModuleKind::TransformerDecoderLayer:
      mha_state(c.self_attn(), "self_attn.", out);
      mha_state(c.self_attn(), "multihead_attn.", out);
      layer_state(c, "", 3, out);
      break;
    case ModuleKind::ScaledDotProductAttention:
      break;  // no parameters
  }
  return out;
}

std::vector<InputSpec> expected_inputs(ModuleKind m) {
  switch (m) {
    case ModuleKind::MultiheadAttention:
      return {{"query", true, false},
              {"key", true, false},
              {"value", true, false},
              {"attn_mask", false, true},
              {"key_padding_mask", false, true}};
    case ModuleKind::TransformerEncoderLayer:
      return {{"src", true, false}, {"src_mask", false, true}, {"src_key_padding_mask", false, true}};
    case ModuleKind::TransformerEncoder:
      return {{"src", true, false}, {"mask", false, true}, {"src_key_padding_mask", false, true}};
    case ModuleKind::TransformerDecoderLayer:
      return {{"tgt", true, false},
              {"memory", true, false},
              {"tgt_mask", false, true},
              {"memory_mask", false, true},
              {"tgt_key_padding_mask", false, true},
              {"memory_key_padding_mask", false, true}};
    case ModuleKind::ScaledDotProductAttention:
      return {{"query", true, false}, {"key", true, false}, {"value", true, false}, {"attn_mask", false, true}};
  }
  return {};
}

void validate(const Problem& p, const std::string& where) {
  auto fail = [&](const std::string& what) { throw InputError(where + ": " + what); };
  auto positive = [&](const char* field, int64_t v) {
    if (v <= 0) fail(fmt::format("config.{}: expected a positive integer, got {}", field, v));
  };
  switch (p.module) {
    case ModuleKind::MultiheadAttention:
      positive("embed_dim", p.mha.embed_dim);
      positive("num_heads", p.mha.num_heads);
      positive("kdim", p.mha.key_dim());
      positive("vdim", p.mha.value_dim());
      if (p.mha.embed_dim % p.mha.num_heads)
        fail(fmt::format("config.num_heads: expected a divisor of embed_dim {}, got {}", p.mha.embed_dim,
                         p.mha.num_heads));
      break;
    case ModuleKind::TransformerEncoder:
      positive("num_layers", p.num_layers);
      [[fallthrough]];
    case ModuleKind::TransformerEncoderLayer:
    case ModuleKind::TransformerDecoderLayer:
      positive("d_model", p.encoder.d_model);
      positive("nhead", p.encoder.nhead);
      positive("dim_feedforward", p.encoder.dim_feedforward);
      if (p.encoder.d_model % p.encoder.nhead)
        fail(fmt::format("config.nhead: expected a divisor of d_model {}, got {}", p.encoder.d_model, p.encoder.nhead));
      if (!(p.encoder.layer_norm_eps > 0))
        fail(fmt::format("config.layer_norm_eps: expected a positive number, got {}", p.encoder.layer_norm_eps));
      break;
    case ModuleKind::ScaledDotProductAttention:
      break;
  }

  std::set<std::string> seen;
  for (const auto& [name, shape] : expected_state_dict(p)) {
    seen.insert(name);
    auto it = p.state_dict.find(name);
    if (it == p.state_dict.end())
      fail(fmt::format("state_dict.{}: missing (expected shape {})", name, to_string(shape)));
    if (it->second.dtype == DType::Bool)
      fail(fmt::format("state_dict.{}: expected a float32 or float64 tensor, got bool", name));
    if (it->second.shape != shape)
      fail(
          fmt::format("state_dict.{}: expected shape {}, got {}", name, to_string(shape), to_string(it->second.shape)));
  }
  for (const auto& [name, t] : p.state_dict)
    if (!seen.count(name))
      fail(fmt::format("state_dict.{}: unexpected entry for {} with this config", name, module_name(p.module)));

  seen.clear();
  for (const InputSpec& s : expected_inputs(p.module)) {
    seen.insert(s.name);
    const DTensor* t = p.input(s.name);
    if (!t) {
      if (s.required) fail(fmt::format("inputs.{}: missing", s.name));
      continue;
    }
    if (!s.is_mask && t->dtype == DType::Bool)
      fail(fmt::format("inputs.{}: expected a float32 or float64 tensor, got bool", s.name));
  }
  for (const auto& [name, t] : p.inputs)
    if (!seen.count(name)) fail(fmt::format("inputs.{}: not an argument of {}.forward()", name, module_name(p.module)));
}

nlohmann::json config_json(const Problem& p) {
  nlohmann::json j;
  switch (p.module) {
    case ModuleKind::MultiheadAttention: {
      const MhaConfig& c = p.mha;
      j = {{"embed_dim", c.embed_dim},     {"num_heads", c.num_heads},         {"bias", c.bias},
           {"add_bias_kv", c.add_bias_kv}, {"add_zero_attn", c.add_zero_attn}, {"kdim", c.key_dim()},
           {"vdim", c.value_dim()},        {"batch_first", c.batch_first}};
      break;
    }
    case ModuleKind::TransformerEncoderLayer:
    case ModuleKind::TransformerEncoder:
    case ModuleKind::TransformerDecoderLayer: {
      const EncoderConfig& c = p.encoder;
      j = {{"d_model", c.d_model},
           {"nhead", c.nhead},
           {"dim_feedforward", c.dim_feedforward},
           {"activation", c.activation == Activation::Gelu ? "gelu" : "relu"},
           {"layer_norm_eps", c.layer_norm_eps},
           {"batch_first", c.batch_first},
           {"norm_first", c.norm_first}};
      if (p.module == ModuleKind::TransformerEncoder) {
        j["num_layers"] = p.num_layers;
        j["norm"] = p.final_norm;
      }
      break;
    }
    case ModuleKind::ScaledDotProductAttention:
      j = nlohmann::json::object();
      break;
  }
  return j;
}

std::string summary(const Problem& p) {
  auto shape_of = [&](const char* n) {
    const DTensor* t = p.input(n);
    return t ? to_string(t->shape) : std::string("-");
  };
  auto mask_of = [&](const char* n) -> std::string {
    const DTensor* t = p.input(n);
    return t ? fmt::format(" {}={}{}", n, dtype_name(t->dtype), to_string(t->shape)) : "";
  };
  switch (p.module) {
    case ModuleKind::MultiheadAttention: {
      const MhaConfig& c = p.mha;
      std::string s =
          fmt::format("MultiheadAttention E={} heads={} bias={}", c.embed_dim, c.num_heads, c.bias ? "on" : "off");
      if (!c.packed()) s += fmt::format(" kdim={} vdim={}", c.key_dim(), c.value_dim());
      if (c.add_bias_kv) s += " add_bias_kv";
      if (c.add_zero_attn) s += " add_zero_attn";
      s += c.batch_first ? " batch_first" : " seq_first";
      s += fmt::format(" query={} key={}", shape_of("query"), shape_of("key"));
      return s + mask_of("attn_mask") + mask_of("key_padding_mask") +
             (p.forward.need_weights ? (p.forward.average_attn_weights ? "" : " per-head weights")
                                     : " need_weights=False");
    }
    case ModuleKind::TransformerEncoderLayer:
    case ModuleKind::TransformerEncoder:
    case ModuleKind::TransformerDecoderLayer: {
      const EncoderConfig& c = p.encoder;
      std::string s = module_name(p.module);
      if (p.module == ModuleKind::TransformerEncoder)
        s += fmt::format(" layers={}{}", p.num_layers, p.final_norm ? " +norm" : "");
      s += fmt::format(" d={} heads={} ffn={} {} eps={:g}{}{}", c.d_model, c.nhead, c.dim_feedforward,
                       c.activation == Activation::Gelu ? "gelu" : "relu", c.layer_norm_eps,
                       c.norm_first ? " norm_first" : "", c.batch_first ? " batch_first" : " seq_first");
      for (const InputSpec& in : expected_inputs(p.module))
        s += in.is_mask ? mask_of(in.name.c_str()) : fmt::format(" {}={}", in.name, shape_of(in.name.c_str()));
      return s;
    }
    case ModuleKind::ScaledDotProductAttention:
      return fmt::format("scaled dot-product attention q={} k={} v={}", shape_of("query"), shape_of("key"),
                         shape_of("value")) +
             mask_of("attn_mask");
  }
  return "";
}

}  // namespace tparity
