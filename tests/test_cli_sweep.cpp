// tparity sweep as a user runs it: usage errors, the CSV and JSON it writes, shards that add up to the
// whole sweep, skipped points, the progress bar; and scripts/plot_sweep on its CSV.
// The expected values come from the documentation (the CSV header, the JSON keys, the gates) and from
// `tparity run` on the same sizes, never from the sweep's own code.
#include <algorithm>
#include <catch2/catch.hpp>
#include <cmath>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <map>
#include <nlohmann/json.hpp>
#include <regex>
#include <set>
#include <sstream>

#include "cli_support.hpp"

using nlohmann::json;
namespace fs = std::filesystem;

using namespace clitest;

namespace {

// The sweep needs LibTorch; built without it, a valid sweep exits 2 with one line and writes nothing.
bool refused_without_torch(const std::string& args, const fs::path& file) {
  if (with_torch()) return false;
  fs::remove(file);
  const Result r = cli(args);
  CHECK(r.code == 2);
  CHECK(one_line(r.err));
  CHECK_THAT(r.err, Catch::Contains("LibTorch"));
  CHECK_FALSE(fs::exists(file));
  return true;
}

// Fields between separators; a text ending in a newline has no empty last line.
std::vector<std::string> split_on(std::string s, char sep) {
  if (sep == '\n' && !s.empty() && s.back() == '\n') s.pop_back();
  std::vector<std::string> parts;
  size_t start = 0;
  for (size_t i = 0; i <= s.size(); ++i)
    if (i == s.size() || s[i] == sep) parts.push_back(s.substr(start, i - start)), start = i + 1;
  return parts;
}

struct Csv {
  std::string header;
  std::vector<std::string> lines;                        // data rows, as written
  std::vector<std::map<std::string, std::string>> rows;  // by column name
};

Csv read_csv(const fs::path& p) {
  Csv c;
  const std::vector<std::string> lines = split_on(slurp(p), '\n');
  REQUIRE_FALSE(lines.empty());
  c.header = lines[0];
  const std::vector<std::string> names = split_on(c.header, ',');
  for (size_t i = 1; i < lines.size(); ++i) {
    const std::vector<std::string> fields = split_on(lines[i], ',');
    REQUIRE(fields.size() == names.size());
    std::map<std::string, std::string> row;
    for (size_t k = 0; k < names.size(); ++k) row[names[k]] = fields[k];
    c.lines.push_back(lines[i]);
    c.rows.push_back(std::move(row));
  }
  return c;
}

// The header the help and the report document.
const std::string kHeader =
    "case,batch,seq,kv_seq,dim,heads,ffn,seed,component,"
    "hand64_vs_torch64_rel_l2,hand64_vs_torch64_bound,"
    "hand32_vs_torch64_rel_l2,hand32_vs_torch64_bound,"
    "torch32_vs_torch64_rel_l2,"
    "hand32_vs_torch32_rel_l2,hand32_vs_torch32_l2,"
    "local_hand64_vs_torch64_rel_l2,local_hand64_vs_torch64_bound,"
    "local_hand32_vs_torch64_rel_l2,local_hand32_vs_torch64_bound,"
    "pass";

// The tiny grid of these tests: 2 x 2 points, under a second.
const std::string kGrid = "sweep --case multihead --seq 4,8 --dim 8 --heads 1,2 --batch 1";

// `tparity run` on one point of the grid, as JSON.
std::string run_args(const std::string& base, int heads, int seq) {
  return base + " --heads " + std::to_string(heads) + " --seq " + std::to_string(seq) + " --format json";
}

bool close_rel(double a, double b, double rel) { return std::abs(a - b) <= rel * std::max(std::abs(a), std::abs(b)); }

// Runs each bad command line with --csv and --json (unless it names its own) and checks the refusal:
// exit 2, one line on stderr naming the option, nothing on stdout, no file written.
void check_refused(const std::vector<std::pair<std::string, std::string>>& bad) {
  const fs::path csv = scratch() / "never.csv", js = scratch() / "never.json";
  const std::string files = " --csv " + csv.string() + " --json " + js.string();
  for (const auto& [args, mention] : bad) {
    CAPTURE(args);
    fs::remove(csv);
    fs::remove(js);
    const bool own_files = args.find("--csv") != std::string::npos || args.find("--json") != std::string::npos;
    const Result r = cli(args + (own_files ? "" : files));
    CHECK(r.code == 2);
    CHECK(one_line(r.err));
    CHECK_THAT(r.err, Catch::Contains(mention));
    CHECK(r.out.empty());
    CHECK_FALSE(fs::exists(csv));
    CHECK_FALSE(fs::exists(js));
  }
}

}  // namespace

TEST_CASE("cli: sweep refuses a size list that does not parse with exit 2 and one line", "[cli][sweep]") {
  check_refused({
      {"sweep --seq 4,x", "option --seq: expected a comma-separated list of positive integers"},
      {"sweep --seq 0", "option --seq"},
      {"sweep --dim 8,-4", "option --dim"},
      {"sweep --seq 4,,8", "option --seq"},
      {"sweep --heads 1,2,1", "option --heads"},
      {"sweep --kv-seq 99999999999999999999", "option --kv-seq"},
      {"sweep --batch -1", "option --batch"},
  });
}

TEST_CASE("cli: sweep refuses bad options with exit 2 and one line naming the option", "[cli][sweep]") {
  const fs::path js = scratch() / "never.json";
  check_refused({
      {"sweep --shard 3/2", "option --shard: expected I/N"},
      {"sweep --shard 2/2", "option --shard"},
      {"sweep --shard 0/0", "option --shard"},
      {"sweep --shard a/b", "option --shard"},
      // I * points overflowed size_t: a slice of nothing, silently (census's --shard likewise)
      {"sweep --shard 9000000000000000000/9000000000000000001",
       "option --shard: expected I/N with 0 <= I < N <= 2^40"},
      {"sweep --case nope", "option --case: expected one of single, batched, multihead, block, sdpa, encoder, decoder"},
      {"sweep --case nope", "got \"nope\""},
      {"sweep --case multihead --ffn 16", "option --ffn"},
      {"sweep --case sdpa --heads 2", "option --heads"},
      {"sweep --case block --seq 4,8 --kv-seq 8", "kv-seq"},
      {"sweep --case sdpa --mask padding", "option --mask"},
      {"sweep --seed -1", "--seed"},
      {"sweep --seq 4,1024 --dim 8 --heads 1 --max-elements 1000", "above --max-elements 1000"},
      {"sweep --dim 8 --heads 3", "--heads"},
      {"sweep --csv ''", "option --csv"},
      {"sweep --seq 4 --dim 8 --csv /nonexistent-dir/s.csv --json " + js.string(),
       "/nonexistent-dir/s.csv: cannot write output"},
      {"sweep --seq 4 --dim 8 --json " + scratch().string(), scratch().string() + ": cannot write output"},
  });
  // A file that is already there stays as it was when the sweep refuses to run.
  const fs::path csv = scratch() / "before.csv";
  std::ofstream(csv) << "before\n";
  CHECK(cli("sweep --shard 5/5 --csv " + csv.string()).code == 2);
  CHECK(slurp(csv) == "before\n");
  // No temporary file is left behind.
  for (const auto& e : fs::directory_iterator(scratch()))
    CHECK(e.path().filename().string().find(".tmp") == std::string::npos);
  CHECK_THAT(cli("sweep --help").out, Catch::Contains("--shard"));
}

TEST_CASE("cli: sweep writes one CSV row per point and component as run measures them", "[cli][sweep][torch]") {
  const fs::path csv = scratch() / "grid.csv";
  if (refused_without_torch(kGrid + " --csv " + csv.string(), csv)) return;
  fs::remove(csv);
  const Result r = cli(kGrid + " --csv " + csv.string());
  REQUIRE(r.code == 0);
  CHECK(r.err.empty());  // no progress bar when stderr is not a terminal
  CHECK_THAT(r.out, Catch::Contains("4 point(s) run: 4 passed, 0 failed"));
  CHECK_THAT(r.out, Catch::Contains(csv.string()));
  const Csv c = read_csv(csv);
  CHECK(c.header == kHeader);

  // The points in the documented order (heads before seq, seq fastest), each with run's components.
  const std::vector<std::pair<int, int>> order = {{1, 4}, {1, 8}, {2, 4}, {2, 8}};  // heads, seq
  size_t row = 0;
  const std::regex number(R"(-?\d\.\d{6}e[+-]\d{2,3})");
  for (const auto& [heads, seq] : order) {
    CAPTURE(heads, seq);
    const Result run = cli(run_args("run --case multihead --batch 1 --dim 8", heads, seq));
    REQUIRE(run.code == 0);
    const json rc = json::parse(run.out).at("cases").at(0);
    for (const json& comp : rc.at("components")) {
      REQUIRE(row < c.rows.size());
      const auto& f = c.rows[row++];
      CAPTURE(c.lines[row - 1]);
      CHECK(f.at("case") == "multihead");
      CHECK(f.at("batch") == "1");
      CHECK(f.at("seq") == std::to_string(seq));
      CHECK(f.at("kv_seq") == std::to_string(seq));  // self-attention: S = L
      CHECK(f.at("dim") == "8");
      CHECK(f.at("heads") == std::to_string(heads));
      CHECK(f.at("seed") == std::to_string(rc.at("seed").get<uint64_t>()));
      CHECK(f.at("component") == comp.at("name").get<std::string>());
      CHECK(f.at("pass") == "true");
      for (const auto& [name, value] : f)
        if (name.find("_l2") != std::string::npos || name.find("_bound") != std::string::npos)
          CHECK(std::regex_match(value, number));
      const json& legs = comp.at("legs");
      for (const char* leg : {"hand32_vs_torch64", "torch32_vs_torch64", "hand32_vs_torch32"})
        CHECK(close_rel(std::stod(f.at(std::string(leg) + "_rel_l2")), legs.at(leg).at("rel_l2").get<double>(), 1e-5));
      CHECK(close_rel(std::stod(f.at("hand32_vs_torch32_l2")), legs.at("hand32_vs_torch32").at("l2").get<double>(),
                      1e-5));
      // The gates as the README states them: 1e-10 for the float64 legs; 2 x quantile x LibTorch's
      // sampled noise + 4u for both float32 legs, the noise as the noise leg measured it.
      CHECK(std::stod(f.at("hand64_vs_torch64_bound")) == 1e-10);
      CHECK(std::stod(f.at("local_hand64_vs_torch64_bound")) == 1e-10);
      const json& noise = legs.at("torch32_vs_torch64").at("noise");
      const double u4 = 4 * std::ldexp(1.0, -24);
      const double want = 2 * noise.at("quantile").get<double>() * noise.at("rms").get<double>() + u4;
      CHECK(noise.at("samples").get<int>() >= 1);
      CHECK(close_rel(std::stod(f.at("hand32_vs_torch64_bound")), want, 1e-5));
      CHECK(close_rel(std::stod(f.at("local_hand32_vs_torch64_bound")), want, 1e-5));
    }
  }
  CHECK(row == c.rows.size());
}

TEST_CASE("cli: sweep JSON has the documented keys and one point per grid point", "[cli][sweep][torch]") {
  const fs::path js = scratch() / "grid.json";
  if (refused_without_torch(kGrid + " --json " + js.string(), js)) return;
  fs::remove(js);
  const Result r = cli(kGrid + " --mask random --seed 11 --random-params --json " + js.string());
  REQUIRE(r.code == 0);
  const json doc = json::parse(slurp(js));
  auto keys = [](const json& j) {
    std::set<std::string> k;
    for (auto it = j.begin(); it != j.end(); ++it) k.insert(it.key());
    return k;
  };
  CHECK(keys(doc) == std::set<std::string>{"sweep", "points", "skipped", "summary"});
  const json& s = doc.at("sweep");
  CHECK(keys(s) == std::set<std::string>{"case", "module", "axes", "grid", "mask", "seed", "random_params",
                                         "max_elements", "grid_points", "shard"});
  CHECK(s.at("case") == "multihead");
  CHECK(s.at("mask") == "random");
  CHECK(s.at("seed") == 11);
  CHECK(s.at("random_params") == true);
  CHECK(s.at("grid").at("seq") == json({4, 8}));
  CHECK(s.at("grid").at("heads") == json({1, 2}));
  CHECK(s.at("grid").at("dim") == json({8}));
  CHECK(s.at("grid").at("batch") == json({1}));
  CHECK(s.at("grid_points") == 4);
  CHECK(s.at("shard").at("index") == 0);
  CHECK(s.at("shard").at("count") == 1);
  REQUIRE(doc.at("points").size() == 4);
  CHECK(doc.at("skipped").empty());
  CHECK(doc.at("summary") == json({{"run", 4}, {"passed", 4}, {"failed", 0}, {"skipped", 0}}));
  const std::set<std::string> point_keys = {"index",       "label",
                                            "batch",       "seq",
                                            "kv_seq",      "dim",
                                            "heads",       "ffn",
                                            "seed",        "name",
                                            "description", "config",
                                            "pass",        "components",
                                            "failures",    "notes",
                                            "not_checked", "first_divergence",
                                            "summary",     "diagnoses",
                                            "reference",   "stored_reference"};
  for (size_t i = 0; i < 4; ++i) {
    const json& p = doc.at("points").at(i);
    CAPTURE(i);
    CHECK(keys(p) == point_keys);
    CHECK(p.at("index") == i);
    CHECK(p.at("pass") == true);
    CHECK(p.at("seed") == 11);
    // The same sizes through run: the same description and components.
    const json rc =
        json::parse(cli(run_args("run --case multihead --batch 1 --dim 8 --mask random --seed 11 --random-params",
                                     p.at("heads").get<int>(), p.at("seq").get<int>()))
                        .out)
            .at("cases")
            .at(0);
    CHECK(p.at("description") == rc.at("description"));
    REQUIRE(p.at("components").size() == rc.at("components").size());
    for (size_t k = 0; k < rc.at("components").size(); ++k)
      CHECK(p.at("components")[k].at("name") == rc.at("components")[k].at("name"));
  }
}

TEST_CASE("cli: sweep shards 0/2 and 1/2 are disjoint and together the whole sweep", "[cli][sweep][torch]") {
  const fs::path full = scratch() / "full.csv";
  if (refused_without_torch(kGrid + " --csv " + full.string(), full)) return;
  REQUIRE(cli(kGrid + " --csv " + full.string()).code == 0);
  const Csv whole = read_csv(full);
  const std::multiset<std::string> all(whole.lines.begin(), whole.lines.end());
  for (int n : {2, 3}) {
    CAPTURE(n);
    std::multiset<std::string> joined;
    std::vector<size_t> sizes;
    for (int i = 0; i < n; ++i) {
      const fs::path part = scratch() / ("part" + std::to_string(i) + ".csv");
      fs::remove(part);
      const Result r =
          cli(kGrid + " --shard " + std::to_string(i) + "/" + std::to_string(n) + " --csv " + part.string());
      REQUIRE(r.code == 0);
      CHECK_THAT(r.out, Catch::Contains("shard " + std::to_string(i) + "/" + std::to_string(n)));
      const Csv c = read_csv(part);
      CHECK(c.header == whole.header);
      std::set<std::string> points;  // points are (heads, seq) here
      for (const auto& row : c.rows) points.insert(row.at("heads") + "/" + row.at("seq"));
      sizes.push_back(points.size());
      for (const std::string& l : c.lines) {
        CHECK(joined.count(l) == 0);  // disjoint (every row names its point and component)
        joined.insert(l);
      }
    }
    CHECK(joined == all);
    CHECK(*std::max_element(sizes.begin(), sizes.end()) - *std::min_element(sizes.begin(), sizes.end()) <= 1);
  }
  // One point over two shards: one runs it, the other runs nothing and still writes the header.
  size_t ran = 0;
  for (const char* shard : {"0/2", "1/2"}) {
    const fs::path part = scratch() / "one.csv";
    fs::remove(part);
    const Result r =
        cli(std::string("sweep --seq 4 --dim 8 --heads 2 --shard ") + shard + " --csv " + part.string());
    REQUIRE(r.code == 0);
    const Csv c = read_csv(part);
    CHECK(c.header == kHeader);
    ran += c.rows.empty() ? 0 : 1;
  }
  CHECK(ran == 1);
}

TEST_CASE("cli: sweep skips a point whose heads do not divide dim and says so", "[cli][sweep][torch]") {
  const fs::path csv = scratch() / "skip.csv", js = scratch() / "skip.json";
  const std::string args =
      "sweep --seq 4 --dim 8 --heads 1,3 --batch 1 --csv " + csv.string() + " --json " + js.string();
  if (refused_without_torch(args, csv)) return;
  const Result r = cli(args);
  CHECK(r.code == 0);
  CHECK_THAT(r.out, Catch::Contains("skipped"));
  CHECK_THAT(r.out, Catch::Contains("heads 3 does not divide dim 8"));
  CHECK_THAT(r.out, Catch::Contains("1 point(s) run"));
  CHECK_THAT(r.out, Catch::Contains("1 skipped"));
  for (const auto& row : read_csv(csv).rows) CHECK(row.at("heads") == "1");
  const json doc = json::parse(slurp(js));
  REQUIRE(doc.at("skipped").size() == 1);
  CHECK(doc.at("skipped")[0].at("heads") == 3);
  CHECK(doc.at("skipped")[0].at("index") == 1);
  CHECK_THAT(doc.at("skipped")[0].at("reason").get<std::string>(), Catch::Contains("does not divide"));
  CHECK(doc.at("points").size() == 1);
}

TEST_CASE("cli: sweep draws a progress bar on stderr only when it is a terminal", "[cli][sweep][torch]") {
  if (!with_torch()) return;  // refused before any progress, as tested above
  if (shell("command -v script").code != 0) {
    WARN("util-linux script is missing: the terminal case is not tested");
    return;
  }
  // script runs the sweep on a pseudo-terminal; stdout goes to a file, stderr (the bar) to the terminal.
  const fs::path out = scratch() / "tty_stdout";
  const Result r =
      shell("script -qec '" + tparity_bin() + " " + kGrid + " >" + out.string() + "' /dev/null");
  CHECK(r.code == 0);
  CHECK_THAT(r.out, Catch::Contains("\r["));
  CHECK_THAT(r.out, Catch::Contains("] 1/4 multihead B=1 T=4 d=8 heads=1"));
  CHECK_THAT(r.out, Catch::Contains("] 4/4 multihead B=1 T=8 d=8 heads=2"));
  CHECK_THAT(slurp(out), Catch::Contains("4 point(s) run"));
  CHECK_THAT(slurp(out), !Catch::Contains("\r"));
}

TEST_CASE("cli: sweep plot_sweep draws the CSV as a PNG", "[cli][sweep][torch]") {
  const std::string plot = (fs::path(TPARITY_FIXTURES).parent_path() / "scripts" / "plot_sweep").string();
  const fs::path csv = scratch() / "plot.csv", png = scratch() / "plot.png";
  // Options are checked before anything is installed.
  Result r = shell(plot + " " + (scratch() / "absent.csv").string());
  CHECK(r.code == 2);
  CHECK(one_line(r.err));
  CHECK_THAT(r.err, Catch::Contains("absent.csv"));
  if (!with_torch()) return;
  REQUIRE(cli(kGrid + " --csv " + csv.string()).code == 0);
  r = shell(plot + " " + csv.string() + " --leg hand32_vs_nothing");
  CHECK(r.code == 2);
  CHECK(one_line(r.err));
  CHECK_THAT(r.err, Catch::Contains("--leg"));
  r = shell(plot + " " + csv.string() + " --x colour");
  CHECK(r.code == 2);
  CHECK(one_line(r.err));
  CHECK_THAT(r.err, Catch::Contains("--x"));
  if (shell("command -v gnuplot").code != 0) {
    WARN("gnuplot is missing (scripts/plot_sweep would install gnuplot-nox): the drawing is not tested");
    return;
  }
  fs::remove(png);
  r = shell(plot + " " + csv.string() + " " + png.string() + " --x seq");
  CHECK(r.code == 0);
  REQUIRE(fs::exists(png));
  CHECK(slurp(png).substr(0, 8) == std::string("\x89PNG\r\n\x1a\n", 8));
  // Default: next to the CSV, the same name with .png.
  fs::remove(png);
  CHECK(shell(plot + " " + csv.string()).code == 0);
  CHECK(fs::exists(png));
}
