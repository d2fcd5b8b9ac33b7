// The LLM decoder blocks (llm.hpp): RMSNorm, rotary embeddings, grouped-query attention over a KV
// cache, SwiGLU, GPT-2's Conv1D block. Each op one function; the layers compose them in
// transformers' order.
#include "tparity/core/llm.hpp"

#include <algorithm>
#include <cmath>
#include <limits>
#include <optional>
#include <string>

#include "tparity/core/defects.hpp"
#include "tparity/core/fused_attention.hpp"
#include "tparity/core/gemm.hpp"
#include "tparity/core/ops.hpp"
#include "tparity/core/parallel.hpp"

namespace tparity {

std::string rope_style_name(RopeStyle s) { return s == RopeStyle::HalfSplit ? "half" : "interleaved"; }

RopeStyle rope_style_from_name(const std::string& s) {
  if (s == "half") return RopeStyle::HalfSplit;
  if (s == "interleaved") return RopeStyle::Interleaved;
  throw std::invalid_argument("expected \"half\" (rotate_half) or \"interleaved\" (rotate_every_two), got \"" + s +
                              "\"");
}

namespace {

template <class T>
void need_shape(const Tensor<T>& t, const std::string& name, const Shape& shape) {
  if (t.shape != shape)
    throw ShapeError("state_dict." + name + ": expected shape " + to_string(shape) + ", got " + to_string(t.shape));
}

// A decoder layer's input and the weights every Llama-shaped layer has (its norms, its MLP).
template <class T>
void need_layer_shapes(const LlamaConfig& c, const LlamaLayerWeights<T>& w, const Tensor<T>& x) {
  const int64_t C = c.hidden_size, I = c.intermediate_size;
  if (x.dim() != 3 || x.size(2) != C)
    throw ShapeError("hidden_states: expected (B, T, " + std::to_string(C) + "), got shape " + to_string(x.shape));
  need_shape(w.input_layernorm, "input_layernorm.weight", {C});
  need_shape(w.post_attention_layernorm, "post_attention_layernorm.weight", {C});
  need_shape(w.gate_proj_weight, "mlp.gate_proj.weight", {I, C});
  need_shape(w.up_proj_weight, "mlp.up_proj.weight", {I, C});
  need_shape(w.down_proj_weight, "mlp.down_proj.weight", {C, I});
}

template <class T>
const T* bias_or_null(const Tensor<T>& b) {
  return b.empty() || injected_defect() == Defect::DropBias ? nullptr : b.ptr();
}

// (B * T, H * D) rows -> (B, H, T, D) heads.
template <class T>
Tensor<T> split_heads(const T* x, int64_t B, int64_t Tn, int64_t H, int64_t D, int64_t row_stride) {
  profile::Scope scope(profile::Op::Copies);
  Tensor<T> out({B, H, Tn, D});
  for (int64_t b = 0; b < B; ++b)
    for (int64_t t = 0; t < Tn; ++t)
      for (int64_t h = 0; h < H; ++h)
        std::copy(x + (b * Tn + t) * row_stride + h * D, x + (b * Tn + t) * row_stride + (h + 1) * D,
                  out.ptr() + ((b * H + h) * Tn + t) * D);
  return out;
}

// (B, H, L, D) -> (B, L, H * D)
template <class T>
Tensor<T> merge_heads(const T* x, int64_t B, int64_t H, int64_t L, int64_t D) {
  profile::Scope scope(profile::Op::Copies);
  Tensor<T> out({B, L, H * D});
  for (int64_t b = 0; b < B; ++b)
    for (int64_t h = 0; h < H; ++h)
      for (int64_t i = 0; i < L; ++i)
        std::copy(x + ((b * H + h) * L + i) * D, x + ((b * H + h) * L + i + 1) * D,
                  out.ptr() + (b * L + i) * H * D + h * D);
  return out;
}

// The cache's first `length` positions as a (B, Hkv, length, D) tensor, and back.
template <class T>
Tensor<T> cache_view(const Tensor<T>& c, int64_t length) {
  const int64_t B = c.size(0), H = c.size(1), cap = c.size(2), D = c.size(3);
  Tensor<T> out({B, H, length, D});
  for (int64_t g = 0; g < B * H; ++g)
    std::copy(c.ptr() + g * cap * D, c.ptr() + (g * cap + length) * D, out.ptr() + g * length * D);
  return out;
}
template <class T>
void cache_store(Tensor<T>& c, const Tensor<T>& view) {
  const int64_t B = c.size(0), H = c.size(1), cap = c.size(2), D = c.size(3), length = view.size(2);
  for (int64_t g = 0; g < B * H; ++g)
    std::copy(view.ptr() + g * length * D, view.ptr() + (g + 1) * length * D, c.ptr() + g * cap * D);
}

// Appends (B, Hkv, T, D) to the cache (DynamicLayer.update's torch.cat along the sequence).
template <class T>
void cache_append(Tensor<T>& c, int64_t length, const Tensor<T>& x) {
  const int64_t B = c.size(0), H = c.size(1), cap = c.size(2), D = c.size(3), Tn = x.size(2);
  for (int64_t g = 0; g < B * H; ++g)
    std::copy(x.ptr() + g * Tn * D, x.ptr() + (g + 1) * Tn * D, c.ptr() + (g * cap + length) * D);
}

// Grows a cache to hold `need` positions (a session allocates once; a lone call allocates its own).
template <class T>
void cache_reserve(KvCache<T>& c, int64_t B, int64_t Hkv, int64_t D, int64_t need) {
  if (c.capacity() >= need && c.k.size(0) == B && c.k.size(1) == Hkv && c.k.size(3) == D) return;
  KvCache<T> bigger = make_cache<T>(B, Hkv, std::max(need, 2 * c.capacity()), D);
  if (c.length) {
    cache_append(bigger.k, 0, cache_view(c.k, c.length));
    cache_append(bigger.v, 0, cache_view(c.v, c.length));
  }
  bigger.length = c.length;
  c = std::move(bigger);
}

// Hands a cache's filled part to the observer (teacher forcing may overwrite it) and stores it back.
template <class T>
void observe_cache(Observer<T>* obs, KvCache<T>& c) {
  if (!obs) return;
  Tensor<T> k = cache_view(c.k, c.length), v = cache_view(c.v, c.length);
  obs->on("cache.k", k);
  obs->on("cache.v", v);
  cache_store(c.k, k);
  cache_store(c.v, v);
}

// Whether key j is visible to query i (absolute index past + i) of batch element b.
struct Visibility {
  const DecoderMask& m;
  int64_t past;
  int64_t window;  // the sliding window as the defects leave it; 0: none
  Visibility(const DecoderMask& mask, int64_t past_) : m(mask), past(past_), window(mask.window) {
    if (window > 0 && injected_defect() == Defect::WindowOffByOne) window += 1;  // window + 1 keys
    if (past > 0 && injected_defect() == Defect::WindowPrefillOnly) window = 0;  // the steps see all
  }
  bool operator()(int64_t b, int64_t i, int64_t j) const {
    if (m.causal && j > past + i) return false;
    if (window > 0 && j <= past + i - window) return false;  // slid out of the window
    return !(m.key_padding && m.key_padding[b * m.key_padding_stride + j]);
  }
};

}  // namespace

template <class T>
void rms_norm_forward(T* out, const T* inp, const T* weight, T eps, int64_t N, int64_t C) {
  // inp is (N, C), weight is (C); out will be (N, C)
  const bool outside = injected_defect() == Defect::RmsEpsOutside;
  for (int64_t n = 0; n < N; ++n) {
    const T* x = inp + n * C;
    T* y = out + n * C;
    const T variance = dot(x, x, C) / T(C);  // hidden_states.pow(2).mean(-1)
    const T r = outside ? T(1) / (std::sqrt(variance) + eps) : T(1) / std::sqrt(variance + eps);
    for (int64_t c = 0; c < C; ++c) y[c] = weight[c] * (x[c] * r);  // weight * (hidden_states * rsqrt(...))
  }
}

template <class T>
void gemma_rms_norm_forward(T* out, const T* inp, const T* weight, T eps, int64_t N, int64_t C) {
  // inp is (N, C), weight is (C); out will be (N, C)
  const T one = injected_defect() == Defect::GemmaNormWeight ? T(0) : T(1);  // the defect: weight alone
  for (int64_t n = 0; n < N; ++n) {
    const T* x = inp + n * C;
    T* y = out + n * C;
    const T r = T(1) / std::sqrt(dot(x, x, C) / T(C) + eps);                // rsqrt(x.pow(2).mean(-1) + eps)
    for (int64_t c = 0; c < C; ++c) y[c] = (x[c] * r) * (one + weight[c]);  // _norm(x) * (1.0 + weight)
  }
}

std::vector<double> rope_inv_freq(int64_t r, double theta, const Llama3RopeScaling& s) {
  std::vector<double> inv_freq(static_cast<size_t>(r / 2));
  for (size_t i = 0; i < inv_freq.size(); ++i) inv_freq[i] = 1.0 / std::pow(theta, double(2 * i) / double(r));
  if (!s.on()) return inv_freq;
  const double original = double(s.original_max_position_embeddings);
  const double low_freq_wavelen = original / s.low_freq_factor;
  const double high_freq_wavelen = original / s.high_freq_factor;
  for (double& f : inv_freq) {
    const double wavelen = 2 * 3.141592653589793 / f;  // math.pi
    const double llama = wavelen > low_freq_wavelen ? f / s.factor : f;  // the low frequencies slowed
    const double smooth = (original / wavelen - s.low_freq_factor) / (s.high_freq_factor - s.low_freq_factor);
    const double smoothed = (1 - smooth) * llama / s.factor + smooth * llama;
    const bool medium = !(wavelen < high_freq_wavelen) && !(wavelen > low_freq_wavelen);
    f = medium ? smoothed : llama;
  }
  return inv_freq;
}

template <class T>
void rope_tables(T* cos, T* sin, const int64_t* positions, int64_t N, int64_t r, double theta,
                 const Llama3RopeScaling& scaling) {
  // positions is (N); cos, sin will be (N, r / 2)
  const int64_t half = r / 2;
  const std::vector<double> inv_freq = rope_inv_freq(r, theta, scaling);
  for (int64_t n = 0; n < N; ++n)
    for (int64_t i = 0; i < half; ++i) {
      const double angle = double(positions[n]) * inv_freq[size_t(i)];
      cos[n * half + i] = T(std::cos(angle));
      sin[n * half + i] = T(std::sin(angle));
    }
}

template <class T>
void rotary_forward(T* x, const T* cos, const T* sin, int64_t B, int64_t H, int64_t Tn, int64_t D, int64_t r,
                    RopeStyle style) {
  // x is (B, H, Tn, D); cos, sin are (B, Tn, r / 2)
  if (injected_defect() == Defect::RopeConvention)
    style = style == RopeStyle::HalfSplit ? RopeStyle::Interleaved : RopeStyle::HalfSplit;
  const int64_t half = r / 2;
  for (int64_t b = 0; b < B; ++b)
    for (int64_t h = 0; h < H; ++h)
      for (int64_t t = 0; t < Tn; ++t) {
        T* row = x + ((b * H + h) * Tn + t) * D;
        const T* c = cos + (b * Tn + t) * half;
        const T* s = sin + (b * Tn + t) * half;
        for (int64_t i = 0; i < half; ++i) {
          const int64_t i1 = style == RopeStyle::HalfSplit ? i : 2 * i;
          const int64_t i2 = style == RopeStyle::HalfSplit ? i + half : 2 * i + 1;
          const T x1 = row[i1], x2 = row[i2];
          const T a1 = x1 * c[i], b1 = -x2 * s[i];  // q * cos + rotate(q) * sin, each product rounded
          const T a2 = x2 * c[i], b2 = x1 * s[i];
          row[i1] = a1 + b1;
          row[i2] = a2 + b2;
        }
      }
}

template <class T>
void gelu_new_forward(T* out, const T* inp, int64_t n) {
  const T k = T(std::sqrt(2.0 / M_PI));
  for (int64_t i = 0; i < n; ++i) {
    const T x = inp[i];
    out[i] = T(0.5) * x * (T(1) + std::tanh(k * (x + T(0.044715) * (x * x * x))));
  }
}

template <class T>
void conv1d_forward(T* out, const T* inp, const T* weight, const T* bias, int64_t N, int64_t C, int64_t OC) {
  // inp is (N, C), weight is (C, OC) (Conv1D's layout), bias is (OC); out will be (N, OC)
  GemmEpilogue<T> ep;
  ep.bias = bias;
  if (injected_defect() == Defect::Conv1dUntransposed)  // the (C, OC) buffer read as nn.Linear's (OC, C)
    return gemm(false, true, N, OC, C, T(1), inp, C, weight, C, T(0), out, OC, bias ? &ep : nullptr, num_threads());
  gemm(false, false, N, OC, C, T(1), inp, C, weight, OC, T(0), out, OC, bias ? &ep : nullptr, num_threads());
}

template <class T>
void llm_linear(T* out, const T* inp, const T* weight, const T* bias, int64_t N, int64_t C, int64_t OC) {
  if (N <= kGemvRows && core_path() == CorePath::Fast) return gemv_forward(out, inp, weight, bias, N, C, OC);
  linear_forward(out, inp, weight, bias, N, C, OC);
}

template <class T>
KvCache<T> make_cache(int64_t B, int64_t Hkv, int64_t capacity, int64_t D) {
  KvCache<T> c;
  c.k = Tensor<T>({B, Hkv, capacity, D});
  c.v = Tensor<T>({B, Hkv, capacity, D});
  return c;
}

template <class T>
Tensor<T> cached_attention(const Tensor<T>& q, const KvCache<T>& cache, int64_t groups, T scaling, T softcap,
                           const DecoderMask& mask, Observer<T>* obs) {
  // q is (B, H, L, D); cache.k, cache.v are (B, Hkv, capacity, D) with S = cache.length filled
  // context will be (B, L, H * D)
  const int64_t B = q.size(0), H = q.size(1), L = q.size(2), D = q.size(3);
  const int64_t S = cache.length, cap = cache.capacity(), Hkv = H / groups, past = S - L;
  const Visibility visible{mask, past};
  // A query row that sees no key (a left-padded prompt's padding) gets what transformers' additive
  // mask gives it, uniform weights over the masked keys (all its scores are the lowest value), which
  // only the explicit path computes: the fused one would give NaN.
  bool dead_rows = false;
  for (int64_t b = 0; b < B && !dead_rows; ++b)
    for (int64_t i = 0; i < L && !dead_rows; ++i) {
      bool any = false;
      for (int64_t j = 0; j < S && !any; ++j) any = visible(b, i, j);
      dead_rows = !any;
    }
  const bool interleaved = injected_defect() == Defect::KvRepeatInterleaved;
  auto kv_head = [&](int64_t h) { return interleaved ? h % Hkv : h / groups; };  // repeat_kv: blocked
  Tensor<T> ctx_heads({B, H, L, D});
  if (injected_defect() == Defect::SoftcapMissing) softcap = T(0);
  const bool cap_after_mask = softcap > 0 && injected_defect() == Defect::SoftcapAfterMask;
  // the fused attention scales and masks; a soft-cap between the two takes the explicit path
  if (!obs && !interleaved && !dead_rows && softcap == T(0) && core_path() == CorePath::Fast) {
    // The fused attention, the kv heads shared through AttentionLayout::repeat, the masks as -inf (the same weights
    // as transformers' lowest value wherever a row sees a key, and blocks the causal mask closes skipped).
    const T ninf = -std::numeric_limits<T>::infinity();
    std::vector<T> attn, bias;
    AttentionMasks<T> m;
    // causal and the window, the same for every row of the batch (one decoding query sees every key
    // of the cache unless some slid out of the window)
    if ((mask.causal && L > 1) || (visible.window > 0 && S > visible.window)) {
      attn.assign(size_t(L * S), T(0));
      DecoderMask order = mask;
      order.key_padding = nullptr;  // the padding goes in key_bias
      const Visibility in_order{order, past};
      for (int64_t i = 0; i < L; ++i)
        for (int64_t j = 0; j < S; ++j)
          if (!in_order(0, i, j)) attn[size_t(i * S + j)] = ninf;
      m.attn = attn.data();
    }
    if (mask.key_padding) {
      bias.assign(size_t(B * S), T(0));
      for (int64_t b = 0; b < B; ++b)
        for (int64_t j = 0; j < S; ++j)
          if (mask.key_padding[b * mask.key_padding_stride + j]) bias[size_t(b * S + j)] = ninf;
      m.key_bias = bias.data();
      m.heads = H;
    }
    AttentionLayout layout;  // q (B, H, L, D); the cache (B, Hkv, cap, D), its first S rows
    layout.repeat = groups, layout.k.head = cap * D, layout.v.head = cap * D;
    fused_attention(ctx_heads.ptr(), q.ptr(), cache.k.ptr(), cache.v.ptr(), B * H, L, S, D, D, scaling, m,
                    num_threads(), layout);
    return merge_heads(ctx_heads.ptr(), B, H, L, D);
  }
  // eager_attention_forward, step by step: matmul(q, repeat_kv(k)^T) * scaling + mask, softmax, matmul v.
  // The scores component holds -inf where a key is masked (the canonical layout, whatever the
  // dtype; transformers' own tensor holds finfo(dtype).min there).
  const T ninf = -std::numeric_limits<T>::infinity();
  Tensor<T> scores({B, H, L, S});
  for (int64_t b = 0; b < B; ++b)
    for (int64_t h = 0; h < H; ++h) {
      const T* kh = cache.k.ptr() + (b * Hkv + kv_head(h)) * cap * D;
      T* sc = scores.ptr() + (b * H + h) * L * S;
      for (int64_t i = 0; i < L; ++i)
        for (int64_t j = 0; j < S; ++j) {
          T s = dot(q.ptr() + ((b * H + h) * L + i) * D, kh + j * D, D) * scaling;
          if (softcap > 0) s = std::tanh(s / softcap) * softcap;  // attn_weights / softcap, tanh, * softcap
          // the defect caps the masked score too: tanh(lowest / cap) * cap = -cap
          sc[i * S + j] = visible(b, i, j) ? s : cap_after_mask ? -softcap : ninf;
        }
    }
  if (obs) obs->on("scores", scores);
  Tensor<T> weights({B, H, L, S});
  softmax_forward(weights.ptr(), scores.ptr(), B * H * L, S);
  // transformers adds the lowest value where a key is masked: the weights are those of -inf wherever
  // a row sees a key, and a row that sees none gets its scores all equal, so uniform weights 1 / S.
  if (dead_rows)
    for (int64_t b = 0; b < B; ++b)
      for (int64_t i = 0; i < L; ++i) {
        bool any = false;
        for (int64_t j = 0; j < S && !any; ++j) any = visible(b, i, j);
        if (!any)
          for (int64_t h = 0; h < H; ++h) std::fill_n(weights.ptr() + ((b * H + h) * L + i) * S, S, T(1) / T(S));
      }
  if (obs) obs->on("attn_weights", weights);
  for (int64_t b = 0; b < B; ++b)
    for (int64_t h = 0; h < H; ++h) {
      const T* vh = cache.v.ptr() + (b * Hkv + kv_head(h)) * cap * D;
      gemm(false, false, L, D, S, T(1), weights.ptr() + (b * H + h) * L * S, S, vh, D, T(0),
           ctx_heads.ptr() + (b * H + h) * L * D, D);
    }
  return merge_heads(ctx_heads.ptr(), B, H, L, D);
}

template <class T>
Tensor<T> llama_attention_forward(const LlamaConfig& c, const LlamaAttentionWeights<T>& w, const Tensor<T>& x,
                                  const DecoderMask& mask, KvCache<T>* cache, Observer<T>* obs) {
  // x is (B, T, hidden); output will be (B, T, hidden)
  const int64_t C = c.hidden_size, H = c.num_heads, Hkv = c.num_kv_heads, D = c.head_dim, r = c.rotary_dim();
  if (x.dim() != 3 || x.size(2) != C)
    throw ShapeError("hidden_states: expected (B, T, " + std::to_string(C) + "), got shape " + to_string(x.shape));
  need_shape(w.q_proj_weight, "q_proj.weight", {H * D, C});
  need_shape(w.k_proj_weight, "k_proj.weight", {Hkv * D, C});
  need_shape(w.v_proj_weight, "v_proj.weight", {Hkv * D, C});
  need_shape(w.o_proj_weight, "o_proj.weight", {C, H * D});
  const int64_t B = x.size(0), Tn = x.size(1), N = B * Tn;
  KvCache<T> own;
  KvCache<T>& kv = cache ? *cache : own;
  const int64_t past = kv.length;
  // q_proj, k_proj, v_proj, then .view(B, T, -1, D).transpose(1, 2)
  auto project = [&](const Tensor<T>& wt, const Tensor<T>& bias, int64_t heads) {
    std::vector<T> y(static_cast<size_t>(N * heads * D));
    {
      profile::Scope scope(profile::Op::Projections);
      llm_linear(y.data(), x.ptr(), wt.ptr(), bias_or_null(bias), N, C, heads * D);
    }
    return split_heads(y.data(), B, Tn, heads, D, heads * D);
  };
  Tensor<T> q = project(w.q_proj_weight, w.q_proj_bias, H);
  Tensor<T> k = project(w.k_proj_weight, w.k_proj_bias, Hkv);
  Tensor<T> v = project(w.v_proj_weight, w.v_proj_bias, Hkv);
  if (obs) obs->on("q", q), obs->on("k", k), obs->on("v", v);
  // Qwen3: q_norm and k_norm over each head's D dims, before rotary (the defect: after it)
  const bool qk_norm_late = c.qk_norm && injected_defect() == Defect::QkNormAfterRotary;
  auto head_norm = [&](Tensor<T>& t, const Tensor<T>& weight, const char* name) {
    need_shape(weight, std::string("self_attn.") + name + ".weight", {D});
    profile::Scope scope(profile::Op::Norms);
    rms_norm_forward(t.ptr(), t.ptr(), weight.ptr(), T(c.rms_norm_eps), t.numel() / D, D);
  };
  if (c.qk_norm && !qk_norm_late) head_norm(q, w.q_norm, "q_norm"), head_norm(k, w.k_norm, "k_norm");
  if (c.qk_norm && obs) obs->on("q_norm", q), obs->on("k_norm", k);
  // position_embeddings: cos and sin at each token's position (position_ids; else the cache's length on)
  std::vector<int64_t> pos(static_cast<size_t>(N));
  const bool off_by_one = past > 0 && injected_defect() == Defect::RopeDecodeOffset;
  for (int64_t b = 0; b < B; ++b)
    for (int64_t t = 0; t < Tn; ++t) {
      const int64_t p =
          mask.positions ? mask.positions[b * (mask.positions_stride ? mask.positions_stride : Tn) + t] : past + t;
      if (p < 0 || p >= c.max_position_embeddings)
        throw ShapeError("position_ids: expected positions in [0, max_position_embeddings = " +
                         std::to_string(c.max_position_embeddings) + "), got " + std::to_string(p));
      pos[size_t(b * Tn + t)] = p + (off_by_one ? 1 : 0);
    }
  std::optional<profile::Scope> phase(std::in_place, profile::Op::Rope);
  std::vector<T> cos(static_cast<size_t>(N * (r / 2))), sin(cos.size());
  rope_tables(cos.data(), sin.data(), pos.data(), N, r, c.rope_theta, c.rope_scaling);
  Tensor<T> q_rot = q, k_rot = k;
  rotary_forward(q_rot.ptr(), cos.data(), sin.data(), B, H, Tn, D, r, c.rope);
  rotary_forward(k_rot.ptr(), cos.data(), sin.data(), B, Hkv, Tn, D, r, c.rope);
  if (qk_norm_late) head_norm(q_rot, w.q_norm, "q_norm"), head_norm(k_rot, w.k_norm, "k_norm");
  if (obs) obs->on("q_rot", q_rot), obs->on("k_rot", k_rot);
  // past_key_values.update(key_states, value_states): the cache holds k after rotary
  cache_reserve(kv, B, Hkv, D, past + Tn);
  cache_append(kv.k, past, injected_defect() == Defect::CacheBeforeRotary ? k : k_rot);
  cache_append(kv.v, past, v);
  kv.length = past + Tn;
  phase.reset();
  if (cache) observe_cache(obs, kv);
  DecoderMask windowed = mask;
  windowed.window = c.sliding_window;
  // self.scaling: head_dim**-0.5, Gemma 2's query_pre_attn_scalar**-0.5
  const T scaling = T(std::pow(c.query_pre_attn_scalar > 0 ? c.query_pre_attn_scalar : double(D), -0.5));
  Tensor<T> ctx = cached_attention(q_rot, kv, c.groups(), scaling, T(c.attn_logit_softcapping), windowed, obs);
  if (obs) obs->on("context", ctx);
  profile::Scope o_proj(profile::Op::OutProj);
  Tensor<T> out = Tensor<T>::unset({B, Tn, C});
  llm_linear(out.ptr(), ctx.ptr(), w.o_proj_weight.ptr(), bias_or_null(w.o_proj_bias), N, H * D, C);
  if (obs) obs->on("output", out);
  return out;
}

template <class T>
Tensor<T> llama_layer_forward(const LlamaConfig& c, const LlamaLayerWeights<T>& w, const Tensor<T>& x,
                              const DecoderMask& mask, KvCache<T>* cache, Observer<T>* obs) {
  // x is (B, T, hidden); output will be (B, T, hidden)
  const int64_t C = c.hidden_size, I = c.intermediate_size;
  need_layer_shapes(c, w, x);
  const int64_t N = x.size(0) * x.size(1);
  const T eps = T(c.rms_norm_eps);
  std::optional<profile::Scope> phase(std::in_place, profile::Op::Norms);
  Tensor<T> h = Tensor<T>::unset(x.shape);
  rms_norm_forward(h.ptr(), x.ptr(), w.input_layernorm.ptr(), eps, N, C);
  phase.reset();
  if (obs) obs->on("input_layernorm", h);
  PrefixObserver<T> sub(obs, "attn.");
  const Tensor<T> a = llama_attention_forward(c, w.self_attn, h, mask, cache, PrefixObserver<T>::wrap(obs, sub));
  phase.emplace(profile::Op::OutProj);
  Tensor<T> x1 = Tensor<T>::unset(x.shape);
  add_forward(x1.ptr(), x.ptr(), a.ptr(), N * C);  // residual + hidden_states
  phase.reset();
  if (obs) obs->on("attn_residual", x1);
  phase.emplace(profile::Op::Norms);
  Tensor<T> h2 = Tensor<T>::unset(x.shape);
  rms_norm_forward(h2.ptr(), x1.ptr(), w.post_attention_layernorm.ptr(), eps, N, C);
  phase.reset();
  if (obs) obs->on("post_attention_layernorm", h2);
  // LlamaMLP: down_proj(act_fn(gate_proj(x)) * up_proj(x)), act_fn silu
  const bool swap = injected_defect() == Defect::GateUpSwapped;
  const Tensor<T>& wg = swap ? w.up_proj_weight : w.gate_proj_weight;
  const Tensor<T>& bg = swap ? w.up_proj_bias : w.gate_proj_bias;
  const Tensor<T>& wu = swap ? w.gate_proj_weight : w.up_proj_weight;
  const Tensor<T>& bu = swap ? w.gate_proj_bias : w.up_proj_bias;
  profile::Scope mlp(profile::Op::FFN);
  Tensor<T> gate = Tensor<T>::unset({x.size(0), x.size(1), I}), up = Tensor<T>::unset(gate.shape);
  llm_linear(gate.ptr(), h2.ptr(), wg.ptr(), bias_or_null(bg), N, C, I);
  llm_linear(up.ptr(), h2.ptr(), wu.ptr(), bias_or_null(bu), N, C, I);
  if (obs) obs->on("mlp.gate", gate), obs->on("mlp.up", up);
  Tensor<T> act = Tensor<T>::unset(gate.shape);
  silu_forward(act.ptr(), gate.ptr(), N * I);
  for (int64_t i = 0; i < N * I; ++i) act.data[size_t(i)] *= up.data[size_t(i)];
  if (obs) obs->on("mlp.act", act);
  Tensor<T> down = Tensor<T>::unset(x.shape);
  llm_linear(down.ptr(), act.ptr(), w.down_proj_weight.ptr(), bias_or_null(w.down_proj_bias), N, I, C);
  if (obs) obs->on("mlp.down", down);
  Tensor<T> out = Tensor<T>::unset(x.shape);
  add_forward(out.ptr(), x1.ptr(), down.ptr(), N * C);
  if (obs) obs->on("output", out);
  return out;
}

template <class T>
Tensor<T> gemma2_layer_forward(const LlamaConfig& c, const LlamaLayerWeights<T>& w, const Tensor<T>& x,
                               const DecoderMask& mask, KvCache<T>* cache, Observer<T>* obs) {
  // x is (B, T, hidden); output will be (B, T, hidden)
  const int64_t C = c.hidden_size, I = c.intermediate_size;
  need_layer_shapes(c, w, x);
  need_shape(w.pre_feedforward_layernorm, "pre_feedforward_layernorm.weight", {C});
  need_shape(w.post_feedforward_layernorm, "post_feedforward_layernorm.weight", {C});
  const int64_t N = x.size(0) * x.size(1);
  const T eps = T(c.rms_norm_eps);
  auto norm = [&](const Tensor<T>& in, const Tensor<T>& weight, const char* name) {
    profile::Scope scope(profile::Op::Norms);
    Tensor<T> y = Tensor<T>::unset(in.shape);
    gemma_rms_norm_forward(y.ptr(), in.ptr(), weight.ptr(), eps, in.numel() / C, C);
    if (obs) obs->on(name, y);
    return y;
  };
  auto residual = [&](const Tensor<T>& a, const Tensor<T>& b, const char* name) {
    Tensor<T> y = Tensor<T>::unset(a.shape);
    add_forward(y.ptr(), a.ptr(), b.ptr(), N * C);
    if (obs) obs->on(name, y);
    return y;
  };
  // residual = x; h = input_layernorm(x); h = self_attn(h); h = post_attention_layernorm(h); x = residual + h
  const Tensor<T> h = norm(x, w.input_layernorm, "input_layernorm");
  PrefixObserver<T> sub(obs, "attn.");
  const Tensor<T> a = llama_attention_forward(c, w.self_attn, h, mask, cache, PrefixObserver<T>::wrap(obs, sub));
  const Tensor<T> x1 = residual(x, norm(a, w.post_attention_layernorm, "post_attention_layernorm"), "attn_residual");
  // residual = x; h = pre_feedforward_layernorm(x); h = mlp(h); h = post_feedforward_layernorm(h); x = residual + h
  const Tensor<T> h2 = norm(x1, w.pre_feedforward_layernorm, "pre_feedforward_layernorm");
  std::optional<profile::Scope> mlp(std::in_place, profile::Op::FFN);
  Tensor<T> gate = Tensor<T>::unset({x.size(0), x.size(1), I}), up = Tensor<T>::unset(gate.shape);
  llm_linear(gate.ptr(), h2.ptr(), w.gate_proj_weight.ptr(), bias_or_null(w.gate_proj_bias), N, C, I);
  llm_linear(up.ptr(), h2.ptr(), w.up_proj_weight.ptr(), bias_or_null(w.up_proj_bias), N, C, I);
  if (obs) obs->on("mlp.gate", gate), obs->on("mlp.up", up);
  // Gemma2MLP: down_proj(act_fn(gate_proj(x)) * up_proj(x)), act_fn gelu_pytorch_tanh, the formula of
  // gelu_new: 0.5 x (1 + tanh(sqrt(2 / pi) (x + 0.044715 x^3)))
  Tensor<T> act = Tensor<T>::unset(gate.shape);
  gelu_new_forward(act.ptr(), gate.ptr(), N * I);
  for (int64_t i = 0; i < N * I; ++i) act.data[size_t(i)] *= up.data[size_t(i)];
  if (obs) obs->on("mlp.act", act);
  Tensor<T> down = Tensor<T>::unset(x.shape);
  llm_linear(down.ptr(), act.ptr(), w.down_proj_weight.ptr(), bias_or_null(w.down_proj_bias), N, I, C);
  if (obs) obs->on("mlp.down", down);
  mlp.reset();
  return residual(x1, norm(down, w.post_feedforward_layernorm, "post_feedforward_layernorm"), "output");
}

template <class T>
Tensor<T> gpt2_block_forward(const Gpt2Config& c, const Gpt2Weights<T>& w, const Tensor<T>& x, const DecoderMask& mask,
                             KvCache<T>* cache, Observer<T>* obs) {
  // x is (B, T, hidden); output will be (B, T, hidden)
  const int64_t C = c.hidden_size, H = c.num_heads, D = C / H, F = c.inner_dim;
  if (x.dim() != 3 || x.size(2) != C)
    throw ShapeError("hidden_states: expected (B, T, " + std::to_string(C) + "), got shape " + to_string(x.shape));
  need_shape(w.c_attn_weight, "attn.c_attn.weight", {C, 3 * C});
  need_shape(w.c_proj_weight, "attn.c_proj.weight", {C, C});
  need_shape(w.c_fc_weight, "mlp.c_fc.weight", {C, F});
  need_shape(w.mlp_c_proj_weight, "mlp.c_proj.weight", {F, C});
  const int64_t B = x.size(0), Tn = x.size(1), N = B * Tn;
  const T eps = T(c.layer_norm_epsilon);
  Tensor<T> h = Tensor<T>::unset(x.shape);
  layernorm_forward(h.ptr(), x.ptr(), w.ln_1_weight.ptr(), w.ln_1_bias.ptr(), eps, N, C);
  if (obs) obs->on("ln_1", h);
  // c_attn(hidden_states).split(split_size, dim=2), each .view(B, T, -1, D).transpose(1, 2)
  std::vector<T> qkv(static_cast<size_t>(N * 3 * C));
  conv1d_forward(qkv.data(), h.ptr(), w.c_attn_weight.ptr(), bias_or_null(w.c_attn_bias), N, C, 3 * C);
  Tensor<T> q = split_heads(qkv.data(), B, Tn, H, D, 3 * C);
  Tensor<T> k = split_heads(qkv.data() + C, B, Tn, H, D, 3 * C);
  Tensor<T> v = split_heads(qkv.data() + 2 * C, B, Tn, H, D, 3 * C);
  PrefixObserver<T> sub(obs, "attn.");
  Observer<T>* aobs = PrefixObserver<T>::wrap(obs, sub);
  if (aobs) aobs->on("q", q), aobs->on("k", k), aobs->on("v", v);
  KvCache<T> own;
  KvCache<T>& kv = cache ? *cache : own;
  const int64_t past = kv.length;
  cache_reserve(kv, B, H, D, past + Tn);
  cache_append(kv.k, past, k);
  cache_append(kv.v, past, v);
  kv.length = past + Tn;
  if (cache) observe_cache(aobs, kv);
  Tensor<T> ctx = cached_attention(q, kv, 1, T(std::pow(double(D), -0.5)), T(0), mask, aobs);
  if (aobs) aobs->on("context", ctx);
  Tensor<T> a = Tensor<T>::unset(x.shape);
  conv1d_forward(a.ptr(), ctx.ptr(), w.c_proj_weight.ptr(), bias_or_null(w.c_proj_bias), N, C, C);
  if (aobs) aobs->on("output", a);
  Tensor<T> x1 = Tensor<T>::unset(x.shape);
  add_forward(x1.ptr(), a.ptr(), x.ptr(), N * C);  // attn_output + residual
  if (obs) obs->on("attn_residual", x1);
  Tensor<T> h2 = Tensor<T>::unset(x.shape);
  layernorm_forward(h2.ptr(), x1.ptr(), w.ln_2_weight.ptr(), w.ln_2_bias.ptr(), eps, N, C);
  if (obs) obs->on("ln_2", h2);
  Tensor<T> fc = Tensor<T>::unset({B, Tn, F});
  conv1d_forward(fc.ptr(), h2.ptr(), w.c_fc_weight.ptr(), bias_or_null(w.c_fc_bias), N, C, F);
  if (obs) obs->on("mlp.fc", fc);
  Tensor<T> act = Tensor<T>::unset(fc.shape);
  gelu_new_forward(act.ptr(), fc.ptr(), N * F);
  if (obs) obs->on("mlp.act", act);
  Tensor<T> m = Tensor<T>::unset(x.shape);
  conv1d_forward(m.ptr(), act.ptr(), w.mlp_c_proj_weight.ptr(), bias_or_null(w.mlp_c_proj_bias), N, F, C);
  if (obs) obs->on("mlp.proj", m);
  Tensor<T> out = Tensor<T>::unset(x.shape);
  add_forward(out.ptr(), x1.ptr(), m.ptr(), N * C);  // residual + feed_forward_hidden_states
  if (obs) obs->on("output", out);
  return out;
}

#define TPARITY_INSTANTIATE(T)                                                                                         \
  template void rms_norm_forward<T>(T*, const T*, const T*, T, int64_t, int64_t);                                      \
  template void rope_tables<T>(T*, T*, const int64_t*, int64_t, int64_t, double, const Llama3RopeScaling&);            \
  template void rotary_forward<T>(T*, const T*, const T*, int64_t, int64_t, int64_t, int64_t, int64_t, RopeStyle);     \
  template void gelu_new_forward<T>(T*, const T*, int64_t);                                                            \
  template void llm_linear<T>(T*, const T*, const T*, const T*, int64_t, int64_t, int64_t);                            \
  template void conv1d_forward<T>(T*, const T*, const T*, const T*, int64_t, int64_t, int64_t);                        \
  template KvCache<T> make_cache<T>(int64_t, int64_t, int64_t, int64_t);                                               \
  template void gemma_rms_norm_forward<T>(T*, const T*, const T*, T, int64_t, int64_t);                                \
  template Tensor<T> cached_attention<T>(const Tensor<T>&, const KvCache<T>&, int64_t, T, T, const DecoderMask&,       \
                                         Observer<T>*);                                                                \
  template Tensor<T> gemma2_layer_forward<T>(const LlamaConfig&, const LlamaLayerWeights<T>&, const Tensor<T>&,        \
                                             const DecoderMask&, KvCache<T>*, Observer<T>*);                           \
  template Tensor<T> llama_attention_forward<T>(const LlamaConfig&, const LlamaAttentionWeights<T>&, const Tensor<T>&, \
                                                const DecoderMask&, KvCache<T>*, Observer<T>*);                        \
  template Tensor<T> llama_layer_forward<T>(const LlamaConfig&, const LlamaLayerWeights<T>&, const Tensor<T>&,         \
                                            const DecoderMask&, KvCache<T>*, Observer<T>*);                            \
  template Tensor<T> gpt2_block_forward<T>(const Gpt2Config&, const Gpt2Weights<T>&, const Tensor<T>&,                 \
                                           const DecoderMask&, KvCache<T>*, Observer<T>*);
TPARITY_INSTANTIATE(float)
TPARITY_INSTANTIATE(double)
#undef TPARITY_INSTANTIATE

}  // namespace tparity
