// The comparator: metrics on worked examples, non-finite handling, and gates that pass and fail.
#include <fmt/format.h>

#include <catch2/catch.hpp>
#include <cmath>
#include <cstring>
#include <limits>
#include <map>
#include <set>

#include "tparity/compare/baseline.hpp"
#include "tparity/compare/legs.hpp"
#include "tparity/compare/report.hpp"
#include "tparity/harness/problem.hpp"
#include "tparity/harness/rng.hpp"

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

// One component "x" of 100 elements in four implementations with chosen errors relative to torch64 =
// ones, spread over every element (alternating signs; element 7 twice the others): rel_l2 = err
// (errors below 1e-12, float64's, all on element 7).
CaseReport judge(double hand64_err, double hand32_err, double torch32_err, bool nan_in_hand32 = false) {
  auto make = [](double err) {
    Tensor<double> t({100}, 1.0);
    if (err < 1e-12) {  // float64-sized: spread, it would be lost in the rounding of 1 + err
      t.data[7] += err * 10;
      return Components{{"x", t}};
    }
    const double a = 10 * err / std::sqrt(103.0);  // 99 a^2 + (2a)^2 = (10 err)^2 = (err ||1||)^2
    for (size_t i = 0; i < 100; ++i) t.data[i] += (i == 7 ? 2 * a : a) * (i % 2 ? -1 : 1);
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

TEST_CASE("legs: a case's legs, propagated then local, and the views of them", "[compare]") {
  auto names = [](const std::vector<LegSpec>& legs) {
    std::vector<std::string> n;
    for (const LegSpec& l : legs) n.push_back(l.name);
    return n;
  };
  const std::vector<std::string> standard = {"hand64_vs_torch64", "hand32_vs_torch64", "torch32_vs_torch64",
                                             "hand32_vs_torch32"},
                                 local = {"local_hand64_vs_torch64", "local_hand32_vs_torch64"};
  CHECK(names(standard_legs()) == standard);
  CHECK(names(local_legs()) == local);
  std::vector<std::string> all = standard;
  all.insert(all.end(), local.begin(), local.end());
  CHECK(names(legs_with_local()) == all);  // the report's column order and the sweep's CSV's
  for (const LegSpec& l : standard_legs()) CHECK_FALSE(l.diagnostic);
  for (const LegSpec& l : local_legs()) {
    CAPTURE(l.name);
    CHECK(l.diagnostic);  // a breach names the first divergence, it fails nothing
    CHECK(l.a.rfind("local_hand", 0) == 0);
    CHECK(l.b == "torch64");
  }
  CHECK(local_legs().at(0).role == LegRole::Semantic);
  CHECK(local_legs().at(1).role == LegRole::Numeric);
  CHECK(local_legs().at(1).noise == "torch32_vs_torch64");
}

TEST_CASE("gates: float64 semantic bound / float32 judged by torch32's own error", "[compare]") {
  const GatePolicy p;
  CHECK(p.numeric_floor == Approx(4 * 5.960464477539063e-08));
  // One sample of 100 equal-sized errors: n_eff 100 (the single sample's scatter, x 3, capped at the
  // count); the bound 2 x q x 2e-7 + 2.4e-7 with q = sqrt(F_{1-1e-6}(100, 100)).
  const double q = noise_quantile(100, 1), bound = 2 * q * 2e-7 + 4 * 0x1p-24;
  REQUIRE(q > 1.5);
  REQUIRE(q < 1.7);
  CHECK(judge(1e-15, 0.99 * bound, 2e-7).pass);
  CHECK_FALSE(judge(1e-15, 1.01 * bound, 2e-7).pass);
  CHECK(judge(1e-15, 2e-7, 0).pass);  // the floor alone: 2e-7 <= 2.4e-7
  CHECK_FALSE(judge(1e-15, 3e-7, 0).pass);
  CHECK_FALSE(judge(1e-9, 1e-7, 1e-7).pass);         // semantics broken, numerics fine
  CHECK_FALSE(judge(1e-15, 1e-7, 1e-7, true).pass);  // a NaN the reference does not have

  const CaseReport r = judge(1e-15, 1e-6, 2e-7);
  REQUIRE(r.failures.size() == 1);
  // A failure names the case, component, leg, figure and bound, and what the bound was built from;
  // the component and leg are also fields of their own.
  CHECK(r.failures[0].component == "x");
  CHECK(r.failures[0].leg == "hand32_vs_torch64");
  CHECK_THAT(r.failures[0].text,
             Catch::StartsWith("case demo: component x: leg hand32_vs_torch64: rel_l2 1e-06 > bound " +
                               fmt::format("{:.3g}", bound)));
  CHECK_THAT(r.failures[0].text,
             Catch::Contains("torch32_vs_torch64 noise 2e-07 (1 sample, n_eff 100) + floor 2.38e-07"));
}

TEST_CASE("gates: a low precision is judged by LibTorch's own error in it, with the floor u", "[compare]") {
  // "x" of 100 elements, errors spread as in judge(): torchf16 with rel_l2 t, handf16 with h, float16's
  // u = 2^-11. n_eff 100, one sample: the bound is 2 q t + u, q = sqrt(F_{1-1e-6}(100, 100)).
  const double u = 0x1p-11, q = noise_quantile(100, 1);
  auto lowp = [&](double h, double t) {
    auto make = [](double err) {
      Tensor<double> x({100}, 1.0);
      const double a = 10 * err / std::sqrt(103.0);
      for (size_t i = 0; i < 100; ++i) x.data[i] += (i == 7 ? 2 * a : a) * (i % 2 ? -1 : 1);
      return Components{{"x", x}};
    };
    const Components hand = make(h), torch = make(t), exact = make(0);
    CaseReport r;
    r.name = "demo";
    const std::vector<LegSpec> legs = low_precision_legs("f16", u);
    REQUIRE(legs.size() == 3);
    CHECK(legs[0].name == "handf16_vs_torch64");
    CHECK(legs[0].noise == "torchf16_vs_torch64");
    compare_components(r, {"x"}, {{"handf16", &hand}, {"torch64", &exact}, {"torchf16", &torch}}, legs, GatePolicy{},
                       {"handf16", "torch64", "torchf16"});
    return r;
  };
  const double t = 4e-4, bound = 2 * q * t + u;
  CHECK(lowp(0.99 * bound, t).pass);
  const CaseReport r = lowp(1.01 * bound, t);
  CHECK_FALSE(r.pass);
  REQUIRE(r.failures.size() == 1);
  CHECK(r.failures[0].leg == "handf16_vs_torch64");
  CHECK_THAT(r.failures[0].text, Catch::StartsWith("case demo: component x: leg handf16_vs_torch64: rel_l2 "));
  CHECK_THAT(r.failures[0].text,
             Catch::Contains("torchf16_vs_torch64 noise 0.0004 (1 sample, n_eff 100) + floor 0.000488"));
  // LibTorch exact: the floor alone, one rounding of float16, not float32's 4u.
  CHECK(lowp(0.99 * u, 0).pass);
  CHECK_FALSE(lowp(1.01 * u, 0).pass);
}

TEST_CASE("gates: a component missing from an implementation fails the case", "[compare]") {
  Components full{{"x", Tensor<double>({1}, {1.0})}}, empty;
  CaseReport r;
  r.name = "demo";
  compare_components(r, {"x"}, {{"hand64", &empty}, {"hand32", &full}, {"torch64", &full}, {"torch32", &full}},
                     standard_legs(), GatePolicy{}, {"hand64", "hand32", "torch64", "torch32"});
  CHECK_FALSE(r.pass);
  CHECK_THAT(r.failures.at(0).text, Catch::Contains("missing from hand64"));
  CHECK(r.failures.at(0).component == "x");
  CHECK(r.failures.at(0).leg.empty());  // no one leg fails: the component is not there to compare
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
                                         "notes", "not_checked", "first_divergence", "reference", "stored_reference",
                                         "summary", "diagnoses"});
  CHECK(c.at("summary") == summary_line(r));
  CHECK(c.at("diagnoses") == nlohmann::json::array());
  CHECK(keys(c.at("components").at(0)) == std::set<std::string>{"name", "shape", "pass", "growth", "legs"});
  CHECK(keys(legs) ==
        std::set<std::string>{"hand64_vs_torch64", "hand32_vs_torch64", "torch32_vs_torch64", "hand32_vs_torch32"});
  const std::set<std::string> common{"l2",         "rel_l2",      "max_abs",     "max_abs_index",      "ref_l2",
                                     "count",      "nan_matched", "inf_matched", "nonfinite_mismatch", "role",
                                     "diagnostic", "pass"};
  std::set<std::string> gated = common;
  gated.insert("bound");
  CHECK(keys(legs.at("hand64_vs_torch64")) == gated);
  std::set<std::string> numeric = gated, noise = common;
  numeric.insert("noise");
  noise.insert("noise");
  CHECK(keys(legs.at("hand32_vs_torch64")) == numeric);
  CHECK(keys(legs.at("torch32_vs_torch64")) == noise);
  CHECK(keys(legs.at("torch32_vs_torch64").at("noise")) ==
        std::set<std::string>{"samples", "rms", "n_eff", "quantile"});
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
  for (const Failure& f : r.failures) CHECK(f.text.find("local_") == std::string::npos);
  CHECK_THAT(render_table(r), Catch::Contains("first divergence: component b"));
  CHECK(to_json(r).at("first_divergence").at("component") == "b");
}

TEST_CASE("failure lines: the size against the bound and against LibTorch's own float32 error", "[compare]") {
  // hand64 off by 2e-4 on x, LibTorch's float32 error 2e-7: 2e-4 / 1e-10 = 2e6 times the bound, 2e-4 / 2e-7
  // = 1000 times LibTorch's own error; hand32 off by 1e-6, its bound worked out as in the gates' test.
  const CaseReport r = judge(2e-4, 1e-6, 2e-7);
  REQUIRE(r.failures.size() == 2);
  CHECK_THAT(r.failures[0].text,
             Catch::StartsWith("case demo: component x: leg hand64_vs_torch64: rel_l2 0.0002 > bound 1e-10 (2e+06x "
                               "the bound; 1000x LibTorch's own float32 error 2e-07); semantic bound; max_abs"));
  const double bound = 2 * noise_quantile(100, 1) * 2e-7 + 4 * 0x1p-24;
  CHECK_THAT(r.failures[1].text,
             Catch::Contains(fmt::format("rel_l2 1e-06 > bound {:.3g} ({:.1f}x the bound; 5.0x LibTorch's own float32 "
                                         "error 2e-07); bound = 2 x ",
                                         bound, 1e-6 / bound)));
  // The one-line summary: the first failing component and leg, and the worst against LibTorch's error.
  CHECK(summary_line(r) ==
        "FAIL  demo  first divergence x (hand64: 2.0e-04 > 1e-10); worst: x 1000x LibTorch's own "
        "float32 error");
  CHECK(summary_line(judge(1e-15, 3e-7, 2e-7)) == "PASS  demo  worst: x 1.5x LibTorch's own float32 error");
  // What the case ran without is said under it when there is something to say; the JSON always has
  // the list (empty: everything the case has was checked).
  CaseReport without = judge(1e-15, 3e-7, 2e-7);
  CHECK(to_json(without).at("not_checked") == nlohmann::json::array());
  CHECK(render_summary(without).find("not checked") == std::string::npos);
  without.not_checked = {"padding", "decode"};
  CHECK(render_summary(without) == summary_line(without) + "\n  not checked: padding, decode\n");
  CHECK(to_json(without).at("not_checked") == nlohmann::json{"padding", "decode"});
  // The default view is that line and the findings; the table is --full's.
  const std::string brief = render_summary(r);
  CHECK(brief.rfind(summary_line(r) + "\n  FAIL case demo: component x: leg hand64_vs_torch64", 0) == 0);
  CHECK(brief.find("verdict  non-finite") == std::string::npos);
  CHECK(render_table(r).find("verdict  non-finite") != std::string::npos);
}

namespace {

// Components a -> b of 100 elements each, torch64 = 1 + a spread pattern, in every implementation named
// in `errs` with its relative errors on (a, b); a missing name is not run.
CaseReport slipped(const std::map<std::string, std::pair<double, double>>& errs) {
  auto make = [](std::pair<double, double> e) {
    Components cs;
    for (auto [name, err] : {std::pair<const char*, double>{"a", e.first}, {"b", e.second}}) {
      Tensor<double> t({100}, 1.0);
      const double amp = 10 * err / std::sqrt(103.0);
      for (size_t i = 0; i < 100; ++i) t.data[i] += (i == 7 ? 2 * amp : amp) * (i % 2 ? -1 : 1);
      cs.push_back({name, t});
    }
    return cs;
  };
  std::map<std::string, Components> made;
  Implementations impls;
  for (const auto& [name, e] : errs) made[name] = make(e);
  made["torch64"] = make({0, 0});
  for (const auto& [name, c] : made) impls[name] = &c;
  CaseReport r;
  r.name = "demo";
  compare_components(r, {"a", "b"}, impls, standard_legs(), GatePolicy{}, {"torch64", "torch32"});
  return r;
}

}  // namespace

TEST_CASE("diagnosis: a precision slip is named at its first component / --accept precision-slip", "[compare]") {
  // float64 off by 3e-8 on a and 5e-8 on b (a float32 rounding's size), float32 as good as LibTorch's 2e-7.
  CaseReport r = slipped({{"hand64", {3e-8, 5e-8}}, {"hand32", {2e-7, 2e-7}}, {"torch32", {2e-7, 2e-7}}});
  CHECK_FALSE(r.pass);
  REQUIRE(r.diagnoses.size() == 1);
  CHECK(r.diagnoses[0].kind == "precision-slip");
  CHECK(r.diagnoses[0].component == "a");  // the first in dataflow order, not b
  CHECK(r.diagnoses[0].leg == "hand64_vs_torch64");
  CHECK_THAT(r.diagnoses[0].text,
             Catch::StartsWith("precision slip: float64 differs at 3e-08, the size of a float32 value inside the "
                               "float64 computation: a constant, a table or a cast (0.15x LibTorch's own float32 "
                               "error 2e-07 on a; every float32 leg passes)"));
  CHECK_THAT(render_summary(r), Catch::Contains("  diagnosis: a: hand64_vs_torch64: precision slip: "));
  CHECK_THAT(r.diagnoses[0].text, Catch::Contains("It fails the case"));
  CHECK(to_json(r).at("diagnoses").at(0).at("kind") == "precision-slip");
  // Accepted: the failures become notes, the case passes, the summary says so.
  CHECK(accept_precision_slip(r));
  CHECK(r.pass);
  CHECK(r.failures.empty());
  REQUIRE(r.notes.size() == 2);
  CHECK_THAT(r.notes[0], Catch::StartsWith("accepted as a precision slip (--accept precision-slip): case demo: "
                                           "component a: leg hand64_vs_torch64: rel_l2 3e-08"));
  CHECK_THAT(summary_line(r), Catch::StartsWith("PASS  demo  precision slip accepted at a; worst: "));
  CHECK_THAT(r.diagnoses.at(0).text, Catch::EndsWith("Accepted (--accept precision-slip): every float32 leg passes"));

  // Not a slip, not accepted: a semantic failure far above float32's level ...
  r = slipped({{"hand64", {1e-3, 1e-3}}, {"hand32", {2e-7, 2e-7}}, {"torch32", {2e-7, 2e-7}}});
  CHECK(r.diagnoses.empty());
  CHECK_FALSE(accept_precision_slip(r));
  CHECK_FALSE(r.pass);
  // ... a float64 slip downstream of a larger one (b at 1e-5: not every failure is float32-sized) ...
  r = slipped({{"hand64", {3e-8, 1e-5}}, {"hand32", {2e-7, 2e-7}}, {"torch32", {2e-7, 2e-7}}});
  CHECK(r.diagnoses.size() == 1);
  CHECK_FALSE(accept_precision_slip(r));
  CHECK_FALSE(r.pass);
  // ... a slip-sized float64 error while a float32 leg fails (something bigger is wrong) ...
  r = slipped({{"hand64", {3e-8, 3e-8}}, {"hand32", {2e-7, 1e-5}}, {"torch32", {2e-7, 2e-7}}});
  CHECK(r.diagnoses.empty());
  CHECK_FALSE(accept_precision_slip(r));
  CHECK_FALSE(r.pass);
  // ... and a float64 run alone: named by its size, but with no float32 leg there is nothing to accept by.
  r = slipped({{"hand64", {3e-8, 3e-8}}, {"torch32", {2e-7, 2e-7}}});
  REQUIRE(r.diagnoses.size() == 1);
  CHECK_THAT(r.diagnoses[0].text, Catch::Contains("the float32 leg was not run"));
  CHECK_FALSE(accept_precision_slip(r));
  CHECK_FALSE(r.pass);
  // Below 1e-9 or above 4x LibTorch's float32 error (and 4u) it is not float32's rounding level.
  CHECK(slipped({{"hand64", {5e-10, 0}}, {"hand32", {2e-7, 2e-7}}, {"torch32", {2e-7, 2e-7}}}).diagnoses.empty());
  CHECK(slipped({{"hand64", {9e-7, 0}}, {"hand32", {2e-7, 2e-7}}, {"torch32", {2e-7, 2e-7}}}).diagnoses.empty());
  CHECK(slipped({{"hand64", {7e-7, 0}}, {"hand32", {2e-7, 2e-7}}, {"torch32", {2e-7, 2e-7}}}).diagnoses.size() == 1);
}

TEST_CASE("diagnosis: NaN rows where the reference's weights are uniform / other non-finite patterns", "[compare]") {
  // Attention weights (2 queries x 4 keys): query 1 has every key masked, the reference gives 1/4 each,
  // the implementation NaN.
  const Tensor<double> ref({1, 2, 4}, {0.1, 0.2, 0.3, 0.4, 0.25, 0.25, 0.25, 0.25});
  const Tensor<double> nan_row({1, 2, 4}, {0.1, 0.2, 0.3, 0.4, kNaN, kNaN, kNaN, kNaN});
  NonfinitePattern p = nonfinite_pattern(nan_row, ref);
  CHECK(p.kind == "nonfinite-rows");
  CHECK(p.rows == 1);
  CHECK(p.uniform_rows == 1);
  CHECK(p.first_row == std::vector<int64_t>{0, 1});
  CHECK(p.text ==
        "1 row(s) of the last axis (length 4) are NaN in yours where the reference's are finite, first row [0,1]; all "
        "in the reference uniform (every value 1/4: rows where every key is masked): the reference gives uniform "
        "weights, yours NaN");
  // Not uniform in the reference: the rows are named, without the masked-row reading.
  const Tensor<double> ref2({1, 2, 4}, {0.1, 0.2, 0.3, 0.4, 0.1, 0.2, 0.3, 0.4});
  p = nonfinite_pattern(nan_row, ref2);
  CHECK(p.kind == "nonfinite-rows");
  CHECK(p.uniform_rows == 0);
  CHECK(p.text.find("uniform") == std::string::npos);
  // An infinity where the reference is finite, in a row otherwise finite: a plain precise description.
  const Tensor<double> inf1({1, 2, 4}, {0.1, kInf, 0.3, 0.4, 0.25, 0.25, 0.25, 0.25});
  p = nonfinite_pattern(inf1, ref);
  CHECK(p.kind == "nonfinite");
  CHECK(p.text == "1 infinite in yours where the reference is finite; first at [0,0,1]");
  CHECK(nonfinite_pattern(ref, ref).kind.empty());

  // Through the legs: the failure line carries the pattern, the case a diagnosis at the first
  // component, with the later components it spreads to.
  Components t64{{"w", ref}, {"out", ref}}, h64{{"w", nan_row}, {"out", nan_row}};
  CaseReport r;
  r.name = "demo";
  compare_components(r, {"w", "out"}, {{"hand64", &h64}, {"torch64", &t64}}, standard_legs(), GatePolicy{},
                     {"hand64", "torch64"});
  REQUIRE(r.failures.size() == 2);
  CHECK_THAT(r.failures[0].text, Catch::Contains("4 non-finite value(s) differ, first at [0,1,0]: 1 row(s) of the "
                                                 "last axis"));
  REQUIRE(r.diagnoses.size() == 1);
  CHECK(r.diagnoses[0].kind == "nonfinite-rows");
  CHECK(r.diagnoses[0].component == "w");
  CHECK_THAT(r.diagnoses[0].text, Catch::Contains("the reference gives uniform weights, yours NaN") &&
                                      Catch::Contains("differ in 1 later component(s) (out): spreading from w"));
  CHECK_THAT(summary_line(r), Catch::StartsWith("FAIL  demo  first divergence w (hand64: 4 non-finite differ)"));
}

TEST_CASE("baseline: recorded legs / rounding / and the drift ratchet with its floors", "[compare]") {
  const CaseReport r = judge(2e-16, 3e-7, 2e-7);
  const Baseline b = make_baseline({r}, {{"torch", "x"}});
  // Only the hand core's gated legs against the float64 reference are recorded.
  CHECK(b.entries ==
        std::map<std::string, double>{{"demo/x/hand32_vs_torch64", 3e-7}, {"demo/x/hand64_vs_torch64", 2e-16}});
  CHECK(find_drift({r}, b, 2.0).empty());

  // The ratchet allows factor x sqrt(F_{1-1e-6}(n_eff, n_eff)) x the baseline: two single samples of
  // an error of n_eff effective elements (here 100) scatter by that much without any change.
  const double q = noise_quantile(100, 1);
  Baseline tight = b;
  tight.entries["demo/x/hand32_vs_torch64"] = 5e-8;  // 3e-7 > 2 x 1.62 x 5e-8
  const std::vector<Drift> d = find_drift({r}, tight, 2.0);
  REQUIRE(d.size() == 1);
  CHECK(d[0].leg == "hand32_vs_torch64");
  CHECK(d[0].bound == Approx(2 * q * 5e-8));
  CHECK(find_drift({r}, tight, 4.0).empty());

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

TEST_CASE("noise model: the quantile table against closed forms of F", "[compare]") {
  // F(2, d2) has P(F > x) = (1 + 2x / d2)^(-d2 / 2): x = (d2 / 2)(alpha^(-2 / d2) - 1), by hand.
  const double a = noise_alpha();
  REQUIRE(a == 1e-6);
  for (int m : {1, 2, 3, 5, 9, 17}) {
    CAPTURE(m);
    const double d2 = 2.0 * m, x = d2 / 2 * (std::pow(a, -2 / d2) - 1);
    CHECK(noise_quantile(2, m) == Approx(std::sqrt(x)).epsilon(1e-5));
  }
  // As d grows the ratio of two chi-squares over their dof tends to 1, from above, and falls monotonically.
  CHECK(noise_quantile(1e7, 9) == Approx(1.0).epsilon(0.01));
  double last = 1e300;
  for (double d = 1; d < 1e6; d *= 1.37) {
    const double q = noise_quantile(d, 9);
    CHECK(q < last);
    CHECK(q > 1);
    last = q;
  }
  // More samples, a tighter quantile; fewer than any row (0 samples) take the widest row.
  CHECK(noise_quantile(4, 17) < noise_quantile(4, 9));
  CHECK(noise_quantile(4, 9) < noise_quantile(4, 8));
  CHECK(noise_quantile(4, 0) == noise_quantile(4, 1));
}

TEST_CASE("noise model: rms and n_eff of sampled errors", "[compare]") {
  Rng rng(3);
  const Tensor<double> ref({400}, 1.0);
  // Nine samples, each element's error N(0, (1e-7)^2): rms 1e-7, n_eff close to the 400 elements.
  std::vector<Tensor<double>> spread(9, ref);
  for (auto& t : spread)
    for (double& x : t.data) x += 1e-7 * rng.normal();
  std::vector<std::pair<const Tensor<double>*, const Tensor<double>*>> samples;
  for (const auto& t : spread) samples.push_back({&t, &ref});
  NoiseEstimate e = estimate_noise(samples);
  CHECK(e.samples == 9);
  CHECK(e.rms == Approx(1e-7).epsilon(0.05));
  CHECK(e.n_eff > 300);
  CHECK(e.n_eff <= 400);
  CHECK(e.quantile == Approx(noise_quantile(e.n_eff, 9)));
  // The whole error on one element: one effective element, (1 + 2/9) for the scatter of nine samples.
  std::vector<Tensor<double>> one(9, ref);
  for (auto& t : one) t.data[17] += 1e-6 * rng.normal();
  samples.clear();
  for (const auto& t : one) samples.push_back({&t, &ref});
  e = estimate_noise(samples);
  CHECK(e.n_eff == Approx(1 + 2.0 / 9));
  // Non-finite positions are left out; an exact reference gives no noise and n_eff = the count.
  Tensor<double> nan = ref;
  nan.data[0] = std::numeric_limits<double>::quiet_NaN();
  e = estimate_noise({{&ref, &ref}, {&nan, &ref}});
  CHECK(e.rms == 0);
  CHECK(e.n_eff == 399);
}

TEST_CASE("noise model: a jittered problem moves each float32 value as nextafter and two coins say", "[compare]") {
  // The rule spelled with branches, as jittered() was first written: each nonzero finite float32 value
  // of the float weights (state_dict in name order), then of the float inputs (in the module's input
  // order), moved to a neighbouring float32 if a coin says so, up or down as a second coin says; zeros,
  // non-finite values, other dtypes and the masks kept, and no draw taken for them.
  const float fmax = std::numeric_limits<float>::max(), tiny = std::numeric_limits<float>::denorm_min();
  const std::vector<double> edges = {0.0,   -0.0,  kInf,        -kInf,         kNaN,      double(fmax), -double(fmax),
                                     tiny,  -tiny, 1e-40,       -1e-40,        1.0,       -1.0,         0.1,
                                     -0.1,  1e300, 1.17549435e-38, -1.17549435e-38, 3.0e-45, 1e-50};
  Rng values(11);
  auto tensor = [&](DType dtype, int n) {
    DTensor t;
    t.dtype = dtype;
    for (int r = 0; r < 10; ++r) t.data.insert(t.data.end(), edges.begin(), edges.end());
    for (int i = 0; i < n; ++i)
      t.data.push_back(dtype == DType::Int64 ? double(i % 7) : values.normal() * (i % 2 ? 1e-3 : 10));
    t.shape = {int64_t(t.data.size())};
    return t;
  };
  Problem p;
  p.module = ModuleKind::MultiheadAttention;  // query, key and value float inputs, in that order; attn_mask a mask
  p.state_dict["a"] = tensor(DType::Float32, 2000);
  p.state_dict["b"] = tensor(DType::Int64, 50);
  p.state_dict["c"] = tensor(DType::Float64, 1000);
  p.inputs["value"] = tensor(DType::Float32, 300);
  p.inputs["query"] = tensor(DType::Float32, 300);
  p.inputs["key"] = tensor(DType::Float32, 300);  // by name before query: the module's order is drawn in
  p.inputs["attn_mask"] = tensor(DType::Float32, 300);
  const std::vector<std::pair<bool, std::string>> order = {
      {true, "a"}, {true, "b"}, {true, "c"}, {false, "query"}, {false, "key"}, {false, "value"}};  // in draw order
  for (uint64_t seed : {1ULL, 2ULL, 77ULL, 0x9e3779b97f4a7c15ULL}) {
    CAPTURE(seed);
    const Problem q = jittered(p, seed);
    Rng rng(seed);
    int64_t wrong = 0, moved = 0, movable = 0;
    auto same_bits = [](double a, double b) { return std::memcmp(&a, &b, sizeof a) == 0; };
    for (const auto& [weight, name] : order) {
      CAPTURE(name);
      const DTensor& from = weight ? p.state_dict.at(name) : p.inputs.at(name);
      const DTensor& got = weight ? q.state_dict.at(name) : q.inputs.at(name);
      REQUIRE(got.data.size() == from.data.size());
      const bool floating = from.dtype == DType::Float32 || from.dtype == DType::Float64;
      for (size_t i = 0; i < from.data.size(); ++i) {
        double want = from.data[i];
        const float f = float(want);
        if (floating && f != 0 && std::isfinite(f)) {
          ++movable;
          if (rng.coin()) want = double(std::nextafter(f, rng.coin() ? INFINITY : -INFINITY));
          moved += same_bits(got.data[i], from.data[i]) ? 0 : 1;
        }
        // the same bits (a NaN is kept as it came; the sign of a zero counts)
        if (!same_bits(want, got.data[i])) ++wrong;
      }
    }
    CHECK(wrong == 0);
    CHECK(std::abs(double(moved) / double(movable) - 0.5) < 0.05);  // about half of them moved
    const Storage<double>& mask = q.inputs.at("attn_mask").data;
    REQUIRE(mask.size() == p.inputs.at("attn_mask").data.size());
    CHECK(std::memcmp(mask.data(), p.inputs.at("attn_mask").data.data(), mask.size() * sizeof(double)) == 0);
  }
}

TEST_CASE("gates: the float32 bound is built from LibTorch's sampled noise, not from one lucky sample", "[compare]") {
  // One component of 400 elements. LibTorch's plain float32 run happens to be 100x better than its
  // usual (1e-9), its jittered runs show the usual 1e-7; the implementation has 3e-7.
  Rng rng(5);
  const Tensor<double> t64({400}, 1.0);
  auto noisy = [&](double scale) {
    Tensor<double> t = t64;
    for (double& x : t.data) x += scale * rng.normal();
    return Components{{"x", t}};
  };
  const Components ref{{"x", t64}}, h64 = noisy(1e-16), h32 = noisy(3e-7), lucky = noisy(1e-9);
  std::vector<Components> samples;
  for (int k = 0; k < 8; ++k) samples.push_back(noisy(1e-7));
  auto judge_with = [&](int n, const Components& hand32) {
    Implementations impls{{"hand64", &h64}, {"hand32", &hand32}, {"torch64", &ref}, {"torch32", &lucky}};
    std::vector<LegSpec> legs = standard_legs();
    for (int k = 1; k <= n; ++k) {
      impls[noise_sample_key("torch32", k)] = &samples[size_t(k - 1)];
      impls[noise_sample_key("torch64", k)] = &ref;
      legs[2].samples.push_back({noise_sample_key("torch32", k), noise_sample_key("torch64", k)});
    }
    CaseReport r;
    r.name = "demo";
    compare_components(r, {"x"}, impls, legs, GatePolicy{}, {});
    return r;
  };
  // Judged by the lucky sample alone, 3e-7 is an alarm (bound 2 x 1.35 x 1e-9 + 2.4e-7)...
  const CaseReport alone = judge_with(0, h32);
  CHECK_FALSE(alone.pass);
  REQUIRE(alone.failures.size() == 1);
  CHECK_THAT(alone.failures[0].text, Catch::Contains("(1 sample, n_eff"));
  // ... judged by nine samples (rms 0.94e-7 with the lucky one), it is within 2x of LibTorch's error.
  const CaseReport sampled = judge_with(8, h32);
  CHECK(sampled.pass);
  const Leg* noise = sampled.components.at(0).leg("torch32_vs_torch64");
  REQUIRE(noise);
  CHECK(noise->noise.samples == 9);
  CHECK(noise->noise.rms == Approx(std::sqrt(8.0 / 9) * 1e-7).epsilon(0.05));
  const Leg* h = sampled.components.at(0).leg("hand32_vs_torch64");
  CHECK(h->bound == Approx(2 * noise->noise.quantile * noise->noise.rms + 4 * 0x1p-24));
  // A defect ten times LibTorch's noise still fails, and the line says by what it was judged.
  const CaseReport bad = judge_with(8, noisy(1e-6));
  CHECK_FALSE(bad.pass);
  REQUIRE(bad.failures.size() == 1);
  CHECK_THAT(bad.failures[0].text, Catch::Contains("torch32_vs_torch64 noise"));
  CHECK_THAT(bad.failures[0].text, Catch::Contains("(9 samples, n_eff"));
}
