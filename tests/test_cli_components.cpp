// tparity components: every canonical component of a case or fixture by name, shape and layout.
// The names and shapes are checked against what the hand core does not decide: hand-worked shapes of
// the default llama case (docs/cases.md: B=2, T=9 of which 7 prefilled and 2 decoded, 4 heads over 2
// kv heads, head_dim 24, hidden 64, intermediate 172) and the reference's own components as
// `tparity export` writes them.
#include <catch2/catch.hpp>
#include <nlohmann/json.hpp>
#include <set>

#include "cli_support.hpp"
#include "tparity/harness/problem.hpp"

using nlohmann::json;
namespace fs = std::filesystem;
using namespace clitest;

namespace {

json components_json(const std::string& args) {
  const Result r = cli("components --format json " + args);
  INFO(r.err);
  REQUIRE(r.code == 0);
  return json::parse(r.out);
}

const json& component(const json& problem, const std::string& name) {
  for (const json& c : problem.at("components"))
    if (c.at("name") == name) return c;
  FAIL("no component " << name);
  throw;
}

}  // namespace

TEST_CASE("cli: components lists the llama case's components with hand-worked shapes", "[cli]") {
  const json doc = components_json("--case llama");
  REQUIRE(doc.at("problems").size() == 1);
  const json& p = doc.at("problems")[0];
  CHECK(p.at("name") == "llama");
  CHECK(p.at("module") == "LlamaDecoderLayer");
  struct Row {
    std::string name;
    std::vector<int64_t> shape;
    std::string layout_has;
  };
  for (const Row& r : std::vector<Row>{
           {"prefill.input_layernorm", {2, 7, 64}, "RMSNorm of the input"},
           {"prefill.attn.q", {2, 4, 7, 24}, "[B, heads, T, head_dim], q_proj, after the head split, before rotary"},
           {"prefill.attn.k", {2, 2, 7, 24}, "[B, kv_heads, T, head_dim]"},
           {"prefill.attn.scores", {2, 4, 7, 7}, "hold -inf"},
           {"prefill.attn.cache.k", {2, 2, 7, 24}, "the whole key cache after this call's update"},
           {"step.0.attn.q", {2, 4, 1, 24}, "step 0 (T = 1): [B, heads, T, head_dim]"},
           {"step.1.attn.scores", {2, 4, 1, 9}, "[B, heads, T, S]"},
           {"step.1.attn.cache.v", {2, 2, 9, 24}, "value cache"},
           {"step.1.mlp.act", {2, 1, 172}, "silu(gate) * up"},
           {"output", {2, 9, 64}, "concatenated along T"},
       }) {
    CAPTURE(r.name);
    const json& c = component(p, r.name);
    CHECK(c.at("shape").get<std::vector<int64_t>>() == r.shape);
    CHECK_THAT(c.at("layout").get<std::string>(), Catch::Contains(r.layout_has));
  }
  // The prefill and 2 steps, each call 19 components (the decoder layer's 17 and the cache's 2), then output.
  CHECK(p.at("components").size() == 3 * 19 + 1);
  for (const json& c : p.at("components")) CHECK(c.size() == 3);  // name, shape, layout: no more, no fewer
  CHECK(p.size() == 4);
  CHECK(doc.size() == 1);

  // The table says the same in words.
  const Result t = cli("components --case llama");
  CHECK(t.code == 0);
  CHECK_THAT(t.out, Catch::Contains("prefill.attn.q"));
  CHECK_THAT(t.out, Catch::Contains("2x4x7x24"));
  // Options reach the case: one call, no decode prefixes.
  const json one = components_json("--case llama --config decode_steps=0");
  CHECK(component(one.at("problems")[0], "attn.q").at("shape").get<std::vector<int64_t>>() ==
        std::vector<int64_t>{2, 4, 9, 24});
  // Averaged weights only where the module returns them.
  const json mha = components_json("--case multihead");
  CHECK_THAT(component(mha.at("problems")[0], "attn_weights_avg").at("layout").get<std::string>(),
             Catch::Contains("averaged over the heads"));
  CHECK_THAT(component(mha.at("problems")[0], "attn_weights").at("layout").get<std::string>(),
             Catch::Contains("per head"));
}

TEST_CASE("cli: every component of every default case and module kind has a layout", "[cli]") {
  std::string fixtures;
  for (const auto& e : fs::directory_iterator(kFixtures))
    if (e.path().extension() == ".json") fixtures += " --fixture " + e.path().string();
  std::set<std::string> kinds;
  size_t seen = 0;
  for (const std::string& args : {std::string(""), fixtures}) {
    const json doc = components_json(args);
    for (const json& p : doc.at("problems")) {
      kinds.insert(p.at("module").get<std::string>());
      CHECK(!p.at("components").empty());
      for (const json& c : p.at("components")) {
        CAPTURE(p.at("name"), c.at("name"));
        CHECK(!c.at("layout").get<std::string>().empty());
        // The words name the same number of axes as the shape has, where they start with axes.
        const std::string lay = c.at("layout");
        const size_t open = lay.find('['), close = lay.find(']');
        if (open != std::string::npos && close != std::string::npos && lay.find("...") > close) {
          const std::string axes = lay.substr(open, close - open);
          CHECK(size_t(std::count(axes.begin(), axes.end(), ',')) + 1 == c.at("shape").size());
        }
        ++seen;
      }
    }
  }
  CHECK(seen > 500);
  CHECK(kinds.size() == tparity::kModuleKindCount);  // every module kind had a case or a fixture
}

TEST_CASE("cli: components names and shapes are the reference's", "[cli][torch]") {
  if (!with_torch()) return;
  const fs::path dir = scratch() / "components_export";
  fs::remove_all(dir);
  const std::vector<std::string> cases{"llama", "gpt2", "block", "sdpa", "book_mha", "qwen3", "gemma2", "vit"};
  std::string args;
  for (const std::string& c : cases) args += " --case " + c;
  const Result e = cli("export --tensors safetensors --out " + dir.string() + args);
  INFO(e.err);
  REQUIRE(e.code == 0);
  const json doc = components_json(args);
  REQUIRE(doc.at("problems").size() == cases.size());
  for (const json& p : doc.at("problems")) {
    CAPTURE(p.at("name"));
    const json exported = json::parse(slurp(dir / (p.at("name").get<std::string>() + ".json")));
    const json& ref = exported.at("components");
    std::set<std::string> names;
    for (const json& c : p.at("components")) {
      names.insert(c.at("name").get<std::string>());
      CAPTURE(c.at("name"));
      REQUIRE(ref.contains(c.at("name").get<std::string>()));
      CHECK(ref.at(c.at("name").get<std::string>()).at("shape") == c.at("shape"));
    }
    CHECK(names.size() == ref.size());
  }
}

TEST_CASE("cli: components refuses bad usage with one line naming the option", "[cli]") {
  for (const auto& [args, mention] : std::vector<std::pair<std::string, std::string>>{
           {"components --case nope", "--case"},
           {"components --format xml", "--format"},
           {"components --fixture /nonexistent/x.json", "--fixture"},
           {"components --case gpt2 --config nope=1", "--config"},
           {"components --case llama --seq 0", "--seq"},
       }) {
    CAPTURE(args);
    const Result r = cli(args);
    CHECK(r.code == 2);
    CHECK(one_line(r.err));
    CHECK_THAT(r.err, Catch::Contains(mention));
    CHECK(r.out.empty());
  }
}
