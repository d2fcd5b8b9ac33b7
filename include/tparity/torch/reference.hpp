// The LibTorch reference runner. This header is torch-free so that the CLI and tests compile fast;
// only src/torch/*.cpp include LibTorch (ATen in all of them, the C++ frontend's modules in modules.cpp).
//
// For a problem it does two things, in float32 or float64:
//  1. runs LibTorch's own module (torch::nn::MultiheadAttention, torch::nn::TransformerEncoderLayer;
//     for seed 004's models the same assembled from torch::nn::Embedding, TransformerEncoderLayer,
//     Linear, BatchNorm1d and the activation modules; for the op cases torch::nn::Softmax,
//     torch::nn::LayerNorm, and torch::bmm over explicitly broadcast operands for torch::matmul)
//     loaded with the problem's state dict, where the 1.13 C++ module can express the config;
//  2. rebuilds every component with torch functional ops from the same parameters, mirroring the
//     module's forward op by op,
// and checks that (2) reproduces (1), so the per-component reference is itself verified. Where the C++
// module cannot express the config (norm_first, layer_norm_eps != 1e-5, 3-D attn_mask, float
// key_padding_mask), (2) still runs, and a fixture exported from Python PyTorch is what verifies it.
#pragma once

#include <functional>
#include <string>
#include <vector>

#include "tparity/harness/components.hpp"
#include "tparity/harness/problem.hpp"
#include "tparity/harness/reference_info.hpp"

namespace tparity {

bool torch_available();
std::string torch_version();  // "2.13.0", "1.13.1" or "none"
std::string torch_blas();     // reference_info().blas, e.g. "MKL 2024.2, oneDNN 3.12.0" or "OpenBLAS 0.3.21"
int torch_threads();          // LibTorch's intra-op thread count; 0 without LibTorch
// Which PyTorch judges: version, how it was built against, BLAS, kernels, capability, threads.
ReferenceInfo reference_info();
// The semantics the reference's decomposition follows (core/attention.hpp): Python's of its version.
TorchSemantics reference_semantics();

// Empty when LibTorch computes matmul, softmax and layer norm in this precision on the CPU (tried on
// a 2 x 2 tensor); otherwise LibTorch's own one line (1.13: no float16 matmul).
std::string low_precision_limitation(DType dtype);

// Empty when torch::nn's C++ module can run this problem; otherwise why not.
std::string module_limitation(const Problem& p);

struct TorchRun {
  RunResult result;  // components of the decomposition; outputs of the module when it ran,
                     // else of the decomposition, laid out as the problem's module returns them
  bool module_ran = false;
  bool verified = false;           // the decomposition reproduced the module's outputs
  std::vector<std::string> notes;  // adaptations made and what was verified, one line each
  std::string failure;             // non-empty when the decomposition disagrees with the module
  double mismatch = 0;  // the largest rel_l2 between the two over the checks (infinity: shapes or non-finite differ)
};

// LibTorch's module (MultiheadAttention or TransformerEncoderLayer, expressible configs) loaded and
// with its inputs converted once, for the benchmark: each call runs its forward under NoGradGuard.
// Runs it once before returning. Throws InputError when the problem is not such a module.
std::function<void()> prepare_torch(const Problem& p, DType dtype, const std::string& where, bool run_once = true);

// LibTorch's intra-op threads (at::set_num_threads) and, when the BLAS is OpenBLAS, its own.
void set_torch_threads(int n);

// Throws InputError (prefixed with `where`) when LibTorch rejects the problem's tensors, and
// std::runtime_error when built without LibTorch.
TorchRun run_torch(const Problem& p, DType dtype, bool collect_components, const std::string& where);

}  // namespace tparity
