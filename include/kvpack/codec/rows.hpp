// Scalar reference encode/decode of whole rows: the executable specification every SIMD and
// CUDA path must match (codes bit-identical, decoded values equal).
//
// Layouts (n = head_dim, G = group size, mb = meta bytes per group):
//  * per-token row: codes [code_bytes(n)] bytes; metadata [n / G][mb] (group g covers
//    elements [g*G, (g+1)*G) of the row);
//  * per-channel token group (KIVI keys): `tokens` == G rows of codes [G][code_bytes(n)] (row
//    major, one row per token) and metadata [n][mb] (one scale/zero per channel for those G tokens).
#pragma once

#include <cstddef>
#include <cstdint>

#include "kvpack/codec/concepts.hpp"

namespace kvpack {

/// Bytes of per-token metadata for one row of n values (0 for ungrouped codecs).
template <KvCodec C>
[[nodiscard]] constexpr std::size_t row_meta_bytes(std::size_t n) noexcept {
  if constexpr (C::grouped) return n / C::group_size * C::meta_bytes_per_group;
  else return 0;
}

/// Encodes one row of n finite values (per-token grouping). n must be a multiple of the group size.
template <KvCodec C>
void encode_row(const float* x, int n, std::byte* codes, std::byte* meta) noexcept {
  if constexpr (C::grouped) {
    constexpr int G = C::group_size;
    for (int g = 0; g < n / G; ++g) {
      const GroupParams p = C::derive(x + g * G, 1, G);
      C::store_params(p, meta + g * C::meta_bytes_per_group);
      // Quantize against the parameters as stored, so encode and decode agree exactly.
      const GroupParams ps = C::load_params(meta + g * C::meta_bytes_per_group);
      for (int i = 0; i < G; ++i) C::store_code(codes, static_cast<std::size_t>(g * G + i), C::encode_value(x[g * G + i], ps));
    }
  } else {
    for (int i = 0; i < n; ++i) C::store_code(codes, static_cast<std::size_t>(i), C::encode_value(x[i], {}));
  }
}

/// Decodes one per-token row of n values.
template <KvCodec C>
void decode_row(const std::byte* codes, const std::byte* meta, int n, float* out) noexcept {
  if constexpr (C::grouped) {
    constexpr int G = C::group_size;
    for (int g = 0; g < n / G; ++g) {
      const GroupParams p = C::load_params(meta + g * C::meta_bytes_per_group);
      for (int i = 0; i < G; ++i) out[g * G + i] = C::decode_value(C::load_code(codes, static_cast<std::size_t>(g * G + i)), p);
    }
  } else {
    for (int i = 0; i < n; ++i) out[i] = C::decode_value(C::load_code(codes, static_cast<std::size_t>(i)), {});
  }
}

/// Encodes G = C::group_size token rows of n channels, grouping along tokens (per-channel, KIVI).
/// x: row r at x + r * x_stride; codes: row r at codes + r * code_row_bytes; meta: [n][mb].
template <GroupedCodec C>
void encode_channels(const float* x, std::ptrdiff_t x_stride, int n, std::byte* codes, std::size_t code_row_bytes,
                     std::byte* meta) noexcept {
  constexpr int G = C::group_size;
  for (int c = 0; c < n; ++c) {
    C::store_params(C::derive(x + c, x_stride, G), meta + c * C::meta_bytes_per_group);
    const GroupParams ps = C::load_params(meta + c * C::meta_bytes_per_group);
    for (int r = 0; r < G; ++r)
      C::store_code(codes + r * code_row_bytes, static_cast<std::size_t>(c), C::encode_value(x[r * x_stride + c], ps));
  }
}

/// Decodes one token row of a per-channel group: codes of that row, the group's per-channel metadata.
template <GroupedCodec C>
void decode_row_channels(const std::byte* codes_row, const std::byte* meta, int n, float* out) noexcept {
  for (int c = 0; c < n; ++c)
    out[c] = C::decode_value(C::load_code(codes_row, static_cast<std::size_t>(c)),
                             C::load_params(meta + c * C::meta_bytes_per_group));
}

}  // namespace kvpack
