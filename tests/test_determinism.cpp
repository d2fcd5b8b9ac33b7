// Determinism: the same seed gives the same problem and the same outputs, bit for bit, run after
// run; and the hand core's outputs do not depend on its thread count, on the fast path (GEMM, fused
// attention, vmath) and the reference path alike, for every default case.
#include <catch2/catch.hpp>
#include <cstring>

#include "support.hpp"
#include "tparity/core/parallel.hpp"
#include "tparity/harness/cases.hpp"
#include "tparity/harness/hand.hpp"

using namespace tparity;

namespace {

bool same_bits(const Storage<double>& a, const Storage<double>& b) {
  return a.size() == b.size() && (a.empty() || std::memcmp(a.data(), b.data(), a.size() * sizeof(double)) == 0);
}

bool same_bits(const TensorMap& a, const TensorMap& b) {
  if (a.size() != b.size()) return false;
  for (const auto& [k, v] : a) {
    auto it = b.find(k);
    if (it == b.end() || it->second.shape != v.shape || !same_bits(it->second.data, v.data)) return false;
  }
  return true;
}

bool same_bits(const Components& a, const Components& b) {
  if (a.size() != b.size()) return false;
  for (size_t i = 0; i < a.size(); ++i)
    if (a[i].name != b[i].name || !same_bits(a[i].value.data, b[i].value.data)) return false;
  return true;
}

class ScopedThreads {
 public:
  explicit ScopedThreads(int n) : saved_(num_threads()) { set_num_threads(n); }
  ~ScopedThreads() { set_num_threads(saved_); }

 private:
  int saved_;
};

}  // namespace

TEST_CASE("determinism: a seed gives the same problem and the same outputs, run after run", "[determinism]") {
  for (const CaseSpec& s : default_cases()) {
    CAPTURE(s.name);
    const Problem a = make_problem(s), b = make_problem(s);
    CHECK(same_bits(a.state_dict, b.state_dict));
    CHECK(same_bits(a.inputs, b.inputs));
    for (DType dt : {DType::Float32, DType::Float64}) {
      const RunResult x = run_hand(a, dt, true, s.name), y = run_hand(b, dt, true, s.name);
      CHECK(same_bits(x.outputs, y.outputs));
      CHECK(same_bits(x.components, y.components));
    }
    CaseSpec other = s;
    other.seed = s.seed + 1000;
    CHECK_FALSE(same_bits(make_problem(other).inputs, a.inputs));  // and the seed matters
  }
}

namespace {

// Every default case (outputs alone: the fast path with the fused attention; with components: the
// unfused one), on 1 to 4 threads, on one core path in one precision; and the benchmark shapes'
// attention at a size where every kernel splits its work (rows of the GEMM, query blocks of the
// fused attention, rows of the softmax and the layer norm). One test per path and precision, so that
// ctest spreads them over its jobs (under ASan the four took 110 s as one test).
void check_thread_count_independence(CorePath path, DType dt) {
  std::vector<CaseSpec> cases = default_cases();
  CaseSpec wide;
  wide.name = "wide", wide.module = ModuleKind::TransformerEncoderLayer, wide.batch = 4, wide.seq = 96;
  wide.dim = 128, wide.heads = 4, wide.ffn = 256, wide.mask = MaskKind::Causal, wide.seed = 5;
  cases.push_back(wide);
  CaseSpec attn;
  attn.name = "attn", attn.module = ModuleKind::MultiheadAttention, attn.batch = 1, attn.seq = 600, attn.dim = 64;
  attn.heads = 2, attn.need_weights = false, attn.mask = MaskKind::Padding, attn.seed = 6;
  cases.push_back(attn);
  const test::ScopedCorePath scoped(path);
  for (const CaseSpec& s : cases) {
    const Problem p = make_problem(s);
    for (bool components : {false, true}) {
      CAPTURE(s.name, path == CorePath::Fast ? "fast" : "reference", dtype_name(dt), components);
      RunResult one;
      {
        const ScopedThreads t(1);
        one = run_hand(p, dt, components, s.name);
      }
      REQUIRE_FALSE(one.outputs.empty());
      if (components) REQUIRE_FALSE(one.components.empty());
      for (int n : {2, 3, 4}) {
        CAPTURE(n);
        const ScopedThreads t(n);
        const RunResult many = run_hand(p, dt, components, s.name);
        CHECK(same_bits(one.outputs, many.outputs));
        CHECK(same_bits(one.components, many.components));
      }
    }
  }
}

}  // namespace

TEST_CASE("determinism: the hand core's outputs do not depend on its thread count / the fast path, float32",
          "[determinism]") {
  check_thread_count_independence(CorePath::Fast, DType::Float32);
}

TEST_CASE("determinism: the hand core's outputs do not depend on its thread count / the fast path, float64",
          "[determinism]") {
  check_thread_count_independence(CorePath::Fast, DType::Float64);
}

TEST_CASE("determinism: the hand core's outputs do not depend on its thread count / the reference path, float32",
          "[determinism]") {
  check_thread_count_independence(CorePath::Reference, DType::Float32);
}

TEST_CASE("determinism: the hand core's outputs do not depend on its thread count / the reference path, float64",
          "[determinism]") {
  check_thread_count_independence(CorePath::Reference, DType::Float64);
}

TEST_CASE("determinism: run_hand(Problem&&) gives run_hand's outputs bit for bit, the weights released on the way",
          "[determinism]") {
  for (const CaseSpec& spec : default_cases()) {
    CAPTURE(spec.name);
    const Problem p = make_problem(spec);
    for (DType dtype : {DType::Float32, DType::Float64}) {
      const RunResult kept = run_hand(p, dtype, false, "case " + spec.name);
      Problem q = p;
      const RunResult released = run_hand(std::move(q), dtype, "case " + spec.name);
      CHECK(same_bits(kept.outputs, released.outputs));
      // The torch.nn modules' weights are released (the LLM blocks convert theirs elsewhere and keep
      // them), and so are their inputs.
      if (p.module == ModuleKind::MultiheadAttention || p.module == ModuleKind::TransformerEncoderLayer ||
          p.module == ModuleKind::TransformerDecoderLayer) {
        size_t held = 0;
        for (const auto& [name, t] : q.state_dict) held += t.data.size();
        CHECK(held == 0);
        for (const char* in : {"query", "src", "tgt"})
          if (const DTensor* t = q.input(in)) CHECK(t->data.empty());
      }
    }
  }
}
