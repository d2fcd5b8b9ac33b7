// The any-language protocol through the CLI: export, exec and judge, with stand-in programs
// (tests/exec/program.py, Python's standard library only) that behave well or in every bad way.
#include <catch2/catch.hpp>
#include <nlohmann/json.hpp>
#include <string>
#include <utility>
#include <vector>

#include "cli_support.hpp"

using namespace clitest;
using nlohmann::json;

TEST_CASE("exec: a program as good as the reference passes / one that spoils the scores fails there first",
          "[cli][torch]") {
  if (!with_torch()) return;
  Result r = cli("exec --case multihead --batch 2 --seq 6 --format json " + program("echo"));
  CHECK(r.code == 0);
  const json doc = json::parse(r.out);
  REQUIRE(doc.at("cases").size() == 2);
  for (const json& c : doc.at("cases")) CHECK(c.at("pass") == true);
  // Its own local components (each op on the reference's inputs) are judged too.
  CHECK(doc.at("cases").at(0).at("components").at(3).at("legs").contains("local_hand64_vs_torch64"));
  // Every score (and local score) 0.1% off: the float64 gate fails, at scores first, not downstream.
  r = cli("exec --case multihead --batch 2 --seq 6 " + program("bad-scores"));
  CHECK(r.code == 1);
  CHECK_THAT(r.out, Catch::Contains("first divergence: component scores: leg local_hand64_vs_torch64"));
  // Outputs alone are judged on the outputs; one precision alone on its own legs, and it is said.
  r = cli("exec --full --case sdpa " + program("echo-no-comp"));
  CHECK(r.code == 0);
  CHECK_THAT(r.out, Catch::Contains("returns no components: its outputs are compared"));
  r = cli("exec --full --case sdpa --dtype float32 " + program("echo"));
  CHECK(r.code == 0);
  CHECK_THAT(r.out, Catch::Contains("gave no float64 run: the semantic legs (hand64_vs_torch64) are not judged"));
  // Components are the program's choice: the one it gives is judged, the others named, none fails
  // (a fused attention has no scores or weights to give).
  r = cli("exec --case multihead --batch 2 --seq 6 --format json " + program("partial"));
  CHECK(r.code == 0);
  const json partial = json::parse(r.out);
  REQUIRE(partial.at("cases").size() == 2);
  const json& first = partial.at("cases").at(0);
  CHECK(first.at("pass") == true);
  REQUIRE(first.at("components").size() == 3);  // q, and the module's output and weights
  CHECK(first.at("components").at(0).at("name") == "q");
  CHECK(first.at("components").at(0).at("legs").contains("hand64_vs_torch64"));
  CHECK_THAT(first.at("notes").dump(),
             Catch::Contains("gave no k, v, scores, attn_weights_avg, context: not judged (components are optional"));
  // And the one it gives is judged: 0.1% off, it fails there.
  r = cli("exec --case multihead --batch 2 --seq 6 " + program("partial-bad-q"));
  CHECK(r.code == 1);
  CHECK_THAT(r.out, Catch::Contains("FAIL case multihead: component q: leg hand64_vs_torch64"));
}

TEST_CASE(
    "exec: a float32 value in float64 code is diagnosed a precision slip, fails by default, is accepted on request",
    "[cli][torch]") {
  if (!with_torch()) return;
  // The stand-in's float64 scores and everything after them rounded to float32: the float64 leg fails at
  // float32's rounding level, first at scores; its float32 run is the reference's own.
  Result r = cli("exec --case multihead --batch 2 --seq 6 " + program("slip"));
  CHECK(r.code == 1);
  CHECK_THAT(r.out, Catch::Contains("\nFAIL  multihead  first divergence scores (hand64: "));
  CHECK_THAT(r.out, Catch::Contains("\n  diagnosis: scores: hand64_vs_torch64: precision slip: float64 differs at "));
  CHECK_THAT(r.out, Catch::Contains("the size of a float32 value inside the float64 computation: a constant, a table "
                                    "or a cast"));
  CHECK_THAT(r.out, Catch::Contains("every float32 leg passes"));
  r = cli("exec --case multihead --batch 2 --seq 6 --format json " + program("slip"));
  const json slip = json::parse(r.out).at("cases").at(0);
  REQUIRE(slip.at("diagnoses").size() == 1);
  CHECK(slip.at("diagnoses").at(0).at("kind") == "precision-slip");
  CHECK(slip.at("diagnoses").at(0).at("component") == "scores");
  CHECK(slip.at("summary").get<std::string>().rfind("FAIL  multihead  first divergence scores", 0) == 0);
  // Accepted on request: the failures become notes, the case passes.
  r = cli("exec --accept precision-slip --case multihead --batch 2 --seq 6 " + program("slip"));
  CHECK(r.code == 0);
  CHECK_THAT(r.out, Catch::Contains("\nPASS  multihead  precision slip accepted at scores; worst: "));
  // Not when float32 fails too, nor for a semantic failure far above float32's rounding.
  r = cli("exec --accept precision-slip --case multihead --batch 2 --seq 6 " + program("slip-coarse"));
  CHECK(r.code == 1);
  CHECK_THAT(r.out, !Catch::Contains("precision slip"));
  r = cli("exec --accept precision-slip --case multihead --batch 2 --seq 6 " + program("bad-scores"));
  CHECK(r.code == 1);
  CHECK_THAT(r.out, !Catch::Contains("precision slip"));
  // Anything else to accept is bad usage.
  r = cli("exec --accept everything --case multihead " + program("echo"));
  CHECK(r.code == 2);
  CHECK(one_line(r.err));
  CHECK_THAT(r.err, Catch::Contains("--accept"));
}

TEST_CASE("exec: NaN where the reference gives a query that sees no key uniform weights is named", "[cli][torch]") {
  if (!with_torch()) return;
  // llama_layer's left padding: its padded queries see no key, and transformers gives them uniform weights;
  // the stand-in gives NaN there.
  const std::string fixture = std::string(TPARITY_SOURCE) + "/fixtures/torch-2.13/llama_layer.json";
  Result r = cli("exec --fixture " + fixture + " " + program("nan-masked"));
  CHECK(r.code == 1);
  CHECK_THAT(r.out, Catch::Contains("\n  diagnosis: attn.attn_weights: hand64_vs_torch64: "));
  CHECK_THAT(r.out, Catch::Contains("are NaN in yours where the reference's are finite, first row ["));
  CHECK_THAT(r.out, Catch::Contains("the reference gives uniform weights, yours NaN"));
  r = cli("exec --format json --fixture " + fixture + " " + program("nan-masked"));
  const json c = json::parse(r.out).at("cases").at(0);
  REQUIRE(c.at("diagnoses").size() >= 1);
  CHECK(c.at("diagnoses").at(0).at("kind") == "nonfinite-rows");
  CHECK(c.at("diagnoses").at(0).at("component") == "attn.attn_weights");
}

TEST_CASE("exec: bfloat16 and float16 runs are judged against LibTorch's own error in them / 1.13 has no float16",
          "[cli][torch]") {
  if (!with_torch()) return;
  const bool torch113 = cli("--version").out.find("LibTorch 1.") != std::string::npos;
  // The stand-in writes the reference's float64 results as bfloat16: read rounded to bfloat16, one
  // rounding of the result, well inside LibTorch's own bfloat16 error (its weights and inputs rounded).
  const fs::path keep = scratch() / "keep-lowp";
  fs::remove_all(keep);
  Result r = cli("exec --case multihead --batch 2 --seq 6 --dtype bfloat16 --format json --keep " + keep.string() +
                     " " + program("echo"));
  CHECK(r.code == 0);
  json doc = json::parse(r.out);
  REQUIRE(doc.at("cases").size() == 1);
  const json& c = doc.at("cases").at(0);
  CHECK(c.at("name") == "multihead/bfloat16");
  CHECK(c.at("pass") == true);
  CHECK(c.at("components").at(0).at("legs").contains("handbf16_vs_torch64"));
  CHECK(c.at("components").at(0).at("legs").contains("torchbf16_vs_torch64"));
  // judge reads the same file.
  r = cli("judge --problem " + (keep / "multihead.json").string() + " --outputs " +
              (keep / "multihead.bfloat16.out.json").string());
  CHECK(r.code == 0);
  CHECK_THAT(r.out, Catch::Contains("\nPASS  multihead/bfloat16  worst: "));
  CHECK_THAT(r.out, Catch::Contains("LibTorch's own bfloat16 error (handbf16)"));
  // Values kept to 4 significant bits (an error of ~2^-5, far beyond bfloat16's own): fails there.
  r = cli("exec --case multihead --batch 2 --seq 6 --dtype bfloat16 " + program("coarse"));
  CHECK(r.code == 1);
  CHECK_THAT(r.out, Catch::Contains("FAIL case multihead/bfloat16: component q: leg handbf16_vs_torch64: rel_l2 "));
  // float16: LibTorch 2.x computes it on the CPU; 1.13 has no float16 matmul there, and exec says so
  // before it runs the program.
  r = cli("exec --case multihead --batch 2 --seq 6 --dtype float16 " + program("echo"));
  if (torch113) {
    CHECK(r.code == 2);
    CHECK(one_line(r.err));
    CHECK_THAT(r.err, Catch::StartsWith("tparity: option --dtype float16: LibTorch 1.13"));
    CHECK_THAT(r.err, Catch::Contains("cannot compute float16 on the CPU"));
    CHECK_THAT(r.err, Catch::Contains("not implemented for 'Half'"));
  } else {
    CHECK(r.code == 0);
    CHECK_THAT(r.out, Catch::Contains("\nPASS  multihead/float16  worst: "));
  }
}

TEST_CASE("exec: a bad program gets one line per case naming what went wrong / and the run goes on",
          "[cli][torch][long]") {
  if (!with_torch()) return;
  const std::vector<std::pair<std::string, std::string>> bad = {
      {"crash", "the program exited with code 3"},
      {"segv", "the program was killed by signal 11"},
      {"hang", "the program timed out after 2 s and was killed"},
      {"silent", "the program exited 0 but wrote no outputs file"},
      {"malformed", "malformed JSON"},
      {"wrong-shape", "outputs.output: expected shape [2, 5, 4] (the reference's), got"},
      {"wrong-name",
       "components.qq: not a component of ScaledDotProductAttention (expected one of: scores, "
       "attn_weights, output)"},
      {"wrong-dtype", "dtype: expected \"float64\" (the precision asked for), got \"float32\""},
  };
  for (const auto& [mode, line] : bad) {
    CAPTURE(mode);
    const Result r = cli("exec --case sdpa --case matmul --timeout 2 " + program(mode));
    CHECK(r.code == 1);
    // One line per case on stderr, the case and the precision first; both cases reached.
    CHECK_THAT(r.err, Catch::Contains("case sdpa (float64): ") && Catch::Contains(line));
    CHECK_THAT(r.err, Catch::Contains("case matmul (float64): "));
    CHECK_THAT(r.out, Catch::Contains("2 case(s): 0 passed, 2 failed"));
  }
  // A module the program declines is skipped, said so, and fails nothing; a run in which the program
  // declined every case judged nothing, and a CI gate on it must not pass.
  Result r = cli("exec --case sdpa --case matmul " + program("echo-unless-sdpa"));
  CHECK(r.code == 0);
  CHECK_THAT(r.out, Catch::Contains("skipped sdpa: the program does not implement it: a stand-in implements nothing"));
  CHECK_THAT(r.out, Catch::Contains("case(s): 2 passed, 0 failed"));  // matmul and matmul/components
  r = cli("exec --case sdpa " + program("unsupported"));
  CHECK(r.code == 2);
  CHECK(one_line(r.err));
  CHECK_THAT(r.err, Catch::Contains("nothing was judged: the program declined every case (1 skipped)"));
  CHECK_THAT(r.out, Catch::Contains("skipped sdpa: the program does not implement it: a stand-in implements nothing"));
}

TEST_CASE("exec: usage errors exit 2 with one line", "[cli]") {
  for (const auto& [args, mention] : std::vector<std::pair<std::string, std::string>>{
           {"exec --case sdpa", "no program given (expected -- CMD ARGS... after the options)"},
           {"exec --case sdpa --timeout 0 " + program("echo"), "option --timeout: expected a finite number of seconds > 0, got 0"},
           {"exec --case sdpa --timeout inf " + program("echo"), "option --timeout: expected a finite number of seconds > 0, got inf"},
           {"exec --case sdpa --factor inf " + program("echo"), "option --factor: expected a finite number >= 1, got inf"},
           {"exec --case sdpa -- python3 " + kProgram + " echo", "never names {problem}"},
           {"exec --case nope " + program("echo"), "option --case: expected one of"},
           {"exec --case sdpa --update-baseline " + program("echo"), "--update-baseline: needs --baseline FILE"},
           {"judge --problem /nonexistent.json --outputs /nonexistent.out.json", "/nonexistent.json: cannot open"},
       }) {
    CAPTURE(args);
    const Result r = cli(args);
    if (!with_torch() && args.rfind("exec", 0) == 0 && r.code == 2 && r.err.find("LibTorch") != std::string::npos)
      continue;
    CHECK(r.code == 2);
    CHECK(one_line(r.err));
    CHECK_THAT(r.err, Catch::Contains(mention));
  }
}

TEST_CASE("export: problem files that check passes / judge reads what a program wrote elsewhere",
          "[cli][torch][long]") {
  if (!with_torch()) return;
  for (const char* tensors : {"inline", "safetensors"}) {
    CAPTURE(tensors);
    const fs::path dir = scratch() / (std::string("export_") + tensors);
    fs::remove_all(dir);
    Result r = cli(std::string("export --case sdpa --case embed --case selfattn_v1 --tensors ") + tensors +
                       " --out " + dir.string());
    REQUIRE(r.code == 0);
    CHECK(fs::exists(dir / "embed.json"));
    CHECK(fs::exists(dir / "embed.safetensors") == (std::string(tensors) == "safetensors"));
    // The hand core against the exported reference: every case and component passes.
    r = cli("check --fixture " + (dir / "sdpa.json").string() + " --fixture " + (dir / "embed.json").string() +
                " --fixture " + (dir / "selfattn_v1.json").string());
    CHECK(r.code == 0);
    const json doc = json::parse(slurp(dir / "embed.json"));
    CHECK(doc.at("version") == 2);
    CHECK(doc.at("components").contains("layers.5.output"));
    CHECK(doc.at("reference").at("name").get<std::string>().rfind("LibTorch's decomposition", 0) == 0);
  }
  // judge: the program's files kept by exec --keep, judged again without running anything.
  const fs::path keep = scratch() / "keep";
  fs::remove_all(keep);
  REQUIRE(cli("exec --case sdpa --keep " + keep.string() + " " + program("echo")).code == 0);
  const std::string problem = (keep / "sdpa.json").string();
  Result r = cli("judge --problem " + problem + " --outputs " + (keep / "sdpa.float64.out.json").string() +
                     " --outputs " + (keep / "sdpa.float32.out.json").string() + " --format json");
  CHECK(r.code == 0);
  CHECK(json::parse(r.out).at("cases").at(0).at("pass") == true);
  r = cli("judge --problem " + problem + " --outputs " + (keep / "sdpa.float64.out.json").string() + " --outputs " +
              (keep / "sdpa.float64.out.json").string());
  CHECK(r.code == 2);
  CHECK_THAT(r.err, Catch::Contains("option --outputs: two files of dtype float64"));
}

TEST_CASE("exec: the program after -- is its own, whatever option came before it", "[cli][torch]") {
  // CLI11 ends a vector option (--case, --dtype) at "--" and then went on reading options: the
  // program's own "-c" was refused as tparity's.
  for (const std::string& before : {"--case softmax", "--case softmax --dtype float64"}) {
    const Result r = cli("exec " + before + " -- python3 -c 'import sys; sys.exit(3)' {problem}");
    CAPTURE(before, r.err);
    CHECK(r.code == 1);
    CHECK(r.err.find("the program exited with code 3") != std::string::npos);
  }
  const Result none = cli("exec --case softmax --");
  CHECK(none.code == 2);
  CHECK(none.err == "tparity: tparity exec: no program given (expected -- CMD ARGS... after the options)\n");
}
