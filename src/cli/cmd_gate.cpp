// tparity gate: the CI regression gate (default cases and fixtures, against a recorded baseline).
#include "common.hpp"

namespace tparity::cli {

void register_gate(CLI::App& app, Action& action) {
  (void)app;
  (void)action;
}

}  // namespace tparity::cli
