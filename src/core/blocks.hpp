// The blocks the encoder and decoder layers are built from (internal to src/core). Everything here
// works on batched, batch-first (B, T, d) tensors.
#pragma once

#include <algorithm>
#include <atomic>
#include <string>
#include <utility>

#include "layout.hpp"
#include "tparity/core/attention.hpp"
#include "tparity/core/defects.hpp"
#include "tparity/core/encoder.hpp"
#include "tparity/core/gemm.hpp"
#include "tparity/core/ops.hpp"
#include "tparity/core/parallel.hpp"

namespace tparity::detail {

template <class T>
void need(const Tensor<T>& t, const std::string& name, const Shape& s) {
  if (t.shape != s)
    throw ShapeError("state_dict." + name + ": expected shape " + to_string(s) + ", got " +
                     (t.empty() ? std::string("none") : to_string(t.shape)));
}

// A key padding mask of an unbatched call, (S), as the (1, S) the batched blocks take.
template <class T>
Mask<T> batch_key_padding(Mask<T> m, bool batched, int64_t S, const std::string& name) {
  if (batched || !m.present()) return m;
  if (m.shape() != Shape{S})
    throw ShapeError(name + ": expected shape " + to_string({S}) + " (S) for unbatched input, got shape " +
                     to_string(m.shape()));
  Shape& s = m.is_bool() ? m.bools.shape : m.floats.shape;
  s.insert(s.begin(), 1);
  return m;
}

// mirrors torch.nn.LayerNorm over the last dim
template <class T>
Tensor<T> layer_norm(const Tensor<T>& x, const Tensor<T>& g, const Tensor<T>& b, double eps) {
  profile::Scope scope(profile::Op::Norms);
  Tensor<T> out(x.shape);
  const int64_t C = x.size(-1);
  layernorm_forward(out.ptr(), x.ptr(), g.ptr(), b.ptr(), T(eps), x.numel() / C, C);
  return out;
}

// The same on a tensor the caller no longer needs, normalised in place: no new tensor to zero-fill
// (layernorm_forward's output may alias its input).
template <class T>
Tensor<T> layer_norm(Tensor<T>&& x, const Tensor<T>& g, const Tensor<T>& b, double eps) {
  profile::Scope scope(profile::Op::Norms);
  const int64_t C = x.size(-1);
  layernorm_forward(x.ptr(), x.ptr(), g.ptr(), b.ptr(), T(eps), x.numel() / C, C);
  return std::move(x);
}

template <class T>
Tensor<T> add(const Tensor<T>& a, const Tensor<T>& b) {
  Tensor<T> out(a.shape);
  add_forward(out.ptr(), a.ptr(), b.ptr(), a.numel());
  return out;
}

// The rows of x the fast feed-forward takes per pass: all N, unless the weights are small (both
// within an eighth of L2) and the hidden rows of all N would not stay in a quarter of it; then as many
// rows as keep a pass's hidden rows there (a multiple of 64, at least 64), so that the second product
// reads them from L2, not from memory. Each row's products, bias, activation and residual are the
// same whatever rows share a pass (the GEMM's sums run over k alike for any M): the same bits.
// The seed block (N = 5000, d = 64, F = 128; 2 MiB of L2: passes of 1024 rows), its two products
// as this path calls them, one pass and 1024-row passes alternating, 300 calls each, two runs on an
// Emerald Rapids Xeon: median 1.68 -> 1.56 and 1.73 -> 1.58 ms (passes of 512 or 2048: no better);
// and the hidden buffer 2.5 MiB -> 0.5 MiB.
template <class T>
int64_t ffn_rows_per_pass(int64_t N, int64_t d, int64_t F) {
  const int64_t l2 = cpu_caches().l2_per_core(), row = F * int64_t(sizeof(T));
  if (l2 == 0 || 2 * d * F * int64_t(sizeof(T)) > l2 / 8 || N * row <= l2 / 4) return N;
  const int64_t rows = l2 / 4 / row / 64 * 64;
  return rows < 64 ? N : rows;
}

// residual = residual + _ff_block(x): residual + linear2(activation(linear1(x))), the residual added in
// the second product's epilogue when nothing observes ffn_output (the same sum: add_forward's).
// Components: ffn_hidden (after the activation), ffn_output (before the residual). residual is (N, d)
// like x, and may be x itself: each row of either is read only for its own row of the sum. In passes
// of rows (ffn_rows_per_pass), each pass's sum goes to a buffer that stays in L2 and then over its
// rows of residual, so that no new tensor is made and filled with zeros (a pass's rows of x and
// residual are not read again): the seed block's layer, 3% of its time in that fill. In one pass
// (large weights: BERT's) the sum still goes to a new tensor, moved into residual.
template <class T>
void add_feed_forward(Activation act, const Tensor<T>& w1, const Tensor<T>& b1, const Tensor<T>& w2,
                      const Tensor<T>& b2, const Tensor<T>& x, Tensor<T>& residual, Observer<T>* obs) {
  profile::Scope scope(profile::Op::FFN);
  const int64_t d = x.size(-1), F = w1.size(0), N = x.numel() / d;
  if (!obs && core_path() == CorePath::Fast) {  // the hidden layer in an uninitialised buffer (layout.hpp)
    const int64_t rows = ffn_rows_per_pass<T>(N, d, F);
    Buffer<T> hidden(rows * F);
    GemmEpilogue<T> ep;
    ep.bias = injected_defect() == Defect::DropBias ? nullptr : b2.ptr();
    ep.ldr = d;
    if (rows == N) {  // one pass: the sum straight into a new tensor
      linear_act_forward(hidden.ptr(), x.ptr(), w1.ptr(), b1.ptr(), N, d, F, act);
      Tensor<T> out = Tensor<T>::unset(x.shape);  // C at beta 0: written whole
      ep.residual = residual.ptr();
      gemm(false, true, N, d, F, T(1), hidden.ptr(), F, w2.ptr(), F, T(0), out.ptr(), d, &ep, num_threads());
      residual = std::move(out);
      return;
    }
    // Pass [r0, r0 + n) through the given buffers. On one thread, the passes in turn; on more, the
    // passes go to whichever thread comes for more, each running its passes' products alone (a team
    // call from inside the team runs on its thread: parallel_team.hpp) in buffers of its own, at most
    // an n-th of a quarter of the rows each so that no thread is left waiting for a long last pass:
    // the seed block's FFN on two threads ran its ten small products at 1.26x one thread's speed,
    // each a call of the whole team.
    auto pass = [&](int64_t r0, int64_t n, T* hid, T* out) {
      GemmEpilogue<T> e = ep;
      e.residual = residual.ptr() + r0 * d;
      linear_act_forward(hid, x.ptr() + r0 * d, w1.ptr(), b1.ptr(), n, d, F, act);
      gemm(false, true, n, d, F, T(1), hid, F, w2.ptr(), F, T(0), out, d, &e, num_threads());
      std::copy_n(out, n * d, residual.ptr() + r0 * d);
    };
    const int threads = num_threads();
    if (threads <= 1) {
      Buffer<T> sum(rows * d);
      for (int64_t r0 = 0; r0 < N; r0 += rows) pass(r0, std::min(rows, N - r0), hidden.ptr(), sum.ptr());
      return;
    }
    hidden.release();
    const int64_t quarter = (N + 4 * threads - 1) / (4 * threads);
    const int64_t per = std::min(rows, (quarter + 63) / 64 * 64);
    std::atomic<int64_t> next{0};
    parallel_for(threads, threads, [&](int64_t, int64_t) {
      Buffer<T> hid(per * F), out(per * d);
      for (int64_t r0 = next.fetch_add(per); r0 < N; r0 = next.fetch_add(per)) pass(r0, std::min(per, N - r0), hid.ptr(), out.ptr());
    });
    return;
  }
  Shape hs = x.shape;
  hs.back() = F;
  Tensor<T> hidden(hs);
  linear_act_forward(hidden.ptr(), x.ptr(), w1.ptr(), b1.ptr(), N, d, F, act);
  if (obs) obs->on("ffn_hidden", hidden);
  Tensor<T> out(x.shape);
  linear_forward(out.ptr(), hidden.ptr(), w2.ptr(), b2.ptr(), N, F, d);
  if (obs) obs->on("ffn_output", out);
  add_forward(out.ptr(), residual.ptr(), out.ptr(), out.numel());
  residual = std::move(out);
}

// residual + _sa_block / _mha_block: residual + attention(q, kv, kv, attn_mask, key_padding_mask,
// need_weights=False)[0], its components under `prefix` ("sa." -> sa.q ... sa.context) and the
// attention's output (before the residual) as `output_name`. residual is (B, L, E) like q, or (L, B,
// E) like q when seq_first (the encoder's unobserved fast path, encoder.cpp).
template <class T>
Tensor<T> attention_block(const MhaConfig& cfg, const MhaWeights<T>& w, const Tensor<T>& q, const Tensor<T>& kv,
                          const Mask<T>& attn_mask, const Mask<T>& kpm, const Tensor<T>& residual, Observer<T>* obs,
                          const std::string& prefix, const std::string& output_name, bool seq_first = false) {
  MhaConfig c = cfg;
  c.batch_first = !seq_first;
  PrefixObserver<T> scoped(obs, prefix, "output", output_name);
  const T* res = injected_defect() == Defect::DropResidual && prefix == "sa." ? nullptr : residual.ptr();
  return mha_attend(c, MhaForward{false, true}, w, MhaInputRefs<T>{q, kv, kv, attn_mask, kpm},
                    PrefixObserver<T>::wrap(obs, scoped), res)
      .output;
}

// Checks a module input's rank and last dim; returns whether it is batched.
template <class T>
bool check_src(const Tensor<T>& src, int64_t d, const std::string& name);

// An encoder layer's feed-forward and norm parameters against the config; names under `prefix`.
template <class T>
void check_layer(const EncoderConfig& cfg, const EncoderWeights<T>& w, const std::string& prefix);

// One encoder layer on batch-first x (B, T, d), masks already batched; or on sequence-first x (T, B,
// d) when seq_first (see encoder_layer_forward).
template <class T>
Tensor<T> encoder_layer(const EncoderConfig& cfg, const EncoderWeights<T>& w, const Tensor<T>& x, const Mask<T>& mask,
                        const Mask<T>& kpm, Observer<T>* obs, bool seq_first = false);

}  // namespace tparity::detail
