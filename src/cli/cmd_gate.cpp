// tparity gate: the CI regression gate. Runs the default cases and every committed fixture; fails
// when a comparator gate fails, and when an error has grown beyond --factor times its recorded
// baseline, even under tolerance (a ratchet on drift).
#include <fmt/format.h>

#include <algorithm>
#include <filesystem>
#include <map>

#include "common.hpp"
#include "gating.hpp"
#include "tparity/compare/baseline.hpp"
#include "tparity/compare/report.hpp"
#include "tparity/core/gemm.hpp"
#include "tparity/eval/evaluate.hpp"
#include "tparity/fixture/fixture.hpp"
#include "tparity/harness/cases.hpp"
#include "tparity/torch/reference.hpp"

namespace tparity::cli {

namespace {

namespace fs = std::filesystem;

struct GateOptions {
  std::string baseline = "fixtures/baseline.json";
  std::string fixtures = "fixtures";  // the committed fixtures, as the baseline is
  std::string junit;
  bool update = false;
  double factor = 2.0;
  ReportOptions report;
};

// The fixtures under dir, its subdirectories included (one per torch version that exported a set):
// every .json file but the baseline itself (and any other baseline*.json).
std::vector<std::string> fixture_files(const std::string& dir, const std::string& baseline) {
  std::error_code ec;
  if (!fs::is_directory(dir, ec)) throw InputError("option --fixtures: " + dir + ": not a directory");
  std::vector<std::string> files;
  for (const auto& e : fs::recursive_directory_iterator(dir)) {
    if (e.path().extension() != ".json" || e.path().filename().string().rfind("baseline", 0) == 0) continue;
    if (fs::equivalent(e.path(), baseline, ec)) continue;
    files.push_back(e.path().string());
  }
  std::sort(files.begin(), files.end());
  return files;
}

int gate(const GateOptions& o) {
  check_factor(o.factor);
  // Before the long run: a bad path fails at once.
  if (!o.junit.empty()) check_output_path(o.junit, "option --junit");
  if (o.update) check_output_path(o.baseline, "option --baseline (--update-baseline writes it)");
  Baseline baseline;
  if (!o.update) baseline = read_baseline(o.baseline);
  if (!o.junit.empty()) check_output_path(o.junit, "option --junit");  // not the baseline just read

  std::vector<Gated> gated;
  for (const CaseSpec& s : default_cases())
    gated.push_back({evaluate_problem(make_problem(s), s.describe(), s.seed, GatePolicy{}), std::to_string(s.seed),
                     fmt::format("tparity run --case {} --seed {}", s.name, s.seed)});
  for (const std::string& f : fixture_files(o.fixtures, o.baseline)) {
    // Named by the file below --fixtures ("torch-2.13/mha_single"): two sets share fixture names.
    std::string stem = fs::path(f).lexically_relative(o.fixtures).replace_extension().generic_string();
    const Problem p = read_fixture(f);
    const bool version_dependent = !semantic_differences(p).empty();
    for (CaseReport& r : check_fixture(p, f, GatePolicy{})) {
      const size_t slash = r.name.find('/');
      const std::string suffix = slash == std::string::npos ? "" : r.name.substr(slash);
      r.name = stem + suffix;
      gated.push_back(
          {std::move(r), "none (fixture data)", "tparity check --fixture " + f, version_dependent && !suffix.empty()});
    }
  }

  std::vector<CaseReport> reports;
  for (Gated& g : gated) {
    std::vector<CaseReport> one{std::move(g.report)};
    apply_accept(one, o.report);
    g.report = std::move(one.front());
    reports.push_back(g.report);
  }
  // Which PyTorch judged, recorded with the baseline and compared with the one that recorded it.
  const ReferenceInfo ref = reference_info();
  const std::map<std::string, std::string> env{{"torch", ref.torch},
                                               {"source", ref.source},
                                               {"blas", ref.blas},
                                               {"kernel", ref.kernel},
                                               {"capability", ref.capability},
                                               {"threads", std::to_string(ref.threads)},
                                               {"hand_isa", to_string(gemm_isa())}};

  if (o.update) {
    size_t failing = 0;
    for (const Gated& g : gated)
      for (const Failure& f : g.report.failures) {
        ++failing;
        fmt::print("FAIL {}; seed {}; re-run: {}\n", f.text, g.seed, g.rerun);
      }
    if (failing) {
      fmt::print("gate: {} failures: a baseline is not recorded from a failing run; {} left as it was\n", failing,
                 o.baseline);
      return kFail;
    }
    const Baseline b = make_baseline(reports, env);
    OutputFiles out;  // the baseline and the JUnit report, both or neither
    out.add(o.baseline, baseline_to_json(b).dump(2, ' ', false, kBadUtf8Replaced) + "\n");
    if (!o.junit.empty()) out.add(o.junit, junit_xml(gated, {}, ref));
    out.commit();
    fmt::print("baseline {}: {} entries from {} cases; reference: {}; hand core ISA {}\n", o.baseline, b.entries.size(),
               reports.size(), ref.line(), env.at("hand_isa"));
    return kPass;
  }

  for (const auto& [k, v] : env) {
    auto it = baseline.environment.find(k);
    const std::string was = it == baseline.environment.end() ? "unrecorded" : it->second;
    if (was != v)
      fmt::print(
          "note: environment differs from the baseline's: {} is {} here, {} in {}; figures may move for that "
          "reason alone\n",
          k, v, was, o.baseline);
  }

  // Failures, one line each, ending with the seed and the command that re-runs only that case.
  std::map<std::string, std::vector<std::string>> by_test;  // "tparity.<case>\n<component>" -> lines
  std::vector<std::string> lines;
  std::map<std::string, const Gated*> by_case;
  std::map<std::string, size_t> failed_by_case;
  for (const Gated& g : gated) by_case[g.report.name] = &g;
  auto add = [&](const Gated& g, const Failure& f) {
    const std::string full = fmt::format("{}; seed {}; re-run: {}", f.text, g.seed, g.rerun);
    lines.push_back(full);
    by_test[junit_key(g.report, f)].push_back(full);
    ++failed_by_case[g.report.name];
  };
  for (const Gated& g : gated)
    for (const Failure& f : g.report.failures) add(g, f);
  size_t optional_missing = 0;
  for (const Drift& d : find_drift(reports, baseline, o.factor)) {
    const Gated& g = *by_case.at(d.case_name);
    if (d.missing && g.entries_optional) {
      ++optional_missing;
      continue;
    }
    if (d.missing)
      add(g, {d.component, d.leg,
              fmt::format("case {}: component {}: leg {}: rel_l2 {:.3g} has no baseline entry in {} (record one with "
                          "tparity gate --update-baseline and commit the diff)",
                          d.case_name, d.component, d.leg, d.value, o.baseline)});
    else
      add(g, {d.component, d.leg,
              fmt::format("case {}: component {}: leg {}: rel_l2 {:.3g} > drift bound {:.3g} ({:g} x baseline {:.3g}"
                          "{}): grew beyond the baseline",
                          d.case_name, d.component, d.leg, d.value, d.bound, o.factor, d.baseline,
                          d.bound > o.factor * d.baseline ? fmt::format(", floor {:.3g}", drift_floor(d.leg)) : "")});
  }

  // Each case's summary line (a pass that drifted beyond the baseline is a FAIL here), and with --full
  // its table; then every failure with its re-run command, and the diagnoses.
  for (const Gated& g : gated) {
    std::string line = summary_line(g.report);
    if (g.report.pass && failed_by_case.count(g.report.name))
      line = "FAIL" + line.substr(4) + "; drifted beyond the baseline";
    fmt::print("{}\n", line);
    if (o.report.full) fmt::print("{}", render_table(g.report));
  }
  for (const std::string& l : lines) fmt::print("FAIL {}\n", l);
  for (const Gated& g : gated)
    for (const Diagnosis& d : g.report.diagnoses)
      fmt::print("diagnosis: case {}: {}: {}: {}\n", g.report.name, d.component, d.leg, d.text);
  if (optional_missing)
    fmt::print(
        "note: {} figures of fixtures compared with this LibTorch's decomposition have no baseline entry: the "
        "baseline was recorded under a torch whose semantics differ where those fixtures exercise the difference\n",
        optional_missing);
  fmt::print("gate: {} cases, {} failures (factor {:g}, baseline {}); reference: {}\n", gated.size(), lines.size(),
             o.factor, o.baseline, ref.line());
  if (!o.junit.empty()) write_output_file(o.junit, junit_xml(gated, by_test, ref));
  return lines.empty() ? kPass : kFail;
}

}  // namespace

void register_gate(CLI::App& app, Action& action) {
  auto o = std::make_shared<GateOptions>();
  CLI::App* cmd = app.add_subcommand(
      "gate", "CI regression gate: default cases and committed fixtures against their gates and a recorded baseline");
  cmd->add_option("--baseline", o->baseline, "Baseline file")->capture_default_str();
  cmd->add_option("--fixtures", o->fixtures, "Directory of fixtures to check")->capture_default_str();
  cmd->add_option("--junit", o->junit, "Also write JUnit XML here (one testcase per case and component)")
      ->check(not_empty("a file to write"));
  cmd->add_flag("--update-baseline", o->update, "Record this run as the baseline (only when every gate passes)");
  cmd->add_option("--factor", o->factor, "Fail when an error grows beyond this factor of its baseline")
      ->capture_default_str();
  add_report_options(*cmd, o->report);
  add_max_elements_option(*cmd);
  cmd->callback([o, &action] { action = [o] { return gate(*o); }; });
}

}  // namespace tparity::cli
