// The LibTorch reference: torch::nn modules and their op-by-op functional decomposition.
#include "tparity/torch/reference.hpp"

#include <ATen/ExpandUtils.h>
#include <dlfcn.h>
#include <torch/torch.h>

#include <cmath>
#include <cstdio>
#include <fstream>
#include <functional>
#include <limits>
#include <map>
#include <memory>
#include <set>

#include "tparity/compare/metrics.hpp"

namespace tparity {

namespace F = torch::nn::functional;
using TT = torch::Tensor;

bool torch_available() { return true; }

std::string torch_version() {
  return std::to_string(TORCH_VERSION_MAJOR) + "." + std::to_string(TORCH_VERSION_MINOR) + "." +
         std::to_string(TORCH_VERSION_PATCH);
}

std::string torch_blas() {
  // Debian's LibTorch links the generic libblas.so.3, which the alternatives system points at a
  // BLAS (OpenBLAS once libopenblas0-pthread is installed). Ask the loader what it mapped, after a
  // product has forced the library in.
  (void)torch::mm(torch::ones({2, 2}), torch::ones({2, 2}));
  std::ifstream maps("/proc/self/maps");
  std::string line, found;
  for (const char* name : {"libopenblas", "libmkl", "libblis", "libblas"}) {
    maps.clear();
    maps.seekg(0);
    while (std::getline(maps, line)) {
      const auto pos = line.find('/');
      if (pos != std::string::npos && line.find(name, pos) != std::string::npos) return line.substr(pos);
    }
  }
  return "unknown";
}

int torch_threads() { return torch::get_num_threads(); }

namespace {

torch::ScalarType scalar_type(DType d) { return d == DType::Float32 ? torch::kFloat : torch::kDouble; }

// Float data in the run's dtype; bool stays bool, int64 (token ids) stays int64.
TT to_torch(const DTensor& t, DType dtype) {
  std::vector<double> copy = t.data;
  TT x = torch::from_blob(copy.data(), t.shape, torch::kDouble).clone();
  if (t.dtype == DType::Bool) return x.to(torch::kBool);
  if (t.dtype == DType::Int64) return x.to(torch::kLong);
  return x.to(scalar_type(dtype));
}

Tensor<double> to_hand(const TT& x) {
  TT c = x.detach().to(torch::kDouble).contiguous();
  Tensor<double> out;
  out.shape.assign(c.sizes().begin(), c.sizes().end());
  out.data.assign(c.data_ptr<double>(), c.data_ptr<double>() + c.numel());
  return out;
}

DTensor to_dtensor(const TT& x, DType dtype) {
  Tensor<double> h = to_hand(x);
  return DTensor{dtype, h.shape, std::move(h.data)};
}

// Collects components under a prefix, like PrefixObserver does for the hand core.
struct Sink {
  Components* out = nullptr;
  std::string prefix, rename_from, rename_to;
  void put(const std::string& name, const TT& x) const {
    if (!out) return;
    out->push_back({!rename_from.empty() && name == rename_from ? rename_to : prefix + name, to_hand(x)});
  }
};

// The parameters the decomposition reads: the module's own (after loading the state dict) when the
// C++ module runs, else the state dict's.
using Params = std::map<std::string, TT>;

Params state_params(const Problem& p, DType dtype) {
  Params ps;
  for (const auto& [name, t] : p.state_dict) ps[name] = to_torch(t, dtype);
  return ps;
}

// BatchNorm's num_batches_tracked: a buffer torch keeps for training (momentum=None), never read in
// eval mode; tparity's state dicts leave it out.
bool training_only_buffer(const std::string& name) {
  const std::string tail = "num_batches_tracked";
  return name.size() >= tail.size() && name.compare(name.size() - tail.size(), tail.size(), tail) == 0;
}

Params module_params(const torch::nn::Module& m) {
  Params ps;
  for (const auto& kv : m.named_parameters()) ps[kv.key()] = kv.value().detach();
  for (const auto& kv : m.named_buffers())
    if (!training_only_buffer(kv.key())) ps[kv.key()] = kv.value().detach();
  return ps;
}

// mirrors an activation module's functional form (nn's default options).
TT activation(Activation a, const TT& x) {
  switch (a) {
    case Activation::Relu:
      return F::relu(x);
    case Activation::Gelu:
      return F::gelu(x);
    case Activation::Tanh:
      return torch::tanh(x);
    case Activation::Sigmoid:
      return torch::sigmoid(x);
    case Activation::Silu:
      return F::silu(x);
    case Activation::Softplus:
      return F::softplus(x, F::SoftplusFuncOptions().beta(1).threshold(20));
    case Activation::LeakyRelu:
      return F::leaky_relu(x, F::LeakyReLUFuncOptions().negative_slope(0.01));
  }
  return x;
}

TT param(const Params& ps, const std::string& name) {
  auto it = ps.find(name);
  return it == ps.end() ? TT() : it->second;
}

TT input(const Problem& p, const std::string& name, DType dtype) {
  const DTensor* t = p.input(name);
  return t ? to_torch(*t, dtype) : TT();
}

// A bool attention mask as the additive float mask Python's multi_head_attention_forward builds
// from it (-inf where true).
TT bool_to_additive(const TT& m, torch::ScalarType st) {
  return torch::zeros(m.sizes(), torch::TensorOptions().dtype(st))
      .masked_fill(m, -std::numeric_limits<double>::infinity());
}

struct MhaParams {
  TT in_proj_weight, in_proj_bias, q_proj_weight, k_proj_weight, v_proj_weight, bias_k, bias_v, out_proj_weight,
      out_proj_bias;
};

MhaParams mha_params(const Params& ps, const std::string& prefix) {
  return {
      param(ps, prefix + "in_proj_weight"), param(ps, prefix + "in_proj_bias"),    param(ps, prefix + "q_proj_weight"),
      param(ps, prefix + "k_proj_weight"),  param(ps, prefix + "v_proj_weight"),   param(ps, prefix + "bias_k"),
      param(ps, prefix + "bias_v"),         param(ps, prefix + "out_proj.weight"), param(ps, prefix + "out_proj.bias")};
}

struct MhaResult {
  TT output;   // (L, B, E)
  TT weights;  // (B, L, S) averaged, (B, H, L, S) per head, or undefined
};

// mirrors torch::nn::functional::detail::multi_head_attention_forward (torch 1.13, C++), op by op, on
// sequence-first batched tensors: query (L, B, E), key (S, B, kdim), value (S, B, vdim).
// attn_mask: undefined, (L, S) or (B*H, L, S), bool or float; key_padding_mask: undefined or (B, S).
// Masks follow Python's 1.13 semantics (a bool attn_mask is -inf where true; a float key padding mask
// is added; a bool attn_mask ORs a float key padding mask's nonzeros), which on everything the C++
// module accepts after the runner's adaptation is what the C++ module computes.
MhaResult mha_decomposed(const MhaConfig& c, const MhaForward& fwd, const MhaParams& w, const TT& query, const TT& key,
                         const TT& value, TT attn_mask, TT kpm, const Sink& sink) {
  const int64_t L = query.size(0), B = query.size(1), E = c.embed_dim, H = c.num_heads, D = E / H;
  const double scaling = 1 / std::sqrt(double(D));
  const auto ninf = -std::numeric_limits<double>::infinity();
  TT q, k, v;
  if (c.packed()) {
    const TT& W = w.in_proj_weight;
    const TT& b = w.in_proj_bias;
    auto bslice = [&](int64_t from, int64_t to) { return b.defined() ? b.slice(0, from, to) : TT(); };
    if (torch::equal(query, key) && torch::equal(key, value)) {  // self-attention
      auto chunks = F::linear(query, W, b).chunk(3, -1);
      q = chunks[0], k = chunks[1], v = chunks[2];
    } else if (torch::equal(key, value)) {  // encoder-decoder attention
      q = F::linear(query, W.slice(0, 0, E), bslice(0, E));
      auto chunks = F::linear(key, W.slice(0, E), bslice(E, 3 * E)).chunk(2, -1);
      k = chunks[0], v = chunks[1];
    } else {
      q = F::linear(query, W.slice(0, 0, E), bslice(0, E));
      k = F::linear(key, W.slice(0, E, 2 * E), bslice(E, 2 * E));
      v = F::linear(value, W.slice(0, 2 * E), bslice(2 * E, 3 * E));
    }
  } else {
    const TT& b = w.in_proj_bias;
    q = F::linear(query, w.q_proj_weight, b.defined() ? b.slice(0, 0, E) : TT());
    k = F::linear(key, w.k_proj_weight, b.defined() ? b.slice(0, E, 2 * E) : TT());
    v = F::linear(value, w.v_proj_weight, b.defined() ? b.slice(0, 2 * E) : TT());
  }
  // Component q: (L, B, E) -> (B, H, L, D), before scaling.
  sink.put("q", q.contiguous().view({L, B * H, D}).transpose(0, 1).reshape({B, H, L, D}));
  q = q * scaling;
  if (c.add_bias_kv) {
    k = torch::cat({k, w.bias_k.repeat({1, B, 1})});
    v = torch::cat({v, w.bias_v.repeat({1, B, 1})});
    if (attn_mask.defined()) attn_mask = F::pad(attn_mask, F::PadFuncOptions({0, 1}));
    if (kpm.defined()) kpm = F::pad(kpm, F::PadFuncOptions({0, 1}));
  }
  q = q.contiguous().view({L, B * H, D}).transpose(0, 1);
  k = k.contiguous().view({-1, B * H, D}).transpose(0, 1);
  v = v.contiguous().view({-1, B * H, D}).transpose(0, 1);
  if (c.add_zero_attn) {
    k = torch::cat({k, torch::zeros({B * H, 1, D}, k.options())}, 1);
    v = torch::cat({v, torch::zeros({B * H, 1, D}, v.options())}, 1);
    if (attn_mask.defined()) attn_mask = F::pad(attn_mask, F::PadFuncOptions({0, 1}));
    if (kpm.defined()) kpm = F::pad(kpm, F::PadFuncOptions({0, 1}));
  }
  const int64_t S = k.size(1);
  sink.put("k", k.reshape({B, H, S, D}));
  sink.put("v", v.reshape({B, H, S, D}));

  TT scores = torch::bmm(q, k.transpose(1, 2));
  if (attn_mask.defined() && attn_mask.scalar_type() == torch::kBool && kpm.defined() &&
      kpm.scalar_type() != torch::kBool)
    kpm = kpm != 0;  // Python: attn_mask.logical_or(key_padding_mask)
  if (attn_mask.defined()) {
    if (attn_mask.scalar_type() == torch::kBool) attn_mask = bool_to_additive(attn_mask, scores.scalar_type());
    scores += attn_mask.dim() == 2 ? attn_mask.unsqueeze(0) : attn_mask;
  }
  if (kpm.defined()) {
    scores = scores.view({B, H, L, S});
    if (kpm.scalar_type() == torch::kBool)
      scores = scores.masked_fill(kpm.unsqueeze(1).unsqueeze(2), ninf);
    else
      scores = scores + kpm.view({B, 1, 1, S});
    scores = scores.view({B * H, L, S});
  }
  sink.put("scores", scores.view({B, H, L, S}));
  TT weights = F::softmax(scores, F::SoftmaxFuncOptions(-1));
  sink.put("attn_weights", weights.view({B, H, L, S}));
  TT context = torch::bmm(weights, v).transpose(0, 1).contiguous().view({L, B, E});
  sink.put("context", context.transpose(0, 1));
  TT output = F::linear(context, w.out_proj_weight, w.out_proj_bias);
  sink.put("output", output.transpose(0, 1));
  MhaResult r{output, TT()};
  if (fwd.need_weights) {
    r.weights = weights.view({B, H, L, S});
    if (fwd.average_attn_weights) {
      r.weights = r.weights.sum(1) / H;
      sink.put("attn_weights_avg", r.weights);
    }
  }
  return r;
}

// What the C++ modules of torch 1.13 cannot run (they are sequence-first and batched only, but those
// are exact layout changes the runner makes).
std::string mha_limitation(const Problem& p, const std::string& attn, const std::string& kpm) {
  const DTensor* a = p.input(attn);
  const DTensor* k = p.input(kpm);
  if (a && a->shape.size() == 3)
    return attn + " is 3-D: the 1.13 C++ module only broadcasts a 2-D (L, S) mask (attn_mask_.unsqueeze(0) then +=)";
  if (k && k->dtype != DType::Bool)
    return kpm + " is float: the 1.13 C++ module only takes a bool key padding mask (masked_fill)";
  return "";
}

}  // namespace

std::string module_limitation(const Problem& p) {
  switch (p.module) {
    case ModuleKind::MultiheadAttention:
      if (p.mha.key_dim() != p.mha.value_dim())
        return "kdim != vdim: the 1.13 C++ module asserts key.sizes() == value.sizes()";
      return mha_limitation(p, "attn_mask", "key_padding_mask");
    case ModuleKind::TransformerEncoderLayer:
    case ModuleKind::TransformerEncoder:
    case ModuleKind::TransformerDecoderLayer: {
      const std::string name =
          p.module == ModuleKind::TransformerDecoderLayer ? "TransformerDecoderLayer" : "TransformerEncoderLayer";
      if (p.encoder.norm_first) return "norm_first: the 1.13 C++ " + name + " has no norm_first option";
      if (p.encoder.layer_norm_eps != 1e-5)
        return "layer_norm_eps != 1e-5: the 1.13 C++ " + name + " has no layer_norm_eps option";
      if (p.module == ModuleKind::TransformerDecoderLayer) {
        const std::string a = mha_limitation(p, "tgt_mask", "tgt_key_padding_mask");
        return a.empty() ? mha_limitation(p, "memory_mask", "memory_key_padding_mask") : a;
      }
      return mha_limitation(p, p.module == ModuleKind::TransformerEncoder ? "mask" : "src_mask",
                            "src_key_padding_mask");
    }
    case ModuleKind::TokenEncoder:
    case ModuleKind::ViT: {
      const EncoderConfig& c = p.module == ModuleKind::ViT ? p.vit.layer : p.token.layer;
      if (c.norm_first) return "norm_first: the 1.13 C++ TransformerEncoderLayer has no norm_first option";
      if (c.layer_norm_eps != 1e-5)
        return "layer_norm_eps != 1e-5: the 1.13 C++ TransformerEncoderLayer has no layer_norm_eps option";
      return "";
    }
    case ModuleKind::ScaledDotProductAttention:
    case ModuleKind::Matmul:
    case ModuleKind::Softmax:
    case ModuleKind::LayerNorm:
      return "";
  }
  return "";
}

namespace {

void load_state(torch::nn::Module& m, const Problem& p, DType dtype, const std::string& where) {
  torch::NoGradGuard guard;
  std::set<std::string> names;
  auto load = [&](const std::string& name, TT& value) {
    names.insert(name);
    auto it = p.state_dict.find(name);
    if (it == p.state_dict.end())
      throw InputError(where + ": state_dict." + name +
                       ": LibTorch's module has this parameter, the state dict has not");
    value.copy_(to_torch(it->second, dtype));
  };
  for (auto& kv : m.named_parameters()) load(kv.key(), kv.value());
  for (auto& kv : m.named_buffers())  // BatchNorm's running statistics
    if (!training_only_buffer(kv.key())) load(kv.key(), kv.value());
  for (const auto& [name, t] : p.state_dict)
    if (!names.count(name))
      throw InputError(where + ": state_dict." + name + ": LibTorch's module has no such parameter");
}

// (L, B, E) <-> the problem's layout.
TT seq_first(const TT& x, bool batched, bool batch_first) {
  if (!batched) return x.unsqueeze(1);
  return batch_first ? x.transpose(0, 1) : x;
}
TT from_seq_first(const TT& x, bool batched, bool batch_first) {
  if (!batched) return x.squeeze(1);
  return batch_first ? x.transpose(0, 1) : x;
}

void verify(TorchRun& run, const char* what, const TT& module_out, const TT& decomposed) {
  const Metrics m = measure(to_hand(decomposed), to_hand(module_out));
  if (!m.clean() || m.l2 != 0)
    run.failure += std::string(run.failure.empty() ? "" : "; ") + "the functional decomposition's " + what +
                   " differs from the module's: rel_l2 " + std::to_string(m.rel_l2) + ", max_abs " +
                   std::to_string(m.max_abs) + ", non-finite mismatches " + std::to_string(m.nonfinite_mismatch);
}

// The bool mask the 1.13 C++ modules would add as 0/1 (attn_output_weights += attn_mask_), in the
// additive -inf/0 form Python's semantics build from it.
TT for_cxx_module(const TT& mask, DType dtype, const char* name, TorchRun& run) {
  if (!mask.defined() || mask.scalar_type() != torch::kBool) return mask;
  run.notes.push_back(std::string("bool ") + name +
                      " passed to the C++ module as its additive -inf/0 form (the 1.13 C++ module adds a bool mask "
                      "as 0/1)");
  return bool_to_additive(mask, scalar_type(dtype));
}

// A verification to a stated tolerance instead of bit for bit.
std::string fmt_note(const std::string& what, DType dtype, double l2, double bound) {
  char buf[160];
  std::snprintf(buf, sizeof buf, " within the summation-order bound (%s): l2 %.3g <= 2 K u || |A| |B| || = %.3g",
                dtype_name(dtype).c_str(), l2, bound);
  return what + buf + "; not bit for bit: the two run different kernels, which round the K-term sums differently";
}

void verified_note(TorchRun& run, const std::string& what, DType dtype) {
  run.verified = run.failure.empty();
  if (run.verified)
    run.notes.push_back("decomposition reproduces " + what + " bit for bit (" + dtype_name(dtype) + ")");
}

TorchRun run_mha(const Problem& p, DType dtype, bool collect) {
  TorchRun run;
  const MhaConfig& c = p.mha;
  const bool batched = p.input("query")->shape.size() == 3;
  const TT query = seq_first(input(p, "query", dtype), batched, c.batch_first);
  const TT key = seq_first(input(p, "key", dtype), batched, c.batch_first);
  const TT value = seq_first(input(p, "value", dtype), batched, c.batch_first);
  const TT attn = input(p, "attn_mask", dtype);
  TT kpm = input(p, "key_padding_mask", dtype);
  if (kpm.defined() && !batched) kpm = kpm.unsqueeze(0);

  const std::string limitation = module_limitation(p);
  torch::nn::MultiheadAttention m{nullptr};
  if (limitation.empty()) {
    m = torch::nn::MultiheadAttention(torch::nn::MultiheadAttentionOptions(c.embed_dim, c.num_heads)
                                          .dropout(0.0)
                                          .bias(c.bias)
                                          .add_bias_kv(c.add_bias_kv)
                                          .add_zero_attn(c.add_zero_attn)
                                          .kdim(c.key_dim())
                                          .vdim(c.value_dim()));
    m->to(scalar_type(dtype));
    m->eval();
    load_state(*m, p, dtype, "LibTorch");
  } else {
    run.notes.push_back("no LibTorch module run: " + limitation);
  }
  const Params params = m ? module_params(*m) : state_params(p, dtype);
  Sink sink{collect ? &run.result.components : nullptr, "", "", ""};
  const MhaResult ref = mha_decomposed(c, p.forward, mha_params(params, ""), query, key, value, attn, kpm, sink);
  TT out = ref.output, weights = ref.weights;
  if (m) {
    const TT mod_attn = for_cxx_module(attn, dtype, "attn_mask", run);
    torch::NoGradGuard guard;
    auto [mout, mweights] =
        m->forward(query, key, value, kpm, p.forward.need_weights, mod_attn, p.forward.average_attn_weights);
    run.module_ran = true;
    verify(run, "output", mout, ref.output);
    if (p.forward.need_weights) verify(run, "attn_weights", mweights, ref.weights);
    verified_note(run, "torch::nn::MultiheadAttention", dtype);
    out = mout, weights = mweights;
  }
  run.result.outputs["output"] = to_dtensor(from_seq_first(out, batched, c.batch_first), dtype);
  if (p.forward.need_weights)
    run.result.outputs["attn_weights"] = to_dtensor(batched ? weights : weights.squeeze(0), dtype);
  return run;
}

// The masks of one attention block, sequence-first batched world.
struct BlockMasks {
  TT attn, kpm;
};

// One encoder layer (memory undefined) or decoder layer, op by op on sequence-first x (T, B, d).
// mirrors TransformerEncoderLayerImpl::forward / TransformerDecoderLayerImpl::forward (C++, 1.13)
// and, for norm_first, Python's: x = x + sa(norm1(x)); [x = x + ca(norm2(x), memory);] x = x + ff(normN(x)).
// Components under `prefix` ("" or "layers.N."), batch-first.
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
    return F::layer_norm(v, F::LayerNormFuncOptions({c.d_model})
                                .weight(param(ps, n + ".weight"))
                                .bias(param(ps, n + ".bias"))
                                .eps(c.layer_norm_eps));
  };
  auto ff = [&](const TT& v) {
    TT h = F::linear(v, param(ps, prefix + "linear1.weight"), param(ps, prefix + "linear1.bias"));
    h = activation(c.activation, h);
    top.put("ffn_hidden", h.transpose(0, 1));
    TT o = F::linear(h, param(ps, prefix + "linear2.weight"), param(ps, prefix + "linear2.bias"));
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

torch::nn::TransformerEncoderLayerOptions encoder_options(const EncoderConfig& c) {
  auto o =
      torch::nn::TransformerEncoderLayerOptions(c.d_model, c.nhead).dim_feedforward(c.dim_feedforward).dropout(0.0);
  if (c.activation == Activation::Gelu)
    o.activation(torch::kGELU);
  else
    o.activation(torch::kReLU);
  return o;
}

torch::nn::TransformerDecoderLayerOptions decoder_options(const EncoderConfig& c) {
  auto o =
      torch::nn::TransformerDecoderLayerOptions(c.d_model, c.nhead).dim_feedforward(c.dim_feedforward).dropout(0.0);
  if (c.activation == Activation::Gelu)
    o.activation(torch::kGELU);
  else
    o.activation(torch::kReLU);
  return o;
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

  const std::string limitation = module_limitation(p);
  std::shared_ptr<torch::nn::Module> m;
  std::function<TT(const BlockMasks&, const BlockMasks&)> module_forward;
  std::string what;
  if (limitation.empty()) {
    if (decoder) {
      auto d = torch::nn::TransformerDecoderLayer(decoder_options(c));
      module_forward = [d, &x0, &memory](const BlockMasks& s, const BlockMasks& x) mutable {
        return d->forward(x0, memory, s.attn, x.attn, s.kpm, x.kpm);
      };
      m = d.ptr(), what = "torch::nn::TransformerDecoderLayer";
    } else if (stack) {
      auto o = torch::nn::TransformerEncoderOptions(encoder_options(c), p.num_layers);
      if (p.final_norm)
        o.norm(
            torch::nn::AnyModule(torch::nn::LayerNorm(torch::nn::LayerNormOptions({c.d_model}).eps(c.layer_norm_eps))));
      auto e = torch::nn::TransformerEncoder(o);
      module_forward = [e, &x0](const BlockMasks& s, const BlockMasks&) mutable {
        return e->forward(x0, s.attn, s.kpm);
      };
      m = e.ptr(), what = "torch::nn::TransformerEncoder";
    } else {
      auto e = torch::nn::TransformerEncoderLayer(encoder_options(c));
      module_forward = [e, &x0](const BlockMasks& s, const BlockMasks&) mutable {
        return e->forward(x0, s.attn, s.kpm);
      };
      m = e.ptr(), what = "torch::nn::TransformerEncoderLayer";
    }
    m->to(scalar_type(dtype));
    m->eval();
    load_state(*m, p, dtype, "LibTorch");
  } else {
    run.notes.push_back("no LibTorch module run: " + limitation);
  }
  const Params params = m ? module_params(*m) : state_params(p, dtype);

  Components* comps = collect ? &run.result.components : nullptr;
  TT x = x0;
  if (stack) {
    // mirrors TransformerEncoderImpl::forward: the layers in turn, each with the same masks, then the norm.
    for (int64_t i = 0; i < p.num_layers; ++i)
      x = layer_decomposed(c, params, "layers." + std::to_string(i) + ".", x, TT(), self, cross, comps);
    if (p.final_norm) {
      x = F::layer_norm(x, F::LayerNormFuncOptions({c.d_model})
                               .weight(param(params, "norm.weight"))
                               .bias(param(params, "norm.bias"))
                               .eps(c.layer_norm_eps));
      Sink{comps, "", "", ""}.put("norm", x.transpose(0, 1));
    }
    Sink{comps, "", "", ""}.put("output", x.transpose(0, 1));
  } else {
    x = layer_decomposed(c, params, "", x, memory, self, cross, comps);
  }
  TT out = x;
  if (m) {
    const BlockMasks mself{for_cxx_module(self.attn, dtype, decoder ? "tgt_mask" : "src_mask", run), self.kpm};
    const BlockMasks mcross{for_cxx_module(cross.attn, dtype, "memory_mask", run), cross.kpm};
    torch::NoGradGuard guard;
    const TT mout = module_forward(mself, mcross);
    run.module_ran = true;
    verify(run, "output", mout, x);
    verified_note(run, what, dtype);
    out = mout;
  }
  run.result.outputs["output"] = to_dtensor(from_seq_first(out, batched, c.batch_first), dtype);
  return run;
}

TorchRun run_sdpa(const Problem& p, DType dtype, bool collect) {
  TorchRun run;
  const TT q = input(p, "query", dtype), k = input(p, "key", dtype), v = input(p, "value", dtype);
  TT mask = input(p, "attn_mask", dtype);
  if (mask.defined() && mask.scalar_type() == torch::kBool) mask = bool_to_additive(mask, scalar_type(dtype));
  const Sink sink{collect ? &run.result.components : nullptr, "", "", ""};
  // mirrors at::_scaled_dot_product_attention (1.13's math path, the forerunner of
  // F.scaled_dot_product_attention): q * (1/sqrt(E)) @ k^T (+ mask), softmax, @ v. Seed 004's
  // DotProductAttention divides the scores instead: the same function, rounded differently.
  TT scores = torch::matmul(q * (1 / std::sqrt(double(q.size(-1)))), k.transpose(-2, -1));
  if (mask.defined()) scores = scores + mask;
  sink.put("scores", scores);
  const TT weights = torch::softmax(scores, -1);
  sink.put("attn_weights", weights);
  const TT out = torch::matmul(weights, v);
  sink.put("output", out);
  {
    torch::NoGradGuard guard;
    auto [mout, mweights] =
        at::_scaled_dot_product_attention(q, k, v, mask.defined() ? c10::optional<TT>(mask) : c10::nullopt, 0.0,
                                          /*need_attn_weights=*/true, /*is_causal=*/false);
    run.module_ran = true;
    verify(run, "output", mout, out);
    verify(run, "attn_weights", mweights, weights);
    verified_note(run, "at::_scaled_dot_product_attention", dtype);
  }
  run.result.outputs["output"] = to_dtensor(out, dtype);
  return run;
}

// ---- seed 004's models ------------------------------------------------------------------------

// Seed 004's PositionalEncoding table, first T rows, from its own torch code, in the run's dtype:
// X = arange(T).reshape(-1, 1) / pow(10000, arange(0, d, 2) / d); P[:, 0::2] = sin(X); P[:, 1::2] = cos(X).
// (The seed builds it in float32 whatever the model's dtype; here float64 runs get the float64 table.)
TT positional_table(int64_t T, int64_t d, DType dtype) {
  const auto o = torch::TensorOptions().dtype(scalar_type(dtype));
  const TT X = torch::arange(T, o).reshape({-1, 1}) / torch::pow(10000, torch::arange(0, d, 2, o) / d);
  TT P = torch::zeros({T, d}, o);
  P.slice(1, 0, d, 2).copy_(torch::sin(X));
  P.slice(1, 1, d, 2).copy_(torch::cos(X));
  return P;
}

// Seed 004's Patcher.forward, verbatim: (B, C, H, W) -> (B, n, C * p * p).
TT patcher(const TT& image, int64_t p) {
  const int64_t b = image.size(0), c = image.size(1);
  return image.unfold(-2, p, p).unfold(-2, p, p).reshape({b, c, -1, p * p}).transpose(1, 2).reshape({b, -1, c * p * p});
}

// The activation modules seed 004's get_activation picks, as a callable (nn's default options).
std::function<TT(const TT&)> activation_module(Activation a) {
  auto wrap = [](auto m) { return std::function<TT(const TT&)>([m](const TT& x) mutable { return m->forward(x); }); };
  switch (a) {
    case Activation::Relu:
      return wrap(torch::nn::ReLU());
    case Activation::Gelu:
      return wrap(torch::nn::GELU());
    case Activation::Tanh:
      return wrap(torch::nn::Tanh());
    case Activation::Sigmoid:
      return wrap(torch::nn::Sigmoid());
    case Activation::Silu:
      return wrap(torch::nn::SiLU());
    case Activation::Softplus:
      return wrap(torch::nn::Softplus(torch::nn::SoftplusOptions().beta(1).threshold(20)));
    case Activation::LeakyRelu:
      return wrap(torch::nn::LeakyReLU(torch::nn::LeakyReLUOptions().negative_slope(0.01)));
  }
  return {};
}

// The stack of torch::nn::TransformerEncoderLayer modules under "layers" (names layers.N.*).
torch::nn::ModuleList encoder_layers(torch::nn::Module& parent, const EncoderConfig& c, int64_t n) {
  auto layers = parent.register_module("layers", torch::nn::ModuleList());
  for (int64_t i = 0; i < n; ++i) layers->push_back(torch::nn::TransformerEncoderLayer(encoder_options(c)));
  return layers;
}

// The layers in turn on batch-first x, through the modules (1.13's C++ layer is sequence-first).
TT forward_layers(const torch::nn::ModuleList& layers, const TT& x) {
  TT s = x.transpose(0, 1);
  for (const auto& layer : *layers) s = layer->as<torch::nn::TransformerEncoderLayer>()->forward(s);
  return s.transpose(0, 1);
}

// The same, op by op (layer_decomposed), components under layers.N.
TT decomposed_layers(const EncoderConfig& c, int64_t n, const Params& ps, const TT& x, Components* comps) {
  TT s = x.transpose(0, 1);
  for (int64_t i = 0; i < n; ++i)
    s = layer_decomposed(c, ps, "layers." + std::to_string(i) + ".", s, TT(), BlockMasks{}, BlockMasks{}, comps);
  return s.transpose(0, 1);
}

// Seed 004's TransformerEncoder assembled from LibTorch modules: torch::nn::Embedding, the seed's
// positional encoding (torch ops), torch::nn::TransformerEncoderLayer x N.
TorchRun run_token_encoder(const Problem& p, DType dtype, bool collect) {
  TorchRun run;
  const TokenEncoderConfig& c = p.token;
  const TT tokens = input(p, "tokens", dtype);
  const TT P = positional_table(tokens.size(1), c.layer.d_model, dtype);

  const std::string limitation = module_limitation(p);
  std::shared_ptr<torch::nn::Module> m;
  torch::nn::Embedding embedding{nullptr};
  torch::nn::ModuleList layers{nullptr};
  if (limitation.empty()) {
    m = std::make_shared<torch::nn::Module>();
    embedding = m->register_module("embedding", torch::nn::Embedding(c.vocab, c.layer.d_model));
    layers = encoder_layers(*m, c.layer, c.num_layers);
    m->to(scalar_type(dtype));
    m->eval();
    load_state(*m, p, dtype, "LibTorch");
  } else {
    run.notes.push_back("no LibTorch module run: " + limitation);
  }
  const Params params = m ? module_params(*m) : state_params(p, dtype);

  Components* comps = collect ? &run.result.components : nullptr;
  const Sink sink{comps, "", "", ""};
  TT x = F::embedding(tokens, param(params, "embedding.weight"));
  sink.put("embedding", x);
  x = x + P;
  sink.put("pos_encoding", x);
  x = decomposed_layers(c.layer, c.num_layers, params, x, comps);
  sink.put("output", x);
  TT out = x;
  if (m) {
    torch::NoGradGuard guard;
    const TT mout = forward_layers(layers, embedding->forward(tokens) + P);
    run.module_ran = true;
    verify(run, "output", mout, x);
    verified_note(run, "torch::nn::Embedding + torch::nn::TransformerEncoderLayer x" + std::to_string(c.num_layers),
                  dtype);
    out = mout;
  }
  run.result.outputs["output"] = to_dtensor(out, dtype);
  return run;
}

// Seed 004's ViT assembled from LibTorch modules: its Patcher and positional encoding (torch ops),
// torch::nn::TransformerEncoderLayer x N, X.view(B, -1), then per hidden width torch::nn::Linear,
// torch::nn::BatchNorm1d (eval) and the activation module, and the output torch::nn::Linear.
TorchRun run_vit(const Problem& p, DType dtype, bool collect) {
  TorchRun run;
  const VitConfig& c = p.vit;
  const TT image = input(p, "image", dtype);
  const int64_t B = image.size(0);
  const size_t hidden = c.head.size() - 1;
  const TT P = positional_table(c.num_patches(), c.d_model(), dtype);

  const std::string limitation = module_limitation(p);
  std::shared_ptr<torch::nn::Module> m;
  torch::nn::ModuleList layers{nullptr};
  std::vector<torch::nn::Linear> linears;
  std::vector<torch::nn::BatchNorm1d> norms;
  torch::nn::Linear out_linear{nullptr};
  if (limitation.empty()) {
    m = std::make_shared<torch::nn::Module>();
    layers = encoder_layers(*m, c.layer, c.num_layers);
    auto head = m->register_module("head", std::make_shared<torch::nn::Module>());
    int64_t in = c.num_patches() * c.d_model();
    for (size_t i = 0; i < hidden; ++i) {
      auto block = head->register_module(std::to_string(i), std::make_shared<torch::nn::Module>());
      linears.push_back(block->register_module("linear", torch::nn::Linear(in, c.head[i])));
      norms.push_back(
          block->register_module("bn", torch::nn::BatchNorm1d(torch::nn::BatchNorm1dOptions(c.head[i]).eps(c.bn_eps))));
      in = c.head[i];
    }
    out_linear = head->register_module("out", torch::nn::Linear(in, c.head.back()));
    m->to(scalar_type(dtype));
    m->eval();
    load_state(*m, p, dtype, "LibTorch");
  } else {
    run.notes.push_back("no LibTorch module run: " + limitation);
  }
  const Params params = m ? module_params(*m) : state_params(p, dtype);

  Components* comps = collect ? &run.result.components : nullptr;
  const Sink sink{comps, "", "", ""};
  const TT patches = patcher(image, c.patch);
  sink.put("patches", patches);
  TT x = patches + P;
  sink.put("pos_encoding", x);
  x = decomposed_layers(c.layer, c.num_layers, params, x, comps).reshape({B, -1});  // X.view(B, -1)
  for (size_t i = 0; i < hidden; ++i) {
    const std::string pre = "head." + std::to_string(i) + ".";
    x = F::linear(x, param(params, pre + "linear.weight"), param(params, pre + "linear.bias"));
    sink.put(pre + "linear", x);
    x = F::batch_norm(x, param(params, pre + "bn.running_mean"), param(params, pre + "bn.running_var"),
                      F::BatchNormFuncOptions()
                          .weight(param(params, pre + "bn.weight"))
                          .bias(param(params, pre + "bn.bias"))
                          .training(false)
                          .eps(c.bn_eps));
    sink.put(pre + "bn", x);
    x = activation(c.head_activation, x);
    sink.put(pre + "act", x);
  }
  x = F::linear(x, param(params, "head.out.weight"), param(params, "head.out.bias"));
  sink.put("output", x);
  TT out = x;
  if (m) {
    torch::NoGradGuard guard;
    const std::function<TT(const TT&)> act = activation_module(c.head_activation);
    TT y = forward_layers(layers, patcher(image, c.patch) + P).reshape({B, -1});
    for (size_t i = 0; i < hidden; ++i) y = act(norms[i]->forward(linears[i]->forward(y)));
    y = out_linear->forward(y);
    run.module_ran = true;
    verify(run, "output", y, x);
    verified_note(run,
                  "torch::nn::TransformerEncoderLayer x" + std::to_string(c.num_layers) +
                      " + torch::nn::Linear / BatchNorm1d (eval) / " + activation_name(c.head_activation) + " head",
                  dtype);
    out = y;
  }
  run.result.outputs["output"] = to_dtensor(out, dtype);
  return run;
}

// ---- the op-level cases --------------------------------------------------------------------------

// torch::matmul, checked against its broadcasting definition: torch::bmm over the operands expanded
// to the common batch (1-D operands as a row / a column, their dim dropped after). matmul may take
// another route to the same numbers (it folds the batch of a >= 3-D input times a 2-D other into one
// mm, which BLAS sums in its own order), so where the two are not bit for bit they must agree within
// the bound any two summation orders of K products obey: ||difference|| <= 2 K u || |A| |B| ||.
TorchRun run_matmul(const Problem& p, DType dtype, bool collect) {
  TorchRun run;
  const TT a = input(p, "input", dtype), b = input(p, "other", dtype);
  TT out;
  {
    torch::NoGradGuard guard;
    out = torch::matmul(a, b);
  }
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
  TT ref = torch::bmm(a2.expand(with(M, K)).reshape({-1, M, K}), b2.expand(with(K, N)).reshape({-1, K, N}))
               .reshape(with(M, N));
  if (b.dim() == 1) ref = ref.squeeze(-1);
  if (a.dim() == 1) ref = ref.squeeze(-2);
  run.module_ran = true;
  const Metrics diff = measure(to_hand(out), to_hand(ref));
  const std::string what = "torch::bmm over the explicitly broadcast operands reproduces torch::matmul";
  if (diff.clean() && diff.l2 == 0) {
    run.notes.push_back(what + " bit for bit (" + dtype_name(dtype) + ")");
  } else {
    const double u = dtype == DType::Float32 ? 0x1p-24 : 0x1p-53;
    const double bound = 2.0 * double(K) * u *
                         torch::matmul(a.to(torch::kDouble).abs(), b.to(torch::kDouble).abs()).norm().item<double>();
    if (!diff.clean() || diff.l2 > bound)
      run.failure = "torch::matmul and torch::bmm over the explicitly broadcast operands differ: l2 " +
                    std::to_string(diff.l2) + " > bound 2 K u || |A| |B| || = " + std::to_string(bound);
    else
      run.notes.push_back(fmt_note(what, dtype, diff.l2, bound));
  }
  run.verified = run.failure.empty();
  run.result.outputs["output"] = to_dtensor(out, dtype);
  return run;
}

// torch::softmax(x, -1), checked against the torch::nn::Softmax(dim=-1) module.
TorchRun run_softmax(const Problem& p, DType dtype, bool collect) {
  TorchRun run;
  const TT x = input(p, "input", dtype);
  const TT out = torch::softmax(x, -1);
  Sink{collect ? &run.result.components : nullptr, "", "", ""}.put("output", out);
  {
    torch::NoGradGuard guard;
    torch::nn::Softmax m(torch::nn::SoftmaxOptions(-1));
    run.module_ran = true;
    verify(run, "output", m->forward(x), out);
    verified_note(run, "torch::nn::Softmax(dim=-1)", dtype);
  }
  run.result.outputs["output"] = to_dtensor(out, dtype);
  return run;
}

// at::native_layer_norm (output, and the mean and rstd it returns beside it), checked against the
// torch::nn::LayerNorm module loaded with the same weight and bias.
TorchRun run_layer_norm(const Problem& p, DType dtype, bool collect) {
  TorchRun run;
  const TT x = input(p, "input", dtype);
  const Shape lead(x.sizes().begin(), x.sizes().end() - 1);
  torch::nn::LayerNorm m(torch::nn::LayerNormOptions({p.normalized}).eps(p.eps).elementwise_affine(p.affine));
  m->to(scalar_type(dtype));
  m->eval();
  load_state(*m, p, dtype, "LibTorch");
  const Params params = module_params(*m);
  const auto [out, mean, rstd] =
      at::native_layer_norm(x, {p.normalized}, param(params, "weight"), param(params, "bias"), p.eps);
  const Sink sink{collect ? &run.result.components : nullptr, "", "", ""};
  sink.put("mean", mean.reshape(lead));
  sink.put("rstd", rstd.reshape(lead));
  sink.put("output", out);
  {
    torch::NoGradGuard guard;
    run.module_ran = true;
    verify(run, "output", m->forward(x), out);
    verified_note(run, "torch::nn::LayerNorm", dtype);
  }
  run.result.outputs["output"] = to_dtensor(out, dtype);
  return run;
}

}  // namespace

std::function<void()> prepare_torch(const Problem& p, DType dtype, const std::string& where, bool run_once) {
  if (!module_limitation(p).empty()) throw InputError(where + ": no LibTorch module to time: " + module_limitation(p));
  try {
    std::function<void()> f;
    if (p.module == ModuleKind::MultiheadAttention) {
      const MhaConfig& c = p.mha;
      const bool batched = p.input("query")->shape.size() == 3;
      auto m = torch::nn::MultiheadAttention(torch::nn::MultiheadAttentionOptions(c.embed_dim, c.num_heads)
                                                 .dropout(0.0)
                                                 .bias(c.bias)
                                                 .add_bias_kv(c.add_bias_kv)
                                                 .add_zero_attn(c.add_zero_attn)
                                                 .kdim(c.key_dim())
                                                 .vdim(c.value_dim()));
      m->to(scalar_type(dtype));
      m->eval();
      load_state(*m, p, dtype, "LibTorch");
      const TT q = seq_first(input(p, "query", dtype), batched, c.batch_first);
      const TT k = seq_first(input(p, "key", dtype), batched, c.batch_first);
      const TT v = seq_first(input(p, "value", dtype), batched, c.batch_first);
      TT attn = input(p, "attn_mask", dtype), kpm = input(p, "key_padding_mask", dtype);
      if (attn.defined() && attn.scalar_type() == torch::kBool) attn = bool_to_additive(attn, scalar_type(dtype));
      if (kpm.defined() && !batched) kpm = kpm.unsqueeze(0);
      const MhaForward fw = p.forward;
      f = [m, q, k, v, attn, kpm, fw]() mutable {
        torch::NoGradGuard guard;
        (void)m->forward(q, k, v, kpm, fw.need_weights, attn, fw.average_attn_weights);
      };
    } else if (p.module == ModuleKind::TransformerEncoderLayer) {
      const EncoderConfig& c = p.encoder;
      const bool batched = p.input("src")->shape.size() == 3;
      auto m = torch::nn::TransformerEncoderLayer(encoder_options(c));
      m->to(scalar_type(dtype));
      m->eval();
      load_state(*m, p, dtype, "LibTorch");
      const TT src = seq_first(input(p, "src", dtype), batched, c.batch_first);
      TT mask = input(p, "src_mask", dtype), kpm = input(p, "src_key_padding_mask", dtype);
      if (mask.defined() && mask.scalar_type() == torch::kBool) mask = bool_to_additive(mask, scalar_type(dtype));
      if (kpm.defined() && !batched) kpm = kpm.unsqueeze(0);
      f = [m, src, mask, kpm]() mutable {
        torch::NoGradGuard guard;
        (void)m->forward(src, mask, kpm);
      };
    } else {
      throw InputError(where + ": the benchmark times MultiheadAttention and TransformerEncoderLayer, not " +
                       module_name(p.module));
    }
    if (run_once) f();
    return f;
  } catch (const c10::Error& e) {
    std::string msg = e.what_without_backtrace();
    if (auto nl = msg.find('\n'); nl != std::string::npos) msg = msg.substr(0, nl);
    throw InputError(where + ": LibTorch rejected the problem: " + msg);
  }
}

void set_torch_threads(int n) {
  torch::set_num_threads(n);
  // Debian's LibTorch calls the system BLAS, which (OpenBLAS pthread) keeps its own thread pool.
  using SetThreads = void (*)(int);
  if (auto f = reinterpret_cast<SetThreads>(dlsym(RTLD_DEFAULT, "openblas_set_num_threads"))) f(n);
}

TorchRun run_torch(const Problem& p, DType dtype, bool collect_components, const std::string& where) {
  try {
    switch (p.module) {
      case ModuleKind::MultiheadAttention:
        return run_mha(p, dtype, collect_components);
      case ModuleKind::TransformerEncoderLayer:
      case ModuleKind::TransformerEncoder:
      case ModuleKind::TransformerDecoderLayer:
        return run_layers(p, dtype, collect_components);
      case ModuleKind::ScaledDotProductAttention:
        return run_sdpa(p, dtype, collect_components);
      case ModuleKind::TokenEncoder:
        return run_token_encoder(p, dtype, collect_components);
      case ModuleKind::ViT:
        return run_vit(p, dtype, collect_components);
      case ModuleKind::Matmul:
        return run_matmul(p, dtype, collect_components);
      case ModuleKind::Softmax:
        return run_softmax(p, dtype, collect_components);
      case ModuleKind::LayerNorm:
        return run_layer_norm(p, dtype, collect_components);
    }
  } catch (const c10::Error& e) {
    std::string msg = e.what_without_backtrace();
    if (auto nl = msg.find('\n'); nl != std::string::npos) msg = msg.substr(0, nl);
    throw InputError(where + ": LibTorch rejected the problem: " + msg);
  } catch (const InputError& e) {
    throw InputError(where + ": " + e.what());
  }
  return {};
}

}  // namespace tparity
