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
    for (auto [from, to] : {std::pair<const char*, const char*>{"libtorch", "lt"}, {"hand", "h"}, {"torch", "t"}})
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
    // Columns: the legs of the first component (all components share the leg set of their case,
    // fixture components may have fewer).
    std::vector<std::pair<std::string, LegRole>> cols;
    for (const ComponentReport& c : r.components)
      for (const Leg& l : c.legs) {
        bool have = false;
        for (auto& [n, role] : cols) have = have || n == l.name;
        if (!have) cols.push_back({l.name, l.role});
      }
    std::string h1 = fmt::format("  {:<18} {:<14}", "", ""), h2 = fmt::format("  {:<18} {:<14}", "component", "shape");
    for (auto& [n, role] : cols) {
      const std::string label = short_leg(n);
      switch (role) {
        case LegRole::Semantic:
        case LegRole::Numeric:
          h1 += fmt::format(" {:<19}", label);
          h2 += fmt::format(" {:>9} {:>9}", "rel_l2", "bound");
          break;
        case LegRole::Noise:
          h1 += fmt::format(" {:<9}", label);
          h2 += fmt::format(" {:>9}", "rel_l2");
          break;
        case LegRole::Report:
          h1 += fmt::format(" {:<29}", label);
          h2 += fmt::format(" {:>9} {:>9} {:>9}", "l2", "rel_l2", "max_abs");
          break;
      }
    }
    out += h1 + "\n" + h2 + "  verdict  non-finite (matched)\n";
    for (const ComponentReport& c : r.components) {
      std::string row = fmt::format("  {:<18} {:<14}", c.name, compact_shape(c.shape));
      int64_t nan = 0, inf = 0;
      for (auto& [n, role] : cols) {
        const Leg* l = c.leg(n);
        const int w = role == LegRole::Report ? 29 : (role == LegRole::Noise ? 9 : 19);
        if (!l) {
          row += fmt::format(" {:>{}}", "-", w);
          continue;
        }
        nan = std::max(nan, l->m.nan_matched);
        inf = std::max(inf, l->m.inf_matched);
        switch (role) {
          case LegRole::Semantic:
          case LegRole::Numeric:
            row += fmt::format(" {:>9} {:>9}", sci(l->m.rel_l2), sci(l->bound));
            break;
          case LegRole::Noise:
            row += fmt::format(" {:>9}", sci(l->m.rel_l2));
            break;
          case LegRole::Report:
            row += fmt::format(" {:>9} {:>9} {:>9}", sci(l->m.l2), sci(l->m.rel_l2), sci(l->m.max_abs));
            break;
        }
      }
      row += fmt::format("  {:<7}", c.pass ? "PASS" : "FAIL");
      if (nan || inf)
        row += fmt::format("  {}{}", nan ? fmt::format("nan {} ", nan) : "", inf ? fmt::format("inf {}", inf) : "");
      out += row + "\n";
    }
  }
  for (const std::string& n : r.notes) out += "  note: " + n + "\n";
  for (const std::string& f : r.failures) out += "  FAIL " + f + "\n";
  out += fmt::format("  => {}\n", r.pass ? "PASS" : "FAIL");
  return out;
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
                          {"pass", l.pass}};
      if (l.role == LegRole::Semantic || l.role == LegRole::Numeric) j["bound"] = l.bound;
      if (!l.m.comparable()) j["shape_mismatch"] = l.m.shape_mismatch;
      legs[l.name] = std::move(j);
    }
    comps.push_back({{"name", c.name}, {"shape", c.shape}, {"pass", c.pass}, {"legs", std::move(legs)}});
  }
  nlohmann::json j = {{"name", r.name},  {"description", r.description},   {"config", r.config},
                      {"pass", r.pass},  {"components", std::move(comps)}, {"failures", r.failures},
                      {"notes", r.notes}};
  j["seed"] = r.has_seed ? nlohmann::json(r.seed) : nlohmann::json(nullptr);
  return j;
}

nlohmann::json to_json(const std::vector<CaseReport>& rs) {
  nlohmann::json cases = nlohmann::json::array();
  for (const CaseReport& r : rs) cases.push_back(to_json(r));
  return {{"cases", std::move(cases)}};
}

}  // namespace tparity
