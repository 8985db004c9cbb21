#!/usr/bin/env bash
# kvpack-eval on bad input: each case must exit non-zero with a message naming the problem.
# Usage: bad_input.sh KVPACK_EVAL [MODEL] (default: $KVPACK_MODEL_PATH, else the fetch_model.sh
# cache path). Cases needing the model are skipped without it.
set -u
exe=$1
model=${2:-${KVPACK_MODEL_PATH:-${KVPACK_MODEL_DIR:-$HOME/.cache/kvpack/models}/SmolLM2-135M-Instruct.Q4_1.gguf}}
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
fails=0
expect() {  # expect NAME REGEX ARGS...: non-zero exit and REGEX in stderr
  local name=$1 re=$2
  shift 2
  local out rc
  out=$("$exe" "$@" 2>&1 >/dev/null)
  rc=$?
  if [ "$rc" -ne 0 ] && grep -qiE "$re" <<<"$out"; then
    echo "ok   $name (exit $rc): $(head -n1 <<<"$out")"
  else
    echo "FAIL $name (exit $rc): $out"
    fails=$((fails + 1))
  fi
}
expect "missing model" "not found" --model "$tmp/nope.gguf" --no-needle
printf 'GGUF' >"$tmp/short.gguf"
expect "truncated model" "cannot (read|load) model" --model "$tmp/short.gguf" --no-needle
head -c 4096 /dev/urandom >"$tmp/random.gguf"
expect "garbage model" "cannot (read|load) model" --model "$tmp/random.gguf" --no-needle
expect "unknown policy" "unknown policy 'int3'" --policies fp32,int3 --model "$tmp/nope.gguf"
# A registered policy that this build did not compile (-DKVPACK_EVAL_POLICIES=defaults), if any:
# the unknown-policy message lists every registered one, --list-policies the compiled ones.
registered=$("$exe" --policies int3 --model "$tmp/nope.gguf" 2>&1 | sed -n 's/.*(known: \(.*\))$/\1/p' | tr -d ' ' | tr ',' '\n')
not_compiled=$(comm -23 <(sort <<<"$registered") <("$exe" --list-policies | sort) | head -n 1)
if [ -n "$not_compiled" ]; then
  expect "policy not compiled in ($not_compiled)" "is not compiled into this kvpack-eval" --policies "$not_compiled" --model "$tmp/nope.gguf"
fi
expect "missing text" "text.*(not exist|cannot read)" --text "$tmp/none.txt"
expect "text is a directory" "text" --text "$tmp"
expect "needle depth above 100 %" "needle-depths.*not in range" --needle-depths 10,150 --model "$tmp/nope.gguf"
expect "negative needle depth" "needle-depths.*not in range" --needle-depths=-5 --model "$tmp/nope.gguf"
expect "needle length 0" "needle-lengths.*not in range" --needle-lengths 0 --model "$tmp/nope.gguf"
if [ -n "$model" ] && [ -f "$model" ]; then
  head -c 5000000 "$model" >"$tmp/cut.gguf"
  expect "model cut short" "cannot (read|load) model" --model "$tmp/cut.gguf" --no-needle
  echo "some text" >"$tmp/t.txt"
  expect "ctx above the model's context" "exceeds the model's trained context" --model "$model" --text "$tmp/t.txt" --ctx 100000
  expect "text shorter than a window" "fewer than one window" --model "$model" --text "$tmp/t.txt" --ctx 512
else
  echo "skip model-dependent cases: no model at '${model}'"
fi
[ "$fails" -eq 0 ]
