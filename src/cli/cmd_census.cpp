// tparity census: the false-alarm count of the float32 gates. The clean hand core over random small
// configurations of the attention and transformer cases (sizes down to T = 1, d = 2, one head; every
// mask kind; random parameters; unbatched input; the ViT's head activations), under every kernel
// setting of the reference it was built with (re-executing itself, since the BLAS libraries read
// their settings when they load) and the hand core's instruction sets. Every failure is a false
// alarm: the clean core is correct, so a gate that fails it is too tight for that CPU.
#include <fmt/format.h>
#include <spawn.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <chrono>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <map>
#include <optional>
#include <sstream>

#include "common.hpp"
#include "tparity/compare/report.hpp"
#include "tparity/core/gemm.hpp"
#include "tparity/eval/evaluate.hpp"
#include "tparity/fixture/fixture.hpp"
#include "tparity/harness/cases.hpp"
#include "tparity/harness/rng.hpp"
#include "tparity/torch/reference.hpp"

extern char** environ;

namespace tparity::cli {

namespace {

namespace fs = std::filesystem;

// ---- kernel settings -------------------------------------------------------------------------------

// One way of making the reference's BLAS run other kernels, as another CPU would: environment
// variables read when the libraries load.
struct KernelSetting {
  std::string name;
  std::vector<std::pair<std::string, std::string>> env;  // empty value: unset
};

// Those of the reference tparity was built with: OpenBLAS's core types for Debian's 1.13 (unset: the
// kernels OpenBLAS picks for this CPU); MKL's and oneDNN's instruction-set limits for the wheel's 2.13
// (avx2: what an AVX2-only CPU gets; compatible: MKL's conditional-reproducibility path without FMA).
std::vector<KernelSetting> kernel_settings() {
  const std::vector<std::pair<std::string, std::string>> clear_mkl{
      {"MKL_ENABLE_INSTRUCTIONS", ""}, {"MKL_CBWR", ""}, {"ONEDNN_MAX_CPU_ISA", ""}, {"ATEN_CPU_CAPABILITY", ""}};
  if (reference_info().blas.rfind("OpenBLAS", 0) == 0) {
    std::vector<KernelSetting> k{{"native", {{"OPENBLAS_CORETYPE", ""}}}};
    for (const char* c : {"Haswell", "SkylakeX", "Zen", "Sandybridge", "Prescott"})
      k.push_back({c, {{"OPENBLAS_CORETYPE", c}}});
    return k;
  }
  return {{"unlimited", clear_mkl},
          {"avx2",
           {{"MKL_ENABLE_INSTRUCTIONS", "AVX2"},
            {"MKL_CBWR", "AVX2"},
            {"ONEDNN_MAX_CPU_ISA", "AVX2"},
            {"ATEN_CPU_CAPABILITY", "avx2"}}},
          {"compatible", {{"MKL_CBWR", "COMPATIBLE"}}}};
}

std::string env_prefix(const KernelSetting& k) {
  std::string s;
  for (const auto& [var, value] : k.env)
    if (!value.empty()) s += var + "=" + value + " ";
  return s;
}

// ---- points ----------------------------------------------------------------------------------------

const std::vector<std::string> kCensusCases = {"multihead", "block", "encoder", "decoder", "sdpa", "vit", "embed"};

const char* isa_name(int i) { return i == 0 ? "avx512" : i == 1 ? "avx2" : "scalar"; }

// Point `index` of case `name`: a random small configuration, drawn from (seed, case, index) alone,
// so that a shard, a worker or --point makes the same one. Draws until make_problem accepts it.
CaseSpec census_point(const std::string& name, uint64_t seed, uint64_t index) {
  const CaseSpec base = find_case(name);
  uint64_t h = seed * 0x9e3779b97f4a7c15ULL + index;
  for (char c : name) h = (h ^ uint64_t(uint8_t(c))) * 1099511628211ULL;
  Rng rng(h);
  for (int attempt = 0;; ++attempt) {
    CaseSpec s = base;
    s.seed = h % 1000000007ULL + uint64_t(attempt);
    s.batch = rng.integer(0, 3);
    s.seq = rng.integer(1, 9);
    s.random_params = rng.coin();
    const MaskKind masks[] = {MaskKind::None, MaskKind::Causal, MaskKind::Random, MaskKind::Padding};
    s.mask = masks[rng.integer(0, 3)];
    auto pick_heads = [&](int64_t d) {  // a divisor of d, at most 6
      std::vector<int64_t> div;
      for (int64_t k = 1; k <= std::min<int64_t>(6, d); ++k)
        if (d % k == 0) div.push_back(k);
      return div[size_t(rng.integer(0, int64_t(div.size()) - 1))];
    };
    switch (module_handler(base.module)) {
      case ModuleHandler::MultiheadAttention:
        s.dim = rng.integer(2, 24);
        s.heads = pick_heads(s.dim);
        s.kv_seq = rng.coin() ? 0 : rng.integer(1, 9);
        s.bias = rng.coin();
        s.need_weights = rng.integer(0, 3) != 0;
        break;
      case ModuleHandler::TransformerEncoderLayer:
      case ModuleHandler::TransformerEncoder:
      case ModuleHandler::TransformerDecoderLayer:
        s.dim = rng.integer(2, 24);
        s.heads = pick_heads(s.dim);
        s.ffn = rng.integer(1, 32);
        s.activation = rng.coin() ? Activation::Relu : Activation::Gelu;
        if (base.module == ModuleKind::TransformerEncoder) s.layers = rng.integer(1, 3), s.final_norm = rng.coin();
        if (base.module == ModuleKind::TransformerDecoderLayer) s.kv_seq = rng.integer(1, 9);
        break;
      case ModuleHandler::ScaledDotProductAttention:
        s.batch = rng.integer(1, 3);
        s.kv_seq = rng.integer(1, 9);
        s.dim = rng.integer(1, 24);
        s.value_dim = rng.integer(1, 24);
        s.mask = rng.coin() ? MaskKind::None : MaskKind::Random;
        if (rng.integer(0, 3) == 0) s.mask = MaskKind::IsCausal;
        // scaled_dot_product_attention's own arguments; scale and enable_gqa came with torch 2.x.
        s.heads = rng.integer(1, 4);
        s.kv_heads = rng.coin() ? s.heads : pick_heads(s.heads);
        if (rng.coin()) s.scale = rng.uniform(-1, 1);
        if (reference_info().torch.rfind("1.", 0) == 0) s.kv_heads = 0, s.scale.reset();
        break;
      case ModuleHandler::TokenEncoder:
        s.batch = rng.integer(1, 3);
        s.dim = 2 * rng.integer(1, 12);
        s.heads = pick_heads(s.dim);
        s.ffn = rng.integer(1, 32);
        s.layers = rng.integer(1, 3);
        s.vocab = rng.integer(2, 50);
        s.mask = MaskKind::None;
        break;
      case ModuleHandler::ViT: {
        s.batch = rng.integer(1, 3);
        s.channels = rng.integer(1, 3);
        s.patch = rng.integer(1, 2);
        if ((s.channels * s.patch * s.patch) % 2) s.channels *= 2;  // d even, for the positional encoding
        s.image_height = s.patch * rng.integer(1, 3);
        s.image_width = s.patch * rng.integer(1, 3);
        s.dim = s.channels * s.patch * s.patch;
        s.seq = (s.image_height / s.patch) * (s.image_width / s.patch);
        s.heads = pick_heads(s.dim);
        s.ffn = rng.integer(1, 32);
        s.layers = rng.integer(1, 2);
        s.head = {rng.integer(1, 8), rng.integer(1, 4)};
        if (rng.coin()) s.head = {rng.integer(1, 4)};  // no hidden width
        const Activation acts[] = {Activation::Relu, Activation::Gelu,     Activation::Tanh,     Activation::Sigmoid,
                                   Activation::Silu, Activation::Softplus, Activation::LeakyRelu};
        s.head_activation = acts[rng.integer(0, 6)];
        s.mask = MaskKind::None;
        break;
      }
      case ModuleHandler::Matmul:
      case ModuleHandler::Softmax:
      case ModuleHandler::LayerNorm:
      case ModuleHandler::Book:
      case ModuleHandler::Llm:
        throw InputError("census: no random points for case " + name);
    }
    try {
      (void)make_problem(s);
      return s;
    } catch (const InputError&) {
      if (attempt > 100) throw;
    }
  }
}

std::string describe_point(const CaseSpec& s) { return s.describe() + fmt::format("  (seed {})", s.seed); }

// ---- worker ----------------------------------------------------------------------------------------

struct CensusOptions {
  std::vector<std::string> cases;
  int64_t points = 1000;  // per kernel setting, over the cases and ISAs in turn
  uint64_t seed = 1;
  std::string kernels = "all", isas = "all";
  std::optional<std::string> shard, json;
  std::vector<std::string> merge;
  std::optional<int64_t> point;
  // internal: one kernel setting's run, in a child process with that setting's environment
  std::optional<std::string> worker_kernel;
};

std::vector<std::string> split(const std::string& s) {
  std::vector<std::string> out;
  std::stringstream ss(s);
  std::string item;
  while (std::getline(ss, item, ','))
    if (!item.empty()) out.push_back(item);
  return out;
}

std::vector<int> chosen_isas(const std::string& text) {
  std::vector<int> out;
  for (const std::string& n : text == "all" ? std::vector<std::string>{"avx512", "avx2", "scalar"} : split(text)) {
    int i = n == "avx512" ? 0 : n == "avx2" ? 1 : n == "scalar" ? 2 : -1;
    if (i < 0) throw InputError("option --isa: expected all or a list of avx512, avx2, scalar, got \"" + n + "\"");
    const GemmIsa isa = i == 0 ? GemmIsa::Avx512 : i == 1 ? GemmIsa::Avx2 : GemmIsa::Scalar;
    if (!gemm_isa_available(isa)) continue;  // this CPU lacks it: said in the table
    out.push_back(i);
  }
  if (out.empty()) throw InputError("option --isa: none of \"" + text + "\" runs on this CPU");
  return out;
}

// Runs this process's share of the points under the current environment: every point of this
// shard, its case and ISA by turn. Returns the worker's JSON.
nlohmann::json run_worker(const CensusOptions& o, const std::string& kernel) {
  const std::vector<int> isas = chosen_isas(o.isas);
  const auto [si, sn] = o.shard ? parse_shard(*o.shard) : std::pair<int64_t, int64_t>{0, 1};
  const int64_t begin = si * o.points / sn, end = (si + 1) * o.points / sn;
  std::map<std::pair<std::string, int>, std::pair<int64_t, nlohmann::json>> tally;  // (case, isa) -> points, alarms
  for (const std::string& c : o.cases)
    for (int isa : isas) tally[{c, isa}] = {0, nlohmann::json::array()};
  std::string prefix;  // the kernel setting's variables, for the re-run commands
  for (const KernelSetting& k : kernel_settings())
    if (k.name == kernel) prefix = env_prefix(k);
  Implementation impl = hand_core();
  impl.teacher_forcing = false;  // the local legs diagnose; the verdict is the propagated legs'
  const auto t0 = std::chrono::steady_clock::now();
  for (int64_t i = begin; i < end; ++i) {
    const std::string& c = o.cases[size_t(i) % o.cases.size()];
    const int isa = isas[size_t(i / int64_t(o.cases.size())) % isas.size()];
    gemm_force_isa(isa == 0 ? GemmIsa::Avx512 : isa == 1 ? GemmIsa::Avx2 : GemmIsa::Scalar);
    const CaseSpec s = census_point(c, o.seed, uint64_t(i));
    const CaseReport r = evaluate_problem(make_problem(s), s.describe(), s.seed, GatePolicy{}, impl);
    auto& [count, alarms] = tally[{c, isa}];
    ++count;
    if (!r.pass)
      alarms.push_back({{"index", i},
                        {"point", describe_point(s)},
                        {"failures", to_json(r.failures)},
                        {"rerun", fmt::format("{}TPARITY_ISA={} tparity census --case {} --seed {} --point {}", prefix,
                                              isa_name(isa), c, o.seed, i)}});
  }
  const double seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  nlohmann::json rows = nlohmann::json::array();
  for (const auto& [key, v] : tally)
    rows.push_back({{"case", key.first}, {"isa", isa_name(key.second)}, {"points", v.first}, {"alarms", v.second}});
  const ReferenceInfo ref = reference_info();
  return {{"format", "tparity.census"},
          {"version", 1},
          {"reference", to_json(ref)},
          {"kernel", kernel},
          {"seed", o.seed},
          {"points", o.points},
          {"shard", o.shard.value_or("0/1")},
          {"seconds", seconds},
          {"rows", rows}};
}

// ---- the parent: one child per kernel setting, the table ------------------------------------------

nlohmann::json spawn_worker(const CensusOptions& o, const KernelSetting& k) {
  const fs::path out = fs::temp_directory_path() / fmt::format("tparity_census_{}_{}.json", ::getpid(), k.name);
  struct Remove {  // the worker's document, gone however this ends (a failed worker, a bad document)
    const fs::path& path;
    ~Remove() {
      std::error_code ec;
      fs::remove(path, ec);
    }
  } remove{out};
  std::vector<std::string> args{"/proc/self/exe",  "census",
                                "--worker-kernel", k.name,
                                "--points",        std::to_string(o.points),
                                "--seed",          std::to_string(o.seed),
                                "--isa",           o.isas,
                                "--json",          out.string()};
  for (const std::string& c : o.cases) args.insert(args.end(), {"--case", c});
  if (o.shard) args.insert(args.end(), {"--shard", *o.shard});
  // The setting's environment: its variables set or unset, everything else inherited.
  std::vector<std::string> env;
  for (char** e = environ; *e; ++e) {
    const std::string kv = *e;
    bool overridden = false;
    for (const auto& [var, value] : k.env) overridden = overridden || kv.rfind(var + "=", 0) == 0;
    if (!overridden) env.push_back(kv);
  }
  for (const auto& [var, value] : k.env)
    if (!value.empty()) env.push_back(var + "=" + value);
  std::vector<char*> argv, envp;
  for (std::string& a : args) argv.push_back(a.data());
  argv.push_back(nullptr);
  for (std::string& e : env) envp.push_back(e.data());
  envp.push_back(nullptr);
  pid_t pid;
  if (posix_spawn(&pid, "/proc/self/exe", nullptr, nullptr, argv.data(), envp.data()) != 0)
    throw std::runtime_error("census: could not start a worker: " + std::string(std::strerror(errno)));
  int status = 0;
  while (waitpid(pid, &status, 0) < 0 && errno == EINTR) {
  }
  std::ifstream in(out);
  if (!WIFEXITED(status) || WEXITSTATUS(status) != 0 || !in)
    throw std::runtime_error(fmt::format("census: the worker for kernel setting {} failed (exit {})", k.name,
                                         WIFEXITED(status) ? WEXITSTATUS(status) : -1));
  return nlohmann::json::parse(in);
}

// The table of merged worker documents: reference x kernel x ISA x case, points and alarms, then
// every alarm's re-run command. Returns the number of alarms.
size_t print_table(const std::vector<std::pair<std::string, nlohmann::json>>& docs) {
  struct Row {
    int64_t points = 0, alarms = 0;
  };
  std::map<std::tuple<std::string, std::string, std::string, std::string>, Row> rows;
  std::map<std::pair<std::string, std::string>, Row> per_setting;
  std::vector<std::string> alarms;
  double seconds = 0;
  for (const auto& [where, d] : docs) try {
      const std::string ref =
          d.at("reference").at("torch").get<std::string>() + " " + d.at("reference").at("blas").get<std::string>();
      seconds += d.at("seconds").get<double>();
      for (const nlohmann::json& r : d.at("rows")) {
        Row& row = rows[{ref, d.at("kernel").get<std::string>(), r.at("isa").get<std::string>(),
                         r.at("case").get<std::string>()}];
        Row& set = per_setting[{ref, d.at("kernel").get<std::string>()}];
        row.points += r.at("points").get<int64_t>(), set.points += r.at("points").get<int64_t>();
        row.alarms += int64_t(r.at("alarms").size()), set.alarms += int64_t(r.at("alarms").size());
        for (const nlohmann::json& a : r.at("alarms"))
          alarms.push_back(fmt::format("ALARM {}: {}; re-run: {}", a.at("point").get<std::string>(),
                                       a.at("failures").at(0).get<std::string>(), a.at("rerun").get<std::string>()));
      }
    } catch (const nlohmann::json::exception& e) {  // a --merge file that is JSON but not a census result
      std::string what = e.what();
      if (auto pos = what.find("] "); pos != std::string::npos) what = what.substr(pos + 2);
      throw InputError(where + ": not a census result of tparity: " + show_text(what, 200));
    }
  fmt::print("{:<34} {:<12} {:<7} {:<10} {:>8} {:>7}\n", "reference", "kernel", "isa", "case", "points", "alarms");
  for (const auto& [k, r] : rows)
    fmt::print("{:<34} {:<12} {:<7} {:<10} {:>8} {:>7}\n", std::get<0>(k), std::get<1>(k), std::get<2>(k),
               std::get<3>(k), r.points, r.alarms);
  fmt::print("\n{:<34} {:<12} {:>8} {:>7}\n", "reference", "kernel", "points", "alarms");
  int64_t total = 0, bad = 0;
  for (const auto& [k, r] : per_setting) {
    fmt::print("{:<34} {:<12} {:>8} {:>7}\n", k.first, k.second, r.points, r.alarms);
    total += r.points, bad += r.alarms;
  }
  for (const std::string& a : alarms) fmt::print("{}\n", a);
  fmt::print("census: {} points, {} false alarms ({:.0f} s of evaluation)\n", total, bad, seconds);
  return size_t(bad);
}

int census(const CensusOptions& given) {
  CensusOptions o = given;
  if (o.cases.empty()) o.cases = kCensusCases;
  for (const std::string& c : o.cases)
    if (std::find(kCensusCases.begin(), kCensusCases.end(), c) == kCensusCases.end())
      throw InputError("option --case: expected one of " + fmt::format("{}", fmt::join(kCensusCases, ", ")) +
                       ", got \"" + c + "\"");
  if (o.json && !o.worker_kernel) check_output_path(*o.json, "option --json");
  if (!o.merge.empty()) {
    std::vector<std::pair<std::string, nlohmann::json>> docs;
    for (const std::string& f : o.merge) {
      const std::string where = show_text(f, 300);
      nlohmann::json d = parse_json(read_input_file(f, "census result"), where);
      const nlohmann::json format = d.is_object() && d.contains("format") ? d["format"] : nlohmann::json();
      if (format == "tparity.census.set" && d.contains("workers") && d["workers"].is_array())
        for (nlohmann::json& w : d["workers"]) docs.push_back({where, std::move(w)});
      else if (format == "tparity.census")
        docs.push_back({where, std::move(d)});
      else
        throw InputError(where +
                         ": format: expected \"tparity.census.set\" (with \"workers\") or \"tparity.census\", got " +
                         show_json(format));
    }
    return print_table(docs) ? kFail : kPass;
  }
  if (o.shard) (void)parse_shard(*o.shard);  // the command line's own faults first
  if (!torch_available()) throw InputError("census compares against LibTorch, and tparity was built without it");
  if (o.point) {  // one point, its whole report: the re-run of an alarm
    if (o.cases.size() != 1) throw InputError("option --point: name its case with --case");
    const CaseSpec s = census_point(o.cases.front(), o.seed, uint64_t(*o.point));
    return emit({evaluate_problem(make_problem(s), s.describe(), s.seed, GatePolicy{})}, Format::Table);
  }
  if (o.worker_kernel) {
    const nlohmann::json j = run_worker(o, *o.worker_kernel);
    write_output_file(*o.json, j.dump(-1, ' ', false, kBadUtf8Replaced) + "\n");
    return kPass;
  }
  std::vector<KernelSetting> settings;
  const std::vector<std::string> wanted = split(o.kernels);
  std::string names;
  for (const KernelSetting& k : kernel_settings()) names += (names.empty() ? "" : ", ") + k.name;
  for (const std::string& w : wanted) {
    bool known = w == "all";
    for (const KernelSetting& k : kernel_settings()) known = known || k.name == w;
    if (!known)
      throw InputError("option --kernels: expected all or a list of " + names + " (the kernel settings of " +
                       reference_info().blas + "), got \"" + w + "\"");
  }
  for (const KernelSetting& k : kernel_settings())
    if (o.kernels == "all" || std::find(wanted.begin(), wanted.end(), k.name) != wanted.end()) settings.push_back(k);
  // (a list of commas alone names none: a census of no point raises no alarm, and says nothing)
  if (settings.empty())
    throw InputError("option --kernels: expected all or a list of " + names + ", got \"" + show_text(o.kernels) +
                     "\" (no kernel setting)");
  (void)chosen_isas(o.isas);  // refused now rather than in every worker
  nlohmann::json workers = nlohmann::json::array();
  std::vector<std::pair<std::string, nlohmann::json>> docs;
  for (const KernelSetting& k : settings) {
    std::fprintf(stderr, "census: kernel setting %s (%s), %lld points\n", k.name.c_str(),
                 env_prefix(k).empty() ? "nothing set" : env_prefix(k).c_str(), static_cast<long long>(o.points));
    docs.push_back({"census worker " + k.name, spawn_worker(o, k)});
    workers.push_back(docs.back().second);
  }
  if (o.json) {
    const nlohmann::json set{{"format", "tparity.census.set"}, {"workers", workers}};
    write_output_file(*o.json, set.dump(1, ' ', false, kBadUtf8Replaced) + "\n");
  }
  return print_table(docs) ? kFail : kPass;
}

}  // namespace

void register_census(CLI::App& app, Action& action) {
  auto o = std::make_shared<CensusOptions>();
  CLI::App* cmd = app.add_subcommand(
      "census",
      "False alarms of the float32 gates: the clean hand core over random small configurations, under every "
      "kernel setting of the reference and every instruction set of the core");
  cmd->add_option("--case", o->cases, "Cases (default: multihead, block, encoder, decoder, sdpa, vit, embed)");
  add_max_elements_option(*cmd);
  cmd->add_option("--points", o->points, "Points per kernel setting, over the cases and instruction sets in turn")
      ->transform(whole_number_in(1, int64_t(1) << 40))
      ->capture_default_str();
  cmd->add_option("--seed", o->seed, "Seed of the random configurations")->capture_default_str();
  cmd->add_option("--kernels", o->kernels,
                  "Kernel settings of the reference, comma-separated (OpenBLAS: native, Haswell, SkylakeX, Zen, "
                  "Sandybridge, Prescott; MKL/oneDNN: unlimited, avx2, compatible) or all")
      ->check(not_empty("kernel settings"))
      ->capture_default_str();
  cmd->add_option("--isa", o->isas, "Instruction sets of the hand core, comma-separated (avx512, avx2, scalar) or all")
      ->capture_default_str();
  cmd->add_option("--shard", o->shard, "Run the I-th of N contiguous slices of the points (I/N, from 0)");
  cmd->add_option("--json", o->json, "Write every kernel setting's counts and alarms here (merge them with --merge)");
  cmd->add_option("--merge", o->merge, "Print the table of census JSON files (shards, machines) instead of running");
  cmd->add_option("--point", o->point, "Run one point of --case and print its report (an alarm's re-run)")
      ->transform(whole_number_in(0, (int64_t(1) << 40) - 1));  // the indices --points can reach
  cmd->add_option("--worker-kernel", o->worker_kernel)->group(kInternal);  // a child's kernel setting
  cmd->callback([o, &action] { action = [o] { return census(*o); }; });
}

}  // namespace tparity::cli
