#include "tparity/api.hpp"

#include <fmt/format.h>

namespace tparity {

std::vector<CaseReport> check_cases(const Implementation& impl, const std::vector<std::string>& names,
                                    const GatePolicy& policy) {
  std::vector<CaseReport> reports;
  const std::vector<CaseSpec> all = default_cases();
  for (const CaseSpec& s : all) {
    bool wanted = names.empty();
    for (const std::string& n : names) wanted = wanted || n == s.name;
    if (wanted) reports.push_back(evaluate_problem(make_problem(s), s.describe(), s.seed, policy, impl));
  }
  for (const std::string& n : names) {
    bool known = false;
    for (const CaseSpec& s : all) known = known || s.name == n;
    if (!known) {
      std::string list;
      for (const CaseSpec& s : all) list += (list.empty() ? "" : ", ") + s.name;
      throw InputError(fmt::format("check_cases: expected case names among {}, got \"{}\"", list, n));
    }
  }
  return reports;
}

std::vector<CaseReport> check_fixtures(const Implementation& impl, const std::vector<std::string>& paths,
                                       const GatePolicy& policy) {
  std::vector<CaseReport> reports;
  for (const std::string& f : paths) {
    std::vector<CaseReport> rs = check_fixture(read_fixture(f), f, policy, impl);
    reports.insert(reports.end(), rs.begin(), rs.end());
  }
  return reports;
}

int exit_code(const std::vector<CaseReport>& reports) {
  for (const CaseReport& r : reports)
    if (!r.pass) return 1;
  return 0;
}

void print_reports(const std::vector<CaseReport>& reports, std::FILE* out, bool json, bool full) {
  if (json) {
    std::fputs((to_json(reports).dump(2) + "\n").c_str(), out);
    return;
  }
  size_t failed = 0;
  if (!reports.empty()) {
    // Which PyTorch judged, once, and again where a case says otherwise.
    std::fputs(fmt::format("reference: {}\n", reports.front().reference.line()).c_str(), out);
    if (!reports.front().reference.warning.empty())
      std::fputs(fmt::format("warning: {}\n", reports.front().reference.warning).c_str(), out);
    std::fputs("\n", out);
  }
  for (const CaseReport& r : reports) {
    failed += r.pass ? 0 : 1;
    std::fputs((full ? render_table(r) + "\n" : render_summary(r)).c_str(), out);
  }
  std::fputs(fmt::format("{} case(s): {} passed, {} failed\n", reports.size(), reports.size() - failed, failed).c_str(),
             out);
}

}  // namespace tparity
