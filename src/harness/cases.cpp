#include "tparity/harness/cases.hpp"

#include <fmt/format.h>

#include <cmath>
#include <limits>

#include "tparity/harness/rng.hpp"

namespace tparity {

std::string mask_kind_name(MaskKind m) {
  switch (m) {
    case MaskKind::None:
      return "none";
    case MaskKind::Causal:
      return "causal";
    case MaskKind::Random:
      return "random";
    case MaskKind::Padding:
      return "padding";
  }
  return "?";
}

MaskKind mask_kind_from_name(const std::string& s) {
  for (MaskKind m : {MaskKind::None, MaskKind::Causal, MaskKind::Random, MaskKind::Padding})
    if (mask_kind_name(m) == s) return m;
  throw std::invalid_argument("expected none, causal, random or padding, got \"" + s + "\"");
}

std::string CaseSpec::describe() const {
  std::string s = module_name(module);
  s += batch ? fmt::format(" B={}", batch) : std::string(" unbatched");
  s += fmt::format(" T={}", seq);
  if (kv_seq && kv_seq != seq) s += fmt::format(" S={}", kv_seq);
  s += fmt::format(" d={}", dim);
  if (module == ModuleKind::ScaledDotProductAttention) {
    if (value_dim && value_dim != dim) s += fmt::format(" dv={}", value_dim);
  } else {
    s += fmt::format(" heads={}", heads);
  }
  if (module == ModuleKind::MultiheadAttention) s += bias ? " bias=on" : " bias=off";
  if (module == ModuleKind::TransformerEncoderLayer || module == ModuleKind::TransformerEncoder ||
      module == ModuleKind::TransformerDecoderLayer) {
    s += fmt::format(" ffn={} {}", ffn, activation == Activation::Gelu ? "gelu" : "relu");
    if (zero_ffn_bias) s += " ffn_bias=0";
  }
  if (module == ModuleKind::TransformerEncoder) s += fmt::format(" layers={}{}", layers, final_norm ? "+norm" : "");
  s += " mask=" + mask_kind_name(mask);
  if (random_params) s += " random_params";
  return s;
}

std::vector<CaseSpec> default_cases() {
  auto c = [](std::string name, ModuleKind m, int64_t batch, int64_t seq, int64_t kv, int64_t dim, int64_t dv,
              int64_t heads, int64_t ffn, bool bias, MaskKind mask, bool zero_ffn, uint64_t seed) {
    CaseSpec s;
    s.name = std::move(name), s.module = m, s.batch = batch, s.seq = seq, s.kv_seq = kv, s.dim = dim;
    s.value_dim = dv, s.heads = heads, s.ffn = ffn, s.bias = bias, s.mask = mask, s.zero_ffn_bias = zero_ffn;
    s.seed = seed;
    return s;
  };
  using M = ModuleKind;
  using K = MaskKind;
  std::vector<CaseSpec> cases = {
      // the seeds' experiments (000-003), then seed 004's DotProductAttention
      //  name         module                        B    T    S   d  dv  H  ffn  bias   mask       zero_ffn seed
      c("single", M::MultiheadAttention, 0, 100, 0, 64, 0, 1, 0, false, K::Causal, false, 1),
      c("batched", M::MultiheadAttention, 50, 100, 0, 64, 0, 1, 0, false, K::Causal, false, 2),
      c("multihead", M::MultiheadAttention, 50, 100, 0, 64, 0, 4, 0, false, K::Causal, false, 3),
      c("block", M::TransformerEncoderLayer, 50, 100, 0, 64, 0, 4, 128, true, K::Causal, true, 4),
      c("sdpa", M::ScaledDotProductAttention, 2, 5, 7, 3, 4, 1, 0, false, K::None, false, 5),
      // the rest of the transformer: an encoder stack with its final norm, a decoder layer
      c("encoder", M::TransformerEncoder, 8, 50, 0, 64, 0, 4, 128, true, K::Causal, false, 6),
      c("decoder", M::TransformerDecoderLayer, 8, 20, 30, 64, 0, 4, 128, true, K::Causal, false, 7),
  };
  cases[5].layers = 3, cases[5].final_norm = true;
  return cases;
}

namespace {

DTensor uniform(Rng& rng, Shape shape, double bound) {
  DTensor t{DType::Float64, shape, {}};
  t.data.resize(size_t(numel(shape)));
  for (double& x : t.data) x = round_to_float(rng.uniform(-bound, bound));
  return t;
}

DTensor normal(Rng& rng, Shape shape, double stddev = 1.0) {
  DTensor t{DType::Float64, shape, {}};
  t.data.resize(size_t(numel(shape)));
  for (double& x : t.data) x = round_to_float(stddev * rng.normal());
  return t;
}

DTensor constant(Shape shape, double v) {
  DTensor t{DType::Float64, shape, {}};
  t.data.assign(size_t(numel(shape)), v);
  return t;
}

// torch's Linear init: kaiming_uniform_(a=sqrt(5)) gives bound 1/sqrt(fan_in) for the weight and the bias.
double linear_bound(int64_t fan_in) { return 1.0 / std::sqrt(double(fan_in)); }

void mha_params(Rng& rng, const MhaConfig& c, bool random_params, const std::string& prefix, TensorMap& sd) {
  const int64_t E = c.embed_dim;
  // in_proj: xavier_uniform_ on the (3E, E) matrix, or on each (E, kdim|vdim) matrix.
  if (c.packed())
    sd[prefix + "in_proj_weight"] = uniform(rng, {3 * E, E}, std::sqrt(6.0 / double(E + 3 * E)));
  else {
    sd[prefix + "q_proj_weight"] = uniform(rng, {E, E}, std::sqrt(6.0 / double(2 * E)));
    sd[prefix + "k_proj_weight"] = uniform(rng, {E, c.key_dim()}, std::sqrt(6.0 / double(E + c.key_dim())));
    sd[prefix + "v_proj_weight"] = uniform(rng, {E, c.value_dim()}, std::sqrt(6.0 / double(E + c.value_dim())));
  }
  sd[prefix + "out_proj.weight"] = uniform(rng, {E, E}, linear_bound(E));
  if (c.bias) {  // torch: constant 0
    sd[prefix + "in_proj_bias"] = random_params ? uniform(rng, {3 * E}, linear_bound(E)) : constant({3 * E}, 0);
    sd[prefix + "out_proj.bias"] = random_params ? uniform(rng, {E}, linear_bound(E)) : constant({E}, 0);
  }
  if (c.add_bias_kv) {  // torch: xavier_normal_, std = sqrt(2 / (E + E))
    sd[prefix + "bias_k"] = normal(rng, {1, 1, E}, std::sqrt(1.0 / double(E)));
    sd[prefix + "bias_v"] = normal(rng, {1, 1, E}, std::sqrt(1.0 / double(E)));
  }
}

// LayerNorm weight and bias: torch's 1 and 0, or random around them.
void norm_params(Rng& rng, const CaseSpec& s, const std::string& name, TensorMap& sd) {
  DTensor w = constant({s.dim}, 1.0), b = constant({s.dim}, 0.0);
  if (s.random_params) {
    for (double& x : w.data) x = round_to_float(1.0 + rng.uniform(-0.2, 0.2));
    for (double& x : b.data) x = round_to_float(rng.uniform(-0.2, 0.2));
  }
  sd[name + ".weight"] = w;
  sd[name + ".bias"] = b;
}

// The mask tensors of a case. L queries, S keys, B batch (0 unbatched).
// attn_name gets an (L, S) mask, kpm_name a key padding mask over kpm_len keys (S unless given).
void add_masks(Rng& rng, const CaseSpec& s, int64_t L, int64_t S, const std::string& attn_name,
               const std::string& kpm_name, TensorMap& in, int64_t kpm_len = 0) {
  switch (s.mask) {
    case MaskKind::None:
      break;
    case MaskKind::Causal: {  // the seeds' float mask: torch.triu(-inf * ones(L, S), 1)
      DTensor m = constant({L, S}, 0.0);
      for (int64_t i = 0; i < L; ++i)
        for (int64_t j = i + 1; j < S; ++j) m.data[size_t(i * S + j)] = -std::numeric_limits<double>::infinity();
      in[attn_name] = m;
      break;
    }
    case MaskKind::Random: {  // bool, ~25% masked, key 0 always visible so no row is all masked
      DTensor m{DType::Bool, {L, S}, std::vector<double>(size_t(L * S), 0.0)};
      for (int64_t i = 0; i < L; ++i)
        for (int64_t j = 1; j < S; ++j) m.data[size_t(i * S + j)] = rng.uniform() < 0.25 ? 1.0 : 0.0;
      in[attn_name] = m;
      break;
    }
    case MaskKind::Padding: {  // bool key padding: element b ignores its last (b * 3) % ceil(S/2) keys
      if (kpm_name.empty())
        throw InputError("option --mask: padding needs a key_padding_mask; " + module_name(s.module) + " has none");
      const int64_t B = s.batch ? s.batch : 1;
      S = kpm_len ? kpm_len : S;
      DTensor m{DType::Bool, s.batch ? Shape{B, S} : Shape{S}, std::vector<double>(size_t(B * S), 0.0)};
      for (int64_t b = 0; b < B; ++b) {
        const int64_t pad = (b * 3 + 1) % ((S + 1) / 2);
        for (int64_t j = S - pad; j < S; ++j) m.data[size_t(b * S + j)] = 1.0;
      }
      in[kpm_name] = m;
      break;
    }
  }
}

Shape batched(int64_t B, int64_t T, int64_t d) { return B ? Shape{B, T, d} : Shape{T, d}; }

// An encoder or decoder layer's feed-forward and LayerNorms (norm1..norm<norms>), torch's init.
void layer_params(Rng& rng, const CaseSpec& s, const std::string& prefix, int norms, TensorMap& sd) {
  const int64_t d = s.dim, F = s.ffn;
  sd[prefix + "linear1.weight"] = uniform(rng, {F, d}, linear_bound(d));
  sd[prefix + "linear1.bias"] = s.zero_ffn_bias ? constant({F}, 0) : uniform(rng, {F}, linear_bound(d));
  sd[prefix + "linear2.weight"] = uniform(rng, {d, F}, linear_bound(F));
  sd[prefix + "linear2.bias"] = s.zero_ffn_bias ? constant({d}, 0) : uniform(rng, {d}, linear_bound(F));
  for (int i = 1; i <= norms; ++i) norm_params(rng, s, prefix + "norm" + std::to_string(i), sd);
}

}  // namespace

Problem make_problem(const CaseSpec& s) {
  auto positive = [&](const char* what, int64_t v) {
    if (v <= 0) throw InputError(fmt::format("case {}: {} must be positive, got {}", s.name, what, v));
  };
  if (s.batch < 0)
    throw InputError(fmt::format("case {}: batch must be >= 0 (0 = unbatched), got {}", s.name, s.batch));
  positive("seq", s.seq);
  positive("dim", s.dim);
  positive("heads", s.heads);
  if (s.kv_seq < 0) throw InputError(fmt::format("case {}: kv-seq must be positive, got {}", s.name, s.kv_seq));

  Rng rng(s.seed);
  Problem p;
  p.name = s.name;
  p.description = s.describe();
  p.module = s.module;
  const int64_t L = s.seq, S = s.kv_seq ? s.kv_seq : s.seq, B = s.batch;
  const bool self = s.kv_seq == 0 || s.kv_seq == s.seq;
  switch (s.module) {
    case ModuleKind::MultiheadAttention: {
      if (s.dim % s.heads)
        throw InputError(fmt::format("case {}: heads {} does not divide dim {}", s.name, s.heads, s.dim));
      p.mha.embed_dim = s.dim;
      p.mha.num_heads = s.heads;
      p.mha.bias = s.bias;
      p.mha.batch_first = true;
      mha_params(rng, p.mha, s.random_params, "", p.state_dict);
      p.inputs["query"] = normal(rng, batched(B, L, s.dim));
      p.inputs["key"] = self ? p.inputs["query"] : normal(rng, batched(B, S, s.dim));
      p.inputs["value"] = p.inputs["key"];
      add_masks(rng, s, L, S, "attn_mask", "key_padding_mask", p.inputs);
      break;
    }
    case ModuleKind::TransformerEncoderLayer:
    case ModuleKind::TransformerEncoder:
    case ModuleKind::TransformerDecoderLayer: {
      positive("ffn", s.ffn);
      if (s.dim % s.heads)
        throw InputError(fmt::format("case {}: heads {} does not divide dim {}", s.name, s.heads, s.dim));
      const bool decoder = s.module == ModuleKind::TransformerDecoderLayer;
      if (!self && !decoder)
        throw InputError(fmt::format("case {}: kv-seq does not apply to a self-attention encoder", s.name));
      EncoderConfig& c = p.encoder;
      c.d_model = s.dim;
      c.nhead = s.heads;
      c.dim_feedforward = s.ffn;
      c.activation = s.activation;
      c.batch_first = true;
      if (s.module == ModuleKind::TransformerEncoder) {
        positive("layers", s.layers);
        p.num_layers = s.layers;
        p.final_norm = s.final_norm;
        for (int64_t i = 0; i < s.layers; ++i) {
          const std::string prefix = "layers." + std::to_string(i) + ".";
          mha_params(rng, c.self_attn(), s.random_params, prefix + "self_attn.", p.state_dict);
          layer_params(rng, s, prefix, 2, p.state_dict);
        }
        if (s.final_norm) norm_params(rng, s, "norm", p.state_dict);
        p.inputs["src"] = normal(rng, batched(B, L, s.dim));
        add_masks(rng, s, L, L, "mask", "src_key_padding_mask", p.inputs);
      } else if (decoder) {
        mha_params(rng, c.self_attn(), s.random_params, "self_attn.", p.state_dict);
        mha_params(rng, c.self_attn(), s.random_params, "multihead_attn.", p.state_dict);
        layer_params(rng, s, "", 3, p.state_dict);
        p.inputs["tgt"] = normal(rng, batched(B, L, s.dim));
        p.inputs["memory"] = normal(rng, batched(B, S, s.dim));
        // causal and random masks go on the target's self-attention, key padding on the memory
        add_masks(rng, s, L, L, "tgt_mask", "memory_key_padding_mask", p.inputs, S);
      } else {
        mha_params(rng, c.self_attn(), s.random_params, "self_attn.", p.state_dict);
        layer_params(rng, s, "", 2, p.state_dict);
        p.inputs["src"] = normal(rng, batched(B, L, s.dim));
        add_masks(rng, s, L, L, "src_mask", "src_key_padding_mask", p.inputs);
      }
      break;
    }
    case ModuleKind::ScaledDotProductAttention: {
      const int64_t G = B ? B : 1, Ev = s.value_dim ? s.value_dim : s.dim;
      auto shape = [&](int64_t n, int64_t e) { return B ? Shape{G, n, e} : Shape{n, e}; };
      p.inputs["query"] = normal(rng, shape(L, s.dim));
      p.inputs["key"] = normal(rng, shape(S, s.dim));
      p.inputs["value"] = normal(rng, shape(S, Ev));
      add_masks(rng, s, L, S, "attn_mask", "", p.inputs);
      break;
    }
  }
  validate(p, "case " + s.name);
  return p;
}

}  // namespace tparity
