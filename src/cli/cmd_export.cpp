// tparity export: problem files for a foreign implementation (README, "Check your implementation in
// any language"): the default cases (with run's options) or fixtures, each with the reference's outputs
// and every reference component in float64 and float32, inline JSON or a safetensors file beside it.
#include <fmt/format.h>

#include <cstdio>
#include <filesystem>
#include <map>

#include "common.hpp"
#include "tparity/eval/foreign.hpp"
#include "tparity/fixture/fixture.hpp"
#include "tparity/harness/cases.hpp"
#include "tparity/torch/reference.hpp"

namespace tparity::cli {

namespace {

namespace fs = std::filesystem;

struct ExportOptions {
  CaseSelection selection;
  std::vector<std::string> fixtures;
  std::string out;
  std::string tensors = "inline";
  bool no_components = false;
};

// A fixture as a problem file: its stored outputs stay (they are the reference: Python's); LibTorch's
// components are added where it has none and shares its semantics.
Problem fixture_problem(Problem p, const std::string& path) {
  if (!p.components.empty()) return p;
  if (*p.semantics != reference_semantics() && !semantic_differences(p).empty()) return p;
  const Problem r = with_reference(p, path);
  p.components = r.components;
  p.components_float32 = r.components_float32;
  p.producer["components"] = r.producer.at("name");
  if (p.producer.find("torch") == p.producer.end()) p.producer["torch"] = "1.13";  // version 1: torch 1.13's
  return p;
}

}  // namespace

// The cases chosen as run chooses them, with the reference's results: shared with exec. Each problem
// is named after its case or fixture, and the name names its files. Fixtures that share a name with
// another problem (both sets' mha_single, a fixture named like a case) are named after their folder
// too, "mha_single@torch-2.13", as the gate names them by folder; names still shared after that (two
// files of one folder, a case given twice) are refused before any reference is computed.
// --without: a case that has no variant without a declared feature, and a fixture that has one (a
// fixture cannot be re-shaped), go to `skipped` with the reason.
std::vector<ExportedProblem> exported_problems(const CaseSelection& selection, const std::vector<std::string>& fixtures,
                                               std::vector<std::pair<std::string, std::string>>& skipped) {
  std::vector<CaseSpec> cases;
  if (!selection.cases.empty() || fixtures.empty())  // fixtures alone: no cases
    cases = selected_cases(selection, &skipped);
  std::vector<Problem> read;
  std::vector<std::string> kept;
  for (const std::string& f : fixtures) {
    Problem p = read_fixture(f);
    if (const std::string why = fixture_without(p, selection.without); !why.empty()) {
      skipped.push_back({p.name, why});
      continue;
    }
    read.push_back(std::move(p));
    kept.push_back(f);
  }
  std::map<std::string, int> uses;
  for (const CaseSpec& s : cases) ++uses[s.name];
  for (const Problem& p : read) ++uses[p.name];
  std::map<std::string, std::string> named;  // final name -> what gave it
  auto claim = [&](const std::string& name, const std::string& what) {
    if (auto [it, fresh] = named.emplace(name, what); !fresh)
      throw InputError(
          fmt::format("{}: its name \"{}\" is also that of {} (problems and their outputs are named "
                      "after them: give each its own name)",
                      what, name, it->second));
  };
  for (const CaseSpec& s : cases) claim(s.name, "option --case " + s.name);
  for (size_t i = 0; i < read.size(); ++i) {
    Problem& p = read[i];
    const std::string what = "option --fixture " + show_text(kept[i], 200);
    if (uses[p.name] > 1) {
      std::error_code ec;
      const fs::path full = fs::weakly_canonical(fs::absolute(kept[i]), ec);
      p.name += "@" + full.parent_path().filename().string();
      check_file_name(p.name, what, "name, with its folder's (it is shared)");
    }
    claim(p.name, what);
  }
  std::vector<ExportedProblem> out;
  for (const CaseSpec& s : cases) {
    Problem p = with_reference(make_problem(s), "case " + s.name);
    p.description = s.describe();
    p.producer["case"] = fmt::format("tparity run --case {} --seed {}", s.name, s.seed);
    out.push_back({s.name, std::move(p), s.not_checked});
  }
  for (size_t i = 0; i < kept.size(); ++i) {
    Problem p = fixture_problem(std::move(read[i]), kept[i]);
    std::string name = p.name;
    out.push_back({std::move(name), std::move(p), {}});
  }
  return out;
}

namespace {

int export_problems(const ExportOptions& o) {
  if (!torch_available()) throw InputError("tparity export: built without LibTorch, there is no reference to export");
  make_output_folder(o.out, "option --out");
  const bool st = o.tensors == "safetensors";
  std::vector<std::pair<std::string, std::string>> skipped;
  std::vector<ExportedProblem> problems = exported_problems(o.selection, o.fixtures, skipped);
  for (const auto& [name, why] : skipped) std::fprintf(stderr, "skipped %s: %s\n", name.c_str(), why.c_str());
  for (auto& [name, p, not_checked] : problems) {
    if (o.no_components) p.components.clear(), p.components_float32.clear();
    const std::string path = (fs::path(o.out) / (name + ".json")).string();
    write_problem(path, p, st);
    std::string without;
    for (const std::string& f : not_checked) without += (without.empty() ? ", without " : ", ") + f;
    fmt::print("{}{}: {} {} components, reference {}{}\n", path, st ? " (+ " + name + ".safetensors)" : "",
               module_name(p.module), p.components.size(), p.producer.count("torch") ? p.producer.at("torch") : "",
               without);
  }
  return kPass;
}

}  // namespace

void register_export(CLI::App& app, Action& action) {
  auto o = std::make_shared<ExportOptions>();
  CLI::App* cmd = app.add_subcommand(
      "export",
      "Write problem files for your own implementation: the cases (or fixtures) with the reference's outputs and "
      "components");
  add_case_options(*cmd, o->selection);
  cmd->add_option("--fixture", o->fixtures,
                  "Also (or, with no --case, only) these fixtures, re-written as problem files");
  cmd->add_option("--out", o->out, "Directory for the problem files (created)")->required();
  cmd->add_option("--tensors", o->tensors,
                  "inline: tensors in the JSON; safetensors: in <name>.safetensors beside it (ids stay inline)")
      ->check(CLI::IsMember({"inline", "safetensors"}))
      ->capture_default_str();
  cmd->add_flag("--no-components", o->no_components,
                "Outputs only: leave the reference's components out (smaller files; no per-op judgement)");
  cmd->callback([o, &action] { action = [o] { return export_problems(*o); }; });
}

}  // namespace tparity::cli
