// RoleCodec: how the cache commits the K or the V rows of a few tokens into a block, per codec
// kind. The codec-side hook of KVCache: the cache asks its RoleCodecs how many tokens commit
// together (`unit`), which block size they need, which attention kernel reads them, and calls
// `encode`; it never tests which codec it holds. Specializations: per-token rows (every row
// codec, SIMD encode on the AVX2 / NEON backends with the scalar rows.hpp as the oracle),
// per-channel key groups (KIVI) here, keyframe intervals in cache/keyframe_hook.hpp.
#pragma once

#include <cstddef>
#include <cstdint>
#include <type_traits>

#include "kvpack/codec/rows.hpp"
#include "kvpack/config.hpp"
#include "kvpack/policy.hpp"
#include "kvpack/kernels/dispatch.hpp"

namespace kvpack {

/// Where one role's data sit in a block (byte offsets and strides from BlockLayout) and which
/// BlockHeader::flags bit records its interval mode (keyframe codecs; 0 for K/V without one).
struct RoleRegion {
  std::size_t codes = 0, row = 0;             ///< codes offset, code bytes per token row
  std::size_t meta = 0, meta_token = 0;       ///< metadata offset, per-token metadata bytes per token
  std::size_t meta_group = 0;                 ///< per-channel metadata bytes per token group
  std::uint8_t mode_flag = 0;                 ///< BlockHeader::flags bit of this role's interval mode

  /// The key (`keys` true) or value region of `L`.
  [[nodiscard]] static RoleRegion of(const BlockLayout& L, bool keys) noexcept {
    if (keys) return {L.k_codes, L.k_row, L.k_meta, L.k_meta_token, L.k_meta_group, 2};
    return {L.v_codes, L.v_row, L.v_meta, L.v_meta_token, 0, 4};
  }
};

/// Encodes one per-token row of n values with the backend's quantizer: the AVX2 / NEON integer
/// quantizers and AVX2's fp16 conversion (kernels/avx2/encode.hpp, kernels/neon/codes.hpp,
/// bit-identical to encode_row for finite x, as every append stages them, tested in
/// tests/test_cache_simd_encode.cpp) where the backend has one, else the scalar encode_row.
template <class BackendTag, KvCodec C>
void encode_row_on(const float* x, int n, std::byte* codes, std::byte* meta) noexcept {
#if KVPACK_HAS_AVX2
  if constexpr (std::is_same_v<BackendTag, Avx2> && kernels::simd::IntCodecFamily<C>) {
    kernels::avx2::encode_row<C>(x, n, codes, meta);
    return;
  } else if constexpr (std::is_same_v<BackendTag, Avx2> && std::is_same_v<C, Fp16>) {
    kernels::avx2::encode_row_fp16(x, n, codes);
    return;
  }
#endif
#if KVPACK_HAS_NEON
  if constexpr (std::is_same_v<BackendTag, Neon> && kernels::simd::IntCodecFamily<C>) {
    kernels::neon::encode_row<C>(x, n, codes, meta);
    return;
  }
#endif
  encode_row<C>(x, n, codes, meta);
}

/// Encodes one per-channel group of G = C::group_size token rows (as encode_channels) with the
/// backend's quantizer: the AVX2 one (kernels/avx2/encode.hpp, bit-identical) on that backend for
/// the integer codecs, else the scalar encode_channels.
template <class BackendTag, KvCodec C>
void encode_channels_on(const float* x, std::ptrdiff_t x_stride, int n, std::byte* codes, std::size_t code_row_bytes,
                        std::byte* meta) noexcept {
#if KVPACK_HAS_AVX2
  if constexpr (std::is_same_v<BackendTag, Avx2> && kernels::simd::IntCodecFamily<C>) {
    kernels::avx2::encode_channels<C>(x, x_stride, n, codes, code_row_bytes, meta);
    return;
  }
#endif
  encode_channels<C>(x, x_stride, n, codes, code_row_bytes, meta);
}

/// Commit rule of a row codec C for one role. Per-token (PerChannel false): tokens commit one at
/// a time. Per-channel keys: tokens commit in aligned groups of C::group_size (KIVI).
template <class C, bool PerChannel, class BackendTag>
struct RoleCodec {
  /// Tokens committed together.
  using codec = C;
  static constexpr bool per_channel = PerChannel;
  static constexpr int unit = PerChannel ? C::group_size : 1;
  /// Block size this codec requires (0: any).
  static constexpr int required_block_tokens = 0;
  /// Block size this codec prefers when no Blocks<> policy is given.
  static constexpr int preferred_block_tokens = PerChannel && C::group_size > 64 ? C::group_size : 64;
  /// Whether blocks must be read by the interval (keyframe) attention kernel.
  static constexpr bool interval_kernel = false;
  /// Channels per metadata group along head_dim (0: none), checked against head_dim at create().
  static constexpr int row_group = !PerChannel && C::grouped ? C::group_size : 0;

  /// Encodes n tokens (rows x + t * stride, D channels each) into slots [off, off + n) of `block`.
  static void encode(const float* x, std::ptrdiff_t stride, int n, int D, std::byte* block, std::size_t off,
                     const RoleRegion& r, std::uint8_t& /*flags*/) noexcept {
    if constexpr (PerChannel) {
      for (int g = 0; g < n; g += unit)
        encode_channels_on<BackendTag, C>(x + g * stride, stride, D, block + r.codes + (off + static_cast<std::size_t>(g)) * r.row, r.row,
                           block + r.meta + (off + static_cast<std::size_t>(g)) / unit * r.meta_group);
    } else {
      for (int t = 0; t < n; ++t) {
        const std::size_t s = off + static_cast<std::size_t>(t);
        encode_row_on<BackendTag, C>(x + t * stride, D, block + r.codes + s * r.row, block + r.meta + s * r.meta_token);
      }
    }
  }
};

}  // namespace kvpack
