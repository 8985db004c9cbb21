// A sealed block record: what an offload tier stores for one block.
//
// Record byte layout (sizes in bytes):
//
//   [ header 32 | nonce field 24 | protected payload P | tag 16 ]     total P + kRecordOverhead
//
// header: block_header.hpp (in clear). nonce field: crypto.hpp. protected payload: the
// compressed block encrypted with the cache's AEAD (or in clear for Aead::none). Associated
// data = BlockId::serialize() (cache id, layer, kv_head, block index, version; 40 bytes)
// || header (32 bytes): a record verifies only for the exact block, version and cache it was
// sealed for, with the exact header it carries.
#pragma once

#include <array>
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <span>
#include <string>

#include "kvpack/offload/block_header.hpp"
#include "kvpack/offload/block_id.hpp"
#include "kvpack/offload/crypto.hpp"
#include "kvpack/result.hpp"

namespace kvpack::offload {

/// Bytes a record adds to its payload: header 32 + nonce field 24 + tag 16.
inline constexpr std::size_t kRecordOverhead = RecordHeader::kBytes + kNonceFieldBytes + kTagBytes;

/// Bytes of the record of a `payload_bytes`-byte payload.
[[nodiscard]] constexpr std::size_t record_bytes(std::size_t payload_bytes) noexcept {
  return payload_bytes + kRecordOverhead;
}

/// What open_record() learned from a verified record.
struct OpenedRecord {
  uint16_t token_count = 0;    ///< tokens in the block
  uint32_t payload_bytes = 0;  ///< bytes written to the output (prefix of it)
};

namespace detail {
inline std::array<std::byte, BlockId::kSerializedBytes + RecordHeader::kBytes> record_ad(
    const BlockId& id, std::span<const std::byte> header) {
  std::array<std::byte, BlockId::kSerializedBytes + RecordHeader::kBytes> ad{};
  const auto idb = id.serialize();
  std::memcpy(ad.data(), idb.data(), idb.size());
  std::memcpy(ad.data() + idb.size(), header.data(), RecordHeader::kBytes);
  return ad;
}
inline std::string name(const BlockId& id) { return describe(id.key) + " version " + std::to_string(id.version); }
}  // namespace detail

/// Seals `payload` (a compressed block of `token_count` tokens) for block `id` into `record`,
/// which must be exactly record_bytes(payload.size()) bytes.
/// Errc::invalid_argument (naming the block) for a wrong record size, a payload above
/// layout.max_payload_bytes or a token count above layout.block_tokens.
[[nodiscard]] inline Status seal_record(const RecordCipher& cipher, const RecordLayout& layout, const BlockId& id,
                                        uint16_t token_count, std::span<const std::byte> payload,
                                        std::span<std::byte> record) {
  if (payload.size() > layout.max_payload_bytes)
    return fail(Errc::invalid_argument, detail::name(id) + ": payload of " + std::to_string(payload.size()) +
                                            " bytes exceeds the layout's maximum " +
                                            std::to_string(layout.max_payload_bytes));
  if (token_count > layout.block_tokens)
    return fail(Errc::invalid_argument, detail::name(id) + ": " + std::to_string(token_count) +
                                            " tokens exceed block_tokens " + std::to_string(layout.block_tokens));
  if (record.size() != record_bytes(payload.size()))
    return fail(Errc::invalid_argument, detail::name(id) + ": record buffer of " + std::to_string(record.size()) +
                                            " bytes, need " + std::to_string(record_bytes(payload.size())));
  const auto header =
      RecordHeader::make(layout, cipher.aead(), token_count, static_cast<uint32_t>(payload.size())).serialize();
  std::memcpy(record.data(), header.data(), header.size());
  const auto ad = detail::record_ad(id, header);
  cipher.seal(ad, payload, record.subspan(RecordHeader::kBytes).first<kNonceFieldBytes>(),
              record.subspan(RecordHeader::kBytes + kNonceFieldBytes, payload.size()),
              record.last<kTagBytes>());
  return {};
}

/// Verifies `record` as the sealed form of block `id` with this layout and protection and
/// writes its payload to the front of `out` (which needs at least payload_bytes bytes).
/// Checks, in order: size >= overhead, header magic/version, layout fields (codec format,
/// bits, group size, head_dim, block tokens), protection, token count, payload size against
/// the record size, then the tag over (id, header, payload).
/// Errors name the block: Errc::corrupt_data (truncated record, bad header, other layout),
/// Errc::auth_failed (tampered, swapped, replayed or foreign record), Errc::invalid_argument
/// (`out` too small). On every error all of `out` is zeroed: no partial data is returned.
[[nodiscard]] inline Result<OpenedRecord> open_record(const RecordCipher& cipher, const RecordLayout& layout,
                                                      const BlockId& id, std::span<const std::byte> record,
                                                      std::span<std::byte> out) {
  auto bad = [&](Errc code, const std::string& what) -> Error {
    if (!out.empty()) sodium_memzero(out.data(), out.size());
    return fail(code, detail::name(id) + ": " + what);
  };
  if (record.size() < kRecordOverhead)
    return bad(Errc::corrupt_data, "record truncated to " + std::to_string(record.size()) + " bytes");
  auto header = RecordHeader::parse(record);
  if (!header) return bad(header.error().code, header.error().message);
  if (auto s = header->check(layout, cipher.aead()); !s) return bad(s.error().code, s.error().message);
  if (record.size() != record_bytes(header->payload_bytes))
    return bad(Errc::corrupt_data, "record of " + std::to_string(record.size()) + " bytes, header says " +
                                       std::to_string(record_bytes(header->payload_bytes)));
  if (out.size() < header->payload_bytes)
    return bad(Errc::invalid_argument, "output of " + std::to_string(out.size()) + " bytes, payload has " +
                                           std::to_string(header->payload_bytes));
  const auto ad = detail::record_ad(id, record.first<RecordHeader::kBytes>());
  auto s = cipher.open(ad, record.subspan(RecordHeader::kBytes).first<kNonceFieldBytes>(),
                       record.subspan(RecordHeader::kBytes + kNonceFieldBytes, header->payload_bytes),
                       record.last<kTagBytes>(), out.first(header->payload_bytes));
  if (!s) return bad(s.error().code, s.error().message + " (tampered, swapped, replayed or foreign block)");
  return OpenedRecord{header->token_count, header->payload_bytes};
}

}  // namespace kvpack::offload
