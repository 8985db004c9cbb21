// PagedEvictStore: one evicting sequence of a PagedCache (pool/paged_eviction.hpp), the pool
// counterpart of SequenceStore<..., Evicts = true> (cache/sequence_store.hpp). It offers the
// members the eviction hooks (eviction/hook.hpp) call on a store, with the same token lifecycle,
// slot bookkeeping (HeadStore: validity words, cache index and score per slot, free slots reused
// last-freed first) and commit order, so a hook makes the same decisions on both and the slot
// payloads hold the same bytes. The difference: a slot's payload lives in a page of the pool's
// arena instead of a heap Block, so HeadStore::blocks stays empty here and every payload access
// goes through the page table `pages[kv_head]`.
//
// Copy-on-write: a page with more than one reference (after fork) is never written. Whatever
// writes a slot (commit's encode, eviction's zeroing) first copies a shared page into a page the
// sequence holds alone; compaction (SnapKV) builds fresh pages and only drops its references to
// the old ones. Pages come from `spare`, taken by the facade before the operation, all or none
// (pages_bound), so running out of pages is an error before any change, never midway.
#pragma once

#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <span>
#include <utility>
#include <vector>

#include "kvpack/cache/alloc_guard.hpp"
#include "kvpack/cache/block.hpp"
#include "kvpack/cache/chunk_stage.hpp"
#include "kvpack/cache/exact_segments.hpp"
#include "kvpack/cache/head_store.hpp"
#include "kvpack/cache/pending_rows.hpp"
#include "kvpack/cache/shape.hpp"
#include "kvpack/detail/secure_zero.hpp"
#include "kvpack/kernels/dispatch.hpp"
#include "kvpack/pool/page_pool.hpp"
#include "kvpack/pool/paged_sequence.hpp"

namespace kvpack::pool_detail {

/// Storage of one evicting pool sequence: Codec a CodecHook with per-token keys and commit unit 1,
/// SinkTokens / ResidualTokens the Sinks<N> / Residual<R> counts.
template <class Codec, int SinkTokens, int ResidualTokens>
class PagedEvictStore {
  static_assert(Codec::commit_unit == 1 && !Codec::keys_per_channel, "PagedEvictStore: per-token codecs only");

 public:
  using codec = Codec;
  static constexpr int sink_tokens = SinkTokens;
  static constexpr int residual_tokens = ResidualTokens;
  static constexpr bool evicts = true;
  /// One layer, as SequenceStore::Layer plus the page table; heads[h].blocks stays empty.
  struct Layer {
    std::vector<float> sink_k, sink_v;  ///< [sinks_held][kv_heads][D]
    std::vector<std::int32_t> sink_pos;
    PendingRows pend;                   ///< [pending][kv_heads][D], oldest first, with scores
    std::vector<float> chunk_k, chunk_v;  ///< exact copy of the latest append
    std::vector<HeadStore> heads;       ///< slot bookkeeping per KV head (no blocks)
    std::vector<std::vector<std::uint32_t>> pages;  ///< [kv_head][page]: slot s is in page s / B
    std::int64_t sinks_held = 0, committed = 0, total = 0, chunk_tokens = 0;
  };

  PagedEvictStore(PagePool& pool, const ModelShape& shape, const BlockLayout& layout)
      : pool_(&pool), shape_(shape), layout_(layout), proto_(Codec::header(shape.head_dim)) {
    layers_.resize(static_cast<std::size_t>(shape.layers));
    for (Layer& L : layers_) {
      L.heads.resize(static_cast<std::size_t>(shape.kv_heads));
      L.pages.resize(static_cast<std::size_t>(shape.kv_heads));
      L.pend.configure(row_floats(), static_cast<std::size_t>(shape.kv_heads));
    }
  }
  PagedEvictStore(const PagedEvictStore&) = delete;
  PagedEvictStore& operator=(const PagedEvictStore&) = delete;
  ~PagedEvictStore() { release_all(); }

  /// A copy of `o` sharing every page (each gains a reference): fork. fp32 rows, scores and
  /// slot bookkeeping are copied. May throw std::bad_alloc: then no page was retained and this
  /// store's page tables are empty (its rows are zeroed when it is dropped).
  void share_from(const PagedEvictStore& o) {
    try {
      copy_from(o);
    } catch (...) {
      for (Layer& T : layers_)
        for (auto& table : T.pages) table.clear();  // copied ids without a reference: never release them
      throw;
    }
    for (const Layer& T : layers_)
      for (const auto& table : T.pages)
        for (const std::uint32_t p : table) pool_->retain(p);
  }
  // share_from's copies, without the references.
  void copy_from(const PagedEvictStore& o) {
    for (std::size_t l = 0; l < layers_.size(); ++l) {
      const Layer& F = o.layers_[l];
      Layer& T = layers_[l];
      T.sink_k = F.sink_k, T.sink_v = F.sink_v, T.sink_pos = F.sink_pos, T.pend = F.pend;
      T.chunk_k = F.chunk_k, T.chunk_v = F.chunk_v, T.pages = F.pages;
      T.sinks_held = F.sinks_held, T.committed = F.committed, T.total = F.total, T.chunk_tokens = F.chunk_tokens;
      for (std::size_t h = 0; h < T.heads.size(); ++h) {
        const HeadStore& a = F.heads[h];
        HeadStore& b = T.heads[h];
        b.valid = a.valid, b.slot_token = a.slot_token, b.slot_score = a.slot_score, b.free_slots = a.free_slots;
        b.live = a.live;
      }
    }
  }
  /// Drops every page reference (a page's last one zeroes it) and zeroes the fp32 rows.
  void release_all() noexcept {
    for (Layer& L : layers_) {
      for (auto& table : L.pages) {
        for (const std::uint32_t p : table) pool_->release(p);
        table.clear();
      }
      for (auto* v : {&L.sink_k, &L.sink_v, &L.chunk_k, &L.chunk_v}) detail::wipe_vector(*v);
      detail::wipe_vector(L.sink_pos);
      L.pend.wipe();
      for (HeadStore& H : L.heads) H = HeadStore{};
      L.sinks_held = L.committed = L.total = L.chunk_tokens = 0;
    }
    stage_.wipe();
  }

  [[nodiscard]] const ModelShape& shape() const noexcept { return shape_; }
  [[nodiscard]] const BlockLayout& layout() const noexcept { return layout_; }
  [[nodiscard]] const BlockHeader& proto() const noexcept { return proto_; }
  /// Layers of the sequence.
  [[nodiscard]] int layers() const noexcept { return static_cast<int>(layers_.size()); }
  [[nodiscard]] Layer& layer(int li) noexcept { return layers_[static_cast<std::size_t>(li)]; }
  [[nodiscard]] const Layer& layer(int li) const noexcept { return layers_[static_cast<std::size_t>(li)]; }
  [[nodiscard]] const PagePool& pool() const noexcept { return *pool_; }
  [[nodiscard]] std::size_t row_floats() const noexcept {
    return static_cast<std::size_t>(shape_.kv_heads) * static_cast<std::size_t>(shape_.head_dim);
  }
  /// Tokens the layer holds (the largest over KV heads), as SequenceStore::held.
  [[nodiscard]] std::int64_t held(const Layer& L) const noexcept {
    std::int64_t live = 0;
    for (const HeadStore& H : L.heads) live = std::max(live, H.live);
    return L.sinks_held + live + L.pend.size();
  }
  /// Bytes of fp32 rows and positions the sequence holds (sinks, pending, latest chunk), plus the
  /// slot bookkeeping (validity words, cache index and score per slot, pending scores).
  [[nodiscard]] std::size_t exact_bytes() const noexcept {
    std::size_t n = 0;
    const std::size_t row = row_floats();
    for (const Layer& L : layers_) {
      const auto rows = static_cast<std::size_t>(L.pend.size() + L.sinks_held);
      n += (rows + static_cast<std::size_t>(L.chunk_tokens)) * row * 2 * sizeof(float) + rows * 4;
      n += static_cast<std::size_t>(L.pend.size()) * L.heads.size() * sizeof(float);
      for (const HeadStore& H : L.heads)
        n += H.valid.size() * 8 + static_cast<std::size_t>(H.slots()) * 8;
    }
    return n;
  }

  /// Pages an operation on layer li may take: per KV head, a copy of every shared page, the
  /// pages growing the slots by up to `commits` tokens need (a slot is only added when no freed
  /// one is left, so by at most commits - free slots), and with `compacts` a fresh copy of them
  /// all (SnapKV's compaction writes the survivors into new pages before releasing the old).
  [[nodiscard]] std::size_t pages_bound(int li, std::int64_t commits, bool compacts) const noexcept {
    const Layer& L = layer(li);
    const auto B = static_cast<std::int64_t>(layout_.tokens);
    std::size_t need = 0;
    for (std::size_t h = 0; h < L.heads.size(); ++h) {
      for (const std::uint32_t p : L.pages[h]) need += pool_->refs(p) > 1;
      const HeadStore& H = L.heads[h];
      const std::int64_t grow = std::max<std::int64_t>(0, commits - static_cast<std::int64_t>(H.free_slots.size()));
      const std::int64_t after = (H.slots() + grow + B - 1) / B;
      need += static_cast<std::size_t>(std::max<std::int64_t>(0, after - static_cast<std::int64_t>(L.pages[h].size())));
      if (compacts) need += static_cast<std::size_t>(after);
    }
    return need;
  }
  /// Allocates ahead everything push() and the lazy commit plus enforce of an append of n tokens
  /// to layer li need (the chunk copy, sink and pending rows, page tables and slot bookkeeping of
  /// every KV head with room for every slot to be freed, the codec's encode buffers, BlockSparse's
  /// block bits), by the rule of SequenceStore::reserve_append (evicting branch), so that they
  /// allocate nothing after it.
  /// May throw std::bad_alloc, leaving the contents unchanged (only capacities grow). SnapKV's
  /// prompt compression (before_append) is not covered: it allocates as it compacts.
  template <class Hook>
  void reserve_append(int li, std::int64_t n, Hook& hook) {
    Layer& L = layer(li);
    (void)reserve_append_rows(L, n, row_floats(), SinkTokens);
    Codec::reserve_encode(shape_.head_dim);
    const std::int64_t keep = std::max<std::int64_t>(ResidualTokens, hook.keep_exact(*this, li));
    const std::int64_t n_commit = std::max<std::int64_t>(0, L.pend.size() - keep);  // committed before the push
    const auto B = static_cast<std::size_t>(layout_.tokens);
    for (std::size_t h = 0; h < L.heads.size(); ++h) {
      HeadStore& H = L.heads[h];
      std::int64_t after = H.slots() + std::max<std::int64_t>(0, n_commit - static_cast<std::int64_t>(H.free_slots.size()));
      // Slots are reused once the budget holds, except by BlockSparse, and not while a Protocol's
      // prompt lasts (its end commits every pending token before evicting).
      bool capped = Hook::evicts_continuously && Hook::required_block_tokens == 0 && hook.budget() > 0;
      if constexpr (requires { hook.ended(li); }) capped = capped && hook.ended(li);
      if (capped) after = std::min(after, std::max(H.slots(), hook.budget() + 1));
      const std::size_t blocks = (static_cast<std::size_t>(after) + B - 1) / B;
      if constexpr (requires { hook.reserve_blocks(li, 0, blocks); }) hook.reserve_blocks(li, static_cast<int>(h), blocks);
      reserve_geometric(L.pages[h], blocks);
      reserve_geometric(H.valid, blocks * HeadStore::words_per_block(layout_.tokens));
      reserve_geometric(H.slot_token, blocks * B), reserve_geometric(H.slot_score, blocks * B);
      reserve_geometric(H.free_slots, blocks * B);
    }
  }

  /// Sets the pages the next operation draws from (nullptr after it).
  void set_spare(std::vector<std::uint32_t>* spare) noexcept { spare_ = spare; }

  /// Drops live `slot` of KV head h of layer li (a policy's victim), as HeadStore::evict_slot:
  /// clears its bit, zeroes its codes, metadata and position (in a private copy of a shared
  /// page), frees it for reuse.
  void drop_slot(int li, int h, std::int64_t slot, std::int64_t /*high_budget*/ = 0) {
    Layer& L = layer(li);
    HeadStore& H = L.heads[static_cast<std::size_t>(h)];
    const auto su = static_cast<std::size_t>(slot), B = static_cast<std::size_t>(layout_.tokens);
    const std::uint32_t p = writable(L, h, su / B);
    H.valid[su / B * HeadStore::words_per_block(layout_.tokens) + (su % B) / 64] &= ~(std::uint64_t{1} << ((su % B) % 64));
    zero_slots(layout_, pool_->data(p), su % B, su % B + 1);  // per-token layout: exactly evict_slot's bytes
    ++pool_->header(p).version;
    H.slot_token[su] = -1;
    H.slot_score[su] = 0.f;
    H.free_slots.push_back(static_cast<std::int32_t>(slot));
    --H.live;
  }

  /// Pages in KV head h's table of layer li (BlockSparse's block count).
  [[nodiscard]] std::size_t block_count(int li, int h) const noexcept { return layer(li).pages[static_cast<std::size_t>(h)].size(); }
  /// BlockSparse's victim: full page `b` of KV head h of layer li leaves the table at once (its
  /// slots forgotten, this sequence's reference dropped: the page is zeroed and freed when that was
  /// the last, a page shared with a fork stays intact), the slots after it move down one page.
  /// What KVCache masks out and compacts later, so both then hold the same live blocks in order.
  void drop_block(int li, int h, std::size_t b) noexcept {
    Layer& L = layer(li);
    HeadStore& H = L.heads[static_cast<std::size_t>(h)];
    auto& table = L.pages[static_cast<std::size_t>(h)];
    const auto B = static_cast<std::ptrdiff_t>(layout_.tokens);
    const auto w = static_cast<std::ptrdiff_t>(HeadStore::words_per_block(layout_.tokens));
    const auto at = static_cast<std::ptrdiff_t>(b);
    for (std::ptrdiff_t t = 0; t < B; ++t) H.forget_slot(at * B + t);
    pool_->release(table[b]);
    table.erase(table.begin() + at);
    H.valid.erase(H.valid.begin() + at * w, H.valid.begin() + (at + 1) * w);
    H.slot_token.erase(H.slot_token.begin() + at * B, H.slot_token.begin() + (at + 1) * B);
    H.slot_score.erase(H.slot_score.begin() + at * B, H.slot_score.begin() + (at + 1) * B);
  }

  /// Rewrites KV head h's live slots densely, in cache-index order, into fresh pages, as
  /// HeadStore::compact (codes copied bit for bit, scores carried); the old pages lose this
  /// sequence's reference (zeroed when it was the last: a page shared with a fork stays intact).
  void compact_head(int li, int h) {
    Layer& L = layer(li);
    HeadStore& H = L.heads[static_cast<std::size_t>(h)];
    auto& table = L.pages[static_cast<std::size_t>(h)];
    std::vector<std::pair<std::int32_t, std::int32_t>> order;  // (token, slot)
    for (std::size_t s = 0; s < H.slot_token.size(); ++s)
      if (H.slot_token[s] >= 0) order.emplace_back(H.slot_token[s], static_cast<std::int32_t>(s));
    std::sort(order.begin(), order.end());
    HeadStore fresh;
    std::vector<std::uint32_t> fresh_pages;
    const auto B = static_cast<std::size_t>(layout_.tokens);
    const BlockLayout& Y = layout_;
    for (const auto& [tok, slot] : order) {
      const auto ns = static_cast<std::size_t>(fresh.slots());
      if (ns % B == 0) {
        fresh_pages.push_back(take_page());
        fresh.valid.resize(fresh.valid.size() + HeadStore::words_per_block(layout_.tokens), 0);
      }
      fresh.slot_token.push_back(-1);
      fresh.slot_score.push_back(0.f);
      const auto so = static_cast<std::size_t>(slot) % B, dof = ns % B;
      const std::byte* src = pool_->data(table[static_cast<std::size_t>(slot) / B]);
      std::byte* dst = pool_->data(fresh_pages.back());
      std::memcpy(dst + Y.k_codes + dof * Y.k_row, src + Y.k_codes + so * Y.k_row, Y.k_row);
      std::memcpy(dst + Y.k_meta + dof * Y.k_meta_token, src + Y.k_meta + so * Y.k_meta_token, Y.k_meta_token);
      std::memcpy(dst + Y.v_codes + dof * Y.v_row, src + Y.v_codes + so * Y.v_row, Y.v_row);
      std::memcpy(dst + Y.v_meta + dof * Y.v_meta_token, src + Y.v_meta + so * Y.v_meta_token, Y.v_meta_token);
      std::memcpy(dst + Y.positions + dof * 4, src + Y.positions + so * 4, 4);
      pool_->header(fresh_pages.back()).count = static_cast<std::uint16_t>(dof + 1);
      fresh.fill_slot(static_cast<std::int64_t>(ns), tok, H.slot_score[static_cast<std::size_t>(slot)], layout_.tokens);
    }
    for (const std::uint32_t p : table) pool_->release(p);
    table = std::move(fresh_pages);
    H = std::move(fresh);
  }

  /// First step of an append: stages and checks its rows (ChunkStage::stage).
  [[nodiscard]] Status stage_chunk(int li, std::span<const float> k, std::span<const float> v) {
    return stage_.stage(shape_, li, layer(li).total, k, v);
  }

  /// Stores n appended tokens (k, v: [n][kv_heads][D], staged by stage_chunk; pos: [n]): sinks
  /// first, then pending (scores 0); the staged copy becomes the latest chunk. As SequenceStore::push.
  void push(Layer& L, std::span<const float> k, std::span<const float> v, std::span<const std::int32_t> pos) {
    const auto n = static_cast<std::int64_t>(pos.size());
    const auto row = static_cast<std::ptrdiff_t>(row_floats());
    stage_.swap_into(L.chunk_k, L.chunk_v);
    L.chunk_tokens = n;
    std::int64_t t = 0;
    for (; t < n && L.sinks_held < SinkTokens; ++t, ++L.sinks_held) {
      L.sink_k.insert(L.sink_k.end(), k.begin() + t * row, k.begin() + (t + 1) * row);
      L.sink_v.insert(L.sink_v.end(), v.begin() + t * row, v.begin() + (t + 1) * row);
      L.sink_pos.push_back(pos[static_cast<std::size_t>(t)]);
    }
    if (t < n) L.pend.push(k.data() + t * row, v.data() + t * row, pos.data() + t, static_cast<std::size_t>(n - t));
    L.total += n;
  }

  /// Quantizes the oldest pending tokens of layer li beyond max(residual, hook.keep_exact), one
  /// slot per token and KV head, the hook enforcing its budget after every slot: the loop of
  /// SequenceStore::commit (evicting branch), writing into pages. Returns whether anything was committed.
  template <class Hook>
  bool commit(int li, Hook& hook) {
    Layer& L = layer(li);
    const int B = layout_.tokens;
    const std::int64_t pending = L.pend.size();
    const std::int64_t keep = std::max<std::int64_t>(ResidualTokens, hook.keep_exact(*this, li));
    const std::int64_t n_commit = pending - keep;
    if (n_commit <= 0) return false;
    const auto stride = static_cast<std::ptrdiff_t>(row_floats());
    const std::int64_t first_index = L.total - pending;
    for (std::int64_t t0 = 0; t0 < n_commit; ++t0) {
      for (int h = 0; h < shape_.kv_heads; ++h) {
        HeadStore& H = L.heads[static_cast<std::size_t>(h)];
        const std::int64_t slot = take_slot(L, h);
        H.fill_slot(slot, first_index + t0, L.pend.score(t0, h), B);
        hook.on_commit(*this, li, h, slot, first_index + t0);
        const std::uint32_t p = writable(L, h, static_cast<std::size_t>(slot / B));
        const auto off = static_cast<std::size_t>(slot % B);
        const std::ptrdiff_t at = t0 * stride + static_cast<std::ptrdiff_t>(h) * shape_.head_dim;
        BlockHeader& hd = pool_->header(p);
        Codec::encode(layout_, pool_->data(p), hd.flags, off, L.pend.k() + at, L.pend.v() + at, stride, L.pend.positions() + t0);
        if (off + 1 > hd.count) hd.count = static_cast<std::uint16_t>(off + 1);
        ++hd.version;
        hook.enforce(*this, li, h, pending - (t0 + 1));
      }
      ++L.committed;
    }
    L.pend.drop_front(n_commit);
    return true;
  }

  /// Kernel arguments for the n_q newest queries of layer L (cache_detail::attend_args).
  [[nodiscard]] kernels::AttendArgs args_for(const Layer& L, const float* q, float* out, std::int64_t n_q,
                                             int group) const noexcept {
    return cache_detail::attend_args(shape_, L.total, q, out, n_q, group);
  }

  /// Segments of KV head h of layer li, as SequenceStore::segments (evicting branch): exact rows,
  /// then every page with count min(B, slots - b * B) when hook.block_visible, else 0 (unread),
  /// its validity words as the mask. Block refs go to `refs` (cleared first).
  template <class Hook, class Offload>
  [[nodiscard]] kernels::HeadSegments segments(int li, int h, const Hook& hook, const Offload&,
                                               std::vector<kernels::BlockRef>& refs) const {
    const Layer& L = layer(li);
    const auto stride = static_cast<std::int64_t>(row_floats());
    kernels::HeadSegments seg = cache_detail::exact_segments(L, stride, static_cast<std::int64_t>(h) * shape_.head_dim);
    refs.clear();
    const HeadStore& H = L.heads[static_cast<std::size_t>(h)];
    const auto& table = L.pages[static_cast<std::size_t>(h)];
    const int B = layout_.tokens;
    const std::size_t w = HeadStore::words_per_block(B);
    for (std::size_t b = 0; b < table.size(); ++b) {
      const std::int64_t count =
          hook.block_visible(*this, li, h, b) ? std::min<std::int64_t>(B, H.slots() - static_cast<std::int64_t>(b) * B) : 0;
      kernels::BlockRef r{pool_->data(table[b]), 0, static_cast<int>(count), H.valid.data() + b * w};
      r.slot_index = H.slot_token.data() + b * static_cast<std::size_t>(B);  // the bias of a masked batch, by cache index
      refs.push_back(r);
    }
    seg.blocks = refs;
    return seg;
  }


  /// Key ordinals of `seg` (the length of an AttendArgs::key_mass array for it).
  [[nodiscard]] std::int64_t ordinals(const kernels::HeadSegments& seg) const noexcept {
    return seg.sinks.count + static_cast<std::int64_t>(seg.blocks.size()) * layout_.tokens + seg.pending.count +
           seg.chunk.count;
  }

 private:
  // A page from the spares taken for this operation. pages_bound counts every page an operation
  // can take, so running out is a bug, not a runtime condition: stop rather than corrupt a page.
  std::uint32_t take_page() {
    if (!spare_ || spare_->empty()) std::abort();
    const std::uint32_t p = spare_->back();
    spare_->pop_back();
    return p;
  }
  // Page `b` of KV head h, copied first when shared (copy-on-write); returns its id.
  std::uint32_t writable(Layer& L, int h, std::size_t b) {
    auto& table = L.pages[static_cast<std::size_t>(h)];
    if (pool_->refs(table[b]) > 1) {
      if (!spare_ || spare_->empty()) std::abort();
      make_writable(*pool_, table, b, *spare_);
    }
    return table[b];
  }
  // A free slot (reused last-freed first), growing by one page when needed: HeadStore::take_slot.
  std::int64_t take_slot(Layer& L, int h) {
    HeadStore& H = L.heads[static_cast<std::size_t>(h)];
    if (!H.free_slots.empty()) {
      const std::int32_t s = H.free_slots.back();
      H.free_slots.pop_back();
      return s;
    }
    const std::int64_t s = H.slots();
    if (s % layout_.tokens == 0) {
      L.pages[static_cast<std::size_t>(h)].push_back(take_page());
      H.valid.resize(H.valid.size() + HeadStore::words_per_block(layout_.tokens), 0);
    }
    H.slot_token.push_back(-1);
    H.slot_score.push_back(0.f);
    return s;
  }

  PagePool* pool_;
  std::vector<std::uint32_t>* spare_ = nullptr;
  ModelShape shape_;
  BlockLayout layout_;
  BlockHeader proto_;
  std::vector<Layer> layers_;
  ChunkStage stage_;  // the append in progress, checked (stage_chunk)
};

}  // namespace kvpack::pool_detail
