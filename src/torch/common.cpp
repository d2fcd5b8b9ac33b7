#include "common.hpp"

#include <algorithm>
#include <cmath>
#include <limits>
#include <sstream>

namespace tparity::torch_ref {

at::ScalarType scalar_type(DType d) {
  switch (d) {
    case DType::Float32:
      return at::kFloat;
    case DType::BFloat16:
      return at::kBFloat16;
    case DType::Float16:
      return at::kHalf;
    default:
      return at::kDouble;
  }
}

TT to_torch(const DTensor& t, DType dtype) {
  TT x = at::empty(t.shape, at::TensorOptions().dtype(at::kDouble));
  std::copy(t.data.begin(), t.data.end(), x.data_ptr<double>());
  if (t.dtype == DType::Bool) return x.to(at::kBool);
  if (t.dtype == DType::Int64) return x.to(at::kLong);
  return x.to(scalar_type(dtype));
}

Tensor<double> to_hand(const TT& x) {
  TT c = x.detach().to(at::kDouble).contiguous();
  Tensor<double> out;
  out.shape.assign(c.sizes().begin(), c.sizes().end());
  out.data.assign(c.data_ptr<double>(), c.data_ptr<double>() + c.numel());
  return out;
}

DTensor to_dtensor(const TT& x, DType dtype) {
  Tensor<double> h = to_hand(x);
  return DTensor{dtype, h.shape, std::move(h.data)};
}

void Sink::put(const std::string& name, const TT& x) const {
  if (!out) return;
  out->push_back({!rename_from.empty() && name == rename_from ? rename_to : prefix + name, to_hand(x)});
}

Params state_params(const Problem& p, DType dtype) {
  Params ps;
  // Floating parameters require grad, as a module's do: ATen picks its kernels by that flag too (a
  // 3-D @ 2-D matmul folds into one product when a gradient is required), and the decomposition
  // must call the same kernels as the module it is verified against, bit for bit. Everything runs
  // under NoGradGuard, as the modules do.
  for (const auto& [name, t] : p.state_dict) {
    TT x = to_torch(t, dtype);
    if (at::isFloatingType(x.scalar_type())) x.set_requires_grad(true);
    ps[name] = x;
  }
  return ps;
}

TT param(const Params& ps, const std::string& name) {
  auto it = ps.find(name);
  return it == ps.end() ? TT() : it->second;
}

TT input(const Problem& p, const std::string& name, DType dtype) {
  const DTensor* t = p.input(name);
  return t ? to_torch(*t, dtype) : TT();
}

bool training_only_buffer(const std::string& name) {
  const std::string tail = "num_batches_tracked";
  return name.size() >= tail.size() && name.compare(name.size() - tail.size(), tail.size(), tail) == 0;
}

TT linear(const TT& input, const TT& weight, const TT& bias) {
  if (input.dim() == 2 && bias.defined()) return at::addmm(bias, input, weight.t());
  TT output = input.matmul(weight.t());
  if (bias.defined()) output += bias;
  return output;
}

TT activation(Activation a, const TT& x) {
  switch (a) {
    case Activation::Relu:
      return at::relu(x);
    case Activation::Gelu:
      return at::gelu(x);
    case Activation::Tanh:
      return at::tanh(x);
    case Activation::Sigmoid:
      return at::sigmoid(x);
    case Activation::Silu:
      return at::silu(x);
    case Activation::Softplus:
      return at::softplus(x, /*beta=*/1, /*threshold=*/20);
    case Activation::LeakyRelu:
      return at::leaky_relu(x, /*negative_slope=*/0.01);
  }
  return x;
}

TT bool_to_additive(const TT& m, at::ScalarType st) {
  return at::zeros(m.sizes(), at::TensorOptions().dtype(st)).masked_fill(m, -std::numeric_limits<double>::infinity());
}

TT seq_first(const TT& x, bool batched, bool batch_first) {
  if (!batched) return x.unsqueeze(1);
  return batch_first ? x.transpose(0, 1) : x;
}

TT from_seq_first(const TT& x, bool batched, bool batch_first) {
  if (!batched) return x.squeeze(1);
  return batch_first ? x.transpose(0, 1) : x;
}

void verify(TorchRun& run, const std::string& what, const TT& module_out, const TT& decomposed) {
  std::string why;
  if (!module_out.sizes().equals(decomposed.sizes())) {
    std::ostringstream o;
    o << "shape " << decomposed.sizes() << " against the module's " << module_out.sizes();
    why = o.str();
    run.mismatch = std::numeric_limits<double>::infinity();
  } else {
    const TT a = decomposed.detach().to(at::kDouble), b = module_out.detach().to(at::kDouble);
    const TT nan_a = a.isnan(), nan_b = b.isnan();
    const TT same = (a == b).logical_or(nan_a.logical_and(nan_b));
    if (!same.all().item<bool>()) {
      const TT finite = a.isfinite().logical_and(b.isfinite());
      const TT d = at::where(finite, a - b, at::zeros_like(a));
      const TT r = at::where(finite, b, at::zeros_like(b));
      const double l2 = d.norm().item<double>(), ref = r.norm().item<double>();
      const int64_t nonfinite = same.logical_not().logical_and(finite.logical_not()).sum().item<int64_t>();
      char buf[200];
      std::snprintf(buf, sizeof buf, "rel_l2 %.3g, max_abs %.3g, non-finite mismatches %lld", ref > 0 ? l2 / ref : l2,
                    d.abs().max().item<double>(), static_cast<long long>(nonfinite));
      why = buf;
      run.mismatch = std::max(run.mismatch, nonfinite ? std::numeric_limits<double>::infinity()
                                            : ref > 0 ? l2 / ref
                                                      : l2);
    }
  }
  if (!why.empty())
    run.failure += std::string(run.failure.empty() ? "" : "; ") + "the functional decomposition's " + what +
                   " differs from the module's: " + why;
}

void verified_note(TorchRun& run, const std::string& what, DType dtype) {
  run.verified = run.failure.empty();
  if (run.verified)
    run.notes.push_back("decomposition reproduces " + what + " bit for bit (" + dtype_name(dtype) + ")");
}

void rethrow_as_input_error(const c10::Error& e, const std::string& where) {
  std::string msg = e.what_without_backtrace();
  if (auto nl = msg.find('\n'); nl != std::string::npos) msg = msg.substr(0, nl);
  throw InputError(where + ": LibTorch rejected the problem: " + msg);
}

}  // namespace tparity::torch_ref
