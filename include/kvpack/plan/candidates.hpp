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

/// The standard per-layer cache: candidate index i is the i-th type below, named
/// standard_candidate_names[i] (the names kvpack-eval's registry uses for the same types).
using StandardLayeredCache = LayeredCache<Fp32Cache, Fp16Cache, Int8Cache, K8V4Cache, Kivi4Cache, Int4G32Cache, Int4G64Cache,
                                          Int8G64Cache>;

/// Names of StandardLayeredCache's candidates, in variant order.
inline constexpr std::array<std::string_view, 8> standard_candidate_names{
    "fp32", "fp16", "int8", "k8v4", "kivi4", "int4-g32", "int4-g64", "int8-g64"};

}  // namespace kvpack::plan
