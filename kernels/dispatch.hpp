// Compile-time choice of the fused dequant-attention kernel.
//
//   kvpack::kernels::attend<BackendTag, KC, VC, KPerChannel>(args, segments, layout, scratch)
//
// runs attend_avx2, attend_neon or attend_scalar (same signature and semantics; outputs equal to
// 1e-5 relative, except where query_int8_group below is non-zero: integer Q·K, bounded error;
// AVX2 with per-token INT4/INT8 keys by default). Tags (include/kvpack/policy.hpp):
//   Auto    the best kernel this translation unit is compiled for: Avx2 when KVPACK_HAS_AVX2,
//           else Neon when KVPACK_HAS_NEON, else Scalar (config.hpp maps compiler macros;
//           KVPACK_DISABLE_SIMD forces Scalar);
//   Scalar  always available;
//   Avx2, Neon  force one; a static_assert names the missing compiler flags when the translation
//           unit is not compiled for it;
//   Cuda    reserved: the CUDA kernels are launched through kernels/cuda/, not through this host
//           dispatch (static_assert).
// The choice is per translation unit, so every unit of a program must be compiled with the same
// instruction-set flags (as with any header-only SIMD library).
#pragma once

#include <string_view>
#include <type_traits>

#include "kvpack/config.hpp"
#include "kvpack/policy.hpp"
#include "kvpack/kernels/scalar/attention.hpp"
#if KVPACK_HAS_AVX2
#include "kvpack/kernels/avx2/attention.hpp"
#endif
#if KVPACK_HAS_NEON
#include "kvpack/kernels/neon/attention.hpp"
#endif

namespace kvpack::kernels {

namespace detail {
template <class T>
inline constexpr bool dependent_false_v = false;
}  // namespace detail

/// The backend tag a Backend<Tag> policy runs: Auto resolved, forced tags checked.
template <class Tag>
struct resolve_backend {
  static_assert(detail::dependent_false_v<Tag>,
                "kvpack::Backend<Tag>: Tag must be kvpack::Auto, kvpack::Scalar, kvpack::Avx2, kvpack::Neon or "
                "kvpack::Cuda");
};
template <>
struct resolve_backend<Auto> {
  using type = std::conditional_t<KVPACK_HAS_AVX2 != 0, Avx2, std::conditional_t<KVPACK_HAS_NEON != 0, Neon, Scalar>>;
};
template <>
struct resolve_backend<Scalar> {
  using type = Scalar;
};
template <class Tag>
  requires std::is_same_v<Tag, Avx2>
struct resolve_backend<Tag> {
  static_assert(KVPACK_HAS_AVX2 != 0 && sizeof(Tag) > 0,
                "kvpack::Backend<Avx2>: this translation unit is not compiled for AVX2 + FMA + F16C; compile with "
                "-march=x86-64-v3 (or -mavx2 -mfma -mf16c), or use Backend<Auto>");
  using type = Avx2;
};
template <class Tag>
  requires std::is_same_v<Tag, Neon>
struct resolve_backend<Tag> {
  static_assert(KVPACK_HAS_NEON != 0 && sizeof(Tag) > 0,
                "kvpack::Backend<Neon>: this translation unit is not compiled for AArch64 Advanced SIMD; use an "
                "aarch64 compiler (e.g. -march=armv8.2-a+dotprod+fp16), or use Backend<Auto>");
  using type = Neon;
};
template <class Tag>
  requires std::is_same_v<Tag, Cuda>
struct resolve_backend<Tag> {
  static_assert(detail::dependent_false_v<Tag>,
                "kvpack::Backend<Cuda>: the CUDA kernels run through kernels/cuda/, not through the host "
                "KVCache::attend; use Backend<Auto>, Scalar, Avx2 or Neon for a host cache");
  using type = Cuda;
};
/// Resolved backend tag of Tag (Auto -> Avx2 | Neon | Scalar).
template <class Tag>
using resolved_backend_t = typename resolve_backend<Tag>::type;

/// Short lower-case name of a resolved backend tag: "scalar", "avx2", "neon", "cuda".
template <class Tag>
inline constexpr std::string_view backend_name = std::is_same_v<Tag, Avx2>   ? "avx2"
                                                 : std::is_same_v<Tag, Neon> ? "neon"
                                                 : std::is_same_v<Tag, Cuda> ? "cuda"
                                                                             : "scalar";

/// Largest error of one element of a query quantized for integer Q·K, as a fraction of the largest
/// magnitude in its key group: two int8 terms (kernels/avx2/int_dot.hpp, opt-in tile path) leave
/// half of the step max|q_g| / (127 * 254), i.e. max|q_g| / 64516; the int16 query of the default
/// block path (kernels/avx2/int_block.hpp) half of max|q_g| / 32767, i.e. max|q_g| / 65534, which
/// this bound covers.
inline constexpr double query_int_error = 1.0 / (2.0 * 127.0 * 254.0);

/// Key group size over which backend Tag quantizes the query for integer Q·K with key codec KC, or
/// 0 when its scores are fp32 (within 1e-5 of the scalar kernel). AVX2 scores per-token INT4/INT8
/// keys with groups of 32/64/128 channels from their codes in every block all queries see in full
/// (kernels/avx2/int_block.hpp, head_dim 64/128/256: the decode case), and with
/// KVPACK_AVX2_INTEGER_QK=1 in the other tiles too (kernels/avx2/int_dot.hpp); the remaining
/// keys keep fp32 scores, so the bound is an upper bound for a whole attend.
/// Such a backend's logits differ from the exact ones on the stored keys by at most
///     scale * Σ_g (max_{d in g} |q_d| * query_int_error) * Σ_{d in g} |k̂_d|
/// per key (half a step of the query times the key's absolute sum), the tolerance the
/// float64-reference tests derive their bound from.
template <class Tag, class KC, bool KPerChannel>
inline constexpr int query_int8_group = [] {
#if KVPACK_HAS_AVX2
  if constexpr (std::is_same_v<resolved_backend_t<Tag>, Avx2> && !KPerChannel &&
                (avx2::int_dot_key<KC> || avx2::int_block_key<KC>))
    return KC::group_size;
#endif
  return 0;
}();

/// Largest error of a weight p_t * scale_t of integer P·V, as a fraction of the largest weight of
/// its tile of 16 tokens: two byte terms (kernels/avx2/int_dot.hpp, int_accumulate) leave
/// half of the step max(w) / (255 * 255).
inline constexpr double value_int_error = 1.0 / (2.0 * 255.0 * 255.0);

/// Whether backend Tag accumulates P·V for value codec VC from the codes (kernels/avx2/int_dot.hpp,
/// int_accumulate): per tile of 16 tokens each weight w_t = p_t scale_t is off by at most
/// max_tile(w) * value_int_error, so an output channel moves by at most
///     8 * value_int_error * Σ_t max_{|t' - t| < 16} p_t' scale_t'
/// (8: the largest centered INT4 code |u - 8|; p normalized): the tolerance the float64-reference
/// tests use.
template <class Tag, class VC>
inline constexpr bool value_int_accumulate = [] {
#if KVPACK_HAS_AVX2
  if constexpr (std::is_same_v<resolved_backend_t<Tag>, Avx2>) return avx2::int_dot_value<VC>;
#endif
  return false;
}();

/// What the attention kernel of a cache does, for callers that check its outputs (tests, the C
/// ABI's kvpack_pool_kernel): the backend it runs, the key group of its quantized query (0: fp32
/// scores; error per query element max|q_g| * query_error) and the value group of integer P·V
/// (0: values dequantized to fp32; error per weight max_tile(w) * value_error).
struct KernelInfo {
  std::string_view backend;
  int query_group = 0;
  double query_error = 0.0;
  int value_group = 0;
  double value_error = 0.0;  ///< a weight's error over its tile's largest weight (value_int_error)
};

/// KernelInfo of backend Tag with key codec KC (per-channel when KPerChannel) and value codec VC.
template <class Tag, class KC, class VC, bool KPerChannel>
[[nodiscard]] constexpr KernelInfo kernel_info() noexcept {
  KernelInfo k;
  k.backend = backend_name<resolved_backend_t<Tag>>;
  k.query_group = query_int8_group<Tag, KC, KPerChannel>;
  k.query_error = k.query_group > 0 ? query_int_error : 0.0;
  if constexpr (value_int_accumulate<Tag, VC>) k.value_group = VC::group_size, k.value_error = value_int_error;
  return k;
}

/// Fused dequant-attention for one KV head and its query group on backend Tag (see above);
/// contract of attend_scalar (kernels/scalar/attention.hpp).
template <class Tag, KvCodec KC, KvCodec VC, bool KPerChannel>
void attend(const AttendArgs& a, const HeadSegments& seg, const BlockLayout& L, Scratch& s) {
  using R = resolved_backend_t<Tag>;
#if KVPACK_HAS_AVX2
  if constexpr (std::is_same_v<R, Avx2>) return attend_avx2<KC, VC, KPerChannel>(a, seg, L, s);
#endif
#if KVPACK_HAS_NEON
  if constexpr (std::is_same_v<R, Neon>) return attend_neon<KC, VC, KPerChannel>(a, seg, L, s);
#endif
  if constexpr (std::is_same_v<R, Scalar>) return attend_scalar<KC, VC, KPerChannel>(a, seg, L, s);
}

}  // namespace kvpack::kernels

namespace kvpack {

/// Name of the attention kernel a cache type runs ("avx2", "neon" or "scalar"), resolved at
/// compile time from its Backend<> policy and the instruction set of this translation unit.
template <class Cache>
[[nodiscard]] constexpr std::string_view active_backend_name() noexcept {
  return kernels::backend_name<kernels::resolved_backend_t<typename Cache::backend_tag>>;
}

}  // namespace kvpack
