// tparity sweep: one case over a grid of sizes, every component's error on every leg, as CSV and JSON.
// Points are the cartesian product of the axes in a fixed order; --shard I/N runs one contiguous slice.
#include <fmt/format.h>

#include <cerrno>
#include <charconv>
#include <tuple>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <limits>
#include <optional>

#include "common.hpp"
#include "tparity/compare/report.hpp"
#include "tparity/eval/evaluate.hpp"
#include "tparity/fixture/fixture.hpp"
#include "tparity/harness/cases.hpp"
#include "tparity/torch/reference.hpp"

namespace tparity::cli {

namespace {

// --- sweep ------------------------------------------------------------------------------------------

constexpr int64_t kMaxSize = std::numeric_limits<int64_t>::max() / 2;  // as run's size options

// The CSV's columns per leg, for every leg of a case evaluation in the report's order
// (legs_with_local(), compare/legs.cpp): its rel_l2; its bound when it is gated (semantic or numeric);
// its l2 when it is reported only (hand32_vs_torch32, the seeds' figure).
struct CsvLeg {
  std::string name;
  bool bound, l2;
};

std::vector<CsvLeg> csv_legs() {
  std::vector<CsvLeg> legs;
  for (const LegSpec& l : legs_with_local())
    legs.push_back({l.name, l.role == LegRole::Semantic || l.role == LegRole::Numeric, l.role == LegRole::Report});
  return legs;
}

struct SweepOptions {
  std::string case_name = "multihead";
  std::optional<std::string> seq, kv_seq, dim, heads, batch, ffn;  // comma-separated lists
  std::optional<std::string> mask;
  std::optional<uint64_t> seed;
  bool random_params = false;
  std::optional<std::string> shard;
  std::optional<std::string> csv, json;
  int64_t max_elements = int64_t(1) << 28;
};

struct Shard {
  int64_t index = 0, count = 1;
};

struct Point {
  size_t index;  // in the whole grid
  CaseSpec spec;
  std::string skip;  // why it does not run; empty when it runs
};

// "16,64,256" -> {16, 64, 256}; every value in [min, kMaxSize], none twice.
std::vector<int64_t> parse_list(const std::string& option, const std::string& text, int64_t min) {
  const std::string what = min == 0 ? "non-negative integers (0 = unbatched)" : "positive integers";
  auto bad = [&](const std::string& why) {
    return InputError(fmt::format("option {}: expected a comma-separated list of {}, e.g. 16,64,256, got \"{}\"{}",
                                  option, what, text, why.empty() ? "" : " (" + why + ")"));
  };
  std::vector<int64_t> values;
  size_t start = 0;
  while (true) {
    const size_t comma = std::min(text.find(',', start), text.size());
    const std::string item = text.substr(start, comma - start);
    int64_t v = 0;
    const auto [end, ec] = std::from_chars(item.data(), item.data() + item.size(), v);
    if (item.empty() || ec == std::errc::invalid_argument || end != item.data() + item.size())
      throw bad(item.empty() ? "an empty item" : "");
    if (ec == std::errc::result_out_of_range || v > kMaxSize) throw bad(fmt::format("{} is above {}", item, kMaxSize));
    if (v < min) throw bad(fmt::format("{} is {}", v, min == 0 ? "negative" : "not positive"));
    for (int64_t w : values)
      if (w == v) throw bad(fmt::format("{} appears twice", v));
    values.push_back(v);
    if (comma == text.size()) break;
    start = comma + 1;
  }
  return values;
}

// The point's sizes, as the progress bar and the notes name them.
std::string label(const CaseSpec& s) {
  std::string l = s.name + (s.batch ? fmt::format(" B={}", s.batch) : std::string(" unbatched"));
  l += fmt::format(" T={}", s.seq);
  if (s.kv_seq && s.kv_seq != s.seq) l += fmt::format(" S={}", s.kv_seq);
  l += fmt::format(" d={}", s.dim);
  if (s.module != ModuleKind::ScaledDotProductAttention) l += fmt::format(" heads={}", s.heads);
  if (s.ffn > 0) l += fmt::format(" ffn={}", s.ffn);
  return l;
}

int64_t kv_of(const CaseSpec& s) { return s.kv_seq ? s.kv_seq : s.seq; }

// A bar on stderr, rewritten in place, only when stderr is a terminal.
class Progress {
 public:
  explicit Progress(size_t total) : total_(total) {}
  void show(size_t done, const std::string& what) {
    constexpr size_t kWidth = 24;
    const size_t fill = total_ ? done * kWidth / total_ : kWidth;
    std::string bar(fill, '=');
    if (fill < kWidth) bar += '>' + std::string(kWidth - fill - 1, ' ');
    line_.show(fmt::format("[{}] {}/{} {}", bar, done + 1, total_, what));
  }

 private:
  StatusLine line_;
  size_t total_;
};

// The CSV's header: the point, the component, per leg its rel_l2 (and bound when gated; and l2, the
// seeds' figure, for hand32_vs_torch32), the component's verdict.
std::string csv_columns() {
  std::string h = "case,batch,seq,kv_seq,dim,heads,ffn,seed,component";
  for (const CsvLeg& leg : csv_legs()) {
    h += fmt::format(",{}_rel_l2", leg.name);
    if (leg.bound) h += fmt::format(",{}_bound", leg.name);
    if (leg.l2) h += fmt::format(",{}_l2", leg.name);
  }
  return h + ",pass";
}

std::string csv_rows(const CaseSpec& s, const CaseReport& r) {
  const std::vector<CsvLeg> legs = csv_legs();
  std::string rows;
  for (const ComponentReport& c : r.components) {
    std::string row = fmt::format("{},{},{},{},{},{},{},{},{}", s.name, s.batch, s.seq, kv_of(s), s.dim, s.heads, s.ffn,
                                  s.seed, c.name);
    for (const CsvLeg& leg : legs) {
      const Leg* l = c.leg(leg.name);  // every leg is there for a case; an absent one leaves empty fields
      auto num = [&](double v) { return l ? fmt::format(",{:.6e}", v) : std::string(","); };
      row += num(l ? l->m.rel_l2 : 0);
      if (leg.bound) row += num(l ? l->bound : 0);
      if (leg.l2) row += num(l ? l->m.l2 : 0);
    }
    rows += row + (c.pass ? ",true\n" : ",false\n");
  }
  return rows;
}

nlohmann::json point_json(const Point& p) {
  const CaseSpec& s = p.spec;
  return {{"index", p.index}, {"label", label(s)}, {"batch", s.batch}, {"seq", s.seq},  {"kv_seq", kv_of(s)},
          {"dim", s.dim},     {"heads", s.heads},  {"ffn", s.ffn},     {"seed", s.seed}};
}

int sweep(const SweepOptions& o) {
  const CaseSpec base = find_case(o.case_name);
  const bool ffn_case = base.ffn > 0;  // the cases with a feed-forward (encoder and decoder layers, stacks)
  const bool sdpa = base.module == ModuleKind::ScaledDotProductAttention;
  auto axis = [](const std::optional<std::string>& text, const char* option, int64_t min,
                 int64_t fallback) -> std::vector<int64_t> {
    return text ? parse_list(option, *text, min) : std::vector<int64_t>{fallback};
  };
  auto refuse = [&](const char* option, const std::string& why) {
    return InputError(
        fmt::format("option {}: does not apply to case {} ({} {})", option, base.name, module_name(base.module), why));
  };
  if (o.ffn && !ffn_case) throw refuse("--ffn", "has no feed-forward");
  if (o.heads && sdpa) throw refuse("--heads", "has no heads");
  const std::vector<int64_t> batches = axis(o.batch, "--batch", 0, 1), seqs = axis(o.seq, "--seq", 1, base.seq),
                             kv_seqs = axis(o.kv_seq, "--kv-seq", 1, base.kv_seq),
                             dims = axis(o.dim, "--dim", 1, base.dim), heads = axis(o.heads, "--heads", 1, base.heads),
                             ffns = axis(o.ffn, "--ffn", 1, base.ffn);
  Shard shard;
  if (o.shard) std::tie(shard.index, shard.count) = parse_shard(*o.shard);
  for (const auto& [option, file] : {std::pair{"--csv", o.csv}, std::pair{"--json", o.json}})
    if (file && file->empty()) throw InputError(fmt::format("option {}: expected a file name, got \"\"", option));
  if (o.csv && o.json && std::filesystem::weakly_canonical(*o.csv) == std::filesystem::weakly_canonical(*o.json))
    throw InputError(
        fmt::format("option --json: expected a file other than --csv's, got \"{}\" and --csv \"{}\"", *o.json, *o.csv));

  // The grid, in a fixed order: batch, dim, heads, ffn, seq, kv-seq (the last varies fastest).
  std::vector<Point> grid;
  for (int64_t b : batches)
    for (int64_t d : dims)
      for (int64_t h : heads)
        for (int64_t f : ffns)
          for (int64_t t : seqs)
            for (int64_t kv : kv_seqs) {
              CaseOverrides ov;
              // only the axes that move the case: apply_overrides refuses a size the kind has not
              if (b != base.batch) ov.batch = b;
              if (d != base.dim) ov.dim = d;
              if (h != base.heads) ov.heads = h;
              if (f != base.ffn) ov.ffn = f;
              if (t != base.seq) ov.seq = t;
              if (kv != base.kv_seq) ov.kv_seq = kv;
              ov.mask = o.mask, ov.seed = o.seed, ov.random_params = o.random_params;
              Point p{grid.size(), base, ""};
              apply_overrides(p.spec, ov);
              if (!sdpa && p.spec.dim % p.spec.heads)
                p.skip = fmt::format("heads {} does not divide dim {}", p.spec.heads, p.spec.dim);
              else
                check_size(p.spec, o.max_elements);
              grid.push_back(std::move(p));
            }
  size_t runnable = 0;
  for (const Point& p : grid) runnable += p.skip.empty() ? 1 : 0;
  if (!runnable)
    throw InputError(
        fmt::format("options --heads and --dim: no point of the grid can run: no head count ({}) divides "
                    "a dimension ({})",
                    fmt::join(heads, ","), fmt::join(dims, ",")));

  // This shard's slice: [I * P / N, (I + 1) * P / N), sizes differing by at most one.
  const size_t P = grid.size(), begin = size_t(shard.index) * P / size_t(shard.count),
               end = size_t(shard.index + 1) * P / size_t(shard.count);
  const std::vector<Point> mine(grid.begin() + std::ptrdiff_t(begin), grid.begin() + std::ptrdiff_t(end));
  // make_problem refuses what the checks above do not (a mask the module lacks, a kv-seq for a
  // self-attention encoder): every point of the grid, so that every shard refuses alike, before
  // anything runs. It draws the inputs, a small cost next to evaluating them.
  for (const Point& p : grid)
    if (p.skip.empty()) make_problem(p.spec);
  for (const std::optional<std::string>& f : {o.csv, o.json})
    if (f) check_output_path(*f, "option --csv/--json");
  if (!torch_available())
    throw InputError("sweep compares against LibTorch, and tparity was built without it (-DTPARITY_WITH_TORCH=OFF)");

  // Run.
  for (const Point& p : mine)
    if (!p.skip.empty()) std::fputs(fmt::format("note: skipped {}: {}\n", label(p.spec), p.skip).c_str(), stdout);
  std::fflush(stdout);
  size_t to_run = 0, done = 0, failed = 0;
  for (const Point& p : mine) to_run += p.skip.empty() ? 1 : 0;
  std::string csv = csv_columns() + "\n";
  nlohmann::json points = nlohmann::json::array(), skipped = nlohmann::json::array();
  std::vector<std::string> failures;
  {
    Progress progress(to_run);
    for (const Point& p : mine) {
      if (!p.skip.empty()) {
        nlohmann::json j = point_json(p);
        j["reason"] = p.skip;
        skipped.push_back(std::move(j));
        continue;
      }
      progress.show(done, label(p.spec));
      const CaseReport r = evaluate_problem(make_problem(p.spec), p.spec.describe(), p.spec.seed, GatePolicy{});
      ++done;
      csv += csv_rows(p.spec, r);
      nlohmann::json j = point_json(p);
      j.update(to_json(r));
      points.push_back(std::move(j));
      if (!r.pass) {
        ++failed;
        for (const std::string& f : r.failures) failures.push_back(fmt::format("FAIL {}: {}", label(p.spec), f));
      }
    }
  }

  // Write.
  auto grid_axis = [](const std::vector<int64_t>& v, bool applies) {
    return applies ? nlohmann::json(v) : nlohmann::json(nullptr);
  };
  const nlohmann::json doc = {
      {"sweep",
       {{"case", base.name},
        {"module", module_name(base.module)},
        {"axes", {"batch", "dim", "heads", "ffn", "seq", "kv_seq"}},
        {"grid",
         {{"batch", batches},
          {"dim", dims},
          {"heads", grid_axis(heads, !sdpa)},
          {"ffn", grid_axis(ffns, ffn_case)},
          {"seq", seqs},
          {"kv_seq", grid_axis(kv_seqs, kv_seqs != std::vector<int64_t>{0})}}},
        {"mask", mask_kind_name(grid.front().spec.mask)},
        {"seed", grid.front().spec.seed},
        {"random_params", grid.front().spec.random_params},
        {"max_elements", o.max_elements},
        {"grid_points", P},
        {"shard", {{"index", shard.index}, {"count", shard.count}, {"begin", begin}, {"end", end}}}}},
      {"points", std::move(points)},
      {"skipped", std::move(skipped)},
      {"summary", {{"run", done}, {"passed", done - failed}, {"failed", failed}, {"skipped", mine.size() - to_run}}}};
  std::vector<std::string> written;
  OutputFiles out;  // both or neither
  if (o.csv) out.add(*o.csv, csv), written.push_back(*o.csv);
  if (o.json) out.add(*o.json, doc.dump(-1, ' ', false, kBadUtf8Replaced) + "\n"), written.push_back(*o.json);
  out.commit();

  for (const std::string& f : failures) std::fputs((f + "\n").c_str(), stdout);
  std::fputs(
      fmt::format("sweep {}{}: {} point(s) run: {} passed, {} failed; {} skipped; {}\n", base.name,
                  o.shard ? fmt::format(" shard {}/{}", shard.index, shard.count) : std::string(), done, done - failed,
                  failed, mine.size() - to_run,
                  written.empty() ? std::string("no file written") : fmt::format("wrote {}", fmt::join(written, ", ")))
          .c_str(),
      stdout);
  return failed ? kFail : kPass;
}

}  // namespace

void register_sweep(CLI::App& app, Action& action) {
  auto o = std::make_shared<SweepOptions>();
  CLI::App* cmd = app.add_subcommand(
      "sweep", "Run one case over a grid of sizes: every component's error on every leg, as CSV and JSON");
  cmd->add_option("--case", o->case_name, "The case whose sizes are swept: " + case_names())
      ->type_name("NAME")
      ->capture_default_str();
  cmd->add_option("--seq", o->seq, "Query sequence lengths L (T), e.g. 16,64,256,1024 (default: the case's)")
      ->type_name("LIST");
  cmd->add_option("--kv-seq", o->kv_seq,
                  "Key/value (memory) sequence lengths S; not for self-attention encoders (default: the case's; "
                  "S = L for self-attention)")
      ->type_name("LIST");
  cmd->add_option("--dim", o->dim, "Embedding dimensions E (d_model) (default: the case's)")->type_name("LIST");
  cmd->add_option("--heads", o->heads, "Head counts; not for sdpa (default: the case's)")->type_name("LIST");
  cmd->add_option("--batch", o->batch, "Batch sizes B, 0 = unbatched input (default: 1, not the case's)")
      ->type_name("LIST");
  cmd->add_option("--ffn", o->ffn, "dim_feedforward values; cases with a feed-forward only (default: the case's)")
      ->type_name("LIST");
  cmd->add_option("--mask", o->mask,
                  "none, causal (float -inf above the diagonal), random (bool), padding (bool key padding); "
                  "default: the case's")
      ->check(CLI::IsMember({"none", "causal", "random", "padding"}));
  add_seed_option(*cmd, o->seed, "Seed of weights and inputs at every point (default: the case's own)");
  cmd->add_flag("--random-params", o->random_params,
                "Draw biases and LayerNorm affine at random instead of torch's constant init");
  cmd->add_option("--shard", o->shard,
                  "Run only the I-th of N contiguous, equal slices of the grid, counted from 0 (0/4 .. 3/4)")
      ->type_name("I/N");
  cmd->add_option("--csv", o->csv, "Write one row per point and component here")->type_name("FILE");
  cmd->add_option("--json", o->json, "Write the whole sweep here, every point's full report")->type_name("FILE");
  add_max_elements_option(*cmd, &o->max_elements);
  cmd->footer(
      "LIST is comma-separated: --seq 16,64,256 --heads 1,4. Points are the product of the lists, in the order\n"
      "batch, dim, heads, ffn, seq, kv-seq (the last varies fastest); an axis not given keeps the case's value,\n"
      "except batch, which is 1 so that long sequences fit. Points where heads does not divide dim are skipped\n"
      "with a note; a point above --max-elements refuses the whole grid before anything runs.\n"
      "CSV: one row per point and component: the point's sizes, then per leg <leg>_rel_l2, <leg>_bound for\n"
      "the gated legs, hand32_vs_torch32_l2 (the seeds' figure), and the component's pass (true|false):\n" +
      csv_columns() +
      "\n(kv_seq is S, equal to seq for self-attention; ffn is 0 where it does not apply; numbers as 1.234560e-07).\n"
      "JSON: {\"sweep\": {case, module, axes, grid, mask, seed, random_params, max_elements, grid_points, shard},\n"
      "\"points\": [{index, label, batch, seq, kv_seq, dim, heads, ffn, seed, and run's per-case report: name, ...,\n"
      "pass, components, failures, notes}], \"skipped\": [{index, ..., reason}], \"summary\": {run, passed, failed,\n"
      "skipped}}. Files are written whole at the end, or not at all. Exit 0 when every point passes, 1 when one\n"
      "fails, 2 on bad usage or input. A progress bar goes to stderr when it is a terminal.");
  cmd->callback([o, &action] { action = [o] { return sweep(*o); }; });
}

}  // namespace tparity::cli
