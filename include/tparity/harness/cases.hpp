// Parity cases as data (ggml's test-backend-ops style): each case is a small struct of parameters with
// a printable description; make_problem() turns one into weights and inputs, deterministically from
// its seed. The default list reproduces the seeds' experiments.
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "tparity/harness/problem.hpp"

namespace tparity {

// Causal: the seeds' float -inf mask above the diagonal; IsCausal: scaled_dot_product_attention's
// is_causal flag instead of a mask tensor (sdpa only).
enum class MaskKind { None, Causal, Random, Padding, IsCausal };

std::string mask_kind_name(MaskKind m);            // none | causal | random | padding
MaskKind mask_kind_from_name(const std::string&);  // throws std::invalid_argument

struct CaseSpec {
  std::string name;
  ModuleKind module = ModuleKind::MultiheadAttention;
  int64_t batch = 1;            // 0: unbatched input
  int64_t seq = 1;              // L (query length) or T
  int64_t kv_seq = 0;           // S for attention; 0: self-attention (S = L, key = value = query)
  int64_t dim = 1;              // E / d_model (sdpa: q and k feature size)
  int64_t value_dim = 0;        // sdpa only: v's feature size; 0: dim
  int64_t out_dim = 0;          // the book's classes: d_out (dim is d_in); 0: dim
  std::optional<double> scale;  // sdpa only: the scores' scale; absent: 1/sqrt(E)
  int64_t heads = 1;
  int64_t ffn = 0;                                                     // encoder/decoder dim_feedforward
  int64_t layers = 1;                                                  // TransformerEncoder num_layers
  bool final_norm = false;                                             // TransformerEncoder norm
  int64_t vocab = 0;                                                   // TokenEncoder: nn.Embedding num_embeddings
  int64_t channels = 0, image_height = 0, image_width = 0, patch = 0;  // ViT (d = channels * patch^2)
  std::vector<int64_t> head;                      // ViT head_neurons: hidden widths, then the output width
  Activation head_activation = Activation::Relu;  // ViT head; `activation` is its encoder layers'
  Shape lhs, rhs;                                 // Matmul: input and other without their leading batch dim
  bool lhs_batched = false, rhs_batched = false;  // Matmul: `batch` leads the operand (nothing when batch is 0)
  double input_scale = 1, input_offset = 0;       // Softmax, LayerNorm: input = offset + scale * N(0, 1)
  bool bias = true;                               // MultiheadAttention bias (the encoder's attention always has bias)
  Activation activation = Activation::Relu;
  MaskKind mask = MaskKind::None;
  bool zero_ffn_bias = false;  // the seeds' block zeroes linear1.bias and linear2.bias
  bool need_weights = true;    // MultiheadAttention forward(need_weights=...)
  bool random_params = false;  // draw the parameters torch initialises to constants (biases,
                               // LayerNorm affine) at random, so their semantics are exercised
  // The LLM blocks (harness/llm.hpp): dim is hidden_size, heads num_attention_heads, ffn the
  // intermediate (Llama) or inner (GPT-2) size, bias attention_bias (Llama; GPT-2 always has biases);
  // the causal mask is always on, mask=padding adds a key padding mask.
  int64_t kv_heads = 0;          // num_key_value_heads (sdpa: k's and v's heads, enable_gqa when fewer); 0: heads
  int64_t head_dim = 0;          // 0: dim / heads
  int64_t decode_steps = 0;      // > 0: a decode session, the last decode_steps tokens one call each
  int64_t position_offset = -1;  // position_ids = offset + 5 b + arange(T); -1: no position_ids input
  bool pad_left = false;         // mask=padding: element b's padding at its start (left), not its end (right)
  RopeStyle rope = RopeStyle::HalfSplit;
  double rotary_fraction = 1.0;  // partial_rotary_factor
  double rope_theta = 10000;
  // The LLM blocks: config keys by transformers' names over the case's own (--config KEY=VALUE), e.g.
  // {"sliding_window": 4}; each must be a key the class takes (harness/llm.hpp, LlmRow::keys).
  nlohmann::json config = nlohmann::json::object();
  uint64_t seed = 0;
  // The features this case had and runs without (the CLI's --without), in the report's not_checked.
  std::vector<std::string> not_checked;

  std::string describe() const;  // "MultiheadAttention B=50 T=100 d=64 heads=4 bias=off mask=causal"
};

// single, batched, multihead, block, sdpa: the seeds' experiments; encoder (a stack of three
// layers and a final norm) and decoder (a decoder layer over a memory); embed and vit: seed 004's
// token encoder and ViT; matmul, bmm, softmax, layernorm: the building blocks the seeds exercise on
// their own (seed 000's and 003's products, scores-like softmax rows, layer norm around a large mean);
// selfattn_v1 and book_mha: seed 001's experiment with the book's SelfAttention_v1 (4 tokens, d_in 3,
// d_out 2, uniform draws) and the book's batched MultiHeadAttention (its chapter's shapes).
std::vector<CaseSpec> default_cases();

// Cases that stress float32 where the default ones do not, for the selftest's numeric defects (and
// `tparity run --case NAME`): softmax_hot, scores large enough that exp overflows without the
// maximum subtracted (|x| up to ~150); long_keys, an attention of 32 queries over 16384 keys, where a weighted sum
// in one running sum loses digits.
std::vector<CaseSpec> stress_cases();

// A Matmul case's operand shapes: lhs and rhs with `batch` prepended to those marked batched.
std::pair<Shape, Shape> matmul_operands(const CaseSpec& spec);

// Weights drawn as torch 1.13 initialises the module (xavier_uniform for in_proj, kaiming-uniform
// bounds 1/sqrt(fan_in) for linears, nn.Embedding N(0, 1), constants for biases, LayerNorm and
// BatchNorm affine unless random_params), inputs from N(0, 1); every value is rounded to float32 so
// both precisions see the same numbers. BatchNorm running statistics are always drawn (running_mean
// ~ N(0, 0.1^2), running_var ~ U(0.5, 1.5)), and the LayerNorm op case always draws its affine
// parameters (1 + U(-0.2, 0.2), U(-0.2, 0.2)), so that the semantics they carry are exercised. Token
// ids are uniform in [0, vocab); images uniform in [0, 1) like the seed's torch.rand.
// The layout is batch_first, as in the seeds. Throws InputError for impossible specs.
Problem make_problem(const CaseSpec& spec);

// The LLM blocks' default cases (llama: a small grouped-query LlamaDecoderLayer with two decode
// steps; gpt2: a GPT2Block with a padding mask), their description and their problems (llm_cases.cpp).
std::vector<CaseSpec> llm_default_cases();
std::string llm_describe(const CaseSpec& spec);
Problem make_llm_problem(const CaseSpec& spec);

}  // namespace tparity
