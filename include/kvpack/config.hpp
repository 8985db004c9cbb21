// Compile-time configuration: maps compiler macros to kvpack macros, in one place.
//
// KVPACK_HOST_DEVICE     marks helpers usable from host code and from CUDA kernels.
// KVPACK_HAS_AVX2        1 when the translation unit is compiled with AVX2, FMA and F16C (every
//                        AVX2 CPU has all three; -march=x86-64-v3, or -mavx2 -mfma -mf16c).
// KVPACK_HAS_NEON        1 when compiled for AArch64 with Advanced SIMD.
// KVPACK_HAS_CUDA        1 when compiled by nvcc (device or host pass).
// Users may define KVPACK_DISABLE_SIMD to force the scalar kernels everywhere.
#pragma once

#if defined(__CUDACC__)
#define KVPACK_HOST_DEVICE __host__ __device__
#define KVPACK_HAS_CUDA 1
#else
#define KVPACK_HOST_DEVICE
#define KVPACK_HAS_CUDA 0
#endif

#if !defined(KVPACK_DISABLE_SIMD) && defined(__AVX2__) && defined(__FMA__) && defined(__F16C__)
#define KVPACK_HAS_AVX2 1
#else
#define KVPACK_HAS_AVX2 0
#endif

#if !defined(KVPACK_DISABLE_SIMD) && defined(__aarch64__) && defined(__ARM_NEON)
#define KVPACK_HAS_NEON 1
#else
#define KVPACK_HAS_NEON 0
#endif
