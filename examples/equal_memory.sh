#!/usr/bin/env bash
# What it shows: README's equal-memory table and plot (issue 24), remade on this machine. Every
# policy of the `equal-memory` group (quantization alone, deletion under both protocols, demotion,
# their mixes) is scored by kvpack-eval on SmolLM2-135M, WikiText-2 test, ctx 2048, the second half
# of each window; tools/equal_memory.py then puts ΔPPL against the bytes each cache holds at the end
# (as a share of an fp16 cache of the same tokens) beside the kvpress rows measured on the same
# windows (docs/results/kvpress-*.json, made by bench/peers/kvpress_eval.py outside CI), and names
# the best row at each memory level.
#
#   bash examples/equal_memory.sh              # windows 0-7 (README's table): about 70 min on 2 cores
#   bash examples/equal_memory.sh --windows 2  # a quick look (the kvpress rows are then left out)
#
# Writes build-eval/results.{json,md} (kvpack-eval's own tables), build-eval/equal-memory-table.md
# and build-eval/equal-memory.png. Set-up (packages, build, model) is tools/run_eval.sh's.
set -euo pipefail
cd "$(dirname "$0")/.."
windows=8
if [ "${1:-}" = "--windows" ] && [ -n "${2:-}" ]; then windows=$2; fi

bash tools/run_eval.sh --ctx 2048 --windows "$windows" --no-needle --decode-tokens 0 --policies equal-memory

peers=()
if [ "$windows" = 8 ]; then  # the kvpress runs cover windows 0-7 (pooled from runs over 0-3 and 4-7)
  peers=(docs/results/kvpress-ctx2048-4w.json+docs/results/kvpress-ctx2048-w4-15.json@4-7
         docs/results/kvpress-ctx2048-4w.json+docs/results/kvpress-ctx2048-w4-7-rest.json)
fi
python3 tools/equal_memory.py build-eval/results.json "${peers[@]}" \
  --markdown build-eval/equal-memory-table.md --plot build-eval/equal-memory.png
echo "equal_memory: table in build-eval/equal-memory-table.md, plot in build-eval/equal-memory.png" >&2
