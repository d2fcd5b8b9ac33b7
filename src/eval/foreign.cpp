// The any-language protocol (eval/foreign.hpp): problem files with the reference's results, a
// foreign program run with a timeout, its outputs checked against the problem and judged.
#include "tparity/eval/foreign.hpp"

#include <dirent.h>
#include <fcntl.h>
#include <fmt/format.h>
#include <signal.h>
#include <sys/prctl.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <iterator>
#include <memory>
#include <set>
#include <thread>

#include "tparity/harness/hand.hpp"
#include "tparity/torch/reference.hpp"

namespace tparity {

namespace {

TensorMap as_tensors(const Components& c, DType dtype) {
  TensorMap m;
  for (const Component& x : c) {
    DTensor t;
    t.dtype = dtype;
    t.shape = x.value.shape;
    t.data = x.value.data;
    m[x.name] = std::move(t);
  }
  return m;
}

Components as_components(const TensorMap& m, const std::vector<std::string>& order) {
  Components c;
  for (const std::string& n : order)
    if (auto it = m.find(n); it != m.end()) c.push_back({n, to_tensor<double>(it->second)});
  return c;
}

// A canonical (B, L, E) tensor in the module's output layout `shape`: the same shape, the batch of
// one dropped (unbatched), or sequence-first (L, B, E). Nothing for any other.
std::optional<DTensor> module_layout(const DTensor& c, const Shape& shape) {
  DTensor o = c;
  o.shape = shape;
  if (c.shape == shape ||
      (c.shape.size() == shape.size() + 1 && c.shape[0] == 1 && Shape(c.shape.begin() + 1, c.shape.end()) == shape))
    return o;
  if (c.shape.size() == 3 && shape == Shape{c.shape[1], c.shape[0], c.shape[2]}) {
    const int64_t B = c.shape[0], L = c.shape[1], E = c.shape[2];
    for (int64_t b = 0; b < B; ++b)
      for (int64_t l = 0; l < L; ++l)
        for (int64_t e = 0; e < E; ++e) o.data[size_t((l * B + b) * E + e)] = c.data[size_t((b * L + l) * E + e)];
    return o;
  }
  return std::nullopt;
}

// An argument with {problem}, {out} and {dtype} replaced in one pass over the template: what is
// substituted is never read again (a "{dtype}" inside the --keep path stays as it is).
std::string substitute(const std::string& arg, const std::string& problem, const std::string& out,
                       const std::string& dtype) {
  std::string s;
  for (size_t i = 0; i < arg.size();) {
    bool replaced = false;
    for (const auto& [key, value] :
         {std::pair<const char*, const std::string*>{"{problem}", &problem}, {"{out}", &out}, {"{dtype}", &dtype}})
      if (arg.compare(i, std::strlen(key), key) == 0) {
        s += *value, i += std::strlen(key), replaced = true;
        break;
      }
    if (!replaced) s += arg[i++];
  }
  return s;
}

// SIGINT, SIGTERM and SIGHUP while a program runs: the signal is noted and the program's process
// group killed at once; run_program and tparity exec stop at the next step, removing what they made.
// A second signal ends tparity at once; the same signal again from the same sending process is the
// same request, not a second one (PR_SET_PDEATHSIG fires once per thread of a dying multithreaded
// parent, as the child is handed from thread to thread).
volatile sig_atomic_t g_signal = 0;
volatile sig_atomic_t g_sender = 0;   // the first signal's sending process, 0 the kernel (a terminal)
volatile sig_atomic_t g_program = 0;  // the running program's process group, 0 when none

void on_signal(int sig, siginfo_t* info, void*) {
  if (const pid_t group = g_program; group > 0) kill(-group, SIGKILL);
  const pid_t sender = info && info->si_code == SI_USER ? info->si_pid : 0;
  if (g_signal && sig == g_signal && sender != 0 && sender == g_sender) return;
  if (g_signal) {  // a second one: tparity ends by it now, as it would have without the guard
    signal(sig, SIG_DFL);
    raise(sig);
    return;
  }
  g_sender = sender;
  g_signal = sig;
}

// The processes whose parent is this one (children, and orphans reparented here), with whether each
// is a zombie already. From /proc/<pid>/stat: "pid (comm) state ppid ...", comm may hold anything.
std::vector<std::pair<pid_t, bool>> children() {
  std::vector<std::pair<pid_t, bool>> out;
  DIR* d = opendir("/proc");
  if (!d) return out;
  const pid_t self = getpid();
  while (const dirent* e = readdir(d)) {
    if (e->d_name[0] < '1' || e->d_name[0] > '9') continue;
    const std::string path = std::string("/proc/") + e->d_name + "/stat";
    const int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC);
    if (fd < 0) continue;
    char buf[1024];
    const ssize_t n = ::read(fd, buf, sizeof buf - 1);
    ::close(fd);
    if (n <= 0) continue;
    buf[n] = 0;
    const char* close_paren = std::strrchr(buf, ')');
    if (!close_paren) continue;
    char state = 0;
    long ppid = 0;
    if (std::sscanf(close_paren + 1, " %c %ld", &state, &ppid) == 2 && ppid == self)
      out.push_back({pid_t(std::atol(e->d_name)), state == 'Z'});
  }
  closedir(d);
  return out;
}

// Kills and reaps every process below this one: tparity is a child subreaper, so what a program
// started and left behind (a setsid grandchild, a daemon) is reparented here when its parent ends,
// and nothing of it outlives the run (nor holds tparity's standard error open). How many were alive.
// Children of tparity's own from before the program started (none in tparity exec) are left alone. A
// process that does not die within 10 s of SIGKILL (stuck in the kernel) is left, and not waited for.
int reap_descendants(const std::set<pid_t>& before) {
  int killed = 0;
  std::set<pid_t> signalled;
  const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(10);
  while (std::chrono::steady_clock::now() < deadline) {
    bool left = false;
    for (const auto& [pid, zombie] : children()) {
      if (before.count(pid)) continue;
      left = true;
      if (!zombie && signalled.insert(pid).second) kill(pid, SIGKILL), ++killed;
      waitpid(pid, nullptr, WNOHANG);
    }
    if (!left) break;
    std::this_thread::sleep_for(std::chrono::milliseconds(2));
  }
  return killed;
}

// The running program's own wait, with a deadline: a killed process stuck in the kernel does not hang
// tparity. True when it was reaped.
bool wait_until_gone(pid_t pid, int& status, std::chrono::steady_clock::time_point deadline) {
  for (;;) {
    const pid_t w = waitpid(pid, &status, WNOHANG);
    if (w == pid) return true;
    if (w < 0 && errno != EINTR) return false;
    if (std::chrono::steady_clock::now() > deadline) return false;
    std::this_thread::sleep_for(std::chrono::milliseconds(2));
  }
}

}  // namespace

InterruptGuard::InterruptGuard() {
  g_signal = 0, g_sender = 0;
  struct sigaction sa {};
  sa.sa_sigaction = on_signal;
  sa.sa_flags = SA_RESTART | SA_SIGINFO;  // the handler only notes and kills; nothing else should see EINTR
  sigemptyset(&sa.sa_mask);
  for (size_t i = 0; i < std::size(kSignals); ++i) sigaction(kSignals[i], &sa, &saved_[i]);
  struct sigaction ignore {};
  ignore.sa_handler = SIG_IGN;
  sigemptyset(&ignore.sa_mask);
  sigaction(SIGPIPE, &ignore, &saved_pipe_);
}

InterruptGuard::~InterruptGuard() {
  for (size_t i = 0; i < std::size(kSignals); ++i) sigaction(kSignals[i], &saved_[i], nullptr);
  sigaction(SIGPIPE, &saved_pipe_, nullptr);
}

int interrupted() { return g_signal; }

std::string killed_by_signal(int sig) {
  const char* name = strsignal(sig);
  // tparity sends SIGKILL only to what it ends itself (a timeout, an interruption: reported apart); the
  // kernel sends it when memory runs out (dmesg names the process).
  return fmt::format("killed by signal {} ({}{})", sig, name ? name : "unknown",
                     sig == SIGKILL ? ": most often the kernel's out-of-memory killer" : "");
}

void interrupt_kills(pid_t group) {
  g_program = group;
  if (group > 0 && g_signal) kill(-group, SIGKILL);  // a signal before the group was known
}

Problem with_reference(const Problem& problem, const std::string& where) {
  Problem p = problem;
  p.semantics.reset();
  resolve_semantics(p, reference_semantics());
  const TorchRun t64 = run_torch(p, DType::Float64, true, where);
  const TorchRun t32 = run_torch(p, DType::Float32, true, where);
  if (!t64.failure.empty()) throw InputError(where + ": the reference failed its own check: " + t64.failure);
  p.outputs = t64.result.outputs;
  p.outputs_float32 = t32.result.outputs;
  // Components in their canonical layouts (MultiheadAttention's per-head attn_weights and the
  // batch-first output among them), beside the outputs as the module returns them.
  p.components = as_tensors(t64.result.components, DType::Float64);
  p.components_float32 = as_tensors(t32.result.components, DType::Float32);
  const ReferenceInfo ref = reference_info();
  p.producer = {{"name", "LibTorch's decomposition (tparity export): " + ref.line()},
                {"torch", ref.torch},
                {"blas", ref.blas},
                {"kernel", ref.kernel},
                {"threads", std::to_string(ref.threads)}};
  for (const std::string& n : t64.notes) p.producer["note"] += (p.producer["note"].empty() ? "" : "; ") + n;
  return p;
}

ProgramRun run_program(const std::vector<std::string>& argv_template, const std::string& problem,
                       const std::string& out, const std::string& dtype, double timeout_s) {
  std::vector<std::string> args;
  for (const std::string& a : argv_template) args.push_back(substitute(a, problem, out, dtype));
  // What the program leaves running is reparented here, to be killed with the rest (reap_descendants).
  std::set<pid_t> before;
  for (const auto& [pid, zombie] : children()) before.insert(pid);
  prctl(PR_SET_CHILD_SUBREAPER, 1);
  std::vector<char*> argv;
  for (std::string& a : args) argv.push_back(a.data());
  argv.push_back(nullptr);
  ProgramRun r;
  // A pipe closed on exec tells the parent whether execvp failed, and why.
  int status_pipe[2];
  if (pipe2(status_pipe, O_CLOEXEC) != 0) {
    r.status = std::string("could not be started: pipe: ") + std::strerror(errno);
    return r;
  }
  const auto t0 = std::chrono::steady_clock::now();
  const pid_t pid = fork();
  if (pid < 0) {
    close(status_pipe[0]), close(status_pipe[1]);
    r.status = std::string("could not be started: fork: ") + std::strerror(errno);
    return r;
  }
  if (pid == 0) {
    setpgid(0, 0);            // its own process group, so that a timeout kills what it started too
    dup2(2, 1);               // the program's standard output goes to tparity's standard error
    struct sigaction dfl {};  // the guard's ignored SIGPIPE would outlive execvp: the program gets the default
    dfl.sa_handler = SIG_DFL;
    sigaction(SIGPIPE, &dfl, nullptr);
    close(status_pipe[0]);
    execvp(argv[0], argv.data());
    const int e = errno;
    if (write(status_pipe[1], &e, sizeof e) < 0) _exit(127);
    _exit(127);
  }
  setpgid(pid, pid);
  g_program = pid;
  if (g_signal) kill(-pid, SIGKILL);  // a signal between fork and here
  close(status_pipe[1]);
  int exec_errno = 0;
  const bool exec_failed = read(status_pipe[0], &exec_errno, sizeof exec_errno) == ssize_t(sizeof exec_errno);
  close(status_pipe[0]);
  int status = 0;
  bool timed_out = false;
  for (;;) {
    const pid_t w = waitpid(pid, &status, WNOHANG);
    if (w == pid) break;
    if (w < 0 && errno != EINTR) break;
    const bool late = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count() > timeout_s;
    if (late || g_signal) {
      kill(-pid, SIGKILL);
      wait_until_gone(pid, status, std::chrono::steady_clock::now() + std::chrono::seconds(10));
      timed_out = late && !g_signal;
      break;
    }
    std::this_thread::sleep_for(std::chrono::milliseconds(5));
  }
  kill(-pid, SIGKILL);  // whatever the program left running in its group
  g_program = 0;
  r.left_running = reap_descendants(before);  // and in other groups and sessions
  prctl(PR_SET_CHILD_SUBREAPER, 0);
  r.seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  r.interrupted = g_signal;
  if (r.interrupted)
    r.status =
        fmt::format("was stopped: tparity received signal {} ({})", int(r.interrupted), strsignal(r.interrupted));
  else if (exec_failed)
    r.status = fmt::format("could not be started: {}: {}", args.empty() ? "" : args[0], std::strerror(exec_errno));
  else if (timed_out)
    r.status = fmt::format("timed out after {:g} s and was killed", timeout_s);
  else if (WIFSIGNALED(status))
    r.status = "was " + killed_by_signal(WTERMSIG(status));
  else if (WIFEXITED(status) && WEXITSTATUS(status) != 0)
    r.status = fmt::format("exited with code {}", WEXITSTATUS(status));
  else
    r.ok = true;
  return r;
}

void check_outputs_file(const OutputsFile& f, const Problem& p, const std::string& dtype, const std::string& where) {
  auto fail = [&](const std::string& field, const std::string& what) {
    throw InputError(where + ": " + field + ": " + what);
  };
  if (f.dtype != dtype)
    fail("dtype", fmt::format("expected \"{}\" (the precision asked for), got \"{}\"", dtype, f.dtype));
  // Every tensor in that precision: a float64 tensor in a float32 run would be judged as float32.
  for (const auto& [section, m] : {std::pair<const char*, const TensorMap*>{"outputs", &f.outputs},
                                   {"components", &f.components},
                                   {"local", &f.local}})
    for (const auto& [name, t] : *m)
      if (dtype_name(t.dtype) != dtype)
        fail(std::string(section) + "." + name + ".dtype",
             fmt::format("expected \"{}\" (the run's precision), got \"{}\"", dtype, dtype_name(t.dtype)));
  const TensorMap& ref_outputs = dtype == "float32" && !p.outputs_float32.empty() ? p.outputs_float32 : p.outputs;
  for (const auto& [name, want] : ref_outputs) {
    auto it = f.outputs.find(name);
    if (it == f.outputs.end()) fail("outputs." + name, "missing (the module returns it)");
    if (it->second.shape != want.shape)
      fail("outputs." + name, fmt::format("expected shape {} (the reference's), got {}", to_string(want.shape),
                                          to_string(it->second.shape)));
  }
  for (const auto& [name, t] : f.outputs)
    if (!ref_outputs.count(name)) {
      std::string list;
      for (const auto& [n, t2] : ref_outputs) list += (list.empty() ? "" : ", ") + n;
      fail("outputs." + name, "not an output of " + module_name(p.module) + " here (expected " + list + ")");
    }
  const std::vector<std::string> names = component_names(p);
  for (const auto& [section, m] :
       {std::pair<const char*, const TensorMap*>{"components", &f.components}, {"local", &f.local}})
    for (const auto& [name, t] : *m) {
      if (std::find(names.begin(), names.end(), name) == names.end()) {
        std::string list;
        for (const std::string& n : names) list += (list.empty() ? "" : ", ") + n;
        fail(std::string(section) + "." + name,
             "not a component of " + module_name(p.module) + " (expected one of: " + list + ")");
      }
      if (auto it = p.components.find(name); it != p.components.end() && it->second.shape != t.shape)
        fail(std::string(section) + "." + name, fmt::format("expected shape {} (the reference's), got {}",
                                                            to_string(it->second.shape), to_string(t.shape)));
    }
}

Implementation foreign_implementation(const std::string& name, const std::optional<OutputsFile>& f64,
                                      const std::optional<OutputsFile>& f32) {
  auto files = std::make_shared<std::pair<std::optional<OutputsFile>, std::optional<OutputsFile>>>(f64, f32);
  Implementation impl;
  impl.name = name;
  impl.float64 = f64.has_value();
  impl.float32 = f32.has_value();
  impl.teacher_forcing = (f64 && !f64->local.empty()) || (f32 && !f32->local.empty());
  impl.local_complete = false;
  impl.components_complete = false;
  impl.run = [files](const Problem& p, DType dtype, const Components* teacher) {
    const std::optional<OutputsFile>& f = dtype == DType::Float64 ? files->first : files->second;
    RunResult r;
    if (!f) return r;
    const std::vector<std::string> order = component_names(p);
    if (!teacher) {
      r.outputs = f->outputs;
      r.components = as_components(f->components, order);
      return r;
    }
    // Teacher forcing is the program's own: its local components, each op on the reference's inputs.
    // The local "output" stands for the outputs (the last op on the reference's inputs).
    r.components = as_components(f->local, order);
    if (auto it = f->local.find("output"); it != f->local.end() && f->outputs.count("output"))
      if (std::optional<DTensor> o = module_layout(it->second, f->outputs.at("output").shape)) r.outputs["output"] = *o;
    return r;
  };
  return impl;
}

CaseReport judge_low_precision(const Problem& p, const std::string& where, const OutputsFile& f,
                               const std::string& name) {
  RunResult run;
  run.outputs = f.outputs;
  run.components = as_components(f.components, component_names(p));
  CaseReport r = evaluate_low_precision(p, where, dtype_from_name(f.dtype), run, name, GatePolicy{});
  if (!f.local.empty())
    r.notes.push_back("its local components are not judged in " + f.dtype +
                      " (the local legs, and the first divergence, are float64's and float32's)");
  return r;
}

}  // namespace tparity
