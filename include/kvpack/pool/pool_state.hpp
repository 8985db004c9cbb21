// PoolState: what a PagedCache owns (configuration, page arena, prefix cache, sequence slots) and
// the operations that span several sequences or layers: opening and closing slots, truncate
// (checked for every layer before any changes), publishing, attaching and importing prefix pages, stats.
#pragma once

#include <algorithm>
#include <atomic>
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <limits>
#include <memory>
#include <mutex>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include "kvpack/cache/alloc_guard.hpp"
#include "kvpack/cache/chunk_stage.hpp"
#include "kvpack/detail/secure_zero.hpp"
#include "kvpack/pool/page_pool.hpp"
#include "kvpack/pool/paged_sequence.hpp"
#include "kvpack/pool/pool_swap.hpp"
#include "kvpack/pool/pool_types.hpp"
#include "kvpack/pool/prefix_cache.hpp"
#include "kvpack/pool/slot_handles.hpp"

namespace kvpack::pool_detail {

/// A sequence slot: its handle (pool/slot_handles.hpp), swap state (pool/pool_swap.hpp), layers
/// and the stage its appends copy and check their rows in (cache/chunk_stage.hpp; one per
/// sequence, since calls on different sequences may run concurrently).
struct SeqSlot : SlotHandle, SwapState {
  std::vector<PagedLayer> layers;
  ChunkStage stage;
};

/// Shared state of a PagedCache with codec hook Codec, Sinks<S>, Residual<R>.
template <class Codec, int S, int R>
struct PoolState {
  static constexpr int U = Codec::commit_unit;
  PoolConfig cfg;
  BlockLayout layout;
  std::unique_ptr<PagePool> pool;
  PrefixCache prefix;
  std::unique_ptr<SeqSlot[]> slots;
  SlotFreeList free_slots;
  std::int64_t hist_cap = 0;  // rollback copies per layer (tokens)
  kernels::RopeTable rope_table;  // PreRope<> pools: cos/sin of positions [0, max_tokens), fixed at create
  kernels::RopeArgs rope;         // ... and the kernels' arguments over it (q_pos set per call)

  /// A pool's state for `cfg` with pages of B tokens (see BasicPagedCache::create for the errors)
  /// and, pre_rope, the RoPE table of cfg.shape. May throw std::bad_alloc.
  static Result<std::unique_ptr<PoolState>> create(const PoolConfig& cfg, int B, bool pre_rope = false) {
    if (Status s = validate_shape(cfg.shape, Codec::K::row_group, Codec::V::row_group); !s) return s.error();
    if (cfg.max_sequences < 1 || cfg.max_rollback_tokens < 0)
      return fail(Errc::invalid_argument, "PagedCache::create: max_sequences must be >= 1 and max_rollback_tokens >= 0");
    auto st = std::make_unique<PoolState>();
    st->cfg = cfg;
    // Pages store no positions: each sequence keeps its paged tokens' positions as runs (PagedLayer::block_pos).
    st->layout = make_block_layout<typename Codec::key_codec, typename Codec::value_codec, Codec::keys_per_channel>(
        B, cfg.shape.head_dim, false);
    auto pool = PagePool::create(st->layout.bytes, cfg.byte_budget, Codec::header(cfg.shape.head_dim));
    if (!pool) return pool.error();
    st->pool = std::move(pool.value());
    st->hist_cap = cfg.max_rollback_tokens > 0 ? cfg.max_rollback_tokens + R + U - 1 : 0;
    if (pre_rope) {  // fixed, so concurrent appends never grow what concurrent attends read
      if (Status s = validate_rope(cfg.shape, "PagedCache::create"); !s) return s.error();
      const int dims = cfg.shape.rope_dims > 0 ? cfg.shape.rope_dims : cfg.shape.head_dim;
      const std::size_t table = saturating_bytes(static_cast<std::uint64_t>(cfg.shape.max_tokens), 4 * static_cast<std::uint64_t>(dims));
      if (table > physical_memory_bytes())  // refused before an overcommitting kernel grants it
        return fail(Errc::out_of_memory, "PagedCache::create: the PreRope<> RoPE table of max_tokens = " +
                                             std::to_string(cfg.shape.max_tokens) + " positions would take " +
                                             std::to_string(table) + " bytes, more than physical memory");
      st->rope_table = kernels::RopeTable(static_cast<double>(cfg.shape.rope_base), dims / 2);
      st->rope_table.ensure(cfg.shape.max_tokens);
      st->rope.table = st->rope_table.data();
      st->rope.positions = st->rope_table.size();
      st->rope.pairs = dims / 2;
      st->rope.neox = cfg.shape.rope_neox;
    }
    st->slots = std::make_unique<SeqSlot[]>(static_cast<std::size_t>(cfg.max_sequences));
    st->free_slots.fill(cfg.max_sequences);
    return st;
  }

  PoolState() = default;
  PoolState(const PoolState&) = delete;
  PoolState& operator=(const PoolState&) = delete;
  ~PoolState() {
    if (!pool) return;
    if (slots)  // null when create() failed before allocating them
      for (int i = 0; i < cfg.max_sequences; ++i)
        if (slots[static_cast<std::size_t>(i)].is_live.load()) close(static_cast<std::uint32_t>(i));
    prefix.clear(*pool);
  }

  [[nodiscard]] std::size_t row() const noexcept {
    return static_cast<std::size_t>(cfg.shape.kv_heads) * static_cast<std::size_t>(cfg.shape.head_dim);
  }
  /// The page tables of slot s (pool/pool_swap.hpp).
  static auto tables(SeqSlot& s) noexcept {
    return PageTables{static_cast<int>(s.layers.size()), [&s](int l) -> PagedLayer& { return s.layers[static_cast<std::size_t>(l)]; }};
  }
  [[nodiscard]] bool live(SeqId id) const noexcept {
    if (id.index >= static_cast<std::uint32_t>(cfg.max_sequences)) return false;
    return slots[id.index].names(id);
  }

  /// A sequence's layers before they enter a slot (create_sequence, fork): all of their memory is
  /// allocated before a slot is taken, so a std::bad_alloc leaves the pool as it was. Rows held
  /// are zeroed when the layers are dropped unused; page ids in them hold no reference.
  struct NewLayers {
    std::vector<PagedLayer> v;
    NewLayers() = default;
    NewLayers(const NewLayers&) = delete;
    NewLayers& operator=(const NewLayers&) = delete;
    ~NewLayers() {
      for (PagedLayer& L : v) L.wipe();
    }
  };
  /// Empty layers of this pool's shape. May throw std::bad_alloc.
  void make_layers(NewLayers& out) const {
    out.v.resize(static_cast<std::size_t>(cfg.shape.layers));
    for (PagedLayer& L : out.v) {
      L.pages.resize(static_cast<std::size_t>(cfg.shape.kv_heads));
      L.pend.configure(row(), 0);
      L.hist.configure(row(), 0);
    }
  }

  /// Takes a free slot and moves `layers` into it (allocates nothing). Errc::capacity_exceeded
  /// when max_sequences are live (layers left to the caller then).
  Result<SeqId> open(const char* what, NewLayers& layers) {
    auto taken = free_slots.take(what, cfg.max_sequences);
    if (!taken) return taken.error();
    const std::uint32_t i = *taken;
    SeqSlot& s = slots[i];
    s.layers.swap(layers.v);  // the slot's old (wiped) layers go back to `layers`
    return s.publish(i);
  }

  /// A new sequence sharing every page of `parent` (PagedCache::fork): its fp32 rows and position
  /// runs are copied before a slot is taken; then the pages gain a reference (allocates nothing).
  Result<SeqId> fork(const SeqSlot& parent) {
    NewLayers layers;
    make_layers(layers);
    for (std::size_t l = 0; l < layers.v.size(); ++l) copy_exact(parent.layers[l], layers.v[l]);
    auto id = open("fork", layers);
    if (!id) return id;
    for (const auto& L : slots[id->index].layers)
      for (const auto& table : L.pages)
        for (const std::uint32_t pg : table) pool->retain(pg);
    return id;
  }

  /// Releases slot i: its pages lose a reference (the copies of swapped-out pages are erased),
  /// its rows are zeroed, its handle goes stale.
  void close(std::uint32_t i) {
    SeqSlot& s = slots[i];
    drop_swapped(tables(s), s, SeqId{i, s.generation.load(std::memory_order_acquire)});
    s.retire();
    for (PagedLayer& L : s.layers) {
      for (const auto& table : L.pages)
        for (const std::uint32_t p : table) pool->release(p);
      L.wipe();
    }
    s.stage.wipe();
    free_slots.give_back(i);
  }

  Status truncate(SeqSlot& s, std::int64_t n) {
    std::size_t need = 0;
    for (std::size_t l = 0; l < s.layers.size(); ++l) {
      const PagedLayer& L = s.layers[l];
      const std::string at = "truncate: layer " + std::to_string(l);
      if (n < 0 || n > L.total)
        return fail(Errc::invalid_argument, at + " holds " + std::to_string(L.total) + " tokens; cannot truncate to " +
                                                std::to_string(n) + " (past the start or the end)");
      if (L.total - n > cfg.max_rollback_tokens)
        return fail(Errc::unsupported, at + ": dropping " + std::to_string(L.total - n) + " tokens exceeds max_rollback_tokens = " +
                                           std::to_string(cfg.max_rollback_tokens));
      if (!can_truncate(L, n, S, R, U))
        return fail(Errc::unsupported, at + ": the rollback copies do not reach back to token " + std::to_string(n) +
                                           " (tokens attached from the prefix cache cannot be rolled back)");
      need += pages_for_truncate(L, *pool, n, S, R, U, layout.tokens);
    }
    // Every allocation first (the new pending rows of every layer, the spare list), then the cut.
    std::vector<TruncatedRows> rows;
    rows.reserve(s.layers.size());
    for (const PagedLayer& L : s.layers) rows.push_back(truncated_rows(L, row(), n, S, R, U));
    SparePages spare(*pool);
    if (Status t = pool->take(need, spare.pages, "truncate"); !t) return t;
    for (std::size_t l = 0; l < s.layers.size(); ++l)
      pool_detail::truncate(s.layers[l], *pool, layout, row(), n, S, R, U, spare.pages, std::move(rows[l]));
    return {};
  }

  // Full blocks committed in every layer.
  [[nodiscard]] static std::int64_t full_blocks(const SeqSlot& s, int B) noexcept {
    std::int64_t m = std::numeric_limits<std::int64_t>::max();
    for (const PagedLayer& L : s.layers) m = std::min(m, L.committed / B);
    return m;
  }

  // Only pages whose tokens sit at positions equal to their indices (a prompt fed from position 0)
  // are published: an attaching sequence gets those positions (post-RoPE keys depend on them).
  std::int64_t publish(SeqSlot& s, std::string_view model_id, std::span<const std::int32_t> tokens) {
    const int B = layout.tokens;
    std::int64_t m = std::min(full_blocks(s, B), static_cast<std::int64_t>(tokens.size()) / B);
    for (const PagedLayer& L : s.layers) m = std::min(m, L.block_pos.leading_indices() / B);
    std::uint64_t key = PrefixCache::root(model_id, Codec::format_id(), B, cfg.shape.head_dim, cfg.shape.layers, cfg.shape.kv_heads);
    std::int64_t added = 0;
    std::vector<std::uint32_t> pages;
    for (std::int64_t k = 0; k < m; ++k) {
      const auto blk = tokens.subspan(static_cast<std::size_t>(k * B), static_cast<std::size_t>(B));
      const std::uint64_t next = PrefixCache::next(key, blk);
      pages.clear();
      for (const PagedLayer& L : s.layers)
        for (const auto& table : L.pages) pages.push_back(table[static_cast<std::size_t>(k)]);
      added += prefix.publish(*pool, next, key, blk, pages);
      key = next;
    }
    return added;
  }

  Result<std::int64_t> attach(SeqSlot& s, std::string_view model_id, std::span<const std::int32_t> prompt) {
    for (const PagedLayer& L : s.layers)
      if (L.total != 0) return fail(Errc::invalid_argument, "attach_prefix: the sequence is not empty");
    const int B = layout.tokens;
    const std::int64_t m_max = commit_count(static_cast<std::int64_t>(prompt.size()), R, U) / B;
    std::uint64_t key = PrefixCache::root(model_id, Codec::format_id(), B, cfg.shape.head_dim, cfg.shape.layers, cfg.shape.kv_heads);
    const std::size_t per_block = s.layers.size() * static_cast<std::size_t>(cfg.shape.kv_heads);
    // Room first (page tables for m_max blocks): after the lookup, nothing allocates. Found pages
    // are retained as found; `found` releases them if an allocation fails before they are placed.
    for (PagedLayer& L : s.layers) {
      for (auto& table : L.pages) table.reserve(static_cast<std::size_t>(m_max));
      L.block_pos.reserve_runs(1);
    }
    SparePages found(*pool);
    auto& pages = found.pages;  // [block][layer][kv_head]
    pages.reserve(static_cast<std::size_t>(m_max) * per_block);
    std::int64_t m = 0;
    for (; m < m_max; ++m) {
      const auto blk = prompt.subspan(static_cast<std::size_t>(m * B), static_cast<std::size_t>(B));
      const std::uint64_t next = PrefixCache::next(key, blk);
      if (!prefix.find(*pool, next, key, blk, pages)) break;
      key = next;
    }
    for (std::int64_t k = 0; k < m; ++k)
      for (std::size_t l = 0; l < s.layers.size(); ++l)
        for (int h = 0; h < cfg.shape.kv_heads; ++h)
          s.layers[l].pages[static_cast<std::size_t>(h)].push_back(
              pages[static_cast<std::size_t>(k) * per_block + l * static_cast<std::size_t>(cfg.shape.kv_heads) + static_cast<std::size_t>(h)]);
    pages.clear();  // now held by the page tables
    for (PagedLayer& L : s.layers) {
      L.total = L.committed = m * B;
      L.block_pos.push_consecutive(0, m * B);  // as published: positions = indices (reserved above)
    }
    return m * B;
  }

  /// Appends full pages given as payload bytes ([page][layer][kv_head][layout.bytes]) to a
  /// sequence holding only whole committed pages; all or nothing (see PagedCache::import_pages).
  Result<std::int64_t> import_pages(SeqSlot& s, std::span<const std::byte> payloads) {
    const auto bad = [](const std::string& m) { return fail(Errc::invalid_argument, "import_pages: " + m); };
    const int B = layout.tokens;
    const std::size_t heads = static_cast<std::size_t>(cfg.shape.kv_heads), per_page = s.layers.size() * heads;
    if (payloads.size() % (per_page * layout.bytes) != 0)
      return bad(std::to_string(payloads.size()) + " bytes is not a whole number of pages of layers * kv_heads * " +
                 std::to_string(layout.bytes) + " bytes");
    const auto n = static_cast<std::int64_t>(payloads.size() / (per_page * layout.bytes));
    const std::int64_t have = s.layers[0].total;
    for (std::size_t l = 0; l < s.layers.size(); ++l) {
      const PagedLayer& L = s.layers[l];
      if (L.total != have || L.committed != L.total || L.total % B != 0 || !L.pend.empty() || L.sinks_held != 0)
        return bad("layer " + std::to_string(l) + " holds " + std::to_string(L.total) + " tokens, " +
                   std::to_string(L.committed) + " committed: the sequence must hold whole pages only, the same in every layer");
    }
    if (n == 0) return have;
    if (have + n * B > cfg.shape.max_tokens)
      return fail(Errc::capacity_exceeded, "import_pages: " + std::to_string(have + n * B) + " tokens exceed max_tokens = " +
                                               std::to_string(cfg.shape.max_tokens));
    for (PagedLayer& L : s.layers) {
      for (auto& table : L.pages) reserve_geometric(table, table.size() + static_cast<std::size_t>(n));
      L.block_pos.reserve_runs(1);
    }
    SparePages taken(*pool);  // released if anything below throws (nothing does after the take)
    std::vector<std::uint32_t>& fresh = taken.pages;
    if (Status t = pool->take(static_cast<std::size_t>(n) * per_page, fresh, "import_pages"); !t) return t.error();
    std::size_t i = 0;
    for (std::int64_t k = 0; k < n; ++k)
      for (PagedLayer& L : s.layers)
        for (std::size_t h = 0; h < heads; ++h, ++i) {
          const std::uint32_t pg = fresh[i];
          std::memcpy(pool->data(pg), payloads.data() + i * layout.bytes, layout.bytes);
          pool->header(pg).count = static_cast<std::uint16_t>(B);
          pool->header(pg).version = 1;
          L.pages[h].push_back(pg);
        }
    fresh.clear();  // now held by the page tables
    for (PagedLayer& L : s.layers) {
      L.block_pos.push_consecutive(static_cast<std::int32_t>(have), n * B);  // positions = cache indices (reserved)
      L.total = L.committed = have + n * B;
      for (auto* v : {&L.chunk_k, &L.chunk_v}) detail::wipe_vector(*v);  // the latest append is not the newest any more
      detail::wipe_vector(L.chunk_pos);
      L.chunk_tokens = 0;
      L.hist.wipe();  // rollback copies would not be the newest tokens: no truncate below this point
    }
    return have + n * B;
  }

  [[nodiscard]] PoolStats stats(bool list_sequences = true) const {
    PoolStats st;
    st.page_bytes = pool->stride();
    st.pages_total = pool->pages();
    st.pages_free = pool->free_pages();
    st.pages_used = st.pages_total - st.pages_free;
    st.pages_shared = pool->shared_pages();
    st.prefix_pages = prefix.page_refs();
    st.prefix_entries = prefix.entries();
    st.budget_bytes = cfg.byte_budget;
    st.bytes_used = st.pages_used * st.page_bytes;
    st.bytes_free = st.pages_free * st.page_bytes;
    st.overhead_bytes = st.pages_total * PagePool::overhead_per_page + rope_table.bytes();  // + a PreRope<> pool's table
    for (int i = 0; i < cfg.max_sequences; ++i) {
      const SeqSlot& s = slots[static_cast<std::size_t>(i)];
      if (!s.is_live.load(std::memory_order_acquire)) continue;
      SequenceStats q;
      q.id = {static_cast<std::uint32_t>(i), s.generation.load(std::memory_order_acquire)};
      q.tokens = s.layers.empty() ? 0 : s.layers[0].total;
      for (const PagedLayer& L : s.layers) {
        for (const auto& t : L.pages) q.pages += t.size();
        q.exact_bytes += L.exact_bytes(row());
      }
      q.swapped_pages = s.swapped_pages;
      q.pages -= s.swapped_pages;
      st.pages_swapped += s.swapped_pages;
      st.bytes_if_unshared += q.pages * st.page_bytes;
      st.exact_bytes += q.exact_bytes;
      if (list_sequences) st.sequences.push_back(q);  // the only allocation
    }
    return st;
  }
};

}  // namespace kvpack::pool_detail
