// tparity bench's measurements: the hand core and this build's LibTorch timed in one process with the
// two sides interleaved, peak memory measured in separate child processes, the machine's FMA peak and
// memory bandwidth measured too, and LibTorch's BLAS on its best kernels for this CPU.
#include <fmt/format.h>
#include <malloc.h>
#include <unistd.h>

#if defined(__x86_64__)
// GCC 12's _mm512_reduce_add_ps uses the header's own undefined values (GCC bug 105593; as in
// src/core/simd_avx512.hpp): the warning is about the header.
#pragma GCC diagnostic push
#pragma GCC diagnostic ignored "-Wuninitialized"
#if !defined(__clang__)
#pragma GCC diagnostic ignored "-Wmaybe-uninitialized"
#endif
#include <immintrin.h>
#pragma GCC diagnostic pop
#endif

#include <algorithm>
#include <cerrno>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <stdexcept>
#include <thread>

#include "bench.hpp"
#include "tparity/api.hpp"
#include "tparity/core/parallel.hpp"
#include "tparity/torch/reference.hpp"

namespace tparity::cli::bench {

namespace {

using Clock = std::chrono::steady_clock;

#if defined(__x86_64__)
// The FMA peak of one core: independent accumulators so the FMA units never wait on a result.
__attribute__((target("avx512f,fma"))) double fma_loop_avx512(int64_t iters) {
  __m512 acc[12];
  for (int i = 0; i < 12; ++i) acc[i] = _mm512_set1_ps(float(i));
  const __m512 a = _mm512_set1_ps(0.999999f), b = _mm512_set1_ps(1e-7f);
  for (int64_t it = 0; it < iters; ++it)
    for (int i = 0; i < 12; ++i) acc[i] = _mm512_fmadd_ps(acc[i], a, b);
  __m512 s = acc[0];
  for (int i = 1; i < 12; ++i) s = _mm512_add_ps(s, acc[i]);
  float out[16];
  _mm512_storeu_ps(out, s);
  return double(out[0]) + double(iters) * 12 * 16 * 2;
}
__attribute__((target("avx2,fma"))) double fma_loop_avx2(int64_t iters) {
  __m256 acc[12];
  for (int i = 0; i < 12; ++i) acc[i] = _mm256_set1_ps(float(i));
  const __m256 a = _mm256_set1_ps(0.999999f), b = _mm256_set1_ps(1e-7f);
  for (int64_t it = 0; it < iters; ++it)
    for (int i = 0; i < 12; ++i) acc[i] = _mm256_fmadd_ps(acc[i], a, b);
  float out[8];
  __m256 s = acc[0];
  for (int i = 1; i < 12; ++i) s = _mm256_add_ps(s, acc[i]);
  _mm256_storeu_ps(out, s);
  return double(out[0]) + double(iters) * 12 * 8 * 2;
}
#endif

#if defined(__x86_64__)
__attribute__((target("avx512f"))) float stream_avx512(const float* p, int64_t n) {
  __m512 a0 = _mm512_setzero_ps(), a1 = a0, a2 = a0, a3 = a0;
  for (int64_t i = 0; i + 64 <= n; i += 64) {
    a0 = _mm512_add_ps(a0, _mm512_loadu_ps(p + i)), a1 = _mm512_add_ps(a1, _mm512_loadu_ps(p + i + 16));
    a2 = _mm512_add_ps(a2, _mm512_loadu_ps(p + i + 32)), a3 = _mm512_add_ps(a3, _mm512_loadu_ps(p + i + 48));
  }
  return _mm512_reduce_add_ps(_mm512_add_ps(_mm512_add_ps(a0, a1), _mm512_add_ps(a2, a3)));
}
__attribute__((target("avx2"))) float stream_avx2(const float* p, int64_t n) {
  __m256 a0 = _mm256_setzero_ps(), a1 = a0, a2 = a0, a3 = a0;
  for (int64_t i = 0; i + 32 <= n; i += 32) {
    a0 = _mm256_add_ps(a0, _mm256_loadu_ps(p + i)), a1 = _mm256_add_ps(a1, _mm256_loadu_ps(p + i + 8));
    a2 = _mm256_add_ps(a2, _mm256_loadu_ps(p + i + 16)), a3 = _mm256_add_ps(a3, _mm256_loadu_ps(p + i + 24));
  }
  float out[8];
  _mm256_storeu_ps(out, _mm256_add_ps(_mm256_add_ps(a0, a1), _mm256_add_ps(a2, a3)));
  return out[0];
}
#endif


// Runs this bench again as --child for one side of one case: that side's peak memory, -1 if unknown.
int64_t peak_in_child(const std::string& side, const BenchCase& c, bool quick) {
  const std::string cmd =
      fmt::format("/proc/{}/exe bench --child {} --case {}{}", ::getpid(), side, c.name, quick ? " --quick" : "");
  std::FILE* pipe = ::popen(cmd.c_str(), "r");
  if (!pipe) return -1;
  long long bytes = -1;
  if (std::fscanf(pipe, "%lld", &bytes) != 1) bytes = -1;
  return ::pclose(pipe) == 0 ? int64_t(bytes) : -1;
}

// The hand core on one thread, profiled (profile.hpp): `reps` calls, each op's time per call. The
// profiled calls are timed too, to show what the profile's own clock reads cost.
void profile_hand(const std::function<void()>& hand, int reps, int threads, std::array<double, profile::kOps>& op_ms,
                  double& profiled_ms) {
  set_num_threads(threads);
  hand();  // warm at this thread count
  profile::set_enabled(true);
  const auto t0 = Clock::now();
  for (int i = 0; i < reps; ++i) hand();
  const double ms = std::chrono::duration<double, std::milli>(Clock::now() - t0).count();
  const profile::Totals t = profile::totals();
  profile::set_enabled(false);
  const double total = double(t.total());
  for (int i = 0; i < profile::kOps; ++i)
    op_ms[size_t(i)] = total > 0 ? ms / reps * double(t.ticks[size_t(i)]) / total : 0;
  profiled_ms = ms / reps;
}

// The fast path as an implementation under test: outputs only, no observer, so every fast kernel
// runs as it does when timed (the fused attention among them).
Implementation fast_path() {
  return {"hand core, fast path (outputs only, as timed)",
          [](const Problem& p, DType dtype, const Components*) { return run_hand(p, dtype, false, "case " + p.name); }};
}

// The OpenBLAS kernels for this CPU when OpenBLAS does not know it: the widest family the CPU runs.
const char* best_openblas_core() {
#if defined(__x86_64__)
  if (__builtin_cpu_supports("avx512f") && __builtin_cpu_supports("avx512bw") && __builtin_cpu_supports("avx512vl"))
    return "SkylakeX";
  if (__builtin_cpu_supports("avx2")) return __builtin_cpu_is("amd") ? "Zen" : "Haswell";
  if (__builtin_cpu_supports("avx")) return "Sandybridge";
#endif
  return "";
}

}  // namespace

int64_t status_bytes(const char* key) {
  std::ifstream in("/proc/self/status");
  std::string line;
  while (std::getline(in, line))
    if (line.rfind(key, 0) == 0) return std::stoll(line.substr(std::strlen(key) + 1)) * 1024;
  return -1;
}

double time_ms(const std::function<void()>& f) {
  const auto t0 = Clock::now();
  f();
  return std::chrono::duration<double, std::milli>(Clock::now() - t0).count();
}

Stats stats(std::vector<double> v) {
  std::sort(v.begin(), v.end());
  const size_t n = v.size();
  return {n % 2 ? v[n / 2] : (v[n / 2 - 1] + v[n / 2]) / 2, v.front(), v.back()};
}

// GFLOP/s of one core's fp32 FMA units, the best of `runs` runs, on the widest path the CPU has.
Best measure_peak(std::string& isa, int runs) {
#if defined(__x86_64__)
  const bool avx512 = __builtin_cpu_supports("avx512f"), avx2 = __builtin_cpu_supports("avx2");
  if (avx512 || avx2) {
    isa = avx512 ? "avx512" : "avx2";
    const int64_t iters = 20'000'000;
    std::vector<double> g;
    volatile double sink = 0;  // keeps the loop
    for (int r = 0; r < runs; ++r) {
      const auto t0 = Clock::now();
      const double flop = avx512 ? fma_loop_avx512(iters) : fma_loop_avx2(iters);
      const double s = std::chrono::duration<double>(Clock::now() - t0).count();
      sink = sink + flop;
      g.push_back(double(iters) * 12 * (avx512 ? 16 : 8) * 2 / s / 1e9);
    }
    (void)sink;
    if (g.empty()) return {};
    return {*std::max_element(g.begin(), g.end()), int(g.size())};  // a limit: the best run (a neighbour only slows one down)
  }
#endif
  isa = "none";
  return {};
}

// One core's streaming read bandwidth, bytes/s: the best of `runs` sums over a 1 GiB buffer (far beyond
// every cache), vector loads in four independent chains, the pages touched before timing.
// The buffer is the core's own storage, advised onto huge pages as the hand core's large tensors are
// (core/tensor.hpp), so that the probe measures what one core can stream at best: on 4 KiB pages it
// read 1-10% less on Zen 5 the same morning (docs/performance.md, "Huge pages by default").
Best measure_bandwidth(int runs) {
  const int64_t n = (int64_t(1) << 30) / 4;
  Storage<float> buf(size_t(n), 1.0f);
  std::vector<double> bw;
  volatile float sink = 0;
  for (int r = 0; r < runs; ++r) {
    const auto t0 = Clock::now();
    float v = 0;
#if defined(__x86_64__)
    if (__builtin_cpu_supports("avx512f"))
      v = stream_avx512(buf.data(), n);
    else if (__builtin_cpu_supports("avx2"))
      v = stream_avx2(buf.data(), n);
    else
#endif
      for (int64_t i = 0; i < n; i += 16) v += buf[size_t(i)];
    sink = sink + v;
    bw.push_back(double(n) * 4 / std::chrono::duration<double>(Clock::now() - t0).count());
  }
  (void)sink;
  if (bw.empty()) return {};
  return {*std::max_element(bw.begin(), bw.end()), int(bw.size())};
}

void Limits::measure(bool with_bandwidth) {
  const Best p = measure_peak(isa, runs_per_round);
  peak = std::max(peak, p.value), peak_runs += p.runs;
  if (with_bandwidth) {
    const Best b = measure_bandwidth(runs_per_round);
    bandwidth = std::max(bandwidth, b.value), bandwidth_runs += b.runs;
  }
  ++rounds;
}

Timings time_sides(const std::function<void()>& hand, const std::function<void()>& torch, int threads, int reps) {
  set_num_threads(threads);
  set_torch_threads(threads);
  for (int w = 0; w < 2; ++w) hand(), torch();  // warm-up: caches, packing buffers, thread pools
  Timings t;
  std::vector<double> th, tt;
  for (int rep = 0; rep < reps; ++rep) {  // interleaved, so a slow spell of the machine hits both
    th.push_back(time_ms(hand));
    tt.push_back(time_ms(torch));
  }
  t.hand = stats(th), t.torch = stats(tt);
  if (threads > 1) {
    // The hand core's own scaling, timed apart from LibTorch: after LibTorch's calls its OpenMP
    // and OpenBLAS workers spin for a while (busy-waiting for the next call) on the cores the
    // hand core's threads need. So: a pause for them to go to sleep, then the hand core alone,
    // one thread and `threads` threads interleaved.
    std::this_thread::sleep_for(std::chrono::milliseconds(300));
    std::vector<double> one, many;
    for (int rep = 0; rep < reps; ++rep) {
      set_num_threads(1);
      one.push_back(time_ms(hand));
      set_num_threads(threads);
      many.push_back(time_ms(hand));
    }
    t.hand_one = stats(one), t.hand_many = stats(many);
  }
  return t;
}

Result measure_case(const BenchCase& c, const Options& o) {
  const Problem p = make_problem(c.spec);
  Result r;
  r.c = c;
  set_num_threads(c.threads);
  set_torch_threads(c.threads);
  const std::function<void()> hand = prepare_hand(p, DType::Float32, "bench " + c.name);
  const std::function<void()> torch = prepare_torch(p, DType::Float32, "bench " + c.name);
  const Timings t = time_sides(hand, torch, c.threads, o.reps);
  r.hand = t.hand, r.torch = t.torch, r.hand_one = t.hand_one, r.hand_many = t.hand_many;
  // The hand core's speed from the time its targets judge (hand_time: on more threads than one, timed
  // alone), so that its share of the peak and its ratio to LibTorch speak of the same runs.
  r.hand_gflops = flops(c.spec) / (hand_time(r) * 1e6);
  r.torch_gflops = flops(c.spec) / (r.torch.median * 1e6);
  if (c.memory_bound) {
    r.hand_bytes_s = bytes_moved(c.spec) / (hand_time(r) * 1e-3);
    r.torch_bytes_s = bytes_moved(c.spec) / (r.torch.median * 1e-3);
  }
  if (o.profile) {
    profile_hand(hand, std::max(3, o.reps / 3), 1, r.op_ms, r.profiled_ms);
    if (c.threads > 1) profile_hand(hand, std::max(3, o.reps / 3), c.threads, r.op_ms_many, r.profiled_ms_many);
  }
  r.hand_peak = peak_in_child("hand", c, o.quick);
  r.torch_peak = peak_in_child("torch", c, o.quick);
  if (o.check) {
    set_num_threads(c.threads);
    const CaseReport cr = evaluate_problem(p, c.spec.describe(), c.spec.seed, GatePolicy{}, fast_path());
    r.parity = cr.pass ? "PASS" : "FAIL: " + (cr.failures.empty() ? std::string("?") : cr.failures.front());
  }
  return r;
}

// Prepares the side (weights and inputs held, the forward not yet run), resets the kernel's peak-RSS
// mark, runs the forward once and prints the peak minus the resident set before it: the memory the
// forward pass itself needs beyond its inputs, weights and the libraries.
int child(const std::string& side, const BenchCase& c) {
  const Problem p = make_problem(c.spec);
  set_num_threads(c.threads);
  set_torch_threads(c.threads);
  const std::function<void()> f = side == "hand" ? prepare_hand(p, DType::Float32, "bench " + c.name, false)
                                                 : prepare_torch(p, DType::Float32, "bench " + c.name, false);
  // Back to glibc's defaults (main() keeps freed memory for speed), and free memory handed back, so
  // that memory the forward reuses from the preparation does not hide from the measurement; the
  // core keeps no freed large block either (glibc's defaults unmap malloc's), so that what the
  // forward frees does not count as still in use.
  mallopt(M_MMAP_THRESHOLD, 128 << 10);
  mallopt(M_TRIM_THRESHOLD, 128 << 10);
  malloc_trim(0);
  set_kept_memory_limit(0);
  const int64_t before = status_bytes("VmRSS:");
  std::ofstream("/proc/self/clear_refs") << "5";  // VmHWM := VmRSS (Linux >= 4.0)
  f();
  std::printf("%lld\n", static_cast<long long>(status_bytes("VmHWM:") - before));
  return kPass;
}

// OpenBLAS reads OPENBLAS_CORETYPE and OPENBLAS_L2_SIZE once, when it loads (with the LibTorch
// reference, which a bench may have loaded by now): to time LibTorch on the kernels its BLAS would
// pick for this CPU, the bench drops them and runs itself again. TPARITY_BENCH_UNSET remembers what
// it dropped, to say so.
void reexec_without_openblas_overrides() {
  std::string dropped;
  for (const char* v : {"OPENBLAS_CORETYPE", "OPENBLAS_L2_SIZE"})
    if (const char* val = std::getenv(v)) dropped += fmt::format("{}{}={}", dropped.empty() ? "" : " ", v, val);
  // (after a pin, reexec_on_generic_openblas's OPENBLAS_CORETYPE is the bench's own: kept)
  if (dropped.empty() || std::getenv("TPARITY_BENCH_UNSET") || std::getenv("TPARITY_BENCH_PINNED")) return;
  ::unsetenv("OPENBLAS_CORETYPE");
  ::unsetenv("OPENBLAS_L2_SIZE");
  ::setenv("TPARITY_BENCH_UNSET", dropped.c_str(), 1);
  ::execv("/proc/self/exe", g_argv);
  throw std::runtime_error(std::string("bench: could not re-execute itself without the OpenBLAS overrides: ") +
                           std::strerror(errno));
}

// LibTorch timed on the kernels OpenBLAS picked itself, unless it fell back to a generic one (0.3.21
// on an Emerald Rapids Xeon runs Prescott's SSE3 kernels): then the run would not be LibTorch at its
// best on this CPU, so the bench pins OPENBLAS_CORETYPE to the CPU's widest kernel family and runs
// itself again; TPARITY_BENCH_PINNED says what it pinned and why.
void reexec_on_generic_openblas() {
  const ReferenceInfo ref = reference_info();
  if (!ref.generic_kernel || std::getenv("TPARITY_BENCH_PINNED")) return;
  const char* core = best_openblas_core();
  if (!*core) return;
  ::setenv("OPENBLAS_CORETYPE", core, 1);
  ::setenv("TPARITY_BENCH_PINNED",
           fmt::format("OPENBLAS_CORETYPE={} (OpenBLAS had picked its generic kernels: {})", core, ref.kernel).c_str(),
           1);
  ::execv("/proc/self/exe", g_argv);
  throw std::runtime_error(std::string("bench: could not re-execute itself with OPENBLAS_CORETYPE pinned: ") +
                           std::strerror(errno));
}

// --huge-pages. glibc's malloc (2.35 on) reads the tunable glibc.malloc.hugetlb once, at start-up: 1
// makes it madvise(MADV_HUGEPAGE) its heap and the blocks it maps, when the kernel's THP mode is
// "madvise", so that the kernel backs them with 2 MiB pages (in "always" mode it does anyway; in
// "never", not at all). The bench sets it and runs itself again; the variable passes to the memory
// children and the other reference alike, so that every side (the hand core, both LibTorches, the
// bandwidth probe) runs on the same pages, and the peak-memory figures count what they touched.
// Without it, the hand core's tensors of 2 MiB and more, the probe's buffer and (through
// THP_MEM_ALLOC_ENABLE) LibTorch 2.13's large blocks are advised onto huge pages already; --huge-pages
// adds every smaller block and LibTorch 1.13's, which has no switch of its own (docs/performance.md,
// "Huge pages by default").
namespace {

// The value glibc will take for glibc.malloc.hugetlb from GLIBC_TUNABLES, as glibc reads it: items
// split at ':', each a name up to its first '=' and a value after it, the last item of that name
// winning; none: no such item ("x=glibc.malloc.hugetlb=1" is the tunable x).
std::optional<std::string> hugetlb_tunable(const std::string& tunables) {
  std::optional<std::string> value;
  size_t begin = 0;
  while (begin <= tunables.size()) {
    const size_t end = std::min(tunables.find(':', begin), tunables.size());
    const std::string item = tunables.substr(begin, end - begin);
    const size_t eq = item.find('=');
    if (eq != std::string::npos && item.compare(0, eq, "glibc.malloc.hugetlb") == 0) value = item.substr(eq + 1);
    begin = end + 1;
  }
  return value;
}

std::string glibc_tunables() {
  const char* t = std::getenv("GLIBC_TUNABLES");
  return t ? t : "";
}

}  // namespace

void reexec_with_huge_pages() {
  const std::string have = glibc_tunables();
  if (hugetlb_tunable(have)) return;  // the user's own setting, whatever it is, stays
  const std::string tunables = (have.empty() ? "" : have + ":") + "glibc.malloc.hugetlb=1";
  ::setenv("GLIBC_TUNABLES", tunables.c_str(), 1);
  ::execv("/proc/self/exe", g_argv);
  throw InputError(fmt::format("option --huge-pages: could not run tparity again with GLIBC_TUNABLES set to \"{}\" "
                               "({} bytes): {}",
                               show_text(tunables, 100), tunables.size(), std::strerror(errno)));
}

void huge_pages_for_libtorch() { ::setenv("THP_MEM_ALLOC_ENABLE", "1", 0); }

std::string heap_pages() {
  std::string mode = "unknown";
  std::ifstream f("/sys/kernel/mm/transparent_hugepage/enabled");
  std::string line;
  if (std::getline(f, line)) {
    const size_t a = line.find('['), b = line.find(']');
    if (a != std::string::npos && b != std::string::npos && b > a) mode = line.substr(a + 1, b - a - 1);
  }
  const char* thp = std::getenv("THP_MEM_ALLOC_ENABLE");
  const std::optional<std::string> value = hugetlb_tunable(glibc_tunables());
  return fmt::format(
      "heap pages: the kernel's transparent huge pages: {}; malloc: {}; advised onto huge pages: the hand core's "
      "tensors of 2 MiB and more, LibTorch's with THP_MEM_ALLOC_ENABLE={} (read by 2.1 and later)",
      mode,
      value ? fmt::format("glibc.malloc.hugetlb={} asked of glibc for every side", show_text(*value, 40))
            : std::string("glibc's default (--huge-pages asks it for huge pages on every side)"),
      thp ? show_text(thp, 40) : std::string("(unset)"));
}

}  // namespace tparity::cli::bench
