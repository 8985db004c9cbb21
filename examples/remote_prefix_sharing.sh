#!/usr/bin/env bash
# Two-process prefix sharing through Redis (issue 19; README "Shared remote tier").
#
#   process A  prefills a 2k-token WikiText-2 prefix on SmolLM2-135M, publishes its sealed INT4
#              pages to a redis-server, decodes the next token
#   process B  a separate process with a fresh cache: imports the prefix from the server, runs
#              none of it through the model, decodes the next token
#
# With --check: exits non-zero unless B's logits are bit-identical to A's and B ran 0 prefix
# tokens through the model; exits 77 (skipped) when the model is absent (KVPACK_MODEL_PATH).
# Starts its own redis-server on a unix socket in a temp folder and stops it at the end.
#
#   bash examples/remote_prefix_sharing.sh [--check] [--tool PATH] [--tokens N] [--url URL]
# --url uses an existing server instead (redis://host:port/db or unix:///path.sock).
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."
check=0 tool=build/gcc-release/tests/remote/kvpack-remote-prefix tokens=2048 url=""
while [ $# -gt 0 ]; do
  case $1 in
    --check) check=1; shift ;;
    --tool) tool=$2; shift 2 ;;
    --tokens) tokens=$2; shift 2 ;;
    --url) url=$2; shift 2 ;;
    *) echo "unknown argument $1" >&2; exit 2 ;;
  esac
done

model=${KVPACK_MODEL_PATH:-}
if [ -z "$model" ] && [ "$check" = 0 ]; then model=$(bash examples/fetch_model.sh); fi
if [ -z "$model" ] || [ ! -f "$model" ]; then
  echo "skipped: the model is absent (set KVPACK_MODEL_PATH; examples/fetch_model.sh prints it)"
  exit 77
fi
text=${KVPACK_WIKITEXT_PATH:-../shared/data/wikitext-2-raw/wiki.test.raw}
if [ ! -f "$text" ]; then
  # A clean clone has only the first 8 KiB of WikiText-2 test: about 1.9k tokens.
  text=tools/llama/tests/data/wikitext2_test_head.raw
  if [ "$tokens" -gt 1024 ]; then tokens=1024; echo "note: full WikiText-2 absent, using a $tokens-token prefix"; fi
fi

work=$(mktemp -d /tmp/kvpack-remote-example-XXXXXX)
server_pid=""
cleanup() {
  if [ -n "$server_pid" ]; then kill "$server_pid" 2>/dev/null || true; wait "$server_pid" 2>/dev/null || true; fi
  rm -rf "$work"
}
trap cleanup EXIT
if [ -z "$url" ]; then
  redis-server --port 0 --unixsocket "$work/redis.sock" --unixsocketperm 700 --save "" --appendonly no \
    --dir "$work" --logfile "$work/redis.log" --daemonize no &
  server_pid=$!
  for _ in $(seq 100); do  # bounded: 10 s
    if redis-cli -s "$work/redis.sock" ping >/dev/null 2>&1; then break; fi
    sleep 0.1
  done
  url="unix://$work/redis.sock"
fi
# The secret both processes share (seals the pages); any 32 bytes in hex.
KVPACK_REMOTE_KEY=${KVPACK_REMOTE_KEY:-$(od -An -N32 -tx1 /dev/urandom | tr -d ' \n')}
export KVPACK_REMOTE_KEY

echo "== process A: prefill $tokens tokens, publish"
"$tool" publish --model "$model" --text "$text" --url "$url" --tokens "$tokens" --logits "$work/a.logits" | tee "$work/a.out"
echo "== process B: fresh cache, import, decode"
"$tool" import --model "$model" --text "$text" --url "$url" --tokens "$tokens" --logits "$work/b.logits" | tee "$work/b.out"

if [ "$check" = 1 ]; then
  grep -q "prefix_tokens_run_through_model=0 " "$work/b.out" || { echo "FAIL: B ran prefix tokens through the model"; exit 1; }
  grep -q "imported=$tokens " "$work/b.out" || { echo "FAIL: B did not import the whole prefix"; exit 1; }
  cmp "$work/a.logits" "$work/b.logits" || { echo "FAIL: B's logits differ from A's"; exit 1; }
  echo "PASS: B imported all $tokens prefix tokens, ran 0 of them through the model, logits bit-identical to A"
fi
