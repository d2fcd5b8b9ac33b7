// tparity's library API: check your own implementation of a transformer module against PyTorch
// with the same cases, legs, gates, report and exit code as the built-in hand core.
//
//   #include <tparity/api.hpp>
//
//   tparity::Implementation mine{"my attention", [](const tparity::Problem& p, tparity::DType dtype,
//                                                   const tparity::Components*) {
//     // read p.mha (the config), the weights and inputs by their PyTorch names, compute, return
//     return dtype == tparity::DType::Float32 ? run<float>(p) : run<double>(p);
//   }};
//   auto reports = tparity::check_cases(mine, {"single", "batched", "multihead"});
//   tparity::print_reports(reports);
//   return tparity::exit_code(reports);  // 0 all pass, 1 a case fails
//
// Your callable gets a Problem (module, config, state dict and inputs, by PyTorch's names and
// layouts) and a precision, and returns RunResult::outputs["output"] (and "attn_weights" when the
// module returns them), laid out as the module returns them. If it also fills
// RunResult::components with the names component_names(p) lists, in their canonical layout (see
// README, "Components"), every component is compared; otherwise the outputs are. In the report
// your implementation is the "hand" side of every leg.
#pragma once

#include <cstdio>
#include <string>
#include <vector>

#include "tparity/compare/report.hpp"
#include "tparity/eval/evaluate.hpp"
#include "tparity/fixture/fixture.hpp"
#include "tparity/harness/cases.hpp"
#include "tparity/harness/hand.hpp"

namespace tparity {

// ---- reading a problem ---------------------------------------------------------------------------

// A parameter by its state_dict name, in T. Throws InputError when the problem has none.
template <class T>
Tensor<T> param(const Problem& p, const std::string& name) {
  auto it = p.state_dict.find(name);
  if (it == p.state_dict.end()) throw InputError("problem " + p.name + ": state_dict." + name + ": missing");
  return to_tensor<T>(it->second);
}

// A forward() tensor argument by its Python name, in T; empty when absent.
template <class T>
Tensor<T> input(const Problem& p, const std::string& name) {
  const DTensor* t = p.input(name);
  return t ? to_tensor<T>(*t) : Tensor<T>();
}

// A mask argument (attn_mask, key_padding_mask, ...): bool, float or absent.
template <class T>
Mask<T> mask(const Problem& p, const std::string& name) {
  return to_mask<T>(p.input(name));
}

// ---- returning a result --------------------------------------------------------------------------

// outputs["output"] and, when given, outputs["attn_weights"].
template <class T>
RunResult outputs(const Tensor<T>& output, const Tensor<T>& attn_weights = {}) {
  RunResult r;
  r.outputs["output"] = to_dtensor(output);
  if (!attn_weights.empty()) r.outputs["attn_weights"] = to_dtensor(attn_weights);
  return r;
}

// ---- checking ------------------------------------------------------------------------------------

// The default cases by name (all of them when `names` is empty), each against LibTorch.
std::vector<CaseReport> check_cases(const Implementation& impl, const std::vector<std::string>& names = {},
                                    const GatePolicy& policy = {});

// Fixture files (format v1), each against the outputs PyTorch stored in it (and LibTorch).
std::vector<CaseReport> check_fixtures(const Implementation& impl, const std::vector<std::string>& paths,
                                       const GatePolicy& policy = {});

// 0 when every case passed, 1 otherwise (the CLI's exit codes).
int exit_code(const std::vector<CaseReport>& reports);

// Each report as its summary line and findings (failures, diagnoses), or with `full` as its table of
// every component; then the line "N case(s): ..."; or one JSON document.
void print_reports(const std::vector<CaseReport>& reports, std::FILE* out = stdout, bool json = false,
                   bool full = false);

}  // namespace tparity
