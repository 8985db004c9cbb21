// Offload<Tiers..., Prefetch<N>>: the KVCache policy that moves whole compressed blocks out of
// the cache's memory into an OffloadStore (hot tier within a resident budget, then a host RAM
// tier and/or an encrypted file tier) and brings them back before attention reads them.
//
//   using Cache = kvpack::KVCache<Keys<Int4<Group<32>>>, Values<Int4<Group<32>>>,
//                                 kvpack::offload::Offload<DeviceTier, FileTier, Prefetch<2>>>;
//   kvpack::offload::OffloadOptions o;
//   o.resident_budget_bytes = 4 << 20;      // bytes of block payload kept in memory
//   o.file.directory = "/var/tmp";          // sealed (AEAD) records go to an unlinked file
//   auto cache = Cache::create(shape, o);
//
// What moves (DESIGN.md "Offload"): a block of one (layer, kv_head) once it is full (all
// Blocks<B> tokens committed: it never changes again) and older than the `keep_recent_blocks`
// newest full blocks of its (layer, kv_head), unless its layer is in `resident_layers`. The
// cache hands it to the store (the store copies it into its hot tier) and wipes and frees its
// own copy; the block's 16-byte header stays in the cache, blocks() shows it with data == null.
// Partially filled blocks, sinks and full-precision rows never move.
//
// Budget: `resident_budget_bytes` counts payload bytes of quantized blocks held in memory
// (kvpack::BlockLayout::bytes each, for keyframe blocks an upper bound): blocks the cache keeps
// itself (pinned layers, recent blocks, the partially filled last block of every (layer,
// kv_head)) plus blocks in the store's hot tier.
// The store's budget is the remainder, updated whenever the cache's own share changes; it is a
// target, exceeded rather than failing while the current layer and the prefetch window are
// pinned (see offload_store.hpp). The store moves cold blocks (lowest block index first) down.
//
// attend(l): first asks the store to prefetch layers l..l+N (wrapping past the last layer, so
// the last layer prefetches the first ones for the next decode step) in the background, then
// pins every offloaded block of layer l with OffloadStore::acquire (which waits for a fetch in
// flight or fetches itself; with wait_for_blocks = false, try_acquire answers
// Errc::not_present instead). Only complete, verified blocks are ever read. If a block cannot be
// read or verified, attend returns that error (Errc::io_error / auth_failed / corrupt_data /
// not_present), its message naming the block "(layer L, kv_head H, block B)", and writes
// nothing to `out`; the record is kept, so a later attend can retry. A failed offload write
// leaves the block resident and usable (the error is counted and returned by flush()).
//
// Needs libsodium (target kvpack::offload). A KVCache without Offload<> does not include this
// header and links nothing beyond kvpack::kvpack.
#pragma once

#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <memory>
#include <optional>
#include <span>
#include <string>
#include <type_traits>
#include <utility>
#include <vector>

#include "kvpack/cache/block.hpp"
#include "kvpack/detail/secure_zero.hpp"
#include "kvpack/offload/cache_layout.hpp"
#include "kvpack/offload/offload_store.hpp"
#include "kvpack/offload/tiers.hpp"
#include "kvpack/policy.hpp"
#include "kvpack/result.hpp"

namespace kvpack::offload {

/// Runtime options of an Offload<...> cache: the second argument of KVCache::create.
struct OffloadOptions {
  /// Bytes of quantized block payload held in memory (cache-held blocks + the store's hot
  /// tier), see the top of this file. UINT64_MAX: nothing moves for lack of room.
  uint64_t resident_budget_bytes = UINT64_MAX;
  /// Layers whose blocks always stay in the cache (never handed to the store).
  std::vector<int32_t> resident_layers{};
  /// The newest `keep_recent_blocks` full blocks of every (layer, kv_head) stay in the cache
  /// (placement by block age); older full blocks go to the store.
  int keep_recent_blocks = 0;
  /// Host RAM tier configuration (used when the policy lists HostTier).
  HostTier host{};
  /// File tier configuration (used when the policy lists FileTier): directory, capacity,
  /// keep_file, injectable FileBackend. Records in the file are always encrypted.
  FileTier file{};
  /// AEAD for encrypted records; default best_available_aead() (AES-256-GCM with AES-NI, else
  /// XChaCha20-Poly1305).
  std::optional<Aead> aead{};
  /// Wraps the per-cache data key (needed only with FileTier::keep_file). Not owned; must
  /// outlive create().
  const KeyProvider* keys = nullptr;
  /// Which resident block leaves first.
  EvictionOrder order = EvictionOrder::oldest_block_first;
  /// A worker thread does write-behind and prefetch; false: everything on the caller's thread.
  bool background = true;
  /// Bounded job queue of the worker (prefetch hints are dropped, not waited for, when full).
  std::size_t queue_capacity = 64;
  /// true: attend waits for (or performs) the fetch of an offloaded block; false: attend fails
  /// with Errc::not_present naming the first block that is not resident right now.
  bool wait_for_blocks = true;
};

/// Offload metrics of one cache: the store's counters (fetch p50/p99, prefetch hit rate,
/// bytes moved, ...) plus the cache-side view. Bytes are payload bytes unless noted.
struct CacheOffloadMetrics {
  Metrics store;                      ///< the OffloadStore's counters (records = payload + 72 bytes)
  uint64_t cache_held_bytes = 0;      ///< block bytes the cache keeps itself (never handed over)
  uint64_t resident_bytes = 0;        ///< cache_held_bytes + store.resident_bytes
  uint64_t offloaded_bytes = 0;       ///< payload bytes of blocks present only in a lower tier
  uint64_t handed_blocks = 0;         ///< blocks held by the store (resident there or not)
  uint64_t bytes_moved = 0;           ///< store.bytes_written + store.bytes_read (record bytes)
  uint64_t budget_bytes = 0;          ///< OffloadOptions::resident_budget_bytes
};

template <class... Ts>
struct Offload;

namespace detail {
template <class T>
struct is_prefetch : std::false_type {};
template <int N>
struct is_prefetch<Prefetch<N>> : std::true_type {};
template <class T>
inline constexpr bool is_tier_v =
    std::is_same_v<T, DeviceTier> || std::is_same_v<T, HostTier> || std::is_same_v<T, FileTier>;

template <class... Ts>
struct prefetch_of {
  static constexpr int value = 0;
};
template <class T, class... Ts>
struct prefetch_of<T, Ts...> {
  static constexpr int value = [] {
    if constexpr (is_prefetch<T>::value)
      return T::lookahead_layers;
    else
      return prefetch_of<Ts...>::value;
  }();
};

/// The cache-side state of Offload<...>: the store, what was handed to it, and the handles
/// that pin the current layer's offloaded blocks during attend. Movable; not thread-safe (the
/// cache is not), the store it owns is.
template <bool HasHost, bool HasFile, int Lookahead>
class OffloadState {
 public:
  /// Keeps a fetched block's bytes valid while it lives.
  using handle = BlockHandle;

  OffloadState() = default;
  OffloadState(OffloadState&&) noexcept = default;
  OffloadState& operator=(OffloadState&&) noexcept = default;

  /// Creates the store for `cache` (a KVCache) with options `o`. Errc::invalid_argument for a
  /// resident layer out of range or keep_recent_blocks < 0; the store's own errors.
  template <class Cache>
  [[nodiscard]] Status init(const Cache& cache, const OffloadOptions& o) {
    const auto& shape = cache.shape();
    for (int32_t l : o.resident_layers)
      if (l < 0 || l >= shape.layers)
        return fail(Errc::invalid_argument, "Offload: resident layer " + std::to_string(l) + " out of range [0, " +
                                                std::to_string(shape.layers) + ")");
    if (o.keep_recent_blocks < 0) return fail(Errc::invalid_argument, "Offload: keep_recent_blocks must be >= 0");
    StoreConfig cfg;
    cfg.layout = layout_for(cache);
    cfg.resident_budget_bytes = o.resident_budget_bytes;
    if constexpr (HasHost) cfg.host = o.host;
    if constexpr (HasFile) cfg.file = o.file;
    cfg.aead = o.aead;
    cfg.order = o.order;
    cfg.layers = shape.layers;
    cfg.background = o.background;
    cfg.queue_capacity = o.queue_capacity;
    auto st = OffloadStore::create(std::move(cfg), o.keys);
    if (!st) return st.error();
    store_ = std::move(st).value();
    budget_ = o.resident_budget_bytes;
    keep_recent_ = o.keep_recent_blocks;
    wait_ = o.wait_for_blocks;
    layers_ = shape.layers;
    heads_ = shape.kv_heads;
    block_bytes_ = cache.block_layout().bytes;
    block_layout_ = cache.block_layout();
    block_tokens_ = Cache::block_tokens;
    pinned_.assign(static_cast<std::size_t>(layers_), 0);
    for (int32_t l : o.resident_layers) pinned_[static_cast<std::size_t>(l)] = 1;
    handed_.assign(static_cast<std::size_t>(layers_) * static_cast<std::size_t>(heads_), 0);
    held_.assign(handed_.size(), 0);
    put_bytes_.assign(handed_.size(), {});
    held_total_ = 0;
    views_.assign(static_cast<std::size_t>(heads_), {});
    return {};
  }

  /// Called by the cache after a commit into (layer, kv_head): hands every full block older
  /// than the keep_recent_blocks newest to the store (its used payload: a keyframe block's size
  /// follows its header's modes), wiping and freeing the cache's copy. A put that fails leaves
  /// the block in the cache (kept for flush()).
  void hand_over(int layer, int kv_head, std::vector<Block>& blocks) {
    if (!store_) return;
    const std::size_t i = index(layer, kv_head);
    int64_t& n = handed_[i];
    if (!pinned_[static_cast<std::size_t>(layer)]) {
      auto full = static_cast<int64_t>(blocks.size());
      if (!blocks.empty() && blocks.back().header.count < block_tokens_) --full;
      const int64_t limit = full - keep_recent_;
      if (limit > n) put_bytes_[i].reserve(static_cast<std::size_t>(limit));  // before any put: no throw after one
      while (n < limit) {
        Block& b = blocks[static_cast<std::size_t>(n)];
        if (!b.data) break;
        const std::size_t used = block_layout_.used_bytes(b.header.count, b.header.flags);
        const Status s = store_->put(BlockKey{layer, kv_head, n}, b.header.count, std::span<const std::byte>(b.data.get(), used));
        if (!s) {
          if (!put_error_) put_error_ = s.error();
          break;
        }
        put_bytes_[i].push_back(static_cast<uint32_t>(used));
        ::kvpack::detail::secure_zero(b.data.get(), b.bytes);
        b.data.reset();
        ++n;
      }
    }
    const uint64_t held = (static_cast<uint64_t>(blocks.size()) - static_cast<uint64_t>(n)) * block_bytes_;
    if (held != held_[i]) {
      held_total_ = held_total_ - held_[i] + held;
      held_[i] = held;
      store_->set_resident_budget(budget_ > held_total_ ? budget_ - held_total_ : 0);
    }
  }

  /// Engine hint: fetch layers layer..layer+N in the background (N = Prefetch<N>; wraps past
  /// the last layer) and protect them from eviction. attend() calls it itself; an engine may
  /// call it earlier (e.g. before computing layer `layer`'s projections) to hide more latency.
  void prefetch(int layer) {
    if (!store_ || Lookahead <= 0 || layer < 0 || layer >= layers_) return;
    (void)store_->prefetch(LayerRange{layer, layer + Lookahead});
  }

  /// Ends the protection of the last prefetch window (attend(l) protects layers l..l+N until
  /// the next attend), e.g. at the end of a sequence, so a flush() can move those blocks too.
  void clear_prefetch_window() {
    if (store_) (void)store_->prefetch(LayerRange{});
  }

  /// Called by attend(layer) before reading: prefetch hint, then pins every offloaded block of
  /// `layer`. On error nothing stays pinned and the error names the block; a payload whose size
  /// is not what was handed over (which its header's count and modes say) is Errc::corrupt_data.
  [[nodiscard]] Status begin_attend(int layer) {
    if (!store_) return {};
    prefetch(layer);
    for (int h = 0; h < heads_; ++h) {
      std::vector<BlockHandle>& v = views_[static_cast<std::size_t>(h)];
      v.clear();
      const int64_t n = handed_[index(layer, h)];
      for (int64_t b = 0; b < n; ++b) {
        const BlockKey key{layer, h, b};
        auto r = wait_ ? store_->acquire(key) : store_->try_acquire(key);
        if (!r) {
          end_attend();
          return fail(r.error().code, "attend: layer " + std::to_string(layer) + ": " + r.error().message);
        }
        if (const uint32_t want = put_bytes_[index(layer, h)][static_cast<std::size_t>(b)]; r->bytes().size() != want) {
          end_attend();
          return fail(Errc::corrupt_data, "attend: layer " + std::to_string(layer) + ", kv_head " + std::to_string(h) +
                                              ", block " + std::to_string(b) + ": the store returned " +
                                              std::to_string(r->bytes().size()) + " bytes; " + std::to_string(want) +
                                              " were handed over (the size its header's count and modes say)");
        }
        v.push_back(std::move(r).value());
      }
    }
    return {};
  }

  /// Bytes of offloaded block `block` of KV head `kv_head` of the layer being attended (pinned
  /// by begin_attend).
  [[nodiscard]] const std::byte* view(int kv_head, std::size_t block) const noexcept {
    return views_[static_cast<std::size_t>(kv_head)][block].bytes().data();
  }

  /// Unpins the blocks begin_attend pinned (they may move down again).
  void end_attend() noexcept {
    for (auto& v : views_) v.clear();
  }

  /// A pinned view of one offloaded block (read_back); errors as for attend.
  [[nodiscard]] Result<BlockHandle> hold(int layer, int kv_head, int64_t block) const {
    if (!store_) return fail(Errc::not_present, "offload store not initialized");
    return store_->acquire(BlockKey{layer, kv_head, block});
  }

  /// Erases every block handed to the store (KVCache::reset).
  void reset() {
    if (!store_) return;
    end_attend();
    for (int l = 0; l < layers_; ++l)
      for (int h = 0; h < heads_; ++h) {
        int64_t& n = handed_[index(l, h)];
        for (int64_t b = 0; b < n; ++b) (void)store_->erase(BlockKey{l, h, b});
        n = 0;
        put_bytes_[index(l, h)].clear();
      }
    std::fill(held_.begin(), held_.end(), 0);
    held_total_ = 0;
    store_->set_resident_budget(budget_);
    put_error_.reset();
  }

  /// Waits for background work, then returns the first error since the last flush (a failed
  /// put or offload write: the block stayed resident), or OK.
  [[nodiscard]] Status flush() {
    if (!store_) return {};
    Status s = store_->flush();
    if (put_error_) {
      Error e = std::move(*put_error_);
      put_error_.reset();
      if (s) return e;
    }
    return s;
  }

  /// Counters, see CacheOffloadMetrics.
  [[nodiscard]] CacheOffloadMetrics metrics() const {
    CacheOffloadMetrics m;
    if (!store_) return m;
    m.store = store_->metrics();
    m.cache_held_bytes = held_total_;
    m.resident_bytes = held_total_ + m.store.resident_bytes;
    m.offloaded_bytes = m.store.offloaded_blocks * block_bytes_;
    for (int64_t n : handed_) m.handed_blocks += static_cast<uint64_t>(n);
    m.bytes_moved = m.store.bytes_written + m.store.bytes_read;
    m.budget_bytes = budget_;
    return m;
  }

  /// The store (tests, diagnostics: location(), offload(), tier()). Null before init.
  [[nodiscard]] OffloadStore* store() const noexcept { return store_.get(); }
  /// Blocks of (layer, kv_head) held by the store: block indices [0, n).
  [[nodiscard]] int64_t handed(int layer, int kv_head) const noexcept {
    return store_ ? handed_[index(layer, kv_head)] : 0;
  }

 private:
  [[nodiscard]] std::size_t index(int layer, int kv_head) const noexcept {
    return static_cast<std::size_t>(layer) * static_cast<std::size_t>(heads_) + static_cast<std::size_t>(kv_head);
  }

  std::unique_ptr<OffloadStore> store_;
  uint64_t budget_ = UINT64_MAX;
  int keep_recent_ = 0;
  bool wait_ = true;
  int layers_ = 0, heads_ = 0, block_tokens_ = 0;
  std::size_t block_bytes_ = 0;
  kvpack::BlockLayout block_layout_;       // the cache's; a block's payload is used_bytes(count, flags)
  std::vector<char> pinned_;               // [layer]
  std::vector<int64_t> handed_;            // [layer * heads + head]: blocks [0, n) are in the store
  std::vector<uint64_t> held_;             // [layer * heads + head]: block bytes the cache holds
  std::vector<std::vector<uint32_t>> put_bytes_;  // [layer * heads + head][block]: payload bytes handed over
  uint64_t held_total_ = 0;
  std::vector<std::vector<BlockHandle>> views_;  // [kv_head][block]: pinned during attend
  std::optional<Error> put_error_;
};
}  // namespace detail

/// KVCache policy (role offload): compose tiers and a prefetch lookahead, order-free.
///  * DeviceTier  the hot tier attention reads (host RAM without CUDA); optional, implied
///  * HostTier    sealed records in RAM (encrypted unless OffloadOptions::host.encrypt = false)
///  * FileTier    encrypted records in one file per cache (unlinked unless keep_file)
///  * Prefetch<N> while layer l is attended, layers l+1..l+N are fetched (default N = 0)
/// At least one of HostTier / FileTier. Lower tiers are tried in the order host, then file.
/// Cannot be combined with an eviction policy (blocks must be immutable once full).
template <class... Ts>
struct Offload {
  static_assert(((detail::is_tier_v<Ts> || detail::is_prefetch<Ts>::value) && ...),
                "kvpack::offload::Offload<...>: arguments must be DeviceTier, HostTier, FileTier or Prefetch<N>");
  static_assert((std::is_same_v<Ts, DeviceTier> + ... + 0) <= 1 && (std::is_same_v<Ts, HostTier> + ... + 0) <= 1 &&
                    (std::is_same_v<Ts, FileTier> + ... + 0) <= 1 && (detail::is_prefetch<Ts>::value + ... + 0) <= 1,
                "kvpack::offload::Offload<...>: each tier and Prefetch<N> at most once");
  static constexpr bool host_tier = (std::is_same_v<Ts, HostTier> || ...);
  static constexpr bool file_tier = (std::is_same_v<Ts, FileTier> || ...);
  static_assert(host_tier || file_tier,
                "kvpack::offload::Offload<...>: needs a lower tier to move blocks to (HostTier and/or FileTier)");
  /// Layers fetched ahead of the one being attended.
  static constexpr int prefetch_layers = detail::prefetch_of<Ts...>::value;

  using kvpack_role = ::kvpack::role::offload;
  static constexpr bool enabled = true;
  using options = OffloadOptions;
  using state = detail::OffloadState<host_tier, file_tier, prefetch_layers>;
};

}  // namespace kvpack::offload
