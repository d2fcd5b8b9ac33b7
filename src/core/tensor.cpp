// The core's memory (tensor.hpp): large blocks on 2 MiB boundaries, advised onto huge pages.
#include "tparity/core/tensor.hpp"

#include <cstdint>
#include <cstdlib>
#include <new>

#if defined(__linux__)
#include <sys/mman.h>
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
#if defined(__linux__) && defined(MADV_HUGEPAGE) && !defined(__SANITIZE_ADDRESS__)
void* map_aligned(size_t bytes) {
  const size_t len = whole_pages(bytes);
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
void unmap(void* p, size_t bytes) { munmap(p, whole_pages(bytes)); }
#else
void* map_aligned(size_t bytes) {
  void* p = nullptr;
  if (posix_memalign(&p, kHugeBlock, bytes) != 0) throw std::bad_alloc();
#if defined(__linux__) && defined(MADV_HUGEPAGE)
  (void)madvise(p, whole_pages(bytes), MADV_HUGEPAGE);  // within the block's mapping: its last page
#endif
  return p;
}
void unmap(void* p, size_t) { std::free(p); }
#endif

}  // namespace

void* tensor_allocate(size_t bytes) { return bytes < kHugeBlock ? ::operator new(bytes) : map_aligned(bytes); }

void tensor_deallocate(void* p, size_t bytes) noexcept {
  if (bytes < kHugeBlock)
    ::operator delete(p);
  else
    unmap(p, bytes);
}

}  // namespace tparity::detail
