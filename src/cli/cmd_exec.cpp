// tparity exec and tparity judge: a foreign implementation, in any language, judged as the hand core
// is (README, "Check your implementation in any language"). exec writes a problem file per case, runs
// the program once per precision, reads what it wrote; judge reads outputs produced elsewhere.
#include <fmt/format.h>
#include <unistd.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <map>
#include <optional>

#include "common.hpp"
#include "gating.hpp"
#include "tparity/api.hpp"
#include "tparity/compare/baseline.hpp"
#include "tparity/compare/report.hpp"
#include "tparity/core/gemm.hpp"
#include "tparity/eval/foreign.hpp"
#include "tparity/fixture/fixture.hpp"
#include "tparity/harness/cases.hpp"
#include "tparity/harness/llm.hpp"
#include "tparity/torch/reference.hpp"

namespace tparity::cli {

namespace {

namespace fs = std::filesystem;

struct Judging {  // what exec and judge share
  Format format = Format::Table;
  ReportOptions report;
  std::string junit, baseline;
  bool update = false;
  double factor = 2.0;
};

struct ExecOptions {
  CaseSelection selection;
  std::vector<std::string> fixtures;
  std::vector<std::string> dtypes{"float64", "float32"};
  double timeout = 60;
  std::string tensors = "inline";
  std::string keep;
  std::string name;
  std::vector<std::string> command;
  Judging judging;
};

struct JudgeOptions {
  std::string problem;
  std::vector<std::string> outputs;
  std::string name = "outputs";
  Judging judging;
};

// A case the program could not be judged on: one line, and a failed report for the counts and JUnit.
CaseReport refused(const std::string& name, const std::string& description, const std::string& line) {
  CaseReport r;
  r.name = name;
  r.description = description;
  r.reference = reference_info();
  r.fail({"", "", line});
  return r;
}

// The reports (tables or one JSON document), then the ratchet against --baseline (or a new one
// recorded), JUnit, and the exit code.
int finish(std::vector<CaseReport> reports, const std::vector<std::pair<std::string, std::string>>& skipped,
           const Judging& j, const std::string& rerun) {
  const ReferenceInfo ref = reference_info();
  apply_accept(reports, j.report);
  if (!j.baseline.empty() && !j.update) {
    const Baseline b = read_baseline(j.baseline);
    for (const Drift& d : find_drift(reports, b, j.factor)) {
      const std::string line =
          d.missing ? fmt::format("case {}: component {}: leg {}: rel_l2 {:.3g} has no baseline entry in {}",
                                  d.case_name, d.component, d.leg, d.value, j.baseline)
                    : fmt::format(
                          "case {}: component {}: leg {}: rel_l2 {:.3g} > drift bound {:.3g} ({:g} x "
                          "baseline {:.3g}): grew beyond the baseline",
                          d.case_name, d.component, d.leg, d.value, d.bound, j.factor, d.baseline);
      for (CaseReport& r : reports)
        if (r.name == d.case_name) r.fail({d.component, d.leg, line});
    }
  }
  if (j.format == Format::Json) {
    nlohmann::json doc = to_json(reports);
    nlohmann::json sk = nlohmann::json::array();
    for (const auto& [n, why] : skipped) sk.push_back({{"name", n}, {"reason", why}});
    doc["skipped"] = sk;
    std::fputs((doc.dump(2, ' ', false, kBadUtf8Replaced) + "\n").c_str(), stdout);
  } else {
    print_reports(reports, stdout, false, j.report.full);
    for (const auto& [n, why] : skipped) fmt::print("skipped {}: {}\n", n, why);
  }
  // A gate that judged nothing must not pass: every case declined (or none asked for).
  if (reports.empty())
    throw InputError(
        fmt::format("tparity exec: nothing was judged: the program declined every case ({} skipped); no baseline or "
                    "JUnit written",
                    skipped.size()));
  const bool failed = exit_code(reports) != 0;
  OutputFiles out;  // the baseline and the JUnit report, both or neither
  if (j.update) {
    if (failed) {
      std::fprintf(stderr, "tparity: a baseline is not recorded from a failing run; %s left as it was\n",
                   j.baseline.c_str());
      return kFail;
    }
    const Baseline b = make_baseline(
        reports, {{"torch", ref.torch}, {"blas", ref.blas}, {"kernel", ref.kernel}, {"implementation", rerun}});
    out.add(j.baseline, baseline_to_json(b).dump(2, ' ', false, kBadUtf8Replaced) + "\n");
    std::fprintf(stderr, "baseline %s: %zu entries\n", j.baseline.c_str(), b.entries.size());
  }
  if (!j.junit.empty()) {
    std::vector<Gated> gated;
    std::map<std::string, std::vector<std::string>> by_test;
    for (const CaseReport& r : reports) {
      gated.push_back({r, "none", rerun});
      for (const Failure& f : r.failures) by_test[junit_key(r, f)].push_back(f.text);
    }
    out.add(j.junit, junit_xml(gated, by_test, ref, "tparity exec"));
  }
  out.commit();
  return failed ? kFail : kPass;
}

// A decode session judged on its outputs alone: they could come from one full causal forward over
// every token, so the decode itself went unchecked; the report says so (not_checked, and a note).
void note_unchecked_decode(const Problem& p, const std::optional<OutputsFile>& f64,
                           const std::optional<OutputsFile>& f32, CaseReport& r) {
  if (!llm_module(p.module) || p.decode_steps <= 0) return;
  for (const std::optional<OutputsFile>* f : {&f64, &f32})
    if (*f)
      for (const auto& [name, t] : (*f)->components)
        if (name.rfind("step.", 0) == 0) return;
  if (std::find(r.not_checked.begin(), r.not_checked.end(), "decode") == r.not_checked.end())
    r.not_checked.push_back("decode");
  r.notes.push_back(
      fmt::format("decode not checked: the problem decodes {} steps over a KV cache, but the program gave no step.N.* "
                  "component; its outputs alone could come from one full forward",
                  p.decode_steps));
}

std::string join(const std::vector<std::string>& v) { return fmt::format("{}", fmt::join(v, " ")); }

// A bfloat16 or float16 run is judged by LibTorch's own error in it: refused up front where LibTorch
// cannot compute in it on the CPU (1.13 has no float16 matmul), before any program runs.
void check_low_precision(const std::string& dtype, const std::string& option) {
  if (dtype != "bfloat16" && dtype != "float16") return;
  if (const std::string why = low_precision_limitation(dtype_from_name(dtype)); !why.empty())
    throw InputError(
        fmt::format("{}: LibTorch {} cannot compute {} on the CPU, so there is no error of its own to "
                    "judge by ({})",
                    option, torch_version(), dtype, why));
}

// The options of the judgment, and its output paths, before any work.
void check_judging(const Judging& j) {
  if (j.update && j.baseline.empty()) throw InputError("option --update-baseline: needs --baseline FILE to write");
  check_factor(j.factor);
  if (!j.junit.empty()) check_output_path(j.junit, "option --junit");
  if (j.update) check_output_path(j.baseline, "option --baseline (--update-baseline writes it)");
}

int exec(const ExecOptions& o) {
  check_judging(o.judging);
  if (!torch_available()) throw InputError("tparity exec: built without LibTorch, there is no reference to judge by");
  if (o.command.empty()) throw InputError("tparity exec: no program given (expected -- CMD ARGS... after the options)");
  if (!(o.timeout > 0) || std::isinf(o.timeout))  // (inf: no timeout at all, a hang the program chose)
    throw InputError(fmt::format("option --timeout: expected a finite number of seconds > 0, got {}", o.timeout));
  for (const std::string& d : o.dtypes) check_low_precision(d, "option --dtype " + d);
  bool placeholder = false;
  for (const std::string& a : o.command) placeholder = placeholder || a.find("{problem}") != std::string::npos;
  if (!placeholder)
    throw InputError("tparity exec: the command never names {problem}: the program would not know what to compute");
  if (!o.keep.empty()) make_output_folder(o.keep, "option --keep");
  // Ctrl-C or a TERM from here on kills the program and whatever it started, removes the temporary
  // folder, and ends the run with 128 + the signal.
  const InterruptGuard guard;
  auto stop_if_interrupted = [] {
    if (const int sig = interrupted()) throw Interrupted(sig);
  };
  // The cases' problems, each named after its case or fixture (names checked before any is made).
  std::vector<std::pair<std::string, std::string>> skipped;  // declined by the program, or by --without
  const std::vector<ExportedProblem> problems = exported_problems(o.selection, o.fixtures, skipped);
  stop_if_interrupted();
  // The work directory: --keep DIR, or a temporary one removed at the end.
  std::string dir = o.keep;
  bool temporary = false;
  if (dir.empty()) {
    std::string tmpl = (fs::temp_directory_path() / "tparity-exec-XXXXXX").string();
    if (!mkdtemp(tmpl.data())) throw InputError("tparity exec: cannot create a temporary directory");
    dir = tmpl, temporary = true;
  }
  struct Cleanup {
    std::string dir;
    bool on;
    void now() {
      std::error_code ec;
      if (on) fs::remove_all(dir, ec);
      on = false;
    }
    ~Cleanup() { now(); }
  } cleanup{dir, temporary};

  const std::string who = o.name.empty() ? join(o.command) : o.name;
  std::vector<CaseReport> reports;
  for (const auto& [name, p, not_checked] : problems) {
    stop_if_interrupted();
    const std::string problem = (fs::path(dir) / (name + ".json")).string();
    write_problem(problem, p, o.tensors == "safetensors");
    std::optional<OutputsFile> f64, f32;
    std::vector<OutputsFile> low;  // bfloat16, float16
    std::string error, unsupported;
    for (const std::string& dtype : o.dtypes) {
      const std::string out = (fs::path(dir) / (name + "." + dtype + ".out.json")).string();
      std::error_code ec;
      fs::remove(out, ec);
      const ProgramRun run = run_program(o.command, problem, out, dtype, o.timeout);
      stop_if_interrupted();
      const std::string where = fmt::format("case {} ({})", name, dtype);
      if (run.left_running)
        std::fprintf(stderr, "%s: the program left %d process(es) running; killed\n", where.c_str(), run.left_running);
      if (!run.ok) {
        error = fmt::format("{}: the program {}", where, run.status);
        break;
      }
      if (!fs::exists(out)) {
        error = fmt::format("{}: the program exited 0 but wrote no outputs file ({})", where, out);
        break;
      }
      try {
        OutputsFile f = read_outputs_file(out);
        if (!f.unsupported.empty()) {
          unsupported = f.unsupported;
          break;
        }
        check_outputs_file(f, p, dtype, where + ": " + out);
        if (dtype == "bfloat16" || dtype == "float16")
          low.push_back(std::move(f));
        else
          (dtype == "float64" ? f64 : f32) = std::move(f);
      } catch (const InputError& e) {  // the file named first; the case and precision before it
        const std::string what = e.what();
        error = what.rfind("case ", 0) == 0 ? what : where + ": " + what;
        break;
      }
    }
    if (!unsupported.empty()) {  // in the report's "skipped" lines
      skipped.push_back({name, "the program does not implement it: " + show_text(unsupported, 300)});
      continue;
    }
    if (!error.empty()) {
      std::fprintf(stderr, "%s\n", error.c_str());
      reports.push_back(refused(name, p.description.empty() ? summary(p) : p.description, error));
      continue;
    }
    if (f64 || f32)
      for (CaseReport& r : check_fixture(p, problem, GatePolicy{}, foreign_implementation(who, f64, f32))) {
        r.not_checked = not_checked;
        note_unchecked_decode(p, f64, f32, r);
        reports.push_back(std::move(r));
      }
    for (const OutputsFile& f : low) reports.push_back(judge_low_precision(p, "case " + name, f, who));
  }
  // Removed before the report is written: a reader gone by then (a caller that died: SIGPIPE on the
  // write) must not leave the folder behind.
  cleanup.now();
  stop_if_interrupted();
  return finish(std::move(reports), skipped, o.judging, "tparity exec -- " + join(o.command));
}

int judge(const JudgeOptions& o) {
  check_judging(o.judging);
  const Problem p = read_fixture(o.problem);
  if (p.outputs.empty())
    throw InputError(o.problem + ": outputs: missing (a problem file from tparity export holds the reference's)");
  check_stored_results(p, o.problem);        // the problem's own shapes first: a program is judged against them
  std::map<std::string, OutputsFile> files;  // by dtype
  for (const std::string& path : o.outputs) {
    OutputsFile f = read_outputs_file(path);
    if (!f.unsupported.empty()) throw InputError(path + ": unsupported: the program declined: " + f.unsupported);
    check_outputs_file(f, p, f.dtype, path);
    check_low_precision(f.dtype, path + ": dtype: " + f.dtype);
    if (files.count(f.dtype))
      throw InputError("option --outputs: two files of dtype " + f.dtype + " (expected one per precision)");
    files[f.dtype] = std::move(f);
  }
  auto take = [&](const char* dtype) {  // moved out: a layer's tensors are not copied
    std::optional<OutputsFile> f;
    if (auto it = files.find(dtype); it != files.end()) f = std::move(it->second);
    return f;
  };
  const std::optional<OutputsFile> f64 = take("float64"), f32 = take("float32");
  std::vector<CaseReport> reports;
  if (f64 || f32) reports = check_fixture(p, o.problem, GatePolicy{}, foreign_implementation(o.name, f64, f32));
  for (CaseReport& r : reports) note_unchecked_decode(p, f64, f32, r);
  for (const char* dtype : {"bfloat16", "float16"})
    if (auto f = take(dtype)) reports.push_back(judge_low_precision(p, o.problem, *f, o.name));
  return finish(reports, {}, o.judging, "tparity judge --problem " + o.problem);
}

void add_judging_options(CLI::App& cmd, Judging& j) {
  add_format_option(cmd, j.format);
  add_report_options(cmd, j.report);
  cmd.add_option("--junit", j.junit, "Also write JUnit XML here (one testcase per case and component)")
      ->check(not_empty("a file to write"));
  cmd.add_option("--baseline", j.baseline, "Fail when an error grows beyond --factor times this baseline's")
      ->check(not_empty("a baseline file"));
  cmd.add_flag("--update-baseline", j.update, "Record this run in --baseline (only when every gate passes)");
  cmd.add_option("--factor", j.factor, "The ratchet's factor")->capture_default_str();
}

}  // namespace

void register_exec(CLI::App& app, Action& action) {
  auto o = std::make_shared<ExecOptions>();
  CLI::App* cmd = app.add_subcommand(
      "exec",
      "Judge your own program, in any language: run it on each case's problem file, once per precision "
      "(-- CMD ARGS with {problem}, {out}, {dtype})");
  add_case_options(*cmd, o->selection);
  cmd->add_option("--fixture", o->fixtures, "Also (or, with no --case, only) these fixtures");
  cmd->add_option("--dtype", o->dtypes,
                  "Precisions to run the program in (float64 is the semantic gate; bfloat16 and float16 are judged "
                  "against LibTorch's own error in them)")
      ->delimiter(',')
      ->check(CLI::IsMember({"float32", "float64", "bfloat16", "float16"}));
  cmd->add_option("--timeout", o->timeout, "Seconds per run of the program before it is killed")->capture_default_str();
  cmd->add_option("--tensors", o->tensors, "Problem files' tensors: inline or safetensors")
      ->check(CLI::IsMember({"inline", "safetensors"}))
      ->capture_default_str();
  cmd->add_option("--keep", o->keep, "Keep the problem and outputs files in this directory")
      ->check(not_empty("a folder"));
  cmd->add_option("--name", o->name, "The implementation's name in the reports (default: the command)")
      ->check(not_empty("a name"));
  cmd->add_option("command", o->command, "The program and its arguments, after --");
  add_judging_options(*cmd, o->judging);
  cmd->callback([o, &action] {
    if (!g_after_separator.empty())
      o->command.insert(o->command.end(), g_after_separator.begin(), g_after_separator.end());
    action = [o] { return exec(*o); };
  });

  auto j = std::make_shared<JudgeOptions>();
  CLI::App* jc = app.add_subcommand(
      "judge", "Judge outputs your program wrote elsewhere against a problem file from tparity export");
  jc->add_option("--problem", j->problem, "The problem file (tparity export)")->required();
  jc->add_option("--outputs", j->outputs, "Outputs file(s), one per precision")->required();
  jc->add_option("--name", j->name, "The implementation's name in the reports")
      ->check(not_empty("a name"))
      ->capture_default_str();
  add_max_elements_option(*jc);
  add_judging_options(*jc, j->judging);
  jc->callback([j, &action] { action = [j] { return judge(*j); }; });
}

}  // namespace tparity::cli
