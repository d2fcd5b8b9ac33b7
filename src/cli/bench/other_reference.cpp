// tparity bench's other reference: the LibTorch of another tparity build (e.g. build-debian/tparity
// against Debian's 1.13) timed on the same cases by that build's own bench, in its own process (two
// LibTorches cannot load in one), and this build's side of such a run (--torch-only).
#include <fcntl.h>
#include <fmt/format.h>
#include <poll.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cerrno>
#include <chrono>
#include <csignal>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <string>
#include <thread>
#include <vector>

#include "bench.hpp"
#include "tparity/api.hpp"
#include "tparity/core/parallel.hpp"
#include "tparity/eval/foreign.hpp"
#include "tparity/torch/reference.hpp"

namespace tparity::cli::bench {

namespace {

// What the other build printed on its standard output, the first line of its standard error, and
// how it ended (a wait status).
struct OtherRun {
  std::string out, err;
  int status = 0;
};

// The other build with args (args[0] its path, as the option names it: relative to the current
// folder when it names no folder, as the option's check that the file exists took it), without a
// shell, in a process group of its own, its environment this one's without TPARITY_BENCH_PINNED and
// TPARITY_BENCH_UNSET: none of this run's bookkeeping about OpenBLAS's kernels passed down (an
// OPENBLAS_CORETYPE this run pinned is, to the child, an override it drops, then pins itself if its
// OpenBLAS falls back too). Its standard error goes to a file in a folder of its own from mkdtemp (a
// fixed name in a shared /tmp could be a stranger's link), removed before this returns or throws,
// after the child is gone. Once the child has exited its group is killed (what it left running
// there), and its standard output read for at most 2 s more (a process outside the group holding
// it open does not hang the bench). A SIGINT, SIGTERM or SIGHUP meanwhile (InterruptGuard) kills
// its group and stops the bench (Interrupted).
OtherRun run_other(std::vector<std::string> args) {
  std::string dir = (std::filesystem::temp_directory_path() / "tparity-bench-other-XXXXXX").string();
  if (!::mkdtemp(dir.data()))
    throw InputError(fmt::format("tparity bench: cannot create a temporary directory in {}: {}",
                                 std::filesystem::temp_directory_path().string(), std::strerror(errno)));
  struct Remove {
    std::string dir;
    ~Remove() {
      std::error_code ec;
      std::filesystem::remove_all(dir, ec);
    }
  } remove{dir};
  const std::string err_file = dir + "/stderr";
  // Everything the child needs, made before fork.
  const std::string exe = args[0].find('/') == std::string::npos ? "./" + args[0] : args[0];
  std::vector<std::string> env_strings;
  for (char** e = environ; *e; ++e)
    if (std::strncmp(*e, "TPARITY_BENCH_PINNED=", 21) != 0 && std::strncmp(*e, "TPARITY_BENCH_UNSET=", 20) != 0)
      env_strings.push_back(*e);
  std::vector<char*> envp, argv;
  for (std::string& e : env_strings) envp.push_back(e.data());
  envp.push_back(nullptr);
  for (std::string& a : args) argv.push_back(a.data());
  argv.push_back(nullptr);
  const InterruptGuard guard;
  int out_pipe[2];
  if (::pipe2(out_pipe, O_CLOEXEC) != 0)
    throw InputError(fmt::format("option --other-reference: could not run \"{}\": pipe: {}", args[0], std::strerror(errno)));
  const pid_t pid = ::fork();
  if (pid < 0) {
    const int e = errno;
    ::close(out_pipe[0]), ::close(out_pipe[1]);
    throw InputError(fmt::format("option --other-reference: could not run \"{}\": fork: {}", args[0], std::strerror(e)));
  }
  if (pid == 0) {
    ::setpgid(0, 0);
    ::dup2(out_pipe[1], 1);
    int err = ::open(err_file.c_str(), O_WRONLY | O_CREAT | O_EXCL | O_NOFOLLOW | O_CLOEXEC, 0600);
    if (err < 0) err = ::open("/dev/null", O_WRONLY | O_CLOEXEC);  // never into tparity's own line
    if (err >= 0) ::dup2(err, 2);
    struct sigaction dfl {};  // the guard's ignored SIGPIPE would outlive exec
    dfl.sa_handler = SIG_DFL;
    ::sigaction(SIGPIPE, &dfl, nullptr);
    ::execve(exe.c_str(), argv.data(), envp.data());
    ::_exit(127);
  }
  ::setpgid(pid, pid);
  ::close(out_pipe[1]);
  // Until it is reaped: a signal kills its group at once (a second one would end tparity before the
  // loop below saw the first); on any way out, its group killed and the child reaped (for at most
  // 10 s: one stuck in the kernel does not hang the bench), before the folder goes.
  interrupt_kills(pid);
  struct Child {
    pid_t pid;
    int fd;
    bool reaped = false;
    ~Child() {
      interrupt_kills(0);
      ::close(fd);
      if (reaped) return;
      ::kill(-pid, SIGKILL);
      const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(10);
      while (::waitpid(pid, nullptr, WNOHANG) == 0 && std::chrono::steady_clock::now() < deadline)
        std::this_thread::sleep_for(std::chrono::milliseconds(2));
    }
  } child{pid, out_pipe[0]};
  OtherRun r;
  bool eof = false, exited = false;
  std::chrono::steady_clock::time_point deadline;
  char buf[4096];
  while (!interrupted()) {
    if (!exited) {
      siginfo_t si{};  // exited, not yet reaped: its pid, hence its group's id, still taken
      const int w = ::waitid(P_PID, id_t(pid), &si, WEXITED | WNOHANG | WNOWAIT);
      // ECHILD: reaped already (SIGCHLD ignored by whoever started tparity: the system reaps)
      if ((w == 0 && si.si_pid == pid) || (w < 0 && errno == ECHILD)) {
        exited = true;
        ::kill(-pid, SIGKILL);  // what it left running in its group
        deadline = std::chrono::steady_clock::now() + std::chrono::seconds(2);
      }
    }
    if (exited && (eof || std::chrono::steady_clock::now() > deadline)) break;
    if (eof) {
      std::this_thread::sleep_for(std::chrono::milliseconds(10));
      continue;
    }
    pollfd p{child.fd, POLLIN, 0};
    const int ready = ::poll(&p, 1, 100);  // a signal ends the wait (poll is never restarted)
    if (ready < 0 && errno != EINTR) eof = true;
    if (ready <= 0) continue;
    const ssize_t n = ::read(child.fd, buf, sizeof buf);
    if (n > 0)
      r.out.append(buf, size_t(n));
    else if (n == 0 || (errno != EINTR && errno != EAGAIN))
      eof = true;
  }
  if (const int sig = interrupted()) throw Interrupted(sig);  // Child and Remove clean up
  pid_t w;
  while ((w = ::waitpid(pid, &r.status, 0)) < 0 && errno == EINTR) {
  }
  if (w < 0) r.status = 0;  // reaped by the system: how it ended is unknown; its output tells
  child.reaped = true;
  std::ifstream in(err_file);
  std::getline(in, r.err);
  return r;
}

}  // namespace

void check_other_reference(const std::string& exe) {
  std::string out = run_other({exe, "--version"}).out;
  out = out.substr(0, out.find('\n'));  // its first line
  if (out.rfind("tparity ", 0) != 0 || out.find("reference: LibTorch") == std::string::npos)
    throw InputError(
        fmt::format("option --other-reference: expected a tparity built against LibTorch, got \"{}\" "
                    "(its --version printed \"{}\")",
                    exe, out.substr(0, 120)));
}

OtherTimes time_other_reference(const Options& o, const std::vector<BenchCase>& cases) {
  std::vector<std::string> args{o.other, "bench", "--torch-only", "--format", "json", "--reps", std::to_string(o.reps)};
  for (const BenchCase& c : cases) args.insert(args.end(), {"--case", c.name});
  if (o.quick) args.push_back("--quick");
  if (o.threads) args.insert(args.end(), {"--threads", std::to_string(o.threads)});
  const OtherRun run = run_other(args);
  const std::string& out = run.out;
  const std::string& err = run.err;
  const int status = run.status;
  const nlohmann::json j = nlohmann::json::parse(out, nullptr, false);
  if (status != 0 || j.is_discarded() || !j.is_object() || !j.contains("cases") || !j.contains("environment"))
    throw InputError(fmt::format(
        "option --other-reference: expected a tparity built against LibTorch (its \"bench --torch-only\" prints "
        "JSON), got \"{}\" {}{}",
        o.other,
        WIFSIGNALED(status) ? fmt::format("killed by signal {} ({})", WTERMSIG(status), strsignal(WTERMSIG(status)))
        : WIFEXITED(status) && WEXITSTATUS(status) == 127 && out.empty()
            ? std::string("that could not be run")
            : fmt::format("exiting with code {}", WIFEXITED(status) ? WEXITSTATUS(status) : -1),
        err.empty() ? "" : ": " + err));
  OtherTimes t;
  const nlohmann::json& env = j.at("environment");
  t.line = env.value("reference_line", "");
  t.short_name = env.value("reference_short", "");
  t.warning = env.value("reference_warning", "");
  t.unset = env.value("unset", "");
  t.pinned = env.value("pinned", "");
  for (const nlohmann::json& c : j.at("cases")) {
    const std::string name = c.at("name").get<std::string>();
    t.torch[name] = {c.at("torch_ms").get<double>(), c.at("torch_min_ms").get<double>(),
                     c.at("torch_max_ms").get<double>()};
    if (c.contains("hand_ms"))
      t.hand[name] = {c.at("hand_ms").get<double>(), c.at("hand_min_ms").get<double>(),
                      c.at("hand_max_ms").get<double>()};
  }
  return t;
}

int torch_only(const Options& o, const std::vector<BenchCase>& cases) {
  if (!torch_available()) throw InputError("option --torch-only: this tparity was built without LibTorch");
  nlohmann::json out = nlohmann::json::array();
  for (const BenchCase& c : cases) {
    // The hand core too, timed as the asking bench times it (time_sides): it runs the same code in
    // both processes, so the asking bench can put this LibTorch's time on its own clock, which a
    // shared machine's drift between the two processes would otherwise skew.
    const Problem p = make_problem(c.spec);
    set_num_threads(c.threads);
    set_torch_threads(c.threads);
    const std::function<void()> hand = prepare_hand(p, DType::Float32, "bench " + c.name);
    const std::function<void()> torch = prepare_torch(p, DType::Float32, "bench " + c.name);
    const Timings t = time_sides(hand, torch, c.threads, o.reps);
    const Stats& h = c.threads > 1 ? t.hand_many : t.hand;  // hand_time's choice
    out.push_back({{"name", c.name},
                   {"torch_ms", t.torch.median},
                   {"torch_min_ms", t.torch.min},
                   {"torch_max_ms", t.torch.max},
                   {"hand_ms", h.median},
                   {"hand_min_ms", h.min},
                   {"hand_max_ms", h.max}});
  }
  set_num_threads(1);
  set_torch_threads(1);
  const ReferenceInfo ref = reference_info();
  const char* dropped = std::getenv("TPARITY_BENCH_UNSET");
  const char* pinned = std::getenv("TPARITY_BENCH_PINNED");
  const nlohmann::json env = {{"reference_line", ref.line()},
                              {"reference_short", ref.short_name()},
                              {"reference_warning", ref.warning},
                              {"unset", dropped ? dropped : ""},
                              {"pinned", pinned ? pinned : ""}};
  std::fputs((nlohmann::json{{"environment", env}, {"cases", out}}.dump(2) + "\n").c_str(), stdout);
  return kPass;
}

}  // namespace tparity::cli::bench
