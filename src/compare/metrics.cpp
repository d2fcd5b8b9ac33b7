#include "tparity/compare/metrics.hpp"

#include <fmt/format.h>

#include <algorithm>
#include <cmath>
#include <limits>

#include "plain_pairs.hpp"

namespace tparity {

std::vector<int64_t> unravel(int64_t flat, const Shape& shape) {
  std::vector<int64_t> idx(shape.size());
  for (size_t d = shape.size(); d-- > 0;) {
    idx[d] = shape[d] ? flat % shape[d] : 0;
    flat = shape[d] ? flat / shape[d] : 0;
  }
  return idx;
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

Metrics measure(const Tensor<double>& a, const Tensor<double>& b) {
  Metrics m;
  if (a.shape != b.shape) {
    m.shape_mismatch = to_string(a.shape) + " vs reference " + to_string(b.shape);
    return m;
  }
  m.count = a.numel();
  // The loop keeps its state in locals (Metrics is written after): stores through `m` inside it would
  // make the compiler reload the data pointers and keep the sums in memory, at about twice the time.
  const double* xs = a.data.data();
  const double* ys = b.data.data();
  const int64_t count = m.count;
  Norm2 diff, ref;
  double max_abs = 0;
  int64_t argmax = -1, first_mismatch = -1;
  // A block of plain pairs (detail::PlainPairs: finite, none tiny or huge) at a time, the rest one by
  // one; the same sums in the same order either way.
  constexpr int64_t kBlock = detail::PlainPairs::kBlock;
  for (int64_t i0 = 0; i0 < count; i0 += kBlock) {
    const int64_t n = std::min(kBlock, count - i0);
    double block_max = max_abs;
    int64_t block_argmax = argmax;
    const bool plain = detail::PlainPairs::add(diff, ref, xs + i0, ys + i0, n, [&](int64_t i, double d) {
      if (block_argmax < 0 || d > block_max) {
        block_max = d;
        block_argmax = i0 + i;
      }
    });
    if (plain) {
      max_abs = block_max;
      argmax = block_argmax;
      continue;
    }
    for (int64_t i = i0; i < i0 + n; ++i) {
      const double x = xs[i], y = ys[i];
      if (!std::isfinite(x) || !std::isfinite(y)) {
        if (std::isnan(x) && std::isnan(y))
          ++m.nan_matched;
        else if (std::isinf(x) && x == y)
          ++m.inf_matched;
        else if (m.nonfinite_mismatch++ == 0)
          first_mismatch = i;
        continue;
      }
      const double d = std::fabs(x - y);
      if (std::isfinite(d))
        diff.add(d);
      else  // beyond double's range: summed as 2 (x/2 - y/2), reported as inf
        diff.add_doubled(x * 0.5 - y * 0.5);
      ref.add(y);
      if (argmax < 0 || d > max_abs) {
        max_abs = d;
        argmax = i;
      }
    }
  }
  m.max_abs = max_abs;
  if (first_mismatch >= 0) m.first_mismatch_index = unravel(first_mismatch, a.shape);
  const ScaledNorm dn = diff.norm(), rn = ref.norm();
  m.l2 = dn.value();
  m.ref_l2 = rn.value();
  m.rel_l2 = ratio(dn, rn);
  if (argmax >= 0) m.max_abs_index = unravel(argmax, a.shape);
  return m;
}

namespace {

std::string index_text(const std::vector<int64_t>& idx) {
  std::string s = "[";
  for (size_t i = 0; i < idx.size(); ++i) s += (i ? "," : "") + std::to_string(idx[i]);
  return s + "]";
}

}  // namespace

NonfinitePattern nonfinite_pattern(const Tensor<double>& a, const Tensor<double>& b) {
  NonfinitePattern p;
  if (a.shape != b.shape) return p;
  const int64_t total = a.numel();
  const int64_t n = a.shape.empty() ? 1 : std::max<int64_t>(a.shape.back(), 1);
  const int64_t rows = total / n;
  // Each kind of mismatch, counted, and its first position.
  int64_t nan_vs_finite = 0, inf_vs_finite = 0, finite_vs_nonfinite = 0, other = 0, first = -1;
  int64_t in_rows = 0;  // mismatches inside rows wholly non-finite in a and finite in b
  bool all_nan = true;  // those rows are NaN, not infinities
  for (int64_t r = 0; r < rows; ++r) {
    const double* x = a.data.data() + r * n;
    const double* y = b.data.data() + r * n;
    int64_t bad_a = 0, bad_b = 0, mismatched = 0;
    bool row_nan = true;
    for (int64_t i = 0; i < n; ++i) {
      const bool fx = std::isfinite(x[i]), fy = std::isfinite(y[i]);
      bad_a += fx ? 0 : 1;
      bad_b += fy ? 0 : 1;
      row_nan = row_nan && std::isnan(x[i]);
      if (fx && fy) continue;
      if ((std::isnan(x[i]) && std::isnan(y[i])) || (std::isinf(x[i]) && x[i] == y[i])) continue;
      ++mismatched;
      if (first < 0) first = r * n + i;
      if (std::isnan(x[i]) && fy)
        ++nan_vs_finite;
      else if (std::isinf(x[i]) && fy)
        ++inf_vs_finite;
      else if (fx)
        ++finite_vs_nonfinite;
      else
        ++other;
    }
    if (mismatched && bad_a == n && bad_b == 0) {
      in_rows += mismatched;
      all_nan = all_nan && row_nan;
      if (p.rows++ == 0) {
        p.first_row = unravel(r * n, a.shape);
        if (!p.first_row.empty()) p.first_row.pop_back();
      }
      // Uniform: every value the same 1/n (a softmax over keys that are all masked), to float64's
      // rounding.
      bool uniform = true;
      for (int64_t i = 0; i < n && uniform; ++i) uniform = std::fabs(y[i] - 1.0 / double(n)) <= 1e-12 / double(n);
      p.uniform_rows += uniform ? 1 : 0;
    }
  }
  const int64_t mismatches = nan_vs_finite + inf_vs_finite + finite_vs_nonfinite + other;
  if (mismatches == 0) return p;
  if (in_rows == mismatches) {
    p.kind = "nonfinite-rows";
    const char* what = all_nan ? "NaN" : "non-finite";
    p.text = fmt::format(
        "{} row(s) of the last axis (length {}) are {} in yours where the reference's are finite, "
        "first row {}",
        p.rows, n, what, index_text(p.first_row));
    if (p.uniform_rows)
      p.text += fmt::format(
          "; {} in the reference uniform (every value 1/{}: rows where every key is masked): the reference gives "
          "uniform weights, yours {}",
          p.uniform_rows == p.rows ? std::string("all") : fmt::format("{} of them", p.uniform_rows), n, what);
    return p;
  }
  p.kind = "nonfinite";
  std::vector<std::string> parts;
  if (nan_vs_finite) parts.push_back(fmt::format("{} NaN in yours where the reference is finite", nan_vs_finite));
  if (inf_vs_finite) parts.push_back(fmt::format("{} infinite in yours where the reference is finite", inf_vs_finite));
  if (finite_vs_nonfinite)
    parts.push_back(fmt::format("{} finite in yours where the reference is NaN or infinite", finite_vs_nonfinite));
  if (other)
    parts.push_back(fmt::format("{} non-finite in both but not alike (NaN against inf, +inf against -inf)", other));
  for (size_t i = 0; i < parts.size(); ++i) p.text += (i ? ", " : "") + parts[i];
  p.text += fmt::format("; first at {}", index_text(unravel(first, a.shape)));
  if (p.rows)
    p.text +=
        fmt::format("; {} whole row(s) of the last axis among them, first row {}", p.rows, index_text(p.first_row));
  return p;
}

}  // namespace tparity
