// PagedCache<Policy...>: many sequences over one pool of fixed-size pages (vLLM-style paged KV
// cache), with the same policies, codes and attention as KVCache<Policy...>: a sequence of a
// PagedCache and a KVCache fed the same tokens hold the same block bytes and attend bit-identically
// on the same backend (tests/test_pool_basic.cpp). Adds what a serving engine needs: fork (pages
// shared copy-on-write), truncate (exact rollback of rejected speculative tokens), batched decode
// over the caller's executor, a prefix cache of published full pages, and swapping a sequence's
// pages out of the arena and back (pool/pool_swap.hpp). With an eviction policy, PagedCache<...>
// names EvictingPagedCache (pool/paged_eviction.hpp) instead. A failed allocation is
// Errc::out_of_memory with nothing changed (each call reserves, then mutates;
// tests/test_alloc_fault_pool.cpp); publish_prefix alone may stop part way. DESIGN.md "Paged pool".
#pragma once

#include <algorithm>
#include <atomic>
#include <cmath>
#include <cstddef>
#include <cstdint>
#include <memory>
#include <mutex>
#include <span>
#include <string>
#include <string_view>
#include <type_traits>
#include <vector>

#include "kvpack/cache/alloc_guard.hpp"
#include "kvpack/cache/workspace.hpp"
#include "kvpack/executor.hpp"
#include "kvpack/kv_cache.hpp"
#include "kvpack/pool/page_pool.hpp"
#include "kvpack/pool/page_swap.hpp"
#include "kvpack/pool/paged_eviction.hpp"
#include "kvpack/pool/paged_sequence.hpp"
#include "kvpack/pool/pool_types.hpp"
#include "kvpack/pool/prefix_cache.hpp"
#include "kvpack/pool/pool_checks.hpp"
#include "kvpack/pool/pool_state.hpp"

namespace kvpack {

/// Many sequences of compressed KV cache in one page pool, without eviction (PagedCache<...>
/// names this type when the policies do not evict, EvictingPagedCache otherwise). Policies as
/// KVCache<Policies...> (the same static_asserts apply); not yet supported on the pool, each a
/// readable compile error: Offload<>, Keyframe<> codecs.
///
/// Thread safety: calls on DIFFERENT sequences may run concurrently from several threads
/// (append, attend, fork of distinct parents, create/free); calls on the SAME sequence must not
/// overlap (attend/attend_batch with each other may: they only read). Pages shared by several
/// sequences are only read. publish_prefix/attach_prefix/clear_prefix_cache are thread-safe.
template <class... Policies>
class BasicPagedCache {
  using single = KVCache<Policies...>;  // resolves the policies and runs KVCache's static_asserts

 public:
  using codec_hook = typename single::codec_hook;
  static constexpr int sink_tokens = single::sink_tokens;
  static constexpr int residual_tokens = single::residual_tokens;
  static constexpr int block_tokens = single::block_tokens;
  static constexpr int commit_unit = codec_hook::commit_unit;
  static constexpr double key_bits_per_value = single::key_bits_per_value;
  static constexpr double value_bits_per_value = single::value_bits_per_value;
  /// PreRope<OriginalPositions>: keys and queries given before RoPE, turned by the kernels at the
  /// stored positions (rope_state.hpp); positions must be < max_tokens (a table fixed at create).
  static constexpr bool pre_rope = single::pre_rope;
  static_assert(pool_detail::check_basic_pool<single>());  // the policies this pool refuses, by name

  /// Creates a pool: the page arena (PoolConfig::byte_budget), room for max_sequences handles;
  /// PreRope<>: the RoPE table of positions [0, shape.max_tokens), rope_dims / 2 cos/sin pairs
  /// each (8 * max_tokens * rope_dims / 2 bytes, outside the budget: 64 MiB at 131072 x 128).
  /// Errc::invalid_argument: a bad shape or RoPE fields (as KVCache::create), max_sequences < 1,
  /// max_rollback_tokens < 0, a budget below one page; Errc::capacity_exceeded when the arena
  /// cannot be allocated; Errc::out_of_memory when the page headers, reference counts, free list
  /// or slots cannot be (nothing kept).
  [[nodiscard]] static Result<BasicPagedCache> create(const PoolConfig& cfg) {
    return catch_alloc("PagedCache::create", 0, [&]() -> Result<BasicPagedCache> {
      auto st = State::create(cfg, block_tokens, pre_rope);
      if (!st) return st.error();
      return Result<BasicPagedCache>(BasicPagedCache(std::move(st.value())));
    });
  }

  BasicPagedCache(BasicPagedCache&&) noexcept = default;
  BasicPagedCache& operator=(BasicPagedCache&&) noexcept = default;
  BasicPagedCache(const BasicPagedCache&) = delete;
  BasicPagedCache& operator=(const BasicPagedCache&) = delete;
  ~BasicPagedCache() = default;  // State releases and zeroes everything

  /// A new empty sequence. Errc::capacity_exceeded when max_sequences are live;
  /// Errc::out_of_memory when its layers cannot be allocated (nothing changed).
  [[nodiscard]] Result<SeqId> create_sequence() {
    if (!st_) return moved("create_sequence");
    return catch_alloc("create_sequence", 0, [&] {
      typename State::NewLayers layers;
      st_->make_layers(layers);
      return st_->open("create_sequence", layers);
    });
  }

  /// A new sequence equal to `parent`: every page of the parent is shared (reference-counted,
  /// copy-on-write: an append or truncate on either side copies a shared page before changing it,
  /// so neither ever sees the other's later tokens); fp32 rows are copied. Errors: a stale handle
  /// (Errc::invalid_argument), max_sequences live (Errc::capacity_exceeded), the copies cannot be
  /// allocated (Errc::out_of_memory: they are made before a slot is taken, nothing changed).
  [[nodiscard]] Result<SeqId> fork(SeqId parent) {
    auto p = find(parent, "fork");
    if (!p) return p.error();
    return catch_alloc("fork", 0, [&] { return st_->fork(**p); });
  }

  /// Frees a sequence: its pages lose a reference (a page goes back to the free list, zeroed,
  /// with its last one), its fp32 rows are zeroed, its handle becomes stale. Errc::invalid_argument
  /// for a stale handle.
  Status free_sequence(SeqId id) {
    auto s = find(id, "free_sequence", true);
    if (!s) return s.error();
    st_->close(id.index);
    return {};
  }

  /// Whether `id` names a live sequence of this pool.
  [[nodiscard]] bool valid(SeqId id) const noexcept { return st_ && st_->live(id); }

  /// Tokens appended to layer 0 of the sequence (its length). Errc::invalid_argument: stale handle.
  [[nodiscard]] Result<std::int64_t> length(SeqId id) const { return tokens(id, 0); }
  /// Tokens appended to `layer` of the sequence. Errc::invalid_argument: stale handle, bad layer.
  [[nodiscard]] Result<std::int64_t> tokens(SeqId id, int layer) const {
    auto s = find(id, "tokens", true);
    if (!s) return s.error();
    if (Status c = check_layer("tokens", layer); !c) return c.error();
    return (*s)->layers[static_cast<std::size_t>(layer)].total;
  }

  /// Drops the newest tokens of every layer so that `new_length` remain: the sequence is then
  /// bit-identical (page bytes and counts, pending fp32 rows, sinks) to one that never received
  /// the dropped tokens, including per-channel key groups and residual windows that the dropped
  /// tokens had completed (their tokens are rebuilt from the rollback copies). The latest chunk
  /// keeps its surviving tokens (attend may still read them as the latest append).
  /// Errors, with nothing changed: stale handle; new_length < 0 or above a layer's tokens
  /// (Errc::invalid_argument); more than max_rollback_tokens dropped from any layer, or a layer
  /// whose rollback copies do not reach back far enough (after attach_prefix) (Errc::unsupported);
  /// a shared page to cut but no free page to copy it to (Errc::capacity_exceeded); the new
  /// pending rows cannot be allocated (Errc::out_of_memory: they are built before the cut).
  Status truncate(SeqId id, std::int64_t new_length) {
    auto s = find(id, "truncate");
    if (!s) return s.error();
    return catch_alloc("truncate", 0, [&] { return st_->truncate(**s, new_length); });
  }

  /// Appends n = positions.size() tokens to `layer` of the sequence, as KVCache::append:
  /// k, v [n][kv_heads][head_dim] float32 (keys after RoPE; before it with PreRope<>), positions
  /// [n]; commits by the same rule, taking pages from the pool (and copying a shared open page
  /// first). Errors, with nothing written: stale handle, layer out of range, wrong sizes, a
  /// negative position or, PreRope<>, one >= shape.max_tokens (Errc::invalid_argument); more than shape.max_tokens tokens in the layer, or the
  /// page pool exhausted (Errc::capacity_exceeded, naming pages needed and free); NaN/Inf
  /// (Errc::non_finite, naming layer, KV head, token and channel); Errc::out_of_memory when the
  /// rows, page tables or page list cannot grow (every allocation is made before any change and
  /// pages taken are returned: the sequence and the pool are as they were). n = 0 is a no-op.
  Status append(SeqId id, int layer, std::span<const float> k, std::span<const float> v,
                std::span<const std::int32_t> positions) {
    auto s = find(id, "append");
    if (!s) return s.error();
    if (Status c = check_layer("append", layer); !c) return c;
    auto& L = (*s)->layers[static_cast<std::size_t>(layer)];
    if (Status c = pool_detail::check_append(shape(), layer, L.total, k, v, positions, false, pre_rope); !c) return c;
    if (positions.empty()) return {};
    return catch_alloc("append", 0, [&]() -> Status {
      const State& S = *st_;
      const auto n = static_cast<std::int64_t>(positions.size());
      // Stage and check the rows, reserve (rows, page tables, the spare list), take the pages,
      // then change: nothing below the take allocates, and `spare` returns its pages if anything
      // throws before they are used.
      ChunkStage& stage = (*s)->stage;
      if (Status c = stage.stage(shape(), layer, L.total, k, v); !c) return c;  // NaN/Inf, in the copy's pass
      pool_detail::reserve_append<codec_hook, pre_rope>(L, positions, row_floats(), sink_tokens, residual_tokens, block_tokens,
                                              S.hist_cap, shape().head_dim);
      SparePages spare(*st_->pool);
      const std::size_t need =
          pool_detail::pages_for_append(L, *S.pool, n, sink_tokens, residual_tokens, commit_unit, block_tokens);
      if (Status t = st_->pool->take(need, spare.pages, "append"); !t) return t;
      std::reverse(spare.pages.begin(), spare.pages.end());  // commit pops from the back: each head's new pages ascend in memory
      pool_detail::store_append<codec_hook, pre_rope>(L, *S.pool, S.layout, shape().kv_heads, k, v, positions, sink_tokens,
                                            residual_tokens, S.hist_cap, stage, spare.pages);
      return {};  // `spare` releases what is left: nothing when the count was right
    });
  }

  /// Attention of the last n_q tokens appended to `layer` of the sequence over everything it
  /// holds, exactly as KVCache::attend (same kernel, same segments: bit-identical on the same
  /// backend). q, out: [n_q][q_heads][head_dim]. Scratch lives in `ws` (one per thread).
  /// Errors as KVCache::attend (invalid_argument, non_finite) plus a stale handle;
  /// Errc::out_of_memory when the scratch in `ws` cannot grow (the pool is only read).
  Status attend(SeqId id, int layer, std::span<const float> q, std::span<float> out, Workspace& ws) const {
    auto s = find(id, "attend");
    if (!s) return s.error();
    if (Status c = check_layer("attend", layer); !c) return c;
    const auto& L = (*s)->layers[static_cast<std::size_t>(layer)];
    if (Status c = pool_detail::check_queries(shape(), layer, L.chunk_tokens, q, out, 0); !c) return c;
    return catch_alloc("attend", 0, [&] {
      attend_one(L, q, out, ws);
      return pool_detail::check_output(shape(), layer, out, 0);
    });
  }

  /// Batched decode: one query token for each of N = seqs.size() sequences (of any lengths) of
  /// `layer`, each attending over its own pages (a paged view as vLLM block tables / FlashInfer
  /// paged_kv_t). q, out: [N][q_heads][head_dim]; sequence i's query is its latest appended token.
  /// Runs W = min(N, workspaces.size()) tasks on `exec` (task w decodes sequences w, w + W, ...
  /// with workspaces[w]); an empty exec runs them serially. Every output is bit-identical to
  /// attend() of that sequence alone (same kernel and inputs; threads share no scratch).
  /// Errors, checked before anything runs (out untouched): stale handle (naming its index in
  /// seqs), bad layer, sizes, a sequence whose latest append is empty, non-finite q,
  /// empty workspaces (Errc::invalid_argument / non_finite); after: a non-finite output, or
  /// Errc::out_of_memory when a workspace's scratch cannot grow (the pool is only read; the
  /// other sequences' outputs are written).
  Status attend_batch(int layer, std::span<const SeqId> seqs, std::span<const float> q, std::span<float> out,
                      const Executor& exec, std::span<Workspace> workspaces) const {
    return batch(layer, seqs, q, nullptr, out, exec, workspaces);
  }

  /// Batched decode with per-sequence additive masks: as attend_batch above, with mask i
  /// (BatchMask, pool_types.hpp: ragged, values[offsets[i], offsets[i + 1]), one float32 per token
  /// sequence i holds in `layer`, by cache index) added to sequence i's scaled scores q.k_t * scale,
  /// for every query head, inside the fused kernel (AttendArgs::bias; scalar, AVX2 and NEON): an
  /// all-zero mask gives outputs bit-identical to the unmasked call, -inf entries drop tokens.
  /// Errors, checked before anything runs (out untouched): those of attend_batch; offsets not
  /// N + 1, decreasing or beyond values; a mask whose length differs from the sequence's tokens
  /// in the layer (the message names both); an all -inf mask (Errc::invalid_argument); NaN or
  /// +inf in a mask (Errc::non_finite, naming the sequence and the entry). After: a non-finite
  /// output (a score plus its bias overflowed fp32). The pool has no CUDA backend (Backend<Cuda>
  /// does not compile for a host cache, kernels/dispatch.hpp), so no backend ignores the masks.
  Status attend_batch(int layer, std::span<const SeqId> seqs, std::span<const float> q, const BatchMask& masks,
                      std::span<float> out, const Executor& exec, std::span<Workspace> workspaces) const {
    return batch(layer, seqs, q, &masks, out, exec, workspaces);
  }

  /// Publishes the full pages of a sequence to the prefix cache: for each k with (k + 1) * B
  /// tokens committed in every layer and within tokens.size(), the pages of block k (every layer
  /// and KV head) under the key hash(model id, codec format id, tokens[0, (k + 1) * B)). `tokens`
  /// are the token ids the sequence was fed, oldest first, at positions 0, 1, ... (publishing stops
  /// at the first block whose positions are not its token indices). Published pages gain a reference (they
  /// stay until clear_prefix_cache) and are read-only from then on. Returns the blocks newly
  /// published. Errors: stale handle; Errc::unsupported with Sinks<N> (sink rows are not in pages);
  /// Errc::out_of_memory when an entry cannot be allocated: NOT all or nothing, the blocks before
  /// the failing one stay published (each entry whole, its pages retained; the sequence unchanged).
  Result<std::int64_t> publish_prefix(SeqId id, std::string_view model_id, std::span<const std::int32_t> tokens) {
    auto s = find(id, "publish_prefix");
    if (!s) return s.error();
    if (sink_tokens > 0) return fail(Errc::unsupported, "publish_prefix: not available with Sinks<N> (sink rows are not paged)");
    return catch_alloc("publish_prefix", 0, [&]() -> Result<std::int64_t> { return st_->publish(**s, model_id, tokens); });
  }

  /// Prefix cache lookup for an EMPTY sequence about to receive `prompt` (all of it): attaches the
  /// longest chain of published blocks matching prompt[0, m * B), capped so that those tokens are
  /// ones appending the whole prompt would commit (m * B <= commit_count(prompt.size())), and
  /// returns m * B: the caller appends prompt tokens from there on (positions as the publisher's).
  /// Decoding afterwards is bit-identical to a sequence that appended prompt[0, m * B) and the
  /// rest in two appends (prefill queries of the rest read the prefix quantized, not exact).
  /// Errors: stale handle, a non-empty sequence (Errc::invalid_argument); Sinks<N> (Errc::unsupported);
  /// Errc::out_of_memory (nothing attached, no page retained; the page tables may keep capacity).
  Result<std::int64_t> attach_prefix(SeqId id, std::string_view model_id, std::span<const std::int32_t> prompt) {
    auto s = find(id, "attach_prefix");
    if (!s) return s.error();
    if (sink_tokens > 0) return fail(Errc::unsupported, "attach_prefix: not available with Sinks<N> (sink rows are not paged)");
    return catch_alloc("attach_prefix", 0, [&]() -> Result<std::int64_t> { return st_->attach(**s, model_id, prompt); });
  }

  /// Appends n full pages, given as their payload bytes, to a sequence that holds whole committed
  /// pages only (an empty one, or one attach_prefix or an earlier import just filled): the import
  /// side of a remote prefix tier (offload/remote_pool_prefix.hpp). `payloads`: n * layers *
  /// kv_heads pages of block_layout().bytes each, ordered [page][layer][kv_head], each a full
  /// block (Blocks<B> tokens) exactly as a page of this pool (or a KVCache block of the same
  /// policies) holds it: codes and metadata, no positions (the tokens take their cache indices as
  /// positions); headers are set to this codec's with count = B. Returns the sequence's
  /// length afterwards (a multiple of B). The tokens count as committed; the latest append and
  /// the rollback copies are dropped (truncate cannot go below the imported tokens), as with
  /// attach_prefix. Errors, with nothing changed: stale handle; a payload size that is not a
  /// whole number of pages, a sequence holding pending or uncommitted tokens or layers of
  /// different lengths (Errc::invalid_argument); more than max_tokens, or
  /// the page pool short of n * layers * kv_heads free pages (Errc::capacity_exceeded, naming
  /// pages needed and free); Sinks<N> (Errc::unsupported: sink rows are not paged);
  /// Errc::out_of_memory when the page tables cannot grow (before any page is taken: nothing changed).
  Result<std::int64_t> import_pages(SeqId id, std::span<const std::byte> payloads) {
    auto s = find(id, "import_pages");
    if (!s) return s.error();
    if (sink_tokens > 0) return fail(Errc::unsupported, "import_pages: not available with Sinks<N> (sink rows are not paged)");
    return catch_alloc("import_pages", 0, [&]() -> Result<std::int64_t> { return st_->import_pages(**s, payloads); });
  }

  /// Drops every published prefix entry (their pages lose the cache's reference).
  void clear_prefix_cache() {
    if (st_) st_->prefix.clear(*st_->pool);
  }

  /// Swaps a sequence out (vLLM's preemption by swapping; pool/page_swap.hpp): each page it holds
  /// alone is stored in `target`, then zeroed and freed; pages it shares (fork, prefix cache) stay.
  /// Its fp32 rows and positions stay in memory. Until swap_in, calls on it other than valid,
  /// length, tokens, block_positions, swapped_out, swap_in and free_sequence are Errc::not_present.
  /// `target` must outlive the swap (free_sequence and ~PagedCache erase the copies through it).
  /// Returns the pages freed. Errors, nothing changed: stale handle; swapped out already
  /// (Errc::not_present); the target's store error (copies made are erased); out_of_memory.
  Result<std::size_t> swap_out(SeqId id, PageSwapTarget& target) {
    auto s = find(id, "swap_out");
    if (!s) return s.error();
    return catch_alloc("swap_out", 0, [&] { return pool_detail::swap_out(*st_->pool, st_->layout, st_->tables(**s), **s, id, target); });
  }
  /// Brings a swapped-out sequence back into fresh pages with the stored bytes and headers: it is
  /// then bit-identical to a sequence never swapped. Returns the pages taken. Errors, the sequence
  /// staying swapped out with its copies kept: stale handle; not swapped out (invalid_argument);
  /// too few free pages (capacity_exceeded); the target's load error (auth_failed, corrupt_data,
  /// io_error, not_present); a loaded header of another codec (corrupt_data); out_of_memory.
  Result<std::size_t> swap_in(SeqId id) {
    auto s = find(id, "swap_in", true);
    if (!s) return s.error();
    return catch_alloc("swap_in", 0, [&] {
      return pool_detail::swap_in(*st_->pool, st_->layout, codec_hook::header(shape().head_dim), st_->tables(**s), **s, id);
    });
  }
  /// Whether the sequence is swapped out. Errc::invalid_argument: stale handle.
  [[nodiscard]] Result<bool> swapped_out(SeqId id) const {
    auto s = find(id, "swapped_out", true);
    if (!s) return s.error();
    return (*s)->swapped_to != nullptr;
  }

  /// The page table of (layer, kv_head) of a sequence, oldest page first. Errc::invalid_argument:
  /// stale handle or indices out of range; Errc::out_of_memory (the list cannot be allocated).
  [[nodiscard]] Result<std::vector<PageView>> pages(SeqId id, int layer, int kv_head) const {
    auto s = find(id, "pages");
    if (!s) return s.error();
    if (layer < 0 || layer >= shape().layers || kv_head < 0 || kv_head >= shape().kv_heads)
      return fail(Errc::invalid_argument, "pages: layer or kv_head out of range");
    return catch_alloc("pages", 0, [&]() -> Result<std::vector<PageView>> {
      std::vector<PageView> v;
      for (const std::uint32_t p : (*s)->layers[static_cast<std::size_t>(layer)].pages[static_cast<std::size_t>(kv_head)])
        v.push_back({p, st_->pool->data(p), st_->pool->header(p), st_->pool->refs(p)});
      return v;
    });
  }

  /// Positions of `layer`'s paged tokens (page k slot t: token k * B + t; pages store none).
  [[nodiscard]] Result<const PositionRuns*> block_positions(SeqId id, int layer) const {
    auto s = find(id, "block_positions", true);
    if (!s) return s.error();
    if (Status c = check_layer("block_positions", layer); !c) return c.error();
    return &(*s)->layers[static_cast<std::size_t>(layer)].block_pos;
  }

  /// Decodes everything (layer, kv_head) of the sequence holds as attention reads it (the latest
  /// append aside, which attend reads exactly), in cache-index order: as KVCache::read_back, for
  /// float64 references. Errc::invalid_argument: stale handle or indices out of range;
  /// Errc::out_of_memory (the contents cannot be allocated).
  [[nodiscard]] Result<HeadContents> read_back(SeqId id, int layer, int kv_head) const {
    auto s = find(id, "read_back");
    if (!s) return s.error();
    if (layer < 0 || layer >= shape().layers || kv_head < 0 || kv_head >= shape().kv_heads)
      return fail(Errc::invalid_argument, "read_back: layer or kv_head out of range");
    return catch_alloc("read_back", 0, [&]() -> Result<HeadContents> {
      return pool_detail::read_back<codec_hook>((*s)->layers[static_cast<std::size_t>(layer)], *st_->pool, st_->layout,
                                                shape().kv_heads, kv_head);
    });
  }

  /// A snapshot of pool use (pool_types.hpp). Not synchronized with concurrent appends. No error
  /// channel: may throw std::bad_alloc (the sequence list), changing nothing.
  [[nodiscard]] PoolStats stats() const { return st_ ? st_->stats() : PoolStats{}; }
  /// Bytes the pool holds: the arena, the per-page overhead, every sequence's fp32 rows. No allocation.
  [[nodiscard]] std::size_t memory_bytes() const noexcept {
    if (!st_) return 0;
    const PoolStats s = st_->stats(false);
    return s.pages_total * s.page_bytes + s.overhead_bytes + s.exact_bytes;
  }
  [[nodiscard]] const ModelShape& shape() const noexcept { return st_->cfg.shape; }
  [[nodiscard]] const PoolConfig& config() const noexcept { return st_->cfg; }
  [[nodiscard]] const BlockLayout& block_layout() const noexcept { return st_->layout; }

 private:
  using Slot = pool_detail::SeqSlot;
  using State = pool_detail::PoolState<codec_hook, sink_tokens, residual_tokens>;
  explicit BasicPagedCache(std::unique_ptr<State> st) : st_(std::move(st)) {}

  [[nodiscard]] std::size_t row_floats() const noexcept {
    return static_cast<std::size_t>(shape().kv_heads) * static_cast<std::size_t>(shape().head_dim);
  }
  static Error moved(const char* what) { return fail(Errc::invalid_argument, std::string(what) + ": moved-from PagedCache"); }
  // A live sequence; a swapped-out one is Errc::not_present unless `swapped_ok`.
  [[nodiscard]] Result<Slot*> find(SeqId id, const char* what, bool swapped_ok = false) const {
    if (!st_) return moved(what);
    const bool live = st_->live(id);
    if (Status c = pool_detail::check_handle(what, id, live, live && !swapped_ok && st_->slots[id.index].swapped_to); !c)
      return c.error();
    return &st_->slots[id.index];
  }
  [[nodiscard]] Status check_layer(const char* what, int layer) const { return pool_detail::check_layer(shape(), what, layer); }
  // attend_batch, with masks (BatchMask) or without (nullptr).
  Status batch(int layer, std::span<const SeqId> seqs, std::span<const float> q, const BatchMask* masks,
               std::span<float> out, const Executor& exec, std::span<Workspace> workspaces) const {
    if (!st_) return moved("attend_batch");
    if (Status c = check_layer("attend_batch", layer); !c) return c;
    return catch_alloc("attend_batch", 0, [&] { return batch_checked(layer, seqs, q, masks, out, exec, workspaces); });
  }
  Status batch_checked(int layer, std::span<const SeqId> seqs, std::span<const float> q, const BatchMask* masks,
                       std::span<float> out, const Executor& exec, std::span<Workspace> workspaces) const {
    const std::size_t N = seqs.size(), qrow = static_cast<std::size_t>(shape().q_heads) * static_cast<std::size_t>(shape().head_dim);
    if (Status c = pool_detail::check_batch_sizes(N, qrow, q.size(), out.size(), workspaces.size()); !c) return c;
    std::vector<const pool_detail::PagedLayer*> Ls(N);
    auto layer_of = [&](SeqId id) -> Result<const pool_detail::PagedLayer*> {
      auto s = find(id, "attend_batch");
      if (!s) return s.error();
      return &(*s)->layers[static_cast<std::size_t>(layer)];
    };
    if (Status c = pool_detail::batch_layers(shape(), layer, seqs, q, out, masks, layer_of, Ls); !c) return c;
    const int W = static_cast<int>(std::min(N, workspaces.size()));
    // A task catches its own std::bad_alloc (scratch growth), so none escapes on an executor's thread.
    std::vector<Status> res(static_cast<std::size_t>(W));
    auto task = [&](int w) {
      res[static_cast<std::size_t>(w)] = catch_alloc("attend_batch", 0, [&]() -> Status {
        for (std::size_t i = static_cast<std::size_t>(w); i < N; i += static_cast<std::size_t>(W))
          attend_one(*Ls[i], q.subspan(i * qrow, qrow), out.subspan(i * qrow, qrow), workspaces[static_cast<std::size_t>(w)],
                     masks ? masks->values.data() + masks->offsets[i] : nullptr);
        return {};
      });
    };
    pool_detail::run_tasks(W, exec, task);
    for (Status& r : res)
      if (!r) return r;
    for (std::size_t i = 0; i < N; ++i)
      if (Status c = pool_detail::check_output(shape(), layer, out.subspan(i * qrow, qrow), static_cast<std::int64_t>(i)); !c)
        return c;
    return {};
  }
  // One sequence's attention on the calling thread (pool_detail::attend_layer), scratch in ws.
  void attend_one(const pool_detail::PagedLayer& L, std::span<const float> q, std::span<float> out, Workspace& ws,
                  const float* bias = nullptr) const {
    pool_detail::attend_layer<codec_hook>(shape(), L, *st_->pool, st_->layout, q, out, ws.scratch, ws.refs, bias,
                                          pre_rope ? &st_->rope : nullptr, &ws.rope_spill);
  }

  std::unique_ptr<State> st_;
};

/// Many sequences of compressed KV cache in one page pool: BasicPagedCache<Policies...> (above),
/// or EvictingPagedCache<Policies...> (pool/paged_eviction.hpp) when an eviction policy is among
/// them (SinkWindow, H2O, SnapKV, TOVA and their Budget/Protocol forms; BlockSparse, Demote<>,
/// Offload<> and Keyframe<> codecs are compile errors there). DESIGN.md "Paged pool".
template <class... Policies>
using PagedCache = std::conditional_t<KVCache<Policies...>::evicts, EvictingPagedCache<Policies...>,
                                      BasicPagedCache<Policies...>>;

}  // namespace kvpack
