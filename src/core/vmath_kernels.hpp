// What vmath's dispatcher (vmath.cpp) and its per-instruction-set files (vmath_kernels_<isa>.cpp)
// share: the entry points each file defines.
#pragma once

#include <cstdint>

namespace tparity::vmath_impl {

// One path's kernels, on the caller's thread. Contracts as exp_forward and softmax_rows (vmath.hpp).
template <class T>
struct VmathKernels {
  void (*exp)(T* out, const T* in, int64_t n);
  void (*softmax)(T* out, const T* in, int64_t rows, int64_t cols);
  // rows a multiple of width; xt scratch of cols x width
  void (*layernorm)(T* out, const T* in, const T* weight, const T* bias, T eps, int64_t rows, int64_t cols, T* mean_out,
                    T* rstd_out, T* xt);
  int width;
};

// Defined in vmath_kernels_scalar.cpp, vmath_kernels_avx2.cpp and vmath_kernels_avx512.cpp; the last
// two are compiled for their instruction set, so call them only once the CPU is known to have it.
template <class T>
VmathKernels<T> scalar_kernels();
template <class T>
VmathKernels<T> avx2_kernels();
template <class T>
VmathKernels<T> avx512_kernels();

}  // namespace tparity::vmath_impl
