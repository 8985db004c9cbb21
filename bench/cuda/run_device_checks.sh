#!/usr/bin/env bash
# One prepared run of every CUDA check on a machine WITH a GPU (nothing here needs the network):
#
#   1. builds only the CUDA targets for the GPU found (nvidia-smi's compute capability, e.g.
#      sm_90 on an H100/H200; override with KVPACK_CUDA_ARCH=80): the CUDA test executables
#      (tests/cuda/*.cu) and the host tests of the __host__ __device__ helpers and the decode plan
#      (test_cuda_helpers, test_cuda_decode_plan) through CMake, and
#      the decode benchmark (bench/cuda/decode_bench.cu) directly with nvcc, in parallel;
#   2. runs the CUDA tests (ctest -L cuda: decode vs the CPU scalar kernel to 1e-5 relative,
#      device quantizer bit-identical to the host, unpacker on every byte) and test_cuda_helpers;
#   3. runs the benchmark: decode at 32k tokens (32 q / 8 KV heads, head_dim 128) for INT4 and
#      INT8 caches against the same run's device-to-device cudaMemcpy bandwidth (a table);
#   4. prints a summary; exits non-zero when anything failed.
#
# Usage (from anywhere; about 3-6 minutes on 16 cores):
#   bash bench/cuda/run_device_checks.sh
# Environment: KVPACK_CUDA_ARCH (e.g. 90), KVPACK_DEVICE_BUILD (build folder, default
# build-device), JOBS (default: nproc), OUT (if set, logs and the table are copied there).
# Needs: nvcc (PATH or /usr/local/cuda/bin), a C++20 host compiler, and for the tests cmake >=
# 3.21 plus GoogleTest (installed, or sources in /usr/src/googletest). Without cmake/GoogleTest
# the tests are reported as not built and the benchmark still runs.
set -uo pipefail

cd "$(dirname "${BASH_SOURCE[0]}")/../.."
root=$PWD
build=${KVPACK_DEVICE_BUILD:-$root/build-device}
jobs=${JOBS:-$(nproc)}
logs=$build/logs
mkdir -p "$logs"
t_start=$(date +%s)
status_build=skipped status_tests=skipped status_helpers=skipped status_bench=skipped
summary_tests="" fail=0

if ! command -v nvcc >/dev/null 2>&1 && [ -x /usr/local/cuda/bin/nvcc ]; then
  export PATH=/usr/local/cuda/bin:$PATH
fi
if ! command -v nvcc >/dev/null 2>&1; then
  echo "[device] FAILED: nvcc not found (PATH, /usr/local/cuda/bin)"
  exit 1
fi
echo "[device] $(nvcc --version | tail -n 2 | head -n 1)"
if command -v nvidia-smi >/dev/null 2>&1; then
  nvidia-smi --query-gpu=name,compute_cap,memory.total,driver_version --format=csv,noheader | sed 's/^/[device] GPU: /'
fi

arch=${KVPACK_CUDA_ARCH:-}
if [ -z "$arch" ] && command -v nvidia-smi >/dev/null 2>&1; then
  arch=$(nvidia-smi --query-gpu=compute_cap --format=csv,noheader 2>/dev/null | head -n 1 | tr -d ' .')
fi
if [ -z "$arch" ]; then
  arch=90
  echo "[device] compute capability unknown; building for sm_$arch"
fi
echo "[device] building for sm_$arch with $jobs jobs into $build"

host_cxx=${CXX:-g++}
command -v "$host_cxx" >/dev/null 2>&1 || host_cxx=c++

# ---- benchmark: plain nvcc, in the background ------------------------------------------------
bench_bin=$build/bench_cuda_decode
(
  nvcc -std=c++20 -O3 -ccbin "$host_cxx" -gencode "arch=compute_$arch,code=sm_$arch" \
    --Werror=all-warnings -Xcompiler=-Wall,-Wextra \
    -I"$root/include" -I"$root/kernels" "$root/bench/cuda/decode_bench.cu" -o "$bench_bin"
) >"$logs/bench-build.log" 2>&1 &
bench_pid=$!

# ---- tests: CMake, only the CUDA targets ------------------------------------------------------
cmake_ok=0
if command -v cmake >/dev/null 2>&1; then
  cmake_version=$(cmake --version | head -n 1 | awk '{print $3}')
  if printf '%s\n3.21\n' "$cmake_version" | sort -V | head -n 1 | grep -qx 3.21; then cmake_ok=1; fi
fi
gtest_flags=()
if [ "$cmake_ok" = 1 ]; then
  if ! ls /usr/lib/*/cmake/GTest/GTestConfig.cmake /usr/lib/cmake/GTest/GTestConfig.cmake \
        /usr/local/lib/cmake/GTest/GTestConfig.cmake /usr/local/lib/*/cmake/GTest/GTestConfig.cmake >/dev/null 2>&1; then
    if [ -f /usr/src/googletest/CMakeLists.txt ]; then
      gtest_flags=(-DKVPACK_GTEST_FROM_SOURCE=ON)
    else
      echo "[device] GoogleTest not found (no GTestConfig.cmake, no /usr/src/googletest): tests not built"
      cmake_ok=0
    fi
  fi
else
  echo "[device] cmake >= 3.21 not found: tests not built"
fi
launcher=()
if command -v ccache >/dev/null 2>&1; then
  launcher=(-DCMAKE_CXX_COMPILER_LAUNCHER=ccache -DCMAKE_CUDA_COMPILER_LAUNCHER=ccache)
fi
if [ "$cmake_ok" = 1 ]; then
  t0=$(date +%s)
  if cmake -S "$root" -B "$build/cmake" -DCMAKE_BUILD_TYPE=Release -DKVPACK_ENABLE_CUDA=ON \
       -DCMAKE_CUDA_ARCHITECTURES="$arch-real" -DCMAKE_CUDA_HOST_COMPILER="$host_cxx" \
       -DCMAKE_CXX_COMPILER="$host_cxx" -DKVPACK_BUILD_BENCH=OFF -DKVPACK_BUILD_EXAMPLES=OFF \
       -DKVPACK_INSTALL=OFF "${gtest_flags[@]}" "${launcher[@]}" >"$logs/configure.log" 2>&1 &&
     timeout 420 cmake --build "$build/cmake" --target kvpack_cuda_all test_cuda_helpers test_cuda_decode_plan -j "$jobs" \
       >"$logs/build.log" 2>&1; then
    status_build="ok ($(( $(date +%s) - t0 )) s)"
  else
    status_build="FAILED ($(( $(date +%s) - t0 )) s; $logs/configure.log, $logs/build.log)"
    fail=1
    tail -n 60 "$logs/configure.log" "$logs/build.log"
  fi
fi

if [[ $status_build == ok* ]]; then
  t0=$(date +%s)
  if timeout 300 ctest --test-dir "$build/cmake" -L '^cuda$' --output-on-failure -j 2 >"$logs/ctest.log" 2>&1; then
    status_tests="ok ($(( $(date +%s) - t0 )) s)"
  else
    status_tests="FAILED ($logs/ctest.log)"
    fail=1
    tail -n 120 "$logs/ctest.log"
  fi
  summary_tests=$(grep -E "tests passed|tests failed|Not Run|\*\*\*Skipped|\*\*\*Failed" "$logs/ctest.log" | head -n 20)
  if grep -q '\*\*\*Skipped' "$logs/ctest.log"; then
    # Exit 77 = the test's main found no usable CUDA device: on a GPU machine that is a failure.
    status_tests="SKIPPED (exit 77: no usable CUDA device; $logs/ctest.log)"
    fail=1
  fi
  status_helpers=""
  for host_test in test_cuda_helpers test_cuda_decode_plan; do
    exe=$(find "$build/cmake" -name "$host_test" -type f -perm -u+x | head -n 1)
    if [ -n "$exe" ] && "$exe" >"$logs/$host_test.log" 2>&1; then
      status_helpers+="$host_test ok ($(grep -E '^\[  PASSED' "$logs/$host_test.log")); "
    else
      status_helpers+="$host_test FAILED ($logs/$host_test.log); "
      fail=1
    fi
  done
fi

# ---- benchmark run --------------------------------------------------------------------------
if wait "$bench_pid"; then
  if timeout 180 "$bench_bin" >"$logs/bench.txt" 2>&1; then
    status_bench=ok
  else
    status_bench="FAILED (exit $?; $logs/bench.txt)"
    fail=1
  fi
  cat "$logs/bench.txt"
else
  status_bench="FAILED to build ($logs/bench-build.log)"
  fail=1
  tail -n 60 "$logs/bench-build.log"
fi

echo
echo "==== kvpack CUDA device checks (sm_$arch), $(( $(date +%s) - t_start )) s ===="
echo "build (CUDA tests + helpers):  $status_build"
echo "CUDA tests (ctest -L cuda):    $status_tests"
[ -n "$summary_tests" ] && echo "$summary_tests" | sed 's/^/    /'
echo "host helpers test:             $status_helpers"
echo "decode benchmark:              $status_bench"
if [ -n "${OUT:-}" ] && [ -d "${OUT:-}" ]; then
  mkdir -p "$OUT/device-checks" && cp -r "$logs"/. "$OUT/device-checks/" 2>/dev/null || true
fi
exit "$fail"
