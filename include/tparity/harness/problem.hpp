// A problem: one module call, fully specified (module, configuration, forward options, state dict,
// inputs) and, when it came from a fixture, the outputs PyTorch gave for it. Cases generate problems;
// fixtures are problems on disk; the hand core and the torch runner both consume them.
#pragma once

#include <nlohmann/json.hpp>
#include <string>
#include <utility>
#include <vector>

#include "tparity/core/decoder.hpp"
#include "tparity/harness/dtensor.hpp"

namespace tparity {

enum class ModuleKind {
  MultiheadAttention,
  TransformerEncoderLayer,
  TransformerEncoder,
  TransformerDecoderLayer,
  ScaledDotProductAttention,
};

// The modules fixture format v1 knows (sdpa is a run case only), and their names for messages.
bool fixture_module(ModuleKind m);
std::string fixture_module_names();  // "\"MultiheadAttention\", \"TransformerEncoderLayer\", ..."

std::string module_name(ModuleKind m);                 // torch's class name; "ScaledDotProductAttention" for sdpa
ModuleKind module_from_name(const std::string& name);  // throws std::invalid_argument

struct Problem {
  std::string name;
  std::string description;
  ModuleKind module = ModuleKind::MultiheadAttention;
  MhaConfig mha;            // MultiheadAttention
  MhaForward forward;       // MultiheadAttention
  EncoderConfig encoder;    // TransformerEncoderLayer, TransformerDecoderLayer, each TransformerEncoder layer
  int64_t num_layers = 1;   // TransformerEncoder
  bool final_norm = false;  // TransformerEncoder: config "norm"
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

// The forward() tensor arguments the module takes: {name, required, may_be_bool}.
struct InputSpec {
  std::string name;
  bool required;
  bool is_mask;
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
