// ChunkStage: where an append's K and V rows are copied and checked for NaN/Inf in one pass,
// before the cache changes; the checked copy then becomes the layer's latest-chunk copy by a
// swap. Checking first and copying afterwards read the caller's rows twice: for a 512-token
// prefill chunk of an 8B-class layer (4 MiB of fp32 K and V, read from memory) the separate
// check took about a quarter of KVCache::append (bench/RESULTS.md, "Append").
#pragma once

#include <algorithm>
#include <bit>
#include <cstddef>
#include <cstdint>
#include <span>
#include <vector>

#include "kvpack/config.hpp"
#if KVPACK_HAS_AVX2
#include <immintrin.h>
#endif

#include "kvpack/cache/alloc_guard.hpp"
#include "kvpack/cache/input_checks.hpp"
#include "kvpack/detail/secure_zero.hpp"

namespace kvpack {

/// Copies n floats from src to dst (not overlapping) and returns whether all of them are finite
/// (cache_detail::all_finite's exponent test, made during the copy). With AVX2, 32 floats per
/// step in intrinsics: g++ 12 -O3 turned the portable loop into permutes and blends that took
/// 34 % of an INT4 append (bench_append, 8B-class 512-token chunks).
[[nodiscard]] inline bool copy_finite(const float* __restrict src, float* __restrict dst, std::size_t n) noexcept {
  constexpr std::uint32_t magnitude = 0x7FFFFFFFu, first_non_finite = 0x7F800000u;
  std::uint32_t top = 0;
  std::size_t i = 0;
#if KVPACK_HAS_AVX2
  {
    const __m256i mag = _mm256_set1_epi32(static_cast<int>(magnitude));
    __m256i t0 = _mm256_setzero_si256(), t1 = t0;
    for (; i + 32 <= n; i += 32) {
      const __m256 a = _mm256_loadu_ps(src + i), b = _mm256_loadu_ps(src + i + 8);
      const __m256 c = _mm256_loadu_ps(src + i + 16), d = _mm256_loadu_ps(src + i + 24);
      _mm256_storeu_ps(dst + i, a);
      _mm256_storeu_ps(dst + i + 8, b);
      _mm256_storeu_ps(dst + i + 16, c);
      _mm256_storeu_ps(dst + i + 24, d);
      const __m256i ma = _mm256_and_si256(_mm256_castps_si256(a), mag), mb = _mm256_and_si256(_mm256_castps_si256(b), mag);
      const __m256i mc = _mm256_and_si256(_mm256_castps_si256(c), mag), md = _mm256_and_si256(_mm256_castps_si256(d), mag);
      t0 = _mm256_max_epu32(t0, _mm256_max_epu32(ma, mb));
      t1 = _mm256_max_epu32(t1, _mm256_max_epu32(mc, md));
    }
    alignas(32) std::uint32_t lanes[8];
    _mm256_store_si256(reinterpret_cast<__m256i*>(lanes), _mm256_max_epu32(t0, t1));
    for (const std::uint32_t l : lanes) top = std::max(top, l);
  }
#endif
  for (; i + 16 <= n; i += 16) {  // fixed steps: g++ -O2 vectorizes loops without an epilogue
    std::uint32_t step = 0;
    for (std::size_t j = 0; j < 16; ++j) {
      dst[i + j] = src[i + j];
      step = std::max(step, std::bit_cast<std::uint32_t>(src[i + j]) & magnitude);
    }
    top = std::max(top, step);
  }
  for (; i < n; ++i) {
    dst[i] = src[i];
    top = std::max(top, std::bit_cast<std::uint32_t>(src[i]) & magnitude);
  }
  return top < first_non_finite;
}

/// The staged K and V rows of the append in progress ([n][kv_heads][head_dim] floats each). One
/// per SequenceStore, shared by its layers: after swap_into it holds the layer's previous chunk
/// copy, whose capacity the next append reuses, so a store keeps one chunk more than it has
/// layers (counted in allocated_bytes, zeroed by wipe). A buffer far larger than the append at
/// hand (a prefill chunk's, once decoding has begun) is released instead of handed on, so the
/// layers' chunk copies shrink to the decode step's size after one step.
struct ChunkStage {
  std::vector<float> k, v;

  /// Capacity for `floats` floats of K and of V. The stage's contents (another layer's previous
  /// chunk) are never needed again, so a stage too small, or oversized_buffer, is zeroed and
  /// released first instead of being copied into the new buffer. May throw std::bad_alloc; the
  /// stage holds no cache state, so nothing is lost.
  void reserve(std::size_t floats) {
    const bool small = k.capacity() < floats || v.capacity() < floats;
    if (small || oversized_buffer(k.capacity(), floats) || oversized_buffer(v.capacity(), floats)) {
      const std::size_t grown = std::max(floats, small ? 2 * k.capacity() : floats);
      wipe();
      k.reserve(grown);
      v.reserve(grown);
    }
  }

  /// Copies the append's rows in (capacity reserved: allocates nothing). Returns 0 when every
  /// value is finite, 1 when K holds a NaN/Inf, 2 when only V does.
  [[nodiscard]] int fill(std::span<const float> kin, std::span<const float> vin) {
    k.resize(kin.size());
    v.resize(vin.size());
    const bool k_ok = copy_finite(kin.data(), k.data(), kin.size());
    const bool v_ok = copy_finite(vin.data(), v.data(), vin.size());
    return !k_ok ? 1 : !v_ok ? 2 : 0;
  }

  /// First step of an append of rows k, v ([n][kv_heads][head_dim]) to `layer` of a sequence
  /// holding `held` tokens: reserves, copies and checks them. Errc::non_finite for the first
  /// NaN/Inf of K, else of V, naming layer, KV head, token and channel (check_finite_rows), the
  /// stage released and nothing else touched. May throw std::bad_alloc (the stage's growth).
  [[nodiscard]] Status stage(const ModelShape& shape, int layer, std::int64_t held, std::span<const float> kin,
                             std::span<const float> vin) {
    reserve(kin.size());
    const int bad = fill(kin, vin);
    if (bad == 0) return {};
    wipe();
    return cache_detail::check_finite_rows(shape, layer, held, bad == 1 ? kin : vin, bad == 1 ? "K" : "V");
  }

  /// Exchanges the staged rows with a layer's latest-chunk copy (chunk_k, chunk_v); the layer's
  /// old copy, now staged, is released if oversized for the new one.
  void swap_into(std::vector<float>& chunk_k, std::vector<float>& chunk_v) noexcept {
    chunk_k.swap(k);
    chunk_v.swap(v);
    if (oversized_buffer(k.capacity(), chunk_k.size()) || oversized_buffer(v.capacity(), chunk_v.size())) wipe();
  }

  /// Bytes allocated (capacities).
  [[nodiscard]] std::size_t allocated_bytes() const noexcept { return (k.capacity() + v.capacity()) * sizeof(float); }

  /// Zeroes and releases both buffers.
  void wipe() noexcept {
    detail::wipe_vector(k);
    detail::wipe_vector(v);
  }
};

}  // namespace kvpack
