// Fixture format v1: the committed fixtures against the hand core (no torch, no Python needed), and
// bad files refused with a message naming the file and the field.
#include <catch2/catch.hpp>
#include <cmath>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <functional>
#include <limits>
#include <set>
#include <sstream>
#include <tuple>

#include "temp_dir.hpp"
#include "tparity/compare/legs.hpp"
#include "tparity/fixture/fixture.hpp"
#include "tparity/fixture/outputs.hpp"
#include "tparity/harness/book.hpp"
#include "tparity/harness/hand.hpp"
#include "tparity/harness/llm.hpp"

using namespace tparity;
namespace fs = std::filesystem;

namespace {

std::string slurp(const std::string& path) {
  std::ifstream in(path);
  std::stringstream ss;
  ss << in.rdbuf();
  return ss.str();
}

Components as_components(const TensorMap& m) {
  Components c;
  for (const auto& [k, v] : m) c.push_back({k, to_tensor<double>(v)});
  return c;
}

std::vector<std::string> committed_fixtures() {
  std::vector<std::string> files;
  for (const auto& e : fs::recursive_directory_iterator(TPARITY_FIXTURES))
    if (e.path().extension() == ".json" && e.path().filename().string().rfind("baseline", 0) != 0)
      files.push_back(e.path().string());
  std::sort(files.begin(), files.end());
  return files;
}

}  // namespace

TEST_CASE("fixtures: the committed set covers what the C++ modules cannot express", "[fixture]") {
  bool norm_first = false, seq_first = false, eps = false, gelu = false, unbatched = false, per_head = false;
  bool kdim_vdim = false, bias_kv_zero_attn = false, mask3d = false, bool_mask = false, float_kpm = false,
       no_weights = false, stack = false, stack_norm = false, decoder = false, decoder_norm_first = false;
  for (const std::string& f : committed_fixtures()) {
    const Problem p = read_fixture(f);
    const bool enc = p.module != ModuleKind::MultiheadAttention;
    norm_first |= enc && p.encoder.norm_first;
    seq_first |= enc ? !p.encoder.batch_first : !p.mha.batch_first;
    eps |= enc && p.encoder.layer_norm_eps != 1e-5;
    gelu |= enc && p.encoder.activation == Activation::Gelu;
    unbatched |= p.inputs.at(expected_inputs(p.module).front().name).shape.size() == 2;
    per_head |= !enc && p.forward.need_weights && !p.forward.average_attn_weights;
    kdim_vdim |= !enc && !p.mha.packed();
    bias_kv_zero_attn |= !enc && p.mha.add_bias_kv && p.mha.add_zero_attn;
    no_weights |= !enc && !p.forward.need_weights;
    stack |= p.module == ModuleKind::TransformerEncoder && p.num_layers > 1;
    stack_norm |= p.module == ModuleKind::TransformerEncoder && p.final_norm;
    decoder |= p.module == ModuleKind::TransformerDecoderLayer;
    decoder_norm_first |= p.module == ModuleKind::TransformerDecoderLayer && p.encoder.norm_first;
    for (const char* m : {"attn_mask", "src_mask", "mask", "tgt_mask", "memory_mask"})
      if (const DTensor* t = p.input(m)) {
        mask3d |= t->shape.size() == 3;
        bool_mask |= t->dtype == DType::Bool;
      }
    for (const char* m :
         {"key_padding_mask", "src_key_padding_mask", "tgt_key_padding_mask", "memory_key_padding_mask"})
      if (const DTensor* t = p.input(m)) float_kpm |= t->dtype != DType::Bool;
  }
  CHECK(norm_first);
  CHECK(seq_first);
  CHECK(eps);
  CHECK(gelu);
  CHECK(unbatched);
  CHECK(per_head);
  CHECK(kdim_vdim);
  CHECK(bias_kv_zero_attn);
  CHECK(mask3d);
  CHECK(bool_mask);
  CHECK(float_kpm);
  CHECK(no_weights);
  CHECK(stack);
  CHECK(stack_norm);
  CHECK(decoder);
  CHECK(decoder_norm_first);
  CHECK(committed_fixtures().size() >= 17);
}

TEST_CASE("fixtures: the hand core reproduces Python PyTorch's stored outputs", "[fixture]") {
  // Semantics in float64 (rel_l2 <= 1e-10); float32 judged by PyTorch's own float32 error, the
  // stored outputs_float32 against the stored float64 outputs. The gates are the comparator's.
  for (const std::string& f : committed_fixtures()) {
    CAPTURE(f);
    const Problem p = read_fixture(f);
    const Components h64 = as_components(run_hand(p, DType::Float64, false, f).outputs);
    const Components h32 = as_components(run_hand(p, DType::Float32, false, f).outputs);
    const Components t64 = as_components(p.outputs), t32 = as_components(p.outputs_float32);
    REQUIRE(p.outputs.at("output").dtype == DType::Float64);
    REQUIRE_FALSE(t32.empty());
    CaseReport r;
    r.name = p.name;
    std::vector<std::string> names{"output"};
    if (p.forward.need_weights && p.module == ModuleKind::MultiheadAttention) names.push_back("attn_weights");
    compare_components(r, names, {{"hand64", &h64}, {"hand32", &h32}, {"torch64", &t64}, {"torch32", &t32}},
                       standard_legs(), GatePolicy{}, {"hand64", "hand32", "torch64", "torch32"});
    for (const Failure& fail : r.failures) UNSCOPED_INFO(fail.text);
    CHECK(r.pass);
    CHECK(r.components.size() == names.size());
  }
}

TEST_CASE("fixtures: writing and reading back gives the same problem / for every committed fixture", "[fixture]") {
  for (const std::string& f : committed_fixtures()) {
    CAPTURE(f);
    const nlohmann::json original = nlohmann::json::parse(slurp(f));
    const Problem p = read_fixture(f);
    const nlohmann::json written = fixture_to_json(p);
    // Every field, every tensor value: doubles round-trip exactly through JSON text.
    CHECK(written == original);
    CHECK(fixture_to_json(parse_fixture(written.dump(), "roundtrip")) == written);
  }
}

TEST_CASE("fixtures: bad files are refused with one message naming the file and the field", "[fixture]") {
  const std::string base_path = std::string(TPARITY_FIXTURES) + "/torch-2.13/mha_no_weights.json";
  const nlohmann::json base = nlohmann::json::parse(slurp(base_path));
  using Mutate = std::function<void(nlohmann::json&)>;
  const std::vector<std::pair<Mutate, std::string>> cases = {
      {[](nlohmann::json& j) { j["format"] = "other"; },
       "bad.json: format: expected \"tparity.fixture\", got \"other\""},
      {[](nlohmann::json& j) { j["version"] = 3; }, "bad.json: version: expected 1 or 2, got 3"},
      {[](nlohmann::json& j) { j["module"] = "Transformer"; },
       "bad.json: module: expected one of \"MultiheadAttention\", \"TransformerEncoderLayer\", \"TransformerEncoder\", "
       "\"TransformerDecoderLayer\", \"ScaledDotProductAttention\", \"TokenEncoder\", \"ViT\", \"Matmul\", "
       "\"Softmax\", "
       "\"LayerNorm\", \"SelfAttention_v1\", \"SelfAttention_v2\", \"CausalAttention\", \"MultiHeadAttentionWrapper\", "
       "\"MultiHeadAttention\", \"LlamaDecoderLayer\", \"LlamaAttention\", \"GPT2Block\", \"MistralDecoderLayer\", "
       "\"Qwen3DecoderLayer\", \"Gemma2DecoderLayer\", got "
       "\"Transformer\""},
      {[](nlohmann::json& j) { j.erase("state_dict"); }, "bad.json: state_dict: missing"},
      {[](nlohmann::json& j) { j["state_dict"].erase("out_proj.weight"); },
       "bad.json: state_dict.out_proj.weight: missing (expected shape [16, 16])"},
      {[](nlohmann::json& j) { j["state_dict"]["bias_k"] = j["state_dict"]["out_proj.bias"]; },
       "bad.json: state_dict.bias_k: unexpected entry"},
      {[](nlohmann::json& j) {
         j["state_dict"]["in_proj_weight"]["shape"] = {48, 8};
         j["state_dict"]["in_proj_weight"]["data"] = std::vector<double>(384, 0.0);
       },
       "bad.json: state_dict.in_proj_weight: expected shape [48, 16], got [48, 8]"},
      {[](nlohmann::json& j) { j["state_dict"]["out_proj.bias"]["data"].erase(0); },
       "bad.json: state_dict.out_proj.bias.data: expected 16 values (the product of shape [16]), got 15"},
      {[](nlohmann::json& j) { j["state_dict"]["out_proj.bias"]["dtype"] = "float16"; },
       "bad.json: state_dict.out_proj.bias.dtype: expected \"float32\", \"float64\" or \"bool\", got \"float16\""},
      {[](nlohmann::json& j) { j["state_dict"]["out_proj.bias"]["dtype"] = "bfloat16"; },  // outputs files' alone
       "bad.json: state_dict.out_proj.bias.dtype: expected \"float32\", \"float64\" or \"bool\", got \"bfloat16\""},
      {[](nlohmann::json& j) { j["state_dict"]["out_proj.bias"]["dtype"] = "int64"; },
       "bad.json: state_dict.out_proj.bias.dtype: expected \"float32\", \"float64\" or \"bool\", got \"int64\""},
      // A problem file (version 2) holds any module; version 1, torch.nn's four.
      {[](nlohmann::json& j) { j["module"] = "ViT"; },
       "bad.json: config.add_bias_kv: unexpected field (expected one of: activation, bn_eps, channels, d_model"},
      {[](nlohmann::json& j) {
         j["module"] = "ViT";
         j["version"] = 1;
         j.erase("reference");
       },
       "bad.json: module: \"ViT\" needs fixture format version 2 (version 1 knows \"MultiheadAttention\", "
       "\"TransformerEncoderLayer\", \"TransformerEncoder\", \"TransformerDecoderLayer\")"},
      {[](nlohmann::json& j) { j["state_dict"]["out_proj.bias"]["data"][3] = "abc"; },
       "bad.json: state_dict.out_proj.bias.data[3]: expected a number or \"inf\", \"-inf\", \"nan\", got \"abc\""},
      {[](nlohmann::json& j) { j["state_dict"]["out_proj.bias"]["data"][3] = nullptr; },
       "bad.json: state_dict.out_proj.bias.data[3]: expected a number, got null"},
      {[](nlohmann::json& j) { j["state_dict"]["out_proj.bias"]["shape"] = {-16}; },
       "bad.json: state_dict.out_proj.bias.shape[0]: expected an integer >= 0, got -16"},
      {[](nlohmann::json& j) {
         j["state_dict"]["out_proj.bias"]["shape"] = {1 << 20, 1 << 20, 1 << 20};
       },
       "bad.json: state_dict.out_proj.bias.shape: expected at most"},
      {[](nlohmann::json& j) { j["config"]["num_heads"] = 3; },
       "bad.json: config.num_heads: expected a divisor of embed_dim 16, got 3"},
      {[](nlohmann::json& j) { j["config"]["num_heads"] = "2"; },
       "bad.json: config.num_heads: expected an integer, got string \"2\""},
      {[](nlohmann::json& j) { j["config"]["dropuot"] = 0; }, "bad.json: config.dropuot: unexpected field"},
      {[](nlohmann::json& j) { j["config"]["dropout"] = 0.1; }, "bad.json: config.dropout: expected 0"},
      {[](nlohmann::json& j) {
         j["inputs"]["query"]["dtype"] = "bool";
         j["inputs"]["query"]["data"] = std::vector<bool>(160, true);
       },
       "bad.json: inputs.query: expected a float32 or float64 tensor, got bool"},
      {[](nlohmann::json& j) { j["inputs"]["src"] = j["inputs"]["query"]; },
       "bad.json: inputs.src: not an argument of MultiheadAttention.forward()"},
      {[](nlohmann::json& j) { j["inputs"].erase("value"); }, "bad.json: inputs.value: missing"},
      {[](nlohmann::json& j) { j["outputs"]["attn_weights"] = j["outputs"]["output"]; },
       "bad.json: outputs.attn_weights: unexpected output (expected output only)"},
      {[](nlohmann::json& j) { j["extra"] = 1; }, "bad.json: extra: unexpected field"},
  };
  for (const auto& [mutate, expect] : cases) {
    nlohmann::json j = base;
    mutate(j);
    CAPTURE(expect);
    CHECK_THROWS_WITH(parse_fixture(j.dump(), "bad.json"), Catch::StartsWith(expect));
  }
  const std::string text = base.dump();
  CHECK_THROWS_WITH(parse_fixture(text.substr(0, text.size() / 2), "bad.json"),
                    Catch::StartsWith("bad.json: malformed JSON: "));
  CHECK_THROWS_WITH(parse_fixture("[1, 2]", "bad.json"),
                    Catch::StartsWith("bad.json: (top level): expected a JSON object, got array"));
  CHECK_THROWS_WITH(read_fixture("/nonexistent/f.json"),
                    Catch::StartsWith("/nonexistent/f.json: cannot open fixture: No such file"));
}

TEST_CASE("fixtures: the book's classes refuse what the class would not take / naming the field", "[fixture]") {
  // SelfAttention_v1 holds (d_in, d_out) matrices used as x @ W: nn.Linear's (d_out, d_in) layout is
  // the classic slip and is refused by shape; the classes' constructor arguments only.
  const nlohmann::json v1 =
      nlohmann::json::parse(slurp(std::string(TPARITY_FIXTURES) + "/torch-2.13/book_selfattn_v1.json"));
  const nlohmann::json mha = nlohmann::json::parse(slurp(std::string(TPARITY_FIXTURES) + "/torch-2.13/book_mha.json"));
  using Mutate = std::function<void(nlohmann::json&)>;
  const std::vector<std::tuple<const nlohmann::json*, Mutate, std::string>> cases = {
      {&v1,
       [](nlohmann::json& j) {
         j["state_dict"]["W_query"]["shape"] = {2, 3};
       },
       "bad.json: state_dict.W_query: expected shape [3, 2], got [2, 3]"},
      {&v1, [](nlohmann::json& j) { j["config"]["num_heads"] = 2; },
       "bad.json: config.num_heads: unexpected key for SelfAttention_v1 (expected one of: d_in, d_out)"},
      {&v1, [](nlohmann::json& j) { j["state_dict"]["W_query.weight"] = j["state_dict"]["W_query"]; },
       "bad.json: state_dict.W_query.weight: unexpected entry for SelfAttention_v1"},
      {&mha, [](nlohmann::json& j) { j["config"]["num_heads"] = 3; },
       "bad.json: config.num_heads: expected a divisor of d_out 4"},
      {&mha, [](nlohmann::json& j) { j["config"]["context_length"] = 4; },
       "bad.json: state_dict.mask: expected shape [4, 4], got [10, 10]"},
      {&mha, [](nlohmann::json& j) { j["config"].erase("context_length"); },
       "bad.json: config.context_length: missing"},
      {&mha, [](nlohmann::json& j) { j["config"]["dropout"] = 0.1; },
       "bad.json: config.dropout: expected 0 (tparity compares eval-mode modules without dropout), got 0.1"},
      {&mha, [](nlohmann::json& j) { j["state_dict"].erase("mask"); }, "bad.json: state_dict.mask: missing"},
  };
  for (const auto& [base, mutate, expect] : cases) {
    nlohmann::json j = *base;
    mutate(j);
    CAPTURE(expect);
    CHECK_THROWS_WITH(parse_fixture(j.dump(), "bad.json"), Catch::StartsWith(expect));
  }
  // More tokens than the causal buffer holds: refused when run, as every input shape is.
  nlohmann::json j = mha;
  j["config"]["context_length"] = 4;
  j["state_dict"]["mask"]["shape"] = {4, 4};
  j["state_dict"]["mask"]["data"] = std::vector<double>(16, 0.0);
  const Problem p = parse_fixture(j.dump(), "bad.json");
  CHECK_THROWS_WITH(run_hand(p, DType::Float64, false, "bad.json"),
                    "bad.json: inputs.x: expected at most context_length = 4 tokens (dim -2), got [2, 6, 3]");
}

// Found by the fuzzer (tests/fuzz, corpus/regress_number_overflow.json): nlohmann::json throws
// out_of_range, not parse_error, for a number beyond double's range, and it escaped the reader.
TEST_CASE("fixtures: a number beyond double's range is malformed JSON, not an escaping exception", "[fixture]") {
  nlohmann::json j = nlohmann::json::parse(slurp(std::string(TPARITY_FIXTURES) + "/torch-2.13/mha_no_weights.json"));
  j["inputs"]["query"]["data"][3] = "number here";
  const std::string text = j.dump();
  const std::string mark = "\"number here\"";
  auto with = [&](const std::string& number) {
    std::string t = text;
    return t.replace(t.find(mark), mark.size(), number);
  };
  for (const char* number : {"1e999", "-1e999", "1.5e400"}) {
    CAPTURE(number);
    CHECK_THROWS_MATCHES(
        parse_fixture(with(number), "bad.json"), InputError,
        Catch::Matchers::Message("bad.json: malformed JSON: number overflow parsing '" + std::string(number) +
                                 "' (expected a finite number; infinities are written \"inf\" "
                                 "and \"-inf\")"));
  }
  // Below double's range is no error: the number rounds to zero, as strtod rounds it.
  CHECK(parse_fixture(with("1e-999"), "ok.json").inputs.at("query").data[3] == 0.0);
  CHECK(parse_fixture(with("-1e-999"), "ok.json").inputs.at("query").data[3] == 0.0);
}

// Found while writing the fuzz target and reproduced with it (corpus/regress_*.json): a size whose
// state_dict shape overflowed int64 (3 x embed_dim, UBSan), a num_layers whose state_dict names ran
// out of memory before any was looked up, and a deeply nested value that overflowed the stack when
// a message showed it (nlohmann::json's dump() recurses once per level).
TEST_CASE("fixtures: sizes, layer counts and nesting that would exhaust the reader are refused", "[fixture]") {
  const nlohmann::json mha =
      nlohmann::json::parse(slurp(std::string(TPARITY_FIXTURES) + "/torch-2.13/mha_no_weights.json"));
  const nlohmann::json stack =
      nlohmann::json::parse(slurp(std::string(TPARITY_FIXTURES) + "/torch-2.13/encoder_stack_norm.json"));
  REQUIRE(stack["config"]["num_layers"] == 3);
  REQUIRE(stack["state_dict"].size() == 38);
  struct Case {
    const nlohmann::json* base;
    const char* field;
    nlohmann::json value;
    std::string expect;
  };
  const std::vector<Case> cases = {
      {&mha, "embed_dim", int64_t(1) << 62,
       "bad.json: config.embed_dim: expected an integer <= 2147483648, got 4611686018427387904"},
      {&mha, "embed_dim", (int64_t(1) << 31) + 1,
       "bad.json: config.embed_dim: expected an integer <= 2147483648, got 2147483649"},
      {&mha, "num_heads", std::numeric_limits<uint64_t>::max(),
       "bad.json: config.num_heads: expected an integer <= 2147483648, got 18446744073709551615"},
      {&mha, "kdim", int64_t(1) << 40, "bad.json: config.kdim: expected an integer <= 2147483648, got 1099511627776"},
      {&stack, "d_model", std::numeric_limits<int64_t>::max(),
       "bad.json: config.d_model: expected an integer <= 2147483648, got 9223372036854775807"},
      {&stack, "num_layers", 1000000000,
       "bad.json: config.num_layers: expected at most 3 (12 state_dict entries per layer, 38 in state_dict), got "
       "1000000000"},
      {&stack, "num_layers", 4,
       "bad.json: config.num_layers: expected at most 3 (12 state_dict entries per layer, 38 in state_dict), got 4"},
  };
  for (const Case& c : cases) {
    nlohmann::json j = *c.base;
    j["config"][c.field] = c.value;
    CAPTURE(c.expect);
    CHECK_THROWS_MATCHES(parse_fixture(j.dump(), "bad.json"), InputError, Catch::Matchers::Message(c.expect));
  }
  // Shape sizes beyond int64 are named as written, not wrapped to negative numbers; no size is above
  // the elements a tensor may hold.
  nlohmann::json j = mha;
  j["state_dict"]["out_proj.bias"]["shape"] = {std::numeric_limits<uint64_t>::max()};
  CHECK_THROWS_MATCHES(parse_fixture(j.dump(), "bad.json"), InputError,
                       Catch::Matchers::Message("bad.json: state_dict.out_proj.bias.shape[0]: expected an integer "
                                                "<= 2147483648, got 18446744073709551615"));

  // 100000 nested arrays where the name goes: refused while parsing, before anything recurses on them.
  j = mha;
  j["name"] = "nested here";
  std::string text = j.dump();
  const std::string mark = "\"nested here\"";
  text.replace(text.find(mark), mark.size(), std::string(100000, '[') + std::string(100000, ']'));
  std::string field = "name";  // the top-level object is the first of the 64 levels
  for (int i = 0; i < 63; ++i) field += "[]";
  CHECK_THROWS_MATCHES(parse_fixture(text, "bad.json"), InputError,
                       Catch::Matchers::Message("bad.json: " + field +
                                                ": expected at most 64 levels of nested arrays and objects, got more"));
  // Four levels deep are shown as such.
  j["name"] = nlohmann::json::parse("[[[[[[1]]]]]]");
  CHECK_THROWS_MATCHES(parse_fixture(j.dump(), "bad.json"), InputError,
                       Catch::Matchers::Message("bad.json: name: expected a string, got array [[[[[...]]]]]"));
  // Shallow values are shown as JSON writes them, cut at 40 characters.
  j = mha;
  j["name"] = {{"a", {1, {2, 3}}}, {"b", nullptr}};
  CHECK_THROWS_WITH(parse_fixture(j.dump(), "bad.json"),
                    "bad.json: name: expected a string, got object {\"a\":[1,[2,3]],\"b\":null}");
  j["name"] = std::vector<int>(100, 7);
  CHECK_THROWS_WITH(parse_fixture(j.dump(), "bad.json"),
                    "bad.json: name: expected a string, got array [7,7,7,7,7,7,7,7,7,7,7,7,7,7,7,7,7,7,...");
}

TEST_CASE("fixtures: inputs whose shapes disagree with the config are refused when run", "[fixture]") {
  nlohmann::json j = nlohmann::json::parse(slurp(std::string(TPARITY_FIXTURES) + "/torch-2.13/mha_no_weights.json"));
  j["inputs"]["attn_mask"]["shape"] = {5, 4};
  j["inputs"]["attn_mask"]["data"] = std::vector<double>(20, 0.0);
  const Problem p = parse_fixture(j.dump(), "bad.json");
  CHECK_THROWS_WITH(run_hand(p, DType::Float32, false, "bad.json"),
                    Catch::StartsWith("bad.json: inputs.attn_mask: expected shape [5, 5]"));
  j = nlohmann::json::parse(slurp(std::string(TPARITY_FIXTURES) + "/torch-2.13/mha_no_weights.json"));
  j["config"]["batch_first"] = false;  // (2, 5, 16) read as (L=2, B=5): the mask no longer fits
  CHECK_THROWS_WITH(run_hand(parse_fixture(j.dump(), "bad.json"), DType::Float32, false, "bad.json"),
                    Catch::StartsWith("bad.json: inputs.attn_mask: expected shape [2, 2]"));
}

TEST_CASE("fixtures: an output that cannot be written leaves nothing behind", "[fixture]") {
  CHECK_THROWS_WITH(write_json_file("/nonexistent-dir/out.json", nlohmann::json::object()),
                    Catch::StartsWith("/nonexistent-dir/out.json: cannot write output: its folder /nonexistent-dir "
                                      "does not exist"));
  const testutil::TempDir dir("tparity_write_test_");  // nothing another run left in it
  const std::string out = (dir.path / "r.json").string();
  write_json_file(out, {{"a", 1}});
  CHECK(nlohmann::json::parse(slurp(out)) == nlohmann::json{{"a", 1}});
  size_t files = 0;
  for (const auto& e : fs::directory_iterator(dir.path)) files += e.is_regular_file();
  CHECK(files == 1);  // no temporary left
}

TEST_CASE("fixtures: a row whose every key is masked is NaN, as Python PyTorch 1.13 gives it", "[fixture]") {
  // The policy (README, "Semantics worth knowing"): torch 1.13's softmax over a row of -inf is NaN,
  // and the hand core keeps it, in the weights, the output and, through the residual and the norms,
  // a whole encoder layer's output. NaN must sit exactly where Python put it; a key left alone by a
  // key padding mask gets weight exactly 1.
  struct Expect {
    const char* name;
    int64_t nan_output;  // NaN elements in Python's stored float64 output
  };
  for (const Expect& e : {Expect{"mha_all_masked_rows", 32}, Expect{"encoder_all_masked_rows", 80}}) {
    CAPTURE(e.name);
    // Exported by torch 1.13, whose semantics give NaN in these rows (2.13 gives zeros without weights).
    const Problem p = read_fixture(std::string(TPARITY_FIXTURES) + "/torch-1.13/" + e.name + ".json");
    const DTensor& stored = p.outputs.at("output");
    int64_t nan_stored = 0;
    for (double x : stored.data) nan_stored += std::isnan(x);
    REQUIRE(nan_stored == e.nan_output);
    for (DType dt : {DType::Float64, DType::Float32}) {
      const RunResult r = run_hand(p, dt, false, e.name);
      const DTensor& out = r.outputs.at("output");
      REQUIRE(out.data.size() == stored.data.size());
      int64_t same_nan = 0, other = 0;
      for (size_t i = 0; i < out.data.size(); ++i) {
        same_nan += std::isnan(out.data[i]) && std::isnan(stored.data[i]);
        other += std::isnan(out.data[i]) != std::isnan(stored.data[i]);
      }
      CHECK(same_nan == e.nan_output);
      CHECK(other == 0);
      if (p.module == ModuleKind::MultiheadAttention) {
        // batch element 1: every key padded but key 4; where its attn_mask row leaves key 4 open,
        // the row's weight on it is exactly 1 and every other weight exactly 0
        const DTensor& w = r.outputs.at("attn_weights");  // (B, H, L, S) = (2, 2, 6, 6)
        const DTensor& am = *p.input("attn_mask");        // (6, 6) bool
        int64_t single_key_rows = 0;
        for (int64_t h = 0; h < 2; ++h)
          for (int64_t i = 0; i < 6; ++i) {
            if (am.data[size_t(i * 6 + 4)] != 0) continue;
            ++single_key_rows;
            for (int64_t j = 0; j < 6; ++j)
              CHECK(w.data[size_t(((1 * 2 + h) * 6 + i) * 6 + j)] == (j == 4 ? 1.0 : 0.0));
          }
        CHECK(single_key_rows >= 2);
      }
    }
  }
}

TEST_CASE("outputs files: a bfloat16 or float16 run's tensors, inline values rounded to the run's precision",
          "[fixture]") {
  auto doc = [](const std::string& dtype, const std::string& tensor_dtype) {
    return R"({"format": "tparity.outputs", "version": 1, "dtype": ")" + dtype +
           R"(", "outputs": {"output": {"dtype": ")" + tensor_dtype +
           R"(", "shape": [4], "data": [1.00390625, 1.005859375, 65519, "inf"]}}})";
  };
  // 1 + 2^-8 is a tie between bfloat16's 1 and 1 + 2^-7: to even, 1; 1 + 1.5 x 2^-8 rounds up.
  const OutputsFile bf = parse_outputs(doc("bfloat16", "bfloat16"), "o.json");
  CHECK(bf.dtype == "bfloat16");
  const DTensor& b = bf.outputs.at("output");
  CHECK(b.dtype == DType::BFloat16);
  CHECK(b.data == std::vector<double>{1.0, 1.0078125, 65536.0, INFINITY});
  // binary16 holds both first values (spacing 2^-10 near 1); 65519 is its largest finite, 65504.
  const OutputsFile hf = parse_outputs(doc("float16", "float16"), "o.json");
  const DTensor& h = hf.outputs.at("output");
  CHECK(h.dtype == DType::Float16);
  CHECK(h.data == std::vector<double>{1.00390625, 1.005859375, 65504.0, INFINITY});
  auto refusal = [](const std::string& text) {
    try {
      parse_outputs(text, "o.json");
    } catch (const InputError& e) {
      return std::string(e.what());
    }
    return std::string("accepted");
  };
  CHECK(refusal(doc("float8", "float32")) ==
        "o.json: dtype: expected \"float32\", \"float64\", \"bfloat16\" or \"float16\", got \"float8\"");
  CHECK(refusal(doc("bfloat16", "int8")) ==
        "o.json: outputs.output.dtype: expected \"float32\", \"float64\", \"bfloat16\", \"float16\" or \"bool\", "
        "got \"int8\"");
}

TEST_CASE("module kinds: one row each / the name read back is the kind / families and fixture formats agree",
          "[fixture]") {
  // What the rows must say, written out here rather than derived from them.
  const std::set<std::string> book{"SelfAttention_v1", "SelfAttention_v2", "CausalAttention",
                                   "MultiHeadAttentionWrapper", "MultiHeadAttention"};
  const std::set<std::string> llm{"LlamaDecoderLayer",   "LlamaAttention",    "GPT2Block",
                                  "MistralDecoderLayer", "Qwen3DecoderLayer", "Gemma2DecoderLayer"};
  // The kinds Python's exporters write are those of the committed fixtures (both torch versions).
  std::set<std::string> exported;
  for (const auto& e : fs::recursive_directory_iterator(TPARITY_FIXTURES))
    if (e.path().extension() == ".json" && e.path().parent_path().filename().string().rfind("torch-", 0) == 0) {
      std::ifstream in(e.path());
      const nlohmann::json doc = nlohmann::json::parse(in);
      if (doc.contains("module")) exported.insert(doc.at("module").get<std::string>());
    }
  REQUIRE(exported.size() >= 10);
  std::set<std::string> names;
  size_t rows = 0;
  for (const ModuleRow& r : module_rows()) {
    CAPTURE(r.name);
    ++rows;
    CHECK(module_from_name(r.name) == r.kind);  // a file's "module" names one kind
    CHECK(names.insert(r.name).second);
    CHECK(book_module(r.kind) == (book.count(r.name) == 1));
    CHECK(llm_module(r.kind) == (llm.count(r.name) == 1));
    CHECK(fixture_module(r.kind) == (exported.count(r.name) == 1));
    // the book's and the LLM kinds are answered by their family's code, which knows every one of them
    CHECK((r.handler == ModuleHandler::Book) == (book.count(r.name) == 1));
    CHECK((r.handler == ModuleHandler::Llm) == (llm.count(r.name) == 1));
    if (llm.count(r.name)) {
      CHECK(llm_row(r.kind).kind == r.kind);
      CHECK(llm_takes(r.kind, "hidden_size"));
      CHECK_FALSE(llm_takes(r.kind, "embed_dim"));
    } else {
      CHECK_THROWS_AS(llm_row(r.kind), std::logic_error);
    }
    if (book.count(r.name)) CHECK_NOTHROW(book_class(r.kind));
  }
  CHECK(rows == kModuleKindCount);
  CHECK_THROWS_AS(module_from_name("Multiheadattention"), std::invalid_argument);  // names are case-sensitive
  CHECK(fixture_v1_module_names() ==
        "\"MultiheadAttention\", \"TransformerEncoderLayer\", \"TransformerEncoder\", \"TransformerDecoderLayer\"");
}
