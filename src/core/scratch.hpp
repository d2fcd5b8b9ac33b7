// A thread's scratch buffer: grows, never shrinks, 64-byte aligned. Each user keeps its own
// thread_local one (the GEMM's packing buffers, the fused attention's blocks), so that one never
// hands out memory the other is still using. Not re-entrant.
#pragma once

#include <cstdlib>
#include <new>

namespace tparity {

class Scratch {
 public:
  Scratch() = default;
  Scratch(const Scratch&) = delete;
  Scratch& operator=(const Scratch&) = delete;
  ~Scratch() { std::free(p_); }
  void* get(size_t bytes) {
    if (bytes > size_) {
      std::free(p_);
      p_ = nullptr, size_ = 0;
      const size_t n = (bytes + 63) / 64 * 64;
      p_ = std::aligned_alloc(64, n);
      if (!p_) throw std::bad_alloc();
      size_ = n;
    }
    return p_;
  }

 private:
  void* p_ = nullptr;
  size_t size_ = 0;
};

}  // namespace tparity
