#include "tparity/compare/metrics.hpp"

#include <cmath>
#include <limits>

namespace tparity {

std::vector<int64_t> unravel(int64_t flat, const Shape& shape) {
  std::vector<int64_t> idx(shape.size());
  for (size_t d = shape.size(); d-- > 0;) {
    idx[d] = shape[d] ? flat % shape[d] : 0;
    flat = shape[d] ? flat / shape[d] : 0;
  }
  return idx;
}

Metrics measure(const Tensor<double>& a, const Tensor<double>& b) {
  Metrics m;
  if (a.shape != b.shape) {
    m.shape_mismatch = to_string(a.shape) + " vs reference " + to_string(b.shape);
    return m;
  }
  m.count = a.numel();
  // Scaled sums of squares (LAPACK dnrm2 style) would guard against overflow; the values here are
  // activations of order 1..1e3, so plain double sums of squares keep full precision.
  double diff2 = 0, ref2 = 0;
  int64_t argmax = -1;
  for (int64_t i = 0; i < m.count; ++i) {
    const double x = a.data[size_t(i)], y = b.data[size_t(i)];
    const bool fx = std::isfinite(x), fy = std::isfinite(y);
    if (!fx || !fy) {
      if (std::isnan(x) && std::isnan(y))
        ++m.nan_matched;
      else if (std::isinf(x) && x == y)
        ++m.inf_matched;
      else if (m.nonfinite_mismatch++ == 0)
        m.first_mismatch_index = unravel(i, a.shape);
      continue;
    }
    const double d = std::fabs(x - y);
    diff2 += d * d;
    ref2 += y * y;
    if (argmax < 0 || d > m.max_abs) {
      m.max_abs = d;
      argmax = i;
    }
  }
  m.l2 = std::sqrt(diff2);
  m.ref_l2 = std::sqrt(ref2);
  m.rel_l2 = m.l2 == 0 ? 0.0 : (m.ref_l2 == 0 ? std::numeric_limits<double>::infinity() : m.l2 / m.ref_l2);
  if (argmax >= 0) m.max_abs_index = unravel(argmax, a.shape);
  return m;
}

}  // namespace tparity
