// Error metrics of one tensor against a reference, with explicit non-finite handling.
#pragma once

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

// a against the reference b. NaN/Inf are classified before any norm is taken.
Metrics measure(const Tensor<double>& a, const Tensor<double>& b);

// Flat row-major offset -> multi-index in `shape`.
std::vector<int64_t> unravel(int64_t flat, const Shape& shape);

}  // namespace tparity
