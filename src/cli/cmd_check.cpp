// tparity check: the hand core (and LibTorch) against the outputs a fixture stores.
#include "common.hpp"
#include "tparity/eval/evaluate.hpp"
#include "tparity/fixture/fixture.hpp"

namespace tparity::cli {

namespace {

struct CheckOptions {
  std::vector<std::string> fixtures;
  Format format = Format::Table;
  ReportOptions report;
};

int check(const CheckOptions& o) {
  std::vector<CaseReport> reports;
  for (const std::string& f : o.fixtures) {
    std::vector<CaseReport> rs = check_fixture(read_fixture(f), f, GatePolicy{});
    reports.insert(reports.end(), rs.begin(), rs.end());
  }
  apply_accept(reports, o.report);
  return emit(reports, o.format, o.report.full);
}

}  // namespace

void register_check(CLI::App& app, Action& action) {
  auto o = std::make_shared<CheckOptions>();
  CLI::App* cmd =
      app.add_subcommand("check", "Compare the hand core (and LibTorch) with the outputs stored in fixtures");
  cmd->add_option("--fixture", o->fixtures, "Fixture file(s), format v1")->required();
  add_format_option(*cmd, o->format);
  add_report_options(*cmd, o->report);
  add_max_elements_option(*cmd);
  cmd->callback([o, &action] { action = [o] { return check(*o); }; });
}

}  // namespace tparity::cli
