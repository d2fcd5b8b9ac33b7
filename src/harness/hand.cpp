#include "tparity/harness/hand.hpp"

#include <stdexcept>

#include "tparity/core/attention.hpp"
#include "tparity/core/encoder.hpp"

namespace tparity {

const Tensor<double>* find(const Components& c, const std::string& name) {
  for (const Component& x : c)
    if (x.name == name) return &x.value;
  return nullptr;
}

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

template <class T>
Tensor<T> param(const Problem& p, const std::string& name) {
  auto it = p.state_dict.find(name);
  return it == p.state_dict.end() ? Tensor<T>() : to_tensor<T>(it->second);
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
Tensor<T> input(const Problem& p, const std::string& name) {
  const DTensor* t = p.input(name);
  return t ? to_tensor<T>(*t) : Tensor<T>();
}

template <class T>
RunResult run(const Problem& p, bool collect, const Components* teacher) {
  RunResult r;
  Collect<T> collector(r.components, teacher);
  Observer<T>* obs = collect ? &collector : nullptr;
  switch (p.module) {
    case ModuleKind::MultiheadAttention: {
      MhaInputs<T> in{input<T>(p, "query"), input<T>(p, "key"), input<T>(p, "value"), to_mask<T>(p.input("attn_mask")),
                      to_mask<T>(p.input("key_padding_mask"))};
      MhaOutputs<T> out = mha_forward(p.mha, p.forward, mha_weights<T>(p, ""), in, obs);
      r.outputs["output"] = to_dtensor(out.output);
      if (p.forward.need_weights) r.outputs["attn_weights"] = to_dtensor(out.attn_weights);
      break;
    }
    case ModuleKind::TransformerEncoderLayer: {
      EncoderWeights<T> w;
      w.self_attn = mha_weights<T>(p, "self_attn.");
      w.linear1_weight = param<T>(p, "linear1.weight");
      w.linear1_bias = param<T>(p, "linear1.bias");
      w.linear2_weight = param<T>(p, "linear2.weight");
      w.linear2_bias = param<T>(p, "linear2.bias");
      w.norm1_weight = param<T>(p, "norm1.weight");
      w.norm1_bias = param<T>(p, "norm1.bias");
      w.norm2_weight = param<T>(p, "norm2.weight");
      w.norm2_bias = param<T>(p, "norm2.bias");
      EncoderInputs<T> in{input<T>(p, "src"), to_mask<T>(p.input("src_mask")),
                          to_mask<T>(p.input("src_key_padding_mask"))};
      r.outputs["output"] = to_dtensor(encoder_layer_forward(p.encoder, w, in, obs));
      break;
    }
    case ModuleKind::ScaledDotProductAttention: {
      r.outputs["output"] = to_dtensor(sdpa_forward(input<T>(p, "query"), input<T>(p, "key"), input<T>(p, "value"),
                                                    to_mask<T>(p.input("attn_mask")), obs));
      break;
    }
  }
  return r;
}

}  // namespace

RunResult run_hand(const Problem& p, DType dtype, bool collect_components, const std::string& where,
                   const Components* teacher) {
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

std::vector<std::string> component_names(const Problem& p) {
  switch (p.module) {
    case ModuleKind::MultiheadAttention: {
      std::vector<std::string> n{"q", "k", "v", "scores", "attn_weights"};
      if (p.forward.need_weights && p.forward.average_attn_weights) n.push_back("attn_weights_avg");
      n.insert(n.end(), {"context", "output"});
      return n;
    }
    case ModuleKind::TransformerEncoderLayer: {
      const std::vector<std::string> sa{"sa.q",       "sa.k",     "sa.v", "sa.scores", "sa.attn_weights",
                                        "sa.context", "sa_output"};
      std::vector<std::string> n;
      if (p.encoder.norm_first) {
        n.push_back("norm1");
        n.insert(n.end(), sa.begin(), sa.end());
        n.push_back("norm2");
      } else {
        n.insert(n.end(), sa.begin(), sa.end());
        n.push_back("norm1");
      }
      n.insert(n.end(), {"ffn_hidden", "ffn_output", "output"});
      return n;
    }
    case ModuleKind::ScaledDotProductAttention:
      return {"scores", "attn_weights", "output"};
  }
  return {};
}

}  // namespace tparity
