// The hand core's worker threads (internal to src/core): a team of threads that run one job
// together, the caller's thread being member 0, and a barrier they can meet at. Used by the GEMM
// (which shares packed panels across the team) and by parallel_for.
#pragma once

#include <atomic>
#include <chrono>
#include <cstdint>
#include <thread>

namespace tparity::detail {

// Waiting without giving the core away. A thread that yields (sched_yield) hands its core to any
// other runnable task for that task's whole slice, a millisecond or more: beside a nice-19 build,
// two threads that yielded at every barrier ran a BERT layer 4x slower than one thread (the kernel's
// scheduler still wakes a sleeper at once, ahead of such a task). So a waiter spins on the CPU's
// pause for a while (kSpinNanoseconds), then sleeps on a futex until woken; on a quiet machine the
// waits are shorter than the spin, and no wake-up is paid.
constexpr int64_t kSpinNanoseconds = 200000;
inline void cpu_relax() {
#if defined(__x86_64__) || defined(__i386__)
  __builtin_ia32_pause();
#elif defined(__aarch64__)
  asm volatile("yield");
#endif
}
// done() polled between pauses for up to `budget` nanoseconds (the clock read every 64 pauses);
// whether it came true.
template <class Done>
bool spin_until(const Done& done, int64_t budget) {
  if (done()) return true;
  if (budget <= 0) return false;
  const auto until = std::chrono::steady_clock::now() + std::chrono::nanoseconds(budget);
  for (;;) {
    for (int i = 0; i < 64; ++i) {
      cpu_relax();
      if (done()) return true;
    }
    if (std::chrono::steady_clock::now() >= until) return false;
  }
}
// Sleeps while *word == expected (returns at once when it is not; may return early); wakes every
// thread asleep on word.
void sleep_while(const std::atomic<unsigned>* word, unsigned expected);
void wake_all(std::atomic<unsigned>* word);

// Where the threads of one call meet: a counter and a phase; a waiter spins, then sleeps.
class Barrier {
 public:
  // n threads; each waiter spins up to `spin` nanoseconds before it sleeps (0 when the team
  // outnumbers the CPUs it may run on: a spinning waiter would hold a CPU a late member needs).
  void reset(int n, int64_t spin = kSpinNanoseconds) { n_ = n, spin_ = spin; }
  void wait() {
    const unsigned phase = phase_.load(std::memory_order_acquire);
    if (arrived_.fetch_add(1, std::memory_order_acq_rel) + 1 == n_) {
      arrived_.store(0, std::memory_order_relaxed);
      phase_.fetch_add(1, std::memory_order_seq_cst);  // publishes every thread's work before the barrier
      if (sleepers_.load(std::memory_order_seq_cst) != 0) wake_all(&phase_);
      return;
    }
    const auto moved = [&] { return phase_.load(std::memory_order_acquire) != phase; };
    if (spin_until(moved, spin_)) return;
    while (!moved()) {
      // Counted before the phase is read again (by the kernel, in the sleep): the last to arrive
      // either sees a sleeper and wakes it, or moved the phase before, and the sleep returns at once.
      sleepers_.fetch_add(1, std::memory_order_seq_cst);
      sleep_while(&phase_, phase);
      sleepers_.fetch_sub(1, std::memory_order_relaxed);
    }
  }

 private:
  int n_ = 1;
  int64_t spin_ = kSpinNanoseconds;
  std::atomic<int> arrived_{0};
  std::atomic<unsigned> phase_{0};
  std::atomic<int> sleepers_{0};
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
