// safetensors: write + read round trips, a file written by Python's safetensors package, binary16 and
// bfloat16 widening against hand-worked bit patterns, and each of the reader's rules refused with a
// message naming the file, the tensor and the field. The bad files are built here byte by byte.
#include <unistd.h>

#include <algorithm>
#include <catch2/catch.hpp>
#include <cmath>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <limits>
#include <sstream>

#include "temp_dir.hpp"
#include "tparity/fixture/safetensors.hpp"

using namespace tparity;
namespace fs = std::filesystem;

namespace {

const char* const kBad = "bad.safetensors";
const double kInf = std::numeric_limits<double>::infinity();
const double kNaN = std::numeric_limits<double>::quiet_NaN();

std::string le64(uint64_t v) {
  std::string s;
  for (int i = 0; i < 8; ++i) s += char((v >> (8 * i)) & 0xff);
  return s;
}

// A file: the header's size, the header as given (no padding added), the buffer.
std::string st_file(const std::string& header, const std::string& buffer = "") {
  return le64(header.size()) + header + buffer;
}

// One tensor entry as header text.
std::string entry(const std::string& name, const std::string& dtype, const std::string& shape, uint64_t begin,
                  uint64_t end) {
  return "\"" + name + "\":{\"dtype\":\"" + dtype + "\",\"shape\":" + shape + ",\"data_offsets\":[" +
         std::to_string(begin) + "," + std::to_string(end) + "]}";
}

// The message from_bytes refuses `bytes` with (the test fails when it accepts them).
std::string refusal(const std::string& bytes) {
  try {
    SafetensorsFile::from_bytes(bytes, kBad);
  } catch (const InputError& e) {
    return e.what();
  }
  FAIL("accepted: " << bytes.substr(8));
  return "";
}

std::string slurp(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  std::stringstream ss;
  ss << in.rdbuf();
  return ss.str();
}

uint64_t bits(double x) {
  uint64_t b;
  std::memcpy(&b, &x, sizeof b);
  return b;
}

uint32_t fbits(float x) {
  uint32_t b;
  std::memcpy(&b, &x, sizeof b);
  return b;
}

// Bit for bit, any NaN matching any NaN (the payload of a NaN typed as a literal is the library's).
void check_values(const DTensor& t, const std::vector<double>& expected) {
  REQUIRE(t.data.size() == expected.size());
  for (size_t i = 0; i < expected.size(); ++i) {
    CAPTURE(i, t.data[i], expected[i]);
    if (std::isnan(expected[i]))
      CHECK(std::isnan(t.data[i]));
    else
      CHECK(bits(t.data[i]) == bits(expected[i]));
  }
}

// A scratch directory, removed with its contents at the end of the scope.
struct TempDir : testutil::TempDir {
  TempDir() : testutil::TempDir("tparity_st_") {}
  std::vector<std::string> listing() const {
    std::vector<std::string> names;
    for (const auto& e : fs::directory_iterator(path)) names.push_back(e.path().filename().string());
    std::sort(names.begin(), names.end());
    return names;
  }
};

DTensor make(DType dtype, Shape shape, std::vector<double> data) {
  DTensor t;
  t.dtype = dtype;
  t.shape = std::move(shape);
  t.data.assign(data.begin(), data.end());
  return t;
}

}  // namespace

TEST_CASE("safetensors: every dtype the writer knows survives write_safetensors + open", "[safetensors]") {
  const float third = 1.0f / 3.0f;
  const DTensor f32 =
      make(DType::Float32, {2, 4}, {0.25, -1.5, -0.0, kInf, kNaN, std::ldexp(1.0, -149), 3.4028234663852886e38, third});
  const DTensor f64 = make(DType::Float64, {6}, {0.1, -1e300, 5e-324, -0.0, -kInf, kNaN});
  const DTensor ids = make(DType::Int64, {5}, {0, -1, 9007199254740992.0, -9007199254740992.0, 42});
  const DTensor mask = make(DType::Bool, {2, 2}, {1, 0, 0, 1});
  const DTensor scalar = make(DType::Float64, {}, {2.5});
  const DTensor z_bool = make(DType::Bool, {0}, {});
  const DTensor z_f32 = make(DType::Float32, {0}, {});
  const DTensor z_i64 = make(DType::Int64, {2, 0, 3}, {});
  const std::vector<std::pair<std::string, const DTensor*>> tensors{
      {"f32", &f32},       {"f64", &f64},       {"ids", &ids},     {"mask", &mask},
      {"scalar", &scalar}, {"z_bool", &z_bool}, {"z_f32", &z_f32}, {"z_i64", &z_i64}};
  const std::map<std::string, std::string> metadata{{"format", "pt"}, {"note", "caf\xc3\xa9 \"quoted\""}};

  TempDir dir;
  const std::string path = (dir.path / "w.safetensors").string();
  write_safetensors(path, tensors, metadata);
  CHECK(dir.listing() == std::vector<std::string>{"w.safetensors"});  // no temporary left

  // The bytes as the format lays them out, checked without the reader: the buffer starts at a
  // multiple of 8 after a space-padded header, holds 4 x 8 + 8 x 6 + 8 x 5 + 4 + 8 bytes, f32 first.
  const std::string raw = slurp(path);
  REQUIRE(raw.size() >= 8);
  uint64_t n = 0;
  for (int i = 7; i >= 0; --i) n = (n << 8) | uint8_t(raw[size_t(i)]);
  CHECK((8 + n) % 8 == 0);
  REQUIRE(raw.size() == 8 + n + 132);
  CHECK(raw[8] == '{');
  const std::string header = raw.substr(8, n);
  CHECK(header.substr(header.find_last_of('}') + 1).find_first_not_of(' ') == std::string::npos);
  CHECK(raw.substr(8 + n, 4) == std::string("\x00\x00\x80\x3e", 4));                       // 0.25f
  CHECK(raw.substr(8 + n + 32, 8) == std::string("\x9a\x99\x99\x99\x99\x99\xb9\x3f", 8));  // 0.1
  CHECK(raw.substr(8 + n + 88, 8) == std::string(8, '\xff'));                              // int64 -1
  CHECK(raw.substr(8 + n + 120, 4) == std::string("\x01\x00\x00\x01", 4));                 // the mask

  const SafetensorsFile f = SafetensorsFile::open(path);
  CHECK(f.where() == path);
  CHECK(f.metadata() == metadata);
  struct Want {
    const char* name;
    StDType dtype;
    Shape shape;
    size_t begin, end;
  };
  // Given order; the empty tensors share offset 132 and come in name order.
  const std::vector<Want> want{{"f32", StDType::F32, {2, 4}, 0, 32},   {"f64", StDType::F64, {6}, 32, 80},
                               {"ids", StDType::I64, {5}, 80, 120},    {"mask", StDType::Bool, {2, 2}, 120, 124},
                               {"scalar", StDType::F64, {}, 124, 132}, {"z_bool", StDType::Bool, {0}, 132, 132},
                               {"z_f32", StDType::F32, {0}, 132, 132}, {"z_i64", StDType::I64, {2, 0, 3}, 132, 132}};
  REQUIRE(f.entries().size() == want.size());
  for (size_t i = 0; i < want.size(); ++i) {
    const StEntry& e = f.entries()[i];
    CAPTURE(i, e.name);
    CHECK(e.name == want[i].name);
    CHECK(e.dtype == want[i].dtype);
    CHECK(e.shape == want[i].shape);
    CHECK(e.begin == want[i].begin);
    CHECK(e.end == want[i].end);
    CHECK(f.find(want[i].name) == &e);
  }
  for (const auto& [name, t] : tensors) {
    CAPTURE(name);
    const DTensor back = f.tensor(name);
    CHECK(back.dtype == t->dtype);
    CHECK(back.shape == t->shape);
  }
  check_values(f.tensor("f32"), {0.25, -1.5, -0.0, kInf, kNaN, std::ldexp(1.0, -149), 3.4028234663852886e38,
                                 0.3333333432674408});  // float(1/3) = 11184811 x 2^-25
  check_values(f.tensor("f64"), {0.1, -1e300, 5e-324, -0.0, -kInf, kNaN});
  check_values(f.tensor("ids"), {0, -1, 9007199254740992.0, -9007199254740992.0, 42});
  check_values(f.tensor("mask"), {1, 0, 0, 1});
  check_values(f.tensor("scalar"), {2.5});
  check_values(f.tensor("z_i64"), {});

  // The same bytes in memory.
  const SafetensorsFile m = SafetensorsFile::from_bytes(safetensors_bytes(tensors, metadata), "mem");
  CHECK(m.entries().size() == want.size());
  check_values(m.tensor("f64"), {0.1, -1e300, 5e-324, -0.0, -kInf, kNaN});
  CHECK(safetensors_bytes(tensors, metadata) == raw);
}

TEST_CASE("safetensors: no tensors and no metadata make a valid file", "[safetensors]") {
  const std::string bytes = safetensors_bytes({});
  CHECK(bytes == le64(8) + "{}      ");  // "{}" padded to 8
  const SafetensorsFile f = SafetensorsFile::from_bytes(bytes, "empty");
  CHECK(f.entries().empty());
  CHECK(f.metadata().empty());
  CHECK(f.find("x") == nullptr);
}

TEST_CASE("safetensors: reads a file written by Python's safetensors package", "[safetensors]") {
  // tests/data/make_python_written.py wrote it (safetensors.torch.save_file); the values below are
  // that script's literals.
  const std::string path = TPARITY_FIXTURES "/../tests/data/python_written.safetensors";
  const SafetensorsFile f = SafetensorsFile::open(path);
  CHECK(f.metadata() ==
        std::map<std::string, std::string>{{"format", "pt"}, {"source", "tests/data/make_python_written.py"}});
  // Buffer order as the package lays it out (by alignment, then name), readable in the file's header.
  std::vector<std::string> names;
  for (const StEntry& e : f.entries()) names.push_back(e.name);
  CHECK(names == std::vector<std::string>{"ids", "f64", "empty", "f32", "scalar", "i32", "bf16", "f16", "i16", "i8",
                                          "u8", "mask"});

  auto check = [&](const char* name, StDType st, DType dt, const Shape& shape, const std::vector<double>& values) {
    CAPTURE(name);
    const StEntry* e = f.find(name);
    REQUIRE(e != nullptr);
    CHECK(e->dtype == st);
    CHECK(e->shape == shape);
    const DTensor t = f.tensor(name);
    CHECK(t.dtype == dt);
    CHECK(t.shape == shape);
    check_values(t, values);
  };
  check("f32", StDType::F32, DType::Float32, {2, 3}, {0.25, -1.5, 3.0, -0.0, 1024.5, -7.75});
  check("f64", StDType::F64, DType::Float64, {3}, {0.1, -1e300, 2.5});
  check("f16", StDType::F16, DType::Float32, {3, 3},
        {1.0, -2.0, 0.5, 65504.0, std::ldexp(1.0, -24), kInf, -0.0, 1365.0 / 4096, kNaN});
  check("bf16", StDType::BF16, DType::Float32, {2, 4},
        {1.0, -5.0, 201.0 / 64, kInf, -kInf, std::ldexp(1.0, -133), kNaN, -0.0});
  check("mask", StDType::Bool, DType::Bool, {2, 3}, {1, 0, 1, 0, 0, 1});
  check("ids", StDType::I64, DType::Int64, {5}, {0, -1, 9007199254740992.0, -9007199254740992.0, 123456789012.0});
  check("i32", StDType::I32, DType::Int64, {3}, {-2147483648.0, 2147483647.0, 7});
  check("i16", StDType::I16, DType::Int64, {2}, {-32768, 32767});
  check("i8", StDType::I8, DType::Int64, {3}, {-128, 127, 0});
  check("u8", StDType::U8, DType::Int64, {3}, {0, 255, 17});
  check("scalar", StDType::F32, DType::Float32, {}, {7.5});
  check("empty", StDType::F32, DType::Float32, {0, 3}, {});
}

TEST_CASE("safetensors: binary16 widens exactly (normals, subnormals, zeros, infinities, NaN)", "[safetensors]") {
  // Hand-worked: sign | exponent (5 bits, bias 15) | mantissa (10 bits).
  const std::vector<std::pair<uint16_t, double>> table{
      {0x3c00, 1.0},                          // 0 01111 0: 2^0
      {0xc000, -2.0},                         // 1 10000 0
      {0x3555, 1365.0 / 4096},                // 0 01101 0101010101: (1 + 341/1024) / 4
      {0x7bff, 65504.0},                      // largest finite: (2 - 2^-10) x 2^15
      {0x0400, std::ldexp(1.0, -14)},         // smallest normal
      {0x03ff, 1023 * std::ldexp(1.0, -24)},  // largest subnormal
      {0x0001, std::ldexp(1.0, -24)},         // smallest subnormal
      {0x8001, -std::ldexp(1.0, -24)},        //
      {0x0000, 0.0},                          //
      {0x8000, -0.0},                         //
      {0x7c00, kInf},                         //
      {0xfc00, -kInf}};
  for (const auto& [h, want] : table) {
    CAPTURE(h, want);
    CHECK(bits(double(half_to_float(h))) == bits(want));
  }
  // NaN: the exponent all ones and a mantissa; the payload moves to float's top mantissa bits.
  CHECK(fbits(half_to_float(0x7e00)) == 0x7fc00000u);
  CHECK(fbits(half_to_float(0x7e01)) == 0x7fc02000u);
  CHECK(fbits(half_to_float(0xfd00)) == 0xffa00000u);  // a signalling NaN stays one in float

  // Every pattern against the format's definition, evaluated in double arithmetic.
  for (uint32_t h = 0; h < 0x10000; ++h) {
    const int sign = h >> 15, exp = (h >> 10) & 0x1f, man = h & 0x3ff;
    const float got = half_to_float(uint16_t(h));
    CAPTURE(h);
    if (exp == 0x1f) {
      CHECK((man == 0 ? std::isinf(got) : std::isnan(got)));
      CHECK(std::signbit(got) == bool(sign));
      continue;
    }
    const double mag = exp == 0 ? std::ldexp(man / 1024.0, -14) : std::ldexp(1 + man / 1024.0, exp - 15);
    const double want = sign ? -mag : mag;
    if (bits(double(got)) != bits(want)) FAIL_CHECK("half " << h << ": got " << got << ", want " << want);
  }
}

TEST_CASE("safetensors: bfloat16 widens exactly (normals, subnormals, zeros, infinities, NaN)", "[safetensors]") {
  // Hand-worked: sign | exponent (8 bits, bias 127) | mantissa (7 bits).
  const std::vector<std::pair<uint16_t, double>> table{
      {0x3f80, 1.0},                                               // 0 01111111 0
      {0xc0a0, -5.0},                                              // 1 10000001 0100000: -(1 + 1/4) x 4
      {0x4049, 201.0 / 64},                                        // 0 10000000 1001001: (1 + 73/128) x 2
      {0x3eab, 171.0 / 512},                                       // 0 01111101 0101011: (1 + 43/128) / 4
      {0x7f7f, (2 - std::ldexp(1.0, -7)) * std::ldexp(1.0, 127)},  // largest finite
      {0x0080, std::ldexp(1.0, -126)},                             // smallest normal
      {0x0001, std::ldexp(1.0, -133)},                             // smallest subnormal
      {0x007f, 127 * std::ldexp(1.0, -133)},                       // largest subnormal
      {0x8000, -0.0},                                              //
      {0x7f80, kInf},                                              //
      {0xff80, -kInf}};
  for (const auto& [h, want] : table) {
    CAPTURE(h, want);
    CHECK(bits(double(bfloat16_to_float(h))) == bits(want));
  }
  CHECK(fbits(bfloat16_to_float(0x7fc0)) == 0x7fc00000u);
  CHECK(fbits(bfloat16_to_float(0xffc1)) == 0xffc10000u);

  for (uint32_t h = 0; h < 0x10000; ++h) {
    const int sign = h >> 15, exp = (h >> 7) & 0xff, man = h & 0x7f;
    const float got = bfloat16_to_float(uint16_t(h));
    CAPTURE(h);
    if (exp == 0xff) {
      CHECK((man == 0 ? std::isinf(got) : std::isnan(got)));
      CHECK(std::signbit(got) == bool(sign));
      continue;
    }
    const double mag = exp == 0 ? std::ldexp(man / 128.0, -126) : std::ldexp(1 + man / 128.0, exp - 127);
    const double want = sign ? -mag : mag;
    if (bits(double(got)) != bits(want)) FAIL_CHECK("bfloat16 " << h << ": got " << got << ", want " << want);
  }
}

TEST_CASE("safetensors: unaligned data is read (an odd header length)", "[safetensors]") {
  // The header padded to an odd length puts the buffer, and every tensor in it, at odd offsets.
  const std::string header = "{" + entry("d", "F64", "[2]", 0, 16) + "," + entry("h", "F16", "[1]", 16, 18) + "," +
                             entry("q", "I64", "[1]", 18, 26) + "}";
  std::string buffer;
  buffer += std::string("\x00\x00\x00\x00\x00\x00\xf8\x3f", 8);  // 1.5
  buffer += std::string("\x00\x00\x00\x00\x00\x00\x02\xc0", 8);  // -2.25
  buffer += std::string("\x00\xbc", 2);                          // -1.0 in binary16
  buffer += std::string("\xfe\xff\xff\xff\xff\xff\xff\xff", 8);  // -2
  std::string padded = header;
  while ((8 + padded.size()) % 2 == 0) padded += ' ';  // an odd buffer start
  const SafetensorsFile f = SafetensorsFile::from_bytes(st_file(padded, buffer), "odd");
  check_values(f.tensor("d"), {1.5, -2.25});
  check_values(f.tensor("h"), {-1.0});
  check_values(f.tensor("q"), {-2});
}

TEST_CASE("safetensors: the file moves with its mapping", "[safetensors]") {
  const DTensor t = make(DType::Float32, {3}, {1, 2, 3});
  TempDir dir;
  const std::string path = (dir.path / "m.safetensors").string();
  write_safetensors(path, {{"t", &t}});
  SafetensorsFile a = SafetensorsFile::open(path);
  SafetensorsFile b(std::move(a));
  check_values(b.tensor("t"), {1, 2, 3});
  SafetensorsFile c = SafetensorsFile::from_bytes(safetensors_bytes({{"u", &t}}), "short");
  c = std::move(b);
  check_values(c.tensor("t"), {1, 2, 3});
  CHECK(c.where() == path);
}

// ---- the reader's rules, one case each -------------------------------------------------------

TEST_CASE("safetensors: a file shorter than 8 bytes is refused", "[safetensors]") {
  CHECK(refusal(std::string("\x05\x00\x00", 3)) ==
        "bad.safetensors: header size: expected a file of at least 8 bytes, got 3");
  CHECK(refusal("") == "bad.safetensors: header size: expected a file of at least 8 bytes, got 0");
}

TEST_CASE("safetensors: a header size above 100,000,000 or beyond the file is refused", "[safetensors]") {
  CHECK(refusal(le64(100000001) + "{}") ==
        "bad.safetensors: header size: expected at most 100000000 bytes, got 100000001");
  CHECK(refusal(le64(uint64_t(-1)) + "{}") ==
        "bad.safetensors: header size: expected at most 100000000 bytes, got 18446744073709551615");
  CHECK(refusal(le64(10) + "{}") ==
        "bad.safetensors: header size: expected at most 2 bytes (the file holds 10, 8 of them the size), got 10");
}

TEST_CASE("safetensors: a header that is not a JSON object is refused", "[safetensors]") {
  CHECK(refusal(st_file("[1]")) ==
        "bad.safetensors: header: expected a JSON object starting with '{', got byte 0x5b first");
  CHECK(refusal(st_file(" {}")) ==
        "bad.safetensors: header: expected a JSON object starting with '{', got byte 0x20 first");
  CHECK(refusal(st_file("")) ==
        "bad.safetensors: header: expected a JSON object starting with '{', got an empty header");
  const std::string cut = refusal(st_file("{\"a\":"));
  CHECK_THAT(cut, Catch::StartsWith("bad.safetensors: header: malformed JSON: parse error at line 1, column 6: ") &&
                      Catch::Contains("unexpected end of input"));
  const std::string trailing = refusal(st_file("{} []"));
  CHECK_THAT(trailing, Catch::StartsWith("bad.safetensors: header: malformed JSON: parse error at line 1, column 4: "));
  // Not UTF-8: a lone continuation byte in a name.
  CHECK_THAT(refusal(st_file("{\"\x80\":1}")), Catch::StartsWith("bad.safetensors: header: malformed JSON: "));
  // Padding is spaces only.
  CHECK(refusal(st_file("{}\n")) ==
        "bad.safetensors: header: expected only spaces (0x20) after the JSON object, got byte 0x0a");
  CHECK(SafetensorsFile::from_bytes(st_file("{}    "), "ok").entries().empty());
}

TEST_CASE("safetensors: a key given twice is refused", "[safetensors]") {
  const std::string a = entry("a", "F32", "[1]", 0, 4);
  CHECK(refusal(st_file("{" + a + "," + a + "}", "abcd")) ==
        "bad.safetensors: header.a: expected each key once, got it twice (JSON readers disagree on which one counts)");
  CHECK(refusal(st_file(R"({"a":{"dtype":"F32","dtype":"F64","shape":[1],"data_offsets":[0,4]}})", "abcd")) ==
        "bad.safetensors: header.a.dtype: expected each key once, got it twice (JSON readers disagree on which one "
        "counts)");
  CHECK(refusal(st_file(R"({"__metadata__":{"k":"1","k":"2"}})")) ==
        "bad.safetensors: header.__metadata__.k: expected each key once, got it twice (JSON readers disagree on which "
        "one counts)");
}

TEST_CASE("safetensors: an entry that is not an object of dtype, shape, data_offsets is refused", "[safetensors]") {
  CHECK(refusal(st_file(R"({"w":[1]})")) ==
        "bad.safetensors: header.w: expected an object {dtype, shape, data_offsets}, got array");
  CHECK(refusal(st_file(R"({"w":{"dtype":"F32","shape":[1],"data_offsets":[0,4],"x":0}})", "abcd")) ==
        "bad.safetensors: header.w.x: unexpected field (expected dtype, shape, data_offsets)");
  CHECK(refusal(st_file(R"({"w":{"dtype":"F32","data_offsets":[0,4]}})", "abcd")) ==
        "bad.safetensors: header.w.shape: missing");
}

TEST_CASE("safetensors: a dtype outside the list is refused with the list", "[safetensors]") {
  CHECK(refusal(st_file("{" + entry("w", "U16", "[1]", 0, 2) + "}", "ab")) ==
        "bad.safetensors: header.w.dtype: expected one of F64, F32, F16, BF16, I64, I32, I16, I8, U8, BOOL, got string "
        "\"U16\"");
  CHECK(refusal(st_file(R"({"w":{"dtype":4,"shape":[1],"data_offsets":[0,4]}})", "abcd")) ==
        "bad.safetensors: header.w.dtype: expected a string, got number 4");
}

TEST_CASE("safetensors: a shape that is not sizes >= 0 or holds more than 2^31 elements is refused", "[safetensors]") {
  CHECK(refusal(st_file("{" + entry("w", "F32", "3", 0, 12) + "}", std::string(12, 'x'))) ==
        "bad.safetensors: header.w.shape: expected an array of sizes, got number 3");
  CHECK(refusal(st_file("{" + entry("w", "F32", "[1,-2]", 0, 0) + "}")) ==
        "bad.safetensors: header.w.shape[1]: expected an integer >= 0, got -2");
  CHECK(refusal(st_file("{" + entry("w", "F32", "[2.0]", 0, 8) + "}", std::string(8, 'x'))) ==
        "bad.safetensors: header.w.shape[0]: expected an integer >= 0, got number 2.0");
  CHECK(refusal(st_file("{" + entry("w", "F32", "[65536,65536]", 0, 0) + "}")) ==
        "bad.safetensors: header.w.shape: expected at most 2147483648 elements, got a product of sizes [65536, 65536] "
        "above that");
  // 2^31 three times overflows int64: refused before.
  CHECK(refusal(st_file("{" + entry("w", "U8", "[2147483648,2147483648,2147483648]", 0, 0) + "}")) ==
        "bad.safetensors: header.w.shape: expected at most 2147483648 elements, got a product of sizes [2147483648, "
        "2147483648, 2147483648] above that");
  CHECK(refusal(st_file("{" + entry("w", "U8", "[0,4294967296]", 0, 0) + "}")) ==
        "bad.safetensors: header.w.shape[1]: expected a size <= 2147483648, got 4294967296");
  // A zero anywhere makes the product 0, whatever the other sizes.
  const SafetensorsFile f =
      SafetensorsFile::from_bytes(st_file("{" + entry("w", "F64", "[2147483648,0]", 0, 0) + "}"), "zero");
  CHECK(f.tensor("w").data.empty());
}

TEST_CASE("safetensors: data_offsets that are not BEGIN <= END <= the buffer's size are refused", "[safetensors]") {
  CHECK(refusal(st_file(R"({"w":{"dtype":"U8","shape":[1],"data_offsets":[0]}})", "a")) ==
        "bad.safetensors: header.w.data_offsets: expected [BEGIN, END], got an array of 1 values");
  CHECK(refusal(st_file(R"({"w":{"dtype":"U8","shape":[1],"data_offsets":{"a":1}}})", "a")) ==
        "bad.safetensors: header.w.data_offsets: expected [BEGIN, END], got object");
  CHECK(refusal(st_file(R"({"w":{"dtype":"U8","shape":[1],"data_offsets":[-4,1]}})", "a")) ==
        "bad.safetensors: header.w.data_offsets[0]: expected an integer >= 0, got -4");
  CHECK(refusal(st_file(R"({"w":{"dtype":"U8","shape":[1],"data_offsets":[0,"1"]}})", "a")) ==
        "bad.safetensors: header.w.data_offsets[1]: expected an integer >= 0, got string \"1\"");
  CHECK(refusal(st_file("{" + entry("w", "U8", "[0]", 8, 4) + "}", std::string(8, 'x'))) ==
        "bad.safetensors: header.w.data_offsets: expected BEGIN <= END, got [8, 4]");
  CHECK(refusal(st_file("{" + entry("w", "F32", "[5]", 0, 20) + "}", std::string(16, 'x'))) ==
        "bad.safetensors: header.w.data_offsets: expected END <= 16 (the buffer's size), got 20");
  CHECK(refusal(st_file("{" + entry("w", "F32", "[5]", 0, 18446744073709551615u) + "}", std::string(16, 'x'))) ==
        "bad.safetensors: header.w.data_offsets: expected END <= 16 (the buffer's size), got 18446744073709551615");
}

TEST_CASE("safetensors: a byte range that is not numel x the dtype's size is refused", "[safetensors]") {
  CHECK(refusal(st_file("{" + entry("layers.0.weight", "F32", "[16]", 0, 60) + "}", std::string(64, 'x'))) ==
        "bad.safetensors: header.layers.0.weight.data_offsets: expected END - BEGIN = 64 bytes (16 x F32), got 60");
  CHECK(refusal(st_file("{" + entry("s", "BF16", "[]", 0, 4) + "}", std::string(4, 'x'))) ==
        "bad.safetensors: header.s.data_offsets: expected END - BEGIN = 2 bytes (1 x BF16), got 4");
}

TEST_CASE("safetensors: overlapping tensors are refused", "[safetensors]") {
  CHECK(refusal(st_file("{" + entry("a", "F32", "[2]", 0, 8) + "," + entry("b", "F32", "[2]", 4, 12) + "}",
                        std::string(12, 'x'))) ==
        "bad.safetensors: header.b.data_offsets: expected no overlap with a's [0, 8], got [4, 12]");
  CHECK(refusal(st_file("{" + entry("a", "F32", "[2]", 0, 8) + "," + entry("b", "F32", "[2]", 0, 8) + "}",
                        std::string(8, 'x'))) ==
        "bad.safetensors: header.b.data_offsets: expected no overlap with a's [0, 8], got [0, 8]");
}

TEST_CASE("safetensors: a buffer with holes or trailing bytes is refused", "[safetensors]") {
  CHECK(refusal(st_file("{" + entry("a", "F32", "[1]", 0, 4) + "," + entry("b", "F32", "[1]", 8, 12) + "}",
                        std::string(12, 'x'))) ==
        "bad.safetensors: header.b.data_offsets: expected BEGIN = 4, where a ends (the buffer must be indexed without "
        "holes), got 8");
  CHECK(refusal(st_file("{" + entry("a", "F32", "[1]", 4, 8) + "}", std::string(8, 'x'))) ==
        "bad.safetensors: header.a.data_offsets: expected BEGIN = 0 for the buffer's first tensor (the buffer must be "
        "indexed without holes), got 4");
  CHECK(refusal(st_file("{" + entry("a", "F32", "[1]", 0, 4) + "}", std::string(6, 'x'))) ==
        "bad.safetensors: buffer: expected 4 bytes, up to where the last tensor, a, ends, got 6 (the buffer must be "
        "indexed without trailing bytes)");
  CHECK(refusal(st_file("{}", "xy")) == "bad.safetensors: buffer: expected 0 bytes (no tensors in the header), got 2");
}

TEST_CASE("safetensors: metadata that is not an object of strings is refused", "[safetensors]") {
  CHECK(refusal(st_file(R"({"__metadata__":["a"]})")) ==
        "bad.safetensors: header.__metadata__: expected an object of strings, got array");
  CHECK(refusal(st_file(R"({"__metadata__":{"ok":"1","n":1}})")) ==
        "bad.safetensors: header.__metadata__.n: expected a string, got number 1");
}

TEST_CASE("safetensors: a BOOL byte other than 0 or 1 is refused", "[safetensors]") {
  CHECK(refusal(st_file("{" + entry("m", "BOOL", "[3]", 0, 3) + "}", std::string("\x01\x00\x02", 3))) ==
        "bad.safetensors: m.data[2]: expected 0 or 1 (BOOL), got 2");
}

TEST_CASE("safetensors: an empty tensor name is refused", "[safetensors]") {
  CHECK(refusal(st_file("{" + entry("", "U8", "[1]", 0, 1) + "}", "x")) ==
        "bad.safetensors: header.\"\": expected a non-empty tensor name");
}

TEST_CASE("safetensors: an I64 beyond +-2^53 is refused when read as a DTensor", "[safetensors]") {
  const std::string header = "{" + entry("ids", "I64", "[2]", 0, 16) + "}";
  for (const auto& [v, shown] : std::vector<std::pair<std::string, std::string>>{
           {std::string("\x01\x00\x00\x00\x00\x00\x20\x00", 8), "9007199254740993"},      // 2^53 + 1
           {std::string("\xff\xff\xff\xff\xff\xff\xdf\xff", 8), "-9007199254740993"}}) {  // -(2^53 + 1)
    const SafetensorsFile f = SafetensorsFile::from_bytes(st_file(header, std::string(8, '\0') + v), kBad);
    CHECK(f.find("ids") != nullptr);  // the file itself is valid
    try {
      f.tensor("ids");
      FAIL("accepted " << shown);
    } catch (const InputError& e) {
      CHECK(std::string(e.what()) ==
            "bad.safetensors: ids.data[1]: expected an I64 within +-2^53 = 9007199254740992 "
            "(DTensor holds values as double), got " +
                shown);
    }
  }
}

TEST_CASE("safetensors: a tensor not in the file is named with the file's", "[safetensors]") {
  const SafetensorsFile f = SafetensorsFile::from_bytes(
      st_file("{" + entry("b", "U8", "[1]", 0, 1) + "," + entry("a", "U8", "[1]", 1, 2) + "}", "xy"), kBad);
  CHECK(f.find("c") == nullptr);
  CHECK_THROWS_WITH(f.tensor("c"), "bad.safetensors: c: no such tensor (the file holds: a, b)");
}

TEST_CASE("safetensors: open names the path and refuses a bad file on disk as it refuses bytes", "[safetensors]") {
  TempDir dir;
  const std::string missing = (dir.path / "missing.safetensors").string();
  CHECK_THROWS_WITH(SafetensorsFile::open(missing),
                    missing + ": cannot open safetensors file: No such file or directory");
  CHECK_THROWS_WITH(SafetensorsFile::open(dir.path.string()),
                    dir.path.string() + ": cannot read safetensors file: it is a directory, not a regular file");
  const std::string empty = (dir.path / "empty.safetensors").string();
  std::ofstream(empty).close();
  CHECK_THROWS_WITH(SafetensorsFile::open(empty), empty + ": header size: expected a file of at least 8 bytes, got 0");
  const std::string bad = (dir.path / "w.safetensors").string();
  std::ofstream(bad, std::ios::binary) << st_file("{" + entry("layers.0.weight", "F32", "[16]", 0, 60) + "}",
                                                  std::string(64, 'x'));
  CHECK_THROWS_WITH(SafetensorsFile::open(bad),
                    bad + ": header.layers.0.weight.data_offsets: expected END - BEGIN = 64 bytes (16 x F32), got 60");
}

TEST_CASE("safetensors: the writer refuses what the format cannot hold and leaves nothing behind", "[safetensors]") {
  const DTensor ok = make(DType::Float32, {1}, {1});
  const DTensor short_data = make(DType::Float32, {2, 2}, {1, 2, 3});
  const DTensor half_id = make(DType::Int64, {2}, {1, 2.5});
  const DTensor nan_id = make(DType::Int64, {1}, {kNaN});
  const DTensor huge_id = make(DType::Int64, {1}, {9223372036854775808.0});
  TempDir dir;
  const std::string path = (dir.path / "w.safetensors").string();
  CHECK_THROWS_WITH(write_safetensors(path, {{"", &ok}}), path + ": \"\": expected a non-empty tensor name");
  CHECK_THROWS_WITH(write_safetensors(path, {{"a", &ok}, {"a", &ok}}),
                    path + ": a: expected each tensor name once, got it twice");
  CHECK_THROWS_WITH(write_safetensors(path, {{"__metadata__", &ok}}),
                    path + ": __metadata__: expected a tensor name, got the metadata's reserved key");
  CHECK_THROWS_WITH(write_safetensors(path, {{"s", &short_data}}),
                    path + ": s.data: expected 4 values (the product of shape [2, 2]), got 3");
  CHECK_THROWS_WITH(write_safetensors(path, {{"i", &half_id}}),
                    path + ": i.data[1]: expected an integer within int64's range, got 2.5");
  CHECK_THROWS_WITH(write_safetensors(path, {{"i", &nan_id}}),
                    path + ": i.data[0]: expected an integer within int64's range, got nan");
  CHECK_THROWS_WITH(write_safetensors(path, {{"i", &huge_id}}),
                    path + ": i.data[0]: expected an integer within int64's range, got 9.223372036854776e+18");
  CHECK_THROWS_WITH(write_safetensors(path, {{"\xff", &ok}}),
                    path + ": tensor name: expected UTF-8 text, got invalid bytes");
  CHECK(dir.listing().empty());
  // The rename fails onto a directory: the temporary file is removed.
  fs::create_directory(dir.path / "taken");
  CHECK_THROWS_AS(write_safetensors((dir.path / "taken").string(), {{"a", &ok}}), InputError);
  CHECK(dir.listing() == std::vector<std::string>{"taken"});
  CHECK_THROWS_AS(write_safetensors((dir.path / "no" / "such" / "dir.safetensors").string(), {{"a", &ok}}), InputError);
  CHECK(dir.listing() == std::vector<std::string>{"taken"});
}

TEST_CASE("rounding to bfloat16 and binary16: to nearest, ties to even, every pattern", "[safetensors]") {
  // For each pair of neighbouring finite values lo < hi of the format: the midpoint goes to the even
  // one, a float32 step either side of it to the nearer; lo and hi stay. Through float32, as documented.
  auto check = [](auto widen, auto round, uint32_t last, const char* what) {
    int64_t bad = 0;
    for (uint32_t h = 0; h < last; ++h) {
      const float lo = widen(uint16_t(h)), hi = widen(uint16_t(h + 1));
      const float mid = float((double(lo) + double(hi)) / 2);  // exact: float has the bits
      const double even = (h % 2 == 0) ? lo : hi;
      const bool ok = round(double(lo)) == lo && round(double(hi)) == hi && round(double(mid)) == even &&
                      round(double(std::nextafter(mid, 0.0f))) == lo &&
                      round(double(std::nextafter(mid, INFINITY))) == hi && round(-double(mid)) == -even;
      if (!ok && bad++ < 5) FAIL_CHECK(what << " pattern " << h << ": lo " << lo << ", hi " << hi);
    }
    CHECK(bad == 0);
  };
  check(half_to_float, round_to_half, 0x7bff, "binary16");
  check(bfloat16_to_float, round_to_bfloat16, 0x7f7f, "bfloat16");
  // Overflow: half's largest finite is 65504; from 65520 (half an ulp above) on, infinity.
  CHECK(round_to_half(65519.0) == 65504.0);
  CHECK(std::isinf(round_to_half(65520.0)));
  CHECK(std::isinf(round_to_bfloat16(3.4028234663852886e38)));  // float's largest rounds past bfloat16's
  CHECK(std::isnan(round_to_half(kNaN)));
  CHECK(std::isnan(round_to_bfloat16(kNaN)));
  CHECK(std::signbit(round_to_half(-0.0)));
}

TEST_CASE("safetensors: every finite bfloat16 and binary16 value survives write_safetensors + open", "[safetensors]") {
  DTensor bf{DType::BFloat16, {}, {}}, h{DType::Float16, {}, {}};
  for (uint32_t b = 0; b < 0x10000; ++b) {
    const float x = bfloat16_to_float(uint16_t(b)), y = half_to_float(uint16_t(b));
    if (!std::isnan(x)) bf.data.push_back(x);
    if (!std::isnan(y)) h.data.push_back(y);
  }
  bf.data.push_back(kNaN), h.data.push_back(kNaN);
  bf.shape = {int64_t(bf.data.size())}, h.shape = {int64_t(h.data.size())};
  const SafetensorsFile f = SafetensorsFile::from_bytes(safetensors_bytes({{"bf", &bf}, {"h", &h}}), "low.safetensors");
  CHECK(st_dtype_name(f.find("bf")->dtype) == "BF16");
  CHECK(st_dtype_name(f.find("h")->dtype) == "F16");
  for (const auto& [name, want] : {std::pair<const char*, const DTensor*>{"bf", &bf}, {"h", &h}}) {
    const DTensor got = f.tensor(name);
    REQUIRE(got.data.size() == want->data.size());
    int64_t differ = 0;
    for (size_t i = 0; i + 1 < got.data.size(); ++i)
      differ += !(got.data[i] == want->data[i]) || std::signbit(got.data[i]) != std::signbit(want->data[i]);
    CHECK(differ == 0);
    CHECK(std::isnan(got.data.back()));
  }
}
