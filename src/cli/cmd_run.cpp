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
  std::optional<int64_t> batch, seq, kv_seq, dim, value_dim, heads, ffn;
  std::optional<std::string> bias, activation, mask;
  std::optional<uint64_t> seed;
  bool random_params = false;
  int64_t max_elements = int64_t(1) << 28;
  Format format = Format::Table;
};

// Elements of the largest tensor a case materialises: the (B, H, L, S) scores, the (B, T, ffn)
// hidden layer, the weights; the embedding table, the image and the ViT head's first Linear
// (n * d inputs); an op case's operands and output. Long double: the product of four user-given sizes
// may overflow int64.
long double largest_tensor(const CaseSpec& s) {
  const long double B = s.batch ? s.batch : 1, L = s.seq, S = s.kv_seq ? s.kv_seq : s.seq;
  const long double widest = std::max<int64_t>({s.dim, s.ffn, s.value_dim});
  const long double attention = std::max({B * s.heads * L * S, B * std::max(L, S) * widest, 3.0L * widest * widest});
  switch (s.module) {
    case ModuleKind::TokenEncoder:
      return std::max(attention, (long double)s.vocab * s.dim);
    case ModuleKind::ViT: {
      // seq and dim are checked against the image when the case is made; size by the image itself
      const long double p = s.patch > 0 ? s.patch : 1, n = (s.image_height / p) * (s.image_width / p),
                        d = (long double)s.channels * p * p;
      long double m = std::max({B * s.channels * s.image_height * s.image_width, B * s.heads * n * n,
                                B * n * std::max<long double>(d, s.ffn), 3.0L * d * d});
      long double in = n * d;
      for (int64_t w : s.head) m = std::max(m, in * w), in = w;
      return m;
    }
    case ModuleKind::Matmul: {
      const auto [a, b] = matmul_operands(s);
      long double na = 1, nb = 1, out = 1;
      for (int64_t x : a) na *= x;
      for (int64_t x : b) nb *= x;
      // the output: the broadcast batch (the larger of each pair of aligned dims) times M x N
      const size_t ra = a.size() >= 2 ? a.size() - 2 : 0, rb = b.size() >= 2 ? b.size() - 2 : 0;
      for (size_t i = 0; i < std::max(ra, rb); ++i) {
        const long double da = i < ra ? a[ra - 1 - i] : 1, db = i < rb ? b[rb - 1 - i] : 1;
        out *= std::max(da, db);
      }
      if (a.size() >= 2) out *= a[a.size() - 2];
      if (b.size() >= 2) out *= b.back();
      return std::max({na, nb, out});
    }
    case ModuleKind::Softmax:
      return B * L * S;
    case ModuleKind::LayerNorm:
      return B * L * s.dim;
    default:
      return attention;
  }
}

int run(const RunOptions& o) {
  std::vector<CaseSpec> all = default_cases(), chosen;
  if (o.cases.empty()) chosen = all;
  for (const std::string& name : o.cases) {
    bool found = false;
    for (const CaseSpec& c : all)
      if (c.name == name) chosen.push_back(c), found = true;
    if (!found) {
      std::string names;
      for (const CaseSpec& c : all) names += (names.empty() ? "" : ", ") + c.name;
      throw InputError(fmt::format("option --case: expected one of {}, got \"{}\"", names, name));
    }
  }
  std::vector<CaseReport> reports;
  for (CaseSpec s : chosen) {
    if (o.batch) s.batch = *o.batch;
    if (o.seq) s.seq = *o.seq;
    if (o.kv_seq) s.kv_seq = *o.kv_seq;
    if (o.dim) s.dim = *o.dim;
    if (o.value_dim) s.value_dim = *o.value_dim;
    if (o.heads) s.heads = *o.heads;
    if (o.ffn) s.ffn = *o.ffn;
    if (o.bias) s.bias = *o.bias == "on";
    if (o.activation) {  // a ViT's is its head's (its encoder layers keep the seed's relu)
      const Activation a = activation_from_name(*o.activation);
      (s.module == ModuleKind::ViT ? s.head_activation : s.activation) = a;
    }
    if (o.mask) s.mask = mask_kind_from_name(*o.mask);
    if (o.seed) s.seed = *o.seed;
    if (o.random_params) s.random_params = true;
    if (largest_tensor(s) > (long double)o.max_elements)
      throw InputError(
          fmt::format("case {}: sizes (batch {}, seq {}, kv-seq {}, dim {}, heads {}, ffn {}) give a tensor of "
                      "{:.3g} elements, above --max-elements {} (each element costs 8 bytes per copy)",
                      s.name, s.batch, s.seq, s.kv_seq ? s.kv_seq : s.seq, s.dim, s.heads, s.ffn,
                      double(largest_tensor(s)), o.max_elements));
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
  cmd->add_option("--batch", o->batch, "Batch size B; 0 = unbatched input (matmul: the leading batch dim, 0 drops it)")
      ->check(CLI::Range(int64_t(0), std::numeric_limits<int64_t>::max() / 2));
  cmd->add_option("--seq", o->seq, "Query sequence length L (T)")->check(size);
  cmd->add_option("--kv-seq", o->kv_seq, "Key/value sequence length S (attention cases; S != L means cross-attention)")
      ->check(size);
  cmd->add_option("--dim", o->dim, "Embedding dimension E (d_model)")->check(size);
  cmd->add_option("--value-dim", o->value_dim, "sdpa: value feature size Ev")->check(size);
  cmd->add_option("--heads", o->heads, "Number of heads")->check(size);
  cmd->add_option("--ffn", o->ffn, "Encoder dim_feedforward")->check(size);
  cmd->add_option("--bias", o->bias, "MultiheadAttention bias")->check(CLI::IsMember({"on", "off"}));
  cmd->add_option("--activation", o->activation,
                  "Encoder feed-forward activation (relu, gelu); for vit the head's (also tanh, sigmoid, silu, "
                  "softplus, leakyrelu)")
      ->check(CLI::IsMember({"relu", "gelu", "tanh", "sigmoid", "silu", "softplus", "leakyrelu"}));
  cmd->add_option("--mask", o->mask,
                  "none, causal (float -inf above the diagonal), random (bool), padding (bool key padding)")
      ->check(CLI::IsMember({"none", "causal", "random", "padding"}));
  cmd->add_option("--seed", o->seed, "Seed of weights and inputs (default: each case's own)");
  cmd->add_flag("--random-params", o->random_params,
                "Draw biases and LayerNorm affine at random instead of torch's constant init");
  cmd->add_option("--max-elements", o->max_elements, "Refuse cases whose largest tensor exceeds this many elements")
      ->check(size)
      ->capture_default_str();
  add_format_option(*cmd, o->format);
  cmd->callback([o, &action] { action = [o] { return run(*o); }; });
}

}  // namespace tparity::cli
