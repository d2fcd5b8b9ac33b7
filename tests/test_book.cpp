// The book's attention classes (core/book.hpp) against hand-worked answers and the invariants that
// tie them to one another: v2 is v1 with W transposed, the wrapper is its heads concatenated, the
// book's MultiHeadAttention is the wrapper of its head slices, a token's output never depends on
// later tokens.
#include <algorithm>
#include <catch2/catch.hpp>
#include <cmath>
#include <map>
#include <string>

#include "support.hpp"
#include "tparity/core/book.hpp"
#include "tparity/harness/book.hpp"

using namespace tparity;
using test::randn;

namespace {

struct Record final : Observer<double> {
  std::map<std::string, Tensor<double>> seen;
  void on(const std::string& name, Tensor<double>& v) override { seen[name] = v; }
};

BookConfig config(BookClass cls, int64_t d_in, int64_t d_out, int64_t heads = 1, int64_t context = 8,
                  bool bias = false) {
  BookConfig c;
  c.cls = cls, c.d_in = d_in, c.d_out = d_out, c.num_heads = heads, c.context_length = context, c.qkv_bias = bias;
  return c;
}

Tensor<double> transposed(const Tensor<double>& w) {
  Tensor<double> t({w.size(1), w.size(0)});
  for (int64_t i = 0; i < w.size(0); ++i)
    for (int64_t j = 0; j < w.size(1); ++j) t.data[size_t(j * w.size(0) + i)] = w.data[size_t(i * w.size(1) + j)];
  return t;
}

Tensor<double> causal(int64_t n) {
  const DTensor b = book_causal_buffer(n);
  return Tensor<double>(b.shape, b.data);
}

// Rows [from, to) of the weight (out, in): one head's slice of a projection.
Tensor<double> rows(const Tensor<double>& w, int64_t from, int64_t to) {
  const int64_t in = w.size(1);
  return Tensor<double>({to - from, in}, std::vector<double>(w.data.begin() + from * in, w.data.begin() + to * in));
}

}  // namespace

TEST_CASE("book: SelfAttention_v1 against a hand-worked answer / scaled by sqrt(d_out), not sqrt(d_in)", "[book]") {
  // x = I (2 tokens, d_in 2), so q, k, v are the matrices' rows. Wq rows (1, 0, 0, 0), (0, 2, 0, 0),
  // Wk rows (1, 0, 0, 0), (0, 1, 0, 0): scores (1, 0; 0, 2), divided by sqrt(d_out) = 2.
  const BookConfig c = config(BookClass::SelfAttentionV1, 2, 4);
  BookWeights<double> w;
  w.heads.push_back({Tensor<double>({2, 4}, {1, 0, 0, 0, 0, 2, 0, 0}),
                     Tensor<double>({2, 4}, {1, 0, 0, 0, 0, 1, 0, 0}),
                     Tensor<double>({2, 4}, {1, 2, 3, 4, 5, 6, 7, 8}),
                     {},
                     {},
                     {},
                     {}});
  Record rec;
  const Tensor<double> out = book_attention_forward(c, w, Tensor<double>({2, 2}, {1, 0, 0, 1}), &rec);
  REQUIRE(out.shape == Shape{2, 4});
  const double a = std::exp(0.5), e = std::exp(1.0);
  const double w0[2] = {a / (a + 1), 1 / (a + 1)}, w1[2] = {1 / (1 + e), e / (1 + e)};
  for (int64_t j = 0; j < 4; ++j) {
    CAPTURE(j);
    CHECK(out.data[size_t(j)] == Approx(w0[0] * double(j + 1) + w0[1] * double(j + 5)).epsilon(1e-15));
    CHECK(out.data[size_t(4 + j)] == Approx(w1[0] * double(j + 1) + w1[1] * double(j + 5)).epsilon(1e-15));
  }
  CHECK(rec.seen.at("scores").shape == Shape{1, 1, 2, 2});
  CHECK(rec.seen.at("scores").data == std::vector<double>{0.5, 0, 0, 1});
  CHECK(rec.seen.at("q").shape == Shape{1, 1, 2, 4});
  CHECK(rec.seen.at("output").shape == Shape{1, 2, 4});
  CHECK_FALSE(rec.seen.count("context"));  // no out_proj: the context is the output
}

TEST_CASE("book: SelfAttention_v2 is v1 with each W transposed / plus its biases", "[book]") {
  Rng rng(1);
  const Tensor<double> x = randn(rng, {5, 3});
  BookWeights<double> w1, w2;
  w1.heads.push_back({randn(rng, {3, 2}), randn(rng, {3, 2}), randn(rng, {3, 2}), {}, {}, {}, {}});
  const BookProjections<double>& p = w1.heads[0];
  w2.heads.push_back({transposed(p.w_query), transposed(p.w_key), transposed(p.w_value), {}, {}, {}, {}});
  const Tensor<double> v1 = book_attention_forward(config(BookClass::SelfAttentionV1, 3, 2), w1, x);
  const Tensor<double> v2 = book_attention_forward(config(BookClass::SelfAttentionV2, 3, 2), w2, x);
  REQUIRE(v2.shape == Shape{5, 2});
  for (size_t i = 0; i < v1.data.size(); ++i) CHECK(v2.data[i] == Approx(v1.data[i]).epsilon(1e-14));
  // A value bias b adds b to every output row: the weights of a row sum to one.
  w2.heads[0].b_value = Tensor<double>({2}, {10, -20});
  w2.heads[0].b_query = Tensor<double>({2}, {0, 0});
  w2.heads[0].b_key = Tensor<double>({2}, {0, 0});
  const Tensor<double> biased = book_attention_forward(config(BookClass::SelfAttentionV2, 3, 2, 1, 8, true), w2, x);
  for (size_t i = 0; i < v1.data.size(); ++i)
    CHECK(biased.data[i] == Approx(v1.data[i] + (i % 2 ? -20.0 : 10.0)).epsilon(1e-14));
}

TEST_CASE("book: CausalAttention's first token is its own value / later tokens never reach earlier ones", "[book]") {
  Rng rng(2);
  const BookConfig c = config(BookClass::CausalAttention, 3, 2, 1, 7);
  BookWeights<double> w;
  w.heads.push_back({randn(rng, {2, 3}), randn(rng, {2, 3}), randn(rng, {2, 3}), {}, {}, {}, causal(7)});
  const Tensor<double> x = randn(rng, {2, 5, 3});
  Record rec;
  const Tensor<double> out = book_attention_forward(c, w, x, &rec);
  REQUIRE(out.shape == Shape{2, 5, 2});
  // Token 0 sees only itself: its output is its value, v = W_value x.
  for (int64_t b = 0; b < 2; ++b)
    for (int64_t j = 0; j < 2; ++j) {
      double v = 0;
      for (int64_t i = 0; i < 3; ++i) v += w.heads[0].w_value.data[size_t(j * 3 + i)] * x.data[size_t(b * 15 + i)];
      CHECK(out.data[size_t(b * 10 + j)] == Approx(v).epsilon(1e-14));
    }
  // The buffer of context_length 7 is sliced to the 5 tokens: masked keys weigh exactly 0.
  const Tensor<double>& wts = rec.seen.at("attn_weights");
  REQUIRE(wts.shape == Shape{2, 1, 5, 5});
  for (int64_t i = 0; i < 5; ++i)
    for (int64_t j = i + 1; j < 5; ++j) CHECK(wts.data[size_t(i * 5 + j)] == 0);
  // The first three tokens alone give the same first three outputs.
  Tensor<double> x3({2, 3, 3});
  for (int64_t b = 0; b < 2; ++b) std::copy_n(x.data.begin() + b * 15, 9, x3.data.begin() + b * 9);
  const Tensor<double> out3 = book_attention_forward(c, w, x3);
  for (int64_t b = 0; b < 2; ++b)
    for (int64_t k = 0; k < 6; ++k)
      CHECK(out3.data[size_t(b * 6 + k)] == Approx(out.data[size_t(b * 10 + k)]).epsilon(1e-14));
  // The buffer is data, as in the book: an all-zero buffer masks nothing.
  w.heads[0].mask = Tensor<double>({7, 7});
  const Tensor<double> open = book_attention_forward(c, w, x, &rec);
  CHECK(rec.seen.at("attn_weights").data[1] > 0);
  CHECK(open.data != out.data);
}

TEST_CASE("book: the wrapper is its CausalAttention heads concatenated / then out_proj", "[book]") {
  Rng rng(3);
  const int64_t H = 3, D = 2;
  BookWeights<double> w;
  for (int64_t h = 0; h < H; ++h)
    w.heads.push_back({randn(rng, {D, 4}), randn(rng, {D, 4}), randn(rng, {D, 4}), randn(rng, {D}), randn(rng, {D}),
                       randn(rng, {D}), causal(6)});
  w.out_proj_weight = randn(rng, {H * D, H * D});
  w.out_proj_bias = randn(rng, {H * D});
  const Tensor<double> x = randn(rng, {2, 6, 4});
  Record rec;
  const Tensor<double> out =
      book_attention_forward(config(BookClass::MultiHeadAttentionWrapper, 4, D, H, 6, true), w, x, &rec);
  REQUIRE(out.shape == Shape{2, 6, H * D});
  const Tensor<double>& context = rec.seen.at("context");
  for (int64_t h = 0; h < H; ++h) {
    BookWeights<double> one;
    one.heads.push_back(w.heads[size_t(h)]);
    const Tensor<double> head = book_attention_forward(config(BookClass::CausalAttention, 4, D, 1, 6, true), one, x);
    for (int64_t bt = 0; bt < 12; ++bt)
      for (int64_t d = 0; d < D; ++d)
        CHECK(context.data[size_t(bt * H * D + h * D + d)] == Approx(head.data[size_t(bt * D + d)]).epsilon(1e-14));
  }
  // out_proj: output = context W^T + b, row by row.
  for (int64_t bt = 0; bt < 12; ++bt)
    for (int64_t o = 0; o < H * D; ++o) {
      double s = w.out_proj_bias.data[size_t(o)];
      for (int64_t i = 0; i < H * D; ++i)
        s += w.out_proj_weight.data[size_t(o * H * D + i)] * context.data[size_t(bt * H * D + i)];
      CHECK(out.data[size_t(bt * H * D + o)] == Approx(s).epsilon(1e-13));
    }
}

TEST_CASE("book: MultiHeadAttention equals the wrapper of its heads' slices / scaled by the head's width", "[book]") {
  // The book's MultiHeadAttention with d_out = H D splits q, k, v into H heads of D: head h is a
  // CausalAttention whose projections are rows h D .. (h + 1) D of W_query, W_key, W_value. Both
  // divide by sqrt(D), a head's width: the same numbers.
  Rng rng(4);
  const int64_t H = 2, D = 3, d_in = 5;
  BookWeights<double> mha;
  mha.heads.push_back(
      {randn(rng, {H * D, d_in}), randn(rng, {H * D, d_in}), randn(rng, {H * D, d_in}), {}, {}, {}, causal(4)});
  mha.out_proj_weight = randn(rng, {H * D, H * D});
  mha.out_proj_bias = randn(rng, {H * D});
  BookWeights<double> wrapper;
  const BookProjections<double>& p = mha.heads[0];
  for (int64_t h = 0; h < H; ++h)
    wrapper.heads.push_back({rows(p.w_query, h * D, (h + 1) * D),
                             rows(p.w_key, h * D, (h + 1) * D),
                             rows(p.w_value, h * D, (h + 1) * D),
                             {},
                             {},
                             {},
                             causal(4)});
  wrapper.out_proj_weight = mha.out_proj_weight, wrapper.out_proj_bias = mha.out_proj_bias;
  const Tensor<double> x = randn(rng, {3, 4, d_in});
  Record r1, r2;
  const Tensor<double> a =
      book_attention_forward(config(BookClass::MultiHeadAttention, d_in, H * D, H, 4), mha, x, &r1);
  const Tensor<double> b =
      book_attention_forward(config(BookClass::MultiHeadAttentionWrapper, d_in, D, H, 4), wrapper, x, &r2);
  REQUIRE(a.shape == b.shape);
  for (size_t i = 0; i < a.data.size(); ++i) CHECK(a.data[i] == Approx(b.data[i]).epsilon(1e-13));
  for (const char* n : {"q", "k", "v", "scores", "attn_weights", "context"}) {
    CAPTURE(n);
    CHECK(r1.seen.at(n).shape == r2.seen.at(n).shape);
  }
  CHECK(r1.seen.at("q").shape == Shape{3, H, 4, D});
}

TEST_CASE("book: shapes that contradict the config are refused, naming the tensor", "[book]") {
  Rng rng(5);
  BookWeights<double> w;
  w.heads.push_back({randn(rng, {2, 3}), randn(rng, {2, 3}), randn(rng, {2, 3}), {}, {}, {}, causal(4)});
  const BookConfig c = config(BookClass::CausalAttention, 3, 2, 1, 4);
  CHECK_THROWS_WITH(book_attention_forward(c, w, randn(rng, {1, 5, 3})),
                    Catch::Contains("x: expected at most context_length = 4 tokens"));
  CHECK_THROWS_WITH(book_attention_forward(c, w, randn(rng, {5, 3})), Catch::Contains("x: expected (B, T, 3)"));
  CHECK_THROWS_WITH(book_attention_forward(config(BookClass::SelfAttentionV1, 3, 2), w, randn(rng, {5, 3})),
                    Catch::Contains("W_query: expected shape [3, 2], got [2, 3]"));
}
