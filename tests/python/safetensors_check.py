#!/usr/bin/env python3
"""forge's safetensors files against an independent reader and writer (stdlib + numpy only).

Run by CTest (test `safetensors_python`):

    python3 tests/python/safetensors_check.py --tool build/tests/forge_safetensors_tool

The format, as specified by https://github.com/huggingface/safetensors:

    u64 little-endian N | N bytes of UTF-8 JSON header | data section
    header: {"__metadata__": {str: str} (optional),
             name: {"dtype": "F32", "shape": [..], "data_offsets": [begin, end]}, ...}
    offsets are relative to the start of the data section (8 + N); the tensors' byte ranges
    cover the data section exactly, without overlaps or holes; data is little-endian row-major.

Checks, each printed as one line, exit status non-zero if any failed:
  1. forge_written   `tool write` -> parsed here following the spec (no forge code); layout
                     (8-byte alignment, '{' first, space padding, exact coverage, key order)
                     and every value checked bit for bit against numpy's own computation of
                     the tensors listed in forge_safetensors_tool.cpp.
  2. python_written  a file written here (header keys sorted, data in another order, padding,
                     metadata last, every dtype, 0-d and empty tensors) -> `tool dump`; the
                     values forge reports must equal what was written.
  3. forge_rewrites  `tool copy` of the Python-written file -> parsed here: same tensors, same
                     bytes, same metadata.
  4. corrupt_*       truncated files, bad JSON, bad offsets: `tool dump` must fail (exit 1) with
                     a message that names the file.
"""
import argparse
import json
import os
import struct
import subprocess
import sys
import tempfile

import numpy as np

# safetensors dtype -> numpy dtype of the stored bits (BF16 as its raw uint16 pattern).
NP_DTYPES = {
    "F64": np.dtype("<f8"), "F32": np.dtype("<f4"), "F16": np.dtype("<f2"), "BF16": np.dtype("<u2"),
    "I64": np.dtype("<i8"), "I32": np.dtype("<i4"), "U8": np.dtype("u1"), "BOOL": np.dtype("u1"),
}
FLOATING = {"F64", "F32", "F16", "BF16"}


def no_duplicates(pairs):
    keys = [k for k, _ in pairs]
    if len(keys) != len(set(keys)):
        raise ValueError("duplicate keys in %r" % keys)
    return dict(pairs)  # dicts keep insertion order


def parse_safetensors(data):
    """Returns (ordered list of (name, dtype, shape, ndarray of stored bits), metadata, header_len)."""
    if len(data) < 8:
        raise ValueError("shorter than 8 bytes")
    (n,) = struct.unpack("<Q", data[:8])
    if 8 + n > len(data):
        raise ValueError("header length %d past the end" % n)
    header_bytes = data[8:8 + n]
    if header_bytes[:1] != b"{":
        raise ValueError("header does not start with '{'")
    header = json.loads(header_bytes.decode("utf-8"), object_pairs_hook=no_duplicates)
    metadata = header.pop("__metadata__", {})
    body = data[8 + n:]
    tensors, ranges = [], []
    for name, info in header.items():
        if set(info) != {"dtype", "shape", "data_offsets"}:
            raise ValueError("tensor %s: fields %r" % (name, sorted(info)))
        dtype, shape, (begin, end) = info["dtype"], info["shape"], info["data_offsets"]
        npd = NP_DTYPES[dtype]
        count = int(np.prod(shape, dtype=np.int64)) if shape else 1
        if end - begin != count * npd.itemsize:
            raise ValueError("tensor %s: %d bytes for %s %r" % (name, end - begin, dtype, shape))
        arr = np.frombuffer(body, dtype=npd, count=count, offset=begin).reshape(shape)
        tensors.append((name, dtype, list(shape), arr))
        ranges.append((begin, end, name))
    covered = 0
    for begin, end, name in sorted(ranges):
        if begin != covered:
            raise ValueError("tensor %s starts at %d, expected %d" % (name, begin, covered))
        covered = end
    if covered != len(body):
        raise ValueError("data section %d bytes, covered %d" % (len(body), covered))
    return tensors, metadata, n


def encode_safetensors(entries, metadata, data_order, pad_to=8):
    """entries: list of (name, dtype, ndarray of stored bits) in header order; data_order: names."""
    by_name = {name: (dtype, arr) for name, dtype, arr in entries}
    offsets, blobs, pos = {}, [], 0
    for name in data_order:
        blob = np.ascontiguousarray(by_name[name][1]).tobytes()
        offsets[name] = (pos, pos + len(blob))
        blobs.append(blob)
        pos += len(blob)
    header = {}
    for name, dtype, arr in entries:
        header[name] = {"dtype": dtype, "shape": list(arr.shape), "data_offsets": list(offsets[name])}
    if metadata is not None:
        header["__metadata__"] = metadata
    text = json.dumps(header, separators=(",", ":")).encode("utf-8")
    text += b" " * ((-(8 + len(text))) % pad_to)
    return struct.pack("<Q", len(text)) + text + b"".join(blobs)


def raw_file(header_obj, body, padding=0):
    text = json.dumps(header_obj).encode("utf-8") + b" " * padding
    return struct.pack("<Q", len(text)) + text + body


def bf16_bits(values):
    """Truncating float32 -> bf16 bits (exact for the values used with it)."""
    return (np.asarray(values, dtype="<f4").view("<u4") >> 16).astype("<u2")


def ramp(n):
    return (np.arange(n, dtype=np.float64) - 5) * 0.375


# What `forge_safetensors_tool write` produces (keep in step with forge_safetensors_tool.cpp),
# as (name, dtype, stored bits).
FORGE_FILE = [
    ("f64.ramp", "F64", ramp(12).reshape(2, 6)),
    ("f32.ramp", "F32", ramp(12).astype("<f4").reshape(3, 4)),
    ("f32.specials", "F32", np.array([0x7f800000, 0xff800000, 0x80000000, 0x7fc00001, 0x00000001, 0x7f7fffff],
                                     dtype="<u4").view("<f4")),
    ("bf16.ramp", "BF16", bf16_bits(ramp(12))),
    ("bf16.specials", "BF16", np.array([0x7f80, 0xff80, 0x8000, 0x7fc1, 0x0001, 0x3f80], dtype="<u2").reshape(2, 3)),
    ("f16.ramp", "F16", ramp(12).astype("<f2").reshape(4, 3)),
    ("i64.values", "I64", np.array([-(1 << 40), -1, 0, 1, (1 << 40) + 7], dtype="<i8")),
    ("i32.values", "I32", np.array([-(1 << 31), -1, 7, (1 << 31) - 1], dtype="<i4")),
    ("u8.values", "U8", np.array([0, 1, 127, 128, 255], dtype="u1")),
    ("bool.values", "BOOL", np.array([[1, 0], [0, 1]], dtype="u1")),
    ("scalar.f64", "F64", np.array(3.5, dtype="<f8")),
    ("scalar.i64", "I64", np.array(-9, dtype="<i8")),
    ("empty.f32", "F32", np.zeros((2, 0), dtype="<f4")),
    ("empty.bf16", "BF16", np.zeros((0,), dtype="<u2")),
    ("transposed.i32", "I32", np.arange(6, dtype="<i4").reshape(2, 3).T),
    ("strided.f32", "F32", np.arange(24, dtype="<f4").reshape(4, 6)[0:4:2, 1:6:2]),
    ("expanded.u8", "U8", np.broadcast_to(np.array([[5, 6]], dtype="u1"), (3, 2))),
]
FORGE_METADATA = {"writer": "forge_safetensors_tool", "answer": "42"}


def python_file():
    """A file as another writer lays it out; returns (bytes, entries in header order, metadata)."""
    rng = np.random.RandomState(1234)
    f32 = rng.standard_normal(6).astype("<f4")
    f32[1] = -0.0
    f32[4] = np.inf
    entries = {
        "z.f32": ("F32", f32.reshape(2, 3)),
        "a.f64": ("F64", rng.standard_normal(4)),
        "m.f16": ("F16", rng.standard_normal(3).astype("<f2").reshape(3, 1)),
        "b.bf16": ("BF16", bf16_bits(rng.standard_normal(5).astype("<f4"))),
        "c.i64": ("I64", rng.randint(-(1 << 62), 1 << 62, size=(2, 2), dtype=np.int64)),
        "d.i32": ("I32", rng.randint(-(1 << 31), (1 << 31) - 1, size=3, dtype=np.int32)),
        "e.u8": ("U8", rng.randint(0, 256, size=4).astype("u1")),
        "f.bool": ("BOOL", np.array([1, 0, 1], dtype="u1")),
        "g.scalar": ("F32", np.array(-2.75, dtype="<f4")),
        "h.empty": ("I64", np.zeros((0, 5), dtype="<i8")),
    }
    header_order = sorted(entries)  # the Python library sorts header keys ...
    data_order = ["z.f32", "a.f64", "c.i64", "d.i32", "g.scalar", "h.empty", "m.f16", "b.bf16", "e.u8",
                  "f.bool"]  # ... and lays data out by alignment
    listed = [(name, entries[name][0], entries[name][1]) for name in header_order]
    metadata = {"format": "pt", "source": "safetensors_check.py", "unicode": "héllo"}
    return encode_safetensors(listed, metadata, data_order), listed, metadata


def stored_bits(dtype, arr):
    """The bit pattern of each element, as a flat list of ints (exact comparison incl. NaN, -0)."""
    a = np.ascontiguousarray(arr)
    view = {"F64": "<u8", "F32": "<u4", "F16": "<u2"}.get(dtype)
    return (a.view(view) if view else a).reshape(-1).astype(np.int64).tolist()


def value_as_double(dtype, bits_arr):
    """Expected values (floats as Python floats) for comparing with `tool dump`."""
    a = np.ascontiguousarray(bits_arr).reshape(-1)
    if dtype == "BF16":
        return [float(x) for x in (a.astype("<u4") << 16).view("<f4")]
    if dtype in FLOATING:
        return [float(x) for x in a]
    return [int(x) for x in a]


def same_value(got, want):
    if isinstance(want, float):
        got = float.fromhex(got)
        if want != want:
            return got != got
        return got == want and np.signbit(got) == np.signbit(want)
    return got == want


class Checker:
    def __init__(self, tool, workdir):
        self.tool, self.workdir = tool, workdir
        self.passed, self.failed = 0, 0

    def run_tool(self, *args):
        return subprocess.run([self.tool, *args], capture_output=True, text=True, encoding="utf-8")

    def path(self, name):
        return os.path.join(self.workdir, name)

    def check(self, name, fn):
        try:
            fn()
        except Exception as e:  # noqa: BLE001 - every failure is reported, then the next check runs
            self.failed += 1
            print("FAIL %-28s %s: %s" % (name, type(e).__name__, e))
        else:
            self.passed += 1
            print("ok   %s" % name)

    # 1 -------------------------------------------------------------------------------------
    def forge_written(self):
        p = self.path("forge.safetensors")
        r = self.run_tool("write", p)
        assert r.returncode == 0, r.stderr
        data = open(p, "rb").read()
        tensors, metadata, n = parse_safetensors(data)
        assert (8 + n) % 8 == 0, "data section not 8-byte aligned (N=%d)" % n
        header_text = data[8:8 + n].decode("utf-8")
        assert header_text.rstrip(" ").endswith("}") and len(header_text) - len(header_text.rstrip(" ")) < 8
        assert metadata == FORGE_METADATA, metadata
        names = [t[0] for t in tensors]
        assert names == [e[0] for e in FORGE_FILE], names
        # Data is laid out in the given order as well.
        header = json.loads(header_text)
        starts = [header[name]["data_offsets"][0] for name in names]
        assert starts == sorted(starts), starts
        for (name, dtype, shape, arr), (_, want_dtype, want) in zip(tensors, FORGE_FILE):
            assert dtype == want_dtype, (name, dtype, want_dtype)
            assert shape == list(want.shape), (name, shape, want.shape)
            assert stored_bits(dtype, arr) == stored_bits(dtype, want), (name, arr, want)

    # 2 -------------------------------------------------------------------------------------
    def python_written(self):
        p = self.path("python.safetensors")
        data, listed, metadata = python_file()
        with open(p, "wb") as f:
            f.write(data)
        r = self.run_tool("dump", p)
        assert r.returncode == 0, r.stderr
        lines = [json.loads(line) for line in r.stdout.splitlines()]
        assert lines[0] == {"metadata": metadata}, lines[0]
        got = lines[1:]
        assert [g["name"] for g in got] == [e[0] for e in listed], [g["name"] for g in got]
        for g, (name, dtype, arr) in zip(got, listed):
            assert g["dtype"] == dtype, (name, g["dtype"], dtype)
            assert g["shape"] == list(arr.shape), (name, g["shape"], arr.shape)
            want = value_as_double(dtype, arr)
            assert len(g["values"]) == len(want), name
            for i, (gv, wv) in enumerate(zip(g["values"], want)):
                assert same_value(gv, wv), "%s[%d]: forge %r, written %r" % (name, i, gv, wv)

    # 3 -------------------------------------------------------------------------------------
    def forge_rewrites(self):
        src, dst = self.path("python.safetensors"), self.path("copied.safetensors")
        if not os.path.exists(src):
            with open(src, "wb") as f:
                f.write(python_file()[0])
        r = self.run_tool("copy", src, dst)
        assert r.returncode == 0, r.stderr
        a, meta_a, _ = parse_safetensors(open(src, "rb").read())
        b, meta_b, _ = parse_safetensors(open(dst, "rb").read())
        assert meta_a == meta_b, (meta_a, meta_b)
        assert [t[0] for t in a] == [t[0] for t in b]
        for (na, da, sa, xa), (_, db, sb, xb) in zip(a, b):
            assert (da, sa) == (db, sb), na
            assert stored_bits(da, xa) == stored_bits(db, xb), na

    # 4 -------------------------------------------------------------------------------------
    def expect_refused(self, name, content, needle):
        p = self.path(name + ".safetensors")
        with open(p, "wb") as f:
            f.write(content)
        r = self.run_tool("dump", p)
        assert r.returncode == 1, "exit %d, stdout %r, stderr %r" % (r.returncode, r.stdout[:200], r.stderr)
        assert p in r.stderr, "message does not name the file: %r" % r.stderr
        assert needle in r.stderr, "expected %r in %r" % (needle, r.stderr)

    def corrupt_truncated(self):
        data = open(self.path("forge.safetensors"), "rb").read()
        (n,) = struct.unpack("<Q", data[:8])
        for cut in (0, 5, 8, 8 + n // 2, 8 + n, len(data) - 1):
            self.expect_refused("truncated_%d" % cut, data[:cut], "truncated")

    def corrupt_json(self):
        good = {"w": {"dtype": "U8", "shape": [2], "data_offsets": [0, 2]}}
        text = json.dumps(good).encode()
        self.expect_refused("bad_json", struct.pack("<Q", len(text) - 3) + text[:-3] + b"ab", "not valid JSON")
        self.expect_refused("not_object", raw_file([1, 2], b""), "does not start with '{'")
        dup = b'{"w":{"dtype":"U8","shape":[1],"data_offsets":[0,1]},"w":{"dtype":"U8","shape":[1],"data_offsets":[1,2]}}'
        self.expect_refused("duplicate", struct.pack("<Q", len(dup)) + dup + b"xy", "duplicate key 'w'")
        bad_dtype = {"w": {"dtype": "Q8", "shape": [1], "data_offsets": [0, 1]}}
        self.expect_refused("bad_dtype", raw_file(bad_dtype, b"x"), "unknown dtype 'Q8'")

    def corrupt_offsets(self):
        mismatch = {"w": {"dtype": "F32", "shape": [2, 2], "data_offsets": [0, 12]}}
        self.expect_refused("size_mismatch", raw_file(mismatch, b"x" * 12), "tensor 'w'")
        overlap = {"a": {"dtype": "U8", "shape": [4], "data_offsets": [0, 4]},
                   "b": {"dtype": "U8", "shape": [4], "data_offsets": [2, 6]}}
        self.expect_refused("overlap", raw_file(overlap, b"x" * 6), "overlap tensor 'a'")
        past = {"a": {"dtype": "U8", "shape": [4], "data_offsets": [0, 4]},
                "b": {"dtype": "I32", "shape": [1], "data_offsets": [4, 8]}}
        self.expect_refused("past_end", raw_file(past, b"x" * 6), "tensor 'b'")
        gap = {"a": {"dtype": "U8", "shape": [2], "data_offsets": [0, 2]},
               "b": {"dtype": "U8", "shape": [2], "data_offsets": [3, 5]}}
        self.expect_refused("gap", raw_file(gap, b"x" * 5), "gap of 1 bytes")


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--tool", required=True, help="path to forge_safetensors_tool")
    args = ap.parse_args()
    with tempfile.TemporaryDirectory(prefix="forge_safetensors_") as workdir:
        c = Checker(os.path.abspath(args.tool), workdir)
        c.check("forge_written", c.forge_written)
        c.check("python_written", c.python_written)
        c.check("forge_rewrites", c.forge_rewrites)
        c.check("corrupt_truncated", c.corrupt_truncated)
        c.check("corrupt_json", c.corrupt_json)
        c.check("corrupt_offsets", c.corrupt_offsets)
    print("%d passed, %d failed" % (c.passed, c.failed))
    return 1 if c.failed else 0


if __name__ == "__main__":
    sys.exit(main())
