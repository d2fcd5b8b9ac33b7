#include "tparity/harness/problem.hpp"

#include <fmt/format.h>

#include <algorithm>
#include <atomic>
#include <cmath>
#include <cstring>
#include <iterator>
#include <limits>
#include <set>
#include <stdexcept>

#include "tparity/harness/book.hpp"
#include "tparity/harness/llm.hpp"
#include "tparity/harness/rng.hpp"

namespace tparity {

namespace {
const Activation kAllActivations[] = {Activation::Relu, Activation::Gelu,     Activation::Tanh,     Activation::Sigmoid,
                                      Activation::Silu, Activation::Softplus, Activation::LeakyRelu};

using F = ModuleFamily;
using MH = ModuleHandler;
// kind, name, family, handler, fixture v1, Python fixtures
constexpr ModuleRow kModuleRows[] = {
    {ModuleKind::MultiheadAttention, "MultiheadAttention", F::TorchNn, MH::MultiheadAttention, true, true},
    {ModuleKind::TransformerEncoderLayer, "TransformerEncoderLayer", F::TorchNn, MH::TransformerEncoderLayer, true,
     true},
    {ModuleKind::TransformerEncoder, "TransformerEncoder", F::TorchNn, MH::TransformerEncoder, true, true},
    {ModuleKind::TransformerDecoderLayer, "TransformerDecoderLayer", F::TorchNn, MH::TransformerDecoderLayer, true,
     true},
    {ModuleKind::ScaledDotProductAttention, "ScaledDotProductAttention", F::Op, MH::ScaledDotProductAttention, false,
     false},
    {ModuleKind::TokenEncoder, "TokenEncoder", F::Seed, MH::TokenEncoder, false, false},
    {ModuleKind::ViT, "ViT", F::Seed, MH::ViT, false, false},
    {ModuleKind::Matmul, "Matmul", F::Op, MH::Matmul, false, false},
    {ModuleKind::Softmax, "Softmax", F::Op, MH::Softmax, false, false},
    {ModuleKind::LayerNorm, "LayerNorm", F::Op, MH::LayerNorm, false, false},
    {ModuleKind::SelfAttentionV1, "SelfAttention_v1", F::Book, MH::Book, false, true},
    {ModuleKind::SelfAttentionV2, "SelfAttention_v2", F::Book, MH::Book, false, true},
    {ModuleKind::CausalAttention, "CausalAttention", F::Book, MH::Book, false, true},
    {ModuleKind::MultiHeadAttentionWrapper, "MultiHeadAttentionWrapper", F::Book, MH::Book, false, true},
    {ModuleKind::BookMultiHeadAttention, "MultiHeadAttention", F::Book, MH::Book, false, true},
    {ModuleKind::LlamaDecoderLayer, "LlamaDecoderLayer", F::Llm, MH::Llm, false, true},
    {ModuleKind::LlamaAttention, "LlamaAttention", F::Llm, MH::Llm, false, true},
    {ModuleKind::GPT2Block, "GPT2Block", F::Llm, MH::Llm, false, true},
    {ModuleKind::MistralDecoderLayer, "MistralDecoderLayer", F::Llm, MH::Llm, false, true},
    {ModuleKind::Qwen3DecoderLayer, "Qwen3DecoderLayer", F::Llm, MH::Llm, false, true},
    {ModuleKind::Gemma2DecoderLayer, "Gemma2DecoderLayer", F::Llm, MH::Llm, false, true},
};
constexpr bool rows_in_enum_order() {
  for (size_t i = 0; i < std::size(kModuleRows); ++i)
    if (size_t(kModuleRows[i].kind) != i) return false;
  return true;
}
static_assert(std::size(kModuleRows) == kModuleKindCount, "one row per ModuleKind: a kind was added without its row");
static_assert(rows_in_enum_order(), "kModuleRows must list the kinds in ModuleKind's order");
constexpr bool families_and_handlers_agree() {
  for (const ModuleRow& r : kModuleRows)
    if ((r.family == ModuleFamily::Book) != (r.handler == ModuleHandler::Book) ||
        (r.family == ModuleFamily::Llm) != (r.handler == ModuleHandler::Llm))
      return false;
  return true;
}
static_assert(families_and_handlers_agree(), "the book's and the LLM kinds are handled by their family's code");

}  // namespace

const ModuleRow* module_rows_begin() { return std::begin(kModuleRows); }
const ModuleRow* module_rows_end() { return std::end(kModuleRows); }
const ModuleRow& module_row(ModuleKind m) {
  const size_t i = size_t(m);
  if (i >= kModuleKindCount) throw std::logic_error("module_row: not a ModuleKind: " + std::to_string(i));
  return kModuleRows[i];
}

std::string module_name(ModuleKind m) { return module_row(m).name; }

bool fixture_module(ModuleKind m) { return module_row(m).python_fixture; }

std::string activation_name(Activation a) {
  switch (a) {
    case Activation::Relu:
      return "relu";
    case Activation::Gelu:
      return "gelu";
    case Activation::Tanh:
      return "tanh";
    case Activation::Sigmoid:
      return "sigmoid";
    case Activation::Silu:
      return "silu";
    case Activation::Softplus:
      return "softplus";
    case Activation::LeakyRelu:
      return "leakyrelu";
  }
  return "?";
}

Activation activation_from_name(const std::string& name) {
  std::string names;
  for (Activation a : kAllActivations) {
    if (activation_name(a) == name) return a;
    names += (names.empty() ? "" : ", ") + activation_name(a);
  }
  throw std::invalid_argument("expected one of " + names + ", got \"" + name + "\"");
}

ModuleKind module_from_name(const std::string& name) {
  for (const ModuleRow& r : module_rows())
    if (r.name == name) return r.kind;
  std::string names;
  for (const ModuleRow& r : module_rows()) names += (names.empty() ? "\"" : ", \"") + std::string(r.name) + "\"";
  throw std::invalid_argument("expected one of " + names + ", got \"" + name + "\"");
}

bool fixture_v1_module(ModuleKind m) { return module_row(m).fixture_v1; }

std::string fixture_v1_module_names() {
  std::string out;
  for (const ModuleRow& r : module_rows())
    if (r.fixture_v1) out += (out.empty() ? "\"" : ", \"") + std::string(r.name) + "\"";
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

// An encoder stack's layers.N.* for every layer.
void layers_state(const EncoderConfig& c, int64_t num_layers, std::vector<std::pair<std::string, Shape>>& out) {
  for (int64_t i = 0; i < num_layers; ++i) {
    const std::string prefix = "layers." + std::to_string(i) + ".";
    mha_state(c.self_attn(), prefix + "self_attn.", out);
    layer_state(c, prefix, 2, out);
  }
}

// Seed 004's ViTHead: head.<i>.linear, head.<i>.bn per hidden width, head.out. (torch's
// bn.num_batches_tracked buffer is left out: eval mode never reads it.)
void vit_head_state(const VitConfig& v, std::vector<std::pair<std::string, Shape>>& out) {
  int64_t in = v.num_patches() * v.d_model();
  for (size_t i = 0; i + 1 < v.head.size(); ++i) {
    const std::string prefix = "head." + std::to_string(i) + ".";
    const int64_t w = v.head[i];
    out.push_back({prefix + "linear.weight", {w, in}});
    out.push_back({prefix + "linear.bias", {w}});
    for (const char* n : {"weight", "bias", "running_mean", "running_var"}) out.push_back({prefix + "bn." + n, {w}});
    in = w;
  }
  if (!v.head.empty()) {
    out.push_back({"head.out.weight", {v.head.back(), in}});
    out.push_back({"head.out.bias", {v.head.back()}});
  }
}

}  // namespace

std::vector<std::pair<std::string, Shape>> expected_state_dict(const Problem& p) {
  std::vector<std::pair<std::string, Shape>> out;
  const EncoderConfig& c = p.encoder;
  switch (module_handler(p.module)) {
    case ModuleHandler::MultiheadAttention:
      mha_state(p.mha, "", out);
      break;
    case ModuleHandler::TransformerEncoderLayer:
      mha_state(c.self_attn(), "self_attn.", out);
      layer_state(c, "", 2, out);
      break;
    case ModuleHandler::TransformerEncoder:
      layers_state(c, p.num_layers, out);
      if (p.final_norm) {
        out.push_back({"norm.weight", {c.d_model}});
        out.push_back({"norm.bias", {c.d_model}});
      }
      break;
    case ModuleHandler::TransformerDecoderLayer:
      mha_state(c.self_attn(), "self_attn.", out);
      mha_state(c.self_attn(), "multihead_attn.", out);
      layer_state(c, "", 3, out);
      break;
    case ModuleHandler::TokenEncoder:
      out.push_back({"embedding.weight", {p.token.vocab, p.token.layer.d_model}});
      layers_state(p.token.layer, p.token.num_layers, out);
      break;
    case ModuleHandler::ViT:
      layers_state(p.vit.layer, p.vit.num_layers, out);
      vit_head_state(p.vit, out);
      break;
    case ModuleHandler::LayerNorm:
      if (p.affine) {
        out.push_back({"weight", {p.normalized}});
        out.push_back({"bias", {p.normalized}});
      }
      break;
    case ModuleHandler::ScaledDotProductAttention:
    case ModuleHandler::Matmul:
    case ModuleHandler::Softmax:
      break;  // no parameters
    case ModuleHandler::Book:
      book_state_dict(p, out);
      break;
    case ModuleHandler::Llm:
      llm_state_dict(p, out);
      break;
  }
  return out;
}

std::vector<InputSpec> expected_inputs(ModuleKind m) {
  constexpr InputKind F = InputKind::Float, M = InputKind::Mask;
  switch (module_handler(m)) {
    case ModuleHandler::MultiheadAttention:
      return {{"query", true, F},
              {"key", true, F},
              {"value", true, F},
              {"attn_mask", false, M},
              {"key_padding_mask", false, M}};
    case ModuleHandler::TransformerEncoderLayer:
      return {{"src", true, F}, {"src_mask", false, M}, {"src_key_padding_mask", false, M}};
    case ModuleHandler::TransformerEncoder:
      return {{"src", true, F}, {"mask", false, M}, {"src_key_padding_mask", false, M}};
    case ModuleHandler::TransformerDecoderLayer:
      return {{"tgt", true, F},
              {"memory", true, F},
              {"tgt_mask", false, M},
              {"memory_mask", false, M},
              {"tgt_key_padding_mask", false, M},
              {"memory_key_padding_mask", false, M}};
    case ModuleHandler::ScaledDotProductAttention:
      return {{"query", true, F}, {"key", true, F}, {"value", true, F}, {"attn_mask", false, M}};
    case ModuleHandler::TokenEncoder:
      return {{"tokens", true, InputKind::Ids}};
    case ModuleHandler::ViT:
      return {{"image", true, F}};
    case ModuleHandler::Matmul:
      return {{"input", true, F}, {"other", true, F}};
    case ModuleHandler::Softmax:
    case ModuleHandler::LayerNorm:
      return {{"input", true, F}};
    case ModuleHandler::Book:
      return book_inputs();
    case ModuleHandler::Llm:
      return llm_inputs(m);
  }
  return {};
}

namespace {

// "[1, 7]": the multi-index of flat position i in shape s.
std::string index_of(const Shape& s, int64_t i) {
  Shape idx(s.size());
  for (size_t d = s.size(); d-- > 0;) {
    idx[d] = s[d] ? i % s[d] : 0;
    i = s[d] ? i / s[d] : 0;
  }
  return to_string(idx);
}

}  // namespace

namespace {

// "2 GiB": a byte count for a message.
std::string bytes_text(long double b) {
  const char* units[] = {"B", "KiB", "MiB", "GiB", "TiB", "PiB", "EiB"};
  int u = 0;
  while (b >= 1024 && u < 6) b /= 1024, ++u;
  return fmt::format("{:.3g} {}", double(b), units[u]);
}

std::atomic<int64_t> g_max_elements{int64_t(1) << 28};

// (batch, length) of a sequence input: unbatched (L, E), batch-first (B, L, E), sequence-first (L, B, E).
std::pair<long double, long double> batch_and_length(const Shape& s, bool batch_first) {
  if (s.size() < 2) return {1, s.empty() ? 1 : (long double)s[0]};
  if (s.size() == 2) return {1, (long double)s[0]};
  return batch_first ? std::pair<long double, long double>{(long double)s[0], (long double)s[1]}
                     : std::pair<long double, long double>{(long double)s[1], (long double)s[0]};
}

// The batch some batch shapes broadcast to (aligned from the right), by size alone.
long double broadcast_size(std::initializer_list<Shape> shapes) {
  size_t rank = 0;
  for (const Shape& s : shapes) rank = std::max(rank, s.size());
  long double n = 1;
  for (size_t i = 0; i < rank; ++i) {
    long double widest = 1;
    for (const Shape& s : shapes)
      if (i < s.size()) widest = std::max(widest, (long double)s[s.size() - 1 - i]);
    n *= widest;
  }
  return n;
}

}  // namespace

int64_t max_elements() { return g_max_elements.load(); }
void set_max_elements(int64_t n) { g_max_elements.store(n); }

long double largest_tensor(const Problem& p) {
  long double m = 0;
  for (const TensorMap* map : {&p.state_dict, &p.inputs})
    for (const auto& [name, t] : *map) m = std::max(m, (long double)t.data.size());
  auto shape = [&](const char* name) {
    const DTensor* t = p.input(name);
    return t ? t->shape : Shape{};
  };
  // An attention of B x L queries over S keys in H heads, and the (B, L or S, width) activations.
  auto attention = [&](long double B, long double L, long double S, long double H, long double width) {
    m = std::max({m, B * H * L * S, B * std::max(L, S) * width});
  };
  auto layer_width = [](const EncoderConfig& c) {
    return std::max(3.0L * (long double)c.d_model, (long double)c.dim_feedforward);
  };
  switch (module_handler(p.module)) {
    case ModuleHandler::MultiheadAttention: {
      const MhaConfig& c = p.mha;
      const auto [B, L] = batch_and_length(shape("query"), c.batch_first);
      const auto [B2, S] = batch_and_length(shape("key"), c.batch_first);
      attention(B, L, S + 2, (long double)c.num_heads, 3.0L * std::max({c.embed_dim, c.key_dim(), c.value_dim()}));
      (void)B2;
      break;
    }
    case ModuleHandler::TransformerEncoderLayer:
    case ModuleHandler::TransformerEncoder: {
      const auto [B, L] = batch_and_length(shape("src"), p.encoder.batch_first);
      attention(B, L, L, (long double)p.encoder.nhead, layer_width(p.encoder));
      break;
    }
    case ModuleHandler::TransformerDecoderLayer: {
      const auto [B, L] = batch_and_length(shape("tgt"), p.encoder.batch_first);
      const auto [B2, S] = batch_and_length(shape("memory"), p.encoder.batch_first);
      attention(B, L, std::max(L, S), (long double)p.encoder.nhead, layer_width(p.encoder));
      (void)B2;
      break;
    }
    case ModuleHandler::ScaledDotProductAttention: {
      const Shape q = shape("query"), k = shape("key"), v = shape("value");
      if (q.size() >= 2 && k.size() >= 2 && v.size() >= 2) {  // torch broadcasts all three batches
        const long double batch = broadcast_size(
            {Shape(q.begin(), q.end() - 2), Shape(k.begin(), k.end() - 2), Shape(v.begin(), v.end() - 2)});
        const long double L = (long double)q[q.size() - 2], S = (long double)k[k.size() - 2];
        m = std::max({m, batch * L * S, batch * L * (long double)v.back()});
      }
      break;
    }
    case ModuleHandler::TokenEncoder: {
      const Shape t = shape("tokens");
      const long double B = t.size() >= 2 ? (long double)t[0] : 1, T = t.empty() ? 1 : (long double)t.back();
      attention(B, T, T, (long double)p.token.layer.nhead, layer_width(p.token.layer));
      break;
    }
    case ModuleHandler::ViT: {
      const Shape im = shape("image");
      const long double B = im.size() == 4 ? (long double)im[0] : 1, n = (long double)p.vit.num_patches();
      attention(B, n, n, (long double)p.vit.layer.nhead, layer_width(p.vit.layer));
      long double in = n * (long double)p.vit.d_model();
      for (int64_t w : p.vit.head) m = std::max(m, B * std::max(in, (long double)w)), in = (long double)w;
      break;
    }
    case ModuleHandler::Matmul: {
      const Shape a = shape("input"), b = shape("other");
      // (..., M, K) @ (..., K, N) -> (broadcast(...), M, N); a 1-d operand has no M (or N).
      const long double M = a.size() >= 2 ? (long double)a[a.size() - 2] : 1,
                        N = b.size() >= 2 ? (long double)b.back() : 1;
      const Shape ba(a.begin(), a.size() >= 2 ? a.end() - 2 : a.begin()),
          bb(b.begin(), b.size() >= 2 ? b.end() - 2 : b.begin());
      m = std::max(m, broadcast_size({ba, bb}) * M * N);
      break;
    }
    case ModuleHandler::Softmax:
    case ModuleHandler::LayerNorm:
      break;
    case ModuleHandler::Book: {
      const Shape x = shape("x");
      const auto [B, T] = batch_and_length(x, true);
      const BookConfig& c = p.book;
      attention(B, T, T, (long double)c.heads(),
                std::max(3.0L * (long double)c.d_out * (long double)c.heads(), (long double)c.out_dim()));
      break;
    }
    case ModuleHandler::Llm:
      m = std::max(m, llm_largest_tensor(p));
      break;
  }
  return m;
}

void validate(const Problem& p, const std::string& where) {
  auto fail = [&](const std::string& what) { throw InputError(where + ": " + what); };
  auto positive = [&](const char* field, int64_t v) {
    if (v <= 0) fail(fmt::format("config.{}: expected a positive integer, got {}", field, v));
  };
  // An encoder layer's configuration, as torch's TransformerEncoderLayer takes it.
  auto layer_config = [&](const EncoderConfig& c) {
    positive("d_model", c.d_model);
    positive("nhead", c.nhead);
    positive("dim_feedforward", c.dim_feedforward);
    if (c.d_model % c.nhead)
      fail(fmt::format("config.nhead: expected a divisor of d_model {}, got {}", c.d_model, c.nhead));
    if (!(c.layer_norm_eps > 0))
      fail(fmt::format("config.layer_norm_eps: expected a positive number, got {}", c.layer_norm_eps));
    if (c.activation != Activation::Relu && c.activation != Activation::Gelu)
      fail(fmt::format("config.activation: expected relu or gelu (torch's TransformerEncoderLayer), got {}",
                       activation_name(c.activation)));
  };
  auto even_d = [&](int64_t d) {
    if (d % 2)
      fail(
          fmt::format("config.d_model: expected an even size (seed 004's positional encoding pairs sin and cos "
                      "columns), got {}",
                      d));
  };
  switch (module_handler(p.module)) {
    case ModuleHandler::MultiheadAttention:
      positive("embed_dim", p.mha.embed_dim);
      positive("num_heads", p.mha.num_heads);
      positive("kdim", p.mha.key_dim());
      positive("vdim", p.mha.value_dim());
      if (p.mha.embed_dim % p.mha.num_heads)
        fail(fmt::format("config.num_heads: expected a divisor of embed_dim {}, got {}", p.mha.embed_dim,
                         p.mha.num_heads));
      break;
    case ModuleHandler::TransformerEncoder:
      positive("num_layers", p.num_layers);
      [[fallthrough]];
    case ModuleHandler::TransformerEncoderLayer:
    case ModuleHandler::TransformerDecoderLayer:
      layer_config(p.encoder);
      break;
    case ModuleHandler::TokenEncoder:
      positive("num_embeddings", p.token.vocab);
      positive("num_layers", p.token.num_layers);
      layer_config(p.token.layer);
      even_d(p.token.layer.d_model);
      break;
    case ModuleHandler::ViT: {
      const VitConfig& v = p.vit;
      positive("channels", v.channels);
      positive("image_size", std::min(v.image_height, v.image_width));
      positive("patch_size", v.patch);
      if (v.image_height % v.patch || v.image_width % v.patch)
        fail(fmt::format("config.image_size: expected multiples of patch_size {}, got [{}, {}]", v.patch,
                         v.image_height, v.image_width));
      if (v.layer.d_model != v.d_model())
        fail(
            fmt::format("config.d_model: expected channels x patch_size^2 = {}, got {}", v.d_model(), v.layer.d_model));
      positive("num_layers", v.num_layers);
      layer_config(v.layer);
      even_d(v.layer.d_model);
      if (v.head.empty()) fail("config.head_neurons: expected at least one width (the output's), got none");
      for (int64_t w : v.head)
        if (w <= 0) fail(fmt::format("config.head_neurons: expected positive widths, got {}", w));
      if (!(v.bn_eps > 0)) fail(fmt::format("config.bn_eps: expected a positive number, got {}", v.bn_eps));
      break;
    }
    case ModuleHandler::LayerNorm:
      positive("normalized_shape", p.normalized);
      if (!(p.eps > 0)) fail(fmt::format("config.eps: expected a positive number, got {}", p.eps));
      break;
    case ModuleHandler::ScaledDotProductAttention:
      if (p.sdpa.is_causal && p.input("attn_mask"))
        fail("config.is_causal: true beside inputs.attn_mask; torch refuses the two together (expected one of them)");
      if (p.sdpa.scale && !std::isfinite(*p.sdpa.scale))
        fail(fmt::format("config.scale: expected a finite number or null, got {}", *p.sdpa.scale));
      break;
    case ModuleHandler::Matmul:
    case ModuleHandler::Softmax:
      break;
    case ModuleHandler::Book:
      validate_book(p, fail);
      break;
    case ModuleHandler::Llm:
      validate_llm(p, fail);
      break;
  }

  std::set<std::string> seen;
  for (const auto& [name, shape] : expected_state_dict(p)) {
    seen.insert(name);
    auto it = p.state_dict.find(name);
    if (it == p.state_dict.end())
      fail(fmt::format("state_dict.{}: missing (expected shape {})", name, to_string(shape)));
    if (it->second.dtype == DType::Bool || it->second.dtype == DType::Int64)
      fail(fmt::format("state_dict.{}: expected a float32 or float64 tensor, got {}", name,
                       dtype_name(it->second.dtype)));
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
    const bool is_float = t->dtype == DType::Float32 || t->dtype == DType::Float64;
    switch (s.kind) {
      case InputKind::Float:
        if (!is_float)
          fail(fmt::format("inputs.{}: expected a float32 or float64 tensor, got {}", s.name, dtype_name(t->dtype)));
        break;
      case InputKind::Mask:
        if (t->dtype == DType::Int64) fail(fmt::format("inputs.{}: expected a bool or float mask, got int64", s.name));
        break;
      case InputKind::Ids: {
        if (t->dtype != DType::Int64)
          fail(fmt::format("inputs.{}: expected an int64 tensor of token ids, got {}", s.name, dtype_name(t->dtype)));
        const int64_t vocab = llm_module(p.module) ? llm_max_positions(p) : p.token.vocab;
        const char* bound = llm_module(p.module) ? "max_position_embeddings" : "num_embeddings";
        for (size_t i = 0; i < t->data.size(); ++i) {
          const double id = t->data[i];
          if (!(id == std::floor(id)))
            fail(fmt::format("inputs.{}{}: expected an integer token id, got {}", s.name,
                             index_of(t->shape, int64_t(i)), id));
          if (id < 0 || id >= double(vocab))
            fail(fmt::format("inputs.{}{}: {} {} is out of range for {} {} (expected 0 <= id < {})", s.name,
                             index_of(t->shape, int64_t(i)), llm_module(p.module) ? "position id" : "token id", id,
                             bound, vocab, vocab));
        }
        break;
      }
    }
  }
  for (const auto& [name, t] : p.inputs)
    if (!seen.count(name)) fail(fmt::format("inputs.{}: not an argument of {}.forward()", name, module_name(p.module)));
  if (const long double n = largest_tensor(p); n > (long double)max_elements())
    fail(
        fmt::format("config and inputs: a run makes a tensor of {:.3g} elements ({} as float64), above "
                    "--max-elements {} (raise it if the machine has the memory)",
                    double(n), bytes_text(n * 8), max_elements()));
}

nlohmann::json config_json(const Problem& p) {
  nlohmann::json j;
  switch (module_handler(p.module)) {
    case ModuleHandler::MultiheadAttention: {
      const MhaConfig& c = p.mha;
      j = {{"embed_dim", c.embed_dim},     {"num_heads", c.num_heads},         {"bias", c.bias},
           {"add_bias_kv", c.add_bias_kv}, {"add_zero_attn", c.add_zero_attn}, {"kdim", c.key_dim()},
           {"vdim", c.value_dim()},        {"batch_first", c.batch_first}};
      break;
    }
    case ModuleHandler::TransformerEncoderLayer:
    case ModuleHandler::TransformerEncoder:
    case ModuleHandler::TransformerDecoderLayer: {
      const EncoderConfig& c = p.encoder;
      j = {{"d_model", c.d_model},
           {"nhead", c.nhead},
           {"dim_feedforward", c.dim_feedforward},
           {"activation", activation_name(c.activation)},
           {"layer_norm_eps", c.layer_norm_eps},
           {"batch_first", c.batch_first},
           {"norm_first", c.norm_first}};
      if (p.module == ModuleKind::TransformerEncoder) {
        j["num_layers"] = p.num_layers;
        j["norm"] = p.final_norm;
      }
      break;
    }
    case ModuleHandler::TokenEncoder: {
      const EncoderConfig& c = p.token.layer;
      j = {{"num_embeddings", p.token.vocab},
           {"d_model", c.d_model},
           {"nhead", c.nhead},
           {"dim_feedforward", c.dim_feedforward},
           {"activation", activation_name(c.activation)},
           {"layer_norm_eps", c.layer_norm_eps},
           {"num_layers", p.token.num_layers}};
      break;
    }
    case ModuleHandler::ViT: {
      const VitConfig& v = p.vit;
      j = {{"channels", v.channels},
           {"image_size", {v.image_height, v.image_width}},
           {"patch_size", v.patch},
           {"d_model", v.layer.d_model},
           {"nhead", v.layer.nhead},
           {"dim_feedforward", v.layer.dim_feedforward},
           {"activation", activation_name(v.layer.activation)},
           {"layer_norm_eps", v.layer.layer_norm_eps},
           {"num_layers", v.num_layers},
           {"head_neurons", v.head},
           {"head_activation", activation_name(v.head_activation)},
           {"bn_eps", v.bn_eps}};
      break;
    }
    case ModuleHandler::Softmax:
      j = {{"dim", -1}};
      break;
    case ModuleHandler::LayerNorm:
      j = {{"normalized_shape", {p.normalized}}, {"eps", p.eps}, {"elementwise_affine", p.affine}};
      break;
    case ModuleHandler::ScaledDotProductAttention:
      j = {{"is_causal", p.sdpa.is_causal},
           {"scale", p.sdpa.scale ? nlohmann::json(*p.sdpa.scale) : nlohmann::json(nullptr)},
           {"enable_gqa", p.sdpa.enable_gqa}};
      break;
    case ModuleHandler::Matmul:
      j = nlohmann::json::object();
      break;
    case ModuleHandler::Book:
      j = book_config_json(p);
      break;
    case ModuleHandler::Llm:
      j = llm_config_json(p);
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
  switch (module_handler(p.module)) {
    case ModuleHandler::MultiheadAttention: {
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
    case ModuleHandler::TransformerEncoderLayer:
    case ModuleHandler::TransformerEncoder:
    case ModuleHandler::TransformerDecoderLayer: {
      const EncoderConfig& c = p.encoder;
      std::string s = module_name(p.module);
      if (p.module == ModuleKind::TransformerEncoder)
        s += fmt::format(" layers={}{}", p.num_layers, p.final_norm ? " +norm" : "");
      s += fmt::format(" d={} heads={} ffn={} {} eps={:g}{}{}", c.d_model, c.nhead, c.dim_feedforward,
                       activation_name(c.activation), c.layer_norm_eps, c.norm_first ? " norm_first" : "",
                       c.batch_first ? " batch_first" : " seq_first");
      for (const InputSpec& in : expected_inputs(p.module))
        s += in.kind == InputKind::Mask ? mask_of(in.name.c_str())
                                        : fmt::format(" {}={}", in.name, shape_of(in.name.c_str()));
      return s;
    }
    case ModuleHandler::ScaledDotProductAttention:
      return fmt::format("scaled dot-product attention q={} k={} v={}", shape_of("query"), shape_of("key"),
                         shape_of("value")) +
             mask_of("attn_mask") + (p.sdpa.is_causal ? " is_causal" : "") +
             (p.sdpa.scale ? fmt::format(" scale={:g}", *p.sdpa.scale) : "") + (p.sdpa.enable_gqa ? " enable_gqa" : "");
    case ModuleHandler::TokenEncoder: {
      const EncoderConfig& c = p.token.layer;
      return fmt::format("TokenEncoder vocab={} d={} heads={} ffn={} {} layers={} tokens={}", p.token.vocab, c.d_model,
                         c.nhead, c.dim_feedforward, activation_name(c.activation), p.token.num_layers,
                         shape_of("tokens"));
    }
    case ModuleHandler::ViT: {
      const VitConfig& v = p.vit;
      std::string head;
      for (int64_t w : v.head) head += (head.empty() ? "" : ", ") + std::to_string(w);
      return fmt::format("ViT image={} patch={} ({} patches, d={}) heads={} ffn={} {} layers={} head=[{}] {}",
                         shape_of("image"), v.patch, v.num_patches(), v.d_model(), v.layer.nhead,
                         v.layer.dim_feedforward, activation_name(v.layer.activation), v.num_layers, head,
                         activation_name(v.head_activation));
    }
    case ModuleHandler::Matmul:
      return fmt::format("matmul input={} other={}", shape_of("input"), shape_of("other"));
    case ModuleHandler::Softmax:
      return fmt::format("softmax dim=-1 input={}", shape_of("input"));
    case ModuleHandler::LayerNorm:
      return fmt::format("layer_norm normalized_shape=[{}] eps={:g}{} input={}", p.normalized, p.eps,
                         p.affine ? " affine" : "", shape_of("input"));
    case ModuleHandler::Book:
      return book_summary(p);
    case ModuleHandler::Llm:
      return llm_summary(p);
  }
  return "";
}

}  // namespace tparity

namespace tparity {

void resolve_semantics(Problem& p, TorchSemantics s) {
  if (!p.semantics) p.semantics = s;
  p.mha.semantics = p.encoder.semantics = p.token.layer.semantics = p.vit.layer.semantics = *p.semantics;
}

TorchSemantics semantics_of_version(const std::string& v) {
  if (v.rfind("1.13", 0) == 0) return TorchSemantics::Torch113;
  if (!v.empty() && v[0] == '2' && v.size() > 1 && v[1] == '.') return TorchSemantics::Torch2;
  throw std::invalid_argument("expected a torch version 1.13.x or 2.x, got \"" + v + "\"");
}

namespace {

// Whether any query row of one attention is masked at every one of its S keys, with the masks
// merged as `s` merges them (core/attention.hpp). attn: (L, S) or (G, L, S) with G = B * H (or H
// unbatched); kpm: (B, S) or (S). Extra keys (bias_kv, zero_attn) are never masked: pass extra > 0.
bool any_dead_row(const DTensor* attn, const DTensor* kpm, int64_t H, TorchSemantics s, int64_t extra) {
  if (extra > 0 || (!attn && !kpm)) return false;
  const double ninf = -std::numeric_limits<double>::infinity();
  auto additive = [&](const DTensor& m, size_t i) {
    return m.dtype == DType::Bool ? (m.data[i] != 0 ? ninf : 0.0) : m.data[i];
  };
  const int64_t S = attn ? attn->shape.back() : kpm->shape.back();
  const int64_t L = attn ? attn->shape[attn->shape.size() - 2] : 1;
  const int64_t B =
      kpm ? (kpm->shape.size() == 2 ? kpm->shape[0] : 1) : (attn && attn->shape.size() == 3 ? attn->shape[0] / H : 1);
  const bool attn3d = attn && attn->shape.size() == 3;
  for (int64_t b = 0; b < B; ++b)
    for (int64_t h = 0; h < (attn3d ? H : 1); ++h)
      for (int64_t i = 0; i < L; ++i) {
        bool dead = true;
        for (int64_t j = 0; j < S && dead; ++j) {
          const size_t ai = size_t(((attn3d ? (b * H + h) * L : 0) + i) * S + j), ki = size_t(b * S + j);
          double v;
          if (s == TorchSemantics::Torch2 || !attn || !kpm) {
            v = (attn ? additive(*attn, ai) : 0.0) + (kpm ? additive(*kpm, ki) : 0.0);
          } else if (attn->dtype == DType::Bool) {  // 1.13: logical_or, a nonzero float key counts
            v = attn->data[ai] != 0 || kpm->data[ki] != 0 ? ninf : 0.0;
          } else {  // 1.13: masked_fill of a bool key padding mask into the float attn_mask
            v = kpm->data[ki] != 0 ? ninf : attn->data[ai];
          }
          dead = v == ninf;
        }
        if (dead) return true;
      }
  return false;
}

}  // namespace

bool has_fully_masked_rows(const Problem& p, TorchSemantics s) {
  switch (module_handler(p.module)) {
    case ModuleHandler::MultiheadAttention:
      return any_dead_row(p.input("attn_mask"), p.input("key_padding_mask"), p.mha.num_heads, s,
                          (p.mha.add_bias_kv ? 1 : 0) + (p.mha.add_zero_attn ? 1 : 0));
    case ModuleHandler::TransformerEncoderLayer:
      return any_dead_row(p.input("src_mask"), p.input("src_key_padding_mask"), p.encoder.nhead, s, 0);
    case ModuleHandler::TransformerEncoder:
      return any_dead_row(p.input("mask"), p.input("src_key_padding_mask"), p.encoder.nhead, s, 0);
    case ModuleHandler::TransformerDecoderLayer:
      return any_dead_row(p.input("tgt_mask"), p.input("tgt_key_padding_mask"), p.encoder.nhead, s, 0) ||
             any_dead_row(p.input("memory_mask"), p.input("memory_key_padding_mask"), p.encoder.nhead, s, 0);
    case ModuleHandler::ScaledDotProductAttention: {  // (L, S); bool true = the key takes part
      const DTensor* m = p.input("attn_mask");
      if (!m || p.sdpa.is_causal || m->shape.size() != 2) return false;  // is_causal leaves key 0 to every row
      const int64_t L = m->shape[0], S = m->shape[1];
      for (int64_t i = 0; i < L; ++i) {
        bool dead = true;
        for (int64_t j = 0; j < S && dead; ++j) {
          const double v = m->data[size_t(i * S + j)];
          dead = m->dtype == DType::Bool ? v == 0 : v == -std::numeric_limits<double>::infinity();
        }
        if (dead) return true;
      }
      return false;
    }
    case ModuleHandler::TokenEncoder:
    case ModuleHandler::ViT:
    case ModuleHandler::Matmul:
    case ModuleHandler::Softmax:
    case ModuleHandler::LayerNorm:
    case ModuleHandler::Book:
    case ModuleHandler::Llm:
      return false;
  }
  return false;  // every handler returned above
}

}  // namespace tparity

namespace tparity {

std::vector<std::string> semantic_differences(const Problem& p) {
  std::vector<std::string> out;
  const bool no_weights = p.module != ModuleKind::MultiheadAttention || !p.forward.need_weights;
  if (no_weights &&
      (has_fully_masked_rows(p, TorchSemantics::Torch113) || has_fully_masked_rows(p, TorchSemantics::Torch2)))
    out.push_back(
        "rows whose every key is masked, without weights: torch 1.13's softmax gives NaN, 2.x's "
        "scaled_dot_product_attention zero weights");
  // Each attention's (attn_mask, key_padding_mask) pair.
  std::vector<std::pair<const char*, const char*>> pairs;
  switch (module_handler(p.module)) {
    case ModuleHandler::MultiheadAttention:
      pairs = {{"attn_mask", "key_padding_mask"}};
      break;
    case ModuleHandler::TransformerEncoderLayer:
      pairs = {{"src_mask", "src_key_padding_mask"}};
      break;
    case ModuleHandler::TransformerEncoder:
      pairs = {{"mask", "src_key_padding_mask"}};
      break;
    case ModuleHandler::TransformerDecoderLayer:
      pairs = {{"tgt_mask", "tgt_key_padding_mask"}, {"memory_mask", "memory_key_padding_mask"}};
      break;
    case ModuleHandler::ScaledDotProductAttention:
    case ModuleHandler::TokenEncoder:
    case ModuleHandler::ViT:
    case ModuleHandler::Matmul:
    case ModuleHandler::Softmax:
    case ModuleHandler::LayerNorm:
    case ModuleHandler::Book:
    case ModuleHandler::Llm:
      break;
  }
  for (const auto& [a, k] : pairs) {
    const DTensor* attn = p.input(a);
    const DTensor* kpm = p.input(k);
    if (!attn || !kpm) continue;
    if (kpm->dtype != DType::Bool)
      out.push_back(std::string("a float ") + k + " with an " + a + ": torch 1.13 ORs its nonzeros into a bool " + a +
                    " and ignores it beside a float one, 2.x adds it");
    else if (attn->dtype != DType::Bool)
      for (double x : attn->data)
        if (!(x < std::numeric_limits<double>::infinity())) {
          out.push_back(std::string("+inf or NaN in a float ") + a + " beside a bool " + k +
                        ": torch 1.13 overwrites a padded key with -inf, 2.x adds -inf to it");
          break;
        }
  }
  return out;
}

}  // namespace tparity

namespace tparity {

Problem jittered(const Problem& p, uint64_t seed) {
  Problem q = p;
  Rng rng(seed);
  // Each nonzero finite float32 value: `if (coin()) x = nextafter(f, coin() ? +inf : -inf)`, written
  // without a branch on either coin (Rng::coin_then_coin). On a nonzero finite float's bits, a step
  // towards +inf is +1 when it is positive and -1 when negative, towards -inf the reverse, carries
  // included (FLT_MAX up is +inf; the smallest subnormal down is +0, its negative up -0: nextafter's).
  auto jitter = [&](DTensor& t) {
    if (t.dtype != DType::Float32 && t.dtype != DType::Float64) return;
    for (double& x : t.data) {
      const float f = float(x);
      if (f == 0 || !std::isfinite(f)) continue;
      bool up = false;
      const bool move = rng.coin_then_coin(up);
      uint32_t bits;
      std::memcpy(&bits, &f, sizeof bits);
      const bool positive = bits >> 31 == 0;
      bits += uint32_t(move) * (up == positive ? 1u : ~0u);
      float moved;
      std::memcpy(&moved, &bits, sizeof moved);
      // x = move ? moved : x, as a select on the bits (GCC 12 -O2 compiled the ?: to a branch)
      const double m = double(moved);
      uint64_t xb, mb;
      std::memcpy(&xb, &x, sizeof xb), std::memcpy(&mb, &m, sizeof mb);
      xb ^= (xb ^ mb) & (uint64_t(0) - uint64_t(move));
      std::memcpy(&x, &xb, sizeof x);
    }
  };
  for (auto& [name, t] : q.state_dict) jitter(t);
  for (const InputSpec& in : expected_inputs(p.module))
    if (in.kind == InputKind::Float)
      if (auto it = q.inputs.find(in.name); it != q.inputs.end()) jitter(it->second);
  q.outputs.clear(), q.outputs_float32.clear(), q.components.clear(), q.components_float32.clear();
  return q;
}

}  // namespace tparity
