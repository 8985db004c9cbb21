// How much of a size sweep a test runs. The release stages run every size; the stages where each
// instruction costs 10-25 times more (AddressSanitizer at -O0, qemu-aarch64) set
// KVPACK_TEST_SWEEP=short in their CMake test preset, and the sweeps that dominate their time
// (the kernel-vs-float64 sweeps, the bit-flip scan) then skip their longest sizes: every odd
// token count (1, 31, 33, 95), head_dim and GQA group stays, so each code path and every tile
// and block edge is still run under the sanitizer or the emulator; what goes is the 1000-token
// repeats of paths the shorter sizes already cover, which the release stage runs in full.
#pragma once

#include <cstdlib>
#include <cstring>
#include <initializer_list>
#include <vector>

namespace kvtest {

/// True when the environment variable KVPACK_TEST_SWEEP is "short" (see the file comment).
inline bool short_sweep() {
  const char* v = std::getenv("KVPACK_TEST_SWEEP");
  return v != nullptr && std::strcmp(v, "short") == 0;
}

/// `full` in a full sweep; in a short one, the sizes of `full` up to `short_max` (inclusive).
inline std::vector<int> sweep_sizes(std::initializer_list<int> full, int short_max) {
  std::vector<int> out;
  const bool cut = short_sweep();
  for (int n : full)
    if (!cut || n <= short_max) out.push_back(n);
  return out;
}

/// Step between the allocation numbers an allocation-failure sweep fails (test_alloc_fault*.cpp,
/// whose every step reruns the whole script): 1 in a full sweep, so every allocation fails once;
/// 2 in a short one (every other allocation: under AddressSanitizer at -O0 the full sweeps were
/// 190 s of CPU, a fifth of that stage's tests). gcc-release fails every allocation.
inline long fault_step() { return short_sweep() ? 2 : 1; }

}  // namespace kvtest
