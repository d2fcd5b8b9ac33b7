// Evaluation: runs the implementations of a case or a fixture (the hand core or a user's, and the
// LibTorch reference, in both precisions and on the noise model's jittered copies) and hands their
// components to the comparator (compare/legs.hpp), which judges without running anything.
#pragma once

#include <functional>
#include <map>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "tparity/compare/legs.hpp"
#include "tparity/harness/problem.hpp"
#include "tparity/torch/reference.hpp"

namespace tparity {

// The implementation under test: the built-in hand core, or a user's (see include/tparity/api.hpp).
// The legs call it "hand" whichever it is.
struct Implementation {
  std::string name = "hand core";
  // Outputs ("output", and "attn_weights" when the module returns them, laid out as the module
  // returns them) and, where it has them, components under component_names(p) in their canonical
  // layout. With a teacher (only asked for when teacher_forcing is true), each component is
  // replaced by the teacher's value as soon as computed.
  std::function<RunResult(const Problem& p, DType dtype, const Components* teacher)> run;
  bool teacher_forcing = false;
  // The precisions it computes in (a foreign program may give one alone): the legs of the other are
  // left out, and the report says so.
  bool float64 = true, float32 = true;
  // Whether its teacher-forced runs give every component (the hand core's do). A foreign program's
  // local components are its own choice: the local legs of those it gives are judged, and a missing
  // one is no failure.
  bool local_complete = true;
  // Whether its runs give every component (the hand core's do). A foreign program's components are
  // its own choice: those it gives are judged, the rest named in a note, and its outputs always.
  bool components_complete = true;
};

namespace detail {
struct MemoState;  // evaluate.cpp
}

// While one lives (one at a time), evaluate_problem keeps LibTorch's runs (the plain ones and the noise
// model's jittered samples) and reuses them for a problem identical to one it ran: the same name,
// config, semantics, state_dict and inputs bit for bit, and precision; with them, what the comparator
// measured of LibTorch against itself (the noise legs), which depends on those runs alone. The
// selftest evaluates every case once clean and once per planted defect, and a defect planted in the
// hand core does not change what LibTorch computes. It keeps every run whole until it goes (for the
// selftest's long_keys case, 2 + 2 x noise samples runs of about 1 M doubles per component): one
// case's lifetime, not a run's.
class ReferenceMemo {
 public:
  ReferenceMemo();
  ~ReferenceMemo();
  ReferenceMemo(const ReferenceMemo&) = delete;
  ReferenceMemo& operator=(const ReferenceMemo&) = delete;
  size_t hits() const;  // runs served from the memo
  size_t runs() const;  // runs LibTorch made (and the memo keeps)

 private:
  std::unique_ptr<detail::MemoState> state_;
};

// The handwritten core of this project, with components and teacher forcing.
Implementation hand_core();

// hand64, hand32, torch64, torch32 on every component (on the outputs alone when the
// implementation returns no components); the reference decomposition must reproduce LibTorch's
// module; with teacher forcing, the local legs too. Requires LibTorch.
CaseReport evaluate_problem(const Problem& p, const std::string& description, std::optional<uint64_t> seed,
                            const GatePolicy& policy, const Implementation& impl = hand_core());

// A fixture against its stored outputs: torch64 and torch32 are what Python PyTorch returned
// ("outputs" in float64, "outputs_float32"); where those lack a precision, LibTorch supplies it.
// With LibTorch, also libtorch64_vs_torch64 (the C++ reference against Python) and a second report,
// "<name>/components", with every component against the LibTorch decomposition.
std::vector<CaseReport> check_fixture(const Problem& p, const std::string& where, const GatePolicy& policy,
                                      const Implementation& impl = hand_core());

// A problem's stored results (outputs, components, in both precisions) checked against the shapes
// LibTorch gives for its inputs (the hand core's without LibTorch): InputError naming the file and
// the field otherwise, so that a wrong shape in the problem is the file's error, not a candidate's.
void check_stored_results(const Problem& p, const std::string& where);

// A candidate's run in a low precision (DType::BFloat16 or Float16: a foreign program's, tparity exec
// --dtype) judged against LibTorch's own error in that precision: LibTorch runs the problem in it
// (every weight and input rounded to it, each op's result too) and in float64; the report
// "<case>/<dtype>" has, on the outputs and on every component the candidate gives, the legs
// low_precision_legs (compare/legs.hpp). Its noise is the plain run's alone (jittering moves float32
// roundings, which rounding to 8 or 11 bits erases). InputError when LibTorch cannot compute the
// problem in that precision on the CPU (1.13 has no float16 matmul there), naming the option.
CaseReport evaluate_low_precision(const Problem& p, const std::string& where, DType dtype, const RunResult& candidate,
                                  const std::string& name, const GatePolicy& policy);

}  // namespace tparity
