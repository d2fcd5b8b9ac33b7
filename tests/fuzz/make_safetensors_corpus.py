#!/usr/bin/env python3
"""Writes the safetensors fuzzer's seed corpus, tests/fuzz/corpus_safetensors: small valid files (every
dtype tparity reads, a scalar, empty tensors, metadata, an unpadded odd-length header, an I64 beyond
2^53 that only tensor() refuses) and one malformed variant per rule of the reader
(src/fixture/safetensors.cpp), each a few hundred bytes. Python's standard library only.
Run it from anywhere after changing it; scripts/fuzz only reads the corpus (it fuzzes a copy)."""
import json
import os
import shutil
import struct

OUT = os.path.join(os.path.dirname(os.path.abspath(__file__)), "corpus_safetensors")

SIZE = {"F64": 8, "F32": 4, "F16": 2, "BF16": 2, "I64": 8, "I32": 4, "I16": 2, "I8": 1, "U8": 1, "BOOL": 1}
# A few little-endian values of each dtype, repeated to fill a tensor.
VALUES = {
    "F64": struct.pack("<4d", 0.1, -1e300, float("inf"), float("nan")),
    "F32": struct.pack("<4f", 0.25, -1.5, float("-inf"), 1e-45),
    "F16": bytes.fromhex("003c00c0ff7b0100007c007e"),  # 1, -2, 65504, 2^-24, inf, nan
    "BF16": bytes.fromhex("803fa0c04940807fc07f0100"),  # 1, -5, 3.140625, inf, nan, 2^-133
    "I64": struct.pack("<3q", 0, -1, 2**53),
    "I32": struct.pack("<3i", -2**31, 2**31 - 1, 7),
    "I16": struct.pack("<3h", -32768, 32767, 0),
    "I8": struct.pack("<3b", -128, 127, 1),
    "U8": bytes([0, 255, 17]),
    "BOOL": bytes([1, 0, 0, 1]),
}


def numel(shape):
    n = 1
    for d in shape:
        n *= d
    return n


def data(dtype, shape):
    n = numel(shape) * SIZE[dtype]
    v = VALUES[dtype]
    return (v * (n // len(v) + 1))[:n]


def layout(tensors, metadata=None):
    """(header dict, buffer) for [(name, dtype, shape)], the tensors in that order."""
    header, buf = {}, b""
    if metadata is not None:
        header["__metadata__"] = metadata
    for name, dtype, shape in tensors:
        d = data(dtype, shape)
        header[name] = {"dtype": dtype, "shape": shape, "data_offsets": [len(buf), len(buf) + len(d)]}
        buf += d
    return header, buf


def st_file(header, buf, pad=True):
    """The file for a header (a dict, or text as is) and a buffer; padded like the writers do."""
    text = header if isinstance(header, (str, bytes)) else json.dumps(header, separators=(",", ":"))
    text = text.encode() if isinstance(text, str) else text
    if pad:
        text += b" " * (-(8 + len(text)) % 8)
    return struct.pack("<Q", len(text)) + text + buf


def main():
    shutil.rmtree(OUT, ignore_errors=True)
    os.makedirs(OUT)
    files = {}

    # Valid.
    every = [(d.lower(), d, [2, 3]) for d in SIZE]
    files["ok_every_dtype"] = st_file(*layout(every, {"format": "pt"}))
    files["ok_scalar_and_empty"] = st_file(*layout([("s", "F32", []), ("e", "F64", [0, 3]), ("z", "BOOL", [0]),
                                                   ("w", "F64", [2])]))
    files["ok_no_tensors"] = st_file({}, b"")
    files["ok_metadata_only"] = st_file({"__metadata__": {"a": "b", "c": ""}}, b"")
    h, b = layout([("weight", "F32", [3, 1]), ("ids", "I64", [2])])
    files["ok_unpadded_odd"] = st_file(json.dumps(h) + " ", b, pad=False)
    files["ok_f16_bf16"] = st_file(*layout([("h", "F16", [6]), ("b", "BF16", [2, 3])]))
    big = {"ids": {"dtype": "I64", "shape": [2], "data_offsets": [0, 16]}}
    files["ok_i64_beyond_2p53"] = st_file(big, struct.pack("<2q", 1, 2**53 + 1))

    # One rule each.
    files["bad_short"] = b"\x05\x00\x00"
    files["bad_header_too_large"] = struct.pack("<Q", 100_000_001) + b"{}"
    files["bad_header_beyond_file"] = struct.pack("<Q", 64) + b"{}"
    files["bad_not_object"] = st_file("[1]", b"")
    files["bad_leading_space"] = st_file(" {}", b"")
    files["bad_newline_padding"] = st_file("{}\n", b"", pad=False)
    files["bad_malformed_json"] = st_file('{"a":{"dtype":"F32",', b"")
    files["bad_not_utf8"] = st_file(b'{"\x80":1}', b"")
    e = '{"dtype":"F32","shape":[1],"data_offsets":[0,4]}'
    files["bad_duplicate_name"] = st_file('{"a":%s,"a":%s}' % (e, e), b"\0" * 4)
    files["bad_duplicate_field"] = st_file('{"a":{"dtype":"F32","dtype":"F32","shape":[1],"data_offsets":[0,4]}}',
                                           b"\0" * 4)
    files["bad_duplicate_metadata"] = st_file('{"__metadata__":{"k":"1","k":"2"}}', b"")
    files["bad_entry_not_object"] = st_file({"a": [1]}, b"")
    files["bad_extra_field"] = st_file({"a": {"dtype": "U8", "shape": [1], "data_offsets": [0, 1], "x": 0}}, b"\1")
    files["bad_missing_field"] = st_file({"a": {"dtype": "U8", "data_offsets": [0, 1]}}, b"\1")
    files["bad_dtype"] = st_file({"a": {"dtype": "U16", "shape": [1], "data_offsets": [0, 2]}}, b"\1\1")
    files["bad_shape_negative"] = st_file({"a": {"dtype": "U8", "shape": [-1], "data_offsets": [0, 0]}}, b"")
    files["bad_shape_overflow"] = st_file({"a": {"dtype": "U8", "shape": [2**31, 2**31, 2**31],
                                                 "data_offsets": [0, 0]}}, b"")
    files["bad_offsets_length"] = st_file({"a": {"dtype": "U8", "shape": [1], "data_offsets": [0]}}, b"\1")
    files["bad_begin_after_end"] = st_file({"a": {"dtype": "U8", "shape": [0], "data_offsets": [1, 0]}}, b"\1")
    files["bad_end_beyond_buffer"] = st_file({"a": {"dtype": "F32", "shape": [2], "data_offsets": [0, 8]}}, b"\0" * 4)
    files["bad_size_mismatch"] = st_file({"a": {"dtype": "F32", "shape": [16], "data_offsets": [0, 60]}}, b"\0" * 64)
    files["bad_overlap"] = st_file({"a": {"dtype": "F32", "shape": [2], "data_offsets": [0, 8]},
                                    "b": {"dtype": "F32", "shape": [2], "data_offsets": [4, 12]}}, b"\0" * 12)
    files["bad_hole"] = st_file({"a": {"dtype": "F32", "shape": [1], "data_offsets": [0, 4]},
                                 "b": {"dtype": "F32", "shape": [1], "data_offsets": [8, 12]}}, b"\0" * 12)
    files["bad_trailing_bytes"] = st_file({"a": {"dtype": "U8", "shape": [1], "data_offsets": [0, 1]}}, b"\1\2")
    files["bad_metadata_value"] = st_file({"__metadata__": {"n": 1}}, b"")
    files["bad_bool_byte"] = st_file({"m": {"dtype": "BOOL", "shape": [3], "data_offsets": [0, 3]}}, b"\1\0\2")
    files["bad_empty_name"] = st_file({"": {"dtype": "U8", "shape": [1], "data_offsets": [0, 1]}}, b"\1")

    for name, content in sorted(files.items()):
        with open(os.path.join(OUT, name + ".safetensors"), "wb") as f:
            f.write(content)
    print(f"{len(files)} files in {OUT}")


if __name__ == "__main__":
    main()
