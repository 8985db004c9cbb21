// The state and the locked helpers behind OffloadStore (offload_store.hpp): the block index, the
// eviction order, the counters, and sealing a block into a tier (write_locked) or reading one back
// (fetch_locked) with the store's mutex released during I/O. OffloadStore adds the public,
// thread-safe interface and the background worker on top; nothing here is meant to be used alone.
#pragma once

#include <algorithm>
#include <array>
#include <chrono>
#include <condition_variable>
#include <cstddef>
#include <cstdint>
#include <memory>
#include <mutex>
#include <optional>
#include <set>
#include <string>
#include <tuple>
#include <unordered_map>
#include <utility>
#include <vector>

#include "kvpack/offload/block_header.hpp"
#include "kvpack/offload/block_id.hpp"
#include "kvpack/offload/block_record.hpp"
#include "kvpack/offload/crypto.hpp"
#include "kvpack/offload/file_backend.hpp"
#include "kvpack/offload/offload_store_types.hpp"
#include "kvpack/offload/prefetcher.hpp"
#include "kvpack/offload/secure_memory.hpp"
#include "kvpack/offload/tiers.hpp"
#include "kvpack/result.hpp"

namespace kvpack::offload::detail {

/// OffloadStore's state and its lock-holding helpers (callers hold mu_ where a name ends in
/// _locked). Protected throughout: OffloadStore derives from it privately.
class OffloadStoreCore {
 protected:

  static constexpr std::size_t kLatencyWindow = 4096;

  struct Entry {
    uint64_t version = 0;  // 0: placeholder not yet filled by put()
    uint16_t token_count = 0;
    uint32_t payload_bytes = 0;
    std::shared_ptr<const detail::Payload> hot;  // resident copy, null when offloaded
    int tier = -1;                               // tier holding a record of `version`, -1: none
    uint64_t slot = 0;
    uint32_t record_bytes = 0;
    bool busy = false;        // a write or fetch of this block is in flight (lock released)
    bool prefetched = false;  // hot copy delivered by prefetch, not yet acquired
    uint64_t fetch_ns = 0;
    uint64_t last_use = 0;
    std::tuple<int64_t, uint64_t, BlockKey> order_key{};  // key in order_ while resident
  };

  explicit OffloadStoreCore(StoreConfig cfg) : cfg_(std::move(cfg)) {}

  Status check_put(const BlockKey& key, uint16_t token_count, std::size_t bytes) const {
    if (key.layer < 0 || key.kv_head < 0 || key.block_index < 0)
      return fail(Errc::invalid_argument, describe(key) + ": negative index");
    if (bytes > cfg_.layout.max_payload_bytes)
      return fail(Errc::invalid_argument, describe(key) + ": payload of " + std::to_string(bytes) +
                                              " bytes exceeds the layout's maximum " +
                                              std::to_string(cfg_.layout.max_payload_bytes));
    if (token_count > cfg_.layout.block_tokens)
      return fail(Errc::invalid_argument, describe(key) + ": " + std::to_string(token_count) +
                                              " tokens exceed block_tokens " + std::to_string(cfg_.layout.block_tokens));
    return {};
  }

  const RecordCipher& cipher_for(std::size_t tier) const {
    return tiers_[tier]->needs_encryption() ? *enc_ : *mac_;
  }

  std::tuple<int64_t, uint64_t, BlockKey> make_order_key(const BlockKey& key, const Entry& e) const {
    if (cfg_.order == EvictionOrder::oldest_block_first) return {key.block_index, e.last_use, key};
    return {static_cast<int64_t>(e.last_use), 0, key};
  }
  void order_erase_locked(const BlockKey&, Entry& e) { order_.erase(e.order_key); }
  using OrderSet = std::set<std::tuple<int64_t, uint64_t, BlockKey>>;
  /// A node of order_ allocated ahead (may throw std::bad_alloc), so that a block becoming
  /// resident allocates nothing once its state starts to change.
  static OrderSet::node_type order_node() {
    OrderSet one;
    one.emplace();  // (insert({}) would pick the initializer_list overload and insert nothing)
    return one.extract(one.begin());
  }
  void touch_locked(const BlockKey& key, Entry& e) {  // moves the block's node: allocates nothing
    auto node = order_.extract(e.order_key);
    e.last_use = ++tick_;
    e.order_key = make_order_key(key, e);
    node.value() = e.order_key;
    order_.insert(std::move(node));
  }
  void set_hot_locked(const BlockKey& key, Entry& e, std::shared_ptr<const detail::Payload> p, OrderSet::node_type node) {
    e.last_use = ++tick_;
    e.order_key = make_order_key(key, e);
    node.value() = e.order_key;
    order_.insert(std::move(node));
    resident_bytes_ += p->bytes.size();
    ++resident_blocks_;
    e.hot = std::move(p);
  }
  void drop_hot_locked(const BlockKey& key, Entry& e) {
    order_erase_locked(key, e);
    resident_bytes_ -= e.hot->bytes.size();
    --resident_blocks_;
    ++offloaded_blocks_;
    e.hot.reset();  // last reference (checked by callers): wiped now
    e.prefetched = false;
  }
  void release_record_locked(Entry& e) {
    if (e.tier >= 0) tiers_[static_cast<std::size_t>(e.tier)]->release(e.slot);
    e.tier = -1;
  }
  void add_wait_locked(bool waited, std::chrono::steady_clock::time_point t0) {
    if (waited)
      acquire_wait_ns_ += static_cast<uint64_t>(
          std::chrono::duration_cast<std::chrono::nanoseconds>(std::chrono::steady_clock::now() - t0).count());
  }

  // Distance of `layer` from the start of `w` (0 = first layer of the window), or -1 when it
  // is outside; windows wrap modulo cfg_.layers when that is set.
  int64_t window_distance(const LayerRange& w, int32_t layer) const {
    if (w.empty()) return -1;
    int64_t d = static_cast<int64_t>(layer) - w.first;
    if (cfg_.layers > 0) d = ((d % cfg_.layers) + cfg_.layers) % cfg_.layers;
    return (d >= 0 && d <= static_cast<int64_t>(w.last) - w.first) ? d : -1;
  }

  // The evictable resident block first in order, or null.
  const BlockKey* pick_victim_locked() const {
    for (const auto& k : order_) {
      const BlockKey& key = std::get<2>(k);
      if (pinned_layers_.count(key.layer) || window_distance(protect_, key.layer) >= 0) continue;
      const Entry& e = map_.find(key)->second;
      if (e.busy || e.hot.use_count() != 1) continue;  // moving, or shown by a BlockHandle
      return &key;
    }
    return nullptr;
  }

  // After an exception in a section that runs unlocked with e.busy set (write_locked,
  // fetch_locked): takes the lock back, clears busy, counts the failure and wakes the waiters.
  void unbusy_after_throw(std::unique_lock<std::mutex>& lock, Entry& e, uint64_t& failures) noexcept {
    if (!lock.owns_lock()) lock.lock();
    e.busy = false;
    ++failures;
    cv_.notify_all();
  }

  // Seals e's hot copy and writes it to the first tier with room; the lock is released during
  // sealing and I/O (e.busy keeps others off this block). On success the block has a record
  // and its hot copy is dropped if no handle shows it.
  Status write_locked(std::unique_lock<std::mutex>& lock, const BlockKey& key, Entry& e) {
    if (tiers_.empty()) {
      ++offload_failures_;
      return fail(Errc::capacity_exceeded, describe(key) + ": no offload tier configured");
    }
    e.busy = true;
    std::shared_ptr<const detail::Payload> p = e.hot;
    const uint64_t version = e.version;
    lock.unlock();

    const BlockId id{cache_, key, version};
    Status status;
    std::size_t used_tier = 0, rec_size = 0;
    uint64_t slot = 0;
    try {  // a std::bad_alloc here must not leave the block busy (every later call would wait)
      const std::string what = describe(key);
      status = fail(Errc::capacity_exceeded, what + ": every offload tier is full");
      SecureBytes record(record_bytes(p->bytes.size()));
      rec_size = record.size();
      Aead sealed_as = Aead::none;
      bool sealed = false;
      for (std::size_t t = 0; t < tiers_.size(); ++t) {
        if (!tiers_[t]->has_room(record.size())) continue;
        const RecordCipher& c = cipher_for(t);
        if (!sealed || sealed_as != c.aead()) {
          if (auto s = seal_record(c, cfg_.layout, id, p->token_count, p->bytes.span(), record.span()); !s) {
            status = s;
            break;
          }
          sealed = true;
          sealed_as = c.aead();
        }
        auto r = tiers_[t]->store(record.span(), what);
        if (r) {
          status = {};
          used_tier = t;
          slot = *r;
          break;
        }
        status = r.error();
        if (r.error().code != Errc::capacity_exceeded) break;  // an I/O error: do not spill further
      }
    } catch (...) {
      p.reset();
      unbusy_after_throw(lock, e, offload_failures_);
      throw;
    }
    p.reset();

    lock.lock();
    e.busy = false;
    if (status) {
      e.tier = static_cast<int>(used_tier);
      e.slot = slot;
      e.record_bytes = static_cast<uint32_t>(rec_size);
      bytes_written_ += rec_size;
      ++offloads_;
      if (e.hot.use_count() == 1) drop_hot_locked(key, e);
    } else {
      ++offload_failures_;
    }
    cv_.notify_all();
    return status;
  }

  // Reads and verifies e's record into a new hot copy; the lock is released during I/O and
  // decryption (e.busy makes others wait). The hot copy is published only when complete.
  Status fetch_locked(std::unique_lock<std::mutex>& lock, const BlockKey& key, Entry& e, bool by_prefetch) {
    if (e.tier < 0) return fail(Errc::corrupt_data, describe(key) + ": neither resident nor offloaded");
    e.busy = true;
    const std::size_t tier = static_cast<std::size_t>(e.tier);
    const uint64_t slot = e.slot;
    const BlockId id{cache_, key, e.version};
    const uint32_t rec_bytes = e.record_bytes;
    const uint32_t payload_bytes = e.payload_bytes;
    const uint16_t token_count = e.token_count;
    lock.unlock();

    const auto t0 = std::chrono::steady_clock::now();
    std::shared_ptr<detail::Payload> p;
    OrderSet::node_type node;
    Status status;
    try {  // a std::bad_alloc here must not leave the block busy (every later call would wait)
      node = order_node();
      const std::string what = describe(key);
      SecureBytes record(rec_bytes);
      p = std::make_shared<detail::Payload>();
      p->bytes = SecureBytes(payload_bytes);
      status = tiers_[tier]->load(slot, record.span(), what + " from the " + std::string(tiers_[tier]->name()) + " tier");
      if (status) {
        auto r = open_record(cipher_for(tier), cfg_.layout, id, record.span(), p->bytes.span());
        if (!r)
          status = r.error();
        else if (r->payload_bytes != payload_bytes || r->token_count != token_count)
          status = fail(Errc::corrupt_data, what + ": record does not match the index");
        p->token_count = token_count;
      }
    } catch (...) {
      p.reset();
      unbusy_after_throw(lock, e, fetch_failures_);
      throw;
    }
    const auto ns = static_cast<uint64_t>(
        std::chrono::duration_cast<std::chrono::nanoseconds>(std::chrono::steady_clock::now() - t0).count());

    lock.lock();
    e.busy = false;
    if (status) {
      set_hot_locked(key, e, std::move(p), std::move(node));
      --offloaded_blocks_;
      e.prefetched = by_prefetch;
      e.fetch_ns = ns;
      latency_ns_[fetches_ % kLatencyWindow] = ns;
      ++fetches_;
      bytes_read_ += rec_bytes;
    } else {
      ++fetch_failures_;
    }
    cv_.notify_all();
    return status;
  }


  void keep_bg_error(Error e) {
    std::lock_guard lock(mu_);
    if (!bg_error_) bg_error_ = std::move(e);
  }

  // The counters under the lock, latency percentiles computed outside it.
  [[nodiscard]] Metrics snapshot_metrics(uint64_t prefetch_dropped) const {
    Metrics m;
    std::vector<uint64_t> lat;
    {
      std::lock_guard lock(mu_);
      m.resident_bytes = resident_bytes_;
      m.resident_blocks = resident_blocks_;
      m.offloaded_blocks = offloaded_blocks_;
      m.bytes_written = bytes_written_;
      m.bytes_read = bytes_read_;
      m.offloads = offloads_;
      m.offload_failures = offload_failures_;
      m.fetches = fetches_;
      m.fetch_failures = fetch_failures_;
      m.prefetch_hits = prefetch_hits_;
      m.prefetch_misses = prefetch_misses_;
      m.prefetch_hidden_ns = prefetch_hidden_ns_;
      m.acquire_wait_ns = acquire_wait_ns_;
      lat.assign(latency_ns_.begin(), latency_ns_.begin() + static_cast<std::ptrdiff_t>(std::min<uint64_t>(fetches_, kLatencyWindow)));
    }
    for (std::size_t t = 0; t < tiers_.size(); ++t) {
      if (tiers_[t]->name() == "host") m.host_tier_bytes = tiers_[t]->used_bytes();
      if (tiers_[t]->name() == "file") m.file_tier_bytes = tiers_[t]->used_bytes();
    }
    m.prefetch_dropped = prefetch_dropped;
    const uint64_t n = m.prefetch_hits + m.prefetch_misses;
    m.prefetch_hit_rate = n ? static_cast<double>(m.prefetch_hits) / static_cast<double>(n) : 0.0;
    auto pct = [&](double q) {
      if (lat.empty()) return 0.0;
      const std::size_t i = std::min(lat.size() - 1, static_cast<std::size_t>(q * static_cast<double>(lat.size())));
      std::nth_element(lat.begin(), lat.begin() + static_cast<std::ptrdiff_t>(i), lat.end());
      return static_cast<double>(lat[i]) / 1000.0;
    };
    m.fetch_p50_us = pct(0.50);
    m.fetch_p99_us = pct(0.99);
    return m;
  }

  StoreConfig cfg_;
  CacheId cache_{};
  std::optional<WrappedKey> wrapped_;
  std::optional<RecordCipher> enc_, mac_;
  std::vector<std::unique_ptr<RecordTier>> tiers_;

  mutable std::mutex mu_;
  std::condition_variable cv_;  // an entry stopped being busy
  std::unordered_map<BlockKey, Entry, BlockKeyHash> map_;
  OrderSet order_;  // resident blocks, eviction order
  std::set<int32_t> pinned_layers_;
  LayerRange protect_{};
  uint64_t version_counter_ = 0, tick_ = 0;
  uint64_t resident_bytes_ = 0, resident_blocks_ = 0, offloaded_blocks_ = 0;
  uint64_t bytes_written_ = 0, bytes_read_ = 0, offloads_ = 0, offload_failures_ = 0;
  uint64_t fetches_ = 0, fetch_failures_ = 0;
  uint64_t prefetch_hits_ = 0, prefetch_misses_ = 0, prefetch_hidden_ns_ = 0, acquire_wait_ns_ = 0;
  std::array<uint64_t, kLatencyWindow> latency_ns_{};
  std::optional<Error> bg_error_;
};

}  // namespace kvpack::offload::detail
