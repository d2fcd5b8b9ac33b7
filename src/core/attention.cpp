#include "tparity/core/attention.hpp"

#include <algorithm>
#include <cassert>
#include <cmath>
#include <limits>
#include <optional>
#include <string>
#include <type_traits>
#include <vector>

#include "layout.hpp"
#include "tparity/core/defects.hpp"
#include "tparity/core/fused_attention.hpp"
#include "tparity/core/gemm.hpp"
#include "tparity/core/ops.hpp"
#include "tparity/core/parallel.hpp"

namespace tparity {

const char* semantics_name(TorchSemantics s) { return s == TorchSemantics::Torch2 ? "torch 2.x" : "torch 1.13"; }

namespace {

[[noreturn]] void shape_error(const std::string& tensor, const std::string& expected, const Shape& got) {
  throw ShapeError(tensor + ": expected " + expected + ", got shape " + to_string(got));
}

std::string dims(std::initializer_list<int64_t> d) { return "shape " + to_string(Shape(d)); }

// Rows of the layout moves over the core's threads when they are many (a copy: any split is exact).
template <class F>
void copy_rows(int64_t rows, int64_t row_elems, const F& f) {
  const int threads = rows * row_elems < (int64_t(1) << 16) ? 1 : num_threads();
  if (threads <= 1) return f(int64_t(0), rows);
  parallel_for(rows, threads, f);
}

// x (B, L, H*D) with row stride ld -> rows [0, L) of y (B, H, Ly, D), Ly >= L
template <class T>
void split_heads_into(T* y, const T* x, int64_t ld, int64_t B, int64_t L, int64_t H, int64_t D, int64_t Ly) {
  profile::Scope scope(profile::Op::Copies);
  const bool interleaved = injected_defect() == Defect::WrongHeadInterleave;
  copy_rows(B * L, H * D, [&](int64_t r0, int64_t r1) {
    for (int64_t r = r0; r < r1; ++r) {
      const int64_t b = r / L, l = r % L;
      for (int64_t h = 0; h < H; ++h) {
        const T* from = x + r * ld + h * D;
        T* to = y + ((b * H + h) * Ly + l) * D;
        if (interleaved)  // the selftest's defect: feature d of head h taken from d * H + h
          for (int64_t d = 0; d < D; ++d) to[d] = x[r * ld + d * H + h];
        else
          for (int64_t d = 0; d < D; ++d) to[d] = from[d];
      }
    }
  });
}

// x (B, H, L, D) -> y (B, L, H*D)
template <class T>
void merge_heads_into(T* y, const T* x, int64_t B, int64_t H, int64_t L, int64_t D) {
  profile::Scope scope(profile::Op::Copies);
  const bool interleaved = injected_defect() == Defect::WrongHeadInterleave;
  copy_rows(B * L, H * D, [&](int64_t r0, int64_t r1) {
    for (int64_t r = r0; r < r1; ++r) {
      const int64_t b = r / L, l = r % L;
      for (int64_t h = 0; h < H; ++h) {
        const T* from = x + ((b * H + h) * L + l) * D;
        T* to = y + r * H * D + h * D;
        if (interleaved)
          for (int64_t d = 0; d < D; ++d) y[r * H * D + d * H + h] = from[d];
        else
          for (int64_t d = 0; d < D; ++d) to[d] = from[d];
      }
    }
  });
}
// The merge of attn_mask and key_padding_mask into one additive mask, read lazily: torch 1.13's
// (logical_or, masked_fill) or torch 2.x's (each additive, summed). Coordinates are those of the padded
// keys: columns >= S0 (bias_kv, zero_attn) are unmasked, as the zero padding torch appends to both
// masks leaves them.
template <class T>
class MergedMask {
 public:
  MergedMask(const Mask<T>& attn, const Mask<T>& kpm, int64_t H, int64_t L, int64_t S0, TorchSemantics semantics)
      : attn_(attn),
        kpm_(kpm),
        H_(H),
        L_(L),
        S0_(S0),
        attn3d_(attn.present() && attn.shape().size() == 3),
        add_(semantics == TorchSemantics::Torch2) {
    if (!add_ && kpm.present() && !kpm.is_bool() && attn.present() && !attn.is_bool())
      throw std::invalid_argument(
          "key_padding_mask: a float key_padding_mask cannot be combined with a float attn_mask under torch 1.13's "
          "semantics (its masked_fill reads each float as a bool byte and ignores most values; torch 2.x adds them)");
  }
  bool any() const { return attn_.present() || kpm_.present(); }

  // The value added to score (b, h, i, j).
  T value(int64_t b, int64_t h, int64_t i, int64_t j) const {
    constexpr T ninf = -std::numeric_limits<T>::infinity();
    if (j >= S0_) return T(0);
    const int64_t ai = attn_.present() ? ((attn3d_ ? (b * H_ + h) * L_ : 0) + i) * S0_ + j : 0;
    const int64_t ki = b * S0_ + j;
    if (add_) {  // torch 2.x: attn_mask + key_padding_mask, each bool as -inf where true
      const T a = !attn_.present()  ? T(0)
                  : attn_.is_bool() ? (attn_.bools.data[size_t(ai)] ? ninf : T(0))
                                    : attn_.floats.data[size_t(ai)];
      const T k = !kpm_.present()  ? T(0)
                  : kpm_.is_bool() ? (kpm_.bools.data[size_t(ki)] ? ninf : T(0))
                                   : kpm_.floats.data[size_t(ki)];
      return attn_.present() && kpm_.present() ? a + k : attn_.present() ? a : k;
    }
    if (!kpm_.present())
      return attn_.is_bool() ? (attn_.bools.data[size_t(ai)] ? ninf : T(0)) : attn_.floats.data[size_t(ai)];
    if (!attn_.present())
      return kpm_.is_bool() ? (kpm_.bools.data[size_t(ki)] ? ninf : T(0)) : kpm_.floats.data[size_t(ki)];
    if (attn_.is_bool()) {  // attn_mask.logical_or(key_padding_mask): a nonzero float key counts as true
      const bool k = kpm_.is_bool() ? kpm_.bools.data[size_t(ki)] != 0 : kpm_.floats.data[size_t(ki)] != T(0);
      return (attn_.bools.data[size_t(ai)] || k) ? ninf : T(0);
    }
    // attn_mask.masked_fill(key_padding_mask, -inf)
    return kpm_.bools.data[size_t(ki)] ? ninf : attn_.floats.data[size_t(ai)];
  }

 private:
  const Mask<T>& attn_;
  const Mask<T>& kpm_;
  int64_t H_, L_, S0_;
  bool attn3d_, add_;
};

// The same merge as MergedMask, row by row (the fast path): the attn_mask as an additive row (bool
// turned into -inf/0 once), the key padding mask as an additive row per batch element, and, under
// 1.13's semantics, where a bool key padding mask meets a float attn_mask, a -inf that replaces the
// attn value (masked_fill) rather than adding to it. Rows are S wide (the keys after bias_kv and zero_attn); columns
// past S0 are zero, and add() leaves them alone. The same arrays are the masks fused_attention adds (fused_view()),
// attn_mask + key bias, which is torch's merge except where masked_fill would replace a +inf or NaN of a float
// attn_mask at a padded key (a sum gives NaN): sum_is_merge() says whether that cannot happen.
template <class T>
class RowMask {
 public:
  RowMask(const Mask<T>& attn, const Mask<T>& kpm, int64_t B, int64_t H, int64_t L, int64_t S0, int64_t S,
          TorchSemantics semantics)
      : H_(H), L_(L), S0_(S0), S_(S) {
    const bool add = semantics == TorchSemantics::Torch2;  // torch 2.x: every mask additive, summed
    constexpr T ninf = -std::numeric_limits<T>::infinity();
    if (attn.present()) {
      attn3d_ = attn.shape().size() == 3;
      const int64_t rows = numel(attn.shape()) / S0;
      a_.assign(size_t(rows * S), T(0));
      for (int64_t r = 0; r < rows; ++r)
        for (int64_t j = 0; j < S0; ++j) {
          const size_t x = size_t(r * S0 + j);
          a_[size_t(r * S + j)] = attn.is_bool() ? (attn.bools.data[x] ? ninf : T(0)) : attn.floats.data[x];
        }
    }
    if (kpm.present()) {
      k_.assign(size_t(B * S), T(0));
      fill_ = !add && !attn.is_bool() && attn.present();  // 1.13: masked_fill into a float attn_mask
      for (int64_t b = 0; b < B; ++b)
        for (int64_t j = 0; j < S0; ++j) {
          const size_t x = size_t(b * S0 + j);
          const bool on = kpm.is_bool() ? kpm.bools.data[x] != 0 : kpm.floats.data[x] != T(0);
          // alone or with a bool attn_mask (logical_or) a bool or nonzero-float key is -inf; alone,
          // a float key padding mask is added as it is
          // (2.x: a float key padding mask is added as it is, whatever attn_mask is)
          k_[size_t(b * S + j)] = kpm.is_bool() || (attn.present() && !add) ? (on ? ninf : T(0)) : kpm.floats.data[x];
        }
      if (fill_)
        for (T v : a_) sum_is_merge_ = sum_is_merge_ && !std::isnan(v) && v != -ninf;
    }
  }
  bool any() const { return !a_.empty() || !k_.empty(); }

  // row (b, h, i) of the scores += the merged mask
  void add(T* row, int64_t b, int64_t h, int64_t i) const {
    constexpr T ninf = -std::numeric_limits<T>::infinity();
    const T* a = a_.empty() ? nullptr : a_.data() + ((attn3d_ ? (b * H_ + h) * L_ : 0) + i) * S_;
    const T* k = k_.empty() ? nullptr : k_.data() + b * S_;
    if (a && k && fill_)
      for (int64_t j = 0; j < S0_; ++j) row[j] = (k[j] == ninf ? ninf : a[j]) + row[j];
    else if (a && k)
      for (int64_t j = 0; j < S0_; ++j) row[j] = (a[j] + k[j]) + row[j];
    else if (a)
      for (int64_t j = 0; j < S0_; ++j) row[j] = a[j] + row[j];
    else
      for (int64_t j = 0; j < S0_; ++j) row[j] = k[j] + row[j];
  }

  bool sum_is_merge() const { return sum_is_merge_; }
  AttentionMasks<T> fused_view() const {
    AttentionMasks<T> v;
    v.attn = a_.empty() ? nullptr : a_.data();
    v.attn_group_stride = attn3d_ ? L_ * S_ : 0;
    v.key_bias = k_.empty() ? nullptr : k_.data();
    v.heads = H_;
    return v;
  }

 private:
  int64_t H_, L_, S0_, S_;
  bool attn3d_ = false, fill_ = false, sum_is_merge_ = true;
  std::vector<T> a_, k_;
};

// out_proj: context (B, L, E) -> (B, L, E), plus the residual (B, L, E) when given, in the GEMM's
// epilogue where nothing observes the attention's own output (residual + out, as add_forward adds),
// else after the observer has seen it.
template <class T>
Tensor<T> out_proj(const T* context, int64_t B, int64_t L, int64_t E, const MhaWeights<T>& w, bool bias,
                   const T* residual, Observer<T>* obs) {
  profile::Scope scope(profile::Op::OutProj);
  const Defect defect = injected_defect();
  Tensor<T> wt;  // the selftest's defect OutProjTransposed: W^T
  if (defect == Defect::OutProjTransposed) {
    wt = Tensor<T>({E, E});
    for (int64_t i = 0; i < E; ++i)
      for (int64_t j = 0; j < E; ++j) wt.data[size_t(j * E + i)] = w.out_proj_weight.data[size_t(i * E + j)];
  }
  const T* W = wt.empty() ? w.out_proj_weight.ptr() : wt.ptr();
  const T* b = bias && defect != Defect::DropBias ? w.out_proj_bias.ptr() : nullptr;
  Tensor<T> out = Tensor<T>::unset({B, L, E});  // written whole by either product
  if (residual && !obs && core_path() == CorePath::Fast) {
    GemmEpilogue<T> ep;
    ep.bias = b, ep.residual = residual, ep.ldr = E;
    gemm(false, true, B * L, E, E, T(1), context, E, W, E, T(0), out.ptr(), E, &ep, num_threads());
    return out;
  }
  linear_forward(out.ptr(), context, W, b, B * L, E, E);
  if (obs) obs->on("output", out);
  if (residual) add_forward(out.ptr(), residual, out.ptr(), out.numel());
  return out;
}

// The selftest's defect SoftmaxWrongAxis: x (G, L, S) softmax over L (the queries) for each key,
// in place.
template <class T>
void softmax_over_queries(T* x, int64_t G, int64_t L, int64_t S) {
  std::vector<T> col(static_cast<size_t>(L));
  for (int64_t g = 0; g < G; ++g)
    for (int64_t j = 0; j < S; ++j) {
      for (int64_t i = 0; i < L; ++i) col[size_t(i)] = x[(g * L + i) * S + j];
      softmax_forward(col.data(), col.data(), 1, L);
      for (int64_t i = 0; i < L; ++i) x[(g * L + i) * S + j] = col[size_t(i)];
    }
}

// Which of the rows (S wide) hold -inf in every score: the rows torch 2.x's scaled_dot_product_attention
// gives zero weights (its _safe_softmax: where(all(x == -inf), 0, softmax(x))). Empty when none does.
template <class T>
std::vector<uint8_t> dead_rows(const T* x, int64_t rows, int64_t S) {
  std::vector<uint8_t> dead;
  for (int64_t r = 0; r < rows; ++r) {
    bool all = true;
    for (int64_t j = 0; j < S && all; ++j) all = x[r * S + j] == -std::numeric_limits<T>::infinity();
    if (!all) continue;
    if (dead.empty()) dead.assign(size_t(rows), 0);
    dead[size_t(r)] = 1;
  }
  return dead;
}

// x (G, L, S): softmax over the keys (dim -1) in place. With zero_dead (torch 2.x's
// scaled_dot_product_attention) a row whose every score is -inf gets zero weights, else NaN.
template <class T>
void attention_softmax(T* x, int64_t G, int64_t L, int64_t S, bool zero_dead) {
  const std::vector<uint8_t> dead = zero_dead ? dead_rows(x, G * L, S) : std::vector<uint8_t>();
  if (injected_defect() == Defect::SoftmaxWrongAxis)
    softmax_over_queries(x, G, L, S);
  else
    softmax_forward(x, x, G * L, S);
  for (size_t r = 0; r < dead.size(); ++r)
    if (dead[r]) std::fill(x + int64_t(r) * S, x + int64_t(r + 1) * S, T(0));
}

}  // namespace

template <class T>
void qdotk(T* scores, const T* q, const T* k, int64_t G, int64_t L, int64_t S, int64_t E) {
  if (core_path() == CorePath::Reference) return qdotk_ref(scores, q, k, G, L, S, E);
  gemm_strided_batched(G, false, true, L, S, E, T(1), q, E, L * E, k, E, S * E, T(0), scores, S, L * S,
                       static_cast<const GemmEpilogue<T>*>(nullptr), 0, num_threads());
}

template <class T>
void weighted_sum_v(T* out, const T* w, const T* v, int64_t G, int64_t L, int64_t S, int64_t Ev) {
  if (std::is_same_v<T, float> && injected_defect() == Defect::SingleRunningSum) {  // the selftest's numeric defect
    for (int64_t g = 0; g < G; ++g)
      for (int64_t i = 0; i < L; ++i)
        for (int64_t e = 0; e < Ev; ++e) {
          T acc = T(0);
          for (int64_t j = 0; j < S; ++j) acc += w[(g * L + i) * S + j] * v[(g * S + j) * Ev + e];
          out[(g * L + i) * Ev + e] = acc;
        }
    return;
  }
  if (core_path() == CorePath::Reference) return weighted_sum_v_ref(out, w, v, G, L, S, Ev);
  gemm_strided_batched(G, false, false, L, Ev, S, T(1), w, S, L * S, v, Ev, S * Ev, T(0), out, Ev, L * Ev,
                       static_cast<const GemmEpilogue<T>*>(nullptr), 0, num_threads());
}

template <class T>
void qdotk_ref(T* scores, const T* q, const T* k, int64_t G, int64_t L, int64_t S, int64_t E) {
  // q is (G, L, E), k is (G, S, E); scores will be (G, L, S)
  for (int64_t g = 0; g < G; ++g)
    for (int64_t i = 0; i < L; ++i)
      for (int64_t j = 0; j < S; ++j) scores[(g * L + i) * S + j] = dot(q + (g * L + i) * E, k + (g * S + j) * E, E);
}

template <class T>
void weighted_sum_v_ref(T* out, const T* w, const T* v, int64_t G, int64_t L, int64_t S, int64_t Ev) {
  // w is (G, L, S), v is (G, S, Ev); out will be (G, L, Ev)
  // Each output element sums over j in eight interleaved partial sums combined pairwise, as dot()
  // does: the rounding error grows like S/8, not S (at S = 1024 that is the difference between
  // beating LibTorch's float32 error and trailing it).
  std::vector<T> acc(size_t(8 * Ev));
  for (int64_t g = 0; g < G; ++g)
    for (int64_t i = 0; i < L; ++i) {
      std::fill(acc.begin(), acc.end(), T(0));
      for (int64_t j = 0; j < S; ++j) {
        const T wij = w[(g * L + i) * S + j];
        const T* vr = v + (g * S + j) * Ev;
        T* a = acc.data() + (j & 7) * Ev;
        for (int64_t e = 0; e < Ev; ++e) a[e] += wij * vr[e];
      }
      T* o = out + (g * L + i) * Ev;
      for (int64_t e = 0; e < Ev; ++e) {
        const T* a = acc.data() + e;
        o[e] = ((a[0] + a[Ev]) + (a[2 * Ev] + a[3 * Ev])) + ((a[4 * Ev] + a[5 * Ev]) + (a[6 * Ev] + a[7 * Ev]));
      }
    }
}

template <class T>
Tensor<T> sdpa_forward(const Tensor<T>& q, const Tensor<T>& k, const Tensor<T>& v, const Mask<T>& mask,
                       Observer<T>* obs, TorchSemantics semantics, const SdpaOptions& options) {
  if (q.dim() < 2) shape_error("query", "at least 2 dims (..., L, E)", q.shape);
  if (k.dim() != q.dim()) shape_error("key", std::to_string(q.dim()) + " dims like query", k.shape);
  if (v.dim() != q.dim()) shape_error("value", std::to_string(q.dim()) + " dims like query", v.shape);
  const int64_t L = q.size(-2), E = q.size(-1), S = k.size(-2), Ev = v.size(-1);
  // Grouped-query attention: the heads (dim -3) of k and v may divide q's.
  const bool gqa = options.enable_gqa && q.dim() >= 3;
  const int64_t Hq = q.dim() >= 3 ? q.size(-3) : 1, Hkv = k.dim() >= 3 ? k.size(-3) : 1;
  for (int64_t d = 0; d + 2 < q.dim(); ++d) {
    const bool heads = gqa && d + 3 == q.dim();
    if (heads) {
      if (Hkv < 1 || Hq % Hkv != 0)
        shape_error("key", "heads (dim -3) dividing query's " + std::to_string(Hq) + " (enable_gqa)", k.shape);
      if (v.size(-3) != Hkv) shape_error("value", "key's " + std::to_string(Hkv) + " heads (dim -3)", v.shape);
      continue;
    }
    if (k.shape[size_t(d)] != q.shape[size_t(d)]) shape_error("key", "leading dims equal to query's", k.shape);
    if (v.shape[size_t(d)] != q.shape[size_t(d)]) shape_error("value", "leading dims equal to query's", v.shape);
  }
  if (k.size(-1) != E) shape_error("key", "last dim " + std::to_string(E) + " (query's E)", k.shape);
  if (v.size(-2) != S) shape_error("value", "dim -2 equal to key's S = " + std::to_string(S), v.shape);
  if (mask.present() && mask.shape() != Shape{L, S}) shape_error("attn_mask", dims({L, S}), mask.shape());
  if (mask.present() && options.is_causal)
    throw std::invalid_argument(
        "attn_mask: given with is_causal; torch's math path refuses the two together (pass one or the other)");
  if (options.scale && !std::isfinite(*options.scale))
    throw std::invalid_argument("scale: expected a finite number, got " + std::to_string(*options.scale));
  const int64_t G = q.numel() / (L * E), group = gqa ? Hq / Hkv : 1;

  Shape lead(q.shape.begin(), q.shape.end() - 2);
  Shape sshape = lead, oshape = lead;
  sshape.insert(sshape.end(), {L, S});
  oshape.insert(oshape.end(), {L, Ev});

  // k and v of query group g: group g / (Hq / Hkv) of theirs (the heads are the innermost leading dim).
  auto kv_group = [&](int64_t g) { return gqa ? g / group : g; };
  Tensor<T> scores(sshape);
  if (gqa)
    for (int64_t g = 0; g < G; ++g)
      qdotk(scores.ptr() + g * L * S, q.ptr() + g * L * E, k.ptr() + kv_group(g) * S * E, 1, L, S, E);
  else
    qdotk(scores.ptr(), q.ptr(), k.ptr(), G, L, S, E);
  const T root = std::sqrt(T(E)), scale = T(options.scale.value_or(0));
  constexpr T ninf = -std::numeric_limits<T>::infinity();
  const bool use_mask = mask.present() && injected_defect() != Defect::IgnoreMask;
  const bool causal = options.is_causal && injected_defect() != Defect::IgnoreMask;
  for (int64_t g = 0; g < G; ++g)
    for (int64_t i = 0; i < L; ++i)
      for (int64_t j = 0; j < S; ++j) {
        T& s = scores.data[size_t((g * L + i) * S + j)];
        s = options.scale ? s * scale : s / root;
        if (use_mask)
          s = s + (mask.is_bool() ? (mask.bools.data[size_t(i * S + j)] ? ninf : T(0))
                                  : mask.floats.data[size_t(i * S + j)]);
        if (causal && j > i) s = s + ninf;
      }
  if (obs) obs->on("scores", scores);
  Tensor<T>& weights = scores;  // softmax in place
  attention_softmax(weights.ptr(), G, L, S, semantics == TorchSemantics::Torch2);
  if (obs) obs->on("attn_weights", weights);
  Tensor<T> out(oshape);
  if (gqa)
    for (int64_t g = 0; g < G; ++g)
      weighted_sum_v(out.ptr() + g * L * Ev, weights.ptr() + g * L * S, v.ptr() + kv_group(g) * S * Ev, 1, L, S, Ev);
  else
    weighted_sum_v(out.ptr(), weights.ptr(), v.ptr(), G, L, S, Ev);
  if (obs) obs->on("output", out);
  return out;
}

namespace {

// ---- multi-head attention, step by step ------------------------------------------------------------
// Every step batch-first, whatever the call's layout: B batch elements (1 unbatched), L queries, S0
// keys as given and S after bias_kv and zero_attn, E features in H heads of D, keys of KD features and
// values of VD.
struct MhaDims {
  bool batched;
  int64_t B, L, S0, S, E, H, D, KD, VD;
};

// The call's sizes, checked against the config: throws ShapeError naming the tensor (or the
// state_dict entry), what was expected and what was found; the masks' shapes as torch 1.13's
// _mha_shape_check and multi_head_attention_forward.
template <class T>
MhaDims check_mha(const MhaConfig& cfg, const MhaWeights<T>& w, const detail::MhaInputRefs<T>& in) {
  const int64_t E = cfg.embed_dim, H = cfg.num_heads, KD = cfg.key_dim(), VD = cfg.value_dim();
  if (E <= 0 || H <= 0)
    throw ShapeError("config: embed_dim and num_heads must be positive, got embed_dim=" + std::to_string(E) +
                     ", num_heads=" + std::to_string(H));
  if (E % H != 0)
    throw ShapeError("config: embed_dim " + std::to_string(E) + " is not divisible by num_heads " + std::to_string(H));
  const bool batched = in.query.dim() == 3;
  if (in.query.dim() != 2 && in.query.dim() != 3) shape_error("query", "2 dims (L, E) or 3 dims", in.query.shape);
  if (in.key.dim() != in.query.dim())
    shape_error("key", std::to_string(in.query.dim()) + " dims like query", in.key.shape);
  if (in.value.dim() != in.query.dim())
    shape_error("value", std::to_string(in.query.dim()) + " dims like query", in.value.shape);
  // dim i of x's batch-first view (B, L|S, features), as BatchFirstView lays it out
  auto dim = [&](const Tensor<T>& x, int i) {
    if (!batched) return i == 0 ? int64_t(1) : x.size(i - 1);
    return cfg.batch_first || i == 2 ? x.size(i) : x.size(1 - i);
  };
  const int64_t B = dim(in.query, 0), L = dim(in.query, 1), S0 = dim(in.key, 1);
  const std::string layout = batched ? (cfg.batch_first ? "(B, L, ·)" : "(L, B, ·)") : "(L, ·)";
  if (dim(in.query, 2) != E)
    shape_error("query", "last dim embed_dim = " + std::to_string(E) + " in layout " + layout, in.query.shape);
  if (dim(in.key, 2) != KD) shape_error("key", "last dim kdim = " + std::to_string(KD), in.key.shape);
  if (dim(in.value, 2) != VD) shape_error("value", "last dim vdim = " + std::to_string(VD), in.value.shape);
  if (dim(in.key, 0) != B)
    shape_error("key", "batch " + std::to_string(B) + " like query in layout " + layout, in.key.shape);
  if (dim(in.value, 0) != B || dim(in.value, 1) != S0)
    shape_error("value", "the same batch and sequence as key " + to_string(in.key.shape), in.value.shape);

  if (in.attn_mask.present()) {
    const Shape& ms = in.attn_mask.shape();
    const int64_t G0 = batched ? B * H : H;
    if (ms.size() == 2) {
      if (ms != Shape{L, S0}) shape_error("attn_mask", dims({L, S0}) + " (L, S) or " + dims({G0, L, S0}), ms);
    } else if (ms.size() == 3) {
      if (ms != Shape{G0, L, S0})
        shape_error(
            "attn_mask",
            dims({G0, L, S0}) + (batched ? " (B*num_heads, L, S)" : " (num_heads, L, S)") + " or " + dims({L, S0}), ms);
    } else {
      shape_error("attn_mask", "2 or 3 dims", ms);
    }
  }
  if (in.key_padding_mask.present()) {
    const Shape want = batched ? Shape{B, S0} : Shape{S0};
    if (in.key_padding_mask.shape() != want)
      shape_error("key_padding_mask", "shape " + to_string(want) + (batched ? " (B, S)" : " (S)"),
                  in.key_padding_mask.shape());
  }

  auto need = [](const Tensor<T>& t, const std::string& name, const Shape& s) {
    if (t.shape != s)
      throw ShapeError("state_dict." + name + ": expected shape " + to_string(s) + ", got " +
                       (t.empty() ? std::string("none") : to_string(t.shape)));
  };
  if (cfg.packed())
    need(w.in_proj_weight, "in_proj_weight", {3 * E, E});
  else {
    need(w.q_proj_weight, "q_proj_weight", {E, E});
    need(w.k_proj_weight, "k_proj_weight", {E, KD});
    need(w.v_proj_weight, "v_proj_weight", {E, VD});
  }
  if (cfg.bias) {
    need(w.in_proj_bias, "in_proj_bias", {3 * E});
    need(w.out_proj_bias, "out_proj.bias", {E});
  }
  if (cfg.add_bias_kv) {
    need(w.bias_k, "bias_k", {1, 1, E});
    need(w.bias_v, "bias_v", {1, 1, E});
  }
  need(w.out_proj_weight, "out_proj.weight", {E, E});
  const int64_t S = S0 + (cfg.add_bias_kv ? 1 : 0) + (cfg.add_zero_attn ? 1 : 0);
  return MhaDims{batched, B, L, S0, S, E, H, E / H, KD, VD};
}

// The masks as the two paths read them: torch's merge read lazily (the reference path; its
// constructor throws on what the semantics leave undefined) and row by row (RowMask, the fast path's,
// also what the fused attention adds). The selftest's defect IgnoreMask drops both masks.
template <class T>
struct MhaMasks {
  MhaMasks(const MhaConfig& cfg, const MhaForward& fwd, const detail::MhaInputRefs<T>& in, const MhaDims& n)
      : merged(used(in.attn_mask), used(in.key_padding_mask), n.H, n.L, n.S0, cfg.semantics),
        // torch 2.x without weights runs scaled_dot_product_attention: rows whose every score is -inf
        // get zero weights there, NaN everywhere else
        zero_dead(cfg.semantics == TorchSemantics::Torch2 && !fwd.need_weights) {
    if (core_path() == CorePath::Fast)
      rows.emplace(used(in.attn_mask), used(in.key_padding_mask), n.B, n.H, n.L, n.S0, n.S, cfg.semantics);
  }
  // Whether the fused attention adds the masks as torch merges them (RowMask::sum_is_merge).
  bool fusable() const { return rows && rows->sum_is_merge(); }

  MergedMask<T> merged;
  std::optional<RowMask<T>> rows;  // on the fast path
  bool zero_dead;

 private:
  static const Mask<T>& used(const Mask<T>& m) {
    static const Mask<T> none;
    return injected_defect() == Defect::IgnoreMask ? none : m;
  }
};

// An intermediate: a Tensor where the observer sees it (and may overwrite it, as a teacher does),
// else an uninitialised Buffer (layout.hpp).
template <class T>
class Stage {
 public:
  Stage(Shape shape, bool seen) {
    if (seen)
      tensor_ = Tensor<T>(std::move(shape));
    else
      buffer_.emplace(numel(shape));
  }
  T* ptr() { return buffer_ ? buffer_->ptr() : tensor_.ptr(); }
  void show(Observer<T>* obs, const char* name) {
    assert(!obs || !buffer_);
    if (obs) obs->on(name, tensor_);
  }
  void release() { tensor_ = Tensor<T>(), buffer_.reset(); }

 private:
  Tensor<T> tensor_;
  std::optional<detail::Buffer<T>> buffer_;
};

// q (B, H, L, D), k and v (B, H, S, D).
template <class T>
struct Heads {
  Stage<T> q, k, v;
  void show(Observer<T>* obs) { q.show(obs, "q"), k.show(obs, "k"), v.show(obs, "v"); }
  void release() { q.release(), k.release(), v.release(); }
};

// Whether one tensor is query, key and value of a packed projection (torch's self-attention: one
// product with in_proj_weight gives q, k and v side by side).
template <class T>
bool packed_self(const MhaConfig& cfg, const detail::MhaInputRefs<T>& in) {
  return in.query.data.data() == in.key.data.data() && in.key.data.data() == in.value.data.data() &&
         in.query.shape == in.key.shape && in.key.shape == in.value.shape && cfg.packed() && !cfg.add_bias_kv &&
         injected_defect() != Defect::SwapQK;  // swapped weights: not one product
}

// query (B, L, E), key (B, S0, KD), value (B, S0, VD) batch-first -> q (B, H, L, D) and keys [0, S0)
// of k and v (B, H, S, D): F.linear with in_proj_weight's thirds or q/k/v_proj_weight and
// in_proj_bias's thirds, split into heads. Self-attention (one tensor as query, key and value) with
// the packed weight is one product with all of in_proj_weight, (B*L, 3E), each element the same sum
// as in three products (the GEMM sums over K alike whatever N is); otherwise each projection is split
// and freed before the next one. The batch-first copies of the inputs are freed once projected.
template <class T>
Heads<T> project_qkv(const MhaConfig& cfg, const MhaWeights<T>& w, const detail::MhaInputRefs<T>& in, const MhaDims& n,
                     bool seen) {
  const int64_t B = n.B, L = n.L, S0 = n.S0, E = n.E, H = n.H, D = n.D;
  Heads<T> heads{Stage<T>({B, H, L, D}, seen), Stage<T>({B, H, n.S, D}, seen), Stage<T>({B, H, n.S, D}, seen)};
  detail::BatchFirstView<T> query(in.query, n.batched, cfg.batch_first), key(in.key, n.batched, cfg.batch_first),
      value(in.value, n.batched, cfg.batch_first);
  const T* Wq = cfg.packed() ? w.in_proj_weight.ptr() : w.q_proj_weight.ptr();
  const T* Wk = cfg.packed() ? w.in_proj_weight.ptr() + E * E : w.k_proj_weight.ptr();
  const T* Wv = cfg.packed() ? w.in_proj_weight.ptr() + 2 * E * E : w.v_proj_weight.ptr();
  const T* bq = cfg.bias ? w.in_proj_bias.ptr() : nullptr;  // (linear_forward drops them for DropBias)
  const T* bk = cfg.bias ? w.in_proj_bias.ptr() + E : nullptr;
  const T* bv = cfg.bias ? w.in_proj_bias.ptr() + 2 * E : nullptr;
  const bool swap_qk = injected_defect() == Defect::SwapQK && n.KD == E;  // the selftest's defect
  if (swap_qk) std::swap(Wq, Wk), std::swap(bq, bk);
  if (packed_self(cfg, in)) {
    detail::Buffer<T> qkv(B * L * 3 * E);
    {
      profile::Scope scope(profile::Op::Projections);
      linear_forward(qkv.ptr(), query.ptr(), w.in_proj_weight.ptr(), bq, B * L, E, 3 * E);
    }
    query.release(), key.release(), value.release();
    split_heads_into(heads.q.ptr(), qkv.ptr(), 3 * E, B, L, H, D, L);
    split_heads_into(heads.k.ptr(), qkv.ptr() + E, 3 * E, B, L, H, D, n.S);
    split_heads_into(heads.v.ptr(), qkv.ptr() + 2 * E, 3 * E, B, L, H, D, n.S);
    return heads;
  }
  // x (B, rows, in_dim) -> rows [0, rows) of `to` (B, H, to_rows, D)
  auto project = [&](Stage<T>& to, int64_t to_rows, const T* x, const T* W, const T* b, int64_t rows, int64_t in_dim) {
    detail::Buffer<T> y(B * rows * E);
    {
      profile::Scope scope(profile::Op::Projections);
      linear_forward(y.ptr(), x, W, b, B * rows, in_dim, E);
    }
    split_heads_into(to.ptr(), y.ptr(), E, B, rows, H, D, to_rows);
  };
  project(heads.q, L, query.ptr(), Wq, bq, L, E);
  project(heads.k, n.S, key.ptr(), Wk, bk, S0, n.KD);
  project(heads.v, n.S, value.ptr(), Wv, bv, S0, n.VD);
  return heads;
}

// k, v (B, H, S, D): key S0 = bias_k, bias_v (1, 1, E) split into heads, for every batch element
// (torch: k = cat([k, bias_k.repeat(1, bsz, 1)]) before the heads are split).
template <class T>
void append_bias_kv(Heads<T>& heads, const MhaWeights<T>& w, const MhaDims& n) {
  // one row (L = 1) read for every batch element (ld = 0), written as key S0
  split_heads_into(heads.k.ptr() + n.S0 * n.D, w.bias_k.ptr(), 0, n.B, 1, n.H, n.D, n.S);
  split_heads_into(heads.v.ptr() + n.S0 * n.D, w.bias_v.ptr(), 0, n.B, 1, n.H, n.D, n.S);
}

// k, v (B, H, S, D): key S - 1 = zeros (torch: k = cat([k, zeros((bsz * num_heads, 1, head_dim))], dim=1)).
template <class T>
void append_zero_attn(Heads<T>& heads, const MhaDims& n) {
  for (int64_t g = 0; g < n.B * n.H; ++g) {
    std::fill_n(heads.k.ptr() + (g * n.S + n.S - 1) * n.D, n.D, T(0));
    std::fill_n(heads.v.ptr() + (g * n.S + n.S - 1) * n.D, n.D, T(0));
  }
}

// q (B, H, L, D) /= sqrt(D) in place (torch 1.13: q_scaled = q / math.sqrt(E), E the head dim there).
template <class T>
void scale_queries(T* q, const MhaDims& n) {
  profile::Scope scope(profile::Op::Scores);
  const T root = std::sqrt(T(injected_defect() == Defect::ScaleByFullDim ? n.E : n.D));  // the selftest's defect
  for (int64_t i = 0; i < n.B * n.L * n.E; ++i) q[i] = q[i] / root;
}

// Whether the call is a sequence-first batch of more than one element, which attend_in_place computes
// in its own row order (a single element's (L, 1, E) is already (1, L, E) in memory).
bool rows_seq_first(const MhaConfig& cfg, const MhaDims& n) { return n.batched && !cfg.batch_first && n.B > 1; }

// context (B, L, E) = the heads' softmax(q . k^T / sqrt(D) + masks) v side by side, for packed
// self-attention without bias_kv or zero_attn: q, k and v read in place from the one (B, L, 3E)
// projection, q divided by sqrt(D) as it is read, each head's output written at its columns of
// context (fused_attention's AttentionLayout): no split into heads, scaling pass or merge, and the
// same bits as project_qkv, scale_queries, attend_fused and merge_heads (the same products, the same
// division, the same sums; fused_attention.hpp).
// A sequence-first batch, (L, B, E) with B > 1, is read and written in its own row order: every
// step here works row by row but the attention, whose row layouts take the (L, B) order as they
// take (B, L) (context (L, B, E)); no copy to batch-first and back (the seed block's encoder layer
// sequence-first took 10-12% longer than batch-first with those copies).
template <class T>
Stage<T> attend_in_place(const MhaConfig& cfg, const MhaWeights<T>& w, const detail::MhaInputRefs<T>& in,
                         const MhaMasks<T>& m, const MhaDims& n) {
  const int64_t B = n.B, L = n.L, E = n.E, H = n.H, D = n.D;
  const bool seq_first = rows_seq_first(cfg, n);
  detail::BatchFirstView<T> query(in.query, n.batched, cfg.batch_first || seq_first);  // as it is when seq_first
  detail::Buffer<T> qkv(B * L * 3 * E);
  {
    profile::Scope scope(profile::Op::Projections);
    linear_forward(qkv.ptr(), query.ptr(), w.in_proj_weight.ptr(), cfg.bias ? w.in_proj_bias.ptr() : nullptr, B * L, E,
                   3 * E);
  }
  query.release();
  Stage<T> context({B, L, E}, false);
  AttentionMasks<T> masks = m.rows->fused_view();
  masks.zero_dead_rows = m.zero_dead;
  AttentionLayout layout;
  layout.heads = H;
  // row t of batch element b at (b * L + t), or at (t * B + b) when seq_first
  layout.q = layout.k = layout.v = seq_first ? RowLayout{B * 3 * E, D, 3 * E} : RowLayout{3 * E, D, L * 3 * E};
  layout.out = seq_first ? RowLayout{B * E, D, E} : RowLayout{E, D, L * E};
  fused_attention(context.ptr(), qkv.ptr(), qkv.ptr() + E, qkv.ptr() + 2 * E, B * H, L, L, D, D, T(1), masks,
                  num_threads(), layout, std::sqrt(T(D)));
  return context;
}

// ctx (B, H, L, D) = softmax(q . k^T + masks) v without holding the L x S scores (fused_attention.hpp).
template <class T>
void attend_fused(T* ctx, Heads<T>& heads, const MhaMasks<T>& m, const MhaDims& n) {
  AttentionMasks<T> masks = m.rows->fused_view();
  masks.zero_dead_rows = m.zero_dead;
  fused_attention(ctx, heads.q.ptr(), heads.k.ptr(), heads.v.ptr(), n.B * n.H, n.L, n.S, n.D, n.D, T(1), masks,
                  num_threads());
}

// scores (B, H, L, S) = q . k^T, einsum 'BHLD,BHSD->BHLS' (q already scaled).
template <class T>
Tensor<T> qk_scores(Heads<T>& heads, const MhaDims& n) {
  Tensor<T> s({n.B, n.H, n.L, n.S});
  profile::Scope scope(profile::Op::Scores);
  qdotk(s.ptr(), heads.q.ptr(), heads.k.ptr(), n.B * n.H, n.L, n.S, n.D);
  return s;
}

// scores (B, H, L, S) += the merged masks; keys past S0 (bias_kv, zero_attn) are never masked.
template <class T>
void add_mask(Tensor<T>& scores, const MhaMasks<T>& m, const MhaDims& n) {
  profile::Scope scope(profile::Op::Scores);
  const int64_t H = n.H, L = n.L, S = n.S;
  if (m.rows) {
    if (!m.rows->any()) return;
    parallel_for(n.B * H, num_threads(), [&](int64_t g0, int64_t g1) {
      for (int64_t g = g0; g < g1; ++g)
        for (int64_t i = 0; i < L; ++i) m.rows->add(scores.ptr() + (g * L + i) * S, g / H, g % H, i);
    });
  } else if (m.merged.any()) {
    for (int64_t b = 0; b < n.B; ++b)
      for (int64_t h = 0; h < H; ++h)
        for (int64_t i = 0; i < L; ++i)
          for (int64_t j = 0; j < S; ++j) {
            T& s = scores.data[size_t(((b * H + h) * L + i) * S + j)];
            s = m.merged.value(b, h, i, j) + s;
          }
  }
}

// weights (B, H, L, S) = softmax(scores) over the keys, in place.
template <class T>
void softmax_keys(Tensor<T>& scores, const MhaMasks<T>& m, const MhaDims& n) {
  profile::Scope scope(profile::Op::Softmax);
  attention_softmax(scores.ptr(), n.B * n.H, n.L, n.S, m.zero_dead);
}

// ctx (B, H, L, D) = weights . v, einsum 'BHLS,BHSD->BHLD'.
template <class T>
void weighted_sum(T* ctx, const Tensor<T>& weights, Heads<T>& heads, const MhaDims& n) {
  profile::Scope scope(profile::Op::Context);
  weighted_sum_v(ctx, weights.ptr(), heads.v.ptr(), n.B * n.H, n.L, n.S, n.D);
}

// ctx (B, H, L, D) -> context (B, L, E), the heads concatenated; ctx freed once read.
template <class T>
Stage<T> merge_heads(Stage<T> ctx, const MhaDims& n, bool seen) {
  Stage<T> context({n.B, n.L, n.E}, seen);
  merge_heads_into(context.ptr(), ctx.ptr(), n.B, n.H, n.L, n.D);
  return context;
}

// What the call returns as attn_weights: per head (B, H, L, S), or averaged over the heads (B, L, S)
// (torch: attn_output_weights.sum(dim=1) / num_heads); the batch dim dropped when unbatched.
template <class T>
Tensor<T> returned_weights(Tensor<T> weights, const MhaForward& fwd, const MhaDims& n, Observer<T>* obs) {
  const int64_t B = n.B, H = n.H, L = n.L, S = n.S;
  if (!fwd.average_attn_weights) return n.batched ? std::move(weights) : Tensor<T>({H, L, S}, std::move(weights.data));
  const bool summed = injected_defect() == Defect::SumHeadWeights;  // the selftest's defect
  Tensor<T> avg({B, L, S});
  for (int64_t b = 0; b < B; ++b)
    for (int64_t x = 0; x < L * S; ++x) {
      T acc = T(0);
      for (int64_t h = 0; h < H; ++h) acc += weights.data[size_t((b * H + h) * L * S + x)];
      avg.data[size_t(b * L * S + x)] = summed ? acc : acc / T(H);
    }
  if (obs) obs->on("attn_weights_avg", avg);
  return n.batched ? std::move(avg) : Tensor<T>({L, S}, std::move(avg.data));
}

}  // namespace

// The steps of torch's multi_head_attention_forward (attention.hpp), each one function above.
template <class T>
MhaOutputs<T> detail::mha_attend(const MhaConfig& cfg, const MhaForward& fwd, const MhaWeights<T>& w,
                                 const MhaInputRefs<T>& in, Observer<T>* obs, const T* residual) {
  const MhaDims n = check_mha(cfg, w, in);
  const MhaMasks<T> masks(cfg, fwd, in, n);
  // nothing observed and no weights returned: the scores streamed, never held
  const bool fused = !obs && !fwd.need_weights && injected_defect() == Defect::None && masks.fusable();
  MhaOutputs<T> result;
  // context -> out_proj (+ residual), in the caller's layout. The context is (B, L, E), or (L, B, E)
  // when attend_in_place computed a sequence-first batch in its own row order; otherwise a
  // sequence-first residual is added once the rows are back in the caller's order.
  auto project_out = [&](Stage<T>& context, bool in_place) {
    const bool caller_rows = in_place && rows_seq_first(cfg, n);
    const bool add_after = residual && rows_seq_first(cfg, n) && !in_place;
    const T* res = add_after ? nullptr : residual;
    Tensor<T> out = out_proj(context.ptr(), n.B, n.L, n.E, w, cfg.bias, res, obs);
    if (caller_rows)
      out.shape = {n.L, n.B, n.E};
    else
      out = detail::from_batch_first(std::move(out), n.batched, cfg.batch_first);
    if (add_after) add_forward(out.ptr(), out.ptr(), residual, out.numel());
    result.output = std::move(out);
  };
  if (fused && packed_self(cfg, in) && !cfg.add_zero_attn) {
    Stage<T> context = attend_in_place(cfg, w, in, masks, n);
    project_out(context, true);
    return result;
  }
  Heads<T> heads = project_qkv(cfg, w, in, n, obs != nullptr);
  if (cfg.add_bias_kv) append_bias_kv(heads, w, n);
  if (cfg.add_zero_attn) append_zero_attn(heads, n);
  heads.show(obs);
  scale_queries(heads.q.ptr(), n);
  Stage<T> ctx_heads({n.B, n.H, n.L, n.D}, false);
  Tensor<T> weights;  // (B, H, L, S), unless fused
  if (fused) {
    attend_fused(ctx_heads.ptr(), heads, masks, n);
  } else {
    weights = qk_scores(heads, n);
    add_mask(weights, masks, n);
    if (obs) obs->on("scores", weights);
    softmax_keys(weights, masks, n);
    if (obs) obs->on("attn_weights", weights);
    weighted_sum(ctx_heads.ptr(), weights, heads, n);
  }
  heads.release();
  Stage<T> context = merge_heads(std::move(ctx_heads), n, obs != nullptr);
  context.show(obs, "context");
  project_out(context, false);
  if (fwd.need_weights) result.attn_weights = returned_weights(std::move(weights), fwd, n, obs);
  return result;
}

template <class T>
MhaOutputs<T> mha_forward(const MhaConfig& cfg, const MhaForward& fwd, const MhaWeights<T>& w, const MhaInputs<T>& in,
                          Observer<T>* obs) {
  return detail::mha_attend(cfg, fwd, w,
                            detail::MhaInputRefs<T>{in.query, in.key, in.value, in.attn_mask, in.key_padding_mask}, obs,
                            static_cast<const T*>(nullptr));
}

#define TPARITY_INSTANTIATE(T)                                                                             \
  template void qdotk<T>(T*, const T*, const T*, int64_t, int64_t, int64_t, int64_t);                      \
  template void qdotk_ref<T>(T*, const T*, const T*, int64_t, int64_t, int64_t, int64_t);                  \
  template void weighted_sum_v_ref<T>(T*, const T*, const T*, int64_t, int64_t, int64_t, int64_t);         \
  template void weighted_sum_v<T>(T*, const T*, const T*, int64_t, int64_t, int64_t, int64_t);             \
  template Tensor<T> sdpa_forward<T>(const Tensor<T>&, const Tensor<T>&, const Tensor<T>&, const Mask<T>&, \
                                     Observer<T>*, TorchSemantics, const SdpaOptions&);                    \
  template MhaOutputs<T> mha_forward<T>(const MhaConfig&, const MhaForward&, const MhaWeights<T>&,         \
                                        const MhaInputs<T>&, Observer<T>*);                                \
  template MhaOutputs<T> detail::mha_attend<T>(const MhaConfig&, const MhaForward&, const MhaWeights<T>&,  \
                                               const detail::MhaInputRefs<T>&, Observer<T>*, const T*);
TPARITY_INSTANTIATE(float)
TPARITY_INSTANTIATE(double)
#undef TPARITY_INSTANTIATE

}  // namespace tparity
