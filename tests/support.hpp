// Random tensors for the tests, from the project's portable stream.
#pragma once

#include <stdexcept>
#include <string>
#include <vector>

#include "tparity/core/ops.hpp"
#include "tparity/core/tensor.hpp"
#include "tparity/harness/cases.hpp"
#include "tparity/harness/rng.hpp"

namespace tparity::test {

inline Tensor<double> randn(Rng& rng, Shape s, double scale = 1.0) {
  Tensor<double> t(std::move(s));
  for (double& x : t.data) x = scale * rng.normal();
  return t;
}

inline Tensor<uint8_t> random_bool(Rng& rng, Shape s, double p) {
  Tensor<uint8_t> t(std::move(s));
  for (uint8_t& x : t.data) x = rng.coin(p);
  return t;
}

// A divisor of n drawn uniformly (a head count for embedding size n).
inline int64_t divisor_of(Rng& rng, int64_t n) {
  std::vector<int64_t> ds;
  for (int64_t d = 1; d <= n; ++d)
    if (n % d == 0) ds.push_back(d);
  return ds[size_t(rng.integer(0, int64_t(ds.size()) - 1))];
}

// A default case found by its name (never by its position in the list).
inline CaseSpec default_case(const std::string& name) {
  for (const CaseSpec& s : default_cases())
    if (s.name == name) return s;
  throw std::invalid_argument("no default case named " + name);
}

// The core's path (fast or reference) for one scope, restored after.
class ScopedCorePath {
 public:
  explicit ScopedCorePath(CorePath p) : saved_(core_path()) { set_core_path(p); }
  ~ScopedCorePath() { set_core_path(saved_); }
  ScopedCorePath(const ScopedCorePath&) = delete;
  ScopedCorePath& operator=(const ScopedCorePath&) = delete;

 private:
  CorePath saved_;
};

}  // namespace tparity::test
