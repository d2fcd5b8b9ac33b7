// The hand core's threads: the team the GEMM and parallel_for run on, and the thread count.
#include "tparity/core/parallel.hpp"

#include <algorithm>
#include <condition_variable>
#include <cstdlib>
#include <exception>
#include <mutex>
#include <string>
#include <system_error>
#include <utility>

#include "parallel_team.hpp"

#if defined(__linux__)
#include <linux/futex.h>
#include <sched.h>
#include <sys/syscall.h>
#include <unistd.h>
#endif

namespace tparity {

namespace detail {

void sleep_while(const std::atomic<unsigned>* word, unsigned expected) {
#if defined(__linux__)
  // The kernel compares *word with expected and sleeps only if they match, atomically with the wake.
  static_assert(sizeof(std::atomic<unsigned>) == sizeof(unsigned), "a futex is a plain 32-bit word");
  syscall(SYS_futex, reinterpret_cast<const unsigned*>(word), FUTEX_WAIT_PRIVATE, expected, nullptr, nullptr, 0);
#else
  if (word->load() == expected) std::this_thread::yield();
#endif
}

void wake_all(std::atomic<unsigned>* word) {
#if defined(__linux__)
  syscall(SYS_futex, reinterpret_cast<unsigned*>(word), FUTEX_WAKE_PRIVATE, INT32_MAX, nullptr, nullptr, 0);
#else
  (void)word;
#endif
}

namespace {

// The CPUs this process may run on (its affinity mask: taskset, a container's cpuset), else every
// CPU the system has.
int usable_cpus() {
#if defined(__linux__)
  cpu_set_t set;
  if (sched_getaffinity(0, sizeof set, &set) == 0 && CPU_COUNT(&set) > 0) return CPU_COUNT(&set);
#endif
  return std::max(1, int(std::thread::hardware_concurrency()));
}

// Whether this thread is running a share of a team's job (the caller's or a worker's): a team call
// from inside one runs on this thread alone (run_team), where it would wait for the team it is in.
thread_local bool t_in_team = false;

struct InTeam {
  const bool was = t_in_team;
  InTeam() { t_in_team = true; }
  ~InTeam() { t_in_team = was; }
};

// Threads kept for the next call: created by the first call that asks for them, then blocked on a
// condition variable between calls, after a short spell of spinning (kSpinNanoseconds, 0.2 ms, for
// the last call's members when the team did not outnumber the CPUs; else none; never yielding, which
// hands the core to any other runnable task: parallel_team.hpp) so that back-to-back calls do not
// each pay a wake-up (43 us per call when threads were started per call, 2 us with these). Idle,
// they take no CPU from LibTorch's pool or anyone else's. Never destroyed (the process ends them).
// One call at a time: concurrent callers take turns.
class Workers {
 public:
  using Job = void (*)(const void* ctx, int tid, int nthreads, Barrier* barrier);

  static Workers& get() {
    static Workers* const workers = new Workers;  // leaked on purpose: no join at exit
    return *workers;
  }

  // job(ctx, tid, n, barrier) for tid 0 (the caller) .. n - 1, n = threads unless the system refused
  // a thread; returns when every share is done.
  void run(int threads, Job job, const void* ctx) {
    const std::lock_guard<std::mutex> one_call(call_mutex_);
    while (started_ < threads - 1) {
      try {
        std::thread(&Workers::loop, this, started_ + 1, generation_.load()).detach();
      } catch (const std::system_error&) {
        break;
      }
      ++started_;
    }
    const int n = std::min(threads, started_ + 1);
    // More threads than CPUs: a waiter sleeps at once, its CPU left to a member that has not arrived.
    static const int cpus = usable_cpus();
    const int64_t spin = n > cpus ? 0 : kSpinNanoseconds;
    Barrier barrier;
    barrier.reset(n, spin);
    {
      const std::lock_guard<std::mutex> lock(mutex_);
      job_ = job, ctx_ = ctx, barrier_ = &barrier, team_ = n, spin_ = spin;
      pending_.store(n - 1);
      generation_.fetch_add(1);
    }
    wake_.notify_all();
    share(job, ctx, 0, n, &barrier);
    spin_until([&] { return pending_.load() == 0; }, spin);
    std::unique_lock<std::mutex> lock(mutex_);
    done_.wait(lock, [&] { return pending_.load() == 0; });
    // What a share threw (out of memory in a share's own buffers), thrown here once every share is
    // done with the job's data: it unwound only that share (a job that meets at its barrier does not
    // throw: the GEMM's buffers are made before its team starts).
    if (error_) std::rethrow_exception(std::exchange(error_, nullptr));
  }

 private:
  void loop(int tid, uint64_t seen) {
    // How long to spin for the next call: the last call's spin when this worker was in its team;
    // none when it was left out (it would spin on a CPU that the team's members need).
    int64_t spin = kSpinNanoseconds;
    for (;;) {
      spin_until([&] { return generation_.load() != seen; }, spin);
      std::unique_lock<std::mutex> lock(mutex_);
      wake_.wait(lock, [&] { return generation_.load() != seen; });
      seen = generation_.load();
      if (tid >= team_) {
        spin = 0;
        continue;
      }
      spin = spin_;
      const Job job = job_;
      const void* const ctx = ctx_;
      Barrier* const barrier = barrier_;
      const int n = team_;
      lock.unlock();
      share(job, ctx, tid, n, barrier);
      lock.lock();
      if (pending_.fetch_sub(1) == 1) done_.notify_one();
    }
  }

  // One member's share of the call, marked as inside the team; the first exception a share throws is
  // kept for run() to throw, not let out of a worker's loop (std::terminate) or out of the caller's
  // share while the workers still run on the job's data.
  void share(Job job, const void* ctx, int tid, int n, Barrier* barrier) {
    const InTeam member;
    try {
      job(ctx, tid, n, barrier);
    } catch (...) {
      const std::lock_guard<std::mutex> lock(error_mutex_);
      if (!error_) error_ = std::current_exception();
    }
  }

  std::mutex call_mutex_;  // held for a whole call
  std::mutex error_mutex_;
  std::exception_ptr error_;  // the first exception a share of the current call threw
  int started_ = 0;        // workers, tids 1..started_
  std::mutex mutex_;       // guards the job and the waits
  std::condition_variable wake_, done_;
  std::atomic<uint64_t> generation_{0};  // one more per call
  std::atomic<int> pending_{0};          // workers still on the current call
  Job job_ = nullptr;
  const void* ctx_ = nullptr;
  Barrier* barrier_ = nullptr;
  int team_ = 1;
  int64_t spin_ = kSpinNanoseconds;  // the current call's: its members' spin at its barrier and for the next
};

}  // namespace

void run_team(int threads, TeamJob job, const void* ctx) {
  if (t_in_team) return job(ctx, 0, 1, nullptr);  // nested: this thread's share is the whole job
  Workers::get().run(threads, job, ctx);
}

bool in_team() { return t_in_team; }

void barrier_wait(Barrier* barrier) { barrier->wait(); }

}  // namespace detail

namespace {

int initial_threads() {
  const char* env = std::getenv("TPARITY_NUM_THREADS");
  if (!env || !*env) return 1;
  char* end = nullptr;
  const long n = std::strtol(env, &end, 10);
  return (*end == 0 && n >= 1 && n <= 1024) ? int(n) : 1;
}

std::atomic<int> g_threads{initial_threads()};

}  // namespace

int num_threads() { return g_threads.load(std::memory_order_relaxed); }

void set_num_threads(int n) {
  if (n < 1) throw std::invalid_argument("set_num_threads: expected a positive thread count, got " + std::to_string(n));
  g_threads.store(n, std::memory_order_relaxed);
}

void parallel_for(int64_t n, int threads, const std::function<void(int64_t begin, int64_t end)>& body) {
  if (n <= 0) return;
  threads = int(std::max<int64_t>(1, std::min<int64_t>(threads, n)));
  detail::run_on_threads(threads, [&](int tid, int nthreads, detail::Barrier*) {
    const int64_t begin = n * tid / nthreads, end = n * (tid + 1) / nthreads;
    if (begin < end) body(begin, end);
  });
}

}  // namespace tparity
