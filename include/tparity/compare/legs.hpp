// Legs and gates: which implementation is compared with which, and what bound each comparison must meet.
//
// The float64 legs prove the semantics: hand64 against torch64 must agree to rel_l2 <= 1e-10, far
// below any float32 effect and far above float64 rounding (~1e-16 per op).
// The float32 legs are judged against LibTorch's own float32 error, measured on the same inputs:
//   rel_l2(hand32, torch64) <= factor * rel_l2(torch32, torch64) + floor
// with factor 2 and floor 4u, u = 2^-24 the float32 unit roundoff. The floor exists because
// torch32's error can be (near) zero for a component (exact products of small integers, zeros,
// results that need one rounding), while an equally good float32 implementation that rounds in a
// different order still carries a few roundings per element; rel_l2 of k independent roundings of
// relative size <= u is at most k*u, and 4 covers the reassociations the hand core is allowed
// (the q scale, the bias add, the final division of the softmax, the head average).
//
// Inherited error. hand32's propagated error at a component is its own rounding (the local error,
// measured by teacher forcing) plus the error it inherited from upstream, carried through this op.
// On a tiny or ill-conditioned component (3 elements after a ReLU, say) the inherited part depends
// on the direction of the incoming error, and torch32's may happen to cancel where hand32's does not,
// with both upstream errors equal in size and both ops equally accurate. So where the local leg
// exists, the reference of the Numeric gate is max(torch32's error, inherited x U_torch / U_hand):
// inherited = sqrt(propagated^2 - local^2) is what this op did to hand32's incoming error, and
// U_torch / U_hand (the largest propagated error upstream, torch32's over hand32's) scales it to what
// the same op would do to torch32's. A component whose own rounding is bad still fails: its local
// error is not inherited.
#pragma once

#include <limits>
#include <map>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "tparity/compare/metrics.hpp"
#include "tparity/harness/hand.hpp"
#include "tparity/harness/reference_info.hpp"

namespace tparity {

struct GatePolicy {
  double semantic_rel = 1e-10;
  double numeric_factor = 2.0;
  double numeric_floor = 4.0 * 0x1.0p-24;
};

enum class LegRole {
  Semantic,  // rel_l2 <= policy.semantic_rel
  Numeric,   // rel_l2 <= factor * rel_l2(noise leg) + floor
  Noise,     // the reference's own error: reported, defines Numeric bounds
  Report,    // reported only (the seeds' figure)
};

struct LegSpec {
  std::string name;  // "hand32_vs_torch64"
  std::string a, b;  // implementation keys; b is the reference
  LegRole role;
  std::string noise;        // for Numeric: the name of the Noise leg that sets the bound
  bool diagnostic = false;  // gated, but a breach only names the first divergence, it fails nothing
  std::string local;        // for Numeric: the same implementation's local leg, when there is one
};

// hand64_vs_torch64 (semantic), hand32_vs_torch64 (numeric), torch32_vs_torch64 (noise),
// hand32_vs_torch32 (report).
std::vector<LegSpec> standard_legs();

// The propagated legs above plus the local ones, for runs that also have "local_hand64" and
// "local_hand32": the hand core teacher-forced with torch64's components, so that each component is
// computed from the reference's own inputs. local_hand64_vs_torch64 (semantic) and
// local_hand32_vs_torch64 (numeric, judged by the same torch32 noise) are diagnostic.
std::vector<LegSpec> legs_with_local();

struct Leg {
  std::string name;
  LegRole role;
  Metrics m;
  double bound = 0;  // 0 for Noise/Report legs
  bool pass = true;
  bool diagnostic = false;
  std::string breach;    // why it does not pass
  double inherited = 0;  // Numeric with a local leg: torch32's upstream error carried through this op
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

struct CaseReport {
  std::string name;
  std::string description;
  nlohmann::json config;
  uint64_t seed = 0;
  bool has_seed = false;
  bool pass = true;
  std::vector<ComponentReport> components;
  std::vector<std::string> failures;  // one line each: case, component, leg, figure, bound
  std::vector<std::string> notes;     // what was verified or skipped on the way (reference checks)
  // Which PyTorch judged: LibTorch (cases; a fixture's libtorch legs), and for a fixture also what
  // produced its stored outputs (its "reference" block, e.g. Python torch 2.13.0 or transformers).
  ReferenceInfo reference;
  std::string stored_reference;  // a fixture's producer, one line; empty for cases
  // The first component, in dataflow order, whose local error breaks its gate: where it breaks.
  std::string first_divergence;  // empty when none does
  std::string first_divergence_detail;
  void fail(const std::string& line) {
    pass = false;
    failures.push_back(line);
  }
};

using Implementations = std::map<std::string, const Components*>;

// Compares every named component across the legs and decides pass/fail. Every implementation in
// `required` must have every component (else the case fails); otherwise a leg whose two
// implementations do not both have the component is skipped. A Numeric leg whose noise leg is
// missing fails: there is nothing to judge it by.
void compare_components(CaseReport& report, const std::vector<std::string>& names, const Implementations& impls,
                        const std::vector<LegSpec>& legs, const GatePolicy& policy,
                        const std::vector<std::string>& required);

// Fills each component's growth and the case's first divergence from the legs compare_components
// measured (it calls this itself).
void diagnose(CaseReport& report);

}  // namespace tparity
