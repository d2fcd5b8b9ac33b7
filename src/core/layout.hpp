// Layout moves shared by the core's ops (internal to src/core).
#pragma once

#include <memory>

#include "tparity/core/tensor.hpp"

namespace tparity::detail {

// An intermediate no caller sees, uninitialised: a Tensor's std::vector zero-fills every element,
// about 8% of a small encoder layer's time, for values about to be overwritten.
template <class T>
class Buffer {
 public:
  explicit Buffer(int64_t n) : p_(new T[size_t(n)]) {}
  T* ptr() { return p_.get(); }
  const T* ptr() const { return p_.get(); }
  void release() { p_.reset(); }

 private:
  std::unique_ptr<T[]> p_;
};

// (A, B, E) -> (B, A, E): sequence-first <-> batch-first.
template <class T>
Tensor<T> swap01(const Tensor<T>& x) {
  const int64_t A = x.size(0), B = x.size(1), E = x.size(2);
  Tensor<T> y({B, A, E});
  for (int64_t a = 0; a < A; ++a)
    for (int64_t b = 0; b < B; ++b)
      for (int64_t e = 0; e < E; ++e) y.data[size_t((b * A + a) * E + e)] = x.data[size_t((a * B + b) * E + e)];
  return y;
}

// Batched, batch-first view of a module input: (L, E) -> (1, L, E); (L, B, E) -> (B, L, E) unless
// batch_first already.
template <class T>
Tensor<T> to_batch_first(const Tensor<T>& x, bool batched, bool batch_first) {
  if (!batched) return Tensor<T>({1, x.size(0), x.size(1)}, x.data);
  return batch_first ? x : swap01(x);
}

// The same view without a copy where the layout allows: unbatched, batch_first, or sequence-first
// with one batch element, (L, 1, E), whose memory is (1, L, E)'s. The input must outlive the view.
template <class T>
class BatchFirstView {
 public:
  BatchFirstView(const Tensor<T>& x, bool batched, bool batch_first) {
    if (!batched)
      shape_ = {1, x.size(0), x.size(1)}, ptr_ = x.ptr();
    else if (batch_first)
      shape_ = x.shape, ptr_ = x.ptr();
    else if (x.size(1) == 1)
      shape_ = {1, x.size(0), x.size(2)}, ptr_ = x.ptr();
    else
      copy_ = swap01(x), shape_ = copy_.shape, ptr_ = copy_.ptr();
  }
  const T* ptr() const { return ptr_; }
  int64_t size(int64_t d) const { return shape_[size_t(d)]; }
  void release() { copy_ = Tensor<T>(), ptr_ = nullptr; }  // frees a copy once it is no longer read

 private:
  Tensor<T> copy_;
  Shape shape_;
  const T* ptr_ = nullptr;
};

// The inverse of to_batch_first for an output (B, L, E).
template <class T>
Tensor<T> from_batch_first(Tensor<T> x, bool batched, bool batch_first) {
  if (!batched) return Tensor<T>({x.size(1), x.size(2)}, std::move(x.data));
  if (batch_first) return x;  // moved (a conditional expression would copy it)
  return swap01(x);
}

}  // namespace tparity::detail
