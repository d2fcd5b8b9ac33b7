#!/usr/bin/env bash
# The any-language protocol end to end (README, "Check your implementation in any language"), as
# ./scripts/test runs it: tparity exec with the numpy example over every default case (each passes,
# none declined), its broken copy (scores scaled by 1/sqrt(E)) failing
# with the first divergence named at scores, the example in bfloat16 and float16 passing and its copy
# with float16 accumulators failing, the C example (libc only) on the seeds' attention
# cases and the committed MultiheadAttention fixtures, and the numpy example's own selfcheck.
# Problems and outputs go inline (the C example, the float16 accumulators) and in safetensors (the
# rest: the numpy example answers in the form it was asked in).
#   tests/scripts/any_language.sh BUILD_DIR PYTHON [all|numpy|rest]
# numpy: part 1 alone (the numpy example over every default case); rest: parts 2 to 5. ./scripts/test
# runs the two at once.
set -euo pipefail
root="$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)"
build="$(cd "$1" && pwd)"
python="$2"
parts="${3:-all}"
case "$parts" in all | numpy | rest) ;; *)
  echo "usage: tests/scripts/any_language.sh BUILD_DIR PYTHON [all|numpy|rest]" >&2
  exit 2
  ;;
esac
cd "$root"
fail() {
  echo "any_language: $*" >&2
  exit 1
}
summary() { grep -E "^[0-9]+ case\(s\):" | tail -n 1; }

# 1. The numpy example: every default case, problems in safetensors form.
if [ "$parts" != rest ]; then
out=$("$build/tparity" exec --tensors safetensors --name "numpy example" --junit "$build/exec-numpy.xml" \
  -- "$python" examples/numpy_attention/run.py {problem} {out} {dtype}) || {
  echo "$out"
  fail "the numpy example failed a case"
}
[ "$(echo "$out" | grep -c '^skipped')" = 0 ] || fail "the numpy example declined a default case: $(echo "$out" | grep '^skipped')"
echo "numpy example: $(echo "$out" | summary), every default case"
fi
[ "$parts" = numpy ] && exit 0

# 2. Its broken copy must fail, and name the scores as the first divergence. (grep -q reads a
# here-string, not a pipe from echo: it exits at its match, and echo's next write into the closed pipe
# would fail the line under pipefail when the output runs past one write, as it does here.)
if out=$("$build/tparity" exec --tensors safetensors --case multihead --case block --name "numpy example, broken" \
  -- "$python" examples/numpy_attention/broken.py {problem} {out} {dtype}); then
  fail "broken.py passed: the scale by 1/sqrt(E) went unseen"
fi
grep -q "first divergence: component scores" <<<"$out" || fail "broken.py: no first divergence at scores: $out"
grep -q "first divergence: component sa.scores" <<<"$out" || fail "broken.py: no first divergence at sa.scores"
grep -q "^FAIL  multihead  first divergence scores (local_hand64: " <<<"$out" ||
  fail "broken.py: the summary line does not name scores: $out"
echo "numpy example, broken: $(echo "$out" | summary), first divergence at scores and sa.scores"

# 3. Low precision, against LibTorch's own error in it: the numpy example in bfloat16 and float16 (weights
# and inputs rounded, float32 arithmetic, every component stored rounded) passes at the seeds' width
# E = 512; its copy with float16 accumulators in the linear layers fails in float16, from the first
# projection on.
# A float16 numpy program at this width takes tens of seconds per case (more on a loaded machine): a
# timeout of its own, above exec's default 60 s.
# (block keeps its own feed-forward width: --ffn would be refused for multihead, which has none.)
wide=(--case multihead --case block --dim 512 --timeout 300)
out=$("$build/tparity" exec "${wide[@]}" --batch 4 --tensors safetensors --dtype bfloat16,float16 \
  --name "numpy example, low precision" \
  -- "$python" examples/numpy_attention/run.py {problem} {out} {dtype}) || {
  echo "$out"
  fail "the numpy example failed in bfloat16 or float16"
}
[ "$(echo "$out" | grep -c '^PASS  [a-z]*/\(bfloat16\|float16\)  ')" = 4 ] || fail "expected 4 low-precision reports: $out"
echo "numpy example in bfloat16 and float16: $(echo "$out" | summary)"
# The float16 accumulators' copy on one batch element: its error against LibTorch's own is the same
# per element (q 2.8x the bound, 9.4x LibTorch's own error, at batch 4 and at batch 1), and its Python
# loop over the sum takes 6 s instead of 18 here.
if out=$("$build/tparity" exec "${wide[@]}" --batch 1 --dtype float16 --name "numpy example, float16 accumulators" \
  -- "$python" examples/numpy_attention/half_accumulate.py {problem} {out} {dtype}); then
  fail "half_accumulate.py passed: float16 accumulation went unseen"
fi
grep -q "FAIL case multihead/float16: component q: leg handf16_vs_torch64" <<<"$out" ||
  fail "half_accumulate.py: q (the first projection) did not fail: $out"
grep -q "FAIL case block/float16: component sa.q: leg handf16_vs_torch64" <<<"$out" ||
  fail "half_accumulate.py: sa.q did not fail"
echo "numpy example with float16 accumulators: $(echo "$out" | summary), failing from q and sa.q"

# 4. The C example, compiled here, on inline problems: three seed cases and every MHA fixture.
cc -std=c11 -O2 -Wall -Wextra -Werror -o "$build/c_attention" examples/c_attention/attention.c -lm
fixtures=()
for f in fixtures/torch-2.13/mha_*.json fixtures/torch-1.13/mha_*.json; do fixtures+=(--fixture "$f"); done
out=$("$build/tparity" exec --case single --case batched --case multihead "${fixtures[@]}" --name "C example" \
  -- "$build/c_attention" {problem} {out} {dtype}) || {
  echo "$out"
  fail "the C example failed a case"
}
echo "C example: $(echo "$out" | summary); $(echo "$out" | grep -c '^skipped') declined"

# 5. The numpy example against every committed fixture's stored results without tparity, and
# tparity_io's own checks (safetensors read and written bit for bit, malformed files refused by name).
out=$("$python" examples/numpy_attention/selfcheck.py) || {
  echo "$out"
  fail "examples/numpy_attention/selfcheck.py failed"
}
echo "numpy example selfcheck: $(echo "$out" | tail -n 1)"
