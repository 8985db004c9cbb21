#!/usr/bin/env bash
# Fetches the llama.cpp sources the llama.cpp peer benchmark builds (bench/peers/CMakeLists.txt):
# the PyPI sdist of llama-cpp-python 0.3.36, unpacked to <repo>/.cache/ (vendor/llama.cpp/ggml and
# its LICENSE only). Idempotent; needs pip and access to PyPI on the first run.
set -euo pipefail
root=$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)
version=0.3.36
dest="$root/.cache/llama_cpp_python-$version"
if [[ -f "$dest/vendor/llama.cpp/ggml/CMakeLists.txt" ]]; then
  echo "$dest/vendor/llama.cpp"
  exit 0
fi
mkdir -p "$root/.cache/sdist"
sdist="$root/.cache/sdist/llama_cpp_python-$version.tar.gz"
if [[ ! -f "$sdist" ]]; then
  python3 -m pip download --no-deps --no-binary=:all: "llama-cpp-python==$version" -d "$root/.cache/sdist" >&2
fi
tar -xzf "$sdist" -C "$root/.cache" "llama_cpp_python-$version/vendor/llama.cpp/ggml" \
  "llama_cpp_python-$version/vendor/llama.cpp/LICENSE"
echo "$dest/vendor/llama.cpp"
