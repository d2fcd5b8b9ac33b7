// The core's memory (tensor.hpp): large blocks on 2 MiB boundaries, advised onto huge pages, and
// freed ones kept for the next request of the same length.
#include "tparity/core/tensor.hpp"

#include <cstdint>
#include <cstdlib>
#include <mutex>
#include <new>
#include <utility>
#include <vector>

#if defined(__linux__)
#include <sys/mman.h>
#endif

#if defined(__SANITIZE_ADDRESS__)  // GCC's -fsanitize=address
#define TPARITY_ASAN 1
#elif defined(__has_feature)
#if __has_feature(address_sanitizer)  // clang's
#define TPARITY_ASAN 1
#endif
#endif

namespace tparity::detail {

namespace {

constexpr size_t kPage = 4096;
size_t whole_pages(size_t bytes) { return (bytes + kPage - 1) / kPage * kPage; }

// Each large block its own mapping, cut to a 2 MiB boundary, so that the kernel can back it with
// huge pages from its first byte and no smaller block ever shares them. From malloc instead
// (posix_memalign), the heap's layout around the aligned blocks raised the prefill layer's peak
// memory from 32 to 54 MB: ranges advised for huge pages, later reused by other blocks.
// The sanitizer build takes the aligned malloc: there the sanitizer checks every block's bounds.
#if defined(__linux__) && defined(MADV_HUGEPAGE) && !defined(TPARITY_ASAN)
void* map_aligned(size_t len) {
  void* m = mmap(nullptr, len + kHugeBlock, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
  if (m == MAP_FAILED) throw std::bad_alloc();
  const uintptr_t start = reinterpret_cast<uintptr_t>(m);
  const uintptr_t p = (start + kHugeBlock - 1) / kHugeBlock * kHugeBlock;
  if (p > start) munmap(m, p - start);
  const uintptr_t end = start + len + kHugeBlock;
  if (end > p + len) munmap(reinterpret_cast<void*>(p + len), end - (p + len));
  // Advice only: a kernel without transparent huge pages refuses it (EINVAL), and 4 KiB pages serve.
  (void)madvise(reinterpret_cast<void*>(p), len, MADV_HUGEPAGE);
  return reinterpret_cast<void*>(p);
}

// Freed blocks, kept: a forward pass allocates the same temporaries every time, and a fresh mapping
// costs its page faults again (with them, the zero-fills of new tensors went from 0.3% to 1.8% of
// the BERT layer on Zen 5, 0.5% to 2.0% of the prefill's). At most kKeptBytes in all; a block past
// that is unmapped. Never destroyed: tensors may outlive every other static.
class Kept {
 public:
  static constexpr size_t kKeptBytes = size_t(256) << 20;
  void* take(size_t len) {
    const std::lock_guard<std::mutex> lock(mutex_);
    for (size_t i = 0; i < blocks_.size(); ++i)
      if (blocks_[i].second == len) {
        void* p = blocks_[i].first;
        blocks_[i] = blocks_.back();
        blocks_.pop_back();
        bytes_ -= len;
        return p;
      }
    return nullptr;
  }
  bool keep(void* p, size_t len) noexcept {
    const std::lock_guard<std::mutex> lock(mutex_);
    if (bytes_ + len > kKeptBytes) return false;
    try {
      blocks_.emplace_back(p, len);
    } catch (...) {
      return false;
    }
    bytes_ += len;
    return true;
  }
  void release() noexcept {
    const std::lock_guard<std::mutex> lock(mutex_);
    for (const auto& [p, len] : blocks_) munmap(p, len);
    blocks_.clear();
    bytes_ = 0;
  }

 private:
  std::mutex mutex_;
  std::vector<std::pair<void*, size_t>> blocks_;
  size_t bytes_ = 0;
};

Kept& kept() {
  static Kept* k = new Kept;
  return *k;
}

void* large_allocate(size_t bytes) {
  const size_t len = whole_pages(bytes);
  if (void* p = kept().take(len)) return p;
  return map_aligned(len);
}
void large_deallocate(void* p, size_t bytes) noexcept {
  const size_t len = whole_pages(bytes);
  if (!kept().keep(p, len)) munmap(p, len);
}
void release_kept() noexcept { kept().release(); }
#else
void* large_allocate(size_t bytes) {
  void* p = nullptr;
  if (posix_memalign(&p, kHugeBlock, bytes) != 0) throw std::bad_alloc();
#if defined(__linux__) && defined(MADV_HUGEPAGE)
  (void)madvise(p, whole_pages(bytes), MADV_HUGEPAGE);  // within the block's mapping: its last page
#endif
  return p;
}
void large_deallocate(void* p, size_t) noexcept { std::free(p); }
void release_kept() noexcept {}
#endif

}  // namespace

void* tensor_allocate(size_t bytes) { return bytes < kHugeBlock ? ::operator new(bytes) : large_allocate(bytes); }

void tensor_deallocate(void* p, size_t bytes) noexcept {
  if (bytes < kHugeBlock)
    ::operator delete(p);
  else
    large_deallocate(p, bytes);
}

}  // namespace tparity::detail

namespace tparity {
void release_kept_memory() noexcept { detail::release_kept(); }
}  // namespace tparity
