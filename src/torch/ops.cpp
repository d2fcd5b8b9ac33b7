// The reference's op cases: torch::matmul, softmax and layer norm on their own.
#include <ATen/ExpandUtils.h>

#include <cstdio>

#include "internal.hpp"

namespace tparity::torch_ref {

// torch::matmul, checked against its broadcasting definition: at::bmm over the operands expanded
// to the common batch (1-D operands as a row / a column, their dim dropped after). matmul may take
// another route to the same numbers (it folds the batch of a >= 3-D input times a 2-D other into one
// mm, which BLAS sums in its own order), so where the two are not bit for bit they must agree within
// the bound any two summation orders of K products obey: ||difference|| <= 2 K u || |A| |B| ||.
TorchRun run_matmul(const Problem& p, DType dtype, bool collect) {
  TorchRun run;
  const TT a = input(p, "input", dtype), b = input(p, "other", dtype);
  const TT out = at::matmul(a, b);
  Sink{collect ? &run.result.components : nullptr, "", "", ""}.put("output", out);

  const TT a2 = a.dim() == 1 ? a.unsqueeze(0) : a, b2 = b.dim() == 1 ? b.unsqueeze(-1) : b;
  const int64_t M = a2.size(-2), K = a2.size(-1), N = b2.size(-1);
  const std::vector<int64_t> batch =
      at::infer_size(a2.sizes().slice(0, size_t(a2.dim() - 2)), b2.sizes().slice(0, size_t(b2.dim() - 2)));
  auto with = [&](int64_t r, int64_t c) {
    std::vector<int64_t> s = batch;
    s.push_back(r), s.push_back(c);
    return s;
  };
  TT ref =
      at::bmm(a2.expand(with(M, K)).reshape({-1, M, K}), b2.expand(with(K, N)).reshape({-1, K, N})).reshape(with(M, N));
  if (b.dim() == 1) ref = ref.squeeze(-1);
  if (a.dim() == 1) ref = ref.squeeze(-2);
  run.module_ran = true;
  const std::string what = "at::bmm over the explicitly broadcast operands reproduces at::matmul";
  // NaN meeting NaN (an overflow to inf in both, then inf - inf) is agreement, as the comparator counts
  // it; a non-finite value in one alone is not; the sums' rounding is judged where both are finite.
  const TT o = out.to(at::kDouble), f = ref.to(at::kDouble);
  const TT same = (o == f).logical_or(o.isnan().logical_and(f.isnan()));
  const TT finite = o.isfinite().logical_and(f.isfinite());
  const int64_t nonfinite = same.logical_not().logical_and(finite.logical_not()).sum().item<int64_t>();
  const double l2 = at::where(finite, o - f, at::zeros_like(o)).norm().item<double>();
  if (same.all().item<bool>()) {
    run.notes.push_back(what + " bit for bit (" + dtype_name(dtype) + ")");
  } else {
    const double u = unit_roundoff(dtype);
    const TT bound_terms = at::matmul(a.to(at::kDouble).abs(), b.to(at::kDouble).abs());
    const double bound =
        2.0 * double(K) * u * at::where(finite, bound_terms, at::zeros_like(bound_terms)).norm().item<double>();
    char buf[240];
    if (nonfinite) {
      std::snprintf(buf, sizeof buf, "%lld non-finite values differ", static_cast<long long>(nonfinite));
      run.failure = "at::matmul and at::bmm over the explicitly broadcast operands differ: " + std::string(buf);
    } else if (!(l2 <= bound)) {
      std::snprintf(buf, sizeof buf, "l2 %.6g > bound 2 K u || |A| |B| || = %.6g", l2, bound);
      run.failure = "at::matmul and at::bmm over the explicitly broadcast operands differ: " + std::string(buf);
    } else {
      std::snprintf(buf, sizeof buf, " within the summation-order bound (%s): l2 %.3g <= 2 K u || |A| |B| || = %.3g",
                    dtype_name(dtype).c_str(), l2, bound);
      run.notes.push_back(what + buf +
                          "; not bit for bit: the two run different kernels, which round the K-term sums differently");
    }
  }
  run.verified = run.failure.empty();
  run.result.outputs["output"] = to_dtensor(out, dtype);
  return run;
}

// at::softmax(x, -1), checked against the torch::nn::Softmax(dim=-1) module.
TorchRun run_softmax(const Problem& p, DType dtype, bool collect) {
  TorchRun run;
  const TT x = input(p, "input", dtype);
  const TT out = at::softmax(x, -1);
  Sink{collect ? &run.result.components : nullptr, "", "", ""}.put("output", out);
  TT checked = out;
  against_module(run, p, dtype, checked);
  run.result.outputs["output"] = to_dtensor(out, dtype);
  return run;
}

// at::native_layer_norm (output, and the mean and rstd it returns beside it), checked against the
// torch::nn::LayerNorm module loaded with the same weight and bias.
TorchRun run_layer_norm(const Problem& p, DType dtype, bool collect) {
  TorchRun run;
  const TT x = input(p, "input", dtype);
  const Shape lead(x.sizes().begin(), x.sizes().end() - 1);
  const Params params = state_params(p, dtype);
  const auto [out, mean, rstd] =
      at::native_layer_norm(x, {p.normalized}, param(params, "weight"), param(params, "bias"), p.eps);
  const Sink sink{collect ? &run.result.components : nullptr, "", "", ""};
  sink.put("mean", mean.reshape(lead));
  sink.put("rstd", rstd.reshape(lead));
  sink.put("output", out);
  TT checked = out;
  against_module(run, p, dtype, checked);
  run.result.outputs["output"] = to_dtensor(out, dtype);
  return run;
}

}  // namespace tparity::torch_ref
