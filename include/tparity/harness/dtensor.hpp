// A dtype-tagged tensor for data that crosses a boundary (fixtures, cases, the torch runner):
// values are held as double, which represents every float32, bool, and int64 below 2^53 exactly
// (int64 tensors are token ids, far below that).
#pragma once

#include <map>
#include <stdexcept>
#include <string>
#include <vector>

#include "tparity/core/tensor.hpp"

namespace tparity {

// BFloat16 and Float16 are the low precisions a foreign implementation may compute in (tparity exec
// --dtype): their values, held as double, are bfloat16's or binary16's. Fixtures and the hand core
// never carry them.
enum class DType { Float32, Float64, Bool, Int64, BFloat16, Float16 };

std::string dtype_name(DType d);                 // "float32" | "float64" | "bool" | "int64" | "bfloat16" | "float16"
DType dtype_from_name(const std::string& name);  // throws std::invalid_argument
bool is_low_precision(DType d);                  // BFloat16 or Float16
// Its unit roundoff: 2^-8 (bfloat16), 2^-11 (float16), 2^-24 (float32), 2^-53 (float64); 0 otherwise.
double unit_roundoff(DType d);

struct DTensor {
  DType dtype = DType::Float64;
  Shape shape;
  Storage<double> data;  // (tensor.hpp: large blocks on huge pages)

  int64_t numel() const { return int64_t(data.size()); }
};

using TensorMap = std::map<std::string, DTensor>;

// Bad input at the file, field or option boundary. The message names the thing, what was expected
// and what came; the CLI prints it as one line and exits with code 2.
struct InputError : std::runtime_error {
  using std::runtime_error::runtime_error;
};

template <class T>
Tensor<T> to_tensor(const DTensor& t) {
  Tensor<T> out;
  out.shape = t.shape;
  out.data.reserve(t.data.size());
  for (double x : t.data) out.data.push_back(static_cast<T>(x));
  return out;
}

template <class T>
DTensor to_dtensor(const Tensor<T>& t) {
  DTensor out;
  out.dtype = sizeof(T) == sizeof(float) ? DType::Float32 : DType::Float64;
  out.shape = t.shape;
  out.data.assign(t.data.begin(), t.data.end());
  return out;
}

// A mask input: bool dtype -> boolean mask, float dtype -> additive mask, null -> absent.
template <class T>
Mask<T> to_mask(const DTensor* t) {
  if (!t) return Mask<T>::none();
  if (t->dtype == DType::Bool) return Mask<T>::of_bool(to_tensor<uint8_t>(*t));
  return Mask<T>::of_float(to_tensor<T>(*t));
}

// Round every value to float32 (for weights and inputs that both precisions must share).
double round_to_float(double x);
// Round to the nearest bfloat16 or binary16 (ties to even; overflow to infinity), through float32.
double round_to_bfloat16(double x);
double round_to_half(double x);

}  // namespace tparity
