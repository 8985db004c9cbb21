#!/usr/bin/env bash
# kvpack's main job: build kvpack-eval, fetch SmolLM2-135M-Instruct, and print the table of every
# default KV-cache policy (quality vs fp32 cache, bits/value, KV bytes, tokens/s, needle retrieval).
#
#   bash examples/run_eval.sh                     # defaults: generated passage, chunk 32
#   bash examples/run_eval.sh --text ../shared/data/wikitext-2-raw/wiki.test.raw --ctx 2048 --windows 16
#
# Extra arguments go to kvpack-eval (see build-eval/examples/llama/kvpack-eval --help).
# Also writes build-eval/results.{json,md} and build-eval/pareto.png.
set -euo pipefail
cd "$(dirname "$0")/.."

# System packages (Debian/Ubuntu): compiler, CMake, Eigen, CLI11, nlohmann-json, gnuplot, pip.
pkgs=(cmake g++ make libeigen3-dev libcli11-dev nlohmann-json3-dev gnuplot-nox python3-pip libsodium-dev pkg-config)
missing=()
for p in "${pkgs[@]}"; do dpkg -s "$p" >/dev/null 2>&1 || missing+=("$p"); done
# A pip that already works (e.g. from pyenv) makes python3-pip unnecessary.
if python3 -m pip --version >/dev/null 2>&1; then
  missing=("${missing[@]/python3-pip/}")
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

model=$(examples/fetch_model.sh)
# The needle test's filler defaults to ../shared/data's WikiText-2 test (this project's layout); in a
# clone without it and without --text/--filler, use the in-repo 7.8 KB head of that file, so the
# default run still has its needle test.
filler=()
case " $* " in
  *" --filler"*|*" --text"*|*" --no-needle "*) ;;
  *) [ -f ../shared/data/wikitext-2-raw/wiki.test.raw ] ||
       filler=(--filler examples/llama/tests/data/wikitext2_test_head.raw) ;;
esac
OMP_WAIT_POLICY=passive build-eval/examples/llama/kvpack-eval --model "$model" "${filler[@]}" \
  --json build-eval/results.json --markdown build-eval/results.md --plot build-eval/pareto.png "$@"
