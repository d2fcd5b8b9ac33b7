// tparity: does a handwritten transformer layer match PyTorch, component by component?
#include <fmt/format.h>

#include <cstdio>
#include <exception>

#include "common.hpp"
#include "tparity/harness/dtensor.hpp"
#include "tparity/torch/reference.hpp"

int main(int argc, char** argv) {
  using namespace tparity;
  CLI::App app{"tparity: reference parity of handwritten transformer layers against PyTorch (LibTorch " +
               torch_version() + ")"};
  app.set_version_flag("--version", std::string("tparity ") + TPARITY_VERSION + ", LibTorch " + torch_version());
  app.require_subcommand(1);
  cli::Action action;
  cli::register_run(app, action);
  cli::register_eval(app, action);
  cli::register_check(app, action);
  cli::register_gate(app, action);
  cli::register_sweep(app, action);
  if (argc > 1 && argv[1][0] != '-') {
    const std::string sub = argv[1];
    bool known = false;
    for (const CLI::App* s : app.get_subcommands({})) known = known || s->get_name() == sub;
    if (!known) {
      std::fprintf(
          stderr, "tparity: unknown subcommand \"%s\": expected run, eval, check, gate or sweep (see tparity --help)\n",
          sub.c_str());
      return cli::kBadInput;
    }
  }
  try {
    app.parse(argc, argv);
  } catch (const CLI::CallForHelp& e) {
    return app.exit(e);
  } catch (const CLI::CallForAllHelp& e) {
    return app.exit(e);
  } catch (const CLI::CallForVersion& e) {
    return app.exit(e);
  } catch (const CLI::ParseError& e) {
    std::fprintf(stderr, "tparity: %s (see tparity --help)\n", e.what());
    return cli::kBadInput;
  }
  try {
    return action();
  } catch (const InputError& e) {
    std::fprintf(stderr, "tparity: %s\n", e.what());
    return cli::kBadInput;
  } catch (const std::exception& e) {
    std::fprintf(stderr, "tparity: error: %s\n", e.what());
    return cli::kBadInput;
  }
}
