// Error metrics of one tensor against a reference, with explicit non-finite handling.
#pragma once

#include <cmath>
#include <cstdint>
#include <string>
#include <vector>

#include "tparity/core/tensor.hpp"

namespace tparity {

struct Metrics {
  int64_t count = 0;                          // elements compared
  double l2 = 0;                              // ||a - b||_2 over positions where both are finite (the seeds' figure)
  double ref_l2 = 0;                          // ||b||_2 over the same positions
  double rel_l2 = 0;                          // l2 / ref_l2 (0 when both are 0; +inf when only the reference is 0)
  double max_abs = 0;                         // max |a - b| over those positions
  std::vector<int64_t> max_abs_index;         // where max_abs occurs (multi-index into the shape)
  int64_t nan_matched = 0;                    // NaN in both at the same position: agreement, counted
  int64_t inf_matched = 0;                    // the same infinity in both at the same position: agreement
  int64_t nonfinite_mismatch = 0;             // any other position where either is non-finite: disagreement
  std::vector<int64_t> first_mismatch_index;  // the first such position
  std::string shape_mismatch;                 // non-empty when the shapes differ (then nothing else is measured)

  bool comparable() const { return shape_mismatch.empty(); }
  // Finite figures and no non-finite disagreement.
  bool clean() const { return comparable() && nonfinite_mismatch == 0; }
};

// a against the reference b. NaN/Inf are classified before any norm is taken; the norms are taken
// without overflow or underflow (Norm2), so rel_l2 is right for values near 1e-300 and 1e300 alike.
Metrics measure(const Tensor<double>& a, const Tensor<double>& b);

// How the non-finite mismatches of a against the reference b are laid out. Rows are along the last
// axis (an attention row: one query's weights over the keys). kind "nonfinite-rows" when every
// mismatch lies in rows that are wholly non-finite in a and wholly finite in b (e.g. NaN where every
// key is masked and the reference gives uniform weights), else "nonfinite"; empty when nothing differs.
struct NonfinitePattern {
  std::string kind;
  int64_t rows = 0;                // rows wholly non-finite in a, wholly finite in b
  int64_t uniform_rows = 0;        // of those, rows where b's values are all 1/n
  std::vector<int64_t> first_row;  // the first such row's index (the shape without its last axis)
  std::string text;                // "3 row(s) of 16 are NaN in yours where the reference's are finite, ..."
};
NonfinitePattern nonfinite_pattern(const Tensor<double>& a, const Tensor<double>& b);

// A norm as root x 2^exponent: in range whatever the values summed (a norm of 1e300-sized values
// does not overflow, one of 1e-300-sized values does not underflow).
struct ScaledNorm {
  double root = 0;   // sqrt of the scaled sum of squares
  int exponent = 0;  // the scale's power of two

  double value() const;  // root x 2^exponent: +inf or 0 only beyond double's range
};
// a / b, exact to a rounding or two, +inf or 0 only beyond double's range; 0 when a is 0, +inf when
// only b is.
double ratio(const ScaledNorm& a, const ScaledNorm& b);

namespace detail {
struct PlainPairs;
}  // namespace detail

// ||x||_2 accumulated in three ranges, each scaled away from double's limits (Blue's algorithm, as
// LAPACK 3.10's dnrm2; Anderson, "Algorithm 978: Safe scaling in the Level 1 BLAS", 2017). Values of
// every normal magnitude keep full precision; a tensor of subnormals alone (below 2.2e-308) keeps the
// few bits they have, as dnrm2 does.
class Norm2 {
 public:
  // Inline, with add_doubled: the comparator calls them once per element of every tensor it
  // measures, and a Norm2 whose address escapes to a call keeps its sums in memory.
  void add(double x) {
    const double ax = std::fabs(x);
    if (ax > kBig) {
      big_ += (ax * kScaleBig) * (ax * kScaleBig);
    } else if (ax < kSmall) {
      if (big_ == 0) small_ += (ax * kScaleSmall) * (ax * kScaleSmall);  // negligible beside a big one
    } else {
      medium_ += ax * ax;
    }
  }
  // Adds 2h (a difference x - y computed as x/2 - y/2 where x - y overflows).
  void add_doubled(double h) {
    const double s = std::fabs(h) * kScaleBig * 2;  // |2h| > 2^1023 > kBig
    big_ += s * s;
  }
  ScaledNorm norm() const;
  friend struct detail::PlainPairs;  // sums blocks of plain values in registers (src/compare/plain_pairs.hpp)

  // Blue's thresholds and scales for double (LAPACK 3.10's la_constants): values above kBig are summed
  // times kScaleBig, below kSmall times kScaleSmall, the rest as they are.
  static constexpr double kSmall = 0x1p-511, kBig = 0x1p486;
  static constexpr double kScaleSmall = 0x1p537, kScaleBig = 0x1p-538;
  static constexpr int kExpSmall = -537, kExpBig = 538;  // the norm's scale: 1 / kScaleSmall, 1 / kScaleBig

 private:
  double small_ = 0, medium_ = 0, big_ = 0;
};

// (x - y) / 2^k without overflow: the difference of two finite values, scaled. Inline: the noise
// model calls it once per element of every sample.
inline double scaled_difference(double x, double y, int k) {
  const double d = x - y;
  if (std::isfinite(d)) return k == 0 ? d : std::ldexp(d, -k);  // k is 0 for references of ordinary size
  return std::ldexp(x * 0.5 - y * 0.5, 1 - k);
}

// Flat row-major offset -> multi-index in `shape`.
std::vector<int64_t> unravel(int64_t flat, const Shape& shape);

}  // namespace tparity
