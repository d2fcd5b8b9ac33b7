// tparity run: the default cases (or a chosen few, with sizes overridden), every component, four legs.
#include <fmt/format.h>

#include <limits>
#include <map>
#include <optional>

#include "common.hpp"
#include "pretrained.hpp"
#include "tparity/api.hpp"
#include "tparity/compare/report.hpp"
#include "tparity/eval/evaluate.hpp"
#include "tparity/fixture/fixture.hpp"
#include "tparity/harness/cases.hpp"

namespace tparity::cli {

namespace {

struct RunOptions {
  std::vector<std::string> cases;
  CaseOverrides overrides;
  int64_t max_elements = int64_t(1) << 28;
  Format format = Format::Table;
};

bool any_override(const CaseOverrides& o) {
  return o.batch || o.seq || o.kv_seq || o.dim || o.value_dim || o.out_dim || o.heads || o.kv_heads || o.scale ||
         o.ffn || o.bias || o.activation || o.mask || o.seed || o.random_params;
}

int run(const RunOptions& o) {
  std::vector<CaseSpec> chosen = o.cases.empty() ? default_cases() : std::vector<CaseSpec>{};
  std::vector<const PretrainedCase*> pretrained;
  for (const std::string& name : o.cases)
    if (const PretrainedCase* c = find_pretrained(name)) {
      if (any_override(o.overrides))
        throw InputError("case " + name +
                         ": sizes and options are the checkpoint's own; drop the size, mask, seed "
                         "and parameter options, or run it alone");
      pretrained.push_back(c);
    } else {
      try {
        chosen.push_back(find_case(name));  // a default or a stress case
      } catch (const InputError&) {
        std::string pre;
        for (const PretrainedCase& other : pretrained_cases()) pre += ", " + other.name;
        throw InputError("option --case: expected one of " + case_names() + pre + ", got \"" + name + "\"");
      }
    }
  // With no --case, the pretrained cases run after the generated ones, unless options reshape the run.
  if (o.cases.empty() && !any_override(o.overrides))
    for (const PretrainedCase& c : pretrained_cases()) pretrained.push_back(&c);
  std::vector<CaseReport> reports;
  for (CaseSpec s : chosen) {
    apply_overrides(s, o.overrides);
    check_size(s, o.max_elements);
    reports.push_back(evaluate_problem(make_problem(s), s.describe(), s.seed, GatePolicy{}));
  }
  nlohmann::json skipped = nlohmann::json::array();
  for (const PretrainedCase* c : pretrained) {
    std::string skip;
    const std::optional<std::string> f = pretrained_fixture(*c, skip);
    if (!f) {  // one line, never a failure: the model's package is not installed here
      std::fprintf(stderr, "%s\n", skip.c_str());
      skipped.push_back({{"name", c->name}, {"reason", skip}});
      continue;
    }
    for (CaseReport& r : check_fixture(read_fixture(*f), *f, GatePolicy{})) {
      const size_t slash = r.name.find('/');
      r.name = c->name + (slash == std::string::npos ? "" : r.name.substr(slash));
      reports.push_back(std::move(r));
    }
  }
  if (o.format == Format::Json) {
    nlohmann::json doc = to_json(reports);
    doc["skipped"] = skipped;
    std::fputs((doc.dump(2) + "\n").c_str(), stdout);
    return exit_code(reports) ? kFail : kPass;
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
  for (const PretrainedCase& c : pretrained_cases()) names += ", " + c.name + " (" + c.description + ")";
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
  cmd->add_option("--out-dim", o->overrides.out_dim, "the book's attention classes: d_out (--dim is d_in)")
      ->check(size);
  cmd->add_option("--heads", o->overrides.heads, "Number of heads")->check(size);
  cmd->add_option("--kv-heads", o->overrides.kv_heads,
                  "sdpa: key/value heads, a divisor of --heads (fewer: grouped-query attention, enable_gqa)")
      ->check(size);
  cmd->add_option("--scale", o->overrides.scale, "sdpa: the scores' scale (default 1/sqrt(E))");
  cmd->add_option("--ffn", o->overrides.ffn, "Encoder dim_feedforward")->check(size);
  cmd->add_option("--bias", o->overrides.bias, "MultiheadAttention bias")->check(CLI::IsMember({"on", "off"}));
  cmd->add_option("--activation", o->overrides.activation,
                  "Encoder feed-forward activation (relu, gelu); for vit the head's (also tanh, sigmoid, silu, "
                  "softplus, leakyrelu)")
      ->check(CLI::IsMember({"relu", "gelu", "tanh", "sigmoid", "silu", "softplus", "leakyrelu"}));
  cmd->add_option("--mask", o->overrides.mask,
                  "none, causal (float -inf above the diagonal), random (bool), padding (bool key padding), "
                  "is-causal (sdpa: the is_causal flag)")
      ->check(CLI::IsMember({"none", "causal", "random", "padding", "is-causal"}));
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
