#include "tparity/core/ops.hpp"

#include <algorithm>
#include <atomic>
#include <cassert>
#include <cmath>
#include <type_traits>
#include <cstdlib>
#include <limits>
#include <string>
#include <vector>

#include "tparity/core/defects.hpp"
#include "tparity/core/gemm.hpp"
#include "tparity/core/parallel.hpp"
#include "tparity/core/vmath.hpp"

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

namespace {

CorePath initial_path() {
  const char* env = std::getenv("TPARITY_CORE_PATH");
  return env && std::string(env) == "reference" ? CorePath::Reference : CorePath::Fast;
}

std::atomic<CorePath> g_path{initial_path()};

// The threads a row-wise op over N rows shares: the core's, when there is enough work to share.
int row_threads(int64_t N, int64_t cost_per_row) { return N * cost_per_row < (int64_t(1) << 15) ? 1 : num_threads(); }

// Rows [0, N) of a row-wise op over row_threads() threads.
template <class F>
void rows(int64_t N, int64_t cost_per_row, const F& f) {
  const int threads = row_threads(N, cost_per_row);
  if (threads <= 1) return f(int64_t(0), N);
  parallel_for(N, threads, f);
}

}  // namespace

CorePath core_path() { return g_path.load(std::memory_order_relaxed); }
void set_core_path(CorePath path) { g_path.store(path, std::memory_order_relaxed); }

template <class T>
void linear_forward(T* out, const T* inp, const T* weight, const T* bias, int64_t N, int64_t C, int64_t OC) {
  // inp is (N, C), weight is (OC, C), bias is (OC)
  // out will be (N, OC)
  if (injected_defect() == Defect::DropBias) bias = nullptr;
  if (core_path() == CorePath::Reference) return linear_forward_ref(out, inp, weight, bias, N, C, OC);
  GemmEpilogue<T> ep;
  ep.bias = bias;
  gemm(false, true, N, OC, C, T(1), inp, C, weight, C, T(0), out, OC, bias ? &ep : nullptr, num_threads());
}

template <class T>
void linear_act_forward(T* out, const T* inp, const T* weight, const T* bias, int64_t N, int64_t C, int64_t OC,
                        Activation act) {
  if (injected_defect() == Defect::DropBias) bias = nullptr;
  if (core_path() == CorePath::Fast && (act == Activation::Relu || act == Activation::Gelu)) {
    GemmEpilogue<T> ep;
    ep.bias = bias;
    if (act == Activation::Relu)
      ep.relu = true;  // relu_forward's, in the micro-kernel's registers on whole tiles
    else
      ep.activation = &gelu_forward<T>;
    return gemm(false, true, N, OC, C, T(1), inp, C, weight, C, T(0), out, OC, &ep, num_threads());
  }
  linear_forward(out, inp, weight, bias, N, C, OC);
  activation_forward(act, out, out, N * OC);
}

template <class T>
void linear_forward_ref(T* out, const T* inp, const T* weight, const T* bias, int64_t N, int64_t C, int64_t OC) {
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
  if (std::is_same_v<T, float> && injected_defect() == Defect::SoftmaxNoMax) {  // the selftest's numeric defect
    for (int64_t n = 0; n < N; ++n) {
      const T* x = inp + n * C;
      T* y = out + n * C;
      T total = T(0);
      for (int64_t c = 0; c < C; ++c) total += (y[c] = std::exp(x[c]));
      for (int64_t c = 0; c < C; ++c) y[c] = y[c] / total;
    }
    return;
  }
  if (core_path() == CorePath::Reference) return softmax_forward_ref(out, inp, N, C);
  softmax_rows(out, inp, N, C, row_threads(N, 8 * C));
}

template <class T>
void softmax_forward_ref(T* out, const T* inp, int64_t N, int64_t C) {
  // inp is (N, C); out will be (N, C)
  rows(N, 8 * C, [&](int64_t n0, int64_t n1) {
    for (int64_t n = n0; n < n1; ++n) {
      const T* x = inp + n * C;
      T* y = out + n * C;
      T maxval = -std::numeric_limits<T>::infinity();
      for (int64_t c = 0; c < C; ++c) maxval = std::max(maxval, x[c]);
      // NaN entries: std::max keeps maxval, exp(NaN - max) stays NaN and poisons the row, as in torch.
      for (int64_t c = 0; c < C; ++c) y[c] = std::exp(x[c] - maxval);
      const T total = sum(y, C);
      for (int64_t c = 0; c < C; ++c) y[c] = y[c] / total;
    }
  });
}

template <class T>
void layernorm_forward(T* out, const T* inp, const T* weight, const T* bias, T eps, int64_t N, int64_t C, T* mean_out,
                       T* rstd_out) {
  const Defect defect = injected_defect();
  if (std::is_same_v<T, float> && defect == Defect::NaiveVariance) {  // the selftest's numeric defect
    for (int64_t n = 0; n < N; ++n) {
      const T* x = inp + n * C;
      T* y = out + n * C;
      T s = T(0), s2 = T(0);
      for (int64_t c = 0; c < C; ++c) s += x[c], s2 += x[c] * x[c];
      const T mean = s / T(C), var = std::max(T(0), s2 / T(C) - mean * mean), rstd = T(1) / std::sqrt(var + eps);
      if (mean_out) mean_out[n] = mean;
      if (rstd_out) rstd_out[n] = rstd;
      for (int64_t c = 0; c < C; ++c) {
        T v = (x[c] - mean) * rstd;
        if (weight) v = v * weight[c];
        if (bias) v = v + bias[c];
        y[c] = v;
      }
    }
    return;
  }
  if (core_path() == CorePath::Reference || defect == Defect::LayerNormEps || defect == Defect::UnbiasedVariance)
    return layernorm_forward_ref(out, inp, weight, bias, eps, N, C, mean_out, rstd_out);
  layernorm_rows(out, inp, weight, bias, eps, N, C, mean_out, rstd_out, row_threads(N, 4 * C));
}

template <class T>
void layernorm_forward_ref(T* out, const T* inp, const T* weight, const T* bias, T eps, int64_t N, int64_t C,
                           T* mean_out, T* rstd_out) {
  // inp is (N, C), weight and bias are (C)
  // out will be (N, C)
  // The mean in two passes: a first estimate, then the mean of the deviations from it as a
  // correction. A row around a large offset (100 + N(0, 1)) loses an ulp of the offset in a plain
  // float sum; the correction recovers it, and the deviations are taken as (x - mean0) - mu without
  // ever rounding the refined mean (x - mean0 is exact when x is within a factor 2 of mean0).
  // Then the mean of squared deviations: no cancellation between E[x^2] and E[x]^2, so a row of tiny
  // variance keeps its digits.
  auto pairwise = [](const T* acc) {
    return ((acc[0] + acc[1]) + (acc[2] + acc[3])) + ((acc[4] + acc[5]) + (acc[6] + acc[7]));
  };
  // Element c goes to partial sum c % 8, in ascending c: written as whole blocks of eight and a tail
  // so that the compiler vectorises the blocks (one lane per partial sum), the same sums either way.
  const int64_t C8 = C & ~int64_t(7);
  const Defect defect = injected_defect();
  if (defect == Defect::LayerNormEps) eps = T(1e-6);
  const T var_divisor = defect == Defect::UnbiasedVariance ? T(C - 1) : T(C);
  rows(N, 4 * C, [&](int64_t n0, int64_t n1) {
    for (int64_t n = n0; n < n1; ++n) {
      const T* x = inp + n * C;
      T* y = out + n * C;
      const T mean0 = sum(x, C) / T(C);
      T acc[8] = {};
      for (int64_t c = 0; c < C8; c += 8)
        for (int j = 0; j < 8; ++j) acc[j] += x[c + j] - mean0;
      for (int64_t c = C8; c < C; ++c) acc[c - C8] += x[c] - mean0;
      const T mu = pairwise(acc) / T(C);
      for (T& a : acc) a = T(0);
      for (int64_t c = 0; c < C8; c += 8)
        for (int j = 0; j < 8; ++j) {
          const T d = (x[c + j] - mean0) - mu;
          acc[j] += d * d;
        }
      for (int64_t c = C8; c < C; ++c) {
        const T d = (x[c] - mean0) - mu;
        acc[c - C8] += d * d;
      }
      const T var = pairwise(acc) / var_divisor;
      const T rstd = T(1) / std::sqrt(var + eps);
      if (mean_out) mean_out[n] = mean0 + mu;
      if (rstd_out) rstd_out[n] = rstd;
      if (weight && bias)
        for (int64_t c = 0; c < C; ++c) y[c] = (((x[c] - mean0) - mu) * rstd) * weight[c] + bias[c];
      else
        for (int64_t c = 0; c < C; ++c) {
          T v = ((x[c] - mean0) - mu) * rstd;
          if (weight) v = v * weight[c];
          if (bias) v = v + bias[c];
          y[c] = v;
        }
    }
  });
}

template <class T>
void relu_forward(T* out, const T* inp, int64_t n) {
  // NaN stays NaN (torch.relu propagates it); -0 becomes +0 like torch's clamp_min(0).
  // x <= 0 is false for NaN and true for -0: one compare and a select, which vectorises.
  for (int64_t i = 0; i < n; ++i) out[i] = inp[i] <= T(0) ? T(0) : inp[i];
}

template <class T>
void gelu_forward(T* out, const T* inp, int64_t n) {
  if (injected_defect() == Defect::GeluTanh) {  // gelu(approximate='tanh'): the selftest's defect
    const T k = T(0.79788456080286535588);      // sqrt(2 / pi)
    for (int64_t i = 0; i < n; ++i) {
      const T x = inp[i];
      out[i] = T(0.5) * x * (T(1) + std::tanh(k * (x + T(0.044715) * x * x * x)));
    }
    return;
  }
  const T inv_sqrt2 = T(0.70710678118654752440);
  for (int64_t i = 0; i < n; ++i) {
    const T x = inp[i];
    out[i] = x * T(0.5) * (T(1) + std::erf(x * inv_sqrt2));
  }
}

template <class T>
void tanh_forward(T* out, const T* inp, int64_t n) {
  for (int64_t i = 0; i < n; ++i) out[i] = std::tanh(inp[i]);
}

template <class T>
void sigmoid_forward(T* out, const T* inp, int64_t n) {
  for (int64_t i = 0; i < n; ++i) out[i] = T(1) / (T(1) + std::exp(-inp[i]));
}

template <class T>
void silu_forward(T* out, const T* inp, int64_t n) {
  for (int64_t i = 0; i < n; ++i) out[i] = inp[i] / (T(1) + std::exp(-inp[i]));
}

template <class T>
void softplus_forward(T* out, const T* inp, int64_t n, T beta, T threshold) {
  for (int64_t i = 0; i < n; ++i) {
    const T x = inp[i];
    out[i] = x * beta > threshold ? x : std::log1p(std::exp(x * beta)) / beta;
  }
}

template <class T>
void leaky_relu_forward(T* out, const T* inp, int64_t n, T negative_slope) {
  for (int64_t i = 0; i < n; ++i) out[i] = inp[i] > T(0) ? inp[i] : inp[i] * negative_slope;
}

template <class T>
void activation_forward(Activation act, T* out, const T* inp, int64_t n) {
  switch (act) {
    case Activation::Relu:
      return relu_forward(out, inp, n);
    case Activation::Gelu:
      return gelu_forward(out, inp, n);
    case Activation::Tanh:
      return tanh_forward(out, inp, n);
    case Activation::Sigmoid:
      return sigmoid_forward(out, inp, n);
    case Activation::Silu:
      return silu_forward(out, inp, n);
    case Activation::Softplus:
      return softplus_forward(out, inp, n, T(1), T(20));
    case Activation::LeakyRelu:
      return leaky_relu_forward(out, inp, n, T(0.01));
  }
}

template <class T>
void add_forward(T* out, const T* a, const T* b, int64_t n) {
  for (int64_t i = 0; i < n; ++i) out[i] = a[i] + b[i];
}

template <class T>
void embedding_forward(T* out, const int64_t* ids, const T* weight, int64_t N, int64_t V, int64_t C) {
  // ids is (N), weight is (V, C); out will be (N, C)
  for (int64_t n = 0; n < N; ++n) {
    assert(ids[n] >= 0 && ids[n] < V);
    (void)V;
    const T* row = weight + ids[n] * C;
    std::copy(row, row + C, out + n * C);
  }
}

template <class T>
void positional_encoding_table(T* P, int64_t Tn, int64_t C) {
  // P will be (T, C); column pair (2j, 2j + 1) shares the angle i / 10000^(2j / C)
  assert(C % 2 == 0);
  for (int64_t j = 0; 2 * j < C; ++j) {
    const T inv_freq = std::pow(T(10000), T(2 * j) / T(C));
    for (int64_t i = 0; i < Tn; ++i) {
      const T angle = T(i) / inv_freq;
      P[i * C + 2 * j] = std::sin(angle);
      P[i * C + 2 * j + 1] = std::cos(angle);
    }
  }
}

template <class T>
void positional_encoding_forward(T* out, const T* inp, int64_t B, int64_t Tn, int64_t C) {
  // inp is (B, T, C); out will be (B, T, C)
  std::vector<T> P(size_t(Tn * C));
  positional_encoding_table(P.data(), Tn, C);
  for (int64_t b = 0; b < B; ++b) add_forward(out + b * Tn * C, inp + b * Tn * C, P.data(), Tn * C);
}

template <class T>
void batchnorm_eval_forward(T* out, const T* inp, const T* mean, const T* var, const T* weight, const T* bias, T eps,
                            int64_t N, int64_t C) {
  // inp is (N, C), mean, var, weight, bias are (C); out will be (N, C)
  std::vector<T> alpha(static_cast<size_t>(C)), beta(static_cast<size_t>(C));
  for (int64_t c = 0; c < C; ++c) {
    const T invstd = T(1) / std::sqrt(var[c] + eps);
    alpha[size_t(c)] = invstd * (weight ? weight[c] : T(1));
    beta[size_t(c)] = (bias ? bias[c] : T(0)) - mean[c] * alpha[size_t(c)];
  }
  for (int64_t n = 0; n < N; ++n)
    for (int64_t c = 0; c < C; ++c) out[n * C + c] = inp[n * C + c] * alpha[size_t(c)] + beta[size_t(c)];
}

namespace {

// An operand of matmul as (batch..., rows, cols): a 1-D input is (1, K), a 1-D other (K, 1).
struct MatmulOperand {
  Shape batch;
  int64_t rows, cols;
};

MatmulOperand as_matrix(const Shape& s, bool is_input) {
  if (s.size() == 1) return is_input ? MatmulOperand{{}, 1, s[0]} : MatmulOperand{{}, s[0], 1};
  return {Shape(s.begin(), s.end() - 2), s[s.size() - 2], s.back()};
}

// The broadcast of two batch shapes, aligned from the right; false when they clash.
bool broadcast_batch(const Shape& a, const Shape& b, Shape& out) {
  const size_t R = std::max(a.size(), b.size());
  out.assign(R, 1);
  for (size_t i = 0; i < R; ++i) {
    const int64_t da = i < R - a.size() ? 1 : a[i - (R - a.size())];
    const int64_t db = i < R - b.size() ? 1 : b[i - (R - b.size())];
    if (da != db && da != 1 && db != 1) return false;
    out[i] = da == 1 ? db : da;
  }
  return true;
}

// Element offsets of each output batch entry into an operand whose batch dims broadcast to `out`.
std::vector<int64_t> batch_offsets(const Shape& operand, const Shape& out, int64_t matrix_size) {
  const size_t R = out.size(), lead = R - operand.size();
  std::vector<int64_t> stride(R, 0);
  int64_t s = matrix_size;
  for (size_t i = R; i-- > lead;) {
    stride[i] = operand[i - lead] == 1 ? 0 : s;
    s *= operand[i - lead];
  }
  std::vector<int64_t> offsets(size_t(numel(out)));
  std::vector<int64_t> idx(R, 0);
  for (size_t n = 0; n < offsets.size(); ++n) {
    int64_t off = 0;
    for (size_t i = 0; i < R; ++i) off += idx[i] * stride[i];
    offsets[n] = off;
    for (size_t i = R; i-- > 0;) {  // odometer, last dim fastest
      if (++idx[i] < out[i]) break;
      idx[i] = 0;
    }
  }
  return offsets;
}

}  // namespace

Shape matmul_shape(const Shape& input, const Shape& other) {
  if (input.empty() || other.empty())
    throw ShapeError("matmul: input " + to_string(input) + " and other " + to_string(other) +
                     ": both need at least 1 dim");
  const MatmulOperand a = as_matrix(input, true), b = as_matrix(other, false);
  if (a.cols != b.rows)
    throw ShapeError("matmul: input " + to_string(input) + " and other " + to_string(other) + ": input's last dim " +
                     std::to_string(a.cols) + " differs from other's " + (other.size() == 1 ? "size " : "rows ") +
                     std::to_string(b.rows));
  Shape out;
  if (!broadcast_batch(a.batch, b.batch, out))
    throw ShapeError("matmul: input " + to_string(input) + " and other " + to_string(other) + ": batch dims " +
                     to_string(a.batch) + " and " + to_string(b.batch) + " do not broadcast");
  if (input.size() > 1) out.push_back(a.rows);
  if (other.size() > 1) out.push_back(b.cols);
  return out;
}

template <class T>
void matmul_forward(T* out, const T* input, const T* other, const Shape& input_shape, const Shape& other_shape) {
  // input is (..., M, K), other is (..., K, N); out will be (broadcast(...), M, N)
  const MatmulOperand a = as_matrix(input_shape, true), b = as_matrix(other_shape, false);
  const int64_t M = a.rows, K = a.cols, N = b.cols;
  Shape batch;
  broadcast_batch(a.batch, b.batch, batch);
  const std::vector<int64_t> a_off = batch_offsets(a.batch, batch, M * K), b_off = batch_offsets(b.batch, batch, K * N);
  std::vector<T> bt(size_t(N * K));  // other's matrix transposed, so that each output element is a dot()
  for (size_t g = 0; g < a_off.size(); ++g) {
    const T* A = input + a_off[g];
    const T* B = other + b_off[g];
    for (int64_t k = 0; k < K; ++k)
      for (int64_t n = 0; n < N; ++n) bt[size_t(n * K + k)] = B[k * N + n];
    T* C = out + int64_t(g) * M * N;
    for (int64_t m = 0; m < M; ++m)
      for (int64_t n = 0; n < N; ++n) C[m * N + n] = dot(A + m * K, bt.data() + n * K, K);
  }
}

#define TPARITY_INSTANTIATE(T)                                                                                        \
  template T dot<T>(const T*, const T*, int64_t);                                                                     \
  template T sum<T>(const T*, int64_t);                                                                               \
  template void linear_forward<T>(T*, const T*, const T*, const T*, int64_t, int64_t, int64_t);                       \
  template void linear_forward_ref<T>(T*, const T*, const T*, const T*, int64_t, int64_t, int64_t);                   \
  template void linear_act_forward<T>(T*, const T*, const T*, const T*, int64_t, int64_t, int64_t, Activation);       \
  template void softmax_forward<T>(T*, const T*, int64_t, int64_t);                                                   \
  template void softmax_forward_ref<T>(T*, const T*, int64_t, int64_t);                                               \
  template void layernorm_forward<T>(T*, const T*, const T*, const T*, T, int64_t, int64_t, T*, T*);                  \
  template void layernorm_forward_ref<T>(T*, const T*, const T*, const T*, T, int64_t, int64_t, T*, T*);              \
  template void relu_forward<T>(T*, const T*, int64_t);                                                               \
  template void gelu_forward<T>(T*, const T*, int64_t);                                                               \
  template void add_forward<T>(T*, const T*, const T*, int64_t);                                                      \
  template void tanh_forward<T>(T*, const T*, int64_t);                                                               \
  template void sigmoid_forward<T>(T*, const T*, int64_t);                                                            \
  template void silu_forward<T>(T*, const T*, int64_t);                                                               \
  template void softplus_forward<T>(T*, const T*, int64_t, T, T);                                                     \
  template void leaky_relu_forward<T>(T*, const T*, int64_t, T);                                                      \
  template void activation_forward<T>(Activation, T*, const T*, int64_t);                                             \
  template void embedding_forward<T>(T*, const int64_t*, const T*, int64_t, int64_t, int64_t);                        \
  template void positional_encoding_table<T>(T*, int64_t, int64_t);                                                   \
  template void positional_encoding_forward<T>(T*, const T*, int64_t, int64_t, int64_t);                              \
  template void batchnorm_eval_forward<T>(T*, const T*, const T*, const T*, const T*, const T*, T, int64_t, int64_t); \
  template void matmul_forward<T>(T*, const T*, const T*, const Shape&, const Shape&);
TPARITY_INSTANTIATE(float)
TPARITY_INSTANTIATE(double)
#undef TPARITY_INSTANTIATE

}  // namespace tparity
