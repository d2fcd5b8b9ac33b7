// tparity components: every canonical component of a case (or fixture) by name, shape and layout in
// words, so that someone hooking their own model knows what to give under each name (README,
// "Checking your own implementation"; docs/components.md is this verb's output for every module kind).
// The names and shapes come from running the hand core on the problem: no second list of them is kept
// here. The layouts are words keyed by the name's last part and the module's family.
#include <fmt/format.h>

#include <nlohmann/json.hpp>
#include <regex>

#include "common.hpp"
#include "tparity/fixture/fixture.hpp"
#include "tparity/harness/cases.hpp"
#include "tparity/harness/hand.hpp"
#include "tparity/harness/llm.hpp"

namespace tparity::cli {

namespace {

struct ComponentsOptions {
  CaseSelection selection;
  std::vector<std::string> fixtures;
  Format format = Format::Table;
  bool markdown = false;  // docs/components.md's sections (tests/scripts/components_doc.sh)
};

// Words for an attention's q ... output under torch.nn's MultiheadAttention and the layers built on it.
std::string mha_layout(const std::string& s) {
  if (s == "q") return "[B, heads, L, E/heads], projected (in_proj), split into heads, before the scaling";
  if (s == "k" || s == "v") return "[B, heads, S, E/heads], projected (in_proj), split into heads";
  if (s == "scores")
    return "[B, heads, L, S], q k^T / sqrt(E/heads) plus the masks, before softmax; masked keys hold -inf";
  if (s == "attn_weights") return "[B, heads, L, S], per head: softmax over the S keys";
  if (s == "attn_weights_avg") return "[B, L, S], averaged over the heads (average_attn_weights), as returned";
  if (s == "context") return "[B, L, E], the heads concatenated, before out_proj";
  if (s == "output") return "[B, L, E], after out_proj, batch-first whatever the call's layout";
  return "";
}

std::string book_layout(const Problem& p, const std::string& s) {
  if (s == "q" || s == "k" || s == "v")
    return "[B, heads, T, head width], x W_" +
           std::string(s == "q"   ? "query"
                       : s == "k" ? "key"
                                  : "value") +
           " split into heads (B = 1 unbatched; heads = 1 but for the two multi-head classes)";
  if (s == "scores")
    return p.book.masked()
               ? "[B, heads, T, T], q k^T / sqrt(head width), the causal buffer's masked keys -inf, before softmax"
               : "[B, heads, T, T], q k^T / sqrt(head width), before softmax (no mask)";
  if (s == "attn_weights") return "[B, heads, T, T], per head: softmax over the keys";
  if (s == "context") return "[B, T, d_out], the heads concatenated, before out_proj";
  if (s == "output")
    return p.book.has_out_proj() ? "[B, T, d_out], after out_proj" : "[B, T, d_out], weights v: the context itself";
  return "";
}

// The layer of torch.nn (encoder or decoder) a component belongs to: its norms' roles depend on
// norm_first and on how many blocks the layer has.
std::string layer_layout(bool norm_first, bool cross, const std::string& s) {
  if (s.rfind("sa.", 0) == 0) return "self-attention: " + mha_layout(s.substr(3));
  if (s.rfind("ca.", 0) == 0) return "cross-attention over the memory (S its length): " + mha_layout(s.substr(3));
  if (s == "sa_output") return "[B, T, E], the self-attention's output (after out_proj), before the residual";
  if (s == "ca_output") return "[B, T, E], the cross-attention's output (after out_proj), before the residual";
  if (s == "ffn_hidden") return "[B, T, ffn], linear1 then the activation";
  if (s == "ffn_output") return "[B, T, E], linear2, before the residual";
  if (s == "output") return "[B, T, E], the layer's output";
  const std::vector<std::string> blocks =
      cross ? std::vector<std::string>{"self-attention", "cross-attention", "feed-forward"}
            : std::vector<std::string>{"self-attention", "feed-forward"};
  if (s.size() == 5 && s.rfind("norm", 0) == 0 && s[4] >= '1' && size_t(s[4] - '1') < blocks.size()) {
    const size_t b = size_t(s[4] - '1');
    return norm_first ? "[B, T, E], LayerNorm of the residual stream: the " + blocks[b] + "'s input (pre-norm)"
                      : "[B, T, E], LayerNorm of the residual sum after the " + blocks[b] + " (post-norm)";
  }
  return "";
}

std::string llm_layout(const Problem& p, const std::string& s) {
  const bool gpt2 = p.module == ModuleKind::GPT2Block, gemma = p.module == ModuleKind::Gemma2DecoderLayer;
  const bool qk_norm = !gpt2 && p.llama.qk_norm;
  const std::string kv = gpt2 ? "heads" : "kv_heads";
  if (s.rfind("attn.", 0) == 0 || p.module == ModuleKind::LlamaAttention) {
    const std::string attn = s.rfind("attn.", 0) == 0 ? s.substr(5) : s;
    const std::string out_proj = gpt2 ? "c_proj" : "o_proj";
    if (attn == "q")
      return gpt2 ? "[B, heads, T, head_dim], c_attn's first hidden columns, after the head split"
                  : std::string("[B, heads, T, head_dim], q_proj, after the head split, before ") +
                        (qk_norm ? "q_norm" : "rotary");
    if (attn == "k")
      return gpt2 ? "[B, heads, T, head_dim], c_attn's second hidden columns, after the head split"
                  : std::string("[B, kv_heads, T, head_dim], k_proj, after the head split, before ") +
                        (qk_norm ? "k_norm" : "rotary") + ", before any repeat to the query heads";
    if (attn == "v")
      return gpt2 ? "[B, heads, T, head_dim], c_attn's last hidden columns, after the head split"
                  : "[B, kv_heads, T, head_dim], v_proj, after the head split, before any repeat";
    if (attn == "q_norm") return "[B, heads, T, head_dim], q after the per-head RMSNorm, before rotary";
    if (attn == "k_norm") return "[B, kv_heads, T, head_dim], k after the per-head RMSNorm, before rotary";
    if (attn == "q_rot") return "[B, heads, T, head_dim], q after rotary at the position ids";
    if (attn == "k_rot") return "[B, kv_heads, T, head_dim], k after rotary, before any repeat to the query heads";
    if (attn == "cache.k")
      return "[B, " + kv + ", S, head_dim], the whole key cache after this call's update (keys after rotary)";
    if (attn == "cache.v") return "[B, " + kv + ", S, head_dim], the whole value cache after this call's update";
    if (attn == "scores")
      return std::string("[B, heads, T, S], q k^T ") +
             (gemma ? "* query_pre_attn_scalar^-0.5, soft-capped" : "/ sqrt(head_dim)") +
             ", before softmax; masked keys hold -inf (transformers adds finfo.min)" +
             (p.llama.sliding_window ? ", keys out of the window too" : "");
    if (attn == "attn_weights")
      return "[B, heads, T, S], per query head: softmax over the S keys; a query row that sees no key (left "
             "padding) is uniform over all S, as in transformers";
    if (attn == "context") return "[B, T, heads * head_dim], the heads concatenated, before " + out_proj;
    if (attn == "output")
      return "[B, T, hidden], " + out_proj + ", before " + (gemma ? "post_attention_layernorm" : "the residual");
    return "";
  }
  const std::string rms = gemma ? "RMSNorm scaled by (1 + weight)" : "RMSNorm";
  if (s == "input_layernorm") return "[B, T, hidden], " + rms + " of the input: the attention's input";
  if (s == "ln_1") return "[B, T, hidden], LayerNorm of the input: the attention's input";
  if (s == "attn_residual")
    return gemma ? "[B, T, hidden], the input plus post_attention_layernorm(attention output)"
                 : "[B, T, hidden], the input plus the attention's output";
  if (s == "post_attention_layernorm")
    return gemma ? "[B, T, hidden], " + rms + " of the attention's output, before the residual"
                 : "[B, T, hidden], RMSNorm of attn_residual: the MLP's input";
  if (s == "pre_feedforward_layernorm") return "[B, T, hidden], " + rms + " of attn_residual: the MLP's input";
  if (s == "post_feedforward_layernorm") return "[B, T, hidden], " + rms + " of the MLP's output, before the residual";
  if (s == "ln_2") return "[B, T, hidden], LayerNorm of attn_residual: the MLP's input";
  if (s == "mlp.gate") return "[B, T, intermediate], gate_proj, before the activation";
  if (s == "mlp.up") return "[B, T, intermediate], up_proj";
  if (s == "mlp.act")
    return gpt2    ? "[B, T, inner], gelu_new (tanh) of mlp.fc"
           : gemma ? "[B, T, intermediate], gelu_tanh(gate) * up"
                   : "[B, T, intermediate], silu(gate) * up";
  if (s == "mlp.down")
    return std::string("[B, T, hidden], down_proj, before ") + (gemma ? "post_feedforward_layernorm" : "the residual");
  if (s == "mlp.fc") return "[B, T, inner], c_fc, before the activation";
  if (s == "mlp.proj") return "[B, T, hidden], c_proj, before the residual";
  if (s == "output") return "[B, T, hidden], the layer's output (after the second residual)";
  return "";
}

}  // namespace

// The layout of component `name` of problem `p` in words; empty when none is written (a test asserts
// that never happens for a component the hand core gives).
std::string component_layout(const Problem& p, const std::string& name) {
  std::string s = name, where;
  std::smatch m;
  // A decode session: each call's components under prefill. and step.N., then the whole output.
  if (p.decode_steps > 0) {
    static const std::regex step(R"(^step\.(\d+)\.(.*)$)");
    if (s.rfind("prefill.", 0) == 0) {
      s = s.substr(8), where = "prefill: ";
    } else if (std::regex_match(s, m, step)) {
      where = "step " + m[1].str() + " (T = 1): ";
      s = m[2].str();
    } else if (s == "output") {
      return "[B, T, hidden], every token's output: the prefill's and each step's, concatenated along T";
    } else {
      return "";
    }
  }
  static const std::regex layer(R"(^layers\.(\d+)\.(.*)$)");
  if (std::regex_match(s, m, layer)) where += "layer " + m[1].str() + ": ", s = m[2].str();
  std::string words;
  switch (module_handler(p.module)) {
    case ModuleHandler::MultiheadAttention:
      words = mha_layout(s);
      break;
    case ModuleHandler::TransformerEncoderLayer:
    case ModuleHandler::TransformerEncoder:
      if (p.module == ModuleKind::TransformerEncoder && where.empty())
        words = s == "norm"     ? "[B, T, E], the stack's final LayerNorm"
                : s == "output" ? "[B, T, E], the stack's output"
                                : "";
      else
        words = layer_layout(p.encoder.norm_first, false, s);
      break;
    case ModuleHandler::TransformerDecoderLayer:
      words = layer_layout(p.encoder.norm_first, true, s);
      break;
    case ModuleHandler::ScaledDotProductAttention:
      words = s == "scores" ? "[..., L, S], q k^T times the scale plus the mask, before softmax; masked keys hold -inf"
              : s == "attn_weights" ? "[..., L, S], softmax over the S keys"
              : s == "output"       ? "[..., L, Ev], the weights times v"
                                    : "";
      break;
    case ModuleHandler::TokenEncoder:
    case ModuleHandler::ViT: {
      const bool vit = p.module == ModuleKind::ViT;
      static const std::regex head(R"(^head\.(\d+)\.(linear|bn|act)$)");
      if (!where.empty())
        words = layer_layout(vit ? p.vit.layer.norm_first : p.token.layer.norm_first, false, s);
      else if (s == "embedding")
        words = "[B, T, d], nn.Embedding's rows for the token ids";
      else if (s == "patches")
        words = "[B, n, d], the image cut into n patches of C * p * p values each, flattened";
      else if (s == "pos_encoding")
        words = "[B, T, d], after adding the sinusoidal positional encoding";
      else if (std::regex_match(s, m, head))
        words = "[B, width], head block " + m[1].str() + ": " +
                (m[2] == "linear" ? "its Linear"
                 : m[2] == "bn"   ? "BatchNorm1d in eval mode (running statistics)"
                                  : "after the activation");
      else if (s == "output")
        words = vit ? "[B, classes], the head's logits" : "[B, T, d], the last layer's output";
      break;
    }
    case ModuleHandler::Matmul:
      words = s == "output" ? "torch.matmul's result, batch dims broadcast" : "";
      break;
    case ModuleHandler::Softmax:
      words = s == "output" ? "the input's shape, softmax over the last axis" : "";
      break;
    case ModuleHandler::LayerNorm:
      words = s == "mean"     ? "the input's shape without its last axis: the mean over the last axis"
              : s == "rstd"   ? "the input's shape without its last axis: 1 / sqrt(biased variance + eps)"
              : s == "output" ? "the input's shape, normalised over the last axis, times weight plus bias"
                              : "";
      break;
    case ModuleHandler::Book:
      words = book_layout(p, s);
      break;
    case ModuleHandler::Llm:
      words = llm_layout(p, s);
      break;
  }
  return words.empty() ? "" : where + words;
}

namespace {

struct Listed {
  std::string what, name, module, description;  // what: "case" or "fixture <path>"
  Components components;
  Problem problem;
};

// The hand core's components in the order the comparator lists them (component_names), each with the
// shape the hand core gave it; any the list lacks after them.
Components in_dataflow_order(const Problem& p, Components got) {
  Components out;
  std::vector<bool> taken(got.size(), false);
  for (const std::string& n : component_names(p))
    for (size_t i = 0; i < got.size(); ++i)
      if (!taken[i] && got[i].name == n) out.push_back(std::move(got[i])), taken[i] = true;
  for (size_t i = 0; i < got.size(); ++i)
    if (!taken[i]) out.push_back(std::move(got[i]));
  return out;
}

int list_components(const ComponentsOptions& o) {
  std::vector<Listed> listed;
  std::vector<CaseSpec> cases;
  if (!o.selection.cases.empty() || o.fixtures.empty()) cases = selected_cases(o.selection);
  for (const CaseSpec& s : cases) {
    Problem p = make_problem(s);
    RunResult r = run_hand(p, DType::Float64, true, "case " + s.name);
    listed.push_back({"case", s.name, module_name(p.module), s.describe(),
                      in_dataflow_order(p, std::move(r.components)), std::move(p)});
  }
  for (const std::string& f : o.fixtures) {
    Problem p = read_fixture(f, false);
    RunResult r = run_hand(p, DType::Float64, true, "option --fixture " + f);
    listed.push_back({"fixture " + f, p.name, module_name(p.module), p.description,
                      in_dataflow_order(p, std::move(r.components)), std::move(p)});
  }
  auto shape_text = [](const Shape& sh) {
    std::string t;
    for (size_t i = 0; i < sh.size(); ++i) t += (i ? "x" : "") + std::to_string(sh[i]);
    return t.empty() ? std::string("scalar") : t;
  };
  if (o.format == Format::Json) {
    nlohmann::json doc = {{"problems", nlohmann::json::array()}};
    for (const Listed& l : listed) {
      nlohmann::json cs = nlohmann::json::array();
      for (const Component& c : l.components)
        cs.push_back({{"name", c.name}, {"shape", c.value.shape}, {"layout", component_layout(l.problem, c.name)}});
      doc["problems"].push_back(
          {{"name", l.name}, {"module", l.module}, {"description", l.description}, {"components", std::move(cs)}});
    }
    fmt::print("{}\n", doc.dump(2, ' ', false, kBadUtf8Replaced));
    return kPass;
  }
  if (o.markdown) {
    auto cell = [](std::string t) {
      for (size_t i = 0; (i = t.find('|', i)) != std::string::npos; i += 2) t.replace(i, 1, "\\|");
      return t;
    };
    for (const Listed& l : listed) {
      fmt::print("### `{}`: {}\n\n{}\n\n| component | shape | layout |\n|---|---|---|\n", l.name, l.module,
                 cell(l.description));
      for (const Component& c : l.components)
        fmt::print("| `{}` | {} | {} |\n", c.name, shape_text(c.value.shape),
                   cell(component_layout(l.problem, c.name)));
      fmt::print("\n");
    }
    return kPass;
  }
  for (const Listed& l : listed) {
    fmt::print("{} {}: {}\n", l.what == "case" ? "case" : "problem", l.name, l.description);
    size_t w = 9, ws = 5;
    for (const Component& c : l.components)
      w = std::max(w, c.name.size()), ws = std::max(ws, shape_text(c.value.shape).size());
    fmt::print("  {:<{}}  {:<{}}  {}\n", "component", w, "shape", ws, "layout");
    for (const Component& c : l.components) {
      const std::string lay = component_layout(l.problem, c.name);
      fmt::print("  {:<{}}  {:<{}}  {}\n", c.name, w, shape_text(c.value.shape), ws, lay.empty() ? "-" : lay);
    }
  }
  return kPass;
}

}  // namespace

void register_components(CLI::App& app, Action& action) {
  auto o = std::make_shared<ComponentsOptions>();
  CLI::App* cmd = app.add_subcommand(
      "components",
      "List every canonical component of the cases (or fixtures): name, shape and layout in words, the names to "
      "hook your own model's intermediates under");
  add_case_options(*cmd, o->selection);
  cmd->add_option("--fixture", o->fixtures, "Also (or, with no --case, only) these fixtures' components")
      ->check(CLI::ExistingFile);
  add_format_option(*cmd, o->format);
  cmd->add_flag("--markdown", o->markdown, "Markdown tables instead (what docs/components.md holds)");
  cmd->callback([o, &action] { action = [o] { return list_components(*o); }; });
}

}  // namespace tparity::cli
