// kvpack numeric formats: every float conversion in kvpack goes through these headers.
//
//   kvpack/numeric/fp16.hpp  IEEE binary16        fp16_from_float / fp16_to_float
//   kvpack/numeric/bf16.hpp  bfloat16             bf16_from_float / bf16_to_float
//   kvpack/numeric/fp8.hpp   OCP E4M3FN and E5M2  e4m3_/e5m2_from_float, e4m3_/e5m2_to_float
//
// Shared policy: round-half-to-even by default (fp16/bf16 also round toward +-Inf on request,
// for scale metadata), subnormals produced and decoded exactly, finite inputs saturate to
// the format's +-max (never Inf, never NaN). All functions are constexpr, noexcept and
// KVPACK_HOST_DEVICE (usable in CUDA kernels), and give bit-identical results on every
// backend because they use integer arithmetic only.
#pragma once

#include "kvpack/numeric/bf16.hpp"
#include "kvpack/numeric/fp16.hpp"
#include "kvpack/numeric/fp8.hpp"
#include "kvpack/numeric/minifloat.hpp"
