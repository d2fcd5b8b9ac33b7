// The pretrained-model cases of `tparity run`: a real checkpoint, its fixture exported by Hugging Face
// transformers itself (scripts/export_pretrained.py, in the project's Python environment, offline) the
// first time it is asked for, then checked like any fixture: hand core vs LibTorch vs the stored
// float64 and float32 results, every component of every layer.
#pragma once

#include <optional>
#include <string>
#include <vector>

namespace tparity::cli {

struct PretrainedCase {
  std::string name;         // "minilm", as --case names it
  std::string script;       // its exporter, under the scripts directory
  std::string file;         // the fixture the exporter writes, "minilm_l6.json"
  std::string description;  // one line for --help
};

const std::vector<PretrainedCase>& pretrained_cases();
const PretrainedCase* find_pretrained(const std::string& name);

// The fixture's path, exported first when it is not there yet (or older than its exporter); or
// nothing, with `skip` saying why in one line, when the exporter cannot run here (no Python, or the
// model's package is not installed: exit code 77). Any other failure of the exporter is an
// InputError naming the case and the exporter's last line. Where: $TPARITY_PRETRAINED_DIR, else the
// build's pretrained/ directory. Which Python: $TPARITY_PYTHON, else the one tparity was built with.
std::optional<std::string> pretrained_fixture(const PretrainedCase& c, std::string& skip);

// The environment variable's value, or `fallback` when unset or empty.
std::string env_or(const char* var, const char* fallback);
// Where this build's Python, exporters and their outputs are, each overridden by the environment:
// $TPARITY_PYTHON, else the Python tparity was built with; the source tree's scripts/ directory;
// $TPARITY_PRETRAINED_DIR and $TPARITY_MODELS_DIR, else the build's pretrained/ and models/. The build
// tree's paths are compiled into pretrained.cpp alone, so that the rest of the CLI compiles to the
// same objects in every build tree (ccache shares them between build/ and build-debian/).
std::string python_path();
std::string script_path(const std::string& name);  // scripts/<name>
std::string pretrained_dir();
std::string models_dir();
// The file's last non-empty line ("" when none).
std::string last_line(const std::string& path);
// How a child ended: its exit code, or the signal that killed it.
struct ChildEnd {
  int code = -1;      // the exit code; -1 when it did not exit (a signal, or it could not be started)
  int signal = 0;     // the signal that ended it, else 0
  std::string error;  // else what went wrong: "could not be started: PATH: REASON", or its end not learned
  // "exit 3"; "killed by signal 9 (Killed: most often the kernel's out-of-memory killer)"
  // (killed_by_signal, eval/foreign.hpp); else the error
  std::string text() const;
};
// Runs argv (argv[0] a path) with stdout to /dev/null and stderr to `log`, and says how it ended.
// InputError naming `log` when it cannot be written, a symbolic link among the reasons (never written
// through).
ChildEnd run_logged(const std::vector<std::string>& argv, const std::string& log);

}  // namespace tparity::cli
