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
    case DType::Int64:
      return "int64";
  }
  return "?";
}

DType dtype_from_name(const std::string& name) {
  if (name == "float32") return DType::Float32;
  if (name == "float64") return DType::Float64;
  if (name == "bool") return DType::Bool;
  if (name == "int64") return DType::Int64;
  throw std::invalid_argument("expected \"float32\", \"float64\", \"bool\" or \"int64\", got \"" + name + "\"");
}

double round_to_float(double x) { return double(float(x)); }

}  // namespace tparity
