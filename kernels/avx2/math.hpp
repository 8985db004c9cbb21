// Vector math shared by the AVX2 attention kernels (kernels/avx2/attention.hpp, int_block.hpp):
// horizontal reductions and exp for the online softmax.
// Only compiled when KVPACK_HAS_AVX2 (config.hpp).
#pragma once

#include "kvpack/config.hpp"

#if KVPACK_HAS_AVX2

#include <immintrin.h>

namespace kvpack::kernels::avx2_detail {

/// Horizontal sum of the 8 lanes.
[[nodiscard]] inline float hsum(__m256 v) noexcept {
  __m128 x = _mm_add_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
  x = _mm_add_ps(x, _mm_movehl_ps(x, x));
  x = _mm_add_ss(x, _mm_movehdup_ps(x));
  return _mm_cvtss_f32(x);
}
/// Horizontal max of the 8 lanes.
[[nodiscard]] inline float hmax(__m256 v) noexcept {
  __m128 x = _mm_max_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
  x = _mm_max_ps(x, _mm_movehl_ps(x, x));
  x = _mm_max_ss(x, _mm_movehdup_ps(x));
  return _mm_cvtss_f32(x);
}
/// Lane i of the result = horizontal sum of v[i] (8 accumulators reduced together).
[[nodiscard]] inline __m256 reduce8(const __m256* v) noexcept {
  const __m256 h01 = _mm256_hadd_ps(v[0], v[1]);
  const __m256 h23 = _mm256_hadd_ps(v[2], v[3]);
  const __m256 h45 = _mm256_hadd_ps(v[4], v[5]);
  const __m256 h67 = _mm256_hadd_ps(v[6], v[7]);
  const __m256 h0123 = _mm256_hadd_ps(h01, h23);
  const __m256 h4567 = _mm256_hadd_ps(h45, h67);
  return _mm256_add_ps(_mm256_permute2f128_ps(h0123, h4567, 0x20), _mm256_permute2f128_ps(h0123, h4567, 0x31));
}

/// exp(x) for x <= 0 (x = -inf and x < -87.3 give 0). Cody-Waite reduction x = n ln2 + r,
/// degree-6 polynomial for e^r (Cephes expf coefficients); <= 2 ulp against std::exp.
[[nodiscard]] inline __m256 exp_nonpos(__m256 x) noexcept {
  const __m256 tiny = _mm256_cmp_ps(x, _mm256_set1_ps(-87.3f), _CMP_LT_OQ);
  x = _mm256_max_ps(x, _mm256_set1_ps(-87.3f));
  const __m256 n = _mm256_round_ps(_mm256_mul_ps(x, _mm256_set1_ps(1.44269504088896341f)),
                                   _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
  __m256 r = _mm256_fnmadd_ps(n, _mm256_set1_ps(0.693359375f), x);
  r = _mm256_fnmadd_ps(n, _mm256_set1_ps(-2.12194440e-4f), r);
  __m256 y = _mm256_set1_ps(1.9875691500e-4f);
  y = _mm256_fmadd_ps(y, r, _mm256_set1_ps(1.3981999507e-3f));
  y = _mm256_fmadd_ps(y, r, _mm256_set1_ps(8.3334519073e-3f));
  y = _mm256_fmadd_ps(y, r, _mm256_set1_ps(4.1665795894e-2f));
  y = _mm256_fmadd_ps(y, r, _mm256_set1_ps(1.6666665459e-1f));
  y = _mm256_fmadd_ps(y, r, _mm256_set1_ps(5.0000001201e-1f));
  y = _mm256_fmadd_ps(y, _mm256_mul_ps(r, r), _mm256_add_ps(r, _mm256_set1_ps(1.f)));
  const __m256i e = _mm256_slli_epi32(_mm256_add_epi32(_mm256_cvtps_epi32(n), _mm256_set1_epi32(127)), 23);
  return _mm256_andnot_ps(tiny, _mm256_mul_ps(y, _mm256_castsi256_ps(e)));
}

}  // namespace kvpack::kernels::avx2_detail

#endif  // KVPACK_HAS_AVX2
