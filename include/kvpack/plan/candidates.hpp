// The standard closed set of per-layer cache configurations the planner chooses from.
#pragma once

#include <array>
#include <string_view>

#include "kvpack/kv_cache.hpp"
#include "kvpack/plan/layered_cache.hpp"

namespace kvpack::plan {

/// fp32 K and V (no compression; the reference every cost is measured against).
using Fp32Cache = KVCache<Keys<Fp32>, Values<Fp32>>;
/// fp16 K and V (16 bits/value).
using Fp16Cache = KVCache<Keys<Fp16>, Values<Fp16>>;
/// INT8 symmetric, group 32 along head_dim, fp16 scales (8.5 bits/value).
using Int8Cache = KVCache<Keys<Int8<Group<32>>>, Values<Int8<Group<32>>>>;
/// INT8 keys, INT4 values (8.5 / 5 bits/value).
using K8V4Cache = KVCache<Keys<Int8<Group<32>>>, Values<Int4<Group<32>>>>;
/// KIVI-style INT4: per-channel keys in groups of 32 tokens, per-token values, 128 recent tokens
/// in fp32 (KIVI, Liu et al. 2024).
using Kivi4Cache = KVCache<Keys<Int4<Group<32>>, PerChannel>, Values<Int4<Group<32>>>, Residual<128>>;
/// INT4 asymmetric, group 32, fp16 scale and zero-point (5 bits/value).
using Int4G32Cache = KVCache<Keys<Int4<Group<32>>>, Values<Int4<Group<32>>>>;
/// INT4 asymmetric, group 64 (4.5 bits/value).
using Int4G64Cache = KVCache<Keys<Int4<Group<64>>>, Values<Int4<Group<64>>>>;

/// INT8 symmetric, group 64 along head_dim, fp16 scales (8.25 bits/value): a step between int8
/// (group 32) and fp16 for the planner.
using Int8G64Cache = KVCache<Keys<Int8<Group<64>>>, Values<Int8<Group<64>>>>;

/// INT8 with KIVI-style per-channel keys: keys quantized per channel in groups of 32 tokens
/// (symmetric, one fp16 scale per channel and group: 8.5 bits/value, the same bytes as int8 once a
/// group closes; the open group, up to 31 newest tokens, waits in fp32 and memory_bytes() counts
/// it), values INT8 per token, group 32 along head_dim (KIVI, Liu et al. 2024, at 8 bits). No
/// residual window, so at a multiple of 32 tokens it holds exactly int8's bytes.
using Kivi8Cache = KVCache<Keys<Int8<Group<32>>, PerChannel>, Values<Int8<Group<32>>>>;
/// Half step up from int8: fp16 keys, INT8 values (group 32; 16 / 8.5 bits/value).
using K16V8Cache = KVCache<Keys<Fp16>, Values<Int8<Group<32>>>>;
/// Half step up from int8: INT8 keys (group 32), fp16 values (8.5 / 16 bits/value).
using K8V16Cache = KVCache<Keys<Int8<Group<32>>>, Values<Fp16>>;
/// A step down from int8 on the key side: per-channel INT4 keys (KIVI, asymmetric, groups of 32
/// tokens, fp16 scale and zero-point: 5 bits/value; open group in fp32), INT8 values (8.5).
using Kc4V8Cache = KVCache<Keys<Int4<Group<32>>, PerChannel>, Values<Int8<Group<32>>>>;

/// The standard per-layer cache: candidate index i is the i-th type below, named
/// standard_candidate_names[i] (the names kvpack-eval's registry uses for the same types where it
/// has them; int8-g64, k16v8, k8v16 and kc4v8 are planner-only).
using StandardLayeredCache = LayeredCache<Fp32Cache, Fp16Cache, Int8Cache, K8V4Cache, Kivi4Cache, Int4G32Cache, Int4G64Cache,
                                          Int8G64Cache, Kivi8Cache, K16V8Cache, K8V16Cache, Kc4V8Cache>;

/// Names of StandardLayeredCache's candidates, in variant order.
inline constexpr std::array<std::string_view, 12> standard_candidate_names{
    "fp32", "fp16", "int8", "k8v4", "kivi4", "int4-g32", "int4-g64", "int8-g64", "kivi8", "k16v8", "k8v16", "kc4v8"};

}  // namespace kvpack::plan
