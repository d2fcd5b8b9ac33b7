// What the gate and exec share: a judged report with how to re-run it, and the JUnit XML of a run.
#pragma once

#include <map>
#include <string>
#include <vector>

#include "tparity/compare/report.hpp"
#include "tparity/harness/reference_info.hpp"

namespace tparity::cli {

// A report and how to re-run only it.
struct Gated {
  CaseReport report;
  std::string seed;  // "4", or "none (fixture data)"
  std::string rerun;
  // A fixture's comparison with LibTorch's decomposition exists only under references whose
  // semantics are the fixture's where it exercises a difference (evaluate.hpp): a baseline recorded
  // under the other version has no entries for it, and that is not a failure.
  bool entries_optional = false;
};

// The failures_by_test key under which a failure of r goes: "tparity.<case>\n<component>", or
// "tparity.<case>\n(case)" for a failure that names none of r's components (a reference that did not
// run, a refused program, a component no implementation computed).
std::string junit_key(const CaseReport& r, const Failure& f);

// --factor of gate and exec (the ratchet: fail when an error grows beyond factor times its baseline's):
// InputError naming it unless finite and >= 1. inf would be a gate that never fails on drift.
void check_factor(double factor);

// JUnit XML: one testcase per case and component (plus one per case for failures that name no
// component, "(case)"), failures carrying their one-line message; the reference in <properties>.
// failures_by_test: "tparity.<case>\n<component>" -> lines.
std::string junit_xml(const std::vector<Gated>& gated,
                      const std::map<std::string, std::vector<std::string>>& failures_by_test, const ReferenceInfo& ref,
                      const std::string& suite = "tparity gate");

}  // namespace tparity::cli
