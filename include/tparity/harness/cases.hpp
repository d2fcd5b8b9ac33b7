// Parity cases as data (ggml's test-backend-ops style): each case is a small struct of parameters with
// a printable description; make_problem() turns one into weights and inputs, deterministically from
// its seed. The default list reproduces the seeds' experiments.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "tparity/harness/problem.hpp"

namespace tparity {

enum class MaskKind { None, Causal, Random, Padding };

std::string mask_kind_name(MaskKind m);            // none | causal | random | padding
MaskKind mask_kind_from_name(const std::string&);  // throws std::invalid_argument

struct CaseSpec {
  std::string name;
  ModuleKind module = ModuleKind::MultiheadAttention;
  int64_t batch = 1;      // 0: unbatched input
  int64_t seq = 1;        // L (query length) or T
  int64_t kv_seq = 0;     // S for attention; 0: self-attention (S = L, key = value = query)
  int64_t dim = 1;        // E / d_model (sdpa: q and k feature size)
  int64_t value_dim = 0;  // sdpa only: v's feature size; 0: dim
  int64_t heads = 1;
  int64_t ffn = 0;        // encoder/decoder dim_feedforward
  int64_t layers = 1;      // TransformerEncoder num_layers
  bool final_norm = false;  // TransformerEncoder norm
  bool bias = true;  // MultiheadAttention bias (the encoder's attention always has bias)
  Activation activation = Activation::Relu;
  MaskKind mask = MaskKind::None;
  bool zero_ffn_bias = false;  // the seeds' block zeroes linear1.bias and linear2.bias
  bool random_params = false;  // draw the parameters torch initialises to constants (biases,
                               // LayerNorm affine) at random, so their semantics are exercised
  uint64_t seed = 0;

  std::string describe() const;  // "MultiheadAttention B=50 T=100 d=64 heads=4 bias=off mask=causal"
};

// single, batched, multihead, block, sdpa: the seeds' experiments; encoder (a stack of three
// layers and a final norm) and decoder (a decoder layer over a memory).
std::vector<CaseSpec> default_cases();

// Weights drawn as torch 1.13 initialises the module (xavier_uniform for in_proj, kaiming-uniform
// bounds 1/sqrt(fan_in) for linears, constants for biases and LayerNorm unless random_params), inputs
// from N(0, 1); every value is rounded to float32 so both precisions see the same numbers.
// The layout is batch_first, as in the seeds. Throws InputError for impossible specs.
Problem make_problem(const CaseSpec& spec);

}  // namespace tparity
