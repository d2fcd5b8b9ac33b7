// tparity bench's other reference: the LibTorch of another tparity build (e.g. build-debian/tparity
// against Debian's 1.13) timed on the same cases by that build's own bench, in its own process (two
// LibTorches cannot load in one), and this build's side of such a run (--torch-only).
#include <fmt/format.h>
#include <unistd.h>

#include <cerrno>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <fstream>

#include "bench.hpp"
#include "tparity/api.hpp"
#include "tparity/core/parallel.hpp"
#include "tparity/torch/reference.hpp"

namespace tparity::cli::bench {

namespace {

// s as one word for /bin/sh: in single quotes, each ' as '\''.
std::string shell_quote(const std::string& s) {
  std::string q = "'";
  for (char ch : s) q += ch == '\'' ? std::string("'\\''") : std::string(1, ch);
  return q + "'";
}

}  // namespace

void check_other_reference(const std::string& exe) {
  std::FILE* pipe = ::popen((shell_quote(exe) + " --version 2>/dev/null").c_str(), "r");
  std::string out;
  if (pipe) {
    char buf[512];
    for (size_t n; (n = std::fread(buf, 1, sizeof buf, pipe)) > 0;) out.append(buf, n);
    ::pclose(pipe);
  }
  out = out.substr(0, out.find('\n'));  // its first line
  if (out.rfind("tparity ", 0) != 0 || out.find("reference: LibTorch") == std::string::npos)
    throw InputError(
        fmt::format("option --other-reference: expected a tparity built against LibTorch, got \"{}\" "
                    "(its --version printed \"{}\")",
                    exe, out.substr(0, 120)));
}

OtherTimes time_other_reference(const Options& o, const std::vector<BenchCase>& cases) {
  // Its own decisions about OpenBLAS's kernels: none of this run's bookkeeping passed down (an
  // OPENBLAS_CORETYPE this run pinned is, to the child, an override it drops, then pins itself if
  // its OpenBLAS falls back too). Its standard error kept apart, for the one line of an error.
  // In a folder of its own from mkdtemp: a fixed name in a shared /tmp could be a stranger's link.
  std::string dir = (std::filesystem::temp_directory_path() / "tparity-bench-other-XXXXXX").string();
  if (!::mkdtemp(dir.data()))
    throw InputError(fmt::format("tparity bench: cannot create a temporary directory in {}: {}",
                                 std::filesystem::temp_directory_path().string(), std::strerror(errno)));
  const std::string err_file = dir + "/stderr";
  std::string cmd = "env -u TPARITY_BENCH_PINNED -u TPARITY_BENCH_UNSET " + shell_quote(o.other) +
                    " bench --torch-only --format json --reps " + std::to_string(o.reps);
  for (const BenchCase& c : cases) cmd += " --case " + c.name;
  if (o.quick) cmd += " --quick";
  if (o.threads) cmd += " --threads " + std::to_string(o.threads);
  cmd += " 2>" + shell_quote(err_file);
  std::FILE* pipe = ::popen(cmd.c_str(), "r");
  std::error_code ec;
  if (!pipe) {
    std::filesystem::remove_all(dir, ec);
    throw InputError("option --other-reference: could not run \"" + o.other + "\"");
  }
  std::string out;
  char buf[4096];
  for (size_t n; (n = std::fread(buf, 1, sizeof buf, pipe)) > 0;) out.append(buf, n);
  const int status = ::pclose(pipe);
  std::string err;
  {
    std::ifstream in(err_file);
    std::getline(in, err);
  }
  std::filesystem::remove_all(dir, ec);
  const nlohmann::json j = nlohmann::json::parse(out, nullptr, false);
  if (status != 0 || j.is_discarded() || !j.is_object() || !j.contains("cases") || !j.contains("environment"))
    throw InputError(
        fmt::format("option --other-reference: expected a tparity built against LibTorch (its \"bench "
                    "--torch-only\" prints JSON), got \"{}\" exiting with status {}{}",
                    o.other, status, err.empty() ? "" : ": " + err));
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
