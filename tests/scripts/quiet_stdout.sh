#!/usr/bin/env bash
# ./scripts/run --format json > report.json must hold the report alone, on a machine where the install
# steps have something to do. Simulated with stubs first on PATH: dpkg-query says every package is
# missing, apt-get (and sudo, for a non-root run) print their progress to standard output as the real
# ones do. Then the pip step, the function scripts/run calls, with a stub Python whose pip prints to
# standard output. Each must leave standard output to the report and still show its own output on
# standard error. Needs build/ (scripts/test runs it after the first build).
set -euo pipefail
root="$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)"
tmp="$(mktemp -d)"
trap 'rm -rf "$tmp"' EXIT
fail() {
  echo "quiet_stdout: $*" >&2
  exit 1
}

mkdir -p "$tmp/bin"
cat >"$tmp/bin/dpkg-query" <<'STUB'
#!/bin/sh
echo "dpkg-query: no packages found matching $*" >&2
exit 1
STUB
cat >"$tmp/bin/apt-get" <<'STUB'
#!/bin/sh
echo "Reading package lists... Done (stub apt-get $*)"
echo "Setting up a package (stub)"
STUB
cat >"$tmp/bin/sudo" <<'STUB'
#!/bin/sh
exec "$@"
STUB
chmod +x "$tmp/bin/"*

# 1. The Debian packages "missing": scripts/run installs them, then reports.
PATH="$tmp/bin:$PATH" "$root/scripts/run" --format json --case sdpa >"$tmp/report.json" 2>"$tmp/run.err" ||
  fail "scripts/run failed: $(tail -n 3 "$tmp/run.err")"
grep -q "installing missing Debian packages" "$tmp/run.err" || fail "the install step did not run (stubs not used?)"
grep -q "Reading package lists... Done (stub apt-get update" "$tmp/run.err" || fail "apt-get's output is not on stderr"
python3 -c 'import json, sys; doc = json.load(open(sys.argv[1])); assert doc["cases"][0]["name"] == "sdpa"' \
  "$tmp/report.json" || fail "stdout is not one JSON report: $(head -c 300 "$tmp/report.json")"

# 2. The pip step (requirements.txt changed since the last install: no stamp in the environment).
mkdir -p "$tmp/venv/bin"
cat >"$tmp/venv/bin/python" <<'STUB'
#!/bin/sh
[ "$1" = "-m" ] && [ "$2" = "pip" ] || exit 3
echo "Collecting torch==2.13.0 (stub pip)"
echo "Successfully installed torch-2.13.0 (stub pip)"
STUB
chmod +x "$tmp/venv/bin/python"
(
  export TPARITY_VENV="$tmp/venv"
  # shellcheck source=../../scripts/lib.sh
  source "$root/scripts/lib.sh"
  tparity_venv
) >"$tmp/pip.out" 2>"$tmp/pip.err" || fail "the pip step failed: $(tail -n 3 "$tmp/pip.err")"
grep -q "Successfully installed torch-2.13.0 (stub pip)" "$tmp/pip.err" || fail "pip's output is not on stderr"
[ ! -s "$tmp/pip.out" ] || fail "the pip step wrote to stdout: $(head -c 300 "$tmp/pip.out")"
[ -f "$tmp/venv/.requirements.sha256" ] || fail "the pip step left no stamp"
echo "quiet_stdout: stdout holds the report alone with the apt step and the pip step running"
