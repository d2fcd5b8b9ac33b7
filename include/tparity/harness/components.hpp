// What an implementation produces for a problem: its components, by the canonical names and layouts
// (README, "Components"), and its outputs as the module returns them. The data the comparator
// judges, whoever produced it (the hand core, LibTorch, a user's callable, a foreign program).
#pragma once

#include <string>
#include <vector>

#include "tparity/harness/dtensor.hpp"

namespace tparity {

struct Component {
  std::string name;
  Tensor<double> value;  // canonical layout (see the op's contract), widened to double
};
using Components = std::vector<Component>;  // in dataflow order

const Tensor<double>* find(const Components& c, const std::string& name);

// What one implementation produced for a problem.
struct RunResult {
  Components components;  // empty when not collected
  TensorMap outputs;      // "output" and, when the call returns them, "attn_weights", as the module
                          // lays them out, in the run's dtype
};

}  // namespace tparity
