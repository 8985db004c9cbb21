#!/usr/bin/env bash
# ctest engine.serving (label model): runs kvpack-engine on the real model with two policies
# (int4-g32 per-token keys; kivi4 per-channel keys with an fp32 residual window, the hardest case
# for rollback) and checks its JSON: >= 8 sequences, shared pages counted once (pool_bytes well
# below pool_bytes_if_unshared), every request identical to its solo run, every rollback
# identical to never appending the rejected tokens, forks isolated, the preempted request's pages
# swapped out and back bit-identical. Exit 77 (skipped) without
# the model: KVPACK_MODEL_PATH names the GGUF file (bash tools/fetch_model.sh prints it).
set -euo pipefail
engine=$1
if [ -z "${KVPACK_MODEL_PATH:-}" ] || [ ! -f "$KVPACK_MODEL_PATH" ]; then
  echo "engine.serving: KVPACK_MODEL_PATH unset or not a file: skipped"
  exit 77
fi
out=$(mktemp -d)
trap 'rm -rf "$out"' EXIT
# 6 requests of up to 16 new tokens after a 200-token prefix: 8 sequences with the forks, drafts
# rolled back, the preempted request's pages swapped (kivi4's residual window keeps 128 tokens out
# of the pages, so a shorter prefix would leave nothing to share or swap); 23 s each on 2 cores,
# where the engine's defaults (10 requests, 384-token prefix) took 47 s.
for policy in int4-g32 kivi4; do
  "$engine" --model "$KVPACK_MODEL_PATH" --policy "$policy" --requests 6 --max-new 16 --prefix 200 \
    --json "$out/$policy.json" > "$out/$policy.log" ||
    { rc=$?; tail -n 30 "$out/$policy.log"; echo "engine.serving: $policy exited with $rc"; exit "$rc"; }
done
python3 - "$out/int4-g32.json" "$out/kivi4.json" <<'PY'
import json, sys
ok = True
for path in sys.argv[1:]:
    j = json.load(open(path))
    checks = {
        "sequences >= 8": j["sequences"] >= 8,
        "pool_bytes < 0.6 x pool_bytes_if_unshared": j["pool_bytes"] < 0.6 * j["pool_bytes_if_unshared"],
        "identical_to_solo": j["identical_to_solo"] is True,
        "rollback_identical": j["rollback_identical"] is True and j["rollback_checks"] > 0,
        "fork_isolated": j["fork_isolated"] is True,
        "swap: pages moved out and back identical": j["swap"]["pages"] > 0 and j["swap"]["identical"] is True,
        "tokens_per_s > 0": j["tokens_per_s"] > 0,
    }
    for name, good in checks.items():
        print(f"{j['policy']}: {name}: {'ok' if good else 'FAILED'}")
        ok = ok and good
sys.exit(0 if ok else 1)
PY
