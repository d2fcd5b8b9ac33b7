// The reference's attention: MultiheadAttention op by op, and scaled dot-product attention.
#include <cmath>
#include <limits>

#include "internal.hpp"

namespace tparity::torch_ref {

MhaParams mha_params(const Params& ps, const std::string& prefix) {
  return {
      param(ps, prefix + "in_proj_weight"), param(ps, prefix + "in_proj_bias"),    param(ps, prefix + "q_proj_weight"),
      param(ps, prefix + "k_proj_weight"),  param(ps, prefix + "v_proj_weight"),   param(ps, prefix + "bias_k"),
      param(ps, prefix + "bias_v"),         param(ps, prefix + "out_proj.weight"), param(ps, prefix + "out_proj.bias")};
}

// mirrors torch::nn::functional::detail::multi_head_attention_forward (the C++ module's, the same in
// 1.13 and 2.x), op by op, with the masks merged and fully masked rows handled as Python's
// F.multi_head_attention_forward of the LibTorch built against does:
//  - 1.13: a bool attn_mask is -inf where true; a float key padding mask alone is added; a bool
//    attn_mask ORs a float key padding mask's nonzeros; a bool one is filled as -inf (masked_fill);
//  - 2.x: each mask additive on its own (bool: -inf where true), attn_mask + key_padding_mask added
//    to the scores; with need_weights=False (scaled_dot_product_attention) a row whose every score is
//    -inf gets zero weights (_safe_softmax).
// On everything the C++ module accepts after the runner's adaptation (a bool key padding mask; no
// fully masked rows under 2.x: module_limitation) both merges give the C++ module's bits.
MhaResult mha_decomposed(const MhaConfig& c, const MhaForward& fwd, const MhaParams& w, const TT& query, const TT& key,
                         const TT& value, TT attn_mask, TT kpm, const Sink& sink) {
  const int64_t L = query.size(0), B = query.size(1), E = c.embed_dim, H = c.num_heads, D = E / H;
  const double scaling = 1 / std::sqrt(double(D));
  const auto ninf = -std::numeric_limits<double>::infinity();
  TT q, k, v;
  if (c.packed()) {
    const TT& W = w.in_proj_weight;
    const TT& b = w.in_proj_bias;
    auto bslice = [&](int64_t from, int64_t to) { return b.defined() ? b.slice(0, from, to) : TT(); };
    if (at::equal(query, key) && at::equal(key, value)) {  // self-attention
      auto chunks = linear(query, W, b).chunk(3, -1);
      q = chunks[0], k = chunks[1], v = chunks[2];
    } else if (at::equal(key, value)) {  // encoder-decoder attention
      q = linear(query, W.slice(0, 0, E), bslice(0, E));
      auto chunks = linear(key, W.slice(0, E), bslice(E, 3 * E)).chunk(2, -1);
      k = chunks[0], v = chunks[1];
    } else {
      q = linear(query, W.slice(0, 0, E), bslice(0, E));
      k = linear(key, W.slice(0, E, 2 * E), bslice(E, 2 * E));
      v = linear(value, W.slice(0, 2 * E), bslice(2 * E, 3 * E));
    }
  } else {
    const TT& b = w.in_proj_bias;
    q = linear(query, w.q_proj_weight, b.defined() ? b.slice(0, 0, E) : TT());
    k = linear(key, w.k_proj_weight, b.defined() ? b.slice(0, E, 2 * E) : TT());
    v = linear(value, w.v_proj_weight, b.defined() ? b.slice(0, 2 * E) : TT());
  }
  // Component q: (L, B, E) -> (B, H, L, D), before scaling.
  sink.put("q", q.contiguous().view({L, B * H, D}).transpose(0, 1).reshape({B, H, L, D}));
  q = q * scaling;
  if (c.add_bias_kv) {
    k = at::cat({k, w.bias_k.repeat({1, B, 1})});
    v = at::cat({v, w.bias_v.repeat({1, B, 1})});
    if (attn_mask.defined()) attn_mask = at::constant_pad_nd(attn_mask, {0, 1});
    if (kpm.defined()) kpm = at::constant_pad_nd(kpm, {0, 1});
  }
  q = q.contiguous().view({L, B * H, D}).transpose(0, 1);
  k = k.contiguous().view({-1, B * H, D}).transpose(0, 1);
  v = v.contiguous().view({-1, B * H, D}).transpose(0, 1);
  if (c.add_zero_attn) {
    k = at::cat({k, at::zeros({B * H, 1, D}, k.options())}, 1);
    v = at::cat({v, at::zeros({B * H, 1, D}, v.options())}, 1);
    if (attn_mask.defined()) attn_mask = at::constant_pad_nd(attn_mask, {0, 1});
    if (kpm.defined()) kpm = at::constant_pad_nd(kpm, {0, 1});
  }
  const int64_t S = k.size(1);
  sink.put("k", k.reshape({B, H, S, D}));
  sink.put("v", v.reshape({B, H, S, D}));

  TT scores = at::bmm(q, k.transpose(1, 2));
  if (kTorchVersion >= 200) {
    // attn_mask = attn_mask + key_padding_mask, each additive, then added to the scores (baddbmm).
    auto additive = [&](const TT& m) {
      return m.scalar_type() == at::kBool ? bool_to_additive(m, scores.scalar_type()) : m;
    };
    TT merged;
    if (attn_mask.defined()) merged = additive(attn_mask);
    if (kpm.defined()) {
      const TT k_add = additive(kpm).view({B, 1, 1, S}).expand({B, H, 1, S}).reshape({B * H, 1, S});
      merged = merged.defined() ? merged + k_add : k_add;
    }
    if (merged.defined()) scores += merged;
  } else {
    if (attn_mask.defined() && attn_mask.scalar_type() == at::kBool && kpm.defined() && kpm.scalar_type() != at::kBool)
      kpm = kpm != 0;  // Python: attn_mask.logical_or(key_padding_mask)
    if (attn_mask.defined()) {
      if (attn_mask.scalar_type() == at::kBool) attn_mask = bool_to_additive(attn_mask, scores.scalar_type());
      scores += attn_mask.dim() == 2 ? attn_mask.unsqueeze(0) : attn_mask;
    }
    if (kpm.defined()) {
      scores = scores.view({B, H, L, S});
      if (kpm.scalar_type() == at::kBool)
        scores = scores.masked_fill(kpm.unsqueeze(1).unsqueeze(2), ninf);
      else
        scores = scores + kpm.view({B, 1, 1, S});
      scores = scores.view({B * H, L, S});
    }
  }
  sink.put("scores", scores.view({B, H, L, S}));
#if TORCH_VERSION_MAJOR >= 2
  TT weights = fwd.need_weights ? at::softmax(scores, -1) : at::_safe_softmax(scores, -1);
#else
  TT weights = at::softmax(scores, -1);
#endif
  sink.put("attn_weights", weights.view({B, H, L, S}));
  TT context = at::bmm(weights, v).transpose(0, 1).contiguous().view({L, B, E});
  sink.put("context", context.transpose(0, 1));
  TT output = linear(context, w.out_proj_weight, w.out_proj_bias);
  sink.put("output", output.transpose(0, 1));
  MhaResult r{output, TT()};
  if (fwd.need_weights) {
    r.weights = weights.view({B, H, L, S});
    if (fwd.average_attn_weights) {
      r.weights = r.weights.sum(1) / H;
      sink.put("attn_weights_avg", r.weights);
    }
  }
  return r;
}

TorchRun run_mha(const Problem& p, DType dtype, bool collect) {
  TorchRun run;
  const MhaConfig& c = p.mha;
  const bool batched = p.input("query")->shape.size() == 3;
  const TT query = seq_first(input(p, "query", dtype), batched, c.batch_first);
  const TT key = seq_first(input(p, "key", dtype), batched, c.batch_first);
  const TT value = seq_first(input(p, "value", dtype), batched, c.batch_first);
  const TT attn = input(p, "attn_mask", dtype);
  TT kpm = input(p, "key_padding_mask", dtype);
  if (kpm.defined() && !batched) kpm = kpm.unsqueeze(0);

  const Sink sink{collect ? &run.result.components : nullptr, "", "", ""};
  const MhaResult ref =
      mha_decomposed(c, p.forward, mha_params(state_params(p, dtype), ""), query, key, value, attn, kpm, sink);
  TT out = ref.output, weights = ref.weights;
  against_module(run, p, dtype, out, p.forward.need_weights ? &weights : nullptr);
  run.result.outputs["output"] = to_dtensor(from_seq_first(out, batched, c.batch_first), dtype);
  if (p.forward.need_weights)
    run.result.outputs["attn_weights"] = to_dtensor(batched ? weights : weights.squeeze(0), dtype);
  return run;
}

// scaled_dot_product_attention's attn_mask as an additive one: a bool mask is true where the key
// takes part; is_causal is ones(L, S, bool).tril() (both versions' math paths).
TT sdpa_additive_mask(const Problem& p, const TT& q, const TT& k, DType dtype) {
  TT mask = input(p, "attn_mask", dtype);
  if (p.sdpa.is_causal) mask = at::ones({q.size(-2), k.size(-2)}, at::TensorOptions().dtype(at::kBool)).tril();
  if (mask.defined() && mask.scalar_type() == at::kBool)
    mask = bool_to_additive(mask.logical_not(), scalar_type(dtype));
  return mask;
}

TorchRun run_sdpa(const Problem& p, DType dtype, bool collect) {
  TorchRun run;
  const TT q = input(p, "query", dtype);
  TT k = input(p, "key", dtype), v = input(p, "value", dtype);
  const TT mask = sdpa_additive_mask(p, q, k, dtype);
  const Sink sink{collect ? &run.result.components : nullptr, "", "", ""};
#if TORCH_VERSION_MAJOR >= 2
  // mirrors at::_scaled_dot_product_attention_math (2.x, the math path of
  // F.scaled_dot_product_attention): k and v repeated over q's heads (enable_gqa, repeat_interleave on
  // dim -3), q and k^T scaled by sqrt(|scale|) (q by its negative for a negative scale), the mask added,
  // a "safe" softmax (rows whose every score is -inf give zero weights, not NaN), @ v.
  if (p.sdpa.enable_gqa) {
    const int64_t group = q.size(-3) / k.size(-3);
    k = k.repeat_interleave(group, -3), v = v.repeat_interleave(group, -3);
  }
  const double scale = p.sdpa.scale.value_or(1 / std::sqrt(double(q.size(-1))));
  const double root = std::sqrt(std::abs(scale));
  TT scores = at::matmul(q * (scale < 0 ? -root : root), k.transpose(-2, -1) * root);
  if (mask.defined()) scores.add_(mask);
  sink.put("scores", scores);
  const TT weights = at::_safe_softmax(scores, -1);
#else
  // mirrors at::_scaled_dot_product_attention (1.13's math path, the forerunner of
  // F.scaled_dot_product_attention): q * scale @ k^T (+ mask), softmax, @ v. It has no scale or
  // enable_gqa argument.
  if (p.sdpa.scale)
    throw InputError(
        "config.scale: torch 1.13's scaled dot-product attention has no scale argument (2.1 added it); "
        "expected a LibTorch 2.x reference, got " +
        torch_version());
  if (p.sdpa.enable_gqa)
    throw InputError(
        "config.enable_gqa: torch 1.13's scaled dot-product attention has no enable_gqa argument (2.5 "
        "added it); expected a LibTorch 2.x reference, got " +
        torch_version());
  const double scale = 1 / std::sqrt(double(q.size(-1)));
  TT scores = at::matmul(q * scale, k.transpose(-2, -1));
  if (mask.defined()) scores = scores + mask;
  sink.put("scores", scores);
  const TT weights = at::softmax(scores, -1);
#endif
  // (Seed 004's DotProductAttention divides the scores instead: the same function, rounded differently.)
  sink.put("attn_weights", weights);
  const TT out = at::matmul(weights, v);
  sink.put("output", out);
  TT checked = out, checked_weights = weights;
  against_module(run, p, dtype, checked, &checked_weights);
  run.result.outputs["output"] = to_dtensor(out, dtype);
  return run;
}

}  // namespace tparity::torch_ref
