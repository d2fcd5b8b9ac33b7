// The report model rendered two ways: a human table per case, and one JSON document.
#pragma once

#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "tparity/compare/legs.hpp"

namespace tparity {

// Header line, one row per component (legs as columns), notes, findings, verdict (--full).
std::string render_table(const CaseReport& r);

// What a person reads first (the default): summary_line(), then the findings.
std::string render_summary(const CaseReport& r);

// The failure lines, the first divergence, the diagnoses and "not checked: ..." when any.
std::string render_findings(const CaseReport& r);

// {"name", "description", "config", "seed", "pass", "components": [{"name", "shape", "pass", "legs":
//  {leg: {"l2", "rel_l2", "max_abs", "max_abs_index", "role", "bound", "pass", ...}}}], "failures", "notes",
//  "summary": summary_line(), "diagnoses": [{"kind", "component", "leg", "text"}], "not_checked" (when
//  any), "reference": {...}, "stored_reference": a fixture's producer or null}
nlohmann::json to_json(const CaseReport& r);

// {"reference": {...} (which PyTorch judged, as the first case names it), "cases": [...]}
nlohmann::json to_json(const std::vector<CaseReport>& rs);

// A case's failures as its "failures" field holds them: their lines, ["case C: component X: ...", ...].
nlohmann::json to_json(const std::vector<Failure>& failures);

// {"torch", "source", "blas", "kernel", "capability", "threads", "pinned", "warning", "line"}
nlohmann::json to_json(const ReferenceInfo& ref);

std::string role_name(LegRole r);

}  // namespace tparity
