#include "tparity/harness/hand.hpp"

#include <cmath>
#include <functional>
#include <memory>
#include <stdexcept>

#include "tparity/core/attention.hpp"
#include "tparity/core/book.hpp"
#include "tparity/core/decoder.hpp"
#include "tparity/core/encoder.hpp"
#include "tparity/core/models.hpp"
#include "tparity/harness/book.hpp"
#include "tparity/harness/llm.hpp"

namespace tparity {

namespace {

// Records every component; with a teacher, then overwrites it with the teacher's value so that the
// ops downstream compute from the reference's inputs.
template <class T>
class Collect final : public Observer<T> {
 public:
  Collect(Components& out, const Components* teacher) : out_(out), teacher_(teacher) {}
  void on(const std::string& name, Tensor<T>& value) override {
    out_.push_back({name, cast<double>(value)});
    if (!teacher_) return;
    const Tensor<double>* ref = find(*teacher_, name);
    if (!ref) return;
    if (ref->shape != value.shape)
      throw std::logic_error("teacher forcing: component " + name + " has shape " + to_string(ref->shape) +
                             " in the reference, " + to_string(value.shape) + " in the hand core");
    for (size_t i = 0; i < value.data.size(); ++i) value.data[i] = static_cast<T>(ref->data[i]);
  }

 private:
  Components& out_;
  const Components* teacher_;
};

// Set while run_hand(Problem&&) runs: each weight and input is released as soon as it is converted.
thread_local bool t_release = false;

// t in the core's type; released (under t_release) once converted. A tensor read twice in a released
// run is this file's bug, and said so rather than computed on an empty vector.
template <class T>
Tensor<T> converted(const DTensor& t, const std::string& name) {
  if (t_release && t.data.empty() && numel(t.shape) > 0)
    throw std::logic_error("run_hand(Problem&&): " + name + " read after it was released");
  Tensor<T> out = to_tensor<T>(t);
  if (t_release) Storage<double>().swap(const_cast<DTensor&>(t).data);  // the caller's Problem is not const
  return out;
}

template <class T>
Tensor<T> param(const Problem& p, const std::string& name) {
  auto it = p.state_dict.find(name);
  return it == p.state_dict.end() ? Tensor<T>() : converted<T>(it->second, "state_dict." + name);
}

template <class T>
MhaWeights<T> mha_weights(const Problem& p, const std::string& prefix) {
  MhaWeights<T> w;
  w.in_proj_weight = param<T>(p, prefix + "in_proj_weight");
  w.q_proj_weight = param<T>(p, prefix + "q_proj_weight");
  w.k_proj_weight = param<T>(p, prefix + "k_proj_weight");
  w.v_proj_weight = param<T>(p, prefix + "v_proj_weight");
  w.in_proj_bias = param<T>(p, prefix + "in_proj_bias");
  w.bias_k = param<T>(p, prefix + "bias_k");
  w.bias_v = param<T>(p, prefix + "bias_v");
  w.out_proj_weight = param<T>(p, prefix + "out_proj.weight");
  w.out_proj_bias = param<T>(p, prefix + "out_proj.bias");
  return w;
}

template <class T>
EncoderWeights<T> encoder_weights(const Problem& p, const std::string& prefix) {
  EncoderWeights<T> w;
  w.self_attn = mha_weights<T>(p, prefix + "self_attn.");
  w.linear1_weight = param<T>(p, prefix + "linear1.weight");
  w.linear1_bias = param<T>(p, prefix + "linear1.bias");
  w.linear2_weight = param<T>(p, prefix + "linear2.weight");
  w.linear2_bias = param<T>(p, prefix + "linear2.bias");
  w.norm1_weight = param<T>(p, prefix + "norm1.weight");
  w.norm1_bias = param<T>(p, prefix + "norm1.bias");
  w.norm2_weight = param<T>(p, prefix + "norm2.weight");
  w.norm2_bias = param<T>(p, prefix + "norm2.bias");
  return w;
}

template <class T>
Tensor<T> input(const Problem& p, const std::string& name) {
  const DTensor* t = p.input(name);
  return t ? converted<T>(*t, "inputs." + name) : Tensor<T>();
}

template <class T>
std::vector<EncoderWeights<T>> stack_weights(const Problem& p, int64_t num_layers) {
  std::vector<EncoderWeights<T>> layers;
  for (int64_t i = 0; i < num_layers; ++i) layers.push_back(encoder_weights<T>(p, "layers." + std::to_string(i) + "."));
  return layers;
}

// The book's classes' parameters: one set of projections (heads.N. for each of the wrapper's heads).
template <class T>
BookWeights<T> book_weights(const Problem& p) {
  const BookConfig& c = p.book;
  BookWeights<T> w;
  const bool v1 = c.cls == BookClass::SelfAttentionV1;
  const int64_t sets = c.cls == BookClass::MultiHeadAttentionWrapper ? c.num_heads : 1;
  for (int64_t h = 0; h < sets; ++h) {
    const std::string pre = c.cls == BookClass::MultiHeadAttentionWrapper ? "heads." + std::to_string(h) + "." : "";
    auto weight = [&](const char* n) { return param<T>(p, pre + n + (v1 ? "" : ".weight")); };
    auto bias = [&](const char* n) { return param<T>(p, pre + n + ".bias"); };
    w.heads.push_back({weight("W_query"), weight("W_key"), weight("W_value"), bias("W_query"), bias("W_key"),
                       bias("W_value"), param<T>(p, pre + "mask")});
  }
  w.out_proj_weight = param<T>(p, "out_proj.weight");
  w.out_proj_bias = param<T>(p, "out_proj.bias");
  return w;
}

// Token ids as int64; a value that is not an integer id (a problem built by hand and never
// validated) is refused rather than cast.
Tensor<int64_t> ids(const Problem& p, const std::string& name) {
  const DTensor* t = p.input(name);
  if (!t) throw std::invalid_argument(name + ": missing");
  Tensor<int64_t> out;
  out.shape = t->shape;
  for (double x : t->data) {
    if (!(x == std::floor(x)) || std::fabs(x) > 0x1p53)
      throw std::invalid_argument(name + ": expected integer token ids, got " + std::to_string(x));
    out.data.push_back(int64_t(x));
  }
  return out;
}

template <class T>
RunResult run(const Problem& p, bool collect, const Components* teacher) {
  RunResult r;
  Collect<T> collector(r.components, teacher);
  Observer<T>* obs = collect ? &collector : nullptr;
  switch (module_handler(p.module)) {
    case ModuleHandler::MultiheadAttention: {
      MhaInputs<T> in{input<T>(p, "query"), input<T>(p, "key"), input<T>(p, "value"), to_mask<T>(p.input("attn_mask")),
                      to_mask<T>(p.input("key_padding_mask"))};
      MhaOutputs<T> out = mha_forward(p.mha, p.forward, mha_weights<T>(p, ""), in, obs);
      r.outputs["output"] = to_dtensor(out.output);
      if (p.forward.need_weights) r.outputs["attn_weights"] = to_dtensor(out.attn_weights);
      break;
    }
    case ModuleHandler::TransformerEncoderLayer: {
      EncoderInputs<T> in{input<T>(p, "src"), to_mask<T>(p.input("src_mask")),
                          to_mask<T>(p.input("src_key_padding_mask"))};
      r.outputs["output"] = to_dtensor(encoder_layer_forward(p.encoder, encoder_weights<T>(p, ""), in, obs));
      break;
    }
    case ModuleHandler::TransformerEncoder: {
      EncoderStackWeights<T> w;
      for (int64_t i = 0; i < p.num_layers; ++i)
        w.layers.push_back(encoder_weights<T>(p, "layers." + std::to_string(i) + "."));
      w.norm_weight = param<T>(p, "norm.weight");
      w.norm_bias = param<T>(p, "norm.bias");
      EncoderInputs<T> in{input<T>(p, "src"), to_mask<T>(p.input("mask")), to_mask<T>(p.input("src_key_padding_mask"))};
      r.outputs["output"] =
          to_dtensor(encoder_forward(EncoderStackConfig{p.encoder, p.num_layers, p.final_norm}, w, in, obs));
      break;
    }
    case ModuleHandler::TransformerDecoderLayer: {
      DecoderWeights<T> w;
      w.self_attn = mha_weights<T>(p, "self_attn.");
      w.multihead_attn = mha_weights<T>(p, "multihead_attn.");
      w.linear1_weight = param<T>(p, "linear1.weight");
      w.linear1_bias = param<T>(p, "linear1.bias");
      w.linear2_weight = param<T>(p, "linear2.weight");
      w.linear2_bias = param<T>(p, "linear2.bias");
      w.norm1_weight = param<T>(p, "norm1.weight");
      w.norm1_bias = param<T>(p, "norm1.bias");
      w.norm2_weight = param<T>(p, "norm2.weight");
      w.norm2_bias = param<T>(p, "norm2.bias");
      w.norm3_weight = param<T>(p, "norm3.weight");
      w.norm3_bias = param<T>(p, "norm3.bias");
      DecoderInputs<T> in{input<T>(p, "tgt"),
                          input<T>(p, "memory"),
                          to_mask<T>(p.input("tgt_mask")),
                          to_mask<T>(p.input("memory_mask")),
                          to_mask<T>(p.input("tgt_key_padding_mask")),
                          to_mask<T>(p.input("memory_key_padding_mask"))};
      r.outputs["output"] = to_dtensor(decoder_layer_forward(p.encoder, w, in, obs));
      break;
    }
    case ModuleHandler::ScaledDotProductAttention: {
      // scaled_dot_product_attention's bool attn_mask is true where a key takes part: the core's is
      // true where it is masked out.
      Mask<T> mask = to_mask<T>(p.input("attn_mask"));
      if (mask.is_bool())
        for (uint8_t& b : mask.bools.data) b = !b;
      r.outputs["output"] = to_dtensor(sdpa_forward(input<T>(p, "query"), input<T>(p, "key"), input<T>(p, "value"),
                                                    mask, obs, p.semantics.value_or(TorchSemantics::Torch113), p.sdpa));
      break;
    }
    case ModuleHandler::TokenEncoder: {
      TokenEncoderWeights<T> w{param<T>(p, "embedding.weight"), stack_weights<T>(p, p.token.num_layers)};
      r.outputs["output"] = to_dtensor(token_encoder_forward(p.token, w, ids(p, "tokens"), obs));
      break;
    }
    case ModuleHandler::ViT: {
      VitWeights<T> w;
      w.layers = stack_weights<T>(p, p.vit.num_layers);
      for (size_t i = 0; i + 1 < p.vit.head.size(); ++i) {
        const std::string pre = "head." + std::to_string(i) + ".";
        w.head.push_back({param<T>(p, pre + "linear.weight"), param<T>(p, pre + "linear.bias"),
                          param<T>(p, pre + "bn.weight"), param<T>(p, pre + "bn.bias"),
                          param<T>(p, pre + "bn.running_mean"), param<T>(p, pre + "bn.running_var")});
      }
      w.out_weight = param<T>(p, "head.out.weight");
      w.out_bias = param<T>(p, "head.out.bias");
      r.outputs["output"] = to_dtensor(vit_forward(p.vit, w, input<T>(p, "image"), obs));
      break;
    }
    case ModuleHandler::Matmul:
      r.outputs["output"] = to_dtensor(matmul(input<T>(p, "input"), input<T>(p, "other"), obs));
      break;
    case ModuleHandler::Softmax:
      r.outputs["output"] = to_dtensor(softmax_lastdim(input<T>(p, "input"), obs));
      break;
    case ModuleHandler::LayerNorm: {
      const Tensor<T> x = input<T>(p, "input");
      if (x.dim() < 1 || x.size(-1) != p.normalized)
        throw ShapeError("input: expected last dim normalized_shape = " + std::to_string(p.normalized) +
                         ", got shape " + to_string(x.shape));
      r.outputs["output"] = to_dtensor(layer_norm_lastdim(x, param<T>(p, "weight"), param<T>(p, "bias"), p.eps, obs));
      break;
    }
    case ModuleHandler::Book:
      r.outputs["output"] = to_dtensor(book_attention_forward(p.book, book_weights<T>(p), input<T>(p, "x"), obs));
      break;
    case ModuleHandler::Llm:
      r.outputs["output"] = to_dtensor(run_llm<T>(p, obs));
      break;
  }
  return r;
}

// The forward pass of the transformer modules with weights and inputs converted once, for timing.
template <class T>
std::function<void()> prepare(const Problem& p) {
  switch (module_handler(p.module)) {
    case ModuleHandler::MultiheadAttention: {
      auto w = std::make_shared<MhaWeights<T>>(mha_weights<T>(p, ""));
      auto in = std::make_shared<MhaInputs<T>>(MhaInputs<T>{input<T>(p, "query"), input<T>(p, "key"),
                                                            input<T>(p, "value"), to_mask<T>(p.input("attn_mask")),
                                                            to_mask<T>(p.input("key_padding_mask"))});
      const MhaConfig c = p.mha;
      const MhaForward f = p.forward;
      return [c, f, w, in] { (void)mha_forward(c, f, *w, *in); };
    }
    case ModuleHandler::TransformerEncoderLayer: {
      auto w = std::make_shared<EncoderWeights<T>>(encoder_weights<T>(p, ""));
      auto in = std::make_shared<EncoderInputs<T>>(EncoderInputs<T>{input<T>(p, "src"), to_mask<T>(p.input("src_mask")),
                                                                    to_mask<T>(p.input("src_key_padding_mask"))});
      const EncoderConfig c = p.encoder;
      return [c, w, in] { (void)encoder_layer_forward(c, *w, *in); };
    }
    case ModuleHandler::Llm:
      return prepare_llm<T>(p);
    case ModuleHandler::TransformerEncoder:
    case ModuleHandler::TransformerDecoderLayer:
    case ModuleHandler::ScaledDotProductAttention:
    case ModuleHandler::TokenEncoder:
    case ModuleHandler::ViT:
    case ModuleHandler::Matmul:
    case ModuleHandler::Softmax:
    case ModuleHandler::LayerNorm:
    case ModuleHandler::Book:
      break;
  }
  const Problem copy = p;  // converted at every call: fine where nobody times it
  return [copy] { (void)run<T>(copy, false, nullptr); };
}

}  // namespace

void check_inputs(const Problem& p, const std::string& where) { (void)run_hand(p, DType::Float64, false, where); }

std::function<void()> prepare_hand(const Problem& p, DType dtype, const std::string& where, bool run_once) {
  try {
    std::function<void()> f = dtype == DType::Float32 ? prepare<float>(p) : prepare<double>(p);
    if (run_once) f();  // so that shape errors surface here, as InputError
    return f;
  } catch (const ShapeError& e) {
    throw InputError(where + ": " + e.what());
  } catch (const std::invalid_argument& e) {
    throw InputError(where + ": " + e.what());
  }
}

RunResult run_hand(const Problem& p, DType dtype, bool collect_components, const std::string& where,
                   const Components* teacher) {
  if (dtype != DType::Float32 && dtype != DType::Float64)
    throw std::logic_error("run_hand: the hand core computes in float32 or float64, not " + dtype_name(dtype));
  try {
    return dtype == DType::Float32 ? run<float>(p, collect_components || teacher, teacher)
                                   : run<double>(p, collect_components || teacher, teacher);
  } catch (const ShapeError& e) {
    // The core names the tensor ("query: ...", "state_dict.x: ..."); say where it came from.
    const std::string what = e.what();
    const bool is_input = what.rfind("state_dict.", 0) != 0 && what.rfind("config", 0) != 0;
    throw InputError(where + ": " + (is_input ? "inputs." : "") + what);
  } catch (const std::invalid_argument& e) {
    throw InputError(where + ": inputs." + e.what());
  }
}

RunResult run_hand(Problem&& p, DType dtype, const std::string& where) {
  struct Release {
    bool before = t_release;
    Release() { t_release = true; }
    ~Release() { t_release = before; }
  } release;
  return run_hand(p, dtype, false, where);
}

namespace {

// An encoder layer's components in dataflow order, or a decoder layer's (cross = true).
std::vector<std::string> layer_components(bool norm_first, bool cross) {
  auto attention = [](const std::string& p, const std::string& out) {
    return std::vector<std::string>{p + "q", p + "k", p + "v", p + "scores", p + "attn_weights", p + "context", out};
  };
  std::vector<std::vector<std::string>> blocks{attention("sa.", "sa_output")};
  if (cross) blocks.push_back(attention("ca.", "ca_output"));
  blocks.push_back({"ffn_hidden", "ffn_output"});
  std::vector<std::string> n;
  for (size_t b = 0; b < blocks.size(); ++b) {
    const std::string norm = "norm" + std::to_string(b + 1);
    if (norm_first) n.push_back(norm);
    n.insert(n.end(), blocks[b].begin(), blocks[b].end());
    if (!norm_first && b + 1 < blocks.size()) n.push_back(norm);  // the last post-norm is the output
  }
  n.push_back("output");
  return n;
}

}  // namespace

std::vector<std::string> component_names(const Problem& p) {
  switch (module_handler(p.module)) {
    case ModuleHandler::MultiheadAttention: {
      std::vector<std::string> n{"q", "k", "v", "scores", "attn_weights"};
      if (p.forward.need_weights && p.forward.average_attn_weights) n.push_back("attn_weights_avg");
      n.insert(n.end(), {"context", "output"});
      return n;
    }
    case ModuleHandler::TransformerEncoderLayer:
      return layer_components(p.encoder.norm_first, false);
    case ModuleHandler::TransformerEncoder: {
      std::vector<std::string> n;
      for (int64_t i = 0; i < p.num_layers; ++i)
        for (const std::string& c : layer_components(p.encoder.norm_first, false))
          n.push_back("layers." + std::to_string(i) + "." + c);
      if (p.final_norm) n.push_back("norm");
      n.push_back("output");
      return n;
    }
    case ModuleHandler::TransformerDecoderLayer:
      return layer_components(p.encoder.norm_first, true);
    case ModuleHandler::ScaledDotProductAttention:
      return {"scores", "attn_weights", "output"};
    case ModuleHandler::TokenEncoder:
    case ModuleHandler::ViT: {
      const bool vit = p.module == ModuleKind::ViT;
      std::vector<std::string> n{vit ? "patches" : "embedding", "pos_encoding"};
      const int64_t layers = vit ? p.vit.num_layers : p.token.num_layers;
      const bool norm_first = vit ? p.vit.layer.norm_first : p.token.layer.norm_first;
      for (int64_t i = 0; i < layers; ++i)
        for (const std::string& c : layer_components(norm_first, false))
          n.push_back("layers." + std::to_string(i) + "." + c);
      if (!vit) {
        n.push_back("output");
        return n;
      }
      for (size_t i = 0; i + 1 < p.vit.head.size(); ++i)
        for (const char* c : {"linear", "bn", "act"}) n.push_back("head." + std::to_string(i) + "." + c);
      n.push_back("output");
      return n;
    }
    case ModuleHandler::Matmul:
    case ModuleHandler::Softmax:
      return {"output"};
    case ModuleHandler::LayerNorm:
      return {"mean", "rstd", "output"};
    case ModuleHandler::Book:
      return book_component_names(p);
    case ModuleHandler::Llm:
      return llm_component_names(p);
  }
  return {};
}

}  // namespace tparity
