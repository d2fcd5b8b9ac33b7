// A problem: one module call, fully specified (module, configuration, forward options, state dict,
// inputs) and, when it came from a fixture, the outputs PyTorch gave for it. Cases generate problems;
// fixtures are problems on disk; the hand core and the torch runner both consume them.
#pragma once

#include <cstddef>
#include <map>
#include <nlohmann/json.hpp>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "tparity/core/book.hpp"
#include "tparity/core/decoder.hpp"
#include "tparity/core/llm.hpp"
#include "tparity/core/models.hpp"
#include "tparity/harness/dtensor.hpp"

namespace tparity {

enum class ModuleKind {
  MultiheadAttention,
  TransformerEncoderLayer,
  TransformerEncoder,
  TransformerDecoderLayer,
  ScaledDotProductAttention,
  TokenEncoder,  // seed 004's TransformerEncoder: nn.Embedding, PositionalEncoding, encoder layers
  ViT,           // seed 004's ViT: Patcher, PositionalEncoding, encoder layers, ViTHead (eval)
  Matmul,        // torch.matmul with batch broadcasting
  Softmax,       // torch.softmax over the last dim
  LayerNorm,     // torch.nn.functional.layer_norm over the last dim
  // The attention classes of "Build a Large Language Model (From Scratch)", ch03 (harness/book.hpp):
  SelfAttentionV1,            // SelfAttention_v1: raw (d_in, d_out) matrices, x @ W
  SelfAttentionV2,            // SelfAttention_v2: nn.Linear projections
  CausalAttention,            // CausalAttention: batched, the causal buffer
  MultiHeadAttentionWrapper,  // MultiHeadAttentionWrapper: CausalAttention heads concatenated, out_proj
  BookMultiHeadAttention,     // the book's MultiHeadAttention (torch's is MultiheadAttention)
  // Hugging Face transformers' decoder blocks (harness/llm.hpp, README "The LLM blocks"):
  LlamaDecoderLayer,    // LlamaDecoderLayer: RMSNorm, rotary, grouped-query attention, SwiGLU
  LlamaAttention,       // LlamaAttention alone (GPT-J's and GPT-NeoX's attentions map onto it)
  GPT2Block,            // GPT2Block: pre-LN, fused Conv1D c_attn, gelu_new
  MistralDecoderLayer,  // MistralDecoderLayer: LlamaDecoderLayer with a sliding window
  Qwen3DecoderLayer,    // Qwen3DecoderLayer: LlamaDecoderLayer with RMSNorm on q and k per head
  Gemma2DecoderLayer,   // Gemma2DecoderLayer: sandwich norms, GeGLU, soft-capped scores, sliding layers
};

// The last kind above: a new kind goes before it or becomes it (the kinds' table checks its length
// against this at compile time).
constexpr ModuleKind kLastModuleKind = ModuleKind::Gemma2DecoderLayer;
constexpr size_t kModuleKindCount = size_t(kLastModuleKind) + 1;

// Where a kind comes from, which decides its config, its readers, its runners and its exporter.
enum class ModuleFamily {
  TorchNn,  // torch.nn's attention and transformer modules
  Op,       // a functional op: scaled_dot_product_attention, matmul, softmax, layer_norm
  Seed,     // seed 004's models (TokenEncoder, ViT)
  Book,     // the book's attention classes (harness/book.hpp)
  Llm,      // transformers' decoder blocks (harness/llm.hpp)
};

// Which code answers for a kind where tparity's layers dispatch (hand runner, fixture reader, cases,
// LibTorch reference, ...): the torch.nn, op and seed kinds each have their own branch; the book's
// classes and the LLM blocks are one branch each, whose family file (harness/book.hpp,
// harness/llm.hpp) tells its kinds apart by their rows. A switch over the handler, never over
// ModuleKind: adding a kind to the book or LLM family then touches no switch, and -Wswitch names
// every switch a new handler must join.
enum class ModuleHandler {
  MultiheadAttention,
  TransformerEncoderLayer,
  TransformerEncoder,
  TransformerDecoderLayer,
  ScaledDotProductAttention,
  TokenEncoder,
  ViT,
  Matmul,
  Softmax,
  LayerNorm,
  Book,  // harness/book.hpp
  Llm,   // harness/llm.hpp
};

// One row per module kind, as data: what the rest of tparity looks up about a kind by its key.
struct ModuleRow {
  ModuleKind kind;
  const char* name;  // the class name in files and on the command line (module_name)
  ModuleFamily family;
  ModuleHandler handler;
  bool fixture_v1;      // fixture format v1 holds it
  bool python_fixture;  // Python's exporters (fixtures/export_*.py) write fixtures of it
};
const ModuleRow& module_row(ModuleKind m);
// Every kind, in the enum's order.
const ModuleRow* module_rows_begin();
const ModuleRow* module_rows_end();
struct ModuleRows {
  const ModuleRow* begin() const { return module_rows_begin(); }
  const ModuleRow* end() const { return module_rows_end(); }
};
inline ModuleRows module_rows() { return {}; }
inline ModuleHandler module_handler(ModuleKind m) { return module_row(m).handler; }

// The modules Python fixtures are exported for (torch.nn's four, the book's classes, the LLM blocks);
// fixture format v1 knows torch.nn's four, and their names for messages. Format v2 (a problem file,
// tparity export) holds any module.
bool fixture_module(ModuleKind m);
bool fixture_v1_module(ModuleKind m);
std::string fixture_v1_module_names();  // "\"MultiheadAttention\", \"TransformerEncoderLayer\", ..."

// torch's class name; "ScaledDotProductAttention" for sdpa, the seed's class names ("TokenEncoder" for
// its TransformerEncoder, "ViT"), "Matmul", "Softmax", "LayerNorm" for the op cases.
std::string module_name(ModuleKind m);
ModuleKind module_from_name(const std::string& name);  // throws std::invalid_argument

// Activation names as torch and seed 004's get_activation spell them: relu, gelu, tanh, sigmoid,
// silu, softplus, leakyrelu.
std::string activation_name(Activation a);
Activation activation_from_name(const std::string& name);  // throws std::invalid_argument

struct Problem {
  std::string name;
  std::string description;
  std::string origin;  // the fixture's path when read from one (errors name it), else empty
  ModuleKind module = ModuleKind::MultiheadAttention;
  MhaConfig mha;             // MultiheadAttention
  MhaForward forward;        // MultiheadAttention
  EncoderConfig encoder;     // TransformerEncoderLayer, TransformerDecoderLayer, each TransformerEncoder layer
  int64_t num_layers = 1;    // TransformerEncoder
  bool final_norm = false;   // TransformerEncoder: config "norm"
  TokenEncoderConfig token;  // TokenEncoder
  VitConfig vit;             // ViT
  int64_t normalized = 0;    // LayerNorm: normalized_shape, the input's last dim
  double eps = 1e-5;         // LayerNorm: eps
  SdpaOptions sdpa;          // ScaledDotProductAttention: is_causal, scale, enable_gqa
  bool affine = true;        // LayerNorm: elementwise_affine (state_dict weight and bias)
  BookConfig book;           // the book's classes
  LlamaConfig llama;         // LlamaDecoderLayer, LlamaAttention
  Gpt2Config gpt2;           // GPT2Block
  int64_t decode_steps = 0;  // the LLM blocks: 0 one forward call; D > 0 a decode session, the last D
                             // tokens one call each after a prefill of the others (harness/llm.hpp)
  bool causal = true;        // the LLM blocks: the causal mask (transformers' decoders always have it)
  TensorMap state_dict;
  TensorMap inputs;
  TensorMap outputs;          // as PyTorch returned them (fixtures only)
  TensorMap outputs_float32;  // the same module run in float32 (fixtures only, optional)
  // Fixture format v2: the producer's components by canonical name and layout (README, Components),
  // float64 and float32, and what produced the outputs ("reference": name, torch, ...).
  TensorMap components, components_float32;
  std::map<std::string, std::string> producer;
  int fixture_version = 0;  // 1 or 2 when read from a fixture
  std::string tensor_file;  // the safetensors file beside it that held its tensors, when one did
  // Whose semantics the problem follows where torch versions differ (core/attention.hpp): a
  // fixture's are its producer's torch (version 1 fixtures: 1.13); a case's are unset until the
  // evaluation resolves them to the reference's (resolve_semantics).
  std::optional<TorchSemantics> semantics;

  const DTensor* input(const std::string& key) const {
    auto it = inputs.find(key);
    return it == inputs.end() ? nullptr : &it->second;
  }
};

// Sets p.semantics to `s` unless the problem fixes its own, and stamps the result into every
// attention config the problem holds (mha, encoder, token.layer, vit.layer).
void resolve_semantics(Problem& p, TorchSemantics s);

// The semantics of a torch version string ("2.13.0+cpu" -> Torch2, "1.13.1" -> Torch113); throws
// std::invalid_argument for what is neither.
TorchSemantics semantics_of_version(const std::string& torch_version);

// Whether a query row of an attention is masked at every key by the problem's masks (then torch
// 1.13's softmax gives NaN there, and 2.x's need_weights=False path zeros): for MultiheadAttention
// and the encoder and decoder layers, judged on the masks alone as semantics `s` merges them.
bool has_fully_masked_rows(const Problem& p, TorchSemantics s);

// A copy of the problem with every nonzero finite float weight and float input (not the masks, not
// token ids) moved, each with probability 1/2, to a neighbouring float32 (up or down alike): the same
// problem to float32 precision, with every rounding's luck redrawn. The noise model's samples
// (compare/noise.hpp). Deterministic in `seed`.
Problem jittered(const Problem& p, uint64_t seed);

// The differences between torch 1.13's and 2.x's semantics this problem exercises (README, "What
// changed between 1.13 and 2.13"), one line each; empty when both give it the same meaning.
std::vector<std::string> semantic_differences(const Problem& p);

// The state_dict names and shapes torch 1.13's module has for this configuration, in its order.
std::vector<std::pair<std::string, Shape>> expected_state_dict(const Problem& p);

// What an input holds: float values (float32 or float64), a mask (bool or float), or token ids
// (int64, integers in [0, vocab)). Ids are never floats and floats never ids.
enum class InputKind { Float, Mask, Ids };

// The forward() tensor arguments the module takes.
struct InputSpec {
  std::string name;
  bool required;
  InputKind kind;
};
std::vector<InputSpec> expected_inputs(ModuleKind m);

// Checks what can be checked without running: config values, state_dict names/shapes/dtypes, input
// names and dtypes, and that no tensor a run makes is above max_elements() (largest_tensor). Shapes of
// inputs against the config are checked by the core when it runs. Throws InputError whose message
// starts with `where` (a file name, or "case <name>").
void validate(const Problem& p, const std::string& where);

// Elements of the largest tensor a run of the problem makes, from its config and its inputs' shapes
// (the scores, the feed-forward's hidden layer, a product's output, the stored tensors). Long double:
// sizes a file gives may multiply past int64.
long double largest_tensor(const Problem& p);
// The most elements validate() lets a problem's largest tensor have (each costs 8 bytes per copy, and
// a run holds several): 2^28 unless the CLI's --max-elements says otherwise.
int64_t max_elements();
void set_max_elements(int64_t n);

// The configuration as the fixture format writes it (Python's keyword names), plus forward options.
nlohmann::json config_json(const Problem& p);

// One line: module and sizes, e.g. "MultiheadAttention E=64 heads=4 bias=off batch_first".
std::string summary(const Problem& p);

}  // namespace tparity
