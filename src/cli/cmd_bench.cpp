// tparity bench: the hand core against LibTorch, timed in one process with the two sides interleaved,
// peak memory measured in separate child processes, the machine's FMA peak measured too. A
// benchmark, not a test: it asserts nothing about time (exit 0 unless the input is bad or a parity
// check of the fast path fails).
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
#include <array>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <map>
#include <optional>
#include <sstream>
#include <thread>

#include "common.hpp"
#include "tparity/api.hpp"
#include "tparity/compare/report.hpp"
#include "tparity/core/gemm.hpp"
#include "tparity/core/parallel.hpp"
#include "tparity/core/profile.hpp"
#include "tparity/torch/reference.hpp"

namespace tparity::cli {

namespace {

// ---- the cases, as data ------------------------------------------------------------------------------

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

// A LLaMA-7B-shaped LlamaDecoderLayer (hidden 4096, 32 heads over 8 kv heads of 128, intermediate
// 11008): T tokens, the last `decode` of them decoded one a call after a prefill of the others.
CaseSpec llama7b(std::string name, int64_t T, int64_t decode, bool quick) {
  CaseSpec s;
  s.name = std::move(name), s.module = ModuleKind::LlamaDecoderLayer, s.batch = 1, s.seq = T;
  s.dim = quick ? 512 : 4096, s.heads = quick ? 4 : 32, s.kv_heads = quick ? 1 : 8, s.head_dim = 128;
  s.ffn = quick ? 1376 : 11008, s.bias = false, s.decode_steps = decode, s.seed = 42;
  return s;
}

CaseSpec encoder_layer(std::string name, int64_t B, int64_t T, int64_t d, int64_t H, int64_t F, MaskKind mask,
                       bool zero_ffn_bias) {
  CaseSpec s;
  s.name = std::move(name), s.module = ModuleKind::TransformerEncoderLayer, s.batch = B, s.seq = T, s.dim = d;
  s.heads = H, s.ffn = F, s.mask = mask, s.zero_ffn_bias = zero_ffn_bias, s.seed = 42;
  return s;
}

std::vector<BenchCase> bench_cases(bool quick) {
  // quick: the same cases, small, for CI's smoke run
  const int64_t q = quick ? 1 : 0;
  CaseSpec attention;
  attention.name = "long_attention", attention.module = ModuleKind::MultiheadAttention, attention.batch = 1;
  attention.seq = q ? 256 : 4096, attention.dim = 512, attention.heads = 8, attention.bias = true;
  attention.need_weights = false, attention.seed = 42;
  return {
      {"seed_block",
       encoder_layer("seed_block", q ? 5 : 50, 100, 64, 4, 128, MaskKind::Causal, true),
       1,
       {0.5, 0.40, 0, 0, 0}},
      {"bert_base",
       encoder_layer("bert_base", q ? 1 : 8, q ? 32 : 128, 768, 12, 3072, MaskKind::None, false),
       1,
       {1.0, 0.75, 0, 0, 0}},
      {"long_attention", attention, 1, {1.0, 0.70, 0, 0.05, 0}},
      {"bert_base_2threads",
       encoder_layer("bert_base_2threads", q ? 1 : 8, q ? 32 : 128, 768, 12, 3072, MaskKind::None, false),
       2,
       {1.0, 0, 0, 0, 1.85}},
      {"llama7b_prefill", llama7b("llama7b_prefill", q ? 32 : 128, 0, quick), 1, {1.0, 0, 0, 0, 0}},
      {"llama7b_decode", llama7b("llama7b_decode", q ? 257 : 2049, 1, quick), 1, {1.0, 0, 0.70, 0, 0}, true},
  };
}

// Multiply-adds x 2 of the products (projections, scores, weighted sums, feed-forward); softmax and
// norms are not counted.
double flops(const CaseSpec& s) {
  if (s.module == ModuleKind::LlamaDecoderLayer) {  // the timed calls' tokens L over S keys
    const double C = double(s.dim), H = double(s.heads), K = double(s.kv_heads), D = double(s.head_dim),
                 I = double(s.ffn), L = double(s.decode_steps ? s.decode_steps : s.seq), S = double(s.seq);
    return 2 * L * (C * (H + 2 * K) * D + H * D * C + 3 * C * I) + 2 * 2 * L * S * H * D;
  }
  const double B = double(s.batch ? s.batch : 1), L = double(s.seq), S = double(s.kv_seq ? s.kv_seq : s.seq),
               E = double(s.dim);
  const double attention = 2 * B * L * E * E + 2 * 2 * B * S * E * E + 2 * 2 * B * L * S * E + 2 * B * L * E * E;
  if (s.module == ModuleKind::TransformerEncoderLayer) return attention + 2 * 2 * B * L * E * double(s.ffn);
  return attention;
}

// The bytes a decode step must move at least: every weight once and the cache's k and v (float32).
double bytes_moved(const CaseSpec& s) {
  if (s.module != ModuleKind::LlamaDecoderLayer) return 0;
  const double C = double(s.dim), H = double(s.heads), K = double(s.kv_heads), D = double(s.head_dim),
               I = double(s.ffn), S = double(s.seq);
  const double weights = C * (H + 2 * K) * D + H * D * C + 3 * C * I + 2 * C;
  return 4 * (weights + 2 * K * S * D);
}

// ---- measuring ---------------------------------------------------------------------------------------

using Clock = std::chrono::steady_clock;

double time_ms(const std::function<void()>& f) {
  const auto t0 = Clock::now();
  f();
  return std::chrono::duration<double, std::milli>(Clock::now() - t0).count();
}

struct Stats {
  double median = 0, min = 0, max = 0;
};

Stats stats(std::vector<double> v) {
  std::sort(v.begin(), v.end());
  const size_t n = v.size();
  return {n % 2 ? v[n / 2] : (v[n / 2 - 1] + v[n / 2]) / 2, v.front(), v.back()};
}

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

// GFLOP/s of one core's fp32 FMA units, the best of 5 runs, on the widest path the CPU has.
double measure_peak(std::string& isa) {
#if defined(__x86_64__)
  const bool avx512 = __builtin_cpu_supports("avx512f"), avx2 = __builtin_cpu_supports("avx2");
  if (avx512 || avx2) {
    isa = avx512 ? "avx512" : "avx2";
    const int64_t iters = 20'000'000;
    std::vector<double> g;
    volatile double sink = 0;  // keeps the loop
    for (int r = 0; r < 5; ++r) {
      const auto t0 = Clock::now();
      const double flop = avx512 ? fma_loop_avx512(iters) : fma_loop_avx2(iters);
      const double s = std::chrono::duration<double>(Clock::now() - t0).count();
      sink = sink + flop;
      g.push_back(double(iters) * 12 * (avx512 ? 16 : 8) * 2 / s / 1e9);
    }
    (void)sink;
    return *std::max_element(g.begin(), g.end());  // a limit: the best run (a neighbour only slows one down)
  }
#endif
  isa = "none";
  return 0;
}

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

// One core's streaming read bandwidth, bytes/s: the best of 5 sums over a 1 GiB buffer (far beyond
// every cache), vector loads in four independent chains, the pages touched before timing.
double measure_bandwidth() {
  const int64_t n = (int64_t(1) << 30) / 4;
  std::vector<float> buf(size_t(n), 1.0f);
  std::vector<double> bw;
  volatile float sink = 0;
  for (int r = 0; r < 5; ++r) {
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
  return *std::max_element(bw.begin(), bw.end());
}

// The process's resident set: "VmRSS" or "VmHWM" (the peak) from /proc/self/status, in bytes.
int64_t status_bytes(const char* key) {
  std::ifstream in("/proc/self/status");
  std::string line;
  while (std::getline(in, line))
    if (line.rfind(key, 0) == 0) return std::stoll(line.substr(std::strlen(key) + 1)) * 1024;
  return -1;
}

// "AMD EPYC (family 25, model 17)": the name, and the numbers that tell a generation when the name
// does not (a VM's "AMD EPYC"; Emerald Rapids is Intel family 6, model 207).
std::string cpu_model() {
  std::ifstream in("/proc/cpuinfo");
  std::string line, name = "unknown", family, model;
  while (std::getline(in, line) && line.find(':') != std::string::npos) {
    const std::string key = line.substr(0, line.find_first_of("\t:"));
    std::string v = line.substr(line.find(':') + 1);
    v.erase(0, v.find_first_not_of(' '));
    if (key == "model name") name = v;
    if (key == "cpu family") family = v;
    if (key == "model") model = v;
  }
  return family.empty() ? name : fmt::format("{} (family {}, model {})", name, family, model);
}

// The caches the OS reports and the GEMM's float blocks fitted to them (gemm.cpp, fit_to_caches).
std::string caches_line() {
  const CpuCaches& c = cpu_caches();
  auto kib = [](int64_t b) { return b >= (1 << 20) ? fmt::format("{} MiB", b >> 20) : fmt::format("{} KiB", b >> 10); };
  const gemm_detail::GemmBlocking bs = gemm_detail::kernel_info<float>(gemm_isa()).blocking;
  const std::string blocks = fmt::format("hand core's float GEMM blocks: mr {} x nr {}, kc {}, mc {}, nc {}", bs.mr,
                                         bs.nr, bs.kc, bs.mc, bs.nc);
  if (c.l2 <= 0) return fmt::format("caches: {}; {}", c.source, blocks);
  return fmt::format("caches ({}): L1d {}, L2 {}{}, {}; {}", c.source, kib(c.l1d), kib(c.l2),
                     c.l2_sharing > 1 ? fmt::format(" shared by {}", c.l2_sharing) : "",
                     c.l3 > 0 ? fmt::format("L3 {} shared by {} CPUs", kib(c.l3), c.l3_sharing) : "no L3 reported",
                     blocks);
}

// ---- the child: one side, one case, its peak memory ---------------------------------------------------

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
  // that memory the forward reuses from the preparation does not hide from the measurement.
  mallopt(M_MMAP_THRESHOLD, 128 << 10);
  mallopt(M_TRIM_THRESHOLD, 128 << 10);
  malloc_trim(0);
  const int64_t before = status_bytes("VmRSS:");
  std::ofstream("/proc/self/clear_refs") << "5";  // VmHWM := VmRSS (Linux >= 4.0)
  f();
  std::printf("%lld\n", static_cast<long long>(status_bytes("VmHWM:") - before));
  return kPass;
}

int64_t peak_in_child(const std::string& side, const BenchCase& c, bool quick) {
  const std::string cmd =
      fmt::format("/proc/{}/exe bench --child {} --case {}{}", ::getpid(), side, c.name, quick ? " --quick" : "");
  std::FILE* pipe = ::popen(cmd.c_str(), "r");
  if (!pipe) return -1;
  long long bytes = -1;
  if (std::fscanf(pipe, "%lld", &bytes) != 1) bytes = -1;
  return ::pclose(pipe) == 0 ? int64_t(bytes) : -1;
}

// ---- the run -----------------------------------------------------------------------------------------

struct BenchOptions {
  std::vector<std::string> cases;
  int threads = 0;  // 0: each case's own
  int reps = 11;
  bool quick = false;
  bool check = true;
  bool profile = false;
  Format format = Format::Table;
  std::string child_side;
  std::string other;        // --other-reference: a tparity built against the other LibTorch
  bool torch_only = false;  // (internal) time LibTorch alone: the other reference's side of a run
};

// The other reference's LibTorch on the chosen cases, timed by that build in its own process.
struct OtherTimes {
  std::string line, short_name, warning, unset, pinned;
  std::map<std::string, Stats> torch;  // by case
};

struct Result {
  BenchCase c;
  Stats hand, torch;
  Stats hand_one, hand_many;  // the scaling phase (threads > 1): the hand core on 1 and on c.threads threads
  double hand_gflops = 0, torch_gflops = 0;
  double hand_bytes_s = 0, torch_bytes_s = 0;  // memory-bound cases: bytes moved / median time
  int64_t hand_peak = -1, torch_peak = -1;
  std::string parity = "not checked";
  Stats other;  // --other-reference: that LibTorch's time (median 0: not run)
  // --profile: the hand core's time per op, ms per call on one thread, and the profiled call's time
  std::array<double, profile::kOps> op_ms{};
  double profiled_ms = 0;
  std::array<double, profile::kOps> op_ms_many{};  // the same on the case's threads (threads > 1)
  double profiled_ms_many = 0;
};

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

// OpenBLAS reads OPENBLAS_CORETYPE and OPENBLAS_L2_SIZE when it loads, before main(): to time
// LibTorch on the kernels its BLAS would pick for this CPU, the bench drops them and runs itself
// again. TPARITY_BENCH_UNSET remembers what it dropped, to say so.
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

// s as one word for /bin/sh: in single quotes, each ' as '\''.
std::string shell_quote(const std::string& s) {
  std::string q = "'";
  for (char ch : s) q += ch == '\'' ? std::string("'\\''") : std::string(1, ch);
  return q + "'";
}

// Before any timing: --other-reference must be a tparity built against LibTorch (its --version says).
void check_other_reference(const std::string& exe) {
  std::FILE* pipe = ::popen((shell_quote(exe) + " --version 2>/dev/null").c_str(), "r");
  std::string out;
  if (pipe) {
    char buf[512];
    for (size_t n; (n = std::fread(buf, 1, sizeof buf, pipe)) > 0;) out.append(buf, n);
    ::pclose(pipe);
  }
  out = out.substr(0, out.find('\n'));  // its first line
  if (out.rfind("tparity ", 0) != 0 || out.find("reference: LibTorch") == std::string::npos)
    throw InputError(
        fmt::format("option --other-reference: expected a tparity built against LibTorch, got \"{}\" "
                    "(its --version printed \"{}\")",
                    exe, out.substr(0, 120)));
}

// The other build's LibTorch on the same cases and repetitions (its own bench, --torch-only).
OtherTimes time_other_reference(const BenchOptions& o, const std::vector<BenchCase>& cases) {
  // Its own decisions about OpenBLAS's kernels: none of this run's bookkeeping passed down (an
  // OPENBLAS_CORETYPE this run pinned is, to the child, an override it drops, then pins itself if
  // its OpenBLAS falls back too). Its standard error kept apart, for the one line of an error.
  const std::string err_file = fmt::format("/tmp/tparity-bench-other-{}.err", ::getpid());
  std::string cmd = "env -u TPARITY_BENCH_PINNED -u TPARITY_BENCH_UNSET " + shell_quote(o.other) +
                    " bench --torch-only --format json --reps " + std::to_string(o.reps);
  for (const BenchCase& c : cases) cmd += " --case " + c.name;
  if (o.quick) cmd += " --quick";
  if (o.threads) cmd += " --threads " + std::to_string(o.threads);
  cmd += " 2>" + err_file;
  std::FILE* pipe = ::popen(cmd.c_str(), "r");
  if (!pipe) throw InputError("option --other-reference: could not run \"" + o.other + "\"");
  std::string out;
  char buf[4096];
  for (size_t n; (n = std::fread(buf, 1, sizeof buf, pipe)) > 0;) out.append(buf, n);
  const int status = ::pclose(pipe);
  std::string err;
  {
    std::ifstream in(err_file);
    std::getline(in, err);
  }
  std::remove(err_file.c_str());
  const nlohmann::json j = nlohmann::json::parse(out, nullptr, false);
  if (status != 0 || j.is_discarded() || !j.is_object() || !j.contains("cases") || !j.contains("environment"))
    throw InputError(
        fmt::format("option --other-reference: expected a tparity built against LibTorch (its \"bench "
                    "--torch-only\" prints JSON), got \"{}\" exiting with status {}{}",
                    o.other, status, err.empty() ? "" : ": " + err));
  OtherTimes t;
  const nlohmann::json& env = j.at("environment");
  t.line = env.value("reference_line", "");
  t.short_name = env.value("reference_short", "");
  t.warning = env.value("reference_warning", "");
  t.unset = env.value("unset", "");
  t.pinned = env.value("pinned", "");
  for (const nlohmann::json& c : j.at("cases"))
    t.torch[c.at("name").get<std::string>()] = {c.at("torch_ms").get<double>(), c.at("torch_min_ms").get<double>(),
                                                c.at("torch_max_ms").get<double>()};
  return t;
}

// --torch-only: LibTorch alone on each case, as JSON for the bench that asked (time_other_reference).
int torch_only(const BenchOptions& o, const std::vector<BenchCase>& cases) {
  if (!torch_available()) throw InputError("option --torch-only: this tparity was built without LibTorch");
  nlohmann::json out = nlohmann::json::array();
  for (const BenchCase& c : cases) {
    const Problem p = make_problem(c.spec);
    set_torch_threads(c.threads);
    const std::function<void()> torch = prepare_torch(p, DType::Float32, "bench " + c.name);
    for (int w = 0; w < 2; ++w) torch();
    std::vector<double> tt;
    for (int rep = 0; rep < o.reps; ++rep) tt.push_back(time_ms(torch));
    const Stats s = stats(tt);
    out.push_back({{"name", c.name}, {"torch_ms", s.median}, {"torch_min_ms", s.min}, {"torch_max_ms", s.max}});
  }
  set_torch_threads(1);
  const ReferenceInfo ref = reference_info();
  const char* dropped = std::getenv("TPARITY_BENCH_UNSET");
  const char* pinned = std::getenv("TPARITY_BENCH_PINNED");
  const nlohmann::json env = {{"reference_line", ref.line()},
                              {"reference_short", ref.short_name()},
                              {"reference_warning", ref.warning},
                              {"unset", dropped ? dropped : ""},
                              {"pinned", pinned ? pinned : ""}};
  std::fputs((nlohmann::json{{"environment", env}, {"cases", out}}.dump(2) + "\n").c_str(), stdout);
  return kPass;
}

int bench(const BenchOptions& o) {
  std::vector<BenchCase> all = bench_cases(o.quick), chosen;
  for (const std::string& n : o.cases) {
    bool found = false;
    for (const BenchCase& c : all) found = found || c.name == n;
    if (!found) {
      std::string names;
      for (const BenchCase& c : all) names += (names.empty() ? "" : ", ") + c.name;
      throw InputError(fmt::format("option --case: expected one of {}, got \"{}\"", names, n));
    }
  }
  for (const BenchCase& c : all)
    if (o.cases.empty() || std::find(o.cases.begin(), o.cases.end(), c.name) != o.cases.end()) chosen.push_back(c);
  if (o.threads)
    for (BenchCase& c : chosen) c.threads = o.threads;
  if (!o.child_side.empty()) return child(o.child_side, chosen.at(0));

  if (!o.other.empty()) check_other_reference(o.other);
  reexec_without_openblas_overrides();
  reexec_on_generic_openblas();
  if (o.torch_only) return torch_only(o, chosen);
  std::string peak_isa;
  const double peak = measure_peak(peak_isa);
  bool any_memory_bound = false;
  for (const BenchCase& c : chosen) any_memory_bound = any_memory_bound || c.memory_bound;
  const double bandwidth = any_memory_bound ? measure_bandwidth() : 0;
  std::vector<Result> results;
  for (const BenchCase& c : chosen) {
    if (o.format == Format::Table && isatty(2)) std::fprintf(stderr, "bench %s ...\n", c.name.c_str());
    const Problem p = make_problem(c.spec);
    Result r;
    r.c = c;
    set_num_threads(c.threads);
    set_torch_threads(c.threads);
    const std::function<void()> hand = prepare_hand(p, DType::Float32, "bench " + c.name);
    const std::function<void()> torch = prepare_torch(p, DType::Float32, "bench " + c.name);
    for (int w = 0; w < 2; ++w) hand(), torch();  // warm-up: caches, packing buffers, thread pools
    std::vector<double> th, tt;
    for (int rep = 0; rep < o.reps; ++rep) {  // interleaved, so a slow spell of the machine hits both
      th.push_back(time_ms(hand));
      tt.push_back(time_ms(torch));
    }
    r.hand = stats(th), r.torch = stats(tt);
    if (c.threads > 1) {
      // The hand core's own scaling, timed apart from LibTorch: after LibTorch's calls its OpenMP
      // and OpenBLAS workers spin for a while (busy-waiting for the next call) on the cores the
      // hand core's threads need. So: a pause for them to go to sleep, then the hand core alone,
      // one thread and c.threads threads interleaved.
      std::this_thread::sleep_for(std::chrono::milliseconds(300));
      std::vector<double> one, many;
      for (int rep = 0; rep < o.reps; ++rep) {
        set_num_threads(1);
        one.push_back(time_ms(hand));
        set_num_threads(c.threads);
        many.push_back(time_ms(hand));
      }
      r.hand_one = stats(one), r.hand_many = stats(many);
    }
    r.hand_gflops = flops(c.spec) / (r.hand.median * 1e6);
    r.torch_gflops = flops(c.spec) / (r.torch.median * 1e6);
    if (c.memory_bound) {
      r.hand_bytes_s = bytes_moved(c.spec) / (r.hand.median * 1e-3);
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
    results.push_back(r);
  }
  set_num_threads(1);
  set_torch_threads(1);
  // The other reference after every case here, in its own process (its LibTorch cannot load beside
  // this one's): the same cases, threads and repetitions.
  std::optional<OtherTimes> other;
  if (!o.other.empty()) {
    if (o.format == Format::Table && isatty(2))
      std::fprintf(stderr, "bench: the other reference (%s) ...\n", o.other.c_str());
    other = time_other_reference(o, chosen);
    for (Result& r : results)
      if (auto it = other->torch.find(r.c.name); it != other->torch.end()) r.other = it->second;
  }

  // A multi-thread case's own scaling: its one-thread time over its many-thread time, both from the
  // scaling phase.
  auto scaling = [&](const Result& r) -> double {
    return r.c.threads > 1 && r.hand_many.median > 0 ? r.hand_one.median / r.hand_many.median : 0.0;
  };

  const char* dropped = std::getenv("TPARITY_BENCH_UNSET");
  const char* pinned = std::getenv("TPARITY_BENCH_PINNED");
  const ReferenceInfo ref = reference_info();
  // The hand core's time on a case: on more threads than one, its median timed alone (LibTorch's idle
  // workers spin on the cores for a while after each of its calls, and the interleaved median pays
  // for them; LibTorch's own median never follows a call of the hand core's that would do the same).
  auto hand_time = [&](const Result& r) {
    return r.c.threads > 1 && r.hand_many.median > 0 ? r.hand_many.median : r.hand.median;
  };
  // The fastest LibTorch on a case: this build's or the other reference's.
  auto fastest = [&](const Result& r) -> std::pair<double, std::string> {
    if (other && r.other.median > 0 && r.other.median < r.torch.median) return {r.other.median, other->short_name};
    return {r.torch.median, ref.short_name()};
  };
  struct TargetRow {
    std::string name, what, measured;
    double value, limit;
    bool met;
  };
  auto target_rows = [&](const Result& r) {
    std::vector<TargetRow> rows;
    const Targets& t = r.c.target;
    const auto [best, best_name] = fastest(r);
    const double ratio = hand_time(r) / best;
    rows.push_back({r.c.name,
                    fmt::format("<= {:.2f}x {} time", t.max_ratio, other ? "the faster LibTorch's" : "LibTorch's"),
                    fmt::format("{:.2f}x ({})", ratio, best_name), ratio, t.max_ratio, ratio <= t.max_ratio});
    if (t.min_peak > 0 && peak > 0) {
      const double f = r.hand_gflops / (peak * r.c.threads);
      rows.push_back({r.c.name, fmt::format(">= {:.0f}% of the FMA peak", 100 * t.min_peak),
                      fmt::format("{:.0f}%", 100 * f), f, t.min_peak, f >= t.min_peak});
    }
    if (t.min_bandwidth > 0 && bandwidth > 0) {
      const double f = r.hand_bytes_s / bandwidth;
      rows.push_back({r.c.name, fmt::format(">= {:.0f}% of the memory bandwidth", 100 * t.min_bandwidth),
                      fmt::format("{:.0f}%", 100 * f), f, t.min_bandwidth, f >= t.min_bandwidth});
    }
    if (t.max_memory > 0 && r.hand_peak >= 0 && r.torch_peak > 0) {
      const double f = double(r.hand_peak) / double(r.torch_peak);
      rows.push_back({r.c.name, fmt::format("<= {:.2f}x LibTorch's peak memory", t.max_memory),
                      fmt::format("{:.3f}x", f), f, t.max_memory, f <= t.max_memory});
    }
    if (t.min_scaling > 0) {
      const double s = scaling(r);
      rows.push_back(
          {r.c.name, fmt::format(">= {:.2f}x its one-thread speed on {} threads", t.min_scaling, r.c.threads),
           fmt::format("{:.2f}x ({:.2f} ms on 1, {:.2f} on {})", s, r.hand_one.median, r.hand_many.median, r.c.threads),
           s, t.min_scaling, s >= t.min_scaling});
    }
    return rows;
  };
  auto targets_json = [&](const Result& r) {
    nlohmann::json a = nlohmann::json::array();
    for (const TargetRow& t : target_rows(r))
      a.push_back(
          {{"target", t.what}, {"measured", t.measured}, {"value", t.value}, {"limit", t.limit}, {"met", t.met}});
    return a;
  };
  nlohmann::json env = {{"cpu", cpu_model()},
                        {"isa", to_string(gemm_isa())},
                        {"blas", torch_blas()},
                        {"torch", torch_version()},
                        {"reference", to_json(ref)},
                        {"peak_gflops", peak},
                        {"peak_isa", peak_isa},
                        {"bandwidth_bytes_s", bandwidth},
                        {"unset", dropped ? dropped : ""},
                        {"pinned", pinned ? pinned : ""},
                        {"caches", caches_line()},
                        {"other_reference", other ? nlohmann::json{{"line", other->line},
                                                                   {"short", other->short_name},
                                                                   {"warning", other->warning},
                                                                   {"unset", other->unset},
                                                                   {"pinned", other->pinned}}
                                                  : nlohmann::json(nullptr)},
                        {"quick", o.quick},
                        {"reps", o.reps}};
  auto profile_json = [&](const Result& r) -> nlohmann::json {
    if (!o.profile) return nullptr;
    nlohmann::json ops = nlohmann::json::object();
    for (int i = 0; i < profile::kOps; ++i)
      ops[profile::name(profile::Op(i))] = {{"ms", r.op_ms[size_t(i)]},
                                            {"share", r.profiled_ms > 0 ? r.op_ms[size_t(i)] / r.profiled_ms : 0.0}};
    nlohmann::json j = {{"threads", 1}, {"profiled_ms", r.profiled_ms}, {"ops", ops}};
    if (r.c.threads > 1) {
      nlohmann::json many = nlohmann::json::object();
      for (int i = 0; i < profile::kOps; ++i) many[profile::name(profile::Op(i))] = {{"ms", r.op_ms_many[size_t(i)]}};
      j["on_threads"] = {{"threads", r.c.threads}, {"profiled_ms", r.profiled_ms_many}, {"ops", many}};
    }
    return j;
  };
  bool parity_ok = true;
  for (const Result& r : results) parity_ok = parity_ok && (r.parity == "PASS" || r.parity == "not checked");
  if (o.format == Format::Json) {
    nlohmann::json cases = nlohmann::json::array();
    for (const Result& r : results)
      cases.push_back({{"name", r.c.name},
                       {"description", r.c.spec.describe()},
                       {"threads", r.c.threads},
                       {"hand_ms", r.hand.median},
                       {"hand_min_ms", r.hand.min},
                       {"hand_max_ms", r.hand.max},
                       {"torch_ms", r.torch.median},
                       {"torch_min_ms", r.torch.min},
                       {"torch_max_ms", r.torch.max},
                       {"ratio", r.hand.median / r.torch.median},
                       {"hand_gflops", r.hand_gflops},
                       {"torch_gflops", r.torch_gflops},
                       {"peak_fraction", peak > 0 ? r.hand_gflops / (peak * r.c.threads) : 0.0},
                       {"torch_peak_fraction", peak > 0 ? r.torch_gflops / (peak * r.c.threads) : 0.0},
                       {"hand_bytes_s", r.hand_bytes_s},
                       {"torch_bytes_s", r.torch_bytes_s},
                       {"bandwidth_fraction", bandwidth > 0 ? r.hand_bytes_s / bandwidth : 0.0},
                       {"torch_bandwidth_fraction", bandwidth > 0 ? r.torch_bytes_s / bandwidth : 0.0},
                       {"hand_peak_bytes", r.hand_peak},
                       {"torch_peak_bytes", r.torch_peak},
                       {"scaling", scaling(r)},
                       {"scaling_one_thread_ms", r.hand_one.median},
                       {"scaling_threads_ms", r.hand_many.median},
                       {"other_torch_ms", r.other.median},
                       {"other_torch_min_ms", r.other.min},
                       {"other_torch_max_ms", r.other.max},
                       {"fastest_torch_ms", fastest(r).first},
                       {"fastest_torch", fastest(r).second},
                       {"targets", targets_json(r)},
                       {"profile", profile_json(r)},
                       {"reference", ref.short_name()},
                       {"parity", r.parity}});
    std::fputs((nlohmann::json{{"environment", env}, {"cases", cases}}.dump(2) + "\n").c_str(), stdout);
    return parity_ok ? kPass : kFail;
  }
  fmt::print(
      "tparity bench: {} | hand core ISA {} | fp32 FMA peak {:.0f} GFLOP/s per core ({}, best of 5)\nreference: {}\n",
      cpu_model(), to_string(gemm_isa()), peak, peak_isa, ref.line());
  if (!ref.warning.empty()) fmt::print("warning: {}\n", ref.warning);
  fmt::print("{}\n", caches_line());
  if (bandwidth > 0)
    fmt::print("memory bandwidth: {:.1f} GB/s (one core's streaming read of 1 GiB, best of 5)\n", bandwidth / 1e9);
  fmt::print("{}\n", dropped ? fmt::format("unset for this run, so OpenBLAS picks its own kernels: {}", dropped)
                             : std::string("no OpenBLAS overrides were set"));
  if (pinned) fmt::print("pinned for LibTorch in this run: {}\n", pinned);
  if (other) {
    fmt::print("other reference: {} (timed by {} after this build's cases, same cases and runs)\n", other->line,
               o.other);
    if (!other->warning.empty()) fmt::print("warning: {}\n", other->warning);
    if (!other->pinned.empty()) fmt::print("pinned for the other reference: {}\n", other->pinned);
  }
  fmt::print(
      "medians of {} interleaved runs after 2 warm-ups; peak memory: the forward pass beyond its inputs and "
      "weights, each side in its own child process\n\n",
      o.reps);
  fmt::print("{:<19} {:>3} {:>22} {:>22} {:>6} {:>13} {:>9} {:>19} {:>6}  {:<18} {}\n", "case", "thr",
             "hand ms (min-max)", "torch ms (min-max)", "ratio", "GFLOP/s h/t", "of peak", "peak MB h/t", "mem",
             "reference", "parity");
  for (const Result& r : results) {
    const double mem = r.hand_peak >= 0 && r.torch_peak > 0 ? double(r.hand_peak) / double(r.torch_peak) : 0;
    fmt::print("{:<19} {:>3} {:>22} {:>22} {:>6.2f} {:>13} {:>9} {:>19} {:>6}  {:<18} {}\n", r.c.name, r.c.threads,
               fmt::format("{:.2f} ({:.2f}-{:.2f})", r.hand.median, r.hand.min, r.hand.max),
               fmt::format("{:.2f} ({:.2f}-{:.2f})", r.torch.median, r.torch.min, r.torch.max),
               r.hand.median / r.torch.median, fmt::format("{:.0f}/{:.0f}", r.hand_gflops, r.torch_gflops),
               peak > 0 ? fmt::format("{:.0f}%/{:.0f}%", 100 * r.hand_gflops / (peak * r.c.threads),
                                      100 * r.torch_gflops / (peak * r.c.threads))
                        : "-",
               fmt::format("{:.1f}/{:.1f}", double(r.hand_peak) / 1e6, double(r.torch_peak) / 1e6),
               mem > 0 ? fmt::format("{:.3f}", mem) : "-", ref.short_name(), r.parity);
  }
  for (const Result& r : results)
    if (r.c.memory_bound)
      fmt::print(
          "{}: {:.2f} GB moved per call (the weights once, the cache's k and v): hand {:.1f} GB/s = {:.0f}% "
          "of the measured bandwidth, LibTorch {:.1f} GB/s = {:.0f}%\n",
          r.c.name, bytes_moved(r.c.spec) / 1e9, r.hand_bytes_s / 1e9,
          bandwidth > 0 ? 100 * r.hand_bytes_s / bandwidth : 0.0, r.torch_bytes_s / 1e9,
          bandwidth > 0 ? 100 * r.torch_bytes_s / bandwidth : 0.0);
  if (o.profile) {
    fmt::print(
        "\nwhere the hand core's time goes (--profile: one thread, {} calls per case after the timed runs; each op's "
        "share of the profiled call, and the profiled call's time over the timed one-thread median: the cost of the "
        "profile's clock reads)\n",
        std::max(3, o.reps / 3));
    fmt::print("{:<30}", "op");
    for (const Result& r : results) fmt::print(" {:>19}", r.c.name);
    fmt::print("\n");
    for (int i = 0; i < profile::kOps; ++i) {
      fmt::print("{:<30}", profile::name(profile::Op(i)));
      for (const Result& r : results)
        fmt::print(" {:>19}",
                   r.profiled_ms > 0 ? fmt::format("{:.1f}%", 100 * r.op_ms[size_t(i)] / r.profiled_ms) : "-");
      fmt::print("\n");
    }
    fmt::print("{:<30}", "profiled ms per call");
    for (const Result& r : results) {
      const double timed = r.c.threads > 1 ? r.hand_one.median : r.hand.median;
      fmt::print(" {:>19}", fmt::format("{:.2f} ({:.2f}x)", r.profiled_ms, timed > 0 ? r.profiled_ms / timed : 0.0));
    }
    fmt::print("\n");
    // On the case's threads: each op's wall time on the calling thread, and its speed-up over one thread.
    for (const Result& r : results) {
      if (r.c.threads <= 1 || r.profiled_ms_many <= 0) continue;
      fmt::print("\n{} on {} threads (the calling thread's wall time per op; speed-up over one thread):\n", r.c.name,
                 r.c.threads);
      for (int i = 0; i < profile::kOps; ++i) {
        const double one = r.op_ms[size_t(i)], many = r.op_ms_many[size_t(i)];
        if (one < 0.005 * r.profiled_ms && many < 0.005 * r.profiled_ms_many) continue;
        fmt::print("{:<30} {:>9.2f} ms {:>6.1f}%  {:>5.2f}x\n", profile::name(profile::Op(i)), many,
                   100 * many / r.profiled_ms_many, many > 0 ? one / many : 0.0);
      }
      fmt::print("{:<30} {:>9.2f} ms          {:>5.2f}x\n", "profiled ms per call", r.profiled_ms_many,
                 r.profiled_ms / r.profiled_ms_many);
    }
    fmt::print("\n");
  }
  if (other) {
    fmt::print("\nagainst both references (ms, median (min-max)):\n{:<19} {:>22} {:>22} {:>22} {:>8}\n", "case", "hand",
               ref.short_name(), other->short_name, "h/faster");
    for (const Result& r : results)
      fmt::print("{:<19} {:>22} {:>22} {:>22} {:>8.2f}\n", r.c.name,
                 fmt::format("{:.2f} ({:.2f}-{:.2f})", r.hand.median, r.hand.min, r.hand.max),
                 fmt::format("{:.2f} ({:.2f}-{:.2f})", r.torch.median, r.torch.min, r.torch.max),
                 r.other.median > 0 ? fmt::format("{:.2f} ({:.2f}-{:.2f})", r.other.median, r.other.min, r.other.max)
                                    : std::string("-"),
                 hand_time(r) / fastest(r).first);
  }
  // The targets, each against this run's measurements: the FMA peak and the bandwidth measured above,
  // the faster LibTorch (with --other-reference: of both); the two-thread scaling timed apart.
  fmt::print(
      "\ntargets (scaling: the hand core alone, {} runs on 1 and on the case's threads interleaved after a 0.3 s "
      "pause{}):\n",
      o.reps, other ? "" : "; the time against this build's LibTorch only: --other-reference adds the other");
  int met = 0, total = 0;
  for (const Result& r : results)
    for (const TargetRow& t : target_rows(r)) {
      fmt::print("{:<19} {:<44} {:<36} {}\n", t.name, t.what, t.measured, t.met ? "met" : "MISSED");
      met += t.met, ++total;
    }
  fmt::print("{} of {} targets met{}\n", met, total, o.quick ? " (--quick: the targets are for the full shapes)" : "");
  return parity_ok ? kPass : kFail;
}

}  // namespace

void register_bench(CLI::App& app, Action& action) {
  auto o = std::make_shared<BenchOptions>();
  CLI::App* cmd = app.add_subcommand(
      "bench", "Time the hand core against LibTorch (interleaved medians, GFLOP/s, peak memory); asserts nothing");
  std::string names;
  for (const BenchCase& c : bench_cases(false)) names += (names.empty() ? "" : ", ") + c.name;
  cmd->add_option("--case", o->cases, "Cases (default: all): " + names);
  cmd->add_option("--threads", o->threads, "Threads on each side (default: each case's own)")
      ->check(CLI::Range(1, 256));
  cmd->add_option("--reps", o->reps, "Timed runs per side")->check(CLI::Range(1, 100000))->capture_default_str();
  cmd->add_flag("--quick", o->quick, "Small shapes and few runs: a smoke run for CI");
  cmd->add_flag("--profile", o->profile,
                "Also time the hand core op by op (projections, score blocks, softmax, context, out_proj, norms, "
                "FFN, copies and zero-fills) on one thread, as shares");
  cmd->add_flag("!--no-check", o->check, "Skip the parity check of the fast path at each shape");
  add_format_option(*cmd, o->format);
  cmd->add_option("--other-reference", o->other,
                  "Another tparity built against the other LibTorch (e.g. build-debian/tparity): its LibTorch is "
                  "timed on the same cases too, and each case is judged against the faster of the two")
      ->check(CLI::ExistingFile);
  cmd->add_flag("--torch-only", o->torch_only, "(internal) time LibTorch alone, as JSON")->group("");
  cmd->add_option("--child", o->child_side, "(internal) measure one side's peak memory")
      ->check(CLI::IsMember({"hand", "torch"}))
      ->group("");
  cmd->callback([o, &action] {
    if (o->quick && o->reps == 11) o->reps = 3;
    action = [o] { return bench(*o); };
  });
}

}  // namespace tparity::cli
