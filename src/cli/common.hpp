// Shared by the subcommands: registration, output of reports, exit codes.
#pragma once

#include <CLI/CLI.hpp>
#include <functional>
#include <optional>
#include <string>
#include <vector>

#include "tparity/compare/legs.hpp"
#include "tparity/harness/cases.hpp"
#include "tparity/harness/io.hpp"

namespace tparity::cli {

// Exit codes: 0 every case passed, 1 a case failed, 2 bad usage or input.
enum Exit : int { kPass = 0, kFail = 1, kBadInput = 2 };

// Each subcommand registers itself and sets `action` to what runs after parsing.
using Action = std::function<int()>;
void register_run(CLI::App& app, Action& action);
void register_eval(CLI::App& app, Action& action);
void register_check(CLI::App& app, Action& action);
void register_gate(CLI::App& app, Action& action);
void register_export(CLI::App& app, Action& action);
void register_exec(CLI::App& app, Action& action);  // exec and judge
void register_sweep(CLI::App& app, Action& action);
void register_bench(CLI::App& app, Action& action);
void register_selftest(CLI::App& app, Action& action);
void register_census(CLI::App& app, Action& action);
void register_components(CLI::App& app, Action& action);

// The layout of a component of the problem in words ("[B, heads, T, head_dim], after the head split,
// before rotary"); empty when none is written (cmd_components.cpp).
std::string component_layout(const Problem& p, const std::string& name);

// main()'s arguments, for a subcommand that must re-execute itself (bench, to change the
// environment OpenBLAS reads when it loads).
extern int g_argc;
extern char** g_argv;

// Sizes and options that override a default case's, as run and sweep take them.
struct CaseOverrides {
  std::optional<int64_t> batch, seq, kv_seq, dim, value_dim, out_dim, heads, kv_heads, ffn;
  std::optional<double> scale;
  std::optional<std::string> bias, activation, mask;
  std::optional<uint64_t> seed;
  bool random_params = false;
  std::vector<std::string> config;  // the LLM blocks: KEY=VALUE, VALUE a JSON value (4, 50.0, null, true)
};
void apply_overrides(CaseSpec& s, const CaseOverrides& o);

// The cases a command runs: run's --case and the size and option overrides, as run, export and exec
// take them.
struct CaseSelection {
  std::vector<std::string> cases;  // empty: every default case
  CaseOverrides overrides;
  int64_t max_elements = int64_t(1) << 28;
};
// Registers --case (help lists the default and stress cases, then `more_names`), the overrides and
// --max-elements.
void add_case_options(CLI::App& cmd, CaseSelection& selection, const std::string& more_names = "");
// --max-elements: the largest tensor a case, fixture or problem may make (harness/problem.hpp's
// max_elements(), set when given, and in *also).
void add_max_elements_option(CLI::App& cmd, int64_t* also = nullptr);
// The chosen cases with the overrides applied and their size checked (InputError naming the option).
std::vector<CaseSpec> selected_cases(const CaseSelection& selection);

std::string case_names();                     // "single, batched, ..., softmax_hot, long_keys"
CaseSpec find_case(const std::string& name);  // InputError naming --case
// Elements of the largest tensor a case materialises; InputError naming --max-elements above the cap.
long double largest_tensor(const CaseSpec& s);
void check_size(const CaseSpec& s, int64_t max_elements);
// --seed: a non-negative integer (CLI11 alone would wrap -1 to 2^64-1).
CLI::Option* add_seed_option(CLI::App& cmd, std::optional<uint64_t>& seed, const std::string& help);

enum class Format { Table, Json };
void add_format_option(CLI::App& cmd, Format& format);

// How the verbs that judge show and decide their reports: --full (every component's table, not only
// each case's summary line and findings) and --accept precision-slip (a float64 failure at float32's
// rounding level becomes a note when every float32 leg of the case passes: accept_precision_slip()).
struct ReportOptions {
  bool full = false;
  std::vector<std::string> accept;  // "precision-slip"
};
void add_report_options(CLI::App& cmd, ReportOptions& o);
// Applies --accept to each report (before a baseline's ratchet judges them).
void apply_accept(std::vector<CaseReport>& reports, const ReportOptions& o);

// Prints the reports (each case's summary line and findings, or with `full` its table, then the line
// "N case(s): ..."; or one JSON document) and returns the exit code.
int emit(const std::vector<CaseReport>& reports, Format format, bool full = false);

}  // namespace tparity::cli
