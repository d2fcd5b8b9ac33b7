#include "common.hpp"

#include <fmt/format.h>

#include <cstdio>
#include <map>

#include "tparity/compare/report.hpp"

namespace tparity::cli {

void add_format_option(CLI::App& cmd, Format& format) {
  cmd.add_option("--format", format, "Output: table (human) or json (one document)")
      ->transform(
          CLI::CheckedTransformer(std::map<std::string, Format>{{"table", Format::Table}, {"json", Format::Json}}))
      ->default_str("table");
}

int emit(const std::vector<CaseReport>& reports, Format format) {
  int failed = 0;
  for (const CaseReport& r : reports) failed += r.pass ? 0 : 1;
  if (format == Format::Json) {
    std::fputs((to_json(reports).dump(2) + "\n").c_str(), stdout);
  } else {
    for (const CaseReport& r : reports) std::fputs((render_table(r) + "\n").c_str(), stdout);
    std::fputs(
        fmt::format("{} case(s): {} passed, {} failed\n", reports.size(), reports.size() - size_t(failed), failed)
            .c_str(),
        stdout);
  }
  return failed ? kFail : kPass;
}

}  // namespace tparity::cli
