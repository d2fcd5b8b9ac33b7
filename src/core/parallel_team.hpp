// The hand core's worker threads (internal to src/core): a team of threads that run one job
// together, the caller's thread being member 0, and a barrier they can meet at. Used by the GEMM
// (which shares packed panels across the team) and by parallel_for.
#pragma once

#include <atomic>
#include <cstdint>
#include <thread>

namespace tparity::detail {

// Where the threads of one call meet: a counter and a phase, spinning (two cores, short waits), then
// yielding.
class Barrier {
 public:
  void reset(int n) { n_ = n; }
  void wait() {
    const unsigned phase = phase_.load(std::memory_order_acquire);
    if (arrived_.fetch_add(1, std::memory_order_acq_rel) + 1 == n_) {
      arrived_.store(0, std::memory_order_relaxed);
      phase_.fetch_add(1, std::memory_order_acq_rel);  // publishes every thread's work before the barrier
      return;
    }
    for (int spins = 0; phase_.load(std::memory_order_acquire) == phase; ++spins)
      if (spins > 4000) std::this_thread::yield();
  }

 private:
  int n_ = 1;
  std::atomic<int> arrived_{0};
  std::atomic<unsigned> phase_{0};
};

void barrier_wait(Barrier* barrier);  // barrier->wait(), out of line for the kernel files

// Work [0, end) dealt out to a team's threads as each comes for more (guided): take() hands the
// calling thread the next chunk [*begin, *stop), an n-th of half of what is left (n: the team's
// threads) rounded up to whole granules, at least `least` granules and at most `most` elements (a
// whole number of granules), or false when nothing is left. The first chunks are about a fixed
// share's size, the last small enough to even the threads out when their cores run at different
// speeds. Relaxed: the work's data are published by whatever ends the team's call, not by this.
class Dealer {
 public:
  bool take(int64_t end, int64_t granule, int64_t least, int64_t most, int threads, int64_t* begin, int64_t* stop) {
    int64_t at = next_.load(std::memory_order_relaxed);
    for (;;) {
      if (at >= end) return false;
      const int64_t share = (end - at + 2 * threads - 1) / (2 * threads);
      int64_t chunk = (share + granule - 1) / granule * granule;
      chunk = chunk < least * granule ? least * granule : chunk;
      chunk = chunk > most ? most : chunk;
      const int64_t to = end - at < chunk ? end : at + chunk;
      if (next_.compare_exchange_weak(at, to, std::memory_order_relaxed)) {
        *begin = at, *stop = to;
        return true;
      }
    }
  }

 private:
  std::atomic<int64_t> next_{0};
};

// job(ctx, tid, n, barrier) for tid 0 (the caller) .. n - 1; n = threads unless the system refused a
// thread; returns when every share is done. Team calls from different threads take turns. Called
// from inside a team's job (a share that itself calls gemm or parallel_for), it runs job(ctx, 0, 1,
// null) on the calling thread: the team is busy with the outer job.
using TeamJob = void (*)(const void* ctx, int tid, int nthreads, Barrier* barrier);
// What a share throws is thrown to the caller once every share has returned.
void run_team(int threads, TeamJob job, const void* ctx);

// Whether this thread is running a share of a team's job: a team call from here runs alone.
bool in_team();

// body(tid, nthreads, barrier) on the caller's thread and threads - 1 workers (nthreads says how
// many ran; barrier is null when that is 1).
template <class F>
void run_on_threads(int threads, const F& body) {
  if (threads <= 1) return body(0, 1, nullptr);
  run_team(
      threads,
      [](const void* ctx, int tid, int n, Barrier* barrier) { (*static_cast<const F*>(ctx))(tid, n, barrier); }, &body);
}

}  // namespace tparity::detail
