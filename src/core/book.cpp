// The book's attention classes (core/book.hpp), in four steps on (B x H) groups: project, scores
// (QDotK, masked, divided), softmax, WeightedSumV; then the heads merged and out_proj.
#include "tparity/core/book.hpp"

#include <algorithm>
#include <cmath>
#include <limits>
#include <string>

#include "tparity/core/attention.hpp"
#include "tparity/core/defects.hpp"
#include "tparity/core/ops.hpp"

namespace tparity {

namespace {

std::string str(int64_t v) { return std::to_string(v); }

[[noreturn]] void shape_error(const std::string& tensor, const std::string& expected, const Shape& got) {
  throw ShapeError(tensor + ": expected " + expected + ", got " + to_string(got));
}

template <class T>
void check_shape(const Tensor<T>& t, const std::string& name, const Shape& want) {
  if (t.shape != want) shape_error(name, "shape " + to_string(want), t.shape);
}

// One projection of x (N, d_in) into out (N, D): SelfAttention_v1's x @ W with W (d_in, D) as the
// class holds it, the others' nn.Linear x @ W^T + b with W (D, d_in). W^T of v1 is an exact copy,
// so both run the same product.
template <class T>
void project(T* out, const BookConfig& c, const Tensor<T>& W, const Tensor<T>& b, const T* x, int64_t N, int64_t D) {
  if (c.cls == BookClass::SelfAttentionV1) {
    std::vector<T> wt(size_t(D * c.d_in));  // (D, d_in)
    for (int64_t i = 0; i < c.d_in; ++i)
      for (int64_t j = 0; j < D; ++j) wt[size_t(j * c.d_in + i)] = W.data[size_t(i * D + j)];
    linear_forward(out, x, wt.data(), static_cast<const T*>(nullptr), N, c.d_in, D);
  } else {
    linear_forward(out, x, W.ptr(), b.empty() ? nullptr : b.ptr(), N, c.d_in, D);
  }
}

// (B, T, H * D) -> (B, H, T, D): MultiHeadAttention's view(b, T, H, D).transpose(1, 2).
template <class T>
Tensor<T> split_heads(const std::vector<T>& x, int64_t B, int64_t Tn, int64_t H, int64_t D) {
  Tensor<T> out({B, H, Tn, D});
  for (int64_t b = 0; b < B; ++b)
    for (int64_t t = 0; t < Tn; ++t)
      for (int64_t h = 0; h < H; ++h)
        for (int64_t d = 0; d < D; ++d)
          out.data[size_t(((b * H + h) * Tn + t) * D + d)] = x[size_t(((b * Tn + t) * H + h) * D + d)];
  return out;
}

template <class T>
void check(const BookConfig& c, const BookWeights<T>& w, const Tensor<T>& x) {
  if (c.d_in <= 0 || c.d_out <= 0 || c.num_heads <= 0)
    throw ShapeError("config: d_in, d_out and num_heads must be positive, got d_in=" + str(c.d_in) +
                     ", d_out=" + str(c.d_out) + ", num_heads=" + str(c.num_heads));
  if (c.cls == BookClass::MultiHeadAttention && c.d_out % c.num_heads)
    throw ShapeError("config: d_out " + str(c.d_out) + " is not divisible by num_heads " + str(c.num_heads));
  const int64_t dims = c.batched() ? 3 : 2;
  if (x.dim() != dims || x.size(-1) != c.d_in)
    shape_error("x", c.batched() ? "(B, T, " + str(c.d_in) + ")" : "(T, " + str(c.d_in) + ")", x.shape);
  const int64_t Tn = x.size(-2);
  if (c.masked() && Tn > c.context_length)
    shape_error("x", "at most context_length = " + str(c.context_length) + " tokens (dim -2)", x.shape);
  const int64_t H = c.heads(), D = c.head_dim();
  const size_t sets = c.cls == BookClass::MultiHeadAttentionWrapper ? size_t(H) : 1;
  if (w.heads.size() != sets)
    throw ShapeError("state_dict: expected " + str(int64_t(sets)) + " set(s) of projections, got " +
                     str(int64_t(w.heads.size())));
  const int64_t P = c.cls == BookClass::MultiHeadAttention ? c.d_out : D;  // one projection's width
  for (size_t h = 0; h < sets; ++h) {
    const BookProjections<T>& p = w.heads[h];
    const std::string pre = c.cls == BookClass::MultiHeadAttentionWrapper ? "heads." + str(int64_t(h)) + "." : "";
    const bool v1 = c.cls == BookClass::SelfAttentionV1;
    const Shape ws = v1 ? Shape{c.d_in, P} : Shape{P, c.d_in};
    check_shape(p.w_query, pre + (v1 ? "W_query" : "W_query.weight"), ws);
    check_shape(p.w_key, pre + (v1 ? "W_key" : "W_key.weight"), ws);
    check_shape(p.w_value, pre + (v1 ? "W_value" : "W_value.weight"), ws);
    for (const auto* b : {&p.b_query, &p.b_key, &p.b_value})
      if (!b->empty()) check_shape(*b, pre + "W_*.bias", {P});
    if (c.masked()) check_shape(p.mask, pre + "mask", {c.context_length, c.context_length});
  }
  if (c.has_out_proj()) {
    const int64_t O = c.out_dim();
    check_shape(w.out_proj_weight, "out_proj.weight", {O, O});
    if (!w.out_proj_bias.empty()) check_shape(w.out_proj_bias, "out_proj.bias", {O});
  }
}

}  // namespace

template <class T>
Tensor<T> book_attention_forward(const BookConfig& c, const BookWeights<T>& w, const Tensor<T>& x, Observer<T>* obs) {
  check(c, w, x);
  const int64_t B = c.batched() ? x.size(0) : 1, Tn = x.size(-2), H = c.heads(), D = c.head_dim(), N = B * Tn;
  const bool wrapper = c.cls == BookClass::MultiHeadAttentionWrapper;

  // ---- q, k, v (B, H, T, D) ---------------------------------------------------------------------
  Tensor<T> q({B, H, Tn, D}), k({B, H, Tn, D}), v({B, H, Tn, D});
  {
    const int64_t P = wrapper ? D : H * D;  // one projection's width
    std::vector<T> pq(size_t(N * P)), pk(size_t(N * P)), pv(size_t(N * P));
    for (size_t s = 0; s < w.heads.size(); ++s) {
      const BookProjections<T>& p = w.heads[s];
      project(pq.data(), c, p.w_query, p.b_query, x.ptr(), N, P);
      project(pk.data(), c, p.w_key, p.b_key, x.ptr(), N, P);
      project(pv.data(), c, p.w_value, p.b_value, x.ptr(), N, P);
      if (wrapper) {  // head s of its own projection: (B, T, D) into q[:, s]
        for (int64_t b = 0; b < B; ++b) {
          const size_t to = size_t(((b * H + int64_t(s)) * Tn) * D), from = size_t(b * Tn * D);
          std::copy(pq.begin() + from, pq.begin() + from + size_t(Tn * D), q.data.begin() + to);
          std::copy(pk.begin() + from, pk.begin() + from + size_t(Tn * D), k.data.begin() + to);
          std::copy(pv.begin() + from, pv.begin() + from + size_t(Tn * D), v.data.begin() + to);
        }
      } else {
        q = split_heads(pq, B, Tn, H, D), k = split_heads(pk, B, Tn, H, D), v = split_heads(pv, B, Tn, H, D);
      }
    }
  }
  if (obs) obs->on("q", q), obs->on("k", k), obs->on("v", v);

  // ---- scores (B, H, T, T): q k^T, the buffer's nonzeros -inf, / sqrt(D) ------------------------
  const int64_t G = B * H;
  Tensor<T> scores({B, H, Tn, Tn});
  qdotk(scores.ptr(), q.ptr(), k.ptr(), G, Tn, Tn, D);
  // keys.shape[-1] ** 0.5; the selftest's defect divides by sqrt(d_in), the input's width
  const T root = std::sqrt(T(injected_defect() == Defect::BookScaleByDIn ? c.d_in : D));
  const bool masked = c.masked() && injected_defect() != Defect::IgnoreMask;
  constexpr T ninf = -std::numeric_limits<T>::infinity();
  for (int64_t g = 0; g < G; ++g) {
    const Tensor<T>& m = w.heads[wrapper ? size_t(g % H) : 0].mask;  // head h's own buffer
    for (int64_t i = 0; i < Tn; ++i)
      for (int64_t j = 0; j < Tn; ++j) {
        T& s = scores.data[size_t((g * Tn + i) * Tn + j)];
        if (masked && m.data[size_t(i * c.context_length + j)] != T(0)) s = ninf;
        s = s / root;
      }
  }
  if (obs) obs->on("scores", scores);

  // ---- attn_weights, then the weighted sum of v per head -----------------------------------------
  Tensor<T>& weights = scores;  // in place
  softmax_forward(weights.ptr(), weights.ptr(), G * Tn, Tn);
  if (obs) obs->on("attn_weights", weights);
  std::vector<T> heads(size_t(G * Tn * D));  // (B, H, T, D)
  weighted_sum_v(heads.data(), weights.ptr(), v.ptr(), G, Tn, Tn, D);

  // ---- context (B, T, H D): heads concatenated (cat along dim -1 = transpose(1, 2) then view) ---
  Tensor<T> context({B, Tn, H * D});
  for (int64_t b = 0; b < B; ++b)
    for (int64_t h = 0; h < H; ++h)
      for (int64_t t = 0; t < Tn; ++t)
        std::copy_n(heads.begin() + ((b * H + h) * Tn + t) * D, D, context.data.begin() + ((b * Tn + t) * H + h) * D);
  Tensor<T> out;
  if (c.has_out_proj()) {
    if (obs) obs->on("context", context);
    const int64_t O = c.out_dim();
    out = Tensor<T>({B, Tn, O});
    linear_forward(out.ptr(), context.ptr(), w.out_proj_weight.ptr(),
                   w.out_proj_bias.empty() ? nullptr : w.out_proj_bias.ptr(), N, H * D, O);
  } else {
    out = std::move(context);
  }
  if (obs) obs->on("output", out);
  if (!c.batched()) out.shape = {Tn, out.size(-1)};
  return out;
}

#define TPARITY_INSTANTIATE(T)                                                                             \
  template Tensor<T> book_attention_forward<T>(const BookConfig&, const BookWeights<T>&, const Tensor<T>&, \
                                               Observer<T>*);
TPARITY_INSTANTIATE(float)
TPARITY_INSTANTIATE(double)
#undef TPARITY_INSTANTIATE

}  // namespace tparity
