// decode_session (llm.hpp): the prefill call, then one call per token, with the cache growing.
#pragma once

#include <algorithm>
#include <string>

#include "tparity/core/llm.hpp"

namespace tparity {

template <class T, class Layer>
Tensor<T> decode_session(const Layer& layer, const Tensor<T>& x, int64_t prefill, const DecoderMask& mask,
                         KvCache<T>& cache, Observer<T>* obs) {
  // x is (B, T, C); output will be (B, T, C)
  const int64_t B = x.size(0), Tn = x.size(1), C = x.size(2);
  if (prefill < 1 || prefill > Tn)
    throw ShapeError("config.decode_prefill: expected 1 <= prefill <= T = " + std::to_string(Tn) + ", got " +
                     std::to_string(prefill));
  Tensor<T> out({B, Tn, C});
  auto call = [&](int64_t t0, int64_t t1, const std::string& prefix) {
    Tensor<T> part({B, t1 - t0, C});
    for (int64_t b = 0; b < B; ++b)
      std::copy(x.ptr() + (b * Tn + t0) * C, x.ptr() + (b * Tn + t1) * C, part.ptr() + b * (t1 - t0) * C);
    DecoderMask m = mask;
    if (mask.positions) {
      m.positions = mask.positions + t0;
      m.positions_stride = mask.positions_stride ? mask.positions_stride : Tn;
    }
    PrefixObserver<T> sub(obs, prefix);
    const Tensor<T> y = layer(part, m, cache, PrefixObserver<T>::wrap(obs, sub));
    for (int64_t b = 0; b < B; ++b)
      std::copy(y.ptr() + b * (t1 - t0) * C, y.ptr() + (b + 1) * (t1 - t0) * C, out.ptr() + (b * Tn + t0) * C);
  };
  call(0, prefill, "prefill.");
  for (int64_t t = prefill; t < Tn; ++t) call(t, t + 1, "step." + std::to_string(t - prefill) + ".");
  if (obs) obs->on("output", out);
  return out;
}

}  // namespace tparity
