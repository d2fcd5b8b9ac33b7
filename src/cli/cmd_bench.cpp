// tparity bench: the hand core against LibTorch, timed in one process with the two sides interleaved,
// peak memory measured in separate child processes, the machine's FMA peak measured too. A
// benchmark, not a test: it asserts nothing about time (exit 0 unless the input is bad or a parity
// check of the fast path fails). This file registers the verb and runs the parts in order; the
// parts, one concern a file, are in src/cli/bench/ (bench.hpp names them).
#include <fmt/format.h>
#include <unistd.h>

#include <algorithm>
#include <cstdio>
#include <cstdlib>

#include "bench/bench.hpp"
#include "common.hpp"
#include "tparity/core/parallel.hpp"
#include "tparity/torch/reference.hpp"

namespace tparity::cli {

namespace {

int run_bench(const bench::Options& o) {
  if (o.huge_pages) bench::reexec_with_huge_pages();  // (every mode: --model's and --gemm's too)
  bench::huge_pages_for_libtorch();
  if (!o.model.empty()) {
    if (!o.cases.empty() || !o.other.empty() || o.profile || o.threads || o.gemm || o.quick || !o.check)
      throw InputError("option --model: times a whole model's export alone, each layer checked against "
                       "transformers' own; --case, --threads, --profile, --gemm, --quick, --no-check and "
                       "--other-reference do not apply");
    return bench::bench_model(o, o.model);
  }
  std::vector<bench::BenchCase> all = bench::bench_cases(o.quick), chosen;
  for (const std::string& n : o.cases) {
    bool found = false;
    for (const bench::BenchCase& c : all) found = found || c.name == n;
    if (!found) {
      std::string names;
      for (const bench::BenchCase& c : all) names += (names.empty() ? "" : ", ") + c.name;
      throw InputError(fmt::format("option --case: expected one of {}, got \"{}\"", names, n));
    }
  }
  for (const bench::BenchCase& c : all)
    if (o.cases.empty() || std::find(o.cases.begin(), o.cases.end(), c.name) != o.cases.end()) chosen.push_back(c);
  if (o.threads)
    for (bench::BenchCase& c : chosen) c.threads = o.threads;
  if (!o.child_side.empty()) return bench::child(o.child_side, chosen.at(0));
  if (o.gemm) {
    if (!o.other.empty() || o.profile || !o.check)
      throw InputError("option --gemm: times the hand core's GEMM alone, which has no parity check to skip; "
                       "--profile, --no-check and --other-reference do not apply");
    return bench::bench_gemm(o, chosen);
  }

  if (!o.other.empty()) bench::check_other_reference(o.other, o.other_timeout);
  bench::reexec_without_openblas_overrides();
  bench::reexec_on_generic_openblas();
  if (o.torch_only) return bench::torch_only(o, chosen);
  bench::Run run;
  if (o.quick) run.limits.runs_per_round = 1;
  bool any_memory_bound = false;
  for (const bench::BenchCase& c : chosen) any_memory_bound = any_memory_bound || c.memory_bound;
  run.limits.measure(any_memory_bound);
  // Which case is being timed, for a person at a terminal (the table's, not JSON's), erased before the
  // report, or by a refusal's one line.
  StatusLine status;
  auto progress = [&](const std::string& line) {
    if (o.format == Format::Table) status.show(line);
  };
  for (const bench::BenchCase& c : chosen) {
    progress("bench " + c.name + " ...");
    run.results.push_back(bench::measure_case(c, o));
    run.limits.measure(any_memory_bound);
  }
  set_num_threads(1);
  set_torch_threads(1);
  // The other reference after every case here, in its own process (its LibTorch cannot load beside
  // this one's): the same cases, threads and repetitions.
  if (!o.other.empty()) {
    progress("bench: the other reference (" + o.other + ") ...");
    run.other = bench::time_other_reference(o, chosen);
    for (bench::Result& r : run.results)
      if (auto it = run.other->torch.find(r.c.name); it != run.other->torch.end()) {
        r.other = it->second;
        if (auto h = run.other->hand.find(r.c.name); h != run.other->hand.end()) r.other_hand = h->second;
      }
  }
  status.clear();
  run.dropped = std::getenv("TPARITY_BENCH_UNSET");
  run.pinned = std::getenv("TPARITY_BENCH_PINNED");
  run.heap = bench::heap_pages();
  run.ref = reference_info();
  bool parity_ok = true;
  for (const bench::Result& r : run.results) parity_ok = parity_ok && (r.parity == "PASS" || r.parity == "not checked");
  if (o.format == Format::Json)
    bench::print_json(o, run);
  else
    bench::print_table(o, run);
  return parity_ok ? kPass : kFail;
}

}  // namespace

void register_bench(CLI::App& app, Action& action) {
  auto o = std::make_shared<bench::Options>();
  CLI::App* cmd = app.add_subcommand(
      "bench", "Time the hand core against LibTorch (interleaved medians, GFLOP/s, peak memory); asserts nothing");
  std::string names;
  for (const bench::BenchCase& c : bench::bench_cases(false)) names += (names.empty() ? "" : ", ") + c.name;
  cmd->add_option("--case", o->cases, "Cases (default: all): " + names);
  cmd->add_option("--threads", o->threads, "Threads on each side (default: each case's own)")
      ->transform(whole_number_in(1, 256));
  cmd->add_option("--reps", o->reps, "Timed runs per side")->transform(whole_number_in(1, 100000))->capture_default_str();
  cmd->add_flag("--quick", o->quick, "Small shapes and few runs: a smoke run for CI");
  cmd->add_flag("--huge-pages", o->huge_pages,
                "Every side's heap on transparent huge pages (glibc.malloc.hugetlb=1): the hand core, LibTorch, "
                "the other reference and the bandwidth probe alike");
  cmd->add_option("--model", o->model,
                  "An export of tparity model (scripts/export_model.py): each layer's hand forward against "
                  "transformers' own, the whole check's time and peak memory");
  cmd->add_flag("--profile", o->profile,
                "Also time the hand core op by op (projections, score blocks, softmax, context, out_proj, norms, "
                "FFN, copies and zero-fills) on one thread, as shares");
  cmd->add_flag("--gemm", o->gemm,
                "Time the hand core's GEMM alone on each case's products (q, k, v; out_proj; the FFN) and on a "
                "2048-cubed product, against the FMA peak: whether a case's products or the rest of it fall short");
  cmd->add_flag("!--no-check", o->check, "Skip the parity check of the fast path at each shape");
  add_format_option(*cmd, o->format);
  cmd->add_option("--other-reference", o->other,
                  "Another tparity built against the other LibTorch (e.g. build-debian/tparity): its LibTorch is "
                  "timed on the same cases too, and each case is judged against the faster of the two")
      ->check(CLI::ExistingFile);
  cmd->add_option("--other-timeout", o->other_timeout,
                  "Seconds the other reference may take for each of its runs before it is killed and refused "
                  "(default: 120 for its --version, an hour per 15 --reps for its bench)")
      ->transform(whole_number_in(1, 1000000));
  cmd->add_flag("--torch-only", o->torch_only, "(internal) time LibTorch alone, as JSON")->group(kInternal);
  cmd->add_option("--child", o->child_side, "(internal) measure one side's peak memory")
      ->check(CLI::IsMember({"hand", "torch"}))
      ->group(kInternal);
  cmd->callback([o, cmd, &action] {
    if (o->quick && cmd->count("--reps") == 0) o->reps = 3;  // --quick's few runs, unless --reps says
    if (cmd->count("--other-timeout") && o->other.empty())
      throw InputError("option --other-timeout: limits the runs of --other-reference, which was not given");
    if (cmd->count("--model") && o->model.empty())
      throw InputError("option --model: expected the folder of a model's export, got an empty path");
    action = [o] { return run_bench(*o); };
  });
}

}  // namespace tparity::cli
