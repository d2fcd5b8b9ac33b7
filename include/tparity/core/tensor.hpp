// A minimal owning tensor: a shape and a contiguous row-major buffer. No views, no strides, no
// broadcasting: each op documents the shapes it takes and walks the buffer itself.
#pragma once

#include <cassert>
#include <cstdint>
#include <stdexcept>
#include <string>
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

template <class T>
struct Tensor {
  Shape shape;
  std::vector<T> data;

  Tensor() = default;
  explicit Tensor(Shape s, T fill = T(0)) : shape(std::move(s)) {
    const int64_t n = tparity::numel(shape);
    if (n > kMaxTensorElements)
      throw ShapeError("shape " + to_string(shape) + ": " + std::to_string(n) + " elements, above the " +
                       std::to_string(kMaxTensorElements) + " any one tensor of the core may hold");
    profile::Scope scope(profile::Op::ZeroFill);
    data.assign(size_t(n), fill);
  }
  Tensor(Shape s, std::vector<T> d) : shape(std::move(s)), data(std::move(d)) {
    assert(int64_t(data.size()) == tparity::numel(shape));
  }

  bool empty() const { return shape.empty() && data.empty(); }  // "absent", not a scalar
  int64_t numel() const { return int64_t(data.size()); }
  int64_t dim() const { return int64_t(shape.size()); }
  int64_t size(int64_t i) const { return shape[size_t(i < 0 ? i + dim() : i)]; }
  T* ptr() { return data.data(); }
  const T* ptr() const { return data.data(); }
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
