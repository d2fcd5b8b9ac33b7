// The CLI tests' shared helpers: run the built tparity binary (or a shell command) with its standard
// output and error captured, read files, a scratch directory per test process.
#pragma once

#include <sys/wait.h>
#include <unistd.h>

#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <sstream>
#include <string>
#include <vector>

#include "temp_dir.hpp"

namespace clitest {

namespace fs = std::filesystem;

struct Result {
  int code;
  std::string out, err;
};

inline std::string slurp(const fs::path& p) {
  std::ifstream in(p, std::ios::binary);
  std::stringstream ss;
  ss << in.rdbuf();
  return ss.str();
}

// A directory of this test process's own (ctest runs each case in its own process): a new one from
// mkdtemp, so nothing an earlier process of the same pid left can stand in for a file a test expects,
// and removed with its contents when the process exits normally, failed checks included (the exports
// in it weigh ~300 MB; a suite leaked one per case until the disk filled; a process killed by a
// signal or ctest's timeout still leaves its folder).
inline fs::path scratch() {
  static const testutil::TempDir dir("tparity_cli_");
  return dir.path;
}

inline Result shell(const std::string& cmd) {
  const fs::path out = scratch() / "stdout", err = scratch() / "stderr";
  const int status = std::system((cmd + " >" + out.string() + " 2>" + err.string()).c_str());
  return {WIFEXITED(status) ? WEXITSTATUS(status) : -1, slurp(out), slurp(err)};
}

// The built tparity's path (cli_support.cpp: the one file given it, as it differs between build trees).
const std::string& tparity_bin();

// The built tparity with these arguments.
inline Result cli(const std::string& args) { return shell(tparity_bin() + " " + args); }

inline bool one_line(const std::string& s) { return !s.empty() && s.find('\n') == s.size() - 1; }

// What a terminal shows of `raw` (a pseudo-terminal's capture: "\r\n" for each line's end): its
// non-blank lines, each carriage return sending what follows back over the line's start.
inline std::vector<std::string> terminal_lines(const std::string& raw) {
  std::vector<std::string> lines;
  std::string row;
  size_t col = 0;
  auto end_row = [&] {
    const size_t last = row.find_last_not_of(' ');
    if (last != std::string::npos) lines.push_back(row.substr(0, last + 1));
    row.clear();
    col = 0;
  };
  for (char ch : raw) {
    if (ch == '\n') {
      end_row();
    } else if (ch == '\r') {
      col = 0;
    } else {
      if (col < row.size())
        row[col] = ch;
      else
        row += ch;
      ++col;
    }
  }
  end_row();
  return lines;
}

// Whether tparity was built with LibTorch: the tests are built with it, in the same tree (asking the
// binary's --version instead cost a process, 0.25-0.5 s of LibTorch's start-up, in every test that
// asked; "cli: --help and --version" holds the binary to this).
inline bool with_torch() {
#ifdef TPARITY_HAVE_TORCH
  return true;
#else
  return false;
#endif
}

// The committed fixtures: one set per torch version that exported them; the tests read 2.13's.
inline const std::string kFixtureRoot = TPARITY_FIXTURES;
inline const std::string kFixtures = kFixtureRoot + "/torch-2.13";

// The exec stand-ins (tests/exec/program.py), and one of them as exec's command after its options.
inline const std::string kProgram = std::string(TPARITY_SOURCE) + "/tests/exec/program.py";
inline std::string program(const std::string& mode) {
  return "-- python3 " + kProgram + " " + mode + " {problem} {out} {dtype}";
}

}  // namespace clitest
