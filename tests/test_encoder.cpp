// The encoder layer against answers worked out through an independent route.
#include <algorithm>
#include <catch2/catch.hpp>
#include <cmath>
#include <limits>
#include <vector>

#include "support.hpp"
#include "tparity/core/encoder.hpp"
#include "tparity/core/gemm.hpp"
#include "tparity/core/parallel.hpp"
#include "tparity/harness/rng.hpp"

using namespace tparity;
using test::divisor_of;
using test::randn;
using test::random_bool;

namespace {

EncoderWeights<double> random_weights(const EncoderConfig& c, Rng& rng) {
  const int64_t d = c.d_model, F = c.dim_feedforward;
  EncoderWeights<double> w;
  w.self_attn.in_proj_weight = randn(rng, {3 * d, d}, 0.3);
  w.self_attn.in_proj_bias = randn(rng, {3 * d}, 0.1);
  w.self_attn.out_proj_weight = randn(rng, {d, d}, 0.3);
  w.self_attn.out_proj_bias = randn(rng, {d}, 0.1);
  w.linear1_weight = randn(rng, {F, d}, 0.3);
  w.linear1_bias = randn(rng, {F}, 0.1);
  w.linear2_weight = randn(rng, {d, F}, 0.3);
  w.linear2_bias = randn(rng, {d}, 0.1);
  w.norm1_weight = randn(rng, {d}, 0.1);
  w.norm2_weight = randn(rng, {d}, 0.1);
  for (double& x : w.norm1_weight.data) x += 1;
  for (double& x : w.norm2_weight.data) x += 1;
  w.norm1_bias = randn(rng, {d}, 0.1);
  w.norm2_bias = randn(rng, {d}, 0.1);
  return w;
}

EncoderConfig config(int64_t d, int64_t H, int64_t F, bool norm_first, Activation act) {
  EncoderConfig c;
  c.d_model = d;
  c.nhead = H;
  c.dim_feedforward = F;
  c.norm_first = norm_first;
  c.activation = act;
  c.batch_first = true;
  return c;
}

// x (A, B, d) as (B, A, d): batch-first to sequence-first and back.
Tensor<double> swap_first_two(const Tensor<double>& x) {
  const int64_t A = x.size(0), B = x.size(1), d = x.size(2);
  Tensor<double> y({B, A, d});
  for (int64_t a = 0; a < A; ++a)
    for (int64_t b = 0; b < B; ++b)
      for (int64_t e = 0; e < d; ++e) y.data[size_t((b * A + a) * d + e)] = x.data[size_t((a * B + b) * d + e)];
  return y;
}

// Positions where a and b differ, a NaN in both being no difference.
int64_t differing(const Tensor<double>& a, const Tensor<double>& b) {
  int64_t n = a.shape != b.shape;
  for (size_t i = 0; i < a.data.size() && i < b.data.size(); ++i)
    n += !(a.data[i] == b.data[i] || (std::isnan(a.data[i]) && std::isnan(b.data[i])));
  return n;
}

// Scalar twin of layer norm in long double.
std::vector<long double> ln_twin(const std::vector<long double>& x, const Tensor<double>& w, const Tensor<double>& b,
                                 double eps) {
  long double mean = 0, var = 0;
  for (long double v : x) mean += v;
  mean /= (long double)x.size();
  for (long double v : x) var += (v - mean) * (v - mean);
  var /= (long double)x.size();
  std::vector<long double> y(x.size());
  for (size_t i = 0; i < x.size(); ++i) y[i] = (x[i] - mean) / std::sqrt(var + eps) * w.data[i] + b.data[i];
  return y;
}

}  // namespace

TEST_CASE("encoder: a layer whose attention and first linear are zeroed / worked out independently", "[encoder]") {
  // With out_proj and in_proj zero the attention contributes exactly 0; with linear1.weight zero the
  // feed-forward gives the same vector c = linear2(act(linear1.bias)) for every token. Then
  //   post-norm: out = LN2(LN1(x) + c)        pre-norm: out = x + c
  Rng rng(71);
  for (Activation act : {Activation::Relu, Activation::Gelu}) {
    const int64_t d = 6, F = 10, B = 2, T = 3;
    EncoderConfig c = config(d, 2, F, false, act);
    c.layer_norm_eps = 1e-3;  // large enough to matter at this precision
    EncoderWeights<double> w = random_weights(c, rng);
    for (double& x : w.self_attn.in_proj_weight.data) x = 0;
    for (double& x : w.self_attn.in_proj_bias.data) x = 0;
    for (double& x : w.self_attn.out_proj_weight.data) x = 0;
    for (double& x : w.self_attn.out_proj_bias.data) x = 0;
    for (double& x : w.linear1_weight.data) x = 0;
    std::vector<long double> hidden(static_cast<size_t>(F)), cvec(static_cast<size_t>(d));
    for (int64_t f = 0; f < F; ++f) {
      const long double z = w.linear1_bias.data[size_t(f)];
      // gelu through erfc (Phi(z) = erfc(-z / sqrt 2) / 2), a different route from the core's erf.
      hidden[size_t(f)] = act == Activation::Relu ? std::max(z, 0.0L) : z * 0.5L * std::erfc(-z / std::sqrt(2.0L));
    }
    for (int64_t o = 0; o < d; ++o) {
      cvec[size_t(o)] = w.linear2_bias.data[size_t(o)];
      for (int64_t f = 0; f < F; ++f) cvec[size_t(o)] += w.linear2_weight.data[size_t(o * F + f)] * hidden[size_t(f)];
    }
    const Tensor<double> x = randn(rng, {B, T, d});

    const Tensor<double> post = encoder_layer_forward(c, w, EncoderInputs<double>{x, {}, {}});
    c.norm_first = true;
    const Tensor<double> pre = encoder_layer_forward(c, w, EncoderInputs<double>{x, {}, {}});
    for (int64_t r = 0; r < B * T; ++r) {
      std::vector<long double> xr(x.data.begin() + r * d, x.data.begin() + (r + 1) * d);
      std::vector<long double> n1 = ln_twin(xr, w.norm1_weight, w.norm1_bias, c.layer_norm_eps);
      for (int64_t i = 0; i < d; ++i) n1[size_t(i)] += cvec[size_t(i)];
      const std::vector<long double> want = ln_twin(n1, w.norm2_weight, w.norm2_bias, c.layer_norm_eps);
      for (int64_t i = 0; i < d; ++i) {
        CAPTURE(r, i);
        CHECK(post.data[size_t(r * d + i)] == Approx(double(want[size_t(i)])).margin(1e-14));
        CHECK(pre.data[size_t(r * d + i)] == Approx(double(xr[size_t(i)] + cvec[size_t(i)])).margin(1e-14));
      }
    }
  }
}

TEST_CASE("encoder: batched equals stacked singles / in both layouts and both norm placements", "[encoder]") {
  Rng rng(73);
  const int64_t B = 3, T = 5, d = 8;
  for (bool norm_first : {false, true}) {
    CAPTURE(norm_first);
    EncoderConfig c = config(d, 2, 16, norm_first, Activation::Gelu);
    const EncoderWeights<double> w = random_weights(c, rng);
    const Tensor<double> x = randn(rng, {B, T, d});
    Tensor<double> mask({T, T});
    for (double& v : mask.data) v = rng.normal();
    const Tensor<double> all = encoder_layer_forward(c, w, EncoderInputs<double>{x, Mask<double>::of_float(mask), {}});
    for (int64_t b = 0; b < B; ++b) {
      const Tensor<double> xb({T, d},
                              std::vector<double>(x.data.begin() + b * T * d, x.data.begin() + (b + 1) * T * d));
      const Tensor<double> one =
          encoder_layer_forward(c, w, EncoderInputs<double>{xb, Mask<double>::of_float(mask), {}});
      CHECK(one.data == std::vector<double>(all.data.begin() + b * T * d, all.data.begin() + (b + 1) * T * d));
    }
    // Sequence-first input is the same computation transposed.
    c.batch_first = false;
    const Tensor<double> sf =
        encoder_layer_forward(c, w, EncoderInputs<double>{swap_first_two(x), Mask<double>::of_float(mask), {}});
    CHECK(differing(sf, swap_first_two(all)) == 0);
  }
}

TEST_CASE("encoder: sequence-first equals batch-first where the attention cannot fuse its masks", "[encoder]") {
  // A float attn_mask with a +inf beside a key padding mask: torch 1.13's merge is not the masks' sum,
  // so the attention takes its general path, which makes its own batch-first copies and adds a
  // sequence-first residual once its output is back in that order (attention.cpp, project_out). The
  // bits must be the batch-first call's, NaN rows included.
  Rng rng(75);
  const int64_t B = 3, T = 6, d = 8;
  for (bool norm_first : {false, true}) {
    CAPTURE(norm_first);
    EncoderConfig c = config(d, 2, 16, norm_first, Activation::Relu);
    const EncoderWeights<double> w = random_weights(c, rng);
    const Tensor<double> x = randn(rng, {B, T, d});
    Tensor<double> mask({T, T});
    for (double& v : mask.data) v = rng.normal();
    mask.data[size_t(1 * T + 4)] = std::numeric_limits<double>::infinity();
    Tensor<uint8_t> kpm({B, T});
    kpm.data[size_t(0 * T + 4)] = kpm.data[size_t(2 * T + 5)] = 1;  // padded keys
    const EncoderInputs<double> bf{x, Mask<double>::of_float(mask), Mask<double>::of_bool(kpm)};
    const Tensor<double> all = encoder_layer_forward(c, w, bf);
    c.batch_first = false;
    const EncoderInputs<double> sf_in{swap_first_two(x), Mask<double>::of_float(mask), Mask<double>::of_bool(kpm)};
    const Tensor<double> sf = encoder_layer_forward(c, w, sf_in);
    CHECK(differing(sf, swap_first_two(all)) == 0);
    CHECK(std::count_if(all.data.begin(), all.data.end(), [](double v) { return std::isnan(v); }) < B * T * d);
  }
}

TEST_CASE("encoder: a stack sequence-first equals it batch-first", "[encoder]") {
  // nn.TransformerEncoder: unobserved on the fast path, a sequence-first batch runs every layer in
  // its own row order (encoder.cpp); the bits must be the batch-first call's, transposed.
  Rng rng(76);
  const int64_t B = 3, T = 7, d = 8;
  for (bool norm_first : {false, true}) {
    CAPTURE(norm_first);
    EncoderStackConfig sc;
    sc.layer = config(d, 2, 16, norm_first, Activation::Gelu);
    sc.num_layers = 2;
    sc.norm = true;
    EncoderStackWeights<double> w;
    for (int i = 0; i < 2; ++i) w.layers.push_back(random_weights(sc.layer, rng));
    w.norm_weight = randn(rng, {d}, 0.1);
    for (double& x : w.norm_weight.data) x += 1;
    w.norm_bias = randn(rng, {d}, 0.1);
    const Tensor<double> x = randn(rng, {B, T, d});
    Tensor<double> mask({T, T});
    for (double& v : mask.data) v = rng.normal();
    Tensor<uint8_t> kpm({B, T});
    kpm.data[size_t(1 * T + 6)] = 1;
    const Tensor<double> all =
        encoder_forward(sc, w, EncoderInputs<double>{x, Mask<double>::of_float(mask), Mask<double>::of_bool(kpm)});
    sc.layer.batch_first = false;
    const EncoderInputs<double> sf_in{swap_first_two(x), Mask<double>::of_float(mask), Mask<double>::of_bool(kpm)};
    CHECK(differing(encoder_forward(sc, w, sf_in), swap_first_two(all)) == 0);
    CHECK(std::none_of(all.data.begin(), all.data.end(), [](double v) { return std::isnan(v); }));
  }
}

TEST_CASE("encoder: a batch whose feed-forward runs in passes of rows equals stacked singles", "[encoder]") {
  // 5120 rows of a 128-wide hidden layer (5 MiB in double) with weights of 32 KiB: on a CPU with
  // 256 KiB to 16 MiB of L2 per core the fast feed-forward takes the rows in passes (blocks.hpp,
  // ffn_rows_per_pass: both weights within an eighth of L2, the hidden rows past a quarter), each
  // single batch element's 64 rows in one; the bits must not change. On 2 and 3 threads the passes
  // are dealt out to the threads, each running its own products inside the team: the same bits.
  Rng rng(74);
  struct Threads {
    const int saved = num_threads();
    ~Threads() { set_num_threads(saved); }
  } restore;
  const int64_t B = 80, T = 64, d = 16, F = 128;
  const int64_t l2 = cpu_caches().l2_per_core();
  if (l2 == 0)
    WARN("L2 unknown: the feed-forward runs in one pass here");
  else
    CHECK((2 * d * F * 8 <= l2 / 8 && B * T * F * 8 > l2 / 4));  // the rule takes passes at this L2
  for (bool norm_first : {false, true})
    for (Activation act : {Activation::Relu, Activation::Gelu}) {
      CAPTURE(norm_first, int(act));
      const EncoderConfig c = config(d, 2, F, norm_first, act);
      const EncoderWeights<double> w = random_weights(c, rng);
      const Tensor<double> x = randn(rng, {B, T, d});
      set_num_threads(1);
      const Tensor<double> all = encoder_layer_forward(c, w, EncoderInputs<double>{x, {}, {}});
      for (int threads : {2, 3}) {
        CAPTURE(threads);
        set_num_threads(threads);
        CHECK(encoder_layer_forward(c, w, EncoderInputs<double>{x, {}, {}}).data == all.data);
      }
      set_num_threads(1);
      int64_t differ = 0;
      for (int64_t b = 0; b < B; ++b) {
        const Tensor<double> xb({T, d},
                                std::vector<double>(x.data.begin() + b * T * d, x.data.begin() + (b + 1) * T * d));
        const Tensor<double> one = encoder_layer_forward(c, w, EncoderInputs<double>{xb, {}, {}});
        differ += one.data != std::vector<double>(all.data.begin() + b * T * d, all.data.begin() + (b + 1) * T * d);
      }
      CHECK(differ == 0);
    }
}

TEST_CASE("encoder: norm_first / the activation and layer_norm_eps each change the result", "[encoder]") {
  // Guards against a flag that is read but ignored.
  Rng rng(79);
  EncoderConfig c = config(8, 2, 16, false, Activation::Relu);
  const EncoderWeights<double> w = random_weights(c, rng);
  const Tensor<double> x = randn(rng, {2, 3, 8});
  const Tensor<double> base = encoder_layer_forward(c, w, EncoderInputs<double>{x, {}, {}});
  c.norm_first = true;
  CHECK(encoder_layer_forward(c, w, EncoderInputs<double>{x, {}, {}}).data != base.data);
  c.norm_first = false;
  c.activation = Activation::Gelu;
  CHECK(encoder_layer_forward(c, w, EncoderInputs<double>{x, {}, {}}).data != base.data);
  c.activation = Activation::Relu;
  c.layer_norm_eps = 1e-1;
  CHECK(encoder_layer_forward(c, w, EncoderInputs<double>{x, {}, {}}).data != base.data);
}

TEST_CASE("encoder: bad shapes are refused / naming the tensor", "[encoder]") {
  Rng rng(83);
  const EncoderConfig c = config(8, 2, 16, false, Activation::Relu);
  EncoderWeights<double> w = random_weights(c, rng);
  CHECK_THROWS_WITH(encoder_layer_forward(c, w, EncoderInputs<double>{randn(rng, {2, 3, 6}), {}, {}}),
                    Catch::StartsWith("src: expected last dim d_model = 8"));
  CHECK_THROWS_WITH(
      encoder_layer_forward(
          c, w, EncoderInputs<double>{randn(rng, {3, 8}), {}, Mask<double>::of_bool(Tensor<uint8_t>({2, 3}))}),
      Catch::StartsWith("src_key_padding_mask: expected shape [3]"));
  w.linear1_weight = randn(rng, {16, 7});
  CHECK_THROWS_WITH(encoder_layer_forward(c, w, EncoderInputs<double>{randn(rng, {2, 3, 8}), {}, {}}),
                    Catch::StartsWith("state_dict.linear1.weight: expected shape [16, 8]"));
}
