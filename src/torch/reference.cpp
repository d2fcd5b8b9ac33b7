// The LibTorch reference: which LibTorch it is, what its C++ modules can run, and run_torch, which
// runs a problem's decomposition (attention.cpp, layers.cpp, models.cpp, ops.cpp) and verifies it
// against torch::nn's module (modules.cpp).
#include "tparity/torch/reference.hpp"

#include "internal.hpp"

namespace tparity {

bool torch_available() { return true; }

std::string torch_version() {
  return std::to_string(TORCH_VERSION_MAJOR) + "." + std::to_string(TORCH_VERSION_MINOR) + "." +
         std::to_string(TORCH_VERSION_PATCH);
}

int torch_threads() { return at::get_num_threads(); }

TorchSemantics reference_semantics() {
  return TORCH_VERSION_MAJOR >= 2 ? TorchSemantics::Torch2 : TorchSemantics::Torch113;
}

std::string low_precision_limitation(DType dtype) {
  c10::NoGradGuard no_grad;
  try {
    const at::Tensor x = at::ones({2, 2}, at::TensorOptions().dtype(torch_ref::scalar_type(dtype)));
    (void)at::matmul(x, x);
    (void)at::softmax(x, -1);
    (void)at::layer_norm(x, {2});
  } catch (const c10::Error& e) {
    std::string msg = e.what_without_backtrace();
    return msg.substr(0, msg.find('\n'));
  }
  return "";
}

namespace {

// What the C++ modules cannot run (they are sequence-first and batched only, but those are exact
// layout changes the runner makes).
std::string mha_limitation(const Problem& p, const std::string& attn, const std::string& kpm) {
  const DTensor* a = p.input(attn);
  const DTensor* k = p.input(kpm);
  if (a && a->shape.size() == 3)
    return attn + " is 3-D: the 1.13 C++ module only broadcasts a 2-D (L, S) mask (attn_mask_.unsqueeze(0) then +=)";
  if (k && k->dtype != DType::Bool)
    return kpm +
           " is float: the C++ module only takes a bool key padding mask (masked_fill; 1.13 ignores a float "
           "one's values, 2.x refuses it)";
  return "";
}

}  // namespace

std::string module_limitation(const Problem& p) {
  // The C++ modules kept 1.13's semantics in 2.x (they merge the masks as 1.13 does and their softmax
  // gives NaN): where Python 2.x's differ, the decomposition follows Python and no module can check it.
  // (2.x's _scaled_dot_product_attention_math has the safe softmax itself.)
  if (TORCH_VERSION_MAJOR >= 2 && has_fully_masked_rows(p, reference_semantics()) &&
      p.module != ModuleKind::ScaledDotProductAttention &&
      (p.module != ModuleKind::MultiheadAttention || !p.forward.need_weights))
    return "rows whose every key is masked: the C++ module keeps torch 1.13's NaN, Python " + torch_version() +
           "'s scaled_dot_product_attention (need_weights=False) gives them zero weights";
  switch (module_handler(p.module)) {
    case ModuleHandler::MultiheadAttention:
      if (p.mha.key_dim() != p.mha.value_dim())
        return "kdim != vdim: the 1.13 C++ module asserts key.sizes() == value.sizes()";
      return mha_limitation(p, "attn_mask", "key_padding_mask");
    case ModuleHandler::TransformerEncoderLayer:
    case ModuleHandler::TransformerEncoder:
    case ModuleHandler::TransformerDecoderLayer: {
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
    case ModuleHandler::TokenEncoder:
    case ModuleHandler::ViT: {
      const EncoderConfig& c = p.module == ModuleKind::ViT ? p.vit.layer : p.token.layer;
      if (c.norm_first) return "norm_first: the 1.13 C++ TransformerEncoderLayer has no norm_first option";
      if (c.layer_norm_eps != 1e-5)
        return "layer_norm_eps != 1e-5: the 1.13 C++ TransformerEncoderLayer has no layer_norm_eps option";
      return "";
    }
    case ModuleHandler::ScaledDotProductAttention:
    case ModuleHandler::Matmul:
    case ModuleHandler::Softmax:
    case ModuleHandler::LayerNorm:
      return "";
    case ModuleHandler::Book:
      return module_name(p.module) +
             " is the book's Python class (LLMs-from-scratch ch03): LibTorch has no such module";
    case ModuleHandler::Llm:
      return module_name(p.module) + " is transformers' (Python): LibTorch has no such module";
  }
  return "";
}

namespace torch_ref {

void against_module(TorchRun& run, const Problem& p, DType dtype, TT& out, TT* weights) {
  if (const std::string limitation = module_limitation(p); !limitation.empty()) {
    run.notes.push_back("no LibTorch module run: " + limitation);
    return;
  }
  ModuleRun m = run_module(p, dtype);
  run.notes.insert(run.notes.end(), m.notes.begin(), m.notes.end());
  run.module_ran = true;
  verify(run, "output", m.output, out);
  if (weights) verify(run, "attn_weights", m.weights, *weights);
  verified_note(run, m.what, dtype);
  out = m.output;
  if (weights) *weights = m.weights;
}

}  // namespace torch_ref

TorchRun run_torch(const Problem& p, DType dtype, bool collect_components, const std::string& where) {
  using namespace torch_ref;
  c10::NoGradGuard no_grad;
  try {
    switch (module_handler(p.module)) {
      case ModuleHandler::MultiheadAttention:
        return run_mha(p, dtype, collect_components);
      case ModuleHandler::TransformerEncoderLayer:
      case ModuleHandler::TransformerEncoder:
      case ModuleHandler::TransformerDecoderLayer:
        return run_layers(p, dtype, collect_components);
      case ModuleHandler::ScaledDotProductAttention:
        return run_sdpa(p, dtype, collect_components);
      case ModuleHandler::TokenEncoder:
        return run_token_encoder(p, dtype, collect_components);
      case ModuleHandler::ViT:
        return run_vit(p, dtype, collect_components);
      case ModuleHandler::Matmul:
        return run_matmul(p, dtype, collect_components);
      case ModuleHandler::Softmax:
        return run_softmax(p, dtype, collect_components);
      case ModuleHandler::LayerNorm:
        return run_layer_norm(p, dtype, collect_components);
      case ModuleHandler::Book:
        return run_book(p, dtype, collect_components);
      case ModuleHandler::Llm:
        return run_llm(p, dtype, collect_components);
    }
  } catch (const c10::Error& e) {
    rethrow_as_input_error(e, where);
  } catch (const InputError& e) {
    throw InputError(where + ": " + e.what());
  } catch (const std::runtime_error& e) {  // c10's checked_convert: a value beyond the dtype's range
    if (std::string(e.what()).rfind("value cannot be converted to type", 0) != 0) throw;
    throw InputError(where + ": LibTorch rejected the problem: " + e.what());
  }
  return {};
}

}  // namespace tparity
