// Shared by the subcommands: registration, output of reports, exit codes.
#pragma once

#include <CLI/CLI.hpp>
#include <functional>
#include <string>
#include <vector>

#include "tparity/compare/legs.hpp"

namespace tparity::cli {

// Exit codes: 0 every case passed, 1 a case failed, 2 bad usage or input.
enum Exit : int { kPass = 0, kFail = 1, kBadInput = 2 };

// Each subcommand registers itself and sets `action` to what runs after parsing.
using Action = std::function<int()>;
void register_run(CLI::App& app, Action& action);
void register_eval(CLI::App& app, Action& action);
void register_check(CLI::App& app, Action& action);
void register_gate(CLI::App& app, Action& action);
void register_sweep(CLI::App& app, Action& action);

enum class Format { Table, Json };
void add_format_option(CLI::App& cmd, Format& format);

// Prints the reports (tables with a summary line, or one JSON document) and returns the exit code.
int emit(const std::vector<CaseReport>& reports, Format format);

}  // namespace tparity::cli
