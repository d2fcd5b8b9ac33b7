// The elementary ops of the handwritten core, one function each, llm.c style: outputs first, then
// inputs, then sizes. In the element type T (float or double): no BLAS, no torch, and every sum
// accumulates in T, so the float instantiation shows the error a float kernel really has.
// `out` may alias `inp` where an op says so.
//
// Two paths. The fast one (the default) runs products through the core's GEMM (gemm.hpp: packed,
// register-tiled, AVX-512 / AVX2 / scalar) and splits rows over num_threads() (parallel.hpp). The
// reference one is the plain loops the fast kernels are tested against: the *_ref functions, and the
// whole core when set_core_path(CorePath::Reference) or TPARITY_CORE_PATH=reference.
#pragma once

#include <cstdint>

#include "tparity/core/tensor.hpp"

namespace tparity {

// The activations a module chooses by name: torch's TransformerEncoderLayer takes relu or gelu;
// seed 004's ViT head (get_activation) takes relu, tanh, sigmoid, silu, softplus and leakyrelu.
enum class Activation { Relu, Gelu, Tanh, Sigmoid, Silu, Softplus, LeakyRelu };

enum class CorePath { Fast, Reference };
CorePath core_path();
void set_core_path(CorePath path);

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
// Fast: gemm(x, W^T) with the bias added to each finished tile. Reference: one dot() per output.
template <class T>
void linear_forward(T* out, const T* inp, const T* weight, const T* bias, int64_t N, int64_t C, int64_t OC);
template <class T>
void linear_forward_ref(T* out, const T* inp, const T* weight, const T* bias, int64_t N, int64_t C, int64_t OC);

// activation(linear(inp)): the same as linear_forward then activation_forward, bit for bit; the fast
// path applies ReLU and GELU to each finished GEMM tile while it is in cache.
template <class T>
void linear_act_forward(T* out, const T* inp, const T* weight, const T* bias, int64_t N, int64_t C, int64_t OC,
                        Activation act);

// mirrors torch.softmax(x, dim=-1): max-subtracted, rows of length C.
// inp is (N, C); out will be (N, C); out may alias inp.
// A row whose entries are all -inf gives NaN, as torch does (exp(-inf - -inf) = exp(NaN)).
// Fast: vmath's softmax_rows (SIMD exp, rows over the threads). Reference (softmax_forward_ref):
// std::exp, the sum in dot()'s eight partial sums. Both divide by the sum; neither multiplies.
template <class T>
void softmax_forward(T* out, const T* inp, int64_t N, int64_t C);
template <class T>
void softmax_forward_ref(T* out, const T* inp, int64_t N, int64_t C);

// mirrors torch.nn.functional.layer_norm over the last axis: biased variance, eps inside the root.
// inp is (N, C), weight and bias are (C) or null (no affine)
// out will be (N, C); out may alias inp
// mean_out and rstd_out, when not null, will be (N): each row's mean and 1 / sqrt(var + eps), the
// statistics torch.native_layer_norm returns beside the output.
// out may alias inp (each row's statistics are taken before any of its outputs is written).
// Fast: vmath's layernorm_rows (rows along the SIMD lanes, the same sums bit for bit). Reference
// (layernorm_forward_ref): the plain loops, a row at a time.
template <class T>
void layernorm_forward(T* out, const T* inp, const T* weight, const T* bias, T eps, int64_t N, int64_t C,
                       T* mean_out = nullptr, T* rstd_out = nullptr);
template <class T>
void layernorm_forward_ref(T* out, const T* inp, const T* weight, const T* bias, T eps, int64_t N, int64_t C,
                           T* mean_out = nullptr, T* rstd_out = nullptr);

// mirrors torch.relu. out may alias inp.
template <class T>
void relu_forward(T* out, const T* inp, int64_t n);

// mirrors torch.nn.functional.gelu(approximate='none'): x * 0.5 * (1 + erf(x / sqrt(2))).
// out may alias inp.
template <class T>
void gelu_forward(T* out, const T* inp, int64_t n);

// mirrors torch.tanh. out may alias inp.
template <class T>
void tanh_forward(T* out, const T* inp, int64_t n);

// mirrors torch.sigmoid: 1 / (1 + exp(-x)). out may alias inp.
template <class T>
void sigmoid_forward(T* out, const T* inp, int64_t n);

// mirrors torch.nn.functional.silu: x / (1 + exp(-x)) (torch's kernel divides; x * sigmoid(x) rounds
// once more). out may alias inp.
template <class T>
void silu_forward(T* out, const T* inp, int64_t n);

// mirrors torch.nn.functional.softplus(x, beta, threshold): x where x * beta > threshold (strictly),
// else log1p(exp(x * beta)) / beta. nn.Softplus defaults: beta 1, threshold 20. out may alias inp.
template <class T>
void softplus_forward(T* out, const T* inp, int64_t n, T beta = T(1), T threshold = T(20));

// mirrors torch.nn.functional.leaky_relu(x, negative_slope): x > 0 ? x : x * negative_slope.
// nn.LeakyReLU's default slope is 0.01. out may alias inp.
template <class T>
void leaky_relu_forward(T* out, const T* inp, int64_t n, T negative_slope = T(0.01));

// The activation chosen by name, with nn's default options (softplus beta 1 threshold 20, leakyrelu
// 0.01, gelu exact). out may alias inp.
template <class T>
void activation_forward(Activation act, T* out, const T* inp, int64_t n);

// out = a + b elementwise (residual connections). out may alias a or b.
template <class T>
void add_forward(T* out, const T* a, const T* b, int64_t n);

// mirrors torch.nn.functional.embedding(ids, weight): row ids[n] of the table.
// ids is (N) with every id in [0, V) (the caller checks: an id outside is a precondition breach),
// weight is (V, C); out will be (N, C)
template <class T>
void embedding_forward(T* out, const int64_t* ids, const T* weight, int64_t N, int64_t V, int64_t C);

// Seed 004's sinusoidal table P (its PositionalEncoding's buffer, first T rows), computed in T the
// way the seed's torch code does: angle[i, j] = i / 10000^(2j / C) (arange(T) / pow(10000,
// arange(0, C, 2) / C)), P[i, 2j] = sin(angle), P[i, 2j + 1] = cos(angle). C must be even. (The
// seed's table stops at max_tokens = 1000 rows; this one has as many as asked for.)
// P will be (T, C)
template <class T>
void positional_encoding_table(T* P, int64_t Tn, int64_t C);

// mirrors seed 004's PositionalEncoding.forward: X + P[:, :T, :].
// inp is (B, T, C), C even; out will be (B, T, C); out may alias inp
template <class T>
void positional_encoding_forward(T* out, const T* inp, int64_t B, int64_t Tn, int64_t C);

// mirrors torch.nn.functional.batch_norm(x, running_mean, running_var, weight, bias, training=False,
// eps) on (N, C), in the order torch's CPU kernel (batch_norm_cpu_collect_linear_and_constant_terms)
// rounds: invstd = 1 / sqrt(var + eps), alpha = invstd * weight, beta = bias - mean * alpha,
// out = x * alpha + beta.
// inp is (N, C); mean, var are (C); weight, bias are (C) or null (1 and 0)
// out will be (N, C); out may alias inp
template <class T>
void batchnorm_eval_forward(T* out, const T* inp, const T* mean, const T* var, const T* weight, const T* bias, T eps,
                            int64_t N, int64_t C);

// The shape of torch.matmul(input, other), numpy-style: a 1-D input is a row (its dim dropped from
// the result), a 1-D other a column (likewise); the dims before the last two broadcast (aligned from
// the right; a 1 stretches). Throws ShapeError naming input and other when the inner sizes differ,
// a batch dim does not broadcast, or an operand has no dims.
Shape matmul_shape(const Shape& input, const Shape& other);

// mirrors torch.matmul(input, other) with batch broadcasting (see matmul_shape).
// input is (..., M, K) (or (K)), other is (..., K, N) (or (K)); out will be matmul_shape(...).
// Every output element is dot() over K. out must not alias input or other.
template <class T>
void matmul_forward(T* out, const T* input, const T* other, const Shape& input_shape, const Shape& other_shape);

}  // namespace tparity
