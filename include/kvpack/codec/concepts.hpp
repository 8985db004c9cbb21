// Concepts every KV codec satisfies; KVCache and the kernels are constrained by them.
#pragma once

#include <concepts>
#include <cstddef>

#include "kvpack/codec/params.hpp"

namespace kvpack {

/// A KV codec: fixed bits per stored code, a row packing, and value encode/decode.
/// `bits_per_value` is exact and includes metadata (scales, zero-points).
template <class C>
concept KvCodec = requires(float x, GroupParams p, unsigned u, std::size_t i, std::byte* row, const std::byte* crow) {
  { C::bits } -> std::convertible_to<int>;
  { C::grouped } -> std::convertible_to<bool>;
  { C::group_size } -> std::convertible_to<int>;
  { C::meta_bytes_per_group } -> std::convertible_to<int>;
  { C::bits_per_value } -> std::convertible_to<double>;
  { C::code_bytes(i) } -> std::same_as<std::size_t>;
  { C::encode_value(x, p) } -> std::same_as<unsigned>;
  { C::decode_value(u, p) } -> std::same_as<float>;
  C::store_code(row, i, u);
  { C::load_code(crow, i) } -> std::same_as<unsigned>;
};

/// A codec whose values share per-group metadata (scale, and zero-point when asymmetric).
template <class C>
concept GroupedCodec = KvCodec<C> && C::grouped &&
                       requires(const float* x, std::ptrdiff_t stride, int n, GroupParams p, std::byte* dst,
                                const std::byte* src) {
                         { C::derive(x, stride, n) } -> std::same_as<GroupParams>;
                         C::store_params(p, dst);
                         { C::load_params(src) } -> std::same_as<GroupParams>;
                       };

}  // namespace kvpack
