// Whole models: an export read and checked layer by layer and end to end (eval/model.hpp).
#include "tparity/eval/model.hpp"

#include <algorithm>
#include <cmath>
#include <cstring>
#include <fmt/format.h>
#include <set>
#include <tuple>

#include "tparity/compare/metrics.hpp"
#include "tparity/compare/noise.hpp"
#include "tparity/compare/report.hpp"
#include "tparity/core/llm.hpp"
#include "tparity/core/ops.hpp"
#include "tparity/eval/evaluate.hpp"
#include "tparity/fixture/fixture.hpp"
#include "tparity/harness/hand.hpp"
#include "tparity/harness/io.hpp"
#include "tparity/harness/llm.hpp"
#include "tparity/harness/rng.hpp"
#include "tparity/torch/reference.hpp"

namespace tparity {

namespace {


// ---- reading ----------------------------------------------------------------------------------

struct Fields {
  const nlohmann::json& j;
  std::string where;
  std::set<std::string> seen;
  const nlohmann::json& get(const std::string& k) {
    seen.insert(k);
    if (!j.contains(k)) throw InputError(where + ": " + k + ": missing");
    return j.at(k);
  }
  bool has(const std::string& k) {
    seen.insert(k);
    return j.contains(k) && !j.at(k).is_null();
  }
  std::string str(const std::string& k) {
    const auto& v = get(k);
    if (!v.is_string()) throw InputError(where + ": " + k + ": expected a string, got " + show_json(v));
    return v.get<std::string>();
  }
  int64_t integer(const std::string& k, int64_t lo, int64_t hi) {
    const auto& v = get(k);
    if (!v.is_number_integer() || v.get<int64_t>() < lo || v.get<int64_t>() > hi)
      throw InputError(where + ": " + k + ": expected an integer in [" + std::to_string(lo) + ", " + std::to_string(hi) +
                       "], got " + show_json(v));
    return v.get<int64_t>();
  }
  double number(const nlohmann::json& v, const std::string& k, double lo, double hi) {
    if (!v.is_number() || !std::isfinite(v.get<double>()) || v.get<double>() < lo || v.get<double>() > hi)
      throw InputError(where + ": " + k + ": expected a number in [" + fmt::format("{:g}", lo) + ", " +
                       fmt::format("{:g}", hi) + "], got " + show_json(v));
    return v.get<double>();
  }
  void no_others() {
    for (auto it = j.begin(); it != j.end(); ++it)
      if (!seen.count(it.key())) throw InputError(where + ": " + show_text(it.key()) + ": unknown field");
  }
};

constexpr int64_t kUnusedNamesShown = 5;  // unused_tensors.first: the exporter's UNUSED_SHOWN

const char* const kArchitectures[] = {"llama", "mistral", "qwen3", "gemma2", "gpt2", "bert"};

// The tensor `name` of the export, its dtype and shape checked.
DTensor tensor_of(const ModelExport& m, const std::string& name, DType dtype, const Shape& shape) {
  const std::string where = m.dir + "/model.safetensors";
  if (!m.tensors->find(name)) throw InputError(where + ": " + name + ": missing");
  DTensor t = m.tensors->tensor(name);
  if (t.dtype != dtype)
    throw InputError(where + ": " + name + ": expected " + dtype_name(dtype) + ", got " + dtype_name(t.dtype));
  if (t.shape != shape)
    throw InputError(where + ": " + name + ": expected shape " + to_string(shape) + ", got " + to_string(t.shape));
  // The truth, transformers' float32 and the weights are finite in every export (the exporter refuses
  // the rest): a NaN there would match the hand core's NaN and pass.
  if (dtype == DType::Float64 || dtype == DType::Float32)
    for (size_t i = 0; i < t.data.size(); ++i)
      if (!std::isfinite(t.data[i]))
        throw InputError(fmt::format("{}: {}: expected finite values (the exporter writes no other), got {} at flat "
                                     "index {}",
                                     where, name, t.data[i], i));
  return t;
}

// What the checkpoint holds beyond its config's model: judged is the model as configured, which may
// not be the one the weights were trained as (a layer count cut short).
std::string unused_note(const ModelExport& m) {
  std::string names;
  for (const std::string& n : m.unused_first) names += (names.empty() ? "" : ", ") + n;
  return fmt::format("the checkpoint holds {} tensor{} that the model its config builds does not read ({}{}): "
                     "judged is the model as configured",
                     m.unused_count, m.unused_count == 1 ? "" : "s", names,
                     m.unused_count > int64_t(m.unused_first.size()) ? ", ..." : "");
}

Shape ids_shape(const ModelExport& m) {
  const StEntry* e = m.tensors->find("input_ids");
  return e ? e->shape : Shape{};
}

void check_float32_reference(const ModelExport& m, const std::string& where);  // below, beside the measures

}  // namespace

ModelExport read_model_export(const std::string& dir) {
  ModelExport m;
  m.dir = dir;
  const std::string path = dir + "/model.json";
  const nlohmann::json j = parse_json(read_input_file(path, "a model export"), path);
  if (!j.is_object()) throw InputError(path + ": expected a JSON object, got " + show_json(j));
  Fields f{j, path, {}};
  if (f.str("format") != kModelFormat)
    throw InputError(path + ": format: expected \"" + std::string(kModelFormat) + "\", got " + show_json(j.at("format")));
  f.integer("version", kModelVersion, kModelVersion);
  m.name = f.str("name");
  check_file_name(m.name, path, "name");
  m.description = f.str("description");
  m.architecture = f.str("architecture");
  if (std::find(std::begin(kArchitectures), std::end(kArchitectures), m.architecture) == std::end(kArchitectures))
    throw InputError(path + ": architecture: expected llama, mistral, qwen3, gemma2, gpt2 or bert, got " +
                     show_json(j.at("architecture")));
  m.module = f.str("module");
  ModuleKind kind;
  try {
    kind = module_from_name(m.module);
  } catch (const std::invalid_argument&) {
    throw InputError(path + ": module: expected a module kind tparity knows, got " + show_json(j.at("module")));
  }
  const bool encoder = m.architecture == "bert";
  if (encoder ? kind != ModuleKind::TransformerEncoderLayer : !llm_module(kind))
    throw InputError(path + ": module: " + m.module + " is not a layer of a " + m.architecture + " model");
  m.checkpoint = f.str("checkpoint");
  m.reference = f.get("reference");
  if (!m.reference.is_object()) throw InputError(path + ": reference: expected an object, got " + show_json(m.reference));
  for (auto it = m.reference.begin(); it != m.reference.end(); ++it)
    if (!it.value().is_string() && !it.value().is_number())
      throw InputError(path + ": reference." + show_text(it.key()) + ": expected a string, got " + show_json(it.value()));
  m.num_layers = f.integer("num_hidden_layers", 1, 4096);
  m.hidden = f.integer("hidden_size", 1, 1 << 20);
  m.vocab = f.integer("vocab_size", 1, int64_t(1) << 24);
  const auto& slice = f.get("slice");
  if (!slice.is_array() || slice.size() != 2 || !slice[0].is_number_integer() || !slice[1].is_number_integer() ||
      slice[0].get<int64_t>() < 0 || slice[1].get<int64_t>() <= slice[0].get<int64_t>() ||
      slice[1].get<int64_t>() > m.num_layers)
    throw InputError(path + ": slice: expected [A, B] with 0 <= A < B <= num_hidden_layers = " +
                     std::to_string(m.num_layers) + ", got " + show_json(slice));
  m.first = slice[0].get<int64_t>();
  m.last = slice[1].get<int64_t>();
  const auto& layers = f.get("layers");
  if (!layers.is_array() || int64_t(layers.size()) != m.last - m.first)
    throw InputError(path + ": layers: expected an array of " + std::to_string(m.last - m.first) +
                     " layers (the slice), got " + show_json(layers));
  for (size_t i = 0; i < layers.size(); ++i) {
    const std::string lw = path + ": layers[" + std::to_string(i) + "]";
    const auto& l = layers[i];
    if (!l.is_object() || l.size() != 2 || !l.contains("index") || !l.contains("fixture") ||
        !l.at("index").is_number_integer() || !l.at("fixture").is_string())
      throw InputError(lw + ": expected {\"index\": integer, \"fixture\": file name}, got " + show_json(l));
    if (l.at("index").get<int64_t>() != m.first + int64_t(i))
      throw InputError(lw + ".index: expected " + std::to_string(m.first + int64_t(i)) + ", got " + show_json(l.at("index")));
    const std::string file = l.at("fixture").get<std::string>();
    check_file_name(file, path, "layers[" + std::to_string(i) + "].fixture");
    m.layers.push_back({m.first + int64_t(i), dir + "/" + file});
  }
  const auto& norm = f.get("final_norm");
  if (!norm.is_object() || !norm.contains("kind") || !norm.at("kind").is_string())
    throw InputError(path + ": final_norm: expected {\"kind\", \"eps\"}, got " + show_json(norm));
  m.final_norm = norm.at("kind").get<std::string>();
  if (m.final_norm != "rms" && m.final_norm != "gemma_rms" && m.final_norm != "layer" && m.final_norm != "none")
    throw InputError(path + ": final_norm.kind: expected rms, gemma_rms, layer or none, got " + show_json(norm.at("kind")));
  for (auto it = norm.begin(); it != norm.end(); ++it)
    if (it.key() != "kind" && it.key() != "eps")
      throw InputError(path + ": final_norm." + show_text(it.key()) + ": unknown field");
  if (m.final_norm != "none") {
    if (!norm.contains("eps")) throw InputError(path + ": final_norm.eps: missing");
    m.final_norm_eps = f.number(norm.at("eps"), "final_norm.eps", 0, 1);
  }
  if (f.has("logit_softcap")) m.logit_softcap = f.number(j.at("logit_softcap"), "logit_softcap", 1e-6, 1e6);
  if (f.has("prompts")) {
    const auto& p = j.at("prompts");
    if (!p.is_array()) throw InputError(path + ": prompts: expected an array of strings or null, got " + show_json(p));
    for (const auto& s : p) {
      if (!s.is_string()) throw InputError(path + ": prompts: expected strings, got " + show_json(s));
      m.prompts.push_back(s.get<std::string>());
    }
  }
  if (f.has("generation")) {
    const auto& g = j.at("generation");
    if (!g.is_object() || g.size() != 2 || !g.contains("steps") || !g.contains("prompt_length"))
      throw InputError(path + ": generation: expected {\"steps\", \"prompt_length\"} or null, got " + show_json(g));
    Fields gf{g, path + ": generation", {}};
    m.generate_steps = gf.integer("steps", 1, 4096);
    m.prompt_length = gf.integer("prompt_length", 1, 1 << 20);
    if (encoder) throw InputError(path + ": generation: an encoder generates nothing; expected null");
  }
  if (f.has("unused_tensors")) {
    const auto& u = j.at("unused_tensors");
    if (!u.is_object() || u.size() != 2 || !u.contains("count") || !u.contains("first"))
      throw InputError(path + ": unused_tensors: expected {\"count\", \"first\"} or null, got " + show_json(u));
    Fields uf{u, path + ": unused_tensors", {}};
    m.unused_count = uf.integer("count", 0, int64_t(1) << 30);
    // exactly the first min(count, 5) names, as the exporter writes them (shown_name: printable ASCII, at
    // most 256 bytes, so two long names cut alike may read the same): nothing a terminal or a
    // line-splitting reader takes for anything but a name
    const int64_t shown = std::min<int64_t>(m.unused_count, kUnusedNamesShown);
    const auto& names = u.at("first");
    if (!names.is_array() || int64_t(names.size()) != shown)
      throw InputError(path + ": unused_tensors.first: expected an array of " + std::to_string(shown) +
                       " names (the count's first, at most " + std::to_string(kUnusedNamesShown) + "), got " +
                       show_json(names));
    for (const auto& n : names) {
      const bool plain = n.is_string() && !n.get_ref<const std::string&>().empty() &&
                         n.get_ref<const std::string&>().size() <= 256 &&
                         std::all_of(n.get_ref<const std::string&>().begin(), n.get_ref<const std::string&>().end(),
                                     [](char c) { return c >= 0x20 && c <= 0x7e; });
      if (!plain)
        throw InputError(path + ": unused_tensors.first: expected tensor names of 1 to 256 printable ASCII "
                         "characters, got " + show_json(n));
      m.unused_first.push_back(n.get<std::string>());
    }
  }
  const std::string tf = f.str("tensor_file");
  check_file_name(tf, path, "tensor_file");
  f.no_others();
  m.tensors = std::make_shared<const SafetensorsFile>(SafetensorsFile::open(dir + "/" + tf));

  // The tensors: every one this export needs, of the model's sizes.
  const Shape bt = ids_shape(m);
  const std::string where = dir + "/" + tf;
  if (bt.size() != 2 || bt[0] < 1 || bt[1] < 1)
    throw InputError(where + ": input_ids: expected I64 (B, T) token ids, got " +
                     (m.tensors->find("input_ids") ? "shape " + to_string(bt) : std::string("nothing")));
  const DTensor ids = tensor_of(m, "input_ids", DType::Int64, bt);
  for (double v : ids.data)
    if (v < 0 || v >= double(m.vocab))
      throw InputError(where + ": input_ids: expected ids in [0, vocab_size = " + std::to_string(m.vocab) + "), got " +
                       fmt::format("{:.0f}", v));
  const DTensor mask = tensor_of(m, "attention_mask", DType::Int64, bt);
  for (int64_t b = 0; b < bt[0]; ++b) {
    bool seen_zero = false, any = false;
    for (int64_t t = 0; t < bt[1]; ++t) {
      const double v = mask.data[size_t(b * bt[1] + t)];
      if (v != 0 && v != 1) throw InputError(where + ": attention_mask: expected 0 or 1, got " + fmt::format("{:g}", v));
      if (v == 1 && seen_zero)
        throw InputError(where + ": attention_mask: row " + std::to_string(b) +
                         ": expected its real tokens first, then padding (right padding)");
      seen_zero |= v == 0;
      any |= v == 1;
    }
    if (!any) throw InputError(where + ": attention_mask: row " + std::to_string(b) + " holds no token");
  }
  const Shape btc{bt[0], bt[1], m.hidden};
  for (int64_t k = m.first; k <= m.last; ++k) {
    (void)tensor_of(m, "hidden." + std::to_string(k), DType::Float64, btc);
    (void)tensor_of(m, "hidden_float32." + std::to_string(k), DType::Float32, btc);
  }
  if (m.has_head()) {
    if (m.last != m.num_layers)
      throw InputError(where + ": lm_head.weight: a head is read after the last layer; the slice ends at " +
                       std::to_string(m.last) + " of " + std::to_string(m.num_layers));
    if (m.final_norm == "none") throw InputError(path + ": final_norm: a decoder's head follows its final norm");
    (void)tensor_of(m, "lm_head.weight", DType::Float32, {m.vocab, m.hidden});
    (void)tensor_of(m, "final_norm.weight", DType::Float32, {m.hidden});
    if (m.final_norm == "layer") (void)tensor_of(m, "final_norm.bias", DType::Float32, {m.hidden});
    (void)tensor_of(m, "logits", DType::Float64, {bt[0], bt[1], m.vocab});
    (void)tensor_of(m, "logits_float32", DType::Float32, {bt[0], bt[1], m.vocab});
  }
  if (m.generate_steps) {
    if (!m.has_head()) throw InputError(path + ": generation: needs the head (lm_head.weight in " + tf + ")");
    const int64_t P = m.prompt_length, N = m.generate_steps;
    // The greedy continuation of prompt 0, as the exporter makes it: its real tokens, then the steps. A
    // crafted prompt_length of 20000 over ids of its own ran a 20000-token prefill nothing had bounded.
    int64_t real0 = 0;
    for (int64_t t = 0; t < bt[1]; ++t) real0 += mask.data[size_t(t)] != 0;
    if (P != real0)
      throw InputError(path + ": generation.prompt_length: expected the real length of prompt 0 (" +
                       std::to_string(real0) + " tokens, attention_mask[0]), got " + std::to_string(P));
    const DTensor g = tensor_of(m, "generation.ids", DType::Int64, {1, P + N});
    for (double v : g.data)
      if (v < 0 || v >= double(m.vocab))
        throw InputError(where + ": generation.ids: expected ids in [0, vocab_size), got " + fmt::format("{:.0f}", v));
    for (int64_t t = 0; t < P; ++t)
      if (g.data[size_t(t)] != ids.data[size_t(t)])
        throw InputError(where + ": generation.ids: expected prompt 0's ids (input_ids[0]) first, got another id at "
                         "position " + std::to_string(t));
    (void)tensor_of(m, "generation.logits", DType::Float64, {N, m.vocab});
    (void)tensor_of(m, "generation.logits_float32", DType::Float32, {N, m.vocab});
    (void)tensor_of(m, "generation.tokens_float32", DType::Int64, {N});
    if (m.architecture == "gpt2") {
      (void)tensor_of(m, "wte.weight", DType::Float32, {m.vocab, m.hidden});
      const StEntry* wpe = m.tensors->find("wpe.weight");
      if (!wpe || wpe->shape.size() != 2 || wpe->shape[0] < P + N || wpe->shape[1] != m.hidden)
        throw InputError(where + ": wpe.weight: expected F32 (positions >= " + std::to_string(P + N) + ", " +
                         std::to_string(m.hidden) + ")");
      (void)tensor_of(m, "wpe.weight", DType::Float32, wpe->shape);
    } else {
      (void)tensor_of(m, "embed_tokens.weight", DType::Float32, {m.vocab, m.hidden});
    }
  }
  check_float32_reference(m, where);
  return m;
}

namespace {

// ---- measuring ----------------------------------------------------------------------------------

template <class A, class B>  // std::vector<double> or Storage<double>
double rel_l2(const A& a, const B& b) {
  Tensor<double> ta({int64_t(a.size())}), tb({int64_t(b.size())});
  std::copy(a.begin(), a.end(), ta.data.begin());
  std::copy(b.begin(), b.end(), tb.data.begin());
  const Metrics mm = measure(ta, tb);
  if (mm.nonfinite_mismatch) return std::numeric_limits<double>::infinity();
  return mm.rel_l2;
}

// transformers' own float32 error is what every float32 bound is made of. Above this rel_l2 against the
// float64 truth it measures nothing (float32 overflowing where float64 does not, or a crafted export's
// zeroed states): the exporter refuses such a checkpoint (export_model.py's FLOAT32_REFERENCE_MOST), and
// the reader refuses such an export, made anywhere (a random engine's dump passed against zeroed float32
// hidden states and logits). Real models' float32 error is 1e-7 to 1e-4.
constexpr double kFloat32ReferenceMost = 0.1;

// rel_l2 of a float32 tensor against the float64 one of its shape (both checked and finite), read where
// they lie in the mapped file: a real model's logits are gigabytes as doubles, and copies of them made
// the read's peak memory several times theirs. Over the rows (vectors of the last axis) whose token is
// real when by_token (shapes (B, T, ...), the mask's (B, T) rows).
double mapped_rel_l2(const ModelExport& m, const std::string& ref_name, const std::string& truth_name, bool by_token) {
  const StEntry& r = *m.tensors->find(ref_name);
  const StEntry& t = *m.tensors->find(truth_name);
  const uint8_t* rp = m.tensors->data(r);
  const uint8_t* tp = m.tensors->data(t);
  const size_t n = (r.end - r.begin) / sizeof(float), width = size_t(r.shape.back());
  const DTensor mask = by_token ? m.tensors->tensor("attention_mask") : DTensor{};
  Norm2 diff, truth;  // the comparator's scaled sums (a float less a finite double cannot overflow)
  for (size_t row = 0; width > 0 && row < n / width; ++row) {
    if (by_token && mask.data[row] == 0) continue;
    for (size_t i = row * width; i < (row + 1) * width; ++i) {
      float f;
      double d;
      std::memcpy(&f, rp + i * sizeof(float), sizeof f);  // not aligned in general
      std::memcpy(&d, tp + i * sizeof(double), sizeof d);
      diff.add(double(f) - d);
      truth.add(d);
    }
  }
  return ratio(diff.norm(), truth.norm());
}

void check_float32_reference(const ModelExport& m, const std::string& where) {
  auto check = [&](const std::string& ref_name, const std::string& truth_name, bool by_token) {
    const double err = mapped_rel_l2(m, ref_name, truth_name, by_token);
    if (!(err <= kFloat32ReferenceMost))
      throw InputError(fmt::format("{}: {}: transformers' own float32 result is no reference: rel_l2 {:.3g} against "
                                   "the float64 truth {} (expected at most {}, as the exporter writes), so no float32 "
                                   "result can be judged against it",
                                   where, ref_name, err, truth_name, kFloat32ReferenceMost));
  };
  for (int64_t k = m.first + 1; k <= m.last; ++k)
    check("hidden_float32." + std::to_string(k), "hidden." + std::to_string(k), true);
  if (m.has_head()) check("logits_float32", "logits", true);
  if (m.generate_steps) check("generation.logits_float32", "generation.logits", false);
}

// A tensor's elements at the real tokens (attention_mask 1), in order: its token axis is the one after
// the batch (B, T, ...: hidden states, most components) or after the heads (B, H, T, ...); one with neither
// is whole. A padding position is the model's arithmetic on no token: a padded query whose sliding window
// holds only padding sees no key, and transformers gives it uniform weights over whatever keys the call
// holds (all T in the full forward, the cached ones in a decode step); an engine that runs each sequence
// unpadded makes no such row at all.
std::vector<double> real_part(const DTensor& x, const ModelExport& m) {
  const Shape bt = ids_shape(m);
  const Shape& s = x.shape;
  int axis = -1;
  if (s.size() >= 2 && s[0] == bt[0] && s[1] == bt[1]) axis = 1;
  else if (s.size() >= 3 && s[0] == bt[0] && s[2] == bt[1]) axis = 2;
  if (axis < 0) return std::vector<double>(x.data.begin(), x.data.end());
  int64_t inner = 1;  // elements per step of the token axis
  for (size_t i = size_t(axis) + 1; i < s.size(); ++i) inner *= s[i];
  int64_t per_batch = 1;
  for (size_t i = 1; i < s.size(); ++i) per_batch *= s[i];
  const DTensor mask = m.tensors->tensor("attention_mask");
  std::vector<double> out;
  for (size_t i = 0; i < x.data.size(); ++i) {
    const int64_t b = int64_t(i) / per_batch, t = (int64_t(i) / inner) % bt[1];
    if (mask.data[size_t(b * bt[1] + t)] != 0) out.push_back(x.data[i]);
  }
  return out;
}

PositionStats stats(std::vector<double> v) {
  PositionStats s;
  if (v.empty()) return s;
  std::sort(v.begin(), v.end());
  double sum = 0;
  for (double x : v) sum += x;
  s.mean = sum / double(v.size());
  s.p99 = v[std::min(v.size() - 1, size_t(std::ceil(0.99 * double(v.size()))) - 1)];
  s.max = v.back();
  return s;
}

// The float32 bound on a hidden state (or logits) against the truth, from transformers' own float32
// error there: the component gates' rule (compare/noise.hpp) on its one sample, 2 x quantile(n_eff,
// 1) x rel_l2 + 4u, so that an error living in few elements (a massive activation) widens it as the
// noise model says it must.
// Logits are the head's image of the last hidden state: their error lives in as few independent
// elements as that state's, whatever their count, so `cap_n_eff` (the last layer's) caps theirs.
template <class A, class B>  // std::vector<double> or Storage<double>
double float32_bound(const A& ref, const B& truth, double* n_eff = nullptr,
                     double cap_n_eff = 0) {
  Tensor<double> a({int64_t(ref.size())}), b({int64_t(truth.size())});
  std::copy(ref.begin(), ref.end(), a.data.begin());
  std::copy(truth.begin(), truth.end(), b.data.begin());
  NoiseEstimate e = estimate_noise({{&a, &b}});
  if (cap_n_eff > 0 && e.n_eff > cap_n_eff) e.n_eff = cap_n_eff, e.quantile = noise_quantile(cap_n_eff, 1);
  if (n_eff) *n_eff = e.n_eff;
  return GatePolicy{}.numeric_factor * e.quantile * e.rms + GatePolicy{}.numeric_floor;
}

// log-softmax of a row, in double
std::vector<double> log_softmax(const double* x, int64_t V) {
  double mx = -std::numeric_limits<double>::infinity();
  for (int64_t i = 0; i < V; ++i) mx = std::max(mx, x[i]);
  double sum = 0;
  for (int64_t i = 0; i < V; ++i) sum += std::exp(x[i] - mx);
  const double lse = mx + std::log(sum);
  std::vector<double> out(static_cast<size_t>(V));
  for (int64_t i = 0; i < V; ++i) out[size_t(i)] = x[i] - lse;
  return out;
}

// KL(p || q) for logits rows p (the truth) and q
double kl(const double* p, const double* q, int64_t V) {
  const std::vector<double> lp = log_softmax(p, V), lq = log_softmax(q, V);
  double s = 0;
  for (int64_t i = 0; i < V; ++i) s += std::exp(lp[size_t(i)]) * (lp[size_t(i)] - lq[size_t(i)]);
  return std::isnan(s) ? s : std::max(0.0, s);  // a NaN row shows as NaN, never as 0
}

int64_t argmax(const double* x, int64_t V) { return int64_t(std::max_element(x, x + V) - x); }

// The top-2 margin of the truth's row.
double margin(const double* x, int64_t V) {
  double a = -std::numeric_limits<double>::infinity(), b = a;
  for (int64_t i = 0; i < V; ++i) {
    if (x[i] > a) b = a, a = x[i];
    else if (x[i] > b) b = x[i];
  }
  return a - b;
}

// The probability that noise like the reference's own float32 error (ref - truth, one sample over the
// vocabulary) flips the truth's argmax: the top two logits move by independent draws of the
// sample's spread sigma, so their difference by sigma sqrt(2); P(flip) = P(N(0, 2 sigma^2) > margin).
double p_flip(const double* truth, const double* ref, int64_t V) {
  double s = 0, s2 = 0;
  for (int64_t i = 0; i < V; ++i) {
    const double d = ref[i] - truth[i];
    s += d, s2 += d * d;
  }
  const double mean = s / double(V), var = std::max(0.0, s2 / double(V) - mean * mean);
  const double m = margin(truth, V);
  if (var == 0) return m == 0 ? 0.5 : 0.0;
  return 0.5 * std::erfc(m / (2.0 * std::sqrt(var)));
}

// ---- the hand core's head -------------------------------------------------------------------------

template <class T>
struct Head {
  std::string norm;
  T eps = 0;
  Tensor<T> norm_weight, norm_bias, lm_head;
  std::optional<double> softcap;
  int64_t C = 0, V = 0;
  // logits (N, V) of hidden states (N, C)
  Tensor<T> operator()(const T* h, int64_t N) const {
    Tensor<T> n({N, C}), logits({N, V});
    if (norm == "rms") rms_norm_forward(n.ptr(), h, norm_weight.ptr(), eps, N, C);
    else if (norm == "gemma_rms") gemma_rms_norm_forward(n.ptr(), h, norm_weight.ptr(), eps, N, C);
    else layernorm_forward(n.ptr(), h, norm_weight.ptr(), norm_bias.ptr(), eps, N, C);
    llm_linear(logits.ptr(), n.ptr(), lm_head.ptr(), static_cast<const T*>(nullptr), N, C, V);
    if (softcap)
      for (T& x : logits.data) x = T(*softcap) * std::tanh(x / T(*softcap));
    return logits;
  }
};

template <class T>
Head<T> head_of(const ModelExport& m) {
  Head<T> h;
  h.norm = m.final_norm;
  h.eps = T(m.final_norm_eps);
  h.norm_weight = to_tensor<T>(m.tensors->tensor("final_norm.weight"));
  if (m.final_norm == "layer") h.norm_bias = to_tensor<T>(m.tensors->tensor("final_norm.bias"));
  h.lm_head = to_tensor<T>(m.tensors->tensor("lm_head.weight"));
  h.softcap = m.logit_softcap;
  h.C = m.hidden, h.V = m.vocab;
  return h;
}

// ---- the layers -------------------------------------------------------------------------------------

// o.perturb_weight of layer p moved by Gaussian noise of relative size o.perturb_size (the hand core's
// copy of the problem). InputError naming --perturb when the layer has no such weight.
void perturb(Problem& p, const ModelOptions& o, int64_t layer) {
  if (o.perturb_weight.empty() || layer != o.perturb_layer) return;
  auto it = p.state_dict.find(o.perturb_weight);
  if (it == p.state_dict.end()) {
    std::string names;
    for (const auto& [n, _] : p.state_dict) names += (names.empty() ? "" : ", ") + n;
    throw InputError("model: --perturb: layer " + std::to_string(layer) + " has no weight " +
                     show_text(o.perturb_weight) + " (it has " + names + ")");
  }
  Storage<double>& w = it->second.data;
  Rng rng(uint64_t(layer) * 1000003u + 17);
  std::vector<double> d(w.size());
  double wn = 0, dn = 0;
  for (size_t i = 0; i < w.size(); ++i) d[i] = rng.normal(), wn += w[i] * w[i], dn += d[i] * d[i];
  // noise relative to an all-zero weight is none: the run would check the true weights, said moved
  if (!(wn > 0))
    throw InputError("model: --perturb: layer " + std::to_string(layer) + "'s " + show_text(o.perturb_weight) +
                     " is all zeros: noise of a size relative to it moves nothing (choose another weight)");
  const double scale = dn > 0 ? o.perturb_size * std::sqrt(wn / dn) : 0;
  for (size_t i = 0; i < w.size(); ++i) w[i] += scale * d[i];
}

// A defect that the layer's code never reads (another architecture's, the book's classes') plants
// nothing, and a run that passed was reported as one with it planted. Refused unless it moves the hand
// core's output on the layer's own inputs beyond rounding: float64 (or its KV-cache decode, where the
// cache's defects live) beyond the semantic gate, or float32 (the numeric defects) beyond the float32
// bound the chain judges this layer's output by (transformers' own float32 error there, made a bound):
// a move within it no check here could show. A defect that only takes another code path moves the last
// bits and no more (kv-repeat-interleaved on GPT-2's equal head counts: 560 of 1024 values, rel_l2 7e-8
// against a bound of 6e-7).
void require_effect(const ModelExport& m, const Problem& p, const ModelOptions& o, const ModelLayerEntry& e) {
  const int64_t T = ids_shape(m)[1];
  const bool decode = llm_module(p.module) && p.decode_steps == 0 && T > 1;
  auto output = [&](bool planted, DType dtype, bool decoding) {
    std::optional<ScopedDefect> d;
    if (planted) d.emplace(o.defect);
    Problem q = p;
    if (decoding) q.decode_steps = std::min<int64_t>(3, T - 1);
    const RunResult r = run_hand(q, dtype, false, e.fixture);
    auto it = r.outputs.find("output");
    if (it == r.outputs.end()) throw InputError(e.fixture + ": the layer returned no output");
    return real_part(it->second, m);
  };
  auto moved = [&](DType dtype, bool decoding) {
    return rel_l2(output(true, dtype, decoding), output(false, dtype, decoding));
  };
  const double full64 = moved(DType::Float64, false), full32 = moved(DType::Float32, false);
  const double decode64 = decode ? moved(DType::Float64, true) : 0;
  const std::string out = std::to_string(e.index + 1);
  const double bound32 = float32_bound(m.tensors->tensor("hidden_float32." + out).data,
                                       m.tensors->tensor("hidden." + out).data);
  if (full64 > o.policy.semantic_rel || decode64 > o.policy.semantic_rel || full32 > bound32) return;
  throw InputError(fmt::format(
      "model: --defect {}: changes nothing beyond rounding in layer {} (a {}: rel_l2 with it against without "
      "{:.2e} in float64, {:.2e} in float32 against the layer's float32 bound {:.2e}{}): not a defect of this "
      "architecture's code, or not one its inputs can show",
      defect_name(o.defect), e.index, module_name(p.module), full64, full32, bound32,
      decode ? fmt::format(", {:.2e} in the KV-cache decode", decode64) : std::string()));
}

// The hand core on the layer with o's perturbation (the reference's runs keep the true weights).
Implementation perturbed_hand_core(const ModelOptions& o, int64_t layer) {
  Implementation impl = hand_core();
  impl.run = [o, layer](const Problem& p, DType dtype, const Components* teacher) {
    Problem q = p;
    perturb(q, o, layer);
    return run_hand(q, dtype, true, q.origin, teacher);
  };
  return impl;
}

// The layer's hidden-state input and its name ("hidden_states"; "src" for an encoder layer).
std::string hidden_input(const Problem& p) { return p.input("hidden_states") ? "hidden_states" : "src"; }

// The layer's output on `x` (float64 or float32 values), the hand core in `dtype`.
DTensor run_layer(Problem& p, const DTensor& x, DType dtype, const std::string& where) {
  p.inputs[hidden_input(p)] = x;
  RunResult r = run_hand(p, dtype, false, where);
  auto it = r.outputs.find("output");
  if (it == r.outputs.end()) throw InputError(where + ": the layer returned no output");
  return it->second;
}

DTensor as_float32(DTensor t) {
  for (double& v : t.data) v = double(float(v));
  t.dtype = DType::Float32;
  return t;
}

void check_layer_fixture(const ModelExport& m, const Problem& p, const ModelLayerEntry& e) {
  if (module_name(p.module) != m.module)
    throw InputError(e.fixture + ": module: expected " + m.module + " (model.json's), got " + module_name(p.module));
  const DTensor* x = p.input(hidden_input(p));
  const Shape bt = ids_shape(m);
  if (!x || x->shape != Shape{bt[0], bt[1], m.hidden})
    throw InputError(e.fixture + ": inputs." + hidden_input(p) + ": expected shape " +
                     to_string(Shape{bt[0], bt[1], m.hidden}) + " (the model's tokens), got " +
                     (x ? to_string(x->shape) : std::string("nothing")));
  const DTensor truth = m.tensors->tensor("hidden." + std::to_string(e.index));
  if (x->data != truth.data)
    throw InputError(e.fixture + ": inputs." + hidden_input(p) + ": expected the truth's hidden." +
                     std::to_string(e.index) + " of model.safetensors, got other values");
}

// The logits' checks: hand64 and hand32 rows against the truth's, on the real positions.
ModelLogitsResult judge_logits(const ModelExport& m, const Storage<double>* l64, const Storage<double>& l32,
                                double cap_n_eff) {
  ModelLogitsResult r;
  r.present = true;
  const Shape bt = ids_shape(m);
  const int64_t V = m.vocab;
  const DTensor truth = m.tensors->tensor("logits"), ref = m.tensors->tensor("logits_float32");
  const DTensor mask = m.tensors->tensor("attention_mask");
  std::vector<double> t_real, h32_real, h64_real, r_real, kl32, klr;
  r.min_margin = std::numeric_limits<double>::infinity();
  for (int64_t b = 0; b < bt[0]; ++b)
    for (int64_t t = 0; t < bt[1]; ++t) {
      if (mask.data[size_t(b * bt[1] + t)] == 0) continue;
      const size_t o = size_t((b * bt[1] + t) * V);
      const double* tr = truth.data.data() + o;
      ++r.positions;
      t_real.insert(t_real.end(), tr, tr + V);
      h32_real.insert(h32_real.end(), l32.data() + o, l32.data() + o + V);
      r_real.insert(r_real.end(), ref.data.data() + o, ref.data.data() + o + V);
      kl32.push_back(kl(tr, l32.data() + o, V));
      klr.push_back(kl(tr, ref.data.data() + o, V));
      const int64_t top = argmax(tr, V);
      const double pf = p_flip(tr, ref.data.data() + o, V);
      r.expected_flips += pf;
      r.min_margin = std::min(r.min_margin, margin(tr, V));
      r.top1_ref += argmax(ref.data.data() + o, V) == top;
      const int64_t g32 = argmax(l32.data() + o, V);
      r.top1_32 += g32 == top;
      if (g32 != top) r.flips32.push_back({b, t, top, g32, margin(tr, V), pf, pf >= kFlipExplained});
      if (l64) {
        h64_real.insert(h64_real.end(), l64->data() + o, l64->data() + o + V);
        const int64_t g64 = argmax(l64->data() + o, V);
        r.top1_64 += g64 == top;
        if (g64 != top) r.flips64.push_back({b, t, top, g64, margin(tr, V), 0.0, false});
      }
    }
  r.rel32 = rel_l2(h32_real, t_real);
  r.ref32 = rel_l2(r_real, t_real);
  r.has64 = l64 != nullptr;
  if (l64) r.rel64 = rel_l2(h64_real, t_real);
  r.kl32 = stats(kl32);
  r.kl_ref = stats(klr);
  r.bound32 = float32_bound(r_real, t_real, &r.n_eff, cap_n_eff);
  r.pass = r.rel32 <= r.bound32;
  if (l64) r.pass = r.pass && r.rel64 <= GatePolicy{}.semantic_rel && r.flips64.empty();
  for (const ModelFlip& f : r.flips32) r.pass = r.pass && f.explained;
  return r;
}

// ---- greedy generation --------------------------------------------------------------------------------

// The hand core's greedy tokens and each step's logits (N, V), widened to double.
struct Generated {
  std::vector<int64_t> tokens;
  std::vector<double> logits;
};

template <class T>
Generated generate(const ModelExport& m, const ModelOptions& o) {
  const int64_t P = m.prompt_length, N = m.generate_steps, C = m.hidden, V = m.vocab;
  const DTensor ids = m.tensors->tensor("generation.ids");
  const bool gpt2 = m.architecture == "gpt2";
  const Tensor<T> wte = to_tensor<T>(m.tensors->tensor(gpt2 ? "wte.weight" : "embed_tokens.weight"));
  Tensor<T> wpe;
  if (gpt2) wpe = to_tensor<T>(m.tensors->tensor("wpe.weight"));
  // Gemma 2 scales the embeddings by sqrt(hidden), the factor rounded to the model's dtype.
  const T scale = m.architecture == "gemma2" ? T(std::sqrt(double(C))) : T(1);
  auto embed = [&](const std::vector<int64_t>& tok, int64_t pos0) {
    Tensor<T> x({1, int64_t(tok.size()), C});
    for (size_t i = 0; i < tok.size(); ++i)
      for (int64_t c = 0; c < C; ++c) {
        T v = wte.data[size_t(tok[i] * C + c)];
        if (gpt2) v += wpe.data[size_t((pos0 + int64_t(i)) * C + c)];
        x.data[i * size_t(C) + size_t(c)] = v * scale;
      }
    return x;
  };
  std::vector<LlmLayerCall<T>> calls;
  std::vector<KvCache<T>> caches;
  for (const ModelLayerEntry& e : m.layers) {
    Problem p = read_fixture(e.fixture, false);
    perturb(p, o, e.index);
    calls.push_back(llm_layer_call<T>(p));
    const auto [Hkv, D] = llm_cache_heads(p);
    caches.push_back(make_cache<T>(1, Hkv, P + N, D));
  }
  const Head<T> head = head_of<T>(m);
  std::vector<int64_t> tokens(ids.data.begin(), ids.data.begin() + P), out;
  std::vector<int64_t> positions;
  Generated g;
  for (int64_t s = 0; s < N; ++s) {
    const int64_t pos0 = s == 0 ? 0 : P + s - 1;
    std::vector<int64_t> step = s == 0 ? tokens : std::vector<int64_t>{out.back()};
    Tensor<T> x = embed(step, pos0);
    positions.resize(step.size());
    for (size_t i = 0; i < step.size(); ++i) positions[i] = pos0 + int64_t(i);
    DecoderMask mask;
    mask.positions = positions.data();
    mask.positions_stride = int64_t(step.size());
    for (size_t l = 0; l < calls.size(); ++l) {
      const bool planted = o.defect != Defect::None && m.layers[l].index == o.defect_layer;
      std::optional<ScopedDefect> d;
      if (planted) d.emplace(o.defect);
      x = calls[l](x, mask, &caches[l]);
    }
    const int64_t L = x.size(1);
    const Tensor<T> logits = head(x.ptr() + (L - 1) * C, 1);
    out.push_back(int64_t(std::max_element(logits.data.begin(), logits.data.end()) - logits.data.begin()));
    g.logits.insert(g.logits.end(), logits.data.begin(), logits.data.end());
  }
  (void)V;
  g.tokens = out;
  return g;
}

ModelGenerationResult judge_generation(const ModelExport& m, const ModelOptions& o, double cap_n_eff) {
  ModelGenerationResult g;
  g.present = true;
  g.steps = m.generate_steps;
  g.prompt_length = m.prompt_length;
  const DTensor ids = m.tensors->tensor("generation.ids");
  g.truth.assign(ids.data.begin() + m.prompt_length, ids.data.end());
  const DTensor ref = m.tensors->tensor("generation.tokens_float32");
  g.ref32.assign(ref.data.begin(), ref.data.end());
  const Generated h64 = generate<double>(m, o), h32 = generate<float>(m, o);
  g.hand64 = h64.tokens;
  g.hand32 = h32.tokens;
  const DTensor lt = m.tensors->tensor("generation.logits"), lr = m.tensors->tensor("generation.logits_float32");
  const int64_t V = m.vocab;
  // Each step's logits while the tokens so far are the truth's (the same inputs as the truth's step):
  // float64 at the semantic bound, float32 against transformers' own float32 logits at that step.
  auto steps_rel = [&](const Generated& h) {
    size_t n = 0;
    while (n < h.tokens.size() && h.tokens[n] == g.truth[n]) ++n;
    n = std::min(size_t(g.steps), n + 1);  // the first differing step's inputs are still the truth's
    const std::vector<double> a(h.logits.begin(), h.logits.begin() + long(n * size_t(V))),
        b(lt.data.begin(), lt.data.begin() + long(n * size_t(V))), r(lr.data.begin(), lr.data.begin() + long(n * size_t(V)));
    return std::make_tuple(rel_l2(a, b), rel_l2(r, b), float32_bound(r, b, nullptr, cap_n_eff));
  };
  std::tie(g.logits64, std::ignore, std::ignore) = steps_rel(h64);
  std::tie(g.logits32, g.logits_ref, g.logits_bound) = steps_rel(h32);
  auto first_diff = [&](const std::vector<int64_t>& v) {
    for (size_t i = 0; i < v.size(); ++i)
      if (v[i] != g.truth[i]) return int64_t(i);
    return int64_t(-1);
  };
  g.first64 = first_diff(g.hand64);
  g.first32 = first_diff(g.hand32);
  g.first_ref = first_diff(g.ref32);
  auto at = [&](int64_t s, double& mg, double& pf) {
    const double* tr = lt.data.data() + s * V;
    mg = margin(tr, V);
    pf = p_flip(tr, lr.data.data() + s * V, V);
  };
  if (g.first64 >= 0) at(g.first64, g.margin64, g.p_flip64);
  if (g.first32 >= 0) at(g.first32, g.margin32, g.p_flip32);
  // float64 must give the truth's tokens; a float32 token may differ only where the reference's own
  // float32 noise would flip it too.
  g.pass = g.first64 < 0 && (g.first32 < 0 || g.p_flip32 >= kFlipExplained) &&
           g.logits64 <= GatePolicy{}.semantic_rel && g.logits32 <= g.logits_bound;
  return g;
}

void decide(ModelReport& r) {
  r.first_layer = -1;
  for (const ModelLayerResult& l : r.layers)
    if (!l.local_pass) {
      r.first_layer = l.index;
      r.first_detail = "layer " + std::to_string(l.index) + ": " +
                       (l.local_divergence.empty() ? std::string("its own check fails")
                                                   : l.local_divergence + " (on the reference's own inputs: made here)");
      break;
    }
  if (r.first_layer < 0)
    for (const ModelLayerResult& l : r.layers)
      if (!l.chain_pass) {
        r.first_layer = l.index;
        r.first_detail = fmt::format(
            "layer {}: the float32 chain {:.2e} > {:.2e} ({:.1f}x transformers' own float32 error at this depth), every "
            "layer's own check passing: grown from below",
            l.index, l.chain32, l.bound32, l.ref32 > 0 ? l.chain32 / l.ref32 : 0.0);
        break;
      }
  r.pass = r.first_layer < 0;
  for (const ModelLayerResult& l : r.layers) r.pass = r.pass && l.local_pass && l.chain_pass;
  if (r.logits.present) r.pass = r.pass && r.logits.pass;
  if (r.generation.present) r.pass = r.pass && r.generation.pass;
}

nlohmann::json model_config(const ModelExport& m) {
  const Shape bt = ids_shape(m);
  return {{"architecture", m.architecture}, {"module", m.module}, {"checkpoint", m.checkpoint},
          {"num_hidden_layers", m.num_layers}, {"hidden_size", m.hidden}, {"vocab_size", m.vocab},
          {"slice", {m.first, m.last}}, {"batch", bt[0]}, {"tokens", bt[1]}, {"export_reference", m.reference}};
}

}  // namespace

ModelReport check_model(const ModelExport& m, const ModelOptions& o) {
  ModelReport r;
  r.name = m.name;
  r.description = m.description;
  r.config = model_config(m);
  r.reference = reference_info();
  DTensor h64 = m.tensors->tensor("hidden." + std::to_string(m.first));
  DTensor h32 = as_float32(h64);
  for (const ModelLayerEntry& e : m.layers) {
    ModelLayerResult l;
    l.index = e.index;
    Problem p = read_fixture(e.fixture);
    check_layer_fixture(m, p, e);
    std::optional<ScopedDefect> planted;
    if (o.defect != Defect::None && e.index == o.defect_layer) {
      require_effect(m, p, o, e);
      planted.emplace(o.defect);
    }
    if (o.local) {
      l.local = e.index == o.perturb_layer ? check_fixture(p, e.fixture, o.policy, perturbed_hand_core(o, e.index))
                                           : check_fixture(p, e.fixture, o.policy);
      for (const CaseReport& c : l.local) {
        l.local_pass = l.local_pass && c.pass;
        if (l.local_divergence.empty() && !c.first_divergence.empty()) l.local_divergence = c.first_divergence;
      }
      if (!l.local_pass && l.local_divergence.empty())
        for (const CaseReport& c : l.local)
          if (!c.failures.empty()) {
            l.local_divergence = c.failures.front().component;
            break;
          }
    }
    // From here on the hand core's own runs: the perturbed weight, when one is asked for.
    const DTensor truth_out = p.outputs.count("output") ? p.outputs.at("output") : DTensor{};
    perturb(p, o, e.index);
    // A decoder layer's KV-cache path: the last tokens one call each after a prefill of the others
    // (decode_session) must give the full forward's rows, the truth's output, in float64.
    const int64_t Tn = ids_shape(m)[1];
    if (llm_module(p.module) && p.decode_steps == 0 && Tn > 1 && !truth_out.data.empty()) {
      p.decode_steps = std::min<int64_t>(3, Tn - 1);
      const RunResult d = run_hand(p, DType::Float64, false, e.fixture + " (decode)");
      p.decode_steps = 0;
      l.decode64 = rel_l2(real_part(d.outputs.at("output"), m), real_part(truth_out, m));
      if (l.decode64 > o.policy.semantic_rel) {
        l.local_pass = false;
        if (l.local_divergence.empty())
          l.local_divergence = fmt::format("decode (KV cache, rel_l2 {:.2e} from the full forward)", l.decode64);
      }
    }
    // The chain: the hand core's own hidden states, from the truth's at the slice's start.
    p.outputs.clear(), p.outputs_float32.clear(), p.components.clear(), p.components_float32.clear();
    const std::string where = e.fixture + " (the chain)";
    h64 = run_layer(p, h64, DType::Float64, where);
    h32 = run_layer(p, h32, DType::Float32, where);
    const std::string k = std::to_string(e.index + 1);
    const DTensor truth = m.tensors->tensor("hidden." + k), ref = m.tensors->tensor("hidden_float32." + k);
    l.chain64 = rel_l2(h64.data, truth.data);
    l.chain32 = rel_l2(h32.data, truth.data);
    l.ref32 = rel_l2(ref.data, truth.data);
    l.bound32 = float32_bound(ref.data, truth.data, &l.n_eff);
    l.chain_pass = l.chain64 <= o.policy.semantic_rel && l.chain32 <= l.bound32;
    r.layers.push_back(std::move(l));
  }
  if (m.has_head()) {
    const Shape bt = ids_shape(m);
    const int64_t N = bt[0] * bt[1];
    const Tensor<double> l64 = head_of<double>(m)(Tensor<double>(to_tensor<double>(h64)).ptr(), N);
    const Tensor<float> f32 = to_tensor<float>(h32);
    const Tensor<float> l32f = head_of<float>(m)(f32.ptr(), N);
    const Storage<double> l32(l32f.data.begin(), l32f.data.end());
    r.logits = judge_logits(m, &l64.data, l32, r.layers.back().n_eff);
  }
  if (m.generate_steps && o.generate) r.generation = judge_generation(m, o, r.layers.back().n_eff);
  if (o.defect != Defect::None)
    r.notes.push_back("defect " + defect_name(o.defect) + " planted in the hand core at layer " +
                      std::to_string(o.defect_layer));
  if (!o.perturb_weight.empty())
    r.notes.push_back(fmt::format("layer {}'s {} moved by Gaussian noise of relative size {:g} in the hand core",
                                  o.perturb_layer, o.perturb_weight, o.perturb_size));
  if (m.unused_count > 0) r.notes.push_back(unused_note(m));
  decide(r);
  return r;
}

ModelReport judge_dump(const ModelExport& m, const std::string& dump) {
  ModelReport r;
  r.name = m.name;
  r.description = m.description;
  r.config = model_config(m);
  r.dump = dump;
  const SafetensorsFile d = SafetensorsFile::open(dump);
  const Shape bt = ids_shape(m);
  const Shape btc{bt[0], bt[1], m.hidden};
  // Every name must be one this export knows: logits, or layers.N.<name> with N a layer of the slice,
  // written as the export writes it (no leading zeros), float32 or float64 (what an engine computed in).
  std::set<std::string> slice;
  for (const ModelLayerEntry& e : m.layers) slice.insert(std::to_string(e.index));
  const std::string slice_text = m.layers.empty() ? std::string("none")
                                                  : fmt::format("{} to {}", m.layers.front().index, m.layers.back().index);
  for (const StEntry& e : d.entries()) {
    if (e.dtype != StDType::F32 && e.dtype != StDType::F64)
      throw InputError(dump + ": " + show_text(e.name) + ": expected float32 or float64 (F32, F64), got " +
                       st_dtype_name(e.dtype));
    if (e.name == "logits") continue;
    const size_t dot = e.name.find('.', 7);
    const bool layer = e.name.rfind("layers.", 0) == 0 && dot != std::string::npos && dot + 1 < e.name.size() &&
                       slice.count(e.name.substr(7, dot - 7));
    if (!layer)
      throw InputError(dump + ": " + show_text(e.name) +
                       ": expected layers.N.<component> or layers.N.output with N a layer of the export's slice (" +
                       slice_text + "), or logits");
  }
  // A layer's output for every layer of the slice, or for none (the logits alone): a layer left out
  // would show as judged. Its components are looked at only beside its output.
  const ModelLayerEntry* with_output = nullptr;
  const ModelLayerEntry* without_output = nullptr;
  for (const ModelLayerEntry& e : m.layers) {
    const ModelLayerEntry*& which = d.find("layers." + std::to_string(e.index) + ".output") ? with_output : without_output;
    if (!which) which = &e;  // the first of each
  }
  if (with_output && without_output)
    throw InputError(fmt::format("{}: layers.{}.output: missing; expected the output of every layer of the export's "
                                 "slice ({}), or of none (the logits alone), as layers.{}.output is there",
                                 dump, without_output->index, slice_text, with_output->index));
  if (!with_output)
    for (const StEntry& e : d.entries())
      if (e.name != "logits")
        throw InputError(dump + ": " + show_text(e.name) + ": a layer's components are judged beside its output, and " +
                         "the dump holds no layers.N.output");
  for (const ModelLayerEntry& e : m.layers) {
    if (!with_output) break;  // the logits alone: no layer judged, none shown as judged
    ModelLayerResult l;
    l.index = e.index;
    const std::string pre = "layers." + std::to_string(e.index) + ".";
    // The engine's components of this layer, against the truth's on the truth's input (measured,
    // not gated: the engine's own input differs from the truth's by its error from below).
    Problem p = read_fixture(e.fixture);
    check_layer_fixture(m, p, e);
    for (const StEntry& s : d.entries()) {
      if (s.name.rfind(pre, 0) != 0 || s.name == pre + "output") continue;
      const std::string c = s.name.substr(pre.size());
      auto it = p.components.find(c);
      if (it == p.components.end())
        throw InputError(dump + ": " + s.name + ": " + m.module + " has no component " + show_text(c) +
                         " (tparity components --fixture " + e.fixture + " lists them)");
      if (s.shape != it->second.shape)
        throw InputError(dump + ": " + s.name + ": expected shape " + to_string(it->second.shape) + ", got " +
                         to_string(s.shape));
    }
    if (const StEntry* out = d.find(pre + "output")) {
      if (out->shape != btc)
        throw InputError(dump + ": " + pre + "output: expected shape " + to_string(btc) + ", got " + to_string(out->shape));
      const DTensor got = d.tensor(pre + "output");
      const std::string k = std::to_string(e.index + 1);
      // on the real tokens only, as the logits: what an engine writes at padding is not judged
      const std::vector<double> truth = real_part(m.tensors->tensor("hidden." + k), m),
                                ref = real_part(m.tensors->tensor("hidden_float32." + k), m);
      const double err = rel_l2(real_part(got, m), truth);
      l.ref32 = rel_l2(ref, truth);
      if (got.dtype == DType::Float64) {
        l.chain64 = err;
        l.bound32 = GatePolicy{}.semantic_rel;
        l.chain_pass = err <= l.bound32;
      } else {
        l.chain32 = err;
        l.bound32 = float32_bound(ref, truth, &l.n_eff);
        l.chain_pass = err <= l.bound32;
      }
      if (!l.chain_pass) {
        // Name the first component (dataflow order) whose error is past the bound too, on the real tokens.
        for (const std::string& c : component_names(p)) {
          if (!d.find(pre + c)) continue;
          auto it = p.components.find(c);
          if (it == p.components.end()) continue;
          const double ce = rel_l2(real_part(d.tensor(pre + c), m), real_part(it->second, m));
          if (ce > l.bound32) {
            l.local_divergence = c;
            break;
          }
        }
      }
    }
    r.layers.push_back(std::move(l));
  }
  if (d.find("logits")) {
    if (!m.has_head()) throw InputError(dump + ": logits: the export holds no logits to judge them by");
    const StEntry* e = d.find("logits");
    if (e->shape != Shape{bt[0], bt[1], m.vocab})
      throw InputError(dump + ": logits: expected shape " + to_string(Shape{bt[0], bt[1], m.vocab}) + ", got " +
                       to_string(e->shape));
    const DTensor got = d.tensor("logits");
    // The last layer's n_eff of transformers' own float32 error caps the logits' (as the hand core's).
    double cap = 0;
    {
      const std::string k = std::to_string(m.last);
      (void)float32_bound(m.tensors->tensor("hidden_float32." + k).data, m.tensors->tensor("hidden." + k).data, &cap);
    }
    r.logits = judge_logits(m, got.dtype == DType::Float64 ? &got.data : nullptr, got.data, cap);
  }
  if (!with_output && !r.logits.present)
    throw InputError(dump + ": expected layers.N.output tensors or logits, got none of them");
  r.first_layer = -1;
  for (const ModelLayerResult& l : r.layers)
    if (!l.chain_pass) {
      r.first_layer = l.index;
      r.first_detail = fmt::format("layer {}: output {:.2e} > {:.2e}", l.index, std::max(l.chain32, l.chain64), l.bound32) +
                       (l.local_divergence.empty() ? "" : "; first component past it: " + l.local_divergence);
      break;
    }
  r.pass = r.first_layer < 0 && (!r.logits.present || r.logits.pass);
  r.notes.push_back("an engine's dump: each layer's output judged against transformers' own float32 chain at its "
                    "depth (2 x quantile(n_eff) x its rel_l2 + 4u), float64 dumps at 1e-10");
  if (!with_output) r.notes.push_back("the dump holds no layer's output: its logits alone judged");
  if (m.unused_count > 0) r.notes.push_back(unused_note(m));
  return r;
}

// ---- rendering ---------------------------------------------------------------------------------------

std::string render_model(const ModelReport& r, bool full) {
  // (the description is the export's text: escaped, so that it holds no line or terminal control of its own)
  std::string s = fmt::format("model {}: {}\n", r.name, show_text(r.description, 400));
  if (!r.dump.empty())
    s += "  judging the engine's dump " + show_text(r.dump, 400) + " (h64 / h32: its float64 / float32 outputs)\n";
  s += fmt::format("  {:>5}  {:<6} {:<28} {:>10} {:>10} {:>10} {:>10} {:>6} {:>6}  {}\n", "layer", "local",
                   "first divergence", "chain h64", "chain h32", "bound", "t32 own", "n_eff", "ratio", "verdict");
  for (const ModelLayerResult& l : r.layers) {
    const bool judged_local = !l.local.empty();
    s += fmt::format("  {:>5}  {:<6} {:<28} {:>10.2e} {:>10.2e} {:>10.2e} {:>10.2e} {:>6.0f} {:>6.2f}  {}\n", l.index,
                     judged_local ? (l.local_pass ? "PASS" : "FAIL") : "-",
                     l.local_divergence.empty() ? "-" : l.local_divergence, l.chain64, l.chain32, l.bound32, l.ref32,
                     l.n_eff, l.ref32 > 0 ? l.chain32 / l.ref32 : 0.0, l.local_pass && l.chain_pass ? "PASS" : "FAIL");
  }
  if (r.logits.present) {
    const ModelLogitsResult& g = r.logits;
    s += fmt::format(
        "  logits ({} positions): h64 rel_l2 {}; h32 rel_l2 {:.2e} <= {:.2e} (transformers' float32 {:.2e}, n_eff "
        "{:.0f}); KL(truth||h32) mean {:.2e} p99 {:.2e} max {:.2e} (transformers' float32: mean {:.2e} max {:.2e})\n",
        g.positions, g.has64 ? fmt::format("{:.2e}", g.rel64) : std::string("-"), g.rel32, g.bound32, g.ref32, g.n_eff,
        g.kl32.mean, g.kl32.p99, g.kl32.max, g.kl_ref.mean, g.kl_ref.max);
    s += fmt::format(
        "  top-1: h32 {}/{} h64 {}/{} (transformers' float32 {}/{}); expected flips from the reference's own float32 "
        "noise {:.3g}; smallest top-2 margin {:.3g}\n",
        g.top1_32, g.positions, g.has64 ? std::to_string(g.top1_64) : std::string("-"), g.positions, g.top1_ref,
        g.positions, g.expected_flips, g.min_margin);
    for (const ModelFlip& f : g.flips32)
      s += fmt::format("  flip h32 at prompt {} token {}: {} instead of {}, margin {:.3g}, P(reference's noise flips "
                       "it) {:.2e}: {}\n",
                       f.batch, f.position, f.got, f.truth, f.margin, f.p_flip,
                       f.explained ? "explained by the noise" : "NOT explained by the noise");
    for (const ModelFlip& f : g.flips64)
      s += fmt::format("  flip h64 at prompt {} token {}: {} instead of {}, margin {:.3g}: float64 must not flip\n",
                       f.batch, f.position, f.got, f.truth, f.margin);
  }
  if (r.generation.present) {
    const ModelGenerationResult& g = r.generation;
    auto same = [&](const std::vector<int64_t>& v, int64_t first) {
      return first < 0 ? fmt::format("{}/{} the truth's", v.size(), g.steps)
                       : fmt::format("first differs at token {} ({} instead of {})", first, v[size_t(first)],
                                     g.truth[size_t(first)]);
    };
    s += fmt::format("  greedy generation, {} tokens after a prompt of {}: h64 {}; h32 {}; transformers' float32 {}\n",
                     g.steps, g.prompt_length, same(g.hand64, g.first64), same(g.hand32, g.first32),
                     same(g.ref32, g.first_ref));
    s += fmt::format("  the steps' logits (KV cache) while the tokens agree: h64 rel_l2 {:.2e}; h32 {:.2e} <= {:.2e} "
                     "(transformers' float32 {:.2e})\n",
                     g.logits64, g.logits32, g.logits_bound, g.logits_ref);
    if (g.first32 >= 0)
      s += fmt::format("  h32's first different token: the truth's margin {:.3g}, P(reference's noise flips it) {:.2e}: "
                       "{}\n",
                       g.margin32, g.p_flip32,
                       g.p_flip32 >= kFlipExplained ? "explained by the noise" : "NOT explained by the noise");
  }
  for (const std::string& n : r.notes) s += "  note: " + n + "\n";
  if (full)
    for (const ModelLayerResult& l : r.layers)
      for (const CaseReport& c : l.local) s += render_table(c);
  else
    for (const ModelLayerResult& l : r.layers)
      for (const CaseReport& c : l.local)
        if (!c.pass) s += render_findings(c);
  double worst = 0;
  int64_t worst_layer = -1;
  for (const ModelLayerResult& l : r.layers)
    if (l.ref32 > 0 && l.chain32 / l.ref32 > worst) worst = l.chain32 / l.ref32, worst_layer = l.index;
  if (r.pass && r.layers.empty())
    s += fmt::format("PASS  model {}  its logits (no layer judged)\n", r.name);
  else if (r.pass)
    s += fmt::format("PASS  model {}  worst: layer {} chain {:.1f}x transformers' own float32 error\n", r.name,
                     worst_layer, worst);
  else
    s += fmt::format("FAIL  model {}  first diverging {}\n", r.name,
                     r.first_layer >= 0 ? r.first_detail
                     : r.logits.present && !r.logits.pass ? std::string("at the logits")
                                                          : std::string("in greedy generation"));
  return s;
}

nlohmann::json to_json(const ModelReport& r) {
  nlohmann::json layers = nlohmann::json::array();
  for (const ModelLayerResult& l : r.layers) {
    nlohmann::json local = nlohmann::json::array();
    for (const CaseReport& c : l.local) local.push_back(to_json(c));
    layers.push_back({{"index", l.index}, {"local_pass", l.local_pass},
                      {"local_first_divergence", l.local_divergence.empty() ? nlohmann::json() : nlohmann::json(l.local_divergence)},
                      {"decode_float64_rel_l2", l.decode64}, {"chain_float64_rel_l2", l.chain64}, {"chain_float32_rel_l2", l.chain32},
                      {"reference_float32_rel_l2", l.ref32}, {"chain_float32_bound", l.bound32}, {"n_eff", l.n_eff},
                      {"chain_pass", l.chain_pass}, {"local", local}});
  }
  nlohmann::json j = {{"name", r.name}, {"description", r.description}, {"config", r.config},
                      {"reference", to_json(r.reference)}, {"layers", layers}, {"pass", r.pass},
                      {"first_diverging_layer", r.first_layer >= 0 ? nlohmann::json(r.first_layer) : nlohmann::json()},
                      {"first_diverging", r.first_detail}, {"notes", r.notes},
                      {"dump", r.dump.empty() ? nlohmann::json() : nlohmann::json(r.dump)}};
  if (r.logits.present) {
    const ModelLogitsResult& g = r.logits;
    auto st = [](const PositionStats& p) { return nlohmann::json{{"mean", p.mean}, {"p99", p.p99}, {"max", p.max}}; };
    auto flips = [](const std::vector<ModelFlip>& v) {
      nlohmann::json a = nlohmann::json::array();
      for (const ModelFlip& f : v)
        a.push_back({{"prompt", f.batch}, {"position", f.position}, {"truth", f.truth}, {"got", f.got},
                     {"margin", f.margin}, {"p_flip", f.p_flip}, {"explained", f.explained}});
      return a;
    };
    j["logits"] = {{"positions", g.positions}, {"float64_rel_l2", g.rel64}, {"float32_rel_l2", g.rel32},
                   {"float32_bound", g.bound32}, {"n_eff", g.n_eff},
                   {"reference_float32_rel_l2", g.ref32}, {"kl_float32", st(g.kl32)}, {"kl_reference_float32", st(g.kl_ref)},
                   {"top1_float32", g.top1_32}, {"top1_float64", g.top1_64}, {"top1_reference_float32", g.top1_ref},
                   {"expected_flips", g.expected_flips}, {"min_margin", g.min_margin},
                   {"flips_float32", flips(g.flips32)}, {"flips_float64", flips(g.flips64)}, {"pass", g.pass}};
  }
  if (r.generation.present) {
    const ModelGenerationResult& g = r.generation;
    auto first = [](int64_t f) { return f >= 0 ? nlohmann::json(f) : nlohmann::json(); };
    j["generation"] = {{"steps", g.steps}, {"prompt_length", g.prompt_length}, {"truth", g.truth},
                       {"float64", g.hand64}, {"float32", g.hand32}, {"reference_float32", g.ref32},
                       {"first_diff_float64", first(g.first64)}, {"first_diff_float32", first(g.first32)},
                       {"first_diff_reference_float32", first(g.first_ref)}, {"margin_float32", g.margin32},
                       {"p_flip_float32", g.p_flip32}, {"logits_float64_rel_l2", g.logits64},
                       {"logits_float32_rel_l2", g.logits32}, {"logits_reference_float32_rel_l2", g.logits_ref},
                       {"logits_float32_bound", g.logits_bound},
                       {"pass", g.pass}};
  }
  return j;
}

}  // namespace tparity
