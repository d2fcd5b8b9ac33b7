// Shared by the subcommands: registration, output of reports, exit codes.
#pragma once

#include <CLI/CLI.hpp>
#include <cstdint>
#include <functional>
#include <limits>
#include <optional>
#include <string>
#include <utility>
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
void register_model(CLI::App& app, Action& action);

// The layout of a component of the problem in words ("[B, heads, T, head_dim], after the head split,
// before rotary"); empty when none is written (cmd_components.cpp).
std::string component_layout(const Problem& p, const std::string& name);

// main()'s arguments, for a subcommand that must re-execute itself (bench, to change the
// environment OpenBLAS reads when it loads).
extern int g_argc;
extern char** g_argv;
// exec's program and its arguments: everything after the first "--", taken out of the arguments
// before CLI11 parses them (CLI11 ends a vector option such as --case at "--" but then goes on parsing
// options, so `--case x -- python3 -c ...` was refused for "-c").
extern std::vector<std::string> g_after_separator;

// Sizes and options that override a default case's, as run and sweep take them.
struct CaseOverrides {
  std::optional<int64_t> batch, seq, kv_seq, dim, value_dim, out_dim, heads, kv_heads, ffn;
  std::optional<double> scale;
  std::optional<std::string> bias, activation, mask;
  std::optional<uint64_t> seed;
  bool random_params = false;
  std::vector<std::string> config;  // the LLM blocks: KEY=VALUE, VALUE a JSON value (4, 50.0, null, true)
  // The LLM blocks' options (docs/cases.md): head_dim, decode steps, position offset ("none" or N),
  // key padding (left, right, none), rotary convention and fraction, the norms' epsilon.
  std::optional<int64_t> head_dim, decode_steps;
  std::optional<std::string> positions_offset, padding, rope;
  std::optional<double> rotary_fraction, eps;
};
// Refuses, naming the option, any override the case's module kind would ignore or cannot honour.
void apply_overrides(CaseSpec& s, const CaseOverrides& o);

// --without: features a program declares it does not support (docs/cases.md). Each case runs its
// variant without them (s.not_checked lists those it had), or is skipped: the returned reason.
std::string without_features(CaseSpec& s, const std::vector<std::string>& features);
// A fixture cannot be re-shaped: the first declared feature it has, as a skip reason ("" none).
std::string fixture_without(const Problem& p, const std::vector<std::string>& features);
// The known features, "padding, positions, ..." (InputError naming --without for another).
std::string without_feature_list();
void check_without(const std::vector<std::string>& features);

// The cases a command runs: run's --case and the size and option overrides, as run, export and exec
// take them.
struct CaseSelection {
  std::vector<std::string> cases;  // empty: every default case
  CaseOverrides overrides;
  std::vector<std::string> without;  // --without FEATURE[,FEATURE...]
  int64_t max_elements = int64_t(1) << 28;
};
// Registers --case (help lists the default and stress cases, then `more_names`), the overrides and
// --max-elements.
void add_case_options(CLI::App& cmd, CaseSelection& selection, const std::string& more_names = "");
// --max-elements: the largest tensor a case, fixture or problem may make (harness/problem.hpp's
// max_elements(), set when given, and in *also).
void add_max_elements_option(CLI::App& cmd, int64_t* also = nullptr);
// The chosen cases with the overrides and --without applied and their size checked (InputError
// naming the option); a case --without leaves no variant of goes to *skipped (name, reason).
std::vector<CaseSpec> selected_cases(const CaseSelection& selection,
                                     std::vector<std::pair<std::string, std::string>>* skipped = nullptr);

std::string case_names();                     // "single, batched, ..., softmax_hot, long_keys"
CaseSpec find_case(const std::string& name);  // InputError naming --case
// Elements of the largest tensor a case materialises; InputError naming --max-elements above the cap.
long double largest_tensor(const CaseSpec& s);
void check_size(const CaseSpec& s, int64_t max_elements);
// --seed: a non-negative whole number (decimal_numbers refuses -1, which CLI11 alone would wrap to 2^64-1).
CLI::Option* add_seed_option(CLI::App& cmd, std::optional<uint64_t>& seed, const std::string& help);
// A whole number from lo to hi, said so when it is not ("--threads: expected a whole number from 1 to
// 256, got \"0\""; CLI::Range says "Value 0 not in range", 1.5 among them), with what came as it
// came; given with ->transform(), as it hands CLI11 the digits without leading zeros (decimal_numbers
// refuses it given with check()). hi = kNoUpperBound: none.
constexpr int64_t kNoUpperBound = std::numeric_limits<int64_t>::max() / 2;
CLI::Validator whole_number_in(int64_t lo, int64_t hi);
// A path or text option given an empty value ("--dump \"$DUMP\"" with DUMP unset): refused, "expected
// `what`, got an empty value", where the option's empty default would otherwise take it for not given.
CLI::Validator not_empty(const std::string& what);
// The same rule for a number inside an option's text (--positions-offset, --shard I/N): decimal digits
// with an optional sign, from lo to hi; nullopt otherwise (" 7", "7junk", "0x10").
std::optional<int64_t> whole_number_text(const std::string& text, int64_t lo, int64_t hi);
// --shard I/N (sweep, census): the I-th of N slices, 0 <= I < N <= 2^40 (so that I times a count of
// points stays far inside int64), read by whole_number_text; InputError naming --shard otherwise.
std::pair<int64_t, int64_t> parse_shard(const std::string& text);
// Numbers on the command line are decimal. CLI11 reads integers with strtoll's base 0 (010 is 8,
// 0x10 is 16) and takes text that overflows int64 as its largest value; it says "Could not convert"
// for text that is no number. Every option of app and its subcommands whose type is a number gets a
// check in front of its own: a whole number for INT and UINT (no sign for UINT) or a number for FLOAT,
// refused by name otherwise ("--eps: expected a number, got \"abc\""), and the digits handed on
// without their leading zeros.
void decimal_numbers(CLI::App& app);
// Options for tparity's own children (bench --child, census --worker-kernel): in group kInternal,
// which InternalHidden leaves out of --help. Not CLI11's empty group: its options have an empty name
// in refusals (": 1 required TEXT missing").
inline const std::string kInternal = "internal";
class InternalHidden : public CLI::Formatter {
 public:
  std::string make_group(std::string group, bool is_positional, std::vector<const CLI::Option*> opts) const override {
    return group == kInternal ? std::string() : CLI::Formatter::make_group(group, is_positional, opts);
  }
};

// A case or fixture as a problem file, with the reference's results (export, exec): named after its
// case or fixture, and the features the case runs without (--without).
struct ExportedProblem {
  std::string name;
  Problem problem;
  std::vector<std::string> not_checked;
};
std::vector<ExportedProblem> exported_problems(const CaseSelection& selection, const std::vector<std::string>& fixtures,
                                               std::vector<std::pair<std::string, std::string>>& skipped);

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

// The folder of a model's export named on the command line (`what`: "model: --export", "option --model"),
// as every file in it: a symbolic link is refused, not followed, and so is a path that resolves through
// one ("link/.", "link/.."); anything but a folder is refused. InputError naming it otherwise.
void check_export_folder(const std::string& dir, const std::string& what);

// Progress for a person at a terminal: one line on standard error, drawn over itself (cut to the
// terminal's width, so that the carriage return reaches its start) and erased by clear() or when the
// object goes, so that what a failed run leaves on standard error is its one line. Nothing when
// standard error is not a terminal. (sweep's bar, model's export, bench's cases)
class StatusLine {
 public:
  StatusLine();
  ~StatusLine() { clear(); }
  StatusLine(const StatusLine&) = delete;
  StatusLine& operator=(const StatusLine&) = delete;
  void show(std::string line);
  void clear();

 private:
  bool on_;
  size_t shown_ = 0;
};

// Prints the reports (each case's summary line and findings, or with `full` its table, then the line
// "N case(s): ..."; or one JSON document) and returns the exit code.
int emit(const std::vector<CaseReport>& reports, Format format, bool full = false);

}  // namespace tparity::cli
