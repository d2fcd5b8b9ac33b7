#include "tparity/core/profile.hpp"

#include <chrono>

#if defined(__x86_64__)
#include <x86intrin.h>
#endif

namespace tparity::profile {

namespace detail {

std::atomic<bool> g_enabled{false};

namespace {

std::array<std::atomic<uint64_t>, kOps> g_ticks{};

inline uint64_t now() {
#if defined(__x86_64__)
  return __rdtsc();  // ~20 cycles, against ~60 for the clock: a fused attention block is a microsecond
#else
  return uint64_t(
      std::chrono::duration_cast<std::chrono::nanoseconds>(std::chrono::steady_clock::now().time_since_epoch())
          .count());
#endif
}

// The profiled thread: the one that turned profiling on. The others (the core's workers) charge
// nothing, so that on more threads than one each op's time is the wall time the calling thread spent
// in it (parallel regions included: it takes a share of their work and waits for the rest).
struct ThreadClock {
  Op current = Op::Other;
  uint64_t since = now();
  bool profiled = false;
};
thread_local ThreadClock t_clock;

inline void charge(uint64_t at) {
  g_ticks[size_t(t_clock.current)].fetch_add(at - t_clock.since, std::memory_order_relaxed);
  t_clock.since = at;
}

}  // namespace

void enter(Op op, Op& saved) {
  if (!t_clock.profiled) return;
  charge(now());
  saved = t_clock.current;
  t_clock.current = op;
}

void leave(Op saved) {
  if (!t_clock.profiled) return;
  charge(now());
  t_clock.current = saved;
}

}  // namespace detail

const char* name(Op op) {
  switch (op) {
    case Op::Projections:
      return "projections (q, k, v)";
    case Op::Scores:
      return "score blocks (q k^T, masks)";
    case Op::Softmax:
      return "softmax / exp";
    case Op::Context:
      return "context (weights v)";
    case Op::OutProj:
      return "out_proj (+ residual)";
    case Op::Norms:
      return "layer / RMS norms";
    case Op::FFN:
      return "FFN (linear1, act, linear2)";
    case Op::Rope:
      return "RoPE, KV cache";
    case Op::Copies:
      return "copies (heads, layouts)";
    case Op::ZeroFill:
      return "zero-fills (new tensors)";
    case Op::Other:
    case Op::kCount:
      break;
  }
  return "other (masks, stats, calls)";
}

bool enabled_here() { return enabled(); }

void set_enabled(bool on) {
  if (on) {
    for (auto& t : detail::g_ticks) t.store(0, std::memory_order_relaxed);
    detail::t_clock = detail::ThreadClock{};
    detail::t_clock.profiled = true;
  } else {
    detail::t_clock.profiled = false;
  }
  detail::g_enabled.store(on, std::memory_order_relaxed);
}

Totals totals() {
  if (enabled() && detail::t_clock.profiled) detail::charge(detail::now());
  Totals t;
  for (int i = 0; i < kOps; ++i) t.ticks[size_t(i)] = detail::g_ticks[size_t(i)].load(std::memory_order_relaxed);
  return t;
}

}  // namespace tparity::profile
