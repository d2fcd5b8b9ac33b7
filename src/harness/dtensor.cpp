#include "tparity/harness/dtensor.hpp"

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <limits>

namespace tparity {

std::string dtype_name(DType d) {
  switch (d) {
    case DType::Float32:
      return "float32";
    case DType::Float64:
      return "float64";
    case DType::Bool:
      return "bool";
    case DType::Int64:
      return "int64";
    case DType::BFloat16:
      return "bfloat16";
    case DType::Float16:
      return "float16";
  }
  return "?";
}

DType dtype_from_name(const std::string& name) {
  if (name == "float32") return DType::Float32;
  if (name == "float64") return DType::Float64;
  if (name == "bool") return DType::Bool;
  if (name == "int64") return DType::Int64;
  if (name == "bfloat16") return DType::BFloat16;
  if (name == "float16") return DType::Float16;
  throw std::invalid_argument(
      "expected \"float32\", \"float64\", \"bool\", \"int64\", \"bfloat16\" or \"float16\", got \"" + name + "\"");
}

bool is_low_precision(DType d) { return d == DType::BFloat16 || d == DType::Float16; }

double unit_roundoff(DType d) {
  switch (d) {
    case DType::BFloat16:
      return 0x1p-8;
    case DType::Float16:
      return 0x1p-11;
    case DType::Float32:
      return 0x1p-24;
    case DType::Float64:
      return 0x1p-53;
    default:
      return 0;
  }
}

double round_to_float(double x) { return double(float(x)); }

double round_to_bfloat16(double x) {
  if (std::fabs(x) > double(std::numeric_limits<float>::max())) return std::copysign(INFINITY, x);
  const float f = float(x);
  if (std::isnan(f)) return x;
  uint32_t bits;
  std::memcpy(&bits, &f, sizeof bits);
  bits += 0x7fffu + ((bits >> 16) & 1u);  // to nearest, ties to even; a carry into the exponent is right
  bits &= 0xffff0000u;
  float r;
  std::memcpy(&r, &bits, sizeof r);
  return r;
}

double round_to_half(double x) {
  if (std::fabs(x) > double(std::numeric_limits<float>::max())) return std::copysign(INFINITY, x);
  const float f = float(x);
  if (!std::isfinite(f)) return f;
  const float a = std::fabs(f);
  if (a >= 65520.0f) return std::copysign(INFINITY, f);  // beyond the largest half (65504) by half an ulp
  // Half's spacing near a: 2^(e - 10) for a normal a in [2^e, 2^(e+1)), 2^-24 below 2^-14. Adding and
  // subtracting a power of two that puts that spacing at float's last place rounds to it (to nearest,
  // ties to even), exactly.
  int e;
  std::frexp(a, &e);  // a in [2^(e-1), 2^e)
  const int spacing = std::max(e - 1 - 10, -24);
  const float big = std::ldexp(1.0f, spacing + 23);
  const volatile float t = a + big;
  return std::copysign(double(t - big), f);
}

}  // namespace tparity
