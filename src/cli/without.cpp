// --without: the features a program declares it does not support, as one table (docs/cases.md): what
// a case has of each, its variant without it or why there is none, and whether a fixture has it.
#include <fmt/format.h>

#include <algorithm>

#include "common.hpp"
#include "tparity/api.hpp"
#include "tparity/harness/book.hpp"
#include "tparity/harness/io.hpp"
#include "tparity/harness/llm.hpp"

namespace tparity::cli {

namespace {

struct WithoutFeature {
  const char* name;
  const char* what;                    // for the docs and messages
  bool (*had)(const CaseSpec&);        // the case has the feature
  std::string (*drop)(CaseSpec&);      // makes the variant without it; a reason when none exists
  bool (*in_problem)(const Problem&);  // a fixture has it
};

bool llama_family(ModuleKind m) { return llm_module(m) && llm_row(m).block != LlmBlock::Gpt2; }
bool llama_family(const CaseSpec& s) { return llama_family(s.module); }

bool problem_has_input(const Problem& p, const std::string& suffix) {
  for (const auto& [name, t] : p.inputs)
    if (name.size() >= suffix.size() && name.compare(name.size() - suffix.size(), suffix.size(), suffix) == 0)
      return true;
  return false;
}

std::string none(CaseSpec&) { return ""; }

const WithoutFeature kWithout[] = {
    {"padding", "a key padding mask (the LLM blocks keep their causal mask)",
     [](const CaseSpec& s) { return s.mask == MaskKind::Padding; },
     [](CaseSpec& s) {
       s.mask = MaskKind::None, s.pad_left = false;
       return std::string();
     },
     [](const Problem& p) { return problem_has_input(p, "key_padding_mask"); }},
    {"positions", "position_ids other than arange(T) (an offset)",
     [](const CaseSpec& s) { return llm_module(s.module) && s.position_offset >= 0; },
     [](CaseSpec& s) {
       s.position_offset = -1;
       return std::string();
     },
     [](const Problem& p) {
       const DTensor* pos = p.input("position_ids");
       if (!pos || pos->shape.empty()) return false;
       const int64_t T = pos->shape.back();
       for (size_t i = 0; i < pos->data.size(); ++i)
         if (pos->data[i] != double(int64_t(i) % T)) return true;
       return false;
     }},
    {"decode", "a KV-cache decode session (decode_steps > 0)", [](const CaseSpec& s) { return s.decode_steps > 0; },
     [](CaseSpec& s) {
       s.decode_steps = 0;
       return std::string();
     },
     [](const Problem& p) { return llm_module(p.module) && p.decode_steps > 0; }},
    {"head-dim", "a head_dim other than hidden / heads",
     [](const CaseSpec& s) { return llama_family(s) && s.head_dim && s.head_dim * s.heads != s.dim; },
     [](CaseSpec& s) {
       if (s.dim % s.heads)
         return fmt::format("heads {} do not divide hidden {}: no head_dim = hidden / heads", s.heads, s.dim);
       s.head_dim = 0;
       return std::string();
     },
     [](const Problem& p) {
       return llama_family(p.module) && p.llama.head_dim * p.llama.num_heads != p.llama.hidden_size;
     }},
    {"gqa", "fewer key/value heads than heads (grouped-query or multi-query attention)",
     [](const CaseSpec& s) { return s.kv_heads && s.kv_heads != s.heads; },
     [](CaseSpec& s) {
       s.kv_heads = 0;
       return std::string();
     },
     [](const Problem& p) {
       return (llama_family(p.module) && p.llama.num_kv_heads != p.llama.num_heads) ||
              (p.module == ModuleKind::ScaledDotProductAttention && p.sdpa.enable_gqa);
     }},
    {"bias", "biases in the attention's projections",
     [](const CaseSpec& s) {
       const ModuleHandler h = module_handler(s.module);
       if (h == ModuleHandler::Book) return s.bias && book_class(s.module) != BookClass::SelfAttentionV1;
       if (h == ModuleHandler::MultiheadAttention || llama_family(s)) return s.bias;
       return h == ModuleHandler::Llm || h == ModuleHandler::TransformerEncoderLayer ||
              h == ModuleHandler::TransformerEncoder || h == ModuleHandler::TransformerDecoderLayer ||
              h == ModuleHandler::TokenEncoder || h == ModuleHandler::ViT;  // always
     },
     [](CaseSpec& s) {
       const ModuleHandler h = module_handler(s.module);
       if (h == ModuleHandler::MultiheadAttention || h == ModuleHandler::Book || llama_family(s)) {
         s.bias = false;
         return std::string();
       }
       return module_name(s.module) + "'s attention always has biases (the class has no option without them)";
     },
     [](const Problem& p) {
       switch (module_handler(p.module)) {
         case ModuleHandler::MultiheadAttention:
           return p.mha.bias;
         case ModuleHandler::Book:
           return p.book.qkv_bias;
         case ModuleHandler::Llm:
           return !llama_family(p.module) || p.llama.attention_bias;
         case ModuleHandler::TransformerEncoderLayer:
         case ModuleHandler::TransformerEncoder:
         case ModuleHandler::TransformerDecoderLayer:
         case ModuleHandler::TokenEncoder:
         case ModuleHandler::ViT:
           return true;
         case ModuleHandler::ScaledDotProductAttention:
         case ModuleHandler::Matmul:
         case ModuleHandler::Softmax:
         case ModuleHandler::LayerNorm:
           return false;
       }
       return false;
     }},
    {"kdim-vdim", "MultiheadAttention's key and value sizes other than embed_dim (kdim, vdim)",
     [](const CaseSpec&) { return false; },  // no case has them: the fixtures do
     none,
     [](const Problem& p) {
       return p.module == ModuleKind::MultiheadAttention &&
              (p.mha.key_dim() != p.mha.embed_dim || p.mha.value_dim() != p.mha.embed_dim);
     }},
    {"sliding-window", "a sliding window over the causal mask (Mistral, Qwen3, Gemma 2's sliding_window)",
     [](const CaseSpec& s) {
       auto it = s.config.find("sliding_window");
       return llm_module(s.module) && it != s.config.end() && !it->is_null();
     },
     [](CaseSpec& s) {
       s.config["sliding_window"] = nullptr;
       return std::string();
     },
     [](const Problem& p) { return llama_family(p.module) && p.llama.sliding_window > 0; }},
    {"masks", "any attention mask (causal, random, padding, is_causal); the causal decoders have no variant",
     [](const CaseSpec& s) {
       const ModuleHandler h = module_handler(s.module);
       if (h == ModuleHandler::Llm) return true;
       if (h == ModuleHandler::Book)
         return book_class(s.module) != BookClass::SelfAttentionV1 &&
                book_class(s.module) != BookClass::SelfAttentionV2;
       return s.mask != MaskKind::None;
     },
     [](CaseSpec& s) {
       const ModuleHandler h = module_handler(s.module);
       if (h == ModuleHandler::Llm || h == ModuleHandler::Book)
         return module_name(s.module) + " is causal by its class (its causal mask is not an option)";
       s.mask = MaskKind::None;
       return std::string();
     },
     [](const Problem& p) {
       return problem_has_input(p, "mask") || (llm_module(p.module) && p.causal) ||
              (p.module == ModuleKind::ScaledDotProductAttention && p.sdpa.is_causal) ||
              (book_module(p.module) && p.book.masked());
     }},
};

const WithoutFeature& without_feature(const std::string& name) {
  for (const WithoutFeature& f : kWithout)
    if (name == f.name) return f;
  throw InputError(
      fmt::format("option --without: expected features among {}, got \"{}\"", without_feature_list(), show_text(name)));
}

}  // namespace

std::string without_feature_list() {
  std::string list;
  for (const WithoutFeature& f : kWithout) list += (list.empty() ? "" : ", ") + std::string(f.name);
  return list;
}

void check_without(const std::vector<std::string>& features) {
  for (const std::string& f : features) (void)without_feature(f);
}

std::string without_features(CaseSpec& s, const std::vector<std::string>& features) {
  check_without(features);
  std::vector<std::string> dropped;
  for (const WithoutFeature& f : kWithout) {  // the table's order
    if (std::find(features.begin(), features.end(), f.name) == features.end() || !f.had(s)) continue;
    if (const std::string why = f.drop(s); !why.empty())
      return fmt::format("case {}: declared without {}: {}", s.name, f.name, why);
    dropped.push_back(f.name);
  }
  for (const std::string& d : dropped)
    if (std::find(s.not_checked.begin(), s.not_checked.end(), d) == s.not_checked.end()) s.not_checked.push_back(d);
  return "";
}

std::string fixture_without(const Problem& p, const std::vector<std::string>& features) {
  check_without(features);
  for (const WithoutFeature& f : kWithout)
    if (std::find(features.begin(), features.end(), f.name) != features.end() && f.in_problem(p))
      return fmt::format("declared without {}, which the fixture has ({}); a fixture cannot be re-shaped", f.name,
                         f.what);
  return "";
}

}  // namespace tparity::cli
