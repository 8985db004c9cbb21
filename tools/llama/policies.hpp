// The named KV-cache policies kvpack-eval knows: a compile-time list of (name, cache type) pairs
// and a runtime dispatch from a name to a function template. Adding a policy is one line.
#pragma once

#include <algorithm>
#include <cstddef>
#include <string>
#include <string_view>
#include <type_traits>
#include <utility>
#include <vector>

#include <kvpack/kvpack.hpp>
#if defined(KVPACK_HAS_SODIUM)
#include <kvpack/offload.hpp>
#endif

#include "reference_cache.hpp"

namespace kvpack::llama {

/// A string usable as a template argument (a policy's name).
template <std::size_t N>
struct PolicyName {
  char text[N]{};
  constexpr PolicyName(const char (&s)[N]) { std::copy_n(s, N, text); }  // NOLINT: implicit by design
  [[nodiscard]] constexpr std::string_view view() const { return {text, N - 1}; }
};

/// One registry entry: `Name` selects cache type `Cache`; `Default` entries run when
/// --policies is not given.
template <PolicyName Name, class Cache, bool Default = true>
struct Policy {
  static constexpr std::string_view name = Name.view();
  static constexpr bool in_defaults = Default;
  using cache = Cache;
};

template <class... Ps>
struct PolicyList {};

/// Every policy kvpack-eval can run. "fp32" is the baseline the others are compared with.
using Registry = PolicyList<
    Policy<"fp32", KVCache<Keys<Fp32>, Values<Fp32>>>,
    Policy<"fp16", KVCache<Keys<Fp16>, Values<Fp16>>>,
    Policy<"int8", KVCache<Keys<Int8<Group<32>>>, Values<Int8<Group<32>>>>>,
    Policy<"int4-g32", KVCache<Keys<Int4<Group<32>>>, Values<Int4<Group<32>>>>>,
    Policy<"int4-g64", KVCache<Keys<Int4<Group<64>>>, Values<Int4<Group<64>>>>>,
    Policy<"k8v4", KVCache<Keys<Int8<Group<32>>>, Values<Int4<Group<32>>>>>,
    Policy<"kivi4", KVCache<Keys<Int4<Group<32>>, PerChannel>, Values<Int4<Group<32>>>, Residual<128>>>,
    // INT8 with per-channel keys (KIVI at 8 bits, no residual; int8's bytes at multiples of 32 tokens),
    // a baseline for the planner at the INT8 budget (docs/RESULTS-planner.md; not default).
    Policy<"kivi8", KVCache<Keys<Int8<Group<32>>, PerChannel>, Values<Int8<Group<32>>>>, false>,
    Policy<"fp8-e4m3", KVCache<Keys<Fp8E4M3<Group<32>>>, Values<Fp8E4M3<Group<32>>>>>,
    // FP8 at 8.0 bits (codec/fp8_unscaled.hpp): scale 1 everywhere (vLLM's default k/v_scale), and
    // scales calibrated per KV head or per channel on each layer's first chunk (Calibrated<>).
    Policy<"fp8-e4m3-s1", KVCache<Keys<Fp8E4M3Unscaled>, Values<Fp8E4M3Unscaled>>, false>,
    Policy<"fp8-e4m3-calib", Calibrated<KVCache<Keys<Fp8E4M3Unscaled>, Values<Fp8E4M3Unscaled>>>, false>,
    Policy<"fp8-e4m3-calib-ch", Calibrated<KVCache<Keys<Fp8E4M3Unscaled>, Values<Fp8E4M3Unscaled>>, Calibrate<PerChannelScale>>, false>,
    // Eviction at a 1024-token budget (not default: they only act on contexts above 1024).
    Policy<"int4-g32+sink-window-1k", KVCache<Keys<Int4<Group<32>>>, Values<Int4<Group<32>>>, SinkWindow<4, 1020>>, false>,
    Policy<"int4-g32+h2o-1k", KVCache<Keys<Int4<Group<32>>>, Values<Int4<Group<32>>>, H2O<512, 508, 4>>, false>,
    // Delta / keyframe coding (codec/keyframe.hpp; not default), at most 5.17 bits/value: fp16
    // keyframe + 63 INT4-g32 deltas per delta interval, plain intervals INT4-g32 rows (5.0),
    // never-expand per interval; kf64-plain is the same commit rule (up to 63 newest tokens in
    // fp32) without deltas, the control. Measured when plain intervals still paid the keyframe
    // (docs/RESULTS-keyframe.md, WikiText-2 ctx 2048 x 2): ΔPPL kf64-plain +3.12 %, anchor
    // +1.15 %, chained +0.76 % (KL 0.0057) vs kivi4-r0 +0.67 % (KL 0.0070, 5.27 bits measured).
    // Deltas help per-token keys (MSE / 4.2 chained), per-channel keys do as well; values: no.
    Policy<"kf64-plain", KVCache<Keys<Keyframe<64, Int4<Group<32>>, Fp16, PlainOnly>>, Values<Keyframe<64, Int4<Group<32>>, Fp16, PlainOnly>>>, false>,
    Policy<"kf64-anchor", KVCache<Keys<Keyframe<64, Int4<Group<32>>, Fp16, Anchor>>, Values<Keyframe<64, Int4<Group<32>>, Fp16, Anchor>>>, false>,
    Policy<"kf64-chained", KVCache<Keys<Keyframe<64, Int4<Group<32>>, Fp16, Chained>>, Values<Keyframe<64, Int4<Group<32>>, Fp16, Chained>>>, false>,
    // Control for kf64-*: KIVI keys without kivi4's 128-token fp32 residual (incomplete key group in fp32).
    Policy<"kivi4-r0", KVCache<Keys<Int4<Group<32>>, PerChannel>, Values<Int4<Group<32>>>>, false>,
    // Below 4 bits (issue 20; codec/int_lowbit.hpp; not default). Codec bits per value in brackets
    // (K and V averaged, metadata included; stored positions and fp32 residual/partial key groups
    // come on top and are counted by the eval): KIVI-2/3 as the paper (fp32 residual of 128
    // tokens), the same without residual (-r0), per-token INT3/INT2, mixed K/V widths, and
    // larger groups (-g64; -g128-64: keys grouped over 128 tokens, values over 64 channels, as a
    // value group cannot exceed head_dim 64 of SmolLM2) for the 3.5- and 2.5-bit targets.
    Policy<"kivi2", KVCache<Keys<Int2<Group<32>>, PerChannel>, Values<Int2<Group<32>>>, Residual<128>>, false>,   // [3.0]
    Policy<"kivi3", KVCache<Keys<Int3<Group<32>>, PerChannel>, Values<Int3<Group<32>>>, Residual<128>>, false>,   // [4.0]
    Policy<"kivi2-r0", KVCache<Keys<Int2<Group<32>>, PerChannel>, Values<Int2<Group<32>>>>, false>,                // [3.0]
    Policy<"kivi3-r0", KVCache<Keys<Int3<Group<32>>, PerChannel>, Values<Int3<Group<32>>>>, false>,                // [4.0]
    Policy<"int3-g32", KVCache<Keys<Int3<Group<32>>>, Values<Int3<Group<32>>>>, false>,                            // [4.0]
    Policy<"int3-g64", KVCache<Keys<Int3<Group<64>>>, Values<Int3<Group<64>>>>, false>,                            // [3.5]
    Policy<"int2-g32", KVCache<Keys<Int2<Group<32>>>, Values<Int2<Group<32>>>>, false>,                            // [3.0]
    Policy<"k4v2", KVCache<Keys<Int4<Group<32>>>, Values<Int2<Group<32>>>>, false>,                                // [4.0]
    Policy<"k4v3", KVCache<Keys<Int4<Group<32>>>, Values<Int3<Group<32>>>>, false>,                                // [4.5]
    Policy<"kc4v2-r0", KVCache<Keys<Int4<Group<32>>, PerChannel>, Values<Int2<Group<32>>>>, false>,                // [4.0]
    Policy<"kc3v3-g64", KVCache<Keys<Int3<Group<64>>, PerChannel>, Values<Int3<Group<64>>>>, false>,              // [3.5]
    Policy<"kc3v2-g64", KVCache<Keys<Int3<Group<64>>, PerChannel>, Values<Int2<Group<64>>>>, false>,              // [3.0]
    Policy<"kc3v3-g128-64", KVCache<Keys<Int3<Group<128>>, PerChannel>, Values<Int3<Group<64>>>>, false>,         // [3.375]
    Policy<"kc2v2-g128-64", KVCache<Keys<Int2<Group<128>>, PerChannel>, Values<Int2<Group<64>>>>, false>,         // [2.375]
    Policy<"kc3v2-g128-64", KVCache<Keys<Int3<Group<128>>, PerChannel>, Values<Int2<Group<64>>>>, false>,         // [2.875]
    // 4-bit codebook vs uniform at equal bits (issue 20; codec/nf4_codec.hpp, docs/RESULTS-nf4.md):
    // NF4 with an fp16 absmax scale per group of 32 / 64, and symmetric INT4 (fp16 scale, no
    // zero-point) at the same 4.5 bits as nf4-g32 and asymmetric int4-g64.
    Policy<"nf4-g32", KVCache<Keys<Nf4<Group<32>>>, Values<Nf4<Group<32>>>>, false>,                                // [4.5]
    Policy<"nf4-g64", KVCache<Keys<Nf4<Group<64>>>, Values<Nf4<Group<64>>>>, false>,                                // [4.25]
    Policy<"int4s-g32", KVCache<Keys<Int4<Symmetric, Group<32>>>, Values<Int4<Symmetric, Group<32>>>>, false>,      // [4.5]
    Policy<"kc-nf4-r0", KVCache<Keys<Nf4<Group<32>>, PerChannel>, Values<Nf4<Group<32>>>>, false>,               // [4.5]
    Policy<"nf4-g32+rot", Rotated<KVCache<Keys<Nf4<Group<32>>>, Values<Nf4<Group<32>>>>>, false>,
    Policy<"nf4-g64+rot", Rotated<KVCache<Keys<Nf4<Group<64>>>, Values<Nf4<Group<64>>>>>, false>,
    // The same with keys and values in a Hadamard-rotated basis (rotation/rotated_cache.hpp; +rot:
    // plain block Hadamard, +srot: with fixed ±1 channel signs), same bits.
    Policy<"int4-g32+rot", Rotated<KVCache<Keys<Int4<Group<32>>>, Values<Int4<Group<32>>>>>, false>,
    Policy<"int4-g64+rot", Rotated<KVCache<Keys<Int4<Group<64>>>, Values<Int4<Group<64>>>>>, false>,
    Policy<"int3-g32+rot", Rotated<KVCache<Keys<Int3<Group<32>>>, Values<Int3<Group<32>>>>>, false>,
    Policy<"int3-g64+rot", Rotated<KVCache<Keys<Int3<Group<64>>>, Values<Int3<Group<64>>>>>, false>,
    Policy<"int2-g32+rot", Rotated<KVCache<Keys<Int2<Group<32>>>, Values<Int2<Group<32>>>>>, false>,
    Policy<"int3-g64+srot", Rotated<KVCache<Keys<Int3<Group<64>>>, Values<Int3<Group<64>>>>, Rotate<SignedHadamard>>, false>,
    Policy<"kivi2-r0+rot", Rotated<KVCache<Keys<Int2<Group<32>>, PerChannel>, Values<Int2<Group<32>>>>>, false>,
    Policy<"kc3v3-g128-64+rot", Rotated<KVCache<Keys<Int3<Group<128>>, PerChannel>, Values<Int3<Group<64>>>>>, false>,
    Policy<"kc2v2-g128-64+rot", Rotated<KVCache<Keys<Int2<Group<128>>, PerChannel>, Values<Int2<Group<64>>>>>, false>,
    // Eviction at 50 % / 25 % of the context (not default). SinkWindow, H2O and BlockSparse resolve
    // their Fraction<> against ModelShape::max_tokens, which kvpack-eval sets to the context (--ctx,
    // or the needle length: see eval_capacity in kvpack_eval.cpp); at 4096 they hold 2048 / 1024
    // tokens per layer and KV head, exactly SinkWindow<4, 2044 / 1020>, H2O<1024, 1020, 4 /
    // 512, 508, 4> and BlockSparse<Tokens<2048 / 1024>>. SnapKV's fraction is of the prompt at
    // compression, window included: 1024 / 512 of WikiText's 2048-token context, 2048 / 1024 of
    // a 4096-token needle prompt (2045 / 1022 of its 4090 tokens). BlockSparse: 64-token blocks.
    Policy<"sink-window-50", KVCache<SinkWindowBudget<Fraction<1, 2>>>, false>,
    Policy<"sink-window-25", KVCache<SinkWindowBudget<Fraction<1, 4>>>, false>,
    Policy<"h2o-50", KVCache<H2OBudget<Fraction<1, 2>>>, false>,
    Policy<"h2o-25", KVCache<H2OBudget<Fraction<1, 4>>>, false>,
    Policy<"snapkv-50", KVCache<SnapKVBudget<Fraction<1, 2>>>, false>,
    Policy<"snapkv-25", KVCache<SnapKVBudget<Fraction<1, 4>>>, false>,
    Policy<"block-sparse-50", KVCache<BlockSparse<Fraction<1, 2>>>, false>,
    Policy<"block-sparse-25", KVCache<BlockSparse<Fraction<1, 4>>>, false>,
    Policy<"int4-g32+sink-window-50", KVCache<Keys<Int4<Group<32>>>, Values<Int4<Group<32>>>, SinkWindowBudget<Fraction<1, 2>>>, false>,
    Policy<"int4-g32+sink-window-25", KVCache<Keys<Int4<Group<32>>>, Values<Int4<Group<32>>>, SinkWindowBudget<Fraction<1, 4>>>, false>,
    Policy<"int4-g32+h2o-50", KVCache<Keys<Int4<Group<32>>>, Values<Int4<Group<32>>>, H2OBudget<Fraction<1, 2>>>, false>,
    Policy<"int4-g32+h2o-25", KVCache<Keys<Int4<Group<32>>>, Values<Int4<Group<32>>>, H2OBudget<Fraction<1, 4>>>, false>,
    Policy<"int4-g32+snapkv-50", KVCache<Keys<Int4<Group<32>>>, Values<Int4<Group<32>>>, SnapKVBudget<Fraction<1, 2>>>, false>,
    Policy<"int4-g32+snapkv-25", KVCache<Keys<Int4<Group<32>>>, Values<Int4<Group<32>>>, SnapKVBudget<Fraction<1, 4>>>, false>,
    Policy<"int4-g32+block-sparse-50", KVCache<Keys<Int4<Group<32>>>, Values<Int4<Group<32>>>, BlockSparse<Fraction<1, 2>>>, false>,
    Policy<"int4-g32+block-sparse-25", KVCache<Keys<Int4<Group<32>>>, Values<Int4<Group<32>>>, BlockSparse<Fraction<1, 4>>>, false>,
    // Keys before RoPE (PreRope<>, issue 20; not default): the kernels rotate queries and keys at
    // the stored positions (-pre: must score as the post-RoPE policy up to rounding for fp32) or
    // at each held token's rank in the cache (-rel, StreamingLLM's positions within the cache).
    Policy<"fp32-pre", KVCache<PreRope<>>, false>,
    Policy<"int4-g32-pre", KVCache<Keys<Int4<Group<32>>>, Values<Int4<Group<32>>>, PreRope<>>, false>,
    Policy<"kivi4-pre", KVCache<Keys<Int4<Group<32>>, PerChannel>, Values<Int4<Group<32>>>, Residual<128>, PreRope<>>, false>,
    Policy<"kivi4-r0-pre", KVCache<Keys<Int4<Group<32>>, PerChannel>, Values<Int4<Group<32>>>, PreRope<>>, false>,
    Policy<"kivi2-r0-pre", KVCache<Keys<Int2<Group<32>>, PerChannel>, Values<Int2<Group<32>>>, PreRope<>>, false>,
    // Toward issue 20's <= 4.5-bit row (docs/RESULTS-4bit.md): per-channel keys before RoPE,
    // fp32 sinks, values Hadamard-rotated (values only: keys before RoPE cannot be rotated), and a
    // control for the values' error. The 4-window exploration's other policies are listed there.
    Policy<"k8-v4-g64+vrot", Rotated<KVCache<Keys<Int8<Group<32>>>, Values<Int4<Group<64>>>>, Rotate<Hadamard, true, false>>, false>,
    Policy<"kc4-g64-s4+vs4rot", Rotated<KVCache<Keys<Int4<Group<64>>, PerChannel>, Values<Int4<Symmetric, Group<64>>>, Sinks<4>>, Rotate<Hadamard, true, false>>, false>,
    Policy<"kc4-g64-pre-s4+vs4rot", Rotated<KVCache<Keys<Int4<Group<64>>, PerChannel>, Values<Int4<Symmetric, Group<64>>>, Sinks<4>, PreRope<>>, Rotate<Hadamard, true, false>>, false>,
    Policy<"kc4-g32-pre-s4+vs4rot", Rotated<KVCache<Keys<Int4<Group<32>>, PerChannel>, Values<Int4<Symmetric, Group<64>>>, Sinks<4>, PreRope<>>, Rotate<Hadamard, true, false>>, false>,
    Policy<"kc4-g64-pre-s4", KVCache<Keys<Int4<Group<64>>, PerChannel>, Values<Int4<Group<64>>>, Sinks<4>, PreRope<>>, false>,
    Policy<"kc3v3-g64-pre", KVCache<Keys<Int3<Group<64>>, PerChannel>, Values<Int3<Group<64>>>, PreRope<>>, false>,
    Policy<"sink-window-50-pre", KVCache<SinkWindowBudget<Fraction<1, 2>>, PreRope<>>, false>,
    Policy<"sink-window-50-rel", KVCache<SinkWindowBudget<Fraction<1, 2>>, PreRope<CacheRelative>>, false>,
    Policy<"sink-window-25-rel", KVCache<SinkWindowBudget<Fraction<1, 4>>, PreRope<CacheRelative>>, false>,
    Policy<"h2o-50-rel", KVCache<H2OBudget<Fraction<1, 2>>, PreRope<CacheRelative>>, false>,
    Policy<"h2o-25-rel", KVCache<H2OBudget<Fraction<1, 4>>, PreRope<CacheRelative>>, false>,
    // A 1024-token sliding window for streams past the trained context (--beyond-trained-context):
    // with original positions the sinks drift out of the trained distances, with ranks they do not.
    Policy<"sink-window-1k", KVCache<SinkWindow<4, 1020>>, false>,
    Policy<"sink-window-1k-rel", KVCache<SinkWindow<4, 1020>, PreRope<CacheRelative>>, false>,
#if defined(KVPACK_HAS_SODIUM)
    // int4-g32 with full blocks offloaded to an encrypted file tier under a resident budget
    // (--offload-budget, default 25 %), prefetching 2 layers ahead; logits must equal int4-g32's.
    Policy<"int4-g32+offload", KVCache<Keys<Int4<Group<32>>>, Values<Int4<Group<32>>>,
                                       offload::Offload<offload::DeviceTier, offload::FileTier, offload::Prefetch<2>>>, false>,
#endif
    // SnapKV at 25 % with a max-pooling kernel of 7 or 9 instead of 5 (docs/RESULTS-snapkv-needle.md):
    // SmolLM2 spells a 5-digit pass key as 6 tokens; the question's queries attend to the key's
    // start, and kernel 5 (+-2 tokens) keeps its later digits in too few heads (4th digit lost at
    // every depth). Kernel 9: needle 3/3 at 25 %, ΔPPL not worse. The -k9 budgets are the same
    // fractions of the prompt as snapkv-50 / snapkv-25 (window included).
    Policy<"snapkv-25-k7", KVCache<SnapKVBudget<Fraction<1, 4>, 32, 7>>, false>,
    Policy<"snapkv-50-k9", KVCache<SnapKVBudget<Fraction<1, 2>, 32, 9>>, false>,
    Policy<"snapkv-25-k9", KVCache<SnapKVBudget<Fraction<1, 4>, 32, 9>>, false>,
    Policy<"int4-g32+snapkv-50-k9", KVCache<Keys<Int4<Group<32>>>, Values<Int4<Group<32>>>, SnapKVBudget<Fraction<1, 2>, 32, 9>>, false>,
    Policy<"int4-g32+snapkv-25-k9", KVCache<Keys<Int4<Group<32>>>, Values<Int4<Group<32>>>, SnapKVBudget<Fraction<1, 4>, 32, 9>>, false>,
    // Not run by default: the engine's own cache without kvpack, and a destructive cache (every V
    // stored as zero) that proves the cache is in the path of every scored token.
    // Issue 24, the equal-memory group (--policies equal-memory): every eviction policy at 50 % / 25 %
    // of the prompt under both protocols (Protocol<P, PromptOnce | FixedBudget>), alone and over INT4.
    Policy<"sink-window-50-prompt", KVCache<Protocol<SinkWindowBudget<Fraction<1, 2>>, PromptOnce>>, false>,
    Policy<"sink-window-50-fixed", KVCache<Protocol<SinkWindowBudget<Fraction<1, 2>>, FixedBudget>>, false>,
    Policy<"sink-window-25-prompt", KVCache<Protocol<SinkWindowBudget<Fraction<1, 4>>, PromptOnce>>, false>,
    Policy<"sink-window-25-fixed", KVCache<Protocol<SinkWindowBudget<Fraction<1, 4>>, FixedBudget>>, false>,
    Policy<"h2o-50-prompt", KVCache<Protocol<H2OBudget<Fraction<1, 2>>, PromptOnce>>, false>,
    Policy<"h2o-50-fixed", KVCache<Protocol<H2OBudget<Fraction<1, 2>>, FixedBudget>>, false>,
    Policy<"h2o-25-prompt", KVCache<Protocol<H2OBudget<Fraction<1, 4>>, PromptOnce>>, false>,
    Policy<"h2o-25-fixed", KVCache<Protocol<H2OBudget<Fraction<1, 4>>, FixedBudget>>, false>,
    Policy<"snapkv-50-prompt", KVCache<Protocol<SnapKVBudget<Fraction<1, 2>>, PromptOnce>>, false>,
    Policy<"snapkv-50-fixed", KVCache<Protocol<SnapKVBudget<Fraction<1, 2>>, FixedBudget>>, false>,
    Policy<"snapkv-25-prompt", KVCache<Protocol<SnapKVBudget<Fraction<1, 4>>, PromptOnce>>, false>,
    Policy<"snapkv-25-fixed", KVCache<Protocol<SnapKVBudget<Fraction<1, 4>>, FixedBudget>>, false>,
    Policy<"block-sparse-50-prompt", KVCache<Protocol<BlockSparse<Fraction<1, 2>, 32>, PromptOnce>>, false>,
    Policy<"block-sparse-50-fixed", KVCache<Protocol<BlockSparse<Fraction<1, 2>, 32>, FixedBudget>>, false>,
    Policy<"block-sparse-25-prompt", KVCache<Protocol<BlockSparse<Fraction<1, 4>, 32>, PromptOnce>>, false>,
    Policy<"block-sparse-25-fixed", KVCache<Protocol<BlockSparse<Fraction<1, 4>, 32>, FixedBudget>>, false>,
    Policy<"int4-g32+h2o-50-prompt", KVCache<Keys<Int4<Group<32>>>, Values<Int4<Group<32>>>, Protocol<H2OBudget<Fraction<1, 2>>, PromptOnce>>, false>,
    Policy<"int4-g32+h2o-50-fixed", KVCache<Keys<Int4<Group<32>>>, Values<Int4<Group<32>>>, Protocol<H2OBudget<Fraction<1, 2>>, FixedBudget>>, false>,
    Policy<"int4-g32+h2o-25-prompt", KVCache<Keys<Int4<Group<32>>>, Values<Int4<Group<32>>>, Protocol<H2OBudget<Fraction<1, 4>>, PromptOnce>>, false>,
    Policy<"int4-g32+h2o-25-fixed", KVCache<Keys<Int4<Group<32>>>, Values<Int4<Group<32>>>, Protocol<H2OBudget<Fraction<1, 4>>, FixedBudget>>, false>,
    Policy<"int4-g32+snapkv-50-prompt", KVCache<Keys<Int4<Group<32>>>, Values<Int4<Group<32>>>, Protocol<SnapKVBudget<Fraction<1, 2>>, PromptOnce>>, false>,
    Policy<"int4-g32+snapkv-50-fixed", KVCache<Keys<Int4<Group<32>>>, Values<Int4<Group<32>>>, Protocol<SnapKVBudget<Fraction<1, 2>>, FixedBudget>>, false>,
    Policy<"int4-g32+snapkv-25-prompt", KVCache<Keys<Int4<Group<32>>>, Values<Int4<Group<32>>>, Protocol<SnapKVBudget<Fraction<1, 4>>, PromptOnce>>, false>,
    Policy<"int4-g32+snapkv-25-fixed", KVCache<Keys<Int4<Group<32>>>, Values<Int4<Group<32>>>, Protocol<SnapKVBudget<Fraction<1, 4>>, FixedBudget>>, false>,
    Policy<"int4-g32+sink-window-50-prompt", KVCache<Keys<Int4<Group<32>>>, Values<Int4<Group<32>>>, Protocol<SinkWindowBudget<Fraction<1, 2>>, PromptOnce>>, false>,
    Policy<"int4-g32+sink-window-50-fixed", KVCache<Keys<Int4<Group<32>>>, Values<Int4<Group<32>>>, Protocol<SinkWindowBudget<Fraction<1, 2>>, FixedBudget>>, false>,
    Policy<"int4-g32+sink-window-25-prompt", KVCache<Keys<Int4<Group<32>>>, Values<Int4<Group<32>>>, Protocol<SinkWindowBudget<Fraction<1, 4>>, PromptOnce>>, false>,
    Policy<"int4-g32+sink-window-25-fixed", KVCache<Keys<Int4<Group<32>>>, Values<Int4<Group<32>>>, Protocol<SinkWindowBudget<Fraction<1, 4>>, FixedBudget>>, false>,
    // Demotion instead of deletion (issue 24 item 2, MiKV; include/kvpack/cache/demotion_tier.hpp):
    // the same evictions, the dropped tokens re-coded into an INT4 or INT2 tier still attended.
    Policy<"int4-g32+h2o-50+demote-int4", KVCache<Keys<Int4<Group<32>>>, Values<Int4<Group<32>>>, H2OBudget<Fraction<1, 2>>, Demote<Keys<Int4<Group<32>>>, Values<Int4<Group<32>>>>>, false>,
    Policy<"int4-g32+h2o-50+demote-int3", KVCache<Keys<Int4<Group<32>>>, Values<Int4<Group<32>>>, H2OBudget<Fraction<1, 2>>, Demote<Keys<Int3<Group<32>>>, Values<Int3<Group<32>>>>>, false>,
    Policy<"int4-g32+h2o-50+demote-k4v2", KVCache<Keys<Int4<Group<32>>>, Values<Int4<Group<32>>>, H2OBudget<Fraction<1, 2>>, Demote<Keys<Int4<Group<32>>>, Values<Int2<Group<32>>>>>, false>,
    Policy<"int4-g32+h2o-50+demote-int2", KVCache<Keys<Int4<Group<32>>>, Values<Int4<Group<32>>>, H2OBudget<Fraction<1, 2>>, Demote<Keys<Int2<Group<32>>>, Values<Int2<Group<32>>>>>, false>,
    Policy<"int4-g32+h2o-50-fixed+demote-int2", KVCache<Keys<Int4<Group<32>>>, Values<Int4<Group<32>>>, Protocol<H2OBudget<Fraction<1, 2>>, FixedBudget>, Demote<Keys<Int2<Group<32>>>, Values<Int2<Group<32>>>>>, false>,
    Policy<"int4-g32+snapkv-50-fixed+demote-int2", KVCache<Keys<Int4<Group<32>>>, Values<Int4<Group<32>>>, Protocol<SnapKVBudget<Fraction<1, 2>>, FixedBudget>, Demote<Keys<Int2<Group<32>>>, Values<Int2<Group<32>>>>>, false>,
    Policy<"int4-g32+sink-window-50-fixed+demote-int2", KVCache<Keys<Int4<Group<32>>>, Values<Int4<Group<32>>>, Protocol<SinkWindowBudget<Fraction<1, 2>>, FixedBudget>, Demote<Keys<Int2<Group<32>>>, Values<Int2<Group<32>>>>>, false>,
    // Equal memory (issue 24 item 3): deletion vs demotion at the same bytes, all under FixedBudget
    // (the bytes stay constant through decoding). Budgets in bytes: Fp16Share<1, 8> / <1, 16> hold
    // both tiers within 12.5 % / 6.25 % of an fp16 cache of the context (cache/demotion_budget.hpp);
    // the deletion twins keep as many INT4 tokens as those bytes hold (11/16 and 11/32 of the prompt
    // at 92 bytes per token and head: 12.4 % and 6.2 % of fp16 at ctx 2048).
    Policy<"int4-g32+h2o-69-fixed", KVCache<Keys<Int4<Group<32>>>, Values<Int4<Group<32>>>, Protocol<H2OBudget<Fraction<11, 16>>, FixedBudget>>, false>,
    Policy<"int4-g32+h2o-34-fixed", KVCache<Keys<Int4<Group<32>>>, Values<Int4<Group<32>>>, Protocol<H2OBudget<Fraction<11, 32>>, FixedBudget>>, false>,
    Policy<"int4-g32+h2o-25-fixed+demote-k4v2-b12", KVCache<Keys<Int4<Group<32>>>, Values<Int4<Group<32>>>, Protocol<H2OBudget<Fraction<1, 4>>, FixedBudget>, Demote<Keys<Int4<Group<32>>>, Values<Int2<Group<32>>>, Fp16Share<1, 8>>>, false>,
    Policy<"int4-g32+h2o-50-fixed+demote-int2-b12", KVCache<Keys<Int4<Group<32>>>, Values<Int4<Group<32>>>, Protocol<H2OBudget<Fraction<1, 2>>, FixedBudget>, Demote<Keys<Int2<Group<32>>>, Values<Int2<Group<32>>>, Fp16Share<1, 8>>>, false>,
    Policy<"int4-g32+h2o-25-fixed+demote-int2-b6", KVCache<Keys<Int4<Group<32>>>, Values<Int4<Group<32>>>, Protocol<H2OBudget<Fraction<1, 4>>, FixedBudget>, Demote<Keys<Int2<Group<32>>>, Values<Int2<Group<32>>>, Fp16Share<1, 16>>>, false>,
    // The same with KIVI-style low keys (per channel, groups of 32 demoted rows; docs/RESULTS-lowbit.md:
    // per-token INT2 keys are what sinks the INT2 low tier).
    Policy<"int4-g32+h2o-50-fixed+demote-kc2v2-b12", KVCache<Keys<Int4<Group<32>>>, Values<Int4<Group<32>>>, Protocol<H2OBudget<Fraction<1, 2>>, FixedBudget>, Demote<Keys<Int2<Group<32>>, PerChannel>, Values<Int2<Group<32>>>, Fp16Share<1, 8>>>, false>,
    Policy<"int4-g32+h2o-25-fixed+demote-kc2v2-b12", KVCache<Keys<Int4<Group<32>>>, Values<Int4<Group<32>>>, Protocol<H2OBudget<Fraction<1, 4>>, FixedBudget>, Demote<Keys<Int2<Group<32>>, PerChannel>, Values<Int2<Group<32>>>, Fp16Share<1, 8>>>, false>,
    Policy<"int4-g32+h2o-25-fixed+demote-kc2v2-b6", KVCache<Keys<Int4<Group<32>>>, Values<Int4<Group<32>>>, Protocol<H2OBudget<Fraction<1, 4>>, FixedBudget>, Demote<Keys<Int2<Group<32>>, PerChannel>, Values<Int2<Group<32>>>, Fp16Share<1, 16>>>, false>,
    Policy<"int4-g32+h2o-50-prompt+demote-kc2v2", KVCache<Keys<Int4<Group<32>>>, Values<Int4<Group<32>>>, Protocol<H2OBudget<Fraction<1, 2>>, PromptOnce>, Demote<Keys<Int2<Group<32>>, PerChannel>, Values<Int2<Group<32>>>>>, false>,
    Policy<"int4-g32+h2o-50-prompt+demote-int4", KVCache<Keys<Int4<Group<32>>>, Values<Int4<Group<32>>>, Protocol<H2OBudget<Fraction<1, 2>>, PromptOnce>, Demote<Keys<Int4<Group<32>>>, Values<Int4<Group<32>>>>>, false>,
    // Mixes: an INT8-key high tier over the INT4 low tier, and Hadamard rotation around the whole
    // demoting cache (rotation/rotated_cache.hpp: both tiers hold rotated rows; scores are
    // rotation-invariant, so the policy keeps the same kind of tokens).
    // Deletion at fp16 (the reference library's storage): what "50 % deletion" holds.
    Policy<"fp16+h2o-50-prompt", KVCache<Keys<Fp16>, Values<Fp16>, Protocol<H2OBudget<Fraction<1, 2>>, PromptOnce>>, false>,
    Policy<"fp16+h2o-25-prompt", KVCache<Keys<Fp16>, Values<Fp16>, Protocol<H2OBudget<Fraction<1, 4>>, PromptOnce>>, false>,
    Policy<"k8v4+h2o-50-prompt+demote-int4", KVCache<Keys<Int8<Group<32>>>, Values<Int4<Group<32>>>, Protocol<H2OBudget<Fraction<1, 2>>, PromptOnce>, Demote<Keys<Int4<Group<32>>>, Values<Int4<Group<32>>>>>, false>,
    Policy<"int4-g32+rot+h2o-50-prompt+demote-int4", Rotated<KVCache<Keys<Int4<Group<32>>>, Values<Int4<Group<32>>>, Protocol<H2OBudget<Fraction<1, 2>>, PromptOnce>, Demote<Keys<Int4<Group<32>>>, Values<Int4<Group<32>>>>>>, false>,
    Policy<"int4-g32+rot+h2o-69-fixed", Rotated<KVCache<Keys<Int4<Group<32>>>, Values<Int4<Group<32>>>, Protocol<H2OBudget<Fraction<11, 16>>, FixedBudget>>>, false>,
    Policy<"int4-g32+rot+h2o-34-fixed", Rotated<KVCache<Keys<Int4<Group<32>>>, Values<Int4<Group<32>>>, Protocol<H2OBudget<Fraction<11, 32>>, FixedBudget>>>, false>,
    Policy<"int4-g32+rot+h2o-25-fixed+demote-k4v2-b12", Rotated<KVCache<Keys<Int4<Group<32>>>, Values<Int4<Group<32>>>, Protocol<H2OBudget<Fraction<1, 4>>, FixedBudget>, Demote<Keys<Int4<Group<32>>>, Values<Int2<Group<32>>>, Fp16Share<1, 8>>>>, false>,
    Policy<"int4-g32+rot+h2o-25-fixed+demote-kc2v2-b6", Rotated<KVCache<Keys<Int4<Group<32>>>, Values<Int4<Group<32>>>, Protocol<H2OBudget<Fraction<1, 4>>, FixedBudget>, Demote<Keys<Int2<Group<32>>, PerChannel>, Values<Int2<Group<32>>>, Fp16Share<1, 16>>>>, false>,
    Policy<"reference", ReferenceCache, false>,
    Policy<"zero-v", ZeroValues<KVCache<Keys<Fp32>, Values<Fp32>>>, false>>;

namespace detail {
template <PolicyName Name, class... Ps>
struct find_policy {
  static_assert(sizeof...(Ps) > 0, "kvpack::llama::cache_for: no policy of that name in the Registry");
};
template <PolicyName Name, class P, class... Ps>
struct find_policy<Name, P, Ps...> {
  using type = typename std::conditional_t<P::name == Name.view(), std::type_identity<typename P::cache>,
                                           find_policy<Name, Ps...>>::type;
};
template <PolicyName Name, class List>
struct find_in;
template <PolicyName Name, class... Ps>
struct find_in<Name, PolicyList<Ps...>> : find_policy<Name, Ps...> {};
}  // namespace detail

/// The cache type registered under `Name`, e.g. cache_for<"int8">.
template <PolicyName Name>
using cache_for = typename detail::find_in<Name, Registry>::type;

/// Names of the registered policies (all, or only those run by default), in registry order.
[[nodiscard]] inline std::vector<std::string> policy_names(bool defaults_only) {
  std::vector<std::string> out;
  [&]<class... Ps>(PolicyList<Ps...>) {
    (..., (defaults_only && !Ps::in_defaults ? void() : void(out.emplace_back(Ps::name))));
  }(Registry{});
  return out;
}

/// Policy groups `--policies` expands. `equal-memory` (issue 24, docs/RESULTS-equal-memory.md):
/// the rows of README's equal-memory table: quantization alone, deletion under both protocols,
/// and deletion vs demotion at the same bytes (12.5 % and 6.25 % of fp16). `protocols`: every
/// "*-prompt" / "*-fixed" row (each eviction policy at 50 % / 25 % of the prompt, alone and over INT4).
[[nodiscard]] inline std::vector<std::string> policy_group(std::string_view group) {
  std::vector<std::string> out;
  if (group == "equal-memory")
    return {"fp32",
            "fp16",
            "k8v4",
            "int4-g32",
            "int4-g32+rot",
            "h2o-50-prompt",
            "sink-window-50-fixed",
            "int4-g32+h2o-50-prompt",
            "int4-g32+h2o-50-prompt+demote-int4",
            "int4-g32+h2o-69-fixed",
            "int4-g32+h2o-25-fixed+demote-k4v2-b12",
            "int4-g32+h2o-50-fixed+demote-int2-b12",
            "int4-g32+h2o-34-fixed",
            "int4-g32+h2o-25-fixed+demote-int2-b6",
            "int4-g32+h2o-50-prompt+demote-kc2v2",
            "int4-g32+h2o-50-fixed+demote-kc2v2-b12",
            "int4-g32+h2o-25-fixed+demote-kc2v2-b12",
            "int4-g32+h2o-25-fixed+demote-kc2v2-b6",
            "fp16+h2o-50-prompt",
            "fp16+h2o-25-prompt",
            "k8v4+h2o-50-prompt+demote-int4",
            "int4-g32+rot+h2o-50-prompt+demote-int4",
            "int4-g32+rot+h2o-69-fixed",
            "int4-g32+rot+h2o-34-fixed",
            "int4-g32+rot+h2o-25-fixed+demote-k4v2-b12",
            "int4-g32+rot+h2o-25-fixed+demote-kc2v2-b6"};
  if (group != "protocols") return out;
  out = {"fp32", "fp16", "int4-g32"};
  for (const auto& n : policy_names(false))
    if (n.ends_with("-prompt") || n.ends_with("-fixed")) out.push_back(n);
  return out;
}

/// Whether `name` is a registered policy.
[[nodiscard]] inline bool has_policy(std::string_view name) {
  const auto all = policy_names(false);
  return std::find(all.begin(), all.end(), name) != all.end();
}

/// Calls `f.template operator()<Cache>()` with the cache type registered under `name` and
/// returns its result. `f` must return R for every cache type; returns `otherwise` for an
/// unknown name. One instantiation of `f` per registered policy.
template <class R, class F>
R with_policy(std::string_view name, F&& f, R otherwise) {
  R result = std::move(otherwise);
  [&]<class... Ps>(PolicyList<Ps...>) {
    (void)((Ps::name == name ? (result = f.template operator()<typename Ps::cache>(), true) : false) || ...);
  }(Registry{});
  return result;
}

}  // namespace kvpack::llama
