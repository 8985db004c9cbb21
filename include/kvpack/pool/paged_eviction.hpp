// EvictingPagedCache<Policy...>: the PagedCache of an evicting policy set (SinkWindow, H2O, SnapKV, BlockSparse,
// TOVA and their Budget forms; PagedCache<...> names it, pool/paged_cache.hpp). Each sequence slot
// holds its store (pool/evicting_store.hpp: slots over pool pages), its own eviction hook (scores
// live in the store's slots and pending rows; H2O's mass, SnapKV's observation window, SinkWindow's
// FIFO and resolved budgets in the hook) and a scratch Workspace for the hook's own scoring. The
// token lifecycle, hook calls and kernel calls are KVCache's (kv_cache.hpp, cache/append_tokens.hpp)
// in the same order, so a pool sequence and a KVCache<same policies> fed the same appends and
// attends hold the same slots and codes and attend bit-identically (tests/test_pool_evict.cpp).
// A failed allocation is Errc::out_of_memory with nothing changed (tests/test_alloc_fault_pool.cpp),
// except in SnapKV's prompt compression (append's first single token, compress_prompt), which
// allocates as it compacts and is not rolled back, as in KVCache (cache/append_tokens.hpp).
// DESIGN.md "Paged pool".
#pragma once

#include <algorithm>
#include <atomic>
#include <cstddef>
#include <cstdint>
#include <limits>
#include <memory>
#include <mutex>
#include <span>
#include <string>
#include <vector>

#include "kvpack/cache/alloc_guard.hpp"
#include "kvpack/cache/workspace.hpp"
#include "kvpack/executor.hpp"
#include "kvpack/kv_cache.hpp"
#include "kvpack/pool/evicting_attend.hpp"
#include "kvpack/pool/evicting_pool_state.hpp"
#include "kvpack/pool/evicting_read_back.hpp"
#include "kvpack/pool/evicting_store.hpp"
#include "kvpack/pool/page_pool.hpp"
#include "kvpack/pool/pool_checks.hpp"
#include "kvpack/pool/pool_types.hpp"

namespace kvpack {

/// Many evicting sequences in one page pool (PagedCache<...> with an eviction policy: SinkWindow,
/// H2O, SnapKV, TOVA, their Budget / Protocol forms, BlockSparse, whose victim block is a page
/// that leaves the table at once, back to the pool unless a fork shares it). Compile errors, each
/// a readable static_assert: Demote<> (a low tier outside the arena), Offload<>, Keyframe<> codecs.
///
/// Differences from the non-evicting pool: attend and attend_batch update the sequence's scores
/// (non-const, as KVCache::attend); truncate is Errc::unsupported (eviction already dropped
/// tokens and folded attention into scores: no earlier state can be rebuilt); no prefix cache,
/// or page import (Errc::unsupported / absent). Fork shares every page;
/// an append or compress_prompt copies a shared page before writing or zeroing a slot in it.
/// Thread safety as PagedCache: calls on different sequences may run concurrently; calls on the
/// same sequence must not overlap (attend writes scores).
template <class... Policies>
class EvictingPagedCache {
  using single = KVCache<Policies...>;

 public:
  using codec_hook = typename single::codec_hook;        ///< as KVCache<Policies...>
  using eviction_hook = typename single::eviction_hook;  ///< the policy's hook, one per sequence
  static constexpr int sink_tokens = single::sink_tokens;
  static constexpr int residual_tokens = single::residual_tokens;
  static constexpr int block_tokens = single::block_tokens;
  static constexpr int commit_unit = codec_hook::commit_unit;
  static constexpr double key_bits_per_value = single::key_bits_per_value;
  static constexpr double value_bits_per_value = single::value_bits_per_value;
  static_assert(single::evicts, "kvpack::EvictingPagedCache<...>: needs an eviction policy (use PagedCache<...>)");
  static_assert(!single::demotes, "kvpack::PagedCache<...>: Demote<> is not supported on the page pool yet");
  static_assert(!single::offloads && !single::pre_rope,
                "kvpack::PagedCache<...>: Offload<> and PreRope<> with eviction are not supported on the page pool yet");
  static_assert(!codec_hook::interval_blocks && commit_unit == 1,
                "kvpack::PagedCache<...>: Keyframe<...> codecs are not supported on the page pool yet");
  /// One sequence's storage (pool/evicting_store.hpp).
  using store_type = pool_detail::PagedEvictStore<codec_hook, sink_tokens, residual_tokens>;

  /// Creates a pool: the page arena (PoolConfig::byte_budget), room for max_sequences handles.
  /// Errc::invalid_argument: a bad shape or an eviction budget it cannot hold (as KVCache::create),
  /// max_sequences < 1, max_rollback_tokens < 0 (unused: no rollback), a budget below one page;
  /// Errc::capacity_exceeded when the arena cannot be allocated; Errc::out_of_memory when the
  /// page headers, reference counts, free list or slots cannot be (nothing is kept).
  [[nodiscard]] static Result<EvictingPagedCache> create(const PoolConfig& cfg) {
    return catch_alloc("PagedCache::create", 0, [&]() -> Result<EvictingPagedCache> {
      if (Status s = validate_shape(cfg.shape, codec_hook::K::row_group, codec_hook::V::row_group); !s) return s.error();
      if (Status s = eviction_hook::check(cfg.shape); !s) return s.error();
      auto st = State::template create<codec_hook>(cfg, block_tokens);
      if (!st) return st.error();
      return Result<EvictingPagedCache>(EvictingPagedCache(std::move(st.value())));
    });
  }

  /// Moves the pool (sequences, pages); the moved-from one answers every call with invalid_argument.
  EvictingPagedCache(EvictingPagedCache&&) noexcept = default;
  EvictingPagedCache& operator=(EvictingPagedCache&&) noexcept = default;
  ~EvictingPagedCache() = default;  // State releases and zeroes everything

  /// A new empty sequence. Errc::capacity_exceeded when max_sequences are live;
  /// Errc::out_of_memory when it cannot be allocated (before a slot is taken: nothing changed).
  [[nodiscard]] Result<SeqId> create_sequence() {
    if (!st_) return moved("create_sequence");
    return catch_alloc("create_sequence", 0, [&] { return st_->open("create_sequence", st_->make_seq()); });
  }
  /// A new sequence equal to `parent`: its pages shared (copy-on-write), its fp32 rows, slot
  /// bookkeeping, scores and eviction state (hook) copied, so each side then evicts by its own
  /// history. Errors: stale handle (invalid_argument), max_sequences live (capacity_exceeded),
  /// the copies cannot be allocated (out_of_memory: made before a slot is taken, nothing changed).
  [[nodiscard]] Result<SeqId> fork(SeqId parent) {
    auto p = find(parent, "fork");
    if (!p) return p.error();
    return catch_alloc("fork", 0, [&]() -> Result<SeqId> {
      std::unique_ptr<Seq> c = st_->make_seq();  // dropped on any failure: references released, rows zeroed
      c->store.share_from((*p)->store);
      c->hook = (*p)->hook;
      return st_->open("fork", std::move(c));
    });
  }
  /// Frees a sequence (pages lose a reference, rows zeroed, handle stale). Errc::invalid_argument: stale.
  Status free_sequence(SeqId id) {
    auto s = find(id, "free_sequence", true);
    if (!s) return s.error();
    st_->close(id.index);
    return {};
  }
  /// Whether `id` names a live sequence of this pool.
  [[nodiscard]] bool valid(SeqId id) const noexcept { return st_ && st_->live(id); }
  /// Tokens appended to layer 0 (evicted ones included). Errc::invalid_argument: stale handle.
  [[nodiscard]] Result<std::int64_t> length(SeqId id) const { return tokens(id, 0); }
  /// Tokens appended to `layer` (evicted ones included). Errc::invalid_argument: stale handle, bad layer.
  [[nodiscard]] Result<std::int64_t> tokens(SeqId id, int layer) const {
    auto s = find(id, "tokens", true);
    if (!s) return s.error();
    if (Status c = check_layer("tokens", layer); !c) return c.error();
    return (*s)->store.layer(layer).total;
  }
  /// Tokens KV head `kv_head` of `layer` holds now (sinks + live slots + pending), as
  /// KVCache::held_tokens. Errc::invalid_argument: stale handle, indices out of range.
  [[nodiscard]] Result<std::int64_t> held_tokens(SeqId id, int layer, int kv_head) const {
    auto s = find(id, "held_tokens", true);
    if (!s) return s.error();
    if (Status c = check_head("held_tokens", layer, kv_head); !c) return c.error();
    const auto& L = (*s)->store.layer(layer);
    return L.sinks_held + L.heads[static_cast<std::size_t>(kv_head)].live + L.pend.size();
  }
  /// The sequence's eviction budget in tokens per (layer, KV head), as KVCache::eviction_budget.
  [[nodiscard]] Result<std::int64_t> eviction_budget(SeqId id) const {
    auto s = find(id, "eviction_budget", true);
    if (!s) return s.error();
    return (*s)->hook.budget();
  }

  /// Swap-out and swap-in as PagedCache's (pool/paged_cache.hpp: preemption by swapping; pages held
  /// alone go to `target`, shared ones stay; fp32 rows, slot bookkeeping, scores and the policy's
  /// state stay in memory; the same errors), so a sequence swapped back in evicts and attends as
  /// one never swapped.
  Result<std::size_t> swap_out(SeqId id, PageSwapTarget& target) {
    auto s = find(id, "swap_out");
    if (!s) return s.error();
    Slot& slot = st_->slots[id.index];
    return catch_alloc("swap_out", 0, [&] { return pool_detail::swap_out(*st_->pool, st_->layout, State::tables(slot), slot, id, target); });
  }
  Result<std::size_t> swap_in(SeqId id) {
    auto s = find(id, "swap_in", true);
    if (!s) return s.error();
    Slot& slot = st_->slots[id.index];
    return catch_alloc("swap_in", 0, [&] {
      return pool_detail::swap_in(*st_->pool, st_->layout, codec_hook::header(shape().head_dim), State::tables(slot), slot, id);
    });
  }
  [[nodiscard]] Result<bool> swapped_out(SeqId id) const {
    auto s = find(id, "swapped_out", true);
    if (!s) return s.error();
    return st_->slots[id.index].swapped_to != nullptr;
  }

  /// Rollback is not available with eviction: always Errc::unsupported for a live sequence
  /// (Errc::invalid_argument for a stale one), nothing changed. Eviction may already have dropped
  /// tokens older than the cut (slots zeroed and reused) and folded the dropped tokens' attention
  /// into the survivors' scores and the policy state, so the state before them cannot be rebuilt.
  /// Errc::out_of_memory when even that message cannot be allocated (nothing changed either way).
  Status truncate(SeqId id, std::int64_t new_length) {
    auto s = find(id, "truncate");
    if (!s) return s.error();
    return catch_alloc("truncate", 0, [&]() -> Status {
      return fail(Errc::unsupported, "truncate to " + std::to_string(new_length) +
                                         ": not available with an eviction policy (eviction already dropped tokens and "
                                         "folded attention into scores, which cannot be undone)");
    });
  }

  /// Appends n = positions.size() tokens to `layer`, as KVCache::append (k, v: [n][kv_heads][head_dim]
  /// float32, keys post-RoPE; positions [n]): the policy's before_append (SnapKV compresses the
  /// prompt on the first single-token append), the lazy commit of the previous chunk with eviction,
  /// the push, the budget enforced. Pages: every page the append may need (a copy of each shared
  /// page of the layer, the slots' growth, SnapKV's compaction) is taken first, all or none.
  /// Errors, with nothing changed: stale handle, bad layer, wrong sizes, a negative position
  /// (Errc::invalid_argument); more than max_tokens held after eviction, more than 2^31 - 1 seen,
  /// or the page pool short of pages (Errc::capacity_exceeded, naming pages needed and free);
  /// NaN/Inf (Errc::non_finite); SnapKV's prompt never attended (Errc::invalid_argument);
  /// Errc::out_of_memory when rows, page tables or slot bookkeeping cannot grow (reserved before
  /// any change, pages taken returned: nothing changed), except during SnapKV's prompt compression
  /// on the first single-token append, which allocates as it compacts and cannot be rolled back
  /// (the sequence is then consistent but may be partly compressed). n = 0: no-op.
  Status append(SeqId id, int layer, std::span<const float> k, std::span<const float> v,
                std::span<const std::int32_t> positions) {
    auto s = find(id, "append");
    if (!s) return s.error();
    if (Status c = check_layer("append", layer); !c) return c;
    Seq& q = **s;
    auto& L = q.store.layer(layer);
    const auto n = static_cast<std::int64_t>(positions.size());
    const std::string at = "append: layer " + std::to_string(layer);
    if (k.size() != static_cast<std::size_t>(n) * q.store.row_floats() || v.size() != k.size())
      return fail(Errc::invalid_argument, at + ": k has " + std::to_string(k.size()) + " and v " + std::to_string(v.size()) +
                                              " floats; expected n_tokens * kv_heads * head_dim");
    if (n == 0) return {};
    if (const std::int64_t bound = q.hook.held_after(q.store, layer, n); bound > shape().max_tokens)
      return fail(Errc::capacity_exceeded, at + ": " + std::to_string(n) + " more tokens (up to " + std::to_string(bound) +
                                               " held after eviction) exceed max_tokens = " + std::to_string(shape().max_tokens));
    if (L.total + n > std::numeric_limits<std::int32_t>::max())
      return fail(Errc::capacity_exceeded, at + " has seen " + std::to_string(L.total) + " tokens; cache indices are int32");
    for (std::size_t t = 0; t < positions.size(); ++t)
      if (positions[t] < 0) return fail(Errc::invalid_argument, at + ": negative position at token " + std::to_string(t));
    return catch_alloc("append", 0, [&]() -> Status {
      if (Status c = q.store.stage_chunk(layer, k, v); !c) return c;  // NaN/Inf, in the copy's pass
      q.store.reserve_append(layer, n, q.hook);  // every allocation below, before any change
      return st_->with_pages(q, layer, n == 1 && compacts(q, layer), "append", [&]() -> Status {
        if (Status b = q.hook.before_append(q.store, q.ws, layer, n); !b) return b;  // fails before any change
        q.store.commit(layer, q.hook);  // lazy commit: blocks only hold tokens older than the current chunk
        q.store.push(L, k, v, positions);
        for (int h = 0; h < shape().kv_heads; ++h) q.hook.enforce(q.store, layer, h, L.pend.size());
        return {};
      });
    });
  }

  /// SnapKV and Protocol<P, ...>: ends `layer`'s prompt now (KVCache::compress_prompt), taking the
  /// pages it may need first. Errors: stale handle, bad layer, already compressed or never attended
  /// (Errc::invalid_argument); the pool short of pages (Errc::capacity_exceeded); nothing changed.
  /// Errc::out_of_memory: nothing changed (the commit is reserved first), except in SnapKV's
  /// compaction, which allocates as it goes and is NOT rolled back (consistent, possibly partly
  /// compacted; the pages taken are returned).
  Status compress_prompt(SeqId id, int layer)
    requires requires(eviction_hook& e, store_type& st, Workspace& w) { e.compress_prompt(st, w, 0); }
  {
    auto s = find(id, "compress_prompt");
    if (!s) return s.error();
    if (Status c = check_layer("compress_prompt", layer); !c) return c;
    Seq& q = **s;
    return catch_alloc("compress_prompt", 0, [&] {
      q.store.reserve_append(layer, 0, q.hook);  // the prompt's commit, before any change
      return st_->with_pages(q, layer, compacts(q, layer), "compress_prompt",
                             [&] { return q.hook.compress_prompt(q.store, q.ws, layer); });
    });
  }

  /// Attention of the last n_q tokens appended to `layer` over everything the sequence holds, as
  /// KVCache::attend (same kernel and segments: bit-identical on the same backend), then the
  /// policy's scores: the kernel's key mass (H2O, TOVA, SnapKV FixedBudget) and the queries
  /// (SnapKV's observation window), credited only when every output is finite.
  /// q, out: [n_q][q_heads][head_dim]; scratch in `ws`. Errors as KVCache::attend plus a stale
  /// handle; Errc::out_of_memory when the scratch in `ws` cannot grow (before any score changes,
  /// except SnapKV's observation window, which reserves its own room first). On error the scores
  /// are unchanged.
  Status attend(SeqId id, int layer, std::span<const float> q, std::span<float> out, Workspace& ws) {
    auto s = find(id, "attend");
    if (!s) return s.error();
    if (Status c = check_layer("attend", layer); !c) return c;
    if (Status c = pool_detail::check_queries(shape(), layer, (*s)->store.layer(layer).chunk_tokens, q, out, -1); !c) return c;
    return catch_alloc("attend", 0, [&]() -> Status {
      if (Status c = run_kernels(**s, layer, q, out, ws, ws.head_mass, -1); !c) return c;  // scores untouched
      credit(**s, layer, q, ws, ws.head_mass);
      return {};
    });
  }

  /// Batched decode: one query token for each of N = seqs.size() distinct sequences, each exactly
  /// attend() of that sequence (outputs bit-identical, scores updated the same way), W =
  /// min(N, workspaces.size()) tasks on `exec` (task w: sequences w, w + W, ... with
  /// workspaces[w]). Errors, checked before any kernel (out untouched, no score changed): stale
  /// handle, a sequence named twice (its scores would race), bad layer, sizes, non-finite q,
  /// empty workspaces; after: a non-finite output (that sequence's scores unchanged, the first
  /// such error returned), or Errc::out_of_memory when scratch cannot grow (every kernel runs
  /// before any score changes: no sequence's scores change then).
  Status attend_batch(int layer, std::span<const SeqId> seqs, std::span<const float> q, std::span<float> out,
                      const Executor& exec, std::span<Workspace> workspaces) {
    if (!st_) return moved("attend_batch");
    if (Status c = check_layer("attend_batch", layer); !c) return c;
    return catch_alloc("attend_batch", 0, [&] { return batch(layer, seqs, q, nullptr, out, exec, workspaces); });
  }
  /// The same with per-sequence additive masks, as PagedCache's (BatchMask: mask i holds one entry
  /// per token sequence i has appended to `layer`, evicted ones included, by cache index; the
  /// kernels add a held slot's entry through BlockRef::slot_index). The scores the policy keeps
  /// (H2O/TOVA key mass) are of the masked attention, as the model saw it. Errors: those above
  /// and PagedCache's mask errors (lengths, NaN/+inf, all -inf), checked before any kernel.
  Status attend_batch(int layer, std::span<const SeqId> seqs, std::span<const float> q, const BatchMask& masks,
                      std::span<float> out, const Executor& exec, std::span<Workspace> workspaces) {
    if (!st_) return moved("attend_batch");
    if (Status c = check_layer("attend_batch", layer); !c) return c;
    return catch_alloc("attend_batch", 0, [&] { return batch(layer, seqs, q, &masks, out, exec, workspaces); });
  }

 private:
  // attend_batch after the layer check; may throw std::bad_alloc before any score changes.
  Status batch(int layer, std::span<const SeqId> seqs, std::span<const float> q, const BatchMask* masks,
               std::span<float> out, const Executor& exec, std::span<Workspace> workspaces) {
    const std::size_t N = seqs.size(), qrow = static_cast<std::size_t>(shape().q_heads) * static_cast<std::size_t>(shape().head_dim);
    if (Status c = pool_detail::check_batch_sizes(N, qrow, q.size(), out.size(), workspaces.size()); !c) return c;
    std::vector<Seq*> S(N);
    for (std::size_t i = 0; i < N; ++i) {
      auto s = find(seqs[i], "attend_batch");
      if (!s) return fail(s.error().code, s.error().message + " (sequence " + std::to_string(i) + " of the batch)");
      S[i] = *s;
      for (std::size_t j = 0; j < i; ++j)
        if (S[j] == S[i])
          return fail(Errc::invalid_argument, "attend_batch: sequence " + std::to_string(i) + " repeats sequence " +
                                                  std::to_string(j) + " (an evicting sequence updates its scores)");
      if (Status c = pool_detail::check_queries(shape(), layer, S[i]->store.layer(layer).chunk_tokens, q.subspan(i * qrow, qrow),
                                                out.subspan(i * qrow, qrow), static_cast<std::int64_t>(i));
          !c)
        return c;
    }
    if (masks) {
      std::vector<std::int64_t> tokens(N);
      for (std::size_t i = 0; i < N; ++i) tokens[i] = S[i]->store.layer(layer).total;
      if (Status c = pool_detail::check_masks(layer, *masks, tokens); !c) return c;
    }
    const int W = static_cast<int>(std::min(N, workspaces.size()));
    // Every kernel first (all the allocation: scratch, key masses: sequence i's in workspaces[i % W]
    // .batch_mass[i / W]), each task catching its std::bad_alloc; scores only if none failed so.
    std::vector<Status> res(N);
    const auto Wz = static_cast<std::size_t>(W);
    auto mass_of = [&](std::size_t i) -> std::vector<std::vector<float>>& { return workspaces[i % Wz].batch_mass[i / Wz]; };
    auto task = [&](int w) {
      Workspace& ws = workspaces[static_cast<std::size_t>(w)];
      for (std::size_t i = static_cast<std::size_t>(w); i < N; i += Wz)
        res[i] = catch_alloc("attend_batch", 0, [&] {
          if (ws.batch_mass.size() <= i / Wz) ws.batch_mass.resize(i / Wz + 1);
          return run_kernels(*S[i], layer, q.subspan(i * qrow, qrow), out.subspan(i * qrow, qrow), ws, mass_of(i),
                             static_cast<std::int64_t>(i), masks ? masks->values.data() + masks->offsets[i] : nullptr);
        });
    };
    pool_detail::run_tasks(W, exec, task);
    for (Status& r : res)
      if (!r && r.error().code == Errc::out_of_memory) return r;
    for (std::size_t i = 0; i < N; ++i)  // the workspace that ran sequence i: its refs have the room
      if (res[i]) credit(*S[i], layer, q.subspan(i * qrow, qrow), workspaces[i % Wz], mass_of(i));
    for (Status& r : res)
      if (!r) return r;
    return {};
  }

 public:
  /// The page table of (layer, kv_head) of a sequence, oldest page first (slot s in page s / B).
  /// Errc::invalid_argument: stale handle or indices out of range; Errc::out_of_memory.
  [[nodiscard]] Result<std::vector<PageView>> pages(SeqId id, int layer, int kv_head) const {
    return inspect<std::vector<PageView>>(id, layer, kv_head, "pages", [&](const Seq& q) {
      std::vector<PageView> v;
      for (const std::uint32_t p : q.store.layer(layer).pages[static_cast<std::size_t>(kv_head)])
        v.push_back({p, st_->pool->data(p), st_->pool->header(p), st_->pool->refs(p)});
      return v;
    });
  }
  /// Decodes what (layer, kv_head) of the sequence holds as attention reads it (the latest append
  /// aside), sorted by cache index: as KVCache::read_back of the same policies (bit-identical).
  /// Errc::invalid_argument: stale handle or indices out of range; Errc::out_of_memory.
  [[nodiscard]] Result<HeadContents> read_back(SeqId id, int layer, int kv_head) const {
    return inspect<HeadContents>(id, layer, kv_head, "read_back",
                                 [&](const Seq& q) { return pool_detail::evicting_read_back(q.store, layer, kv_head); });
  }
  /// The cache index each slot of (layer, kv_head) holds (-1: free), slot order (HeadStore::slot_token).
  /// Errc::invalid_argument: stale handle or indices out of range; Errc::out_of_memory.
  [[nodiscard]] Result<std::vector<std::int32_t>> slot_tokens(SeqId id, int layer, int kv_head) const {
    return inspect<std::vector<std::int32_t>>(id, layer, kv_head, "slot_tokens", [&](const Seq& q) {
      return q.store.layer(layer).heads[static_cast<std::size_t>(kv_head)].slot_token;
    });
  }

  /// A snapshot of pool use (pool_types.hpp); SequenceStats::exact_bytes also counts the slot
  /// bookkeeping (validity words, 8 bytes of cache index and score per slot, pending scores) and
  /// BlockSparse's block bits (8 bytes per 64 pages of a KV head).
  /// No error channel: may throw std::bad_alloc (the sequence list), changing nothing.
  [[nodiscard]] PoolStats stats() const { return st_ ? st_->stats() : PoolStats{}; }
  /// Bytes the pool holds: the arena, the per-page overhead, every sequence's exact_bytes. No allocation.
  [[nodiscard]] std::size_t memory_bytes() const noexcept {
    if (!st_) return 0;
    const PoolStats s = st_->stats(false);
    return s.pages_total * s.page_bytes + s.overhead_bytes + s.exact_bytes;
  }
  /// The model shape, the configuration and the page payload layout (KVCache's block layout).
  [[nodiscard]] const ModelShape& shape() const noexcept { return st_->cfg.shape; }
  [[nodiscard]] const PoolConfig& config() const noexcept { return st_->cfg; }
  [[nodiscard]] const BlockLayout& block_layout() const noexcept { return st_->layout; }

 private:
  // Whether ending layer li's prompt may compact it into fresh pages (SnapKV, until it compressed).
  template <class S>
  static bool compacts(const S& q, int li) noexcept {
    if constexpr (requires { q.hook.prompt_compacted(li); }) return !q.hook.prompt_compacted(li);
    else return false;
  }
  struct Seq {
    store_type store;
    eviction_hook hook;  // the policy's per-sequence state (budget, FIFO, observation window)
    Workspace ws;        // scratch of the hook's own scoring (SnapKV compression); no state between calls
    Seq(PagePool& pool, const ModelShape& shape, const BlockLayout& layout) : store(pool, shape, layout) { hook.init(shape); }
    ~Seq() { hook.wipe(); }
  };
  using State = pool_detail::EvictPoolState<Seq>;
  using Slot = typename State::Slot;
  explicit EvictingPagedCache(std::unique_ptr<State> st) : st_(std::move(st)) {}

  Status run_kernels(Seq& s, int layer, std::span<const float> q, std::span<float> out, Workspace& ws,
                     std::vector<std::vector<float>>& mass, std::int64_t i, const float* bias = nullptr) {
    return pool_detail::evicting_kernels<codec_hook>(s, shape(), layer, q, out, ws, mass, i, bias);
  }
  void credit(Seq& s, int layer, std::span<const float> q, Workspace& ws, std::vector<std::vector<float>>& mass) {
    pool_detail::evicting_credit(s, shape(), layer, q, ws, mass);
  }

  static Error moved(const char* what) { return fail(Errc::invalid_argument, std::string(what) + ": moved-from PagedCache"); }
  // A live sequence; a swapped-out one is Errc::not_present unless `swapped_ok`.
  [[nodiscard]] Result<Seq*> find(SeqId id, const char* what, bool swapped_ok = false) const {
    if (!st_) return moved(what);
    const bool live = st_->live(id);
    if (Status c = pool_detail::check_handle(what, id, live, live && !swapped_ok && st_->slots[id.index].swapped_to); !c)
      return c.error();
    return st_->slots[id.index].seq.get();
  }
  [[nodiscard]] Status check_layer(const char* what, int layer) const { return pool_detail::check_layer(shape(), what, layer); }
  // A read-only query of (layer, kv_head) of a live sequence: f(seq), its std::bad_alloc an error.
  template <class T, class F>
  [[nodiscard]] Result<T> inspect(SeqId id, int layer, int kv_head, const char* what, F&& f) const {
    auto s = find(id, what);
    if (!s) return s.error();
    if (Status c = check_head(what, layer, kv_head); !c) return c.error();
    return catch_alloc(what, 0, [&]() -> Result<T> { return f(**s); });
  }
  [[nodiscard]] Status check_head(const char* what, int layer, int kv_head) const {
    if (layer >= 0 && layer < shape().layers && kv_head >= 0 && kv_head < shape().kv_heads) return {};
    return fail(Errc::invalid_argument, std::string(what) + ": layer or kv_head out of range");
  }

  std::unique_ptr<State> st_;
};

}  // namespace kvpack
