#include "tparity/harness/components.hpp"

namespace tparity {

const Tensor<double>* find(const Components& c, const std::string& name) {
  for (const Component& x : c)
    if (x.name == name) return &x.value;
  return nullptr;
}

}  // namespace tparity
