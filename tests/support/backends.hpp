// The attention kernels compiled into this test binary: every test of tests/test_backend_*.cpp
// runs on the SIMD backend the build compiled in (kvtest::SimdKernel: AVX2 on x86-64 built with
// AVX2, NEON on AArch64) and compares it with the scalar kernel (the spec). Without a SIMD
// backend SimdKernel is NoSimd, whose tests GTEST_SKIP.
#pragma once

#include <gtest/gtest.h>

#include <cstddef>
#include <vector>

#include "kvpack/kernels/dispatch.hpp"

namespace kvtest {

/// The scalar kernel, the reference every other backend is compared with.
struct ScalarKernel {
  static constexpr const char* name = "scalar";
  template <class KC, class VC, bool PC>
  static void attend(const kvpack::kernels::AttendArgs& a, const kvpack::kernels::HeadSegments& seg,
                     const kvpack::BlockLayout& L, kvpack::kernels::Scratch& s) {
    kvpack::kernels::attend_scalar<KC, VC, PC>(a, seg, L, s);
  }
};

#if KVPACK_HAS_AVX2
#include <cpuid.h>

struct Avx2Kernel {
  static constexpr const char* name = "avx2";
  static constexpr bool available = true;
  /// Query int8 group of integer Q·K for key codec KC (0: fp32 scores); kernels::query_int8_group.
  template <class KC, bool PC>
  static constexpr int query_group = kvpack::kernels::query_int8_group<kvpack::Avx2, KC, PC>;
  /// Whether INT4 values are accumulated from their codes; kernels::value_int_accumulate.
  template <class VC>
  static constexpr bool int_values = kvpack::kernels::value_int_accumulate<kvpack::Avx2, VC>;
  template <class KC, class VC, bool PC>
  static void attend(const kvpack::kernels::AttendArgs& a, const kvpack::kernels::HeadSegments& seg,
                     const kvpack::BlockLayout& L, kvpack::kernels::Scratch& s) {
    kvpack::kernels::attend_avx2<KC, VC, PC>(a, seg, L, s);
  }
  /// The CPU running the test can execute the kernel (cpuid), else the test skips.
  /// (clang 14 has no "f16c" for __builtin_cpu_supports, so F16C is read from cpuid leaf 1.)
  static bool cpu_ok() {
    unsigned eax = 0, ebx = 0, ecx = 0, edx = 0;
    const bool f16c = __get_cpuid(1, &eax, &ebx, &ecx, &edx) && (ecx & bit_F16C) != 0;
    return __builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma") && f16c;
  }
};
#endif

#if KVPACK_HAS_NEON
struct NeonKernel {
  static constexpr const char* name = "neon";
  static constexpr bool available = true;
  template <class KC, bool PC>
  static constexpr int query_group = 0;  // NEON scores in fp32
  template <class VC>
  static constexpr bool int_values = false;
  template <class KC, class VC, bool PC>
  static void attend(const kvpack::kernels::AttendArgs& a, const kvpack::kernels::HeadSegments& seg,
                     const kvpack::BlockLayout& L, kvpack::kernels::Scratch& s) {
    kvpack::kernels::attend_neon<KC, VC, PC>(a, seg, L, s);
  }
  static bool cpu_ok() { return true; }  // Advanced SIMD is mandatory on AArch64
};
#endif

/// Placeholder when no SIMD backend is compiled in: tests skip.
struct NoSimd {
  static constexpr const char* name = "none";
  static constexpr bool available = false;
  template <class KC, bool PC>
  static constexpr int query_group = 0;
  template <class VC>
  static constexpr bool int_values = false;
  template <class KC, class VC, bool PC>
  static void attend(const kvpack::kernels::AttendArgs&, const kvpack::kernels::HeadSegments&,
                     const kvpack::BlockLayout&, kvpack::kernels::Scratch&) {}
  static bool cpu_ok() { return false; }
};

/// The SIMD kernel of this build (one per target: AVX2 on x86-64, NEON on AArch64), or NoSimd.
#if KVPACK_HAS_AVX2
using SimdKernel = Avx2Kernel;
#elif KVPACK_HAS_NEON
using SimdKernel = NeonKernel;
#else
using SimdKernel = NoSimd;
#endif

/// The SIMD code paths of this build (decode and the integer quantizer) with the interface of
/// tests/test_case_c4_rounding.cpp's backends:
///  encode<C>(x, n, p, codes) / decode<C>(codes, n, p, out): n values under one GroupParams p;
///  encode_row<C> / decode_row<C>: per-token rows with derived, stored metadata.
#if KVPACK_HAS_AVX2 || KVPACK_HAS_NEON
#if KVPACK_HAS_AVX2
namespace simd_codes = kvpack::kernels::avx2;
#else
namespace simd_codes = kvpack::kernels::neon;
#endif
struct SimdCodes {
  static constexpr const char* name = SimdKernel::name;
  template <class C>
  static void encode(const float* x, std::size_t n, kvpack::GroupParams p, std::byte* codes) {
    simd_codes::encode_codes<C>(x, n, p, codes);
  }
  template <class C>
  static void decode(const std::byte* codes, std::size_t n, kvpack::GroupParams p, float* out) {
    simd_codes::decode_codes<C>(codes, n, p, out);
  }
  template <class C>
  static void encode_row(const float* x, int n, std::byte* codes, std::byte* meta) {
    simd_codes::encode_row<C>(x, n, codes, meta);
  }
  template <class C>
  static void decode_row(const std::byte* codes, const std::byte* meta, int n, float* out) {
    std::vector<float> tmp(2 * static_cast<std::size_t>(n) + 8);
    simd_codes::decode_row<C>(codes, meta, n, out, tmp.data());
  }
};
#endif

/// Skips the current test when backend K is not compiled in or the CPU cannot run it.
#define KVTEST_REQUIRE_BACKEND(K)                                                            \
  do {                                                                                       \
    if (!K::available) GTEST_SKIP() << "no SIMD backend compiled into this test binary";      \
    if (!K::cpu_ok()) GTEST_SKIP() << K::name << " backend compiled in, but this CPU lacks it"; \
  } while (0)

}  // namespace kvtest
