// The reference's LLM blocks: transformers' LlamaDecoderLayer, LlamaAttention (with GPT-J's
// interleaved and GPT-NeoX's partial rotary) and GPT2Block, composed from ATen ops line by line as
// transformers 5.23 writes them (models/llama/modeling_llama.py, gptj/, gpt_neox/, gpt2/), by its
// state_dict names, in the run's dtype throughout: the float64 run is the mathematics in float64
// (transformers' own float64 module computes its RMSNorm, rotary angles and softmax in float32);
// the float32 run is transformers' float32 (its casts are no-ops there). No LibTorch module exists
// for these: Hugging Face's fixtures verify the decomposition (libtorch64_vs_torch64).
#include "tparity/harness/llm.hpp"

#include <cmath>
#include <limits>

#include "internal.hpp"

namespace tparity::torch_ref {

namespace {

// LlamaRMSNorm.forward without the cast: weight * (x * rsqrt(x.pow(2).mean(-1, keepdim=True) + eps)).
TT rms_norm(const TT& x, const TT& weight, double eps) {
  const TT variance = x.pow(2).mean(-1, /*keepdim=*/true);
  return weight * (x * at::rsqrt(variance + eps));
}

// Gemma2RMSNorm.forward without the casts: _norm(x) * (1.0 + weight).
TT gemma_rms_norm(const TT& x, const TT& weight, double eps) {
  return (x * at::rsqrt(x.pow(2).mean(-1, /*keepdim=*/true) + eps)) * (1.0 + weight);
}

// rotate_half / rotate_every_two
TT rotate_half(const TT& x) {
  const int64_t h = x.size(-1) / 2;
  return at::cat({-x.slice(-1, h), x.slice(-1, 0, h)}, -1);
}
TT rotate_every_two(const TT& x) {
  const TT x1 = x.slice(-1, 0, x.size(-1), 2), x2 = x.slice(-1, 1, x.size(-1), 2);
  return at::stack({-x2, x1}, -1).flatten(-2);
}

// The rotary tables of LlamaRotaryEmbedding / GPT-NeoX's (partial_rotary_factor) in the run's dtype:
// inv_freq = 1 / theta^(arange(0, r, 2) / r), scaled as _compute_llama3_parameters scales it (Llama 3's
// rope_scaling), freqs = position_ids[..., None] * inv_freq, (B, T, r/2).
std::pair<TT, TT> rope_angles(const TT& positions, int64_t r, double theta, const Llama3RopeScaling& s,
                              at::ScalarType st) {
  const auto o = at::TensorOptions().dtype(st);
  TT inv_freq = 1.0 / at::pow(theta, at::arange(0, r, 2, o) / double(r));
  if (s.on()) {
    const double original = double(s.original_max_position_embeddings);
    const double low_freq_wavelen = original / s.low_freq_factor, high_freq_wavelen = original / s.high_freq_factor;
    // a Python number over a tensor is the tensor's reciprocal times the number (Tensor.__rtruediv__)
    const TT wavelen = inv_freq.reciprocal() * (2 * 3.141592653589793);  // 2 * math.pi / inv_freq
    const TT llama = at::where(wavelen > low_freq_wavelen, inv_freq / s.factor, inv_freq);
    const TT smooth =
        (wavelen.reciprocal() * original - s.low_freq_factor) / (s.high_freq_factor - s.low_freq_factor);
    const TT smoothed = (1 - smooth) * llama / s.factor + smooth * llama;
    const TT medium = (wavelen < high_freq_wavelen).logical_not() * (wavelen > low_freq_wavelen).logical_not();
    inv_freq = at::where(medium, smoothed, llama);
  }
  const TT freqs = positions.unsqueeze(-1).to(st) * inv_freq;
  return {freqs.cos(), freqs.sin()};
}

// apply_rotary_pos_emb on the first r dims of x (B, H, T, D): (x * cos) + (rotate(x) * sin).
TT apply_rotary(const TT& x, const TT& cos_half, const TT& sin_half, int64_t r, RopeStyle style) {
  if (r == 0) return x;
  TT c, s;
  if (style == RopeStyle::HalfSplit) {  // emb = torch.cat((freqs, freqs), dim=-1)
    c = at::cat({cos_half, cos_half}, -1).unsqueeze(1);
    s = at::cat({sin_half, sin_half}, -1).unsqueeze(1);
  } else {  // GPT-J: torch.repeat_interleave(sin[:, :, None, :], 2, 3), heads on dim 1 here
    c = at::repeat_interleave(cos_half, 2, -1).unsqueeze(1);
    s = at::repeat_interleave(sin_half, 2, -1).unsqueeze(1);
  }
  const TT rot = x.slice(-1, 0, r), pass = x.slice(-1, r);
  const TT out = (rot * c) + ((style == RopeStyle::HalfSplit ? rotate_half(rot) : rotate_every_two(rot)) * s);
  return r == x.size(-1) ? out : at::cat({out, pass}, -1);
}

// repeat_kv: (B, Hkv, S, D) -> (B, Hkv * n_rep, S, D), kv head j serving query heads j * n_rep ...
TT repeat_kv(const TT& x, int64_t n_rep) {
  if (n_rep == 1) return x;
  const int64_t B = x.size(0), K = x.size(1), S = x.size(2), D = x.size(3);
  return x.unsqueeze(2).expand({B, K, n_rep, S, D}).reshape({B, K * n_rep, S, D});
}

// The additive mask of a call: (B, 1, L, S), 0 where key j is visible to query i (absolute past + i),
// torch.finfo(dtype).min where it is not (causal, padding, and, with a sliding window w > 0, keys
// j <= i - w: masking_utils.sliding_window_overlay's kv_idx > q_idx - w negated).
TT additive_mask(const TT& padding, int64_t B, int64_t L, int64_t S, bool causal, int64_t window, at::ScalarType st) {
  const auto ob = at::TensorOptions().dtype(at::kBool);
  TT masked = at::zeros({B, 1, L, S}, ob);
  const int64_t past = S - L;
  if (causal) masked = masked | at::ones({L, S}, ob).triu(past + 1).view({1, 1, L, S});
  if (window > 0) masked = masked | at::ones({L, S}, ob).tril(past - window).view({1, 1, L, S});
  if (padding.defined()) masked = masked | padding.slice(1, 0, S).view({B, 1, 1, S});
  double lowest = std::numeric_limits<double>::lowest();
  if (st == at::kFloat) lowest = double(std::numeric_limits<float>::lowest());
  if (st == at::kBFloat16) lowest = double(float(std::numeric_limits<c10::BFloat16>::lowest()));
  if (st == at::kHalf) lowest = double(float(std::numeric_limits<c10::Half>::lowest()));
  return at::zeros({B, 1, L, S}, at::TensorOptions().dtype(st)).masked_fill(masked, lowest);
}

struct Cache {
  TT k, v;  // (B, Hkv, S, D), undefined when empty
  int64_t length() const { return k.defined() ? k.size(2) : 0; }
};

struct Call {
  const Problem& p;
  const Params& ps;
  at::ScalarType st;
  TT positions_all;  // (B, T_total) int64
  TT padding;        // (B, T_total) bool or undefined

  // eager_attention_forward over the cache (this call's k and v already in it).
  TT attention(const TT& q, const Cache& c, int64_t groups, const Sink& sink) const {
    const int64_t B = q.size(0), L = q.size(2), S = c.length();
    const TT k = repeat_kv(c.k, groups), v = repeat_kv(c.v, groups);
    const bool gpt2 = llm_row(p.module).block == LlmBlock::Gpt2;
    const double qpas = gpt2 ? 0.0 : p.llama.query_pre_attn_scalar, cap = gpt2 ? 0.0 : p.llama.attn_logit_softcapping;
    const double scaling = std::pow(qpas > 0 ? qpas : double(q.size(3)), -0.5);  // Gemma 2: query_pre_attn_scalar
    TT scores = at::matmul(q, k.transpose(2, 3)) * scaling;
    if (cap > 0) scores = at::tanh(scores / cap) * cap;  // Gemma 2's soft-cap, before the mask
    const int64_t window = gpt2 ? 0 : p.llama.sliding_window;
    const TT mask = additive_mask(padding, B, L, S, p.causal, window, st);
    scores = scores + mask;
    // the component: -inf where masked (canonical whatever the dtype), the computation: finfo.min
    if (sink.out) sink.put("scores", scores.masked_fill(mask != 0, -std::numeric_limits<double>::infinity()));
    const TT w = at::softmax(scores, -1);  // transformers: dtype=torch.float32 (a no-op in float32)
    sink.put("attn_weights", w);
    const TT ctx = at::matmul(w, v).transpose(1, 2).reshape({B, L, -1});
    sink.put("context", ctx);
    return ctx;
  }

  void append(Cache& c, const TT& k, const TT& v, bool observe, const Sink& sink) const {
    c.k = c.k.defined() ? at::cat({c.k, k}, 2) : k;  // DynamicLayer.update
    c.v = c.v.defined() ? at::cat({c.v, v}, 2) : v;
    if (observe) sink.put("cache.k", c.k), sink.put("cache.v", c.v);
  }

  // LlamaAttention.forward on x (B, T, C), tokens t0.. of the session.
  TT llama_attention(const TT& x, int64_t t0, const std::string& pre, Cache& cache, bool observe,
                     const Sink& sink) const {
    const LlamaConfig& c = p.llama;
    const int64_t B = x.size(0), Tn = x.size(1), D = c.head_dim, r = c.rotary_dim();
    auto proj = [&](const char* name) {
      return linear(x, param(ps, pre + name + ".weight"), param(ps, pre + name + ".bias"))
          .view({B, Tn, -1, D})
          .transpose(1, 2);
    };
    TT q = proj("q_proj"), k = proj("k_proj"), v = proj("v_proj");
    sink.put("q", q), sink.put("k", k), sink.put("v", v);
    if (c.qk_norm) {  // Qwen3Attention: q_norm(q_proj(x).view(...)), k_norm likewise, over each head's dims
      q = rms_norm(q, param(ps, pre + "q_norm.weight"), c.rms_norm_eps);
      k = rms_norm(k, param(ps, pre + "k_norm.weight"), c.rms_norm_eps);
      sink.put("q_norm", q), sink.put("k_norm", k);
    }
    const auto [cos, sin] = rope_angles(positions_all.slice(1, t0, t0 + Tn), r, c.rope_theta, c.rope_scaling, st);
    const TT q_rot = apply_rotary(q, cos, sin, r, c.rope), k_rot = apply_rotary(k, cos, sin, r, c.rope);
    sink.put("q_rot", q_rot), sink.put("k_rot", k_rot);
    append(cache, k_rot, v, observe, sink);
    const TT ctx = attention(q_rot, cache, c.groups(), sink);
    const TT out = linear(ctx, param(ps, pre + "o_proj.weight"), param(ps, pre + "o_proj.bias"));
    sink.put("output", out);
    return out;
  }

  // LlamaDecoderLayer.forward
  TT llama_layer(const TT& x, int64_t t0, Cache& cache, bool observe, const Sink& sink) const {
    const double eps = p.llama.rms_norm_eps;
    const TT h = rms_norm(x, param(ps, "input_layernorm.weight"), eps);
    sink.put("input_layernorm", h);
    const TT a = llama_attention(h, t0, "self_attn.", cache, observe, Sink{sink.out, sink.prefix + "attn.", "", ""});
    const TT x1 = x + a;
    sink.put("attn_residual", x1);
    const TT h2 = rms_norm(x1, param(ps, "post_attention_layernorm.weight"), eps);
    sink.put("post_attention_layernorm", h2);
    const TT gate = linear(h2, param(ps, "mlp.gate_proj.weight"), param(ps, "mlp.gate_proj.bias"));
    const TT up = linear(h2, param(ps, "mlp.up_proj.weight"), param(ps, "mlp.up_proj.bias"));
    sink.put("mlp.gate", gate), sink.put("mlp.up", up);
    const TT act = at::silu(gate) * up;  // act_fn(gate_proj(x)) * up_proj(x)
    sink.put("mlp.act", act);
    const TT down = linear(act, param(ps, "mlp.down_proj.weight"), param(ps, "mlp.down_proj.bias"));
    sink.put("mlp.down", down);
    const TT out = x1 + down;
    sink.put("output", out);
    return out;
  }

  // Gemma2DecoderLayer.forward: Gemma2RMSNorm before and after the attention and the MLP, GeGLU (tanh)
  TT gemma2_layer(const TT& x, int64_t t0, Cache& cache, bool observe, const Sink& sink) const {
    const double eps = p.llama.rms_norm_eps;
    auto norm = [&](const TT& in, const char* name) {
      const TT y = gemma_rms_norm(in, param(ps, std::string(name) + ".weight"), eps);
      sink.put(name, y);
      return y;
    };
    const TT h = norm(x, "input_layernorm");
    const TT a = llama_attention(h, t0, "self_attn.", cache, observe, Sink{sink.out, sink.prefix + "attn.", "", ""});
    const TT x1 = x + norm(a, "post_attention_layernorm");
    sink.put("attn_residual", x1);
    const TT h2 = norm(x1, "pre_feedforward_layernorm");
    const TT gate = linear(h2, param(ps, "mlp.gate_proj.weight"), param(ps, "mlp.gate_proj.bias"));
    const TT up = linear(h2, param(ps, "mlp.up_proj.weight"), param(ps, "mlp.up_proj.bias"));
    sink.put("mlp.gate", gate), sink.put("mlp.up", up);
    const TT act = at::gelu(gate, "tanh") * up;  // gelu_pytorch_tanh(gate_proj(x)) * up_proj(x)
    sink.put("mlp.act", act);
    const TT down = linear(act, param(ps, "mlp.down_proj.weight"), param(ps, "mlp.down_proj.bias"));
    sink.put("mlp.down", down);
    const TT out = x1 + norm(down, "post_feedforward_layernorm");
    sink.put("output", out);
    return out;
  }

  // GPT2Block.forward
  TT gpt2_block(const TT& x, Cache& cache, bool observe, const Sink& sink) const {
    const Gpt2Config& c = p.gpt2;
    const int64_t B = x.size(0), Tn = x.size(1), C = c.hidden_size, D = C / c.num_heads;
    auto conv1d = [&](const TT& in, const std::string& name) {  // Conv1D: addmm(bias, x.view(-1, nx), weight)
      const TT w = param(ps, name + ".weight");
      return at::addmm(param(ps, name + ".bias"), in.reshape({-1, in.size(-1)}), w).view({B, Tn, w.size(1)});
    };
    const TT h = at::layer_norm(x, {C}, param(ps, "ln_1.weight"), param(ps, "ln_1.bias"), c.layer_norm_epsilon);
    sink.put("ln_1", h);
    const Sink as{sink.out, sink.prefix + "attn.", "", ""};
    const std::vector<TT> qkv = conv1d(h, "attn.c_attn").split(C, 2);
    auto heads = [&](const TT& t) { return t.view({B, Tn, -1, D}).transpose(1, 2); };
    const TT q = heads(qkv[0]), k = heads(qkv[1]), v = heads(qkv[2]);
    as.put("q", q), as.put("k", k), as.put("v", v);
    append(cache, k, v, observe, as);
    const TT ctx = attention(q, cache, 1, as);
    const TT a = conv1d(ctx, "attn.c_proj");
    as.put("output", a);
    const TT x1 = a + x;
    sink.put("attn_residual", x1);
    const TT h2 = at::layer_norm(x1, {C}, param(ps, "ln_2.weight"), param(ps, "ln_2.bias"), c.layer_norm_epsilon);
    sink.put("ln_2", h2);
    const TT fc = conv1d(h2, "mlp.c_fc");
    sink.put("mlp.fc", fc);
    // NewGELUActivation
    const TT act = 0.5 * fc * (1.0 + at::tanh(std::sqrt(2.0 / M_PI) * (fc + 0.044715 * at::pow(fc, 3.0))));
    sink.put("mlp.act", act);
    const TT m = conv1d(act, "mlp.c_proj");
    sink.put("mlp.proj", m);
    const TT out = x1 + m;
    sink.put("output", out);
    return out;
  }

  TT operator()(const TT& x, int64_t t0, Cache& cache, bool observe, const Sink& sink) const {
    switch (llm_row(p.module).block) {
      case LlmBlock::Layer:
        return llama_layer(x, t0, cache, observe, sink);
      case LlmBlock::Gemma2Layer:
        return gemma2_layer(x, t0, cache, observe, sink);
      case LlmBlock::Attention:
        return llama_attention(x, t0, "", cache, observe, sink);
      case LlmBlock::Gpt2:
        break;
    }
    return gpt2_block(x, cache, observe, sink);
  }
};

}  // namespace

TorchRun run_llm(const Problem& p, DType dtype, bool collect) {
  TorchRun run;
  const Params ps = state_params(p, dtype);
  const TT x = input(p, "hidden_states", dtype);
  const int64_t B = x.size(0), Tn = x.size(1);
  TT positions = input(p, "position_ids", dtype);
  if (!positions.defined()) positions = at::arange(Tn, at::kLong).unsqueeze(0).expand({B, Tn});
  TT padding = input(p, "key_padding_mask", dtype);
  Components* comps = collect ? &run.result.components : nullptr;
  const Call call{p, ps, scalar_type(dtype), positions, padding};
  TT out;
  if (p.decode_steps == 0) {
    Cache cache;
    out = call(x, 0, cache, false, Sink{comps, "", "", ""});
  } else {
    // The decode session (prefill, then one token a call, the cache growing), then the full causal
    // forward over every token, whose rows the session's outputs must be: the session's calls give
    // the step components, the full forward the output.
    const int64_t P = Tn - p.decode_steps;
    Cache cache;
    (void)call(x.slice(1, 0, P), 0, cache, true, Sink{comps, "prefill.", "", ""});
    for (int64_t t = P; t < Tn; ++t)
      (void)call(x.slice(1, t, t + 1), t, cache, true, Sink{comps, "step." + std::to_string(t - P) + ".", "", ""});
    Cache fresh;
    out = call(x, 0, fresh, false, Sink{});
    if (comps) comps->push_back({"output", to_hand(out)});
    run.notes.push_back("output: the full causal forward over all " + std::to_string(Tn) +
                        " tokens; the decode session's calls give the prefill.* and step.N.* components");
  }
  run.notes.push_back("no LibTorch module: " + module_name(p.module) +
                      " is transformers' (Python); the decomposition follows transformers 5.23's code line by line "
                      "in the run's dtype, and Hugging Face's fixtures verify it (libtorch64_vs_torch64)");
  run.result.outputs["output"] = to_dtensor(out, dtype);
  return run;
}

// The forward pass for the benchmark: weights and inputs converted once, no components.
std::function<void()> prepare_llm_torch(const Problem& p, DType dtype) {
  auto ps = std::make_shared<Params>(state_params(p, dtype));
  auto prob = std::make_shared<Problem>(p);
  prob->state_dict.clear();
  const TT x = input(p, "hidden_states", dtype);
  const int64_t B = x.size(0), Tn = x.size(1);
  TT positions = input(p, "position_ids", dtype);
  if (!positions.defined()) positions = at::arange(Tn, at::kLong).unsqueeze(0).expand({B, Tn});
  const TT padding = input(p, "key_padding_mask", dtype);
  const at::ScalarType st = scalar_type(dtype);
  // A decode session times its steps alone: the prefill runs once here, and each timed call starts
  // from that cache (DynamicLayer.update's torch.cat copies it, as transformers does every step).
  auto prefilled = std::make_shared<Cache>();
  if (p.decode_steps > 0) {
    c10::NoGradGuard no_grad;
    const Call call{*prob, *ps, st, positions, padding};
    (void)call(x.slice(1, 0, Tn - p.decode_steps), 0, *prefilled, false, Sink{});
  }
  auto f = [prob, ps, x, positions, padding, st, prefilled] {
    c10::NoGradGuard no_grad;
    const Call call{*prob, *ps, st, positions, padding};
    const Sink none{};
    if (prob->decode_steps == 0) {
      Cache cache;
      (void)call(x, 0, cache, false, none);
      return;
    }
    Cache cache = *prefilled;
    for (int64_t t = x.size(1) - prob->decode_steps; t < x.size(1); ++t)
      (void)call(x.slice(1, t, t + 1), t, cache, false, none);
  };
  return f;
}

}  // namespace tparity::torch_ref
