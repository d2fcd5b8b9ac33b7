// tparity bench's parts, one concern a file: the cases and the work they do (cases.cpp), measuring
// the hand core and this build's LibTorch (measure.cpp), the other reference (other_reference.cpp),
// what each case is judged against (targets.cpp), the table and the JSON (render.cpp).
// src/cli/cmd_bench.cpp registers the verb and runs them in that order. Internal to the CLI.
#pragma once

#include <array>
#include <functional>
#include <map>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "../common.hpp"
#include "tparity/core/profile.hpp"
#include "tparity/harness/reference_info.hpp"

namespace tparity::cli::bench {

// ---- the cases, as data (cases.cpp) -----------------------------------------------------------------

// What the project aims at for a case (informative: a benchmark asserts nothing); 0: no such target.
struct Targets {
  double max_ratio = 1.0;    // the hand core's time over the fastest LibTorch's
  double min_peak = 0;       // the hand core's GFLOP/s over the FMA peak of its threads' cores
  double min_bandwidth = 0;  // bytes moved / time over the measured bandwidth (memory-bound cases)
  double max_memory = 0;     // the hand core's peak memory over LibTorch's
  double min_scaling = 0;    // its speed on the case's threads over its one-thread speed
};

struct BenchCase {
  std::string name;
  CaseSpec spec;
  int threads;  // the hand core's threads, and LibTorch's
  Targets target;
  bool memory_bound = false;  // reported against the measured memory bandwidth (bytes moved / time)
};

// The bench's cases; quick: the same cases, small, for CI's smoke run.
std::vector<BenchCase> bench_cases(bool quick);
// Multiply-adds x 2 of the products (projections, scores, weighted sums, feed-forward); softmax and
// norms are not counted.
double flops(const CaseSpec& s);
// The bytes a decode step must move at least: every weight once and the cache's k and v (float32).
double bytes_moved(const CaseSpec& s);

struct Options {
  std::vector<std::string> cases;
  int threads = 0;  // 0: each case's own
  int reps = 11;
  bool quick = false;
  bool check = true;
  bool profile = false;
  bool huge_pages = false;  // --huge-pages: every side's heap on transparent huge pages (measure.cpp)
  Format format = Format::Table;
  std::string child_side;
  std::string other;        // --other-reference: a tparity built against the other LibTorch
  int other_timeout = 0;    // --other-timeout: seconds each of its runs may take (0: 120 for its
                            // --version, an hour per 15 reps for its bench)
  bool torch_only = false;  // (internal) time LibTorch alone: the other reference's side of a run
  std::string model;        // --model EXPORT: a whole model's check (model.cpp)
  bool gemm = false;        // --gemm: the hand core's GEMM alone on the cases' products (gemm.cpp)
};

// ---- the GEMM alone (gemm.cpp) -----------------------------------------------------------------------

// The hand core's GEMM on each case's products and on a large square one, against the FMA peak.
int bench_gemm(const Options& o, const std::vector<BenchCase>& cases);

// ---- a whole model (model.cpp) ----------------------------------------------------------------------

int bench_model(const Options& o, const std::string& dir);
// The process's resident set: "VmRSS:" or "VmHWM:" (the peak) from /proc/self/status, in bytes.
int64_t status_bytes(const char* key);

// ---- measuring (measure.cpp) ------------------------------------------------------------------------

struct Stats {
  double median = 0, min = 0, max = 0;
};

double time_ms(const std::function<void()>& f);
Stats stats(std::vector<double> v);

// GFLOP/s of one core's fp32 FMA units, the best of `runs` runs, on the widest path the CPU has; `isa`
// names that path ("avx512", "avx2", "none").
// A limit is the best of kLimitRuns runs each time (a neighbour only slows one down); --quick's smoke
// runs, whose small shapes say nothing of the peak, take one (each FMA run is about 30 ms, and the
// suites start some sixty quick benches).
constexpr int kLimitRuns = 5;
// A limit's value, the best of the runs it timed, and how many it timed (what the run reports: not
// the count it was asked for).
struct Best {
  double value = 0;
  int runs = 0;
};
Best measure_peak(std::string& isa, int runs);
// One core's streaming read bandwidth, bytes/s, the best of `runs` runs.
Best measure_bandwidth(int runs);

// The machine's limits over a run: each measure() takes them again (before the cases and after each),
// the best kept, since a shared host's speed drifts over a run (one Emerald Rapids VM's FMA peak
// measured 116, 166 and 177 GFLOP/s a minute apart) and a limit taken once in a slow spell would put
// the cases above it.
struct Limits {
  double peak = 0;  // GFLOP/s of one core (measure_peak)
  std::string isa;
  double bandwidth = 0;  // bytes/s (measure_bandwidth); 0 unless measured
  int rounds = 0;
  int runs_per_round = kLimitRuns;  // 1 for --quick
  int peak_runs = 0, bandwidth_runs = 0;  // timed over all the rounds, as the probes counted them
  void measure(bool with_bandwidth);
};

// Both sides of one case timed: interleaved, so that a slow spell of the machine hits both; on more
// threads than one, then the hand core alone on 1 and on the case's threads (measure_case says why).
struct Timings {
  Stats hand, torch;
  Stats hand_one, hand_many;  // threads > 1 only
};
Timings time_sides(const std::function<void()>& hand, const std::function<void()>& torch, int threads, int reps);

struct Result {
  BenchCase c;
  Stats hand, torch;
  Stats hand_one, hand_many;  // the scaling phase (threads > 1): the hand core on 1 and on c.threads threads
  double hand_gflops = 0, torch_gflops = 0;
  double hand_bytes_s = 0, torch_bytes_s = 0;  // memory-bound cases: bytes moved / median time
  int64_t hand_peak = -1, torch_peak = -1;
  std::string parity = "not checked";
  Stats other;  // --other-reference: that LibTorch's time (median 0: not run)
  Stats other_hand;  // and the hand core's, timed beside it in that process as here (hand_time's way)
  // --profile: the hand core's time per op, ms per call on one thread, and the profiled call's time
  std::array<double, profile::kOps> op_ms{};
  double profiled_ms = 0;
  std::array<double, profile::kOps> op_ms_many{};  // the same on the case's threads (threads > 1)
  double profiled_ms_many = 0;
};

// One case, both sides: the interleaved timings, the scaling phase, the profile, peak memory in
// child processes, the fast path's parity check (o.check).
Result measure_case(const BenchCase& c, const Options& o);
// --child: one side's peak memory on one case, printed for the parent (measure_case).
int child(const std::string& side, const BenchCase& c);

// Re-execute the bench, before any timing, so that LibTorch runs on the kernels its BLAS picks for
// this CPU: without a user's OpenBLAS overrides, then pinned to the CPU's widest kernels if OpenBLAS
// fell back to a generic one. TPARITY_BENCH_UNSET and TPARITY_BENCH_PINNED say what was done.
void reexec_without_openblas_overrides();
void reexec_on_generic_openblas();
// --huge-pages: runs itself again with glibc's malloc asking for transparent huge pages, unless
// GLIBC_TUNABLES already says glibc.malloc.hugetlb.
void reexec_with_huge_pages();
// LibTorch's own switch (2.1 and later) for what the hand core does by default, huge pages for
// tensors of 2 MiB and more (core/tensor.hpp): THP_MEM_ALLOC_ENABLE=1, unless the user set it. Before
// LibTorch's first allocation: it reads the variable once.
void huge_pages_for_libtorch();
// One line: the heap's pages as glibc was told (GLIBC_TUNABLES), the kernel's THP mode, and the
// large tensors' (the hand core's advice, LibTorch's THP_MEM_ALLOC_ENABLE).
std::string heap_pages();

// ---- the other reference (other_reference.cpp) ------------------------------------------------------

// The other reference's LibTorch on the chosen cases, timed by that build in its own process.
struct OtherTimes {
  std::string line, short_name, warning, unset, pinned;
  std::map<std::string, Stats> torch;  // by case
  std::map<std::string, Stats> hand;   // the hand core beside it in that process, by case (hand_time's way)
};

// Before any timing: --other-reference must be a tparity built against LibTorch (its --version says,
// within `seconds`, 0: the default).
void check_other_reference(const std::string& exe, int seconds);
// The other build's LibTorch on the same cases and repetitions (its own bench, --torch-only).
OtherTimes time_other_reference(const Options& o, const std::vector<BenchCase>& cases);
// --torch-only: LibTorch alone on each case, as JSON for the bench that asked (time_other_reference).
int torch_only(const Options& o, const std::vector<BenchCase>& cases);

// ---- the targets (targets.cpp) ----------------------------------------------------------------------

// A whole run: every case's measurements, the machine's limits and the references, as measured.
struct Run {
  std::vector<Result> results;
  Limits limits;  // measured before the cases and after each
  std::optional<OtherTimes> other;
  ReferenceInfo ref;              // this build's LibTorch
  const char* dropped = nullptr;  // TPARITY_BENCH_UNSET: the OpenBLAS overrides this run dropped
  const char* pinned = nullptr;   // TPARITY_BENCH_PINNED: the OpenBLAS kernels this run pinned
  std::string heap;               // heap_pages(): what pages the heap was asked for
};

// A multi-thread case's own scaling: its one-thread time over its many-thread time (0: one thread).
double scaling(const Result& r);
// The hand core's time on a case (its median timed alone on more threads than one).
double hand_time(const Result& r);
// The other reference's time on this run's clock: its median times the hand core's time here over the
// hand core's time beside it in its own process (the same code, timed the same way), so that a shared
// machine's drift between the two processes cancels; its raw median if that process did not time it.
double other_on_this_clock(const Result& r);
// The fastest LibTorch on a case, ms and short name: this build's or the other reference's (on this
// run's clock).
std::pair<double, std::string> fastest(const Run& run, const Result& r);

struct TargetRow {
  std::string name, what, measured;
  double value, limit;
  bool met;
};
// The case's targets, each against this run's measurements.
std::vector<TargetRow> target_rows(const Run& run, const Result& r);

// ---- rendering (render.cpp) -------------------------------------------------------------------------

// The whole run as one JSON document on standard output.
void print_json(const Options& o, const Run& run);
// The whole run as tables on standard output: the environment, the cases, the profile, both
// references, the targets.
void print_table(const Options& o, const Run& run);

}  // namespace tparity::cli::bench
