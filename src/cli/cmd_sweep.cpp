// tparity sweep: a grid of sizes, every component's error, CSV and JSON.
#include "common.hpp"

namespace tparity::cli {

void register_sweep(CLI::App& app, Action& action) {
  (void)app;
  (void)action;
}

}  // namespace tparity::cli
