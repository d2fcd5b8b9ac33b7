// The report model rendered two ways: a human table per case, and one JSON document.
#pragma once

#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "tparity/compare/legs.hpp"

namespace tparity {

// Header line, one row per component (legs as columns), failures, notes, verdict.
std::string render_table(const CaseReport& r);

// {"name", "description", "config", "seed", "pass", "components": [{"name", "shape", "pass", "legs":
//  {leg: {"l2", "rel_l2", "max_abs", "max_abs_index", "role", "bound", "pass", ...}}}], "failures", "notes"}
nlohmann::json to_json(const CaseReport& r);

// {"cases": [...]}
nlohmann::json to_json(const std::vector<CaseReport>& rs);

std::string role_name(LegRole r);

}  // namespace tparity
