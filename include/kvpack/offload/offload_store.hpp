// OffloadStore: the compressed blocks of one cache, kept resident within a memory budget and
// moved to lower tiers (host RAM records, a file) when cold, sealed (encrypted and
// authenticated) on the way out, verified on the way back.
//
// What the cache calls (all thread-safe):
//   put(key, token_count, payload)  store a full, already compressed block (copy or move)
//   acquire(key)                    a pinned read-only view of the block, fetching it and/or
//                                   waiting for an in-flight fetch; never partial bytes
//   try_acquire(key)                the same without I/O or waiting: Errc::not_present if the
//                                   block is not fully resident right now
//   prefetch(layers)                hint: fetch these layers in the background and protect
//                                   them from eviction (double buffering, see below)
//   erase(key), pin_layer(l, on), flush(), metrics()
//
// Blocks are opaque byte payloads here (compress before offload); their layout is described
// once by a RecordLayout and checked in every record header on restore.
//
// Placement. The hot tier holds at most `resident_budget_bytes` of payload (a target: it is
// exceeded, never failing a put, when every resident block is pinned, protected or in use,
// and while write-behind catches up). Victims are chosen in EvictionOrder among resident
// blocks that are not in use (no live BlockHandle), not in a pinned layer, not in the current
// prefetch window and not being moved. A victim with a valid record in a lower tier (a
// "clean" block, e.g. one fetched earlier) is dropped without I/O; otherwise it is sealed and
// written to the first tier with room (host, then file). A fetched block keeps its record,
// so evicting it again costs nothing until it is replaced by put().
//
// Double buffering: while the cache computes layer l from pinned handles, prefetch({l+1,
// l+N}) fetches the next N layers and protects them from eviction, so the budget should hold
// the pinned layers plus N+1 layers of blocks.
//
// Faults. A failed seal/write (ENOSPC, EIO, short write, full tier) leaves the block resident
// and usable and the store consistent (the slot is freed); the error is returned by
// rebalance()/offload() or, for background work, by flush(). A failed read or verification
// returns an error naming the block (layer, kv_head, block index) and no data; the record is
// kept, so a transient read error can be retried.
//
// Secure lifetime: payloads are wiped when the last reference goes (erase, replacement,
// eviction, destruction); keys live in guarded memory and are wiped with the store; without a
// FileTier nothing is written to disk.
#pragma once

#include <algorithm>
#include <chrono>
#include <cstddef>
#include <cstdint>
#include <memory>
#include <mutex>
#include <span>
#include <string>
#include <utility>
#include <vector>

#include "kvpack/offload/offload_store_core.hpp"
#include "kvpack/offload/offload_store_types.hpp"
#include "kvpack/result.hpp"

namespace kvpack::offload {

/// See the top of this file.
class OffloadStore : private detail::OffloadStoreCore {
 public:
  /// Where a block's record lives (test and diagnostic hook).
  struct Location {
    int tier = -1;          ///< index into tiers (0 = first configured), -1 = none
    uint64_t slot = 0;
    uint32_t record_bytes = 0;
    uint64_t version = 0;
    bool resident = false;
  };

  /// Creates a store with a fresh random cache id and data key. `keys` wraps the data key
  /// (required when the file is kept, so the superblock holds it wrapped; otherwise optional:
  /// an ephemeral cache needs no key management). Errors: Errc::invalid_argument (bad layout,
  /// Aead::none requested, keep_file without a KeyProvider), Errc::unsupported (AES-GCM asked
  /// for without AES-NI), and the KeyProvider's own errors.
  [[nodiscard]] static Result<std::unique_ptr<OffloadStore>> create(StoreConfig cfg, const KeyProvider* keys = nullptr) {
    if (auto s = ensure_sodium(); !s) return s.error();
    if (auto s = cfg.layout.validate(); !s) return s.error();
    const Aead aead = cfg.aead.value_or(best_available_aead());
    if (aead == Aead::none)
      return fail(Errc::invalid_argument, "offload store: Aead::none is not allowed (use HostTier{.encrypt = false})");
    if (cfg.file && cfg.file->keep_file && !keys)
      return fail(Errc::invalid_argument, "offload store: keep_file needs a KeyProvider to wrap the data key");
    std::unique_ptr<OffloadStore> st(new OffloadStore(cfg));
    randombytes_buf(st->cache_.bytes.data(), st->cache_.bytes.size());
    auto data_key = SecretBytes::random(kKeyBytes);
    if (!data_key) return data_key.error();
    if (keys) {
      auto kek = keys->key_encryption_key();
      if (!kek) return kek.error();
      auto w = wrap_data_key(*kek, *data_key, st->cache_);
      if (!w) return w.error();
      st->wrapped_ = *w;
    }
    auto enc = RecordCipher::create(aead, *data_key);
    if (!enc) return enc.error();
    st->enc_.emplace(std::move(enc).value());
    if (cfg.host && !cfg.host->encrypt) {
      auto mac = RecordCipher::create(Aead::none, *data_key);
      if (!mac) return mac.error();
      st->mac_.emplace(std::move(mac).value());
    }
    if (cfg.host) st->tiers_.push_back(std::make_unique<HostRecordTier>(*cfg.host));
    if (cfg.file)
      st->tiers_.push_back(std::make_unique<FileRecordTier>(*cfg.file, st->cache_, aead,
                                                            record_bytes(cfg.layout.max_payload_bytes), st->wrapped_));
    if (cfg.background)
      st->worker_ = std::make_unique<Prefetcher>(cfg.queue_capacity, [p = st.get()](const IoJob& j) { p->run_job(j); });
    return st;
  }

  OffloadStore(const OffloadStore&) = delete;
  OffloadStore& operator=(const OffloadStore&) = delete;
  /// Stops the worker (finishing the job in flight), then wipes every block and key.
  ~OffloadStore() {
    if (worker_) worker_->stop();
  }

  // ---- the cache's interface ------------------------------------------------------------

  /// Stores (or replaces) block `key`: a copy of `payload` holding `token_count` tokens. The
  /// block is resident afterwards with a new version; an older record of it becomes invalid.
  /// Waits while the block is being moved. May trigger write-behind (background) or a
  /// synchronous rebalance whose failure does not fail the put (see rebalance()).
  /// Errc::invalid_argument naming the block for a negative key, a payload above
  /// layout.max_payload_bytes or more tokens than layout.block_tokens.
  [[nodiscard]] Status put(const BlockKey& key, uint16_t token_count, std::span<const std::byte> payload) {
    if (auto s = check_put(key, token_count, payload.size()); !s) return s;
    return put(key, token_count, SecureBytes::copy_of(payload));
  }
  /// put() taking ownership of the payload buffer (no copy).
  [[nodiscard]] Status put(const BlockKey& key, uint16_t token_count, SecureBytes&& payload) {
    if (auto s = check_put(key, token_count, payload.size()); !s) return s;
    auto p = std::make_shared<detail::Payload>();
    p->bytes = std::move(payload);
    p->token_count = token_count;
    auto node = order_node();  // every allocation before the entry changes
    std::shared_ptr<const detail::Payload> old;
    {
      std::unique_lock lock(mu_);
      Entry* e = &map_[key];
      while (e->busy) {  // look the entry up again after every wait: it may have been erased
        cv_.wait(lock);
        e = &map_[key];
      }
      release_record_locked(*e);
      old = std::move(e->hot);
      if (old) {
        resident_bytes_ -= old->bytes.size();
        --resident_blocks_;
        order_erase_locked(key, *e);
      } else if (e->version != 0) {
        --offloaded_blocks_;
      }
      e->version = ++version_counter_;
      e->token_count = token_count;
      e->payload_bytes = static_cast<uint32_t>(p->bytes.size());
      e->prefetched = false;
      set_hot_locked(key, *e, std::move(p), std::move(node));
    }
    old.reset();  // wiped here, outside the lock, unless a handle still shows it
    after_growth();
    return {};
  }

  /// A pinned view of block `key`, fetched from its tier if needed. Waits while another
  /// thread (the prefetcher, or a concurrent acquire) is fetching it. Never returns partial
  /// data. Errors, naming the block: Errc::not_present (never stored or erased),
  /// Errc::io_error / corrupt_data / auth_failed (the record could not be read or verified;
  /// the block is then not resident and the record is kept for a retry).
  [[nodiscard]] Result<BlockHandle> acquire(const BlockKey& key) {
    std::unique_lock lock(mu_);
    bool waited = false;
    std::chrono::steady_clock::time_point t0{};
    for (;;) {
      auto it = map_.find(key);
      if (it == map_.end() || it->second.version == 0) {
        add_wait_locked(waited, t0);
        return fail(Errc::not_present, describe(key) + " is not in the cache (never stored or erased)");
      }
      Entry& e = it->second;
      if (e.hot) {
        if (!waited && e.prefetched) {
          ++prefetch_hits_;
          prefetch_hidden_ns_ += e.fetch_ns;
        } else if (waited) {
          ++prefetch_misses_;
        }
        e.prefetched = false;
        touch_locked(key, e);
        add_wait_locked(waited, t0);
        BlockHandle h(e.hot, key, e.version);
        lock.unlock();
        if (waited) after_growth();
        return h;
      }
      if (!waited) {
        waited = true;
        t0 = std::chrono::steady_clock::now();
      }
      if (e.busy) {
        cv_.wait(lock);
        continue;
      }
      if (auto s = fetch_locked(lock, key, e, /*by_prefetch=*/false); !s) {
        ++prefetch_misses_;
        add_wait_locked(waited, t0);
        return s.error();
      }
    }
  }

  /// Like acquire() but never performs I/O or waits: Errc::not_present when the block is not
  /// fully resident now (offloaded, or being fetched), or not in the cache at all.
  [[nodiscard]] Result<BlockHandle> try_acquire(const BlockKey& key) {
    std::lock_guard lock(mu_);
    auto it = map_.find(key);
    if (it == map_.end() || it->second.version == 0)
      return fail(Errc::not_present, describe(key) + " is not in the cache (never stored or erased)");
    Entry& e = it->second;
    if (!e.hot)
      return fail(Errc::not_present, describe(key) + (e.busy ? " is being fetched" : " is offloaded, not resident"));
    if (e.prefetched) {
      ++prefetch_hits_;
      prefetch_hidden_ns_ += e.fetch_ns;
      e.prefetched = false;
    }
    touch_locked(key, e);
    return BlockHandle(e.hot, key, e.version);
  }

  /// Hint: fetch every offloaded block of `layers` in the background (no I/O without a
  /// worker), nearest layer first, and protect those layers from eviction until the next
  /// prefetch() call. The decode loop calls prefetch({l, l + N}) when it starts layer l: layer
  /// l stays protected until its blocks are acquired (pinned) and layers l+1..l+N are
  /// fetched meanwhile. With StoreConfig::layers = L > 0 the window wraps: {L-1, L} covers
  /// layers L-1 and 0. An empty range clears the protection. Returns whether a fetch was
  /// queued (false when the queue is full: the request is dropped and counted).
  bool prefetch(LayerRange layers) {
    {
      std::lock_guard lock(mu_);
      protect_ = layers;
    }
    if (!worker_ || layers.empty()) return false;
    return worker_->request(layers);
  }

  /// Changes the resident budget (payload bytes the hot tier aims to hold) at run time; when
  /// the resident set is now over it, blocks move down as after a put() (write-behind on the
  /// worker, or a synchronous rebalance whose error is kept for flush()).
  void set_resident_budget(uint64_t bytes) {
    {
      std::lock_guard lock(mu_);
      cfg_.resident_budget_bytes = bytes;
    }
    after_growth();
  }

  /// Removes block `key`: its hot copy is wiped once no handle shows it, its record slot is
  /// freed. Waits while it is being moved. Errc::not_present if absent.
  [[nodiscard]] Status erase(const BlockKey& key) {
    std::shared_ptr<const detail::Payload> old;
    {
      std::unique_lock lock(mu_);
      auto it = map_.find(key);
      while (it != map_.end() && it->second.busy) {  // look it up again after every wait
        cv_.wait(lock);
        it = map_.find(key);
      }
      if (it == map_.end() || it->second.version == 0)
        return fail(Errc::not_present, describe(key) + " is not in the cache");
      Entry* e = &it->second;
      release_record_locked(*e);
      if (e->hot) {
        resident_bytes_ -= e->hot->bytes.size();
        --resident_blocks_;
        order_erase_locked(key, *e);
        old = std::move(e->hot);
      } else if (e->version != 0) {
        --offloaded_blocks_;
      }
      map_.erase(key);  // safe: nobody else holds this entry while it is not busy
    }
    return {};
  }

  /// Keeps every block of `layer` resident (true) or lets it be evicted again (false). Does
  /// not fetch blocks already offloaded; acquire() does.
  void pin_layer(int32_t layer, bool pinned) {
    {
      std::lock_guard lock(mu_);
      if (pinned)
        pinned_layers_.insert(layer);
      else
        pinned_layers_.erase(layer);
    }
    if (!pinned) after_growth();
  }

  /// Moves blocks down until the resident bytes fit the budget or no block can move. Returns
  /// the first failure (the failed block stays resident and usable); Errc::capacity_exceeded
  /// when no tier has room. Runs on the caller's thread.
  [[nodiscard]] Status rebalance() {
    if (tiers_.empty()) return {};  // an in-memory store has nowhere to move blocks
    for (;;) {
      std::unique_lock lock(mu_);
      if (resident_bytes_ <= cfg_.resident_budget_bytes) return {};
      const BlockKey* victim = pick_victim_locked();
      if (!victim) return {};  // over budget, but everything is pinned, protected or in use
      const BlockKey key = *victim;
      Entry& e = map_.find(key)->second;
      if (e.tier >= 0) {
        drop_hot_locked(key, e);
        continue;
      }
      if (auto s = write_locked(lock, key, e); !s) return s;
    }
  }

  /// Writes block `key` to a lower tier now (if it has no valid record yet) and drops its hot
  /// copy unless a handle is using it. Ignores pins and protection. The block stays resident
  /// on failure. Errc::not_present if absent; Errc::capacity_exceeded without a tier.
  [[nodiscard]] Status offload(const BlockKey& key) {
    std::unique_lock lock(mu_);
    for (;;) {
      auto it = map_.find(key);
      if (it == map_.end() || it->second.version == 0)
        return fail(Errc::not_present, describe(key) + " is not in the cache");
      Entry& e = it->second;
      if (e.busy) {
        cv_.wait(lock);
        continue;
      }
      if (!e.hot) return {};
      if (e.tier < 0) {
        if (auto s = write_locked(lock, key, e); !s) return s;
        continue;  // re-check: the hot copy may still be in use
      }
      if (e.hot.use_count() == 1) drop_hot_locked(key, e);
      return {};
    }
  }

  /// Waits for queued background work (write-behind and prefetch) to finish, runs a last
  /// rebalance() on the caller's thread (a request dropped by a full queue is caught up
  /// here), then returns and clears the first error since the last flush(), background or
  /// this rebalance's.
  [[nodiscard]] Status flush() {
    if (worker_) worker_->drain();
    if (auto s = rebalance(); !s) keep_bg_error(s.error());
    std::lock_guard lock(mu_);
    if (!bg_error_) return {};
    Error e = std::move(*bg_error_);
    bg_error_.reset();
    return e;
  }

  /// A snapshot of the counters.
  [[nodiscard]] Metrics metrics() const { return snapshot_metrics(worker_ ? worker_->dropped() : 0); }

  // ---- introspection -------------------------------------------------------------------

  [[nodiscard]] const CacheId& cache_id() const noexcept { return cache_; }
  [[nodiscard]] const RecordLayout& layout() const noexcept { return cfg_.layout; }
  /// Protection of records in encrypted tiers.
  [[nodiscard]] Aead aead() const noexcept { return enc_->aead(); }
  /// The data key wrapped by the KeyProvider's key (absent without a provider).
  [[nodiscard]] const std::optional<WrappedKey>& wrapped_data_key() const noexcept { return wrapped_; }
  /// Whether `key` is stored (resident or not).
  [[nodiscard]] bool contains(const BlockKey& key) const {
    std::lock_guard lock(mu_);
    auto it = map_.find(key);
    return it != map_.end() && it->second.version != 0;
  }
  /// Whether `key` is fully resident now.
  [[nodiscard]] bool is_resident(const BlockKey& key) const {
    std::lock_guard lock(mu_);
    auto it = map_.find(key);
    return it != map_.end() && it->second.hot != nullptr;
  }
  /// Where `key`'s record lives. Test and diagnostic hook.
  [[nodiscard]] std::optional<Location> location(const BlockKey& key) const {
    std::lock_guard lock(mu_);
    auto it = map_.find(key);
    if (it == map_.end() || it->second.version == 0) return std::nullopt;
    const Entry& e = it->second;
    return Location{e.tier, e.slot, e.record_bytes, e.version, e.hot != nullptr};
  }
  /// Runtime tier `i` (0 = host if configured, else file). Test hook.
  [[nodiscard]] RecordTier* tier(std::size_t i) const { return i < tiers_.size() ? tiers_[i].get() : nullptr; }
  [[nodiscard]] std::size_t tier_count() const noexcept { return tiers_.size(); }

 private:
  explicit OffloadStore(StoreConfig cfg) : OffloadStoreCore(std::move(cfg)) {}

  // After the resident set grew: write-behind in the background, or a synchronous rebalance
  // whose error is kept for flush().
  void after_growth() {
    {
      std::lock_guard lock(mu_);
      if (resident_bytes_ <= cfg_.resident_budget_bytes || tiers_.empty()) return;
    }
    if (worker_) {
      worker_->request_rebalance();
      return;
    }
    if (auto s = rebalance(); !s) keep_bg_error(s.error());
  }


  void run_job(const IoJob& job) {
    if (job.kind == IoJob::Kind::rebalance) {
      if (auto s = rebalance(); !s) keep_bg_error(s.error());
      return;
    }
    std::vector<std::pair<int64_t, BlockKey>> todo;  // (distance in the window, block)
    {
      std::lock_guard lock(mu_);
      for (const auto& [k, e] : map_) {
        const int64_t d = window_distance(job.layers, k.layer);
        if (d >= 0 && e.version != 0 && !e.hot && !e.busy) todo.emplace_back(d, k);
      }
    }
    std::sort(todo.begin(), todo.end());
    for (const auto& [d, k] : todo) {
      {
        std::unique_lock lock(mu_);
        auto it = map_.find(k);
        if (it == map_.end() || it->second.version == 0 || it->second.hot || it->second.busy) continue;
        // The compute thread moved on and this layer is no longer protected: a fetch now would
        // be evicted again before use (wasted I/O), so skip it.
        if (window_distance(protect_, k.layer) < 0) continue;
        if (auto s = fetch_locked(lock, k, it->second, /*by_prefetch=*/true); !s) {
          lock.unlock();
          keep_bg_error(s.error());
          continue;
        }
      }
      if (auto s = rebalance(); !s) keep_bg_error(s.error());
    }
  }

  std::unique_ptr<Prefetcher> worker_;  // destroyed (joined) before the core's state
};

}  // namespace kvpack::offload
