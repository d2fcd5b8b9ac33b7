#include "tparity/compare/legs.hpp"

#include <fmt/format.h>

#include <algorithm>
#include <cmath>

namespace tparity {

namespace {

// Every leg of a case, in the order the report shows them: the propagated legs, then the local ones
// (diagnostic: the hand core teacher-forced with torch64's components). standard_legs(),
// local_legs() and legs_with_local() are views of this one table.
std::vector<LegSpec> case_legs() {
  return {
      {"hand64_vs_torch64", "hand64", "torch64", LegRole::Semantic, ""},
      {"hand32_vs_torch64", "hand32", "torch64", LegRole::Numeric, "torch32_vs_torch64"},
      {"torch32_vs_torch64", "torch32", "torch64", LegRole::Noise, ""},
      {"hand32_vs_torch32", "hand32", "torch32", LegRole::Report, ""},
      {"local_hand64_vs_torch64", "local_hand64", "torch64", LegRole::Semantic, "", true},
      {"local_hand32_vs_torch64", "local_hand32", "torch64", LegRole::Numeric, "torch32_vs_torch64", true},
  };
}

std::vector<LegSpec> case_legs_where(bool local) {
  std::vector<LegSpec> legs;
  for (LegSpec& l : case_legs())
    if (l.diagnostic == local) legs.push_back(std::move(l));
  return legs;
}

}  // namespace

std::vector<LegSpec> standard_legs() { return case_legs_where(false); }

std::vector<LegSpec> local_legs() { return case_legs_where(true); }

std::vector<LegSpec> legs_with_local() { return case_legs(); }

std::vector<LegSpec> low_precision_legs(const std::string& tag, double unit_roundoff) {
  const std::string hand = "hand" + tag, torch = "torch" + tag;
  LegSpec numeric{hand + "_vs_torch64", hand, "torch64", LegRole::Numeric, torch + "_vs_torch64"};
  numeric.floor = unit_roundoff;
  return {numeric,
          {torch + "_vs_torch64", torch, "torch64", LegRole::Noise, ""},
          {hand + "_vs_" + torch, hand, torch, LegRole::Report, ""}};
}

std::string noise_sample_key(const std::string& impl, int k) { return impl + "~" + std::to_string(k); }

const Leg* ComponentReport::leg(const std::string& n) const {
  for (const Leg& l : legs)
    if (l.name == n) return &l;
  return nullptr;
}

namespace {

std::string index_str(const std::vector<int64_t>& idx) {
  std::string s = "[";
  for (size_t i = 0; i < idx.size(); ++i) s += (i ? "," : "") + std::to_string(idx[i]);
  return s + "]";
}

// "380x", "1.3x", "0.04x", "2e+06x": a ratio as the reports print it.
std::string times(double x, double of) {
  if (!(of > 0)) return "-";
  const double r = x / of;
  if (!std::isfinite(r) || r < 1 || r >= 1e6) return fmt::format("{:.2g}x", r);
  return r < 10 ? fmt::format("{:.1f}x", r) : fmt::format("{:.0f}x", r);
}

// The precision a noise leg measures: torch32_vs_torch64 -> float32, torchbf16_... -> bfloat16.
std::string precision_of(const std::string& noise_leg) {
  if (noise_leg.rfind("torchbf16", 0) == 0) return "bfloat16";
  if (noise_leg.rfind("torchf16", 0) == 0) return "float16";
  return "float32";
}

constexpr const char* kNoise32 = "torch32_vs_torch64";

// LibTorch's own error on the component that a leg is best read against, and its precision: a numeric
// leg's own noise; for a float64 leg, LibTorch's float32 error (0 when not measured).
std::pair<double, std::string> own_error(const ComponentReport& c, const Leg& leg, const LegSpec& spec) {
  if (spec.role == LegRole::Numeric) return {leg.noise.rms, precision_of(spec.noise)};
  const Leg* n = c.leg(kNoise32);
  return {n && n->m.comparable() ? n->noise.rms : 0.0, "float32"};
}

}  // namespace

void compare_components(CaseReport& report, const std::vector<std::string>& names, const Implementations& impls,
                        const std::vector<LegSpec>& legs, const GatePolicy& policy,
                        const std::vector<std::string>& required, NoiseLegMemo* noise_memo) {
  auto get = [&](const std::string& impl, const std::string& comp) -> const Tensor<double>* {
    auto it = impls.find(impl);
    return it == impls.end() || !it->second ? nullptr : find(*it->second, comp);
  };
  for (const std::string& name : names) {
    ComponentReport cr;
    cr.name = name;
    for (const std::string& impl : required)
      if (!get(impl, name))
        report.fail({name, "", fmt::format("case {}: component {}: missing from {}", report.name, name, impl)});
    // Measure every leg first: a Numeric leg's bound comes from its Noise leg.
    std::vector<const LegSpec*> specs;
    for (const LegSpec& spec : legs) {
      const Tensor<double>* a = get(spec.a, name);
      const Tensor<double>* b = get(spec.b, name);
      if (!a || !b) continue;
      if (cr.shape.empty()) cr.shape = b->shape;
      const bool noise = spec.role == LegRole::Noise;
      const std::string memo_key = noise && noise_memo ? name + "\n" + spec.name : std::string();
      if (!memo_key.empty())
        if (auto kept = noise_memo->find(memo_key); kept != noise_memo->end()) {
          cr.legs.push_back(kept->second);
          specs.push_back(&spec);
          continue;
        }
      Leg leg{spec.name, spec.role, measure(*a, *b), 0, true, spec.diagnostic, {}, {}, {}};
      if (leg.m.nonfinite_mismatch) leg.nonfinite = nonfinite_pattern(*a, *b);
      if (noise && leg.m.comparable()) {
        std::vector<std::pair<const Tensor<double>*, const Tensor<double>*>> samples{{a, b}};
        for (const auto& [sa, sb] : spec.samples)
          if (const Tensor<double>* x = get(sa, name), *y = get(sb, name); x && y) samples.push_back({x, y});
        leg.noise = estimate_noise(samples);
      }
      if (!memo_key.empty()) noise_memo->emplace(memo_key, leg);
      cr.legs.push_back(std::move(leg));
      specs.push_back(&spec);
    }
    for (size_t i = 0; i < cr.legs.size(); ++i) {
      Leg& leg = cr.legs[i];
      const LegSpec& spec = *specs[i];
      const std::string where = fmt::format("case {}: component {}: leg {}", report.name, name, spec.name);
      const double floor = spec.floor >= 0 ? spec.floor : policy.numeric_floor;
      // A breach fails the case, or, for a diagnostic leg, is only kept with the leg.
      auto breach = [&](const std::string& what) {
        leg.pass = false;
        leg.breach = what;
        if (!spec.diagnostic) report.fail({name, spec.name, where + ": " + what});
      };
      if (!leg.m.comparable()) {
        breach("shape " + leg.m.shape_mismatch);
      } else if (spec.role == LegRole::Semantic || spec.role == LegRole::Numeric) {
        const Leg* noise = spec.role == LegRole::Numeric ? cr.leg(spec.noise) : nullptr;
        if (spec.role == LegRole::Semantic) {
          leg.bound = policy.semantic_rel;
        } else if (!noise || !noise->m.comparable()) {
          breach("no " + spec.noise + " leg to judge it by");
        } else {
          leg.noise = noise->noise;
          leg.bound = policy.numeric_factor * leg.noise.quantile * leg.noise.rms + floor;
        }
        if (leg.m.nonfinite_mismatch) {
          breach(fmt::format("{} non-finite value(s) differ, first at {}: {}", leg.m.nonfinite_mismatch,
                             index_str(leg.m.first_mismatch_index), leg.nonfinite.text));
        } else if (leg.pass && !(leg.m.rel_l2 <= leg.bound)) {
          const std::string how =
              spec.role == LegRole::Semantic
                  ? "semantic bound"
                  : fmt::format("bound = {:g} x {:.3g} x {} noise {:.3g} ({} sample{}, n_eff {:.3g}) + floor {:.3g}",
                                policy.numeric_factor, leg.noise.quantile, spec.noise, leg.noise.rms, leg.noise.samples,
                                leg.noise.samples == 1 ? "" : "s", leg.noise.n_eff, floor);
          // How far over, against the bound and against LibTorch's own error in the precision that
          // judges the leg (float32 for the float64 legs: what makes a precision slip visible).
          std::string sizes = times(leg.m.rel_l2, leg.bound) + " the bound";
          if (const auto [own, label] = own_error(cr, leg, spec); own > 0)
            sizes += fmt::format("; {} LibTorch's own {} error {:.3g}", times(leg.m.rel_l2, own), label, own);
          breach(fmt::format("rel_l2 {:.3g} > bound {:.3g} ({}); {}; max_abs {:.3g} at {}", leg.m.rel_l2, leg.bound,
                             sizes, how, leg.m.max_abs, index_str(leg.m.max_abs_index)));
        }
      }
      if (!spec.diagnostic) cr.pass = cr.pass && leg.pass;
    }
    if (cr.legs.empty()) continue;
    report.pass = report.pass && cr.pass;
    report.components.push_back(std::move(cr));
  }
  diagnose(report);
}

double slip_high(double noise32) { return std::max(4 * 0x1p-24, 4 * noise32); }

namespace {

// The float64 legs of an implementation under test (hand64_vs_torch64; not the local ones, which
// fail nothing, nor a fixture's libtorch64 leg, which checks the reference).
bool float64_leg(const Leg& l) { return l.role == LegRole::Semantic && !l.diagnostic && l.name.rfind("hand", 0) == 0; }
bool float32_leg(const Leg& l) {
  return l.role == LegRole::Numeric && !l.diagnostic && l.name.rfind("hand32_", 0) == 0;
}

// LibTorch's float32 error on a component, 0 when not measured.
double noise32(const ComponentReport& c) {
  const Leg* n = c.leg(kNoise32);
  return n && n->m.comparable() ? n->noise.rms : 0.0;
}

// A float64 leg that fails at float32's rounding level on its component.
bool slip_sized(const ComponentReport& c, const Leg& l) {
  return float64_leg(l) && !l.pass && l.m.clean() && l.m.rel_l2 >= kSlipLow && l.m.rel_l2 <= slip_high(noise32(c));
}

struct Float32Evidence {
  bool ran = false;  // some float32 leg was measured
  bool pass = true;  // every one passed
};
Float32Evidence float32_evidence(const CaseReport& r) {
  Float32Evidence e;
  for (const ComponentReport& c : r.components)
    for (const Leg& l : c.legs)
      if (float32_leg(l)) e.ran = true, e.pass = e.pass && l.pass;
  return e;
}

std::string leg_side(const std::string& leg) { return leg.substr(0, leg.find("_vs_")); }

// Why a slip still fails by default, and what --accept says instead.
constexpr const char* kSlipFails =
    ". It fails the case: a semantic slip this small (an eps, a scale) looks the same; "
    "--accept precision-slip accepts it when every float32 leg passes";
constexpr const char* kSlipAccepted = ". Accepted (--accept precision-slip): every float32 leg passes";

void diagnose_precision_slip(CaseReport& report) {
  for (const ComponentReport& c : report.components)
    for (const Leg& l : c.legs) {
      if (!float64_leg(l) || l.pass) continue;
      // The first float64 failure, in dataflow order: a slip if it is float32-sized and float32 does
      // not fail too (then something bigger is wrong).
      const Float32Evidence f32 = float32_evidence(report);
      if (!slip_sized(c, l) || (f32.ran && !f32.pass)) return;
      const double n32 = noise32(c);
      std::string text = fmt::format(
          "precision slip: float64 differs at {:.2g}, the size of a float32 value inside the float64 "
          "computation: a constant, a table or a cast",
          l.m.rel_l2);
      if (f32.ran)
        text += fmt::format(" ({} LibTorch's own float32 error {:.2g} on {}; every float32 leg passes)",
                            times(l.m.rel_l2, n32), n32, c.name);
      else
        text += fmt::format(" (judged by its size alone, {:.0e} to {:.2g}: the float32 leg was not run)", kSlipLow,
                            slip_high(n32));
      text += kSlipFails;
      report.diagnoses.push_back({"precision-slip", c.name, l.name, text});
      return;
    }
}

void diagnose_nonfinite(CaseReport& report) {
  const ComponentReport* first = nullptr;
  const Leg* leg = nullptr;
  std::vector<std::string> later;
  for (const ComponentReport& c : report.components)
    for (const Leg& l : c.legs) {
      if (l.diagnostic || !l.m.nonfinite_mismatch || l.pass) continue;  // a failure's pattern only
      if (!first)
        first = &c, leg = &l;
      else if (&c != first && (later.empty() || later.back() != c.name))
        later.push_back(c.name);
    }
  if (!first) return;
  std::string text = fmt::format("{} non-finite value(s) differ: {}", leg->m.nonfinite_mismatch, leg->nonfinite.text);
  if (!later.empty()) {
    std::string names;
    for (size_t i = 0; i < later.size() && i < 4; ++i) names += (i ? ", " : "") + later[i];
    if (later.size() > 4) names += fmt::format(", and {} more", later.size() - 4);
    text += fmt::format("; non-finite values then differ in {} later component(s) ({}): spreading from {}",
                        later.size(), names, first->name);
  }
  report.diagnoses.push_back({leg->nonfinite.kind, first->name, leg->name, text});
}

}  // namespace

bool accept_precision_slip(CaseReport& report) {
  if (report.pass || report.failures.empty()) return false;
  bool slip = false;
  for (const Diagnosis& d : report.diagnoses) slip = slip || d.kind == "precision-slip";
  const Float32Evidence f32 = float32_evidence(report);
  if (!slip || !f32.ran || !f32.pass) return false;
  // Every failure must be a float64 leg at float32's rounding level: anything else is not a slip.
  for (const Failure& f : report.failures) {
    const ComponentReport* c = nullptr;
    for (const ComponentReport& x : report.components)
      if (x.name == f.component) c = &x;
    const Leg* l = c ? c->leg(f.leg) : nullptr;
    if (!l || !slip_sized(*c, *l)) return false;
  }
  for (const Failure& f : report.failures)
    report.notes.push_back("accepted as a precision slip (--accept precision-slip): " + f.text);
  report.failures.clear();
  report.pass = true;
  for (Diagnosis& d : report.diagnoses)
    if (const size_t at = d.text.find(kSlipFails); d.kind == "precision-slip" && at != std::string::npos)
      d.text = d.text.substr(0, at) + kSlipAccepted;
  for (ComponentReport& c : report.components) c.pass = true;
  return true;
}

std::string summary_line(const CaseReport& r) {
  std::vector<std::string> parts;
  // Where it breaks: the first local breach (the op that is wrong), else the first failing leg.
  const ComponentReport* fc = nullptr;
  const Leg* fl = nullptr;
  for (bool local : {true, false})
    for (const ComponentReport& c : r.components) {
      if (fl) break;
      for (const Leg& l : c.legs)
        if (!l.pass && l.diagnostic == local && (l.role == LegRole::Semantic || l.role == LegRole::Numeric)) {
          fc = &c, fl = &l;
          break;
        }
    }
  if (!r.pass && fl) {
    const std::string figure = !fl->m.comparable() ? "shape differs"
                               : fl->m.nonfinite_mismatch != 0
                                   ? fmt::format("{} non-finite differ", fl->m.nonfinite_mismatch)
                                   : fmt::format("{:.1e} > {:.2g}", fl->m.rel_l2, fl->bound);
    parts.push_back(fmt::format("first divergence {} ({}: {})", fc->name, leg_side(fl->name), figure));
  } else if (!r.pass && !r.failures.empty()) {
    std::string t = r.failures.front().text;
    const std::string prefix = "case " + r.name + ": ";
    if (t.rfind(prefix, 0) == 0) t = t.substr(prefix.size());
    parts.push_back(t);
  }
  for (const Diagnosis& d : r.diagnoses)
    if (d.kind == "precision-slip")
      for (const std::string& n : r.notes)
        if (n.rfind("accepted as a precision slip", 0) == 0) {
          parts.push_back("precision slip accepted at " + d.component);
          break;
        }
  // The worst component against LibTorch's own error in the precision that judges it.
  double worst = -1;
  std::string worst_text;
  for (const ComponentReport& c : r.components)
    for (const Leg& l : c.legs) {
      if (l.diagnostic || l.name.rfind("hand", 0) != 0 || !l.m.clean()) continue;
      if (l.role != LegRole::Semantic && l.role != LegRole::Numeric) continue;
      const std::string side = leg_side(l.name);
      const double own = l.role == LegRole::Numeric ? l.noise.rms : noise32(c);
      if (!(own > 0)) continue;
      const double ratio = l.m.rel_l2 / own;
      if (ratio > worst) {
        worst = ratio;
        const std::string prec = side == "handbf16" ? "bfloat16" : side == "handf16" ? "float16" : "float32";
        worst_text = fmt::format("worst: {} {} LibTorch's own {} error{}", c.name, times(l.m.rel_l2, own), prec,
                                 side == "hand64" || side == "hand32" ? "" : fmt::format(" ({})", side));
      }
    }
  if (worst >= 0) parts.push_back(worst_text);
  std::string out = fmt::format("{}  {}", r.pass ? "PASS" : "FAIL", r.name);
  for (size_t i = 0; i < parts.size(); ++i) out += (i ? "; " : "  ") + parts[i];
  return out;
}

void diagnose(CaseReport& report) {
  report.diagnoses.clear();
  diagnose_nonfinite(report);
  diagnose_precision_slip(report);
  const ComponentReport* prev = nullptr;
  for (ComponentReport& c : report.components) {
    const Leg* now = c.leg("hand32_vs_torch64");
    const Leg* before = prev ? prev->leg("hand32_vs_torch64") : nullptr;
    if (now && before && before->m.rel_l2 > 0) c.growth = now->m.rel_l2 / before->m.rel_l2;
    prev = &c;
    if (!report.first_divergence.empty()) continue;
    for (const Leg& l : c.legs)
      if (l.diagnostic && !l.pass) {
        report.first_divergence = c.name;
        report.first_divergence_detail = fmt::format("component {}: leg {}: {}", c.name, l.name, l.breach);
        break;
      }
  }
}

}  // namespace tparity
