#!/usr/bin/env bash
# kvpress_setup.sh - creates the Python virtual environment that
# bench/peers/kvpress_eval.py runs in (NVIDIA's kvpress eviction library on
# transformers + torch, float32 on the CPU), with pinned versions.
#
# Usage:   bash bench/peers/kvpress_setup.sh [VENV_DIR]
# Default: VENV_DIR=~/.cache/kvpack/kvpress-venv
# Then:    ~/.cache/kvpack/kvpress-venv/bin/python bench/peers/kvpress_eval.py --help
#
# Not part of CI or ctest. Needs PyPI only. torch is PyPI's default wheel
# (it drags in the CUDA runtime wheels, a few GB; the script uses the CPU).
set -euo pipefail
VENV="${1:-$HOME/.cache/kvpack/kvpress-venv}"
TORCH_VERSION=2.9.1
TRANSFORMERS_VERSION=4.57.6
KVPRESS_VERSION=0.5.5
GGUF_VERSION=0.17.1
NUMPY_VERSION=2.3.5

if [ ! -x "$VENV/bin/python" ]; then
  python3 -m venv "$VENV"
fi
"$VENV/bin/python" -m pip install --upgrade --quiet pip
"$VENV/bin/python" -m pip install --quiet \
  "torch==$TORCH_VERSION" \
  "transformers==$TRANSFORMERS_VERSION" \
  "kvpress==$KVPRESS_VERSION" \
  "gguf==$GGUF_VERSION" \
  "numpy==$NUMPY_VERSION"
"$VENV/bin/python" - <<'PY'
import importlib.metadata as m
for p in ("torch", "transformers", "kvpress", "gguf", "numpy"):
    print(f"{p}=={m.version(p)}")
PY
echo "venv ready: $VENV"
