#include "tparity/harness/cases.hpp"

#include <fmt/format.h>

#include <cmath>
#include <limits>

#include "tparity/harness/book.hpp"
#include "tparity/harness/llm.hpp"
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
    case MaskKind::IsCausal:
      return "is-causal";
  }
  return "?";
}

MaskKind mask_kind_from_name(const std::string& s) {
  for (MaskKind m : {MaskKind::None, MaskKind::Causal, MaskKind::Random, MaskKind::Padding, MaskKind::IsCausal})
    if (mask_kind_name(m) == s) return m;
  throw std::invalid_argument("expected none, causal, random, padding or is-causal, got \"" + s + "\"");
}

namespace {

std::string widths(const std::vector<int64_t>& v) {
  std::string s;
  for (int64_t x : v) s += (s.empty() ? "" : ", ") + std::to_string(x);
  return "[" + s + "]";
}

bool op_case(ModuleKind m) { return m == ModuleKind::Matmul || m == ModuleKind::Softmax || m == ModuleKind::LayerNorm; }

}  // namespace

std::pair<Shape, Shape> matmul_operands(const CaseSpec& s) {
  auto lead = [&](Shape shape, bool batched) {
    if (batched && s.batch) shape.insert(shape.begin(), s.batch);
    return shape;
  };
  return {lead(s.lhs, s.lhs_batched), lead(s.rhs, s.rhs_batched)};
}

std::string CaseSpec::describe() const {
  if (llm_module(module)) return llm_describe(*this);
  std::string s = module_name(module);
  if (book_module(module)) {
    s += batch ? fmt::format(" B={}", batch) : std::string(" unbatched");
    s += fmt::format(" T={} d_in={} d_out={}", seq, dim, out_dim ? out_dim : dim);
    const BookClass c = book_class(module);
    if (c == BookClass::MultiHeadAttentionWrapper || c == BookClass::MultiHeadAttention)
      s += fmt::format(" heads={}", heads);
    if (c != BookClass::SelfAttentionV1) s += bias ? " qkv_bias" : "";
    if (c != BookClass::SelfAttentionV1 && c != BookClass::SelfAttentionV2) s += " causal buffer";
    return s + " (the book's, ch03)";
  }
  switch (module_handler(module)) {
    case ModuleHandler::TokenEncoder:
      return s + fmt::format(" B={} T={} vocab={} d={} heads={} ffn={} {} layers={}{}", batch, seq, vocab, dim, heads,
                             ffn, activation_name(activation), layers, random_params ? " random_params" : "");
    case ModuleHandler::ViT:
      return s +
             fmt::format(" B={} image={}x{}x{} patch={} ({} patches, d={}) heads={} ffn={} {} layers={} head={} {}{}",
                         batch, channels, image_height, image_width, patch, seq, dim, heads, ffn,
                         activation_name(activation), layers, widths(head), activation_name(head_activation),
                         random_params ? " random_params" : "");
    case ModuleHandler::Matmul: {
      const auto [a, b] = matmul_operands(*this);
      return s + " " + to_string(a) + " @ " + to_string(b);
    }
    case ModuleHandler::Softmax:
    case ModuleHandler::LayerNorm: {
      Shape shape{seq, module == ModuleKind::Softmax ? (kv_seq ? kv_seq : seq) : dim};
      if (batch) shape.insert(shape.begin(), batch);
      s += " " + to_string(shape);
      if (input_offset != 0) s += fmt::format(" offset={:g}", input_offset);
      if (input_scale != 1) s += fmt::format(" scale={:g}", input_scale);
      return s + (module == ModuleKind::Softmax ? " dim=-1" : " affine");
    }
    case ModuleHandler::MultiheadAttention:
    case ModuleHandler::TransformerEncoderLayer:
    case ModuleHandler::TransformerEncoder:
    case ModuleHandler::TransformerDecoderLayer:
    case ModuleHandler::ScaledDotProductAttention:
    case ModuleHandler::Book:  // the book's and the LLM blocks' are described above
    case ModuleHandler::Llm:
      break;
  }
  s += batch ? fmt::format(" B={}", batch) : std::string(" unbatched");
  s += fmt::format(" T={}", seq);
  if (kv_seq && kv_seq != seq) s += fmt::format(" S={}", kv_seq);
  s += fmt::format(" d={}", dim);
  if (module == ModuleKind::ScaledDotProductAttention) {
    if (value_dim && value_dim != dim) s += fmt::format(" dv={}", value_dim);
    if (heads > 1) s += fmt::format(" heads={}", heads);
    if (kv_heads && kv_heads != heads) s += fmt::format(" kv_heads={}", kv_heads);
    if (scale) s += fmt::format(" scale={:g}", *scale);
  } else {
    s += fmt::format(" heads={}", heads);
  }
  if (module == ModuleKind::MultiheadAttention) s += bias ? " bias=on" : " bias=off";
  if (module == ModuleKind::TransformerEncoderLayer || module == ModuleKind::TransformerEncoder ||
      module == ModuleKind::TransformerDecoderLayer) {
    s += fmt::format(" ffn={} {}", ffn, activation_name(activation));
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
  cases[6].activation = Activation::Gelu;  // torch's other feed-forward activation, in a default case

  // seed 004's front: its own numbers (it fed zeros; uniform ids are a stronger test)
  CaseSpec embed = c("embed", M::TokenEncoder, 2, 100, 0, 300, 0, 5, 100, true, K::None, false, 8);
  embed.vocab = 1000, embed.layers = 6;
  // seed 004's ViT, scaled down: 32x32 images in 8x8 patches (16 patches of 3 * 64 = 192 features)
  CaseSpec vit = c("vit", M::ViT, 2, 16, 0, 192, 0, 6, 100, true, K::None, false, 9);
  vit.channels = 3, vit.image_height = 32, vit.image_width = 32, vit.patch = 8, vit.layers = 2, vit.head = {64, 10};
  // seed 000's (5, 4, 10, 3) @ (3, 6) and seed 003's (10, 3, 5, 4) @ (10, 3, 4, 3)
  CaseSpec matmul = c("matmul", M::Matmul, 5, 1, 0, 1, 0, 1, 0, false, K::None, false, 10);
  matmul.lhs = {4, 10, 3}, matmul.rhs = {3, 6}, matmul.lhs_batched = true;
  CaseSpec bmm = c("bmm", M::Matmul, 10, 1, 0, 1, 0, 1, 0, false, K::None, false, 11);
  bmm.lhs = {3, 5, 4}, bmm.rhs = {3, 4, 3}, bmm.lhs_batched = bmm.rhs_batched = true;
  // scores-like rows, scaled so they are peaked; a layer norm whose rows sit around 100
  CaseSpec softmax = c("softmax", M::Softmax, 50, 100, 100, 1, 0, 1, 0, false, K::None, false, 12);
  softmax.input_scale = 8;
  CaseSpec layernorm = c("layernorm", M::LayerNorm, 50, 100, 0, 64, 0, 1, 0, false, K::None, false, 13);
  layernorm.input_offset = 100;
  cases.insert(cases.end(), {embed, vit, matmul, bmm, softmax, layernorm});
  // seed 001's experiment: the book's SelfAttention_v1, 4 tokens of d_in 3 into d_out 2, weights and
  // inputs uniform in [0, 1) as its torch.rand draws them; the book's MultiHeadAttention on its
  // chapter's batch (2 x 6 tokens of 3 dims, d_out 2 over 2 heads)
  CaseSpec v1 = c("selfattn_v1", M::SelfAttentionV1, 0, 4, 0, 3, 0, 1, 0, false, K::None, false, 18);
  v1.out_dim = 2;
  CaseSpec book_mha = c("book_mha", M::BookMultiHeadAttention, 2, 6, 0, 3, 0, 2, 0, false, K::None, false, 19);
  book_mha.out_dim = 2;
  cases.insert(cases.end(), {v1, book_mha});
  for (const CaseSpec& l : llm_default_cases()) cases.push_back(l);
  return cases;
}

std::vector<CaseSpec> stress_cases() {
  CaseSpec hot;
  hot.name = "softmax_hot", hot.module = ModuleKind::Softmax, hot.batch = 4, hot.seq = 32, hot.kv_seq = 256;
  hot.dim = 1, hot.input_scale = 40, hot.seed = 14;
  CaseSpec keys;
  // 32 queries over 16384 keys: M N K = 32 x 16 x 16384 per head is far above the 10^6 below which
  // OpenBLAS's SkylakeX and Cooperlake kernels take their small-matrix path, which sums all of K in one
  // running sum itself (at 8 queries over 4096 keys LibTorch 1.13's float32 context had the defect's
  // own error there, 1.09e-6 against 1.08e-6, and nothing judged against it could tell them apart).
  keys.name = "long_keys", keys.module = ModuleKind::MultiheadAttention, keys.batch = 1, keys.seq = 32;
  keys.kv_seq = 16384, keys.dim = 32, keys.heads = 2, keys.bias = true, keys.seed = 15;
  return {hot, keys};
}

namespace {

DTensor uniform(Rng& rng, Shape shape, double bound) {
  DTensor t{DType::Float64, shape, {}};
  t.data.resize(size_t(numel(shape)));
  for (double& x : t.data) x = round_to_float(rng.uniform(-bound, bound));
  return t;
}

// torch.rand: uniform in [0, 1).
DTensor uniform01(Rng& rng, Shape shape) {
  DTensor t{DType::Float64, shape, {}};
  t.data.resize(size_t(numel(shape)));
  for (double& x : t.data) x = round_to_float(rng.uniform());
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
// A bool mask is true where a key is masked out (MultiheadAttention and the layers), except for
// scaled_dot_product_attention (sdpa_convention), where true means the key takes part, as in torch.
void add_masks(Rng& rng, const CaseSpec& s, int64_t L, int64_t S, const std::string& attn_name,
               const std::string& kpm_name, TensorMap& in, int64_t kpm_len = 0, bool sdpa_convention = false) {
  switch (s.mask) {
    case MaskKind::None:
    case MaskKind::IsCausal:  // a flag, not a tensor
      break;
    case MaskKind::Causal: {  // the seeds' float mask: torch.triu(-inf * ones(L, S), 1)
      DTensor m = constant({L, S}, 0.0);
      for (int64_t i = 0; i < L; ++i)
        for (int64_t j = i + 1; j < S; ++j) m.data[size_t(i * S + j)] = -std::numeric_limits<double>::infinity();
      in[attn_name] = m;
      break;
    }
    case MaskKind::Random: {  // bool, ~25% masked, key 0 always visible so no row is all masked
      DTensor m{DType::Bool, {L, S}, Storage<double>(size_t(L * S), 0.0)};
      for (int64_t i = 0; i < L; ++i)
        for (int64_t j = 1; j < S; ++j) m.data[size_t(i * S + j)] = rng.uniform() < 0.25 ? 1.0 : 0.0;
      if (sdpa_convention)
        for (double& x : m.data) x = 1.0 - x;
      in[attn_name] = m;
      break;
    }
    case MaskKind::Padding: {  // bool key padding: element b ignores its last (b * 3) % ceil(S/2) keys
      if (kpm_name.empty())
        throw InputError("option --mask: padding needs a key_padding_mask; " + module_name(s.module) + " has none");
      const int64_t B = s.batch ? s.batch : 1;
      S = kpm_len ? kpm_len : S;
      DTensor m{DType::Bool, s.batch ? Shape{B, S} : Shape{S}, Storage<double>(size_t(B * S), 0.0)};
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

// Seed 004's ViTHead at torch's init: per hidden width a Linear and a BatchNorm1d (its affine 1/0
// unless random_params; running statistics always drawn so eval mode has something to apply), then
// the output Linear.
void vit_head_params(Rng& rng, const CaseSpec& s, int64_t fan_in, TensorMap& sd) {
  for (size_t i = 0; i + 1 < s.head.size(); ++i) {
    const std::string prefix = "head." + std::to_string(i) + ".";
    const int64_t w = s.head[i];
    sd[prefix + "linear.weight"] = uniform(rng, {w, fan_in}, linear_bound(fan_in));
    sd[prefix + "linear.bias"] = uniform(rng, {w}, linear_bound(fan_in));
    DTensor g = constant({w}, 1.0), b = constant({w}, 0.0);
    if (s.random_params) {
      for (double& x : g.data) x = round_to_float(1.0 + rng.uniform(-0.2, 0.2));
      for (double& x : b.data) x = round_to_float(rng.uniform(-0.2, 0.2));
    }
    sd[prefix + "bn.weight"] = g;
    sd[prefix + "bn.bias"] = b;
    sd[prefix + "bn.running_mean"] = normal(rng, {w}, 0.1);
    DTensor var = constant({w}, 0.0);
    for (double& x : var.data) x = round_to_float(rng.uniform(0.5, 1.5));
    sd[prefix + "bn.running_var"] = var;
    fan_in = w;
  }
  sd["head.out.weight"] = uniform(rng, {s.head.back(), fan_in}, linear_bound(fan_in));
  sd["head.out.bias"] = uniform(rng, {s.head.back()}, linear_bound(fan_in));
}

// An encoder or decoder layer's feed-forward and LayerNorms (norm1..norm<norms>), torch's init.
void layer_params(Rng& rng, const CaseSpec& s, const std::string& prefix, int norms, TensorMap& sd) {
  const int64_t d = s.dim, F = s.ffn;
  sd[prefix + "linear1.weight"] = uniform(rng, {F, d}, linear_bound(d));
  sd[prefix + "linear1.bias"] = s.zero_ffn_bias ? constant({F}, 0) : uniform(rng, {F}, linear_bound(d));
  sd[prefix + "linear2.weight"] = uniform(rng, {d, F}, linear_bound(F));
  sd[prefix + "linear2.bias"] = s.zero_ffn_bias ? constant({d}, 0) : uniform(rng, {d}, linear_bound(F));
  for (int i = 1; i <= norms; ++i) norm_params(rng, s, prefix + "norm" + std::to_string(i), sd);
}

// The book's classes as the book builds them: SelfAttention_v1's torch.rand matrices, nn.Linear's
// init for the others (weight and bias uniform in +-1/sqrt(fan_in)), the causal buffer
// triu(ones(T, T), 1) with context_length = T (the book's batch.shape[1]), x uniform in [0, 1).
void book_params(Rng& rng, const CaseSpec& s, Problem& p) {
  BookConfig& c = p.book;
  c.cls = book_class(s.module);
  c.d_in = s.dim, c.d_out = s.out_dim ? s.out_dim : s.dim, c.num_heads = s.heads, c.qkv_bias = s.bias;
  c.context_length = s.seq;
  const std::string cls = module_name(s.module);
  if (c.batched() != (s.batch > 0))
    throw InputError(c.batched() ? fmt::format("case {}: batch must be >= 1 ({} takes x (B, T, d_in))", s.name, cls)
                                 : fmt::format("case {}: batch must be 0 ({} takes unbatched x (T, d_in): its keys.T "
                                               "would transpose every dim of a batch)",
                                               s.name, cls));
  const bool heads = c.cls == BookClass::MultiHeadAttentionWrapper || c.cls == BookClass::MultiHeadAttention;
  if (!heads && s.heads != 1)
    throw InputError(fmt::format("case {}: option --heads: {} has one head, got {}", s.name, cls, s.heads));
  if (c.cls == BookClass::MultiHeadAttention && c.d_out % c.num_heads)
    throw InputError(fmt::format("case {}: heads {} does not divide d_out {}", s.name, c.num_heads, c.d_out));
  const int64_t sets = c.cls == BookClass::MultiHeadAttentionWrapper ? c.num_heads : 1;
  for (int64_t h = 0; h < sets; ++h) {
    const std::string pre = c.cls == BookClass::MultiHeadAttentionWrapper ? "heads." + std::to_string(h) + "." : "";
    if (c.masked()) p.state_dict[pre + "mask"] = book_causal_buffer(c.context_length);
    for (const char* w : {"W_query", "W_key", "W_value"}) {
      if (c.cls == BookClass::SelfAttentionV1) {
        p.state_dict[pre + w] = uniform01(rng, {c.d_in, c.d_out});
        continue;
      }
      p.state_dict[pre + w + ".weight"] = uniform(rng, {c.d_out, c.d_in}, linear_bound(c.d_in));
      if (c.qkv_bias) p.state_dict[pre + w + ".bias"] = uniform(rng, {c.d_out}, linear_bound(c.d_in));
    }
  }
  if (c.has_out_proj()) {
    const int64_t O = c.out_dim();
    p.state_dict["out_proj.weight"] = uniform(rng, {O, O}, linear_bound(O));
    p.state_dict["out_proj.bias"] = uniform(rng, {O}, linear_bound(O));
  }
  p.inputs["x"] = uniform01(rng, c.batched() ? Shape{s.batch, s.seq, s.dim} : Shape{s.seq, s.dim});
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
  if (s.module != ModuleKind::ScaledDotProductAttention) {
    if (s.mask == MaskKind::IsCausal)
      throw InputError(fmt::format(
          "option --mask: is-causal is scaled_dot_product_attention's flag, {} takes none (causal is its float mask)",
          module_name(s.module)));
    if (s.kv_heads && !llm_module(s.module))
      throw InputError(
          fmt::format("option --kv-heads: only scaled_dot_product_attention and the LLM blocks take it, not {}",
                      module_name(s.module)));
    if (s.scale)
      throw InputError(
          fmt::format("option --scale: only scaled_dot_product_attention takes it, not {}", module_name(s.module)));
  }
  if (llm_module(s.module)) return make_llm_problem(s);

  if (s.module == ModuleKind::TokenEncoder || s.module == ModuleKind::ViT || op_case(s.module) ||
      book_module(s.module)) {
    if (s.mask != MaskKind::None)
      throw InputError(
          fmt::format("option --mask: {} takes no mask, got {}", module_name(s.module), mask_kind_name(s.mask)));
  }
  if (s.module == ModuleKind::TokenEncoder || s.module == ModuleKind::ViT) {
    if (!s.batch)
      throw InputError(fmt::format("case {}: batch must be >= 1 (seed 004's {} takes batched input)", s.name,
                                   module_name(s.module)));
    if (s.kv_seq && s.kv_seq != s.seq)
      throw InputError(fmt::format("case {}: kv-seq does not apply to a self-attention encoder", s.name));
    positive("ffn", s.ffn);
    positive("layers", s.layers);
    if (s.activation != Activation::Relu && s.activation != Activation::Gelu)
      throw InputError(fmt::format("case {}: activation {}: the encoder layers' feed-forward takes relu or gelu",
                                   s.name, activation_name(s.activation)));
  }

  Rng rng(s.seed);
  Problem p;
  p.name = s.name;
  p.description = s.describe();
  p.module = s.module;
  const int64_t L = s.seq, S = s.kv_seq ? s.kv_seq : s.seq, B = s.batch;
  const bool self = s.kv_seq == 0 || s.kv_seq == s.seq;
  auto encoder_layer_config = [&] {
    EncoderConfig c;
    c.d_model = s.dim;
    c.nhead = s.heads;
    c.dim_feedforward = s.ffn;
    c.activation = s.activation;
    c.batch_first = true;
    return c;
  };
  auto stack_params = [&](const EncoderConfig& c) {
    for (int64_t i = 0; i < s.layers; ++i) {
      const std::string prefix = "layers." + std::to_string(i) + ".";
      mha_params(rng, c.self_attn(), s.random_params, prefix + "self_attn.", p.state_dict);
      layer_params(rng, s, prefix, 2, p.state_dict);
    }
  };
  switch (module_handler(s.module)) {
    case ModuleHandler::MultiheadAttention: {
      if (s.dim % s.heads)
        throw InputError(fmt::format("case {}: heads {} does not divide dim {}", s.name, s.heads, s.dim));
      p.mha.embed_dim = s.dim;
      p.mha.num_heads = s.heads;
      p.mha.bias = s.bias;
      p.mha.batch_first = true;
      p.forward.need_weights = s.need_weights;
      mha_params(rng, p.mha, s.random_params, "", p.state_dict);
      p.inputs["query"] = normal(rng, batched(B, L, s.dim));
      p.inputs["key"] = self ? p.inputs["query"] : normal(rng, batched(B, S, s.dim));
      p.inputs["value"] = p.inputs["key"];
      add_masks(rng, s, L, S, "attn_mask", "key_padding_mask", p.inputs);
      break;
    }
    case ModuleHandler::TransformerEncoderLayer:
    case ModuleHandler::TransformerEncoder:
    case ModuleHandler::TransformerDecoderLayer: {
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
    case ModuleHandler::ScaledDotProductAttention: {
      // One head: (B, L, E) as seed 004's; more: (B, H, L, E), and k, v with kv_heads (enable_gqa).
      const int64_t G = B ? B : 1, Ev = s.value_dim ? s.value_dim : s.dim, H = s.heads,
                    Hkv = s.kv_heads ? s.kv_heads : s.heads;
      if (Hkv < 1 || H % Hkv)
        throw InputError(
            fmt::format("case {}: option --kv-heads: expected a divisor of heads {}, got {}", s.name, H, Hkv));
      if (s.scale && !std::isfinite(*s.scale))
        throw InputError(fmt::format("option --scale: expected a finite number, got {}", *s.scale));
      auto shape = [&](int64_t h, int64_t n, int64_t e) {
        Shape out;
        if (B) out.push_back(G);
        if (H > 1) out.push_back(h);
        out.insert(out.end(), {n, e});
        return out;
      };
      p.inputs["query"] = normal(rng, shape(H, L, s.dim));
      p.inputs["key"] = normal(rng, shape(Hkv, S, s.dim));
      p.inputs["value"] = normal(rng, shape(Hkv, S, Ev));
      p.sdpa.is_causal = s.mask == MaskKind::IsCausal;
      p.sdpa.scale = s.scale;
      p.sdpa.enable_gqa = Hkv != H;
      if (s.mask != MaskKind::IsCausal) add_masks(rng, s, L, S, "attn_mask", "", p.inputs, 0, true);
      break;
    }
    case ModuleHandler::TokenEncoder: {
      positive("vocab", s.vocab);
      if (s.dim % 2)
        throw InputError(
            fmt::format("case {}: dim must be even for seed 004's positional encoding, got {}", s.name, s.dim));
      if (s.dim % s.heads)
        throw InputError(fmt::format("case {}: heads {} does not divide dim {}", s.name, s.heads, s.dim));
      p.token.vocab = s.vocab;
      p.token.layer = encoder_layer_config();
      p.token.num_layers = s.layers;
      p.state_dict["embedding.weight"] = normal(rng, {s.vocab, s.dim});  // nn.Embedding: N(0, 1)
      stack_params(p.token.layer);
      DTensor ids{DType::Int64, {B, L}, Storage<double>(size_t(B * L))};
      for (double& id : ids.data) id = double(rng.integer(0, s.vocab - 1));
      p.inputs["tokens"] = ids;
      break;
    }
    case ModuleHandler::ViT: {
      positive("channels", s.channels);
      positive("image height", s.image_height);
      positive("image width", s.image_width);
      positive("patch", s.patch);
      if (s.image_height % s.patch || s.image_width % s.patch)
        throw InputError(fmt::format("case {}: image {}x{} is not a multiple of the patch size {}", s.name,
                                     s.image_height, s.image_width, s.patch));
      VitConfig& v = p.vit;
      v.channels = s.channels, v.image_height = s.image_height, v.image_width = s.image_width, v.patch = s.patch;
      if (s.dim != v.d_model())
        throw InputError(
            fmt::format("case {}: dim is channels x patch^2 = {} for a ViT, got {}", s.name, v.d_model(), s.dim));
      if (s.seq != v.num_patches())
        throw InputError(fmt::format("case {}: seq is the number of patches (H/p)(W/p) = {} for a ViT, got {}", s.name,
                                     v.num_patches(), s.seq));
      if (s.dim % 2)
        throw InputError(
            fmt::format("case {}: channels x patch^2 = {} must be even for seed 004's positional "
                        "encoding",
                        s.name, s.dim));
      if (s.dim % s.heads)
        throw InputError(fmt::format("case {}: heads {} does not divide d = {}", s.name, s.heads, s.dim));
      if (s.head.empty()) throw InputError(fmt::format("case {}: the head needs at least one width", s.name));
      for (int64_t w : s.head) positive("head width", w);
      v.layer = encoder_layer_config();
      v.num_layers = s.layers;
      v.head = s.head;
      v.head_activation = s.head_activation;
      stack_params(v.layer);
      vit_head_params(rng, s, v.num_patches() * v.d_model(), p.state_dict);
      DTensor image{DType::Float64, {B, s.channels, s.image_height, s.image_width}, {}};
      image.data.resize(size_t(numel(image.shape)));
      for (double& x : image.data) x = round_to_float(rng.uniform());  // torch.rand
      p.inputs["image"] = image;
      break;
    }
    case ModuleHandler::Matmul: {
      const auto [a, b] = matmul_operands(s);
      for (const Shape& shape : {a, b})
        for (int64_t d : shape)
          if (d <= 0)
            throw InputError(fmt::format("case {}: operand sizes must be positive, got {}", s.name, to_string(shape)));
      try {
        (void)matmul_shape(a, b);
      } catch (const ShapeError& e) {
        throw InputError(fmt::format("case {}: {}", s.name, e.what()));
      }
      p.inputs["input"] = normal(rng, a);
      p.inputs["other"] = normal(rng, b);
      break;
    }
    case ModuleHandler::Book:
      book_params(rng, s, p);
      break;
    case ModuleHandler::Softmax:
    case ModuleHandler::LayerNorm: {
      const bool ln = s.module == ModuleKind::LayerNorm;
      const Shape shape = batched(B, L, ln ? s.dim : S);
      if (ln) {
        p.normalized = s.dim;
        DTensor w = constant({s.dim}, 0.0), b = constant({s.dim}, 0.0);
        for (double& x : w.data) x = round_to_float(1.0 + rng.uniform(-0.2, 0.2));
        for (double& x : b.data) x = round_to_float(rng.uniform(-0.2, 0.2));
        p.state_dict["weight"] = w;
        p.state_dict["bias"] = b;
      }
      DTensor x = normal(rng, shape);
      for (double& v : x.data) v = round_to_float(s.input_offset + s.input_scale * v);
      p.inputs["input"] = x;
      break;
    }
    case ModuleHandler::Llm:  // make_llm_problem, above
      break;
  }
  validate(p, "case " + s.name);
  return p;
}

}  // namespace tparity
