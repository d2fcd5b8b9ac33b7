// The any-language protocol (README, "Check your implementation in any language"): a problem file
// with the reference's results (tparity export), a foreign program run on it once per precision
// (tparity exec), its outputs file (fixture/outputs.hpp) checked against the problem and judged as the
// hand core is (tparity exec, tparity judge).
#pragma once

#include <signal.h>

#include <optional>
#include <stdexcept>
#include <string>
#include <vector>

#include "tparity/eval/evaluate.hpp"
#include "tparity/fixture/outputs.hpp"
#include "tparity/harness/problem.hpp"

namespace tparity {

// The problem with LibTorch's results stored, as a problem file holds them: outputs (float64) and
// outputs_float32, every component of the decomposition in both precisions, and the reference block
// naming the LibTorch, BLAS and kernels that computed them. Requires LibTorch.
Problem with_reference(const Problem& p, const std::string& where);

// One run of a program: argv with "{problem}", "{out}" and "{dtype}" replaced (anywhere in an
// argument), its standard output and error passed to tparity's standard error (tparity's own standard
// output is its report), killed with its process group after `timeout_s` seconds.
// The program runs in its own process group; tparity is a child subreaper, so whatever the program
// leaves running when it ends or is killed (in its group or in a session of its own) is killed too,
// and counted. A SIGINT, SIGTERM or SIGHUP to tparity while an InterruptGuard lives kills the program
// at once and stops the run (interrupted).
// How tparity says that a child ended by a signal, wherever it runs one (a program, an exporter, the
// other reference): "killed by signal 11 (Segmentation fault)"; SIGKILL names its likeliest sender,
// "killed by signal 9 (Killed: most often the kernel's out-of-memory killer)".
std::string killed_by_signal(int sig);

struct ProgramRun {
  bool ok = false;     // exited with code 0 in time
  std::string status;  // otherwise one line: "exited with code 3", "was killed by signal 11 (Segmentation
                       // fault)", "timed out after 5 s and was killed", "could not be started: ..."
  double seconds = 0;
  int left_running = 0;  // processes the program left running, killed after it
  int interrupted = 0;   // the signal tparity received meanwhile, 0 when none
};
ProgramRun run_program(const std::vector<std::string>& argv_template, const std::string& problem,
                       const std::string& out, const std::string& dtype, double timeout_s);

// While one lives, SIGINT, SIGTERM and SIGHUP are noted (interrupted()) instead of ending tparity at
// once, and kill the running program's process group; a second signal ends tparity at once. The
// caller stops at its next step (throwing Interrupted), so that its temporary files are removed.
// SIGPIPE is ignored meanwhile: a reader of tparity's output that is gone (a caller that died) makes
// a write fail, not tparity die before its temporary files are removed.
class InterruptGuard {
 public:
  InterruptGuard();
  ~InterruptGuard();
  InterruptGuard(const InterruptGuard&) = delete;
  InterruptGuard& operator=(const InterruptGuard&) = delete;

 private:
  static constexpr int kSignals[] = {SIGINT, SIGTERM, SIGHUP};
  struct sigaction saved_[3]{};
  struct sigaction saved_pipe_ {};
};
// The signal received under the guard, 0 when none.
int interrupted();
// The process group a signal under the guard kills at once (run_program sets its program's; a
// caller running a child of its own sets that child's, in a group of its own); 0: none.
void interrupt_kills(pid_t group);
// Thrown by a run that stopped on a signal; the CLI exits with 128 + signal.
struct Interrupted : std::runtime_error {
  explicit Interrupted(int sig) : std::runtime_error("interrupted"), signal(sig) {}
  int signal;
};

// An outputs file checked against the problem it answers: its dtype (and every tensor's) is the one
// asked for; outputs
// "output" (and "attn_weights" when the module returns them) with the reference's shapes and no
// others; components and local components only by the problem's component names, each with the
// shape of the reference's component. InputError naming the file and the field otherwise.
void check_outputs_file(const OutputsFile& f, const Problem& p, const std::string& dtype, const std::string& where);

// The implementation under test from a program's outputs files, one per precision (absent: it gave
// none in that precision). Its plain runs are the outputs and components; with a teacher, its local
// components (the program computed each op on the reference's inputs itself).
Implementation foreign_implementation(const std::string& name, const std::optional<OutputsFile>& f64,
                                      const std::optional<OutputsFile>& f32);

// A bfloat16 or float16 outputs file (checked by check_outputs_file) judged against LibTorch's own
// error in that precision (evaluate_low_precision): the report "<case>/<dtype>".
CaseReport judge_low_precision(const Problem& p, const std::string& where, const OutputsFile& f,
                               const std::string& name);

}  // namespace tparity
