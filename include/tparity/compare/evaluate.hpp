// Runs the legs of a case or a fixture: the hand core and the reference in both precisions, compared
// component by component.
#pragma once

#include <optional>
#include <string>
#include <vector>

#include "tparity/compare/legs.hpp"
#include "tparity/harness/problem.hpp"

namespace tparity {

// hand64, hand32, torch64, torch32 on every component; the reference decomposition must reproduce
// LibTorch's module. `where` names the case for messages. Requires LibTorch.
CaseReport evaluate_problem(const Problem& p, const std::string& description, std::optional<uint64_t> seed,
                            const GatePolicy& policy);

// A fixture against its stored outputs: torch64 and torch32 are what Python PyTorch returned
// ("outputs" in float64, "outputs_float32"); where those lack a precision, LibTorch supplies it.
// With LibTorch, also libtorch64_vs_torch64 (the C++ reference against Python) and a second report,
// "<name>/components", with every component against the LibTorch decomposition.
std::vector<CaseReport> check_fixture(const Problem& p, const std::string& where, const GatePolicy& policy);

}  // namespace tparity
