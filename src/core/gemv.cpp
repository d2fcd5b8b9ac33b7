// gemv_forward (llm.hpp): nn.Linear on a few rows, the weight streamed once per row without packing.
// Decoding one token is a matrix-vector product per projection, bound by reading the weights: the
// GEMM's packing would read them, write a copy and read that again. Each output is the dot product of
// a weight row with the input row, several weight rows at a time (rows_avx512), in SIMD partial sums
// (one per lane) added together at the end. AVX-512 or AVX2 as gemm_isa() says, compiled through target attributes
// (this file is built without -mavx512f: nothing here runs unless the CPU has the path).
#include <atomic>
#include <cstdint>
#include <stdexcept>
#include <string>

#include "tparity/core/gemm.hpp"
#include "tparity/core/gemv.hpp"
#include "tparity/core/llm.hpp"
#include "tparity/core/ops.hpp"

#if defined(__x86_64__) && defined(__GNUC__)
// GCC 12's _mm512_reduce_add_* use the header's own undefined values (GCC bug 105593): as in
// simd_avx512.hpp, the warning is about the header.
#pragma GCC diagnostic push
#pragma GCC diagnostic ignored "-Wuninitialized"
#if !defined(__clang__)
#pragma GCC diagnostic ignored "-Wmaybe-uninitialized"
#endif
#include <immintrin.h>
#pragma GCC diagnostic pop
#define TPARITY_GEMV_X86 1
#else
#define TPARITY_GEMV_X86 0
#endif

namespace tparity {

namespace {

std::atomic<int> rows_per_step{0};  // gemv_detail::set_rows_per_step's

#if TPARITY_GEMV_X86
// R weight rows at a time, each row's next cache lines asked for PF floats ahead (0: none). Each
// output is one chain of FMAs over k in 16 lanes, then the lanes' sum, whatever R: the same bits.
template <int R, int PF>
__attribute__((target("avx512f,fma"))) void rows_avx512_by(float* y, const float* W, const float* x, int64_t N,
                                                           int64_t K) {
  const int64_t full = K / 16 * 16;
  const __mmask16 tail = __mmask16((1u << (K - full)) - 1);
  int64_t n = 0;
  for (; n + R <= N; n += R) {
    const float* w = W + n * K;
    __m512 a[R];
#pragma GCC unroll 8
    for (int r = 0; r < R; ++r) a[r] = _mm512_setzero_ps();
    for (int64_t k = 0; k < full; k += 16) {
      const __m512 xv = _mm512_loadu_ps(x + k);
#pragma GCC unroll 8
      for (int r = 0; r < R; ++r) {
        if (PF && k + PF < K) _mm_prefetch(reinterpret_cast<const char*>(w + r * K + k + PF), _MM_HINT_T0);
        a[r] = _mm512_fmadd_ps(_mm512_loadu_ps(w + r * K + k), xv, a[r]);
      }
    }
    if (tail) {
      const __m512 xv = _mm512_maskz_loadu_ps(tail, x + full);
#pragma GCC unroll 8
      for (int r = 0; r < R; ++r) a[r] = _mm512_fmadd_ps(_mm512_maskz_loadu_ps(tail, w + r * K + full), xv, a[r]);
    }
#pragma GCC unroll 8
    for (int r = 0; r < R; ++r) y[n + r] = _mm512_reduce_add_ps(a[r]);
  }
  for (; n < N; ++n) {
    __m512 a = _mm512_setzero_ps();
    for (int64_t k = 0; k < full; k += 16)
      a = _mm512_fmadd_ps(_mm512_loadu_ps(W + n * K + k), _mm512_loadu_ps(x + k), a);
    if (tail)
      a = _mm512_fmadd_ps(_mm512_maskz_loadu_ps(tail, W + n * K + full), _mm512_maskz_loadu_ps(tail, x + full), a);
    y[n] = _mm512_reduce_add_ps(a);
  }
}

// Four rows at a time; on Intel eight, each prefetched 256 floats ahead: an 11008 x 4096 weight on an
// Emerald Rapids Xeon, alternating, three rounds: 12.6-12.8 GB/s median against 11.7-11.9. On Zen 4
// a prefetch 512 floats ahead was 11-30% slower (performance.md), so AMD keeps four rows without.
__attribute__((target("avx512f,fma"))) void rows_avx512(float* y, const float* W, const float* x, int64_t N,
                                                        int64_t K) {
  static const bool intel = __builtin_cpu_is("intel");
  const int forced = rows_per_step.load(std::memory_order_relaxed);
  if (forced == 8 || (forced == 0 && intel)) return rows_avx512_by<8, 256>(y, W, x, N, K);
  rows_avx512_by<4, 0>(y, W, x, N, K);
}

__attribute__((target("avx512f,fma"))) void rows_avx512(double* y, const double* W, const double* x, int64_t N,
                                                        int64_t K) {
  const int64_t full = K / 8 * 8;
  const __mmask8 tail = __mmask8((1u << (K - full)) - 1);
  for (int64_t n = 0; n < N; ++n) {
    __m512d a = _mm512_setzero_pd(), b = a;
    int64_t k = 0;
    for (; k + 16 <= full; k += 16) {
      a = _mm512_fmadd_pd(_mm512_loadu_pd(W + n * K + k), _mm512_loadu_pd(x + k), a);
      b = _mm512_fmadd_pd(_mm512_loadu_pd(W + n * K + k + 8), _mm512_loadu_pd(x + k + 8), b);
    }
    for (; k < full; k += 8) a = _mm512_fmadd_pd(_mm512_loadu_pd(W + n * K + k), _mm512_loadu_pd(x + k), a);
    if (tail)
      b = _mm512_fmadd_pd(_mm512_maskz_loadu_pd(tail, W + n * K + full), _mm512_maskz_loadu_pd(tail, x + full), b);
    y[n] = _mm512_reduce_add_pd(_mm512_add_pd(a, b));
  }
}

__attribute__((target("avx2,fma"))) float hsum(__m256 v) {
  __m128 s = _mm_add_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
  s = _mm_add_ps(s, _mm_movehl_ps(s, s));
  s = _mm_add_ss(s, _mm_shuffle_ps(s, s, 1));
  return _mm_cvtss_f32(s);
}

__attribute__((target("avx2,fma"))) void rows_avx2(float* y, const float* W, const float* x, int64_t N, int64_t K) {
  const int64_t full = K / 8 * 8;
  for (int64_t n = 0; n < N; ++n) {
    __m256 a = _mm256_setzero_ps(), b = a;
    int64_t k = 0;
    for (; k + 16 <= full; k += 16) {
      a = _mm256_fmadd_ps(_mm256_loadu_ps(W + n * K + k), _mm256_loadu_ps(x + k), a);
      b = _mm256_fmadd_ps(_mm256_loadu_ps(W + n * K + k + 8), _mm256_loadu_ps(x + k + 8), b);
    }
    for (; k < full; k += 8) a = _mm256_fmadd_ps(_mm256_loadu_ps(W + n * K + k), _mm256_loadu_ps(x + k), a);
    float s = hsum(_mm256_add_ps(a, b));
    float t = 0;
    for (k = full; k < K; ++k) t += W[n * K + k] * x[k];
    y[n] = s + t;
  }
}
#endif

template <class T>
void rows(T* y, const T* W, const T* x, int64_t N, int64_t K) {
#if TPARITY_GEMV_X86
  const GemmIsa isa = gemm_isa();
  if (isa == GemmIsa::Avx512) return rows_avx512(y, W, x, N, K);
  if constexpr (std::is_same_v<T, float>)
    if (isa == GemmIsa::Avx2) return rows_avx2(y, W, x, N, K);
#endif
  for (int64_t n = 0; n < N; ++n) y[n] = dot(W + n * K, x, K);
}

}  // namespace

template <class T>
void gemv_forward(T* out, const T* inp, const T* weight, const T* bias, int64_t N, int64_t C, int64_t OC) {
  // inp is (N, C), weight is (OC, C), bias is (OC) or null; out will be (N, OC)
  for (int64_t n = 0; n < N; ++n) {
    rows(out + n * OC, weight, inp + n * C, OC, C);
    if (bias)
      for (int64_t o = 0; o < OC; ++o) out[n * OC + o] += bias[o];
  }
}

namespace gemv_detail {

void set_rows_per_step(int rows) {
  if (rows != 0 && rows != 4 && rows != 8)
    throw std::invalid_argument("gemv set_rows_per_step: expected 0, 4 or 8, got " + std::to_string(rows));
  rows_per_step.store(rows, std::memory_order_relaxed);
}

}  // namespace gemv_detail

template void gemv_forward<float>(float*, const float*, const float*, const float*, int64_t, int64_t, int64_t);
template void gemv_forward<double>(double*, const double*, const double*, const double*, int64_t, int64_t, int64_t);

}  // namespace tparity
