// The keyframe codec's commit hook (codec/keyframe.hpp): a block holds exactly one interval, the
// interval commits as a whole (up to Interval - 1 newest tokens wait in fp32, as KIVI's key
// group), its mode (delta or plain) goes into the block's header flags and sets the block's size
// (BlockLayout::at: SequenceStore::commit then moves the payload into an allocation of that size),
// and blocks are read by the interval attention kernel (kernels/scalar/keyframe_attention.hpp)
// on every backend.
#pragma once

#include <cstddef>
#include <cstdint>

#include "kvpack/cache/role_codec.hpp"
#include "kvpack/codec/keyframe.hpp"

namespace kvpack {

/// RoleCodec of a Keyframe<...> codec (per-token axis only: Keys<> rejects per-channel keyframes).
template <class C, class BackendTag>
  requires is_keyframe_codec_v<C>
struct RoleCodec<C, false, BackendTag> {
  using codec = C;
  static constexpr bool per_channel = false;
  static constexpr int unit = C::interval;
  static constexpr int required_block_tokens = C::interval;
  static constexpr int preferred_block_tokens = C::interval;
  static constexpr bool interval_kernel = true;
  static constexpr int row_group = C::group_size;

  /// Encodes one whole interval (n == Interval tokens) into the block at r.codes (room for the
  /// larger mode) and records its mode in `flags` (bit r.mode_flag set = delta).
  static void encode(const float* x, std::ptrdiff_t stride, int n, int D, std::byte* block, std::size_t /*off*/,
                     const RoleRegion& r, std::uint8_t& flags) {
    const bool delta = C::encode_interval(x, stride, n, D, block + r.codes);
    flags = static_cast<std::uint8_t>((flags & ~r.mode_flag) | (delta ? r.mode_flag : 0u));
  }
};

}  // namespace kvpack
