#include "tparity/harness/dtensor.hpp"

namespace tparity {

std::string dtype_name(DType d) {
  switch (d) {
    case DType::Float32:
      return "float32";
    case DType::Float64:
      return "float64";
    case DType::Bool:
      return "bool";
  }
  return "?";
}

DType dtype_from_name(const std::string& name) {
  if (name == "float32") return DType::Float32;
  if (name == "float64") return DType::Float64;
  if (name == "bool") return DType::Bool;
  throw std::invalid_argument("expected \"float32\", \"float64\" or \"bool\", got \"" + name + "\"");
}

double round_to_float(double x) { return double(float(x)); }

}  // namespace tparity
