// Cases shaped to the code under test (issue 25): the LLM blocks' options as case options, the
// refusal of any option a case would ignore, --without FEATURE and the reports' not_checked.
#include <catch2/catch.hpp>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "cli_support.hpp"

using namespace clitest;
using nlohmann::json;

namespace {

// The exported problem file of one case, with the given options.
json exported(const std::string& name, const std::string& options) {
  const fs::path dir = scratch() / ("export_" + name);
  fs::remove_all(dir);
  const Result r = cli("export --case " + name + " --no-components " + options + " --out " + dir.string());
  CAPTURE(options, r.err);
  REQUIRE(r.code == 0);
  return json::parse(slurp(dir / (name + ".json")));
}

// A (B, T) bool input as rows of 0/1, whatever the file's spelling of booleans.
std::vector<std::vector<int>> rows(const json& t) {
  const int64_t B = t.at("shape").at(0), T = t.at("shape").at(1);
  std::vector<std::vector<int>> out(static_cast<size_t>(B), std::vector<int>(static_cast<size_t>(T)));
  const json& data = t.at("data");
  for (int64_t b = 0; b < B; ++b)
    for (int64_t i = 0; i < T; ++i) {
      const json& v = data.at(size_t(b * T + i));
      out[size_t(b)][size_t(i)] = v.is_boolean() ? int(v.get<bool>()) : int(v.get<double>() != 0);
    }
  return out;
}

}  // namespace

TEST_CASE("case options: each LLM option reshapes the exported problem", "[cli][torch]") {
  if (!with_torch()) return;
  // llama's defaults: head_dim 24, kv heads 2, two decode steps, positions offset by 3, no padding.
  const json base = exported("llama", "");
  CHECK(base.at("config").at("head_dim") == 24);
  CHECK(base.at("config").at("decode_steps") == 2);
  CHECK(base.at("inputs").contains("position_ids"));
  CHECK_FALSE(base.at("inputs").contains("key_padding_mask"));

  const json p = exported("llama",
                          "--head-dim 16 --kv-heads 4 --decode-steps 0 --positions-offset none --padding left "
                          "--rope interleaved --rotary-fraction 0.5 --eps 0.001 --bias on");
  const json& c = p.at("config");
  CHECK(c.at("head_dim") == 16);
  CHECK(c.at("num_key_value_heads") == 4);
  CHECK(c.at("decode_steps") == 0);
  CHECK(c.at("rope_convention") == "interleaved");
  CHECK(c.at("partial_rotary_factor") == 0.5);
  CHECK(c.at("rms_norm_eps") == 0.001);
  CHECK(c.at("attention_bias") == true);
  CHECK(p.at("state_dict").contains("self_attn.q_proj.bias"));
  CHECK(p.at("state_dict").at("self_attn.q_proj.weight").at("shape") == json::array({64, 64}));  // 4 heads x 16
  CHECK_FALSE(p.at("inputs").contains("position_ids"));
  // Left padding: element b's first (3b + 1) % ceil(T/2) tokens, T = 9: 1 and 4.
  REQUIRE(p.at("inputs").contains("key_padding_mask"));
  const auto left = rows(p.at("inputs").at("key_padding_mask"));
  CHECK(left == std::vector<std::vector<int>>{{1, 0, 0, 0, 0, 0, 0, 0, 0}, {1, 1, 1, 1, 0, 0, 0, 0, 0}});
  CHECK_THAT(p.at("description").get<std::string>(),
             Catch::Contains("head_dim=16") && Catch::Contains("rope=interleaved") && Catch::Contains("rotary=0.5") &&
                 Catch::Contains("attention_bias") && Catch::Contains("mask=causal+left-padding") &&
                 !Catch::Contains("positions+") && !Catch::Contains("decode="));

  // A position offset and right padding; decode steps kept with right padding.
  const json q = exported("llama", "--positions-offset 100 --padding right --decode-steps 1");
  CHECK(q.at("config").at("decode_steps") == 1);
  const json& pos = q.at("inputs").at("position_ids");
  CHECK(pos.at("data").at(0) == 100);
  CHECK(pos.at("data").at(9) == 105);  // element 1: offset + 5
  CHECK(rows(q.at("inputs").at("key_padding_mask")) ==
        std::vector<std::vector<int>>{{0, 0, 0, 0, 0, 0, 0, 0, 1}, {0, 0, 0, 0, 0, 1, 1, 1, 1}});

  // gpt2: --padding none drops the key padding, --eps is its layer_norm_epsilon; right is its default.
  const json g = exported("gpt2", "--padding none --eps 1e-3");
  CHECK_FALSE(g.at("inputs").contains("key_padding_mask"));
  CHECK(g.at("config").at("layer_norm_epsilon") == 0.001);
  CHECK(exported("gpt2", "--padding right").at("inputs") == exported("gpt2", "").at("inputs"));
}

TEST_CASE("case options: an option the case would ignore or cannot honour exits 2 naming it", "[cli]") {
  struct Refusal {
    const char* args;
    const char* option;
  };
  const Refusal refusals[] = {
      {"--case gpt2 --rope half", "option --rope: case gpt2"},
      {"--case multihead --rope half", "option --rope: case multihead"},
      {"--case mistral --rope interleaved", "option --rope: case mistral"},
      {"--case gpt2 --rotary-fraction 0.5", "option --rotary-fraction: case gpt2"},
      {"--case multihead --decode-steps 1", "option --decode-steps: case multihead"},
      {"--case gpt2 --head-dim 16", "option --head-dim: case gpt2"},
      {"--case gpt2 --positions-offset 3", "option --positions-offset: case gpt2"},
      {"--case multihead --ffn 64", "option --ffn: case multihead"},
      {"--case sdpa --bias on", "option --bias: case sdpa"},
      {"--case gpt2 --bias off", "option --bias: case gpt2"},
      {"--case block --bias off", "option --bias: case block"},
      {"--case mistral --bias on", "option --bias: case mistral"},
      {"--case gpt2 --kv-heads 2", "option --kv-heads: case gpt2"},
      {"--case sdpa --activation gelu", "option --activation: case sdpa"},
      {"--case llama --activation gelu", "option --activation: case llama"},
      {"--case multihead --value-dim 8", "option --value-dim: case multihead"},
      {"--case llama --random-params", "option --random-params: case llama"},
      {"--case matmul --seq 4", "option --seq: case matmul"},
      {"--case softmax --dim 4", "option --dim: case softmax"},
      {"--case layernorm --heads 2", "option --heads: case layernorm"},
      {"--case multihead --eps 1e-5", "option --eps: case multihead"},
      {"--case multihead --padding left", "option --padding: case multihead"},
      {"--case multihead --positions-offset 3", "option --positions-offset: case multihead"},
      // values
      {"--case llama --decode-steps 9", "option --decode-steps: case llama: expected fewer than its 9 tokens"},
      {"--case llama --seq 2", "option --decode-steps: case llama: expected fewer than its 2 tokens"},
      {"--case llama --kv-heads 3", "option --kv-heads: case llama: expected a divisor of heads 4, got 3"},
      {"--case llama --heads 3", "option --kv-heads: case llama: expected a divisor of heads 3, got 2"},
      {"--case llama --head-dim 15", "option --head-dim: case llama: head_dim 15"},
      {"--case llama --rotary-fraction 0.3", "option --rotary-fraction: case llama: head_dim 24 x rotary fraction 0.3"},
      {"--case llama --rotary-fraction 0", "option --rotary-fraction: expected a fraction in (0, 1]"},
      {"--case llama --rotary-fraction 1.5", "option --rotary-fraction: expected a fraction in (0, 1]"},
      {"--case llama --eps 0", "option --eps: expected a positive finite number"},
      {"--case llama --eps -1e-5", "option --eps: expected a positive finite number"},
      {"--case llama --eps inf", "option --eps: expected a positive finite number"},
      {"--case llama --positions-offset -3", "option --positions-offset: expected none or a whole number from 0 to 2^30"},
      {"--case llama --positions-offset 3x", "option --positions-offset: expected none or a whole number from 0 to 2^30"},
      // std::stoll skipped the space, and -5 slipped past the sign check as "no position_ids"
      {"--case llama --positions-offset ' -5'", "option --positions-offset: expected none or a whole number"},
      {"--case llama --padding left", "option --padding: case llama: left padding with 2 decode steps"},
      {"--case llama --padding right --mask causal", "option --padding: case llama"},
      {"--case gpt2 --without bias", "option --without: nothing was run: no chosen case has a variant without bias"},
      {"--case llama --without nonsense", "option --without: expected features among padding, positions, decode"},
  };
  for (const Refusal& x : refusals) {
    CAPTURE(x.args);
    const Result r = cli(std::string("run ") + x.args);
    CAPTURE(r.err);
    CHECK(r.code == 2);
    CHECK(one_line(r.err));
    CHECK_THAT(r.err, Catch::Contains(x.option));
  }
  // The same refusals on export and exec, where the case options are taken too.
  const std::string out = (scratch() / "refused").string();
  for (const std::string& command :
       {"export --case gpt2 --rope half --out " + out, "exec --case gpt2 --rope half " + program("echo")}) {
    CAPTURE(command);
    const Result r = cli(command);
    CHECK(r.code == 2);
    CHECK(one_line(r.err));
    if (with_torch()) CHECK_THAT(r.err, Catch::Contains("option --rope: case gpt2"));
  }
}

TEST_CASE("cases without features: each case runs its variant without the features, and the report says so",
          "[cli][torch]") {
  if (!with_torch()) return;
  Result r = cli("run --case gpt2 --case llama --without padding,decode --format json");
  CAPTURE(r.err);
  CHECK(r.code == 0);
  json doc = json::parse(r.out);
  REQUIRE(doc.at("cases").size() == 2);
  const json& gpt2 = doc.at("cases").at(0);
  const json& llama = doc.at("cases").at(1);
  CHECK(gpt2.at("not_checked") == json::array({"padding"}));  // gpt2 had no decode steps
  CHECK(llama.at("not_checked") == json::array({"decode"}));  // llama had no padding
  CHECK_THAT(gpt2.at("description").get<std::string>(), Catch::Contains("mask=causal") && !Catch::Contains("padding"));
  CHECK_THAT(llama.at("description").get<std::string>(), !Catch::Contains("decode"));
  for (const json& c : llama.at("components")) CHECK(c.at("name").get<std::string>().rfind("step.", 0) != 0);
  // Without features it never had: nothing not checked.
  r = cli("run --case multihead --without decode,positions --format json");
  CHECK(r.code == 0);
  CHECK(json::parse(r.out).at("cases").at(0).at("not_checked") == json::array());
  // The table: one line.
  r = cli("run --case gpt2 --without padding --without positions");
  CHECK(r.code == 0);
  CHECK_THAT(r.out, Catch::Contains("\n  not checked: padding\n"));
  // Several features on llama, in the table's order whatever the order given.
  r = cli("run --case llama --without gqa,head-dim,positions,decode --format json");
  CHECK(r.code == 0);
  doc = json::parse(r.out);
  CHECK(doc.at("cases").at(0).at("not_checked") == json::array({"positions", "decode", "head-dim", "gqa"}));
  CHECK_THAT(doc.at("cases").at(0).at("description").get<std::string>(),
             Catch::Contains("kv_heads=4 head_dim=16") && !Catch::Contains("positions+"));
  // No variant: GPT-2 always has biases, so it is skipped with the reason; llama runs.
  r = cli("run --case gpt2 --case llama --without bias --format json");
  CHECK(r.code == 0);
  doc = json::parse(r.out);
  REQUIRE(doc.at("cases").size() == 1);
  CHECK(doc.at("cases").at(0).at("name") == "llama");
  CHECK(doc.at("cases").at(0).at("not_checked") == json::array());  // llama has no attention bias
  REQUIRE(doc.at("skipped").size() == 1);
  CHECK(doc.at("skipped").at(0).at("name") == "gpt2");
  CHECK_THAT(doc.at("skipped").at(0).at("reason").get<std::string>(),
             Catch::Contains("without bias") && Catch::Contains("always has biases"));
}

TEST_CASE("cases without features on exec and fixtures / a decode judged on its outputs alone is not checked",
          "[cli][torch]") {
  if (!with_torch()) return;
  // exec: the variant without padding, and not_checked in the report.
  Result r = cli("exec --case gpt2 --without padding --format json " + program("echo"));
  CAPTURE(r.err);
  CHECK(r.code == 0);
  json doc = json::parse(r.out);
  CHECK(doc.at("cases").at(0).at("not_checked") == json::array({"padding"}));
  // A program that gives its outputs only: llama's two decode steps go unchecked, and it is said.
  r = cli("exec --case llama --format json " + program("echo-no-comp"));
  CHECK(r.code == 0);
  doc = json::parse(r.out);
  CHECK(doc.at("cases").at(0).at("not_checked") == json::array({"decode"}));
  CHECK_THAT(doc.at("cases").at(0).at("notes").dump(),
             Catch::Contains("decode not checked") && Catch::Contains("one full forward"));
  r = cli("exec --case llama " + program("echo-no-comp"));
  CHECK_THAT(r.out, Catch::Contains("\n  not checked: decode\n"));
  // With its step components, the decode is checked; without decode steps there is none to check.
  r = cli("exec --case llama --format json " + program("echo"));
  CHECK(r.code == 0);
  CHECK(json::parse(r.out).at("cases").at(0).at("not_checked") == json::array());
  r = cli("exec --case llama --decode-steps 0 --format json " + program("echo-no-comp"));
  CHECK(r.code == 0);
  CHECK(json::parse(r.out).at("cases").at(0).at("not_checked") == json::array());
  // A fixture cannot be re-shaped: one with a declared feature is skipped, naming it.
  const std::string fixture = std::string(TPARITY_SOURCE) + "/fixtures/torch-2.13/llama_decode.json";
  r = cli("exec --fixture " + fixture + " --fixture " + std::string(TPARITY_SOURCE) +
              "/fixtures/torch-2.13/gpt2_block.json --without decode --format json " + program("echo"));
  CHECK(r.code == 0);
  doc = json::parse(r.out);
  REQUIRE(doc.at("skipped").size() == 1);
  CHECK_THAT(doc.at("skipped").at(0).at("reason").get<std::string>(),
             Catch::Contains("declared without decode") && Catch::Contains("cannot be re-shaped"));
  REQUIRE(doc.at("cases").size() >= 1);
  const fs::path dir = scratch() / "export_fixture_without";
  fs::remove_all(dir);
  r = cli("export --fixture " + fixture + " --without decode --out " + dir.string());
  CHECK(r.code == 0);
  CHECK_THAT(r.err, Catch::Contains("declared without decode"));
  CHECK_FALSE(fs::exists(dir / "llama_decode.json"));
  // MultiheadAttention's kdim and vdim: only fixtures have them.
  const std::string sets = std::string(TPARITY_SOURCE) + "/fixtures/torch-2.13/";
  fs::remove_all(dir);
  r = cli("export --fixture " + sets + "mha_kdim_vdim.json --fixture " + sets +
              "mha_batched.json --without kdim-vdim --no-components --out " + dir.string());
  CHECK(r.code == 0);
  CHECK_THAT(r.err, Catch::Contains("skipped mha_kdim_vdim: declared without kdim-vdim"));
  CHECK_FALSE(fs::exists(dir / "mha_kdim_vdim.json"));
  CHECK(fs::exists(dir / "mha_batched.json"));
}
