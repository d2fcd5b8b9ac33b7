"""Driving the tparity CLI: `tparity exec` runs the relay once per case and precision, the relay hands
each problem back to this process, which runs the user's code and writes the outputs file; exec
judges it (legs, gates, report, JUnit, baseline) exactly as for any program."""

import functools
import json
import os
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import threading
import traceback
from pathlib import Path

import tparity_io

from ._run import Unsupported

RELAY = Path(__file__).with_name("_relay.py")


def binary(explicit=None):
    """The tparity executable: explicit, $TPARITY_BIN, `tparity` on PATH, or this checkout's build."""
    for candidate in (explicit, os.environ.get("TPARITY_BIN"), shutil.which("tparity"),
                      Path(__file__).resolve().parents[2] / "build" / "tparity"):
        if candidate and os.path.isfile(candidate) and os.access(candidate, os.X_OK):
            return str(candidate)
    raise FileNotFoundError("no tparity executable: give tparity=PATH, set TPARITY_BIN, or put it on PATH "
                            "(./scripts/run builds build/tparity)")


class UsageError(ValueError):
    """tparity refused the request (exit code 2): its one line says what. `skipped` holds the cases
    the code declined ({"name", "reason"}) when that is why nothing was judged."""

    def __init__(self, message, skipped=()):
        super().__init__(message)
        self.skipped = list(skipped)


def _drain(stream, sink, echo):
    for line in stream:
        sink.append(line)
        if echo:
            sys.stderr.write(line)


def _answer(conn, compute, errors):
    """Read one request from the relay, compute it, reply. What the code raised goes into errors
    ({(problem name, dtype): "Type: message"}) for the report's line of that case."""
    with conn:
        data = b""
        while not data.endswith(b"\n"):
            chunk = conn.recv(65536)
            if not chunk:
                return
            data += chunk
        req = json.loads(data)
        error, problem = None, None
        try:
            problem = tparity_io.load_problem(req["problem"])
            try:
                outputs, components, local = compute(problem, req["dtype"])
            except Unsupported as e:
                tparity_io.write_unsupported(req["out"], str(e) or "unsupported")
            else:
                tparity_io.write_outputs(req["out"], req["dtype"], outputs, components, local,
                                         tensors="safetensors" if problem.tensor_file else "inline")
        except (Exception, SystemExit) as e:  # the user's code failed (sys.exit too): the case fails
            traceback.print_exc()
            error = " ".join(f"{type(e).__name__}: {e}".split())
            if problem is not None:
                errors[(problem.name, req["dtype"])] = error
        try:
            conn.sendall((json.dumps({"error": error}) + "\n").encode())
        except OSError:  # the relay is gone: exec timed it out (its report says so) or was interrupted
            pass


def _prctl():
    """libc's prctl, looked up here in the parent (a dlopen in the forked child could wait forever on a
    loader lock another thread of this process held at the fork), or None."""
    try:
        import ctypes
        return ctypes.CDLL(None, use_errno=True).prctl
    except (OSError, AttributeError):
        return None


def _with_parent(prctl, parent):
    """In exec's child before it runs (Linux): SIGTERM when this process dies. exec runs in its own
    session, so a signal to this process's group (a CI job cancelled, a terminal closed) does not
    reach it; this process dying does, and exec removes its work directory as on Ctrl-C."""
    prctl(1, signal.SIGTERM)  # PR_SET_PDEATHSIG
    if os.getppid() != parent:  # died before prctl took
        os.kill(os.getpid(), signal.SIGTERM)


def _parent_death():
    prctl = _prctl() if sys.platform.startswith("linux") else None
    return functools.partial(_with_parent, prctl, os.getpid()) if prctl is not None else None


def _stop(proc, grace=10):
    """End exec as Ctrl-C would: on SIGTERM it kills the relay's process group and removes its work
    directory (SIGKILL would leave both); SIGKILL only if it has not ended within grace seconds."""
    if proc.poll() is not None:
        return
    proc.send_signal(signal.SIGTERM)
    try:
        proc.wait(grace)
    except subprocess.TimeoutExpired:
        proc.kill()


def option_error(args, tparity=None):
    """exec's own line for an option it does not take. With the relay's command after `--`, exec's
    parser names the command's words as the unexpected ones ("not expected: {dtype} {out} {problem}
    .../relay.sock ..."); parsed alone, the options give the line that names the option ("The
    following argument was not expected: --sq"). None when they parse."""
    try:
        r = subprocess.run([binary(tparity), "exec", *args], stdin=subprocess.DEVNULL, capture_output=True,
                           text=True, timeout=60)
    except (OSError, subprocess.TimeoutExpired):
        return None
    lines = [ln for ln in r.stderr.splitlines() if ln.strip()]
    return lines[-1] if r.returncode == 2 and lines and "not expected" in lines[-1] else None


def _bind(server, folder, path):
    """Bind the relay's socket at path, in folder. A Unix socket's path holds at most 107 bytes: under
    a longer $TMPDIR it is bound through this process's descriptor of the folder (Linux's
    /proc/self/fd), a short path to the same place (the relay connects from inside the folder), so that
    it stays in the private folder $TMPDIR holds (it went to /tmp, where a SIGKILL left it)."""
    if len(os.fsencode(path)) < 100:
        return server.bind(path)
    fd = os.open(folder, os.O_RDONLY | os.O_DIRECTORY)
    try:
        server.bind("/proc/self/fd/%d/%s" % (fd, os.path.basename(path)))
    finally:
        os.close(fd)


def run_exec(compute, args, tparity=None, echo=False):
    """`tparity exec ARGS -- relay`, serving compute(problem, dtype) -> (outputs, components, local):
    (exit code, the JSON report or None, standard error, {(case, dtype): what the code raised})."""
    exe = binary(tparity)
    # A Unix socket's path holds at most 107 bytes: past that the socket is bound through a descriptor
    # of its folder (_bind), on Linux; elsewhere the folder goes in /tmp.
    long = len(os.fsencode(os.path.join(tempfile.gettempdir(), "tparity-py-XXXXXXXX", "relay.sock"))) >= 100
    where = "/tmp" if long and not (sys.platform.startswith("linux") and os.path.isdir("/proc/self/fd")) else None
    with tempfile.TemporaryDirectory(prefix="tparity-py-", dir=where) as tmp:
        sock_path = os.path.join(tmp, "relay.sock")
        server = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        _bind(server, tmp, sock_path)
        server.listen(4)
        server.settimeout(0.1)
        cmd = [exe, "exec", "--format", "json", *args, "--", sys.executable, "-I", str(RELAY), sock_path,
               "{problem}", "{out}", "{dtype}"]
        # Its own session: a terminal's Ctrl-C reaches this process alone, which stops exec with one
        # SIGTERM (_stop); a second signal would make exec end at once, leaving its work directory.
        proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                                start_new_session=True, preexec_fn=_parent_death())
        out, err, errors = [], [], {}
        readers = [threading.Thread(target=_drain, args=(proc.stdout, out, False), daemon=True),
                   threading.Thread(target=_drain, args=(proc.stderr, err, echo), daemon=True)]
        for r in readers:
            r.start()
        try:
            while proc.poll() is None:
                try:
                    conn, _ = server.accept()
                except socket.timeout:
                    continue
                conn.settimeout(None)
                _answer(conn, compute, errors)
        except BaseException:  # Ctrl-C, or the code's KeyboardInterrupt: exec must not outlive the call
            _stop(proc)
            raise
        finally:
            server.close()
            proc.wait()
            for r in readers:
                r.join()
        stderr = "".join(err)
        try:  # exit code 2 may still come with a report: nothing judged, every case declined
            report = json.loads("".join(out))
        except ValueError:
            report = None
        return proc.returncode, report, stderr, errors
