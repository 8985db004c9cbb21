#!/usr/bin/env bash
# kvpack's main job: build kvpack-eval, fetch SmolLM2-135M-Instruct, score every default KV-cache
# policy on WikiText-2 test (quality vs the fp32 cache, bits/value, KV bytes, tokens/s) and run
# the needle test; prints the tables and writes the quality-vs-bits (Pareto) plot.
#
#   bash tools/run_eval.sh                          # defaults: WikiText-2 test, ctx 1024, 6 windows
#   bash tools/run_eval.sh --ctx 2048 --windows 16  # the README's long table (about an hour on 2 cores)
#   bash tools/run_eval.sh --text FILE              # any other text
#
# Extra arguments go to kvpack-eval and override the defaults (see build-eval/tools/kvpack-eval
# --help); --progress draws the progress bar even when stderr is not a terminal.
# Writes build-eval/results.{json,md} and build-eval/pareto.png.
set -euo pipefail
cd "$(dirname "$0")/.."

# System packages (Debian/Ubuntu): compiler, CMake, Eigen, CLI11, nlohmann-json, gnuplot, pip.
pkgs=(cmake g++ make libeigen3-dev libcli11-dev nlohmann-json3-dev gnuplot-nox python3-pip libsodium-dev pkg-config)
missing=()
for p in "${pkgs[@]}"; do dpkg -s "$p" >/dev/null 2>&1 || missing+=("$p"); done
# A pip that already works (e.g. from pyenv) makes python3-pip unnecessary; any gnuplot will do.
if python3 -m pip --version >/dev/null 2>&1; then
  missing=("${missing[@]/python3-pip/}")
fi
if command -v gnuplot >/dev/null 2>&1; then
  missing=("${missing[@]/gnuplot-nox/}")
fi
if [ -n "$(echo "${missing[@]:-}" | tr -d ' ')" ]; then
  echo "run_eval: installing ${missing[*]}" >&2
  sudo=""
  [ "$(id -u)" -ne 0 ] && sudo="sudo"
  $sudo apt-get update -qq >&2
  # shellcheck disable=SC2068
  DEBIAN_FRONTEND=noninteractive $sudo apt-get install -y -qq --no-install-recommends ${missing[@]} >&2
fi

launcher=()
command -v ccache >/dev/null 2>&1 && launcher=(-DCMAKE_CXX_COMPILER_LAUNCHER=ccache)
cmake -S . -B build-eval -DCMAKE_BUILD_TYPE=Release -DKVPACK_BUILD_TESTS=OFF -DKVPACK_BUILD_BENCH=OFF \
  -DKVPACK_BUILD_EXAMPLES=ON "${launcher[@]}" >&2
cmake --build build-eval --target kvpack-eval -j2 >&2

model=$(tools/fetch_model.sh)
# Defaults for the options the caller did not give (kvpack-eval accepts each option once).
# WikiText-2 test is read from ../shared/data beside the project (not copied into it); without it,
# the in-repo 7.8 KB head of the same text (tools/llama/tests/data) keeps the run going, with a
# warning: its figures are not README's. Pass --text for any other copy. 6 windows of
# 1024 tokens fit the 5-minute budget on 2 cores; the int4-g32 perplexity change then carries a
# sampling error of about +-0.7 points (window-to-window spread, docs/RESULTS-eval.md, "How many
# windows"); --windows 40 brings it to +-0.3.
given() { local a; for a in "${args[@]}"; do case "$a" in "$1" | "$1="*) return 0 ;; esac; done; return 1; }
args=("$@")
defaults=()
wikitext=../shared/data/wikitext-2-raw/wiki.test.raw
if ! given --text && [ ! -f "$wikitext" ]; then
  wikitext=tools/llama/tests/data/wikitext2_test_head.raw
  echo "run_eval: WARNING: $PWD/../shared/data/wikitext-2-raw/wiki.test.raw not found; scoring the" \
       "7.8 KB head of WikiText-2 test instead (pass --text PATH for the full text)" >&2
  given --ctx || defaults+=(--ctx 512)     # the head holds about 2,000 tokens
  given --windows || defaults+=(--windows 3)
fi
given --text || defaults+=(--text "$wikitext")
given --ctx || [[ " ${defaults[*]} " == *" --ctx "* ]] || defaults+=(--ctx 1024)
given --windows || [[ " ${defaults[*]} " == *" --windows "* ]] || defaults+=(--windows 6)
TIMEFORMAT='run_eval: kvpack-eval took %0R s wall, %0U s user + %0S s system CPU (build excluded)'
time OMP_WAIT_POLICY=passive build-eval/tools/kvpack-eval --model "$model" "${defaults[@]}" \
  --json build-eval/results.json --markdown build-eval/results.md --plot build-eval/pareto.png "$@"
echo "run_eval: tables in build-eval/results.md, plot in build-eval/pareto.png" >&2
