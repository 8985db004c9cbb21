// EvictPoolState: what an EvictingPagedCache (pool/paged_eviction.hpp) owns: configuration,
// page arena and sequence slots (each holding its sequence: store, hook, scratch), with opening
// and closing slots and the statistics. Seq: the facade's sequence type, constructible from
// (PagePool&, const ModelShape&, const BlockLayout&), with a `store` (PagedEvictStore).
#pragma once

#include <algorithm>
#include <atomic>
#include <cstddef>
#include <cstdint>
#include <memory>
#include <mutex>
#include <string>
#include <vector>

#include "kvpack/cache/block.hpp"
#include "kvpack/cache/shape.hpp"
#include "kvpack/pool/page_pool.hpp"
#include "kvpack/pool/pool_swap.hpp"
#include "kvpack/pool/pool_types.hpp"
#include "kvpack/pool/slot_handles.hpp"
#include "kvpack/result.hpp"

namespace kvpack::pool_detail {

/// Configuration, arena and slots of an evicting pool; members in this order so that the slots
/// (their page references) go before the arena.
template <class Seq>
struct EvictPoolState {
  /// A sequence slot: its handle (pool/slot_handles.hpp), swap state (pool/pool_swap.hpp) and the
  /// sequence (null when free).
  struct Slot : SlotHandle, SwapState {
    std::unique_ptr<Seq> seq;
  };
  PoolConfig cfg;
  BlockLayout layout;
  std::unique_ptr<PagePool> pool;
  std::unique_ptr<Slot[]> slots;
  SlotFreeList free_slots;

  /// The state of a pool for `cfg` (the facade's create checks the shape and budget first): pages
  /// of KVCache's block layout for codecs Codec and B tokens. May throw std::bad_alloc.
  template <class Codec>
  static Result<std::unique_ptr<EvictPoolState>> create(const PoolConfig& cfg, int B) {
    if (cfg.max_sequences < 1 || cfg.max_rollback_tokens < 0)
      return fail(Errc::invalid_argument, "PagedCache::create: max_sequences must be >= 1 and max_rollback_tokens >= 0");
    auto st = std::make_unique<EvictPoolState>();
    st->cfg = cfg;
    st->layout = make_block_layout<typename Codec::key_codec, typename Codec::value_codec, false>(B, cfg.shape.head_dim);
    auto pool = PagePool::create(st->layout.bytes, cfg.byte_budget, Codec::header(cfg.shape.head_dim));
    if (!pool) return pool.error();
    st->pool = std::move(pool.value());
    st->slots = std::make_unique<Slot[]>(static_cast<std::size_t>(cfg.max_sequences));
    st->free_slots.fill(cfg.max_sequences);
    return st;
  }
  ~EvictPoolState() {
    if (slots)
      for (int i = 0; i < cfg.max_sequences; ++i) {
        Slot& s = slots[static_cast<std::size_t>(i)];
        if (!s.seq) continue;
        drop_swapped(tables(s), s, SeqId{static_cast<std::uint32_t>(i), s.generation.load(std::memory_order_acquire)});
        s.seq.reset();  // releases pages
      }
  }
  /// The page tables of slot s's sequence (pool/pool_swap.hpp).
  static auto tables(Slot& s) noexcept {
    return PageTables{s.seq->store.layers(), [&s](int l) -> auto& { return s.seq->store.layer(l); }};
  }
  /// Whether `id` names a live sequence (index in range, slot live, same generation).
  [[nodiscard]] bool live(SeqId id) const noexcept {
    if (id.index >= static_cast<std::uint32_t>(cfg.max_sequences)) return false;
    return slots[id.index].names(id);
  }
  /// An empty sequence of this pool, not yet in a slot. May throw std::bad_alloc.
  [[nodiscard]] std::unique_ptr<Seq> make_seq() { return std::make_unique<Seq>(*pool, cfg.shape, layout); }
  /// Takes a free slot and moves `seq` (made by make_seq, filled before: every allocation is done
  /// before a slot is taken) into it; allocates nothing. Errc::capacity_exceeded when none is
  /// free (`seq` is dropped then: its page references released, its rows zeroed).
  Result<SeqId> open(const char* what, std::unique_ptr<Seq> seq) {
    auto taken = free_slots.take(what, cfg.max_sequences);
    if (!taken) return taken.error();
    const std::uint32_t i = *taken;
    Slot& s = slots[i];
    s.seq = std::move(seq);
    return s.publish(i);
  }
  /// Releases slot i: the handle goes stale, the sequence's pages lose a reference, rows are zeroed.
  void close(std::uint32_t i) {
    Slot& s = slots[i];
    drop_swapped(tables(s), s, SeqId{i, s.generation.load(std::memory_order_acquire)});  // copies erased
    s.retire();
    s.seq.reset();  // pages lose a reference, rows zeroed
    free_slots.give_back(i);
  }
  /// Takes the pages layer `layer` of sequence q may need (its store's pages_bound; `compacts`:
  /// a compaction into fresh pages may follow), runs `op` with them as the store's spares, and
  /// returns the rest: all or none (Errc::capacity_exceeded naming `what` when short). If op
  /// throws, the pages not used go back to the pool (SparePages) and the store forgets them.
  template <class Op>
  Status with_pages(Seq& q, int layer, bool compacts, const char* what, Op&& op) {
    SparePages spare(*pool);
    const std::size_t need = q.store.pages_bound(layer, q.store.layer(layer).pend.size(), compacts);
    if (Status t = pool->take(need, spare.pages, what); !t) return t;
    std::reverse(spare.pages.begin(), spare.pages.end());  // popped from the back: new pages ascend in memory
    q.store.set_spare(&spare.pages);
    struct Unset {
      decltype(q.store)& s;
      ~Unset() { s.set_spare(nullptr); }
    } unset{q.store};
    return op();
  }
  /// A snapshot of pool use (no prefix cache here: prefix fields stay 0).
  [[nodiscard]] PoolStats stats(bool list_sequences = true) const {
    PoolStats st;
    st.page_bytes = pool->stride(), st.pages_total = pool->pages(), st.pages_free = pool->free_pages();
    st.pages_used = st.pages_total - st.pages_free, st.pages_shared = pool->shared_pages();
    st.budget_bytes = cfg.byte_budget;
    st.bytes_used = st.pages_used * st.page_bytes, st.bytes_free = st.pages_free * st.page_bytes;
    st.overhead_bytes = st.pages_total * PagePool::overhead_per_page;
    for (int i = 0; i < cfg.max_sequences; ++i) {
      const Slot& s = slots[static_cast<std::size_t>(i)];
      if (!s.is_live.load(std::memory_order_acquire)) continue;
      SequenceStats q;
      q.id = {static_cast<std::uint32_t>(i), s.generation.load(std::memory_order_acquire)};
      q.tokens = s.seq->store.layer(0).total;
      for (int l = 0; l < cfg.shape.layers; ++l)
        for (const auto& t : s.seq->store.layer(l).pages) q.pages += t.size();
      q.exact_bytes = s.seq->store.exact_bytes();
      for (int l = 0; l < cfg.shape.layers; ++l)  // the policy's own per-head state (BlockSparse's block bits)
        for (int h = 0; h < cfg.shape.kv_heads; ++h) q.exact_bytes += s.seq->hook.extra_bytes(l, h);
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
