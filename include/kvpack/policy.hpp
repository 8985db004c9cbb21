// Policy types that compose into KVCache<Policy...>. Each policy is an empty tag carrying
// constants; its `kvpack_role` member names the role KVCache finds it by (order-free).
#pragma once

#include <type_traits>

#include "kvpack/cache/demotion_budget.hpp"
#include "kvpack/codec/concepts.hpp"
#include "kvpack/codec/float_codec.hpp"
#include "kvpack/codec/fp8_codec.hpp"
#include "kvpack/codec/fp8_unscaled.hpp"
#include "kvpack/codec/int_codec.hpp"
#include "kvpack/codec/int_lowbit.hpp"
#include "kvpack/codec/nf4_codec.hpp"
#include "kvpack/codec/keyframe.hpp"

namespace kvpack {

/// Roles a policy can play inside KVCache.
namespace role {
struct keys {};
struct values {};
struct sinks {};
struct residual {};
struct blocks {};
struct backend {};
struct eviction {};
struct offload {};  ///< NoOffload (default, include/kvpack/cache/offload_hooks.hpp) or offload::Offload<...>
struct demotion {};  ///< NoDemotion (default) or Demote<Keys<LK>, Values<LV>>
struct rope {};      ///< PostRope (default: keys arrive rotated) or PreRope<Positions>
}  // namespace role

/// Key grouping axis: groups run along head_dim within each token (per-token, the default).
struct PerToken {};
/// Key grouping axis: groups run along tokens within each channel (KIVI, arXiv:2402.02750).
/// The last, incomplete group of tokens waits in full precision until group_size tokens arrive.
struct PerChannel {};

/// Codec (and grouping axis) of the keys. Default when absent: Keys<Fp32>. Keyframe<...> codecs
/// (codec/keyframe.hpp) are accepted with the per-token axis.
template <CacheCodec Codec, class Axis = PerToken>
struct Keys {
  static_assert(std::is_same_v<Axis, PerToken> || std::is_same_v<Axis, PerChannel>,
                "kvpack::Keys<Codec, Axis>: Axis must be kvpack::PerToken or kvpack::PerChannel");
  static_assert(!std::is_same_v<Axis, PerChannel> || Codec::grouped,
                "kvpack::Keys<Codec, PerChannel>: per-channel keys need a grouped codec "
                "(Int8, Int4, Int3, Int2, Fp8E4M3, Fp8E5M2); Fp32/Fp16 have no groups");
  using kvpack_role = role::keys;
  using codec = Codec;
  static constexpr bool per_channel = std::is_same_v<Axis, PerChannel>;
};

/// Codec of the values, always grouped per token (or a Keyframe<...> codec). Default when absent:
/// Values<Fp32>.
template <CacheCodec Codec>
struct Values {
  using kvpack_role = role::values;
  using codec = Codec;
};

/// Attention sinks (StreamingLLM, arXiv:2309.17453): the first N tokens stay in full precision
/// (fp32) for the life of the cache. Default: Sinks<0>.
template <int N>
struct Sinks {
  static_assert(N >= 0, "kvpack::Sinks<N>: N must be >= 0");
  using kvpack_role = role::sinks;
  static constexpr int count = N;
};

/// Residual window: the most recent R tokens stay in full precision (fp32); older tokens are
/// quantized as they leave the window (KIVI keeps R = 128). Default: Residual<0>.
template <int R>
struct Residual {
  static_assert(R >= 0, "kvpack::Residual<R>: R must be >= 0");
  using kvpack_role = role::residual;
  static constexpr int tokens = R;
};

/// Tokens per storage block (the unit of quantized storage, eviction, offload). Default: 64, or the
/// key group size when per-channel keys use a larger group. Any B in [2, 1024]; powers of two
/// are not required on the CPU (a Keyframe<10, ...> cache uses Blocks<10>).
template <int B>
struct Blocks {
  static_assert(B >= 2 && B <= 1024,
                "kvpack::Blocks<B>: B must be in [2, 1024] tokens (block headers count tokens in 16 bits; "
                "the CUDA decode path alone needs a power of two >= 8)");
  using kvpack_role = role::blocks;
  static constexpr int tokens = B;
};

/// Kernel backend tags (kernels/dispatch.hpp resolves them at compile time).
/// Auto: the best kernel the translation unit is compiled for (AVX2, then NEON, else scalar).
struct Auto {};
/// Portable scalar kernel (kernels/scalar/): the executable specification; always available.
struct Scalar {};
/// x86-64 AVX2 + FMA + F16C kernel (kernels/avx2/); needs KVPACK_HAS_AVX2 (-march=x86-64-v3).
struct Avx2 {};
/// AArch64 Advanced SIMD kernel (kernels/neon/); needs KVPACK_HAS_NEON.
struct Neon {};
/// Reserved for the CUDA kernels (kernels/cuda/); not accepted by the host KVCache::attend.
struct Cuda {};
/// Backend selection policy. Default: Backend<Auto>.
template <class Tag>
struct Backend {
  using kvpack_role = role::backend;
  using tag = Tag;
};

/// Keys arrive after RoPE (the engine rotated them); the cache never touches positions. Default.
struct PostRope {
  using kvpack_role = role::rope;
  static constexpr bool enabled = false;
  static constexpr bool cache_relative = false;
};
/// RoPE positions of PreRope<>: each token's original position (as appended).
struct OriginalPositions {};
/// RoPE positions of PreRope<>: each held token's rank within the cache (0, 1, ... in arrival
/// order over the tokens a KV head holds after eviction), the query at the next rank: StreamingLLM's
/// positions within the cache (arXiv:2309.17453, section 3.2), which keep every distance inside
/// the range the model was trained on however long the stream runs.
struct CacheRelative {};
/// Keys (and queries) arrive before RoPE; the attention kernels rotate queries and dequantized
/// keys at their positions (kernels/rope.hpp; ModelShape::rope_base / rope_dims / rope_neox give
/// the model's RoPE). Keys are quantized unrotated, as KVQuant (arXiv:2401.18079) recommends for
/// per-channel keys. Costs: the AVX2 integer Q·K paths step aside (fp32 tiles), each key row is
/// rotated once per attend and KV head, and a cos/sin table of rope_dims floats per position
/// (grown to the largest position used) sits beside the cache.
template <class Positions = OriginalPositions>
struct PreRope {
  static_assert(std::is_same_v<Positions, OriginalPositions> || std::is_same_v<Positions, CacheRelative>,
                "kvpack::PreRope<Positions>: Positions must be kvpack::OriginalPositions or kvpack::CacheRelative");
  using kvpack_role = role::rope;
  static constexpr bool enabled = true;
  static constexpr bool cache_relative = std::is_same_v<Positions, CacheRelative>;
};

namespace detail {
template <class P, class = void>
struct role_of {
  using type = void;
};
template <class P>
struct role_of<P, std::void_t<typename P::kvpack_role>> {
  using type = typename P::kvpack_role;
};
template <class P>
using role_of_t = typename role_of<P>::type;

template <class Role>
struct has_role {
  template <class P>
  struct pred : std::is_same<role_of_t<P>, Role> {};
};

template <class Role, class Default, class... Ps>
using find_role_t = pick_or_t<has_role<Role>::template pred, Default, Ps...>;

template <class Role, class... Ps>
inline constexpr int role_count_v = count_if_v<has_role<Role>::template pred, Ps...>;
}  // namespace detail

/// Demotion instead of deletion (MiKV, "No Token Left Behind", Yang et al. 2024,
/// arXiv:2402.18096): the tokens an eviction policy drops are re-coded into a low-precision tier
/// of the same cache, with K codec LowKeys::codec and V codec LowValues::codec (e.g.
/// Demote<Keys<Int2<Group<32>>>, Values<Int2<Group<32>>>>; keys may be per channel, KIVI's axis:
/// Keys<Int2<Group<32>>, PerChannel> codes each 32 demoted rows together, the newest < 32 staged
/// in fp32 meanwhile), and attention reads both tiers
/// (include/kvpack/cache/demotion_tier.hpp). Needs an eviction policy; sinks and the recent
/// window stay as the policy keeps them. Default: NoDemotion (dropped tokens are deleted).
/// The third parameter caps the low tier per (layer, KV head) (cache/demotion_budget.hpp): Tokens<N>
/// or Fraction<Num, Den> of max_tokens rows, or Fp16Share<Num, Den>, a byte budget for both tiers
/// (Num/Den of an fp16 cache of max_tokens); past the cap the oldest demoted row is deleted.
/// Default Unbounded: every dropped token stays in the low tier.
template <class LowKeys, class LowValues, class LowBudget = Unbounded>
struct Demote {
  static_assert(std::is_same_v<detail::role_of_t<LowKeys>, role::keys> &&
                    std::is_same_v<detail::role_of_t<LowValues>, role::values>,
                "kvpack::Demote<LowKeys, LowValues>: write Demote<Keys<Codec>, Values<Codec>>, e.g. "
                "Demote<Keys<Int2<Group<32>>>, Values<Int2<Group<32>>>>");
  static_assert(LowTierBudget<LowBudget>,
                "kvpack::Demote<Keys<LK>, Values<LV>, Budget>: Budget must be Tokens<N>, Fraction<Num, Den>, "
                "Fp16Share<Num, Den> or Unbounded");
  using kvpack_role = role::demotion;
  using budget = LowBudget;
  using keys = LowKeys;
  using values = LowValues;
  static constexpr bool enabled = true;
};

/// No low tier: an evicted token is deleted (the default).
struct NoDemotion {
  using kvpack_role = role::demotion;
  static constexpr bool enabled = false;
};

}  // namespace kvpack
