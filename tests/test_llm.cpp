// The LLM blocks' ops (core/llm.hpp) against hand-worked answers and long-double twins: RMSNorm,
// rotary in both conventions and partial, repeat_kv's order, SwiGLU, Conv1D's layout, the fused GQA
// path against the explicit one, and a decode session against the full causal forward.
#include <catch2/catch.hpp>
#include <cmath>
#include <map>
#include <string>
#include <vector>

#include "tparity/core/defects.hpp"
#include "tparity/core/llm.hpp"
#include "tparity/harness/rng.hpp"

using namespace tparity;

namespace {

template <class T>
Tensor<T> random_tensor(Shape s, uint64_t seed, double scale = 1.0) {
  Rng rng(seed);
  Tensor<T> t(std::move(s));
  for (T& x : t.data) x = T(scale * rng.uniform(-1, 1));
  return t;
}

// Keeps every component a forward hands its observer, by name.
struct Keep final : Observer<double> {
  std::map<std::string, Tensor<double>> seen;
  void on(const std::string& n, Tensor<double>& t) override { seen[n] = t; }
};

double rel_diff(const Tensor<double>& a, const Tensor<double>& b) {
  long double num = 0, den = 0;
  for (size_t i = 0; i < a.data.size(); ++i) {
    num += (long double)(a.data[i] - b.data[i]) * (a.data[i] - b.data[i]);
    den += (long double)b.data[i] * b.data[i];
  }
  return double(std::sqrt(num / den));
}

}  // namespace

TEST_CASE("llm: RMSNorm against hand-worked values / eps inside the root", "[llm]") {
  // x = (3, 4): mean(x^2) = 12.5; eps 0.5 -> rsqrt(13); weight (1, 2)
  const double x[2] = {3, 4}, w[2] = {1, 2};
  double y[2];
  rms_norm_forward(y, x, w, 0.5, 1, 2);
  CHECK(y[0] == Approx(3 / std::sqrt(13.0)).epsilon(1e-15));
  CHECK(y[1] == Approx(8 / std::sqrt(13.0)).epsilon(1e-15));
  ScopedDefect d(Defect::RmsEpsOutside);  // 1 / (sqrt(12.5) + 0.5): another number
  rms_norm_forward(y, x, w, 0.5, 1, 2);
  CHECK(y[0] == Approx(3 / (std::sqrt(12.5) + 0.5)).epsilon(1e-15));
}

TEST_CASE("llm: rotary tables and both pair conventions, hand-worked", "[llm]") {
  // r = 4, theta 10000: inv_freq (1, 1/100); position 2: angles (2, 0.02)
  const int64_t pos = 2;
  double c[2], s[2];
  rope_tables(c, s, &pos, 1, 4, 10000.0);
  CHECK(c[0] == std::cos(2.0));
  CHECK(s[1] == Approx(std::sin(0.02)).epsilon(1e-15));
  const long double a0 = 2.0L, a1 = 0.02L;
  SECTION("half: pairs (i, i + r/2), rotate_half") {
    double x[4] = {1, 2, 3, 4};
    rotary_forward(x, c, s, 1, 1, 1, 4, 4, RopeStyle::HalfSplit);
    CHECK(x[0] == Approx(double(1 * std::cos(a0) - 3 * std::sin(a0))).epsilon(1e-14));
    CHECK(x[2] == Approx(double(3 * std::cos(a0) + 1 * std::sin(a0))).epsilon(1e-14));
    CHECK(x[1] == Approx(double(2 * std::cos(a1) - 4 * std::sin(a1))).epsilon(1e-14));
    CHECK(x[3] == Approx(double(4 * std::cos(a1) + 2 * std::sin(a1))).epsilon(1e-14));
  }
  SECTION("interleaved: pairs (2i, 2i + 1), rotate_every_two") {
    double x[4] = {1, 2, 3, 4};
    rotary_forward(x, c, s, 1, 1, 1, 4, 4, RopeStyle::Interleaved);
    CHECK(x[0] == Approx(double(1 * std::cos(a0) - 2 * std::sin(a0))).epsilon(1e-14));
    CHECK(x[1] == Approx(double(2 * std::cos(a0) + 1 * std::sin(a0))).epsilon(1e-14));
    CHECK(x[2] == Approx(double(3 * std::cos(a1) - 4 * std::sin(a1))).epsilon(1e-14));
    CHECK(x[3] == Approx(double(4 * std::cos(a1) + 3 * std::sin(a1))).epsilon(1e-14));
  }
  SECTION("partial: only the first r dims rotate (GPT-NeoX rotary_pct, GPT-J rotary_dim)") {
    double cc[1], ss[1];
    rope_tables(cc, ss, &pos, 1, 2, 10000.0);  // r = 2: one pair, angle 2
    double x[6] = {1, 2, 3, 4, 5, 6};
    rotary_forward(x, cc, ss, 1, 1, 1, 6, 2, RopeStyle::HalfSplit);
    CHECK(x[0] == Approx(double(1 * std::cos(a0) - 2 * std::sin(a0))).epsilon(1e-14));
    CHECK(x[1] == Approx(double(2 * std::cos(a0) + 1 * std::sin(a0))).epsilon(1e-14));
    for (int i = 2; i < 6; ++i) CHECK(x[i] == double(i + 1));
  }
}

TEST_CASE("llm: Llama 3's rope scaling, each band as Meta's apply_scaling treats it", "[llm]") {
  // r = 6, theta 10000: inv_freq 1, 10000^(-1/3), 10000^(-2/3), wavelengths 2 pi / f = 6.3, 135.4, 2916.5.
  // original 1024, low_freq_factor 1, high_freq_factor 8: above 1024 slowed by the factor, below 128
  // kept, between smoothed: Meta's llama3 reference (models/llama3 apply_scaling) as an if-chain.
  Llama3RopeScaling s;
  s.factor = 4, s.low_freq_factor = 1, s.high_freq_factor = 8, s.original_max_position_embeddings = 1024;
  const std::vector<double> plain = rope_inv_freq(6, 10000.0, Llama3RopeScaling{});
  REQUIRE(plain.size() == 3);
  CHECK(plain[0] == 1.0);
  CHECK(plain[1] == Approx(std::pow(10000.0L, -1.0L / 3)).epsilon(1e-15));
  const std::vector<double> scaled = rope_inv_freq(6, 10000.0, s);
  auto meta = [](long double freq) {
    const long double wavelen = 2 * 3.14159265358979323846264338327950288L / freq;
    if (wavelen < 1024.0L / 8) return freq;
    if (wavelen > 1024.0L / 1) return freq / 4;
    const long double smooth = (1024 / wavelen - 1) / (8 - 1);
    return (1 - smooth) * freq / 4 + smooth * freq;
  };
  CHECK(scaled[0] == plain[0]);      // high frequency: kept
  CHECK(scaled[2] == plain[2] / 4);  // low frequency: slowed by the factor
  CHECK(scaled[1] != plain[1]);      // between: smoothed
  CHECK(scaled[1] > plain[1] / 4);
  for (size_t i = 0; i < 3; ++i) CHECK(scaled[i] == Approx(double(meta(plain[i]))).epsilon(1e-14));
  // the tables: angle = position * the scaled frequency
  const int64_t pos = 300;
  double c[3], sn[3];
  rope_tables(c, sn, &pos, 1, 6, 10000.0, s);
  for (size_t i = 0; i < 3; ++i) CHECK(c[i] == std::cos(300 * scaled[i]));
}

TEST_CASE("llm: repeat_kv's blocks: query head h reads kv head h / (H / Hkv)", "[llm]") {
  // H = 4 query heads over Hkv = 2; one key; v of kv head 0 is all 0, of kv head 1 all 1: the
  // context of query heads 0, 1 must be 0 and of 2, 3 must be 1 (interleaved would give 0, 1, 0, 1).
  const int64_t B = 1, H = 4, K = 2, D = 3;
  KvCache<double> cache = make_cache<double>(B, K, 4, D);
  for (int64_t d = 0; d < D; ++d) cache.v.data[size_t(1 * 4 * D + d)] = 1.0;
  cache.length = 1;
  Tensor<double> q = random_tensor<double>({B, H, 1, D}, 1);
  DecoderMask m;
  for (bool fused : {false, true}) {
    struct Null final : Observer<double> {
      void on(const std::string&, Tensor<double>&) override {}
    } null;
    const Tensor<double> ctx = cached_attention(q, cache, H / K, 0.5, 0.0, m, fused ? nullptr : &null);
    CAPTURE(fused);
    for (int64_t h = 0; h < H; ++h)
      for (int64_t d = 0; d < D; ++d) CHECK(ctx.data[size_t(h * D + d)] == (h < 2 ? 0.0 : 1.0));
  }
}

TEST_CASE("llm: Conv1D reads its (in, out) weight", "[llm]") {
  // x (1, 2) = (1, 2); W (2, 3) = [[1, 2, 3], [4, 5, 6]]; b = (0.5, 0, 0): y = x W + b = (9.5, 12, 15)
  const float x[2] = {1, 2}, W[6] = {1, 2, 3, 4, 5, 6}, b[3] = {0.5f, 0, 0};
  float y[3];
  conv1d_forward(y, x, W, b, 1, 2, 3);
  CHECK(y[0] == 9.5f);
  CHECK(y[1] == 12.0f);
  CHECK(y[2] == 15.0f);
}

TEST_CASE("llm: a one-dim LlamaDecoderLayer worked by hand (RMSNorm, attention of one key, SwiGLU)", "[llm]") {
  // hidden 1, one head of dim 1, no rotary dims: h = x / |x| = 1 for x = 2; attention over one key
  // gives v; x1 = x + wo wv; h2 = 1; SwiGLU: wd silu(wg) wu; out = x1 + that.
  LlamaConfig c;
  c.hidden_size = 1, c.num_heads = 1, c.num_kv_heads = 1, c.head_dim = 1, c.intermediate_size = 1;
  c.rms_norm_eps = 0, c.partial_rotary_factor = 0;
  LlamaLayerWeights<double> w;
  auto one = [](double v) { return Tensor<double>({1, 1}, std::vector<double>{v}); };
  w.self_attn.q_proj_weight = one(0.3), w.self_attn.k_proj_weight = one(0.7), w.self_attn.v_proj_weight = one(0.5);
  w.self_attn.o_proj_weight = one(2.0);
  w.input_layernorm = Tensor<double>({1}, std::vector<double>{1.0});
  w.post_attention_layernorm = Tensor<double>({1}, std::vector<double>{1.0});
  w.gate_proj_weight = one(1.5), w.up_proj_weight = one(-0.25), w.down_proj_weight = one(3.0);
  const Tensor<double> x({1, 1, 1}, std::vector<double>{2.0});
  const double x1 = 2.0 + 2.0 * 0.5;
  const double silu = 1.5 / (1 + std::exp(-1.5));
  CHECK(llama_layer_forward(c, w, x, DecoderMask{}).data[0] == Approx(x1 + 3.0 * silu * -0.25).epsilon(1e-15));
  ScopedDefect d(Defect::GateUpSwapped);  // silu(up) * gate
  const double swapped = -0.25 / (1 + std::exp(0.25)) * 1.5;
  CHECK(llama_layer_forward(c, w, x, DecoderMask{}).data[0] == Approx(x1 + 3.0 * swapped).epsilon(1e-15));
}

TEST_CASE("llm: a decode session gives the full causal forward's rows / the fused GQA path the explicit one's",
          "[llm]") {
  LlamaConfig c;
  c.hidden_size = 16, c.num_heads = 4, c.num_kv_heads = 2, c.head_dim = 8, c.intermediate_size = 24;
  c.partial_rotary_factor = 0.5;  // 4 of 8 dims rotate
  LlamaLayerWeights<double> w;
  uint64_t seed = 10;
  auto lin = [&](int64_t out, int64_t in) {
    return random_tensor<double>({out, in}, seed++, 1 / std::sqrt(double(in)));
  };
  w.self_attn.q_proj_weight = lin(32, 16), w.self_attn.k_proj_weight = lin(16, 16);
  w.self_attn.v_proj_weight = lin(16, 16), w.self_attn.o_proj_weight = lin(16, 32);
  w.gate_proj_weight = lin(24, 16), w.up_proj_weight = lin(24, 16), w.down_proj_weight = lin(16, 24);
  w.input_layernorm = Tensor<double>({16}, 1.0), w.post_attention_layernorm = Tensor<double>({16}, 1.1);
  const int64_t B = 2, Tn = 11, P = 6;
  const Tensor<double> x = random_tensor<double>({B, Tn, 16}, 99);
  std::vector<int64_t> pos;
  for (int64_t b = 0; b < B; ++b)
    for (int64_t t = 0; t < Tn; ++t) pos.push_back(7 * b + t);
  DecoderMask m;
  m.positions = pos.data(), m.positions_stride = Tn;
  const Tensor<double> full = llama_layer_forward(c, w, x, m);  // fused path: no observer
  KvCache<double> cache = make_cache<double>(B, 2, Tn, 8);
  auto layer = [&](const Tensor<double>& part, const DecoderMask& mm, KvCache<double>& kv, Observer<double>* o) {
    return llama_layer_forward(c, w, part, mm, &kv, o);
  };
  const Tensor<double> session = decode_session(layer, x, P, m, cache, static_cast<Observer<double>*>(nullptr));
  CHECK(rel_diff(session, full) < 1e-14);
  CHECK(cache.length == Tn);
  struct Null final : Observer<double> {
    void on(const std::string&, Tensor<double>&) override {}
  } null;
  const Tensor<double> explicit_path = llama_layer_forward(c, w, x, m, static_cast<KvCache<double>*>(nullptr), &null);
  CHECK(rel_diff(full, explicit_path) < 1e-14);
  // and the defect that rotates decode steps one position late breaks the session, not the prefill
  ScopedDefect d(Defect::RopeDecodeOffset);
  KvCache<double> cache2 = make_cache<double>(B, 2, Tn, 8);
  const Tensor<double> off = decode_session(layer, x, P, m, cache2, static_cast<Observer<double>*>(nullptr));
  CHECK(rel_diff(off, full) > 1e-6);
}

TEST_CASE("llm: a sliding window of one key: each token attends to itself alone / the window through a decode",
          "[llm]") {
  // MistralAttention with sliding_window 1: query i sees key i only (j > i - 1), so its weights are
  // one-hot and the context is the token's own value, whatever q and k are.
  LlamaConfig c;
  c.hidden_size = 8, c.num_heads = 4, c.num_kv_heads = 2, c.head_dim = 4, c.sliding_window = 1;
  LlamaAttentionWeights<double> w;
  w.q_proj_weight = random_tensor<double>({16, 8}, 1), w.k_proj_weight = random_tensor<double>({8, 8}, 2);
  w.v_proj_weight = random_tensor<double>({8, 8}, 3), w.o_proj_weight = random_tensor<double>({8, 16}, 4);
  const int64_t B = 2, Tn = 5, H = 4, D = 4, groups = 2;
  const Tensor<double> x = random_tensor<double>({B, Tn, 8}, 5);
  Keep keep;
  const Tensor<double> out =
      llama_attention_forward(c, w, x, DecoderMask{}, static_cast<KvCache<double>*>(nullptr), &keep);
  const Tensor<double>&v = keep.seen.at("v"), &ctx = keep.seen.at("context");  // (B, Hkv, T, D), (B, T, H D)
  for (int64_t b = 0; b < B; ++b)
    for (int64_t t = 0; t < Tn; ++t)
      for (int64_t h = 0; h < H; ++h)
        for (int64_t d = 0; d < D; ++d)
          CHECK(ctx.data[size_t((b * Tn + t) * H * D + h * D + d)] ==
                Approx(v.data[size_t(((b * 2 + h / groups) * Tn + t) * D + d)]).epsilon(1e-15));
  CHECK(rel_diff(llama_attention_forward(c, w, x, DecoderMask{}), out) < 1e-15);  // the fused path
  {  // a window of one key too many is another attention
    ScopedDefect d(Defect::WindowOffByOne);
    CHECK(rel_diff(llama_attention_forward(c, w, x, DecoderMask{}), out) > 1e-3);
  }
  // Window 2 through a decode session past it: the steps give the full forward's rows, on the fused
  // path and the explicit one, and the window forgotten in the steps breaks them, not the prefill.
  c.sliding_window = 2;
  const Tensor<double> full = llama_attention_forward(c, w, x, DecoderMask{});
  auto call = [&](const Tensor<double>& part, const DecoderMask& m, KvCache<double>& kv, Observer<double>* o) {
    return llama_attention_forward(c, w, part, m, &kv, o);
  };
  for (bool observed : {false, true}) {
    KvCache<double> cache = make_cache<double>(B, 2, Tn, D);
    const Tensor<double> session =
        decode_session(call, x, 2, DecoderMask{}, cache,
                       observed ? static_cast<Observer<double>*>(&keep) : static_cast<Observer<double>*>(nullptr));
    CHECK(rel_diff(session, full) < 1e-14);
  }
  ScopedDefect d(Defect::WindowPrefillOnly);
  KvCache<double> cache = make_cache<double>(B, 2, Tn, D);
  const Tensor<double> session =
      decode_session(call, x, 2, DecoderMask{}, cache, static_cast<Observer<double>*>(nullptr));
  CHECK(rel_diff(session, full) > 1e-3);
}

TEST_CASE("llm: Qwen3's q_norm and k_norm: each head's q and k of mean square ms / (ms + eps), before rotary",
          "[llm]") {
  LlamaConfig c;
  c.hidden_size = 8, c.num_heads = 2, c.num_kv_heads = 1, c.head_dim = 6, c.qk_norm = true, c.rms_norm_eps = 0.25;
  LlamaAttentionWeights<double> w;
  w.q_proj_weight = random_tensor<double>({12, 8}, 11), w.k_proj_weight = random_tensor<double>({6, 8}, 12);
  w.v_proj_weight = random_tensor<double>({6, 8}, 13), w.o_proj_weight = random_tensor<double>({8, 12}, 14);
  w.q_norm = Tensor<double>({6}, 1.0), w.k_norm = Tensor<double>({6}, 1.0);
  const Tensor<double> x = random_tensor<double>({1, 3, 8}, 15);
  Keep keep;
  const Tensor<double> out =
      llama_attention_forward(c, w, x, DecoderMask{}, static_cast<KvCache<double>*>(nullptr), &keep);
  for (const char* pair : {"q", "k"}) {
    const Tensor<double>&raw = keep.seen.at(pair), &normed = keep.seen.at(std::string(pair) + "_norm");
    REQUIRE(raw.shape == normed.shape);
    for (int64_t row = 0; row < raw.numel() / 6; ++row) {  // RMSNorm of weight 1: x / sqrt(ms + eps)
      double ms = 0, ms_normed = 0;
      for (int64_t d = 0; d < 6; ++d)
        ms += raw.data[size_t(row * 6 + d)] * raw.data[size_t(row * 6 + d)] / 6,
            ms_normed += normed.data[size_t(row * 6 + d)] * normed.data[size_t(row * 6 + d)] / 6;
      CHECK(ms_normed == Approx(ms / (ms + 0.25)).epsilon(1e-13));
    }
  }
  // A non-uniform norm weight does not commute with the rotation: the norm after rotary is another layer.
  w.q_norm = random_tensor<double>({6}, 16), w.k_norm = random_tensor<double>({6}, 17);
  const Tensor<double> right = llama_attention_forward(c, w, x, DecoderMask{});
  ScopedDefect d(Defect::QkNormAfterRotary);
  CHECK(rel_diff(llama_attention_forward(c, w, x, DecoderMask{}), right) > 1e-3);
}

TEST_CASE("llm: Gemma 2's RMSNorm scales by 1 + weight, hand-worked", "[llm]") {
  // x = (3, 4): mean(x^2) = 12.5, eps 0; weight (0, 1) scales by (1, 2): 3 / sqrt(12.5), 8 / sqrt(12.5).
  const double x[2] = {3, 4}, weight[2] = {0, 1};
  double y[2];
  gemma_rms_norm_forward(y, x, weight, 0.0, 1, 2);
  CHECK(y[0] == Approx(0.848528137423857).epsilon(1e-15));
  CHECK(y[1] == Approx(2.262741699796952).epsilon(1e-15));
  ScopedDefect d(Defect::GemmaNormWeight);  // by weight alone: (0, 4 / sqrt(12.5))
  gemma_rms_norm_forward(y, x, weight, 0.0, 1, 2);
  CHECK(y[0] == 0.0);
  CHECK(y[1] == Approx(1.131370849898476).epsilon(1e-15));
}

TEST_CASE("llm: Gemma 2's soft-cap: cap * tanh(score / cap) before the mask, hand-worked", "[llm]") {
  // One query (D = 1, q = 2) over three keys (1, 3, 5), scaling 1, cap 1, the third key padding:
  // scores tanh(2), tanh(6), -inf; weights softmax of the first two.
  KvCache<double> cache = make_cache<double>(1, 1, 3, 1);
  cache.k.data = {1, 3, 5}, cache.v.data = {10, 20, 30}, cache.length = 3;
  const Tensor<double> q({1, 1, 1, 1}, 2.0);
  const uint8_t padding[3] = {0, 0, 1};
  DecoderMask m;
  m.causal = false, m.key_padding = padding, m.key_padding_stride = 3;
  const double e0 = std::exp(std::tanh(2.0)), e1 = std::exp(std::tanh(6.0));
  const double expected = (10 * e0 + 20 * e1) / (e0 + e1);
  Keep keep;
  const Tensor<double> ctx = cached_attention(q, cache, 1, 1.0, 1.0, m, &keep);
  const Tensor<double>& s = keep.seen.at("scores");
  CHECK(s.data[0] == Approx(std::tanh(2.0)).epsilon(1e-15));
  CHECK(s.data[1] == Approx(std::tanh(6.0)).epsilon(1e-15));
  CHECK(std::isinf(s.data[2]));
  CHECK(ctx.data[0] == Approx(expected).epsilon(1e-14));
  CHECK(cached_attention(q, cache, 1, 1.0, 1.0, m).data[0] == Approx(expected).epsilon(1e-14));  // no observer
  {  // the cap after the mask: the padding key scores -cap and takes weight
    ScopedDefect d(Defect::SoftcapAfterMask);
    Keep late;
    (void)cached_attention(q, cache, 1, 1.0, 1.0, m, &late);
    CHECK(late.seen.at("scores").data[2] == -1.0);
  }
  ScopedDefect d(Defect::SoftcapMissing);  // uncapped: scores 2 and 6
  Keep raw;
  (void)cached_attention(q, cache, 1, 1.0, 1.0, m, &raw);
  CHECK(raw.seen.at("scores").data[1] == 6.0);
}
