// Runs the handwritten core on a problem, in float32 or float64, and collects its components.
#pragma once

#include <functional>
#include <string>
#include <vector>

#include "tparity/harness/components.hpp"
#include "tparity/harness/problem.hpp"

namespace tparity {

// dtype: Float32 or Float64. Throws InputError (prefixed with `where`) when the problem's tensors
// contradict its config.
// With a teacher, every component the teacher has is replaced by the teacher's value (rounded to
// dtype) as soon as the hand core has computed it: the components then collected are each op's
// local result on the reference's own inputs.
RunResult run_hand(const Problem& p, DType dtype, bool collect_components, const std::string& where,
                   const Components* teacher = nullptr);

// The same without components, for a problem used once (tparity eval): each weight and input is
// released as soon as the core has its own copy, so that a large layer's weights are never held as
// double and as the core's type at once. The problem's tensors are left empty.
RunResult run_hand(Problem&& p, DType dtype, const std::string& where);

// The hand core's checks of the problem's tensors against its config (torch 1.13's own shape and
// mask checks), run before anything else sees the problem: InputError naming the tensor, prefixed
// with `where`. (It runs the core once in float64 and drops the result.)
void check_inputs(const Problem& p, const std::string& where);

// The forward pass with weights and inputs converted once (for the benchmark): each call runs the
// core on the problem, without an observer, and drops the result. Runs it once before returning
// unless run_once is false (to measure the first run's memory).
std::function<void()> prepare_hand(const Problem& p, DType dtype, const std::string& where, bool run_once = true);

// Components of a module in dataflow order (names only): what the comparator lists.
std::vector<std::string> component_names(const Problem& p);

}  // namespace tparity
