// The regression baseline: the hand core's recorded error per case, component and leg, and the
// ratchet that fails a run whose error has grown beyond a factor of it, even while under tolerance.
// For a float32 leg the factor is widened by sqrt(F_{1-1e-6}(n_eff, n_eff)) (noise.hpp), the scatter
// of two single samples of an error with n_eff effective elements, so that a baseline recorded on
// one CPU, reference or instruction set holds on another.
//
// File (fixtures/baseline.json), written deterministically so that a change reads as a diff:
//   {"format": "tparity.baseline", "version": 1,
//    "environment": {"torch": "1.13.1", "blas": "...", "threads": 1},
//    "entries": {"<case>/<component>/<leg>": rel_l2, ...}}     keys sorted, values to 3 digits
#pragma once

#include <map>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "tparity/compare/legs.hpp"

namespace tparity {

inline constexpr const char* kBaselineFormat = "tparity.baseline";

struct Baseline {
  std::map<std::string, std::string> environment;
  std::map<std::string, double> entries;
};

// The legs a baseline records: the hand core's gated, non-diagnostic legs against the float64
// reference (hand64_vs_torch64, hand32_vs_torch64).
bool recorded_leg(const Leg& leg);
std::string entry_key(const std::string& case_name, const std::string& component, const std::string& leg);

// Reads and validates; InputError naming the file and field.
Baseline read_baseline(const std::string& path);
Baseline parse_baseline(const std::string& text, const std::string& where);
nlohmann::json baseline_to_json(const Baseline& b);
// The entries of these reports, each rounded to 3 significant digits.
Baseline make_baseline(const std::vector<CaseReport>& reports, std::map<std::string, std::string> environment);

// Below this a change is rounding noise, not drift: the ratchet compares against
// max(baseline, floor). float64 legs: 2^-50 (8.9e-16, a few float64 roundings: a reordered sum
// moves a 2e-16 error to 5e-16 without meaning anything); float32 legs: 2^-26 (1.5e-8, a quarter of
// one float32 rounding, well below the hand core's 5e-8..2e-7).
double drift_floor(const std::string& leg);

struct Drift {
  std::string key, case_name, component, leg;
  double value = 0, baseline = 0, bound = 0;
  bool missing = false;  // no baseline entry
};

// Every recorded leg whose rel_l2 exceeds factor x max(baseline, floor), or has no baseline entry.
std::vector<Drift> find_drift(const std::vector<CaseReport>& reports, const Baseline& b, double factor);

}  // namespace tparity
