// Seed 004's models and the op cases against hand-worked answers, formulas evaluated in long double,
// explicit loops, and long-double twins (tests/twin.hpp) built without the core's code.
#include <catch2/catch.hpp>
#include <cmath>
#include <limits>
#include <map>
#include <vector>

#include "support.hpp"
#include "tparity/compare/metrics.hpp"
#include "tparity/core/models.hpp"
#include "tparity/harness/cases.hpp"
#include "tparity/harness/hand.hpp"
#include "tparity/harness/rng.hpp"
#include "twin.hpp"

using namespace tparity;
using test::divisor_of;
using test::randn;
using LD = long double;

namespace {

// Pixel (b, c, y, x) holds b * 1000 + c * 100 + y * 10 + x: every value says where it came from.
Tensor<double> coded_image(int64_t B, int64_t C, int64_t H, int64_t W) {
  Tensor<double> img({B, C, H, W});
  for (int64_t b = 0; b < B; ++b)
    for (int64_t c = 0; c < C; ++c)
      for (int64_t y = 0; y < H; ++y)
        for (int64_t x = 0; x < W; ++x)
          img.data[size_t(((b * C + c) * H + y) * W + x)] = b * 1000 + c * 100 + y * 10 + x;
  return img;
}

void close(const Tensor<double>& got, const Tensor<double>& want, double tol) {
  const Metrics m = measure(got, want);
  CAPTURE(m.shape_mismatch, m.rel_l2, m.max_abs, m.nonfinite_mismatch);
  CHECK(m.clean());
  CHECK(m.rel_l2 <= tol);
}

}  // namespace

TEST_CASE("models: the patcher / patches row-major over the grid and features channel then row then column",
          "[models]") {
  // Seed 004's unfold code on (2, 2, 4, 6) with p = 2: a 2 x 3 grid of patches of 2 * 2 * 2 = 8.
  const Tensor<double> img = coded_image(2, 2, 4, 6);
  const Tensor<double> out = patcher_forward(img, 2);
  REQUIRE(out.shape == Shape{2, 6, 8});
  // Worked by hand: batch 0, patch 4 is grid row 1, column 1 (pixels y 2..3, x 2..3); channel 0's
  // four pixels row by row, then channel 1's.
  const std::vector<double> patch4(out.data.begin() + 4 * 8, out.data.begin() + 5 * 8);
  CHECK(patch4 == std::vector<double>{22, 23, 32, 33, 122, 123, 132, 133});
  // Batch 1, patch 2 is grid row 0, column 2 (y 0..1, x 4..5).
  const std::vector<double> b1p2(out.data.begin() + (6 + 2) * 8, out.data.begin() + (6 + 3) * 8);
  CHECK(b1p2 == std::vector<double>{1004, 1005, 1014, 1015, 1104, 1105, 1114, 1115});
  // Every entry, from the rule in the seed's comment: patch index r * (W/p) + c, feature [ch][i][j].
  for (int64_t b = 0; b < 2; ++b)
    for (int64_t r = 0; r < 2; ++r)
      for (int64_t c = 0; c < 3; ++c)
        for (int64_t ch = 0; ch < 2; ++ch)
          for (int64_t i = 0; i < 2; ++i)
            for (int64_t j = 0; j < 2; ++j)
              CHECK(out.data[size_t((b * 6 + r * 3 + c) * 8 + ch * 4 + i * 2 + j)] ==
                    b * 1000 + ch * 100 + (2 * r + i) * 10 + (2 * c + j));
  // p = 1: every pixel its own patch, features the channels; p = the image: one patch, the image.
  const Tensor<double> ones = patcher_forward(coded_image(1, 3, 2, 2), 1);
  REQUIRE(ones.shape == Shape{1, 4, 3});
  CHECK(std::vector<double>(ones.data.begin() + 3 * 3, ones.data.end()) == std::vector<double>{11, 111, 211});
  const Tensor<double> whole = patcher_forward(coded_image(1, 2, 2, 2), 2);
  CHECK(whole.shape == Shape{1, 1, 8});
  CHECK(whole.data == std::vector<double>{0, 1, 10, 11, 100, 101, 110, 111});
  CHECK_THROWS_AS(patcher_forward(coded_image(1, 1, 4, 6), 4), ShapeError);
}

TEST_CASE("models: the positional encoding table / the formula in long double and the seed's printed values",
          "[models]") {
  const int64_t T = 60, d = 32;
  std::vector<double> P(size_t(T * d));
  std::vector<float> Pf(size_t(T * d));
  positional_encoding_table(P.data(), T, d);
  positional_encoding_table(Pf.data(), T, d);
  for (int64_t i = 0; i < T; ++i)
    for (int64_t j = 0; j < d / 2; ++j) {
      const LD angle = LD(i) / std::pow(10000.0L, LD(2 * j) / LD(d));
      CAPTURE(i, j);
      // double: a few roundings of the angle (relative 2^-53 each) and of sin/cos
      const double tol = 4 * 0x1p-53 * double(1 + angle);
      CHECK(std::fabs(P[size_t(i * d + 2 * j)] - double(std::sin(angle))) <= tol);
      CHECK(std::fabs(P[size_t(i * d + 2 * j + 1)] - double(std::cos(angle))) <= tol);
      // float: the same in 2^-24
      const double ftol = 4 * 0x1p-24 * double(1 + angle);
      CHECK(std::fabs(Pf[size_t(i * d + 2 * j)] - double(std::sin(angle))) <= ftol);
      CHECK(std::fabs(Pf[size_t(i * d + 2 * j + 1)] - double(std::cos(angle))) <= ftol);
    }
  // Position 0: sin 0 = 0 and cos 0 = 1 exactly.
  for (int64_t j = 0; j < d / 2; ++j) CHECK((P[size_t(2 * j)] == 0.0 && P[size_t(2 * j + 1)] == 1.0));
  // The seed printed XPE (zeros + P, encoding_dim 32) to five digits; rows 1, 2 and 59, first three
  // and last three columns.
  struct Printed {
    int64_t row, col;
    double value;
  };
  for (const Printed& x : std::vector<Printed>{{1, 0, 8.4147e-01},
                                               {1, 1, 5.4030e-01},
                                               {1, 2, 5.3317e-01},
                                               {1, 29, 1.0000e+00},
                                               {1, 30, 1.7783e-04},
                                               {1, 31, 1.0000e+00},
                                               {2, 0, 9.0930e-01},
                                               {2, 1, -4.1615e-01},
                                               {2, 2, 9.0213e-01},
                                               {2, 30, 3.5566e-04},
                                               {59, 0, 6.3674e-01},
                                               {59, 1, -7.7108e-01},
                                               {59, 2, 9.8174e-01},
                                               {59, 29, 9.9983e-01},
                                               {59, 30, 1.0492e-02},
                                               {59, 31, 9.9994e-01}}) {
    CAPTURE(x.row, x.col);
    CHECK(P[size_t(x.row * d + x.col)] == Approx(x.value).margin(5e-5 * std::max(1.0, std::fabs(x.value) * 10)));
  }
  // The forward adds the table to every batch element.
  Rng rng(4);
  const Tensor<double> x = randn(rng, {3, 5, 8});
  std::vector<double> out(x.data.size()), table(5 * 8);
  positional_encoding_forward(out.data(), x.ptr(), 3, 5, 8);
  positional_encoding_table(table.data(), 5, 8);
  for (size_t i = 0; i < out.size(); ++i) CHECK(out[i] == x.data[i] + table[i % 40]);
}

TEST_CASE("models: batch norm in eval mode / a worked example on running statistics", "[models]") {
  // mean (1, 0), var (3, 8), eps 1: sqrt(var + eps) = (2, 3); weight (2, -1), bias (0.5, 1).
  // y[n][0] = (x - 1) / 2 * 2 + 0.5; y[n][1] = x / 3 * -1 + 1.
  const std::vector<double> x{1, 2, 3, 4}, mean{1, 0}, var{3, 8}, w{2, -1}, b{0.5, 1};
  std::vector<double> y(4);
  batchnorm_eval_forward(y.data(), x.data(), mean.data(), var.data(), w.data(), b.data(), 1.0, 2, 2);
  CHECK(y[0] == Approx(0.5).epsilon(1e-15));
  CHECK(y[1] == Approx(1.0 / 3).epsilon(1e-15));
  CHECK(y[2] == Approx(2.5).epsilon(1e-15));
  CHECK(y[3] == Approx(-1.0 / 3).epsilon(1e-15));
  // No affine: weight 1, bias 0; in float too.
  const std::vector<float> xf{1, 2, 3, 4}, meanf{1, 0}, varf{3, 8};
  std::vector<float> yf(4);
  batchnorm_eval_forward(yf.data(), xf.data(), meanf.data(), varf.data(), static_cast<const float*>(nullptr),
                         static_cast<const float*>(nullptr), 1.0f, 2, 2);
  CHECK(yf[0] == 0.0f);
  CHECK(yf[1] == Approx(2.0 / 3).epsilon(1e-6));
  CHECK(yf[2] == Approx(1.0).epsilon(1e-6));
  CHECK(yf[3] == Approx(4.0 / 3).epsilon(1e-6));
}

TEST_CASE("models: the head activations at points with known values", "[models]") {
  const double ln2 = std::log(2.0), ln3 = std::log(3.0);
  auto at = [](Activation a, double x) {
    double y = 0;
    activation_forward(a, &y, &x, 1);
    return y;
  };
  auto atf = [](Activation a, float x) {
    float y = 0;
    activation_forward(a, &y, &x, 1);
    return y;
  };
  CHECK(at(Activation::Relu, -1.5) == 0.0);
  CHECK(at(Activation::Relu, 2.0) == 2.0);
  // tanh(ln 2) = (2 - 1/2) / (2 + 1/2) = 3/5
  CHECK(at(Activation::Tanh, ln2) == Approx(0.6).epsilon(1e-15));
  CHECK(at(Activation::Tanh, 0.0) == 0.0);
  // sigmoid(ln 3) = 1 / (1 + 1/3) = 3/4; sigmoid(0) = 1/2
  CHECK(at(Activation::Sigmoid, ln3) == Approx(0.75).epsilon(1e-15));
  CHECK(at(Activation::Sigmoid, 0.0) == 0.5);
  CHECK(at(Activation::Sigmoid, -ln3) == Approx(0.25).epsilon(1e-15));
  // silu(x) = x sigmoid(x)
  CHECK(at(Activation::Silu, ln3) == Approx(0.75 * ln3).epsilon(1e-15));
  CHECK(at(Activation::Silu, -ln3) == Approx(-0.25 * ln3).epsilon(1e-15));
  // softplus(x) = log(1 + e^x): log 2 at 0, log 4 at ln 3; x itself above the threshold 20 (strictly)
  CHECK(at(Activation::Softplus, 0.0) == Approx(ln2).epsilon(1e-15));
  CHECK(at(Activation::Softplus, ln3) == Approx(std::log(4.0)).epsilon(1e-15));
  CHECK(at(Activation::Softplus, 25.0) == 25.0);
  CHECK(at(Activation::Softplus, 20.5) == 20.5);
  CHECK(at(Activation::Softplus, 20.0) == Approx(20.0 + std::exp(-20.0)).epsilon(1e-15));  // log(1 + e^20)
  CHECK(at(Activation::Softplus, -30.0) == Approx(std::exp(-30.0)).epsilon(1e-12));        // no underflow to 0
  // leaky relu, slope 0.01
  CHECK(at(Activation::LeakyRelu, -2.0) == Approx(-0.02).epsilon(1e-15));
  CHECK(at(Activation::LeakyRelu, 3.0) == 3.0);
  // gelu(1) = Phi(1) (tables)
  CHECK(at(Activation::Gelu, 1.0) == Approx(0.841344746068542948585).epsilon(1e-15));
  // float: within a few float roundings
  CHECK(atf(Activation::Tanh, float(ln2)) == Approx(0.6).epsilon(4e-7));
  CHECK(atf(Activation::Sigmoid, float(ln3)) == Approx(0.75).epsilon(4e-7));
  CHECK(atf(Activation::Silu, float(ln3)) == Approx(0.75 * ln3).epsilon(4e-7));
  CHECK(atf(Activation::Softplus, float(ln3)) == Approx(std::log(4.0)).epsilon(4e-7));
  CHECK(atf(Activation::LeakyRelu, -2.0f) == Approx(-0.02).epsilon(4e-7));
}

TEST_CASE("models: broadcast matmul / worked answers for 1-D and batched operands", "[models]") {
  const Tensor<double> A({2, 2}, {1, 2, 3, 4});
  // (2, 2) @ (2, 2, 1): A times each column e0, e1 -> its columns (1, 3) and (2, 4).
  const Tensor<double> cols({2, 2, 1}, {1, 0, 0, 1});
  Tensor<double> out = matmul(A, cols);
  CHECK(out.shape == Shape{2, 2, 1});
  CHECK(out.data == std::vector<double>{1, 3, 2, 4});
  // (2) @ (2, 2): a row times A, the row dim dropped: (1*1 + 2*3, 1*2 + 2*4) = (7, 10)
  out = matmul(Tensor<double>({2}, {1, 2}), A);
  CHECK(out.shape == Shape{2});
  CHECK(out.data == std::vector<double>{7, 10});
  // (2, 2) @ (2): A times a column, the column dim dropped: (3, 7)
  out = matmul(A, Tensor<double>({2}, {1, 1}));
  CHECK(out.shape == Shape{2});
  CHECK(out.data == std::vector<double>{3, 7});
  // (3) @ (3): the dot product, a scalar: 4 + 10 + 18
  out = matmul(Tensor<double>({3}, {1, 2, 3}), Tensor<double>({3}, {4, 5, 6}));
  CHECK(out.shape == Shape{});
  CHECK(out.data == std::vector<double>{32});
  // (2, 1, 1, 2) @ (3, 2, 1): batch (2, 1) with (3) broadcasts to (2, 3)
  const Tensor<double> rows({2, 1, 1, 2}, {1, 1, 1, -1});
  const Tensor<double> vs({3, 2, 1}, {1, 2, 3, 4, 5, 7});
  out = matmul(rows, vs);
  CHECK(out.shape == Shape{2, 3, 1, 1});
  CHECK(out.data == std::vector<double>{3, 7, 12, -1, -1, -2});
  // Shapes that do not combine
  CHECK_THROWS_WITH(matmul(A, Tensor<double>({3, 2})),
                    Catch::Contains("input's last dim 2 differs from other's rows 3"));
  CHECK_THROWS_WITH(matmul(Tensor<double>({2, 2, 2}), Tensor<double>({3, 2, 2})), Catch::Contains("do not broadcast"));
  CHECK_THROWS_AS(matmul(Tensor<double>(Shape{}), A), ShapeError);
}

TEST_CASE("models: broadcast matmul / explicit loops in long double over a seeded grid of shapes", "[models]") {
  for (uint64_t seed = 1; seed <= 200; ++seed) {
    Rng rng(seed);
    const int64_t M = rng.integer(1, 5), K = rng.integer(1, 20), N = rng.integer(1, 5), R = rng.integer(0, 3);
    Shape batch(static_cast<size_t>(R));
    for (int64_t& d : batch) d = rng.integer(1, 3);
    // Each operand takes a suffix of the batch, with some dims collapsed to 1; or is 1-D.
    auto operand_batch = [&] {
      Shape s(batch.begin() + rng.integer(0, R), batch.end());
      for (int64_t& d : s)
        if (rng.coin(0.3)) d = 1;
      return s;
    };
    const bool a_vec = rng.coin(0.15), b_vec = rng.coin(0.15);
    Shape as = a_vec ? Shape{K} : operand_batch(), bs = b_vec ? Shape{K} : operand_batch();
    if (!a_vec) as.insert(as.end(), {M, K});
    if (!b_vec) bs.insert(bs.end(), {K, N});
    const Tensor<double> a = randn(rng, as), b = randn(rng, bs);
    CAPTURE(seed, to_string(as), to_string(bs));
    const Tensor<double> got = matmul(a, b);
    // The expected shape, by the broadcasting rule: the longer batch, each dim the non-1 of the pair.
    const Shape ab = a_vec ? Shape{} : Shape(as.begin(), as.end() - 2),
                bb = b_vec ? Shape{} : Shape(bs.begin(), bs.end() - 2);
    const size_t Rb = std::max(ab.size(), bb.size());
    Shape ob(Rb, 1);
    for (size_t i = 0; i < Rb; ++i) {
      const int64_t da = i + ab.size() >= Rb ? ab[i + ab.size() - Rb] : 1,
                    db = i + bb.size() >= Rb ? bb[i + bb.size() - Rb] : 1;
      ob[i] = std::max(da, db);
    }
    Shape want_shape = ob;
    if (!a_vec) want_shape.push_back(M);
    if (!b_vec) want_shape.push_back(N);
    REQUIRE(got.shape == want_shape);
    // Each output element, by explicit loops: the batch multi-index mapped into each operand (index
    // 0 along a size-1 dim), a long double sum over K.
    const int64_t Mo = a_vec ? 1 : M, No = b_vec ? 1 : N, G = numel(ob);
    for (int64_t g = 0; g < G; ++g) {
      Shape idx(Rb);
      for (int64_t r = int64_t(Rb) - 1, rest = g; r >= 0; --r)
        idx[size_t(r)] = rest % ob[size_t(r)], rest /= ob[size_t(r)];
      auto offset = [&](const Shape& ob_, int64_t mat) {
        int64_t off = 0;
        for (size_t i = 0; i < ob_.size(); ++i) off = off * ob_[i] + (ob_[i] == 1 ? 0 : idx[i + Rb - ob_.size()]);
        return off * mat;
      };
      const int64_t ao = offset(ab, Mo * K), bo = offset(bb, K * No);
      for (int64_t m = 0; m < Mo; ++m)
        for (int64_t n = 0; n < No; ++n) {
          LD acc = 0, mag = 0;
          for (int64_t k = 0; k < K; ++k) {
            const LD t = LD(a.data[size_t(ao + m * K + k)]) * LD(b.data[size_t(bo + k * No + n)]);
            acc += t, mag += std::fabs(t);
          }
          // any summation order: |error| <= K u sum |a_k b_k|, u = 2^-53
          CHECK(std::fabs(LD(got.data[size_t((g * Mo + m) * No + n)]) - acc) <= LD(K) * 0x1p-53L * mag);
        }
    }
  }
}

TEST_CASE("models: layer norm's statistics and softmax over the last dim", "[models]") {
  // x = (1, 2, 3, 4): mean 2.5, biased variance 1.25; the rows of a (2, 4) input are independent.
  const Tensor<double> x({2, 4}, {1, 2, 3, 4, 10, 10, 10, 14});
  struct Keep final : Observer<double> {
    std::map<std::string, Tensor<double>> seen;
    void on(const std::string& n, Tensor<double>& v) override { seen[n] = v; }
  } obs;
  const double eps = 1e-5;
  layer_norm_lastdim(x, Tensor<double>(), Tensor<double>(), eps, &obs);
  REQUIRE(obs.seen.at("mean").shape == Shape{2});
  CHECK(obs.seen.at("mean").data == std::vector<double>{2.5, 11});
  // row 2: deviations (-1, -1, -1, 3), variance 12 / 4 = 3
  CHECK(obs.seen.at("rstd").data[0] == Approx(1 / std::sqrt(1.25 + eps)).epsilon(1e-15));
  CHECK(obs.seen.at("rstd").data[1] == Approx(1 / std::sqrt(3 + eps)).epsilon(1e-15));
  CHECK(obs.seen.at("output").data[7] == Approx(3 / std::sqrt(3 + eps)).epsilon(1e-15));
  CHECK_THROWS_AS(layer_norm_lastdim(x, Tensor<double>({4}, 1.0), Tensor<double>(), eps), ShapeError);
  // softmax of (0, log 2, log 3, log 4) over a 1-D input: (1, 2, 3, 4) / 10
  const Tensor<double> s = softmax_lastdim(Tensor<double>({4}, {0, std::log(2.0), std::log(3.0), std::log(4.0)}));
  for (int i = 0; i < 4; ++i) CHECK(s.data[size_t(i)] == Approx((i + 1) / 10.0).epsilon(1e-15));
}

namespace {

// Encoder layer weights at the scales torch's init gives.
EncoderWeights<double> random_layer(Rng& rng, const EncoderConfig& c) {
  const int64_t d = c.d_model, F = c.dim_feedforward;
  const double s = 1 / std::sqrt(double(d));
  EncoderWeights<double> w;
  w.self_attn.in_proj_weight = randn(rng, {3 * d, d}, s);
  w.self_attn.in_proj_bias = randn(rng, {3 * d}, 0.1);
  w.self_attn.out_proj_weight = randn(rng, {d, d}, s);
  w.self_attn.out_proj_bias = randn(rng, {d}, 0.1);
  w.linear1_weight = randn(rng, {F, d}, s);
  w.linear1_bias = randn(rng, {F}, 0.1);
  w.linear2_weight = randn(rng, {d, F}, 1 / std::sqrt(double(F)));
  w.linear2_bias = randn(rng, {d}, 0.1);
  for (Tensor<double>* g : {&w.norm1_weight, &w.norm2_weight}) {
    *g = randn(rng, {d}, 0.1);
    for (double& v : g->data) v += 1;
  }
  w.norm1_bias = randn(rng, {d}, 0.1);
  w.norm2_bias = randn(rng, {d}, 0.1);
  return w;
}

EncoderConfig layer_config(Rng& rng, int64_t d) {
  EncoderConfig c;
  c.d_model = d;
  c.nhead = divisor_of(rng, d);
  c.dim_feedforward = rng.integer(1, 12);
  c.activation = rng.coin() ? Activation::Gelu : Activation::Relu;
  c.batch_first = true;
  return c;
}

// P[i, 2j] = sin(i / 10000^(2j/d)), P[i, 2j+1] = cos(same), in long double.
LD pe(int64_t i, int64_t col, int64_t d) {
  const LD angle = LD(i) / std::pow(10000.0L, LD(col - col % 2) / LD(d));
  return col % 2 ? std::cos(angle) : std::sin(angle);
}

LD act_twin(Activation a, LD x) {
  switch (a) {
    case Activation::Relu:
      return std::max(x, LD(0));
    case Activation::Gelu:
      return x * 0.5L * std::erfc(-x / std::sqrt(2.0L));
    case Activation::Tanh:
      return std::tanh(x);
    case Activation::Sigmoid:
      return 1 / (1 + std::exp(-x));
    case Activation::Silu:
      return x / (1 + std::exp(-x));
    case Activation::Softplus:
      return x > 20 ? x : std::log1p(std::exp(x));
    case Activation::LeakyRelu:
      return x > 0 ? x : 0.01L * x;
  }
  return x;
}

}  // namespace

TEST_CASE("models: the token encoder against a long-double twin", "[models][twin]") {
  for (uint64_t seed = 1; seed <= 40; ++seed) {
    Rng rng(seed);
    TokenEncoderConfig c;
    c.vocab = rng.integer(1, 30);
    c.layer = layer_config(rng, std::vector<int64_t>{2, 4, 8, 12}[size_t(rng.integer(0, 3))]);
    c.num_layers = rng.integer(1, 3);
    const int64_t d = c.layer.d_model, B = rng.integer(1, 3), T = rng.integer(1, 7);
    TokenEncoderWeights<double> w{randn(rng, {c.vocab, d}), {}};
    for (int64_t i = 0; i < c.num_layers; ++i) w.layers.push_back(random_layer(rng, c.layer));
    Tensor<int64_t> tokens({B, T});
    for (int64_t& id : tokens.data) id = rng.integer(0, c.vocab - 1);
    CAPTURE(seed, c.vocab, d, c.layer.nhead, c.num_layers, B, T);
    // embedding row, plus the table, then the twin's layers
    Tensor<double> x({B, T, d});
    for (int64_t n = 0; n < B * T; ++n)
      for (int64_t k = 0; k < d; ++k)
        x.data[size_t(n * d + k)] =
            double(LD(w.embedding_weight.data[size_t(tokens.data[size_t(n)] * d + k)]) + pe(n % T, k, d));
    for (const EncoderWeights<double>& lw : w.layers) x = twin::encoder(c.layer, lw, x, {}, {});
    close(token_encoder_forward(c, w, tokens), x, 1e-13);
  }
}

TEST_CASE("models: the ViT against a long-double twin / every head activation", "[models][twin]") {
  const Activation acts[] = {Activation::Relu,     Activation::Tanh,      Activation::Sigmoid, Activation::Silu,
                             Activation::Softplus, Activation::LeakyRelu, Activation::Gelu};
  for (uint64_t seed = 1; seed <= 42; ++seed) {
    Rng rng(seed);
    VitConfig c;
    do {
      c.channels = rng.integer(1, 3), c.patch = rng.integer(1, 3);
    } while (c.d_model() % 2);
    c.image_height = c.patch * rng.integer(1, 3), c.image_width = c.patch * rng.integer(1, 3);
    c.layer = layer_config(rng, c.d_model());
    c.num_layers = rng.integer(1, 2);
    c.head.resize(size_t(rng.integer(1, 3)));
    for (int64_t& x : c.head) x = rng.integer(1, 6);
    c.head_activation = acts[seed % 7];
    const int64_t d = c.d_model(), n = c.num_patches(), B = rng.integer(1, 3);
    VitWeights<double> w;
    for (int64_t i = 0; i < c.num_layers; ++i) w.layers.push_back(random_layer(rng, c.layer));
    int64_t in = n * d;
    for (size_t i = 0; i + 1 < c.head.size(); ++i) {
      const int64_t wd = c.head[i];
      VitHeadBlock<double> hb{randn(rng, {wd, in}, 1 / std::sqrt(double(in))),
                              randn(rng, {wd}, 0.1),
                              randn(rng, {wd}, 0.2),
                              randn(rng, {wd}, 0.2),
                              randn(rng, {wd}, 0.1),
                              randn(rng, {wd}, 0.2)};
      for (double& v : hb.bn_weight.data) v += 1;
      for (double& v : hb.bn_running_var.data) v = 1 + std::fabs(v);
      w.head.push_back(hb);
      in = wd;
    }
    w.out_weight = randn(rng, {c.head.back(), in}, 1 / std::sqrt(double(in)));
    w.out_bias = randn(rng, {c.head.back()}, 0.1);
    Tensor<double> image({B, c.channels, c.image_height, c.image_width});
    for (double& v : image.data) v = rng.uniform();
    CAPTURE(seed, c.channels, c.patch, c.image_height, c.image_width, c.layer.nhead, c.num_layers, c.head.size(),
            int(c.head_activation), B);

    // Patches by the rule, written out again: patch r * (W/p) + q, feature [ch][i][j].
    const int64_t H = c.image_height, W = c.image_width, p = c.patch, cols = W / p;
    Tensor<double> x({B, n, d});
    for (int64_t b = 0; b < B; ++b)
      for (int64_t t = 0; t < n; ++t)
        for (int64_t f = 0; f < d; ++f) {
          const int64_t ch = f / (p * p), i = f / p % p, j = f % p, y = t / cols * p + i, xx = t % cols * p + j;
          x.data[size_t((b * n + t) * d + f)] =
              double(LD(image.data[size_t(((b * c.channels + ch) * H + y) * W + xx)]) + pe(t, f, d));
        }
    for (const EncoderWeights<double>& lw : w.layers) x = twin::encoder(c.layer, lw, x, {}, {});
    std::vector<LD> h = twin::widen(x);  // (B, n * d)
    int64_t width = n * d;
    for (size_t i = 0; i + 1 < c.head.size(); ++i) {
      const VitHeadBlock<double>& hb = w.head[i];
      const int64_t wd = c.head[i];
      std::vector<LD> y = twin::linear(h, hb.linear_weight, &hb.linear_bias, B, width, wd);
      for (int64_t b = 0; b < B; ++b)
        for (int64_t k = 0; k < wd; ++k) {
          LD& v = y[size_t(b * wd + k)];
          v = (v - LD(hb.bn_running_mean.data[size_t(k)])) / std::sqrt(LD(hb.bn_running_var.data[size_t(k)]) + 1e-5L) *
                  LD(hb.bn_weight.data[size_t(k)]) +
              LD(hb.bn_bias.data[size_t(k)]);
          v = act_twin(c.head_activation, v);
        }
      h = y, width = wd;
    }
    const std::vector<LD> logits = twin::linear(h, w.out_weight, &w.out_bias, B, width, c.head.back());
    Tensor<double> want({B, c.head.back()});
    for (size_t i = 0; i < logits.size(); ++i) want.data[i] = double(logits[i]);
    close(vit_forward(c, w, image), want, 1e-12);
  }
}

TEST_CASE("models: token ids out of range or not ids are refused / never a crash", "[models]") {
  CaseSpec s = test::default_case("embed");
  s.batch = 2, s.seq = 5, s.dim = 8, s.heads = 2, s.ffn = 4, s.layers = 1, s.vocab = 10;
  Problem p = make_problem(s);
  // The core: an id equal to vocab, and a negative one.
  TokenEncoderConfig c = p.token;
  Rng rng(1);
  TokenEncoderWeights<double> w{to_tensor<double>(p.state_dict.at("embedding.weight")), {random_layer(rng, c.layer)}};
  Tensor<int64_t> tokens({2, 5}, int64_t(3));
  tokens.data[7] = 10;
  CHECK_THROWS_WITH(token_encoder_forward(c, w, tokens),
                    Catch::Contains("tokens: id 10 at [1, 2] is out of range for an embedding of 10 rows"));
  tokens.data[7] = -1;
  CHECK_THROWS_AS(token_encoder_forward(c, w, tokens), ShapeError);
  // The harness: validation names the input and the index; the hand runner says where.
  Problem bad = p;
  bad.inputs["tokens"].data[7] = 10;
  CHECK_THROWS_WITH(validate(bad, "case embed"),
                    "case embed: inputs.tokens[1, 2]: token id 10 is out of range for num_embeddings 10 (expected "
                    "0 <= id < 10)");
  CHECK_THROWS_WITH(run_hand(bad, DType::Float32, false, "case embed"),
                    Catch::StartsWith("case embed: inputs.tokens: id 10 at [1, 2] is out of range"));
  bad.inputs["tokens"].data[7] = 2.5;
  CHECK_THROWS_WITH(validate(bad, "case embed"),
                    "case embed: inputs.tokens[1, 2]: expected an integer token id, got 2.5");
  CHECK_THROWS_WITH(run_hand(bad, DType::Float64, false, "case embed"),
                    Catch::StartsWith("case embed: inputs.tokens: expected integer token ids"));
  // Ids are not floats, and floats are not ids.
  bad = p;
  bad.inputs["tokens"].dtype = DType::Float32;
  CHECK_THROWS_WITH(validate(bad, "case embed"),
                    "case embed: inputs.tokens: expected an int64 tensor of token ids, got float32");
  CaseSpec v = test::default_case("vit");
  Problem img = make_problem(v);
  img.inputs["image"].dtype = DType::Int64;
  CHECK_THROWS_WITH(validate(img, "case vit"),
                    "case vit: inputs.image: expected a float32 or float64 tensor, got int64");
  img = make_problem(v);
  img.state_dict["head.0.bn.running_var"].dtype = DType::Int64;
  CHECK_THROWS_WITH(validate(img, "case vit"),
                    "case vit: state_dict.head.0.bn.running_var: expected a float32 or float64 tensor, got int64");
}

TEST_CASE("models: the state dict names of the new run cases", "[models]") {
  CaseSpec v = test::default_case("vit");
  v.head = {5, 4, 3};
  v.layers = 1;
  const Problem p = make_problem(v);
  std::vector<std::string> names;
  for (const auto& [name, shape] : expected_state_dict(p))
    if (name.rfind("layers.", 0) != 0) names.push_back(name);
  CHECK(names == std::vector<std::string>{"head.0.linear.weight", "head.0.linear.bias", "head.0.bn.weight",
                                          "head.0.bn.bias", "head.0.bn.running_mean", "head.0.bn.running_var",
                                          "head.1.linear.weight", "head.1.linear.bias", "head.1.bn.weight",
                                          "head.1.bn.bias", "head.1.bn.running_mean", "head.1.bn.running_var",
                                          "head.out.weight", "head.out.bias"});
  // The first Linear takes the flattened encoder output: 16 patches x 192 features.
  CHECK(p.state_dict.at("head.0.linear.weight").shape == Shape{5, 16 * 192});
  CHECK(p.state_dict.at("head.out.weight").shape == Shape{3, 4});
  // Running statistics are drawn, not torch's 0 and 1: var within U(0.5, 1.5), mean not all zero.
  const DTensor& var = p.state_dict.at("head.0.bn.running_var");
  const DTensor& mean = p.state_dict.at("head.0.bn.running_mean");
  for (double x : var.data) CHECK((x >= 0.5 && x <= 1.5));
  double mean_l2 = 0;
  for (double x : mean.data) mean_l2 += x * x;
  CHECK(mean_l2 > 0);
}
