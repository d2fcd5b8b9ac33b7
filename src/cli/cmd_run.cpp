// tparity run: the default cases (or a chosen few, with sizes overridden), every component, four legs.
#include <fmt/format.h>

#include <limits>
#include <map>
#include <optional>

#include "common.hpp"
#include "pretrained.hpp"
#include "tparity/api.hpp"
#include "tparity/compare/report.hpp"
#include "tparity/eval/evaluate.hpp"
#include "tparity/fixture/fixture.hpp"
#include "tparity/harness/cases.hpp"

namespace tparity::cli {

namespace {

struct RunOptions {
  CaseSelection selection;
  Format format = Format::Table;
  ReportOptions report;
};

bool any_override(const CaseOverrides& o) {
  return o.batch || o.seq || o.kv_seq || o.dim || o.value_dim || o.out_dim || o.heads || o.kv_heads || o.scale ||
         o.ffn || o.bias || o.activation || o.mask || o.seed || o.random_params || !o.config.empty() || o.head_dim ||
         o.decode_steps || o.positions_offset || o.padding || o.rope || o.rotary_fraction || o.eps;
}

int run(const RunOptions& o) {
  const std::vector<std::string>& names = o.selection.cases;
  const CaseOverrides& overrides = o.selection.overrides;
  const std::vector<std::string>& without = o.selection.without;
  check_without(without);
  std::vector<CaseSpec> chosen = names.empty() ? default_cases() : std::vector<CaseSpec>{};
  std::vector<const PretrainedCase*> pretrained;
  for (const std::string& name : names)
    if (const PretrainedCase* c = find_pretrained(name)) {
      if (any_override(overrides))
        throw InputError("case " + name +
                         ": sizes and options are the checkpoint's own; drop the size, mask, seed "
                         "and parameter options, or run it alone");
      pretrained.push_back(c);
    } else {
      try {
        chosen.push_back(find_case(name));  // a default or a stress case
      } catch (const InputError&) {
        std::string pre;
        for (const PretrainedCase& other : pretrained_cases()) pre += ", " + other.name;
        throw InputError("option --case: expected one of " + case_names() + pre + ", got \"" + name + "\"");
      }
    }
  // With no --case, the pretrained cases run after the generated ones, unless options reshape the run.
  if (names.empty() && !any_override(overrides))
    for (const PretrainedCase& c : pretrained_cases()) pretrained.push_back(&c);
  std::vector<CaseReport> reports;
  nlohmann::json skipped = nlohmann::json::array();
  std::vector<std::string> without_lines;                             // printed once the run is known to run
  auto skip = [&](const std::string& name, const std::string& why) {  // one line each, never a failure
    without_lines.push_back("skipped " + name + ": " + why);
    skipped.push_back({{"name", name}, {"reason", why}});
  };
  for (CaseSpec s : chosen) {
    apply_overrides(s, overrides);
    if (const std::string why = without_features(s, without); !why.empty()) {
      skip(s.name, why);
      continue;
    }
    check_size(s, o.selection.max_elements);
    reports.push_back(evaluate_problem(make_problem(s), s.describe(), s.seed, GatePolicy{}));
    reports.back().not_checked = s.not_checked;
  }
  for (const PretrainedCase* c : pretrained) {
    std::string missing;
    const std::optional<std::string> f = pretrained_fixture(*c, missing);
    if (!f) {  // one line, never a failure: the model's package is not installed here
      std::fprintf(stderr, "%s\n", missing.c_str());
      skipped.push_back({{"name", c->name}, {"reason", missing}});
      continue;
    }
    const Problem fixture = read_fixture(*f);
    if (const std::string why = fixture_without(fixture, without); !why.empty()) {
      skip(c->name, why);
      continue;
    }
    for (CaseReport& r : check_fixture(fixture, *f, GatePolicy{})) {
      const size_t slash = r.name.find('/');
      r.name = c->name + (slash == std::string::npos ? "" : r.name.substr(slash));
      reports.push_back(std::move(r));
    }
  }
  // A run that judged nothing must not pass: --without left no variant of any chosen case.
  if (reports.empty() && !without.empty())
    throw InputError(fmt::format("option --without: nothing was run: no chosen case has a variant without {} ({})",
                                 fmt::join(without, ", "), fmt::join(without_lines, "; ")));
  for (const std::string& line : without_lines) std::fprintf(stderr, "%s\n", line.c_str());
  apply_accept(reports, o.report);
  if (o.format == Format::Json) {
    nlohmann::json doc = to_json(reports);
    doc["skipped"] = skipped;
    std::fputs((doc.dump(2, ' ', false, kBadUtf8Replaced) + "\n").c_str(), stdout);
    return exit_code(reports) ? kFail : kPass;
  }
  return emit(reports, o.format, o.report.full);
}

}  // namespace

void register_run(CLI::App& app, Action& action) {
  auto o = std::make_shared<RunOptions>();
  CLI::App* cmd = app.add_subcommand(
      "run", "Run the default cases (or --case NAME ...): every component, hand vs LibTorch, float64 and float32");
  std::string pretrained;
  for (const PretrainedCase& c : pretrained_cases()) pretrained += ", " + c.name + " (" + c.description + ")";
  add_case_options(*cmd, o->selection, pretrained);
  add_format_option(*cmd, o->format);
  add_report_options(*cmd, o->report);
  cmd->callback([o, &action] { action = [o] { return run(*o); }; });
}

}  // namespace tparity::cli
