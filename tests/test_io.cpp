// Files from strangers (harness/io.hpp) and figures that must not depend on the values' scale: links,
// FIFOs, devices and folders refused before any byte is read; JSON nested without bound, with a key
// twice, or with a 10 MB string refused in one short line; outputs written whole or not at all and
// never over an input; norms right at 1e-300 and 1e300; size products that would wrap refused.
#include <fcntl.h>
#include <signal.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include <catch2/catch.hpp>
#include <chrono>
#include <cmath>
#include <filesystem>
#include <fstream>
#include <string>

#include "tparity/compare/metrics.hpp"
#include "tparity/compare/noise.hpp"
#include "tparity/core/ops.hpp"
#include "tparity/fixture/fixture.hpp"
#include "tparity/harness/dtensor.hpp"
#include "tparity/harness/io.hpp"
#include "tparity/harness/rng.hpp"

using namespace tparity;
namespace fs = std::filesystem;

namespace {

// A folder of this test process's own, removed when it ends.
fs::path scratch(const std::string& name) {
  static const struct Root {
    fs::path path = fs::temp_directory_path() / ("tparity_io_" + std::to_string(::getpid()));
    ~Root() {
      std::error_code ec;
      fs::remove_all(path, ec);
    }
  } root;
  const fs::path d = root.path / name;
  fs::remove_all(d);
  fs::create_directories(d);
  return d;
}

// Whether f() finishes within `seconds` in a child process (a deadlock would hang this test for ever).
template <class F>
bool finishes(F&& f, int seconds) {
  const pid_t pid = ::fork();
  if (pid == 0) {
    // The child ends here whatever f() does, never back in Catch: its exit would run the static
    // destructors, the scratch folder's removal among them.
    try {
      f();
    } catch (...) {
      ::_exit(1);
    }
    ::_exit(0);
  }
  for (int i = 0; i < seconds * 100; ++i) {
    int status = 0;
    if (::waitpid(pid, &status, WNOHANG) == pid) return WIFEXITED(status) && WEXITSTATUS(status) == 0;
    ::usleep(10000);
  }
  ::kill(pid, SIGKILL);
  ::waitpid(pid, nullptr, 0);
  return false;
}

void write(const fs::path& p, const std::string& text) { std::ofstream(p, std::ios::binary) << text; }

std::string read(const fs::path& p) {
  std::ifstream in(p, std::ios::binary);
  return std::string(std::istreambuf_iterator<char>(in), {});
}

// The message of the InputError f throws ("" when it throws none).
template <class F>
std::string refusal(F&& f) {
  try {
    f();
  } catch (const InputError& e) {
    return e.what();
  }
  return "";
}

}  // namespace

TEST_CASE("io: a link, a FIFO, a device or a folder is refused before a byte is read", "[io]") {
  const fs::path d = scratch("inputs");
  write(d / "real.json", "{}");
  fs::create_symlink(d / "real.json", d / "link.json");
  REQUIRE(::mkfifo((d / "fifo").c_str(), 0600) == 0);
  struct Case {
    fs::path path;
    std::string says;
  };
  for (const Case& c : {Case{d / "link.json", "it is a symbolic link"}, Case{d / "fifo", "it is a FIFO"},
                        Case{"/dev/zero", "it is a character device"}, Case{d, "it is a directory"},
                        Case{d / "missing.json", "No such file"}}) {
    CAPTURE(c.path);
    const auto t0 = std::chrono::steady_clock::now();
    const std::string why = refusal([&] { read_input_file(c.path.string(), "fixture"); });
    CHECK_THAT(why, Catch::Contains(c.path.string()) && Catch::Contains(c.says));
    CHECK(std::chrono::steady_clock::now() - t0 < std::chrono::seconds(2));  // a FIFO never blocks
  }
  CHECK(read_input_file((d / "real.json").string(), "fixture") == "{}");
  // Refused above the limit, before reading.
  CHECK_THAT(refusal([&] { read_input_file((d / "real.json").string(), "fixture", 1); }),
             Catch::Contains("expected at most 1 bytes, got 2"));
}

TEST_CASE("io: JSON nested without bound, a key twice, a number beyond double's range: one short line", "[io]") {
  std::string deep;
  for (int i = 0; i < 100000; ++i) deep += '[';
  for (int i = 0; i < 100000; ++i) deep += ']';
  CHECK_THAT(refusal([&] { parse_json("{\"config\": {\"x\": " + deep + "}}", "f.json"); }),
             Catch::StartsWith("f.json: config.x[][]") && Catch::Contains("expected at most 64 levels"));
  std::string ok;  // 64 levels in all are allowed
  for (int i = 0; i < 64; ++i) ok += '[';
  for (int i = 0; i < 64; ++i) ok += ']';
  CHECK_NOTHROW(parse_json(ok, "f.json"));
  CHECK_THAT(refusal([&] { parse_json("[" + ok + "]", "f.json"); }), Catch::Contains("at most 64 levels"));
  // The first "data" malformed, the second well formed: refused, not read as the second.
  CHECK_THAT(refusal([&] { parse_json(R"({"t": {"data": "x", "shape": [1], "data": [1]}})", "f.json"); }),
             Catch::Equals("f.json: t.data: expected each key once in an object, got it twice (JSON readers "
                           "disagree on which one counts)"));
  CHECK_NOTHROW(parse_json(R"({"a": {"data": 1}, "b": {"data": 2}})", "f.json"));  // one per object
  CHECK_THAT(refusal([&] { parse_json("[1e999]", "f.json"); }), Catch::Contains("malformed JSON: number overflow"));
  // A 10 MB string in a malformed document, and as a value shown in a message: cut.
  const std::string big(10'000'000, 'x');
  const std::string why = refusal([&] { parse_json("[\"" + big + "\" 1]", "f.json"); });
  CHECK_THAT(why, Catch::StartsWith("f.json: malformed JSON: "));
  CHECK(why.size() < 400);
  CHECK(show_json(nlohmann::json(big)).size() <= 43);
  CHECK(show_json(parse_json(ok, "f.json")) == "[[[[[...]]]]]");
  CHECK(show_text("a\nb\x1b", 80) == "a\\nb\\x1b");
  // Past ASCII: a line break to Python's splitlines (U+2028, U+0085), a terminal's CSI (U+009B), a bidi
  // override (U+202E) and isolate (U+2066) escaped; other text, and a character cut at its end, as it is.
  CHECK(show_text("a\u2028PASS\u2029b\u0085c\u009bd\u202ee\u2066f", 80) ==
        "a\\u2028PASS\\u2029b\\u0085c\\u009bd\\u202ee\\u2066f");
  CHECK(show_text("caf\u00e9 \u2027\u202f\u2070 \u4e2d", 80) == "caf\u00e9 \u2027\u202f\u2070 \u4e2d");
  // Bytes that are no UTF-8 text, each escaped: a lone 0x85 and 0x9B, a sequence cut at the end, an
  // overlong '/', a surrogate.
  CHECK(show_text(std::string("a\x85" "b\x9b" "c\xc0\xaf" "d\xed\xa0\x80" "x\xe2\x80"), 80) ==
        "a\\x85b\\x9bc\\xc0\\xafd\\xed\\xa0\\x80x\\xe2\\x80");
  CHECK(show_json(nlohmann::json("n\u2028PASS")) == "\"n\\u2028PASS\"");
  // The cut never splits an escape or a character, nor passes the length asked for.
  CHECK(show_text("abc\u2028", 8) == "abc...");
  CHECK(show_text("ab\u00e9\u00e9", 5) == "ab\u00e9...");
  CHECK(show_json(nlohmann::json(std::string(30, 'x') + "\u2028\u2028\u2028")).size() <= 40);
}

TEST_CASE("io: a name that names files is a plain name", "[io]") {
  for (const std::string& bad : {std::string(""), std::string("/abs/x"), std::string("../../x"), std::string(".."),
                                 std::string("."), std::string("a/b"), std::string("a\\b"), std::string("a\nb"),
                                 std::string("x\x1by"), std::string(".hidden"), std::string(129, 'n')}) {
    CAPTURE(bad);
    CHECK_THAT(refusal([&] { check_file_name(bad, "f.json", "name"); }),
               Catch::StartsWith("f.json: name: expected a plain name"));
  }
  for (const std::string& good : {std::string("mha_single"), std::string("my case (v2)"), std::string("a..b"),
                                  std::string(128, 'n'), std::string("\xc3\xa9t\xc3\xa9")})
    CHECK(refusal([&] { check_file_name(good, "f.json", "name"); }).empty());
}

TEST_CASE("io: outputs are written whole or not at all, never through a link, never over an input", "[io]") {
  const fs::path d = scratch("outputs");
  SECTION("a pair whose second file cannot be written leaves neither") {
    OutputFiles out;
    out.add((d / "o.safetensors").string(), "tensors");
    out.add((d / "missing" / "o.json").string(), "{}");
    CHECK_THAT(refusal([&] { out.commit(); }), Catch::Contains("missing") && Catch::Contains("does not exist"));
    CHECK(std::distance(fs::directory_iterator(d), {}) == 0);  // no file, no temporary left
  }
  SECTION("both, whole, replacing what was there") {
    write(d / "o.json", "old");
    OutputFiles out;
    out.add((d / "o.safetensors").string(), "tensors");
    out.add((d / "o.json").string(), "new");
    out.commit();
    CHECK(read(d / "o.json") == "new");
    CHECK(read(d / "o.safetensors") == "tensors");
    CHECK(std::distance(fs::directory_iterator(d), {}) == 2);
  }
  SECTION("one folder under two spellings is locked once; one file under two is one output, refused") {
    const fs::path cwd = fs::current_path();
    fs::current_path(d);
    const bool done = finishes(
        [&] {
          OutputFiles out;
          out.add("a.csv", "a");
          out.add((d / "b.json").string(), "b");
          out.commit();
        },
        5);
    CHECK(done);  // it waited on its own lock for ever
    CHECK(read(d / "a.csv") == "a");
    CHECK(read(d / "b.json") == "b");
    OutputFiles twice;
    twice.add("x.json", "1");
    twice.add((d / "." / "x.json").string(), "2");
    CHECK_THAT(refusal([&] { twice.commit(); }), Catch::Contains("another output of this run"));
    CHECK_FALSE(fs::exists(d / "x.json"));
    fs::current_path(cwd);
  }
  SECTION("a link is neither written through nor replaced") {
    write(d / "target", "kept");
    fs::create_symlink(d / "target", d / "link.json");
    CHECK_THAT(refusal([&] { check_output_path((d / "link.json").string(), "option --out"); }),
               Catch::StartsWith("option --out: ") && Catch::Contains("cannot write output: it is a symbolic link"));
    CHECK_THAT(refusal([&] { write_output_file((d / "link.json").string(), "x"); }),
               Catch::Contains("is a symbolic link"));
    CHECK(read(d / "target") == "kept");
    CHECK(fs::is_symlink(d / "link.json"));
  }
  SECTION("an input of this run, a folder, a device or a missing folder is refused before any work") {
    write(d / "fixture.json", "input");
    (void)read_input_file((d / "fixture.json").string(), "fixture");
    CHECK_THAT(refusal([&] { check_output_path((d / "fixture.json").string(), "option --out"); }),
               Catch::Contains("is a file this run reads"));
    CHECK_THAT(refusal([&] { write_output_file((d / "fixture.json").string(), "x"); }),
               Catch::Contains("is a file this run reads"));
    CHECK(read(d / "fixture.json") == "input");
    CHECK_THAT(refusal([&] { check_output_path(d.string(), "option --junit"); }), Catch::Contains("is a directory"));
    CHECK_THAT(refusal([&] { check_output_path("/dev/null", "option --junit"); }),
               Catch::Contains("is a character device"));
    CHECK_THAT(refusal([&] { check_output_path((d / "no" / "j.xml").string(), "option --junit"); }),
               Catch::Contains("does not exist"));
    CHECK(refusal([&] { check_output_path((d / "new.xml").string(), "option --junit"); }).empty());
  }
  SECTION("an output folder that is a link is refused; a missing one is made") {
    fs::create_directories(d / "real");
    fs::create_directory_symlink(d / "real", d / "linked");
    CHECK_THAT(refusal([&] { make_output_folder((d / "linked").string(), "option --keep"); }),
               Catch::Contains("is a symbolic link"));
    CHECK(refusal([&] { make_output_folder((d / "a" / "b").string(), "option --keep"); }).empty());
    CHECK(fs::is_directory(d / "a" / "b"));
  }
}

TEST_CASE("metrics: a 1e-3 relative difference measures 1e-3 at every scale double holds", "[compare][io]") {
  Rng rng(7);
  for (double scale : {1e-300, 1e-170, 1e-100, 1.0, 1e154, 1e200, 1e300}) {
    CAPTURE(scale);
    Tensor<double> ref({1000}), got({1000});
    for (size_t i = 0; i < 1000; ++i) {
      ref.data[i] = scale * (0.5 + rng.uniform(0, 1)) * (i % 3 ? 1 : -1);
      got.data[i] = ref.data[i] * (1 + 1e-3);
    }
    const Metrics m = measure(got, ref);
    CHECK(m.rel_l2 == Approx(1e-3).epsilon(1e-9));
    CHECK(m.l2 == Approx(1e-3 * m.ref_l2).epsilon(1e-9));
  }
  // The report's example: 87% off at 1.5e154 (the sums of squares overflowed: rel_l2 0, PASS).
  CHECK(measure(Tensor<double>({1}, {2.8e154}), Tensor<double>({1}, {1.5e154})).rel_l2 == Approx(1.3 / 1.5));
  // 3x, its negative and zeros against a reference of 1e-170 (its squares underflowed to 0).
  for (double got : {3e-170, -1e-170, 0.0})
    CHECK(measure(Tensor<double>({2}, {got, got}), Tensor<double>({2}, {1e-170, 1e-170})).rel_l2 ==
          Approx(std::fabs(got - 1e-170) / 1e-170));
  // A difference beyond double's range: 2 x 1.7e308.
  const Metrics m = measure(Tensor<double>({1}, {-1.7e308}), Tensor<double>({1}, {1.7e308}));
  CHECK(m.rel_l2 == Approx(2.0));
  CHECK(std::isinf(m.max_abs));
  // Tiny and ordinary values in one tensor (the small and medium sums combined): the tiny difference
  // is measured, not lost to an underflowing square (1e-400 is 0 in double).
  CHECK(measure(Tensor<double>({2}, {2e-200, 1.0}), Tensor<double>({2}, {1e-200, 1.0})).rel_l2 == Approx(1e-200));
  CHECK(measure(Tensor<double>({2}, {0, 0}), Tensor<double>({2}, {3e-200, 4e-200})).l2 == Approx(5e-200));
  // Tiny and huge values in one tensor: the norm is the huge ones'.
  CHECK(measure(Tensor<double>({2}, {1e-300, 2e300}), Tensor<double>({2}, {1e-300, 1e300})).rel_l2 == Approx(1.0));
}

TEST_CASE("noise model: the same relative figures at 1e-300, 1 and 1e300", "[compare][io]") {
  Rng rng(11);
  Tensor<double> a({500}), b({500});
  for (size_t i = 0; i < 500; ++i) {
    b.data[i] = rng.normal();
    a.data[i] = b.data[i] * (1 + 1e-7 * rng.normal() * (i < 10 ? 30 : 1));
  }
  const NoiseEstimate one = estimate_noise({{&a, &b}});
  for (double scale : {1e-300, 1e300}) {
    CAPTURE(scale);
    Tensor<double> as = a, bs = b;
    for (double& x : as.data) x *= scale;
    for (double& x : bs.data) x *= scale;
    const NoiseEstimate e = estimate_noise({{&as, &bs}});
    CHECK(e.rms == Approx(one.rms).epsilon(1e-6));
    CHECK(e.n_eff == Approx(one.n_eff).epsilon(1e-6));
  }
}

TEST_CASE("sizes: a product of sizes that would wrap is refused, a 0 first or not", "[io]") {
  CHECK(numel({int64_t(1) << 31, 0}) == 0);
  CHECK_THROWS_AS(numel({int64_t(1) << 31, 0, int64_t(1) << 33}), ShapeError);
  CHECK_THROWS_AS(numel({0, int64_t(1) << 62, 4}), ShapeError);
  CHECK_THROWS_AS(numel({-2, 3}), ShapeError);
  CHECK_THROWS_AS(Tensor<float>({int64_t(1) << 20, int64_t(1) << 20}), ShapeError);  // above any one tensor
  // The product [2^31, 0] x [0, 2^33]: no output of 2^64 elements is made (a wrapped size wrote
  // through a null pointer before).
  const Shape out = matmul_shape({int64_t(1) << 31, 0}, {0, int64_t(1) << 33});
  CHECK(out == Shape{int64_t(1) << 31, int64_t(1) << 33});
  CHECK_THROWS_AS(Tensor<double>(out), ShapeError);
}
