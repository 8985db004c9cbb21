// The victim search of score-based token eviction (H2O, TokenBudgetHook::lowest_score): the slot
// whose token lies in [lo, hi) with the lowest score, the oldest token on ties. An evicting cache
// runs it once per evicted token and KV head over every slot (a 1k budget: 1k slots), so on AVX2
// it scans 8 slots per step; the scalar scan is the specification and the fallback.
#pragma once

#include <cstddef>
#include <cstdint>
#include <span>

#include "kvpack/config.hpp"

#if KVPACK_HAS_AVX2
#include <immintrin.h>
#endif

namespace kvpack::eviction {

/// Index of the slot s with token[s] in [lo, hi) and the lowest score[s], the smallest token among
/// equal scores (tokens of live slots are distinct cache indices; free slots hold -1 < lo);
/// -1 when no token is in range. The first qualifying slot is taken as it is and a later one
/// replaces it only by comparing lower (or equal with an older token), so with NaN scores the
/// result depends on the order: a NaN is never lower than anything.
[[nodiscard]] inline std::int64_t lowest_score_scalar(std::span<const std::int32_t> token, std::span<const float> score,
                                                      std::int32_t lo, std::int64_t hi) noexcept {
  std::int64_t victim = -1;
  for (std::size_t s = 0; s < token.size(); ++s) {
    const std::int32_t tok = token[s];
    if (tok < lo || tok >= hi) continue;
    const auto v = static_cast<std::size_t>(victim);
    if (victim < 0 || score[s] < score[v] || (score[s] == score[v] && tok < token[v])) victim = static_cast<std::int64_t>(s);
  }
  return victim;
}

/// lowest_score_scalar, 8 slots per step on AVX2: each lane keeps the lowest (score, token) of its
/// slots, the lanes are reduced at the end. Lexicographic minima of distinct tokens do not depend
/// on the order, so the result equals the scan's whenever no score in range is NaN; a NaN sends
/// the search to the scalar scan.
[[nodiscard]] inline std::int64_t lowest_score(std::span<const std::int32_t> token, std::span<const float> score,
                                               std::int32_t lo, std::int64_t hi) noexcept {
#if KVPACK_HAS_AVX2
  const std::size_t n = token.size(), body = n - n % 8;
  if (body == 0 || hi <= lo) return lowest_score_scalar(token, score, lo, hi);
  const std::int32_t hi32 = hi > INT32_MAX ? INT32_MAX : static_cast<std::int32_t>(hi);
  const bool hi_open = hi > INT32_MAX;  // every token below hi
  const __m256i vlo = _mm256_set1_epi32(lo - 1), vhi = _mm256_set1_epi32(hi32);
  // Per lane the lowest (score, token) so far and its slot; (+inf, INT32_MAX) loses to every
  // token in range (cache indices are below INT32_MAX), a +inf score included (the tie rule).
  __m256 best = _mm256_set1_ps(__builtin_inff());
  __m256i best_tok = _mm256_set1_epi32(INT32_MAX);
  __m256i best_slot = _mm256_set1_epi32(-1);  // -1: no token in range yet
  __m256 nan = _mm256_setzero_ps();           // lanes that met a NaN score in range
  __m256i slot = _mm256_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7);
  const __m256i eight = _mm256_set1_epi32(8);
  for (std::size_t s = 0; s < body; s += 8, slot = _mm256_add_epi32(slot, eight)) {
    const __m256i t = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(token.data() + s));
    const __m256 x = _mm256_loadu_ps(score.data() + s);
    __m256i in = _mm256_cmpgt_epi32(t, vlo);  // t >= lo
    if (!hi_open) in = _mm256_and_si256(in, _mm256_cmpgt_epi32(vhi, t));
    const __m256 in_range = _mm256_castsi256_ps(in);
    nan = _mm256_or_ps(nan, _mm256_and_ps(in_range, _mm256_cmp_ps(x, x, _CMP_UNORD_Q)));
    // (x, t) < (best, best_tok), lexicographically
    const __m256 lower = _mm256_cmp_ps(x, best, _CMP_LT_OQ);
    const __m256 tie = _mm256_and_ps(_mm256_cmp_ps(x, best, _CMP_EQ_OQ), _mm256_castsi256_ps(_mm256_cmpgt_epi32(best_tok, t)));
    const __m256 take = _mm256_and_ps(in_range, _mm256_or_ps(lower, tie));
    best = _mm256_blendv_ps(best, x, take);
    best_tok = _mm256_castps_si256(_mm256_blendv_ps(_mm256_castsi256_ps(best_tok), _mm256_castsi256_ps(t), take));
    best_slot = _mm256_castps_si256(_mm256_blendv_ps(_mm256_castsi256_ps(best_slot), _mm256_castsi256_ps(slot), take));
  }
  if (_mm256_movemask_ps(nan) != 0) return lowest_score_scalar(token, score, lo, hi);
  alignas(32) float bs[8];
  alignas(32) std::int32_t bt[8], bslot[8];
  _mm256_store_ps(bs, best);
  _mm256_store_si256(reinterpret_cast<__m256i*>(bt), best_tok);
  _mm256_store_si256(reinterpret_cast<__m256i*>(bslot), best_slot);
  std::int64_t victim = -1;
  float vs = 0.f;
  std::int32_t vt = 0;
  auto consider = [&](std::int64_t s, float x, std::int32_t t) {
    if (victim < 0 || x < vs || (x == vs && t < vt)) victim = s, vs = x, vt = t;
  };
  for (int j = 0; j < 8; ++j)
    if (bslot[j] >= 0) consider(bslot[j], bs[j], bt[j]);
  for (std::size_t s = body; s < n; ++s) {
    const std::int32_t t = token[s];
    if (t < lo || t >= hi) continue;
    if (score[s] != score[s]) return lowest_score_scalar(token, score, lo, hi);
    consider(static_cast<std::int64_t>(s), score[s], t);
  }
  return victim;
#else
  return lowest_score_scalar(token, score, lo, hi);
#endif
}

}  // namespace kvpack::eviction
