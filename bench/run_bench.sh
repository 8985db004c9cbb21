#!/usr/bin/env bash
# Runs kvpack's microbenchmark suite and prints the Markdown table.
#
#   bench/run_bench.sh [extra Google Benchmark flags, e.g. --benchmark_filter=decode]
#
# Configures a Release build of bench/ only (-O3 -march=native; KVPACK_BENCH_NATIVE=OFF drops
# -march=native), builds kvpack_bench with at most 2 jobs, runs it with JSON output and renders
# <build>/bench-results.{json,md,png} (table: bench/render_table.py; plot: gnuplot).
# Environment:
#   KVPACK_BENCH_BUILD_DIR       build folder (default: <repo>/build-bench)
#   KVPACK_BENCH_JOBS            build jobs (default 2)
#   KVPACK_BENCH_CONTEXTS        decode context lengths (default 1024,4096,32768; 131072 if RAM allows)
#   KVPACK_BENCH_PREFILL_SHAPES  smollm2-135m (default) or all
#   KVPACK_BENCH_LLAMACPP        ON (default): build ggml from the llama.cpp sources of the
#                                llama-cpp-python 0.3.36 sdist (bench/peers/fetch_llamacpp.sh,
#                                pip download on first use) and run its flash attention beside
#                                kvpack (decode-seq/llamacpp-*); OFF: kvpack only
set -euo pipefail
start=$(date +%s)
root=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
build=${KVPACK_BENCH_BUILD_DIR:-$root/build-bench}
jobs=${KVPACK_BENCH_JOBS:-2}
native=${KVPACK_BENCH_NATIVE:-ON}
llamacpp=${KVPACK_BENCH_LLAMACPP:-ON}
peer=()
if [[ "$llamacpp" == ON ]]; then
  peer=(-DKVPACK_BENCH_LLAMACPP=ON "-DKVPACK_LLAMACPP_DIR=$("$root/bench/peers/fetch_llamacpp.sh")")
fi

launcher=()
if command -v ccache >/dev/null 2>&1; then launcher=(-DCMAKE_CXX_COMPILER_LAUNCHER=ccache); fi
cmake -S "$root" -B "$build" -DCMAKE_BUILD_TYPE=Release -DKVPACK_BUILD_BENCH=ON -DKVPACK_BUILD_TESTS=OFF \
  -DKVPACK_BUILD_EXAMPLES=OFF -DKVPACK_BENCH_NATIVE="$native" "${peer[@]}" "${launcher[@]}" >/dev/null
cmake --build "$build" --target kvpack_bench -j "$jobs"

echo "load before the run: $(uptime)"
# Progress bar on stderr (terminal, or KVPACK_PROGRESS=1): one step per benchmark printed
# (stdbuf: line-buffered, so each result line arrives as it is printed).
"$build/bench/kvpack_bench" --benchmark_list_tests "$@" >"$build/bench-names.txt"
stdbuf -oL "$build/bench/kvpack_bench" --benchmark_out="$build/bench-results.json" --benchmark_out_format=json "$@" |
  python3 "$root/tools/progress_lines.py" --names "$build/bench-names.txt"
echo "load after the run:  $(uptime)"
echo
python3 "$root/bench/render_table.py" "$build/bench-results.json" \
  --md "$build/bench-results.md" --png "$build/bench-results.png"
status=$?
echo
echo "JSON: $build/bench-results.json  Markdown: $build/bench-results.md  (suite took $(( $(date +%s) - start )) s)"
exit $status
