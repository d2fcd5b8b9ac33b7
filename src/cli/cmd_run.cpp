// tparity run: the default cases (or a chosen few, with sizes overridden), every component, four legs.
#include <fmt/format.h>

#include <limits>
#include <map>
#include <optional>

#include "common.hpp"
#include "tparity/compare/evaluate.hpp"
#include "tparity/harness/cases.hpp"

namespace tparity::cli {

namespace {

struct RunOptions {
  std::vector<std::string> cases;
  CaseOverrides overrides;
  int64_t max_elements = int64_t(1) << 28;
  Format format = Format::Table;
};

int run(const RunOptions& o) {
  std::vector<CaseSpec> chosen = o.cases.empty() ? default_cases() : std::vector<CaseSpec>{};
  for (const std::string& name : o.cases) chosen.push_back(find_case(name));
  std::vector<CaseReport> reports;
  for (CaseSpec s : chosen) {
    apply_overrides(s, o.overrides);
    check_size(s, o.max_elements);
    reports.push_back(evaluate_problem(make_problem(s), s.describe(), s.seed, GatePolicy{}));
  }
  return emit(reports, o.format);
}

}  // namespace

void register_run(CLI::App& app, Action& action) {
  auto o = std::make_shared<RunOptions>();
  CLI::App* cmd = app.add_subcommand(
      "run", "Run the default cases (or --case NAME ...): every component, hand vs LibTorch, float64 and float32");
  std::string names;
  for (const CaseSpec& c : default_cases()) names += (names.empty() ? "" : ", ") + c.name;
  cmd->add_option("--case", o->cases, "Cases to run (default: all): " + names);
  const auto size = CLI::Range(int64_t(1), std::numeric_limits<int64_t>::max() / 2);
  cmd->add_option("--batch", o->overrides.batch,
                  "Batch size B; 0 = unbatched input (matmul: the leading batch dim, 0 drops it)")
      ->check(CLI::Range(int64_t(0), std::numeric_limits<int64_t>::max() / 2));
  cmd->add_option("--seq", o->overrides.seq, "Query sequence length L (T)")->check(size);
  cmd->add_option("--kv-seq", o->overrides.kv_seq,
                  "Key/value sequence length S (attention cases; S != L means cross-attention)")
      ->check(size);
  cmd->add_option("--dim", o->overrides.dim, "Embedding dimension E (d_model)")->check(size);
  cmd->add_option("--value-dim", o->overrides.value_dim, "sdpa: value feature size Ev")->check(size);
  cmd->add_option("--heads", o->overrides.heads, "Number of heads")->check(size);
  cmd->add_option("--ffn", o->overrides.ffn, "Encoder dim_feedforward")->check(size);
  cmd->add_option("--bias", o->overrides.bias, "MultiheadAttention bias")->check(CLI::IsMember({"on", "off"}));
  cmd->add_option("--activation", o->overrides.activation,
                  "Encoder feed-forward activation (relu, gelu); for vit the head's (also tanh, sigmoid, silu, "
                  "softplus, leakyrelu)")
      ->check(CLI::IsMember({"relu", "gelu", "tanh", "sigmoid", "silu", "softplus", "leakyrelu"}));
  cmd->add_option("--mask", o->overrides.mask,
                  "none, causal (float -inf above the diagonal), random (bool), padding (bool key padding)")
      ->check(CLI::IsMember({"none", "causal", "random", "padding"}));
  add_seed_option(*cmd, o->overrides.seed, "Seed of weights and inputs (default: each case's own)");
  cmd->add_flag("--random-params", o->overrides.random_params,
                "Draw biases and LayerNorm affine at random instead of torch's constant init");
  cmd->add_option("--max-elements", o->max_elements, "Refuse cases whose largest tensor exceeds this many elements")
      ->check(size)
      ->capture_default_str();
  add_format_option(*cmd, o->format);
  cmd->callback([o, &action] { action = [o] { return run(*o); }; });
}

}  // namespace tparity::cli
