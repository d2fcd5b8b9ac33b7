// The hand core's threads: parallel_for covers its range exactly once, whatever the thread count.
#include <atomic>
#include <catch2/catch.hpp>
#include <vector>

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
