"""The program `tparity exec` runs for a Python check: it hands the problem to the process that
called tparity.check (over a Unix socket in that process's private folder) and waits for it to write
the outputs file. Standard library only; run as `python -I _relay.py SOCKET PROBLEM OUT DTYPE`."""

import json
import os
import socket
import sys


def main(argv):
    if len(argv) != 4:
        print("usage: _relay.py SOCKET PROBLEM OUT DTYPE", file=sys.stderr)
        return 2
    path, problem, out, dtype = argv
    if len(os.fsencode(path)) >= 100:  # longer than a Unix socket's path holds: connect from its folder
        os.chdir(os.path.dirname(path))
        path = os.path.basename(path)
    with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as s:
        s.connect(path)
        s.sendall((json.dumps({"problem": problem, "out": out, "dtype": dtype}) + "\n").encode())
        reply = b""
        while not reply.endswith(b"\n"):
            chunk = s.recv(65536)
            if not chunk:
                print("the checking process closed the connection", file=sys.stderr)
                return 1
            reply += chunk
    answer = json.loads(reply)
    if answer.get("error"):
        print(answer["error"], file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
