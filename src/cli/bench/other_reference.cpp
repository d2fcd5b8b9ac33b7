// tparity bench's other reference: the LibTorch of another tparity build (e.g. build-debian/tparity
// against Debian's 1.13) timed on the same cases by that build's own bench, in its own process (two
// LibTorches cannot load in one), and this build's side of such a run (--torch-only).
#include <fcntl.h>
#include <fmt/format.h>
#include <poll.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cerrno>
#include <chrono>
#include <cmath>
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
// its group and stops the bench (Interrupted). A child still running after `seconds`, or printing
// more than kMaxOtherOutput bytes, is killed with its group and refused (InputError): a stalled or
// runaway program does not hang the bench or fill its memory.
constexpr size_t kMaxOtherOutput = size_t(64) << 20;
// --version starts LibTorch (seconds, more on a cold disk); the bench times every case asked for
// with the same runs as this one (a few minutes at the default 15): an hour per 15 runs.
constexpr int kVersionSeconds = 120;
int bench_seconds(int reps) { return 3600 * (reps / 15 + 1); }
OtherRun run_other(std::vector<std::string> args, int seconds) {
  std::error_code tmp_error;
  const std::filesystem::path tmp = std::filesystem::temp_directory_path(tmp_error);
  if (tmp_error) {
    const char* env = std::getenv("TMPDIR");
    throw InputError(fmt::format("option --other-reference: no temporary folder for its standard error: TMPDIR "
                                 "(\"{}\"): {}",
                                 show_text(env ? env : "", 200), tmp_error.message()));
  }
  std::string dir = (tmp / "tparity-bench-other-XXXXXX").string();
  if (!::mkdtemp(dir.data()))
    throw InputError(fmt::format("option --other-reference: cannot create a temporary folder in {}: {}",
                                 show_text(tmp.string(), 200), std::strerror(errno)));
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
  const auto limit = std::chrono::steady_clock::now() + std::chrono::seconds(seconds);
  char buf[4096];
  while (!interrupted()) {
    if (!exited && std::chrono::steady_clock::now() > limit)
      throw InputError(fmt::format("option --other-reference: \"{}\" was still running after {} s (expected "
                                   "`{}` to finish): killed",
                                   show_text(args[0], 200), seconds, show_text(fmt::format("{}", fmt::join(args, " ")), 200)));
    if (r.out.size() > kMaxOtherOutput)
      throw InputError(fmt::format("option --other-reference: \"{}\" printed more than {} MiB (expected the "
                                   "JSON of `{}`): killed",
                                   show_text(args[0], 200), kMaxOtherOutput >> 20, show_text(fmt::format("{}", fmt::join(args, " ")), 200)));
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

void check_other_reference(const std::string& exe, int seconds) {
  struct stat st {};
  const bool file = ::stat(exe.c_str(), &st) == 0 && S_ISREG(st.st_mode);
  if (!file || ::access(exe.c_str(), X_OK) != 0)
    throw InputError(fmt::format("option --other-reference: expected an executable file, got \"{}\" ({})",
                                 show_text(exe, 200),
                                 !file ? "not a regular file" : std::string("not executable: ") + std::strerror(errno)));
  std::string out = run_other({exe, "--version"}, seconds ? seconds : kVersionSeconds).out;
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
  const OtherRun run = run_other(args, o.other_timeout ? o.other_timeout : bench_seconds(o.reps));
  const std::string& out = run.out;
  const std::string& err = run.err;
  const int status = run.status;
  // read as every JSON of a stranger's is (parse_json: strict, its nesting bounded); status first
  const nlohmann::json j =
      status == 0 ? parse_json(out, fmt::format("option --other-reference: \"{}\" printed", show_text(o.other, 200)))
                  : nlohmann::json();
  if (status != 0 || !j.is_object() || !j.contains("cases") || !j.contains("environment"))
    throw InputError(fmt::format(
        "option --other-reference: expected a tparity built against LibTorch (its \"bench --torch-only\" prints "
        "JSON), got \"{}\" {}{}",
        o.other,
        WIFSIGNALED(status) ? killed_by_signal(WTERMSIG(status))
        : WIFEXITED(status) && WEXITSTATUS(status) == 127 && out.empty()
            ? std::string("that could not be run")
            : fmt::format("exiting with code {}", WIFEXITED(status) ? WEXITSTATUS(status) : -1),
        err.empty() ? "" : ": " + err));
  // Every field checked before use: the program is the user's, its output a stranger's. A refusal
  // names the field and what came; the texts are shown escaped and cut (they reach the report).
  auto refuse = [&](const std::string& field, const std::string& expected, const nlohmann::json& got) {
    return InputError(fmt::format("option --other-reference: \"{}\" printed JSON whose {} is {}: expected {}",
                                  show_text(o.other, 200), field, show_json(got), expected));
  };
  auto text = [&](const nlohmann::json& env, const char* key) {
    if (!env.contains(key)) return std::string();
    const nlohmann::json& v = env.at(key);
    if (!v.is_string()) throw refuse(fmt::format("environment.{}", key), "a string", v);
    return show_text(v.get<std::string>(), 300);
  };
  auto times = [&](const nlohmann::json& c, const std::string& where, const std::string& key) {
    Stats st;
    double* to[3] = {&st.median, &st.min, &st.max};
    const std::string keys[3] = {key + "_ms", key + "_min_ms", key + "_max_ms"};
    for (int i = 0; i < 3; ++i) {
      const nlohmann::json v = c.contains(keys[i]) ? c.at(keys[i]) : nlohmann::json();
      if (!v.is_number() || !std::isfinite(v.get<double>()) || !(v.get<double>() > 0) || v.get<double>() > 1e9)
        throw refuse(where + "." + keys[i], "a time in ms above 0 and at most 1e9", v);
      *to[i] = v.get<double>();
    }
    if (!(st.min <= st.median && st.median <= st.max))
      throw refuse(where, fmt::format("{0}_min_ms <= {0}_ms <= {0}_max_ms", key), c);
    return st;
  };
  OtherTimes t;
  const nlohmann::json& env = j.at("environment");
  if (!env.is_object()) throw refuse("environment", "an object", env);
  t.line = text(env, "reference_line");
  t.short_name = text(env, "reference_short");
  t.warning = text(env, "reference_warning");
  t.unset = text(env, "unset");
  t.pinned = text(env, "pinned");
  const nlohmann::json& list = j.at("cases");
  if (!list.is_array()) throw refuse("cases", "an array", list);
  for (size_t i = 0; i < list.size(); ++i) {
    const nlohmann::json& c = list[i];
    const std::string where = fmt::format("cases[{}]", i);
    if (!c.is_object() || !c.contains("name") || !c.at("name").is_string())
      throw refuse(where, "an object with a string \"name\"", c);
    const std::string name = c.at("name").get<std::string>();
    bool asked = false;
    for (const BenchCase& bc : cases) asked = asked || bc.name == name;
    if (!asked || t.torch.count(name)) throw refuse(where + ".name", "a case asked for, once", c.at("name"));
    t.torch[name] = times(c, where, "torch");
    t.hand[name] = times(c, where, "hand");
  }
  for (const BenchCase& bc : cases)
    if (!t.torch.count(bc.name)) throw refuse("cases", fmt::format("a time for case {}", bc.name), list);
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
  const nlohmann::json doc{{"environment", env}, {"cases", out}};
  std::fputs((doc.dump(2, ' ', false, kBadUtf8Replaced) + "\n").c_str(), stdout);
  return kPass;
}

}  // namespace tparity::cli::bench
