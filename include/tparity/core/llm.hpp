// The decoder blocks people write today, as Hugging Face transformers 5.23 defines them: LLaMA's
// (RMSNorm, rotary position embeddings, grouped-query attention, SwiGLU), with GPT-J's interleaved
// rotary pairs, GPT-NeoX's partial rotary and a head dim that is not hidden / heads as options, and
// GPT-2's (pre-LN, fused c_attn, Conv1D weights stored (in, out), gelu_new). A KV cache for
// step-by-step decoding. Templated on float and double; every sum accumulates in T.
//
// Sources (transformers 5.23.0, site-packages/transformers/):
//   models/llama/modeling_llama.py   LlamaRMSNorm, LlamaRotaryEmbedding, rotate_half,
//                                    apply_rotary_pos_emb, LlamaMLP, repeat_kv,
//                                    eager_attention_forward, LlamaAttention, LlamaDecoderLayer
//   models/gptj/modeling_gptj.py     rotate_every_two, apply_rotary_pos_emb, GPTJAttention (rotary_dim)
//   models/gpt_neox/modeling_gpt_neox.py  partial_rotary_factor (rotary_pct), GPTNeoXAttention
//   models/gpt2/modeling_gpt2.py     GPT2Attention, GPT2MLP, GPT2Block; pytorch_utils.py Conv1D;
//                                    activations.py NewGELUActivation
//   cache_utils.py                   DynamicCache / DynamicLayer.update: torch.cat of k and v, after rotary
//
// Precision: the core computes in T throughout. transformers casts to float32 in three places even
// for a float64 model (LlamaRMSNorm's hidden_states.to(torch.float32), the rotary angles'
// inv_freq and position_ids .float(), eager attention's softmax(dtype=torch.float32)); the float64
// core is the mathematics in float64, which the fixtures' float64 results are too (README, "The
// LLM blocks").
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "tparity/core/observer.hpp"
#include "tparity/core/tensor.hpp"

namespace tparity {

// Which dims of a head rotate together.
//   HalfSplit:   (i, i + r/2), transformers' rotate_half (LLaMA, GPT-NeoX, Mistral, Qwen, ...)
//   Interleaved: (2i, 2i + 1), rotate_every_two (GPT-J, Meta's original LLaMA release)
enum class RopeStyle { HalfSplit, Interleaved };
std::string rope_style_name(RopeStyle s);            // "half" | "interleaved"
RopeStyle rope_style_from_name(const std::string&);  // throws std::invalid_argument

// Llama 3's rope scaling (rope_type "llama3", transformers' _compute_llama3_parameters); factor 0: none.
// With wavelen = 2 pi / inv_freq, lo = original_max_position_embeddings / low_freq_factor and
// hi = original_max_position_embeddings / high_freq_factor, each inverse frequency becomes
//   inv_freq / factor                             where wavelen > lo (the low frequencies)
//   inv_freq                                      where wavelen < hi (the high frequencies)
//   (1 - s) inv_freq / factor + s inv_freq        between, s = (original / wavelen - low) / (high - low)
struct Llama3RopeScaling {
  double factor = 0;  // >= 1 when on
  double low_freq_factor = 1;
  double high_freq_factor = 4;  // above low_freq_factor
  int64_t original_max_position_embeddings = 8192;
  bool on() const { return factor > 0; }
};

// LlamaConfig's fields as LlamaDecoderLayer reads them, plus the rotary options of GPT-J and
// GPT-NeoX. rotary_dim() dims of each head rotate (the first ones), the rest pass through.
struct LlamaConfig {
  int64_t hidden_size = 0;
  int64_t num_heads = 0;     // num_attention_heads
  int64_t num_kv_heads = 0;  // num_key_value_heads: 1 multi-query, num_heads multi-head
  int64_t head_dim = 0;      // need not be hidden_size / num_heads
  int64_t intermediate_size = 0;
  double rms_norm_eps = 1e-6;
  double rope_theta = 10000;
  Llama3RopeScaling rope_scaling;  // config.json's rope_scaling of rope_type "llama3" (Llama 3.1, 3.2, 3.3)
  RopeStyle rope = RopeStyle::HalfSplit;
  double partial_rotary_factor = 1.0;  // GPT-NeoX rotary_pct; GPT-J rotary_dim / head_dim
  bool attention_bias = false;
  bool mlp_bias = false;
  int64_t max_position_embeddings = 2048;  // positions must lie below it
  // Mistral's sliding window (and the sliding layers' of Gemma 2 and Qwen3): query i (absolute) sees
  // keys j with i - sliding_window < j <= i, masking_utils.sliding_window_overlay; 0: no window.
  int64_t sliding_window = 0;
  // Qwen3's q_norm and k_norm: an RMSNorm (weight (head_dim), rms_norm_eps) over each head's dims of the
  // projected q and k, before rotary.
  bool qk_norm = false;
  // Gemma 2's attention: scores scaled by query_pre_attn_scalar^-0.5 (0: head_dim^-0.5), then
  // soft-capped, cap * tanh(scores / cap), before the mask (0: no cap).
  double query_pre_attn_scalar = 0;
  double attn_logit_softcapping = 0;
  int64_t rotary_dim() const { return int64_t(double(head_dim) * partial_rotary_factor); }
  int64_t groups() const { return num_kv_heads ? num_heads / num_kv_heads : 0; }  // queries per kv head
};

// GPT2Config's fields as GPT2Block reads them (scale_attn_weights true, no layer-idx scaling, no
// reordered upcast: the defaults).
struct Gpt2Config {
  int64_t hidden_size = 0;
  int64_t num_heads = 0;
  int64_t inner_dim = 0;  // n_inner, 4 * hidden_size when unset
  double layer_norm_epsilon = 1e-5;
  int64_t max_position_embeddings = 1024;  // n_positions (only bounds the sequence)
};

// By transformers' state_dict names (nn.Linear weights (out, in); biases empty when absent).
template <class T>
struct LlamaAttentionWeights {
  Tensor<T> q_proj_weight, q_proj_bias, k_proj_weight, k_proj_bias, v_proj_weight, v_proj_bias, o_proj_weight,
      o_proj_bias;
  Tensor<T> q_norm, k_norm;  // Qwen3's (head_dim), with c.qk_norm
};
template <class T>
struct LlamaLayerWeights {
  LlamaAttentionWeights<T> self_attn;
  Tensor<T> input_layernorm, post_attention_layernorm;  // RMSNorm weights (hidden)
  Tensor<T> gate_proj_weight, gate_proj_bias, up_proj_weight, up_proj_bias, down_proj_weight, down_proj_bias;
  Tensor<T> pre_feedforward_layernorm, post_feedforward_layernorm;  // Gemma 2's (hidden)
};
// Conv1D weights are (in, out): y = x @ W + b.
template <class T>
struct Gpt2Weights {
  Tensor<T> ln_1_weight, ln_1_bias, c_attn_weight, c_attn_bias, c_proj_weight, c_proj_bias;
  Tensor<T> ln_2_weight, ln_2_bias, c_fc_weight, c_fc_bias, mlp_c_proj_weight, mlp_c_proj_bias;
};

// One layer's KV cache, transformers' DynamicLayer: the keys after rotary and the values, (B, Hkv,
// capacity, D), the first `length` positions of each head filled. Appending never moves what is there.
template <class T>
struct KvCache {
  Tensor<T> k, v;
  int64_t length = 0;
  int64_t capacity() const { return k.dim() == 4 ? k.size(2) : 0; }
};

// What a decoder call sees besides its hidden states.
//   positions: (B, T) the rotary position of every token (transformers' position_ids); empty: the
//     cache's length + arange(T)
//   key_padding: (B, S_total) 1 where a key is padding (masked out), over every key of the session
//     (the cache's and this call's: column j is key j); empty: none
//   causal: query i of this call (absolute index past + i, past = the cache's length before the call)
//     sees keys j <= past + i
//   window: > 0, query i sees only keys j > past + i - window (a sliding window, causal only); 0: none
// Masked scores are set to the dtype's lowest value, as transformers' additive masks make them
// (torch.finfo(dtype).min added to the score), not -inf; a query row whose every key is masked (a
// left-padded prompt's padding) then gets uniform weights over the masked keys, as in transformers.
struct DecoderMask {
  const int64_t* positions = nullptr;
  int64_t positions_stride = 0;  // T of this call when 0; a session's calls read columns of (B, T_total)
  const uint8_t* key_padding = nullptr;
  int64_t key_padding_stride = 0;  // S_total
  bool causal = true;
  int64_t window = 0;
};

// mirrors LlamaRMSNorm.forward (in T, not float32): y = weight * (x * rsqrt(mean(x^2) + eps)).
// inp is (N, C), weight is (C); out will be (N, C); out may alias inp.
// mean(x^2): dot(x, x) / C, dot()'s eight partial sums; rsqrt as 1 / sqrt.
template <class T>
void rms_norm_forward(T* out, const T* inp, const T* weight, T eps, int64_t N, int64_t C);

// mirrors Gemma2RMSNorm.forward (in T, not float32): y = (x * rsqrt(mean(x^2) + eps)) * (1 + weight),
// the weight an offset from 1 (Gemma 2 initialises it to zeros).
// inp is (N, C), weight is (C); out will be (N, C); out may alias inp.
template <class T>
void gemma_rms_norm_forward(T* out, const T* inp, const T* weight, T eps, int64_t N, int64_t C);

// The rotary inverse frequencies, in double: inv_freq[i] = 1 / theta^(2i / r), i < r / 2, then
// scaled as Llama 3's rope_scaling says (when on), in _compute_llama3_parameters' order of operations.
std::vector<double> rope_inv_freq(int64_t r, double theta, const Llama3RopeScaling& scaling);

// mirrors LlamaRotaryEmbedding.forward (default or llama3 rope type, attention_scaling 1), computed in
// double and rounded once to T: inv_freq = rope_inv_freq(r, theta, scaling), angle = position * inv_freq[i],
// cos[n, i] = cos(angle), sin[n, i] = sin(angle), i < r / 2 (transformers' emb = cat(freqs, freqs)
// repeats these for the two halves; GPT-J's sincos table holds them once and repeat_interleaves).
// positions is (N); cos and sin will be (N, r / 2). r even.
template <class T>
void rope_tables(T* cos, T* sin, const int64_t* positions, int64_t N, int64_t r, double theta,
                 const Llama3RopeScaling& scaling = {});

// mirrors apply_rotary_pos_emb: x * cos + rotate(x) * sin on the first r dims of each head, the rest
// passing through (GPT-NeoX's q_rot / q_pass, GPT-J's rotary_dim), in place.
//   HalfSplit (rotate_half):     x'[i] = x[i] c_i - x[i + r/2] s_i,  x'[i + r/2] = x[i + r/2] c_i + x[i] s_i
//   Interleaved (rotate_every_two): x'[2i] = x[2i] c_i - x[2i+1] s_i,  x'[2i+1] = x[2i+1] c_i + x[2i] s_i
// Each term rounded, then added, as torch's two products and one sum.
// x is (B, H, Tn, D), cos and sin are (B, Tn, r / 2) (one row per token).
template <class T>
void rotary_forward(T* x, const T* cos, const T* sin, int64_t B, int64_t H, int64_t Tn, int64_t D, int64_t r,
                    RopeStyle style);

// mirrors transformers' NewGELUActivation (gelu_new, GPT-2's activation_function):
// 0.5 x (1 + tanh(sqrt(2 / pi) (x + 0.044715 x^3))). out may alias inp.
template <class T>
void gelu_new_forward(T* out, const T* inp, int64_t n);

// mirrors torch.nn.functional.linear for a few rows (a decode step's tokens): each output the dot
// product of a weight row with the input row, the weight streamed once per row, never packed (gemv.cpp).
// inp is (N, C), weight is (OC, C), bias is (OC) or null; out will be (N, OC)
template <class T>
void gemv_forward(T* out, const T* inp, const T* weight, const T* bias, int64_t N, int64_t C, int64_t OC);

// nn.Linear as the LLM blocks run it: gemv_forward for at most kGemvRows rows on the fast path, else
// linear_forward (the GEMM).
constexpr int64_t kGemvRows = 4;
template <class T>
void llm_linear(T* out, const T* inp, const T* weight, const T* bias, int64_t N, int64_t C, int64_t OC);

// mirrors GPT-2's Conv1D.forward: torch.addmm(bias, x, weight), weight stored (in, out).
// inp is (N, C), weight is (C, OC), bias is (OC) or null; out will be (N, OC)
template <class T>
void conv1d_forward(T* out, const T* inp, const T* weight, const T* bias, int64_t N, int64_t C, int64_t OC);

// Attention of a decoder call over its cache, eager_attention_forward's steps:
//   scores[b, h, i, j] = (q[b, h, i] . k[b, h / groups, j]) * scaling + mask (lowest where masked)
//   with softcap > 0 (Gemma 2's eager_attention_forward): s = softcap * tanh(s / softcap) before the mask
//   attn_weights = softmax(scores, -1); context[b, i, h * D + d] = sum_j w[b, h, i, j] v[b, h / groups, j, d]
// q is (B, H, L, D) after rotary; cache holds S = cache.length keys and values (this call's last);
// context will be (B, L, H * D). Components (with an observer): scores (B, H, L, S), -inf where a key
// is masked (canonical whatever the dtype: transformers' tensor holds finfo(dtype).min there),
// attn_weights (B, H, L, S). Without one, the fast path runs the fused attention (fused_attention.hpp), the kv
// heads shared by their query heads without a copy (AttentionLayout::repeat).
template <class T>
Tensor<T> cached_attention(const Tensor<T>& q, const KvCache<T>& cache, int64_t groups, T scaling, T softcap,
                           const DecoderMask& mask, Observer<T>* obs = nullptr);

// mirrors LlamaAttention.forward (eager attention, transformers' DynamicCache when `cache` is given):
// q, k, v projections, rotary on q and k, k and v appended to the cache, attention, o_proj. With
// c.sliding_window, MistralAttention's: the window in the mask (the cache keeps every key; the ones
// that slid out are masked, which gives transformers' DynamicSlidingWindowLayer's weights). With
// c.qk_norm, Qwen3Attention's: q = q_norm(q_proj(x)), k = k_norm(k_proj(x)) over each head's dims,
// then rotary.
// Components: q, k, v (B, H|Hkv, T, D) projected; q_norm, k_norm after the norms (c.qk_norm); q_rot,
// k_rot after rotary; cache.k, cache.v
// (B, Hkv, S, D) the cache after the update; scores, attn_weights (B, H, T, S); context (B, T, H D);
// output (B, T, hidden).
template <class T>
Tensor<T> llama_attention_forward(const LlamaConfig& c, const LlamaAttentionWeights<T>& w, const Tensor<T>& x,
                                  const DecoderMask& mask, KvCache<T>* cache = nullptr, Observer<T>* obs = nullptr);

// mirrors LlamaDecoderLayer.forward: x + attn(input_layernorm(x)), then + mlp(post_attention_layernorm(.)),
// LlamaMLP = down(silu(gate(h)) * up(h)).
// x is (B, T, hidden); output will be (B, T, hidden).
// Components: input_layernorm, the attention's under attn. (attn.q ... attn.output), attn_residual,
// post_attention_layernorm, mlp.gate, mlp.up, mlp.act (silu(gate) * up), mlp.down, output.
template <class T>
Tensor<T> llama_layer_forward(const LlamaConfig& c, const LlamaLayerWeights<T>& w, const Tensor<T>& x,
                              const DecoderMask& mask, KvCache<T>* cache = nullptr, Observer<T>* obs = nullptr);

// mirrors Gemma2DecoderLayer.forward: norms before and after the attention and the MLP, each a
// Gemma2RMSNorm (by 1 + weight):
//   x1 = x + post_attention_layernorm(attn(input_layernorm(x)))
//   out = x1 + post_feedforward_layernorm(mlp(pre_feedforward_layernorm(x1)))
// Gemma2MLP = down(gelu_pytorch_tanh(gate(h)) * up(h)); the attention is llama_attention_forward's with
// c.query_pre_attn_scalar, c.attn_logit_softcapping and the layer's sliding window (Gemma 2 alternates
// sliding and full layers: the layer's own window, or 0).
// x is (B, T, hidden); output will be (B, T, hidden).
// Components: input_layernorm, attn.*, post_attention_layernorm, attn_residual, pre_feedforward_layernorm,
// mlp.gate, mlp.up, mlp.act (gelu_tanh(gate) * up), mlp.down, post_feedforward_layernorm, output.
template <class T>
Tensor<T> gemma2_layer_forward(const LlamaConfig& c, const LlamaLayerWeights<T>& w, const Tensor<T>& x,
                               const DecoderMask& mask, KvCache<T>* cache = nullptr, Observer<T>* obs = nullptr);

// mirrors GPT2Block.forward (eager attention, causal, no cross-attention):
// x + c_proj(attn(ln_1(x))), then + mlp(ln_2(.)), mlp = c_proj(gelu_new(c_fc(h))), Conv1D weights (in, out).
// x is (B, T, hidden); output will be (B, T, hidden). mask.positions is not read (GPT-2's positions
// are the model's wpe, outside the block).
// Components: ln_1, attn.q, attn.k, attn.v (B, H, T, D), attn.scores, attn.attn_weights, attn.context,
// attn.output (c_proj), attn_residual, ln_2, mlp.fc (c_fc), mlp.act (gelu_new), mlp.proj, output.
template <class T>
Tensor<T> gpt2_block_forward(const Gpt2Config& c, const Gpt2Weights<T>& w, const Tensor<T>& x, const DecoderMask& mask,
                             KvCache<T>* cache = nullptr, Observer<T>* obs = nullptr);

// A decode session: prefill the first P tokens of x in one call, then the D = T - P others one token
// a call, each call appending its k and v to the cache (what generate() does with transformers'
// DynamicCache). `layer(x_part, mask, cache, obs)` is one call of a decoder layer or attention.
// x is (B, T, hidden), positions (B, T); output will be (B, T, hidden): the calls' outputs in order,
// which are the rows of the full causal forward over all T tokens.
// Components: prefill.<the call's components>, step.N.<the call's components> for N < D (cache.k
// and cache.v among them), and output.
template <class T, class Layer>
Tensor<T> decode_session(const Layer& layer, const Tensor<T>& x, int64_t prefill, const DecoderMask& mask,
                         KvCache<T>& cache, Observer<T>* obs);

// Allocates a cache for B x Hkv heads of D dims and `capacity` positions, empty.
template <class T>
KvCache<T> make_cache(int64_t B, int64_t Hkv, int64_t capacity, int64_t D);

}  // namespace tparity

#include "tparity/core/llm_session.hpp"
