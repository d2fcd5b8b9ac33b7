// The comparator's inner loop: blocks of "plain" pairs summed in registers (src/compare/plain_pairs.hpp)
// give the bits Norm2::add gives one value at a time, in measure() and estimate_noise(), and the block
// itself takes every plain block and refuses every other, whatever its length and wherever the odd
// value sits.
#include <catch2/catch.hpp>
#include <cmath>
#include <cstring>
#include <iterator>
#include <limits>
#include <vector>

#include "compare/plain_pairs.hpp"
#include "tparity/compare/metrics.hpp"
#include "tparity/compare/noise.hpp"
#include "tparity/harness/rng.hpp"

using namespace tparity;

namespace {
constexpr double kInf = std::numeric_limits<double>::infinity();
constexpr double kNaN = std::numeric_limits<double>::quiet_NaN();
bool same(double a, double b) { return std::memcmp(&a, &b, sizeof a) == 0; }
bool same(const Norm2& a, const Norm2& b) {
  const ScaledNorm x = a.norm(), y = b.norm();
  return same(x.root, y.root) && x.exponent == y.exponent;
}
}  // namespace

TEST_CASE("metrics: blocks of plain values sum as one value at a time does, bit for bit", "[compare]") {
  // measure() and estimate_noise() sum a block of "plain" pairs (finite, each |x - y| and |y| zero or
  // of ordinary size) in registers and fall back to Norm2::add one value at a time for the rest: spelled
  // out here with Norm2::add alone, over lengths across the 256-pair blocks, with values that send a
  // block down each path (tiny, huge, subnormal and non-finite values, exact zeros and ties) scattered
  // at random, the results must be the same bits.
  const double odd[] = {0.0, -0.0, kNaN, kInf, -kInf, 1e-320, 0x1p-512, 0x1p-511, 0x1p486, 0x1p487, 1e300,
                        -1e300, 1.7e308, 5e-324, 1e-160};
  Rng rng(29);
  for (int trial = 0; trial < 400; ++trial) {
    // Four kinds of trial: values of ordinary size alone; odd values scattered; equal values but for a
    // few differences below kSmall (beside references of ordinary size); every value below kSmall.
    // A difference or reference below kSmall shows in the norm only where nothing larger is summed.
    const int kind = trial % 4;
    const int64_t n = 1 + int64_t(rng.next() % 1200);
    const double p_odd = std::pow(10.0, -1 - 3 * rng.uniform());
    const double scale = kind == 3 ? 1e-160 : kind == 2 ? 1e-150 : std::ldexp(1.0, int(rng.next() % 60) - 30);
    Tensor<double> a({n}), b({n});
    for (int64_t i = 0; i < n; ++i) {
      b.data[i] = rng.normal() * scale;
      a.data[i] = b.data[i];
      if (kind == 0 || kind == 1) {
        if (rng.coin(0.7)) a.data[i] += rng.normal() * scale * 1e-6;
      } else if (kind == 3 || rng.coin(p_odd)) {
        a.data[i] += rng.normal() * 1e-165;
      }
      if (kind == 1 && rng.coin(p_odd)) a.data[i] = odd[rng.next() % std::size(odd)];
      if (kind == 1 && rng.coin(p_odd)) b.data[i] = odd[rng.next() % std::size(odd)];
    }
    CAPTURE(trial, n);
    // measure(), one pair at a time
    Norm2 diff, ref;
    double max_abs = 0;
    int64_t argmax = -1, first_mismatch = -1, nan_matched = 0, inf_matched = 0, mismatched = 0;
    for (int64_t i = 0; i < n; ++i) {
      const double x = a.data[i], y = b.data[i];
      if (!std::isfinite(x) || !std::isfinite(y)) {
        if (std::isnan(x) && std::isnan(y))
          ++nan_matched;
        else if (std::isinf(x) && x == y)
          ++inf_matched;
        else if (mismatched++ == 0)
          first_mismatch = i;
        continue;
      }
      const double d = std::fabs(x - y);
      if (std::isfinite(d))
        diff.add(d);
      else
        diff.add_doubled(x * 0.5 - y * 0.5);
      ref.add(y);
      if (argmax < 0 || d > max_abs) max_abs = d, argmax = i;
    }
    const Metrics m = measure(a, b);
    CHECK(same(m.l2, diff.norm().value()));
    CHECK(same(m.ref_l2, ref.norm().value()));
    CHECK(same(m.rel_l2, ratio(diff.norm(), ref.norm())));
    CHECK(same(m.max_abs, max_abs));
    CHECK(m.max_abs_index == (argmax >= 0 ? std::vector<int64_t>{argmax} : std::vector<int64_t>{}));
    CHECK(m.nan_matched == nan_matched);
    CHECK(m.inf_matched == inf_matched);
    CHECK(m.nonfinite_mismatch == mismatched);
    CHECK(m.first_mismatch_index == (first_mismatch >= 0 ? std::vector<int64_t>{first_mismatch} : std::vector<int64_t>{}));
    // estimate_noise()'s rms over two samples, one pair at a time over the positions finite in both
    // The second sample non-finite at a few positions where the first is finite: a block there is
    // left out of both samples' sums (estimate_noise's mask), plain or not.
    Tensor<double> a2 = a;
    for (double& x : a2.data)
      if (std::isfinite(x)) x = rng.coin(p_odd) ? (rng.coin() ? kNaN : -kInf) : x + rng.normal() * scale * 1e-7;
    double mean_sq = 0;
    int used = 0;
    for (const Tensor<double>* s : {&a, &a2}) {
      Norm2 e2, r2;
      for (int64_t i = 0; i < n; ++i) {
        const bool ok = std::isfinite(a.data[i]) && std::isfinite(a2.data[i]) && std::isfinite(b.data[i]);
        if (!ok) continue;
        const double d = s->data[i] - b.data[i];
        if (std::isfinite(d))
          e2.add(d);
        else
          e2.add_doubled(s->data[i] * 0.5 - b.data[i] * 0.5);
        r2.add(b.data[i]);
      }
      if (!(r2.norm().root > 0)) continue;
      const double rel = ratio(e2.norm(), r2.norm());
      mean_sq += rel * rel;
      ++used;
    }
    const NoiseEstimate e = estimate_noise({{&a, &b}, {&a2, &b}});
    CHECK(e.samples == used);
    if (used) CHECK(same(e.rms, std::sqrt(mean_sq / used)));
  }
}

TEST_CASE("plain pairs: every length takes a plain block and refuses one odd value anywhere", "[compare]") {
  // Lengths around the two-lane steps and the 256-pair blocks; an odd value at the first, second,
  // second-to-last and last position, of each kind that Norm2::add sums elsewhere than its medium sum
  // or that measure() counts apart.
  struct Odd {
    const char* what;
    double x, y;  // x replaces x_i, y replaces y_i (NaN: kept)
  };
  const Odd odds[] = {{"NaN in x", kNaN, 1.0},        {"inf in y", 1.0, kInf},
                      {"a difference below kSmall", 1e-150 + 1e-165, 1e-150},
                      {"y below kSmall", 1e-160, 1e-160}, {"y subnormal", 1e-310, 1e-310},
                      {"y above kBig", 0x1p487, 0x1p487},  {"x - y above kBig", 0x1p487, 1.0}};
  Rng rng(31);
  for (int64_t n : {0, 1, 2, 3, 4, 5, 255, 256, 257, 511, 513}) {
    CAPTURE(n);
    std::vector<double> x(static_cast<size_t>(n)), y(static_cast<size_t>(n));
    for (int64_t i = 0; i < n; ++i) {
      y[size_t(i)] = rng.normal();
      x[size_t(i)] = i % 3 == 0 ? y[size_t(i)] : y[size_t(i)] + 1e-6 * rng.normal();  // exact ties too
    }
    // A plain block: taken, every pair seen once in order, the sums Norm2::add's.
    Norm2 diff, ref, want_diff, want_ref;
    diff.add(0.5), ref.add(2.0), want_diff.add(0.5), want_ref.add(2.0);  // sums already under way
    std::vector<int64_t> seen;
    bool same_d = true;
    const bool taken = detail::PlainPairs::add(diff, ref, x.data(), y.data(), n, [&](int64_t i, double d) {
      seen.push_back(i);
      same_d = same_d && same(d, std::fabs(x[size_t(i)] - y[size_t(i)]));
    });
    for (int64_t i = 0; i < n; ++i) want_diff.add(x[size_t(i)] - y[size_t(i)]), want_ref.add(y[size_t(i)]);
    CHECK(taken);
    CHECK(same_d);
    std::vector<int64_t> order(static_cast<size_t>(n));
    for (int64_t i = 0; i < n; ++i) order[size_t(i)] = i;
    CHECK(seen == order);
    CHECK(same(diff, want_diff));
    CHECK(same(ref, want_ref));
    // One odd pair: refused, the sums untouched.
    for (int64_t at : {int64_t(0), int64_t(1), n - 2, n - 1}) {
      if (at < 0 || at >= n) continue;
      for (const Odd& odd : odds) {
        CAPTURE(at, odd.what);
        std::vector<double> xo = x, yo = y;
        xo[size_t(at)] = odd.x;
        yo[size_t(at)] = odd.y;
        Norm2 d2, r2, d0, r0;
        d2.add(0.5), r2.add(2.0), d0.add(0.5), r0.add(2.0);
        CHECK_FALSE(detail::PlainPairs::add(d2, r2, xo.data(), yo.data(), n, [](int64_t, double) {}));
        CHECK(same(d2, d0));
        CHECK(same(r2, r0));
      }
    }
  }
}
