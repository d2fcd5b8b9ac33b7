// The elementary ops of the handwritten core, one function each, llm.c style: outputs first, then
// inputs, then sizes. Plain loops in the element type T (float or double): no BLAS, no torch, and
// every sum accumulates in T, so the float instantiation shows the error a float kernel really has.
// `out` may alias `inp` where an op says so.
#pragma once

#include <cstdint>

namespace tparity {

// Sum of a[i] * b[i], i < n, in T: eight interleaved partial sums combined pairwise (the order a
// vectorised kernel uses; its rounding error grows like n/8 rather than n).
template <class T>
T dot(const T* a, const T* b, int64_t n);

// Sum of x[i], i < n, in T, accumulated as dot() does.
template <class T>
T sum(const T* x, int64_t n);

// mirrors torch.nn.functional.linear: weight has torch's (out, in) layout.
// inp is (N, C), weight is (OC, C), bias is (OC) or null
// out will be (N, OC); out must not alias inp
template <class T>
void linear_forward(T* out, const T* inp, const T* weight, const T* bias, int64_t N, int64_t C, int64_t OC);

// mirrors torch.softmax(x, dim=-1): max-subtracted, rows of length C.
// inp is (N, C); out will be (N, C); out may alias inp.
// A row whose entries are all -inf gives NaN, as torch does (exp(-inf - -inf) = exp(NaN)).
template <class T>
void softmax_forward(T* out, const T* inp, int64_t N, int64_t C);

// mirrors torch.nn.functional.layer_norm over the last axis: biased variance, eps inside the root.
// inp is (N, C), weight and bias are (C) or null (no affine)
// out will be (N, C); out may alias inp
template <class T>
void layernorm_forward(T* out, const T* inp, const T* weight, const T* bias, T eps, int64_t N, int64_t C);

// mirrors torch.relu. out may alias inp.
template <class T>
void relu_forward(T* out, const T* inp, int64_t n);

// mirrors torch.nn.functional.gelu(approximate='none'): x * 0.5 * (1 + erf(x / sqrt(2))).
// out may alias inp.
template <class T>
void gelu_forward(T* out, const T* inp, int64_t n);

// out = a + b elementwise (residual connections). out may alias a or b.
template <class T>
void add_forward(T* out, const T* a, const T* b, int64_t n);

}  // namespace tparity
