// What the gate and exec share (gating.hpp).
#include "gating.hpp"

#include <cmath>

#include <fmt/format.h>

#include "tparity/fixture/fixture.hpp"

namespace tparity::cli {

namespace {

std::string xml_escape(const std::string& s) {
  std::string out;
  for (char c : s) switch (c) {
      case '&':
        out += "&amp;";
        break;
      case '<':
        out += "&lt;";
        break;
      case '>':
        out += "&gt;";
        break;
      case '"':
        out += "&quot;";
        break;
      default:
        out += c;
    }
  return out;
}

}  // namespace

std::string junit_key(const CaseReport& r, const Failure& f) {
  for (const ComponentReport& c : r.components)
    if (c.name == f.component) return "tparity." + r.name + "\n" + c.name;
  return "tparity." + r.name + "\n(case)";
}

std::string junit_xml(const std::vector<Gated>& gated,
                      const std::map<std::string, std::vector<std::string>>& failures_by_test, const ReferenceInfo& ref,
                      const std::string& suite) {
  std::string cases;
  size_t tests = 0, failed = 0;
  auto testcase = [&](const std::string& cls, const std::string& name) {
    ++tests;
    cases += fmt::format("    <testcase classname=\"{}\" name=\"{}\"", xml_escape(cls), xml_escape(name));
    auto it = failures_by_test.find(cls + "\n" + name);
    if (it == failures_by_test.end()) {
      cases += "/>\n";
      return;
    }
    ++failed;
    std::string all;
    for (const std::string& f : it->second) all += f + "\n";
    cases += fmt::format(">\n      <failure message=\"{}\">{}</failure>\n    </testcase>\n",
                         xml_escape(it->second.front()), xml_escape(all));
  };
  for (const Gated& g : gated) {
    const std::string cls = "tparity." + g.report.name;
    if (failures_by_test.count(cls + "\n(case)")) testcase(cls, "(case)");
    for (const ComponentReport& c : g.report.components) testcase(cls, c.name);
  }
  return fmt::format(
      "<?xml version=\"1.0\" encoding=\"UTF-8\"?>\n<testsuites>\n  <testsuite name=\"{}\" tests=\"{}\" "
      "failures=\"{}\">\n    <properties>\n      <property name=\"reference\" value=\"{}\"/>\n"
      "      <property name=\"torch\" value=\"{}\"/>\n      <property name=\"blas\" value=\"{}\"/>\n"
      "      <property name=\"kernel\" value=\"{}\"/>\n    </properties>\n{}  </testsuite>\n</testsuites>\n",
      xml_escape(suite), tests, failed, xml_escape(ref.line()), xml_escape(ref.torch), xml_escape(ref.blas),
      xml_escape(ref.kernel), cases);
}

void check_factor(double factor) {
  if (!(std::isfinite(factor) && factor >= 1.0))
    throw InputError(fmt::format("option --factor: expected a finite number >= 1, got {}", factor));
}

}  // namespace tparity::cli
