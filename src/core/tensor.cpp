// The core's memory (tensor.hpp): large blocks on 2 MiB boundaries, advised onto huge pages, and
// freed ones kept for the next request of the same length.
#include "tparity/core/tensor.hpp"

#include <cstddef>
#include <cstdint>
#include <cstdlib>
#include <mutex>
#include <new>
#include <utility>
#include <vector>

#include <pthread.h>
#include <unistd.h>

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

size_t page_size() {
  static const size_t page = [] {
    const long p = sysconf(_SC_PAGESIZE);
    return p > 0 ? size_t(p) : size_t(4096);
  }();
  return page;
}
[[maybe_unused]] const size_t page_size_at_load = page_size();  // (see kept_at_load)

// bytes in whole pages (a block's length as allocated, so also as freed)
size_t in_pages(size_t bytes) noexcept { return (bytes + page_size() - 1) / page_size() * page_size(); }

// Each large block its own mapping, cut to a 2 MiB boundary, so that the kernel can back it with
// huge pages from its first byte and no smaller block ever shares them. From malloc instead
// (posix_memalign), the heap's layout around the aligned blocks raised the prefill layer's peak
// memory from 32 to 54 MB: ranges advised for huge pages, later reused by other blocks.
// The sanitizer build takes the aligned malloc: there the sanitizer checks every block's bounds.
#if defined(__linux__) && defined(MADV_HUGEPAGE) && !defined(TPARITY_ASAN)
// in_pages, for a new block: bad_alloc where that, or a mapping 2 MiB longer, would not fit in a size_t
size_t whole_pages(size_t bytes) {
  if (bytes > size_t(-1) - 2 * kHugeBlock - page_size()) throw std::bad_alloc();
  return in_pages(bytes);
}

void* map_aligned(size_t len) {
  void* m = mmap(nullptr, len + kHugeBlock, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
  if (m == MAP_FAILED) throw std::bad_alloc();
  const uintptr_t start = reinterpret_cast<uintptr_t>(m);
  const uintptr_t p = (start + kHugeBlock - 1) / kHugeBlock * kHugeBlock;
  // The head and the tail cut off (page multiples, as start and len are). Should a cut fail (the
  // kernel's limit on mappings), that part stays mapped, unused: memory, not a fault.
  if (p > start) (void)munmap(m, p - start);
  const uintptr_t end = start + len + kHugeBlock;
  if (end > p + len) (void)munmap(reinterpret_cast<void*>(p + len), end - (p + len));
  // Advice only: a kernel without transparent huge pages refuses it (EINVAL), and small pages serve.
  (void)madvise(reinterpret_cast<void*>(p), len, MADV_HUGEPAGE);
  return reinterpret_cast<void*>(p);
}

class Kept;
Kept& kept();

// Freed blocks, kept: a forward pass allocates the same temporaries every time, and a fresh mapping
// costs its page faults again (with them, the zero-fills of new tensors went from 0.3% to 1.8% of
// the BERT layer on Zen 5, 0.5% to 2.0% of the prefill's). A request takes a kept block of exactly
// its length in pages, the latest kept first; at most limit_ bytes are kept, the oldest handed back
// to the kernel to make room. Never destroyed: tensors may outlive every other static.
// Fork-safe as malloc is: the mutex is taken before a fork and released after it on both sides, so
// that a child forked while another thread held it (the child has no such thread) can still allocate.
class Kept {
 public:
  Kept() {
    (void)pthread_atfork([] { kept().mutex_.lock(); }, [] { kept().mutex_.unlock(); },
                         [] { kept().mutex_.unlock(); });
  }
  void* take(size_t len) {
    const std::lock_guard<std::mutex> lock(mutex_);
    for (size_t i = blocks_.size(); i-- > 0;)
      if (blocks_[i].second == len) {
        void* p = blocks_[i].first;
        blocks_.erase(blocks_.begin() + std::ptrdiff_t(i));
        bytes_ -= len;
        return p;
      }
    return nullptr;
  }
  void keep(void* p, size_t len) noexcept {
    const std::lock_guard<std::mutex> lock(mutex_);
    if (len > limit_) {
      (void)munmap(p, len);
      return;
    }
    shrink_to(limit_ - len);
    try {
      blocks_.emplace_back(p, len);
      bytes_ += len;
    } catch (...) {  // no room for the record: the block goes back
      (void)munmap(p, len);
    }
  }
  size_t set_limit(size_t bytes) noexcept {
    const std::lock_guard<std::mutex> lock(mutex_);
    const size_t old = limit_;
    limit_ = bytes;
    shrink_to(limit_);
    return old;
  }

 private:
  void shrink_to(size_t bytes) noexcept {  // mutex_ held
    size_t drop = 0;
    while (drop < blocks_.size() && bytes_ > bytes) {
      (void)munmap(blocks_[drop].first, blocks_[drop].second);
      bytes_ -= blocks_[drop].second;
      ++drop;
    }
    blocks_.erase(blocks_.begin(), blocks_.begin() + std::ptrdiff_t(drop));
  }

  std::mutex mutex_;
  std::vector<std::pair<void*, size_t>> blocks_;  // oldest first
  size_t bytes_ = 0;
  size_t limit_ = size_t(256) << 20;
};

Kept& kept() {
  static Kept* k = new Kept;
  return *k;
}
// Made at load time, in one thread, at the latest: a child forked while another thread was making
// it (at its first large tensor) would wait on its static's guard for ever (page_size's likewise).
[[maybe_unused]] Kept& kept_at_load = kept();

void* large_allocate(size_t bytes) {
  const size_t len = whole_pages(bytes);
  if (void* p = kept().take(len)) return p;
  return map_aligned(len);
}
void large_deallocate(void* p, size_t bytes) noexcept { kept().keep(p, in_pages(bytes)); }
size_t set_kept_limit(size_t bytes) noexcept { return kept().set_limit(bytes); }
#else
void* large_allocate(size_t bytes) {
  void* p = nullptr;
  if (posix_memalign(&p, kHugeBlock, bytes) != 0) throw std::bad_alloc();  // exact: the sanitizer's bounds
#if defined(__linux__) && defined(MADV_HUGEPAGE)
  (void)madvise(p, in_pages(bytes), MADV_HUGEPAGE);  // to the end of its last page, within its mapping
#endif
  return p;
}
void large_deallocate(void* p, size_t) noexcept { std::free(p); }
size_t set_kept_limit(size_t) noexcept { return 0; }
#endif

}  // namespace

bool unset_filled_with_nan() noexcept {
#ifdef NDEBUG
  return false;
#else
  return true;
#endif
}

void* tensor_allocate(size_t bytes) { return bytes < kHugeBlock ? ::operator new(bytes) : large_allocate(bytes); }

void tensor_deallocate(void* p, size_t bytes) noexcept {
  if (bytes < kHugeBlock)
    ::operator delete(p);
  else
    large_deallocate(p, bytes);
}

}  // namespace tparity::detail

namespace tparity {
size_t set_kept_memory_limit(size_t bytes) noexcept { return detail::set_kept_limit(bytes); }
void release_kept_memory() noexcept { set_kept_memory_limit(set_kept_memory_limit(0)); }
}  // namespace tparity
