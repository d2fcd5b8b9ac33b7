// The LLM blocks as problems: Hugging Face transformers' LlamaDecoderLayer, LlamaAttention and
// GPT2Block (core/llm.hpp), one forward call or a decode session. What problem.cpp, hand.cpp,
// cases.cpp and the fixture reader ask of these module kinds lives here, so that those files only
// dispatch.
//
// Config (the fixture's "config", transformers' config names):
//   LlamaDecoderLayer / LlamaAttention: hidden_size, num_attention_heads, num_key_value_heads,
//     head_dim, intermediate_size (layer only), rms_norm_eps (layer only), rope_theta,
//     rope_convention ("half" | "interleaved"), partial_rotary_factor, attention_bias, mlp_bias
//     (layer only), max_position_embeddings, causal, decode_steps
//   GPT2Block: hidden_size (n_embd), num_attention_heads (n_head), n_inner, layer_norm_epsilon,
//     max_position_embeddings (n_positions), causal, decode_steps
// State dict: transformers' names (self_attn.q_proj.weight, mlp.gate_proj.weight,
//   input_layernorm.weight, ...; LlamaAttention's without the self_attn. prefix; attn.c_attn.weight,
//   ln_1.weight, mlp.c_fc.weight, ...).
// Inputs: hidden_states (B, T, hidden) float; position_ids (B, T) int64 (optional: arange(T));
//   key_padding_mask (B, T) bool, true at a padding token (optional; transformers' attention_mask
//   is its negation).
// Outputs: output (B, T, hidden). In a decode session (decode_steps D > 0) the first T - D tokens
//   are prefilled in one call and each of the last D is one call over the cache; `output` holds the
//   calls' outputs in order, and the reference's `output` is its full causal forward over all T
//   tokens, so that the output's legs measure the decode against the full forward.
// Components: see component names (llm_component_names); a decode session's are the calls' under
//   prefill. and step.N. (the cache among them as cache.k and cache.v, (B, Hkv, S, D)), then output.
#pragma once

#include <functional>
#include <nlohmann/json.hpp>
#include <string>
#include <utility>
#include <vector>

#include "tparity/harness/components.hpp"
#include "tparity/harness/problem.hpp"

namespace tparity {

bool llm_module(ModuleKind m);

// Which core function (and which composition of the reference's) runs a kind's block.
enum class LlmBlock {
  Attention,    // llama_attention_forward: the attention alone (LlamaAttention)
  Layer,        // llama_layer_forward: RMSNorm, attention, RMSNorm, gated MLP (LlamaDecoderLayer)
  Gpt2,         // gpt2_block_forward: GPT2Config, Conv1D weights (GPT2Block)
  Gemma2Layer,  // gemma2_layer_forward: norms (by 1 + weight) before and after attention and MLP, GeGLU
};

// One LLM kind as data: what the family's code asks of it. A kind of this family is its ModuleRow
// (problem.cpp) and this row (llm.cpp's kLlmRows); its config keys are transformers' names, read,
// written and validated once for the family, each kind taking the keys its row lists.
struct LlmRow {
  ModuleKind kind;
  LlmBlock block;
  const char* keys;  // the config keys the class reads, space-separated (besides causal, decode_steps)
  // What the class fixes that LlamaConfig leaves open (norms, activation, ...); null: nothing.
  void (*preset)(LlamaConfig&);
};
const LlmRow& llm_row(ModuleKind m);  // throws std::logic_error for a kind of another family
// Whether the kind's config takes `key`.
bool llm_takes(ModuleKind m, const std::string& key);
// "hidden_size, num_attention_heads, ..." for messages.
std::string llm_key_list(ModuleKind m);

// problem.cpp's questions, for the LLM kinds.
void llm_state_dict(const Problem& p, std::vector<std::pair<std::string, Shape>>& out);
std::vector<InputSpec> llm_inputs(ModuleKind m);
// Config checks; `fail` throws with the field's message.
void validate_llm(const Problem& p, const std::function<void(const std::string&)>& fail);
nlohmann::json llm_config_json(const Problem& p);
std::string llm_summary(const Problem& p);
// The largest position id plus one (position_ids must lie below it).
int64_t llm_max_positions(const Problem& p);

// Reads the fixture's config object into p.llama / p.gpt2 / p.decode_steps / p.causal, from the
// class's defaults. `fail(field, what)` throws; every key must be one of the kind's.
void read_llm_config(const nlohmann::json& j, Problem& p,
                     const std::function<void(const std::string& field, const std::string& what)>& fail);
// Sets the keys `j` holds over the problem's config as it stands (a case's --config KEY=VALUE).
void apply_llm_config(const nlohmann::json& j, Problem& p,
                      const std::function<void(const std::string& field, const std::string& what)>& fail);

// The largest tensor a run makes (problem.cpp's largest_tensor): the scores, the projections, the MLP.
long double llm_largest_tensor(const Problem& p);
// The kv heads and head dim of the block's cache.
std::pair<int64_t, int64_t> llm_cache_heads(const Problem& p);

// The hand core on the problem (hand.cpp's run): outputs["output"], components through obs.
template <class T>
Tensor<T> run_llm(const Problem& p, Observer<T>* obs);

// The forward pass with weights converted once (the bench).
template <class T>
std::function<void()> prepare_llm(const Problem& p);

// Components in dataflow order.
std::vector<std::string> llm_component_names(const Problem& p);

// One call of the problem's block with its weights converted once, on hidden states x (B, L, hidden)
// and a mask of the caller's, through `cache` when not null: a whole model's layer in greedy
// generation (eval/model.hpp), which steps every layer a token at a time.
template <class T>
using LlmLayerCall = std::function<Tensor<T>(const Tensor<T>& x, const DecoderMask& mask, KvCache<T>* cache)>;
template <class T>
LlmLayerCall<T> llm_layer_call(const Problem& p);

}  // namespace tparity
