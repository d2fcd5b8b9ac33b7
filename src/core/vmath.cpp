// vmath's front: the path (the GEMM's, gemm_isa()) and the threads. The algorithms are in
// vmath_simd.hpp, instantiated by vmath_kernels_<isa>.cpp.
#include "tparity/core/vmath.hpp"

#include <algorithm>
#include <cassert>
#include <vector>

#include "tparity/core/gemm.hpp"
#include "tparity/core/parallel.hpp"
#include "vmath_kernels.hpp"

#if defined(__x86_64__) && defined(__GNUC__)
#define TPARITY_VMATH_X86 1
#else
#define TPARITY_VMATH_X86 0
#endif

namespace tparity {
namespace vmath_impl {
namespace {

template <class T>
VmathKernels<T> make_kernels(GemmIsa isa) {
  switch (isa) {
#if TPARITY_VMATH_X86
    case GemmIsa::Avx512:
      return avx512_kernels<T>();
    case GemmIsa::Avx2:
      return avx2_kernels<T>();
#endif
    default:
      return scalar_kernels<T>();
  }
}

// A given path's kernels, the path available (the scalar one always is). Each path's entry points
// are fetched the first time it is used: an AVX file's code runs only after that check.
template <class T>
const VmathKernels<T>& kernels_for(GemmIsa isa) {
  switch (isa) {
    case GemmIsa::Avx512: {
      static const VmathKernels<T> k = make_kernels<T>(GemmIsa::Avx512);
      return k;
    }
    case GemmIsa::Avx2: {
      static const VmathKernels<T> k = make_kernels<T>(GemmIsa::Avx2);
      return k;
    }
    default: {
      static const VmathKernels<T> k = make_kernels<T>(GemmIsa::Scalar);
      return k;
    }
  }
}

// The kernels of the path in use; gemm_isa() has checked that the CPU has it (or thrown).
template <class T>
const VmathKernels<T>& kernels() {
  return kernels_for<T>(gemm_isa());
}

}  // namespace
}  // namespace vmath_impl

template <class T>
void exp_forward(T* out, const T* in, int64_t n) {
  assert(n >= 0);
  if (n > 0) vmath_impl::kernels<T>().exp(out, in, n);
}

template <class T>
void softmax_rows(T* out, const T* in, int64_t rows, int64_t cols, int threads) {
  // in is (rows, cols); out will be (rows, cols)
  assert(rows >= 0 && cols >= 0);
  if (rows == 0 || cols == 0) return;
  const auto softmax = vmath_impl::kernels<T>().softmax;
  if (threads <= 1 || rows == 1) return softmax(out, in, rows, cols);
  parallel_for(rows, threads, [&](int64_t r0, int64_t r1) { softmax(out + r0 * cols, in + r0 * cols, r1 - r0, cols); });
}

template <class T>
void layernorm_rows(T* out, const T* in, const T* weight, const T* bias, T eps, int64_t rows, int64_t cols, T* mean_out,
                    T* rstd_out, int threads) {
  // in is (rows, cols); out will be (rows, cols); mean_out, rstd_out (rows) when not null
  assert(rows >= 0 && cols >= 0);
  if (rows == 0 || cols == 0) return;
  const vmath_impl::VmathKernels<T>& path = vmath_impl::kernels<T>();
  const vmath_impl::VmathKernels<T>& one = vmath_impl::kernels_for<T>(GemmIsa::Scalar);
  const int64_t W = path.width;
  // [r0, r1): whole blocks of W rows on the path, the rest a row at a time on the scalar lanes (the
  // same sums, lane for lane)
  auto run = [&](int64_t r0, int64_t r1) {
    std::vector<T> xt(size_t(cols * W));
    const int64_t full = r0 + (r1 - r0) / W * W;
    auto at = [&](T* p, int64_t r) { return p ? p + r : nullptr; };
    if (full > r0)
      path.layernorm(out + r0 * cols, in + r0 * cols, weight, bias, eps, full - r0, cols, at(mean_out, r0),
                     at(rstd_out, r0), xt.data());
    if (r1 > full)
      one.layernorm(out + full * cols, in + full * cols, weight, bias, eps, r1 - full, cols, at(mean_out, full),
                    at(rstd_out, full), xt.data());
  };
  const int64_t blocks = (rows + W - 1) / W;
  if (threads <= 1 || blocks == 1) return run(0, rows);
  // whole blocks of W rows to each thread
  parallel_for(blocks, threads, [&](int64_t b0, int64_t b1) { run(b0 * W, std::min(rows, b1 * W)); });
}

#define TPARITY_INSTANTIATE(T)                                        \
  template void exp_forward<T>(T*, const T*, int64_t);                \
  template void softmax_rows<T>(T*, const T*, int64_t, int64_t, int); \
  template void layernorm_rows<T>(T*, const T*, const T*, const T*, T, int64_t, int64_t, T*, T*, int);
TPARITY_INSTANTIATE(float)
TPARITY_INSTANTIATE(double)
#undef TPARITY_INSTANTIATE

}  // namespace tparity
