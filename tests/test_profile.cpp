// The per-op profile (tparity/core/profile.hpp) that `tparity bench --profile` reads: each tick goes
// to the innermost open scope (exclusive times), time outside every scope to Other, and only the
// thread that turned profiling on is timed. The scopes spin on the wall clock for set durations, so
// the shares are ratios of those durations whatever the machine's speed; the tolerances separate
// exclusive from inclusive accounting (3:1 against 4:1) with room for a preempted spin.
#include <catch2/catch.hpp>
#include <chrono>
#include <thread>

#include "tparity/core/profile.hpp"

using namespace tparity;

namespace {

void spin(std::chrono::milliseconds d) {
  const auto until = std::chrono::steady_clock::now() + d;
  while (std::chrono::steady_clock::now() < until) {
  }
}

double ticks(const profile::Totals& t, profile::Op op) { return double(t.ticks[size_t(op)]); }

}  // namespace

TEST_CASE("profile: the innermost scope owns each tick, outside every scope is Other, off costs nothing", "[profile]") {
  using profile::Op;
  using std::chrono::milliseconds;
  profile::set_enabled(true);
  {
    const profile::Scope ffn(Op::FFN);
    spin(milliseconds(20));
    {
      const profile::Scope inner(Op::Softmax);
      spin(milliseconds(20));
    }
    spin(milliseconds(40));  // FFN's own: 60 ms, inclusive it would be 80
  }
  spin(milliseconds(20));  // no scope: Other
  // another thread's scopes are not timed (the core's workers, in a parallel region)
  std::thread([] {
    const profile::Scope s(Op::Copies);
    spin(milliseconds(20));
  }).join();
  const profile::Totals t = profile::totals();
  profile::set_enabled(false);
  const double softmax = ticks(t, Op::Softmax);
  REQUIRE(softmax > 0);
  CHECK(ticks(t, Op::FFN) / softmax == Approx(3.0).margin(0.45));
  CHECK(ticks(t, Op::Other) / softmax >= 0.85);  // 20 ms of spin and the 20 ms join
  CHECK(ticks(t, Op::Copies) == 0);
  CHECK(ticks(t, Op::Projections) == 0);
  CHECK(t.total() == t.ticks[size_t(Op::FFN)] + t.ticks[size_t(Op::Softmax)] + t.ticks[size_t(Op::Other)]);

  // off: scopes charge nothing, and turning it on again starts from zero
  {
    const profile::Scope s(Op::Norms);
    spin(milliseconds(5));
  }
  profile::set_enabled(true);
  const profile::Totals fresh = profile::totals();
  profile::set_enabled(false);
  CHECK(ticks(fresh, Op::Norms) == 0);
  CHECK(ticks(fresh, Op::FFN) == 0);
  CHECK(ticks(fresh, Op::Softmax) == 0);
}
