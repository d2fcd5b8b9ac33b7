// LibTorch's own float32 error on a component, measured from several samples, and the statistics the
// float32 gate draws from it (README, "The noise model").
//
// One sample is a pair (a float32 result, the float64 result of the same inputs). The plain
// reference gives one; evaluate runs more on jittered copies of the problem (every float32 weight and
// input moved to a neighbouring float32 at random), which changes every rounding's luck and nothing
// else. The gate judges an implementation's float32 rel_l2 by the noise scale
//   rms = sqrt(mean over samples of rel_l2^2)
// and by how few independent elements the error has: n_eff, the participation ratio of the
// elements' mean squared (relative) errors, (sum w)^2 / sum w^2, corrected for the scatter of w
// estimated from S samples (x (1 + 2/S)) and capped at the element count. With both errors modelled
// as Gaussian of the same per-element shape, an implementation's rel_l2^2 / rms^2 is F(n_eff, S
// n_eff)-distributed; quantile = sqrt(F_{1-alpha}(n_eff, S n_eff)) at alpha = 1e-6 (a table made by
// scripts/noise_table.py with scipy, interpolated in log n_eff, the largest tabulated S not above the
// samples taken).
#pragma once

#include <utility>
#include <vector>

#include "tparity/core/tensor.hpp"

namespace tparity {

struct NoiseEstimate {
  int samples = 0;      // S
  double rms = 0;       // sqrt(mean_s rel_l2_s^2)
  double n_eff = 0;     // effective independent elements of the error
  double quantile = 1;  // sqrt(F_{1-alpha}(n_eff, S n_eff))
};

// (result, reference) pairs of the same shape; positions non-finite in any of them are left out.
// Pairs whose shapes differ from the first are ignored.
NoiseEstimate estimate_noise(const std::vector<std::pair<const Tensor<double>*, const Tensor<double>*>>& samples);

// sqrt(F_{1-alpha}(n_eff, samples * n_eff)) for n_eff >= 1 (smaller values count as 1), alpha the
// table's (noise_alpha()).
double noise_quantile(double n_eff, int samples);
double noise_alpha();

}  // namespace tparity
