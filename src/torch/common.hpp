// What the LibTorch reference's files share: conversions between DTensor and ATen tensors, the
// component sink, parameters by state_dict name, masks as Python builds them, layouts. ATen only: the
// torch::nn modules live in modules.cpp, the one file that includes the C++ frontend.
#pragma once

#include <ATen/ATen.h>
#include <ATen/Parallel.h>
#include <c10/core/GradMode.h>
#include <torch/version.h>

#include <map>
#include <string>
#include <vector>

#include "tparity/torch/reference.hpp"

namespace tparity::torch_ref {

using TT = at::Tensor;

// LibTorch's version as major * 100 + minor (113, 213): the semantics its modules have.
constexpr int kTorchVersion = TORCH_VERSION_MAJOR * 100 + TORCH_VERSION_MINOR;

at::ScalarType scalar_type(DType d);

// Float data in the run's dtype; bool stays bool, int64 (token ids) stays int64.
TT to_torch(const DTensor& t, DType dtype);
Tensor<double> to_hand(const TT& x);
DTensor to_dtensor(const TT& x, DType dtype);

// Collects components under a prefix, like PrefixObserver does for the hand core; `rename_from` is
// stored as `rename_to` (an attention block's "output" as the layer's "sa_output").
struct Sink {
  Components* out = nullptr;
  std::string prefix, rename_from, rename_to;
  void put(const std::string& name, const TT& x) const;
};

// The parameters the decomposition reads, by state_dict name, in the run's dtype.
using Params = std::map<std::string, TT>;
Params state_params(const Problem& p, DType dtype);
TT param(const Params& ps, const std::string& name);  // undefined when absent (an absent bias)

TT input(const Problem& p, const std::string& name, DType dtype);  // undefined when absent

// BatchNorm's num_batches_tracked: a buffer torch keeps for training, never read in eval mode;
// tparity's state dicts leave it out.
bool training_only_buffer(const std::string& name);

// mirrors torch::nn::functional::linear, the C++ frontend's own (torch 1.13 and 2.13 alike): addmm for
// a 2-D input with a bias, else matmul then += bias. The modules call this one; ATen's at::linear
// folds the bias of a contiguous 3-D input into the product (addmm) since 2.x, which MKL rounds
// differently, so the decomposition must call this to reproduce the modules bit for bit.
TT linear(const TT& input, const TT& weight, const TT& bias = {});

// mirrors an activation module's functional form (nn's default options).
TT activation(Activation a, const TT& x);

// A bool attention mask as the additive float mask Python's multi_head_attention_forward builds
// from it (-inf where true).
TT bool_to_additive(const TT& m, at::ScalarType st);

// (L, B, E) sequence-first <-> the problem's layout (batch_first or not; unbatched (L, E)).
TT seq_first(const TT& x, bool batched, bool batch_first);
TT from_seq_first(const TT& x, bool batched, bool batch_first);

// Whether two results are the same bits (NaN where the other has NaN counts as the same); else
// appends to run.failure what differs, naming `what`.
void verify(TorchRun& run, const std::string& what, const TT& module_out, const TT& decomposed);
// After the verifications of a run: run.verified, and a note naming what was reproduced.
void verified_note(TorchRun& run, const std::string& what, DType dtype);

// at:: calls raise c10::Error for what LibTorch rejects: as InputError prefixed with `where`.
[[noreturn]] void rethrow_as_input_error(const c10::Error& e, const std::string& where);

}  // namespace tparity::torch_ref
