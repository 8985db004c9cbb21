#!/usr/bin/env bash
# llama.cpp's own quantized-KV perplexity rows, in kvpack-eval's JSON format (issues 20, 21).
#
# What it does: unpacks the whole llama.cpp tree (vendor/llama.cpp) of the PyPI sdist of
# llama-cpp-python 0.3.36 (downloaded by bench/peers/fetch_llamacpp.sh), builds its
# `llama-perplexity` tool (CMake, Release, CPU only, no curl/openssl, no tests or examples, ccache
# launcher) in <repo>/.cache/build-llamacpp, and runs it on the model and text kvpack-eval scores:
# SmolLM2-135M-Instruct Q4_1 GGUF over WikiText-2 test, --chunks windows of -c tokens, the second
# half of each window scored (perplexity.cpp: first = n_ctx/2), flash attention on. One run per KV
# cache type: f16/f16 first, which also saves its log-probabilities (--kl-divergence-base), then
# each quantized type with --kl-divergence against that file (KL mean / 99th percentile and
# "Same top p" = top-1 agreement). bench/peers/llamacpp_ppl_to_json.py turns the logs into
# <out>.json and <out>.md. llama.cpp applies a 64x64 Hadamard rotation to K and V of quantized
# caches by default (attn_rot_k/attn_rot_v; LLAMA_ATTN_ROT_DISABLE=1 turns it off): the rows
# marked "no-rot" are the same types with the rotation disabled.
#
# How to run (from anywhere; ~10 min of build, then 10 to 19 min per type on 2 busy cores):
#   bash bench/peers/llamacpp_ppl.sh [OUT_BASENAME]       # default docs/results/llamacpp-ctx2048-16w
# Environment: MODEL (default: tools/fetch_model.sh), TEXT (wiki.test.raw), CTX (2048),
#   CHUNKS (16), THREADS (2), TYPES (space-separated K:V pairs), NOROT_TYPES (K:V pairs run again
#   with LLAMA_ATTN_ROT_DISABLE=1; "" for none), SKIP_KL=1 (no logits file: PPL only),
#   KEEP_LOGITS=1 (keep the ~1.6 GB base logits file), JOBS (build parallelism, 2). A finished
#   run's log in .cache/llamacpp-ppl/ is reused (FORCE=1 reruns everything); the f16 run is reused
#   only while its logits file is there, so add types to a KEEP_LOGITS=1 run by rerunning.
# Outside CI and ctest: it needs PyPI, a few minutes of build and a 1.6 GB scratch file.
set -euo pipefail
root=$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)
cd "$root"
out=${1:-docs/results/llamacpp-ctx2048-16w}
ctx=${CTX:-2048}
chunks=${CHUNKS:-16}
threads=${THREADS:-2}
jobs=${JOBS:-2}
types=${TYPES:-"f16:f16 q8_0:q8_0 q4_0:q4_0 q8_0:q4_0 q4_1:q4_1 q5_0:q5_0"}
norot_types=${NOROT_TYPES-"q4_0:q4_0 q8_0:q4_0"}
version=0.3.36
src="$root/.cache/llama_cpp_python-$version/vendor/llama.cpp"
build="$root/.cache/build-llamacpp"
work="$root/.cache/llamacpp-ppl"
log() { echo "llamacpp_ppl: $*" >&2; }

# --- sources: the sdist's whole vendor/llama.cpp tree (fetch_llamacpp.sh unpacks only ggml/) ---
bash "$root/bench/peers/fetch_llamacpp.sh" > /dev/null
if [[ ! -f "$src/tools/perplexity/perplexity.cpp" ]]; then
  log "unpacking vendor/llama.cpp from the llama-cpp-python $version sdist"
  tar -xzf "$root/.cache/sdist/llama_cpp_python-$version.tar.gz" -C "$root/.cache" \
    "llama_cpp_python-$version/vendor/llama.cpp" "llama_cpp_python-$version/CHANGELOG.md"
fi
# the sdist carries no .git; llama-cpp-python's CHANGELOG names the llama.cpp commit it vendors
commit=$(sed -n "/^## \[$version\]/,/^## \[/p" "$src/../../CHANGELOG.md" 2>/dev/null |
  grep -o 'llama\.cpp@[0-9a-f]*' | head -n1 | cut -d@ -f2 || true)
llama_version=$(sed -n 's/^set(LLAMA_VERSION_\(MAJOR\|MINOR\|PATCH\) \([0-9]*\))/\2/p' "$src/CMakeLists.txt" | paste -sd.)
source_desc="llama.cpp ${commit:-unknown} (vendor/llama.cpp of llama-cpp-python $version, LLAMA_VERSION $llama_version) llama-perplexity"

# --- build llama-perplexity only ---
if [[ ! -x "$build/bin/llama-perplexity" ]] || [[ -n "${REBUILD:-}" ]]; then
  launcher=()
  command -v ccache > /dev/null && launcher=(-DCMAKE_C_COMPILER_LAUNCHER=ccache -DCMAKE_CXX_COMPILER_LAUNCHER=ccache)
  gen=()
  command -v ninja > /dev/null && gen=(-G Ninja)
  log "configuring $build"
  cmake -S "$src" -B "$build" "${gen[@]}" -DCMAKE_BUILD_TYPE=Release -DBUILD_SHARED_LIBS=OFF \
    -DGGML_NATIVE=ON -DGGML_CUDA=OFF -DGGML_METAL=OFF -DGGML_VULKAN=OFF -DGGML_CCACHE=OFF \
    -DLLAMA_CURL=OFF -DLLAMA_OPENSSL=OFF -DLLAMA_BUILD_TESTS=OFF -DLLAMA_BUILD_EXAMPLES=OFF \
    -DLLAMA_BUILD_SERVER=OFF -DLLAMA_BUILD_APP=OFF -DLLAMA_BUILD_TOOLS=ON -DLLAMA_BUILD_COMMON=ON \
    "${launcher[@]}" > "$root/.cache/build-llamacpp.configure.log"
  log "building llama-perplexity (-j$jobs)"
  cmake --build "$build" --target llama-perplexity -j "$jobs" > "$root/.cache/build-llamacpp.build.log"
fi
bin="$build/bin/llama-perplexity"

# --- inputs ---
model=${MODEL:-$(bash "$root/tools/fetch_model.sh")}
text=${TEXT:-}
if [[ -z "$text" ]]; then
  for t in "$root/../shared/data/wikitext-2-raw/wiki.test.raw" /work/shared/data/wikitext-2-raw/wiki.test.raw; do
    [[ -f "$t" ]] && { text=$t; break; }
  done
fi
[[ -f "$text" ]] || { log "WikiText-2 wiki.test.raw not found; set TEXT=/path/to/wiki.test.raw"; exit 1; }

# --- runs ---
mkdir -p "$work"
tag="ctx$ctx-${chunks}w"
base_logits="$work/f16-$tag.logits"
common=(-m "$model" -f "$text" -c "$ctx" -b "$ctx" --chunks "$chunks" -t "$threads" -fa on -lv 4)
logs=()
run() {  # run NAME K V [ENV=...] : one llama-perplexity run, its log in $work/NAME-$tag.log
  local name=$1 k=$2 v=$3; shift 3
  local logf="$work/$name-$tag.log" extra=()
  if [[ $k == f16 && $v == f16 ]]; then
    [[ -n "${SKIP_KL:-}" ]] || extra=(--kl-divergence-base "$base_logits")
  elif [[ -z "${SKIP_KL:-}" ]]; then
    extra=(--kl-divergence-base "$base_logits" --kl-divergence)
  fi
  if [[ -z "${FORCE:-}" ]] && grep -qE '(Final estimate: PPL|Same top p:)' "$logf" 2> /dev/null &&
     { [[ $k != f16 || $v != f16 ]] || [[ -n "${SKIP_KL:-}" || -f "$base_logits" ]]; }; then
    log "$name: reusing $logf (FORCE=1 reruns it)"
    logs+=("$name=$logf")
    return
  fi
  log "$name: K $k, V $v $* -> $logf"
  local t0=$SECONDS
  env "$@" "$bin" "${common[@]}" -ctk "$k" -ctv "$v" "${extra[@]}" > "$logf" 2>&1 ||
    { log "$name failed; tail of $logf:"; tail -n 20 "$logf" >&2; exit 1; }
  log "$name: $((SECONDS - t0)) s"
  logs+=("$name=$logf")
}
for kv in $types; do
  k=${kv%%:*}; v=${kv##*:}
  if [[ $k == f16 && $v == f16 ]]; then name=f16; elif [[ $k == "$v" ]]; then name=$k; else name="k${k}-v${v}"; fi
  run "$name" "$k" "$v"
done
for kv in $norot_types; do
  k=${kv%%:*}; v=${kv##*:}
  if [[ $k == "$v" ]]; then name=$k-no-rot; else name="k${k}-v${v}-no-rot"; fi
  run "$name" "$k" "$v" LLAMA_ATTN_ROT_DISABLE=1
done
[[ -n "${KEEP_LOGITS:-}" ]] || rm -f "$base_logits"

# --- JSON + Markdown ---
python3 "$root/bench/peers/llamacpp_ppl_to_json.py" --model "$model" --text "$text" --ctx "$ctx" \
  --windows "$chunks" --threads "$threads" --source "$source_desc" --out "$out" "${logs[@]}"
log "wrote $out.json and $out.md"
