// Between the reference's files: each module family's decomposition (attention.cpp, layers.cpp,
// models.cpp, ops.cpp), run by reference.cpp, and torch::nn's own modules (modules.cpp), run beside
// them to verify them. ATen types only.
#pragma once

#include <functional>
#include <string>
#include <vector>

#include "common.hpp"

namespace tparity::torch_ref {

// ---- decompositions: every component, from ATen ops, sequence-first inside -----------------------

struct MhaParams {
  TT in_proj_weight, in_proj_bias, q_proj_weight, k_proj_weight, v_proj_weight, bias_k, bias_v, out_proj_weight,
      out_proj_bias;
};
MhaParams mha_params(const Params& ps, const std::string& prefix);

struct MhaResult {
  TT output;   // (L, B, E)
  TT weights;  // (B, L, S) averaged, (B, H, L, S) per head, or undefined
};

// mirrors Python's torch.nn.functional.multi_head_attention_forward of the LibTorch built against
// (kTorchVersion), op by op, on sequence-first batched tensors: query (L, B, E), key (S, B, kdim),
// value (S, B, vdim). attn_mask: undefined, (L, S) or (B*H, L, S), bool or float; key_padding_mask:
// undefined or (B, S). Components q, k, v, scores, attn_weights, [attn_weights_avg], context, output.
MhaResult mha_decomposed(const MhaConfig& c, const MhaForward& fwd, const MhaParams& w, const TT& query, const TT& key,
                         const TT& value, TT attn_mask, TT kpm, const Sink& sink);

// The masks of one attention block, sequence-first batched world.
struct BlockMasks {
  TT attn, kpm;
};

// One encoder layer (memory undefined) or decoder layer, op by op on sequence-first x (T, B, d).
// Components under `prefix` ("" or "layers.N."), batch-first.
TT layer_decomposed(const EncoderConfig& c, const Params& ps, const std::string& prefix, TT x, const TT& memory,
                    const BlockMasks& self, const BlockMasks& cross, Components* comps);

// Seed 004's PositionalEncoding table, first T rows, in the run's dtype; its Patcher.
TT positional_table(int64_t T, int64_t d, DType dtype);
TT patcher(const TT& image, int64_t p);

TorchRun run_mha(const Problem& p, DType dtype, bool collect);
TorchRun run_sdpa(const Problem& p, DType dtype, bool collect);
TorchRun run_layers(const Problem& p, DType dtype, bool collect);
TorchRun run_token_encoder(const Problem& p, DType dtype, bool collect);
TorchRun run_vit(const Problem& p, DType dtype, bool collect);
TorchRun run_matmul(const Problem& p, DType dtype, bool collect);
TorchRun run_softmax(const Problem& p, DType dtype, bool collect);
TorchRun run_layer_norm(const Problem& p, DType dtype, bool collect);
// The book's attention classes (book.cpp)
TorchRun run_book(const Problem& p, DType dtype, bool collect);
// transformers' LlamaDecoderLayer, LlamaAttention, GPT2Block (llm.cpp)
TorchRun run_llm(const Problem& p, DType dtype, bool collect);
std::function<void()> prepare_llm_torch(const Problem& p, DType dtype);

// ---- torch::nn's modules (modules.cpp) ------------------------------------------------------------

// What LibTorch's own module returned for a problem (only where module_limitation(p) is empty),
// laid out as the decomposition's results are: output and weights as MhaResult has them for
// MultiheadAttention, the sequence-first output for the encoder and decoder layers and the stack,
// the batch-first output for the token encoder and the ViT, the op's result for the op cases.
struct ModuleRun {
  TT output, weights;
  std::string what;                // "torch::nn::MultiheadAttention"
  std::vector<std::string> notes;  // adaptations made to run it
};
ModuleRun run_module(const Problem& p, DType dtype);

// Where torch::nn's module can run p (module_limitation), runs it, verifies the decomposition's output
// (and attention weights, when given) against it bit for bit, and replaces them with the module's;
// otherwise notes why not. reference.cpp.
void against_module(TorchRun& run, const Problem& p, DType dtype, TT& out, TT* weights = nullptr);

}  // namespace tparity::torch_ref
