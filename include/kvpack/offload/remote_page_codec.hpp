// Sealing and opening shared prefix pages: the value stored under a page key (remote_page_key.hpp)
// is an ordinary sealed block record (block_record.hpp: 32-byte authenticated header, nonce,
// payload, tag), bound to that key.
//
// Binding: the record's BlockId (its AEAD associated data) is cache id = key digest bytes 0-15,
// (layer, kv_head, block index = page index), version = key digest bytes 16-23 (little-endian),
// so 192 bits of the content address are authenticated. A value copied under another key, a value
// of another model or codec, a truncated, extended or bit-flipped value all fail open_record()
// (Errc::corrupt_data for a header of another layout, Errc::auth_failed otherwise) and are misses.
//
// Key: every process sharing a tier holds the same 32-byte secret (a KeyProvider, e.g.
// EnvKeyProvider("KVPACK_REMOTE_KEY")). The record key is derived from it with crypto_kdf
// (BLAKE2b, context "kvpremot", subkey 1) so the secret itself is never used directly.
// Protection: XChaCha20-Poly1305 (random 192-bit nonces), or authenticated-only Aead::none. Never
// AES-256-GCM: its 96-bit counter nonces are per process, and two processes sharing one key
// would reuse nonces.
#pragma once

#include <sodium.h>

#include <cstddef>
#include <cstdint>
#include <span>
#include <string>
#include <vector>

#include "kvpack/offload/block_header.hpp"
#include "kvpack/offload/block_record.hpp"
#include "kvpack/offload/crypto.hpp"
#include "kvpack/offload/remote_page_key.hpp"
#include "kvpack/result.hpp"

namespace kvpack::offload {

/// Seals and opens the full-block pages of one cache layout under the tier's shared key.
/// Thread-safe (the cipher is); move-only.
class PageSealer {
 public:
  /// `keys` gives the shared secret; `layout` is the cache's block layout (cache_layout.hpp
  /// layout_for); `encrypt` false: Aead::none (authenticated, payload in clear). Errors: the key
  /// provider's, Errc::invalid_argument for an invalid layout.
  [[nodiscard]] static Result<PageSealer> create(const KeyProvider& keys, const RecordLayout& layout, bool encrypt = true) {
    if (auto s = layout.validate(); !s) return s.error();
    auto kek = keys.key_encryption_key();
    if (!kek) return kek.error();
    if (kek->size() != kKeyBytes) return fail(Errc::invalid_argument, keys.describe() + ": key must be 32 bytes");
    auto data_key = SecretBytes::allocate(kKeyBytes);
    if (!data_key) return data_key.error();
    static constexpr char ctx[crypto_kdf_CONTEXTBYTES + 1] = "kvpremot";
    crypto_kdf_derive_from_key(reinterpret_cast<unsigned char*>(data_key->writable().data()), kKeyBytes, 1, ctx,
                               kek->uchar());
    data_key->seal();
    auto cipher = RecordCipher::create(encrypt ? Aead::xchacha20poly1305 : Aead::none, *data_key);
    if (!cipher) return cipher.error();
    return PageSealer(std::move(cipher).value(), layout);
  }

  /// Protection of every record (XChaCha20-Poly1305 or none).
  [[nodiscard]] Aead aead() const noexcept { return cipher_.aead(); }
  /// The layout pages are checked against.
  [[nodiscard]] const RecordLayout& layout() const noexcept { return layout_; }
  /// Bytes of one sealed page: max_payload_bytes + kRecordOverhead (72).
  [[nodiscard]] std::size_t record_size() const noexcept { return record_bytes(layout_.max_payload_bytes); }

  /// Seals the full-block `payload` (exactly max_payload_bytes) of page `at` under `key` into
  /// `record` (exactly record_size() bytes). Errc::invalid_argument for wrong sizes.
  [[nodiscard]] Status seal(const PageDigest& key, const PageCoord& at, std::span<const std::byte> payload,
                            std::span<std::byte> record) const {
    if (payload.size() != layout_.max_payload_bytes)
      return fail(Errc::invalid_argument, "page payload of " + std::to_string(payload.size()) + " bytes, expected " +
                                              std::to_string(layout_.max_payload_bytes));
    return seal_record(cipher_, layout_, id_of(key, at), layout_.block_tokens, payload, record);
  }

  /// Verifies `record` as page `at` under `key` and writes its payload to `out` (exactly
  /// max_payload_bytes). Errc::corrupt_data (truncated, other layout, not a full page),
  /// Errc::auth_failed (tampered, foreign, under a forged key); `out` is zeroed on every error.
  [[nodiscard]] Status open(const PageDigest& key, const PageCoord& at, std::span<const std::byte> record,
                            std::span<std::byte> out) const {
    auto r = open_record(cipher_, layout_, id_of(key, at), record, out);
    if (!r) return r.error();
    if (r->token_count != layout_.block_tokens || r->payload_bytes != layout_.max_payload_bytes) {
      sodium_memzero(out.data(), out.size());
      return fail(Errc::corrupt_data, "shared page holds " + std::to_string(r->token_count) + " tokens in " +
                                          std::to_string(r->payload_bytes) + " bytes; only full pages are shared");
    }
    return {};
  }

 private:
  PageSealer(RecordCipher c, const RecordLayout& l) : cipher_(std::move(c)), layout_(l) {}

  static BlockId id_of(const PageDigest& key, const PageCoord& at) {
    BlockId id;
    for (std::size_t i = 0; i < 16; ++i) id.cache.bytes[i] = key.bytes[i];
    id.key = BlockKey{at.layer, at.kv_head, at.page};
    for (std::size_t i = 0; i < 8; ++i) id.version |= std::to_integer<uint64_t>(key.bytes[16 + i]) << (8 * i);
    return id;
  }

  RecordCipher cipher_;
  RecordLayout layout_;
};

}  // namespace kvpack::offload
