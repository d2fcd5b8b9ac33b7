"""tparity's exec protocol from Python: read a problem file, write an outputs file.

`tparity exec -- CMD ARGS` runs CMD once per case and precision with a problem file (tparity's fixture
format, versions 1 and 2: README "Fixture format"), the path of the outputs file to write and the
dtype ("float32" or "float64"; "bfloat16" or "float16" when asked for with --dtype). Standard library
and numpy only.

    import sys
    import numpy as np
    import tparity_io

    problem_path, out_path, dtype = sys.argv[1:4]
    p = tparity_io.load_problem(problem_path)           # p.module, p.config, p.state_dict, p.inputs, ...
    if p.module != "Softmax":
        tparity_io.write_unsupported(out_path, "only Softmax is implemented")
        sys.exit(0)
    x = p.inputs["input"].astype(dtype)                  # stored values are exact in float32 too
    e = np.exp(x - x.max(axis=-1, keepdims=True))
    tparity_io.write_outputs(out_path, dtype, {"output": e / e.sum(axis=-1, keepdims=True)})

Tensors are numpy arrays in their stored dtype (float64, float32, bool, int64). Malformed input raises
ValueError naming the file and the field, e.g. `f.json: state_dict.out_proj.bias.data: expected 16
values (the product of shape [16]), got 15`.
"""

import json
import math
import os
import stat
import tempfile
from dataclasses import dataclass, field

import numpy as np

_DTYPES = {"float32": np.float32, "float64": np.float64, "bool": np.bool_, "int64": np.int64}
_NONFINITE = {"inf": math.inf, "-inf": -math.inf, "nan": math.nan}
# safetensors dtypes and their sizes; a field may name the four that are tparity dtypes, as (code, numpy)
_ST_SIZES = {"F64": 8, "F32": 4, "F16": 2, "BF16": 2, "I64": 8, "I32": 4, "I16": 2, "I8": 1, "U8": 1, "BOOL": 1}
_ST_OF = {"float64": ("F64", "<f8"), "float32": ("F32", "<f4"), "bool": ("BOOL", "u1"), "int64": ("I64", "<i8")}
_MAX_HEADER = 100 << 20
_MAPS = ("state_dict", "inputs", "outputs", "outputs_float32", "components", "components_float32")
_FIELDS = {1: {"format", "version", "name", "module", "config", "forward", "description"} | set(_MAPS[:4])}
_FIELDS[2] = _FIELDS[1] | {"reference", "tensor_file"} | set(_MAPS[4:])


@dataclass
class Problem:
    """One case: the module, its constructor arguments, weights and inputs, and the reference's results.
    Each tensor map is name -> numpy array in the stored dtype; absent maps are empty."""
    path: str
    name: str
    module: str
    config: dict
    forward: dict
    reference: dict  # what produced the stored results, every value a string; {} in version 1
    description: str = ""
    state_dict: dict = field(default_factory=dict)
    inputs: dict = field(default_factory=dict)
    outputs: dict = field(default_factory=dict)
    outputs_float32: dict = field(default_factory=dict)
    components: dict = field(default_factory=dict)
    components_float32: dict = field(default_factory=dict)
    tensor_file: str = ""  # the safetensors file beside it that held its tensors, when one did


def _unique_keys(pairs):
    """json's object_pairs_hook: a repeated key is an error, not "the last one wins"."""
    out = {}
    for k, v in pairs:
        if k in out:
            raise ValueError(f"repeated key {json.dumps(k)}")
        out[k] = v
    return out


_MAX_DEPTH = 64  # levels of nested arrays and objects, as tparity's own reader allows
_MAX_JSON_BYTES = 4 << 30


def _depth_ok(doc):
    """Whether doc nests at most _MAX_DEPTH levels of arrays and objects (iteratively: no recursion)."""
    stack = [(doc, 1)]
    while stack:
        v, d = stack.pop()
        if isinstance(v, (dict, list)):
            if d > _MAX_DEPTH:
                return False
            stack.extend((c, d + 1) for c in (v.values() if isinstance(v, dict) else v))
    return True


def _read_regular(path, what):
    """The bytes of the regular file at path, opened without following a link and without blocking (a FIFO
    is refused at once instead of hanging the reader): ValueError for a link, a FIFO, a directory or a device."""
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC | os.O_NOCTTY)
    except OSError as e:
        if os.path.islink(path):
            raise ValueError(f"{path}: cannot read {what}: it is a symbolic link (name the file itself)") from None
        raise ValueError(f"{path}: cannot read {what}: {e.strerror}") from None
    try:
        mode = os.fstat(fd).st_mode
        if not stat.S_ISREG(mode):
            kind = ("a directory" if stat.S_ISDIR(mode) else "a FIFO" if stat.S_ISFIFO(mode)
                    else "a device" if stat.S_ISCHR(mode) or stat.S_ISBLK(mode) else "not a regular file")
            raise ValueError(f"{path}: cannot read {what}: it is {kind}, not a regular file")
        if os.fstat(fd).st_size > _MAX_JSON_BYTES and what == "problem file":
            raise ValueError(f"{path}: cannot read {what}: expected at most {_MAX_JSON_BYTES} bytes")
        with os.fdopen(fd, "rb", closefd=False) as f:
            return f.read()
    except OSError as e:
        raise ValueError(f"{path}: cannot read {what}: {e.strerror}") from None
    finally:
        os.close(fd)


def _no_constant(name):
    raise ValueError(f"{name} is not JSON (non-finite values are the strings \"inf\", \"-inf\", \"nan\")")


def _short(e, n=200):
    """An exception's message for one line: control characters escaped, cut to n characters."""
    text = str(e).encode("unicode_escape").decode("ascii")
    return text if len(text) <= n else text[:n] + "..."


class _Reader:
    """Reads the parts of one problem file; every failure names the file and the field."""

    def __init__(self, path):
        self.path = path
        self.st = None  # the tensor_file: (its bytes, {name: (dtype, shape, begin)}), when there is one
        self.referenced = set()

    def fail(self, where, what):
        raise ValueError(f"{self.path}: {_short(where)}: {_short(what, 700)}")

    def obj(self, v, where):
        if not isinstance(v, dict):
            self.fail(where, f"expected an object, got {type(v).__name__}")
        return v

    def string(self, v, where):
        if not isinstance(v, str):
            self.fail(where, f"expected a string, got {type(v).__name__}")
        return v

    def tensor(self, t, where):
        """T: {"dtype", "shape", "data"} inline, or {"dtype", "shape", "file"} in the tensor_file."""
        self.obj(t, where)
        if "file" in t and self.st is None:
            self.fail(where + ".file", "names a tensor, but the problem has no tensor_file")
        keys = {"dtype", "shape", "file" if "file" in t else "data"}
        if set(t) != keys:
            self.fail(where, f"expected exactly the keys {sorted(keys)}, got {sorted(t)}")
        dtype, shape = self.string(t["dtype"], where + ".dtype"), t["shape"]
        if dtype not in _DTYPES:
            self.fail(where + ".dtype", f"expected one of {', '.join(_DTYPES)}, got {json.dumps(dtype)}")
        if not isinstance(shape, list) or any(type(d) is not int or d < 0 for d in shape):
            self.fail(where + ".shape", f"expected an array of non-negative integers, got {json.dumps(shape)[:40]}")
        shape = tuple(shape)
        if "file" in t:
            return self.file_tensor(self.string(t["file"], where + ".file"), dtype, shape, where + ".file")
        data, n = t["data"], math.prod(shape)
        if not isinstance(data, list) or len(data) != n:
            got = f"{len(data)}" if isinstance(data, list) else type(data).__name__
            self.fail(where + ".data", f"expected {n} values (the product of shape {list(shape)}), got {got}")
        # JSON true/false for bool, integers for int64; numbers and "inf", "-inf", "nan" for floats
        ok = {"bool": lambda x: type(x) is bool, "int64": lambda x: type(x) is int}.get(
            dtype, lambda x: type(x) in (int, float) or (type(x) is str and x in _NONFINITE))
        if not all(map(ok, data)):
            i = next(i for i, x in enumerate(data) if not ok(x))
            self.fail(f"{where}.data[{i}]", f"expected a {dtype} value, got {json.dumps(data[i])[:40]}")
        strings = [i for i, x in enumerate(data) if type(x) is str] if dtype.startswith("float") else []
        try:
            a = np.array([0.0 if type(x) is str else x for x in data] if strings else data,
                         dtype=np.float64 if dtype.startswith("float") else _DTYPES[dtype])
        except OverflowError:
            self.fail(where + ".data", f"a value beyond the range of {dtype}")
        if a.dtype.kind == "f" and not np.isfinite(a).all():  # a number beyond double's range: 1e999
            self.fail(f"{where}.data[{np.flatnonzero(~np.isfinite(a))[0]}]", "expected a finite number")
        a[strings] = [_NONFINITE[data[i]] for i in strings]
        return a.astype(_DTYPES[dtype]).reshape(shape)  # float32: rounded to nearest, exact for stored values

    def file_tensor(self, name, dtype, shape, where):
        blob, entries = self.st
        if name not in entries:
            self.fail(where, f"expected the name of a tensor in the tensor_file, got {json.dumps(name)}")
        st_dtype, st_shape, begin = entries[name]
        if (st_dtype, st_shape) != (_ST_OF[dtype][0], shape):
            self.fail(where, f"expected {json.dumps(name)} to be {_ST_OF[dtype][0]} of shape {list(shape)} "
                             f"in the tensor_file, got {st_dtype} of shape {list(st_shape)}")
        self.referenced.add(name)
        a = np.frombuffer(blob, dtype=_ST_OF[dtype][1], count=math.prod(shape), offset=begin)
        return a.astype(_DTYPES[dtype]).reshape(shape)

    def tensors(self, v, where):
        return {k: self.tensor(t, f"{where}.{k}") for k, t in self.obj(v, where).items()}


def _read_safetensors(path):
    """The file's bytes and {name: (dtype, shape, absolute begin)}, validated whole first: the header,
    each entry's dtype, shape and byte range (numel x size), the ranges tiling the data, BOOL bytes 0/1."""
    def fail(what):
        raise ValueError(f"{path}: {what}")
    blob = _read_regular(path, "the tensor_file")
    n = int.from_bytes(blob[:8], "little") if len(blob) >= 8 else -1
    if not 0 <= n <= min(_MAX_HEADER, len(blob) - 8):
        fail(f"header length {n}: not within 100 MB and the file's {len(blob)} bytes")
    try:
        header = json.loads(blob[8:8 + n].decode("utf-8"), object_pairs_hook=_unique_keys)
    except (ValueError, RecursionError) as e:  # UnicodeDecodeError included; RecursionError: deep nesting
        fail(f"header: expected a JSON object: {_short(e)}")
    if not isinstance(header, dict):
        fail(f"header: expected a JSON object, got {type(header).__name__}")
    header.pop("__metadata__", None)
    entries, spans, base = {}, [], 8 + n
    for name, e in header.items():
        where = f"tensor {json.dumps(name)}"
        if not isinstance(e, dict) or set(e) != {"dtype", "shape", "data_offsets"}:
            fail(f"{where}: expected exactly dtype, shape and data_offsets")
        dtype, shape, offs = e["dtype"], e["shape"], e["data_offsets"]
        if dtype not in _ST_SIZES:
            fail(f"{where}: dtype: expected one of {', '.join(_ST_SIZES)}, got {json.dumps(dtype)}")
        if not isinstance(shape, list) or any(type(d) is not int or d < 0 for d in shape):
            fail(f"{where}: shape: expected non-negative integers, got {json.dumps(shape)}")
        size = math.prod(shape) * _ST_SIZES[dtype]
        if not (isinstance(offs, list) and len(offs) == 2 and all(type(o) is int for o in offs)) or \
                offs[1] - offs[0] != size:
            fail(f"{where}: data_offsets: expected [begin, begin + {size}] (shape {shape}, {dtype}), "
                 f"got {json.dumps(offs)}")
        entries[name] = (dtype, tuple(shape), base + offs[0])
        spans.append((offs[0], offs[1], where))
    end = 0
    for begin, stop, where in sorted(spans):
        if begin != end:
            fail(f"{where}: data_offsets: starts at {begin}, expected {end} (no overlap, no hole)")
        end = stop
    if base + end != len(blob):
        fail(f"the tensors end at byte {end} of the data, which has {len(blob) - base}")
    for name, (dtype, shape, begin) in entries.items():
        if dtype == "BOOL" and np.frombuffer(blob, np.uint8, math.prod(shape), begin).max(initial=0) > 1:
            fail(f"tensor {json.dumps(name)}: a BOOL byte other than 0 or 1")
    return blob, entries


def load_problem(path):
    """Read a problem (fixture) file and the safetensors file it names; see the module docstring."""
    r = _Reader(path)
    text = _read_regular(path, "problem file")
    try:
        doc = json.loads(text.decode("utf-8"), object_pairs_hook=_unique_keys, parse_constant=_no_constant)
    except RecursionError:
        raise ValueError(f"{path}: malformed JSON: nested deeper than Python's JSON reader goes") from None
    except ValueError as e:  # UnicodeDecodeError included
        raise ValueError(f"{path}: malformed JSON: {_short(e)}") from None
    if not _depth_ok(doc):
        raise ValueError(f"{path}: malformed JSON: expected at most {_MAX_DEPTH} levels of nested arrays and objects")
    r.obj(doc, "(top level)")
    if doc.get("format") != "tparity.fixture":
        r.fail("format", f"expected \"tparity.fixture\", got {json.dumps(doc.get('format'))}")
    version = doc.get("version")
    if type(version) is not int or version not in _FIELDS:
        r.fail("version", f"expected 1 or 2, got {json.dumps(version)}")
    for key in doc:
        if key not in _FIELDS[version]:
            r.fail(key, f"unknown field (version {version} has {', '.join(sorted(_FIELDS[version]))})")
    for key in ("name", "module", "config", "state_dict", "inputs") + (("reference",) if version == 2 else ()):
        if key not in doc:
            r.fail(key, "missing")
    reference = r.obj(doc.get("reference", {}), "reference")
    for k, v in reference.items():
        r.string(v, "reference." + k)
    if "tensor_file" in doc:
        name = r.string(doc["tensor_file"], "tensor_file")
        if not name or "/" in name or name in (".", ".."):
            r.fail("tensor_file", f"expected a file name beside the problem file, got {json.dumps(name)}")
        try:
            r.st = _read_safetensors(os.path.join(os.path.dirname(os.path.abspath(path)), name))
        except ValueError as e:
            r.fail("tensor_file", str(e))
    p = Problem(path=path, name=r.string(doc["name"], "name"), module=r.string(doc["module"], "module"),
                config=r.obj(doc["config"], "config"), forward=r.obj(doc.get("forward", {}), "forward"),
                reference=reference, description=r.string(doc.get("description", ""), "description"),
                tensor_file=doc.get("tensor_file", ""))
    for key in _MAPS:
        if key in doc:
            setattr(p, key, r.tensors(doc[key], key))
    unused = sorted(set(r.st[1]) - r.referenced) if r.st else []
    if unused:
        r.fail("tensor_file", f"tensor {json.dumps(unused[0])} is referred to by no field")
    return p


def round_bfloat16(a):
    """a rounded to the nearest bfloat16 (ties to even), as a float32 array: numpy has no bfloat16, and
    a bfloat16 is a float32 whose low 16 bits are zero."""
    bits = np.ascontiguousarray(a, dtype=np.float32).view(np.uint32)
    rounded = (bits + np.uint32(0x7FFF) + ((bits >> np.uint32(16)) & np.uint32(1))) & np.uint32(0xFFFF0000)
    out = np.where(np.isnan(a), bits, rounded).astype(np.uint32).view(np.float32)
    return out.reshape(np.shape(a))


def _temporary(path):
    """A new temporary file in path's directory: (its descriptor, its path)."""
    return tempfile.mkstemp(prefix=".tparity-", suffix=".tmp", dir=os.path.dirname(os.path.abspath(path)))


def _write_json(path, doc, tensor_file=None):
    """doc to path atomically: a temporary file in the same directory, then os.replace. With
    tensor_file (its path and bytes), that file is written the same way first, so that the JSON never
    names a tensor file that is not whole."""
    text = json.dumps(doc, separators=(",", ":"), allow_nan=False) + "\n"
    written = []
    try:
        for target, data in ([tensor_file] if tensor_file else []) + [(path, text.encode("utf-8"))]:
            fd, tmp = _temporary(target)
            written.append(tmp)
            with os.fdopen(fd, "wb") as f:
                f.write(data)
        for tmp, target in zip(written, ([tensor_file[0]] if tensor_file else []) + [path]):
            os.replace(tmp, target)
    except BaseException:
        for tmp in written:
            if os.path.exists(tmp):
                os.unlink(tmp)
        raise


def _checked(a, where, bfloat16):
    """a as a float array and its dtype's name ("bfloat16" for a bfloat16 run's float32 arrays, whose
    every value must be one)."""
    a = np.asarray(a)
    if a.dtype not in (np.float16, np.float32, np.float64):
        raise ValueError(f"{where}: expected a float16, float32 or float64 array, got {a.dtype}")
    if bfloat16 and a.dtype == np.float32:
        if not np.array_equal(a, round_bfloat16(a), equal_nan=True):
            raise ValueError(f"{where}: a bfloat16 run's float32 array holds values that are not bfloat16 "
                             f"(round them with tparity_io.round_bfloat16)")
        return a, "bfloat16"
    return a, a.dtype.name


def _tensor_json(a, where, bfloat16=False):
    """T inline, in the array's own dtype (float32 arrays as "bfloat16" in a bfloat16 run, where each
    value must be one); floats as Python floats (repr is exact, float32 and float16 values too)."""
    a, name = _checked(a, where, bfloat16)
    data = a.astype(np.float64).ravel().tolist()
    if not np.isfinite(a).all():
        data = [x if math.isfinite(x) else "nan" if x != x else "inf" if x > 0 else "-inf" for x in data]
    return {"dtype": name, "shape": list(a.shape), "data": data}


# A tensor's bytes in the safetensors file, by its tparity dtype: (safetensors dtype, little-endian bytes).
_ST_WRITE = {"float64": ("F64", lambda a: a.astype("<f8").tobytes()),
             "float32": ("F32", lambda a: a.astype("<f4").tobytes()),
             "float16": ("F16", lambda a: a.astype("<f2").tobytes()),
             # a bfloat16 value is a float32's high 16 bits (the low ones are zero: _checked); a NaN
             # whose payload lies in the low bits alone would become inf, so every NaN is bfloat16's own
             "bfloat16": ("BF16", lambda a: np.where(np.isnan(a), np.uint16(0x7FC0), (np.ascontiguousarray(
                 a, "<f4").view("<u4") >> 16).astype("<u2")).astype("<u2").tobytes())}


def _safetensors_bytes(tensors):
    """A safetensors file holding tensors, a list of (name, tparity dtype, array), in that order."""
    header, chunks, offset = {}, [], 0
    for name, dtype, a in tensors:
        code, to_bytes = _ST_WRITE[dtype]
        data = to_bytes(a)
        header[name] = {"dtype": code, "shape": list(a.shape), "data_offsets": [offset, offset + len(data)]}
        chunks.append(data)
        offset += len(data)
    text = json.dumps(header, separators=(",", ":")).encode("utf-8")
    text += b" " * (-len(text) % 8)  # the data starts 8-byte aligned, as the format's writers align it
    return len(text).to_bytes(8, "little") + text + b"".join(chunks)


def write_outputs(path, dtype, outputs, components=None, local=None, tensors="inline"):
    """Write {"format": "tparity.outputs", "version": 1, "dtype", "outputs", "components"?, "local"?}.
    Each map is name -> float array. Every tensor is written in its own dtype: a float64 array of a
    float32 run is written as float64, for tparity to see, not rounded here. A bfloat16 run's tensors
    are float32 arrays of bfloat16 values (round_bfloat16), a float16 run's numpy float16 arrays.
    tensors="safetensors" puts the arrays in a safetensors file beside path (its name with ".json"
    replaced by, or any other name followed by, ".safetensors") instead of inline JSON: a few times smaller and faster to write and read
    (as `tparity exec --tensors safetensors` hands problems over). The two files are written so that
    the JSON appears only once its tensor file is whole."""
    if dtype not in ("float32", "float64", "bfloat16", "float16"):
        raise ValueError(f"dtype: expected \"float32\", \"float64\", \"bfloat16\" or \"float16\", got {dtype!r}")
    if tensors not in ("inline", "safetensors"):
        raise ValueError(f"tensors: expected \"inline\" or \"safetensors\", got {tensors!r}")
    if "output" not in outputs:
        raise ValueError("outputs: expected an \"output\" entry")
    doc = {"format": "tparity.outputs", "version": 1, "dtype": dtype}
    stored = []  # (name in the tensor file, dtype, array)
    for key, group in (("outputs", outputs), ("components", components), ("local", local)):
        if group is None:
            continue
        doc[key] = {}
        for name, a in group.items():
            where = f"{key}.{name}"
            if tensors == "inline":
                doc[key][name] = _tensor_json(a, where, dtype == "bfloat16")
                continue
            a, kind = _checked(a, where, dtype == "bfloat16")
            stored.append((where, kind, a))
            doc[key][name] = {"dtype": kind, "shape": list(a.shape), "file": where}
    tensor_file = None
    if tensors == "safetensors":
        # As tparity names the tensor file beside a JSON: ".json" replaced, any other name extended (an
        # outputs path "case.out" must not take the "case.safetensors" of a problem "case.json").
        full = os.path.abspath(path)
        st_path = (full[:-5] if full.endswith(".json") and len(os.path.basename(full)) > 5 else full) + ".safetensors"
        doc["tensor_file"] = os.path.basename(st_path)
        tensor_file = (st_path, _safetensors_bytes(stored))
    _write_json(path, doc, tensor_file)


def write_unsupported(path, why):
    """Write {"format": "tparity.outputs", "version": 1, "unsupported": why}, why on one line."""
    why = " ".join(str(why).split())
    if not why:
        raise ValueError("why: expected a reason, got an empty string")
    _write_json(path, {"format": "tparity.outputs", "version": 1, "unsupported": why})
