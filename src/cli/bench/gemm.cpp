// tparity bench --gemm: the hand core's GEMM alone, on the products each chosen case makes (an
// nn.Linear's x W^T: M rows of tokens, N outputs, K inputs) and on a plain 2048-cubed product, each as
// GFLOP/s and as a share of the FMA peak measured in the same run. Where a case misses its share of
// the peak, this says whether its products run below what the GEMM reaches on a large square one
// (the shape's fault: thin M, small K) or the rest of the layer does.
#include <fmt/format.h>

#include <nlohmann/json.hpp>
#include <random>

#include "bench.hpp"
#include "tparity/core/gemm.hpp"

namespace tparity::cli::bench {

namespace {

struct Product {
  std::string name;
  int64_t M, N, K;
};

// The products of one call of the case's layer, the fast path's own (q, k and v as one product).
std::vector<Product> products(const CaseSpec& s) {
  const int64_t tokens = (s.batch ? s.batch : 1) * s.seq;
  if (s.module == ModuleKind::LlamaDecoderLayer) {
    const int64_t T = s.decode_steps ? s.decode_steps : s.seq, C = s.dim, D = s.head_dim;
    if (T < 2) return {};  // a decode step: matrix-vector products (gemv), bound by memory
    return {{"q, k, v", T, (s.heads + 2 * s.kv_heads) * D, C},
            {"o_proj", T, C, s.heads * D},
            {"gate, up (each)", T, s.ffn, C},
            {"down", T, C, s.ffn}};
  }
  std::vector<Product> p{{"q, k, v", tokens, 3 * s.dim, s.dim}, {"out_proj", tokens, s.dim, s.dim}};
  if (s.module == ModuleKind::TransformerEncoderLayer)
    p.push_back({"linear1", tokens, s.ffn, s.dim}), p.push_back({"linear2", tokens, s.dim, s.ffn});
  return p;
}

struct GemmRow {
  std::string case_name, product;
  int64_t M, N, K;
  int threads;
  Stats ms;
  double gflops;
};

GemmRow time_product(const std::string& case_name, const Product& p, int threads, int reps) {
  std::mt19937 rng(42);
  std::uniform_real_distribution<float> u(-1, 1);
  std::vector<float> A(size_t(p.M * p.K)), B(size_t(p.N * p.K)), C(size_t(p.M * p.N));
  for (float& x : A) x = u(rng);
  for (float& x : B) x = u(rng);
  auto call = [&] {
    gemm<float>(false, true, p.M, p.N, p.K, 1.0f, A.data(), p.K, B.data(), p.K, 0.0f, C.data(), p.N, nullptr, threads);
  };
  for (int w = 0; w < 2; ++w) call();
  std::vector<double> t;
  for (int r = 0; r < reps; ++r) t.push_back(time_ms(call));
  const Stats s = stats(t);
  return {case_name, p.name, p.M, p.N, p.K, threads, s, 2.0 * double(p.M) * double(p.N) * double(p.K) / (s.median * 1e6)};
}

}  // namespace

int bench_gemm(const Options& o, const std::vector<BenchCase>& cases) {
  Limits limits;  // the peak before the products and after each
  if (o.quick) limits.runs_per_round = 1;
  limits.measure(false);
  std::vector<GemmRow> rows;
  auto time_one = [&](const std::string& name, const Product& p, int threads) {
    rows.push_back(time_product(name, p, threads, o.reps));
    limits.measure(false);
  };
  const int64_t square = o.quick ? 256 : 2048;
  time_one("(square)", {"A B^T", square, square, square}, 1);
  for (const BenchCase& c : cases)
    for (const Product& p : products(c.spec)) time_one(c.name, p, c.threads);
  const double square_gflops = rows.front().gflops, peak = limits.peak;
  if (o.format == Format::Json) {
    nlohmann::json out = nlohmann::json::array();
    for (const GemmRow& r : rows)
      out.push_back({{"case", r.case_name},
                     {"product", r.product},
                     {"m", r.M},
                     {"n", r.N},
                     {"k", r.K},
                     {"threads", r.threads},
                     {"ms", r.ms.median},
                     {"ms_min", r.ms.min},
                     {"ms_max", r.ms.max},
                     {"gflops", r.gflops},
                     {"peak_fraction", peak > 0 ? r.gflops / (peak * r.threads) : 0.0},
                     {"of_square", r.gflops / r.threads / square_gflops}});
    fmt::print("{}\n", nlohmann::json{{"isa", to_string(gemm_isa())},
                                      {"peak_gflops", peak},
                                      {"peak_isa", limits.isa},
                                      {"peak_runs", limits.peak_runs},
                                      {"reps", o.reps},
                                      {"heap", heap_pages()},
                                      {"products", out}}
                           .dump(2, ' ', false, kBadUtf8Replaced));
    return kPass;
  }
  fmt::print(
      "tparity bench --gemm: the hand core's GEMM alone (x W^T, float32, {} path) | fp32 FMA peak {:.0f} GFLOP/s per "
      "core ({}, best of {} runs: {} before the products and {} after each) | medians of {} runs after 2 "
      "warm-ups\n{}\n\n",
      to_string(gemm_isa()), peak, limits.isa, limits.peak_runs, limits.runs_per_round, limits.runs_per_round, o.reps,
      heap_pages());
  fmt::print("{:<20} {:<16} {:>18} {:>3} {:>24} {:>8} {:>8} {:>9}\n", "case", "product", "M x N x K", "thr",
             "ms (min-max)", "GFLOP/s", "of peak", "of square");
  for (const GemmRow& r : rows)
    fmt::print("{:<20} {:<16} {:>18} {:>3} {:>24} {:>8.1f} {:>7.0f}% {:>8.2f}x\n", r.case_name, r.product,
               fmt::format("{}x{}x{}", r.M, r.N, r.K), r.threads,
               fmt::format("{:.2f} ({:.2f}-{:.2f})", r.ms.median, r.ms.min, r.ms.max), r.gflops,
               peak > 0 ? 100 * r.gflops / (peak * r.threads) : 0.0, r.gflops / r.threads / square_gflops);
  fmt::print(
      "\nof peak: GFLOP/s over the FMA peak of the product's threads' cores; of square: per thread, over the "
      "{}-cubed product's\n",
      square);
  return kPass;
}

}  // namespace tparity::cli::bench
