#include "tparity/compare/metrics.hpp"

#include <algorithm>
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

namespace {

// Blue's thresholds and scales for double (LAPACK 3.10's la_constants): values above kBig are summed
// times kScaleBig, below kSmall times kScaleSmall, the rest as they are.
constexpr double kSmall = 0x1p-511, kBig = 0x1p486;
constexpr double kScaleSmall = 0x1p537, kScaleBig = 0x1p-538;
constexpr int kExpSmall = -537, kExpBig = 538;  // the norm's scale: 1 / kScaleSmall, 1 / kScaleBig

}  // namespace

void Norm2::add(double x) {
  const double ax = std::fabs(x);
  if (ax > kBig) {
    big_ += (ax * kScaleBig) * (ax * kScaleBig);
  } else if (ax < kSmall) {
    if (big_ == 0) small_ += (ax * kScaleSmall) * (ax * kScaleSmall);  // negligible beside a big one
  } else {
    medium_ += ax * ax;
  }
}

void Norm2::add_doubled(double h) {
  const double s = std::fabs(h) * kScaleBig * 2;  // |2h| > 2^1023 > kBig
  big_ += s * s;
}

ScaledNorm Norm2::norm() const {
  if (big_ > 0) {
    // The medium values, scaled down, join the big ones (those below kSmall are negligible).
    return {std::sqrt(big_ + (medium_ * kScaleBig) * kScaleBig), kExpBig};
  }
  if (small_ > 0) {
    if (medium_ > 0) {
      const double a = std::sqrt(medium_), b = std::sqrt(small_) / kScaleSmall;
      const double hi = std::max(a, b), lo = std::min(a, b);
      return {hi * std::sqrt(1 + (lo / hi) * (lo / hi)), 0};
    }
    return {std::sqrt(small_), kExpSmall};
  }
  return {std::sqrt(medium_), 0};
}

double ScaledNorm::value() const { return std::ldexp(root, exponent); }

double ratio(const ScaledNorm& a, const ScaledNorm& b) {
  if (a.root == 0) return 0;
  if (b.root == 0) return std::numeric_limits<double>::infinity();
  int ea = 0, eb = 0;
  const double ma = std::frexp(a.root, &ea), mb = std::frexp(b.root, &eb);
  return std::ldexp(ma / mb, ea - eb + a.exponent - b.exponent);
}

double scaled_difference(double x, double y, int k) {
  const double d = x - y;
  if (std::isfinite(d)) return k == 0 ? d : std::ldexp(d, -k);  // k is 0 for references of ordinary size
  return std::ldexp(x * 0.5 - y * 0.5, 1 - k);
}

Metrics measure(const Tensor<double>& a, const Tensor<double>& b) {
  Metrics m;
  if (a.shape != b.shape) {
    m.shape_mismatch = to_string(a.shape) + " vs reference " + to_string(b.shape);
    return m;
  }
  m.count = a.numel();
  Norm2 diff, ref;
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
    if (std::isfinite(d))
      diff.add(d);
    else  // beyond double's range: summed as 2 (x/2 - y/2), reported as inf
      diff.add_doubled(x * 0.5 - y * 0.5);
    ref.add(y);
    if (argmax < 0 || d > m.max_abs) {
      m.max_abs = d;
      argmax = i;
    }
  }
  const ScaledNorm dn = diff.norm(), rn = ref.norm();
  m.l2 = dn.value();
  m.ref_l2 = rn.value();
  m.rel_l2 = ratio(dn, rn);
  if (argmax >= 0) m.max_abs_index = unravel(argmax, a.shape);
  return m;
}

}  // namespace tparity
