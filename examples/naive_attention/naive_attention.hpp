// The user's own code: a naive multi-head self-attention written the way the seeds' numpy code
// does it (X W^T, split into heads, softmax(Q K^T / sqrt(d) + M), times V, concatenate, W_out),
// with torch's weight layout. It knows nothing about tparity.
#pragma once

#include <cmath>
#include <cstdint>
#include <limits>
#include <vector>

namespace naive {

// x (B, T, E) row-major; w_qkv (3E, E) = in_proj_weight; b_qkv (3E) or empty; w_out (E, E);
// b_out (E) or empty; mask (T, T) additive or empty. Returns (B, T, E); fills the head-averaged
// weights (B, T, T) and, when asked, the intermediates.
template <class T>
struct Intermediates {
  std::vector<T> q, k, v;          // (B, H, T, D)
  std::vector<T> scores, weights;  // (B, H, T, T)
  std::vector<T> context;          // (B, T, E)
};

template <class T>
std::vector<T> self_attention(const std::vector<T>& x, int64_t B, int64_t Tn, int64_t E, int64_t H,
                              const std::vector<T>& w_qkv, const std::vector<T>& b_qkv, const std::vector<T>& w_out,
                              const std::vector<T>& b_out, const std::vector<T>& mask, std::vector<T>& avg_weights,
                              Intermediates<T>* keep = nullptr, bool wrong_scale = false) {
  const int64_t D = E / H;
  // Q, K, V = split(X W_qkv^T + b, 3) then (B, T, E) -> (B, H, T, D)
  std::vector<T> q(size_t(B * H * Tn * D)), k(q.size()), v(q.size());
  for (int64_t b = 0; b < B; ++b)
    for (int64_t t = 0; t < Tn; ++t)
      for (int64_t o = 0; o < 3 * E; ++o) {
        T acc = b_qkv.empty() ? T(0) : b_qkv[size_t(o)];
        for (int64_t c = 0; c < E; ++c) acc += x[size_t((b * Tn + t) * E + c)] * w_qkv[size_t(o * E + c)];
        const int64_t part = o / E, h = (o % E) / D, d = o % D;
        std::vector<T>& dst = part == 0 ? q : part == 1 ? k : v;
        dst[size_t(((b * H + h) * Tn + t) * D + d)] = acc;
      }
  // A = softmax(Q K^T / sqrt(D) + M) per head
  const T scale = std::sqrt(T(wrong_scale ? E : D));
  std::vector<T> scores(size_t(B * H * Tn * Tn)), weights(scores.size());
  for (int64_t bh = 0; bh < B * H; ++bh)
    for (int64_t i = 0; i < Tn; ++i) {
      T mx = -std::numeric_limits<T>::infinity();
      for (int64_t j = 0; j < Tn; ++j) {
        T s = 0;
        for (int64_t d = 0; d < D; ++d) s += q[size_t((bh * Tn + i) * D + d)] * k[size_t((bh * Tn + j) * D + d)];
        s = s / scale + (mask.empty() ? T(0) : mask[size_t(i * Tn + j)]);
        scores[size_t((bh * Tn + i) * Tn + j)] = s;
        mx = std::max(mx, s);
      }
      T sum = 0;
      for (int64_t j = 0; j < Tn; ++j)
        sum += weights[size_t((bh * Tn + i) * Tn + j)] = std::exp(scores[size_t((bh * Tn + i) * Tn + j)] - mx);
      for (int64_t j = 0; j < Tn; ++j) weights[size_t((bh * Tn + i) * Tn + j)] /= sum;
    }
  // context = concat_h(A V), Y = context W_out^T + b_out; weights averaged over heads
  std::vector<T> context(size_t(B * Tn * E), T(0)), y(context.size());
  avg_weights.assign(size_t(B * Tn * Tn), T(0));
  for (int64_t b = 0; b < B; ++b)
    for (int64_t h = 0; h < H; ++h)
      for (int64_t i = 0; i < Tn; ++i)
        for (int64_t j = 0; j < Tn; ++j) {
          const T a = weights[size_t(((b * H + h) * Tn + i) * Tn + j)];
          avg_weights[size_t((b * Tn + i) * Tn + j)] += a / T(H);
          for (int64_t d = 0; d < D; ++d)
            context[size_t((b * Tn + i) * E + h * D + d)] += a * v[size_t(((b * H + h) * Tn + j) * D + d)];
        }
  for (int64_t r = 0; r < B * Tn; ++r)
    for (int64_t o = 0; o < E; ++o) {
      T acc = b_out.empty() ? T(0) : b_out[size_t(o)];
      for (int64_t c = 0; c < E; ++c) acc += context[size_t(r * E + c)] * w_out[size_t(o * E + c)];
      y[size_t(r * E + o)] = acc;
    }
  if (keep) *keep = Intermediates<T>{q, k, v, scores, weights, context};
  return y;
}

}  // namespace naive
