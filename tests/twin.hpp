// Scalar twins of the core's attention and encoder layer, for the unit tests: written again from
// torch 1.13's Python source (torch/nn/functional.py multi_head_attention_forward,
// torch/nn/modules/transformer.py), in long double, as plain nested loops, sharing no code with the
// core. Batched, batch-first inputs only (the layouts are tested separately).
#pragma once

#include <cmath>
#include <limits>
#include <vector>

#include "tparity/core/decoder.hpp"
#include "tparity/core/encoder.hpp"

namespace twin {

using tparity::Activation;
using tparity::EncoderConfig;
using tparity::EncoderWeights;
using tparity::Mask;
using tparity::MhaConfig;
using tparity::MhaWeights;
using tparity::Tensor;
using LD = long double;

// softmax(q . k / sqrt(E) + mask) . v for one (L, E) x (S, E) x (S, Ev) problem; mask (L, S) additive.
inline std::vector<LD> sdpa(const std::vector<LD>& q, const std::vector<LD>& k, const std::vector<LD>& v, int64_t L,
                            int64_t S, int64_t E, int64_t Ev, const std::vector<LD>* mask = nullptr,
                            std::vector<LD>* weights = nullptr) {
  std::vector<LD> out(size_t(L * Ev), 0), w(size_t(L * S));
  for (int64_t i = 0; i < L; ++i) {
    LD mx = -std::numeric_limits<LD>::infinity();
    for (int64_t j = 0; j < S; ++j) {
      LD s = 0;
      for (int64_t e = 0; e < E; ++e) s += q[size_t(i * E + e)] * k[size_t(j * E + e)];
      s = s / std::sqrt(LD(E));
      if (mask) s += (*mask)[size_t(i * S + j)];
      w[size_t(i * S + j)] = s;
      mx = std::max(mx, s);
    }
    LD total = 0;
    for (int64_t j = 0; j < S; ++j) total += w[size_t(i * S + j)] = std::exp(w[size_t(i * S + j)] - mx);
    for (int64_t j = 0; j < S; ++j) w[size_t(i * S + j)] /= total;
    for (int64_t j = 0; j < S; ++j)
      for (int64_t e = 0; e < Ev; ++e) out[size_t(i * Ev + e)] += w[size_t(i * S + j)] * v[size_t(j * Ev + e)];
  }
  if (weights) *weights = w;
  return out;
}

// y (N, OC) = x (N, C) W^T + b
inline std::vector<LD> linear(const std::vector<LD>& x, const Tensor<double>& W, const Tensor<double>* b, int64_t N,
                              int64_t C, int64_t OC, int64_t row0 = 0) {
  std::vector<LD> y(size_t(N * OC));
  for (int64_t n = 0; n < N; ++n)
    for (int64_t o = 0; o < OC; ++o) {
      LD acc = b && !b->empty() ? LD(b->data[size_t(row0 + o)]) : 0;
      for (int64_t c = 0; c < C; ++c) acc += x[size_t(n * C + c)] * LD(W.data[size_t((row0 + o) * C + c)]);
      y[size_t(n * OC + o)] = acc;
    }
  return y;
}

inline std::vector<LD> widen(const Tensor<double>& t, int64_t from = 0, int64_t n = -1) {
  return std::vector<LD>(t.data.begin() + from, n < 0 ? t.data.end() : t.data.begin() + from + n);
}

struct MhaResult {
  Tensor<double> output;   // (B, L, E)
  Tensor<double> weights;  // (B, H, L, S) per head
};

// multi_head_attention_forward: query (B, L, E), key (B, S, kdim), value (B, S, vdim); attn_mask
// (L, S) or (B*H, L, S); key_padding_mask (B, S).
inline MhaResult mha(const MhaConfig& c, const MhaWeights<double>& w, const Tensor<double>& query,
                     const Tensor<double>& key, const Tensor<double>& value, const Mask<double>& attn,
                     const Mask<double>& kpm) {
  const LD ninf = -std::numeric_limits<LD>::infinity();
  const int64_t B = query.size(0), L = query.size(1), S0 = key.size(1), E = c.embed_dim, H = c.num_heads, D = E / H;
  const int64_t KD = c.key_dim(), VD = c.value_dim();
  const int64_t S1 = S0 + (c.add_bias_kv ? 1 : 0), S = S1 + (c.add_zero_attn ? 1 : 0);
  MhaResult r{Tensor<double>({B, L, E}), Tensor<double>({B, H, L, S})};
  for (int64_t b = 0; b < B; ++b) {
    const std::vector<LD> x = widen(query, b * L * E, L * E), kx = widen(key, b * S0 * KD, S0 * KD),
                          vx = widen(value, b * S0 * VD, S0 * VD);
    const Tensor<double>* bias = c.bias ? &w.in_proj_bias : nullptr;
    // in_projection: rows [0, E), [E, 2E), [2E, 3E) of in_proj_weight and in_proj_bias
    std::vector<LD> Q, K, V;
    if (c.packed()) {
      Q = linear(x, w.in_proj_weight, bias, L, E, E, 0);
      K = linear(kx, w.in_proj_weight, bias, S0, E, E, E);
      V = linear(vx, w.in_proj_weight, bias, S0, E, E, 2 * E);
    } else {
      Tensor<double> bq, bk, bv;
      if (bias) {
        bq = Tensor<double>({E}, std::vector<double>(bias->data.begin(), bias->data.begin() + E));
        bk = Tensor<double>({E}, std::vector<double>(bias->data.begin() + E, bias->data.begin() + 2 * E));
        bv = Tensor<double>({E}, std::vector<double>(bias->data.begin() + 2 * E, bias->data.end()));
      }
      Q = linear(x, w.q_proj_weight, &bq, L, E, E);
      K = linear(kx, w.k_proj_weight, &bk, S0, KD, E);
      V = linear(vx, w.v_proj_weight, &bv, S0, VD, E);
    }
    if (c.add_bias_kv) {
      for (int64_t e = 0; e < E; ++e) K.push_back(w.bias_k.data[size_t(e)]);
      for (int64_t e = 0; e < E; ++e) V.push_back(w.bias_v.data[size_t(e)]);
    }
    std::vector<LD> ctx(size_t(L * E));
    for (int64_t h = 0; h < H; ++h) {
      std::vector<LD> qh(size_t(L * D)), kh(size_t(S * D), 0), vh(size_t(S * D), 0), mask(size_t(L * S), 0);
      for (int64_t i = 0; i < L; ++i)
        for (int64_t d = 0; d < D; ++d) qh[size_t(i * D + d)] = Q[size_t(i * E + h * D + d)];
      for (int64_t j = 0; j < S1; ++j)  // the zero-attention row, if any, stays 0
        for (int64_t d = 0; d < D; ++d) {
          kh[size_t(j * D + d)] = K[size_t(j * E + h * D + d)];
          vh[size_t(j * D + d)] = V[size_t(j * E + h * D + d)];
        }
      // The 1.13 merge: kpm ORed into a bool attn_mask, filled as -inf into a float one, used as is
      // alone; a bool result becomes -inf/0. Padded columns (bias_kv, zero_attn) are never masked.
      for (int64_t i = 0; i < L; ++i)
        for (int64_t j = 0; j < S0; ++j) {
          const int64_t ai = attn.present() ? (attn.shape().size() == 3 ? (b * H + h) * L * S0 : 0) + i * S0 + j : 0;
          const bool has_a = attn.present(), has_k = kpm.present();
          const bool a_bool = has_a && attn.is_bool() && attn.bools.data[size_t(ai)];
          const LD a_val = has_a && !attn.is_bool() ? LD(attn.floats.data[size_t(ai)]) : 0;
          const bool k_true = has_k && (kpm.is_bool() ? kpm.bools.data[size_t(b * S0 + j)] != 0
                                                      : kpm.floats.data[size_t(b * S0 + j)] != 0.0);
          const LD k_val = has_k && !kpm.is_bool() ? LD(kpm.floats.data[size_t(b * S0 + j)]) : 0;
          LD m = 0;
          if (!has_k)
            m = has_a ? (attn.is_bool() ? (a_bool ? ninf : 0) : a_val) : 0;
          else if (!has_a)
            m = kpm.is_bool() ? (k_true ? ninf : 0) : k_val;
          else if (attn.is_bool())
            m = (a_bool || k_true) ? ninf : 0;
          else
            m = k_true ? ninf : a_val;
          mask[size_t(i * S + j)] = m;
        }
      std::vector<LD> wts;
      const std::vector<LD> oh = sdpa(qh, kh, vh, L, S, D, D, &mask, &wts);
      for (int64_t i = 0; i < L; ++i)
        for (int64_t d = 0; d < D; ++d) ctx[size_t(i * E + h * D + d)] = oh[size_t(i * D + d)];
      for (int64_t x2 = 0; x2 < L * S; ++x2) r.weights.data[size_t((b * H + h) * L * S + x2)] = double(wts[size_t(x2)]);
    }
    const std::vector<LD> out = linear(ctx, w.out_proj_weight, c.bias ? &w.out_proj_bias : nullptr, L, E, E);
    for (int64_t x2 = 0; x2 < L * E; ++x2) r.output.data[size_t(b * L * E + x2)] = double(out[size_t(x2)]);
  }
  return r;
}

inline std::vector<LD> layer_norm(const std::vector<LD>& x, const Tensor<double>& g, const Tensor<double>& bt, LD eps,
                                  int64_t N, int64_t C) {
  std::vector<LD> y(x.size());
  for (int64_t n = 0; n < N; ++n) {
    LD mean = 0, var = 0;
    for (int64_t c = 0; c < C; ++c) mean += x[size_t(n * C + c)];
    mean /= LD(C);
    for (int64_t c = 0; c < C; ++c) var += (x[size_t(n * C + c)] - mean) * (x[size_t(n * C + c)] - mean);
    var /= LD(C);
    for (int64_t c = 0; c < C; ++c)
      y[size_t(n * C + c)] =
          (x[size_t(n * C + c)] - mean) / std::sqrt(var + eps) * LD(g.data[size_t(c)]) + LD(bt.data[size_t(c)]);
  }
  return y;
}

// TransformerEncoderLayer.forward on src (B, T, d), batch-first.
inline Tensor<double> encoder(const EncoderConfig& c, const EncoderWeights<double>& w, const Tensor<double>& src,
                              const Mask<double>& mask, const Mask<double>& kpm) {
  const int64_t B = src.size(0), T = src.size(1), d = c.d_model, F = c.dim_feedforward, N = B * T;
  const LD eps = LD(c.layer_norm_eps);
  auto to_tensor = [&](const std::vector<LD>& v) {
    Tensor<double> t({B, T, d});
    for (size_t i = 0; i < v.size(); ++i) t.data[i] = double(v[i]);
    return t;
  };
  auto sa = [&](const std::vector<LD>& x) {
    const Tensor<double> xt = to_tensor(x);  // rounds the attention's input to double, as the core holds it
    return widen(mha(c.self_attn(), w.self_attn, xt, xt, xt, mask, kpm).output);
  };
  auto ff = [&](const std::vector<LD>& x) {
    std::vector<LD> h = linear(x, w.linear1_weight, &w.linear1_bias, N, d, F);
    for (LD& z : h)
      z = c.activation == Activation::Relu ? std::max(z, LD(0)) : z * 0.5L * std::erfc(-z / std::sqrt(2.0L));
    return linear(h, w.linear2_weight, &w.linear2_bias, N, F, d);
  };
  auto add = [](std::vector<LD> a, const std::vector<LD>& b) {
    for (size_t i = 0; i < a.size(); ++i) a[i] += b[i];
    return a;
  };
  std::vector<LD> x = widen(src);
  if (c.norm_first) {
    x = add(x, sa(layer_norm(x, w.norm1_weight, w.norm1_bias, eps, N, d)));
    x = add(x, ff(layer_norm(x, w.norm2_weight, w.norm2_bias, eps, N, d)));
  } else {
    x = layer_norm(add(x, sa(x)), w.norm1_weight, w.norm1_bias, eps, N, d);
    x = layer_norm(add(x, ff(x)), w.norm2_weight, w.norm2_bias, eps, N, d);
  }
  return to_tensor(x);
}

// TransformerDecoderLayer.forward on tgt (B, T, d) and memory (B, S, d), batch-first.
inline Tensor<double> decoder(const EncoderConfig& c, const tparity::DecoderWeights<double>& w,
                              const Tensor<double>& tgt, const Tensor<double>& memory, const Mask<double>& tgt_mask,
                              const Mask<double>& memory_mask, const Mask<double>& tgt_kpm,
                              const Mask<double>& memory_kpm) {
  const int64_t B = tgt.size(0), T = tgt.size(1), d = c.d_model, F = c.dim_feedforward, N = B * T;
  const LD eps = LD(c.layer_norm_eps);
  auto to_tensor = [&](const std::vector<LD>& v) {
    Tensor<double> t({B, T, d});
    for (size_t i = 0; i < v.size(); ++i) t.data[i] = double(v[i]);
    return t;
  };
  auto sa = [&](const std::vector<LD>& x) {
    const Tensor<double> xt = to_tensor(x);
    return widen(mha(c.self_attn(), w.self_attn, xt, xt, xt, tgt_mask, tgt_kpm).output);
  };
  auto ca = [&](const std::vector<LD>& x) {
    return widen(mha(c.self_attn(), w.multihead_attn, to_tensor(x), memory, memory, memory_mask, memory_kpm).output);
  };
  auto ff = [&](const std::vector<LD>& x) {
    std::vector<LD> h = linear(x, w.linear1_weight, &w.linear1_bias, N, d, F);
    for (LD& z : h)
      z = c.activation == Activation::Relu ? std::max(z, LD(0)) : z * 0.5L * std::erfc(-z / std::sqrt(2.0L));
    return linear(h, w.linear2_weight, &w.linear2_bias, N, F, d);
  };
  auto add = [](std::vector<LD> a, const std::vector<LD>& b) {
    for (size_t i = 0; i < a.size(); ++i) a[i] += b[i];
    return a;
  };
  std::vector<LD> x = widen(tgt);
  if (c.norm_first) {
    x = add(x, sa(layer_norm(x, w.norm1_weight, w.norm1_bias, eps, N, d)));
    x = add(x, ca(layer_norm(x, w.norm2_weight, w.norm2_bias, eps, N, d)));
    x = add(x, ff(layer_norm(x, w.norm3_weight, w.norm3_bias, eps, N, d)));
  } else {
    x = layer_norm(add(x, sa(x)), w.norm1_weight, w.norm1_bias, eps, N, d);
    x = layer_norm(add(x, ca(x)), w.norm2_weight, w.norm2_bias, eps, N, d);
    x = layer_norm(add(x, ff(x)), w.norm3_weight, w.norm3_bias, eps, N, d);
  }
  return to_tensor(x);
}

}  // namespace twin
