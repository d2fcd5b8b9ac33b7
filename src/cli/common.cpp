#include "common.hpp"

#include <fmt/format.h>
#include <sys/ioctl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cctype>
#include <cerrno>
#include <cmath>
#include <cstdlib>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <limits>
#include <map>
#include <stdexcept>

#include "tparity/api.hpp"
#include "tparity/harness/book.hpp"
#include "tparity/harness/io.hpp"
#include "tparity/harness/llm.hpp"

namespace tparity::cli {

int g_argc = 0;
char** g_argv = nullptr;
std::vector<std::string> g_after_separator;

void check_export_folder(const std::string& dir, const std::string& what) {
  const std::string named = what + " " + show_text(dir);
  // "link/", "link/." and "link/./" resolve through the link: its own name, lexically
  std::string d = std::filesystem::path(dir).lexically_normal().string();
  while (d.size() > 1 && d.back() == '/') d.pop_back();
  struct stat st {};
  if (::lstat(d.c_str(), &st) != 0) throw InputError(named + ": " + std::strerror(errno));
  if (S_ISLNK(st.st_mode))
    throw InputError(named + ": it is a symbolic link (tparity reads no file through a link: name the folder itself)");
  if (!S_ISDIR(st.st_mode))
    throw InputError(named + ": expected an export's folder, got " + (S_ISREG(st.st_mode) ? "a file" : "a special file"));
  // "link/.." names the link's target's parent, not the folder its letters name
  struct stat as_given {};
  if (::stat(dir.c_str(), &as_given) != 0 || as_given.st_dev != st.st_dev || as_given.st_ino != st.st_ino)
    throw InputError(named + ": it resolves through a symbolic link (tparity reads no file through a link: name the "
                     "folder itself)");
}

StatusLine::StatusLine() : on_(::isatty(2) == 1) {}

void StatusLine::show(std::string line) {
  if (!on_) return;
  line = show_text(line, std::string::npos);  // a path's control characters escaped: one line, drawn over itself
  winsize ws{};
  if (::ioctl(2, TIOCGWINSZ, &ws) == 0 && ws.ws_col > 1 && line.size() >= ws.ws_col) {
    size_t cut = ws.ws_col - 1u;
    while (cut > 0 && (static_cast<unsigned char>(line[cut]) & 0xC0) == 0x80) --cut;  // not inside a character
    line.resize(cut);
  }
  const size_t pad = shown_ > line.size() ? shown_ - line.size() : 0;
  std::fputs(("\r" + line + std::string(pad, ' ')).c_str(), stderr);
  std::fflush(stderr);
  shown_ = line.size();
}

void StatusLine::clear() {
  if (!on_ || !shown_) return;
  std::fputs(("\r" + std::string(shown_, ' ') + "\r").c_str(), stderr);
  std::fflush(stderr);
  shown_ = 0;
}

void add_format_option(CLI::App& cmd, Format& format) {
  cmd.add_option("--format", format, "Output: table (human) or json (one document)")
      ->transform(
          CLI::CheckedTransformer(std::map<std::string, Format>{{"table", Format::Table}, {"json", Format::Json}}))
      ->default_str("table");
}

namespace {

[[noreturn]] void refuse(const char* option, const CaseSpec& s, const std::string& why) {
  throw InputError(fmt::format("option {}: case {} ({}) {}", option, s.name, module_name(s.module), why));
}

bool gpt2_case(const CaseSpec& s) { return llm_module(s.module) && llm_row(s.module).block == LlmBlock::Gpt2; }

// Options a module kind would ignore, refused before any is applied (the others' own refusals, such as
// --scale beyond sdpa or --out-dim beyond the book's classes, stay where the case is made).
void refuse_ignored(const CaseSpec& s, const CaseOverrides& o) {
  const ModuleHandler h = module_handler(s.module);
  const bool llm = h == ModuleHandler::Llm, gpt2 = gpt2_case(s);
  const bool encoders = h == ModuleHandler::TransformerEncoderLayer || h == ModuleHandler::TransformerEncoder ||
                        h == ModuleHandler::TransformerDecoderLayer || h == ModuleHandler::TokenEncoder ||
                        h == ModuleHandler::ViT;
  const bool ops = h == ModuleHandler::Matmul || h == ModuleHandler::Softmax || h == ModuleHandler::LayerNorm;
  if (o.seq && h == ModuleHandler::Matmul) refuse("--seq", s, "takes its operands' own shapes, no sequence length");
  if (o.kv_seq && (h == ModuleHandler::Matmul || h == ModuleHandler::LayerNorm || h == ModuleHandler::Book))
    refuse("--kv-seq", s, "has no keys of their own length");
  if (o.dim && (h == ModuleHandler::Matmul || h == ModuleHandler::Softmax))
    refuse("--dim", s, "has no embedding dimension");
  if (o.value_dim && h != ModuleHandler::ScaledDotProductAttention)
    refuse("--value-dim", s, "has no separate value size (only scaled_dot_product_attention takes it)");
  if (o.heads && ops) refuse("--heads", s, "has no heads");
  if (o.kv_heads && gpt2)
    refuse("--kv-heads", s, "has as many key/value heads as heads (GPT-2 has no grouped-query attention)");
  if (o.ffn && !(encoders || (llm && llm_row(s.module).block != LlmBlock::Attention)))
    refuse("--ffn", s, "has no feed-forward network");
  if (o.bias) {
    const bool on = *o.bias == "on";
    if (ops || h == ModuleHandler::ScaledDotProductAttention) refuse("--bias", s, "has no attention biases");
    if (!on && (gpt2 || encoders))
      refuse("--bias", s, "off: its attention always has biases (the class has no option without them)");
    if (on && h == ModuleHandler::Book && book_class(s.module) == BookClass::SelfAttentionV1)
      refuse("--bias", s, "on: SelfAttention_v1's weights are bare parameters, it has no bias");
    if (on && llm && !gpt2 && !llm_takes(s.module, "attention_bias"))
      refuse("--bias", s, "on: the class has no attention_bias (its projections have no bias)");
  }
  if (o.activation && !encoders)
    refuse("--activation", s, "has no feed-forward activation (only the encoder layers and vit take it)");
  if (o.random_params && (ops || llm || h == ModuleHandler::Book || h == ModuleHandler::ScaledDotProductAttention))
    refuse("--random-params", s,
           "has no parameter that torch initialises to a constant (its parameters are drawn at random already)");
  // the LLM blocks' own options
  auto llm_only = [&](bool given, const char* option) {
    if (given && !llm) refuse(option, s, "is not an LLM block (the option is the LLM blocks')");
  };
  llm_only(o.head_dim.has_value(), "--head-dim");
  llm_only(o.decode_steps.has_value(), "--decode-steps");
  llm_only(o.positions_offset.has_value(), "--positions-offset");
  llm_only(o.padding.has_value(), "--padding");
  llm_only(o.rope.has_value(), "--rope");
  llm_only(o.rotary_fraction.has_value(), "--rotary-fraction");
  llm_only(o.eps.has_value(), "--eps");
  if (!llm) return;
  if (o.head_dim && gpt2) refuse("--head-dim", s, "has head_dim = hidden / heads (GPT2Config has no head_dim)");
  if (o.positions_offset && *o.positions_offset != "none" && gpt2)
    refuse("--positions-offset", s,
           "has no rotary embedding: GPT2Block would ignore position_ids (its positions are GPT2Model's wpe)");
  if (o.rope && !llm_takes(s.module, "rope_convention"))
    refuse("--rope", s, gpt2 ? "has no rotary embedding" : "fixes its rotary convention (half; no rope_convention)");
  if (o.rotary_fraction && !llm_takes(s.module, "partial_rotary_factor"))
    refuse("--rotary-fraction", s,
           gpt2 ? "has no rotary embedding" : "rotates every dim of a head (no partial_rotary_factor)");
  if (o.eps && !llm_takes(s.module, "rms_norm_eps") && !llm_takes(s.module, "layer_norm_epsilon"))
    refuse("--eps", s, "has no norm (the attention alone)");
  if (o.padding && o.mask) refuse("--padding", s, "give --padding or --mask, not both (both set the key padding)");
}

}  // namespace

void apply_overrides(CaseSpec& s, const CaseOverrides& o) {
  refuse_ignored(s, o);
  if (o.batch) s.batch = *o.batch;
  if (o.seq) s.seq = *o.seq;
  if (o.kv_seq) s.kv_seq = *o.kv_seq;
  if (o.dim) s.dim = *o.dim;
  if (o.value_dim) s.value_dim = *o.value_dim;
  if (o.out_dim) {
    if (!book_module(s.module))
      throw InputError("option --out-dim: only the book's attention classes take it (d_out), not " +
                       module_name(s.module));
    s.out_dim = *o.out_dim;
  }
  if (o.heads) s.heads = *o.heads;
  if (o.kv_heads) s.kv_heads = *o.kv_heads;
  if (o.scale) s.scale = *o.scale;
  if (o.ffn) s.ffn = *o.ffn;
  if (o.bias) s.bias = *o.bias == "on";
  if (o.activation) {  // a ViT's is its head's (its encoder layers keep the seed's relu)
    const Activation a = activation_from_name(*o.activation);
    (s.module == ModuleKind::ViT ? s.head_activation : s.activation) = a;
  }
  if (o.mask) {
    // The LLM blocks are causal decoders: "none" would not make them otherwise, so it is refused
    // rather than run causal under another name.
    if (llm_module(s.module) && *o.mask != "causal" && *o.mask != "padding")
      throw InputError("option --mask " + *o.mask + ": case " + s.name + " (" + module_name(s.module) +
                       ") is a causal decoder; expected causal, or padding (causal with a key padding mask)");
    s.mask = mask_kind_from_name(*o.mask);
    s.pad_left = false;
  }
  if (o.seed) s.seed = *o.seed;
  if (o.random_params) s.random_params = true;
  if (llm_module(s.module)) {
    if (o.head_dim) s.head_dim = *o.head_dim;
    if (o.decode_steps) s.decode_steps = *o.decode_steps;
    if (o.positions_offset) {
      if (*o.positions_offset == "none") {
        s.position_offset = -1;
      } else {
        const std::string& v = *o.positions_offset;
        const std::optional<int64_t> n = whole_number_text(v, 0, int64_t(1) << 30);
        if (!n)
          throw InputError(fmt::format(
              "option --positions-offset: expected none or a whole number from 0 to 2^30, got \"{}\"", show_text(v, 60)));
        s.position_offset = *n;
      }
    }
    if (o.padding) {
      s.mask = *o.padding == "none" ? MaskKind::None : MaskKind::Padding;
      s.pad_left = *o.padding == "left";
    }
    if (o.rope) s.rope = rope_style_from_name(*o.rope);
    if (o.rotary_fraction) {
      const double f = *o.rotary_fraction;
      if (!(f > 0 && f <= 1))
        throw InputError(fmt::format("option --rotary-fraction: expected a fraction in (0, 1], got {}", f));
      s.rotary_fraction = f;
    }
    if (o.eps) {
      if (!(std::isfinite(*o.eps) && *o.eps > 0 && float(*o.eps) > 0))
        throw InputError(
            fmt::format("option --eps: expected a positive finite number (above 0 in float32), got {}", *o.eps));
      s.config[llm_takes(s.module, "rms_norm_eps") ? "rms_norm_eps" : "layer_norm_epsilon"] = *o.eps;
    }
    // the values against each other, once all are set
    if (o.decode_steps || o.seq) {
      if (s.decode_steps >= s.seq)
        throw InputError(fmt::format(
            "option --decode-steps: case {}: expected fewer than its {} tokens (--seq; the prefill needs one at "
            "least), got {}",
            s.name, s.seq, s.decode_steps));
    }
    if (!gpt2_case(s) && (o.kv_heads || o.heads) && s.kv_heads && s.heads % s.kv_heads)
      throw InputError(fmt::format("option --kv-heads: case {}: expected a divisor of heads {}, got {}", s.name,
                                   s.heads, s.kv_heads));
    if (!gpt2_case(s) && (o.head_dim || o.rotary_fraction || o.dim || o.heads)) {
      if (!s.head_dim && s.dim % s.heads)
        throw InputError(
            fmt::format("option --heads: case {}: expected a divisor of hidden {} (head_dim = hidden / "
                        "heads), got {}; or give --head-dim",
                        s.name, s.dim, s.heads));
      const int64_t d = s.head_dim ? s.head_dim : s.dim / s.heads;
      const int64_t r = int64_t(double(d) * s.rotary_fraction);
      if (r < 2 || r % 2)
        throw InputError(fmt::format(
            "option {}: case {}: head_dim {} x rotary fraction {:g} = {} rotary dims, expected an even number >= 2",
            o.rotary_fraction && !o.head_dim ? "--rotary-fraction" : "--head-dim", s.name, d, s.rotary_fraction, r));
    }
    if (s.pad_left && s.mask == MaskKind::Padding && s.decode_steps > 0)
      throw InputError(fmt::format(
          "option --padding: case {}: left padding with {} decode steps: a left-padded query row sees no key, and "
          "transformers gives it uniform weights over however many keys the call has, so the prefill's rows cannot "
          "equal the full forward's; expected right or none, or --decode-steps 0",
          s.name, s.decode_steps));
  }
  for (const std::string& kv : o.config) {
    const size_t eq = kv.find('=');
    const std::string key = kv.substr(0, eq), where = "option --config " + kv;
    if (eq == std::string::npos || key.empty())
      throw InputError(where +
                       ": expected KEY=VALUE (a config key of the class and a JSON value), e.g. sliding_window=4");
    if (!llm_module(s.module))
      throw InputError(where + ": only the LLM blocks take config keys, not " + module_name(s.module) + " (case " +
                       s.name + ")");
    if (!llm_takes(s.module, key))
      throw InputError(where + ": " + module_name(s.module) + " has no config key " + key +
                       " (expected one of: " + llm_key_list(s.module) + ")");
    s.config[key] = parse_json(kv.substr(eq + 1), where);
  }
}

void add_case_options(CLI::App& cmd, CaseSelection& sel, const std::string& more_names) {
  cmd.add_option("--case", sel.cases, "Cases (default: every default case): " + case_names() + more_names);
  CaseOverrides& o = sel.overrides;
  const CLI::Validator size = whole_number_in(1, kNoUpperBound);  // (given with transform: see decimal_numbers)
  cmd.add_option("--batch", o.batch, "Batch size B; 0 = unbatched input (matmul: the leading batch dim, 0 drops it)")
      ->transform(whole_number_in(0, kNoUpperBound));
  cmd.add_option("--seq", o.seq, "Query sequence length L (T)")->transform(size);
  cmd.add_option("--kv-seq", o.kv_seq, "Key/value sequence length S (attention cases; S != L means cross-attention)")
      ->transform(size);
  cmd.add_option("--dim", o.dim, "Embedding dimension E (d_model)")->transform(size);
  cmd.add_option("--value-dim", o.value_dim, "sdpa: value feature size Ev")->transform(size);
  cmd.add_option("--out-dim", o.out_dim, "the book's attention classes: d_out (--dim is d_in)")->transform(size);
  cmd.add_option("--heads", o.heads, "Number of heads")->transform(size);
  cmd.add_option("--kv-heads", o.kv_heads,
                 "sdpa and the LLM blocks: key/value heads, a divisor of --heads (fewer: grouped-query attention)")
      ->transform(size);
  cmd.add_option("--scale", o.scale, "sdpa: the scores' scale (default 1/sqrt(E))");
  cmd.add_option("--ffn", o.ffn, "Encoder dim_feedforward")->transform(size);
  cmd.add_option("--bias", o.bias,
                 "Attention biases: MultiheadAttention's, the book's qkv_bias, Llama's attention_bias")
      ->check(CLI::IsMember({"on", "off"}));
  cmd.add_option("--activation", o.activation,
                 "Encoder feed-forward activation (relu, gelu); for vit the head's (also tanh, sigmoid, silu, "
                 "softplus, leakyrelu)")
      ->check(CLI::IsMember({"relu", "gelu", "tanh", "sigmoid", "silu", "softplus", "leakyrelu"}));
  cmd.add_option("--mask", o.mask,
                 "none, causal (float -inf above the diagonal), random (bool), padding (bool key padding), "
                 "is-causal (sdpa: the is_causal flag)")
      ->check(CLI::IsMember({"none", "causal", "random", "padding", "is-causal"}));
  cmd.add_option("--config", o.config,
                 "The LLM blocks: KEY=VALUE over the class's config, transformers' key names and a JSON value "
                 "(e.g. --config sliding_window=4); repeatable");
  cmd.add_option("--head-dim", o.head_dim, "The LLM blocks (not gpt2): head_dim (default: the case's; hidden / heads)")
      ->transform(size);
  cmd.add_option("--decode-steps", o.decode_steps,
                 "The LLM blocks: decode the last N tokens one call each over a KV cache (0: one forward call)")
      ->transform(whole_number_in(0, kNoUpperBound));
  cmd.add_option("--positions-offset", o.positions_offset,
                 "The LLM blocks: position_ids = N + 5 b + arange(T); none: no position_ids input (arange(T))");
  cmd.add_option("--padding", o.padding,
                 "The LLM blocks' key padding: right (each element's last tokens), left (its first), none")
      ->check(CLI::IsMember({"left", "right", "none"}));
  cmd.add_option("--rope", o.rope, "Llama's rotary pairs: half (rotate_half) or interleaved (GPT-J's)")
      ->check(CLI::IsMember({"half", "interleaved"}));
  cmd.add_option("--rotary-fraction", o.rotary_fraction,
                 "Llama's partial_rotary_factor: the fraction of each head's dims that rotate, in (0, 1]");
  cmd.add_option("--eps", o.eps, "The LLM blocks' norm epsilon (rms_norm_eps; GPT-2's layer_norm_epsilon)");
  cmd.add_option("--without", sel.without,
                 "Features your code does not support (" + without_feature_list() +
                     "): each case runs its variant without them, or is skipped; repeatable")
      ->delimiter(',');
  add_seed_option(cmd, o.seed, "Seed of weights and inputs (default: each case's own)");
  cmd.add_flag("--random-params", o.random_params,
               "Draw biases and LayerNorm affine at random instead of torch's constant init");
  add_max_elements_option(cmd, &sel.max_elements);
}

void add_max_elements_option(CLI::App& cmd, int64_t* also) {
  cmd.add_option_function<int64_t>(
         "--max-elements",
         [also](const int64_t& n) {
           set_max_elements(n);  // what validate() allows
           if (also) *also = n;
         },
         "Refuse cases, fixtures and problems whose largest tensor would exceed this many elements")
      ->transform(whole_number_in(1, kNoUpperBound))
      ->default_str(std::to_string(max_elements()));
}

std::vector<CaseSpec> selected_cases(const CaseSelection& sel,
                                     std::vector<std::pair<std::string, std::string>>* skipped) {
  check_without(sel.without);
  std::vector<CaseSpec> chosen = sel.cases.empty() ? default_cases() : std::vector<CaseSpec>{};
  for (const std::string& name : sel.cases) chosen.push_back(find_case(name));
  std::vector<CaseSpec> out;
  for (CaseSpec& s : chosen) {
    apply_overrides(s, sel.overrides);
    if (const std::string why = without_features(s, sel.without); !why.empty()) {
      if (!skipped) throw InputError("option --without: " + why);
      skipped->push_back({s.name, why});
      continue;
    }
    check_size(s, sel.max_elements);
    out.push_back(std::move(s));
  }
  return out;
}

std::string case_names() {
  std::string names;
  for (const CaseSpec& c : default_cases()) names += (names.empty() ? "" : ", ") + c.name;
  for (const CaseSpec& c : stress_cases()) names += ", " + c.name;
  return names;
}

CaseSpec find_case(const std::string& name) {
  for (const CaseSpec& c : default_cases())
    if (c.name == name) return c;
  for (const CaseSpec& c : stress_cases())
    if (c.name == name) return c;
  throw InputError(fmt::format("option --case: expected one of {}, got \"{}\"", case_names(), name));
}

// Elements of the largest tensor a case materialises: the (B, H, L, S) scores, the (B, T, ffn)
// hidden layer, the weights; the embedding table, the image and the ViT head's first Linear
// (n * d inputs); an op case's operands and output. Long double: the product of four user-given sizes
// may overflow int64.
long double largest_tensor(const CaseSpec& s) {
  const long double B = s.batch ? s.batch : 1, L = s.seq, S = s.kv_seq ? s.kv_seq : s.seq;
  const long double widest =
      std::max({(long double)s.dim, (long double)s.ffn, (long double)s.value_dim, (long double)s.out_dim * s.heads});
  const long double attention = std::max({B * s.heads * L * S, B * std::max(L, S) * widest, 3.0L * widest * widest});
  switch (module_handler(s.module)) {
    case ModuleHandler::TokenEncoder:
      return std::max(attention, (long double)s.vocab * s.dim);
    case ModuleHandler::ViT: {
      // seq and dim are checked against the image when the case is made; size by the image itself
      const long double p = s.patch > 0 ? s.patch : 1, n = (s.image_height / p) * (s.image_width / p),
                        d = (long double)s.channels * p * p;
      long double m = std::max({B * s.channels * s.image_height * s.image_width, B * s.heads * n * n,
                                B * n * std::max<long double>(d, s.ffn), 3.0L * d * d});
      long double in = n * d;
      for (int64_t w : s.head) m = std::max(m, in * w), in = w;
      return m;
    }
    case ModuleHandler::Matmul: {
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
    case ModuleHandler::Softmax:
      return B * L * S;
    case ModuleHandler::LayerNorm:
      return B * L * s.dim;
    case ModuleHandler::MultiheadAttention:
    case ModuleHandler::TransformerEncoderLayer:
    case ModuleHandler::TransformerEncoder:
    case ModuleHandler::TransformerDecoderLayer:
    case ModuleHandler::ScaledDotProductAttention:
    case ModuleHandler::Book:
    case ModuleHandler::Llm:
      return attention;
  }
  return attention;
}

void check_size(const CaseSpec& s, int64_t max_elements) {
  if (largest_tensor(s) > (long double)max_elements)
    throw InputError(
        fmt::format("case {}: sizes (batch {}, seq {}, kv-seq {}, dim {}, heads {}, ffn {}) give a tensor of "
                    "{:.3g} elements, above --max-elements {} (each element costs 8 bytes per copy)",
                    s.name, s.batch, s.seq, s.kv_seq ? s.kv_seq : s.seq, s.dim, s.heads, s.ffn,
                    double(largest_tensor(s)), max_elements));
}

CLI::Option* add_seed_option(CLI::App& cmd, std::optional<uint64_t>& seed, const std::string& help) {
  return cmd.add_option("--seed", seed, help);
}

namespace {

// what came, quoted as a refusal quotes it: cut, control characters escaped (one line)
std::string came(const std::string& v) { return "got \"" + show_text(v, 60) + "\""; }

// v as a decimal whole number without its leading zeros ("-007" -> "-7", "-0" -> "0"), or why it is
// none: not an optional sign and digits, negative where unsigned, or beyond uint64 (unsigned; a
// signed option's range is whole_number_in's to say).
struct Whole {
  std::string digits, why;
};
Whole decimal_whole(const std::string& v, bool is_unsigned) {
  const Whole none{"", (is_unsigned ? "expected a whole number >= 0, " : "expected a whole number, ") + came(v)};
  size_t i = 0;
  bool negative = false;
  if (i < v.size() && (v[i] == '+' || v[i] == '-')) negative = v[i++] == '-';
  if (i == v.size()) return none;
  for (size_t j = i; j < v.size(); ++j)
    if (v[j] < '0' || v[j] > '9') return none;
  while (i + 1 < v.size() && v[i] == '0') ++i;
  const std::string digits = v.substr(i);
  negative = negative && digits != "0";
  if (negative && is_unsigned) return none;
  const std::string limit = std::to_string(std::numeric_limits<uint64_t>::max());
  if (is_unsigned && (digits.size() > limit.size() || (digits.size() == limit.size() && digits > limit)))
    return {"", "expected a whole number from 0 to 2^64-1, " + came(v)};
  return {(negative ? "-" : "") + digits, ""};
}

constexpr const char* kWholeNumber = "whole_number";  // whole_number_in's validators' name

}  // namespace

std::optional<int64_t> whole_number_text(const std::string& v, int64_t lo, int64_t hi) {
  const Whole w = decimal_whole(v, false);
  if (!w.why.empty()) return std::nullopt;
  errno = 0;
  const long long n = std::strtoll(w.digits.c_str(), nullptr, 10);
  if (errno == ERANGE || n < lo || n > hi) return std::nullopt;
  return int64_t(n);
}

std::pair<int64_t, int64_t> parse_shard(const std::string& text) {
  const size_t slash = text.find('/');
  const std::optional<int64_t> i = whole_number_text(text.substr(0, slash), 0, int64_t(1) << 40),
                               n = slash == std::string::npos ? std::nullopt
                                                              : whole_number_text(text.substr(slash + 1), 1, int64_t(1) << 40);
  if (!i || !n || *i >= *n)
    throw InputError(fmt::format(
        "option --shard: expected I/N with 0 <= I < N <= 2^40 (the I-th of N slices, counted from 0), got \"{}\"",
        show_text(text, 60)));
  return {*i, *n};
}

CLI::Validator whole_number_in(int64_t lo, int64_t hi) {
  const std::string range =
      hi >= kNoUpperBound ? fmt::format(">= {}", lo) : fmt::format("from {} to {}", lo, hi);
  return CLI::Validator(
      [lo, hi, range](std::string& v) {
        const Whole w = decimal_whole(v, false);
        errno = 0;
        const long long n = w.why.empty() ? std::strtoll(w.digits.c_str(), nullptr, 10) : 0;
        if (w.why.empty() && errno != ERANGE && n >= lo && n <= hi) {
          v = w.digits;  // decimal, for CLI11's base-0 conversion
          return std::string();
        }
        // (beyond the bound that is none, 2^62-1: said as such, not ">= lo")
        const bool huge = w.why.empty() && hi >= kNoUpperBound && (errno == ERANGE || n > hi);
        return "expected a whole number " + (huge ? fmt::format("from {} to 2^62-1", lo) : range) + ", " + came(v);
      },
      hi >= kNoUpperBound ? fmt::format("INT >= {}", lo) : fmt::format("INT in [{} - {}]", lo, hi), kWholeNumber);
}

CLI::Validator not_empty(const std::string& what) {
  return CLI::Validator(
      [what](std::string& v) { return v.empty() ? "expected " + what + ", got an empty value" : std::string(); },
      "", "not empty");
}

void decimal_numbers(CLI::App& app) {
  // any whole number (an option without whole_number_in), its digits handed on
  const auto whole_number = [](bool is_unsigned) {
    return CLI::Validator(
        [is_unsigned](std::string& v) {
          const Whole w = decimal_whole(v, is_unsigned);
          if (w.why.empty()) v = w.digits;
          return w.why;
        },
        "");
  };
  const CLI::Validator whole = whole_number(false), whole_unsigned = whole_number(true);
  // A number strtod reads whole, not hexadecimal, that float64 holds (1e400 would be inf, 1e-400 0,
  // where CLI11 reads them as long double and casts); inf and nan go on to the option's own check.
  const CLI::Validator number(
      [](std::string& v) {
        char* end = nullptr;
        errno = 0;
        const double x = v.empty() || std::isspace(static_cast<unsigned char>(v[0])) ? 0.0 : std::strtod(v.c_str(), &end);
        if (end != v.c_str() + v.size() || v.find_first_of("xX") != std::string::npos)
          return "expected a number, " + came(v);
        if (errno == ERANGE && (std::isinf(x) || x == 0.0)) return "expected a number within float64's range, " + came(v);
        return std::string();
      },
      "");
  for (CLI::Option* o : app.get_options()) {
    const std::string type = o->get_type_name();
    const std::string base = type.substr(0, type.find(':'));
    if (base == "INT") {
      const CLI::Validator* own = nullptr;
      try {
        own = o->get_validator(kWholeNumber);
      } catch (const CLI::OptionNotFound&) {
      }
      // whole_number_in hands CLI11 its decimal digits only when it may change the text: given
      // with check(), which forbids that, 010 would pass its range as 10 and then be read as 8.
      if (own && !own->get_modifying())
        throw std::logic_error(o->get_name() + ": whole_number_in must be given with transform(), not check()");
      if (!own) o->transform(whole);
    }
    if (base == "UINT") o->transform(whole_unsigned);
    if (base == "FLOAT") o->transform(number);
  }
  for (CLI::App* sub : app.get_subcommands({})) decimal_numbers(*sub);
}

void add_report_options(CLI::App& cmd, ReportOptions& o) {
  cmd.add_flag("--full", o.full,
               "Print every case's table of components and legs, not only its summary line, failures and diagnoses");
  cmd.add_option("--accept", o.accept,
                 "precision-slip: a float64 leg failing at float32's rounding level (a float32 constant, table or "
                 "cast in float64 code) is a note, not a failure, when every float32 leg of the case passes")
      ->check(CLI::IsMember({"precision-slip"}));
}

void apply_accept(std::vector<CaseReport>& reports, const ReportOptions& o) {
  if (std::find(o.accept.begin(), o.accept.end(), "precision-slip") == o.accept.end()) return;
  for (CaseReport& r : reports) accept_precision_slip(r);
}

int emit(const std::vector<CaseReport>& reports, Format format, bool full) {
  print_reports(reports, stdout, format == Format::Json, full);
  return exit_code(reports) ? kFail : kPass;
}

}  // namespace tparity::cli
