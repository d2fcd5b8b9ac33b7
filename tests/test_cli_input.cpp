// Bad input, as a user meets it through `tparity eval`, `tparity check` and the library API: one line
// on stderr (or one exception) naming the file and field, what was expected and what came; exit code
// 2; no crash; no output file. And NaN or infinities in weights and inputs: allowed, reported, never
// silently compared equal.
#include <catch2/catch.hpp>
#include <cmath>
#include <functional>
#include <nlohmann/json.hpp>

#include "cli_support.hpp"
#include "tparity/api.hpp"
#include "tparity/eval/evaluate.hpp"

using nlohmann::json;
using namespace clitest;

namespace {

struct BadInput {
  std::string what;  // the defect, for CAPTURE
  std::string base;  // the committed fixture it starts from
  std::function<void(json&)> mutate;
  std::string mention;  // what the one line must say after "<file>: "
};

json fixture(const std::string& name) { return json::parse(slurp(kFixtures + "/" + name + ".json")); }

// A tensor of the given shape and dtype filled with `value`.
json tensor(const std::vector<int64_t>& shape, const std::string& dtype, double value) {
  int64_t n = 1;
  for (int64_t d : shape) n *= d;
  json data = json::array();
  for (int64_t i = 0; i < n; ++i) dtype == "bool" ? data.push_back(value != 0) : data.push_back(value);
  return {{"dtype", dtype}, {"shape", shape}, {"data", data}};
}

const std::vector<BadInput>& bad_inputs() {
  static const std::vector<BadInput> cases = {
      {"wrong format name", "mha_no_weights", [](json& j) { j["format"] = "tparity.fixtures"; },
       "format: expected \"tparity.fixture\", got \"tparity.fixtures\""},
      {"wrong version", "mha_no_weights", [](json& j) { j["version"] = 3; }, "version: expected 1 or 2, got 3"},
      {"unknown module", "mha_no_weights", [](json& j) { j["module"] = "Transformer"; },
       "module: expected one of \"MultiheadAttention\""},
      {"state_dict entry missing", "mha_no_weights", [](json& j) { j["state_dict"].erase("out_proj.weight"); },
       "state_dict.out_proj.weight: missing (expected shape [16, 16])"},
      {"state_dict entry extra", "mha_no_weights",
       [](json& j) {
         j["state_dict"]["bias_k"] = tensor({1, 1, 16}, "float32", 0);
       },
       "state_dict.bias_k: unexpected entry"},
      {"state_dict entry of the wrong shape", "mha_no_weights",
       [](json& j) {
         j["state_dict"]["in_proj_weight"] = tensor({48, 8}, "float32", 0.5);
       },
       "state_dict.in_proj_weight: expected shape [48, 16], got [48, 8]"},
      {"data length not the product of the shape", "mha_no_weights",
       [](json& j) { j["state_dict"]["out_proj.bias"]["data"].erase(0); },
       "state_dict.out_proj.bias.data: expected 16 values (the product of shape [16]), got 15"},
      {"unknown dtype", "mha_no_weights", [](json& j) { j["inputs"]["query"]["dtype"] = "bfloat16"; },
       "inputs.query.dtype: expected \"float32\", \"float64\" or \"bool\", got \"bfloat16\""},
      {"non-numeric data", "mha_no_weights", [](json& j) { j["inputs"]["key"]["data"][7] = "0.5"; },
       "inputs.key.data[7]: expected a number or \"inf\", \"-inf\", \"nan\", got \"0.5\""},
      {"non-numeric data (an object)", "mha_no_weights",
       [](json& j) { j["inputs"]["key"]["data"][7] = json::object(); },
       "inputs.key.data[7]: expected a number, got object"},
      {"a size of zero", "mha_no_weights", [](json& j) { j["config"]["embed_dim"] = 0; },
       "config.embed_dim: expected an integer >= 1, got 0"},
      {"a negative size", "mha_no_weights", [](json& j) { j["inputs"]["query"]["shape"][0] = -2; },
       "inputs.query.shape[0]: expected an integer >= 0, got -2"},
      {"an element count that overflows", "mha_no_weights",
       [](json& j) {
         j["inputs"]["query"]["shape"] = {int64_t(1) << 30, int64_t(1) << 30, int64_t(1) << 30};
       },
       "inputs.query.shape: expected at most 2147483648 elements"},
      {"a size above any tensor's", "mha_no_weights",
       [](json& j) {
         j["inputs"]["query"]["shape"] = {int64_t(1) << 40, int64_t(1) << 40};
       },
       "inputs.query.shape[0]: expected an integer <= 2147483648, got 1099511627776"},
      {"sizes whose product wraps once a 0 comes first", "mha_no_weights",
       [](json& j) {
         j["inputs"]["query"]["shape"] = {0, int64_t(1) << 31, int64_t(1) << 31};
       },
       "inputs.query.shape: expected at most 2147483648 elements (counting its nonzero sizes)"},
      {"num_heads not dividing embed_dim", "mha_no_weights", [](json& j) { j["config"]["num_heads"] = 3; },
       "config.num_heads: expected a divisor of embed_dim 16, got 3"},
      {"query disagreeing with embed_dim", "mha_no_weights",
       [](json& j) {
         j["inputs"]["query"] = tensor({2, 5, 8}, "float64", 0.1);
       },
       "inputs.query: expected last dim embed_dim = 16"},
      {"key disagreeing with kdim", "mha_kdim_vdim",
       [](json& j) {
         j["inputs"]["key"] = tensor({2, 6, 10}, "float64", 0.1);
       },
       "inputs.key: expected last dim kdim = 12"},
      {"value disagreeing with vdim", "mha_kdim_vdim",
       [](json& j) {
         j["inputs"]["value"] = tensor({2, 6, 16}, "float64", 0.1);
       },
       "inputs.value: expected last dim vdim = 20"},
      {"inputs laid out against batch_first", "mha_no_weights", [](json& j) { j["config"]["batch_first"] = false; },
       "inputs.attn_mask: expected shape [2, 2]"},
      {"attn_mask of the wrong shape", "mha_no_weights",
       [](json& j) {
         j["inputs"]["attn_mask"] = tensor({5, 4}, "float64", 0);
       },
       "inputs.attn_mask: expected shape [5, 5]"},
      {"key_padding_mask of the wrong shape", "mha_no_weights",
       [](json& j) {
         j["inputs"]["key_padding_mask"] = tensor({5, 2}, "bool", 0);
       },
       "inputs.key_padding_mask: expected shape [2, 5] (B, S)"},
      {"masks of dtypes torch 1.13 leaves undefined together", "mha_no_weights",
       [](json& j) {
         j["reference"]["torch"] = "1.13.1";  // 2.x adds them
         j["inputs"]["key_padding_mask"] = tensor({2, 5}, "float64", 0);
       },
       "inputs.key_padding_mask: a float key_padding_mask cannot be combined with a float attn_mask under torch "
       "1.13's semantics"},
      {"a mask of dtype bool for a float input", "encoder_block", [](json& j) { j["inputs"]["src"]["dtype"] = "bool"; },
       "inputs.src.data[0]: expected true or false (dtype bool)"},
  };
  return cases;
}

}  // namespace

TEST_CASE("bad input through eval and check: exit 2 / one line naming the file and field / no output file",
          "[cli][input]") {
  const fs::path bad = scratch() / "bad.json", out = scratch() / "out.json";
  for (const BadInput& b : bad_inputs()) {
    CAPTURE(b.what);
    json j = fixture(b.base);
    b.mutate(j);
    std::ofstream(bad) << j.dump();
    const std::string mention = bad.string() + ": " + b.mention;
    fs::remove(out);
    for (const std::string& args :
         {"eval --fixture " + bad.string() + " --out " + out.string(),
          "eval --impl torch --dtype float64 --fixture " + bad.string() + " --out " + out.string(),
          "check --fixture " + bad.string(), "check --format json --fixture " + bad.string()}) {
      CAPTURE(args);
      const Result r = cli(args);
      CHECK(r.code == 2);
      CHECK(one_line(r.err));
      CHECK_THAT(r.err, Catch::Contains(mention));
      CHECK(r.out.empty());  // nothing on stdout: no half-written report either
      CHECK_FALSE(fs::exists(out));
    }
  }
  // Truncated and malformed JSON.
  const std::string text = slurp(kFixtures + "/mha_no_weights.json");
  for (const std::string& broken : {text.substr(0, text.size() / 3), text.substr(0, 1), std::string("{\"format\": 1,}"),
                                    std::string(""), std::string("\x89PNG\r\n")}) {
    std::ofstream(bad, std::ios::binary) << broken;
    for (const std::string& args :
         {"eval --fixture " + bad.string() + " --out " + out.string(), "check --fixture " + bad.string()}) {
      CAPTURE(args, broken.size());
      const Result r = cli(args);
      CHECK(r.code == 2);
      CHECK(one_line(r.err));
      CHECK_THAT(r.err, Catch::Contains(bad.string() + ": malformed JSON"));
      CHECK_FALSE(fs::exists(out));
    }
  }
}

TEST_CASE("bad input through the library API: one InputError naming the file and field", "[input]") {
  const fs::path bad = scratch() / "api_bad.json";
  for (const BadInput& b : bad_inputs()) {
    CAPTURE(b.what);
    json j = fixture(b.base);
    b.mutate(j);
    std::ofstream(bad) << j.dump();
    CHECK_THROWS_MATCHES(tparity::check_fixtures(tparity::hand_core(), {bad.string()}), tparity::InputError,
                         Catch::Matchers::Predicate<tparity::InputError>(
                             [&](const tparity::InputError& e) {
                               const std::string w = e.what();
                               return w.find(bad.string() + ": " + b.mention) != std::string::npos &&
                                      w.find('\n') == std::string::npos;
                             },
                             "names the file and the field in one line"));
  }
  CHECK_THROWS_AS(tparity::check_cases(tparity::hand_core(), {"no-such-case"}), tparity::InputError);
}

TEST_CASE("outputs that cannot be written: exit 2 / one line / nothing left behind", "[cli][input]") {
  const fs::path dir = scratch() / "readonly";
  fs::create_directories(dir);
  const std::string fx = kFixtures + "/mha_no_weights.json";
  for (const std::string& args :
       std::vector<std::string>{"eval --fixture " + fx + " --out /nonexistent-dir/r.json",
                                "eval --fixture " + fx + " --out " + dir.string(),  // a directory
                                "sweep --case single --seq 4 --dim 4 --csv /nonexistent-dir/s.csv"}) {
    CAPTURE(args);
    const Result r = cli(args);
    CHECK(r.code == 2);
    CHECK(one_line(r.err));
    CHECK_THAT(r.err, Catch::Contains("cannot write"));
  }
  // No temporary file left: the writer's is the target's path plus ".tmp<pid>", beside it.
  size_t leftovers = 0;
  for (const fs::path& d : {scratch(), dir})
    for (const auto& e : fs::directory_iterator(d))
      leftovers += e.path().filename().string().find(".tmp") != std::string::npos;
  CHECK(leftovers == 0);
  CHECK(fs::is_directory(dir));  // and the directory named as the output is still a directory
}

TEST_CASE("NaN and inf in weights and inputs: reported, matched NaN counted, never silently equal",
          "[cli][input][torch]") {
  if (!with_torch()) return;
  // A NaN in one query feature and an inf in a weight of mha_single (a float32 fixture of torch's
  // semantics). Against the stored outputs, computed without them, the check fails on the non-finite
  // mismatch; against outputs LibTorch computes from the same poisoned values, NaN meets NaN at the
  // same positions, which counts as agreement and is counted, and the check passes. Both name the
  // poisoned tensors in a note.
  json j = fixture("mha_single");
  j["inputs"]["query"]["data"][3] = "nan";
  j["state_dict"]["out_proj.weight"]["data"][0] = "inf";
  const fs::path poisoned = scratch() / "poisoned.json", out64 = scratch() / "o64.json", out32 = scratch() / "o32.json";
  std::ofstream(poisoned) << j.dump();
  Result r = cli("check --format json --fixture " + poisoned.string());
  CHECK(r.code == 1);
  json doc = json::parse(r.out);
  const json& report = doc.at("cases").at(0);
  CHECK(report.at("pass") == false);
  std::string notes = report.at("notes").dump();
  CHECK_THAT(notes, Catch::Contains("non-finite values in inputs.query: 1 NaN"));
  CHECK_THAT(notes, Catch::Contains("non-finite values in state_dict.out_proj.weight: 1 +inf"));
  CHECK_THAT(report.at("failures").dump(), Catch::Contains("non-finite value(s) differ"));

  REQUIRE(cli("eval --impl torch --dtype float64 --fixture " + poisoned.string() + " --out " + out64.string()).code ==
          0);
  REQUIRE(cli("eval --impl torch --dtype float32 --fixture " + poisoned.string() + " --out " + out32.string()).code ==
          0);
  j["outputs"] = json::parse(slurp(out64)).at("outputs");
  j["outputs_float32"] = json::parse(slurp(out32)).at("outputs");
  std::ofstream(poisoned) << j.dump();
  r = cli("check --format json --fixture " + poisoned.string());
  CHECK(r.code == 0);
  doc = json::parse(r.out);
  const json& output = doc.at("cases").at(0).at("components").at(0);
  REQUIRE(output.at("name") == "output");
  // The query's NaN (row 0; key and value are separate tensors here) poisons row 0 of the scores,
  // weights and output: 64 NaN; the +inf weight feeds column 0 of the other 99 rows: 99 infinities.
  for (const char* name : {"hand64_vs_torch64", "hand32_vs_torch64", "libtorch64_vs_torch64"}) {
    CAPTURE(name);
    const json& leg = output.at("legs").at(name);
    CHECK(leg.at("nan_matched") == 64);
    CHECK(leg.at("inf_matched") == 99);
    CHECK(leg.at("nonfinite_mismatch") == 0);
  }
  CHECK(doc.at("cases").at(0).at("components").at(1).at("legs").at("hand64_vs_torch64").at("nan_matched") == 100);
  CHECK_THAT(doc.at("cases").at(0).at("notes").dump(), Catch::Contains("non-finite values in inputs.query: 1 NaN"));
  r = cli("check --full --fixture " + poisoned.string());
  CHECK_THAT(r.out, Catch::Contains("PASS     nan 64 inf 99"));  // the table's non-finite column counts them
}
