// A problem: one module call, fully specified (module, configuration, forward options, state dict,
// inputs) and, when it came from a fixture, the outputs PyTorch gave for it. Cases generate problems;
// fixtures are problems on disk; the hand core and the torch runner both consume them.
#pragma once

#include <nlohmann/json.hpp>
#include <string>
#include <utility>
#include <vector>

#include "tparity/core/decoder.hpp"
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
};

// The modules fixture format v1 knows (sdpa and the modules after it are run cases only), and their
// names for messages.
bool fixture_module(ModuleKind m);
std::string fixture_module_names();  // "\"MultiheadAttention\", \"TransformerEncoderLayer\", ..."

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
  bool affine = true;        // LayerNorm: elementwise_affine (state_dict weight and bias)
  TensorMap state_dict;
  TensorMap inputs;
  TensorMap outputs;          // as PyTorch returned them (fixtures only)
  TensorMap outputs_float32;  // the same module run in float32 (fixtures only, optional)

  const DTensor* input(const std::string& key) const {
    auto it = inputs.find(key);
    return it == inputs.end() ? nullptr : &it->second;
  }
};

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
// names and dtypes. Shapes of inputs against the config are checked by the core when it runs.
// Throws InputError whose message starts with `where` (a file name, or "case <name>").
void validate(const Problem& p, const std::string& where);

// The configuration as the fixture format writes it (Python's keyword names), plus forward options.
nlohmann::json config_json(const Problem& p);

// One line: module and sizes, e.g. "MultiheadAttention E=64 heads=4 bias=off batch_first".
std::string summary(const Problem& p);

}  // namespace tparity
