// Parity against LibTorch: the default cases, a seeded grid of shapes and options, the fixtures
// through the C++ reference. Each problem goes through the comparator's own gates.
#define CATCH_CONFIG_EXTERNAL_INTERFACES  // Catch::TestEventListenerBase, for the listener below
#include <catch2/catch.hpp>
#if defined(__x86_64__)
#include <immintrin.h>
#endif
#include <algorithm>
#include <cmath>
#include <filesystem>
#include <functional>
#include <map>

#include "support.hpp"
#include "tparity/api.hpp"
#include "tparity/compare/report.hpp"
#include "tparity/core/defects.hpp"
#include "tparity/eval/evaluate.hpp"
#include "tparity/fixture/fixture.hpp"
#include "tparity/harness/book.hpp"
#include "tparity/harness/cases.hpp"
#include "tparity/harness/llm.hpp"
#include "tparity/harness/rng.hpp"
#include "tparity/torch/reference.hpp"

using namespace tparity;
using test::divisor_of;
namespace fs = std::filesystem;

namespace {

// LibTorch on one thread, as the CLI runs it (main.cpp): ctest runs two of these suites at a time on
// two cores, and two intra-op threads each (LibTorch's default, one per core) would spin against each
// other in OpenMP's and OpenBLAS's waits (the 2.13 suite took four times the wall time that way).
struct OneReferenceThread : Catch::TestEventListenerBase {
  using TestEventListenerBase::TestEventListenerBase;
  void testRunStarting(const Catch::TestRunInfo&) override { set_torch_threads(1); }
};
CATCH_REGISTER_LISTENER(OneReferenceThread)

DTensor randn(Rng& rng, Shape s, double scale = 1.0) {
  DTensor t{DType::Float64, s, Storage<double>(size_t(numel(s)))};
  for (double& x : t.data) x = round_to_float(scale * rng.normal());
  return t;
}

DTensor random_bool(Rng& rng, Shape s, double p) {
  DTensor t{DType::Bool, s, Storage<double>(size_t(numel(s)))};
  for (double& x : t.data) x = rng.coin(p) ? 1.0 : 0.0;
  return t;
}

// attn_mask and key_padding_mask as torch 1.13 accepts them: none, 2-D or 3-D, bool or float; a float
// key padding mask only without a float attn_mask (torch raises on that pair).
void random_masks(Rng& rng, Problem& p, int64_t B, int64_t H, int64_t L, int64_t S, const char* attn, const char* kpm) {
  switch (rng.integer(0, 4)) {
    case 0:
      break;
    case 1:
      p.inputs[attn] = randn(rng, {L, S});
      break;
    case 2:
      p.inputs[attn] = random_bool(rng, {L, S}, 0.3);
      break;
    case 3:
      p.inputs[attn] = randn(rng, {(B ? B : 1) * H, L, S});
      break;
    case 4:
      p.inputs[attn] = random_bool(rng, {(B ? B : 1) * H, L, S}, 0.3);
      break;
  }
  const Shape ks = B ? Shape{B, S} : Shape{S};
  const bool float_attn = p.inputs.count(attn) && p.inputs[attn].dtype != DType::Bool;
  switch (rng.integer(0, 2)) {
    case 0:
      break;
    case 1:
      p.inputs[kpm] = random_bool(rng, ks, 0.3);
      break;
    case 2:
      if (!float_attn) p.inputs[kpm] = randn(rng, ks);
      break;
  }
}

void mha_state(Rng& rng, const MhaConfig& c, const std::string& prefix, TensorMap& sd) {
  const int64_t E = c.embed_dim;
  const double s = 1 / std::sqrt(double(E));
  if (c.packed())
    sd[prefix + "in_proj_weight"] = randn(rng, {3 * E, E}, s);
  else {
    sd[prefix + "q_proj_weight"] = randn(rng, {E, E}, s);
    sd[prefix + "k_proj_weight"] = randn(rng, {E, c.key_dim()}, s);
    sd[prefix + "v_proj_weight"] = randn(rng, {E, c.value_dim()}, s);
  }
  if (c.bias) {
    sd[prefix + "in_proj_bias"] = randn(rng, {3 * E}, 0.2);
    sd[prefix + "out_proj.bias"] = randn(rng, {E}, 0.2);
  }
  if (c.add_bias_kv) {
    sd[prefix + "bias_k"] = randn(rng, {1, 1, E});
    sd[prefix + "bias_v"] = randn(rng, {1, 1, E});
  }
  sd[prefix + "out_proj.weight"] = randn(rng, {E, E}, s);
}

Shape layout(int64_t B, int64_t T, int64_t d, bool batch_first) {
  if (!B) return {T, d};
  return batch_first ? Shape{B, T, d} : Shape{T, B, d};
}

Problem random_mha(uint64_t seed) {
  Rng rng(seed);
  Problem p;
  p.name = "mha_grid_" + std::to_string(seed);
  p.module = ModuleKind::MultiheadAttention;
  MhaConfig& c = p.mha;
  c.embed_dim = std::vector<int64_t>{4, 6, 8, 12, 16}[size_t(rng.integer(0, 4))];
  c.num_heads = divisor_of(rng, c.embed_dim);
  c.bias = rng.coin();
  c.add_bias_kv = rng.coin(0.3);
  c.add_zero_attn = rng.coin(0.3);
  if (rng.coin(0.3)) c.kdim = rng.integer(1, 10), c.vdim = rng.integer(1, 10);
  c.batch_first = rng.coin();
  p.forward.need_weights = rng.coin(0.8);
  p.forward.average_attn_weights = rng.coin();
  const int64_t B = rng.integer(0, 3), L = rng.integer(1, 8);
  const bool self = c.packed() && rng.coin();
  const int64_t S = self ? L : rng.integer(1, 9);
  mha_state(rng, c, "", p.state_dict);
  p.inputs["query"] = randn(rng, layout(B, L, c.embed_dim, c.batch_first));
  p.inputs["key"] = self ? p.inputs["query"] : randn(rng, layout(B, S, c.key_dim(), c.batch_first));
  p.inputs["value"] =
      self ? p.inputs["query"]
           : (c.packed() && rng.coin() ? p.inputs["key"] : randn(rng, layout(B, S, c.value_dim(), c.batch_first)));
  random_masks(rng, p, B, c.num_heads, L, S, "attn_mask", "key_padding_mask");
  return p;
}

Problem random_encoder(uint64_t seed) {
  Rng rng(seed);
  Problem p;
  p.name = "encoder_grid_" + std::to_string(seed);
  p.module = ModuleKind::TransformerEncoderLayer;
  EncoderConfig& c = p.encoder;
  c.d_model = std::vector<int64_t>{4, 8, 12, 16}[size_t(rng.integer(0, 3))];
  c.nhead = divisor_of(rng, c.d_model);
  c.dim_feedforward = rng.integer(1, 24);
  c.activation = rng.coin() ? Activation::Gelu : Activation::Relu;
  c.layer_norm_eps = std::vector<double>{1e-5, 1e-6, 1e-3}[size_t(rng.integer(0, 2))];
  c.batch_first = rng.coin();
  c.norm_first = rng.coin();
  mha_state(rng, c.self_attn(), "self_attn.", p.state_dict);
  const int64_t d = c.d_model, F = c.dim_feedforward, B = rng.integer(0, 3), T = rng.integer(1, 8);
  p.state_dict["linear1.weight"] = randn(rng, {F, d}, 1 / std::sqrt(double(d)));
  p.state_dict["linear1.bias"] = randn(rng, {F}, 0.2);
  p.state_dict["linear2.weight"] = randn(rng, {d, F}, 1 / std::sqrt(double(F)));
  p.state_dict["linear2.bias"] = randn(rng, {d}, 0.2);
  for (const char* n : {"norm1", "norm2"}) {
    DTensor w = randn(rng, {d}, 0.2);
    for (double& x : w.data) x = round_to_float(1 + x);
    p.state_dict[std::string(n) + ".weight"] = w;
    p.state_dict[std::string(n) + ".bias"] = randn(rng, {d}, 0.2);
  }
  p.inputs["src"] = randn(rng, layout(B, T, d, c.batch_first));
  random_masks(rng, p, B, c.nhead, T, T, "src_mask", "src_key_padding_mask");
  return p;
}

void require_pass(const CaseReport& r) {
  INFO(render_table(r));
  REQUIRE(r.pass);
}

}  // namespace

TEST_CASE("parity: the default cases pass / with the reference verified against LibTorch's modules", "[parity]") {
  for (const CaseSpec& s : default_cases()) {
    CAPTURE(s.name, s.seed);
    const CaseReport r = evaluate_problem(make_problem(s), s.describe(), s.seed, GatePolicy{});
    require_pass(r);
    // q k v scores attn_weights [attn_weights_avg] context output; the block: 7 attention + 4 more.
    // embed: embedding, pos_encoding, 6 layers x 11, output = 69. vit: patches, pos_encoding, 2 x 11,
    // one hidden head width x (linear, bn, act), output = 28. layernorm: mean, rstd, output.
    const std::map<std::string, size_t> expected{{"single", 8},
                                                 {"batched", 8},
                                                 {"multihead", 8},
                                                 {"block", 11},
                                                 {"sdpa", 3},
                                                 {"encoder", 35},
                                                 {"decoder", 19},
                                                 {"embed", 69},
                                                 {"vit", 28},
                                                 {"matmul", 1},
                                                 {"bmm", 1},
                                                 {"softmax", 1},
                                                 {"layernorm", 3},
                                                 {"selfattn_v1", 6},
                                                 {"book_mha", 7},
                                                 // llama: 19 per call (prefill and two decode steps), then output
                                                 {"llama", 58},
                                                 {"gpt2", 14},
                                                 // mistral: the prefill and three decode steps, then output
                                                 {"mistral", 77},
                                                 // qwen3: 21 per call (q_norm and k_norm among them), three calls
                                                 {"qwen3", 64},
                                                 // gemma2: 21 per call (four norms), four calls
                                                 {"gemma2", 85}};
    CHECK(r.components.size() == expected.at(s.name));
    // Each precision's reference is verified against what LibTorch runs for real: its modules bit for
    // bit, or for matmul at::bmm over the broadcast operands (bit for bit, or within the bound of
    // two summation orders, said so).
    const std::map<std::string, std::string> verified_what{{"embed", "torch::nn::Embedding"},
                                                           {"vit", "BatchNorm1d (eval)"},
                                                           {"matmul", "at::matmul"},
                                                           {"bmm", "at::matmul"},
                                                           {"softmax", "torch::nn::Softmax(dim=-1)"},
                                                           {"layernorm", "torch::nn::LayerNorm"}};
    if (book_module(s.module) || llm_module(s.module)) {  // no LibTorch module: Python's fixtures verify these
      size_t said = 0;
      for (const std::string& n : r.notes)
        said += n.find("is the book's Python class") != std::string::npos ||
                n.find("is transformers' (Python)") != std::string::npos;
      CHECK(said == 2);
      continue;
    }
    size_t verified = 0;
    for (const std::string& n : r.notes) {
      const bool exact = n.find("bit for bit (float") != std::string::npos;
      const bool bounded = n.find("within the summation-order bound (float") != std::string::npos;
      verified += exact || bounded;
      if (verified_what.count(s.name) && (exact || bounded)) CHECK_THAT(n, Catch::Contains(verified_what.at(s.name)));
    }
    CHECK(verified == 2);  // float64 and float32
  }
}

TEST_CASE("parity: a seeded grid of multi-head attention shapes and options", "[parity]") {
  // Unbatched and batched, both layouts, bias, bias_kv, zero_attn, kdim/vdim, 2-D and 3-D masks,
  // bool and float, key padding, averaged and per-head weights, need_weights off. Rows whose keys
  // are all masked are allowed: torch and the core both give NaN there, which counts as agreement.
  for (uint64_t seed = 1000; seed < 1200; ++seed) {
    const Problem p = random_mha(seed);
    CAPTURE(seed, summary(p));
    require_pass(evaluate_problem(p, summary(p), seed, GatePolicy{}));
  }
}

TEST_CASE("parity: the book's five attention classes over a seeded grid of sizes / heads / qkv_bias", "[parity]") {
  // SelfAttention_v1 and v2 (unbatched), CausalAttention, the wrapper and MultiHeadAttention
  // (batched): d_in and d_out apart, 1 to 4 heads, with and without qkv_bias, 1 to 9 tokens.
  const ModuleKind kinds[] = {ModuleKind::SelfAttentionV1, ModuleKind::SelfAttentionV2, ModuleKind::CausalAttention,
                              ModuleKind::MultiHeadAttentionWrapper, ModuleKind::BookMultiHeadAttention};
  Rng rng(77);
  for (int i = 0; i < 60; ++i) {
    CaseSpec s;
    s.name = "book_grid";
    s.module = kinds[i % 5];
    const BookClass c = book_class(s.module);
    const bool batched = c != BookClass::SelfAttentionV1 && c != BookClass::SelfAttentionV2;
    s.batch = batched ? rng.integer(1, 3) : 0;
    s.seq = rng.integer(1, 9);
    s.dim = rng.integer(1, 12);
    s.heads = c == BookClass::MultiHeadAttentionWrapper || c == BookClass::MultiHeadAttention ? rng.integer(1, 4) : 1;
    s.out_dim = rng.integer(1, 6) * (c == BookClass::MultiHeadAttention ? s.heads : 1);
    s.bias = rng.coin();
    s.seed = 3000 + uint64_t(i);
    CAPTURE(s.describe());
    require_pass(evaluate_problem(make_problem(s), s.describe(), s.seed, GatePolicy{}));
  }
}

TEST_CASE("parity: a seeded grid of encoder layers", "[parity]") {
  for (uint64_t seed = 2000; seed < 2100; ++seed) {
    const Problem p = random_encoder(seed);
    CAPTURE(seed, summary(p));
    require_pass(evaluate_problem(p, summary(p), seed, GatePolicy{}));
  }
}

TEST_CASE("parity: the run options reach LibTorch: masks / cross-attention / gelu / unbatched", "[parity]") {
  for (CaseSpec s : default_cases()) {
    if ((!fixture_module(s.module) && s.module != ModuleKind::ScaledDotProductAttention) || book_module(s.module) ||
        llm_module(s.module))
      continue;  // their own grids
    for (MaskKind m : {MaskKind::None, MaskKind::Random, MaskKind::Padding}) {
      if (s.module == ModuleKind::ScaledDotProductAttention && m == MaskKind::Padding) continue;
      s.batch = s.batch ? 3 : 0;
      s.seq = 6;
      s.kv_seq = s.module == ModuleKind::TransformerEncoderLayer || s.module == ModuleKind::TransformerEncoder ? 0 : 9;
      s.mask = m;
      s.bias = true;
      s.random_params = true;
      s.activation = Activation::Gelu;
      CAPTURE(s.describe());
      require_pass(evaluate_problem(make_problem(s), s.describe(), s.seed, GatePolicy{}));
    }
  }
}

TEST_CASE("parity: scaled_dot_product_attention's arguments reach LibTorch / is_causal, scale, enable_gqa, a bool mask",
          "[parity]") {
  // The reference's output is at::scaled_dot_product_attention's own, given the arguments as a user
  // gives them (a bool attn_mask true where a key takes part): a core that read the flags or the mask
  // differently fails here. torch 1.13 has no scale or enable_gqa: refused in one line.
  const bool v2 = reference_semantics() == TorchSemantics::Torch2;
  Rng rng(31);
  for (int i = 0; i < 40; ++i) {
    CaseSpec s;
    for (const CaseSpec& c : default_cases())
      if (c.name == "sdpa") s = c;
    s.batch = rng.integer(0, 2);
    s.seq = rng.integer(1, 7);
    s.kv_seq = rng.integer(1, 7);
    s.heads = rng.integer(1, 4);
    s.kv_heads = rng.coin() ? s.heads : 1;
    const MaskKind masks[] = {MaskKind::None, MaskKind::Random, MaskKind::Causal, MaskKind::IsCausal};
    s.mask = masks[rng.integer(0, 3)];
    if (rng.coin()) s.scale = rng.uniform(-1.5, 1.5);
    s.seed = 500 + uint64_t(i);
    CAPTURE(s.describe());
    const Problem p = make_problem(s);
    if (!v2 && (s.scale || p.sdpa.enable_gqa)) {
      CHECK_THROWS_WITH(evaluate_problem(p, s.describe(), s.seed, GatePolicy{}),
                        Catch::Contains("expected a LibTorch 2.x reference"));
      continue;
    }
    const CaseReport r = evaluate_problem(p, s.describe(), s.seed, GatePolicy{});
    require_pass(r);
    size_t verified = 0;
    for (const std::string& n : r.notes) verified += n.find("bit for bit (float") != std::string::npos;
    CHECK(verified == 2);
  }
}

TEST_CASE("parity: every committed fixture through LibTorch and the hand core", "[parity]") {
  std::vector<std::string> files;
  for (const auto& e : fs::recursive_directory_iterator(TPARITY_FIXTURES))
    if (e.path().extension() == ".json" && e.path().filename().string().rfind("baseline", 0) != 0)
      files.push_back(e.path().string());
  REQUIRE(files.size() >= 17);
  for (const std::string& f : files) {
    CAPTURE(f);
    const Problem p = read_fixture(f);
    const std::vector<CaseReport> rs = check_fixture(p, f, GatePolicy{});
    // Outputs against Python, and every component against the decomposition, unless the fixture's
    // torch and LibTorch's differ in semantics where the fixture exercises the difference.
    const bool differs = !semantic_differences(p).empty() && *p.semantics != reference_semantics();
    REQUIRE(rs.size() == (differs ? 1u : 2u));
    for (const CaseReport& r : rs) require_pass(r);
    CHECK(rs[0].components.back().leg("libtorch64_vs_torch64") != nullptr);
  }
}

TEST_CASE("parity: rows whose every key is masked / NaN under 1.13 / zero weights without weights under 2.x",
          "[parity]") {
  // The policy against both references and both versions of Python: the hand core follows the
  // fixture's torch (NaN at exactly Python's positions under 1.13; under 2.x NaN only where weights
  // are returned, zero weights otherwise), and LibTorch's decomposition follows its own version: gated
  // against the fixture where the two versions agree, reported only (and said so) where they differ.
  struct Expect {
    const char* set;
    const char* name;
    int64_t nan_output;  // NaN elements in Python's stored float64 output
  };
  const std::vector<Expect> expect{
      {"torch-1.13", "mha_all_masked_rows", 32},     {"torch-1.13", "mha_all_masked_rows_no_weights", 32},
      {"torch-1.13", "encoder_all_masked_rows", 80}, {"torch-1.13", "decoder_layer_all_masked_memory", 40},
      {"torch-2.13", "mha_all_masked_rows", 32},     {"torch-2.13", "mha_all_masked_rows_no_weights", 0},
      {"torch-2.13", "encoder_all_masked_rows", 0},  {"torch-2.13", "decoder_layer_all_masked_memory", 0}};
  for (const Expect& e : expect) {
    CAPTURE(e.set, e.name);
    const std::string f = std::string(TPARITY_FIXTURES) + "/" + e.set + "/" + e.name + ".json";
    const Problem p = read_fixture(f);
    const std::vector<CaseReport> rs = check_fixture(p, f, GatePolicy{});
    const bool differs = !semantic_differences(p).empty() && *p.semantics != reference_semantics();
    REQUIRE(rs.size() == (differs ? 1u : 2u));
    for (const CaseReport& r : rs) require_pass(r);
    const ComponentReport* out = nullptr;
    for (const ComponentReport& c : rs[0].components)
      if (c.name == "output") out = &c;
    REQUIRE(out != nullptr);
    for (const char* leg : {"hand64_vs_torch64", "hand32_vs_torch64"}) {
      CAPTURE(leg);
      REQUIRE(out->leg(leg) != nullptr);
      CHECK(out->leg(leg)->m.nan_matched == e.nan_output);
      CHECK(out->leg(leg)->m.nonfinite_mismatch == 0);
    }
    const Leg* lt = out->leg("libtorch64_vs_torch64");
    REQUIRE(lt != nullptr);
    CHECK((lt->role == LegRole::Report) == differs);
    if (!differs) {
      CHECK(lt->m.nan_matched == e.nan_output);
      CHECK(lt->m.nonfinite_mismatch == 0);
    }
  }
}

TEST_CASE("parity: a user implementation through the library API / outputs only / and one that is wrong", "[parity]") {
  // Outputs without components: compared on the outputs, in the module's layout.
  const Implementation outputs_only{"outputs only", [](const Problem& p, DType dtype, const Components*) {
                                      RunResult r = run_hand(p, dtype, false, p.name);
                                      r.components.clear();
                                      return r;
                                    }};
  std::vector<CaseReport> rs = check_cases(outputs_only, {"multihead", "decoder"});
  REQUIRE(rs.size() == 2);
  CHECK(exit_code(rs) == 0);
  CHECK(rs[0].components.size() == 2);  // output, attn_weights
  CHECK(rs[1].components.size() == 1);  // output
  CHECK(rs[0].components[0].name == "output");
  // A wrong one: every output off by one part in 1e6.
  const Implementation off{"off by 1e-6", [](const Problem& p, DType dtype, const Components*) {
                             RunResult r = run_hand(p, dtype, false, p.name);
                             for (auto& [k, t] : r.outputs)
                               for (double& x : t.data) x *= 1 + 1e-6;
                             return r;
                           }};
  rs = check_cases(off, {"single"});
  CHECK(exit_code(rs) == 1);
  CHECK_THAT(rs[0].failures.at(0).text, Catch::StartsWith("case single: component output: leg hand64_vs_torch64"));
  CHECK_THROWS_WITH(check_cases(off, {"nope"}), Catch::Contains("expected case names among single"));
}

namespace {

// A ViT case with its options drawn: channels, patch and image size (d = channels * patch^2 even),
// heads, ffn, layers, head widths and activation, encoder activation, random parameters.
CaseSpec random_vit(uint64_t seed) {
  Rng rng(seed);
  CaseSpec s = test::default_case("vit");
  s.name = "vit_grid_" + std::to_string(seed);
  s.seed = seed;
  do {
    s.channels = rng.integer(1, 3), s.patch = rng.integer(1, 4);
  } while ((s.channels * s.patch * s.patch) % 2);
  s.image_height = s.patch * rng.integer(1, 4), s.image_width = s.patch * rng.integer(1, 4);
  s.dim = s.channels * s.patch * s.patch;
  s.seq = (s.image_height / s.patch) * (s.image_width / s.patch);
  s.heads = divisor_of(rng, s.dim);
  s.ffn = rng.integer(1, 24);
  s.layers = rng.integer(1, 2);
  s.head.resize(size_t(rng.integer(1, 3)));
  for (int64_t& w : s.head) w = rng.integer(1, 12);
  const Activation acts[] = {Activation::Relu,     Activation::Tanh,      Activation::Sigmoid, Activation::Silu,
                             Activation::Softplus, Activation::LeakyRelu, Activation::Gelu};
  s.head_activation = acts[rng.integer(0, 6)];
  s.activation = rng.coin() ? Activation::Gelu : Activation::Relu;
  s.random_params = rng.coin();
  s.batch = rng.integer(1, 3);
  return s;
}

CaseSpec random_token_encoder(uint64_t seed) {
  Rng rng(seed);
  CaseSpec s = test::default_case("embed");
  s.name = "embed_grid_" + std::to_string(seed);
  s.seed = seed;
  s.vocab = rng.integer(1, 50);
  s.dim = std::vector<int64_t>{2, 4, 6, 8, 12, 16}[size_t(rng.integer(0, 5))];
  s.heads = divisor_of(rng, s.dim);
  s.ffn = rng.integer(1, 24);
  s.layers = rng.integer(1, 3);
  s.activation = rng.coin() ? Activation::Gelu : Activation::Relu;
  s.random_params = rng.coin();
  s.batch = rng.integer(1, 3), s.seq = rng.integer(1, 10);
  return s;
}

// torch.matmul operands: a batch of rank 0..3, each operand a suffix of it with some dims 1, or 1-D.
Problem random_matmul(uint64_t seed) {
  Rng rng(seed);
  Problem p;
  p.name = "matmul_grid_" + std::to_string(seed);
  p.module = ModuleKind::Matmul;
  const int64_t M = rng.integer(1, 6), K = rng.integer(1, 40), N = rng.integer(1, 6), R = rng.integer(0, 3);
  Shape batch(static_cast<size_t>(R));
  for (int64_t& d : batch) d = rng.integer(1, 4);
  auto operand = [&](bool vec, int64_t rows, int64_t cols) {
    if (vec) return Shape{K};
    Shape s(batch.begin() + rng.integer(0, R), batch.end());
    for (int64_t& d : s)
      if (rng.coin(0.3)) d = 1;
    s.insert(s.end(), {rows, cols});
    return s;
  };
  p.inputs["input"] = randn(rng, operand(rng.coin(0.15), M, K));
  p.inputs["other"] = randn(rng, operand(rng.coin(0.15), K, N));
  validate(p, p.name);
  return p;
}

// Softmax or LayerNorm on a random shape, its values offset + scale * N(0, 1).
Problem random_row_op(uint64_t seed) {
  Rng rng(seed);
  Problem p;
  p.module = rng.coin() ? ModuleKind::Softmax : ModuleKind::LayerNorm;
  p.name = (p.module == ModuleKind::Softmax ? "softmax_grid_" : "layernorm_grid_") + std::to_string(seed);
  Shape s(size_t(rng.integer(1, 4)));
  for (int64_t& d : s) d = rng.integer(1, 5);
  s.back() = rng.integer(1, 40);
  const double scale = std::vector<double>{1, 8, 30}[size_t(rng.integer(0, 2))];
  const double offset = std::vector<double>{0, 0, 100, -1000}[size_t(rng.integer(0, 3))];
  DTensor x = randn(rng, s);
  for (double& v : x.data) v = round_to_float(offset + scale * v);
  p.inputs["input"] = x;
  if (p.module == ModuleKind::LayerNorm) {
    p.normalized = s.back();
    p.eps = std::vector<double>{1e-5, 1e-3}[size_t(rng.integer(0, 1))];
    // A one-element row normalises to exactly 0: LibTorch's x * rstd - mean * rstd returns rounding
    // noise there (1e-14 in float64), against which no relative measure means anything; the bias
    // gives such a row a value.
    p.affine = s.back() == 1 || rng.coin(0.7);
    if (p.affine) {
      DTensor w = randn(rng, {s.back()}, 0.2);
      for (double& v : w.data) v = round_to_float(1 + v);
      p.state_dict["weight"] = w;
      p.state_dict["bias"] = randn(rng, {s.back()}, 0.2);
    }
  }
  validate(p, p.name);
  return p;
}

}  // namespace

TEST_CASE("parity: a seeded grid of ViTs / patch sizes and head widths and activations", "[parity]") {
  for (uint64_t seed = 3000; seed < 3060; ++seed) {
    const CaseSpec s = random_vit(seed);
    CAPTURE(seed, s.describe());
    require_pass(evaluate_problem(make_problem(s), s.describe(), seed, GatePolicy{}));
  }
}

TEST_CASE("parity: a seeded grid of token encoders", "[parity]") {
  for (uint64_t seed = 4000; seed < 4040; ++seed) {
    const CaseSpec s = random_token_encoder(seed);
    CAPTURE(seed, s.describe());
    require_pass(evaluate_problem(make_problem(s), s.describe(), seed, GatePolicy{}));
  }
}

TEST_CASE("parity: a seeded grid of matmul broadcast shapes / 1-sized dims and 1-D operands", "[parity]") {
  for (uint64_t seed = 5000; seed < 5150; ++seed) {
    const Problem p = random_matmul(seed);
    CAPTURE(seed, summary(p));
    require_pass(evaluate_problem(p, summary(p), seed, GatePolicy{}));
  }
}

TEST_CASE("parity: softmax and layer norm over a seeded grid of shapes and offsets", "[parity]") {
  for (uint64_t seed = 6000; seed < 6100; ++seed) {
    const Problem p = random_row_op(seed);
    CAPTURE(seed, summary(p));
    require_pass(evaluate_problem(p, summary(p), seed, GatePolicy{}));
  }
}

namespace {

// A case's problem with its float inputs transformed (every value kept float32-representable, so
// both precisions still see the same numbers).
Problem with_inputs(const CaseSpec& s, const std::function<double(double)>& f, const std::vector<std::string>& names) {
  Problem p = make_problem(s);
  for (const std::string& n : names)
    for (double& x : p.inputs.at(n).data) x = round_to_float(f(x));
  return p;
}

const ComponentReport& component(const CaseReport& r, const std::string& name) {
  for (const ComponentReport& c : r.components)
    if (c.name == name) return c;
  FAIL("no component " << name << " in case " << r.name);
  return r.components.front();
}

CaseSpec mha(const char* name, int64_t B, int64_t L, int64_t S, int64_t E, int64_t H, MaskKind mask) {
  CaseSpec s;
  s.name = name, s.module = ModuleKind::MultiheadAttention, s.batch = B, s.seq = L, s.kv_seq = S, s.dim = E;
  s.heads = H, s.bias = true, s.mask = mask, s.random_params = true, s.seed = 77;
  return s;
}

}  // namespace

namespace {

// The hand core's float64 component `name` on problem p.
Tensor<double> hand_component(const Problem& p, const std::string& name) {
  for (const Component& c : run_hand(p, DType::Float64, true, p.name).components)
    if (c.name == name) return c.value;
  FAIL("no component " << name);
  return {};
}

// A careless implementation as a user would hand it in: only the output, computed in T by `f` from
// the problem's "input" (rows of the last dim), with the LayerNorm's weight and bias when present.
Implementation careless(const std::string& name,
                        const std::function<void(std::vector<float>&, int64_t, int64_t, const Problem&)>& f32) {
  return {name, [f32](const Problem& p, DType dt, const Components*) {
            const DTensor& in = p.inputs.at("input");
            const int64_t C = in.shape.back(), N = int64_t(in.data.size()) / C;
            if (dt == DType::Float64) return run_hand(p, dt, false, p.name);  // careless in float32 only
            std::vector<float> x(in.data.begin(), in.data.end());
            f32(x, N, C, p);
            DTensor out{DType::Float32, in.shape, Storage<double>(x.begin(), x.end())};
            RunResult r;
            r.outputs["output"] = out;
            return r;
          }};
}

}  // namespace

TEST_CASE("parity: inputs that break careless code / saturating and near-tied scores", "[parity][edge]") {
  // |score| ~ 2e4: exp overflows unless the row's maximum is subtracted; the weights are then one-hot
  // up to exp(-large). Near-tied: scores within 1e-6 of each other, weights ~1/S, where a softmax that
  // rounds its sum badly drifts. Without biases, so that the scaled query decides the scores alone.
  CaseSpec s = mha("saturating", 3, 12, 0, 16, 2, MaskKind::Causal);
  s.bias = false, s.random_params = false;
  const Problem hp = with_inputs(s, [](double x) { return 8192 * x; }, {"query", "key", "value"});
  const CaseReport hot = evaluate_problem(hp, "saturating", 77, GatePolicy{});
  require_pass(hot);
  const Tensor<double> scores = hand_component(hp, "scores"), weights = hand_component(hp, "attn_weights");
  double max_score = 0;
  for (double x : scores.data)
    if (std::isfinite(x)) max_score = std::max(max_score, std::fabs(x));
  CHECK(max_score > 1e4);  // the scores really are that large
  const int64_t S = weights.shape.back(), rows = int64_t(weights.data.size()) / S;
  int64_t one_hot = 0;
  for (int64_t r = 0; r < rows; ++r) {
    double m = 0;
    for (int64_t j = 0; j < S; ++j) m = std::max(m, weights.data[size_t(r * S + j)]);
    one_hot += m > 1 - 1e-6;
  }
  CHECK(one_hot > rows * 9 / 10);  // saturated: almost every row puts all its weight on one key
  for (const char* leg : {"hand64_vs_torch64", "hand32_vs_torch64"})
    CHECK(component(hot, "attn_weights").leg(leg)->m.nonfinite_mismatch == 0);  // no overflow to inf or NaN

  const Problem tp = with_inputs(s, [](double x) { return x * 0x1p-24; }, {"query", "key", "value"});
  require_pass(evaluate_problem(tp, "near-tied", 77, GatePolicy{}));
  const Tensor<double> tied = hand_component(tp, "scores");
  double spread = 0;
  for (double x : tied.data)
    if (std::isfinite(x)) spread = std::max(spread, std::fabs(x));
  CHECK(spread < 1e-6);  // every finite score within 1e-6 of 0, so of each other
}

TEST_CASE("parity: inputs that break careless code / layer-norm rows of tiny variance / denormals", "[parity][edge]") {
  // Rows around 100 with a spread of 1e-3 (a variance of 1e-6, a tenth of eps): E[x^2] - E[x]^2
  // cancels to nothing in float32 there; the hand core's two-pass mean and centred variance do not,
  // and a layer norm computed that careless way fails the same gate.
  CaseSpec ln;
  ln.name = "layernorm_tiny_var", ln.module = ModuleKind::LayerNorm, ln.batch = 4, ln.seq = 30, ln.dim = 64;
  ln.input_offset = 100, ln.input_scale = 1e-3, ln.seed = 78;
  const Problem lp = make_problem(ln);
  require_pass(evaluate_problem(lp, ln.describe(), ln.seed, GatePolicy{}));
  const Implementation naive_ln =
      careless("E[x^2] - E[x]^2 layer norm", [](std::vector<float>& x, int64_t N, int64_t C, const Problem& p) {
        const DTensor &w = p.state_dict.at("weight"), &b = p.state_dict.at("bias");
        for (int64_t n = 0; n < N; ++n) {
          float s = 0, s2 = 0;
          for (int64_t c = 0; c < C; ++c) s += x[size_t(n * C + c)], s2 += x[size_t(n * C + c)] * x[size_t(n * C + c)];
          const float mean = s / float(C), var = s2 / float(C) - mean * mean;
          for (int64_t c = 0; c < C; ++c) {
            float& v = x[size_t(n * C + c)];
            v = (v - mean) / std::sqrt(var + 1e-5f) * float(w.data[size_t(c)]) + float(b.data[size_t(c)]);
          }
        }
      });
  CHECK_FALSE(evaluate_problem(lp, ln.describe(), ln.seed, GatePolicy{}, naive_ln).pass);

  // Subnormal float32 inputs (~1e-40) through an attention and an encoder layer, with torch's init
  // (no attention biases): q, k, v and the context are subnormal, the scores underflow to zero, every
  // row of weights is uniform; the encoder's norms then divide by sqrt(eps). Each component is held
  // to LibTorch's gates, so a core that flushed subnormals to zero (FTZ / DAZ) would fail at q: it
  // does, below, with the flags set around the hand core's run.
  CaseSpec mh = mha("mha_denormal", 2, 7, 0, 16, 4, MaskKind::None);
  mh.bias = false, mh.random_params = false;
  const Problem mp = with_inputs(mh, [](double x) { return x * 0x1p-135; }, {"query", "key", "value"});
  const Tensor<double> q = hand_component(mp, "q");
  int64_t subnormal = 0;
  for (double x : q.data) subnormal += x != 0 && std::fabs(x) < 0x1p-126;
  CHECK(subnormal == int64_t(q.data.size()));  // every projected query element is subnormal
  require_pass(evaluate_problem(mp, "denormal", 80, GatePolicy{}));
#if defined(__x86_64__)
  const Implementation flushing{"hand core with FTZ and DAZ",
                                [](const Problem& p, DType dt, const Components* t) {
                                  const unsigned csr = _mm_getcsr();
                                  _mm_setcsr(csr | 0x8040);  // flush to zero, denormals are zero
                                  RunResult r = run_hand(p, dt, true, p.name, t);
                                  _mm_setcsr(csr);
                                  return r;
                                },
                                true};
  const CaseReport flushed = evaluate_problem(mp, "denormal, flushed", 80, GatePolicy{}, flushing);
  CHECK_FALSE(flushed.pass);
  CHECK(flushed.first_divergence == "q");
#endif
  CaseSpec enc;
  enc.name = "encoder_denormal", enc.module = ModuleKind::TransformerEncoderLayer, enc.batch = 2, enc.seq = 9;
  enc.dim = 16, enc.heads = 2, enc.ffn = 32, enc.seed = 79;
  const Problem dp = with_inputs(enc, [](double x) { return x * 0x1p-133; }, {"src"});
  subnormal = 0;
  for (double x : hand_component(dp, "sa.context").data) subnormal += x != 0 && std::fabs(x) < 0x1p-126;
  CHECK(subnormal > 200);
  require_pass(evaluate_problem(dp, "denormal src", 79, GatePolicy{}));
}

TEST_CASE("parity: inputs that break careless code / long rows of 4096 keys", "[parity][edge]") {
  // Rows of S = 4096 keys: the sums of the softmax and of the weighted values run over 4096 terms,
  // where one running float sum loses digits that partial sums keep; a softmax summed that way
  // fails the gate that the core passes.
  const CaseSpec s = mha("long_rows", 1, 6, 4096, 32, 2, MaskKind::Random);
  require_pass(evaluate_problem(make_problem(s), s.describe(), s.seed, GatePolicy{}));
  CaseSpec sm;
  sm.name = "softmax_long", sm.module = ModuleKind::Softmax, sm.batch = 2, sm.seq = 3, sm.kv_seq = 4096;
  sm.dim = 1, sm.input_scale = 0.25, sm.seed = 81;
  const Problem sp = make_problem(sm);
  require_pass(evaluate_problem(sp, sm.describe(), sm.seed, GatePolicy{}));
  const Implementation running_sum =
      careless("softmax with one running sum", [](std::vector<float>& x, int64_t N, int64_t C, const Problem&) {
        for (int64_t n = 0; n < N; ++n) {
          float* r = x.data() + n * C;
          const float m = *std::max_element(r, r + C);
          float total = 0;
          for (int64_t c = 0; c < C; ++c) total += (r[c] = std::exp(r[c] - m));
          for (int64_t c = 0; c < C; ++c) r[c] /= total;
        }
      });
  CHECK_FALSE(evaluate_problem(sp, sm.describe(), sm.seed, GatePolicy{}, running_sum).pass);
}

TEST_CASE("parity: inputs that break careless code / all-masked rows / a key padding mask leaving one key",
          "[parity][edge]") {
  // Queries 0 and 5 have every key masked by the bool attn_mask: NaN in LibTorch and in the core,
  // matched position by position. Batch element 1 keeps only key 3 through its key padding mask:
  // every other row of it puts weight exactly 1 on that key, in both.
  const CaseSpec s = mha("masked", 2, 8, 0, 16, 2, MaskKind::None);
  Problem p = make_problem(s);
  const int64_t L = 8;
  DTensor am{DType::Bool, {L, L}, Storage<double>(size_t(L * L), 0.0)};
  for (int64_t j = 0; j < L; ++j) am.data[size_t(0 * L + j)] = am.data[size_t(5 * L + j)] = 1;
  am.data[size_t(2 * L + 3)] = 1;  // and one row of batch 1 masks its only key too
  DTensor kpm{DType::Bool, {2, L}, Storage<double>(size_t(2 * L), 0.0)};
  for (int64_t j = 0; j < L; ++j) kpm.data[size_t(L + j)] = j != 3;
  p.inputs["attn_mask"] = am;
  p.inputs["key_padding_mask"] = kpm;
  p.forward.average_attn_weights = false;
  const CaseReport r = evaluate_problem(p, "all-masked rows", s.seed, GatePolicy{});
  require_pass(r);
  // NaN rows: batch 0 queries 0 and 5; batch 1 queries 0, 2 and 5 (every key masked there); per head.
  const int64_t nan_rows = (2 + 3) * 2;
  CHECK(component(r, "attn_weights").leg("hand32_vs_torch64")->m.nan_matched == nan_rows * L);
  CHECK(component(r, "attn_weights").leg("hand64_vs_torch64")->m.nonfinite_mismatch == 0);
  CHECK(component(r, "output").leg("hand64_vs_torch64")->m.nan_matched == (2 + 3) * 16);
  const RunResult h = run_hand(p, DType::Float32, false, "masked");
  const DTensor& w = h.outputs.at("attn_weights");  // (B, H, L, S)
  for (int64_t hd = 0; hd < 2; ++hd)
    for (int64_t i : {1, 3, 4, 6, 7})
      for (int64_t j = 0; j < L; ++j) CHECK(w.data[size_t(((1 * 2 + hd) * L + i) * L + j)] == (j == 3 ? 1.0 : 0.0));
}

TEST_CASE("parity: the float32 gate catches a uniform relative error above its threshold / not below it", "[parity]") {
  // The detection threshold `tparity selftest --thresholds` reports: eps = sqrt(bound^2 - rel_l2^2),
  // the perturbation adding to the core's own float32 error in quadrature. Every element of the
  // block's norm1 (320,000 of them) times 1 + eps' r (r = +-1 at random, a relative error of exactly
  // eps'): caught at 1.25 eps, not at 0.75 eps.
  CaseSpec s;
  for (const CaseSpec& c : default_cases())
    if (c.name == "block") s = c;
  const Problem p = make_problem(s);
  const CaseReport clean = evaluate_problem(p, s.describe(), s.seed, GatePolicy{});
  require_pass(clean);
  const Leg* h = nullptr;
  for (const ComponentReport& c : clean.components)
    if (c.name == "norm1") h = c.leg("hand32_vs_torch64");
  REQUIRE(h);
  const double eps = std::sqrt(h->bound * h->bound - h->m.rel_l2 * h->m.rel_l2);
  CAPTURE(h->m.rel_l2, h->bound, eps, h->noise.rms);
  auto perturbed = [&](double e) {
    return Implementation{"perturbed norm1",
                          [e](const Problem& q, DType dtype, const Components* teacher) {
                            RunResult r = run_hand(q, dtype, true, q.name, teacher);
                            if (dtype != DType::Float32 || teacher) return r;
                            Rng rng(42);
                            for (Component& c : r.components)
                              if (c.name == "norm1")
                                for (double& x : c.value.data) x *= 1 + e * (rng.coin() ? 1 : -1);
                            return r;
                          },
                          true};
  };
  const CaseReport above = evaluate_problem(p, s.describe(), s.seed, GatePolicy{}, perturbed(1.25 * eps));
  CHECK_FALSE(above.pass);
  REQUIRE_FALSE(above.failures.empty());
  CHECK_THAT(above.failures.front().text, Catch::Contains("component norm1: leg hand32_vs_torch64"));
  CHECK(above.failures.front().component == "norm1");
  const CaseReport below = evaluate_problem(p, s.describe(), s.seed, GatePolicy{}, perturbed(0.75 * eps));
  CHECK(below.pass);
}

TEST_CASE("parity: the numeric defects fail the float32 gate alone / the float64 semantics stay exact", "[parity]") {
  // A numeric defect spoils float32 only: every failure is a float32 leg's, the float64 legs pass.
  std::map<std::string, CaseSpec> cases;
  for (const CaseSpec& c : default_cases()) cases[c.name] = c;
  for (const CaseSpec& c : stress_cases()) cases[c.name] = c;
  for (const auto& [defect, name] : std::vector<std::pair<Defect, std::string>>{{Defect::Bf16Accumulate, "single"},
                                                                                {Defect::Fp16Accumulate, "block"},
                                                                                {Defect::SoftmaxNoMax, "softmax_hot"},
                                                                                {Defect::SingleRunningSum, "long_keys"},
                                                                                {Defect::NaiveVariance, "layernorm"}}) {
    CAPTURE(defect_name(defect), name);
    const CaseSpec& s = cases.at(name);
    const ScopedDefect scoped(defect);
    const CaseReport r = evaluate_problem(make_problem(s), s.describe(), s.seed, GatePolicy{});
    CHECK_FALSE(r.pass);
    REQUIRE_FALSE(r.failures.empty());
    for (const Failure& f : r.failures) {
      CAPTURE(f.text);
      CHECK(f.leg == "hand32_vs_torch64");
    }
    for (const ComponentReport& c : r.components) CHECK(c.leg("hand64_vs_torch64")->pass);
  }
}

TEST_CASE(
    "parity: a reference memo reuses LibTorch's run of the same problem only / a changed weight, input, "
    "config or forward option is run again",
    "[parity][long]") {
  const CaseSpec s = test::default_case("block");
  const Problem p = make_problem(s);
  // Each of these changes what LibTorch computes. Were a memo to serve the first problem's runs (or the
  // noise legs measured on them) for one, hand64 (which sees the change) would differ from torch64 far
  // beyond the semantic gate's 1e-10, and the report would differ from the one made without a memo.
  std::vector<std::pair<std::string, Problem>> changes;
  changes.emplace_back("a weight", p);
  changes.back().second.state_dict.begin()->second.data[0] += 0.25;
  changes.emplace_back("an input", p);
  changes.back().second.inputs.begin()->second.data[1] += 0.25;
  changes.emplace_back("the config", p);
  changes.back().second.encoder.layer_norm_eps = 0.5;
  // MultiheadAttention's forward options are not in its config: with and without weights.
  const CaseSpec m = test::default_case("multihead");
  const Problem mha = make_problem(m);
  changes.emplace_back("need_weights", mha);
  changes.back().second.forward.need_weights = false;
  changes.emplace_back("average_attn_weights", mha);
  changes.back().second.forward.average_attn_weights = false;
  // The reports without a memo, to hold the memo's to.
  auto report = [&](const Problem& q) {
    return to_json(evaluate_problem(q, s.describe(), s.seed, GatePolicy{})).dump();
  };
  const std::string plain = report(p), plain_mha = report(mha);
  std::vector<std::string> plain_changes;
  for (const auto& [what, q] : changes) plain_changes.push_back(report(q));
  // One problem judged three ways: as it is, with fewer noise samples, and through an implementation
  // that gives its outputs alone (the noise legs of the outputs' view). None may take another's runs or
  // legs. The single case's components are small: the noise model runs its jittered samples there.
  const CaseSpec one = test::default_case("single");
  const Problem single = make_problem(one);
  GatePolicy fewer;
  fewer.noise_samples = 2;
  Implementation outputs_only = hand_core();
  outputs_only.name = "the hand core's outputs alone";
  outputs_only.teacher_forcing = false;
  outputs_only.run = [](const Problem& q, DType dtype, const Components*) {
    RunResult r = hand_core().run(q, dtype, nullptr);
    r.components.clear();
    return r;
  };
  auto judged = [&](const GatePolicy& policy, const Implementation& impl) {
    return to_json(evaluate_problem(single, one.describe(), one.seed, policy, impl)).dump();
  };
  const std::string plain_single = judged(GatePolicy{}, hand_core()), plain_fewer = judged(fewer, hand_core()),
                    plain_outputs = judged(GatePolicy{}, outputs_only);
  CHECK(plain_fewer != plain_single);  // the sample count shows in the report

  const ReferenceMemo memo;
  CHECK_THROWS_AS(ReferenceMemo(), std::logic_error);  // one at a time
  const CaseReport first = evaluate_problem(p, s.describe(), s.seed, GatePolicy{});
  require_pass(first);
  CHECK(to_json(first).dump() == plain);
  const size_t made = memo.runs();
  CHECK(made >= 2);  // torch64, torch32 and any noise samples
  CHECK(memo.hits() == 0);
  // The same problem again: every run from the memo, the same report figure for figure.
  CHECK(report(p) == plain);
  CHECK(memo.runs() == made);
  CHECK(memo.hits() == made);
  CHECK(report(mha) == plain_mha);
  CHECK(judged(GatePolicy{}, hand_core()) == plain_single);
  CHECK(judged(fewer, hand_core()) == plain_fewer);
  CHECK(judged(GatePolicy{}, outputs_only) == plain_outputs);
  for (size_t i = 0; i < changes.size(); ++i) {
    INFO(changes[i].first);
    const size_t before = memo.runs();
    CHECK(report(changes[i].second) == plain_changes[i]);
    CHECK(memo.runs() >= before + 2);  // at least torch64 and torch32 run again
  }
}
