#include "tparity/compare/report.hpp"

#include <fmt/format.h>

#include <cmath>

namespace tparity {

std::string role_name(LegRole r) {
  switch (r) {
    case LegRole::Semantic:
      return "semantic";
    case LegRole::Numeric:
      return "numeric";
    case LegRole::Noise:
      return "noise";
    case LegRole::Report:
      return "report";
  }
  return "?";
}

namespace {

std::string compact_shape(const Shape& s) {
  std::string out;
  for (size_t i = 0; i < s.size(); ++i) out += (i ? "x" : "") + std::to_string(s[i]);
  return out;
}

std::string sci(double x) { return std::isfinite(x) ? fmt::format("{:.2e}", x) : fmt::format("{}", x); }

// Short leg label: hand32_vs_torch64 -> h32:t64, libtorch64_vs_torch64 -> lt64:t64
std::string short_leg(const std::string& n) {
  auto abbrev = [](std::string s) {
    for (auto [from, to] :
         {std::pair<const char*, const char*>{"local_hand", "lh"}, {"libtorch", "lt"}, {"hand", "h"}, {"torch", "t"}})
      if (s.rfind(from, 0) == 0) return to + s.substr(std::string(from).size());
    return s;
  };
  const size_t v = n.find("_vs_");
  return v == std::string::npos ? n : abbrev(n.substr(0, v)) + ":" + abbrev(n.substr(v + 4));
}

}  // namespace

std::string render_table(const CaseReport& r) {
  std::string out = fmt::format("case {}: {}{}\n", r.name, r.description,
                                r.has_seed ? fmt::format("  (seed {})", r.seed) : std::string());
  if (!r.components.empty()) {
    // One group of columns per leg, in the order the legs first appear (fixture components may lack
    // some); the local (diagnostic) legs show their rel_l2 only, then hand32's growth.
    std::vector<const Leg*> legs;
    for (const ComponentReport& c : r.components)
      for (const Leg& l : c.legs) {
        bool have = false;
        for (const Leg* x : legs) have = have || x->name == l.name;
        if (!have) legs.push_back(&l);
      }
    auto fields = [](const Leg& l) -> std::vector<std::string> {
      if (l.diagnostic || l.role == LegRole::Noise) return {"rel_l2"};
      if (l.role == LegRole::Report) return {"l2", "rel_l2", "max_abs"};
      return {"rel_l2", "bound"};
    };
    auto value = [](const Leg& l, const std::string& f) {
      return sci(f == "l2" ? l.m.l2 : f == "max_abs" ? l.m.max_abs : f == "bound" ? l.bound : l.m.rel_l2);
    };
    size_t cw = 18;  // the component column fits the longest name ("layers.11.sa.attn_weights")
    for (const ComponentReport& c : r.components) cw = std::max(cw, c.name.size());
    std::string h1 = fmt::format("  {:<{}} {:<14}", "", cw, ""),
                h2 = fmt::format("  {:<{}} {:<14}", "component", cw, "shape");
    for (const Leg* l : legs) {
      const size_t n = fields(*l).size();
      h1 += fmt::format(" {:<{}}", short_leg(l->name), 10 * n - 1);
      for (const std::string& f : fields(*l)) h2 += fmt::format(" {:>9}", f);
    }
    const bool growth = r.components.size() > 1 && r.components.front().leg("hand32_vs_torch64");
    if (growth) h2 += fmt::format(" {:>6}", "growth");
    out += h1 + "\n" + h2 + "  verdict  non-finite (matched)\n";
    for (const ComponentReport& c : r.components) {
      std::string row = fmt::format("  {:<{}} {:<14}", c.name, cw, compact_shape(c.shape));
      int64_t nan = 0, inf = 0;
      for (const Leg* col : legs) {
        const Leg* l = c.leg(col->name);
        for (const std::string& f : fields(*col)) row += fmt::format(" {:>9}", l ? value(*l, f) : "-");
        if (l) nan = std::max(nan, l->m.nan_matched), inf = std::max(inf, l->m.inf_matched);
      }
      if (growth) row += fmt::format(" {:>6}", std::isnan(c.growth) ? "-" : fmt::format("{:.2g}", c.growth));
      row += fmt::format("  {:<7}", c.pass ? "PASS" : "FAIL");
      if (nan || inf)
        row += fmt::format("  {}{}", nan ? fmt::format("nan {} ", nan) : "", inf ? fmt::format("inf {}", inf) : "");
      out += row + "\n";
    }
  }
  for (const std::string& n : r.notes) out += "  note: " + n + "\n";
  out += render_findings(r);
  out += fmt::format("  => {}\n", r.pass ? "PASS" : "FAIL");
  return out;
}

std::string render_findings(const CaseReport& r) {
  std::string out;
  for (const Failure& f : r.failures) out += "  FAIL " + f.text + "\n";
  if (!r.first_divergence.empty()) out += "  first divergence: " + r.first_divergence_detail + "\n";
  for (const Diagnosis& d : r.diagnoses) out += "  diagnosis: " + d.component + ": " + d.leg + ": " + d.text + "\n";
  if (!r.not_checked.empty()) {
    std::string list;
    for (const std::string& n : r.not_checked) list += (list.empty() ? "" : ", ") + n;
    out += "  not checked: " + list + "\n";
  }
  return out;
}

std::string render_summary(const CaseReport& r) { return summary_line(r) + "\n" + render_findings(r); }

nlohmann::json to_json(const ReferenceInfo& ref) {
  return {{"torch", ref.torch},   {"source", ref.source},         {"blas", ref.blas},
          {"kernel", ref.kernel}, {"capability", ref.capability}, {"threads", ref.threads},
          {"pinned", ref.pinned}, {"warning", ref.warning},       {"line", ref.line()}};
}

nlohmann::json to_json(const std::vector<Failure>& failures) {
  nlohmann::json j = nlohmann::json::array();
  for (const Failure& f : failures) j.push_back(f.text);
  return j;
}

nlohmann::json to_json(const CaseReport& r) {
  nlohmann::json comps = nlohmann::json::array();
  for (const ComponentReport& c : r.components) {
    nlohmann::json legs = nlohmann::json::object();
    for (const Leg& l : c.legs) {
      nlohmann::json j = {{"l2", l.m.l2},
                          {"rel_l2", l.m.rel_l2},
                          {"max_abs", l.m.max_abs},
                          {"max_abs_index", l.m.max_abs_index},
                          {"ref_l2", l.m.ref_l2},
                          {"count", l.m.count},
                          {"nan_matched", l.m.nan_matched},
                          {"inf_matched", l.m.inf_matched},
                          {"nonfinite_mismatch", l.m.nonfinite_mismatch},
                          {"role", role_name(l.role)},
                          {"diagnostic", l.diagnostic},
                          {"pass", l.pass}};
      if (l.role == LegRole::Semantic || l.role == LegRole::Numeric) j["bound"] = l.bound;
      if (l.role == LegRole::Noise || l.role == LegRole::Numeric)
        j["noise"] = {{"samples", l.noise.samples},
                      {"rms", l.noise.rms},
                      {"n_eff", l.noise.n_eff},
                      {"quantile", l.noise.quantile}};
      if (!l.m.comparable()) j["shape_mismatch"] = l.m.shape_mismatch;
      legs[l.name] = std::move(j);
    }
    comps.push_back({{"name", c.name},
                     {"shape", c.shape},
                     {"pass", c.pass},
                     {"growth", std::isnan(c.growth) ? nlohmann::json(nullptr) : nlohmann::json(c.growth)},
                     {"legs", std::move(legs)}});
  }
  nlohmann::json j = {{"name", r.name},   {"description", r.description},   {"config", r.config},
                      {"pass", r.pass},   {"components", std::move(comps)}, {"failures", to_json(r.failures)},
                      {"notes", r.notes}, {"summary", summary_line(r)}};
  nlohmann::json diagnoses = nlohmann::json::array();
  for (const Diagnosis& d : r.diagnoses)
    diagnoses.push_back({{"kind", d.kind}, {"component", d.component}, {"leg", d.leg}, {"text", d.text}});
  j["diagnoses"] = std::move(diagnoses);
  j["not_checked"] = r.not_checked;
  j["seed"] = r.has_seed ? nlohmann::json(r.seed) : nlohmann::json(nullptr);
  j["reference"] = to_json(r.reference);
  j["stored_reference"] = r.stored_reference.empty() ? nlohmann::json(nullptr) : nlohmann::json(r.stored_reference);
  j["first_divergence"] = r.first_divergence.empty() ? nlohmann::json(nullptr)
                                                     : nlohmann::json{{"component", r.first_divergence},
                                                                      {"detail", r.first_divergence_detail}};
  return j;
}

nlohmann::json to_json(const std::vector<CaseReport>& rs) {
  nlohmann::json cases = nlohmann::json::array();
  for (const CaseReport& r : rs) cases.push_back(to_json(r));
  nlohmann::json doc = {{"cases", std::move(cases)}};
  doc["reference"] = rs.empty() ? nlohmann::json(nullptr) : to_json(rs.front().reference);
  return doc;
}

}  // namespace tparity
