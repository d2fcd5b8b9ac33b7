// tparity: does a handwritten transformer layer match PyTorch, component by component?
#include <fmt/format.h>
#include <malloc.h>

#include <cstdio>
#include <exception>

#include "common.hpp"
#include "tparity/core/parallel.hpp"
#include "tparity/harness/dtensor.hpp"
#include "tparity/torch/reference.hpp"

int main(int argc, char** argv) {
  using namespace tparity;
  // Keep freed blocks up to 256 MiB in the heap instead of returning them to the kernel: a forward
  // pass allocates the same temporaries every time, and fresh pages cost a page fault each (12% of a
  // BERT-sized layer). Both sides benefit alike (LibTorch's CPU allocator is malloc as well).
  mallopt(M_MMAP_THRESHOLD, 256 << 20);
  mallopt(M_TRIM_THRESHOLD, 512 << 20);
  // The reference computes on one thread unless a subcommand says otherwise (bench): its float32
  // results, hence the float32 gates' reference figures, depend on how its products split their work.
  set_torch_threads(1);
  CLI::App app{"tparity: reference parity of handwritten transformer layers against PyTorch (LibTorch " +
               torch_version() + ")"};
  app.set_version_flag("--version", [] {
    return std::string("tparity ") + TPARITY_VERSION + "; reference: " + reference_info().line() +
           "; hand core threads " + std::to_string(num_threads());
  });
  app.require_subcommand(1);
  cli::Action action;
  cli::register_run(app, action);
  cli::register_eval(app, action);
  cli::register_check(app, action);
  cli::register_gate(app, action);
  cli::register_export(app, action);
  cli::register_exec(app, action);
  cli::register_sweep(app, action);
  cli::register_bench(app, action);
  cli::register_selftest(app, action);
  cli::register_census(app, action);
  cli::g_argc = argc, cli::g_argv = argv;
  if (argc > 1 && argv[1][0] != '-') {
    const std::string sub = argv[1];
    bool known = false;
    for (const CLI::App* s : app.get_subcommands({})) known = known || s->get_name() == sub;
    if (!known) {
      std::fprintf(
          stderr,
          "tparity: unknown subcommand \"%s\": expected run, eval, check, gate, sweep, bench, selftest or census (see "
          "tparity --help)\n",
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
