// The book's attention classes as problems (harness/book.hpp): state dicts, inputs, config.
#include "tparity/harness/book.hpp"

#include <fmt/format.h>

#include <set>
#include <stdexcept>

#include "tparity/harness/io.hpp"

namespace tparity {

bool book_module(ModuleKind m) { return module_row(m).family == ModuleFamily::Book; }

BookClass book_class(ModuleKind m) {
  // the family's kinds and the core's classes, one line each
  const std::pair<ModuleKind, BookClass> classes[] = {
      {ModuleKind::SelfAttentionV1, BookClass::SelfAttentionV1},
      {ModuleKind::SelfAttentionV2, BookClass::SelfAttentionV2},
      {ModuleKind::CausalAttention, BookClass::CausalAttention},
      {ModuleKind::MultiHeadAttentionWrapper, BookClass::MultiHeadAttentionWrapper},
      {ModuleKind::BookMultiHeadAttention, BookClass::MultiHeadAttention},
  };
  for (const auto& [kind, c] : classes)
    if (kind == m) return c;
  throw std::logic_error("book_class: " + module_name(m) + " is not one of the book's classes");
}

namespace {

// One set of projections under `pre`, in module.state_dict()'s order: a module's own buffers come
// before its children's parameters (CausalAttention: mask, then W_query.weight, ...).
void projections(const BookConfig& c, const std::string& pre, int64_t width,
                 std::vector<std::pair<std::string, Shape>>& out) {
  if (c.masked()) out.push_back({pre + "mask", {c.context_length, c.context_length}});
  for (const char* w : {"W_query", "W_key", "W_value"}) {
    if (c.cls == BookClass::SelfAttentionV1) {
      out.push_back({pre + w, {c.d_in, width}});
      continue;
    }
    out.push_back({pre + w + ".weight", {width, c.d_in}});
    if (c.qkv_bias) out.push_back({pre + w + ".bias", {width}});
  }
}

}  // namespace

void book_state_dict(const Problem& p, std::vector<std::pair<std::string, Shape>>& out) {
  const BookConfig& c = p.book;
  if (c.cls == BookClass::MultiHeadAttentionWrapper)
    for (int64_t h = 0; h < c.num_heads; ++h) projections(c, "heads." + std::to_string(h) + ".", c.d_out, out);
  else
    projections(c, "", c.d_out, out);
  if (c.has_out_proj()) {
    out.push_back({"out_proj.weight", {c.out_dim(), c.out_dim()}});
    out.push_back({"out_proj.bias", {c.out_dim()}});
  }
}

std::vector<InputSpec> book_inputs() { return {{"x", true, InputKind::Float}}; }

void validate_book(const Problem& p, const std::function<void(const std::string&)>& fail) {
  const BookConfig& c = p.book;
  auto positive = [&](const char* field, int64_t v) {
    if (v <= 0) fail(fmt::format("config.{}: expected a positive integer, got {}", field, v));
  };
  positive("d_in", c.d_in);
  positive("d_out", c.d_out);
  if (c.masked()) positive("context_length", c.context_length);
  positive("num_heads", c.num_heads);
  if (c.cls == BookClass::MultiHeadAttention && c.d_out % c.num_heads)
    fail(fmt::format(
        "config.num_heads: expected a divisor of d_out {} (the book asserts d_out % num_heads == 0), got {}", c.d_out,
        c.num_heads));
  // x's shape against the config is the core's to check when it runs, as for the other modules.
}

nlohmann::json book_config_json(const Problem& p) {
  const BookConfig& c = p.book;
  nlohmann::json j = {{"d_in", c.d_in}, {"d_out", c.d_out}};
  if (c.cls != BookClass::SelfAttentionV1) j["qkv_bias"] = c.qkv_bias;
  if (c.masked()) j["context_length"] = c.context_length;
  if (c.cls == BookClass::MultiHeadAttentionWrapper || c.cls == BookClass::MultiHeadAttention)
    j["num_heads"] = c.num_heads;
  return j;
}

std::string book_summary(const Problem& p) {
  const BookConfig& c = p.book;
  const DTensor* x = p.input("x");
  std::string s = fmt::format("{} (the book's, ch03) d_in={} d_out={}", module_name(p.module), c.d_in, c.d_out);
  if (c.cls == BookClass::MultiHeadAttentionWrapper || c.cls == BookClass::MultiHeadAttention)
    s += fmt::format(" heads={}", c.num_heads);
  if (c.masked()) s += fmt::format(" context_length={}", c.context_length);
  if (c.cls != BookClass::SelfAttentionV1) s += c.qkv_bias ? " qkv_bias" : "";
  return s + " x=" + (x ? to_string(x->shape) : std::string("-"));
}

std::vector<std::string> book_component_names(const Problem& p) {
  if (p.book.has_out_proj()) return {"q", "k", "v", "scores", "attn_weights", "context", "output"};
  return {"q", "k", "v", "scores", "attn_weights", "output"};
}

void read_book_config(const nlohmann::json& j, Problem& p,
                      const std::function<void(const std::string& field, const std::string& what)>& fail) {
  BookConfig& c = p.book;
  c.cls = book_class(p.module);
  std::set<std::string> keys{"d_in", "d_out"};
  if (c.cls != BookClass::SelfAttentionV1) keys.insert("qkv_bias");
  if (c.masked()) keys.insert({"context_length", "dropout"});
  if (c.cls == BookClass::MultiHeadAttentionWrapper || c.cls == BookClass::MultiHeadAttention) keys.insert("num_heads");
  for (auto it = j.begin(); it != j.end(); ++it)
    if (!keys.count(it.key())) {
      std::string list;
      for (const std::string& k : keys) list += (list.empty() ? "" : ", ") + k;
      fail("config." + it.key(), "unexpected key for " + module_name(p.module) + " (expected one of: " + list + ")");
    }
  auto field = [](const char* k) { return std::string("config.") + k; };
  auto integer = [&](const char* k, int64_t& out) {
    auto it = j.find(k);
    if (it == j.end()) return fail(field(k), "missing");
    if (!it->is_number_integer()) fail(field(k), "expected an integer, got " + show_json(*it));
    if (it->is_number_unsigned() && it->get<uint64_t>() > (uint64_t(1) << 31))
      fail(field(k), fmt::format("expected an integer in [1, 2^31], got {}", it->get<uint64_t>()));
    const int64_t x = it->get<int64_t>();
    if (x < 1 || x > (int64_t(1) << 31)) fail(field(k), fmt::format("expected an integer in [1, 2^31], got {}", x));
    out = x;
  };
  integer("d_in", c.d_in);
  integer("d_out", c.d_out);
  if (keys.count("qkv_bias"))
    if (auto it = j.find("qkv_bias"); it != j.end()) {
      if (!it->is_boolean()) fail(field("qkv_bias"), "expected true or false, got " + show_json(*it));
      c.qkv_bias = it->get<bool>();
    }
  if (c.masked()) integer("context_length", c.context_length);
  if (keys.count("num_heads")) integer("num_heads", c.num_heads);
}

DTensor book_causal_buffer(int64_t n) {
  DTensor t{DType::Float64, {n, n}, Storage<double>(size_t(n * n), 0.0)};
  for (int64_t i = 0; i < n; ++i)
    for (int64_t j = i + 1; j < n; ++j) t.data[size_t(i * n + j)] = 1;
  return t;
}

}  // namespace tparity
