#pragma once
// The comparator's inner loop over a block of pairs (x_i, y_i): the sums of squares of x_i - y_i and
// of y_i, which measure() and estimate_noise() take over every element of every tensor they compare
// (its main cost in the test suites: a selftest spent 44% of its time there). In the common case,
// every pair "plain", the two sums run in registers, two lanes checked at a time; otherwise nothing is
// added and the caller takes the block one pair at a time through Norm2::add. The same sums, in the
// same order, either way, where the arithmetic is IEEE double as written (SSE2 or the like; the
// comparator is compiled with -ffp-contract=off).
#include <cassert>
#include <cmath>
#include <cstdint>

#if defined(__SSE2__)
#include <emmintrin.h>
#endif

#include "tparity/compare/metrics.hpp"

namespace tparity::detail {

struct PlainPairs {
  // The block its callers offer at a time: a pair that is not plain sends the whole block through
  // Norm2::add, so blocks stay short; long enough that the checks cost little beside the sums.
  static constexpr int64_t kBlock = 256;

  // A value Norm2::add sums into its medium range alone: 0 (which adds nothing anywhere) or within
  // [kSmall, kBig]. False for NaN and infinities.
  static bool plain(double a) { return a == 0 || (a >= Norm2::kSmall && a <= Norm2::kBig); }

  // When every pair is plain (x_i, y_i finite, |x_i - y_i| and |y_i| plain): diff.add(|x_i - y_i|)
  // and ref.add(y_i) for i < n, in order, and true. Otherwise false, diff and ref untouched. on(i,
  // |x_i - y_i|) is called for each i < n, in order, whatever the outcome: keep what it gathers only
  // on true.
  template <class OnDiff>
  static bool add(Norm2& diff, Norm2& ref, const double* x, const double* y, int64_t n, OnDiff&& on) {
    assert(&diff != &ref);  // two sums, each in its own register
    double dm = diff.medium_, rm = ref.medium_;
    int64_t i = 0;
    bool ok = true;
#if defined(__SSE2__)
    // Two lanes at a time: the checks in vector compares, off the sums' chains of adds.
    const __m128d abs_mask = _mm_castsi128_pd(_mm_set1_epi64x(0x7fffffffffffffffLL));
    const __m128d small = _mm_set1_pd(Norm2::kSmall), big = _mm_set1_pd(Norm2::kBig), zero = _mm_setzero_pd();
    __m128d good = _mm_castsi128_pd(_mm_set1_epi64x(-1));
    for (; i + 2 <= n; i += 2) {
      const __m128d yv = _mm_loadu_pd(y + i);
      const __m128d d = _mm_and_pd(_mm_sub_pd(_mm_loadu_pd(x + i), yv), abs_mask);
      const __m128d a = _mm_and_pd(yv, abs_mask);
      // plain(v): v == 0 or kSmall <= v <= kBig; every compare is false for NaN
      const __m128d pd = _mm_or_pd(_mm_cmpeq_pd(d, zero), _mm_and_pd(_mm_cmpge_pd(d, small), _mm_cmple_pd(d, big)));
      const __m128d pa = _mm_or_pd(_mm_cmpeq_pd(a, zero), _mm_and_pd(_mm_cmpge_pd(a, small), _mm_cmple_pd(a, big)));
      good = _mm_and_pd(good, _mm_and_pd(pd, pa));
      const double d0 = _mm_cvtsd_f64(d), d1 = _mm_cvtsd_f64(_mm_unpackhi_pd(d, d));
      const double a0 = _mm_cvtsd_f64(a), a1 = _mm_cvtsd_f64(_mm_unpackhi_pd(a, a));
      dm += d0 * d0;
      rm += a0 * a0;
      on(i, d0);
      dm += d1 * d1;
      rm += a1 * a1;
      on(i + 1, d1);
    }
    ok = _mm_movemask_pd(good) == 3;
#endif
    for (; i < n; ++i) {
      const double d = std::fabs(x[i] - y[i]), a = std::fabs(y[i]);
      ok = ok && plain(d) && plain(a);
      dm += d * d;
      rm += a * a;
      on(i, d);
    }
    if (!ok) return false;
    diff.medium_ = dm;
    ref.medium_ = rm;
    return true;
  }
};

}  // namespace tparity::detail
