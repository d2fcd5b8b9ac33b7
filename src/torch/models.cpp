// The reference's versions of seed 004's models: its TransformerEncoder (token encoder) and ViT, op by op.
#include "internal.hpp"

namespace tparity::torch_ref {

// Seed 004's PositionalEncoding table, first T rows, from its own torch code, in the run's dtype:
// X = arange(T).reshape(-1, 1) / pow(10000, arange(0, d, 2) / d); P[:, 0::2] = sin(X); P[:, 1::2] = cos(X).
// (The seed builds it in float32 whatever the model's dtype; here float64 runs get the float64 table.)
TT positional_table(int64_t T, int64_t d, DType dtype) {
  const auto o = at::TensorOptions().dtype(scalar_type(dtype));
  const TT X = at::arange(T, o).reshape({-1, 1}) / at::pow(10000, at::arange(0, d, 2, o) / d);
  TT P = at::zeros({T, d}, o);
  P.slice(1, 0, d, 2).copy_(at::sin(X));
  P.slice(1, 1, d, 2).copy_(at::cos(X));
  return P;
}

// Seed 004's Patcher.forward, verbatim: (B, C, H, W) -> (B, n, C * p * p).
TT patcher(const TT& image, int64_t p) {
  const int64_t b = image.size(0), c = image.size(1);
  return image.unfold(-2, p, p).unfold(-2, p, p).reshape({b, c, -1, p * p}).transpose(1, 2).reshape({b, -1, c * p * p});
}

namespace {

// The layers in turn on batch-first x, op by op (layer_decomposed), components under layers.N.
TT decomposed_layers(const EncoderConfig& c, int64_t n, const Params& ps, const TT& x, Components* comps) {
  TT s = x.transpose(0, 1);
  for (int64_t i = 0; i < n; ++i)
    s = layer_decomposed(c, ps, "layers." + std::to_string(i) + ".", s, TT(), BlockMasks{}, BlockMasks{}, comps);
  return s.transpose(0, 1);
}

}  // namespace

// Seed 004's TransformerEncoder: nn.Embedding, the seed's positional encoding, encoder layers x N.
TorchRun run_token_encoder(const Problem& p, DType dtype, bool collect) {
  TorchRun run;
  const TokenEncoderConfig& c = p.token;
  const TT tokens = input(p, "tokens", dtype);
  const Params params = state_params(p, dtype);
  Components* comps = collect ? &run.result.components : nullptr;
  const Sink sink{comps, "", "", ""};
  TT x = at::embedding(param(params, "embedding.weight"), tokens);
  sink.put("embedding", x);
  x = x + positional_table(tokens.size(1), c.layer.d_model, dtype);
  sink.put("pos_encoding", x);
  x = decomposed_layers(c.layer, c.num_layers, params, x, comps);
  sink.put("output", x);
  TT out = x;
  against_module(run, p, dtype, out);
  run.result.outputs["output"] = to_dtensor(out, dtype);
  return run;
}

// Seed 004's ViT: its Patcher and positional encoding, encoder layers x N, X.view(B, -1), then per
// hidden width Linear, BatchNorm1d (eval) and the activation, and the output Linear.
TorchRun run_vit(const Problem& p, DType dtype, bool collect) {
  TorchRun run;
  const VitConfig& c = p.vit;
  const TT image = input(p, "image", dtype);
  const int64_t B = image.size(0);
  const Params params = state_params(p, dtype);
  Components* comps = collect ? &run.result.components : nullptr;
  const Sink sink{comps, "", "", ""};
  const TT patches = patcher(image, c.patch);
  sink.put("patches", patches);
  TT x = patches + positional_table(c.num_patches(), c.d_model(), dtype);
  sink.put("pos_encoding", x);
  x = decomposed_layers(c.layer, c.num_layers, params, x, comps).reshape({B, -1});  // X.view(B, -1)
  for (size_t i = 0; i + 1 < c.head.size(); ++i) {
    const std::string pre = "head." + std::to_string(i) + ".";
    x = linear(x, param(params, pre + "linear.weight"), param(params, pre + "linear.bias"));
    sink.put(pre + "linear", x);
    x = at::batch_norm(x, param(params, pre + "bn.weight"), param(params, pre + "bn.bias"),
                       param(params, pre + "bn.running_mean"), param(params, pre + "bn.running_var"),
                       /*training=*/false, /*momentum=*/0.1, c.bn_eps, /*cudnn_enabled=*/false);
    sink.put(pre + "bn", x);
    x = activation(c.head_activation, x);
    sink.put(pre + "act", x);
  }
  x = linear(x, param(params, "head.out.weight"), param(params, "head.out.bias"));
  sink.put("output", x);
  TT out = x;
  against_module(run, p, dtype, out);
  run.result.outputs["output"] = to_dtensor(out, dtype);
  return run;
}

}  // namespace tparity::torch_ref
