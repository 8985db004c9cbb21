// Content addresses of shared prefix pages (remote_tier.hpp).
//
// A page is one full block (Blocks<B> tokens) of one (layer, KV head). Two processes that ran
// the same model with the same cache codecs over the same token prefix hold byte-identical
// pages, so the page's address is a hash of everything its bytes depend on:
//
//   prefix digest  d_0 = BLAKE2b-256("kvpack-prefix-v1" || model id length u32 || model id)
//                  d_p = BLAKE2b-256(d_{p-1} || token ids of page p-1, int32 LE)    (p >= 1)
//                  so d_p covers the whole prefix [0, p * B) up to the page's end, and
//                  computing every page's digest costs one pass over the tokens (the chained
//                  block hash of vLLM's prefix cache, with a cryptographic hash).
//   page key       BLAKE2b-256("kvpack-page-v1" || d_{p+1} || layer i32 || kv_head i32 ||
//                  kv_heads i32 || page index i64 || layout: codec_format u32, k_bits, v_bits,
//                  flags u8, k_group, v_group, head_dim, block_tokens u16, max_payload_bytes u32
//                  || protection u8)
//
// all integers little-endian. BLAKE2b is libsodium's crypto_generichash (RFC 7693). A different
// model, codec, group size, head layout, protection or any different earlier token gives a
// different key, so such pages are never found; a value planted under a forged key is still
// rejected because the key is bound into the record's authenticated data (remote_page_codec.hpp).
#pragma once

#include <sodium.h>

#include <array>
#include <cstddef>
#include <cstdint>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include "kvpack/offload/block_header.hpp"

namespace kvpack::offload {

/// 32-byte BLAKE2b-256 digest (a prefix digest or a page key).
struct PageDigest {
  std::array<std::byte, 32> bytes{};
  friend bool operator==(const PageDigest&, const PageDigest&) = default;

  /// Lower-case hex, 64 characters.
  [[nodiscard]] std::string hex() const {
    static constexpr char digits[] = "0123456789abcdef";
    std::string s;
    s.reserve(64);
    for (std::byte b : bytes) {
      s.push_back(digits[std::to_integer<unsigned>(b) >> 4]);
      s.push_back(digits[std::to_integer<unsigned>(b) & 0xF]);
    }
    return s;
  }
};

namespace detail {
/// Incremental BLAKE2b-256 with little-endian integer helpers.
class PageHasher {
 public:
  PageHasher() { crypto_generichash_init(&st_, nullptr, 0, 32); }
  PageHasher& bytes(const void* p, std::size_t n) {
    crypto_generichash_update(&st_, static_cast<const unsigned char*>(p), n);
    return *this;
  }
  PageHasher& u(uint64_t v, int n) {
    unsigned char b[8];
    for (int i = 0; i < n; ++i) b[i] = static_cast<unsigned char>((v >> (8 * i)) & 0xFF);
    return bytes(b, static_cast<std::size_t>(n));
  }
  PageDigest done() {
    PageDigest d;
    crypto_generichash_final(&st_, reinterpret_cast<unsigned char*>(d.bytes.data()), d.bytes.size());
    return d;
  }

 private:
  crypto_generichash_state st_{};
};
}  // namespace detail

/// Prefix digests d_1..d_n of the n = tokens.size() / block_tokens full pages of `tokens`
/// (result[p] = d_{p+1}: covers tokens [0, (p + 1) * block_tokens)). A trailing partial page gets
/// none (only complete pages are shared). `model_id` names the model weights (e.g. the GGUF
/// file's name and size, or a hash of it). block_tokens must be > 0 (0 yields no pages).
[[nodiscard]] inline std::vector<PageDigest> prefix_page_digests(std::string_view model_id,
                                                                 std::span<const int32_t> tokens, int block_tokens) {
  std::vector<PageDigest> out;
  if (block_tokens <= 0) return out;
  static constexpr char tag[] = "kvpack-prefix-v1";
  PageDigest d = detail::PageHasher().bytes(tag, sizeof tag - 1).u(model_id.size(), 4).bytes(model_id.data(), model_id.size()).done();
  const std::size_t B = static_cast<std::size_t>(block_tokens);
  out.reserve(tokens.size() / B);
  for (std::size_t p = 0; (p + 1) * B <= tokens.size(); ++p) {
    detail::PageHasher h;
    h.bytes(d.bytes.data(), d.bytes.size());
    for (std::size_t t = p * B; t < (p + 1) * B; ++t) h.u(static_cast<uint32_t>(tokens[t]), 4);
    d = h.done();
    out.push_back(d);
  }
  return out;
}

/// Where one page lives: its (layer, kv_head, page index) in a cache of `kv_heads` KV heads.
struct PageCoord {
  int32_t layer = 0;
  int32_t kv_head = 0;
  int32_t kv_heads = 0;
  int64_t page = 0;
};

/// The content address of page `at` whose prefix digest is `prefix` (covering the prefix up to
/// the page's end), stored with `layout` under protection `aead`. See the top of this file.
[[nodiscard]] inline PageDigest page_key(const PageDigest& prefix, const PageCoord& at, const RecordLayout& layout,
                                         Aead aead) {
  static constexpr char tag[] = "kvpack-page-v1";
  detail::PageHasher h;
  h.bytes(tag, sizeof tag - 1).bytes(prefix.bytes.data(), prefix.bytes.size());
  h.u(static_cast<uint32_t>(at.layer), 4).u(static_cast<uint32_t>(at.kv_head), 4).u(static_cast<uint32_t>(at.kv_heads), 4);
  h.u(static_cast<uint64_t>(at.page), 8);
  h.u(layout.codec_format, 4).u(layout.k_bits, 1).u(layout.v_bits, 1).u(layout.flags, 1);
  h.u(layout.k_group, 2).u(layout.v_group, 2).u(layout.head_dim, 2).u(layout.block_tokens, 2);
  h.u(layout.max_payload_bytes, 4).u(static_cast<uint8_t>(aead), 1);
  return h.done();
}

}  // namespace kvpack::offload
