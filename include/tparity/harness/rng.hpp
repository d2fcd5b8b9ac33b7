// The project's random stream: the same numbers on every platform and standard library.
#pragma once

#include <cmath>
#include <cstdint>

namespace tparity {

// xoshiro256** seeded through splitmix64: the same stream on every platform, unlike
// std::normal_distribution, whose algorithm the standard leaves to the library.
class Rng {
 public:
  explicit Rng(uint64_t seed) {
    for (uint64_t& s : s_) {
      seed += 0x9e3779b97f4a7c15ULL;
      uint64_t z = seed;
      z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ULL;
      z = (z ^ (z >> 27)) * 0x94d049bb133111ebULL;
      s = z ^ (z >> 31);
    }
  }
  uint64_t next() {
    const uint64_t result = rotl(s_[1] * 5, 7) * 9, t = s_[1] << 17;
    s_[2] ^= s_[0];
    s_[3] ^= s_[1];
    s_[1] ^= s_[2];
    s_[0] ^= s_[3];
    s_[2] ^= t;
    s_[3] = rotl(s_[3], 45);
    return result;
  }
  double uniform() { return double(next() >> 11) * 0x1.0p-53; }  // [0, 1)
  double uniform(double lo, double hi) { return lo + (hi - lo) * uniform(); }
  int64_t integer(int64_t lo, int64_t hi) { return lo + int64_t(next() % uint64_t(hi - lo + 1)); }  // [lo, hi]
  bool coin(double p = 0.5) { return uniform() < p; }
  // `if (coin()) second = coin();` (second false otherwise), the same draws and the same state after,
  // without a branch on the first coin: a fair coin is a branch mispredicted half the time, which cost
  // more than the draws (jittered()'s loop over 30M values in a test program, GCC 12 -O2, an Emerald
  // Rapids Xeon: 575-740 -> 180-225 ms; in the -O3 build, SmolLM2's check spent 16.8 s in it, now 6.6).
  // coin() is true exactly when the draw's top bit is clear (uniform() < 0.5 <=> (next() >> 11) < 2^52).
  bool coin_then_coin(bool& second) {
    const uint64_t first = next();
    const uint64_t t0 = s_[0], t1 = s_[1], t2 = s_[2], t3 = s_[3];  // the state after one draw
    const uint64_t drawn = next();
    const uint64_t took = (first >> 63) - 1;  // all ones when the first coin came up true
    s_[0] = (s_[0] & took) | (t0 & ~took), s_[1] = (s_[1] & took) | (t1 & ~took);
    s_[2] = (s_[2] & took) | (t2 & ~took), s_[3] = (s_[3] & took) | (t3 & ~took);
    second = took != 0 && drawn >> 63 == 0;
    return took != 0;
  }
  double normal() {  // Box-Muller
    const double u1 = 1.0 - uniform(), u2 = uniform();
    return std::sqrt(-2.0 * std::log(u1)) * std::cos(6.283185307179586 * u2);
  }

 private:
  static uint64_t rotl(uint64_t x, int k) { return (x << k) | (x >> (64 - k)); }
  uint64_t s_[4];
};

}  // namespace tparity
