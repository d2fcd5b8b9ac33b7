// libFuzzer target over the safetensors reader: SafetensorsFile::from_bytes on the bytes as a file,
// then tensor() on every entry it accepted.
// Bad input must come back as tparity::InputError (from tensor(), only for an I64 beyond +-2^53).
// Anything else is a finding: another exception type (it escapes, std::terminate aborts), a crash, an
// ASan/UBSan/LeakSanitizer report, a hang, entries that do not tile the buffer, or a broken round
// trip: the tensors the writer can hold (F32, F64, BOOL, I64), written back with the metadata
// (safetensors_bytes) and read again, must give the same entries and the same tensors bit for bit;
// when every tensor was written back, the same offsets too.
// Built by scripts/fuzz (-DTPARITY_FUZZ=ON, cmake/Fuzz.cmake); seeds in tests/fuzz/corpus_safetensors
// (tests/fuzz/make_safetensors_corpus.py), dictionary tests/fuzz/safetensors.dict.
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <optional>
#include <string>
#include <vector>

#include "tparity/fixture/safetensors.hpp"

namespace {

using tparity::DTensor;
using tparity::SafetensorsFile;
using tparity::StDType;
using tparity::StEntry;

const char* const kWhere = "fuzz.safetensors";

[[noreturn]] void finding(const std::string& what) {
  std::fprintf(stderr, "fuzz_safetensors: %s\n", what.c_str());
  std::abort();
}

bool same_bits(const DTensor& a, const DTensor& b) {
  return a.dtype == b.dtype && a.shape == b.shape && a.data.size() == b.data.size() &&
         (a.data.empty() || std::memcmp(a.data.data(), b.data.data(), a.data.size() * sizeof(double)) == 0);
}

bool writable(StDType d) { return d == StDType::F32 || d == StDType::F64 || d == StDType::Bool || d == StDType::I64; }

// The reader's promises about what it accepted: entries in buffer order tile [0, buffer size), each
// numel x the dtype's size bytes, each found by its name, all within the file.
void check_layout(const SafetensorsFile& f, size_t size) {
  size_t at = 0;
  for (const StEntry& e : f.entries()) {
    if (e.begin != at) finding("entries do not tile the buffer at " + e.name);
    if (e.end - e.begin != size_t(tparity::numel(e.shape)) * tparity::st_dtype_size(e.dtype))
      finding("an entry's size is not numel x the dtype's size: " + e.name);
    if (f.find(e.name) != &e) finding("find() does not give the entry back: " + e.name);
    at = e.end;
  }
  if (at + 8 > size) finding("the buffer is larger than the file");
  for (const StEntry& e : f.entries())
    if (f.data(e) != f.data(f.entries().front()) + (e.begin - f.entries().front().begin))
      finding("data() does not point into one buffer: " + e.name);
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  std::optional<SafetensorsFile> f;
  try {
    f.emplace(SafetensorsFile::from_bytes(std::string(reinterpret_cast<const char*>(data), size), kWhere));
  } catch (const tparity::InputError&) {
    return 0;
  }
  check_layout(*f, size);

  // Every tensor read; the writable ones kept in buffer order.
  std::vector<std::pair<std::string, DTensor>> kept;
  for (const StEntry& e : f->entries()) {
    DTensor t;
    try {
      t = f->tensor(e.name);
    } catch (const tparity::InputError& err) {
      if (e.dtype != StDType::I64) finding(std::string("tensor() refused a tensor the reader accepted: ") + err.what());
      continue;
    }
    if (t.shape != e.shape || t.numel() != tparity::numel(e.shape)) finding("tensor() changed the shape: " + e.name);
    if (e.dtype == StDType::F16 || e.dtype == StDType::BF16)
      for (double x : t.data)
        if (!std::isnan(x) && double(float(x)) != x) finding("a widened F16/BF16 value is not a float: " + e.name);
    if (writable(e.dtype)) kept.emplace_back(e.name, std::move(t));
  }
  const bool all = kept.size() == f->entries().size();
  if (!f->find("absent?")) {
    bool refused = false;
    try {
      f->tensor("absent?");
    } catch (const tparity::InputError&) {
      refused = true;
    }
    if (!refused) finding("tensor() gave a tensor find() does not know");
  }

  std::vector<std::pair<std::string, const DTensor*>> out;
  for (const auto& [name, t] : kept) out.emplace_back(name, &t);
  std::string written;
  try {
    written = tparity::safetensors_bytes(out, f->metadata());
  } catch (const tparity::InputError& e) {
    finding(std::string("safetensors_bytes refused what the reader gave: ") + e.what());
  }
  std::optional<SafetensorsFile> g;
  try {
    g.emplace(SafetensorsFile::from_bytes(written, kWhere));
  } catch (const tparity::InputError& e) {
    finding(std::string("safetensors_bytes wrote a file from_bytes refuses: ") + e.what());
  }
  if (g->metadata() != f->metadata()) finding("the round trip changed the metadata");
  if (g->entries().size() != kept.size()) finding("the round trip changed the number of tensors");
  for (const auto& [name, t] : kept) {
    const StEntry* a = f->find(name);
    const StEntry* b = g->find(name);
    if (!b) finding("the round trip lost " + name);
    if (b->dtype != a->dtype || b->shape != a->shape || b->end - b->begin != a->end - a->begin)
      finding("the round trip changed the entry of " + name);
    if (all && (b->begin != a->begin || b->end != a->end)) finding("the round trip moved " + name);
    if (!same_bits(g->tensor(name), t)) finding("the round trip changed the values of " + name);
  }
  return 0;
}
