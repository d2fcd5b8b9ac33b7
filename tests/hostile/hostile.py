#!/usr/bin/env python3
"""Hostile-input test driver for tparity: what a stranger could hand it, as data.

    .venv/bin/python tests/hostile/hostile.py --tparity build/tparity [-k SUBSTR] [--jobs 2]
                                              [--markdown FILE] [--list] [--root DIR] [--keep-root]

Every case is one `Case(cls, name, setup, expect, needs=...)` in CASES (ggml's test-backend-ops
style). `setup(sb)` writes the case's inputs into a fresh sandbox and returns a `Run` (argv, env,
timeout, an action such as "send SIGINT once the program has started", outputs the case may write,
extra checks). `expect` is BAD(...) (exit 2, one line on stderr naming the file, field or option),
FAIL (exit 1: a wrong answer caught), OK (exit 0), INTERRUPTED (130 after SIGINT, 143 after SIGTERM)
or EITHER(a, b).

The sandbox of case N:

    ROOT/case-N/              the parent canary: must hold nothing but box/ afterwards
      box/                    nothing in it may change but work/ (names, sizes, mtimes, sha256)
        work/                 the case's inputs and permitted outputs; tparity's cwd
        outside/              canary files (outside/x.float64.out.json ...) and links' targets
        tmp/                  TMPDIR of the run: must be empty afterwards (no tparity-exec-* left)
        pids/                 stand-in programs write their pids (and their children's) here

Universal checks, each its own verdict column, applied to every case:
  time     finished (process exited, its stdout and stderr closed) within the timeout; a hang is
           killed (the whole process group) and fails
  exit     exit code in {0, 1, 2, 130, 143}, never killed by a signal
  outside  nothing created, changed or removed outside work/ (box/, outside/, the parent canary,
           tmp/ left empty, files outside the sandbox that links point to, the temporary folder a
           stand-in program was handed its problem in: gone afterwards)
  inputs   every file the setup wrote is unchanged afterwards (unless the case says it may be written)
  links    every symlink is still the same symlink (never replaced by a file), its target unchanged
  procs    no process a stand-in program started survives the run (survivors are then killed)
  files    no output half-written: every new or changed JSON parses, a JSON naming a tensor_file has
           it and its tensors match the JSON's shapes, no orphan .safetensors, no *.tmp<pid> left
  expect   the case's own expectation

Exit 0 only when every case passes every check. Cases that need LibTorch (export, exec, judge and
anything built from an exported problem) are skipped with a note when `tparity --version` says the
build has none. Standard library, numpy and safetensors only.
"""

from __future__ import annotations

import argparse
import copy
import glob
import hashlib
import json
import os
import re
import selectors
import shutil
import signal
import stat
import subprocess
import sys
import tempfile
import threading
import time
import xml.etree.ElementTree as ET
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable, Optional

import numpy as np

REPO = Path(__file__).resolve().parents[2]
FIXTURES = REPO / "fixtures" / "torch-2.13"
PY = sys.executable
EXIT_CODES = {0, 1, 2, 130, 143}
NEST = "[" * 100_000 + "]" * 100_000  # 100,000 nested arrays (200 kB)
NEST_OBJ = '{"a":' * 100_000 + "1" + "}" * 100_000
BIG = "A" * (10 << 20)  # a 10 MB string
MEM_LIMIT = 4 << 30  # address space of each tparity run: a runaway read or allocation stops there
IS_ROOT = os.geteuid() == 0


def others_reach(path) -> bool:
    """Whether a user who is neither owner nor group may run the file: every folder on its way lets
    others search it, and the file lets others execute it."""
    p = Path(path).resolve()
    return all(os.stat(d).st_mode & stat.S_IXOTH for d in [p, *p.parents])
NOBODY = 65534


# ---------------------------------------------------------------------------------------------------
# Expectations
# ---------------------------------------------------------------------------------------------------

# What a one-line refusal must never show: C++ internals instead of the file, field or option.
LEAKS = ("bad_alloc", "std::", "basic_string", "vector::", "Segmentation", "terminate called")


@dataclass
class Expect:
    kind: str  # BAD, FAIL, OK, INT, EITHER
    contains: tuple = ()  # every one of these (regex when prefixed "re:")
    any_of: tuple = ()  # at least one of these
    not_contains: tuple = ()
    one_line: bool = True
    code: Optional[int] = None
    stdout: tuple = ()  # regexes stdout must match (OK / FAIL)
    alts: tuple = ()

    def label(self) -> str:
        if self.kind == "EITHER":
            return "|".join(a.label() for a in self.alts)
        if self.kind == "INT":
            return f"INT{self.code}"
        return self.kind

    def problems(self, rc: Optional[int], out: bytes, err: bytes) -> list[str]:
        if self.kind == "EITHER":
            probs = [a.problems(rc, out, err) for a in self.alts]
            return [] if any(not p for p in probs) else ["; or ".join("; ".join(p) for p in probs)]
        want = {"BAD": 2, "FAIL": 1, "OK": 0, "INT": self.code}[self.kind]
        p = []
        if rc != want:
            p.append(f"exit {rc}, expected {want}")
        text = err.decode("utf-8", "replace")
        if self.kind == "BAD":
            if self.one_line:
                nl = err.count(b"\n")
                if not err.endswith(b"\n") or nl != 1:
                    p.append(f"stderr is {nl} lines (newlines), expected exactly one")
                line = err[:-1] if err.endswith(b"\n") else err
                if len(line) > 1000:
                    p.append(f"stderr line of {len(line)} bytes (at most 1000)")
                bad = sorted({c for c in line if c < 0x20 or c == 0x7F})
                if bad:
                    p.append("control characters in stderr: " + ",".join(f"0x{c:02x}" for c in bad))
            else:
                if len(err) > 20000:
                    p.append(f"stderr of {len(err)} bytes")
            for s in self.contains:
                if not _has(text, s):
                    p.append(f"stderr lacks {s!r}")
            if self.any_of and not any(_has(text, s) for s in self.any_of):
                p.append("stderr lacks any of " + "/".join(repr(s) for s in self.any_of))
            for s in LEAKS + tuple(self.not_contains):
                if s in text:
                    p.append(f"stderr shows {s!r}")
        else:
            o = out.decode("utf-8", "replace")
            for s in self.stdout:
                if not re.search(s, o, re.M):
                    p.append(f"stdout lacks /{s}/")
            for s in self.contains:
                if not _has(text, s):
                    p.append(f"stderr lacks {s!r}")
        return p


def _has(text: str, s: str) -> bool:
    return re.search(s[3:], text) is not None if s.startswith("re:") else s in text


def BAD(*contains, any_of=(), not_contains=(), one_line=True):
    return Expect("BAD", tuple(contains), tuple(any_of), tuple(not_contains), one_line)


def FAIL(*stdout, stderr=()):
    return Expect("FAIL", stdout=tuple(stdout), contains=tuple(stderr))


def OK(*stdout, stderr=()):
    return Expect("OK", stdout=tuple(stdout), contains=tuple(stderr))


def INTERRUPTED(sig=signal.SIGINT):
    return Expect("INT", code=128 + int(sig))


def EITHER(*alts):
    return Expect("EITHER", alts=tuple(alts))


# A wrong answer caught where it is: the program's float64 output against the reference's (not, say, a
# reference self-check failing beside it).
WRONG = FAIL(r"^\s*FAIL case [^:]+: component output: leg hand64_vs_torch64: ")

# The field `name` named (and not an OS error about a long file name).
NAME = "re:(^|[^A-Za-z_])name([^A-Za-z_]|$)"
NOT_OS_NAME = ("name too long",)
# The phrases tparity's refusals use (harness/io.cpp), exactly: a looser word ("directory") would also
# match "No such file or directory" and pass a FIFO case on a file-not-found.
LINK = ("it is a symbolic link",)
NOT_REGULAR = ("it is a FIFO, not a regular file", "it is a directory, not a regular file",
               "it is a character device, not a regular file", "it is a block device, not a regular file",
               "it is a socket, not a regular file")


# ---------------------------------------------------------------------------------------------------
# Cases, runs, sandboxes
# ---------------------------------------------------------------------------------------------------


@dataclass
class Run:
    argv: list
    env: dict = field(default_factory=dict)
    timeout: float = 60.0
    max_seconds: Optional[float] = None  # finished sooner than this (a refusal before the long run)
    signal_: Optional[int] = None  # sent to tparity's own pid ...
    signal_when: str = "pid"  # ... once a stand-in has written its pid ("pid"), or after N seconds ("2.0")
    may_write: tuple = ()  # globs (relative to work/) of pre-existing entries the run may change
    user: Optional[int] = None  # run as this uid (and gid) when the driver is root
    parallel: list = field(default_factory=list)  # further argvs started at the same moment
    repeat: int = 1  # run the whole (parallel) set this many times, checking after each
    checks: list = field(default_factory=list)  # callables (sb, result) -> [problems]
    external: list = field(default_factory=list)  # files outside the sandbox that must not change
    expect_override: Optional[Expect] = None


@dataclass
class Case:
    cls: str
    name: str
    setup: Callable
    expect: Expect
    needs: tuple = ()  # "torch", "root"
    serial: bool = False  # exec cases: one at a time (they start processes)
    note: str = ""


@dataclass
class Result:
    case: Case
    idx: int
    rc: Optional[int] = None
    stdout: bytes = b""
    stderr: bytes = b""
    seconds: float = 0.0
    checks: dict = field(default_factory=dict)  # column -> [problems]
    skipped: str = ""
    argv: list = field(default_factory=list)
    reaped: set = field(default_factory=set)

    @property
    def passed(self) -> bool:
        return not self.skipped and not any(self.checks.values())


class Sandbox:
    def __init__(self, caseroot: Path, tparity: str, res: "Resources"):
        self.caseroot = caseroot
        self.box = caseroot / "box"
        self.work = self.box / "work"
        self.outside = self.box / "outside"
        self.tmp = self.box / "tmp"
        self.pids = self.box / "pids"
        for d in (self.work, self.outside, self.tmp, self.pids):
            d.mkdir(parents=True, exist_ok=True)
        for d in (caseroot, self.box, self.work, self.outside):
            os.chmod(d, 0o755)
        os.chmod(self.tmp, 0o1777)
        os.chmod(self.pids, 0o1777)
        self.tp = tparity
        self.res = res
        self.pidfile = self.pids / "pids.txt"
        # canaries: a program's outputs file of a case named "x", and plain files
        (self.outside / "x.float64.out.json").write_text('{"canary": "x.float64.out.json"}\n')
        (self.outside / "x.float32.out.json").write_text('{"canary": "x.float32.out.json"}\n')
        (self.outside / "x.json").write_text('{"canary": "x.json"}\n')
        (self.outside / "canary.txt").write_text("canary\n")
        (self.box / "canary.txt").write_text("canary\n")

    # paths
    def w(self, rel: str) -> Path:
        return self.work / rel

    def o(self, rel: str) -> Path:
        return self.outside / rel

    # writers (relative to work/ unless absolute)
    def _p(self, rel) -> Path:
        p = Path(rel)
        return p if p.is_absolute() else self.work / p

    def write(self, rel, data) -> Path:
        p = self._p(rel)
        p.parent.mkdir(parents=True, exist_ok=True)
        if isinstance(data, str):
            data = data.encode("utf-8")
        p.write_bytes(data)
        return p

    def json(self, rel, doc, replace: Optional[dict] = None) -> Path:
        text = json.dumps(doc)
        for k, v in (replace or {}).items():
            assert k in text, k
            text = text.replace(k, v, 1)
        return self.write(rel, text)

    def copy(self, src, rel) -> Path:
        p = self._p(rel)
        p.parent.mkdir(parents=True, exist_ok=True)
        shutil.copyfile(src, p)
        return p

    def link(self, rel, target) -> Path:
        p = self._p(rel)
        p.parent.mkdir(parents=True, exist_ok=True)
        os.symlink(str(target), p)
        return p

    def fifo(self, rel) -> Path:
        p = self._p(rel)
        p.parent.mkdir(parents=True, exist_ok=True)
        os.mkfifo(p)
        return p

    def mkdir(self, rel) -> Path:
        p = self._p(rel)
        p.mkdir(parents=True, exist_ok=True)
        return p

    def prog(self) -> Path:
        """The stand-in program, in work/ (see PROGRAM)."""
        return self.write("prog.py", PROGRAM)

    def exec_argv(self, *opts, mode="echo", timeout="20"):
        self.prog()
        return [self.tp, "exec", *opts, "--timeout", timeout, "--", PY, "prog.py", mode, "{problem}", "{out}",
                "{dtype}"]


# ---------------------------------------------------------------------------------------------------
# The stand-in program tparity exec runs (written into each exec case's work/)
# ---------------------------------------------------------------------------------------------------

PROGRAM = r'''
import json, os, subprocess, sys, time
mode, problem, out, dtype = sys.argv[1:5]
def note(pid):
    with open(os.environ["HOSTILE_PIDS"], "a") as f:
        f.write(f"{pid}\n")
note(os.getpid())
with open(os.path.join(os.path.dirname(os.environ["HOSTILE_PIDS"]), "paths.txt"), "a") as f:
    f.write(os.path.abspath(problem) + "\n")  # where tparity put the problem (its temporary folder)
SLEEP = [sys.executable, "-c", "import time; time.sleep(60)"]
if mode == "sleep":
    time.sleep(60)
    sys.exit(0)
if mode == "spawn-sleep":          # a child in its own process group (the default): tparity's group kill reaches it
    note(subprocess.Popen(SLEEP).pid)
    time.sleep(60)
if mode == "setsid":               # a grandchild in a session of its own, holding tparity's stderr; then hang
    note(subprocess.Popen(SLEEP, start_new_session=True).pid)
    time.sleep(60)
daemon = mode == "daemon"          # a grandchild in a session of its own left running; then echo and exit 0
if daemon:
    note(subprocess.Popen(SLEEP, start_new_session=True, stdin=subprocess.DEVNULL).pid)
    mode = "echo"
if mode == "decline":
    with open(out, "w") as f:
        json.dump({"format": "tparity.outputs", "version": 1, "unsupported": "a stand-in implements nothing"}, f)
    sys.exit(0)
if mode == "checkpath":            # the paths it was given must exist as given
    if not os.path.isfile(problem) or not os.path.isdir(os.path.dirname(os.path.abspath(out))):
        sys.stderr.write(f"stand-in: given a path that does not exist: {problem!r} / {out!r}\n")
        sys.exit(3)
with open(problem) as f:
    p = json.load(f)
f32 = dtype == "float32"
outputs = p["outputs_float32"] if f32 and p.get("outputs_float32") else p["outputs"]
comps = p.get("components_float32" if f32 else "components", {})
doc = {"format": "tparity.outputs", "version": 1, "dtype": dtype,
       "outputs": {k: dict(v, dtype=dtype) for k, v in outputs.items()}}
if mode == "echo-scores":
    doc["components"] = {k: dict(v, dtype=dtype) for k, v in comps.items() if k == "scores"}
elif mode in ("echo", "checkpath"):
    doc["components"] = {k: dict(v, dtype=dtype) for k, v in comps.items()}
with open(out, "w") as f:
    json.dump(doc, f)
'''

PROBE = r'''
import sys
sys.path.insert(0, sys.argv[1])
import tparity_io
try:
    tparity_io.load_problem(sys.argv[2])
except ValueError as e:
    print("ValueError:", str(e)[:200])
    sys.exit(0)
except BaseException as e:
    print(type(e).__name__ + ":", str(e)[:200])
    sys.exit(3)
print("accepted")
sys.exit(4)
'''


# ---------------------------------------------------------------------------------------------------
# Resources: tiny problems exported once, committed fixtures
# ---------------------------------------------------------------------------------------------------


class Resources:
    def __init__(self, root: Path, tparity: str, torch: bool):
        self.dir = root / "res"
        self.dir.mkdir(parents=True, exist_ok=True)
        self.tp = tparity
        self.torch = torch
        self.book_path = FIXTURES / "book_selfattn_v1.json"
        self.book = json.loads(self.book_path.read_text())
        self.baseline_path = REPO / "fixtures" / "baseline.json"
        self.error = ""
        if torch:
            try:
                self._export()
            except Exception as e:  # noqa: BLE001
                self.error = f"resources could not be exported: {e}"

    def _tp(self, *args):
        for attempt in range(30):  # the binary may be rebuilt under us for a moment
            if os.path.exists(self.tp):
                r = subprocess.run([self.tp, *args], cwd=self.dir, capture_output=True, text=True, timeout=120)
                if r.returncode == 0:
                    return r
                if os.path.exists(self.tp):
                    raise RuntimeError(f"tparity {' '.join(args)}: exit {r.returncode}: {r.stderr.strip()[:300]}")
            time.sleep(2)
        raise RuntimeError(f"{self.tp} missing")

    def _export(self):
        jobs = [("sdpa", "--case", "sdpa", "--out", "sdpa"),
                ("sdpa_st", "--case", "sdpa", "--out", "sdpa_st", "--tensors", "safetensors"),
                ("softmax", "--case", "softmax", "--batch", "2", "--seq", "3", "--kv-seq", "5", "--out", "softmax"),
                ("llama", "--case", "llama", "--no-components", "--out", "llama")]
        errors = []

        def one(j):
            try:
                self._tp("export", *j[1:])
            except Exception as e:  # noqa: BLE001
                errors.append(str(e))

        threads = [threading.Thread(target=one, args=(j,)) for j in jobs]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
        if errors:
            raise RuntimeError(errors[0])
        self.sdpa_path = self.dir / "sdpa" / "sdpa.json"
        self.sdpa = json.loads(self.sdpa_path.read_text())
        self.sdpa_st_json = self.dir / "sdpa_st" / "sdpa.json"
        self.sdpa_st_bin = self.dir / "sdpa_st" / "sdpa.safetensors"
        self.softmax_path = self.dir / "softmax" / "softmax.json"
        self.softmax = json.loads(self.softmax_path.read_text())
        self.llama_path = self.dir / "llama" / "llama.json"
        self.llama = json.loads(self.llama_path.read_text())
        # the reference's own outputs as a program's (both precisions), and a baseline recorded from them
        self.softmax_o64 = outputs_doc("float64", self.softmax["outputs"])
        self.softmax_o32 = outputs_doc("float32", self.softmax["outputs_float32"])
        (self.dir / "softmax" / "o64.json").write_text(json.dumps(self.softmax_o64))
        (self.dir / "softmax" / "o32.json").write_text(json.dumps(self.softmax_o32))
        self._tp("judge", "--problem", "softmax/softmax.json", "--outputs", "softmax/o64.json", "--outputs",
                 "softmax/o32.json", "--baseline", "softmax/baseline.json", "--update-baseline")
        self.softmax_baseline = json.loads((self.dir / "softmax" / "baseline.json").read_text())


def outputs_doc(dtype, outputs, components=None):
    d = {"format": "tparity.outputs", "version": 1, "dtype": dtype,
         "outputs": {k: dict(v, dtype=dtype) for k, v in outputs.items()}}
    if components:
        d["components"] = {k: dict(v, dtype=dtype) for k, v in components.items()}
    return d


def T(a, dtype="float64", shape=None):
    """A tensor of the fixture format, inline; non-finite values as strings."""
    a = np.asarray(a, dtype=np.float64)
    data = [x if np.isfinite(x) else ("nan" if x != x else "inf" if x > 0 else "-inf") for x in a.ravel().tolist()]
    return {"dtype": dtype, "shape": list(a.shape) if shape is None else shape, "data": data}


def matmul_problem(a, b, name="mm", outputs=True, shapes=None):
    """A Matmul problem (format v2) with the reference's results computed here (float64 and float32)."""
    doc = {"format": "tparity.fixture", "version": 2, "name": name, "module": "Matmul", "config": {},
           "forward": {}, "reference": {"torch": "2.13.0", "name": "hostile.py (numpy)"}, "state_dict": {}}
    if shapes:  # sizes alone, no values (a product of sizes that wraps)
        doc["inputs"] = {"input": {"dtype": "float64", "shape": shapes[0], "data": []},
                         "other": {"dtype": "float64", "shape": shapes[1], "data": []}}
        return doc
    a, b = np.asarray(a, np.float64), np.asarray(b, np.float64)
    doc["inputs"] = {"input": T(a), "other": T(b)}
    if outputs:
        with np.errstate(all="ignore"):
            out = a @ b
            out32 = (a.astype(np.float32) @ b.astype(np.float32)).astype(np.float64)
        doc["outputs"] = {"output": T(out)}
        doc["outputs_float32"] = {"output": T(out32, "float32")}
    return doc


def scaled(doc, s):
    """A tensor dict with every value times s (float64 arithmetic; float32 tensors rounded again)."""
    d = copy.deepcopy(doc)
    a = np.array([float(x) for x in d["data"]], np.float64) * s
    if d["dtype"] == "float32":
        with np.errstate(all="ignore"):
            a = a.astype(np.float32).astype(np.float64)
    d["data"] = T(a)["data"]
    return d


def st_bytes(header: dict, data: bytes) -> bytes:
    h = json.dumps(header).encode()
    return len(h).to_bytes(8, "little") + h + data


def st_split(blob: bytes):
    n = int.from_bytes(blob[:8], "little")
    return json.loads(blob[8:8 + n]), blob[8 + n:]


def census_doc():
    return {"format": "tparity.census", "version": 1, "reference": {"torch": "2.13.0", "blas": "MKL"},
            "kernel": "unlimited", "seed": 1, "points": 1, "shard": "0/1", "seconds": 0.1,
            "rows": [{"case": "sdpa", "isa": "avx512", "points": 1, "alarms": []}]}


# ---------------------------------------------------------------------------------------------------
# Case builders
# ---------------------------------------------------------------------------------------------------

CASES: list[Case] = []


def add(cls, name, setup, expect, needs=(), serial=False, note=""):
    CASES.append(Case(cls, name, setup, expect, tuple(needs), serial, note))


def book(**changes):
    d = json.loads(json.dumps(_BOOK))
    d.update(changes)
    return d


_BOOK = json.loads((FIXTURES / "book_selfattn_v1.json").read_text())
TORCH = ("torch",)


def no_file(*rels):
    """A check: these paths (relative to work/) do not exist afterwards."""
    def check(sb, r):
        return [f"{rel} exists afterwards" for rel in rels if os.path.lexists(sb.w(rel))]
    return check


def program_not_started(sb, r):
    return ["the program was started"] if sb.pidfile.exists() and sb.pidfile.read_text().strip() else []


# ---- 1. a name used as a path -------------------------------------------------------------------------

NAMES = {
    "abs-outside": None,  # the absolute path of outside/x (filled per sandbox)
    "/abs/x": "/abs/x",
    "../../x": "../../x",
    "../../outside/x": "../../outside/x",
    "..": "..",
    ".": ".",
    "empty": "",
    "a/b": "a/b",
    "a\\b": "a\\b",
    "a\\nb": "a\nb",
    "x\\u0000y": "x\u0000y",
    "x\\u001by": "x\u001by",
    "300 chars": "n" * 300,
    ".hidden": ".hidden",
}


def _name_value(sb, key):
    return str(sb.outside / "x") if key == "abs-outside" else NAMES[key]


def name_setup(cmd, key):
    def setup(sb):
        doc = book(name=_name_value(sb, key))
        if cmd == "gate":
            sb.json("fx/f.json", doc)
            sb.copy(REPO / "fixtures" / "baseline.json", "b.json")
            return Run([sb.tp, "gate", "--fixtures", "fx", "--baseline", "b.json"])
        sb.json("f.json", doc)
        if cmd == "export":
            return Run([sb.tp, "export", "--fixture", "f.json", "--out", "out"])
        if cmd == "exec":
            sb.mkdir("k")
            return Run(sb.exec_argv("--fixture", "f.json", "--keep", "k"))
        if cmd == "check":
            return Run([sb.tp, "check", "--fixture", "f.json"])
        if cmd == "eval":
            return Run([sb.tp, "eval", "--fixture", "f.json", "--out", "o.json"])
        raise ValueError(cmd)
    return setup


for _cmd, _keys in (
        ("export", list(NAMES)),
        ("exec", ["abs-outside", "../../outside/x", "..", "a/b", "empty", "300 chars", "x\\u0000y"]),
        ("check", ["a\\nb", "x\\u0000y", ".", "x\\u001by", "/abs/x"]),
        ("eval", ["../../x", ".hidden", "a\\b"]),
        ("gate", ["../../x", "a\\nb"])):
    for _k in _keys:
        add("1-name", f"{_cmd} --fixture: name {_k}", name_setup(_cmd, _k), BAD(NAME, not_contains=NOT_OS_NAME),
            needs=TORCH if _cmd in ("export", "exec") else (), serial=_cmd == "exec")


# ---- 2. links and special files -------------------------------------------------------------------------

def st_problem(sb, tensor_target=None, fifo=False, directory=False, self_ref=False):
    """work/p.json naming tensor_file sdpa.safetensors, which is a link (to tensor_target), a FIFO, a
    directory, or the JSON itself."""
    doc = json.loads(sb.res.sdpa_st_json.read_text())
    if self_ref:
        doc["tensor_file"] = "p.json"
    sb.json("p.json", doc)
    if tensor_target is not None:
        sb.link("sdpa.safetensors", tensor_target)
    elif fifo:
        sb.fifo("sdpa.safetensors")
    elif directory:
        sb.mkdir("sdpa.safetensors")
    elif not self_ref:
        sb.copy(sb.res.sdpa_st_bin, "sdpa.safetensors")


def _tf_link_copy(sb):
    sb.copy(sb.res.sdpa_st_bin, sb.o("real.safetensors"))
    st_problem(sb, "../outside/real.safetensors")
    return Run([sb.tp, "eval", "--fixture", "p.json", "--out", "o.json"])


def _tf_link_passwd(sb):
    st_problem(sb, "/etc/passwd")
    return Run([sb.tp, "eval", "--fixture", "p.json", "--out", "o.json"], external=["/etc/passwd"])


def _tf_fifo(sb):
    st_problem(sb, fifo=True)
    return Run([sb.tp, "eval", "--fixture", "p.json", "--out", "o.json"], timeout=8)


def _tf_dir(sb):
    st_problem(sb, directory=True)
    return Run([sb.tp, "eval", "--fixture", "p.json", "--out", "o.json"])


def _tf_self(sb):
    st_problem(sb, self_ref=True)
    return Run([sb.tp, "eval", "--fixture", "p.json", "--out", "o.json"])


add("2-link", "tensor_file a symlink to a copy in outside/", _tf_link_copy, BAD("sdpa.safetensors", any_of=LINK),
    needs=TORCH)
add("2-link", "tensor_file a symlink to /etc/passwd", _tf_link_passwd, BAD("sdpa.safetensors", any_of=LINK),
    needs=TORCH)
add("2-link", "tensor_file a FIFO", _tf_fifo, BAD("sdpa.safetensors", any_of=NOT_REGULAR), needs=TORCH)
add("2-link", "tensor_file a directory", _tf_dir, BAD("sdpa.safetensors", any_of=NOT_REGULAR), needs=TORCH)
add("2-link", "tensor_file names the JSON itself", _tf_self, BAD("p.json"), needs=TORCH)


def special(kind, sb, rel, real_src=None, real_doc=None):
    """work/rel as `kind`: link (to a real file in outside/), fifo, dir, empty."""
    if kind == "link":
        if real_src is not None:
            sb.copy(real_src, sb.o("real" + Path(rel).suffix))
        else:
            sb.json(sb.o("real" + Path(rel).suffix), real_doc)
        sb.link(rel, "../outside/real" + Path(rel).suffix)
    elif kind == "fifo":
        sb.fifo(rel)
    elif kind == "dir":
        sb.mkdir(rel)
    elif kind == "empty":
        sb.write(rel, b"")
    return rel


def kind_expect(kind, rel):
    if kind == "link":
        return BAD(rel, any_of=LINK)
    if kind == "empty":
        return BAD(rel)
    return BAD(rel, any_of=NOT_REGULAR)


def special_setup(target, kind):
    def setup(sb):
        tmo = 8 if kind == "fifo" else 60
        if target == "check --fixture":
            rel = special(kind, sb, "f.json", real_src=FIXTURES / "book_selfattn_v1.json")
            return Run([sb.tp, "check", "--fixture", rel], timeout=tmo)
        if target == "eval --fixture":
            rel = special(kind, sb, "f.json", real_src=FIXTURES / "book_selfattn_v1.json")
            return Run([sb.tp, "eval", "--fixture", rel, "--out", "o.json"], timeout=tmo)
        if target == "export --fixture":
            rel = special(kind, sb, "f.json", real_src=FIXTURES / "book_selfattn_v1.json")
            return Run([sb.tp, "export", "--fixture", rel, "--out", "out"], timeout=tmo)
        if target == "judge --problem":
            rel = special(kind, sb, "p.json", real_src=sb.res.softmax_path)
            sb.json("o.json", sb.res.softmax_o64)
            return Run([sb.tp, "judge", "--problem", rel, "--outputs", "o.json"], timeout=tmo)
        if target == "judge --outputs":
            sb.copy(sb.res.softmax_path, "p.json")
            rel = special(kind, sb, "o.json", real_doc=sb.res.softmax_o64)
            return Run([sb.tp, "judge", "--problem", "p.json", "--outputs", rel], timeout=tmo)
        if target == "judge --baseline":
            sb.copy(sb.res.softmax_path, "p.json")
            sb.json("o.json", sb.res.softmax_o64)
            rel = special(kind, sb, "b.json", real_doc=sb.res.softmax_baseline)
            return Run([sb.tp, "judge", "--problem", "p.json", "--outputs", "o.json", "--baseline", rel],
                       timeout=tmo)
        if target == "gate --baseline":
            sb.mkdir("empty")
            rel = special(kind, sb, "b.json", real_src=REPO / "fixtures" / "baseline.json")
            return Run([sb.tp, "gate", "--fixtures", "empty", "--baseline", rel], timeout=tmo)
        if target == "census --merge":
            rel = special(kind, sb, "c.json", real_doc=census_doc())
            return Run([sb.tp, "census", "--merge", rel], timeout=tmo)
        raise ValueError(target)
    return setup


_SPECIAL_REL = {"check --fixture": "f.json", "eval --fixture": "f.json", "export --fixture": "f.json",
                "judge --problem": "p.json", "judge --outputs": "o.json", "judge --baseline": "b.json",
                "gate --baseline": "b.json", "census --merge": "c.json"}
for _t, _kinds in (("check --fixture", ["link", "fifo", "dir", "empty"]),
                   ("eval --fixture", ["link", "fifo"]),
                   ("export --fixture", ["link", "fifo"]),
                   ("judge --problem", ["link", "fifo", "dir"]),
                   ("judge --outputs", ["link", "fifo", "dir"]),
                   ("judge --baseline", ["link", "fifo"]),
                   ("gate --baseline", ["link", "fifo"]),
                   ("census --merge", ["link", "fifo", "dir"])):
    for _k in _kinds:
        _torch = TORCH if _t.split()[0] in ("export", "judge") else ()
        add("2-link", f"{_t} is a {_k}", special_setup(_t, _k), kind_expect(_k, _SPECIAL_REL[_t]), needs=_torch)


def _dev(path, cmd):
    def setup(sb):
        if cmd == "check":
            return Run([sb.tp, "check", "--fixture", path], timeout=20)
        sb.json("o.json", sb.res.softmax_o64)
        return Run([sb.tp, "judge", "--problem", path, "--outputs", "o.json"], timeout=20)
    return setup


add("2-link", "check --fixture /dev/zero", _dev("/dev/zero", "check"), BAD("/dev/zero", any_of=NOT_REGULAR))
add("2-link", "check --fixture /dev/null", _dev("/dev/null", "check"), BAD("/dev/null", any_of=NOT_REGULAR))
add("2-link", "judge --problem /dev/null", _dev("/dev/null", "judge"), BAD("/dev/null", any_of=NOT_REGULAR),
    needs=TORCH)
add("2-link", "judge --problem /dev/zero", _dev("/dev/zero", "judge"), BAD("/dev/zero", any_of=NOT_REGULAR),
    needs=TORCH)


# ---- 3. wrong answers that must not pass ---------------------------------------------------------------


def judge_run(sb, problem, outputs_list):
    sb.json("p.json", problem)
    argv = [sb.tp, "judge", "--problem", "p.json"]
    for i, o in enumerate(outputs_list):
        sb.json(f"o{i}.json", o)
        argv += ["--outputs", f"o{i}.json"]
    return Run(argv)


def sdpa_scaled(sb, s, factor):
    """The sdpa problem with its value input times s (so the reference's output is s times larger,
    scores and weights unchanged), judged on a float64 program that returns factor x the reference."""
    p = copy.deepcopy(sb.res.sdpa)
    p["inputs"]["value"] = scaled(p["inputs"]["value"], s)
    for sec in ("outputs", "outputs_float32", "components", "components_float32"):
        if "output" in p.get(sec, {}):
            p[sec]["output"] = scaled(p[sec]["output"], s)
    o = outputs_doc("float64", {"output": scaled(p["outputs"]["output"], factor) if factor != 1
                                else p["outputs"]["output"]})
    return judge_run(sb, p, [o])


def matmul_scaled(sb, s, how, seed=3):
    """input (4x3) times s, other (3x5) O(1): the reference's output is O(s); the program's is `how`."""
    rng = np.random.default_rng(seed)
    a, b = rng.standard_normal((4, 3)) * s, rng.standard_normal((3, 5))
    p = matmul_problem(a, b)
    ref = np.array(p["outputs"]["output"]["data"], np.float64).reshape(4, 5)
    prog = {"exact": ref, "3x": 3 * ref, "negated": -ref, "zeros": 0 * ref, "1e-3": ref * (1 + 1e-3),
            "2x": 2 * ref}[how]
    return judge_run(sb, p, [outputs_doc("float64", {"output": T(prog)})])


def single(sb, ref_value, prog_value):
    p = matmul_problem([[ref_value]], [[1.0]])
    return judge_run(sb, p, [outputs_doc("float64", {"output": T([[prog_value]])})])


def softmax_off(sb, factor):
    p = sb.res.softmax
    o = scaled(p["outputs"]["output"], factor)
    return judge_run(sb, p, [outputs_doc("float64", {"output": o})])


add("3-wrong", "sdpa, value x 1e154, program 1.87x", lambda sb: sdpa_scaled(sb, 1e154, 1.87), WRONG, needs=TORCH)
add("3-wrong", "sdpa, value x 1e154, program exact", lambda sb: sdpa_scaled(sb, 1e154, 1), OK(), needs=TORCH)
add("3-wrong", "sdpa, value x 1e-170, program 3x", lambda sb: sdpa_scaled(sb, 1e-170, 3), WRONG, needs=TORCH)
add("3-wrong", "sdpa, value x 1e-170, program exact", lambda sb: sdpa_scaled(sb, 1e-170, 1), OK(), needs=TORCH)
add("3-wrong", "single element 1.5e154, program 2.8e154", lambda sb: single(sb, 1.5e154, 2.8e154), WRONG,
    needs=TORCH)
add("3-wrong", "single element 1e308, program 1.7e308", lambda sb: single(sb, 1e308, 1.7e308), WRONG,
    needs=TORCH)
add("3-wrong", "single element 1e308, program exact", lambda sb: single(sb, 1e308, 1e308), OK(), needs=TORCH)
add("3-wrong", "single element 1e308, program -1.7e308", lambda sb: single(sb, 1e308, -1.7e308), WRONG,
    needs=TORCH)
for _s, _hows in ((1e-170, ["3x", "negated", "zeros", "exact"]), (1e300, ["1e-3", "exact"]),
                  (1e-300, ["1e-3", "exact"]), (1e154, ["2x"]), (1e-160, ["zeros"])):
    for _h in _hows:
        add("3-wrong", f"matmul, input x {_s:g}, program {_h}",
            (lambda s, h: lambda sb: matmul_scaled(sb, s, h))(_s, _h), OK() if _h == "exact" else WRONG,
            needs=TORCH)
add("3-wrong", "softmax, program 1e-3 off (control)", lambda sb: softmax_off(sb, 1 + 1e-3), WRONG, needs=TORCH)
add("3-wrong", "softmax, program exact (control)", lambda sb: softmax_off(sb, 1), OK(), needs=TORCH)


# ---- 4. crashes: nesting, sizes that wrap ----------------------------------------------------------------


def _nest_llama(cmd):
    def setup(sb):
        doc = copy.deepcopy(sb.res.llama)
        doc["config"]["rope_theta"] = "__NEST__"
        sb.json("f.json", doc, {'"__NEST__"': NEST})
        if cmd == "check":
            return Run([sb.tp, "check", "--fixture", "f.json"])
        return Run([sb.tp, "eval", "--fixture", "f.json", "--out", "o.json"])
    return setup


def _nest_book(sb):
    sb.json("f.json", book(config={"d_in": "__NEST__", "d_out": 2}), {'"__NEST__"': NEST})
    return Run([sb.tp, "check", "--fixture", "f.json"])


def _nest_name(sb):
    sb.json("f.json", book(name="__NEST__"), {'"__NEST__"': NEST})
    return Run([sb.tp, "eval", "--fixture", "f.json", "--out", "o.json"])


def _nest_data(sb):
    d = book()
    d["inputs"]["x"]["data"][0] = "__NEST__"
    sb.json("f.json", d, {'"__NEST__"': NEST})
    return Run([sb.tp, "eval", "--fixture", "f.json", "--out", "o.json"])


def _nest_forward(sb):
    sb.json("f.json", book(forward={"need_weights": "__NEST__"}), {'"__NEST__"': NEST_OBJ})
    return Run([sb.tp, "check", "--fixture", "f.json"])


def _nest_baseline(cmd):
    def setup(sb):
        b = copy.deepcopy(sb.res.softmax_baseline if cmd == "judge" else json.loads(
            (REPO / "fixtures" / "baseline.json").read_text()))
        b["environment"]["torch"] = "__NEST__"
        sb.json("b.json", b, {'"__NEST__"': NEST})
        if cmd == "gate":
            sb.mkdir("empty")
            return Run([sb.tp, "gate", "--fixtures", "empty", "--baseline", "b.json"])
        sb.copy(sb.res.softmax_path, "p.json")
        sb.json("o.json", sb.res.softmax_o64)
        return Run([sb.tp, "judge", "--problem", "p.json", "--outputs", "o.json", "--baseline", "b.json"])
    return setup


def _nest_outputs(sb):
    sb.copy(sb.res.softmax_path, "p.json")
    o = copy.deepcopy(sb.res.softmax_o64)
    o["outputs"]["output"]["dtype"] = "__NEST__"
    sb.json("o.json", o, {'"__NEST__"': NEST})
    return Run([sb.tp, "judge", "--problem", "p.json", "--outputs", "o.json"])


def _nest_census(sb):
    c = census_doc()
    c["kernel"] = "__NEST__"
    sb.json("c.json", c, {'"__NEST__"': NEST})
    return Run([sb.tp, "census", "--merge", "c.json"])


add("4-crash", "LLaMA config.rope_theta: 100k nested arrays (check)", _nest_llama("check"), BAD("rope_theta"),
    needs=TORCH)
add("4-crash", "LLaMA config.rope_theta: 100k nested arrays (eval)", _nest_llama("eval"), BAD("rope_theta"),
    needs=TORCH)
add("4-crash", "book config.d_in: 100k nested arrays", _nest_book, BAD("d_in"))
add("4-crash", "name: 100k nested arrays", _nest_name, BAD(NAME, not_contains=NOT_OS_NAME))
add("4-crash", "inputs data[0]: 100k nested arrays", _nest_data, BAD("inputs.x"))
add("4-crash", "forward value: 100k nested objects", _nest_forward, BAD("forward"))
add("4-crash", "gate --baseline environment: 100k nested arrays", _nest_baseline("gate"), BAD("environment"))
add("4-crash", "judge --baseline environment: 100k nested arrays", _nest_baseline("judge"), BAD("environment"),
    needs=TORCH)
add("4-crash", "outputs file dtype: 100k nested arrays", _nest_outputs, BAD("o.json"), needs=TORCH)
add("4-crash", "census --merge kernel: 100k nested arrays", _nest_census, BAD("c.json"))


def _wrap(shapes, cmd):
    def setup(sb):
        sb.json("f.json", matmul_problem(None, None, shapes=shapes))
        if cmd == "eval":
            return Run([sb.tp, "eval", "--fixture", "f.json", "--out", "o.json"])
        if cmd == "eval-torch":
            return Run([sb.tp, "eval", "--impl", "torch", "--fixture", "f.json", "--out", "o.json"])
        return Run([sb.tp, "export", "--fixture", "f.json", "--out", "out"])
    return setup


SIZE = ("expected an integer <=", "expected at most 2147483648 elements", "above --max-elements",
        "the product of its sizes overflows", "expected an integer >= 0")
add("4-crash", "matmul [2^31,0] x [0,2^33] (2^64 wraps to 0)", _wrap(([2**31, 0], [0, 2**33]), "eval"),
    BAD("f.json", any_of=SIZE))
add("4-crash", "matmul [2^31,0] x [0,2^33] (LibTorch)", _wrap(([2**31, 0], [0, 2**33]), "export"),
    BAD("f.json", any_of=SIZE), needs=TORCH)
add("4-crash", "matmul [2^62,0] x [0,4] (2^64 wraps)", _wrap(([2**62, 0], [0, 4]), "eval"),
    BAD("f.json", any_of=SIZE))
add("4-crash", "matmul [2^40,0] x [0,2^40]", _wrap(([2**40, 0], [0, 2**40]), "eval-torch"),
    BAD("f.json", any_of=SIZE), needs=TORCH)
add("4-crash", "matmul batch [2^33,1,1,0] x [1,2^33,0,1]", _wrap(([2**33, 1, 1, 0], [1, 2**33, 0, 1]), "eval"),
    BAD("f.json", any_of=SIZE))
add("4-crash", "matmul shape [-1,3] x [3,2]", _wrap(([-1, 3], [3, 2]), "eval"), BAD("shape"))
add("4-crash", "matmul shape [2^63,0] x [0,2]", _wrap(([2**63, 0], [0, 2]), "eval"), BAD("shape"))


# ---- 5. Ctrl-C and SIGTERM during exec --------------------------------------------------------------------


def _sig(sig, mode="sleep", keep=False):
    def setup(sb):
        opts = ["--case", "sdpa"] + (["--keep", "k"] if keep else [])
        return Run(sb.exec_argv(*opts, mode=mode, timeout="60"), timeout=15, signal_=sig)
    return setup


def _setsid(sb):
    return Run(sb.exec_argv("--case", "sdpa", "--dtype", "float64", mode="setsid", timeout="2"), timeout=15)


add("5-signal", "SIGINT during exec (program sleeping)", _sig(signal.SIGINT), INTERRUPTED(signal.SIGINT),
    needs=TORCH, serial=True)
add("5-signal", "SIGTERM during exec (program sleeping)", _sig(signal.SIGTERM), INTERRUPTED(signal.SIGTERM),
    needs=TORCH, serial=True)
add("5-signal", "SIGINT during exec (program with a child)", _sig(signal.SIGINT, "spawn-sleep"),
    INTERRUPTED(signal.SIGINT), needs=TORCH, serial=True)
add("5-signal", "SIGINT during exec --keep (program sleeping)", _sig(signal.SIGINT, keep=True),
    INTERRUPTED(signal.SIGINT), needs=TORCH, serial=True)
add("5-signal", "setsid grandchild + hang past --timeout 2", _setsid,
    FAIL(stderr=("timed out after 2 s and was killed", "the program left 1 process(es) running; killed")),
    needs=TORCH, serial=True)
add("5-signal", "program exits 0 leaving a setsid daemon", lambda sb: Run(sb.exec_argv(
    "--case", "sdpa", "--dtype", "float64", mode="daemon"), timeout=30),
    OK(stderr=("the program left 1 process(es) running; killed",)), needs=TORCH, serial=True)


# ---- 6. outputs --------------------------------------------------------------------------------------------


def _out_is_dir(sb):
    sb.copy(FIXTURES / "book_selfattn_v1.json", "f.json")
    sb.mkdir("o.json")
    return Run([sb.tp, "eval", "--fixture", "f.json", "--out", "o.json", "--tensors", "safetensors"],
               checks=[no_file("o.safetensors")])


def _out_readonly(sb):
    sb.copy(FIXTURES / "book_selfattn_v1.json", "f.json")
    ro = sb.mkdir("ro")
    if not IS_ROOT:
        os.chmod(ro, 0o555)
    return Run([sb.tp, "eval", "--fixture", "f.json", "--out", "ro/o.json", "--tensors", "safetensors"],
               user=NOBODY, checks=[no_file("ro/o.safetensors")])


def _out_st_is_dir(sb):
    sb.copy(FIXTURES / "book_selfattn_v1.json", "f.json")
    sb.mkdir("o.safetensors")
    return Run([sb.tp, "eval", "--fixture", "f.json", "--out", "o.json", "--tensors", "safetensors"],
               checks=[no_file("o.json")])


def _gate_update_junit(sb):
    sb.mkdir("empty")
    sb.copy(REPO / "fixtures" / "baseline.json", "b.json")
    return Run([sb.tp, "gate", "--update-baseline", "--baseline", "b.json", "--fixtures", "empty", "--junit",
                "missing/j.xml"])


def _gate_junit_missing(sb):
    sb.mkdir("empty")
    sb.copy(REPO / "fixtures" / "baseline.json", "b.json")
    return Run([sb.tp, "gate", "--baseline", "b.json", "--fixtures", "empty", "--junit", "missing_dir/j.xml"],
               timeout=30, max_seconds=3.0)


def _judge_update_junit(sb):
    sb.copy(sb.res.softmax_path, "p.json")
    sb.json("o.json", sb.res.softmax_o64)
    sb.json("b.json", sb.res.softmax_baseline)
    return Run([sb.tp, "judge", "--problem", "p.json", "--outputs", "o.json", "--baseline", "b.json",
                "--update-baseline", "--junit", "missing/j.xml"])


def _eval_out_is_fixture(sb):
    sb.copy(FIXTURES / "book_selfattn_v1.json", "f.json")
    return Run([sb.tp, "eval", "--fixture", "f.json", "--out", "f.json"])


def _eval_out_tensor_stem(sb):
    doc = json.loads(sb.res.sdpa_st_json.read_text())
    doc["tensor_file"] = "t.safetensors"
    sb.json("p.json", doc)
    sb.copy(sb.res.sdpa_st_bin, "t.safetensors")
    return Run([sb.tp, "eval", "--fixture", "p.json", "--out", "t.json"])


def _eval_out_link(sb):
    sb.copy(FIXTURES / "book_selfattn_v1.json", "f.json")
    sb.write(sb.o("target.json"), '{"canary": "target"}\n')
    sb.link("o.json", "../outside/target.json")
    return Run([sb.tp, "eval", "--fixture", "f.json", "--out", "o.json"])


def _eval_out_overwrite(sb):  # control: an existing regular output file is replaced, atomically
    sb.copy(FIXTURES / "book_selfattn_v1.json", "f.json")
    sb.write("o.json", "old\n")
    return Run([sb.tp, "eval", "--fixture", "f.json", "--out", "o.json"], may_write=("o.json",))


def _judge_junit(kind):
    def setup(sb):
        sb.copy(sb.res.softmax_path, "p.json")
        sb.json("o.json", sb.res.softmax_o64)
        argv = [sb.tp, "judge", "--problem", "p.json", "--outputs", "o.json"]
        if kind == "link":
            sb.write(sb.o("j.xml"), "<canary/>\n")
            sb.link("j.xml", "../outside/j.xml")
            return Run(argv + ["--junit", "j.xml"])
        if kind == "baseline":
            sb.json("b.json", sb.res.softmax_baseline)
            return Run(argv + ["--baseline", "b.json", "--junit", "b.json"])
        if kind == "problem":
            return Run(argv + ["--junit", "p.json"])
        if kind == "outputs":
            return Run(argv + ["--junit", "o.json"])
        raise ValueError(kind)
    return setup


def _concurrent(sb):
    """Two evals of the same cost writing one --out; their outputs differ in shape ([4, 2] and [5, 2]), so
    a JSON and a tensor file of different runs show. The race is a matter of timing: rounds repeat it."""
    sb.copy(FIXTURES / "book_selfattn_v1.json", "a.json")
    d = book()
    d["inputs"]["x"]["shape"] = [5, 3]
    d["inputs"]["x"]["data"] += [0.25, -0.5, 0.75]
    for sec in ("outputs", "outputs_float32", "components", "components_float32"):
        d.pop(sec, None)
    sb.json("b.json", d)
    argv = [sb.tp, "eval", "--out", "same.json", "--tensors", "safetensors", "--fixture"]
    return Run(argv + ["a.json"], parallel=[argv + ["b.json"]], repeat=12)


def _export_out_link(sb):
    sb.mkdir(sb.o("dir"))
    sb.link("outlink", "../outside/dir")
    return Run([sb.tp, "export", "--case", "sdpa", "--out", "outlink"])


def _export_out_file_link(sb):
    sb.mkdir("out")
    sb.write(sb.o("sdpa.json"), '{"canary": "sdpa.json"}\n')
    sb.link("out/sdpa.json", "../../outside/sdpa.json")
    return Run([sb.tp, "export", "--case", "sdpa", "--out", "out"])


def _export_out_is_file(sb):
    sb.write("out", "a file\n")
    return Run([sb.tp, "export", "--case", "sdpa", "--out", "out"])


def _exec_keep_file(sb):
    sb.write("k", "a file\n")
    return Run(sb.exec_argv("--case", "sdpa", "--keep", "k"), checks=[program_not_started])


def _exec_keep_fixture_dir(sb):
    sb.copy(FIXTURES / "book_selfattn_v1.json", "fx/book_selfattn_v1.json")
    return Run(sb.exec_argv("--fixture", "fx/book_selfattn_v1.json", "--keep", "fx"))


def _exec_junit_missing(sb):
    return Run(sb.exec_argv("--case", "sdpa", "--junit", "missing/j.xml"), checks=[program_not_started])


def _sweep_csv(kind):
    def setup(sb):
        argv = [sb.tp, "sweep", "--case", "sdpa", "--seq", "2", "--csv"]
        if kind == "device":
            os.mknod(sb.w("full"), stat.S_IFCHR | 0o666, os.makedev(1, 7))
            return Run(argv + ["full"])
        if kind == "/dev/full":
            return Run(argv + ["/dev/full"], user=NOBODY)
        if kind == "readonly":
            ro = sb.mkdir("ro")
            if not IS_ROOT:
                os.chmod(ro, 0o555)
            return Run(argv + ["ro/x.csv"], user=NOBODY)
        if kind == "link":
            sb.write(sb.o("x.csv"), "canary\n")
            sb.link("x.csv", "../outside/x.csv")
            return Run(argv + ["x.csv"])
        raise ValueError(kind)
    return setup


add("6-output", "eval --out o.json that is a directory (--tensors safetensors)", _out_is_dir, BAD("o.json"))
add("6-output", "eval --out into a read-only folder (--tensors safetensors)", _out_readonly, BAD("ro/o."))
add("6-output", "eval --out o.json whose o.safetensors is a directory", _out_st_is_dir, BAD("o.safetensors"))
add("6-output", "gate --update-baseline --junit missing/j.xml", _gate_update_junit,
    BAD(any_of=("missing/j.xml", "--junit")))
add("6-output", "gate --junit missing_dir/j.xml (before the run)", _gate_junit_missing,
    BAD(any_of=("missing_dir/j.xml", "--junit")))
add("6-output", "judge --update-baseline --junit missing/j.xml", _judge_update_junit,
    BAD(any_of=("missing/j.xml", "--junit")), needs=TORCH)
add("6-output", "eval --fixture f.json --out f.json", _eval_out_is_fixture, BAD("f.json"))
add("6-output", "eval --out t.json over the fixture's tensor_file t.safetensors", _eval_out_tensor_stem,
    BAD("t."), needs=TORCH)
add("6-output", "eval --out that is a symlink", _eval_out_link, BAD("o.json", any_of=LINK))
add("6-output", "eval --out over an existing regular file (control)", _eval_out_overwrite, OK())
add("6-output", "judge --junit that is a symlink", _judge_junit("link"), BAD("j.xml", any_of=LINK), needs=TORCH)
add("6-output", "judge --junit equal to --baseline", _judge_junit("baseline"), BAD("b.json"), needs=TORCH)
add("6-output", "judge --junit equal to --problem", _judge_junit("problem"), BAD("p.json"), needs=TORCH)
add("6-output", "judge --junit equal to --outputs", _judge_junit("outputs"), BAD("o.json"), needs=TORCH)
add("6-output", "two concurrent eval --out same.json --tensors safetensors", _concurrent, OK(), needs=TORCH)
add("6-output", "export --out a folder that is a symlink", _export_out_link, BAD("outlink", any_of=LINK),
    needs=TORCH)
add("6-output", "export --out whose sdpa.json is a symlink", _export_out_file_link, BAD("sdpa.json", any_of=LINK),
    needs=TORCH)
add("6-output", "export --out that is a file", _export_out_is_file, BAD("out"), needs=TORCH)
add("6-output", "exec --keep that is a file", _exec_keep_file, BAD(any_of=("--keep", "k:")), needs=TORCH,
    serial=True)
add("6-output", "exec --keep = the fixture's own folder", _exec_keep_fixture_dir, BAD("fx", "a file this run reads"),
    needs=TORCH, serial=True)
add("6-output", "exec --junit missing/j.xml (before the program runs)", _exec_junit_missing,
    BAD(any_of=("missing/j.xml", "--junit")), needs=TORCH, serial=True)
add("6-output", "sweep --csv a character device (/dev/full's node in work/)", _sweep_csv("device"), BAD("full"),
    needs=("torch", "root"))
add("6-output", "sweep --csv /dev/full (as nobody)", _sweep_csv("/dev/full"), BAD("/dev/full"), needs=TORCH)
add("6-output", "sweep --csv into a read-only folder", _sweep_csv("readonly"), BAD("ro/x.csv"), needs=TORCH)
add("6-output", "sweep --csv that is a symlink", _sweep_csv("link"), BAD("x.csv", any_of=LINK), needs=TORCH)


# ---- 7. lax readers ---------------------------------------------------------------------------------------

REPEATED = ("twice", "repeat", "duplicate", "more than once", "once")


def _dup_fixture(sb):
    d = book()
    d["inputs"]["x"]["data"] = "__DUP__"
    good = json.dumps(book()["inputs"]["x"]["data"])
    sb.json("f.json", d, {'"__DUP__"': '"not an array", "data": ' + good})
    return Run([sb.tp, "check", "--fixture", "f.json"])


def _dup_outputs(sb):
    sb.copy(sb.res.softmax_path, "p.json")
    o = copy.deepcopy(sb.res.softmax_o64)
    good = json.dumps(o["outputs"]["output"])
    o["outputs"]["output"] = "__DUP__"
    sb.json("o.json", o, {'"__DUP__"': '{"dtype": "float64", "shape": [1], "data": [0]}, "output": ' + good})
    return Run([sb.tp, "judge", "--problem", "p.json", "--outputs", "o.json"])


def _dup_baseline(sb):
    sb.copy(sb.res.softmax_path, "p.json")
    sb.json("o.json", sb.res.softmax_o64)
    b = copy.deepcopy(sb.res.softmax_baseline)
    k = sorted(b["entries"])[0]
    sb.json("b.json", b, {f'"{k}": ': f'"{k}": "bad", "{k}": '})
    return Run([sb.tp, "judge", "--problem", "p.json", "--outputs", "o.json", "--baseline", "b.json"])


def _dup_problem(sb):
    p = copy.deepcopy(sb.res.softmax)
    sb.json("p.json", p, {'"name": "softmax"': '"name": "other", "name": "softmax"'})
    sb.json("o.json", sb.res.softmax_o64)
    return Run([sb.tp, "judge", "--problem", "p.json", "--outputs", "o.json"])


def _dup_st_header(sb):
    doc = json.loads(sb.res.sdpa_st_json.read_text())
    sb.json("p.json", doc)
    header, data = st_split(sb.res.sdpa_st_bin.read_bytes())
    text = json.dumps(header)
    k = sorted(x for x in header if x != "__metadata__")[0]
    text = text.replace("{", "{" + json.dumps(k) + ": " + json.dumps({"dtype": "F64", "shape": [0],
                                                                        "data_offsets": [0, 0]}) + ", ", 1)
    h = text.encode()
    sb.write("sdpa.safetensors", len(h).to_bytes(8, "little") + h + data)
    return Run([sb.tp, "eval", "--fixture", "p.json", "--out", "o.json"])


add("7-lax", "fixture: \"data\" twice, the first malformed", _dup_fixture, BAD("data", any_of=REPEATED))
add("7-lax", "outputs file: \"output\" twice", _dup_outputs, BAD("o.json", any_of=REPEATED), needs=TORCH)
add("7-lax", "baseline: an entry twice", _dup_baseline, BAD("b.json", any_of=REPEATED), needs=TORCH)
add("7-lax", "problem: \"name\" twice", _dup_problem, BAD("p.json", any_of=REPEATED), needs=TORCH)
add("7-lax", "safetensors header: a key twice (regression)", _dup_st_header, BAD("sdpa.safetensors"), needs=TORCH)


def _big(where):
    def setup(sb):
        if where == "module":
            sb.json("f.json", book(module=BIG))
        elif where == "config":
            sb.json("f.json", book(config={"d_in": BIG, "d_out": 2}))
        elif where == "dtype":
            d = book()
            d["inputs"]["x"]["dtype"] = BIG
            sb.json("f.json", d)
        elif where == "name":
            sb.json("f.json", book(name=BIG))
        elif where == "key":
            d = book()
            d[BIG] = 1
            sb.json("f.json", d)
        elif where == "llama":
            d = copy.deepcopy(sb.res.llama)
            d["config"]["rope_theta"] = BIG
            sb.json("f.json", d)
        elif where in ("baseline", "outputs"):
            sb.copy(sb.res.softmax_path, "p.json")
            o = copy.deepcopy(sb.res.softmax_o64)
            b = copy.deepcopy(sb.res.softmax_baseline)
            if where == "baseline":
                b["entries"][sorted(b["entries"])[0]] = BIG
            else:
                o["dtype"] = BIG
            sb.json("o.json", o)
            sb.json("b.json", b)
            return Run([sb.tp, "judge", "--problem", "p.json", "--outputs", "o.json", "--baseline", "b.json"])
        return Run([sb.tp, "check", "--fixture", "f.json"])
    return setup


add("7-lax", "10 MB string as module", _big("module"), BAD("module"))
add("7-lax", "10 MB string as book config.d_in", _big("config"), BAD("d_in"))
add("7-lax", "10 MB string as a tensor's dtype", _big("dtype"), BAD("dtype"))
add("7-lax", "10 MB string as name", _big("name"), BAD(NAME, not_contains=NOT_OS_NAME))
add("7-lax", "10 MB string as a field's key", _big("key"), BAD("f.json"))
add("7-lax", "10 MB string as LLaMA config.rope_theta", _big("llama"), BAD("rope_theta"), needs=TORCH)
add("7-lax", "10 MB string as a baseline entry", _big("baseline"), BAD("entries"), needs=TORCH)
add("7-lax", "10 MB string as an outputs file's dtype", _big("outputs"), BAD("dtype"), needs=TORCH)
add("7-lax", "matmul [2^31,0] x [0,2^31]: 2^62 elements, legal sizes", _wrap(([2**31, 0], [0, 2**31]), "eval"),
    BAD("f.json", any_of=SIZE))
add("7-lax", "matmul [2^31,0] x [0,2^31] (LibTorch)", _wrap(([2**31, 0], [0, 2**31]), "eval-torch"),
    BAD("f.json", any_of=SIZE), needs=TORCH)


def _wrong_shape(where, cmd):
    def setup(sb):
        if cmd == "check":
            d = book()
            t = d[where.split(".")[0]][where.split(".")[1]]
            n = len(t["data"])
            t["shape"] = [n // 2, 2] if where.startswith("components") else [n, 1]
            # the float32 one too, so that the pair stays consistent
            d[where.split(".")[0] + "_float32"][where.split(".")[1]]["shape"] = t["shape"]
            sb.json("f.json", d)
            return Run([sb.tp, "check", "--fixture", "f.json"])
        p = copy.deepcopy(sb.res.sdpa)
        sec, name = where.split(".")
        for s in (sec, sec + "_float32"):
            t = p[s][name]
            t["shape"] = [len(t["data"])]
        sb.json("p.json", p)
        o = outputs_doc("float64", sb.res.sdpa["outputs"])
        sb.json("o.json", o)
        return Run([sb.tp, "judge", "--problem", "p.json", "--outputs", "o.json"])
    return setup


add("7-lax", "check: stored components.scores of the wrong shape", _wrong_shape("components.scores", "check"),
    BAD("f.json", "components.scores"))
add("7-lax", "judge: stored components.scores of the wrong shape", _wrong_shape("components.scores", "judge"),
    BAD("p.json", "components.scores"), needs=TORCH)
add("7-lax", "check: stored outputs.output of the wrong shape", _wrong_shape("outputs.output", "check"),
    BAD("f.json", "outputs.output"))
add("7-lax", "judge: stored outputs.output of the wrong shape", _wrong_shape("outputs.output", "judge"),
    BAD("p.json", "outputs"), needs=TORCH)


def _probe(kind):
    def setup(sb):
        sb.write("probe.py", PROBE)
        src = sb.res.softmax_path
        if kind == "nested":
            d = json.loads(src.read_text())
            d["config"]["dim"] = "__NEST__"
            sb.json("p.json", d, {'"__NEST__"': NEST})
        elif kind == "fifo":
            sb.fifo("p.json")
        elif kind == "link":
            sb.copy(src, sb.o("real.json"))
            sb.link("p.json", "../outside/real.json")
        elif kind == "repeated":
            sb.json("p.json", json.loads(src.read_text()), {'"name": "softmax"': '"name": "x", "name": "softmax"'})
        elif kind == "tensor_file link":
            sb.copy(sb.res.sdpa_st_json, "p.json")
            sb.copy(sb.res.sdpa_st_bin, sb.o("real.safetensors"))
            sb.link("sdpa.safetensors", "../outside/real.safetensors")
        elif kind == "tensor_file fifo":
            sb.copy(sb.res.sdpa_st_json, "p.json")
            sb.fifo("sdpa.safetensors")
        return Run([PY, "probe.py", str(REPO / "python"), "p.json"], timeout=10)
    return setup


for _k in ("nested", "fifo", "link", "repeated", "tensor_file link", "tensor_file fifo"):
    add("7-lax", f"tparity_io.load_problem: {_k} -> ValueError", _probe(_k), OK("^ValueError"), needs=TORCH)


# ---- 8. what real users hit through exec -------------------------------------------------------------------


def _exec_partial(sb):
    return Run(sb.exec_argv("--full", "--case", "sdpa", mode="echo-scores"))  # --full: the notes


def _distinct_reports(sb, r):
    """rc 0/1: two distinct report names and two problem files kept (nothing collided)."""
    if r.rc == 2:
        return []
    names = re.findall(r"^case (\S+):", r.stdout.decode("utf-8", "replace"), re.M)
    p = []
    if len(names) != len(set(names)):
        p.append("two reports of one name: " + ", ".join(sorted({n for n in names if names.count(n) > 1})))
    kept = [f for f in glob.glob(str(sb.w("k") / "*.json")) if not f.endswith(".out.json")]
    if len(kept) < 2:
        p.append(f"{len(kept)} problem file(s) kept for two cases: they collided in --keep")
    return p


def _exec_same_name(sb):
    sb.copy(sb.res.sdpa_path, "f.json")  # a fixture named "sdpa"
    return Run(sb.exec_argv("--full", "--case", "sdpa", "--fixture", "f.json", "--keep", "k"),
               checks=[_distinct_reports])  # --full: each report's "case NAME:" header


def _exec_same_case_twice(sb):
    return Run(sb.exec_argv("--full", "--case", "sdpa", "--case", "sdpa", "--keep", "k"), checks=[_distinct_reports])


def _exec_declined(sb):
    return Run(sb.exec_argv("--case", "sdpa", "--case", "softmax", mode="decline"))


def _mask_none(cmd, c):
    def setup(sb):
        if cmd == "run":
            return Run([sb.tp, "run", "--case", c, "--mask", "none"])
        if cmd == "export":
            return Run([sb.tp, "export", "--case", c, "--mask", "none", "--out", "out"])
        return Run(sb.exec_argv("--case", c, "--mask", "none"))
    return setup


def _nothing_written(sb, r):
    left = [str(p.relative_to(sb.work)) for p in sb.w("out").rglob("*") if p.is_file()] if sb.w(
        "out").exists() else []
    return [f"written: {', '.join(left)}"] if left else []


def _export_two_same_name(sb):
    """Two fixtures of one name in two folders: each named after its folder too, both written."""
    sb.copy(FIXTURES / "book_selfattn_v1.json", "a/f.json")
    sb.copy(FIXTURES / "book_selfattn_v1.json", "b/f.json")

    def both_written(sb, r):
        want = {"book_selfattn_v1@a.json", "book_selfattn_v1@b.json"}
        have = {p.name for p in sb.w("out").glob("*.json")} if sb.w("out").exists() else set()
        return [] if have == want else [f"expected {sorted(want)} in out/, got {sorted(have)}"]
    return Run([sb.tp, "export", "--fixture", "a/f.json", "--fixture", "b/f.json", "--out", "out"],
               checks=[both_written])


def _export_two_same_name_one_folder(sb):
    """Two files of one folder with one name: no name tells them apart; refused, nothing written."""
    sb.copy(FIXTURES / "book_selfattn_v1.json", "a/f.json")
    sb.copy(FIXTURES / "book_selfattn_v1.json", "a/g.json")
    return Run([sb.tp, "export", "--fixture", "a/f.json", "--fixture", "a/g.json", "--out", "out"],
               checks=[_nothing_written])


def _exec_placeholder_keep(token):
    def setup(sb):
        return Run(sb.exec_argv("--case", "sdpa", "--keep", "k" + token, mode="checkpath"))
    return setup


def _exec_plain(*opts):
    def setup(sb):
        return Run(sb.exec_argv(*opts))
    return setup


add("8-exec", "program gives only the scores component", _exec_partial,
    OK(r"^\s*note:.*attn_weights"), needs=TORCH, serial=True)
add("8-exec", "a default case and a fixture both named sdpa", _exec_same_name, OK(r"^case sdpa@work: "),
    needs=TORCH, serial=True)
add("8-exec", "the same case twice (--case sdpa --case sdpa)", _exec_same_case_twice, BAD("--case sdpa", "also that of option --case sdpa"),
    needs=TORCH, serial=True)
add("8-exec", "every case declined by the program", _exec_declined, BAD("nothing was judged"),
    needs=TORCH, serial=True)
add("8-exec", "run --case llama --mask none", _mask_none("run", "llama"), BAD("--mask"))
add("8-exec", "run --case gpt2 --mask none", _mask_none("run", "gpt2"), BAD("--mask"))
add("8-exec", "export --case llama --mask none", _mask_none("export", "llama"), BAD("--mask"), needs=TORCH)
add("8-exec", "exec --case gpt2 --mask none", _mask_none("exec", "gpt2"), BAD("--mask"), needs=TORCH, serial=True)
add("8-exec", "export: two fixtures of one name in two folders", _export_two_same_name, OK(), needs=TORCH)
add("8-exec", "export: two fixtures of one name in one folder", _export_two_same_name_one_folder,
    BAD("a/g.json", "book_selfattn_v1"), needs=TORCH)
add("8-exec", "{dtype} inside the --keep path", _exec_placeholder_keep("{dtype}"), OK(), needs=TORCH, serial=True)
add("8-exec", "{out} inside the --keep path", _exec_placeholder_keep("{out}"), OK(), needs=TORCH, serial=True)
add("8-exec", "exec --case sdpa, program echoes the reference (control)", _exec_plain("--case", "sdpa"), OK(),
    needs=TORCH, serial=True)
add("8-exec", "exec --fixture book_selfattn_v1 (control)",
    lambda sb: (sb.copy(FIXTURES / "book_selfattn_v1.json", "f.json"),
                Run(sb.exec_argv("--fixture", "f.json", "--keep", "k")))[1], OK(), needs=TORCH, serial=True)


# ---- 9. ordinary malformed input ---------------------------------------------------------------------------


def _text_fixture(text_fn, cmd="check"):
    def setup(sb):
        text = json.dumps(book())
        sb.write("f.json", text_fn(text))
        if cmd == "eval":
            return Run([sb.tp, "eval", "--fixture", "f.json", "--out", "o.json"])
        return Run([sb.tp, "check", "--fixture", "f.json"])
    return setup


def _doc_fixture(mutate, cmd="check"):
    def setup(sb):
        d = book()
        mutate(d)
        sb.json("f.json", d)
        if cmd == "eval":
            return Run([sb.tp, "eval", "--fixture", "f.json", "--out", "o.json"])
        return Run([sb.tp, "check", "--fixture", "f.json"])
    return setup


def _set(path, value):
    def mutate(d):
        keys = path.split("/")
        for k in keys[:-1]:
            d = d[int(k)] if isinstance(d, list) else d[k]
        last = keys[-1]
        if isinstance(d, list):
            d[int(last)] = value
        elif value is _DELETE:
            del d[last]
        else:
            d[last] = value
    return mutate


_DELETE = object()

add("9-malformed", "truncated JSON", _text_fixture(lambda t: t[: len(t) // 2]), BAD("f.json"))
add("9-malformed", "UTF-8 BOM", _text_fixture(lambda t: "\ufeff" + t), BAD("f.json"))
add("9-malformed", "invalid UTF-8 in the description", lambda sb: (sb.write(
    "f.json", json.dumps(book(description="__X__")).encode().replace(b"__X__", b"\xff\xfe")),
    Run([sb.tp, "check", "--fixture", "f.json"]))[1], BAD("f.json"))
add("9-malformed", "1e999 in data", _text_fixture(lambda t: t.replace('"data": [', '"data": [1e999, ', 1)),
    BAD("f.json"))
add("9-malformed", "bare NaN in data", _text_fixture(lambda t: t.replace('"data": [', '"data": [NaN, ', 1)),
    BAD("f.json"))
add("9-malformed", "a string in data", _doc_fixture(_set("inputs/x/data/0", "abc")), BAD("inputs.x.data"))
add("9-malformed", "null in data", _doc_fixture(_set("inputs/x/data/0", None)), BAD("inputs.x.data"))
add("9-malformed", "negative size in a shape", _doc_fixture(_set("inputs/x/shape/0", -4)), BAD("inputs.x.shape"))
add("9-malformed", "a size of 2^64 in a shape", _doc_fixture(_set("inputs/x/shape/0", 2**64)), BAD("shape"))
add("9-malformed", "a fractional size in a shape", _doc_fixture(_set("inputs/x/shape/0", 4.5)), BAD("shape"))
add("9-malformed", "data one value short", _doc_fixture(lambda d: d["inputs"]["x"]["data"].pop()), BAD("inputs.x"))
add("9-malformed", "data one value long", _doc_fixture(lambda d: d["inputs"]["x"]["data"].append(1.0)),
    BAD("inputs.x"))
add("9-malformed", "unknown module", _doc_fixture(_set("module", "Transformer9000")), BAD("module"))
add("9-malformed", "unknown format", _doc_fixture(_set("format", "tparity.fixtur")), BAD("format"))
add("9-malformed", "unknown version 3", _doc_fixture(_set("version", 3)), BAD("version"))
add("9-malformed", "version as a string", _doc_fixture(_set("version", "2")), BAD("version"))
add("9-malformed", "unknown top-level field", _doc_fixture(_set("extra", 1)), BAD("extra"))
add("9-malformed", "unknown config key", _doc_fixture(_set("config/d_hidden", 3)), BAD("d_hidden"))
add("9-malformed", "dtype float8", _doc_fixture(_set("inputs/x/dtype", "float8")), BAD("dtype"))
add("9-malformed", "top level an array", lambda sb: (sb.write("f.json", "[1, 2]"),
                                                     Run([sb.tp, "check", "--fixture", "f.json"]))[1],
    BAD("f.json"))
add("9-malformed", "missing state_dict entry", _doc_fixture(lambda d: d["state_dict"].pop("W_key")),
    BAD("W_key"))
add("9-malformed", "config.d_in 0", _doc_fixture(_set("config/d_in", 0)), BAD("d_in"))
add("9-malformed", "config.d_in 2^40 (at odds with the weights)", _doc_fixture(_set("config/d_in", 2**40)),
    BAD("d_in"))
add("9-malformed", "missing file", lambda sb: Run([sb.tp, "check", "--fixture", "nope.json"]), BAD("nope.json"))


def _int64_big(sb):
    d = copy.deepcopy(sb.res.llama)
    d["inputs"]["position_ids"]["data"][0] = 2**60
    sb.json("f.json", d)
    return Run([sb.tp, "eval", "--fixture", "f.json", "--out", "o.json"])


def _int64_neg(sb):
    d = copy.deepcopy(sb.res.llama)
    d["inputs"]["position_ids"]["data"][0] = -5
    sb.json("f.json", d)
    return Run([sb.tp, "eval", "--fixture", "f.json", "--out", "o.json"])


add("9-malformed", "LLaMA position_ids beyond 2^53", _int64_big, BAD("position_ids"), needs=TORCH)
add("9-malformed", "LLaMA position_ids negative", _int64_neg, BAD("position_ids"), needs=TORCH)


def _st(mutate):
    def setup(sb):
        sb.copy(sb.res.sdpa_st_json, "p.json")
        sb.write("sdpa.safetensors", mutate(sb.res.sdpa_st_bin.read_bytes()))
        return Run([sb.tp, "eval", "--fixture", "p.json", "--out", "o.json"])
    return setup


def _st_overlap(blob):
    header, data = st_split(blob)
    names = sorted((k for k in header if k != "__metadata__"), key=lambda k: header[k]["data_offsets"][0])
    header[names[1]]["data_offsets"] = [x - 8 for x in header[names[1]]["data_offsets"]]
    return st_bytes(header, data)


def _st_header_beyond(blob):
    return (len(blob) + 100).to_bytes(8, "little") + blob[8:]


add("9-malformed", "safetensors truncated", _st(lambda b: b[:-10]), BAD("sdpa.safetensors"), needs=TORCH)
add("9-malformed", "safetensors header size beyond the file", _st(_st_header_beyond), BAD("sdpa.safetensors"),
    needs=TORCH)
add("9-malformed", "safetensors overlapping offsets", _st(_st_overlap), BAD("sdpa.safetensors"), needs=TORCH)
add("9-malformed", "safetensors empty", _st(lambda b: b""), BAD("sdpa.safetensors"), needs=TORCH)


def _baseline_entry(value):
    def setup(sb):
        sb.copy(sb.res.softmax_path, "p.json")
        sb.json("o.json", sb.res.softmax_o64)
        b = copy.deepcopy(sb.res.softmax_baseline)
        b["entries"][sorted(b["entries"])[0]] = value
        sb.json("b.json", b)
        return Run([sb.tp, "judge", "--problem", "p.json", "--outputs", "o.json", "--baseline", "b.json"])
    return setup


add("9-malformed", "baseline entry negative", _baseline_entry(-1.0), BAD("entries"), needs=TORCH)
add("9-malformed", "baseline entry a string", _baseline_entry("0.5"), BAD("entries"), needs=TORCH)
add("9-malformed", "baseline entry null", _baseline_entry(None), BAD("entries"), needs=TORCH)


def _outputs_file(mutate):
    def setup(sb):
        sb.copy(sb.res.softmax_path, "p.json")
        o = copy.deepcopy(sb.res.softmax_o64)
        mutate(o)
        sb.json("o.json", o)
        return Run([sb.tp, "judge", "--problem", "p.json", "--outputs", "o.json"])
    return setup


add("9-malformed", "outputs: dtype float32 holding float64 tensors", _outputs_file(_set("dtype", "float32")),
    BAD("o.json", "dtype"), needs=TORCH)
add("9-malformed", "outputs: wrong format", _outputs_file(_set("format", "tparity.output")), BAD("format"),
    needs=TORCH)
add("9-malformed", "outputs: empty unsupported", lambda sb: (sb.copy(sb.res.softmax_path, "p.json"), sb.json(
    "o.json", {"format": "tparity.outputs", "version": 1, "unsupported": ""}), Run(
    [sb.tp, "judge", "--problem", "p.json", "--outputs", "o.json"]))[2], BAD("unsupported"), needs=TORCH)
add("9-malformed", "outputs: output of the wrong shape", _outputs_file(_set("outputs/output/shape", [30])),
    BAD("outputs.output"), needs=TORCH)
add("9-malformed", "outputs: NaN where the reference is finite",
    _outputs_file(_set("outputs/output/data/0", "nan")), WRONG, needs=TORCH)


def _opt(*argv, needs_problem=False):
    def setup(sb):
        args = []
        for a in argv:
            args.append(sb.tp if a == "TP" else a)
        if needs_problem:
            sb.copy(sb.res.softmax_path, "p.json")
            sb.json("o.json", sb.res.softmax_o64)
        if "prog.py" in args:
            sb.prog()
        sb.copy(FIXTURES / "book_selfattn_v1.json", "f.json")
        return Run(args, checks=[program_not_started])
    return setup


EXEC_TAIL = ("--", PY, "prog.py", "echo", "{problem}", "{out}", "{dtype}")
add("9-malformed", "exec --timeout 0", _opt("TP", "exec", "--case", "sdpa", "--timeout", "0", *EXEC_TAIL),
    BAD("--timeout"), needs=TORCH, serial=True)
add("9-malformed", "exec --timeout nan", _opt("TP", "exec", "--case", "sdpa", "--timeout", "nan", *EXEC_TAIL),
    BAD("--timeout"), needs=TORCH, serial=True)
add("9-malformed", "exec --timeout -1", _opt("TP", "exec", "--case", "sdpa", "--timeout", "-1", *EXEC_TAIL),
    BAD("--timeout"), needs=TORCH, serial=True)
add("9-malformed", "exec --dtype float8", _opt("TP", "exec", "--case", "sdpa", "--dtype", "float8", *EXEC_TAIL),
    BAD("--dtype"), needs=TORCH, serial=True)
add("9-malformed", "exec without {problem}", _opt("TP", "exec", "--case", "sdpa", "--", PY, "prog.py", "echo"),
    BAD("{problem}"), needs=TORCH, serial=True)
add("9-malformed", "judge --factor 0.5", _opt("TP", "judge", "--problem", "p.json", "--outputs", "o.json",
                                              "--factor", "0.5", needs_problem=True), BAD("--factor"), needs=TORCH)
add("9-malformed", "judge --factor nan", _opt("TP", "judge", "--problem", "p.json", "--outputs", "o.json",
                                              "--factor", "nan", needs_problem=True), BAD("--factor"), needs=TORCH)
add("9-malformed", "gate --factor 0.5", _opt("TP", "gate", "--factor", "0.5"), BAD("--factor"))
add("9-malformed", "eval --dtype float8", _opt("TP", "eval", "--fixture", "f.json", "--out", "o.json", "--dtype",
                                               "float8"), BAD("--dtype"))
add("9-malformed", "eval --impl cuda", _opt("TP", "eval", "--fixture", "f.json", "--out", "o.json", "--impl",
                                            "cuda"), BAD("--impl"))
add("9-malformed", "run --max-elements -1", _opt("TP", "run", "--case", "sdpa", "--max-elements", "-1"),
    BAD("--max-elements"))
add("9-malformed", "run --max-elements 0", _opt("TP", "run", "--case", "sdpa", "--max-elements", "0"),
    BAD("--max-elements"))
add("9-malformed", "run --seed -1", _opt("TP", "run", "--case", "sdpa", "--seed", "-1"), BAD("--seed"))
add("9-malformed", "run --batch -1", _opt("TP", "run", "--case", "sdpa", "--batch", "-1"), BAD("--batch"))
add("9-malformed", "run --seq 2^40 --kv-seq 2^40 (sizes beyond --max-elements)",
    _opt("TP", "run", "--case", "sdpa", "--seq", str(2**40), "--kv-seq", str(2**40)), BAD("--max-elements"))
add("9-malformed", "run --scale nan", _opt("TP", "run", "--case", "sdpa", "--scale", "nan"), BAD("--scale"))
add("9-malformed", "run --case nope", _opt("TP", "run", "--case", "nope"), BAD("--case"))
add("9-malformed", "sweep --shard 3/2", _opt("TP", "sweep", "--case", "sdpa", "--shard", "3/2"), BAD("--shard"))
add("9-malformed", "census --merge: wrong format", lambda sb: (sb.json("c.json", {"format": "x"}), Run(
    [sb.tp, "census", "--merge", "c.json"]))[1], BAD("c.json"))
add("9-malformed", "census --merge: rows missing", lambda sb: (sb.json("c.json", {
    k: v for k, v in census_doc().items() if k != "rows"}), Run([sb.tp, "census", "--merge", "c.json"]))[1],
    BAD("c.json"))
add("9-malformed", "census --merge: alarms a number", lambda sb: (sb.json("c.json", dict(census_doc(), rows=[
    {"case": "sdpa", "isa": "avx512", "points": 1, "alarms": 7}])), Run(
    [sb.tp, "census", "--merge", "c.json"]))[1], BAD("c.json"))
add("9-malformed", "unknown subcommand", _opt("TP", "frobnicate"), BAD("frobnicate"))
add("9-malformed", "judge without --outputs", _opt("TP", "judge", "--problem", "p.json", needs_problem=True),
    BAD("--outputs"), needs=TORCH)


# ---------------------------------------------------------------------------------------------------
# Running a case
# ---------------------------------------------------------------------------------------------------


def entry(p: Path):
    st = os.lstat(p)
    m = st.st_mode
    if stat.S_ISLNK(m):
        return ("link", os.readlink(p))
    if stat.S_ISDIR(m):
        return ("dir", st.st_mtime_ns)
    if stat.S_ISREG(m):
        h = hashlib.sha256()
        with open(p, "rb") as f:
            for chunk in iter(lambda: f.read(1 << 20), b""):
                h.update(chunk)
        return ("file", st.st_size, st.st_mtime_ns, h.hexdigest())
    if stat.S_ISFIFO(m):
        return ("fifo",)
    if stat.S_ISCHR(m):
        return ("chr", st.st_rdev)
    return ("other", m)


def snapshot(root: Path, exclude=()) -> dict:
    out = {}
    if not root.exists():
        return out
    for dirpath, dirnames, filenames in os.walk(root, followlinks=False):
        rel_dir = os.path.relpath(dirpath, root)
        if rel_dir == ".":
            dirnames[:] = [d for d in dirnames if d not in exclude]
            filenames = [f for f in filenames if f not in exclude]
        for n in dirnames + filenames:
            p = Path(dirpath) / n
            try:
                out[os.path.normpath(os.path.join(rel_dir, n))] = entry(p)
            except OSError as e:
                out[os.path.normpath(os.path.join(rel_dir, n))] = ("error", str(e))
    return out


def diff(before: dict, after: dict, ignore_dir_mtime=False) -> list[str]:
    p = []
    for k, v in before.items():
        a = after.get(k)
        if a is None:
            p.append(f"{k} removed")
        elif a != v:
            if ignore_dir_mtime and a[0] == "dir" and v[0] == "dir":
                continue
            p.append(f"{k} changed ({v[0]} -> {a[0]})" if a[0] != v[0] else f"{k} changed")
    for k in after:
        if k not in before:
            p.append(f"{k} created")
    return p


def file_hash(path):
    try:
        return entry(Path(path))
    except OSError as e:
        return ("error", str(e))


def alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    try:
        with open(f"/proc/{pid}/stat") as f:
            state = f.read().rsplit(")", 1)[1].split()[0]
        return state not in ("Z", "X")
    except OSError:
        return False


def recorded_pids(sb) -> list[int]:
    try:
        return [int(x) for x in sb.pidfile.read_text().split() if x.strip().isdigit()]
    except OSError:
        return []


def half_written(sb, before: dict) -> list[str]:
    """New or changed files under work/: JSON parses, tensor_file pairs agree, no orphans or temporaries."""
    after = snapshot(sb.work)
    changed = [k for k, v in after.items() if v[0] == "file" and before.get(k) != v]
    p = []
    referenced = set()
    for k in changed:
        name = os.path.basename(k)
        path = sb.work / k
        if re.search(r"\.tmp\d*$|\.tmp\.|^\.tparity-.*\.tmp$", name):
            p.append(f"temporary file left: {k}")
            continue
        if name.endswith(".json"):
            try:
                doc = json.loads(path.read_bytes())
            except (ValueError, OSError) as e:
                p.append(f"{k}: not JSON ({str(e)[:60]})")
                continue
            if isinstance(doc, dict) and isinstance(doc.get("tensor_file"), str):
                tf = os.path.join(os.path.dirname(k), doc["tensor_file"])
                referenced.add(os.path.normpath(tf))
                p += tensor_pair(sb.work / tf, doc, k)
        elif name.endswith(".xml"):
            try:
                ET.parse(path)
            except (ET.ParseError, OSError) as e:
                p.append(f"{k}: not XML ({str(e)[:60]})")
    for k in changed:
        if k.endswith(".safetensors") and os.path.normpath(k) not in referenced:
            p.append(f"{k}: a tensor file no new JSON names (half of a pair)")
    return p


def tensor_pair(path: Path, doc: dict, where: str) -> list[str]:
    if not path.is_file():
        return [f"{where}: tensor_file {path.name} missing"]
    try:
        from safetensors import safe_open
        with safe_open(str(path), framework="np") as f:
            shapes = {k: list(f.get_slice(k).get_shape()) for k in f.keys()}
    except Exception as e:  # noqa: BLE001
        return [f"{where}: tensor_file {path.name} unreadable ({str(e)[:60]})"]
    declared = {}

    def walk(x):
        if isinstance(x, dict):
            if "file" in x and "shape" in x:
                declared[x["file"]] = list(x["shape"])
            else:
                for v in x.values():
                    walk(v)
    walk(doc)
    p = []
    for k, s in declared.items():
        if k not in shapes:
            p.append(f"{where}: names tensor {k} absent from {path.name}")
        elif shapes[k] != s:
            p.append(f"{where}: {k} declared {s}, {path.name} holds {shapes[k]} (another run's?)")
    for k in shapes:
        if k not in declared:
            p.append(f"{where}: {path.name} holds {k}, which the JSON does not name")
    return p


def wait_for_binary(tparity: str):
    for _ in range(60):
        if os.access(tparity, os.X_OK):
            return
        time.sleep(1)


class Runner:
    def __init__(self, tparity: str, root: Path, res: Resources, torch: bool, prlimit: Optional[str]):
        self.tp = tparity
        self.root = root
        self.res = res
        self.torch = torch
        self.prlimit = prlimit

    def start(self, sb, run, argv):
        env = os.environ.copy()
        env.update({"TMPDIR": str(sb.tmp), "HOSTILE_PIDS": str(sb.pidfile)})
        env.update(run.env)
        argv = [str(a) for a in argv]
        if argv[0] == self.tp and self.prlimit:
            argv = [self.prlimit, f"--as={MEM_LIMIT}", "--"] + argv
        kw = dict(cwd=sb.work, stdin=subprocess.DEVNULL, stdout=subprocess.PIPE, stderr=subprocess.PIPE, env=env,
                  start_new_session=True)
        if run.user is not None and IS_ROOT:
            kw.update(user=run.user, group=run.user, extra_groups=[])
        return subprocess.Popen(argv, **kw)

    def run_once(self, sb, run, r: Result):
        """Starts the argv (and the parallel ones) and pumps their output to EOF within the timeout. A run
        has finished when its processes have exited and their stdout and stderr are closed: a process left
        holding them (a grandchild of tparity's) is a hang too, found 2 s after tparity's exit."""
        argvs = [run.argv] + list(run.parallel)
        wait_for_binary(self.tp)
        t0 = time.monotonic()
        procs = [self.start(sb, run, a) for a in argvs]
        deadline = t0 + run.timeout
        sel = selectors.DefaultSelector()
        bufs = {}
        for i, pr in enumerate(procs):
            for nm, f in (("out", pr.stdout), ("err", pr.stderr)):
                os.set_blocking(f.fileno(), False)
                sel.register(f, selectors.EVENT_READ, (i, nm))
                bufs[(i, nm)] = bytearray()
        state = {"sent": run.signal_ is None, "exited": None}
        sig_at = t0 + float(run.signal_when) if run.signal_ is not None and run.signal_when != "pid" else None

        def pump(until, grace=None):
            """'closed' (every pipe at EOF), 'deadline', or 'held' (all exited, pipes open `grace` s later)."""
            while sel.get_map():
                now = time.monotonic()
                if now >= until:
                    return "deadline"
                if grace is not None:
                    if state["exited"] is None and all(pr.poll() is not None for pr in procs):
                        state["exited"] = now
                    if state["exited"] is not None and now - state["exited"] > grace:
                        return "held"
                if not state["sent"]:
                    ready = (sig_at is not None and now >= sig_at) or (
                        sig_at is None and recorded_pids(sb) and now - t0 > 0.3)
                    if ready:
                        time.sleep(0.3)
                        try:
                            os.kill(procs[0].pid, run.signal_)
                        except ProcessLookupError:
                            pass
                        state["sent"] = True
                for key, _ in sel.select(timeout=min(0.05, max(0.0, until - now))):
                    try:
                        data = os.read(key.fileobj.fileno(), 1 << 16)
                    except BlockingIOError:
                        continue
                    if data:
                        if len(bufs[key.data]) < (64 << 20):
                            bufs[key.data] += data
                    else:
                        sel.unregister(key.fileobj)
            return "closed"

        status = pump(deadline, grace=2.0)
        if status == "closed":
            for pr in procs:
                try:
                    pr.wait(timeout=max(0.05, deadline - time.monotonic()))
                except subprocess.TimeoutExpired:
                    status = "deadline"
        r.seconds = time.monotonic() - t0
        if status != "closed":
            for pr in procs:  # tparity's own group
                if pr.poll() is None:
                    try:
                        os.killpg(pr.pid, signal.SIGKILL)
                    except (ProcessLookupError, PermissionError):
                        pass
            self.reap_survivors(sb, r)
            pump(time.monotonic() + 3)
            for pr in procs:
                try:
                    pr.wait(timeout=5)
                except subprocess.TimeoutExpired:
                    pass
            how = ", ".join(f"pid {pr.pid} " + (f"exited {pr.returncode}" if pr.returncode is not None
                                                 else "still running") for pr in procs)
            if status == "held":
                r.checks["time"].append(f"exited, but its stdout/stderr stayed open 2 s later (held by a process it "
                                        f"started): {how}")
            else:
                r.checks["time"].append(f"not finished (exited, stdout/stderr closed) within {run.timeout:g} s; {how}")
        for key in list(sel.get_map().values()):
            sel.unregister(key.fileobj)
        for pr in procs:
            pr.stdout.close()
            pr.stderr.close()
        if not state["sent"]:
            r.checks["expect"].append("the signal was never sent (the program never started)")
        r.rc = procs[0].returncode
        r.stdout = bytes(bufs[(0, "out")])
        r.stderr = bytes(bufs[(0, "err")])
        results = [(pr.returncode, bytes(bufs[(i, "out")]), bytes(bufs[(i, "err")])) for i, pr in enumerate(procs)]
        for i, (rc, _, _) in enumerate(results):
            tag = "" if i == 0 else f"parallel run {i}: "
            if rc is None:
                continue
            if rc < 0:
                r.checks["exit"].append(f"{tag}killed by signal {-rc} ({signal.Signals(-rc).name})")
            elif rc not in EXIT_CODES:
                r.checks["exit"].append(f"{tag}exit code {rc}")
        if run.max_seconds is not None and r.seconds > run.max_seconds:
            r.checks["time"].append(f"took {r.seconds:.1f} s, expected a refusal within {run.max_seconds:g} s")
        return results

    def reap_survivors(self, sb, r: Result, wait=0.0):
        """Processes a stand-in recorded that are still alive: each a failure, then killed."""
        t_end = time.monotonic() + wait
        survivors = [p for p in recorded_pids(sb) if alive(p) and p not in r.reaped]
        while survivors and time.monotonic() < t_end:
            time.sleep(0.05)
            survivors = [p for p in survivors if alive(p)]
        for pid in survivors:
            r.reaped.add(pid)
            r.checks["procs"].append(f"pid {pid} (started by the program) survived tparity (killed now)")
            try:
                os.kill(pid, signal.SIGKILL)
            except OSError:
                pass

    def run_case(self, idx: int, c: Case) -> Result:
        r = Result(c, idx)
        for col in ("time", "exit", "outside", "inputs", "links", "procs", "files", "expect"):
            r.checks[col] = []
        if "torch" in c.needs and not self.torch:
            r.skipped = "needs LibTorch (this tparity was built without it)"
            return r
        if "torch" in c.needs and self.res.error:
            r.skipped = self.res.error
            return r
        if "root" in c.needs and not IS_ROOT:
            r.skipped = "needs root (mknod)"
            return r
        caseroot = self.root / f"case-{idx:03d}"
        sb = Sandbox(caseroot, self.tp, self.res)
        try:
            run = c.setup(sb)
        except Exception as e:  # noqa: BLE001
            r.checks["expect"].append(f"setup failed: {type(e).__name__}: {e}")
            return r
        r.argv = [str(a) for a in run.argv]
        if run.user is not None and IS_ROOT and not others_reach(self.tp):
            r.skipped = (f"another user cannot run {self.tp}: a folder on the way lets no one else in (a checkout "
                         f"inside mktemp -d's 0700 folder); clone where others may enter to run this case")
            return r
        if run.user is not None and IS_ROOT:
            os.chown(sb.tmp, run.user, run.user)
        box_before = snapshot(sb.box, exclude=("work", "tmp", "pids"))
        work_before = snapshot(sb.work)
        links = {k: v for k, v in {**{("work/" + k): v for k, v in work_before.items()},
                                   **{k: v for k, v in box_before.items()}}.items() if v[0] == "link"}
        link_targets = {}  # the path each link resolves to, and that file's state
        for k in links:
            t = (sb.box / k).resolve()
            link_targets[k] = (t, file_hash(t) if t.exists() and t.is_file() else None)
        external = {p: file_hash(p) for p in run.external}
        for _ in range(run.repeat):
            results = self.run_once(sb, run, r)
            # expectations on every process of the round
            exp = run.expect_override or c.expect
            for i, (rc, out, err) in enumerate(results):
                for prob in exp.problems(rc, out, err):
                    r.checks["expect"].append(prob if i == 0 else f"parallel run {i}: {prob}")
            for chk in run.checks:
                r.checks["expect"] += chk(sb, r)
            r.checks["files"] += half_written(sb, work_before)
            if any(r.checks.values()):
                break
            if run.repeat > 1:  # the next round starts from the same inputs
                for k, v in snapshot(sb.work).items():
                    if k not in work_before and v[0] == "file":
                        os.unlink(sb.work / k)
        # processes a stand-in started (a moment for a kill tparity sent just before it exited)
        self.reap_survivors(sb, r, wait=1.5)
        # outside work/
        box_after = snapshot(sb.box, exclude=("work", "tmp", "pids"))
        work_after = snapshot(sb.work)
        r.checks["outside"] += [d for d in diff({k: v for k, v in box_before.items() if v[0] != "link"},
                                                {k: v for k, v in box_after.items()
                                                 if not (k in links and v[0] == "link")})]
        parent = sorted(os.listdir(caseroot))
        if parent != ["box"]:
            r.checks["outside"].append("parent folder holds " + ", ".join(x for x in parent if x != "box"))
        left = sorted(os.listdir(sb.tmp))
        if left:
            r.checks["outside"].append("left in TMPDIR: " + ", ".join(left[:3]))
        # the folders tparity put the program's problems in: outside work/ (a temporary one, in TMPDIR
        # or /tmp if it ignored TMPDIR) it must be gone. Attributed by the stand-in's own record, not by
        # a glob of /tmp/tparity-exec-*, which other runs on a shared machine also create.
        try:
            given = set(os.path.dirname(x) for x in (sb.pids / "paths.txt").read_text().split("\n") if x)
        except OSError:
            given = set()
        for d in sorted(given):
            if not d.startswith(str(sb.work) + os.sep) and os.path.isdir(d):
                r.checks["outside"].append(f"exec's temporary folder left: {d}")
                shutil.rmtree(d, ignore_errors=True)
        for p, h in external.items():
            if file_hash(p) != h:
                r.checks["outside"].append(f"{p} changed")
        # inputs: every pre-existing entry of work/ unchanged (links: their own column)
        for k, v in work_before.items():
            if v[0] == "link" or any(Path(k).match(g) for g in run.may_write):
                continue
            a = work_after.get(k)
            if a is None:
                r.checks["inputs"].append(f"{k} removed")
            elif v[0] == "dir" and a[0] == "dir":
                continue
            elif a != v:
                r.checks["inputs"].append(f"{k} modified" if a[0] == v[0] else f"{k} became a {a[0]}")
        # links
        for k, v in links.items():
            a = (box_after if not k.startswith("work/") else {("work/" + x): y for x, y in work_after.items()}).get(k)
            if a is None:
                r.checks["links"].append(f"link {k} removed")
            elif a != v:
                r.checks["links"].append(f"link {k} replaced by a {a[0]}" if a[0] != "link" else f"link {k} retargeted")
            t, h = link_targets[k]
            if h is not None and file_hash(t) != h:
                r.checks["links"].append(f"link {k}'s target {t} modified")
        return r


# ---------------------------------------------------------------------------------------------------
# Main
# ---------------------------------------------------------------------------------------------------

COLUMNS = ("time", "exit", "outside", "inputs", "links", "procs", "files", "expect")


def one_line(b: bytes, n=100) -> str:
    s = b.decode("utf-8", "replace")
    s = s.replace("\n", "\\n")
    s = "".join(ch if ch.isprintable() else f"\\x{ord(ch):02x}" for ch in s)
    return s[:n] + ("..." if len(s) > n else "")


def verdict(r: Result) -> str:
    if r.skipped:
        return "SKIP"
    bad = [c for c in COLUMNS if r.checks.get(c)]
    return "PASS" if not bad else "FAIL(" + ",".join(bad) + ")"


def line(r: Result) -> str:
    rc = "-" if r.rc is None else str(r.rc)
    return (f"{r.idx:3d} {r.case.cls:11s} {r.case.name[:58]:58s} exp={r.case.expect.label():9s} rc={rc:>3s} "
            f"{r.seconds:5.1f}s {verdict(r):24s} {one_line(r.stderr)!s}")


def md_escape(s: str) -> str:
    return s.replace("|", "\\|").replace("`", "'")


def write_markdown(path: str, results: list[Result], tparity: str, version: str):
    rows = ["| # | class | input | expected | what tparity did | verdict |", "|---|---|---|---|---|---|"]
    for r in results:
        if r.skipped:
            did = "skipped: " + r.skipped
        else:
            did = f"exit {r.rc}, {r.seconds:.1f} s"
            if r.stderr:
                did += ": `" + md_escape(one_line(r.stderr, 140)) + "`"
            probs = [f"{c}: {p}" for c in COLUMNS for p in r.checks.get(c, [])]
            if probs:
                did += "<br>" + "<br>".join(md_escape(p[:160]) for p in probs[:4])
        rows.append(f"| {r.idx} | {r.case.cls} | {md_escape(r.case.name)} | {r.case.expect.label()} | {did} | "
                    f"{verdict(r)} |")
    n_pass = sum(r.passed for r in results)
    n_skip = sum(bool(r.skipped) for r in results)
    head = (f"# tparity hostile inputs\n\n`tests/hostile/hostile.py --tparity {tparity}`; {version}\n\n"
            f"{len(results)} cases: {n_pass} pass, {len(results) - n_pass - n_skip} fail, {n_skip} skipped.\n\n")
    Path(path).write_text(head + "\n".join(rows) + "\n")


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--tparity", default=str(REPO / "build" / "tparity"))
    ap.add_argument("-k", dest="filter", action="append", default=[],
                    help="only cases whose 'class/name' contains this (repeatable: any of them)")
    ap.add_argument("--markdown", help="write the table (class | input | what tparity did | verdict) here")
    ap.add_argument("--list", action="store_true", help="list the cases and exit")
    ap.add_argument("--jobs", type=int, default=2, help="cases run at once (exec cases always one at a time)")
    ap.add_argument("--root", help="sandbox root (default: a new temporary directory)")
    ap.add_argument("--keep-root", action="store_true", help="keep the sandboxes afterwards")
    ap.add_argument("-v", "--verbose", action="store_true", help="print each failing check in full")
    ap.add_argument("--quiet", action="store_true", help="print failing cases and the summary only")
    a = ap.parse_args(argv)

    chosen = [(i, c) for i, c in enumerate(CASES, 1)
              if not a.filter or any(f in f"{c.cls}/{c.name}" for f in a.filter)]
    if a.list:
        for i, c in chosen:
            print(f"{i:3d} {c.cls:11s} {c.name:62s} {c.expect.label():10s} {'torch' if 'torch' in c.needs else ''}")
        by = {}
        for _, c in chosen:
            by[c.cls] = by.get(c.cls, 0) + 1
        print(f"{len(chosen)} cases: " + ", ".join(f"{k} {v}" for k, v in sorted(by.items())))
        return 0

    tparity = os.path.abspath(a.tparity)
    wait_for_binary(tparity)
    try:
        version = subprocess.run([tparity, "--version"], capture_output=True, text=True, timeout=60).stdout.strip()
    except (OSError, subprocess.TimeoutExpired) as e:
        print(f"hostile: cannot run {tparity}: {e}", file=sys.stderr)
        return 2
    torch = "no LibTorch" not in version and "LibTorch" in version
    if not torch:
        print(f"note: {tparity} has no LibTorch: the cases that need it are skipped", flush=True)
    root = Path(a.root) if a.root else Path(tempfile.mkdtemp(prefix="tparity-hostile-"))
    root.mkdir(parents=True, exist_ok=True)
    os.chmod(root, 0o755)
    t0 = time.monotonic()
    res = Resources(root, tparity, torch)
    if res.error:
        print(f"note: {res.error}", flush=True)
    prlimit = shutil.which("prlimit")
    runner = Runner(tparity, root, res, torch, prlimit)
    if not a.quiet:
        print(f"{version}\n{len(chosen)} cases, sandboxes in {root}\n", flush=True)

    results: dict[int, Result] = {}
    lock = threading.Lock()

    def go(ic):
        i, c = ic
        try:
            r = runner.run_case(i, c)
        except Exception as e:  # noqa: BLE001  (the driver's own failure is a failure)
            r = Result(c, i)
            r.checks = {col: [] for col in COLUMNS}
            r.checks["expect"].append(f"driver error: {type(e).__name__}: {e}")
        with lock:
            results[i] = r
            if not a.quiet or (not r.passed and not r.skipped):
                print(line(r), flush=True)
            if a.verbose:
                for col in COLUMNS:
                    for p in r.checks.get(col, []):
                        print(f"      {col}: {p}", flush=True)
        return r

    par = [ic for ic in chosen if not ic[1].serial]
    ser = [ic for ic in chosen if ic[1].serial]
    with ThreadPoolExecutor(max_workers=max(1, a.jobs)) as ex:
        list(ex.map(go, par))
    for ic in ser:
        go(ic)

    ordered = [results[i] for i, _ in chosen]
    failed = [r for r in ordered if not r.passed and not r.skipped]
    skipped = [r for r in ordered if r.skipped]
    if not a.quiet:
        print()
    by = {}
    for r in ordered:
        s = by.setdefault(r.case.cls, [0, 0, 0])
        s[0 if r.passed else 2 if r.skipped else 1] += 1
    for k, (p, f, s) in sorted(by.items()):
        if not a.quiet:
            print(f"  {k:11s} {p:3d} pass {f:3d} fail {s:3d} skipped")
    cols = {c: sum(bool(r.checks.get(c)) for r in ordered) for c in COLUMNS}
    if any(cols.values()):
        print("  failing checks: " + ", ".join(f"{c} {n}" for c, n in cols.items() if n))
    if failed:
        print("\nfailures:")
        for r in failed:
            print(f"{r.idx:3d} {r.case.cls} / {r.case.name}")
            for col in COLUMNS:
                for p in r.checks.get(col, [])[:4]:
                    print(f"      {col}: {p[:200]}")
    print(f"\nhostile: {len(ordered)} cases, {len(ordered) - len(failed) - len(skipped)} passed, {len(failed)} "
          f"failed, {len(skipped)} skipped ({time.monotonic() - t0:.0f} s)")
    if a.markdown:
        write_markdown(a.markdown, ordered, a.tparity, version)
    if not a.keep_root and not a.root:
        shutil.rmtree(root, ignore_errors=True)
    elif a.keep_root:
        print(f"sandboxes kept in {root}")
    return 0 if not failed else 1


if __name__ == "__main__":
    sys.exit(main())
