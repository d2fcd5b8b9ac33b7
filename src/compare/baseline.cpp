#include "tparity/compare/baseline.hpp"

#include <fmt/format.h>

#include <algorithm>
#include <cmath>

#include "tparity/harness/dtensor.hpp"
#include "tparity/harness/io.hpp"

namespace tparity {

bool recorded_leg(const Leg& leg) {
  return !leg.diagnostic && (leg.role == LegRole::Semantic || leg.role == LegRole::Numeric) &&
         leg.name.rfind("hand", 0) == 0;
}

std::string entry_key(const std::string& case_name, const std::string& component, const std::string& leg) {
  return case_name + "/" + component + "/" + leg;
}

double drift_floor(const std::string& leg) { return leg.find("hand64") != std::string::npos ? 0x1.0p-50 : 0x1.0p-26; }

Baseline read_baseline(const std::string& path) { return parse_baseline(read_input_file(path, "baseline"), path); }

Baseline parse_baseline(const std::string& text, const std::string& path) {
  const std::string where = show_text(path, 300);
  const nlohmann::json doc = parse_json(text, where);
  auto fail = [&](const std::string& field, const std::string& what) {
    throw InputError(where + ": " + show_text(field, 200) + ": " + what);
  };
  if (!doc.is_object()) fail("(top level)", std::string("expected a JSON object, got ") + doc.type_name());
  if (!doc.contains("format") || doc["format"] != kBaselineFormat)
    fail("format", fmt::format("expected \"{}\", got {}", kBaselineFormat,
                               doc.contains("format") ? show_json(doc["format"]) : "nothing"));
  if (!doc.contains("version") || doc["version"] != 1)
    fail("version",
         "expected 1, got " + (doc.contains("version") ? show_json(doc["version"]) : std::string("nothing")));
  for (auto it = doc.begin(); it != doc.end(); ++it)
    if (it.key() != "format" && it.key() != "version" && it.key() != "environment" && it.key() != "entries")
      fail(it.key(), "unexpected field (expected format, version, environment, entries)");
  Baseline b;
  if (doc.contains("environment")) {
    if (!doc["environment"].is_object()) fail("environment", "expected an object of strings");
    for (auto it = doc["environment"].begin(); it != doc["environment"].end(); ++it) {
      if (!it.value().is_string())
        fail("environment." + it.key(),
             "expected a string, got " + std::string(it.value().type_name()) + " " + show_json(it.value()));
      b.environment[it.key()] = it.value().get<std::string>();
    }
  }
  if (!doc.contains("entries") || !doc["entries"].is_object()) fail("entries", "expected an object of numbers");
  for (auto it = doc["entries"].begin(); it != doc["entries"].end(); ++it) {
    if (!it.value().is_number() || it.value().get<double>() < 0)
      fail("entries." + it.key(), "expected a number >= 0, got " + show_json(it.value()));
    b.entries[it.key()] = it.value().get<double>();
  }
  return b;
}

nlohmann::json baseline_to_json(const Baseline& b) {
  nlohmann::json env = nlohmann::json::object(), entries = nlohmann::json::object();
  for (const auto& [k, v] : b.environment) env[k] = v;
  for (const auto& [k, v] : b.entries) entries[k] = v;
  return {{"format", kBaselineFormat}, {"version", 1}, {"environment", env}, {"entries", entries}};
}

Baseline make_baseline(const std::vector<CaseReport>& reports, std::map<std::string, std::string> environment) {
  Baseline b;
  b.environment = std::move(environment);
  for (const CaseReport& r : reports)
    for (const ComponentReport& c : r.components)
      for (const Leg& l : c.legs)
        if (recorded_leg(l))
          b.entries[entry_key(r.name, c.name, l.name)] = std::stod(fmt::format("{:.3g}", l.m.rel_l2));
  return b;
}

std::vector<Drift> find_drift(const std::vector<CaseReport>& reports, const Baseline& b, double factor) {
  std::vector<Drift> out;
  for (const CaseReport& r : reports)
    for (const ComponentReport& c : r.components)
      for (const Leg& l : c.legs) {
        if (!recorded_leg(l)) continue;
        Drift d{entry_key(r.name, c.name, l.name), r.name, c.name, l.name, l.m.rel_l2, 0, 0, false};
        auto it = b.entries.find(d.key);
        if (it == b.entries.end()) {
          d.missing = true;
          out.push_back(d);
          continue;
        }
        d.baseline = it->second;
        // A float32 error of few effective elements scatters from run to run (another CPU, another
        // instruction set of the hand core): allow the scatter of two samples of it (noise.hpp).
        // (hand32's by torch32_vs_torch64, a low precision's handbf16 by torchbf16_vs_torch64.)
        const std::string prec = l.name.substr(4, l.name.find("_vs_") - 4);
        const Leg* noise = prec == "64" ? nullptr : c.leg("torch" + prec + "_vs_torch64");
        const double q = noise && noise->noise.samples > 0 ? noise_quantile(noise->noise.n_eff, 1) : 1.0;
        d.bound = factor * q * std::max(d.baseline, drift_floor(l.name));
        if (!(d.value <= d.bound)) out.push_back(d);
      }
  return out;
}

}  // namespace tparity
