#include "tparity/compare/noise.hpp"

#include <algorithm>
#include <cmath>
#include <iterator>

#include "plain_pairs.hpp"
#include "tparity/compare/metrics.hpp"

namespace tparity {

namespace {
#include "noise_table.inc"
}  // namespace

double noise_alpha() { return kNoiseAlpha; }

double noise_quantile(double n_eff, int samples) {
  constexpr int nd = int(std::size(kNoiseTableD)), nm = int(std::size(kNoiseTableM));
  int row = 0;  // the largest tabulated m not above `samples`: fewer samples, a wider quantile
  for (int i = 0; i < nm; ++i)
    if (kNoiseTableM[i] <= samples) row = i;
  const double d = std::max(1.0, n_eff);
  if (d >= kNoiseTableD[nd - 1]) return kNoiseTable[row][nd - 1];
  int j = 0;
  while (kNoiseTableD[j + 1] < d) ++j;
  const double t =
      (std::log(d) - std::log(kNoiseTableD[j])) / (std::log(kNoiseTableD[j + 1]) - std::log(kNoiseTableD[j]));
  // The quantile falls steeply at small d: interpolate its logarithm.
  return std::exp((1 - t) * std::log(kNoiseTable[row][j]) + t * std::log(kNoiseTable[row][j + 1]));
}

NoiseEstimate estimate_noise(const std::vector<std::pair<const Tensor<double>*, const Tensor<double>*>>& samples) {
  NoiseEstimate est;
  if (samples.empty()) return est;
  const Shape& shape = samples.front().second->shape;
  std::vector<const std::pair<const Tensor<double>*, const Tensor<double>*>*> use;
  for (const auto& s : samples)
    if (s.first->shape == shape && s.second->shape == shape) use.push_back(&s);
  const size_t n = samples.front().second->data.size();
  // Positions finite in every sample.
  std::vector<char> ok(n, 1);
  for (const auto* s : use)
    for (size_t i = 0; i < n; ++i)
      ok[i] = ok[i] && std::isfinite(s->first->data[i]) && std::isfinite(s->second->data[i]);
  std::vector<double> w(n, 0.0);
  double mean_sq = 0;
  for (const auto* s : use) {
    // Scaled norms (metrics.hpp): a reference of 1e-300 or 1e300 gives the same relative figures as
    // one of 1.
    // A block at a time in registers where every position is finite in every sample and every pair
    // plain (plain_pairs.hpp), the rest one by one: the same sums either way.
    Norm2 e2, r2;
    const double* xs = s->first->data.data();
    const double* ys = s->second->data.data();
    constexpr size_t kBlock = size_t(detail::PlainPairs::kBlock);
    for (size_t i0 = 0; i0 < n; i0 += kBlock) {
      const size_t m = std::min(kBlock, n - i0);
      if (std::all_of(ok.begin() + i0, ok.begin() + i0 + m, [](char c) { return c != 0; }) &&
          detail::PlainPairs::add(e2, r2, xs + i0, ys + i0, int64_t(m), [](int64_t, double) {}))
        continue;
      for (size_t i = i0; i < i0 + m; ++i)
        if (ok[i]) {
          const double d = xs[i] - ys[i];
          if (std::isfinite(d))
            e2.add(d);
          else
            e2.add_doubled(xs[i] * 0.5 - ys[i] * 0.5);
          r2.add(ys[i]);
        }
    }
    const ScaledNorm rn = r2.norm();
    if (!(rn.root > 0)) continue;  // a zero reference: no relative error to speak of
    const double rel = ratio(e2.norm(), rn);
    mean_sq += rel * rel;
    // Each element's squared error relative to the reference's norm: e_i / (root x 2^exponent).
    for (size_t i = 0; i < n; ++i)
      if (ok[i]) {
        const double e = scaled_difference(s->first->data[i], s->second->data[i], rn.exponent) / rn.root;
        w[i] += e * e;
      }
    ++est.samples;
  }
  if (est.samples == 0) return est;
  est.rms = std::sqrt(mean_sq / est.samples);
  double sum = 0, sum2 = 0, count = 0;
  for (size_t i = 0; i < n; ++i)
    if (ok[i]) sum += w[i] / est.samples, sum2 += (w[i] / est.samples) * (w[i] / est.samples), count += 1;
  est.n_eff = sum2 > 0 ? std::min(count, sum * sum / sum2 * (1 + 2.0 / est.samples)) : std::max(count, 1.0);
  est.quantile = noise_quantile(est.n_eff, est.samples);
  return est;
}

}  // namespace tparity
