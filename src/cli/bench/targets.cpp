// tparity bench's targets: what each case is judged against, all measured in this run: the FMA peak
// and the memory bandwidth of the machine, the faster LibTorch (with --other-reference: of both),
// LibTorch's peak memory, the hand core's own one-thread speed.
#include <fmt/format.h>

#include "bench.hpp"

namespace tparity::cli::bench {

// Both times from the scaling phase (measure_case), the hand core timed alone.
double scaling(const Result& r) {
  return r.c.threads > 1 && r.hand_many.median > 0 ? r.hand_one.median / r.hand_many.median : 0.0;
}

// On more threads than one, its median timed alone (the scaling phase): LibTorch's idle workers spin
// on the cores for a while after each of its calls, and the interleaved median pays for them;
// LibTorch's own median never follows a call of the hand core's that would do the same.
double hand_time(const Result& r) {
  return r.c.threads > 1 && r.hand_many.median > 0 ? r.hand_many.median : r.hand.median;
}

double other_on_this_clock(const Result& r) {
  return r.other_hand.median > 0 ? r.other.median * hand_time(r) / r.other_hand.median : r.other.median;
}

std::pair<double, std::string> fastest(const Run& run, const Result& r) {
  if (run.other && r.other.median > 0) {
    const double other = other_on_this_clock(r);
    if (other < r.torch.median) return {other, run.other->short_name};
  }
  return {r.torch.median, run.ref.short_name()};
}

std::vector<TargetRow> target_rows(const Run& run, const Result& r) {
  const double peak = run.limits.peak, bandwidth = run.limits.bandwidth;
  std::vector<TargetRow> rows;
  const Targets& t = r.c.target;
  const auto [best, best_name] = fastest(run, r);
  const double ratio = hand_time(r) / best;
  rows.push_back({r.c.name,
                  fmt::format("<= {:.2f}x {} time", t.max_ratio, run.other ? "the faster LibTorch's" : "LibTorch's"),
                  fmt::format("{:.2f}x ({})", ratio, best_name), ratio, t.max_ratio, ratio <= t.max_ratio});
  if (t.min_peak > 0 && peak > 0) {
    const double f = r.hand_gflops / (peak * r.c.threads);
    rows.push_back({r.c.name, fmt::format(">= {:.0f}% of the FMA peak", 100 * t.min_peak),
                    fmt::format("{:.0f}%", 100 * f), f, t.min_peak, f >= t.min_peak});
  }
  if (t.min_bandwidth > 0 && bandwidth > 0) {
    const double f = r.hand_bytes_s / bandwidth;
    rows.push_back({r.c.name, fmt::format(">= {:.0f}% of the memory bandwidth", 100 * t.min_bandwidth),
                    fmt::format("{:.0f}%", 100 * f), f, t.min_bandwidth, f >= t.min_bandwidth});
  }
  if (t.max_memory > 0 && r.hand_peak >= 0 && r.torch_peak > 0) {
    const double f = double(r.hand_peak) / double(r.torch_peak);
    rows.push_back({r.c.name, fmt::format("<= {:.2f}x LibTorch's peak memory", t.max_memory), fmt::format("{:.3f}x", f),
                    f, t.max_memory, f <= t.max_memory});
  }
  if (t.min_scaling > 0) {
    const double s = scaling(r);
    rows.push_back(
        {r.c.name, fmt::format(">= {:.2f}x its one-thread speed on {} threads", t.min_scaling, r.c.threads),
         fmt::format("{:.2f}x ({:.2f} ms on 1, {:.2f} on {})", s, r.hand_one.median, r.hand_many.median, r.c.threads),
         s, t.min_scaling, s >= t.min_scaling});
  }
  return rows;
}

}  // namespace tparity::cli::bench
