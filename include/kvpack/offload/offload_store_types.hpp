// Plain types of the offload store (offload_store.hpp): its configuration, its counters and the
// pinned view of a resident block it hands out.
#pragma once

#include <cstddef>
#include <cstdint>
#include <memory>
#include <optional>
#include <span>
#include <utility>

#include "kvpack/offload/block_id.hpp"
#include "kvpack/offload/block_record.hpp"
#include "kvpack/offload/crypto.hpp"
#include "kvpack/offload/secure_memory.hpp"
#include "kvpack/offload/tiers.hpp"

namespace kvpack::offload {

class OffloadStore;


/// Which resident block leaves first when the budget is exceeded.
enum class EvictionOrder {
  /// Oldest tokens first: lowest block index, then least recently used. Under the layer-by-layer
  /// decode loop this keeps a stable resident set (the newest blocks of every layer) and moves
  /// the same blocks each step, instead of LRU's thrashing on cyclic access.
  oldest_block_first,
  /// Least recently put or acquired first.
  least_recently_used,
};

/// Configuration of an OffloadStore.
struct StoreConfig {
  RecordLayout layout;                            ///< checked on every restore
  uint64_t resident_budget_bytes = UINT64_MAX;   ///< payload bytes the hot tier aims to hold
  std::optional<HostTier> host;                  ///< RAM tier of records, tried first
  std::optional<FileTier> file;                  ///< file tier, tried after the host tier
  std::optional<Aead> aead;                      ///< default: best_available_aead(); not none
  EvictionOrder order = EvictionOrder::oldest_block_first;
  int32_t layers = 0;                            ///< model layers; > 0 makes prefetch windows wrap
  bool background = true;                        ///< a worker thread does write-behind and prefetch
  std::size_t queue_capacity = 64;               ///< bounded job queue of the worker
};

/// Counters and gauges of one store. Bytes are payload bytes in the hot tier and record bytes
/// (payload + 72) in lower tiers; latencies cover read + verify + decrypt of one block.
struct Metrics {
  uint64_t resident_bytes = 0;      ///< payload bytes in the hot tier
  uint64_t resident_blocks = 0;     ///< blocks in the hot tier
  uint64_t offloaded_blocks = 0;    ///< blocks present only in a lower tier
  uint64_t host_tier_bytes = 0;     ///< bytes held by the host tier
  uint64_t file_tier_bytes = 0;     ///< bytes of file slots in use
  uint64_t bytes_written = 0;       ///< record bytes written to lower tiers
  uint64_t bytes_read = 0;          ///< record bytes read back
  uint64_t offloads = 0;            ///< records written
  uint64_t offload_failures = 0;    ///< writes/seals that failed (block stayed resident)
  uint64_t fetches = 0;             ///< records read and verified
  uint64_t fetch_failures = 0;      ///< reads/verifications that failed
  double fetch_p50_us = 0;          ///< median fetch latency over the last 4096 fetches
  double fetch_p99_us = 0;          ///< 99th percentile of the same
  uint64_t prefetch_hits = 0;       ///< acquires served by a block prefetch had brought in
  uint64_t prefetch_misses = 0;     ///< acquires that had to fetch or wait for a fetch
  double prefetch_hit_rate = 0;     ///< hits / (hits + misses), 0 when none
  uint64_t prefetch_hidden_ns = 0;  ///< fetch time of prefetch hits (latency prefetch hid)
  uint64_t acquire_wait_ns = 0;     ///< time acquire() spent fetching or waiting (exposed latency)
  uint64_t prefetch_dropped = 0;    ///< prefetch requests dropped (queue full)
};

namespace detail {
struct Payload {
  SecureBytes bytes;
  uint16_t token_count = 0;
};
}  // namespace detail

/// A pinned, read-only view of one resident block. While it lives the block stays resident
/// (and its bytes valid, even if the block is replaced or erased meanwhile). Move-only; cheap.
class BlockHandle {
 public:
  BlockHandle() = default;
  /// The compressed payload (exactly the bytes given to put()).
  [[nodiscard]] std::span<const std::byte> bytes() const noexcept {
    return p_ ? p_->bytes.span() : std::span<const std::byte>{};
  }
  /// Tokens in the block.
  [[nodiscard]] uint16_t token_count() const noexcept { return p_ ? p_->token_count : 0; }
  [[nodiscard]] const BlockKey& key() const noexcept { return key_; }
  /// The version this view shows.
  [[nodiscard]] uint64_t version() const noexcept { return version_; }
  [[nodiscard]] bool valid() const noexcept { return p_ != nullptr; }

 private:
  friend class OffloadStore;
  BlockHandle(std::shared_ptr<const detail::Payload> p, BlockKey key, uint64_t version)
      : p_(std::move(p)), key_(key), version_(version) {}
  std::shared_ptr<const detail::Payload> p_;
  BlockKey key_{};
  uint64_t version_ = 0;
};

}  // namespace kvpack::offload
