// CodecHook: the K and V RoleCodecs of a cache as one object: the commit unit, the block size and
// header, the encode of one commit unit, and which kernel attends and decodes the blocks. The
// cache calls these at commit, attend and read_back; codec kinds are told apart only here and in
// the RoleCodec specializations.
#pragma once

#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <cstring>

#include "kvpack/cache/block.hpp"
#include "kvpack/cache/keyframe_hook.hpp"
#include "kvpack/cache/role_codec.hpp"
#include "kvpack/codec/format_id.hpp"
#include "kvpack/kernels/dispatch.hpp"
#include "kvpack/kernels/scalar/keyframe_attention.hpp"

namespace kvpack {

/// Codec hooks of a cache with key codec KC (per-channel when KPerChannel), value codec VC and
/// attention backend BackendTag (resolved).
template <class KC, class VC, bool KPerChannel, class BackendTag>
struct CodecHook {
  using key_codec = KC;
  using value_codec = VC;
  static constexpr bool keys_per_channel = KPerChannel;
  using K = RoleCodec<KC, KPerChannel, BackendTag>;
  using V = RoleCodec<VC, false, BackendTag>;
  static_assert(K::unit == 1 || V::unit == 1 || K::unit == V::unit,
                "kvpack::KVCache<...>: Keys<Keyframe<I1,...>> and Values<Keyframe<I2,...>> need I1 == I2, and "
                "Keys<Codec, PerChannel> cannot be combined with a Keyframe<...> value codec");
  /// Tokens committed together (1: token-level eviction is possible).
  static constexpr int commit_unit = std::max(K::unit, V::unit);
  /// Block size the codecs require (0: any).
  static constexpr int required_block_tokens = std::max(K::required_block_tokens, V::required_block_tokens);
  /// Block size without a Blocks<> policy.
  static constexpr int preferred_block_tokens = std::max(K::preferred_block_tokens, V::preferred_block_tokens);
  /// Whether blocks hold whole intervals read by the interval kernel (no masks, no key mass).
  static constexpr bool interval_blocks = K::interval_kernel || V::interval_kernel;

  /// What the attention kernel does (kernels::KernelInfo: backend, quantized query, integer P·V).
  static constexpr kernels::KernelInfo kernel = kernels::kernel_info<BackendTag, KC, VC, KPerChannel>();

  /// The pair's stored codec identity (codec/format_id.hpp), told to the offload layer.
  [[nodiscard]] static constexpr std::uint32_t format_id() noexcept { return codec_format_id<KC, VC>(); }

  /// Header fields every new block starts with.
  [[nodiscard]] static BlockHeader header(int head_dim) noexcept {
    BlockHeader h;
    h.k_bits = static_cast<std::uint8_t>(KC::bits);
    h.v_bits = static_cast<std::uint8_t>(VC::bits);
    h.flags = KPerChannel ? 1 : 0;
    h.k_group = static_cast<std::uint16_t>(KC::group_size);
    h.v_group = static_cast<std::uint16_t>(VC::group_size);
    h.head_dim = static_cast<std::uint16_t>(head_dim);
    return h;
  }

  /// Encodes commit_unit tokens (K rows k + t * stride, V rows v + t * stride, D channels,
  /// positions pos[t], stored when L.pos_bytes != 0) into slots [off, off + commit_unit) of block b.
  static void encode(const BlockLayout& L, Block& b, std::size_t off, const float* k, const float* v,
                     std::ptrdiff_t stride, const std::int32_t* pos) {
    encode(L, b.data.get(), b.header.flags, off, k, v, stride, pos);
  }
  /// The same into a payload `d` of L.bytes bytes that the caller owns (a pool page), `flags` its
  /// header's flags. Keyframe blocks: K's mode (known once K is coded) places V, both modes the
  /// positions (BlockLayout::at); L.at(flags).bytes bytes are written, the rest of `d` is untouched.
  static void encode(const BlockLayout& L, std::byte* d, std::uint8_t& flags, std::size_t off, const float* k,
                     const float* v, std::ptrdiff_t stride, const std::int32_t* pos) {
    const int D = L.head_dim;
    K::encode(k, stride, commit_unit, D, d, off, RoleRegion::of(L, true), flags);
    if constexpr (interval_blocks) {
      V::encode(v, stride, commit_unit, D, d, off, RoleRegion::of(L.at(flags), false), flags);
      if (L.pos_bytes) std::memcpy(d + L.at(flags).positions + off * sizeof(std::int32_t), pos, commit_unit * sizeof(std::int32_t));
    } else {
      V::encode(v, stride, commit_unit, D, d, off, RoleRegion::of(L, false), flags);
      if (L.pos_bytes) std::memcpy(d + L.positions + off * sizeof(std::int32_t), pos, commit_unit * sizeof(std::int32_t));
    }
  }

  /// Grows the codecs' encode scratch for head_dim D (keyframe intervals), so that encode then
  /// allocates nothing (KVCache::append reserves before it changes anything). May throw std::bad_alloc.
  static void reserve_encode(int D) {
    if constexpr (requires { KC::reserve_encode(D); }) KC::reserve_encode(D);
    if constexpr (requires { VC::reserve_encode(D); }) VC::reserve_encode(D);
  }

  /// Runs the fused attention kernel over one KV head's segments.
  static void attend(const kernels::AttendArgs& a, const kernels::HeadSegments& seg, const BlockLayout& L,
                     kernels::Scratch& s) {
    if constexpr (interval_blocks) kernels::attend_keyframe<KC, VC>(a, seg, L, s);
    else kernels::attend<BackendTag, KC, VC, KPerChannel>(a, seg, L, s);
  }

  /// Decodes the first `count` tokens of a block into s.k_tile / s.v_tile ([count][D]) as the
  /// kernel reads them (s sized by ensure(1, D, B)).
  static void decode(const BlockLayout& L, const std::byte* data, std::uint8_t flags, int count, kernels::Scratch& s) {
    if constexpr (interval_blocks)
      kernels::keyframe_detail::decode_block<KC, VC>(L, data, flags, count, s.k_tile.data(), s.v_tile.data());
    else
      kernels::scalar_detail::dequantize_block<KC, VC, KPerChannel>(L, kernels::BlockRef{data, 0, count, nullptr}, s);
  }
};

}  // namespace kvpack
