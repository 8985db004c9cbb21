#!/usr/bin/env bash
# CXX_COMPILER_LAUNCHER for targets that are only checked, never linked (kvpack-eval-policy-check,
# tools/CMakeLists.txt): runs the compile command with -fsyntax-only, so every template is
# instantiated and checked, with the front end's warnings and -Werror, but no code is generated (a
# fifth of the CPU of -O2 for a kvpack-eval shard), then leaves the empty object file the build
# tool expects. The optimiser's warnings (-Wmaybe-uninitialized, -Warray-bounds, -Wstringop-*)
# are not run. g++ and clang++ still write the -MD dependency file.
set -euo pipefail
out=""
args=("$@")
for ((i = 0; i + 1 < ${#args[@]}; i++)); do
  if [ "${args[i]}" = -o ]; then out=${args[i + 1]}; fi
done
"$@" -fsyntax-only
if [ -n "$out" ]; then : >"$out"; fi
