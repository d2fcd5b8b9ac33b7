// Threads for the hand core. One thread unless asked: set_num_threads(n), or the environment
// variable TPARITY_NUM_THREADS read at start-up. The workers are kept between calls and block when
// idle, so they take no CPU from LibTorch's own pool. Results never depend on the thread count: work
// is split into whole rows, heads or tiles, each computed in the same order whoever computes it.
#pragma once

#include <cstdint>
#include <functional>
#include <stdexcept>

namespace tparity {

int num_threads();
void set_num_threads(int n);  // throws std::invalid_argument for n < 1

// body(begin, end) over contiguous slices of [0, n), on up to `threads` threads (the caller's
// included); returns when all are done. A slice boundary never splits an index.
void parallel_for(int64_t n, int threads, const std::function<void(int64_t begin, int64_t end)>& body);

}  // namespace tparity
