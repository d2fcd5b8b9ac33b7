#include "tparity/eval/evaluate.hpp"

#include <fmt/format.h>

#include <cmath>
#include <cstring>
#include <functional>
#include <map>
#include <memory>
#include <stdexcept>
#include <utility>

#include "tparity/harness/hand.hpp"
#include "tparity/torch/reference.hpp"

namespace tparity {

namespace detail {

// LibTorch's float32 error sampled further, on jittered copies of the problem (noise.hpp): pairs
// (float32, float64) of its runs.
struct NoiseRuns {
  std::vector<std::shared_ptr<const TorchRun>> f32, f64;  // sample k at [k - 1]
};

// The noise model's runs of one problem and view (none when the plain sample said enough), and the
// noise legs measured on them.
struct NoiseEntry {
  NoiseRuns runs;
  NoiseLegMemo legs;
};

// The live ReferenceMemo's (evaluate.hpp). Keys: fingerprint() below.
struct MemoState {
  std::map<std::string, std::shared_ptr<const TorchRun>> runs;  // by problem and precision
  std::map<std::string, NoiseEntry> noise;  // by problem, policy, view and the components judged
  size_t hits = 0, misses = 0;              // runs served from the memo, runs LibTorch made
};

}  // namespace detail

namespace {

using detail::NoiseRuns;

Components outputs_as_components(const TensorMap& outs) {
  Components c;
  for (const char* n : {"output", "attn_weights"})
    if (auto it = outs.find(n); it != outs.end()) c.push_back({n, to_tensor<double>(it->second)});
  return c;
}

// "output" (and MultiheadAttention's "attn_weights") are the module's, in its layout, not the
// components of those names; another module's attn_weights is a component like any other.
bool is_output(const Problem& p, const std::string& n) {
  return n == "output" || (n == "attn_weights" && p.module == ModuleKind::MultiheadAttention);
}

// A run's components other than the outputs, then its outputs in the module's layout.
Components with_outputs(const Problem& p, const RunResult& run) {
  Components c;
  for (const Component& x : run.components)
    if (!is_output(p, x.name)) c.push_back(x);
  for (const Component& o : outputs_as_components(run.outputs)) c.push_back(o);
  return c;
}

// The live ReferenceMemo's state, if one lives. One thread evaluates at a time (the selftest's loop);
// nothing here is synchronised.
detail::MemoState* memo = nullptr;

// What a LibTorch run depends on: the problem's name, module kind and config, MultiheadAttention's
// forward options, its semantics, every state_dict and input tensor (each map tagged and counted,
// each tensor's name, dtype, rank, shape and bits, hashed), and the precision. Equal keys, equal runs.
std::string fingerprint(const Problem& p, DType dtype) {
  uint64_t h = 0x9e3779b97f4a7c15ULL;
  auto mix = [&h](uint64_t w) {
    h ^= w + 0x9e3779b97f4a7c15ULL + (h << 6) + (h >> 2);
    h *= 0xff51afd7ed558ccdULL;
    h ^= h >> 33;
  };
  uint64_t section = 0;
  for (const TensorMap* m : {&p.state_dict, &p.inputs}) {
    mix(++section), mix(m->size());
    for (const auto& [name, t] : *m) {
      mix(name.size());
      for (char c : name) mix(uint64_t(uint8_t(c)));
      mix(uint64_t(t.dtype)), mix(t.shape.size());
      for (int64_t d : t.shape) mix(uint64_t(d));
      mix(t.data.size());
      // The values in four independent chains (one chain's multiply waits on the last: a selftest spent
      // 8% of its time here), folded in at the end.
      uint64_t lane[4] = {1, 2, 3, 4};
      const size_t n = t.data.size(), n4 = n - n % 4;
      for (size_t i = 0; i < n4; i += 4)
        for (int j = 0; j < 4; ++j) {
          uint64_t bits;
          std::memcpy(&bits, &t.data[i + size_t(j)], sizeof bits);
          lane[j] = (lane[j] ^ bits) * 0xff51afd7ed558ccdULL;
          lane[j] ^= lane[j] >> 33;
        }
      for (size_t i = n4; i < n; ++i) {
        uint64_t bits;
        std::memcpy(&bits, &t.data[i], sizeof bits);
        mix(bits);
      }
      for (uint64_t w : lane) mix(w);
    }
  }
  return fmt::format("{}\n{}\n{}\nneed_weights {} average {}\n{}\n{}\n{:016x}", p.name, module_name(p.module),
                     config_json(p).dump(), p.forward.need_weights, p.forward.average_attn_weights,
                     p.semantics ? semantics_name(*p.semantics) : "unset", dtype_name(dtype), h);
}

// LibTorch's run of a problem with its components, shared with the live memo, from it when it ran
// before.
std::shared_ptr<const TorchRun> reference_run(const Problem& p, DType dtype, const std::string& where) {
  if (!memo) return std::make_shared<const TorchRun>(run_torch(p, dtype, true, where));
  std::string key = fingerprint(p, dtype);
  if (auto it = memo->runs.find(key); it != memo->runs.end()) {
    ++memo->hits;
    return it->second;
  }
  auto run = std::make_shared<const TorchRun>(run_torch(p, dtype, true, where));
  memo->runs.emplace(std::move(key), run);
  ++memo->misses;
  return run;
}

// NaN and infinities in the weights and inputs are allowed (the comparator classifies them before
// any norm), but never silently: one note per tensor that holds them. A -inf in a float mask is the
// mask's ordinary "masked out" and is not reported.
void add_nonfinite_notes(CaseReport& r, const Problem& p) {
  auto scan = [&](const TensorMap& m, const char* where) {
    for (const auto& [name, t] : m) {
      if (t.dtype == DType::Bool || t.dtype == DType::Int64) continue;
      const bool mask = name.find("mask") != std::string::npos;
      int64_t nan = 0, pinf = 0, ninf = 0;
      for (double x : t.data) nan += std::isnan(x), pinf += x == INFINITY, ninf += x == -INFINITY && !mask;
      if (nan + pinf + ninf == 0) continue;
      std::string what;
      for (auto [n, label] : {std::pair<int64_t, const char*>{nan, "NaN"}, {pinf, "+inf"}, {ninf, "-inf"}})
        if (n) what += fmt::format("{}{} {}", what.empty() ? "" : ", ", n, label);
      r.notes.push_back(
          fmt::format("non-finite values in {}.{}: {} (allowed; equal non-finite results in both "
                      "count as agreement and are counted, any other mismatch fails)",
                      where, name, what));
    }
  };
  scan(p.state_dict, "state_dict");
  scan(p.inputs, "inputs");
}

void add_reference_notes(CaseReport& r, const TorchRun& run, const char* label) {
  for (const std::string& n : run.notes) r.notes.push_back(fmt::format("{}: {}", label, n));
  if (!run.failure.empty()) r.fail({"", "", fmt::format("case {}: reference {}: {}", r.name, label, run.failure)});
}

// Whether some judged component's error in the plain sample has fewer than
// policy.noise_neff_threshold effective elements: then one sample says too little.
bool needs_samples(const std::vector<std::string>& names, const Components& t32, const Components& t64,
                   const GatePolicy& policy) {
  for (const std::string& n : names) {
    const Tensor<double>* a = find(t32, n);
    const Tensor<double>* b = find(t64, n);
    if (a && b && estimate_noise({{a, b}}).n_eff < policy.noise_neff_threshold) return true;
  }
  return false;
}

NoiseRuns run_noise(const Problem& p, const GatePolicy& policy, const std::string& where) {
  NoiseRuns out;
  uint64_t h = 1469598103934665603ULL;  // FNV-1a of the name: each case its own jitter
  for (char c : p.name) h = (h ^ uint64_t(uint8_t(c))) * 1099511628211ULL;
  for (int k = 1; k <= policy.noise_samples; ++k) {
    const Problem q = jittered(p, h + uint64_t(k));
    out.f64.push_back(reference_run(q, DType::Float64, where));
    out.f32.push_back(reference_run(q, DType::Float32, where));
  }
  return out;
}

// The samples as the judged components, in the view the report compares: the runs' own components,
// or views made of them (kept in `made`).
struct NoiseSamples {
  std::vector<const Components*> f32, f64;
  std::vector<std::unique_ptr<const Components>> made;
};
NoiseSamples own_components(const NoiseRuns& runs) {
  NoiseSamples s;
  for (const auto& t : runs.f32) s.f32.push_back(&t->result.components);
  for (const auto& t : runs.f64) s.f64.push_back(&t->result.components);
  return s;
}
NoiseSamples view(const NoiseRuns& runs, const std::function<Components(const TorchRun&)>& as) {
  NoiseSamples s;
  for (auto [from, to] : {std::pair{&runs.f32, &s.f32}, std::pair{&runs.f64, &s.f64}})
    for (const auto& t : *from) {
      s.made.push_back(std::make_unique<const Components>(as(*t)));
      to->push_back(s.made.back().get());
    }
  return s;
}

// The samples as implementations, and the noise legs told about them.
void add_samples(Implementations& impls, std::vector<LegSpec>& legs, const NoiseSamples& s) {
  for (size_t k = 0; k < s.f32.size(); ++k) {
    impls[noise_sample_key("torch32", int(k + 1))] = s.f32[k];
    impls[noise_sample_key("torch64", int(k + 1))] = s.f64[k];
  }
  for (LegSpec& l : legs)
    if (l.role == LegRole::Noise)
      for (size_t k = 0; k < s.f32.size(); ++k)
        l.samples.push_back({noise_sample_key("torch32", int(k + 1)), noise_sample_key("torch64", int(k + 1))});
}

// The implementations every component must be found in: the references, and the implementation under
// test in the precisions it computes in (a foreign program may give one alone).
std::vector<std::string> required_of(const Implementation& impl) {
  std::vector<std::string> r{"torch64", "torch32"};
  if (impl.float64) r.push_back("hand64");
  if (impl.float32) r.push_back("hand32");
  return r;
}

void note_precisions(CaseReport& r, const Implementation& impl) {
  if (!impl.float64)
    r.notes.push_back(impl.name + " gave no float64 run: the semantic legs (hand64_vs_torch64) are not judged");
  if (!impl.float32)
    r.notes.push_back(impl.name + " gave no float32 run: the numeric legs (hand32_vs_torch64) are not judged");
}

// Stored results of another shape than the module's for these inputs are the file's error (exit 2),
// not the implementation's failure: named by field. `truth` is LibTorch's run (or the hand core's).
void check_stored_shapes(const Problem& p, const std::string& where, const RunResult& truth, const std::string& whose) {
  for (const auto& [section, m] :
       {std::pair<const char*, const TensorMap*>{"outputs", &p.outputs}, {"outputs_float32", &p.outputs_float32}})
    for (const auto& [name, t] : *m)
      if (auto it = truth.outputs.find(name); it != truth.outputs.end() && it->second.shape != t.shape)
        throw InputError(fmt::format("{}: {}.{}: expected shape {} ({} output for these inputs), got {}", where,
                                     section, name, to_string(it->second.shape), whose, to_string(t.shape)));
  for (const auto& [section, m] : {std::pair<const char*, const TensorMap*>{"components", &p.components},
                                   {"components_float32", &p.components_float32}})
    for (const auto& [name, t] : *m)
      if (const Tensor<double>* c = find(truth.components, name); c && c->shape != t.shape)
        throw InputError(fmt::format("{}: {}.{}: expected shape {} ({} component for these inputs), got {}", where,
                                     section, name, to_string(c->shape), whose, to_string(t.shape)));
}

// The components to judge, of `names` in their order: all of them, or, for an implementation whose
// components are its own choice, those it gave in some precision (the rest named in a note). The
// outputs are always judged.
std::vector<std::string> given_components(CaseReport& r, const std::vector<std::string>& names,
                                          const Implementation& impl, const RunResult& h64, const RunResult& h32) {
  if (impl.components_complete) return names;
  std::vector<std::string> given, missing;
  for (const std::string& n : names)
    (find(h64.components, n) || find(h32.components, n) ? given : missing).push_back(n);
  if (!missing.empty()) {
    std::string list;
    for (const std::string& n : missing) list += (list.empty() ? "" : ", ") + n;
    r.notes.push_back(impl.name + " gave no " + list + ": not judged (components are optional; those given are)");
  }
  return given;
}

// Every component on the propagated legs and, through the implementation teacher-forced with
// torch64's components (each op fed the reference's own inputs), on the local ones. An
// implementation without components is compared on its outputs. `noise`: LibTorch's jittered runs,
// taken here when none are given and the plain sample says too little.
void compare_every_component(CaseReport& r, const Problem& p, const Implementation& impl, const RunResult& h64,
                             const RunResult& h32, const TorchRun& t64, const TorchRun& t32, const GatePolicy& policy,
                             const std::string& where, const NoiseRuns* noise = nullptr) {
  NoiseRuns own;
  NoiseLegMemo* legs_memo = nullptr;  // set by runs() under a live memo: the noise legs kept with them
  // The noise model's runs: those given, else LibTorch's own when the plain sample says too little;
  // under a live memo, those it kept for this problem and view, or kept there once run.
  auto runs = [&](const char* view, const std::vector<std::string>& names, const Components& a,
                  const Components& b) -> const NoiseRuns& {
    if (noise) return *noise;
    if (!memo) {
      if (needs_samples(names, a, b, policy)) own = run_noise(p, policy, where);
      return own;
    }
    std::string key = fmt::format("{}\n{}\nsamples {} neff {}", fingerprint(p, DType::Float64), view,
                                  policy.noise_samples, policy.noise_neff_threshold);
    for (const std::string& n : names) key += "\n" + n;
    auto it = memo->noise.find(key);
    if (it != memo->noise.end()) {
      memo->hits += it->second.runs.f32.size() + it->second.runs.f64.size();
    } else {
      detail::NoiseEntry e;
      if (needs_samples(names, a, b, policy)) e.runs = run_noise(p, policy, where);
      it = memo->noise.emplace(std::move(key), std::move(e)).first;
    }
    legs_memo = &it->second.legs;
    return it->second.runs;
  };
  if ((impl.float64 && h64.components.empty()) || (impl.float32 && h32.components.empty())) {
    const Components a64 = outputs_as_components(h64.outputs), a32 = outputs_as_components(h32.outputs),
                     b64 = outputs_as_components(t64.result.outputs), b32 = outputs_as_components(t32.result.outputs);
    std::vector<std::string> names;
    for (const Component& c : b64) names.push_back(c.name);
    r.notes.push_back(impl.name + " returns no components: its outputs are compared");
    const NoiseSamples ns = view(runs("outputs", names, b32, b64),
                                 [](const TorchRun& t) { return outputs_as_components(t.result.outputs); });
    Implementations impls{{"hand64", &a64}, {"hand32", &a32}, {"torch64", &b64}, {"torch32", &b32}};
    std::vector<LegSpec> legs = standard_legs();
    add_samples(impls, legs, ns);
    compare_components(r, names, impls, legs, policy, required_of(impl), legs_memo);
    return;
  }
  const std::vector<std::string> names = given_components(r, component_names(p), impl, h64, h32);
  const NoiseSamples ns = own_components(runs("components", names, t32.result.components, t64.result.components));
  if (!impl.teacher_forcing) {
    Implementations impls{{"hand64", &h64.components},
                          {"hand32", &h32.components},
                          {"torch64", &t64.result.components},
                          {"torch32", &t32.result.components}};
    std::vector<LegSpec> legs = standard_legs();
    add_samples(impls, legs, ns);
    compare_components(r, names, impls, legs, policy, {"torch64", "torch32"}, legs_memo);
    return;
  }
  const RunResult l64 = impl.run(p, DType::Float64, &t64.result.components);
  const RunResult l32 = impl.run(p, DType::Float32, &t64.result.components);
  Implementations impls{{"hand64", &h64.components},         {"hand32", &h32.components},
                        {"torch64", &t64.result.components}, {"torch32", &t32.result.components},
                        {"local_hand64", &l64.components},   {"local_hand32", &l32.components}};
  std::vector<LegSpec> legs = legs_with_local();
  add_samples(impls, legs, ns);
  std::vector<std::string> required = required_of(impl);
  if (impl.local_complete && impl.float64 && !l64.components.empty()) required.push_back("local_hand64");
  if (impl.local_complete && impl.float32 && !l32.components.empty()) required.push_back("local_hand32");
  compare_components(r, names, impls, legs, policy, required, legs_memo);
}

}  // namespace

ReferenceMemo::ReferenceMemo() {
  if (memo) throw std::logic_error("ReferenceMemo: one is already live");
  state_ = std::make_unique<detail::MemoState>();
  memo = state_.get();
}
size_t ReferenceMemo::hits() const { return state_->hits; }
size_t ReferenceMemo::runs() const { return state_->misses; }
ReferenceMemo::~ReferenceMemo() { memo = nullptr; }

Implementation hand_core() {
  return Implementation{"hand core",
                        [](const Problem& p, DType dtype, const Components* teacher) {
                          return run_hand(p, dtype, true, p.origin.empty() ? "case " + p.name : p.origin, teacher);
                        },
                        true};
}

CaseReport evaluate_problem(const Problem& problem, const std::string& description, std::optional<uint64_t> seed,
                            const GatePolicy& policy, const Implementation& impl) {
  // A case follows the reference's semantics where torch versions differ (core/attention.hpp).
  Problem p = problem;
  resolve_semantics(p, reference_semantics());
  CaseReport r;
  r.name = p.name;
  r.description = description;
  r.config = config_json(p);
  r.has_seed = seed.has_value();
  r.seed = seed.value_or(0);
  r.reference = reference_info();
  const std::string where = "case " + p.name;
  add_nonfinite_notes(r, p);
  const RunResult h64 = impl.run(p, DType::Float64, nullptr);
  const RunResult h32 = impl.run(p, DType::Float32, nullptr);
  const std::shared_ptr<const TorchRun> t64 = reference_run(p, DType::Float64, where);
  const std::shared_ptr<const TorchRun> t32 = reference_run(p, DType::Float32, where);
  add_reference_notes(r, *t64, "torch64");
  add_reference_notes(r, *t32, "torch32");
  if (impl.name != hand_core().name)
    r.notes.push_back("implementation under test (\"hand\" in the legs): " + impl.name);
  compare_every_component(r, p, impl, h64, h32, *t64, *t32, policy, where);
  return r;
}

std::vector<CaseReport> check_fixture(const Problem& fixture, const std::string& where, const GatePolicy& policy,
                                      const Implementation& impl) {
  // The hand side follows the fixture's semantics (its producer's torch) against the stored outputs,
  // and the reference's against LibTorch's decomposition.
  Problem p = fixture;
  resolve_semantics(p, reference_semantics());
  CaseReport r;
  r.name = p.name;
  r.description = summary(p) + " [fixture " + where + "]";
  r.config = config_json(p);
  r.reference = reference_info();
  // What produced the stored results, from the fixture's reference block (its other entries, such
  // as a model's sentences, stay in the fixture).
  for (const char* k : {"name", "model", "torch", "transformers", "blas", "threads"})
    if (auto it = p.producer.find(k); it != p.producer.end())
      r.stored_reference += (r.stored_reference.empty() ? "" : "; ") +
                            (std::string(k) == "name" || std::string(k) == "model" ? "" : std::string(k) + " ") +
                            it->second;
  if (r.stored_reference.empty()) r.stored_reference = "Python torch 1.13 (fixture format v1)";
  r.notes.push_back("torch64 and torch32 are the fixture's stored results: " + r.stored_reference + "; semantics " +
                    semantics_name(*p.semantics));
  add_nonfinite_notes(r, p);

  const RunResult h64 = impl.run(p, DType::Float64, nullptr);
  const RunResult h32 = impl.run(p, DType::Float32, nullptr);
  if (impl.name != hand_core().name)
    r.notes.push_back("implementation under test (\"hand\" in the legs): " + impl.name);

  // The stored results: the outputs as the module returns them, and the producer's components in
  // their canonical layout (format v2), "output" being the module's own.
  auto stored = [&](const TensorMap& outs, const TensorMap& comps) {
    Components c;
    for (const auto& [name, t] : comps)
      if (!is_output(p, name)) c.push_back({name, to_tensor<double>(t)});
    for (const Component& o : outputs_as_components(outs)) c.push_back(o);
    return c;
  };
  Components torch64, torch32, lt64, lt32;
  NoiseSamples noise;  // LibTorch's jittered samples, beside the stored float32 sample
  NoiseRuns noise_runs;
  const bool stored64 = !p.outputs.empty() && p.outputs.at("output").dtype == DType::Float64;
  if (stored64)
    torch64 = stored(p.outputs, p.components);
  else if (!p.outputs.empty())
    torch32 = stored(p.outputs, p.components_float32);
  if (!p.outputs_float32.empty()) torch32 = stored(p.outputs_float32, p.components_float32);
  if (p.outputs.empty() && p.outputs_float32.empty())
    throw InputError(where + ": outputs: missing (check compares against the outputs PyTorch stored in the fixture)");

  std::vector<CaseReport> reports;
  std::vector<LegSpec> legs = standard_legs();
  if (torch_available()) {
    Problem q = fixture;  // the reference's semantics, for the comparison with LibTorch's decomposition
    q.semantics.reset();
    resolve_semantics(q, reference_semantics());
    const TorchRun t64 = run_torch(q, DType::Float64, true, where);
    check_stored_shapes(p, where, t64.result, "LibTorch's");
    const TorchRun t32 = run_torch(q, DType::Float32, true, where);
    add_reference_notes(r, t64, "libtorch64");
    add_reference_notes(r, t32, "libtorch32");
    lt64 = with_outputs(p, t64.result);
    lt32 = with_outputs(p, t32.result);
    // The stored float32 result is one sample of the producer's float32 error; LibTorch's, on
    // jittered copies, stand beside it (the producer cannot be run again here). One set of runs
    // serves this report and the components' one.
    {
      std::vector<std::string> judged = component_names(q);
      for (const char* n : {"output", "attn_weights"}) judged.push_back(n);
      if (p.outputs_float32.empty() ||
          needs_samples(judged, stored(p.outputs_float32, p.components_float32), stored(p.outputs, p.components),
                        policy) ||
          needs_samples(judged, lt32, lt64, policy))
        noise_runs = run_noise(q, policy, where);
      noise = view(noise_runs, [&](const TorchRun& t) { return with_outputs(p, t.result); });
    }
    if (torch64.empty()) {
      torch64 = outputs_as_components(t64.result.outputs);
      r.notes.push_back("torch64 is LibTorch's (the fixture stores no float64 outputs)");
    }
    if (torch32.empty()) {
      torch32 = outputs_as_components(t32.result.outputs);
      r.notes.push_back("torch32 is LibTorch's (the fixture stores no float32 outputs)");
    }
    // LibTorch against what Python stored: the reference's semantics must be the fixture's, or the
    // problem must not exercise where they differ; otherwise the leg is reported, not gated.
    const std::vector<std::string> diffs = semantic_differences(p);
    const bool comparable = *p.semantics == reference_semantics() || diffs.empty();
    legs.push_back(
        {"libtorch64_vs_torch64", "libtorch64", "torch64", comparable ? LegRole::Semantic : LegRole::Report, ""});
    legs.push_back({"libtorch32_vs_torch32", "libtorch32", "torch32", LegRole::Report, ""});
    if (!comparable)
      for (const std::string& d : diffs)
        r.notes.push_back(
            fmt::format("libtorch64_vs_torch64 reported, not gated: LibTorch {} follows {}'s semantics, "
                        "the fixture {}'s, and it exercises a difference: {}",
                        torch_version(), semantics_name(reference_semantics()), semantics_name(*p.semantics), d));

    // Every component, against the LibTorch decomposition (verified just above by its outputs), the
    // hand side on the reference's semantics too; unless the fixture needs semantics the reference
    // does not have (then there is nothing like to compare).
    if (!comparable) {
      r.notes.push_back("components against LibTorch's decomposition not compared: LibTorch " + torch_version() +
                        " follows other semantics where this fixture needs its own");
    } else {
      CaseReport cr;
      cr.name = p.name + "/components";
      cr.description =
          "every component against the LibTorch decomposition, which the fixture's leg libtorch64_vs_torch64 verifies";
      cr.config = r.config;
      cr.reference = r.reference;
      const bool same = *p.semantics == *q.semantics;
      const RunResult q64 = same ? RunResult() : impl.run(q, DType::Float64, nullptr);
      const RunResult q32 = same ? RunResult() : impl.run(q, DType::Float32, nullptr);
      if (!same)
        cr.notes.push_back(
            fmt::format("the hand side runs with {}'s semantics here, LibTorch's", semantics_name(*q.semantics)));
      compare_every_component(cr, q, impl, same ? h64 : q64, same ? h32 : q32, t64, t32, policy, where, &noise_runs);
      reports.push_back(std::move(cr));
    }
  }
  if (!torch_available() && impl.components_complete) check_stored_shapes(p, where, h64, "the hand core's");
  if (torch64.empty())
    throw InputError(where +
                     ": outputs: the fixture stores no float64 outputs and tparity was built without LibTorch, "
                     "so the float64 semantics cannot be checked (export the fixture in float64)");
  if (torch32.empty())
    throw InputError(where +
                     ": outputs_float32: missing, and tparity was built without LibTorch, so there is no "
                     "float32 error to judge the hand core's float32 run by");

  // The names compared: the stored components in dataflow order (when the implementation gives
  // components), then the outputs.
  const bool has_components = !h64.components.empty() || !h32.components.empty();
  if (!has_components && !p.components.empty())
    r.notes.push_back(impl.name + " returns no components: its outputs are compared");
  std::vector<std::string> names;
  for (const std::string& n : component_names(p))
    if (!is_output(p, n) && p.components.count(n) && has_components) names.push_back(n);
  names = given_components(r, names, impl, h64, h32);
  names.push_back("output");
  if (p.module == ModuleKind::MultiheadAttention && p.forward.need_weights) names.push_back("attn_weights");
  const Components hand64 = with_outputs(p, h64), hand32 = with_outputs(p, h32);
  Implementations impls{{"hand64", &hand64},   {"hand32", &hand32},   {"torch64", &torch64},
                        {"torch32", &torch32}, {"libtorch64", &lt64}, {"libtorch32", &lt32}};
  add_samples(impls, legs, noise);
  // With stored components, every op of the hand side also runs on the producer's own inputs
  // (teacher forcing with the stored float64 components): the local legs and the first divergence.
  Components l64, l32;
  if (!p.components.empty() && impl.teacher_forcing && !(h64.components.empty() && h32.components.empty())) {
    Components teacher;  // canonical layouts only
    for (const auto& [name, t] : p.components)
      if (!is_output(p, name)) teacher.push_back({name, to_tensor<double>(t)});
    l64 = with_outputs(p, impl.run(p, DType::Float64, &teacher));
    l32 = with_outputs(p, impl.run(p, DType::Float32, &teacher));
    impls["local_hand64"] = &l64;
    impls["local_hand32"] = &l32;
    // the local legs right after the case's standard ones, before the fixture's libtorch legs
    const std::vector<LegSpec> local = local_legs();
    legs.insert(legs.begin() + std::ptrdiff_t(standard_legs().size()), local.begin(), local.end());
  }
  compare_components(r, names, impls, legs, policy, required_of(impl));
  note_precisions(r, impl);
  reports.insert(reports.begin(), std::move(r));
  return reports;
}

void check_stored_results(const Problem& problem, const std::string& where) {
  Problem p = problem;
  p.semantics.reset();
  resolve_semantics(p, reference_semantics());
  if (torch_available())
    check_stored_shapes(problem, where, run_torch(p, DType::Float64, true, where).result, "LibTorch's");
  else
    check_stored_shapes(problem, where, run_hand(p, DType::Float64, true, where), "the hand core's");
}

CaseReport evaluate_low_precision(const Problem& problem, const std::string& where, DType dtype,
                                  const RunResult& candidate, const std::string& name, const GatePolicy& policy) {
  const std::string tag = dtype == DType::BFloat16 ? "bf16" : "f16";
  Problem p = problem;  // on the reference's semantics, as its runs
  p.semantics.reset();
  resolve_semantics(p, reference_semantics());
  CaseReport r;
  r.name = p.name + "/" + dtype_name(dtype);
  r.description =
      fmt::format("{} in {}, against LibTorch's own {} error", summary(p), dtype_name(dtype), dtype_name(dtype));
  r.config = config_json(p);
  r.reference = reference_info();
  const TorchRun t64 = run_torch(p, DType::Float64, true, where);
  TorchRun tl;
  try {
    tl = run_torch(p, dtype, true, where);
  } catch (const InputError& e) {
    std::string why = e.what();
    if (why.find("not implemented for") == std::string::npos) throw;  // the problem's, not the precision's
    const std::string said = "LibTorch rejected the problem: ";
    if (auto at = why.find(said); at != std::string::npos) why = why.substr(at + said.size());
    throw InputError(fmt::format("{}: option --dtype {}: LibTorch {} cannot compute {} in {} on the CPU ({})", where,
                                 dtype_name(dtype), torch_version(), module_name(p.module), dtype_name(dtype), why));
  }
  add_reference_notes(r, t64, "torch64");
  // In a low precision a module's fused kernel (scaled_dot_product_attention's flash path) rounds once
  // where the decomposition's separate ops round each: a difference of a few roundings (every rel_l2
  // the check names <= 4u) is said, not failed; the float64 run is the decomposition's proof. More
  // than that fails the case as in float32 and float64.
  if (!tl.failure.empty()) {
    if (tl.mismatch > 0 && tl.mismatch <= 4 * unit_roundoff(dtype)) {  // verify()'s figures alone
      r.notes.push_back(
          fmt::format("torch{}: {} (within 4u of {}: rounding; the outputs judged are the module's, "
                      "the components the decomposition's; torch64 verifies the decomposition)",
                      tag, tl.failure, dtype_name(dtype)));
      tl.failure.clear();
    }
  }
  add_reference_notes(r, tl, ("torch" + tag).c_str());
  r.notes.push_back("implementation under test (\"hand\" in the legs): " + name);
  r.notes.push_back(
      fmt::format("torch{} is LibTorch {} computing in {} on the CPU; its error is one sample, the plain "
                  "run's (jittered copies move float32 roundings, which {} erases)",
                  tag, torch_version(), dtype_name(dtype), dtype_name(dtype)));
  // The candidate's components, in dataflow order, then the outputs in the module's layout.
  const Components hand = with_outputs(p, candidate), torch64 = with_outputs(p, t64.result),
                   torchl = with_outputs(p, tl.result);
  std::vector<std::string> names;
  for (const std::string& n : component_names(p))
    if (!is_output(p, n) && find(hand, n)) names.push_back(n);
  if (names.empty())
    r.notes.push_back(name + " gave no components in " + dtype_name(dtype) + ": its outputs are compared");
  for (const Component& o : outputs_as_components(t64.result.outputs)) names.push_back(o.name);
  const Implementations impls{{"hand" + tag, &hand}, {"torch64", &torch64}, {"torch" + tag, &torchl}};
  compare_components(r, names, impls, low_precision_legs(tag, unit_roundoff(dtype)), policy,
                     {"hand" + tag, "torch64", "torch" + tag});
  return r;
}

}  // namespace tparity
