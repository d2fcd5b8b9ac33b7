#!/usr/bin/env python3
"""Writes the fuzzer's seed corpus, tests/fuzz/corpus: fixtures of every module fixture format v1
knows, at the smallest sizes (embed_dim 2), and malformed variants of them, each a few hundred bytes.
The values are arbitrary (the reader checks names, shapes and dtypes, not what PyTorch would give).
Run it from anywhere after changing it; scripts/fuzz only reads the corpus (it fuzzes a copy).
The regress_*.json files beside them are inputs the fuzzer found a bug with, kept as it wrote them
(each has a test in tests/test_fixture.cpp); this script leaves them alone, and the seeds of the
other kinds and files the target reads too:
  problem_*.json      every other module kind at small sizes, the LLM blocks' and the book classes'
                      config readers among them: `tparity export --case NAME --no-components` with
                      small sizes (llama: --batch 1 --seq 3 --dim 4 --heads 2 --kv-heads 1 --ffn 4;
                      gpt2: --batch 1 --seq 3 --dim 4 --heads 2 --ffn 4; book_mha: --batch 1 --seq 2;
                      sdpa: --batch 1 --seq 2 --kv-seq 2 --dim 2 --value-dim 2; softmax: --batch 1
                      --seq 2 --kv-seq 2; layernorm: --batch 1 --seq 2 --dim 2; selfattn_v1)
  outputs_sdpa.json   `tparity eval --fixture problem_sdpa.json --dtype float64 --tensors inline`
  baseline_small.json the first six entries of fixtures/baseline.json with its environment"""
import json
import os

OUT = os.path.join(os.path.dirname(os.path.abspath(__file__)), "corpus")


def tensor(shape, dtype="float32", fill=None):
    n = 1
    for d in shape:
        n *= d
    if fill is not None:
        data = [fill[i % len(fill)] for i in range(n)]
    elif dtype == "bool":
        data = [i % 3 == 0 for i in range(n)]
    else:
        data = [round(0.25 * (i % 7) - 0.5, 3) for i in range(n)]
    return {"dtype": dtype, "shape": shape, "data": data}


def mha_state(e, kdim=None, vdim=None, bias=True, bias_kv=False, prefix=""):
    s = {}
    if (kdim or e) == e and (vdim or e) == e:
        s[prefix + "in_proj_weight"] = tensor([3 * e, e])
    else:
        s[prefix + "q_proj_weight"] = tensor([e, e])
        s[prefix + "k_proj_weight"] = tensor([e, kdim or e])
        s[prefix + "v_proj_weight"] = tensor([e, vdim or e])
    if bias:
        s[prefix + "in_proj_bias"] = tensor([3 * e], "float64")
    if bias_kv:
        s[prefix + "bias_k"] = tensor([1, 1, e])
        s[prefix + "bias_v"] = tensor([1, 1, e])
    s[prefix + "out_proj.weight"] = tensor([e, e])
    if bias:
        s[prefix + "out_proj.bias"] = tensor([e])
    return s


def layer_state(d, f, norms, prefix=""):
    s = {prefix + "linear1.weight": tensor([f, d]), prefix + "linear1.bias": tensor([f]),
         prefix + "linear2.weight": tensor([d, f]), prefix + "linear2.bias": tensor([d])}
    for i in range(1, norms + 1):
        s[f"{prefix}norm{i}.weight"] = tensor([d], fill=[1.0])
        s[f"{prefix}norm{i}.bias"] = tensor([d], fill=[0.0])
    return s


def fixture(name, module, config, state_dict, inputs, outputs, forward=None, **extra):
    doc = {"format": "tparity.fixture", "version": 1, "name": name, "module": module, "config": config,
           "forward": forward or {}, "state_dict": state_dict, "inputs": inputs, "outputs": outputs}
    doc.update(extra)
    return doc


def valid():
    d = {}
    d["mha_tiny"] = fixture(
        "mha_tiny", "MultiheadAttention",
        {"embed_dim": 2, "num_heads": 1, "bias": True, "add_bias_kv": False, "add_zero_attn": False,
         "kdim": 2, "vdim": 2, "batch_first": True, "dropout": 0.0},
        mha_state(2),
        {"query": tensor([1, 2, 2]), "key": tensor([1, 2, 2]), "value": tensor([1, 2, 2]),
         "attn_mask": tensor([2, 2], "bool")},
        {"output": tensor([1, 2, 2], "float64"), "attn_weights": tensor([1, 2, 2], "float64")},
        forward={"need_weights": True, "average_attn_weights": True},
        outputs_float32={"output": tensor([1, 2, 2]), "attn_weights": tensor([1, 2, 2])},
        description="MultiheadAttention, embed_dim 2, one head, a bool attn_mask")
    d["mha_kdim_vdim_bias_kv"] = fixture(
        "mha_kdim_vdim_bias_kv", "MultiheadAttention",
        {"embed_dim": 2, "num_heads": 2, "bias": False, "add_bias_kv": True, "add_zero_attn": True,
         "kdim": 1, "vdim": 3, "batch_first": False},
        mha_state(2, kdim=1, vdim=3, bias=False, bias_kv=True),
        {"query": tensor([2, 1, 2]), "key": tensor([3, 1, 1]), "value": tensor([3, 1, 3]),
         "key_padding_mask": tensor([1, 3], "float64", fill=[0.0, "-inf", "nan"])},
        {"output": tensor([2, 1, 2], fill=["inf", 0.5])},
        forward={"need_weights": False, "average_attn_weights": False})
    d["encoder_layer_tiny"] = fixture(
        "encoder_layer_tiny", "TransformerEncoderLayer",
        {"d_model": 2, "nhead": 1, "dim_feedforward": 3, "activation": "gelu", "layer_norm_eps": 1e-6,
         "batch_first": True, "norm_first": True, "dropout": 0.0},
        {**mha_state(2, prefix="self_attn."), **layer_state(2, 3, 2)},
        {"src": tensor([1, 2, 2]), "src_mask": tensor([2, 2], "bool"),
         "src_key_padding_mask": tensor([1, 2], "bool", fill=[False, True])},
        {"output": tensor([1, 2, 2])})
    d["encoder_stack_tiny"] = fixture(
        "encoder_stack_tiny", "TransformerEncoder",
        {"num_layers": 2, "norm": True, "d_model": 2, "nhead": 2, "dim_feedforward": 1, "activation": "relu",
         "batch_first": False},
        {**mha_state(2, prefix="layers.0.self_attn."), **layer_state(2, 1, 2, "layers.0."),
         **mha_state(2, prefix="layers.1.self_attn."), **layer_state(2, 1, 2, "layers.1."),
         "norm.weight": tensor([2], fill=[1.0]), "norm.bias": tensor([2], fill=[0.0])},
        {"src": tensor([2, 2]), "mask": tensor([2, 2], "float32", fill=[0.0, "-inf"])},
        {"output": tensor([2, 2])})
    d["decoder_layer_tiny"] = fixture(
        "decoder_layer_tiny", "TransformerDecoderLayer",
        {"d_model": 2, "nhead": 1, "dim_feedforward": 2, "batch_first": True},
        {**mha_state(2, prefix="self_attn."), **mha_state(2, prefix="multihead_attn."), **layer_state(2, 2, 3)},
        {"tgt": tensor([1, 1, 2]), "memory": tensor([1, 2, 2]), "tgt_mask": tensor([1, 1], "bool"),
         "memory_key_padding_mask": tensor([1, 2], "bool", fill=[False, True])},
        {"output": tensor([1, 1, 2])})
    return d


def malformed(v):
    """Each one fault the reader must name; keyed by what is wrong."""
    import copy
    m = {}

    def vary(base, name, edit):
        doc = copy.deepcopy(v[base])
        edit(doc)
        m[name] = doc

    vary("mha_tiny", "bad_format", lambda d: d.update(format="tparity.fixtures"))
    vary("mha_tiny", "bad_version", lambda d: d.update(version=2))
    vary("mha_tiny", "bad_module", lambda d: d.update(module="ViT"))
    vary("mha_tiny", "unknown_field", lambda d: d.update(extra=1))
    vary("mha_tiny", "missing_state", lambda d: d["state_dict"].pop("out_proj.bias"))
    vary("mha_tiny", "wrong_shape", lambda d: d["state_dict"].update({"out_proj.bias": tensor([3])}))
    vary("mha_tiny", "heads_not_divisor", lambda d: d["config"].update(num_heads=3))
    vary("mha_tiny", "negative_size", lambda d: d["inputs"]["query"].update(shape=[-1, 2, 2]))
    vary("mha_tiny", "data_length", lambda d: d["inputs"]["query"]["data"].pop())
    vary("mha_tiny", "huge_shape", lambda d: d["inputs"]["query"].update(shape=[65536, 65536, 65536]))
    vary("mha_tiny", "int64_dtype", lambda d: d["inputs"]["query"].update(dtype="int64"))
    vary("mha_tiny", "bool_in_float", lambda d: d["inputs"]["query"]["data"].__setitem__(0, True))
    vary("mha_tiny", "bad_special", lambda d: d["inputs"]["query"]["data"].__setitem__(0, "Infinity"))
    vary("mha_tiny", "float_in_bool", lambda d: d["inputs"]["attn_mask"]["data"].__setitem__(0, 1.5))
    vary("mha_tiny", "bool_output", lambda d: d["outputs"].update(output=tensor([1, 2, 2], "bool")))
    vary("mha_tiny", "missing_weights", lambda d: d["outputs"].pop("attn_weights"))
    vary("mha_tiny", "dropout", lambda d: d["config"].update(dropout=0.1))
    vary("mha_tiny", "unknown_input", lambda d: d["inputs"].update(src=tensor([1])))
    vary("encoder_layer_tiny", "bad_activation", lambda d: d["config"].update(activation="tanh"))
    vary("encoder_layer_tiny", "bad_eps", lambda d: d["config"].update(layer_norm_eps=-1))
    vary("encoder_stack_tiny", "zero_layers", lambda d: d["config"].update(num_layers=0))
    vary("decoder_layer_tiny", "string_size", lambda d: d["config"].update(d_model="2"))
    return m


def main():
    os.makedirs(OUT, exist_ok=True)
    v = valid()
    files = {k: json.dumps(doc, separators=(",", ":")) for k, doc in v.items()}
    files.update({"bad_" + k if not k.startswith("bad_") else k: json.dumps(doc, separators=(",", ":"))
                  for k, doc in malformed(v).items()})
    # Bare tensors, for tensor_from_json (the fuzz target decodes the top level and its members).
    files["tensor_specials"] = json.dumps(tensor([2, 3], "float64", fill=[1e308, "inf", "-inf", "nan", -0.0, 5e-324]))
    files["tensor_bool"] = json.dumps(tensor([0, 3], "bool"))
    files["tensor_scalar"] = json.dumps({"dtype": "float32", "shape": [], "data": [3.4028235e38]})
    # Not JSON, or not an object.
    files["bad_truncated"] = files["mha_tiny"][:200]
    files["bad_top_level"] = "[1, 2, 3]"
    files["bad_empty"] = ""
    for k, text in sorted(files.items()):
        with open(os.path.join(OUT, k + ".json"), "w") as f:
            f.write(text)


if __name__ == "__main__":
    main()
