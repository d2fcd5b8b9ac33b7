// Legs and gates: which implementation is compared with which, and what bound each comparison must meet.
//
// The float64 legs prove the semantics: hand64 against torch64 must agree to rel_l2 <= 1e-10, far
// below any float32 effect and far above float64 rounding (~1e-16 per op).
// The float32 legs are judged against LibTorch's own float32 error on the same component, measured
// from several samples (noise.hpp: the plain reference and runs on jittered copies of the problem):
//   rel_l2(hand32, torch64) <= factor * quantile(n_eff, S) * rms + floor
// rms is LibTorch's noise scale over the S samples; quantile, sqrt(F_{1-alpha}(n_eff, S n_eff)) with
// alpha = 1e-6, widens the bound on components whose error has few independent elements (n_eff), where
// one implementation's rel_l2 is a noisy statistic: an implementation whose float32 error is `factor`
// (2) times LibTorch's fails with probability alpha, one as accurate as LibTorch far less often. The
// floor, 4u with u = 2^-24, covers components where LibTorch's float32 result is exact (products of
// small integers, zeros, one rounding) while an equally good implementation that rounds in another
// order still carries a few roundings per element: rel_l2 of k roundings of relative size <= u is at
// most k u, and 4 covers the reassociations the hand core makes (the q scale, the bias add, the
// softmax's division, the head average).
#pragma once

#include <limits>
#include <map>
#include <nlohmann/json.hpp>
#include <string>
#include <utility>
#include <vector>

#include "tparity/compare/metrics.hpp"
#include "tparity/compare/noise.hpp"
#include "tparity/harness/components.hpp"
#include "tparity/harness/reference_info.hpp"

namespace tparity {

struct GatePolicy {
  double semantic_rel = 1e-10;
  double numeric_factor = 2.0;
  double numeric_floor = 4.0 * 0x1.0p-24;
  // The noise model's extra samples of LibTorch's float32 error (jittered runs), taken when some
  // component's error has fewer than noise_neff_threshold effective elements in the plain sample
  // (large components are measured well enough by one).
  int noise_samples = 8;
  double noise_neff_threshold = 512;
};

enum class LegRole {
  Semantic,  // rel_l2 <= policy.semantic_rel
  Numeric,   // rel_l2 <= factor * quantile * noise rms + floor
  Noise,     // the reference's own error, sampled: reported, defines Numeric bounds
  Report,    // reported only (the seeds' figure)
};

struct LegSpec {
  std::string name;  // "hand32_vs_torch64"
  std::string a, b;  // implementation keys; b is the reference
  LegRole role;
  std::string noise;        // for Numeric: the name of the Noise leg that sets the bound
  bool diagnostic = false;  // gated, but a breach only names the first divergence, it fails nothing
  // For Noise: more samples of the same error, (float32 result, float64 reference) implementation
  // keys; those missing are skipped.
  std::vector<std::pair<std::string, std::string>> samples;
  // For Numeric: the floor in place of policy.numeric_floor (a low precision's u), when >= 0.
  double floor = -1;
};

// hand64_vs_torch64 (semantic), hand32_vs_torch64 (numeric), torch32_vs_torch64 (noise),
// hand32_vs_torch32 (report).
std::vector<LegSpec> standard_legs();

// The local legs, for runs that also have "local_hand64" and "local_hand32": the hand core
// teacher-forced with torch64's components, so that each component is computed from the reference's
// own inputs. local_hand64_vs_torch64 (semantic) and local_hand32_vs_torch64 (numeric, judged by the
// same torch32 noise) are diagnostic, and are the only diagnostic legs of a case.
std::vector<LegSpec> local_legs();

// standard_legs() then local_legs(): every leg of a case, in the order the report shows them (one
// table in legs.cpp; the sweep's CSV columns follow it too).
std::vector<LegSpec> legs_with_local();

// A low precision's legs, `tag` "bf16" or "f16" for a foreign implementation's bfloat16 or float16
// run: hand<tag>_vs_torch64 (numeric), judged by torch<tag>_vs_torch64 (noise: LibTorch's own error in
// that precision), and hand<tag>_vs_torch<tag> (report). The numeric floor is u of that precision, not
// 4u: float32's floor is for components LibTorch computes exactly, but in a low precision every result
// is stored rounded, so LibTorch's own error is rarely below u / 2 and already carries the roundings
// another order would make; a larger floor would let through what the gate is for (a float16
// accumulator's error, growing with the reduction, is a few times LibTorch's at K = 64).
std::vector<LegSpec> low_precision_legs(const std::string& tag, double unit_roundoff);

// The keys of the k-th jittered sample of the reference (k from 1): "torch32~k", "torch64~k".
std::string noise_sample_key(const std::string& impl, int k);

struct Leg {
  std::string name;
  LegRole role;
  Metrics m;
  double bound = 0;  // 0 for Noise/Report legs
  bool pass = true;
  bool diagnostic = false;
  std::string breach;  // why it does not pass
  // When non-finite values differ: their pattern (nonfinite_pattern in metrics.hpp), else empty.
  NonfinitePattern nonfinite;
  NoiseEstimate noise;  // Noise: the samples' statistics; Numeric: those its bound was built from
};

struct ComponentReport {
  std::string name;
  Shape shape;
  std::vector<Leg> legs;  // in the order of the LegSpecs, absent ones skipped
  bool pass = true;
  // hand32's propagated rel_l2 over that of the previous component in dataflow order: how much the
  // error grows at this step (NaN for the first component or a zero predecessor).
  double growth = std::numeric_limits<double>::quiet_NaN();
  const Leg* leg(const std::string& n) const;
};

// One reason a case fails: the line the reports print, and what it is about, set where the failure is
// found, so that a reader that groups failures (the gate's JUnit testcase per component) need not
// parse the line.
struct Failure {
  std::string component;  // "" for the case as a whole (a reference that did not run, a refused program)
  std::string leg;        // "" when no one leg fails (a component missing from an implementation)
  std::string text;       // "case C: component X: leg L: rel_l2 ... > bound ...", as printed
  // The line alone, for readers that want only it (a bench's parity column, a sweep's list).
  operator const std::string&() const { return text; }
};

// A likely cause of a failure, named from its pattern: the reports print its text under the case.
struct Diagnosis {
  std::string kind;       // "precision-slip", "nonfinite-rows", "nonfinite"
  std::string component;  // where it first appears, in dataflow order
  std::string leg;
  std::string text;  // "precision slip: float64 differs at 9.1e-09, the size of ..."
};

struct CaseReport {
  std::string name;
  std::string description;
  nlohmann::json config;
  uint64_t seed = 0;
  bool has_seed = false;
  bool pass = true;
  std::vector<ComponentReport> components;
  std::vector<Failure> failures;   // in the order found
  std::vector<std::string> notes;  // what was verified or skipped on the way (reference checks)
  std::vector<std::string>
      not_checked;  // features the case ran without, or that the program's outputs leave unchecked (decode)
  // Which PyTorch judged: LibTorch (cases; a fixture's libtorch legs), and for a fixture also what
  // produced its stored outputs (its "reference" block, e.g. Python torch 2.13.0 or transformers).
  ReferenceInfo reference;
  std::string stored_reference;  // a fixture's producer, one line; empty for cases
  // The first component, in dataflow order, whose local error breaks its gate: where it breaks.
  std::string first_divergence;  // empty when none does
  std::string first_divergence_detail;
  // What the failures (or a pass's notes) point to, named at the first component where each appears
  // (diagnose()): a precision slip, NaN rows where the reference is finite, ...
  std::vector<Diagnosis> diagnoses;
  void fail(Failure f) {
    pass = false;
    failures.push_back(std::move(f));
  }
};

using Implementations = std::map<std::string, const Components*>;

// The Noise legs measured, by component and leg ("name\nleg"): what the reference's float32 runs
// are against its float64 one, before any judging. A caller that compares implementations against the
// same reference runs again (the selftest: one planted defect after another) keeps them here and
// measures them once; the runs the keys point at must be the same ones each time.
using NoiseLegMemo = std::map<std::string, Leg>;

// Compares every named component across the legs and decides pass/fail. Every implementation in
// `required` must have every component (else the case fails); otherwise a leg whose two
// implementations do not both have the component is skipped. A Numeric leg whose noise leg is
// missing fails: there is nothing to judge it by. `noise_memo`: the Noise legs taken from it when
// there, measured and kept in it when not.
void compare_components(CaseReport& report, const std::vector<std::string>& names, const Implementations& impls,
                        const std::vector<LegSpec>& legs, const GatePolicy& policy,
                        const std::vector<std::string>& required, NoiseLegMemo* noise_memo = nullptr);

// Fills each component's growth, the case's first divergence and its diagnoses from the legs
// compare_components measured (it calls this itself).
void diagnose(CaseReport& report);

// Float32's rounding level on a component, the range a float64 leg's rel_l2 falls in when a float32
// value (a constant, a table, a cast) sits inside float64 code: from kSlipLow (1e-9, below which one
// float32 rounding in a float64 computation hardly ever lands) to the larger of 4u (u = 2^-24) and 4x
// LibTorch's own float32 error on the component (`noise32`, 0 when unknown). docs/noise-model.md,
// "Precision slips", has the measurements.
constexpr double kSlipLow = 1e-9;
double slip_high(double noise32);

// --accept precision-slip: when the case's failures are all float64 legs at float32's rounding level
// (a precision-slip diagnosis) and every float32 leg of the case ran and passed, those failures become
// notes and the case passes. Returns whether it accepted anything.
bool accept_precision_slip(CaseReport& report);

// The one line a person reads first: "PASS  gpt2  worst: mlp.fc 1.3x LibTorch's own float32 error",
// "FAIL  gpt2  first divergence mlp.act (hand64: 2.0e-04 > 1e-10); worst: mlp.act 790x LibTorch's own
// float32 error".
std::string summary_line(const CaseReport& report);

}  // namespace tparity
