// The reference's transformer layers: TransformerEncoderLayer, TransformerEncoder and
// TransformerDecoderLayer op by op.
#include <functional>

#include "internal.hpp"

namespace tparity::torch_ref {

// mirrors TransformerEncoderLayerImpl::forward / TransformerDecoderLayerImpl::forward (C++, 1.13)
// and, for norm_first, Python's: x = x + sa(norm1(x)); [x = x + ca(norm2(x), memory);] x = x + ff(normN(x)).
TT layer_decomposed(const EncoderConfig& c, const Params& ps, const std::string& prefix, TT x, const TT& memory,
                    const BlockMasks& self, const BlockMasks& cross, Components* comps) {
  const Sink top{comps, prefix, "", ""};
  const MhaConfig acfg = c.self_attn();
  auto attention = [&](const std::string& module, const std::string& tag, const TT& q, const TT& kv,
                       const BlockMasks& m) {
    const Sink sink{comps, prefix + tag + ".", "output", prefix + tag + "_output"};
    return mha_decomposed(acfg, MhaForward{false, true}, mha_params(ps, prefix + module + "."), q, kv, kv, m.attn,
                          m.kpm, sink)
        .output;
  };
  auto norm = [&](const TT& v, int i) {
    const std::string n = prefix + "norm" + std::to_string(i);
    return at::layer_norm(v, {c.d_model}, param(ps, n + ".weight"), param(ps, n + ".bias"), c.layer_norm_eps);
  };
  auto ff = [&](const TT& v) {
    TT h = linear(v, param(ps, prefix + "linear1.weight"), param(ps, prefix + "linear1.bias"));
    h = activation(c.activation, h);
    top.put("ffn_hidden", h.transpose(0, 1));
    TT o = linear(h, param(ps, prefix + "linear2.weight"), param(ps, prefix + "linear2.bias"));
    top.put("ffn_output", o.transpose(0, 1));
    return o;
  };
  // The blocks in order: self-attention, cross-attention (decoder), feed-forward.
  std::vector<std::function<TT(const TT&)>> blocks{
      [&](const TT& v) { return attention("self_attn", "sa", v, v, self); }};
  if (memory.defined())
    blocks.push_back([&](const TT& v) { return attention("multihead_attn", "ca", v, memory, cross); });
  blocks.push_back(ff);
  for (size_t b = 0; b < blocks.size(); ++b) {
    const int n = int(b) + 1;
    if (c.norm_first) {
      const TT normed = norm(x, n);
      top.put("norm" + std::to_string(n), normed.transpose(0, 1));
      x = x + blocks[b](normed);
    } else {
      x = norm(x + blocks[b](x), n);
      if (b + 1 < blocks.size()) top.put("norm" + std::to_string(n), x.transpose(0, 1));
    }
  }
  top.put("output", x.transpose(0, 1));
  return x;
}

// TransformerEncoderLayer, TransformerEncoder and TransformerDecoderLayer.
TorchRun run_layers(const Problem& p, DType dtype, bool collect) {
  TorchRun run;
  const EncoderConfig& c = p.encoder;
  const bool decoder = p.module == ModuleKind::TransformerDecoderLayer;
  const bool stack = p.module == ModuleKind::TransformerEncoder;
  const std::string x_name = decoder ? "tgt" : "src";
  const bool batched = p.input(x_name)->shape.size() == 3;
  auto batched_kpm = [&](const char* name) {
    TT k = input(p, name, dtype);
    return k.defined() && !batched ? k.unsqueeze(0) : k;
  };
  const TT x0 = seq_first(input(p, x_name, dtype), batched, c.batch_first);
  const TT memory = decoder ? seq_first(input(p, "memory", dtype), batched, c.batch_first) : TT();
  const BlockMasks self =
      decoder ? BlockMasks{input(p, "tgt_mask", dtype), batched_kpm("tgt_key_padding_mask")}
              : BlockMasks{input(p, stack ? "mask" : "src_mask", dtype), batched_kpm("src_key_padding_mask")};
  const BlockMasks cross =
      decoder ? BlockMasks{input(p, "memory_mask", dtype), batched_kpm("memory_key_padding_mask")} : BlockMasks{};
  const Params params = state_params(p, dtype);

  Components* comps = collect ? &run.result.components : nullptr;
  TT x = x0;
  if (stack) {
    // mirrors TransformerEncoderImpl::forward: the layers in turn, each with the same masks, then the norm.
    for (int64_t i = 0; i < p.num_layers; ++i)
      x = layer_decomposed(c, params, "layers." + std::to_string(i) + ".", x, TT(), self, cross, comps);
    if (p.final_norm) {
      x = at::layer_norm(x, {c.d_model}, param(params, "norm.weight"), param(params, "norm.bias"), c.layer_norm_eps);
      Sink{comps, "", "", ""}.put("norm", x.transpose(0, 1));
    }
    Sink{comps, "", "", ""}.put("output", x.transpose(0, 1));
  } else {
    x = layer_decomposed(c, params, "", x, memory, self, cross, comps);
  }
  TT out = x;
  against_module(run, p, dtype, out);
  run.result.outputs["output"] = to_dtensor(from_seq_first(out, batched, c.batch_first), dtype);
  return run;
}

}  // namespace tparity::torch_ref
