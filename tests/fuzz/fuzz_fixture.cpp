// libFuzzer target over the readers of tparity's JSON files and what runs on what they accept:
// parse_fixture on the bytes as a fixture or problem file (every module kind's config reader, the LLM
// blocks' and the book classes' among them), and the hand core run on every problem it accepts, in
// float64 and float32 (eval on fuzzed problems, their largest tensor held to 2^16 elements so that a
// run stays fast); tensor_from_json on the JSON values in them (the top level, its members and theirs),
// so that the tensor decoder is reached past whatever else a mutated fixture gets wrong;
// parse_outputs on the bytes as an outputs file; parse_baseline on them as a baseline.
// Bad input must come back as tparity::InputError. Anything else is a finding: another exception
// type (it escapes, std::terminate aborts), a crash, an ASan/UBSan/LeakSanitizer report, a hang, or
// a broken round trip: what the reader accepts, written back (fixture_to_json, tensor_to_json,
// baseline_to_json) and read again, must give the same document, tensor or entries bit for bit.
// Built by scripts/fuzz (-DTPARITY_FUZZ=ON, cmake/Fuzz.cmake); seeds in tests/fuzz/corpus.
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <string>

#include "tparity/compare/baseline.hpp"
#include "tparity/fixture/fixture.hpp"
#include "tparity/fixture/outputs.hpp"
#include "tparity/harness/hand.hpp"
#include "tparity/harness/io.hpp"

namespace {

const char* const kWhere = "fuzz.json";

[[noreturn]] void finding(const std::string& what) {
  std::fprintf(stderr, "fuzz_fixture: %s\n", what.c_str());
  std::abort();
}

bool same_bits(const tparity::DTensor& a, const tparity::DTensor& b) {
  return a.dtype == b.dtype && a.shape == b.shape && a.data.size() == b.data.size() &&
         (a.data.empty() || std::memcmp(a.data.data(), b.data.data(), a.data.size() * sizeof(double)) == 0);
}

void decode_tensor(const nlohmann::json& j) {
  tparity::DTensor t;
  try {
    t = tparity::tensor_from_json(j, kWhere, "tensor");
  } catch (const tparity::InputError&) {
    return;
  }
  const nlohmann::json back = tparity::tensor_to_json(t);
  tparity::DTensor again;
  try {
    again = tparity::tensor_from_json(nlohmann::json::parse(back.dump()), kWhere, "tensor");
  } catch (const tparity::InputError& e) {
    finding(std::string("tensor_to_json wrote a tensor tensor_from_json refuses: ") + e.what());
  }
  if (!same_bits(t, again)) finding("tensor round trip changed the tensor: " + back.dump());
}

// The hand core on an accepted problem: a problem whose inputs disagree with its config is refused
// with an InputError like any other bad input; nothing else may come out.
void evaluate(const tparity::Problem& p) {
  for (tparity::DType d : {tparity::DType::Float64, tparity::DType::Float32}) {
    try {
      (void)tparity::run_hand(p, d, true, kWhere);
    } catch (const tparity::InputError&) {
      return;
    }
  }
}

void parse_problem(const std::string& text) {
  tparity::Problem p;
  try {
    p = tparity::parse_fixture(text, kWhere);
  } catch (const tparity::InputError&) {
    return;
  }
  evaluate(p);
  const std::string written = tparity::fixture_to_json(p).dump();
  std::string rewritten;
  try {
    rewritten = tparity::fixture_to_json(tparity::parse_fixture(written, kWhere)).dump();
  } catch (const tparity::InputError& e) {
    finding(std::string("fixture_to_json wrote a fixture parse_fixture refuses: ") + e.what());
  }
  if (rewritten != written) finding("fixture round trip changed the document:\n" + written + "\n" + rewritten);
}

void parse_other_files(const std::string& text) {
  try {
    (void)tparity::parse_outputs(text, kWhere);
  } catch (const tparity::InputError&) {
  }
  tparity::Baseline b;
  try {
    b = tparity::parse_baseline(text, kWhere);
  } catch (const tparity::InputError&) {
    return;
  }
  const std::string written = tparity::baseline_to_json(b).dump();
  tparity::Baseline again;
  try {
    again = tparity::parse_baseline(written, kWhere);
  } catch (const tparity::InputError& e) {
    finding(std::string("baseline_to_json wrote a baseline parse_baseline refuses: ") + e.what());
  }
  if (again.entries != b.entries || again.environment != b.environment) finding("baseline round trip changed it");
}

}  // namespace

extern "C" int LLVMFuzzerInitialize(int*, char***) {
  tparity::set_max_elements(int64_t(1) << 16);  // problems the hand core runs in a blink
  return 0;
}

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  const std::string text(reinterpret_cast<const char*>(data), size);
  parse_problem(text);
  parse_other_files(text);

  // The tensor decoder on the values a fixture holds its tensors at (state_dict.<name>): the top
  // level, its members, and their members.
  nlohmann::json doc;
  try {
    doc = tparity::parse_json(text, kWhere);
  } catch (const tparity::InputError&) {
    return 0;
  }
  decode_tensor(doc);
  if (!doc.is_object()) return 0;
  for (const auto& member : doc) {
    decode_tensor(member);
    if (member.is_object())
      for (const auto& inner : member) decode_tensor(inner);
  }
  return 0;
}
