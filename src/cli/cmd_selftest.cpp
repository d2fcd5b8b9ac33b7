// tparity selftest: the defect-detection matrix. The default cases run on the clean hand core (no
// alarm allowed), then once per deliberately injected defect (core/defects.hpp); a defect is caught
// by a case when that case fails a gate. Exit 0 only when the clean core passes every case and every
// defect is caught by at least one.
#include <fmt/format.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <stdexcept>

#include "common.hpp"
#include "tparity/core/defects.hpp"
#include "tparity/eval/evaluate.hpp"
#include "tparity/harness/cases.hpp"

namespace tparity::cli {

namespace {

struct SelftestOptions {
  std::vector<std::string> defects;  // default: all
  std::vector<std::string> cases;    // default: every default case
  Format format = Format::Table;
  bool thresholds = false;
};

// The detection threshold of the float32 gate on each component of the clean core: the smallest
// uniform relative perturbation (every element times 1 + eps r, r = +-1 at random) that the gate
// catches, eps = sqrt(bound^2 - rel_l2^2) (the perturbation adds to the core's own error in
// quadrature), against LibTorch's float32 noise on the same component (rms of its samples).
int thresholds(const SelftestOptions& o) {
  std::vector<CaseSpec> cases = o.cases.empty() ? default_cases() : std::vector<CaseSpec>{};
  for (const std::string& n : o.cases) cases.push_back(find_case(n));
  nlohmann::json out = nlohmann::json::array();
  if (o.format == Format::Table)
    fmt::print("{:<10} {:>6} {:>10} {:>10} {:>10} {:>10} {:>10}  {}\n", "case", "comps", "eps min", "eps median",
               "x noise lo", "x noise med", "x noise hi", "widest (few effective elements)");
  for (const CaseSpec& s : cases) {
    const CaseReport r = evaluate_problem(make_problem(s), s.describe(), s.seed, GatePolicy{});
    std::vector<double> eps, ratio;
    std::string widest;
    double widest_ratio = 0;
    nlohmann::json comps = nlohmann::json::array();
    for (const ComponentReport& c : r.components) {
      const Leg* h = c.leg("hand32_vs_torch64");
      if (!h || h->noise.rms <= 0) continue;
      const double e = std::sqrt(std::max(0.0, h->bound * h->bound - h->m.rel_l2 * h->m.rel_l2));
      eps.push_back(e);
      ratio.push_back(e / h->noise.rms);
      if (ratio.back() > widest_ratio)
        widest_ratio = ratio.back(),
        widest = fmt::format("{} ({:.3g}x, n_eff {:.3g})", c.name, ratio.back(), h->noise.n_eff);
      comps.push_back({{"component", c.name},
                       {"eps", e},
                       {"noise_rms", h->noise.rms},
                       {"n_eff", h->noise.n_eff},
                       {"x_noise", ratio.back()}});
    }
    if (eps.empty()) continue;
    auto median = [](std::vector<double> v) {
      std::sort(v.begin(), v.end());
      return v[v.size() / 2];
    };
    const double lo = *std::min_element(ratio.begin(), ratio.end());
    if (o.format == Format::Table)
      fmt::print("{:<10} {:>6} {:>10.3g} {:>10.3g} {:>10.3g} {:>10.3g} {:>10.3g}  {}\n", s.name, eps.size(),
                 *std::min_element(eps.begin(), eps.end()), median(eps), lo, median(ratio), widest_ratio, widest);
    out.push_back({{"case", s.name}, {"components", comps}});
  }
  if (o.format == Format::Json)
    fmt::print("{}\n", nlohmann::json{{"thresholds", out}}.dump(2, ' ', false, kBadUtf8Replaced));
  return kPass;
}

// One cell of the matrix: did this case catch this defect, and where did it first diverge.
struct Cell {
  bool caught = false;
  std::string first;  // the first divergence (local error), else the first failing component
  size_t failures = 0;
};

Cell evaluate(const CaseSpec& s) {
  const CaseReport r = evaluate_problem(make_problem(s), s.describe(), s.seed, GatePolicy{});
  Cell c;
  c.caught = !r.pass;
  c.failures = r.failures.size();
  c.first = r.first_divergence;
  if (c.first.empty())
    for (const ComponentReport& comp : r.components)
      if (!comp.pass) {
        c.first = comp.name;
        break;
      }
  // Else the first failure's component (one missing from an implementation fails no leg), or, for a
  // failure of the case as a whole, the reference's: the only such failure of an evaluation.
  if (c.first.empty() && !r.failures.empty())
    c.first = r.failures.front().component.empty() ? "(reference)" : r.failures.front().component;
  return c;
}

int selftest(const SelftestOptions& o) {
  if (o.thresholds) return thresholds(o);
  std::vector<Defect> defects;
  for (const std::string& n : o.defects) {
    try {
      const Defect d = defect_from_name(n);
      if (d == Defect::None)
        throw std::invalid_argument("expected a defect, got \"none\" (the clean core always runs)");
      defects.push_back(d);
    } catch (const std::invalid_argument& e) {
      throw InputError(std::string("option --defect: ") + e.what());
    }
  }
  if (defects.empty()) defects = all_defects();
  std::vector<CaseSpec> cases = o.cases.empty() ? default_cases() : std::vector<CaseSpec>{};
  if (o.cases.empty())  // the numeric defects' stress: large scores, 16384 keys
    for (const CaseSpec& s : stress_cases()) cases.push_back(s);
  for (const std::string& n : o.cases) cases.push_back(find_case(n));

  const auto t0 = std::chrono::steady_clock::now();
  inject_defect(Defect::None);
  // Case by case: clean, then under each defect, LibTorch's runs of the case kept for its rows (a
  // defect in the hand core leaves them as they are) and let go before the next case.
  std::vector<Cell> clean(cases.size());
  std::vector<std::vector<Cell>> matrix(defects.size(), std::vector<Cell>(cases.size()));
  for (size_t k = 0; k < cases.size(); ++k) {
    const ReferenceMemo memo;
    clean[k] = evaluate(cases[k]);
    for (size_t i = 0; i < defects.size(); ++i) {
      const ScopedDefect scoped(defects[i]);
      matrix[i][k] = evaluate(cases[k]);
    }
  }
  const double seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();

  bool clean_ok = true;
  for (const Cell& c : clean) clean_ok = clean_ok && !c.caught;
  size_t caught_defects = 0;
  std::vector<bool> caught(defects.size(), false);
  for (size_t i = 0; i < defects.size(); ++i) {
    for (const Cell& c : matrix[i]) caught[i] = caught[i] || c.caught;
    caught_defects += caught[i];
  }
  const bool pass = clean_ok && caught_defects == defects.size();
  size_t numeric = 0, numeric_caught = 0;
  for (size_t i = 0; i < defects.size(); ++i)
    if (numeric_defect(defects[i])) ++numeric, numeric_caught += caught[i];

  if (o.format == Format::Json) {
    nlohmann::json jclean = nlohmann::json::array(), jdefects = nlohmann::json::array();
    for (size_t k = 0; k < cases.size(); ++k)
      jclean.push_back({{"case", cases[k].name}, {"alarm", clean[k].caught}, {"first_divergence", clean[k].first}});
    for (size_t i = 0; i < defects.size(); ++i) {
      nlohmann::json jcases = nlohmann::json::array();
      for (size_t k = 0; k < cases.size(); ++k) {
        const Cell& c = matrix[i][k];
        jcases.push_back({{"case", cases[k].name},
                          {"caught", c.caught},
                          {"failures", c.failures},
                          {"first_divergence", c.caught ? nlohmann::json(c.first) : nlohmann::json(nullptr)}});
      }
      jdefects.push_back({{"name", defect_name(defects[i])},
                          {"kind", numeric_defect(defects[i]) ? "numeric" : "semantic"},
                          {"description", defect_description(defects[i])},
                          {"caught", caught[i]},
                          {"cases", jcases}});
    }
    const nlohmann::json doc = {{"pass", pass}, {"clean", jclean}, {"defects", jdefects}, {"seconds", seconds}};
    fmt::print("{}\n", doc.dump(2, ' ', false, kBadUtf8Replaced));
    return pass ? kPass : kFail;
  }

  // The matrix: a column per case, X caught, . missed; then, per defect, where each catching case
  // first diverged.
  size_t w = std::string("clean core (no alarm)").size();
  for (Defect d : defects) w = std::max(w, defect_name(d).size());
  std::string header = fmt::format("{:<{}}", "defect \\ case", w);
  for (const CaseSpec& s : cases) header += fmt::format(" {:>{}}", s.name, std::max<size_t>(s.name.size(), 1));
  fmt::print(
      "tparity selftest: {} defects ({} semantic, {} numeric: float32 only) x {} cases (X caught: the case fails a "
      "gate; . missed)\n\n",
      defects.size(), defects.size() - numeric, numeric, cases.size());
  fmt::print("{}\n", header);
  auto row = [&](const std::string& label, const std::vector<Cell>& cells, bool clean_row) {
    std::string line = fmt::format("{:<{}}", label, w);
    for (size_t k = 0; k < cases.size(); ++k)
      line += fmt::format(" {:>{}}", clean_row ? (cells[k].caught ? "ALARM" : "ok") : (cells[k].caught ? "X" : "."),
                          cases[k].name.size());
    return line;
  };
  fmt::print("{}\n", row("clean core (no alarm)", clean, true));
  for (size_t i = 0; i < defects.size(); ++i) fmt::print("{}\n", row(defect_name(defects[i]), matrix[i], false));
  fmt::print("\nfirst divergence (the first component whose own error breaks its gate):\n");
  for (size_t i = 0; i < defects.size(); ++i) {
    std::string where;
    for (size_t k = 0; k < cases.size(); ++k)
      if (matrix[i][k].caught)
        where += fmt::format("{}{} at {}", where.empty() ? "" : ", ", cases[k].name, matrix[i][k].first);
    fmt::print("  {:<{}}  {} ({}): {}\n", defect_name(defects[i]), w, defect_description(defects[i]),
               numeric_defect(defects[i]) ? "numeric" : "semantic", where.empty() ? "MISSED by every case" : where);
  }
  for (size_t k = 0; k < cases.size(); ++k)
    if (clean[k].caught)
      fmt::print("ALARM: the clean core fails case {} (first at {}): tparity run --case {}\n", cases[k].name,
                 clean[k].first, cases[k].name);
  fmt::print("\nselftest: {} of {} semantic and {} of {} numeric defects caught, clean core {} ({:.0f} s) => {}\n",
             caught_defects - numeric_caught, defects.size() - numeric, numeric_caught, numeric,
             clean_ok ? "raises no alarm" : "RAISES AN ALARM", seconds, pass ? "PASS" : "FAIL");
  return pass ? kPass : kFail;
}

}  // namespace

void register_selftest(CLI::App& app, Action& action) {
  auto o = std::make_shared<SelftestOptions>();
  CLI::App* cmd = app.add_subcommand(
      "selftest",
      "The defect-detection matrix: the default cases on the clean hand core and with each injected defect");
  std::string names;
  for (Defect d : all_defects()) names += (names.empty() ? "" : ", ") + defect_name(d);
  cmd->add_option("--defect", o->defects, "Defects to inject (default: all): " + names);
  cmd->add_option("--case", o->cases, "Cases to run (default: every default case, softmax_hot and long_keys)");
  cmd->add_flag("--thresholds", o->thresholds,
                "Instead of the matrix: the smallest uniform relative error each component's float32 gate catches, "
                "against LibTorch's noise");
  add_format_option(*cmd, o->format);
  cmd->callback([o, &action] { action = [o] { return selftest(*o); }; });
}

}  // namespace tparity::cli
