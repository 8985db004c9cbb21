// llama.cpp's KV cache type names (`--cache-type-k` / `--cache-type-v`, ggml type names) as
// aliases of kvpack codecs, where one matches. A registry name may be one type for both ("q8_0")
// or a key/value pair "K/V" ("q8_0/q4_0" = --cache-type-k q8_0 --cache-type-v q4_0).
//
// What matches and what does not (ggml-quants.c reference quantizers vs codec/int_codec.hpp):
//  - f32 -> Fp32, f16 -> Fp16: identical storage (IEEE binary32 / binary16, round to nearest even).
//  - q8_0 -> Int8<Group<32>> (symmetric, fp16 scale): same block (32 values, 8-bit codes, one fp16
//    scale: 8.5 bits/value) and the same scale formula amax / 127. Differences: ggml codes with the
//    unrounded scale (stored rounded to nearest fp16) and rounds half away from zero; kvpack
//    rounds the scale UP to fp16 and codes with the stored scale, half to even. Codes can differ by one step on ties and near the
//    group maximum; the error bound (half a step) is the same.
//  - q4_0 -> Int4<Group<32>, Symmetric>: same block size and bits (4-bit codes + fp16 scale per 32
//    values: 4.5 bits/value). Not the same grid: ggml sets d = (signed value of largest |x|) / -8
//    and uses all 16 codes [-8, 7] (the extreme maps to -8 exactly, the other sign gets at most 7
//    steps); kvpack uses scale = amax / 7 and codes [-7, 7] (code -8 unused), symmetric in sign.
//    kvpack's step is 8/7 of ggml's for the same group, so its error bound is ~14 % larger.
//  - q4_1 -> Int4<Group<32>> (asymmetric, fp16 scale and zero): same block (5.0 bits/value) and
//    grid: d = (max - min) / 15, zero = min, codes [0, 15]. kvpack rounds d up and the zero down
//    to fp16 (the group stays representable), ggml rounds both to nearest; codes round half to
//    even vs ggml's +0.5 truncation.
//  - No kvpack codec matches (Errc::unsupported): bf16 (kvpack has bf16 conversions but no bf16
//    codec), q5_0, q5_1 (5-bit codes), iq4_nl (non-linear 4-bit grid).
// Memory layout is kvpack's block layout (cache/block.hpp), never ggml's: these aliases choose
// the quantization, they do not make kvpack pages readable by ggml.
#pragma once

#include <array>
#include <string_view>

#include "kvpack/kv_cache.hpp"
#include "kvpack/registry/policy_table.hpp"

namespace kvpack::registry {

/// A llama.cpp cache type name and the kvpack codec it selects.
template <FixedName Name, class Codec>
struct LlamaCppType {
  static constexpr std::string_view name = Name.view();
  using codec = Codec;
};

template <class... Types>
struct LlamaCppTypeList {};

/// The llama.cpp cache types with a kvpack codec (see the file comment for how close each is).
using LlamaCppTypes = LlamaCppTypeList<LlamaCppType<"f32", Fp32>, LlamaCppType<"f16", Fp16>,
                                       LlamaCppType<"q8_0", Int8<Group<32>>>,
                                       LlamaCppType<"q4_0", Int4<Group<32>, Symmetric>>,
                                       LlamaCppType<"q4_1", Int4<Group<32>>>>;

/// llama.cpp cache type names that kvpack recognises but has no codec for.
inline constexpr std::array<std::string_view, 5> llama_cpp_unmatched{"bf16", "q5_0", "q5_1", "iq4_nl", "f64"};

/// A name split into llama.cpp key and value types: "q8_0" -> {q8_0, q8_0}, "q8_0/q4_0" -> {q8_0, q4_0}.
struct KvTypeNames {
  std::string_view k, v;
};
[[nodiscard]] constexpr KvTypeNames split_kv_name(std::string_view name) noexcept {
  const auto slash = name.find('/');
  if (slash == std::string_view::npos) return {name, name};
  return {name.substr(0, slash), name.substr(slash + 1)};
}

/// The key/value pairs compiled in (each pair is one PagedCache / KVCache instantiation, so not
/// all 25): every type for both, and a higher-precision key with a lower-precision value, the
/// combinations llama.cpp users pick (keys are the more sensitive role). Other pairs fail with
/// Errc::unsupported naming these.
template <class K, class V>
struct LlamaCppPair {
  using key = K;
  using value = V;
};
template <class... Pairs>
struct LlamaCppPairList {};
namespace detail {
using F32 = LlamaCppType<"f32", Fp32>;
using F16 = LlamaCppType<"f16", Fp16>;
using Q80 = LlamaCppType<"q8_0", Int8<Group<32>>>;
using Q40 = LlamaCppType<"q4_0", Int4<Group<32>, Symmetric>>;
using Q41 = LlamaCppType<"q4_1", Int4<Group<32>>>;
}  // namespace detail
using LlamaCppPairs =
    LlamaCppPairList<LlamaCppPair<detail::F32, detail::F32>, LlamaCppPair<detail::F16, detail::F16>,
                     LlamaCppPair<detail::Q80, detail::Q80>, LlamaCppPair<detail::Q40, detail::Q40>,
                     LlamaCppPair<detail::Q41, detail::Q41>, LlamaCppPair<detail::F16, detail::Q80>,
                     LlamaCppPair<detail::F16, detail::Q40>, LlamaCppPair<detail::F16, detail::Q41>,
                     LlamaCppPair<detail::Q80, detail::Q40>, LlamaCppPair<detail::Q80, detail::Q41>>;

/// Whether a name is a llama.cpp type of LlamaCppTypes.
[[nodiscard]] inline bool is_llama_cpp_type(std::string_view name) {
  return [&]<class... Ts>(LlamaCppTypeList<Ts...>) { return ((Ts::name == name) || ...); }(LlamaCppTypes{});
}

namespace detail {
template <class F, class... Ps>
bool with_pair(std::string_view k_name, std::string_view v_name, F& f, LlamaCppPairList<Ps...>) {
  return ((Ps::key::name == k_name && Ps::value::name == v_name
               ? (f.template operator()<PolicySet<Keys<typename Ps::key::codec>, Values<typename Ps::value::codec>>>(), true)
               : false) ||
          ...);
}
}  // namespace detail

/// Calls f.template operator()<Set>() with PolicySet<Keys<KC>, Values<VC>> for the llama.cpp key
/// and value type names when the pair is in LlamaCppPairs; returns false (f not called) otherwise.
template <class F>
bool with_llama_cpp_types(std::string_view k_name, std::string_view v_name, F&& f) {
  return detail::with_pair(k_name, v_name, f, LlamaCppPairs{});
}

}  // namespace kvpack::registry
