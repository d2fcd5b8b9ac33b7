// tparity bench's output: the environment, every case's figures, the profile, both references and the
// targets, as tables or as one JSON document (built as one value, printed in one place).
#include <fmt/format.h>

#include <algorithm>
#include <cstdio>
#include <fstream>

#include "bench.hpp"
#include "tparity/compare/report.hpp"
#include "tparity/core/gemm.hpp"
#include "tparity/torch/reference.hpp"

namespace tparity::cli::bench {

namespace {

// "AMD EPYC (family 25, model 17)": the name, and the numbers that tell a generation when the name
// does not (a VM's "AMD EPYC"; Emerald Rapids is Intel family 6, model 207).
std::string cpu_model() {
  std::ifstream in("/proc/cpuinfo");
  std::string line, name = "unknown", family, model;
  while (std::getline(in, line) && line.find(':') != std::string::npos) {
    const std::string key = line.substr(0, line.find_first_of("\t:"));
    std::string v = line.substr(line.find(':') + 1);
    v.erase(0, v.find_first_not_of(' '));
    if (key == "model name") name = v;
    if (key == "cpu family") family = v;
    if (key == "model") model = v;
  }
  return family.empty() ? name : fmt::format("{} (family {}, model {})", name, family, model);
}

// The caches the OS reports and the GEMM's float blocks fitted to them (gemm.cpp, fit_to_caches).
std::string caches_line() {
  const CpuCaches& c = cpu_caches();
  auto kib = [](int64_t b) { return b >= (1 << 20) ? fmt::format("{} MiB", b >> 20) : fmt::format("{} KiB", b >> 10); };
  const gemm_detail::GemmBlocking bs = gemm_detail::kernel_info<float>(gemm_isa()).blocking;
  const std::string blocks = fmt::format("hand core's float GEMM blocks: mr {} x nr {}, kc {}, mc {}, nc {}", bs.mr,
                                         bs.nr, bs.kc, bs.mc, bs.nc);
  if (c.l2 <= 0) return fmt::format("caches: {}; {}", c.source, blocks);
  return fmt::format("caches ({}): L1d {}, L2 {}{}, {}; {}", c.source, kib(c.l1d), kib(c.l2),
                     c.l2_sharing > 1 ? fmt::format(" shared by {}", c.l2_sharing) : "",
                     c.l3 > 0 ? fmt::format("L3 {} shared by {} CPUs", kib(c.l3), c.l3_sharing) : "no L3 reported",
                     blocks);
}

nlohmann::json targets_json(const Run& run, const Result& r) {
  nlohmann::json a = nlohmann::json::array();
  for (const TargetRow& t : target_rows(run, r))
    a.push_back({{"target", t.what}, {"measured", t.measured}, {"value", t.value}, {"limit", t.limit}, {"met", t.met}});
  return a;
}

nlohmann::json profile_json(const Options& o, const Result& r) {
  if (!o.profile) return nullptr;
  nlohmann::json ops = nlohmann::json::object();
  for (int i = 0; i < profile::kOps; ++i)
    ops[profile::name(profile::Op(i))] = {{"ms", r.op_ms[size_t(i)]},
                                          {"share", r.profiled_ms > 0 ? r.op_ms[size_t(i)] / r.profiled_ms : 0.0}};
  nlohmann::json j = {{"threads", 1}, {"profiled_ms", r.profiled_ms}, {"ops", ops}};
  if (r.c.threads > 1) {
    nlohmann::json many = nlohmann::json::object();
    for (int i = 0; i < profile::kOps; ++i) many[profile::name(profile::Op(i))] = {{"ms", r.op_ms_many[size_t(i)]}};
    j["on_threads"] = {{"threads", r.c.threads}, {"profiled_ms", r.profiled_ms_many}, {"ops", many}};
  }
  return j;
}

// How many runs a limit is the best of (`runs`, the peak's or the bandwidth's), and when they were taken.
std::string limits_when(const Run& run, int runs) {
  const int each = run.limits.runs_per_round;
  return run.limits.rounds > 1 ? fmt::format("{} runs: {} before the cases and {} after each", runs, each, each)
                              : fmt::format("{} runs", runs);
}

}  // namespace

void print_json(const Options& o, const Run& run) {
  const double peak = run.limits.peak, bandwidth = run.limits.bandwidth;
  const std::optional<OtherTimes>& other = run.other;
  const ReferenceInfo& ref = run.ref;
  const char *dropped = run.dropped, *pinned = run.pinned;
  nlohmann::json env = {{"cpu", cpu_model()},
                        {"isa", to_string(gemm_isa())},
                        {"blas", torch_blas()},
                        {"torch", torch_version()},
                        {"reference", to_json(ref)},
                        {"peak_gflops", peak},
                        {"peak_isa", run.limits.isa},
                        {"limit_runs", run.limits.peak_runs},
                        {"bandwidth_runs", run.limits.bandwidth_runs},
                        {"bandwidth_bytes_s", bandwidth},
                        {"unset", dropped ? dropped : ""},
                        {"pinned", pinned ? pinned : ""},
                        {"heap", run.heap},
                        {"caches", caches_line()},
                        {"other_reference", other ? nlohmann::json{{"line", other->line},
                                                                   {"short", other->short_name},
                                                                   {"warning", other->warning},
                                                                   {"unset", other->unset},
                                                                   {"pinned", other->pinned}}
                                                  : nlohmann::json(nullptr)},
                        {"quick", o.quick},
                        {"reps", o.reps}};
  nlohmann::json cases = nlohmann::json::array();
  for (const Result& r : run.results)
    cases.push_back({{"name", r.c.name},
                     {"description", r.c.spec.describe()},
                     {"threads", r.c.threads},
                     {"hand_ms", r.hand.median},
                     {"hand_min_ms", r.hand.min},
                     {"hand_max_ms", r.hand.max},
                     {"torch_ms", r.torch.median},
                     {"torch_min_ms", r.torch.min},
                     {"torch_max_ms", r.torch.max},
                     {"ratio", r.hand.median / r.torch.median},
                     {"hand_gflops", r.hand_gflops},
                     {"torch_gflops", r.torch_gflops},
                     {"peak_fraction", peak > 0 ? r.hand_gflops / (peak * r.c.threads) : 0.0},
                     {"torch_peak_fraction", peak > 0 ? r.torch_gflops / (peak * r.c.threads) : 0.0},
                     {"hand_bytes_s", r.hand_bytes_s},
                     {"torch_bytes_s", r.torch_bytes_s},
                     {"bandwidth_fraction", bandwidth > 0 ? r.hand_bytes_s / bandwidth : 0.0},
                     {"torch_bandwidth_fraction", bandwidth > 0 ? r.torch_bytes_s / bandwidth : 0.0},
                     {"hand_peak_bytes", r.hand_peak},
                     {"torch_peak_bytes", r.torch_peak},
                     {"scaling", scaling(r)},
                     {"scaling_one_thread_ms", r.hand_one.median},
                     {"scaling_threads_ms", r.hand_many.median},
                     {"other_torch_ms", r.other.median},
                     {"other_torch_min_ms", r.other.min},
                     {"other_torch_max_ms", r.other.max},
                     {"other_hand_ms", r.other_hand.median},
                     {"other_torch_on_this_clock_ms", r.other.median > 0 ? other_on_this_clock(r) : 0.0},
                     {"fastest_torch_ms", fastest(run, r).first},
                     {"fastest_torch", fastest(run, r).second},
                     {"targets", targets_json(run, r)},
                     {"profile", profile_json(o, r)},
                     {"reference", ref.short_name()},
                     {"parity", r.parity}});
  const nlohmann::json doc{{"environment", env}, {"cases", cases}};
  std::fputs((doc.dump(2, ' ', false, kBadUtf8Replaced) + "\n").c_str(), stdout);
}

void print_table(const Options& o, const Run& run) {
  const double peak = run.limits.peak, bandwidth = run.limits.bandwidth;
  const std::optional<OtherTimes>& other = run.other;
  const ReferenceInfo& ref = run.ref;
  const char *dropped = run.dropped, *pinned = run.pinned;
  const std::vector<Result>& results = run.results;
  fmt::print(
      "tparity bench: {} | hand core ISA {} | fp32 FMA peak {:.0f} GFLOP/s per core ({}, best of {})\nreference: {}\n",
      cpu_model(), to_string(gemm_isa()), peak, run.limits.isa, limits_when(run, run.limits.peak_runs), ref.line());
  if (!ref.warning.empty()) fmt::print("warning: {}\n", ref.warning);
  fmt::print("{}\n", caches_line());
  if (bandwidth > 0)
    fmt::print("memory bandwidth: {:.1f} GB/s (one core's streaming read of 1 GiB, best of {})\n", bandwidth / 1e9,
               limits_when(run, run.limits.bandwidth_runs));
  fmt::print("{}\n", dropped ? fmt::format("unset for this run, so OpenBLAS picks its own kernels: {}", dropped)
                             : std::string("no OpenBLAS overrides were set"));
  if (pinned) fmt::print("pinned for LibTorch in this run: {}\n", pinned);
  if (!run.heap.empty()) fmt::print("{}\n", run.heap);
  if (other) {
    fmt::print("other reference: {} (timed by {} after this build's cases, same cases and runs)\n", other->line,
               o.other);
    if (!other->warning.empty()) fmt::print("warning: {}\n", other->warning);
    if (!other->pinned.empty()) fmt::print("pinned for the other reference: {}\n", other->pinned);
  }
  fmt::print(
      "medians of {} interleaved runs after 2 warm-ups; peak memory: the forward pass beyond its inputs and "
      "weights, each side in its own child process\n\n",
      o.reps);
  fmt::print("{:<19} {:>3} {:>22} {:>22} {:>6} {:>13} {:>9} {:>19} {:>6}  {:<18} {}\n", "case", "thr",
             "hand ms (min-max)", "torch ms (min-max)", "ratio", "GFLOP/s h/t", "of peak", "peak MB h/t", "mem",
             "reference", "parity");
  for (const Result& r : results) {
    const double mem = r.hand_peak >= 0 && r.torch_peak > 0 ? double(r.hand_peak) / double(r.torch_peak) : 0;
    fmt::print("{:<19} {:>3} {:>22} {:>22} {:>6.2f} {:>13} {:>9} {:>19} {:>6}  {:<18} {}\n", r.c.name, r.c.threads,
               fmt::format("{:.2f} ({:.2f}-{:.2f})", r.hand.median, r.hand.min, r.hand.max),
               fmt::format("{:.2f} ({:.2f}-{:.2f})", r.torch.median, r.torch.min, r.torch.max),
               r.hand.median / r.torch.median, fmt::format("{:.0f}/{:.0f}", r.hand_gflops, r.torch_gflops),
               peak > 0 ? fmt::format("{:.0f}%/{:.0f}%", 100 * r.hand_gflops / (peak * r.c.threads),
                                      100 * r.torch_gflops / (peak * r.c.threads))
                        : "-",
               fmt::format("{:.1f}/{:.1f}", double(r.hand_peak) / 1e6, double(r.torch_peak) / 1e6),
               mem > 0 ? fmt::format("{:.3f}", mem) : "-", ref.short_name(), r.parity);
  }
  for (const Result& r : results)
    if (r.c.memory_bound)
      fmt::print(
          "{}: {:.2f} GB moved per call (the weights once, the cache's k and v): hand {:.1f} GB/s = {:.0f}% "
          "of the measured bandwidth, LibTorch {:.1f} GB/s = {:.0f}%\n",
          r.c.name, bytes_moved(r.c.spec) / 1e9, r.hand_bytes_s / 1e9,
          bandwidth > 0 ? 100 * r.hand_bytes_s / bandwidth : 0.0, r.torch_bytes_s / 1e9,
          bandwidth > 0 ? 100 * r.torch_bytes_s / bandwidth : 0.0);
  if (o.profile) {
    fmt::print(
        "\nwhere the hand core's time goes (--profile: one thread, {} calls per case after the timed runs; each op's "
        "share of the profiled call, and the profiled call's time over the timed one-thread median: the cost of the "
        "profile's clock reads)\n",
        std::max(3, o.reps / 3));
    fmt::print("{:<30}", "op");
    for (const Result& r : results) fmt::print(" {:>19}", r.c.name);
    fmt::print("\n");
    for (int i = 0; i < profile::kOps; ++i) {
      fmt::print("{:<30}", profile::name(profile::Op(i)));
      for (const Result& r : results)
        fmt::print(" {:>19}",
                   r.profiled_ms > 0 ? fmt::format("{:.1f}%", 100 * r.op_ms[size_t(i)] / r.profiled_ms) : "-");
      fmt::print("\n");
    }
    fmt::print("{:<30}", "profiled ms per call");
    for (const Result& r : results) {
      const double timed = r.c.threads > 1 ? r.hand_one.median : r.hand.median;
      fmt::print(" {:>19}", fmt::format("{:.2f} ({:.2f}x)", r.profiled_ms, timed > 0 ? r.profiled_ms / timed : 0.0));
    }
    fmt::print("\n");
    // On the case's threads: each op's wall time on the calling thread, and its speed-up over one thread.
    for (const Result& r : results) {
      if (r.c.threads <= 1 || r.profiled_ms_many <= 0) continue;
      fmt::print("\n{} on {} threads (the calling thread's wall time per op; speed-up over one thread):\n", r.c.name,
                 r.c.threads);
      for (int i = 0; i < profile::kOps; ++i) {
        const double one = r.op_ms[size_t(i)], many = r.op_ms_many[size_t(i)];
        if (one < 0.005 * r.profiled_ms && many < 0.005 * r.profiled_ms_many) continue;
        fmt::print("{:<30} {:>9.2f} ms {:>6.1f}%  {:>5.2f}x\n", profile::name(profile::Op(i)), many,
                   100 * many / r.profiled_ms_many, many > 0 ? one / many : 0.0);
      }
      fmt::print("{:<30} {:>9.2f} ms          {:>5.2f}x\n", "profiled ms per call", r.profiled_ms_many,
                 r.profiled_ms / r.profiled_ms_many);
    }
    fmt::print("\n");
  }
  if (other) {
    fmt::print(
        "\nagainst both references (ms, median (min-max); the other reference timed in its own process beside the hand "
        "core, whose time there puts it on this run's clock: \"here\"):\n{:<19} {:>22} {:>22} {:>22} {:>22} {:>8} "
        "{:>8}\n",
        "case", "hand", ref.short_name(), other->short_name, "hand there", "here", "h/faster");
    for (const Result& r : results) {
      auto ms = [](const Stats& s) {
        return s.median > 0 ? fmt::format("{:.2f} ({:.2f}-{:.2f})", s.median, s.min, s.max) : std::string("-");
      };
      fmt::print("{:<19} {:>22} {:>22} {:>22} {:>22} {:>8} {:>8.2f}\n", r.c.name, ms(r.hand), ms(r.torch), ms(r.other),
                 ms(r.other_hand), r.other.median > 0 ? fmt::format("{:.2f}", other_on_this_clock(r)) : "-",
                 hand_time(r) / fastest(run, r).first);
    }
  }
  // The targets, each against this run's measurements: the FMA peak and the bandwidth measured above,
  // the faster LibTorch (with --other-reference: of both); the two-thread scaling timed apart.
  fmt::print(
      "\ntargets (scaling: the hand core alone, {} runs on 1 and on the case's threads interleaved after a 0.3 s "
      "pause{}):\n",
      o.reps, other ? "" : "; the time against this build's LibTorch only: --other-reference adds the other");
  int met = 0, total = 0;
  for (const Result& r : results)
    for (const TargetRow& t : target_rows(run, r)) {
      fmt::print("{:<19} {:<44} {:<36} {}\n", t.name, t.what, t.measured, t.met ? "met" : "MISSED");
      met += t.met, ++total;
    }
  fmt::print("{} of {} targets met{}\n", met, total, o.quick ? " (--quick: the targets are for the full shapes)" : "");
}

}  // namespace tparity::cli::bench
