// Where the hand core's time goes, op by op (`tparity bench --profile`). Off by default; a scope costs
// one relaxed load then. On, each scope reads the time-stamp counter on entry and exit and charges
// the time in between to its op, less the time of the scopes opened inside it (the innermost scope
// owns each tick), so the shares add up to the profiled time. Only the thread that turned it on is
// timed: on more threads, each op's wall time as that thread lived it.
#pragma once

#include <array>
#include <atomic>
#include <cstdint>

namespace tparity::profile {

enum class Op : int {
  Projections,  // q, k, v (self-attention: one product), LLM q/k/v
  Scores,       // score blocks: q k^T, scaled, masks added (fused: per key block)
  Softmax,      // softmax and its exp (fused: the online softmax per key block)
  Context,      // the weighted sum of v (fused: per key block, and the final division)
  OutProj,      // out_proj / o_proj, residual in its epilogue
  Norms,        // layer norms, RMS norms
  FFN,          // linear1, activation, linear2 (LLM: gate, up, down)
  Rope,         // LLM: rotary embedding, KV cache appends
  Copies,       // heads split and merged, layout moves
  ZeroFill,     // new tensors zero-filled (std::vector's value-initialisation)
  Other,        // what no scope claims: masks' merge, key statistics, allocation, the call itself
  kCount
};

inline constexpr int kOps = int(Op::kCount);
const char* name(Op op);

namespace detail {
extern std::atomic<bool> g_enabled;
void enter(Op op, Op& saved);
void leave(Op saved);
}  // namespace detail

inline bool enabled() { return detail::g_enabled.load(std::memory_order_relaxed); }
// The same, out of line: for the per-instruction-set files, which call no inline function they
// share with other files (the linker keeps one copy, perhaps compiled for another instruction set).
bool enabled_here();

// Profiling on or off for the whole process; turning it on clears the totals and starts the calling
// thread's clock (its time outside every scope is Other).
void set_enabled(bool on);

struct Totals {
  std::array<uint64_t, kOps> ticks{};  // time-stamp counter ticks (or nanoseconds where there is none)
  uint64_t total() const {
    uint64_t t = 0;
    for (uint64_t x : ticks) t += x;
    return t;
  }
};
// The totals since set_enabled(true), the calling thread's time up to now included.
Totals totals();

class Scope {
 public:
  explicit Scope(Op op) : active_(enabled()) {
    if (active_) detail::enter(op, saved_);
  }
  ~Scope() {
    if (active_) detail::leave(saved_);
  }
  Scope(const Scope&) = delete;
  Scope& operator=(const Scope&) = delete;

 private:
  bool active_;
  Op saved_ = Op::Other;
};

}  // namespace tparity::profile
