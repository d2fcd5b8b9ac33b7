// The GEMM's front: the choice of instruction set, the packing buffers, the threads, and the calls
// that need no kernel (K == 0, alpha == 0). The five loops are in gemm_driver.hpp, the kernels in
// gemm_kernels_<isa>.cpp.
#include "tparity/core/gemm.hpp"

#include <algorithm>
#include <atomic>
#include <cassert>
#include <cmath>
#include <condition_variable>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <memory>
#include <mutex>
#include <new>
#include <stdexcept>
#include <string>
#include <system_error>
#include <thread>
#include <vector>

#include "gemm_driver.hpp"
#include "gemm_kernels.hpp"
#include "parallel_team.hpp"
#include "scratch.hpp"
#include "tparity/core/defects.hpp"

#if defined(__x86_64__) && defined(__GNUC__)
#define TPARITY_GEMM_X86 1
#else
#define TPARITY_GEMM_X86 0
#endif

namespace tparity {
namespace gemm_impl {

using detail::run_on_threads;

namespace {

// --- the instruction set -------------------------------------------------------------------------

// The CPU feature a path lacks on this machine, or "" when it can run. AVX-512 F and AVX2 both come
// with FMA on every CPU that has them, but the kernels use it, so it is checked too.
// (__builtin_cpu_supports also checks that the OS saves the wider registers.)
std::string missing_feature(GemmIsa isa) {
  switch (isa) {
    case GemmIsa::Scalar:
      return "";
    case GemmIsa::Avx2:
#if TPARITY_GEMM_X86
      __builtin_cpu_init();
      if (!__builtin_cpu_supports("avx2")) return "avx2";
      if (!__builtin_cpu_supports("fma")) return "fma";
      return "";
#else
      return "x86-64 (this build has no AVX2 kernels)";
#endif
    case GemmIsa::Avx512:
#if TPARITY_GEMM_X86
      __builtin_cpu_init();
      if (!__builtin_cpu_supports("avx512f")) return "avx512f";
      if (!__builtin_cpu_supports("fma")) return "fma";
      return "";
#else
      return "x86-64 (this build has no AVX-512 kernels)";
#endif
  }
  return "a known instruction set";
}

std::string unavailable_message(GemmIsa isa) {
  return std::string("gemm: the ") + to_string(isa) + " path needs the CPU feature " + missing_feature(isa) +
         ", which this machine does not have";
}

GemmIsa best_available() {
  if (missing_feature(GemmIsa::Avx512).empty()) return GemmIsa::Avx512;
  if (missing_feature(GemmIsa::Avx2).empty()) return GemmIsa::Avx2;
  return GemmIsa::Scalar;
}

// TPARITY_ISA: the path it asks for, or why it cannot be had.
struct EnvChoice {
  bool set = false;
  GemmIsa isa = GemmIsa::Scalar;
  std::string error;
};

EnvChoice read_env() {
  EnvChoice c;
  const char* s = std::getenv("TPARITY_ISA");
  if (!s || !*s) return c;
  try {
    c.isa = parse_gemm_isa(s);
  } catch (const std::invalid_argument& e) {
    c.error = std::string("TPARITY_ISA: ") + e.what();
    return c;
  }
  if (!missing_feature(c.isa).empty())
    c.error = "TPARITY_ISA=" + std::string(s) + ": " + unavailable_message(c.isa);
  else
    c.set = true;
  return c;
}

// The path in use: a GemmIsa, or kUnresolved until the first call after start-up or
// gemm_reset_isa() reads TPARITY_ISA (a bad TPARITY_ISA leaves it unresolved, so every call throws).
constexpr int kUnresolved = -1;
std::atomic<int> current_isa{kUnresolved};
std::mutex resolve_mutex;

GemmIsa resolve_isa() {
  const std::lock_guard<std::mutex> lock(resolve_mutex);
  const int c = current_isa.load(std::memory_order_acquire);
  if (c != kUnresolved) return GemmIsa(c);
  const EnvChoice env = read_env();
  if (!env.error.empty()) throw std::invalid_argument(env.error);
  const GemmIsa isa = env.set ? env.isa : best_available();
  current_isa.store(int(isa), std::memory_order_release);
  return isa;
}

// --- the paths -----------------------------------------------------------------------------------

template <class T>
Path<T> make_path(GemmIsa isa) {
  switch (isa) {
#if TPARITY_GEMM_X86
    case GemmIsa::Avx512:
      return avx512_path<T>();
    case GemmIsa::Avx2:
      return avx2_path<T>();
#endif
    default:
      return scalar_path<T>();
  }
}

// --- the caches ----------------------------------------------------------------------------------

// "32K", "1024K", "32M" (sysfs's cache sizes) in bytes; 0 if unreadable.
int64_t parse_size(const std::string& s) {
  char* end = nullptr;
  const long long v = std::strtoll(s.c_str(), &end, 10);
  if (end == s.c_str() || v <= 0) return 0;
  const char unit = *end;
  return unit == 'K' ? v << 10 : unit == 'M' ? v << 20 : unit == 'G' ? v << 30 : v;
}

// "0-1", "0,2", "3": how many CPUs.
int count_cpus(const std::string& list) {
  int n = 0;
  size_t i = 0;
  while (i < list.size()) {
    size_t j = list.find(',', i);
    if (j == std::string::npos) j = list.size();
    const std::string item = list.substr(i, j - i);
    const size_t dash = item.find('-');
    n += dash == std::string::npos ? 1 : std::atoi(item.c_str() + dash + 1) - std::atoi(item.c_str()) + 1;
    i = j + 1;
  }
  return n > 0 ? n : 1;
}

std::string read_line(const std::string& path) {
  std::FILE* f = std::fopen(path.c_str(), "r");
  if (!f) return "";
  char buf[256] = {0};
  const bool ok = std::fgets(buf, sizeof buf, f) != nullptr;
  std::fclose(f);
  std::string s = ok ? buf : "";
  while (!s.empty() && (s.back() == '\n' || s.back() == ' ')) s.pop_back();
  return s;
}

// CPU 0's data caches as Linux reports them (sysfs: what CPUID leaves 4 / 0x8000001D say).
CpuCaches read_caches() {
  CpuCaches c;
  for (int i = 0; i < 8; ++i) {
    const std::string dir = "/sys/devices/system/cpu/cpu0/cache/index" + std::to_string(i) + "/";
    const std::string level = read_line(dir + "level"), type = read_line(dir + "type");
    if (level.empty()) break;
    if (type == "Instruction") continue;
    const int64_t size = parse_size(read_line(dir + "size"));
    const int sharing = count_cpus(read_line(dir + "shared_cpu_list"));
    if (level == "1") c.l1d = size;
    if (level == "2") c.l2 = size, c.l2_sharing = sharing;
    if (level == "3") c.l3 = size, c.l3_sharing = sharing;
  }
  c.source = c.l2 > 0 ? "sysfs" : "unknown (the paths' own block sizes)";
  return c;
}

// The path's mc and nc for these caches: A's mc x kc block in about a third of L2 (per core; the
// rest holds B's micro-panels streaming past and C's tiles), as the tuned sizes are on a 1 MiB L2;
// B's kc x nc block no larger than half of L3's share per core. The scalar path keeps its own.
GemmBlocking fit_to_caches(GemmBlocking bs, int lanes, int64_t elem, const CpuCaches& c) {
  if (lanes == 1 || c.l2 <= 0) return bs;
  const int64_t l2 = c.l2_per_core();
  const int64_t mc = int64_t(0.36 * double(l2)) / (int64_t(bs.kc) * elem) / bs.mr * bs.mr;
  bs.mc = int(std::clamp<int64_t>(mc, 8 * int64_t(bs.mr), 192 * int64_t(bs.mr)));
  if (c.l3 > 0) {
    const int64_t share = c.l3 / std::max(1, c.l3_sharing) / 2;
    const int64_t nc = share / (int64_t(bs.kc) * elem) / bs.nr * bs.nr;
    bs.nc = int(std::clamp<int64_t>(nc, 4 * int64_t(bs.nr), bs.nc));
  }
  return bs;
}

template <class T>
Path<T> fitted(Path<T> p) {
  p.blocking = fit_to_caches(p.blocking, p.lanes, int64_t(sizeof(T)), cpu_caches());
  return p;
}

// The path's entry points; isa must be available (the AVX files' code runs only after that check).
template <class T>
const Path<T>& path_for(GemmIsa isa) {
  switch (isa) {
    case GemmIsa::Avx512: {
      static const Path<T> p = fitted(make_path<T>(GemmIsa::Avx512));
      return p;
    }
    case GemmIsa::Avx2: {
      static const Path<T> p = fitted(make_path<T>(GemmIsa::Avx2));
      return p;
    }
    default: {
      static const Path<T> p = make_path<T>(GemmIsa::Scalar);
      return p;
    }
  }
}

// --- packing buffers -----------------------------------------------------------------------------

// One per calling thread (scratch.hpp). Not re-entrant: an epilogue's activation must not call gemm.
thread_local Scratch scratch;

// Elements of one workspace for an M x N x K problem split over nthreads row ranges.
struct WorkspaceShape {
  int64_t b, a_stride, a_rows;
  int64_t total(int nthreads) const { return b + nthreads * a_stride; }
};

WorkspaceShape workspace_shape(const GemmBlocking& bs, int64_t M, int64_t N, int64_t K, int nthreads) {
  const int64_t kc = min64(bs.kc, K);
  const int64_t nc = round_up(min64(bs.nc, N), bs.nr);
  const int64_t rows = round_up((M + nthreads - 1) / nthreads, bs.mr);
  const int64_t mc = round_up(min64(bs.mc, rows), bs.mr);
  return {round_up(kc * nc, 16), round_up(mc * kc, 16), mc};
}

template <class T>
Workspace<T> carve(T* base, const WorkspaceShape& s, RowDealer* dealer = nullptr) {
  return {base, base + s.b, s.a_stride, s.a_rows, dealer};
}

// --- the calls that need no kernel ---------------------------------------------------------------

// C = beta * C (0 when beta is 0, whatever C held), then the epilogue: K == 0 or alpha == 0.
template <class T>
void scale_only(int64_t M, int64_t N, T beta, T* C, int64_t ldc, const GemmEpilogue<T>* ep) {
  for (int64_t i = 0; i < M; ++i) {
    T* c = C + i * ldc;
    for (int64_t j = 0; j < N; ++j) c[j] = beta == T(0) ? T(0) : beta * c[j];
    if (ep) apply_epilogue(*ep, c, ldc, i, 0, 1, N);
  }
}

template <class T>
Problem<T> make_problem(bool trans_a, bool trans_b, int64_t M, int64_t N, int64_t K, T alpha, const T* A, int64_t lda,
                        const T* B, int64_t ldb, T beta, T* C, int64_t ldc, const GemmEpilogue<T>* ep) {
  assert(M >= 0 && N >= 0 && K >= 0);
  assert(ldc >= (N > 0 ? N : 1));
  assert(lda >= ((trans_a ? M : K) > 0 ? (trans_a ? M : K) : 1));
  assert(ldb >= ((trans_b ? K : N) > 0 ? (trans_b ? K : N) : 1));
  assert(!ep || !(ep->relu && ep->activation));  // one activation or none
  return {trans_a, trans_b, M, N, K, alpha, A, lda, B, ldb, beta, C, ldc, ep};
}

}  // namespace
}  // namespace gemm_impl

using namespace gemm_impl;

// --- the instruction set ---------------------------------------------------------------------------

const char* to_string(GemmIsa isa) {
  switch (isa) {
    case GemmIsa::Scalar:
      return "scalar";
    case GemmIsa::Avx2:
      return "avx2";
    case GemmIsa::Avx512:
      return "avx512";
  }
  return "?";
}

GemmIsa parse_gemm_isa(const std::string& name) {
  for (GemmIsa isa : {GemmIsa::Scalar, GemmIsa::Avx2, GemmIsa::Avx512})
    if (name == to_string(isa)) return isa;
  throw std::invalid_argument("gemm: unknown instruction set '" + name + "' (expected scalar, avx2 or avx512)");
}

bool gemm_isa_available(GemmIsa isa) { return missing_feature(isa).empty(); }

const CpuCaches& cpu_caches() {
  static const CpuCaches c = read_caches();
  return c;
}

GemmIsa gemm_isa() {
  const int c = current_isa.load(std::memory_order_acquire);
  return c != kUnresolved ? GemmIsa(c) : resolve_isa();
}

void gemm_force_isa(GemmIsa isa) {
  if (!gemm_isa_available(isa)) throw std::invalid_argument(unavailable_message(isa));
  current_isa.store(int(isa), std::memory_order_release);
}

void gemm_reset_isa() { current_isa.store(kUnresolved, std::memory_order_release); }

// --- the selftest's low-precision accumulation ------------------------------------------------------

// x rounded to nearest even with the low `drop` bits of its significand cleared (bfloat16: 16,
// float16: 13, leaving 8 and 11 significant bits), float16's range (finite up to 65504) when `half`
// (its subnormals aside).
float round_to(float x, int drop, bool half) {
  uint32_t u;
  std::memcpy(&u, &x, sizeof u);
  if ((u & 0x7f800000u) == 0x7f800000u) return x;  // inf, NaN
  u = (u + ((1u << (drop - 1)) - 1) + ((u >> drop) & 1)) & ~((1u << drop) - 1);
  std::memcpy(&x, &u, sizeof x);
  return half && std::fabs(x) > 65504.0f ? std::copysign(INFINITY, x) : x;
}

// The numeric defects Bf16Accumulate and Fp16Accumulate (float only): C = alpha op(A) op(B) + beta C
// with every partial sum of every dot product rounded to bfloat16 or float16, then the epilogue as
// the kernels apply it (bias, ReLU or activation, residual). A float32 implementation that accumulates in a
// 16-bit type.
bool low_precision(const float*, Defect d) { return d == Defect::Bf16Accumulate || d == Defect::Fp16Accumulate; }
bool low_precision(const double*, Defect) { return false; }

void gemm_low(bool ta, bool tb, int64_t M, int64_t N, int64_t K, float alpha, const float* A, int64_t lda,
              const float* B, int64_t ldb, float beta, float* C, int64_t ldc, const GemmEpilogue<float>* ep, Defect d) {
  const int bits = d == Defect::Bf16Accumulate ? 16 : 13;  // significand bits dropped
  const bool half = d == Defect::Fp16Accumulate;
  // Eight columns of C at a time: eight independent chains of rounded sums, each the same chain of
  // operations as one column alone (k ascending), so that the rounding's latency overlaps.
  constexpr int64_t J = 8;
  for (int64_t i = 0; i < M; ++i) {
    float* c = C + i * ldc;
    for (int64_t j0 = 0; j0 < N; j0 += J) {
      const int64_t nj = std::min(J, N - j0);
      float acc[J] = {0, 0, 0, 0, 0, 0, 0, 0};
      for (int64_t k = 0; k < K; ++k) {
        const float a = ta ? A[k * lda + i] : A[i * lda + k];
        for (int64_t jj = 0; jj < nj; ++jj) {
          const int64_t j = j0 + jj;
          acc[jj] = round_to(acc[jj] + a * (tb ? B[j * ldb + k] : B[k * ldb + j]), bits, half);
        }
      }
      for (int64_t jj = 0; jj < nj; ++jj) {
        const int64_t j = j0 + jj;
        c[j] = alpha * acc[jj] + (beta == 0 ? 0.0f : beta * c[j]);
      }
    }
    if (ep) apply_epilogue(*ep, c, ldc, i, 0, 1, N);
  }
}
void gemm_low(bool, bool, int64_t, int64_t, int64_t, double, const double*, int64_t, const double*, int64_t, double,
              double*, int64_t, const GemmEpilogue<double>*, Defect) {}

// --- gemm ------------------------------------------------------------------------------------------

namespace gemm_impl {

struct RowDealer {
  std::unique_ptr<detail::Dealer[]> slices;  // one per slice of the sum
};

// Guided (detail::Dealer): chunks of whole mr-tall panels, at least 4 of them and at most `most`
// rows, so that the first chunks are about as large as a fixed share's blocks and the last ones small
// enough to even the threads out at the slice's end. The barriers around the slice publish its rows.
bool next_rows(RowDealer* dealer, int64_t slice, int64_t M, int64_t mr, int64_t most, int nthreads, int64_t* begin,
               int64_t* end) {
  return dealer->slices[size_t(slice)].take(M, mr, 4, most, nthreads, begin, end);
}

namespace {

std::atomic<bool> swap_operands{true};
std::atomic<bool> deal_rows{true};

// The five loops on one problem, its packing buffers from this thread's scratch. On more than one
// thread the rows of C are dealt out slice by slice (next_rows), one counter per slice of the sum.
template <class T>
void run_problem(const Path<T>& path, const Problem<T>& p, int threads) {
  const WorkspaceShape shape = workspace_shape(path.blocking, p.M, p.N, p.K, threads);
  const GemmBlocking& bs = path.blocking;
  RowDealer dealer;
  const bool dealt = threads > 1 && deal_rows.load(std::memory_order_relaxed);
  if (dealt) dealer.slices.reset(new detail::Dealer[size_t((p.N + bs.nc - 1) / bs.nc * ((p.K + bs.kc - 1) / bs.kc))]);
  const Workspace<T> ws = carve(static_cast<T*>(scratch.get(size_t(shape.total(threads)) * sizeof(T))), shape,
                                dealt ? &dealer : nullptr);
  // noexcept: the threads meet at barriers, where a share that threw would leave the others waiting
  // for ever (the team passes other jobs' exceptions to the caller); nothing here allocates or throws.
  run_on_threads(threads, [&](int tid, int nthreads, Barrier* barrier) noexcept {
    path.run(p, path.blocking, ws, tid, nthreads, barrier);
  });
}

// A few rows against a large nn.Linear weight (a prefill of 128 tokens: M = 128 against N = 11008,
// K = 4096): packing op(B), the weight, would read and write all of it for M rows only, a tenth of
// the time. So the operands swap: C^T = W op(A)^T, the weight read where it lies as the left operand
// (its rows are row-major) and op(A)^T, M columns, packed instead; C^T then transposed into C, the
// epilogue applied in the segments the kernels apply it in (NR columns from 0). Each element is the
// same chain of fused multiply-adds over k in the same order (fma(a, b, c) = fma(b, a, c)), so C is
// the same bit for bit (tested). Taken for beta = 0 and lanes >= 8, with M from nr to 256 below N.
template <class T>
bool swap_pays(const Path<T>& path, bool trans_a, bool trans_b, int64_t M, int64_t N, T beta) {
  return swap_operands.load(std::memory_order_relaxed) && trans_b && !trans_a && beta == T(0) && path.lanes >= 8 &&
         M >= path.blocking.nr && M <= 256 && M < N;
}

template <class T>
void gemm_swapped(const Path<T>& path, int64_t M, int64_t N, int64_t K, T alpha, const T* A, int64_t lda, const T* B,
                  int64_t ldb, T* C, int64_t ldc, const GemmEpilogue<T>* ep, int threads) {
  // op(B) is B^T with B (N, K) row-major; C^T (N, M) = B (N, K) . A^T (K, M), A (M, K) row-major.
  std::unique_ptr<T[]> ct(new T[size_t(N * M)]);  // every element written by the product
  Problem<T> p = make_problem(false, true, N, M, K, alpha, B, ldb, A, lda, T(0), ct.get(), M,
                              static_cast<const GemmEpilogue<T>*>(nullptr));
  p.a_streams = true;
  run_problem(path, p, threads);
  const int64_t nr = path.blocking.nr;
  auto rows = [&](int64_t i0, int64_t i1) {
    for (int64_t i = i0; i < i1; ++i) {
      T* c = C + i * ldc;
      for (int64_t j = 0; j < N; ++j) c[j] = ct[size_t(j * M + i)];
      if (ep)
        for (int64_t j0 = 0; j0 < N; j0 += nr) apply_epilogue(*ep, c + j0, ldc, i, j0, 1, min64(nr, N - j0));
    }
  };
  if (threads <= 1) return rows(0, M);
  run_on_threads(threads, [&](int tid, int nthreads, Barrier*) {
    const int64_t per = (M + nthreads - 1) / nthreads;
    rows(min64(M, tid * per), min64(M, (tid + 1) * per));
  });
}

}  // namespace
}  // namespace gemm_impl

template <class T>
void gemm(bool trans_a, bool trans_b, int64_t M, int64_t N, int64_t K, T alpha, const T* A, int64_t lda, const T* B,
          int64_t ldb, T beta, T* C, int64_t ldc, const GemmEpilogue<T>* epilogue, int threads) {
  if (const Defect d = injected_defect(); low_precision(A, d))
    return gemm_low(trans_a, trans_b, M, N, K, alpha, A, lda, B, ldb, beta, C, ldc, epilogue, d);
  const Problem<T> p = make_problem(trans_a, trans_b, M, N, K, alpha, A, lda, B, ldb, beta, C, ldc, epilogue);
  if (M == 0 || N == 0) return;
  const Path<T>& path = path_for<T>(gemm_isa());
  if (K == 0 || alpha == T(0)) return scale_only(M, N, beta, C, ldc, epilogue);
  threads = threads < 1 || detail::in_team() ? 1 : threads;  // inside a team's share: this thread alone
  if (swap_pays(path, trans_a, trans_b, M, N, beta))
    return gemm_swapped(path, M, N, K, alpha, A, lda, B, ldb, C, ldc, epilogue, threads);
  run_problem(path, p, threads);
}

template <class T>
void gemm_strided_batched(int64_t batch, bool trans_a, bool trans_b, int64_t M, int64_t N, int64_t K, T alpha,
                          const T* A, int64_t lda, int64_t stride_a, const T* B, int64_t ldb, int64_t stride_b, T beta,
                          T* C, int64_t ldc, int64_t stride_c, const GemmEpilogue<T>* epilogue, int64_t stride_r,
                          int threads) {
  assert(batch >= 0);
  if (const Defect d = injected_defect(); low_precision(A, d)) {
    for (int64_t b = 0; b < batch; ++b) {
      GemmEpilogue<T> ep;
      if (epilogue) ep = *epilogue, ep.residual = ep.residual ? ep.residual + b * stride_r : nullptr;
      gemm_low(trans_a, trans_b, M, N, K, alpha, A + b * stride_a, lda, B + b * stride_b, ldb, beta, C + b * stride_c,
               ldc, epilogue ? &ep : nullptr, d);
    }
    return;
  }
  (void)make_problem(trans_a, trans_b, M, N, K, alpha, A, lda, B, ldb, beta, C, ldc, epilogue);
  if (batch == 0 || M == 0 || N == 0) return;
  const Path<T>& path = path_for<T>(gemm_isa());
  const bool no_kernel = K == 0 || alpha == T(0);
  threads = threads < 1 || detail::in_team() ? 1 : int(min64(threads, batch));
  // Each thread takes every nthreads-th matrix, serially, in its own workspace.
  const WorkspaceShape shape = workspace_shape(path.blocking, M, N, K, 1);
  T* const base = static_cast<T*>(scratch.get(size_t(shape.total(1) * threads) * sizeof(T)));
  run_on_threads(threads, [&](int tid, int nthreads, Barrier*) {
    const Workspace<T> ws = carve(base + tid * shape.total(1), shape);
    for (int64_t b = tid; b < batch; b += nthreads) {
      GemmEpilogue<T> ep;
      if (epilogue) {
        ep = *epilogue;
        if (ep.residual) ep.residual += b * stride_r;
      }
      T* Cb = C + b * stride_c;
      if (no_kernel) {
        scale_only(M, N, beta, Cb, ldc, epilogue ? &ep : nullptr);
        continue;
      }
      const Problem<T> p{trans_a, trans_b,          M,   N,    K,  alpha, A + b * stride_a,
                         lda,     B + b * stride_b, ldb, beta, Cb, ldc,   epilogue ? &ep : nullptr};
      path.run(p, path.blocking, ws, 0, 1, nullptr);
    }
  });
}

// --- for tests ---------------------------------------------------------------------------------------

namespace gemm_detail {

template <class T>
KernelInfo<T> kernel_info(GemmIsa isa) {
  if (!gemm_isa_available(isa)) throw std::invalid_argument(unavailable_message(isa));
  const Path<T>& path = path_for<T>(isa);
  return {path.blocking, path.lanes, path.kernel};
}

void set_operand_swap(bool on) { swap_operands.store(on, std::memory_order_relaxed); }
void set_row_dealing(bool on) { deal_rows.store(on, std::memory_order_relaxed); }

template <class T>
void reference_microkernel(int mr, int nr, int64_t kc, const T* A, int64_t rs_a, int64_t cs_a, const T* B, T* C,
                           int64_t ldc, int n, T alpha, T beta) {
  for (int i = 0; i < mr; ++i)
    for (int j = 0; j < n; ++j) {
      T acc = T(0);
      for (int64_t k = 0; k < kc; ++k) acc += A[i * rs_a + k * cs_a] * B[k * nr + j];
      T& c = C[i * ldc + j];
      c = beta == T(0) ? alpha * acc : alpha * acc + beta * c;
    }
}

}  // namespace gemm_detail

#define TPARITY_INSTANTIATE(T)                                                                                         \
  template void gemm<T>(bool, bool, int64_t, int64_t, int64_t, T, const T*, int64_t, const T*, int64_t, T, T*,         \
                        int64_t, const GemmEpilogue<T>*, int);                                                         \
  template void gemm_strided_batched<T>(int64_t, bool, bool, int64_t, int64_t, int64_t, T, const T*, int64_t, int64_t, \
                                        const T*, int64_t, int64_t, T, T*, int64_t, int64_t, const GemmEpilogue<T>*,   \
                                        int64_t, int);                                                                 \
  template gemm_detail::KernelInfo<T> gemm_detail::kernel_info<T>(GemmIsa);                                            \
  template void gemm_detail::reference_microkernel<T>(int, int, int64_t, const T*, int64_t, int64_t, const T*, T*,     \
                                                      int64_t, int, T, T);
TPARITY_INSTANTIATE(float)
TPARITY_INSTANTIATE(double)
#undef TPARITY_INSTANTIATE

}  // namespace tparity
