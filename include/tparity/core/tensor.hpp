// A minimal owning tensor: a shape and a contiguous row-major buffer. No views, no strides, no
// broadcasting: each op documents the shapes it takes and walks the buffer itself.
#pragma once

#include <algorithm>
#include <cassert>
#include <cstddef>
#include <cstdint>
#include <limits>
#include <new>
#include <stdexcept>
#include <string>
#include <type_traits>
#include <utility>
#include <vector>

#include "tparity/core/profile.hpp"

namespace tparity {

using Shape = std::vector<int64_t>;

// "[2, 5, 3]"
inline std::string to_string(const Shape& shape) {
  std::string s = "[";
  for (size_t i = 0; i < shape.size(); ++i) {
    if (i) s += ", ";
    s += std::to_string(shape[i]);
  }
  return s + "]";
}

// Thrown at the API boundary when a caller hands in tensors whose shapes or kinds contradict the
// configuration. The message names the tensor, what was expected and what came.
struct ShapeError : std::invalid_argument {
  using std::invalid_argument::invalid_argument;
};

// Product of the extents; 1 for a scalar (empty shape). ShapeError for a negative extent, or when the
// product of the nonzero extents overflows int64 (whatever their order: [2^31, 0, 2^33] too), so that
// no size a stranger's shapes make wraps into a small allocation and a write beyond it.
inline int64_t numel(const Shape& shape) {
  int64_t nonzero = 1;
  bool zero = false;
  for (int64_t d : shape) {
    if (d < 0) throw ShapeError("shape " + to_string(shape) + ": negative size");
    if (d == 0) {
      zero = true;
      continue;
    }
    if (__builtin_mul_overflow(nonzero, d, &nonzero))
      throw ShapeError("shape " + to_string(shape) + ": the product of its sizes overflows int64");
  }
  return zero ? 0 : nonzero;
}

// No tensor of the core holds more elements than this (16 GiB as double): a backstop beneath the
// harness's own limit on what a problem may make (harness/problem.hpp, max_elements).
inline constexpr int64_t kMaxTensorElements = int64_t(1) << 31;

// --- the core's memory ---------------------------------------------------------------------------
// Blocks of kHugeBlock bytes and more are each mapped on their own from a 2 MiB boundary and
// madvise(MADV_HUGEPAGE)d, so that where the kernel's transparent huge pages are "madvise" (as on
// the project's machines) it may back them with 2 MiB pages, not 4 KiB ones: a decode step reads
// 0.7 GB of weights a call, and on 4 KiB pages its four weight rows at a time pay a page walk every
// 4 KiB that they do not hide (docs/performance.md, "Huge pages"). The kernel decides: in "never"
// mode, or for a process that turned THP off, the advice changes nothing. Smaller blocks are plain
// operator new; the core's own scratch buffers (layout.hpp, scratch.hpp) are not tensors.
// (LibTorch 2.1 and later advise theirs likewise under THP_MEM_ALLOC_ENABLE=1, page-aligned.)
// Freed large blocks are kept for the next request of the same length in pages (a forward pass asks
// for the same temporaries every time; a fresh mapping pays its page faults again), at most the
// limit in all, the oldest handed back to the kernel first: set_kept_memory_limit (default 256 MiB;
// 0 keeps none) returns the limit it replaces; release_kept_memory() hands every kept block back.
// Thread-safe, and fork-safe as malloc is (a child may allocate whatever other threads were doing).
inline constexpr size_t kHugeBlock = size_t(2) << 20;
size_t set_kept_memory_limit(size_t bytes) noexcept;
void release_kept_memory() noexcept;
namespace detail {
void* tensor_allocate(size_t bytes);                   // throws std::bad_alloc
void tensor_deallocate(void* p, size_t bytes) noexcept;  // bytes: as allocated
// Set on this thread by Storage::resize_unset alone, for its one resize: TensorAllocator::construct
// then leaves a number it is asked to value-initialise unset.
inline thread_local bool t_leave_unset = false;
// Whether Tensor::unset fills its elements with NaN: in the core library's builds with assertions (the
// sanitizers'), so that an element an op leaves unwritten shows in their tests. Decided where the
// library is built (tensor.cpp), not in each includer, so that every object agrees on it.
bool unset_filled_with_nan() noexcept;
}  // namespace detail

template <class T>
struct TensorAllocator {
  using value_type = T;
  TensorAllocator() = default;
  template <class U>
  TensorAllocator(const TensorAllocator<U>&) noexcept {}
  T* allocate(size_t n) {
    if (n > size_t(-1) / sizeof(T)) throw std::bad_array_new_length();
    return static_cast<T*>(detail::tensor_allocate(n * sizeof(T)));
  }
  void deallocate(T* p, size_t n) noexcept { detail::tensor_deallocate(p, n * sizeof(T)); }
  // An element the vector value-initialises (zero, for a number) as std::allocator's would be; but
  // default-initialised, left as the memory held it, inside Storage::resize_unset alone.
  template <class U>
  void construct(U* p) noexcept(std::is_nothrow_default_constructible_v<U>) {
    if (detail::t_leave_unset)
      ::new (static_cast<void*>(p)) U;
    else
      ::new (static_cast<void*>(p)) U();
  }
  template <class U, class... A>
  void construct(U* p, A&&... a) {
    ::new (static_cast<void*>(p)) U(std::forward<A>(a)...);
  }
  template <class U>
  bool operator==(const TensorAllocator<U>&) const noexcept {
    return true;
  }
  template <class U>
  bool operator!=(const TensorAllocator<U>&) const noexcept {
    return false;
  }
};

// A tensor's elements: a std::vector on the core's allocator. It converts to a plain std::vector<T>
// (a copy), so that code written against the `std::vector<T> data` tensors had before 7dad45a (a
// user's adapter taking `const std::vector<T>&`, `cond ? t.data : std::vector<T>{}`) still builds.
template <class T>
class Storage : public std::vector<T, TensorAllocator<T>> {
  using Base = std::vector<T, TensorAllocator<T>>;

 public:
  using Base::Base;
  Storage() = default;
  // n elements, those past the old size left as the memory held them (Tensor::unset); every other way
  // a std::vector makes elements of none gives zeros, as ever.
  void resize_unset(size_t n) {
    struct Leave {
      Leave() { detail::t_leave_unset = true; }
      ~Leave() { detail::t_leave_unset = false; }
    } leave;
    this->resize(n);
  }
  operator std::vector<T>() const { return std::vector<T>(this->begin(), this->end()); }
};

// The same elements in the same order as a plain std::vector's.
template <class T, class A, class = std::enable_if_t<!std::is_same_v<A, TensorAllocator<T>>>>
bool operator==(const Storage<T>& a, const std::vector<T, A>& b) {
  return a.size() == b.size() && std::equal(a.begin(), a.end(), b.begin());
}
template <class T, class A, class = std::enable_if_t<!std::is_same_v<A, TensorAllocator<T>>>>
bool operator!=(const Storage<T>& a, const std::vector<T, A>& b) {
  return !(a == b);
}

template <class T>
struct Tensor {
  Shape shape;
  Storage<T> data;

  Tensor() = default;
  explicit Tensor(Shape s, T fill = T(0)) : shape(std::move(s)) {
    const int64_t n = checked_numel(shape);
    profile::Scope scope(profile::Op::ZeroFill);
    data.assign(size_t(n), fill);
  }
  // A tensor whose elements are left as the memory held them, for an output that the next op writes
  // whole before anything reads it (a GEMM's C at beta 0, an elementwise op's out): no pass of zeros
  // over it first (the seed block's layer spent 3% of its time filling its output so). The core
  // library's builds with assertions fill it with NaN instead (detail::unset_filled_with_nan).
  static Tensor unset(Shape s) {
    Tensor t;
    const int64_t n = checked_numel(s);
    t.shape = std::move(s);
    if (std::numeric_limits<T>::has_quiet_NaN && detail::unset_filled_with_nan())
      t.data.assign(size_t(n), std::numeric_limits<T>::quiet_NaN());
    else
      t.data.resize_unset(size_t(n));
    return t;
  }
  Tensor(Shape s, Storage<T> d) : shape(std::move(s)), data(std::move(d)) {
    assert(int64_t(data.size()) == tparity::numel(shape));
  }
  // (a copy of d's elements; a template, so that a braced list goes to the one above)
  template <class A, class = std::enable_if_t<!std::is_same_v<A, TensorAllocator<T>>>>
  Tensor(Shape s, const std::vector<T, A>& d) : shape(std::move(s)), data(d.begin(), d.end()) {
    assert(int64_t(data.size()) == tparity::numel(shape));
  }

  bool empty() const { return shape.empty() && data.empty(); }  // "absent", not a scalar
  int64_t numel() const { return int64_t(data.size()); }
  int64_t dim() const { return int64_t(shape.size()); }
  int64_t size(int64_t i) const { return shape[size_t(i < 0 ? i + dim() : i)]; }
  T* ptr() { return data.data(); }
  const T* ptr() const { return data.data(); }

 private:
  static int64_t checked_numel(const Shape& shape) {
    const int64_t n = tparity::numel(shape);
    if (n > kMaxTensorElements)
      throw ShapeError("shape " + to_string(shape) + ": " + std::to_string(n) + " elements, above the " +
                       std::to_string(kMaxTensorElements) + " any one tensor of the core may hold");
    return n;
  }
};

template <class To, class From>
Tensor<To> cast(const Tensor<From>& t) {
  Tensor<To> out;
  out.shape = t.shape;
  out.data.reserve(t.data.size());
  for (const From& x : t.data) out.data.push_back(static_cast<To>(x));
  return out;
}

// An attention mask as torch takes one: absent, boolean (true = masked out) or floating (added to
// the scores). Exactly one of `bools` / `floats` is non-empty when present.
template <class T>
struct Mask {
  Tensor<uint8_t> bools;
  Tensor<T> floats;

  static Mask none() { return {}; }
  static Mask of_bool(Tensor<uint8_t> b) { return Mask{std::move(b), {}}; }
  static Mask of_float(Tensor<T> f) { return Mask{{}, std::move(f)}; }

  bool present() const { return !bools.empty() || !floats.empty(); }
  bool is_bool() const { return !bools.empty(); }
  const Shape& shape() const { return is_bool() ? bools.shape : floats.shape; }
};

template <class To, class From>
Mask<To> cast(const Mask<From>& m) {
  return Mask<To>{m.bools, cast<To>(m.floats)};
}

}  // namespace tparity
