// The hand core's threads: parallel_for covers its range exactly once, whatever the thread count.
#include <time.h>

#include <atomic>
#include <catch2/catch.hpp>
#include <chrono>
#include <exception>
#include <future>
#include <memory>
#include <stdexcept>
#include <string>
#include <thread>
#include <vector>

#include "core/parallel_team.hpp"
#include "tparity/core/gemm.hpp"
#include "tparity/core/parallel.hpp"

using namespace tparity;

TEST_CASE("parallel: parallel_for visits every index once in contiguous slices", "[parallel]") {
  for (int threads : {1, 2, 3, 4}) {
    for (int64_t n : {0, 1, 2, 3, 7, 1000}) {
      CAPTURE(threads, n);
      std::vector<std::atomic<int>> seen(static_cast<size_t>(n));
      std::atomic<int> slices{0};
      parallel_for(n, threads, [&](int64_t b, int64_t e) {
        CHECK(b < e);
        ++slices;
        for (int64_t i = b; i < e; ++i) ++seen[size_t(i)];
      });
      for (auto& s : seen) CHECK(s.load() == 1);
      CHECK(slices.load() <= std::max<int64_t>(1, std::min<int64_t>(threads, n)));
    }
  }
}

TEST_CASE("parallel: the thread count is positive", "[parallel]") {
  const int before = num_threads();
  CHECK(before >= 1);
  set_num_threads(2);
  CHECK(num_threads() == 2);
  CHECK_THROWS_AS(set_num_threads(0), std::invalid_argument);
  set_num_threads(before);
}

namespace {

std::atomic<int> nested_failures{0};

void nested_calls() {
  for (int threads : {2, 3}) {
    const int64_t outer = 4, inner = 1000;
    std::vector<std::atomic<int>> seen(size_t(outer * inner));
    std::atomic<int> inner_slices{0};
    parallel_for(outer, threads, [&](int64_t b, int64_t e) {
      for (int64_t o = b; o < e; ++o)
        parallel_for(inner, threads, [&](int64_t ib, int64_t ie) {
          ++inner_slices;
          for (int64_t i = ib; i < ie; ++i) ++seen[size_t(o * inner + i)];
        });
    });
    for (auto& s : seen) nested_failures += s.load() != 1;
    nested_failures += inner_slices.load() != outer;

    const int64_t M = 200, N = 70, K = 50;
    std::vector<float> A(size_t(M * K)), B(size_t(N * K));
    for (size_t i = 0; i < A.size(); ++i) A[i] = float(int(i % 13) - 6) / 8;
    for (size_t i = 0; i < B.size(); ++i) B[i] = float(int(i % 11) - 5) / 4;
    std::vector<float> alone(size_t(M * N)), inside(size_t(outer * M * N));
    gemm<float>(false, true, M, N, K, 1.f, A.data(), K, B.data(), K, 0.f, alone.data(), N, nullptr, 1);
    parallel_for(outer, threads, [&](int64_t b, int64_t e) {
      for (int64_t o = b; o < e; ++o)
        gemm<float>(false, true, M, N, K, 1.f, A.data(), K, B.data(), K, 0.f, inside.data() + o * M * N, N, nullptr,
                    threads);
    });
    for (int64_t o = 0; o < outer; ++o)
      nested_failures += std::vector<float>(inside.begin() + o * M * N, inside.begin() + (o + 1) * M * N) != alone;
  }
}

}  // namespace

TEST_CASE("parallel: a team call inside a team's share runs whole on that thread", "[parallel]") {
  // The feed-forward deals its passes out to the team, and each pass calls gemm with the core's
  // thread count: a call from inside a share must run on the calling thread alone (the team is busy
  // with the outer call; waiting for it would never end). Each inner parallel_for is then one slice,
  // and a gemm on "2 threads" inside a share gives one thread's C. Run on a thread of its own, so that
  // a deadlock fails the test after a minute instead of hanging it.
  const auto finished = std::make_shared<std::promise<void>>();
  std::future<void> done = finished->get_future();
  std::thread([finished] {
    try {
      nested_calls();
      finished->set_value();
    } catch (...) {
      finished->set_exception(std::current_exception());
    }
  }).detach();
  REQUIRE(done.wait_for(std::chrono::seconds(60)) == std::future_status::ready);
  CHECK_NOTHROW(done.get());
  CHECK(nested_failures.load() == 0);
}

TEST_CASE("parallel: what a share throws reaches the caller once every share is done", "[parallel]") {
  // A share's own buffers can run out of memory: the exception must reach the caller (a worker's
  // used to end the process through std::terminate), and only after the other shares have finished
  // with the job's data.
  for (int threads : {2, 3})
    for (bool callers : {false, true}) {  // the last share is a worker's, the first the caller's
      CAPTURE(threads, callers);
      std::vector<std::atomic<int>> seen(300);
      bool caught = false;
      try {
        parallel_for(300, threads, [&](int64_t b, int64_t e) {
          for (int64_t i = b; i < e; ++i) ++seen[size_t(i)];
          if (callers ? b == 0 : e == 300) throw std::runtime_error("one share's");
        });
      } catch (const std::runtime_error& err) {
        caught = std::string(err.what()) == "one share's";
      }
      CHECK(caught);
      for (auto& s : seen) CHECK(s.load() == 1);  // every share ran to its end before the throw arrived
    }
}


namespace {

// Rounds of a team meeting at its barrier, one member late by 0 to 3 ms in turn: a waiter spins 0.2
// ms (detail::kSpinNanoseconds; not at all when the team outnumbers the CPUs, as 3 threads do on two),
// then sleeps until the last to arrive wakes it. Each member writes its
// slot before the barrier and reads every slot after it. The count of stale slots read.
int late_member_rounds(int threads) {
  std::vector<int> slot(size_t(threads), -1);
  std::atomic<int> stale{0};
  detail::run_on_threads(threads, [&](int tid, int n, detail::Barrier* barrier) {
    for (int round = 0; round < 60; ++round) {
      if (tid == round % n) std::this_thread::sleep_for(std::chrono::microseconds(1000 * (round % 4)));
      slot[size_t(tid)] = round;
      detail::barrier_wait(barrier);
      for (int j = 0; j < n; ++j) stale += slot[size_t(j)] != round;
      detail::barrier_wait(barrier);  // every slot read before the next round writes
    }
  });
  return stale.load();
}

}  // namespace

TEST_CASE("parallel: a member late by milliseconds finds the others asleep at the barrier, and wakes them",
          "[parallel]") {
  // Waiters sleep on a futex after a spell of spinning (not sched_yield, which handed the core to a
  // nice-19 build for its whole slice); a wake-up lost between the phase's change and the sleep would
  // hang the team: run on a thread of its own, failed after a minute.
  for (int threads : {2, 3}) {
    CAPTURE(threads);
    const auto finished = std::make_shared<std::promise<int>>();
    std::future<int> done = finished->get_future();
    std::thread([finished, threads] { finished->set_value(late_member_rounds(threads)); }).detach();
    REQUIRE(done.wait_for(std::chrono::seconds(60)) == std::future_status::ready);
    CHECK(done.get() == 0);
  }
}

TEST_CASE("parallel: a member waiting a long while at the barrier sleeps, not spinning or yielding", "[parallel]") {
  // The caller is 300 ms late; the worker's own CPU time over its wait is what it burnt waiting: 0.2 ms
  // of spinning, then nothing asleep. A waiter that kept spinning, or yielding on an idle core, burns
  // the whole 300 ms (on a busy machine it gets less, never more).
  std::atomic<int64_t> burnt_ns{-1};
  detail::run_on_threads(2, [&](int tid, int n, detail::Barrier* barrier) {
    if (n < 2) return;  // the system refused a thread: nothing waits
    if (tid == 0) {
      std::this_thread::sleep_for(std::chrono::milliseconds(300));
      detail::barrier_wait(barrier);
      return;
    }
    timespec t0{}, t1{};
    clock_gettime(CLOCK_THREAD_CPUTIME_ID, &t0);
    detail::barrier_wait(barrier);
    clock_gettime(CLOCK_THREAD_CPUTIME_ID, &t1);
    burnt_ns = (t1.tv_sec - t0.tv_sec) * 1000000000LL + (t1.tv_nsec - t0.tv_nsec);
  });
  REQUIRE(burnt_ns.load() >= 0);
  CHECK(burnt_ns.load() < 50000000);  // 50 ms: the spin's 0.2 ms, and a wake-up, with room
}
