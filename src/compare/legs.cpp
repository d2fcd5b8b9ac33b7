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

}  // namespace

void compare_components(CaseReport& report, const std::vector<std::string>& names, const Implementations& impls,
                        const std::vector<LegSpec>& legs, const GatePolicy& policy,
                        const std::vector<std::string>& required) {
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
      Leg leg{spec.name, spec.role, measure(*a, *b), 0, true, spec.diagnostic, {}, {}};
      if (spec.role == LegRole::Noise && leg.m.comparable()) {
        std::vector<std::pair<const Tensor<double>*, const Tensor<double>*>> samples{{a, b}};
        for (const auto& [sa, sb] : spec.samples)
          if (const Tensor<double>* x = get(sa, name), *y = get(sb, name); x && y) samples.push_back({x, y});
        leg.noise = estimate_noise(samples);
      }
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
          breach(fmt::format("{} non-finite value(s) differ, first at {}", leg.m.nonfinite_mismatch,
                             index_str(leg.m.first_mismatch_index)));
        } else if (leg.pass && !(leg.m.rel_l2 <= leg.bound)) {
          const std::string how =
              spec.role == LegRole::Semantic
                  ? "semantic bound"
                  : fmt::format("{:g} x {:.3g} x {} noise {:.3g} ({} sample{}, n_eff {:.3g}) + floor {:.3g}",
                                policy.numeric_factor, leg.noise.quantile, spec.noise, leg.noise.rms, leg.noise.samples,
                                leg.noise.samples == 1 ? "" : "s", leg.noise.n_eff, floor);
          breach(fmt::format("rel_l2 {:.3g} > bound {:.3g} ({}); max_abs {:.3g} at {}", leg.m.rel_l2, leg.bound, how,
                             leg.m.max_abs, index_str(leg.m.max_abs_index)));
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

void diagnose(CaseReport& report) {
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
