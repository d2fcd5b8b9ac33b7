#include "common.hpp"

#include <fmt/format.h>

#include <cstdio>
#include <map>

#include "tparity/api.hpp"

namespace tparity::cli {

void add_format_option(CLI::App& cmd, Format& format) {
  cmd.add_option("--format", format, "Output: table (human) or json (one document)")
      ->transform(
          CLI::CheckedTransformer(std::map<std::string, Format>{{"table", Format::Table}, {"json", Format::Json}}))
      ->default_str("table");
}

int emit(const std::vector<CaseReport>& reports, Format format) {
  print_reports(reports, stdout, format == Format::Json);
  return exit_code(reports) ? kFail : kPass;
}

}  // namespace tparity::cli
