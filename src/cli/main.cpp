// tparity: does a handwritten transformer layer match PyTorch, component by component?
#include <fmt/format.h>
#include <malloc.h>

#include <cerrno>
#include <csignal>
#include <cstdio>
#include <cstring>
#include <exception>
#include <new>

#include "common.hpp"
#include "tparity/core/parallel.hpp"
#include "tparity/eval/foreign.hpp"
#include "tparity/harness/dtensor.hpp"
#include "tparity/torch/reference.hpp"

namespace tparity::cli {
namespace {

// Every verb, in the order --help lists them: the function in src/cli/cmd_<verb>.cpp that adds it
// (cmd_exec.cpp adds exec and judge), declared in common.hpp. A new verb is one entry here; --help
// and the unknown-verb message list what these added, in this order.
using AddVerb = void (*)(CLI::App&, Action&);
constexpr AddVerb kVerbs[] = {register_run,      register_eval,   register_check,     register_gate,
                              register_export,   register_exec,   register_sweep,     register_bench,
                              register_selftest, register_census, register_components, register_model};

// Whether the command line asks for the top-level help: a help flag before any verb (a verb's own
// help, "tparity run --help", does not print the reference's version, so it must not start LibTorch).
bool top_help_asked(int argc, char** argv) {
  for (int i = 1; i < argc; ++i) {
    const std::string a = argv[i];
    if (a.empty() || a[0] != '-') return false;  // a verb: whatever follows is its own
    if (a == "-h" || a == "--help" || a == "--help-all") return true;
  }
  return false;
}

}  // namespace
}  // namespace tparity::cli

int main(int argc, char** argv) {
  using namespace tparity;
  // Keep freed blocks up to 256 MiB in the heap instead of returning them to the kernel: a forward
  // pass allocates the same temporaries every time, and fresh pages cost a page fault each (12% of a
  // BERT-sized layer). LibTorch's CPU allocator is malloc, and so are the hand core's blocks below
  // 2 MiB; its larger tensors are kept by the core itself, likewise (core/tensor.hpp).
  mallopt(M_MMAP_THRESHOLD, 256 << 20);
  mallopt(M_TRIM_THRESHOLD, 512 << 20);
  // SIGCHLD at its default, whatever it came as: left ignored by whoever started tparity (ignored
  // signals stay so across exec), it has the kernel reap tparity's children unseen, and waitpid fails
  // (ECHILD): an exporter's, a program's or the other reference's end would be lost.
  std::signal(SIGCHLD, SIG_DFL);
  // The reference computes on one thread unless a subcommand says otherwise (bench): its float32
  // results, hence the float32 gates' reference figures, depend on how its products split their work.
  set_torch_threads(1);
  CLI::App app{"tparity: reference parity of handwritten transformer layers against PyTorch"};
  // The reference's version in the top-level --help alone: asking it starts LibTorch
  // (src/torch/loader.cpp), which a refusal, a verb's help or a hand-core-only command never does.
  if (cli::top_help_asked(argc, argv)) {
    try {
      app.description(app.get_description() + " (LibTorch " + torch_version() + ")");
    } catch (const std::exception& e) {
      app.description(app.get_description() + " (" + show_text(e.what(), 2000) + ")");
    }
  }
  app.set_version_flag("--version", [] {
    return std::string("tparity ") + TPARITY_VERSION + "; reference: " + reference_info().line() +
           "; hand core threads " + std::to_string(num_threads());
  });
  app.require_subcommand(1);
  app.formatter(std::make_shared<cli::InternalHidden>());  // (before the verbs: they take the app's)
  cli::Action action;
  for (cli::AddVerb add : cli::kVerbs) add(app, action);
  cli::decimal_numbers(app);
  cli::g_argc = argc, cli::g_argv = argv;
  if (argc > 1 && argv[1][0] != '-') {
    const std::string sub = argv[1];
    bool known = false;
    std::string verbs;  // the registered ones, as registered
    for (const CLI::App* s : app.get_subcommands({})) {
      known = known || s->get_name() == sub;
      verbs += (verbs.empty() ? "" : ", ") + s->get_name();
    }
    if (!known) {
      std::fprintf(stderr, "tparity: unknown subcommand \"%s\": expected one of %s (see tparity --help)\n",
                   show_text(sub, 60).c_str(), verbs.c_str());
      return cli::kBadInput;
    }
  }
  // exec's program after "--" is its own: never parsed as options.
  int parsed = argc;
  if (argc > 1 && std::string(argv[1]) == "exec")
    for (int i = 2; i < argc; ++i)
      if (std::string(argv[i]) == "--") {
        cli::g_after_separator.assign(argv + i + 1, argv + argc);
        parsed = i;
        break;
      }
  // Every refusal is one line on standard error, however long or strange what it quotes; so is a
  // failure in parsing's own callbacks (--version's, when the reference does not load).
  auto line = [](const std::string& s) { return show_text(s, 2000); };
  try {
    app.parse(parsed, argv);
    const int rc = action();
    // The report is what the run is for: one that could not be written (a full disk, a closed
    // descriptor) is no run, whatever the verdict.
    const bool flushed = std::fflush(stdout) == 0;
    const int e = errno;
    if (!flushed || std::ferror(stdout)) {
      std::fprintf(stderr, "tparity: could not write the report to standard output%s%s\n", flushed ? "" : ": ",
                   flushed ? " (a write failed)" : std::strerror(e));
      return rc == 0 || rc == 1 ? cli::kBadInput : rc;
    }
    return rc;
  } catch (const CLI::CallForHelp& e) {
    return app.exit(e);
  } catch (const CLI::CallForAllHelp& e) {
    return app.exit(e);
  } catch (const CLI::CallForVersion& e) {
    return app.exit(e);
  } catch (const CLI::ParseError& e) {
    std::fprintf(stderr, "tparity: %s (see tparity --help)\n", line(e.what()).c_str());
    return cli::kBadInput;
  } catch (const InputError& e) {
    std::fprintf(stderr, "tparity: %s\n", line(e.what()).c_str());
    return cli::kBadInput;
  } catch (const Interrupted& e) {
    std::fprintf(stderr,
                 "tparity: stopped by signal %d (%s): the program and what it started were killed, the "
                 "temporary files removed\n",
                 e.signal, strsignal(e.signal));
    return 128 + e.signal;
  } catch (const std::bad_alloc&) {
    std::fprintf(stderr,
                 "tparity: out of memory (a problem too large for this machine: lower --max-elements, "
                 "%lld now, to refuse such problems before they run)\n",
                 static_cast<long long>(max_elements()));
    return cli::kBadInput;
  } catch (const std::exception& e) {
    std::fprintf(stderr, "tparity: error: %s\n", line(e.what()).c_str());
    return cli::kBadInput;
  }
}
