// The user's test: their naive attention against PyTorch, through tparity's installed library.
#define CATCH_CONFIG_MAIN
#include <catch2/catch.hpp>
#include <tparity/api.hpp>

#include "naive_attention.hpp"

namespace {

// tparity hands a Problem (torch's names and layouts); this adapter feeds the naive code and hands
// back outputs and components (tparity's canonical layouts, which here are the naive code's own).
template <class T>
tparity::RunResult run_naive(const tparity::Problem& p, bool wrong_scale) {
  const tparity::MhaConfig& c = p.mha;
  if (p.module != tparity::ModuleKind::MultiheadAttention || !c.batch_first || !c.packed() || c.add_bias_kv ||
      c.add_zero_attn || p.input("key_padding_mask"))
    throw std::runtime_error("naive attention: unsupported configuration in " + p.name);
  tparity::Tensor<T> x = tparity::input<T>(p, "query");
  const bool batched = x.dim() == 3;
  const int64_t B = batched ? x.size(0) : 1, Tn = x.size(-2), E = c.embed_dim, H = c.num_heads, D = E / H;
  const tparity::Mask<T> m = tparity::mask<T>(p, "attn_mask");
  std::vector<T> mask = m.present() ? m.floats.data : std::vector<T>{};
  if (m.present() && m.is_bool())
    for (uint8_t b : m.bools.data) mask.push_back(b ? -std::numeric_limits<T>::infinity() : T(0));
  std::vector<T> avg;
  naive::Intermediates<T> keep;
  const std::vector<T> y = naive::self_attention<T>(
      x.data, B, Tn, E, H, tparity::param<T>(p, "in_proj_weight").data,
      c.bias ? tparity::param<T>(p, "in_proj_bias").data : std::vector<T>{},
      tparity::param<T>(p, "out_proj.weight").data,
      c.bias ? tparity::param<T>(p, "out_proj.bias").data : std::vector<T>{}, mask, avg, &keep, wrong_scale);

  tparity::Shape out_shape = batched ? tparity::Shape{B, Tn, E} : tparity::Shape{Tn, E};
  tparity::Shape w_shape = batched ? tparity::Shape{B, Tn, Tn} : tparity::Shape{Tn, Tn};
  tparity::RunResult r = tparity::outputs<T>(tparity::Tensor<T>(out_shape, y), tparity::Tensor<T>(w_shape, avg));
  auto put = [&](const char* name, tparity::Shape s, const std::vector<T>& v) {
    r.components.push_back({name, tparity::cast<double>(tparity::Tensor<T>(s, v))});
  };
  put("q", {B, H, Tn, D}, keep.q);
  put("k", {B, H, Tn, D}, keep.k);
  put("v", {B, H, Tn, D}, keep.v);
  put("scores", {B, H, Tn, Tn}, keep.scores);
  put("attn_weights", {B, H, Tn, Tn}, keep.weights);
  put("attn_weights_avg", {B, Tn, Tn}, avg);
  put("context", {B, Tn, E}, keep.context);
  put("output", {B, Tn, E}, y);
  return r;
}

tparity::Implementation naive_attention(bool wrong_scale = false) {
  return {wrong_scale ? "naive attention (scaled by sqrt(E))" : "naive attention",
          [wrong_scale](const tparity::Problem& p, tparity::DType dtype, const tparity::Components*) {
            return dtype == tparity::DType::Float32 ? run_naive<float>(p, wrong_scale)
                                                    : run_naive<double>(p, wrong_scale);
          }};
}

}  // namespace

TEST_CASE("naive attention matches PyTorch on the seeds' cases") {
  const auto reports = tparity::check_cases(naive_attention(), {"single", "batched", "multihead"});
  tparity::print_reports(reports);
  REQUIRE(reports.size() == 3);
  CHECK(reports[2].components.size() == 8);  // every component, not just the output
  CHECK(tparity::exit_code(reports) == 0);
}

TEST_CASE("naive attention matches the outputs PyTorch stored in the installed fixtures") {
  // The fixtures exported by Python PyTorch 2.13 (torch-1.13/ holds the same cases from 1.13).
  const std::string dir = std::string(TPARITY_FIXTURES) + "/torch-2.13";
  const auto reports = tparity::check_fixtures(
      naive_attention(), {dir + "/mha_single.json", dir + "/mha_batched.json", dir + "/mha_multihead.json"});
  tparity::print_reports(reports);
  CHECK(tparity::exit_code(reports) == 0);
}

TEST_CASE("the same attention scaled by sqrt(E) instead of sqrt(E/heads) is caught at the scores") {
  const auto reports = tparity::check_cases(naive_attention(true), {"multihead"});
  REQUIRE(reports.size() == 1);
  CHECK(tparity::exit_code(reports) == 1);
  REQUIRE_FALSE(reports[0].failures.empty());
  CHECK_THAT(reports[0].failures[0].text, Catch::StartsWith("case multihead: component scores: leg hand64_vs_torch64"));
}
