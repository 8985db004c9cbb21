// Build configuration: the SIMD backend that config.hpp detects is the one the build was
// configured for (KVPACK_EXPECTED_SIMD, set by the CMake presets), so a CI stage cannot
// silently test the scalar fallback instead of the AVX2 or NEON kernels.
#include <kvpack/config.hpp>

#include <gtest/gtest.h>

#include <string>

namespace {

std::string detected() {
  if (KVPACK_HAS_AVX2) return "avx2";
  if (KVPACK_HAS_NEON) return "neon";
  return "none";
}

}  // namespace

TEST(BuildConfig, DetectedSimdIsTheConfiguredOne) {
#if defined(KVPACK_EXPECTED_SIMD_AVX2)
  EXPECT_EQ(detected(), "avx2");
#elif defined(KVPACK_EXPECTED_SIMD_NEON)
  EXPECT_EQ(detected(), "neon");
#elif defined(KVPACK_EXPECTED_SIMD_NONE)
  EXPECT_EQ(detected(), "none");
#else
  GTEST_SKIP() << "no KVPACK_EXPECTED_SIMD configured; detected: " << detected();
#endif
}

TEST(BuildConfig, AtMostOneSimdBackend) { EXPECT_LE(KVPACK_HAS_AVX2 + KVPACK_HAS_NEON, 1); }

TEST(BuildConfig, HostCompilerIsNotCuda) { EXPECT_EQ(KVPACK_HAS_CUDA, 0); }

TEST(BuildConfig, Cxx20) { EXPECT_GE(__cplusplus, 202002L); }
