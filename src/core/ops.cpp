#include "tparity/core/ops.hpp"

#include <algorithm>
#include <cmath>
#include <limits>

namespace tparity {

template <class T>
T dot(const T* a, const T* b, int64_t n) {
  T acc[8] = {};
  int64_t i = 0;
  for (; i + 8 <= n; i += 8)
    for (int j = 0; j < 8; ++j) acc[j] += a[i + j] * b[i + j];
  for (int j = 0; i < n; ++i, ++j) acc[j] += a[i] * b[i];
  return ((acc[0] + acc[1]) + (acc[2] + acc[3])) + ((acc[4] + acc[5]) + (acc[6] + acc[7]));
}

template <class T>
T sum(const T* x, int64_t n) {
  T acc[8] = {};
  int64_t i = 0;
  for (; i + 8 <= n; i += 8)
    for (int j = 0; j < 8; ++j) acc[j] += x[i + j];
  for (int j = 0; i < n; ++i, ++j) acc[j] += x[i];
  return ((acc[0] + acc[1]) + (acc[2] + acc[3])) + ((acc[4] + acc[5]) + (acc[6] + acc[7]));
}

template <class T>
void linear_forward(T* out, const T* inp, const T* weight, const T* bias, int64_t N, int64_t C, int64_t OC) {
  // inp is (N, C), weight is (OC, C), bias is (OC)
  // out will be (N, OC)
  for (int64_t n = 0; n < N; ++n) {
    const T* x = inp + n * C;
    T* y = out + n * OC;
    for (int64_t o = 0; o < OC; ++o) {
      T acc = dot(x, weight + o * C, C);
      y[o] = bias ? acc + bias[o] : acc;
    }
  }
}

template <class T>
void softmax_forward(T* out, const T* inp, int64_t N, int64_t C) {
  // inp is (N, C); out will be (N, C)
  for (int64_t n = 0; n < N; ++n) {
    const T* x = inp + n * C;
    T* y = out + n * C;
    T maxval = -std::numeric_limits<T>::infinity();
    for (int64_t c = 0; c < C; ++c) maxval = std::max(maxval, x[c]);
    // NaN entries: std::max keeps maxval, exp(NaN - max) stays NaN and poisons the row, as in torch.
    for (int64_t c = 0; c < C; ++c) y[c] = std::exp(x[c] - maxval);
    const T total = sum(y, C);
    for (int64_t c = 0; c < C; ++c) y[c] = y[c] / total;
  }
}

template <class T>
void layernorm_forward(T* out, const T* inp, const T* weight, const T* bias, T eps, int64_t N, int64_t C) {
  // inp is (N, C), weight and bias are (C)
  // out will be (N, C)
  // Two passes (mean, then the mean of squared deviations): no cancellation between E[x^2] and
  // E[x]^2, so a row of tiny variance keeps its digits.
  for (int64_t n = 0; n < N; ++n) {
    const T* x = inp + n * C;
    T* y = out + n * C;
    const T mean = sum(x, C) / T(C);
    T acc[8] = {};
    for (int64_t c = 0; c < C; ++c) {
      const T d = x[c] - mean;
      acc[c & 7] += d * d;
    }
    const T var = (((acc[0] + acc[1]) + (acc[2] + acc[3])) + ((acc[4] + acc[5]) + (acc[6] + acc[7]))) / T(C);
    const T rstd = T(1) / std::sqrt(var + eps);
    for (int64_t c = 0; c < C; ++c) {
      T v = (x[c] - mean) * rstd;
      if (weight) v = v * weight[c];
      if (bias) v = v + bias[c];
      y[c] = v;
    }
  }
}

template <class T>
void relu_forward(T* out, const T* inp, int64_t n) {
  // NaN stays NaN (torch.relu propagates it); -0 becomes +0 like torch's clamp_min(0).
  for (int64_t i = 0; i < n; ++i) out[i] = std::isnan(inp[i]) ? inp[i] : (inp[i] > T(0) ? inp[i] : T(0));
}

template <class T>
void gelu_forward(T* out, const T* inp, int64_t n) {
  const T inv_sqrt2 = T(0.70710678118654752440);
  for (int64_t i = 0; i < n; ++i) {
    const T x = inp[i];
    out[i] = x * T(0.5) * (T(1) + std::erf(x * inv_sqrt2));
  }
}

template <class T>
void add_forward(T* out, const T* a, const T* b, int64_t n) {
  for (int64_t i = 0; i < n; ++i) out[i] = a[i] + b[i];
}

#define TPARITY_INSTANTIATE(T)                                                                  \
  template T dot<T>(const T*, const T*, int64_t);                                               \
  template T sum<T>(const T*, int64_t);                                                         \
  template void linear_forward<T>(T*, const T*, const T*, const T*, int64_t, int64_t, int64_t); \
  template void softmax_forward<T>(T*, const T*, int64_t, int64_t);                             \
  template void layernorm_forward<T>(T*, const T*, const T*, const T*, T, int64_t, int64_t);    \
  template void relu_forward<T>(T*, const T*, int64_t);                                         \
  template void gelu_forward<T>(T*, const T*, int64_t);                                         \
  template void add_forward<T>(T*, const T*, const T*, int64_t);
TPARITY_INSTANTIATE(float)
TPARITY_INSTANTIATE(double)
#undef TPARITY_INSTANTIATE

}  // namespace tparity
