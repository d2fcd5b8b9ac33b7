// torch::nn's own modules, loaded with a problem's state dict: what the decompositions are verified
// against, and what the benchmark times. The one file of the reference that includes the C++ frontend.
#include <dlfcn.h>
#include <torch/nn.h>

#include <memory>
#include <set>

#include "internal.hpp"
#include "tparity/harness/llm.hpp"

namespace tparity::torch_ref {

namespace {

// Copies the state dict into the module's parameters and buffers, every name both ways.
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

template <class M>
M loaded(M m, const Problem& p, DType dtype) {
  m->to(scalar_type(dtype));
  m->eval();
  load_state(*m, p, dtype, "LibTorch");
  return m;
}

// The C++ modules take an attention mask as a float to add or, in 1.13, a bool they ADD as 0/1
// (attn_output_weights += attn_mask_) rather than masking: the runner hands them the additive -inf/0
// form Python's semantics build from a bool mask, and says so.
TT for_cxx_module(const TT& mask, DType dtype, const char* name, std::vector<std::string>& notes) {
  if (!mask.defined() || mask.scalar_type() != at::kBool) return mask;
  notes.push_back(
      std::string("bool ") + name +
      " passed to the C++ module as its additive -inf/0 form (the 1.13 C++ module adds a bool mask as 0/1)");
  return bool_to_additive(mask, scalar_type(dtype));
}

torch::nn::MultiheadAttention mha_module(const MhaConfig& c) {
  return torch::nn::MultiheadAttention(torch::nn::MultiheadAttentionOptions(c.embed_dim, c.num_heads)
                                           .dropout(0.0)
                                           .bias(c.bias)
                                           .add_bias_kv(c.add_bias_kv)
                                           .add_zero_attn(c.add_zero_attn)
                                           .kdim(c.key_dim())
                                           .vdim(c.value_dim()));
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

// The layers in turn on batch-first x, through the modules (the C++ layer is sequence-first).
TT forward_layers(const torch::nn::ModuleList& layers, const TT& x) {
  TT s = x.transpose(0, 1);
  for (const auto& layer : *layers) s = layer->as<torch::nn::TransformerEncoderLayer>()->forward(s);
  return s.transpose(0, 1);
}

TT batched_kpm(const Problem& p, const char* name, DType dtype, bool batched) {
  TT k = input(p, name, dtype);
  return k.defined() && !batched ? k.unsqueeze(0) : k;
}

ModuleRun mha(const Problem& p, DType dtype) {
  ModuleRun r{TT(), TT(), "torch::nn::MultiheadAttention", {}};
  const MhaConfig& c = p.mha;
  const bool batched = p.input("query")->shape.size() == 3;
  auto m = loaded(mha_module(c), p, dtype);
  const TT attn = for_cxx_module(input(p, "attn_mask", dtype), dtype, "attn_mask", r.notes);
  torch::NoGradGuard guard;
  std::tie(r.output, r.weights) = m->forward(seq_first(input(p, "query", dtype), batched, c.batch_first),
                                             seq_first(input(p, "key", dtype), batched, c.batch_first),
                                             seq_first(input(p, "value", dtype), batched, c.batch_first),
                                             batched_kpm(p, "key_padding_mask", dtype, batched), p.forward.need_weights,
                                             attn, p.forward.average_attn_weights);
  return r;
}

ModuleRun layers(const Problem& p, DType dtype) {
  const EncoderConfig& c = p.encoder;
  const bool decoder = p.module == ModuleKind::TransformerDecoderLayer;
  const bool stack = p.module == ModuleKind::TransformerEncoder;
  const bool batched = p.input(decoder ? "tgt" : "src")->shape.size() == 3;
  const TT x0 = seq_first(input(p, decoder ? "tgt" : "src", dtype), batched, c.batch_first);
  ModuleRun r;
  torch::NoGradGuard guard;
  if (decoder) {
    r.what = "torch::nn::TransformerDecoderLayer";
    auto d = loaded(torch::nn::TransformerDecoderLayer(decoder_options(c)), p, dtype);
    r.output = d->forward(x0, seq_first(input(p, "memory", dtype), batched, c.batch_first),
                          for_cxx_module(input(p, "tgt_mask", dtype), dtype, "tgt_mask", r.notes),
                          for_cxx_module(input(p, "memory_mask", dtype), dtype, "memory_mask", r.notes),
                          batched_kpm(p, "tgt_key_padding_mask", dtype, batched),
                          batched_kpm(p, "memory_key_padding_mask", dtype, batched));
    return r;
  }
  const TT mask = for_cxx_module(input(p, stack ? "mask" : "src_mask", dtype), dtype, "src_mask", r.notes);
  const TT kpm = batched_kpm(p, "src_key_padding_mask", dtype, batched);
  if (stack) {
    r.what = "torch::nn::TransformerEncoder";
    auto o = torch::nn::TransformerEncoderOptions(encoder_options(c), p.num_layers);
    if (p.final_norm)
      o.norm(
          torch::nn::AnyModule(torch::nn::LayerNorm(torch::nn::LayerNormOptions({c.d_model}).eps(c.layer_norm_eps))));
    auto e = loaded(torch::nn::TransformerEncoder(o), p, dtype);
    r.output = e->forward(x0, mask, kpm);
  } else {
    r.what = "torch::nn::TransformerEncoderLayer";
    auto e = loaded(torch::nn::TransformerEncoderLayer(encoder_options(c)), p, dtype);
    r.output = e->forward(x0, mask, kpm);
  }
  return r;
}

// Seed 004's TransformerEncoder assembled from LibTorch modules: torch::nn::Embedding, the seed's
// positional encoding (torch ops), torch::nn::TransformerEncoderLayer x N.
ModuleRun token_encoder(const Problem& p, DType dtype) {
  const TokenEncoderConfig& c = p.token;
  auto m = std::make_shared<torch::nn::Module>();
  auto embedding = m->register_module("embedding", torch::nn::Embedding(c.vocab, c.layer.d_model));
  auto layers = encoder_layers(*m, c.layer, c.num_layers);
  loaded(m, p, dtype);
  const TT tokens = input(p, "tokens", dtype);
  torch::NoGradGuard guard;
  return {forward_layers(layers, embedding->forward(tokens) + positional_table(tokens.size(1), c.layer.d_model, dtype)),
          TT(),
          "torch::nn::Embedding + torch::nn::TransformerEncoderLayer x" + std::to_string(c.num_layers),
          {}};
}

// Seed 004's ViT assembled from LibTorch modules: its Patcher and positional encoding (torch ops),
// torch::nn::TransformerEncoderLayer x N, X.view(B, -1), then per hidden width torch::nn::Linear,
// torch::nn::BatchNorm1d (eval) and the activation module, and the output torch::nn::Linear.
ModuleRun vit(const Problem& p, DType dtype) {
  const VitConfig& c = p.vit;
  auto m = std::make_shared<torch::nn::Module>();
  auto layers = encoder_layers(*m, c.layer, c.num_layers);
  auto head = m->register_module("head", std::make_shared<torch::nn::Module>());
  std::vector<torch::nn::Linear> linears;
  std::vector<torch::nn::BatchNorm1d> norms;
  int64_t in = c.num_patches() * c.d_model();
  for (size_t i = 0; i + 1 < c.head.size(); ++i) {
    auto block = head->register_module(std::to_string(i), std::make_shared<torch::nn::Module>());
    linears.push_back(block->register_module("linear", torch::nn::Linear(in, c.head[i])));
    norms.push_back(
        block->register_module("bn", torch::nn::BatchNorm1d(torch::nn::BatchNorm1dOptions(c.head[i]).eps(c.bn_eps))));
    in = c.head[i];
  }
  auto out_linear = head->register_module("out", torch::nn::Linear(in, c.head.back()));
  loaded(m, p, dtype);
  const TT image = input(p, "image", dtype);
  torch::NoGradGuard guard;
  const std::function<TT(const TT&)> act = activation_module(c.head_activation);
  TT y = forward_layers(layers, patcher(image, c.patch) + positional_table(c.num_patches(), c.d_model(), dtype))
             .reshape({image.size(0), -1});
  for (size_t i = 0; i < linears.size(); ++i) y = act(norms[i]->forward(linears[i]->forward(y)));
  return {out_linear->forward(y),
          TT(),
          "torch::nn::TransformerEncoderLayer x" + std::to_string(c.num_layers) +
              " + torch::nn::Linear / BatchNorm1d (eval) / " + activation_name(c.head_activation) + " head",
          {}};
}

#if TORCH_VERSION_MAJOR >= 2
// Pins scaled_dot_product_attention's CPU backend to the math path for its lifetime (the flash kernel
// is the default and rounds differently).
struct MathSdpa {
  bool flash = at::globalContext().userEnabledFlashSDP();
  MathSdpa() { at::globalContext().setSDPUseFlash(false); }
  ~MathSdpa() { at::globalContext().setSDPUseFlash(flash); }
};
#endif

// 2.x: the output of at::scaled_dot_product_attention (F.scaled_dot_product_attention's op, on its math
// path) given the arguments as they came (a bool attn_mask true where a key takes part, is_causal,
// scale, enable_gqa), the weights of at::_scaled_dot_product_attention_math, which that path calls
// once it has made the mask additive. 1.13: at::_scaled_dot_product_attention (its forerunner, the
// same arguments but scale and enable_gqa), output and weights.
ModuleRun sdpa(const Problem& p, DType dtype) {
  const TT q = input(p, "query", dtype), k = input(p, "key", dtype), v = input(p, "value", dtype);
  const TT mask = input(p, "attn_mask", dtype);
  torch::NoGradGuard guard;
  ModuleRun r;
#if TORCH_VERSION_MAJOR >= 2
  r.what = "at::scaled_dot_product_attention (math backend) and _scaled_dot_product_attention_math's weights";
  {
    MathSdpa math;
    r.output = at::scaled_dot_product_attention(q, k, v, mask.defined() ? std::optional<TT>(mask) : std::nullopt, 0.0,
                                                p.sdpa.is_causal, p.sdpa.scale, p.sdpa.enable_gqa);
  }
  const TT additive = mask.defined() && mask.scalar_type() == at::kBool
                          ? bool_to_additive(mask.logical_not(), scalar_type(dtype))
                          : mask;
  r.weights = std::get<1>(
      at::_scaled_dot_product_attention_math(q, k, v, additive.defined() ? std::optional<TT>(additive) : std::nullopt,
                                             0.0, p.sdpa.is_causal, std::nullopt, p.sdpa.scale, p.sdpa.enable_gqa));
#else
  r.what = "at::_scaled_dot_product_attention";
  std::tie(r.output, r.weights) =
      at::_scaled_dot_product_attention(q, k, v, mask.defined() ? c10::optional<TT>(mask) : c10::nullopt, 0.0,
                                        /*need_attn_weights=*/true, p.sdpa.is_causal);
#endif
  return r;
}

ModuleRun softmax(const Problem& p, DType dtype) {
  torch::nn::Softmax m(torch::nn::SoftmaxOptions(-1));
  torch::NoGradGuard guard;
  return {m->forward(input(p, "input", dtype)), TT(), "torch::nn::Softmax(dim=-1)", {}};
}

ModuleRun layer_norm(const Problem& p, DType dtype) {
  auto m =
      loaded(torch::nn::LayerNorm(torch::nn::LayerNormOptions({p.normalized}).eps(p.eps).elementwise_affine(p.affine)),
             p, dtype);
  torch::NoGradGuard guard;
  return {m->forward(input(p, "input", dtype)), TT(), "torch::nn::LayerNorm", {}};
}

}  // namespace

ModuleRun run_module(const Problem& p, DType dtype) {
  switch (module_handler(p.module)) {
    case ModuleHandler::MultiheadAttention:
      return mha(p, dtype);
    case ModuleHandler::TransformerEncoderLayer:
    case ModuleHandler::TransformerEncoder:
    case ModuleHandler::TransformerDecoderLayer:
      return layers(p, dtype);
    case ModuleHandler::ScaledDotProductAttention:
      return sdpa(p, dtype);
    case ModuleHandler::TokenEncoder:
      return token_encoder(p, dtype);
    case ModuleHandler::ViT:
      return vit(p, dtype);
    case ModuleHandler::Softmax:
      return softmax(p, dtype);
    case ModuleHandler::LayerNorm:
      return layer_norm(p, dtype);
    case ModuleHandler::Matmul:  // module_limitation: none of these is a torch::nn module
    case ModuleHandler::Book:
    case ModuleHandler::Llm:  // transformers' modules are Python's: the fixtures verify these
      break;
  }
  throw std::logic_error("run_module: no module for " + module_name(p.module));
}

}  // namespace tparity::torch_ref

namespace tparity {

using torch_ref::TT;

std::function<void()> prepare_torch(const Problem& p, DType dtype, const std::string& where, bool run_once) {
  using namespace torch_ref;
  if (llm_module(p.module)) {  // transformers' blocks: LibTorch times the ATen composition (llm.cpp)
    std::function<void()> f = prepare_llm_torch(p, dtype);
    if (run_once) f();
    return f;
  }
  if (!module_limitation(p).empty()) throw InputError(where + ": no LibTorch module to time: " + module_limitation(p));
  try {
    std::function<void()> f;
    if (p.module == ModuleKind::MultiheadAttention) {
      const MhaConfig& c = p.mha;
      const bool batched = p.input("query")->shape.size() == 3;
      auto m = loaded(mha_module(c), p, dtype);
      const TT q = seq_first(input(p, "query", dtype), batched, c.batch_first);
      const TT k = seq_first(input(p, "key", dtype), batched, c.batch_first);
      const TT v = seq_first(input(p, "value", dtype), batched, c.batch_first);
      std::vector<std::string> notes;
      const TT attn = for_cxx_module(input(p, "attn_mask", dtype), dtype, "attn_mask", notes);
      const TT kpm = batched_kpm(p, "key_padding_mask", dtype, batched);
      const MhaForward fw = p.forward;
      f = [m, q, k, v, attn, kpm, fw]() mutable {
        torch::NoGradGuard guard;
        (void)m->forward(q, k, v, kpm, fw.need_weights, attn, fw.average_attn_weights);
      };
    } else if (p.module == ModuleKind::TransformerEncoderLayer) {
      const EncoderConfig& c = p.encoder;
      const bool batched = p.input("src")->shape.size() == 3;
      auto m = loaded(torch::nn::TransformerEncoderLayer(encoder_options(c)), p, dtype);
      const TT src = seq_first(input(p, "src", dtype), batched, c.batch_first);
      std::vector<std::string> notes;
      const TT mask = for_cxx_module(input(p, "src_mask", dtype), dtype, "src_mask", notes);
      const TT kpm = batched_kpm(p, "src_key_padding_mask", dtype, batched);
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
    rethrow_as_input_error(e, where);
  }
}

void set_torch_threads(int n) {
  at::set_num_threads(n);
  // Debian's LibTorch calls the system BLAS, which (OpenBLAS pthread) keeps its own thread pool.
  using SetThreads = void (*)(int);
  if (auto f = reinterpret_cast<SetThreads>(dlsym(RTLD_DEFAULT, "openblas_set_num_threads"))) f(n);
}

}  // namespace tparity
