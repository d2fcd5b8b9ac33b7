// The comparator: metrics on worked examples, non-finite handling, and gates that pass and fail.
#include <catch2/catch.hpp>
#include <cmath>
#include <limits>
#include <set>

#include "tparity/compare/baseline.hpp"
#include "tparity/compare/legs.hpp"
#include "tparity/compare/report.hpp"

using namespace tparity;

namespace {
constexpr double kInf = std::numeric_limits<double>::infinity();
constexpr double kNaN = std::numeric_limits<double>::quiet_NaN();
}  // namespace

TEST_CASE("metrics: l2 / rel_l2 and max_abs with its multi-index", "[compare]") {
  // a - b = (0, 3, 0, -4): l2 = 5; ||b|| = sqrt(1 + 4 + 4 + 16) = 5; max_abs 4 at flat 3 = [1, 1].
  const Tensor<double> a({2, 2}, {1, 5, 2, 0}), b({2, 2}, {1, 2, 2, 4});
  const Metrics m = measure(a, b);
  CHECK(m.l2 == 5.0);
  CHECK(m.rel_l2 == 1.0);
  CHECK(m.max_abs == 4.0);
  CHECK(m.max_abs_index == std::vector<int64_t>{1, 1});
  CHECK(m.count == 4);
  CHECK(m.clean());
  CHECK(measure(b, b).rel_l2 == 0.0);
  CHECK(measure(Tensor<double>({1}, {1}), Tensor<double>({1}, {0})).rel_l2 == kInf);
  CHECK_FALSE(measure(Tensor<double>({4}), b).comparable());
}

TEST_CASE("metrics: NaN with NaN and the same infinity agree and are counted / anything else disagrees", "[compare]") {
  const Tensor<double> a({5}, {kNaN, -kInf, 1.0, kInf, kNaN}), b({5}, {kNaN, -kInf, 1.5, -kInf, 2.0});
  const Metrics m = measure(a, b);
  CHECK(m.nan_matched == 1);
  CHECK(m.inf_matched == 1);
  CHECK(m.nonfinite_mismatch == 2);
  CHECK(m.first_mismatch_index == std::vector<int64_t>{3});
  CHECK(m.l2 == 0.5);  // only position 2 is finite in both
  CHECK_FALSE(m.clean());
}

namespace {

// One component "x" in four implementations with chosen errors relative to torch64 = ones.
CaseReport judge(double hand64_err, double hand32_err, double torch32_err, bool nan_in_hand32 = false) {
  auto make = [](double err) {
    Tensor<double> t({100}, 1.0);
    t.data[7] += err * 10;  // ||t - 1|| = 10 err, ||1|| = 10: rel_l2 = err
    return Components{{"x", t}};
  };
  Components h64 = make(hand64_err), h32 = make(hand32_err), t64 = make(0), t32 = make(torch32_err);
  if (nan_in_hand32) h32[0].value.data[3] = kNaN;
  CaseReport r;
  r.name = "demo";
  compare_components(r, {"x"}, {{"hand64", &h64}, {"hand32", &h32}, {"torch64", &t64}, {"torch32", &t32}},
                     standard_legs(), GatePolicy{}, {"hand64", "hand32", "torch64", "torch32"});
  return r;
}

}  // namespace

TEST_CASE("gates: float64 semantic bound / float32 judged by torch32's own error", "[compare]") {
  const GatePolicy p;
  CHECK(p.numeric_floor == Approx(4 * 5.960464477539063e-08));
  CHECK(judge(1e-15, 3e-7, 2e-7).pass);        // 3e-7 <= 2 * 2e-7 + 2.4e-7
  CHECK_FALSE(judge(1e-15, 7e-7, 2e-7).pass);  // 7e-7 >  6.4e-7
  CHECK(judge(1e-15, 2e-7, 0).pass);           // the floor alone: 2e-7 <= 2.4e-7
  CHECK_FALSE(judge(1e-15, 3e-7, 0).pass);
  CHECK_FALSE(judge(1e-9, 1e-7, 1e-7).pass);         // semantics broken, numerics fine
  CHECK_FALSE(judge(1e-15, 1e-7, 1e-7, true).pass);  // a NaN the reference does not have

  const CaseReport r = judge(1e-15, 7e-7, 2e-7);
  REQUIRE(r.failures.size() == 1);
  // A failure names the case, component, leg, figure and bound.
  CHECK_THAT(r.failures[0],
             Catch::StartsWith("case demo: component x: leg hand32_vs_torch64: rel_l2 7e-07 > bound 6.38e-07"));
  CHECK_THAT(r.failures[0], Catch::Contains("2 x torch32_vs_torch64 2e-07"));
}

TEST_CASE("gates: a component missing from an implementation fails the case", "[compare]") {
  Components full{{"x", Tensor<double>({1}, {1.0})}}, empty;
  CaseReport r;
  r.name = "demo";
  compare_components(r, {"x"}, {{"hand64", &empty}, {"hand32", &full}, {"torch64", &full}, {"torch32", &full}},
                     standard_legs(), GatePolicy{}, {"hand64", "hand32", "torch64", "torch32"});
  CHECK_FALSE(r.pass);
  CHECK_THAT(r.failures.at(0), Catch::Contains("missing from hand64"));
}

TEST_CASE("report: the JSON document has the documented shape", "[compare]") {
  const CaseReport r = judge(1e-15, 3e-7, 2e-7);
  const nlohmann::json j = to_json(std::vector<CaseReport>{r});
  const nlohmann::json& c = j.at("cases").at(0);
  CHECK(c.at("name") == "demo");
  CHECK(c.at("pass") == true);
  const nlohmann::json& legs = c.at("components").at(0).at("legs");
  auto keys = [](const nlohmann::json& o) {
    std::set<std::string> k;
    for (auto it = o.begin(); it != o.end(); ++it) k.insert(it.key());
    return k;
  };
  // The keys the README documents, no fewer and no others.
  CHECK(keys(c) == std::set<std::string>{"name", "description", "config", "seed", "pass", "components", "failures",
                                         "notes", "first_divergence", "reference", "stored_reference"});
  CHECK(keys(c.at("components").at(0)) == std::set<std::string>{"name", "shape", "pass", "growth", "legs"});
  CHECK(keys(legs) ==
        std::set<std::string>{"hand64_vs_torch64", "hand32_vs_torch64", "torch32_vs_torch64", "hand32_vs_torch32"});
  const std::set<std::string> common{"l2",         "rel_l2",      "max_abs",     "max_abs_index",      "ref_l2",
                                     "count",      "nan_matched", "inf_matched", "nonfinite_mismatch", "role",
                                     "diagnostic", "pass"};
  std::set<std::string> gated = common;
  gated.insert("bound");
  CHECK(keys(legs.at("hand64_vs_torch64")) == gated);
  std::set<std::string> numeric = gated;
  numeric.insert("inherited");
  CHECK(keys(legs.at("hand32_vs_torch64")) == numeric);
  CHECK(keys(legs.at("torch32_vs_torch64")) == common);
  CHECK(keys(legs.at("hand32_vs_torch32")) == common);
  CHECK(legs.at("hand32_vs_torch64").at("max_abs_index") == std::vector<int64_t>{7});
  CHECK(legs.at("hand32_vs_torch64").at("rel_l2").get<double>() == Approx(3e-7));
  CHECK(render_table(r).find("PASS") != std::string::npos);
}

TEST_CASE("diagnosis: growth between components and the first component whose local error breaks", "[compare]") {
  // Three components a -> b -> c. hand32's propagated errors 1e-7, 4e-7, 4e-7 (b grows the error 4x);
  // local errors: b alone breaks its bound (semantically in float64), c is fine on b's reference.
  auto comp = [](std::vector<double> errs) {
    Components cs;
    const char* names[3] = {"a", "b", "c"};
    for (int i = 0; i < 3; ++i) {
      Tensor<double> t({100}, 1.0);
      t.data[5] += errs[size_t(i)] * 10;
      cs.push_back({names[i], t});
    }
    return cs;
  };
  const Components t64 = comp({0, 0, 0}), t32 = comp({1e-7, 1e-7, 1e-7}), h64 = comp({1e-16, 1e-6, 1e-6}),
                   h32 = comp({1e-7, 4e-7, 4e-7}), l64 = comp({1e-16, 1e-6, 1e-16}), l32 = comp({1e-7, 4e-7, 1e-7});
  CaseReport r;
  r.name = "demo";
  compare_components(r, {"a", "b", "c"},
                     {{"hand64", &h64},
                      {"hand32", &h32},
                      {"torch64", &t64},
                      {"torch32", &t32},
                      {"local_hand64", &l64},
                      {"local_hand32", &l32}},
                     legs_with_local(), GatePolicy{}, {"hand64", "hand32", "torch64", "torch32"});
  CHECK_FALSE(r.pass);
  CHECK(std::isnan(r.components[0].growth));
  CHECK(r.components[1].growth == Approx(4.0));
  CHECK(r.components[2].growth == Approx(1.0));
  CHECK(r.first_divergence == "b");
  CHECK_THAT(r.first_divergence_detail,
             Catch::StartsWith("component b: leg local_hand64_vs_torch64: rel_l2 1e-06 > bound 1e-10"));
  // Local legs diagnose; they do not add failures of their own.
  for (const std::string& f : r.failures) CHECK(f.find("local_") == std::string::npos);
  CHECK_THAT(render_table(r), Catch::Contains("first divergence: component b"));
  CHECK(to_json(r).at("first_divergence").at("component") == "b");
}

TEST_CASE("baseline: recorded legs / rounding / and the drift ratchet with its floors", "[compare]") {
  const CaseReport r = judge(2e-16, 3e-7, 2e-7);
  const Baseline b = make_baseline({r}, {{"torch", "x"}});
  // Only the hand core's gated legs against the float64 reference are recorded.
  CHECK(b.entries ==
        std::map<std::string, double>{{"demo/x/hand32_vs_torch64", 3e-7}, {"demo/x/hand64_vs_torch64", 2e-16}});
  CHECK(find_drift({r}, b, 2.0).empty());

  Baseline tight = b;
  tight.entries["demo/x/hand32_vs_torch64"] = 1e-7;  // 3e-7 > 2 x 1e-7
  const std::vector<Drift> d = find_drift({r}, tight, 2.0);
  REQUIRE(d.size() == 1);
  CHECK(d[0].leg == "hand32_vs_torch64");
  CHECK(d[0].bound == Approx(2e-7));
  CHECK(find_drift({r}, tight, 3.0).empty());

  // Floors: a float64 error moving within a few roundings, or a float32 one below a quarter rounding,
  // is not drift.
  Baseline tiny = b;
  tiny.entries["demo/x/hand64_vs_torch64"] = 1e-17;
  tiny.entries["demo/x/hand32_vs_torch64"] = 3e-7;
  CHECK(find_drift({r}, tiny, 2.0).empty());
  CHECK(drift_floor("hand64_vs_torch64") == 0x1.0p-50);
  CHECK(drift_floor("hand32_vs_torch64") == 0x1.0p-26);

  Baseline missing = b;
  missing.entries.erase("demo/x/hand64_vs_torch64");
  const std::vector<Drift> m = find_drift({r}, missing, 2.0);
  REQUIRE(m.size() == 1);
  CHECK(m[0].missing);

  // Values are kept to three digits, so a re-recorded baseline only changes where the figure did.
  const CaseReport r2 = judge(2e-16, 3.0004e-7, 2e-7);
  CHECK(make_baseline({r2}, {}).entries.at("demo/x/hand32_vs_torch64") == 3e-7);
}

TEST_CASE("gates: error inherited from upstream is judged by what torch32's own upstream error becomes", "[compare]") {
  // a -> b. Upstream (a): hand32 1.5e-7, torch32 1.5e-7. At b hand32 has 4.6e-7 of which its own
  // rounding (local) is 5e-8: the rest came through the op from a. torch32 got lucky at b (5e-8):
  // judged against torch32 alone, b would fail (4.6e-7 > 2 x 5e-8 + 2.4e-7).
  auto comp = [](double ea, double eb) {
    Components cs;
    for (auto [name, e] : {std::pair<const char*, double>{"a", ea}, {"b", eb}}) {
      Tensor<double> t({100}, 1.0);
      t.data[5] += e * 10;
      cs.push_back({name, t});
    }
    return cs;
  };
  auto run = [&](double local_b) {
    const Components t64 = comp(0, 0), t32 = comp(1.5e-7, 5e-8), h64 = comp(1e-16, 1e-16), h32 = comp(1.5e-7, 4.6e-7),
                     l64 = comp(1e-16, 1e-16), l32 = comp(1.5e-7, local_b);
    CaseReport r;
    r.name = "demo";
    compare_components(r, {"a", "b"},
                       {{"hand64", &h64},
                        {"hand32", &h32},
                        {"torch64", &t64},
                        {"torch32", &t32},
                        {"local_hand64", &l64},
                        {"local_hand32", &l32}},
                       legs_with_local(), GatePolicy{}, {});
    return r;
  };
  const CaseReport inherited = run(5e-8);
  CHECK(inherited.pass);
  const Leg* b = inherited.components.at(1).leg("hand32_vs_torch64");
  REQUIRE(b);
  CHECK(b->inherited == Approx(std::sqrt(4.6e-7 * 4.6e-7 - 5e-8 * 5e-8)));  // x 1.5e-7 / 1.5e-7
  // The same error made by the op itself (local 4.6e-7) is not inherited: it fails.
  const CaseReport own = run(4.6e-7);
  CHECK_FALSE(own.pass);
  CHECK(own.first_divergence == "b");
}
