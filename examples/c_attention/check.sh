#!/bin/sh
# Compiles attention.c and runs it, as tparity exec would, on every torch.nn.MultiheadAttention fixture
# (fixtures/torch-2.13/mha_*.json and fixtures/torch-1.13/mha_*.json) in both precisions, comparing what
# it writes with the fixture's stored results: float64 against "outputs" (relative l2 <= 1e-10, NaN at
# the same places), float32 against "outputs_float32" (relative l2 <= 1e-5).
#
#     examples/c_attention/check.sh [BUILD]     BUILD: where the binary goes (default: a temporary directory)
#
# One line per fixture and dtype: pass, fail or unsupported. Exit status 1 on any failure, and when one of
# mha_single, mha_batched, mha_multihead, mha_no_weights does not pass; 0 otherwise.
set -eu

here=$(cd "$(dirname "$0")" && pwd)
root=$(cd "$here/../.." && pwd)
python=${TPARITY_PYTHON:-$root/.venv/bin/python}

if ! "$python" -c 'import numpy' 2>/dev/null; then
  echo "check.sh: $python with numpy is needed for the comparison (TPARITY_PYTHON names another)" >&2
  exit 2
fi

if [ $# -ge 1 ]; then
  mkdir -p "$1"
  BUILD=$(cd "$1" && pwd)
else
  BUILD=$(mktemp -d)
  trap 'rm -rf "$BUILD"' EXIT
fi

(cd "$here" && cc -std=c11 -O2 -Wall -Wextra -o "$BUILD/attention" attention.c -lm)

# compare.py FIXTURE DTYPE OUTPUTS: prints "pass ...", "fail ..." or "unsupported ..."; exit 0, 1 or 3.
cat >"$BUILD/compare.py" <<'EOF'
import json
import sys

import numpy as np

fixture_path, dtype, outputs_path = sys.argv[1:4]
NONFINITE = {"inf": np.inf, "-inf": -np.inf, "nan": np.nan}
TOLERANCE = {"float64": 1e-10, "float32": 1e-5}


def tensor(t, where):
    if "data" not in t:
        raise ValueError(f"{where}: no inline data")
    data = [NONFINITE[x] if isinstance(x, str) else x for x in t["data"]]
    return np.array(data, dtype=np.float64).reshape(t["shape"])


def main():
    fixture = json.load(open(fixture_path))
    try:
        got = json.load(open(outputs_path))
    except (OSError, ValueError) as e:
        return 1, f"cannot read the outputs file: {e}"
    if got.get("format") != "tparity.outputs" or got.get("version") != 1:
        return 1, f"not a tparity.outputs version 1 file: format {got.get('format')!r}, version {got.get('version')!r}"
    if "unsupported" in got:
        return 3, got["unsupported"]
    if got.get("dtype") != dtype:
        return 1, f"dtype {got.get('dtype')!r}, the run is {dtype}"
    key = "outputs_float32" if dtype == "float32" and "outputs_float32" in fixture else "outputs"
    want, have = fixture[key], got.get("outputs", {})
    if set(have) != set(want):
        return 1, f"outputs {sorted(have)}, the fixture's {key} has {sorted(want)}"
    notes, ok = [], True
    for name in sorted(want):
        if have[name].get("dtype") != dtype:
            return 1, f"{name}: dtype {have[name].get('dtype')!r}, the run is {dtype}"
        a, b = tensor(have[name], name), tensor(want[name], f"{key}.{name}")
        if a.shape != b.shape:
            return 1, f"{name}: shape {list(a.shape)}, expected {list(b.shape)}"
        nan_a, nan_b = np.isnan(a), np.isnan(b)
        if (nan_a != nan_b).any():
            ok = False
            notes.append(f"{name}: NaN at {int(nan_a.sum())} places, expected {int(nan_b.sum())} "
                         f"({int((nan_a != nan_b).sum())} differ)")
            continue
        inf_a, inf_b = np.isinf(a), np.isinf(b)
        if (inf_a != inf_b).any() or (a[inf_a] != b[inf_b]).any():
            ok = False
            notes.append(f"{name}: infinities at other places than expected")
            continue
        finite = ~(nan_a | inf_a)
        diff = np.linalg.norm(a[finite] - b[finite])
        norm = np.linalg.norm(b[finite])
        rel = diff / norm if norm > 0 else (0.0 if diff == 0 else np.inf)
        nan_note = f" ({int(nan_b.sum())} NaN)" if nan_b.any() else ""
        notes.append(f"{name} rel_l2 {rel:.2e}{nan_note}")
        if not rel <= TOLERANCE[dtype]:
            ok = False
            notes[-1] += f" > {TOLERANCE[dtype]:g}"
    return (0 if ok else 1), ", ".join(notes)


status, line = main()
print(("pass", "fail", "", "unsupported")[status], line)
sys.exit(status)
EOF

passed=0 failed=0 declined=0
required_failures=""
for fixture in "$root"/fixtures/torch-2.13/mha_*.json "$root"/fixtures/torch-1.13/mha_*.json; do
  [ -e "$fixture" ] || continue
  version=$(basename "$(dirname "$fixture")")
  name=$(basename "$fixture" .json)
  for dtype in float64 float32; do
    out="$BUILD/$version.$name.$dtype.json"
    rm -f "$out"
    label=$(printf '%-12s %-36s %-8s' "$version" "$name" "$dtype")
    if ! "$BUILD/attention" "$fixture" "$out" "$dtype" 2>"$BUILD/stderr"; then
      verdict="fail"
      line="fail the program exited non-zero: $(head -n 3 "$BUILD/stderr" | tr '\n' ' ')"
    else
      set +e
      line=$("$python" "$BUILD/compare.py" "$fixture" "$dtype" "$out")
      status=$?
      set -e
      case $status in
        0) verdict=pass ;;
        3) verdict=unsupported ;;
        *) verdict=fail ;;
      esac
    fi
    printf '%s %s\n' "$label" "$line"
    case $verdict in
      pass) passed=$((passed + 1)) ;;
      unsupported) declined=$((declined + 1)) ;;
      *) failed=$((failed + 1)) ;;
    esac
    case $name in
      mha_single | mha_batched | mha_multihead | mha_no_weights)
        [ "$verdict" = pass ] || required_failures="$required_failures $version/$name/$dtype" ;;
    esac
  done
done

echo "$passed pass, $declined unsupported, $failed fail"
if [ -n "$required_failures" ]; then
  echo "required to pass, but did not:$required_failures"
  exit 1
fi
[ "$failed" -eq 0 ]
