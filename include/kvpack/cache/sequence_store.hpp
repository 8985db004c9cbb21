// SequenceStore: everything one sequence's KV cache holds, per layer, and the token lifecycle
// over it: appended tokens fill the fp32 sinks first, then the pending rows; commit() quantizes
// the oldest pending tokens beyond the residual window into blocks, one commit unit at a time
// (1 token, a per-channel key group, or a keyframe interval: the codec hook's unit), so codes
// depend only on the tokens, never on how they were chunked (CASES C12). segments() describes a
// KV head for the attention kernel (sinks, blocks, pending, the latest chunk, exact).
//
// Per-sequence state only: scratch lives in the caller's Workspace (cache/workspace.hpp), the
// eviction policy's own state in its hook (eviction/), so a pool of sequences can hold many
// SequenceStores and share one set of hooks' code.
#pragma once

#include <algorithm>
#include <cmath>
#include <cstddef>
#include <cstdint>
#include <span>
#include <vector>

#include "kvpack/cache/block.hpp"
#include "kvpack/cache/chunk_stage.hpp"
#include "kvpack/cache/demotion_tier.hpp"
#include "kvpack/cache/exact_segments.hpp"
#include "kvpack/cache/head_store.hpp"
#include "kvpack/cache/pending_rows.hpp"
#include "kvpack/cache/position_runs.hpp"
#include "kvpack/cache/shape.hpp"
#include "kvpack/detail/secure_zero.hpp"
#include "kvpack/kernels/dispatch.hpp"

namespace kvpack {

/// Storage and token lifecycle of one sequence: Codec is a CodecHook, SinkTokens / ResidualTokens
/// the Sinks<N> / Residual<R> counts, Evicts whether blocks hold reusable slots, Tier the
/// low-precision tier that evicted tokens are demoted to (DemotionTier, cache/demotion_tier.hpp;
/// NoDemotionTier: they are deleted).
template <class Codec, int SinkTokens, int ResidualTokens, bool Evicts, class Tier = NoDemotionTier>
class SequenceStore {
  static_assert(!Tier::enabled || Evicts, "SequenceStore: a demotion tier needs an evicting store");

 public:
  using codec = Codec;                                    ///< the CodecHook
  using tier_type = Tier;                                 ///< the demotion tier (NoDemotionTier: none)
  static constexpr int sink_tokens = SinkTokens;          ///< Sinks<N>
  static constexpr int residual_tokens = ResidualTokens;  ///< Residual<R>
  static constexpr bool evicts = Evicts;                  ///< blocks hold reusable slots
  /// One layer: fp32 sinks, pending rows, the exact copy of the latest append, and its KV heads.
  struct Layer {
    std::vector<float> sink_k, sink_v;  ///< [sinks_held][kv_heads][D]
    std::vector<std::int32_t> sink_pos;
    PendingRows pend;                   ///< [pending][kv_heads][D], oldest first
    std::vector<float> chunk_k, chunk_v;  ///< exact copy of the latest append
    std::vector<std::int32_t> chunk_pos;  ///< ... and its positions
    std::vector<HeadStore> heads;       ///< [kv_head]
    /// Positions of the quantized tokens (block slots, commit order) when the block payloads hold
    /// none (layout().pos_bytes == 0: no eviction); empty otherwise.
    PositionRuns block_pos;
    std::int64_t sinks_held = 0, committed = 0, total = 0, chunk_tokens = 0;
  };

  SequenceStore() = default;
  /// slot_positions: whether block payloads store each slot's position (always with eviction,
  /// whose slots are reused); otherwise each layer keeps them as runs (Layer::block_pos).
  SequenceStore(const ModelShape& shape, int block_tokens, bool slot_positions = true)
      : shape_(shape),
        layout_(make_block_layout<typename Codec::key_codec, typename Codec::value_codec, Codec::keys_per_channel>(
            block_tokens, shape.head_dim, Evicts || slot_positions)),
        proto_(Codec::header(shape.head_dim)) {
    if constexpr (Tier::enabled) tier_ = Tier(shape, block_tokens);
    reset();
  }
  SequenceStore(SequenceStore&& o) noexcept
      : shape_(o.shape_), layout_(o.layout_), proto_(o.proto_), layers_(std::move(o.layers_)), tier_(std::move(o.tier_)),
        stage_(std::move(o.stage_)) {
    o.layers_.clear();
    o.shape_.layers = 0;
  }
  SequenceStore& operator=(SequenceStore&& o) noexcept {
    if (this != &o) {
      wipe();
      shape_ = o.shape_, layout_ = o.layout_, proto_ = o.proto_, layers_ = std::move(o.layers_);
      tier_ = std::move(o.tier_);
      stage_ = std::move(o.stage_);
      o.layers_.clear();
      o.shape_.layers = 0;
    }
    return *this;
  }
  ~SequenceStore() { wipe(); }

  [[nodiscard]] const ModelShape& shape() const noexcept { return shape_; }
  [[nodiscard]] const BlockLayout& layout() const noexcept { return layout_; }
  [[nodiscard]] const BlockHeader& proto() const noexcept { return proto_; }
  [[nodiscard]] Layer& layer(int li) noexcept { return layers_[static_cast<std::size_t>(li)]; }
  [[nodiscard]] const Layer& layer(int li) const noexcept { return layers_[static_cast<std::size_t>(li)]; }
  [[nodiscard]] std::span<const Layer> layers() const noexcept { return layers_; }
  /// The demotion tier (a NoDemotionTier without Demote<>).
  [[nodiscard]] const Tier& tier() const noexcept { return tier_; }
  [[nodiscard]] std::size_t row_floats() const noexcept {
    return static_cast<std::size_t>(shape_.kv_heads) * static_cast<std::size_t>(shape_.head_dim);
  }
  /// Tokens the layer holds (the largest over KV heads).
  [[nodiscard]] std::int64_t held(const Layer& L) const noexcept {
    if constexpr (Evicts) {
      std::int64_t live = 0;
      for (const HeadStore& H : L.heads) live = std::max(live, H.live);
      return L.sinks_held + live + L.pend.size();
    } else {
      return L.total;
    }
  }

  /// Drops live `slot` of KV head h of layer li (an eviction policy's victim): with a demotion
  /// tier its K/V row is first re-coded into the low tier (DemotionTier::demote), then the slot is
  /// evicted (zeroed and freed, HeadStore::evict_slot). Without one, exactly evict_slot.
  /// `high_budget`: the policy's budget in tokens (a Fp16Share low tier's cap depends on it).
  void drop_slot(int li, int h, std::int64_t slot, std::int64_t high_budget = 0) noexcept(!Tier::enabled) {
    HeadStore& H = layer(li).heads[static_cast<std::size_t>(h)];
    if constexpr (Tier::enabled) tier_.demote(layout_, H, slot, li, h, high_budget);
    else (void)high_budget;
    H.evict_slot(slot, layout_);
  }
  /// Demotes live `slot` of KV head h of layer li without evicting it (block-granular eviction
  /// forgets its slots itself); a no-op without a demotion tier or for a free slot.
  void demote_slot(int li, int h, std::int64_t slot, std::int64_t high_budget = 0) {
    if constexpr (Tier::enabled) tier_.demote(layout_, layer(li).heads[static_cast<std::size_t>(h)], slot, li, h, high_budget);
    else (void)li, (void)h, (void)slot, (void)high_budget;
  }

  /// Blocks KV head h of layer li has allocated (BlockSparse's block count; masked-out ones included).
  [[nodiscard]] std::size_t block_count(int li, int h) const noexcept { return layer(li).heads[static_cast<std::size_t>(h)].blocks.size(); }
  /// BlockSparse's compaction without allocating: the blocks of KV head h of layer li for which
  /// keep(b) is false (masked out, their slots forgotten) are zeroed and freed, the others move
  /// down in order with their slot bookkeeping. The live tokens end densely in cache-index order,
  /// as HeadStore::compact would write them (whole blocks go, never part of one).
  template <class Keep>
  void erase_blocks(int li, int h, Keep&& keep) noexcept {
    HeadStore& H = layer(li).heads[static_cast<std::size_t>(h)];
    const auto B = static_cast<std::size_t>(layout_.tokens), w = HeadStore::words_per_block(layout_.tokens);
    const std::size_t old_slots = H.slot_token.size();  // only the last block may be partly allocated
    std::size_t to = 0, slots = 0;
    for (std::size_t b = 0; b < H.blocks.size(); ++b) {
      if (!keep(b)) {
        if (H.blocks[b].data) detail::secure_zero(H.blocks[b].data.get(), H.blocks[b].bytes);
        continue;
      }
      const std::size_t n = std::min(B, old_slots - b * B);
      if (to != b) {
        H.blocks[to] = std::move(H.blocks[b]);  // frees a masked-out payload moved over (zeroed above)
        std::copy_n(H.valid.begin() + static_cast<std::ptrdiff_t>(b * w), w, H.valid.begin() + static_cast<std::ptrdiff_t>(to * w));
        std::copy_n(H.slot_token.begin() + static_cast<std::ptrdiff_t>(b * B), n, H.slot_token.begin() + static_cast<std::ptrdiff_t>(to * B));
        std::copy_n(H.slot_score.begin() + static_cast<std::ptrdiff_t>(b * B), n, H.slot_score.begin() + static_cast<std::ptrdiff_t>(to * B));
      }
      slots = to * B + n;
      ++to;
    }
    H.blocks.erase(H.blocks.begin() + static_cast<std::ptrdiff_t>(to), H.blocks.end());  // frees the dropped payloads
    H.valid.resize(to * w);
    H.slot_token.resize(slots), H.slot_score.resize(slots);
  }
  /// Rewrites KV head h of layer li densely (HeadStore::compact): SnapKV's compaction, through the
  /// store so that a paged store (pool/evicting_store.hpp) can compact into pool pages instead.
  void compact_head(int li, int h) { layer(li).heads[static_cast<std::size_t>(h)].compact(layout_, proto_); }

  /// Empties every layer (zeroing first) and sizes them for the shape.
  void reset() {
    wipe();
    if constexpr (Tier::enabled) tier_.reset();
    layers_.resize(static_cast<std::size_t>(shape_.layers));
    for (Layer& L : layers_) {
      L.heads.resize(static_cast<std::size_t>(shape_.kv_heads));
      L.pend.configure(row_floats(), Evicts ? static_cast<std::size_t>(shape_.kv_heads) : 0);
    }
  }

  /// Empties every layer like reset(), but keeps each KV head's block allocations, zeroed, as
  /// spares that its next commits take first (HeadStore::new_block): a cache reused for the next
  /// request allocates no blocks and takes no page faults for them. Blocks of another size
  /// (keyframe blocks fitted to their modes) and offloaded ones (null data) are released. May
  /// throw std::bad_alloc before changing anything.
  void clear() {
    const auto heads = static_cast<std::size_t>(shape_.kv_heads);
    std::vector<std::vector<Block>> keep(layers_.size() * heads);
    for (std::size_t i = 0; i < keep.size(); ++i) {
      const HeadStore& H = layers_[i / heads].heads[i % heads];
      keep[i].reserve(H.spare.size() + H.blocks.size());
    }
    for (std::size_t i = 0; i < keep.size(); ++i) {  // nothing below allocates
      HeadStore& H = layers_[i / heads].heads[i % heads];
      for (Block& b : H.spare) keep[i].push_back(std::move(b));  // zeroed since allocated
      for (Block& b : H.blocks)
        if (b.data && b.bytes == layout_.bytes) {
          detail::secure_zero(b.data.get(), b.bytes);
          b.header = proto_;
          keep[i].push_back(std::move(b));
        }
    }
    reset();  // zeroes and releases the rest
    for (std::size_t i = 0; i < keep.size(); ++i) layers_[i / heads].heads[i % heads].spare = std::move(keep[i]);
  }

  /// Allocates ahead all that push and commit of n tokens to layer li need (sinks, pending rows,
  /// blocks, slot bookkeeping), so they allocate nothing (KVCache::append's strong guarantee).
  /// Blocks: the commit rule's count, exact without eviction; with eviction, the committed tokens
  /// that find no free slot, capped at the hook's budget plus one unit. Keyframe blocks are
  /// reserved at BlockLayout::bytes; commit moves each into an allocation of its own size by a
  /// nothrow allocation that keeps the reserved buffer if it fails (fit_payload). `pos`: the
  /// appended positions. May throw std::bad_alloc, leaving the contents unchanged.
  template <class Hook>
  void reserve_append(int li, std::span<const std::int32_t> pos, Hook& hook) {
    const auto n = static_cast<std::int64_t>(pos.size());
    Layer& L = layer(li);
    if (!Evicts && layout_.pos_bytes == 0)  // runs of the pending and new positions (a bound on the committed ones)
      L.block_pos.reserve_runs(L.block_pos.runs_added(
          std::span<const std::int32_t>(L.pend.positions(), static_cast<std::size_t>(L.pend.size())), pos));
    const std::size_t to_sinks = reserve_append_rows(L, n, row_floats(), SinkTokens, direct_tokens(li, n, hook));
    reserve_geometric(L.chunk_pos, static_cast<std::size_t>(n));
    Codec::reserve_encode(shape_.head_dim);
    constexpr std::int64_t unit = Codec::commit_unit;
    const std::int64_t keep = std::max<std::int64_t>(ResidualTokens, hook.keep_exact(*this, li));
    // Evicting caches commit the previous pending tokens before the push; the others after it.
    const std::int64_t pending = L.pend.size() + (Evicts ? 0 : n - static_cast<std::int64_t>(to_sinks));
    const std::int64_t n_commit = std::max<std::int64_t>(0, (pending - keep) / unit * unit);
    for (HeadStore& H : L.heads) {
      if constexpr (Evicts) {
        std::int64_t after = H.slots() + std::max<std::int64_t>(0, n_commit - static_cast<std::int64_t>(H.free_slots.size()));
        // Slots are reused once the budget holds, except by BlockSparse, and not while a
        // Protocol's prompt lasts (its end commits every pending token before evicting).
        bool capped = Hook::evicts_continuously && Hook::required_block_tokens == 0 && hook.budget() > 0;
        if constexpr (requires { hook.ended(li); }) capped = capped && hook.ended(li);
        if (capped) after = std::min(after, std::max(H.slots(), hook.budget() + unit));
        H.reserve_slots(after, true, layout_, proto_);
        if constexpr (requires { hook.reserve_blocks(li, 0, std::size_t{}); })
          hook.reserve_blocks(li, static_cast<int>(&H - L.heads.data()), H.blocks.capacity());
        // Every slot evicted in this append is demoted: at most what exceeds the budget after it
        // (plus one block for block-granular eviction), never more than the slots and pending tokens.
        if constexpr (Tier::enabled) {
          const std::int64_t held = L.sinks_held + H.live + L.pend.size() + n;
          const std::int64_t over = std::clamp<std::int64_t>(held - hook.budget() + layout_.tokens, 0, H.live + L.pend.size() + n);
          tier_.reserve(li, static_cast<int>(&H - L.heads.data()), over);
        }
      } else {
        H.reserve_slots(L.committed + n_commit, false, layout_, proto_);
      }
    }
  }

  /// Of an n-token append to layer li, the tokens after the sinks that commit() would quantize in it
  /// beyond all pending rows, if those are whole units that all commit (commit_pending() first); push()
  /// skips them, commit_direct() encodes them from the caller's rows (same codes). 0 if evicting.
  template <class Hook>
  [[nodiscard]] std::int64_t direct_tokens(int li, std::int64_t n, const Hook& hook) const {
    if constexpr (Evicts) return 0;
    else {  // NOLINT(readability-else-after-return): discards the hook call for evicting stores
      constexpr std::int64_t unit = Codec::commit_unit;
      const Layer& L = layer(li);
      const std::int64_t pending = L.pend.size(), after_sinks = n - std::min<std::int64_t>(n, SinkTokens - L.sinks_held);
      const std::int64_t keep = std::max<std::int64_t>(ResidualTokens, hook.keep_exact(*this, li));
      const std::int64_t n_commit = std::max<std::int64_t>(0, (pending + after_sinks - keep) / unit * unit);
      return pending % unit != 0 || n_commit <= pending ? 0 : n_commit - pending;
    }
  }

  /// Encodes every pending row of layer li (whole units) ahead of the append's direct tokens.
  void commit_pending(int li) {
    static_assert(!Evicts, "SequenceStore::commit_pending: evicting stores commit through their hook");
    Layer& L = layer(li);
    encode_units(L, L.pend.k(), L.pend.v(), L.pend.positions(), L.pend.size());
    L.pend.drop_front(L.pend.size());
  }

  /// First step of an append: stages and checks its rows (ChunkStage::stage).
  [[nodiscard]] Status stage_chunk(int li, std::span<const float> k, std::span<const float> v) {
    return stage_.stage(shape_, li, layer(li).total, k, v);
  }
  [[nodiscard]] std::size_t stage_bytes() const noexcept { return stage_.allocated_bytes(); }  ///< the stage's capacity

  /// Stores n appended tokens (k, v: [n][kv_heads][D], staged by stage_chunk; pos: [n]): sinks
  /// first, then pending (except the `direct` tokens after the sinks, which commit_direct
  /// encodes); the staged copy becomes the latest chunk.
  void push(Layer& L, std::span<const float> k, std::span<const float> v, std::span<const std::int32_t> pos,
            std::int64_t direct = 0) {
    const auto n = static_cast<std::int64_t>(pos.size());
    const std::size_t row = row_floats();
    stage_.swap_into(L.chunk_k, L.chunk_v);
    L.chunk_pos.assign(pos.begin(), pos.end());
    L.chunk_tokens = n;
    std::int64_t t = 0;
    for (; t < n && L.sinks_held < SinkTokens; ++t, ++L.sinks_held) {
      L.sink_k.insert(L.sink_k.end(), k.begin() + t * row, k.begin() + (t + 1) * row);
      L.sink_v.insert(L.sink_v.end(), v.begin() + t * row, v.begin() + (t + 1) * row);
      L.sink_pos.push_back(pos[static_cast<std::size_t>(t)]);
    }
    t += direct;
    if (t < n) L.pend.push(k.data() + t * row, v.data() + t * row, pos.data() + t, static_cast<std::size_t>(n - t));
    L.total += n;
  }

  /// Encodes the `direct` tokens that push() left out of the pending rows (direct_tokens() of
  /// the same append, made right after that push): they follow the chunk's sink tokens and come
  /// from the latest-chunk copy. Non-evicting stores only.
  void commit_direct(int li, std::int64_t direct) {
    static_assert(!Evicts, "SequenceStore::commit_direct: evicting stores commit through their hook");
    Layer& L = layer(li);
    if (direct <= 0) return;
    const std::int64_t first = L.chunk_tokens - L.pend.size() - direct;  // chunk row of the first direct token
    const auto stride = static_cast<std::ptrdiff_t>(row_floats());
    encode_units(L, L.chunk_k.data() + first * stride, L.chunk_v.data() + first * stride,
                 L.chunk_pos.data() + first, direct);
  }

  /// Quantizes the oldest pending tokens of layer li beyond max(residual, hook.keep_exact) into
  /// blocks, in whole commit units. With eviction, each token takes a slot (hook.on_commit) and
  /// the hook enforces its budget after every slot, so a long prefill reuses slots instead of
  /// growing past the budget. Returns whether anything was committed.
  template <class Hook>
  bool commit(int li, Hook& hook) {
    Layer& L = layer(li);
    constexpr std::int64_t unit = Codec::commit_unit;
    const std::int64_t pending = L.pend.size();
    const std::int64_t keep = std::max<std::int64_t>(ResidualTokens, hook.keep_exact(*this, li));
    const std::int64_t n_commit = (pending - keep) / unit * unit;
    if (n_commit <= 0) return false;
    if constexpr (Evicts) {
      const int B = layout_.tokens;
      const auto stride = static_cast<std::ptrdiff_t>(row_floats());
      const std::int64_t first_index = L.total - pending;
      for (std::int64_t t0 = 0; t0 < n_commit; t0 += unit) {
        for (int h = 0; h < shape_.kv_heads; ++h) {
          HeadStore& H = L.heads[static_cast<std::size_t>(h)];
          const std::int64_t slot = H.take_slot(layout_, proto_);
          H.fill_slot(slot, first_index + t0, L.pend.score(t0, h), B);
          hook.on_commit(*this, li, h, slot, first_index + t0);
          Block& b = H.blocks[static_cast<std::size_t>(slot / B)];
          const auto off = static_cast<std::size_t>(slot % B);
          const std::ptrdiff_t at = t0 * stride + static_cast<std::ptrdiff_t>(h) * shape_.head_dim;
          Codec::encode(layout_, b, off, L.pend.k() + at, L.pend.v() + at, stride, L.pend.positions() + t0);
          if constexpr (Codec::interval_blocks) fit_payload(b, layout_.at(b.header.flags).bytes);  // its modes' size
          if (off + static_cast<std::size_t>(unit) > b.header.count) b.header.count = static_cast<std::uint16_t>(off + unit);
          ++b.header.version;
          hook.enforce(*this, li, h, pending - (t0 + unit));
        }
        L.committed += unit;
      }
    } else {
      encode_units(L, L.pend.k(), L.pend.v(), L.pend.positions(), n_commit);
    }
    L.pend.drop_front(n_commit);
    return true;
  }

  /// Kernel arguments for the n_q newest queries of layer L (GQA group `group`; see
  /// cache_detail::attend_args).
  [[nodiscard]] kernels::AttendArgs args_for(const Layer& L, const float* q, float* out, std::int64_t n_q,
                                             int group) const noexcept {
    return cache_detail::attend_args(shape_, L.total, q, out, n_q, group);
  }

  /// Segments of KV head h of layer li: sinks, blocks, pending before the latest chunk, and the
  /// latest chunk (exact). Block refs go to `refs` (cleared first). With eviction, a block is read
  /// iff hook.block_visible; a block whose payload was handed to an offload store (null data) is
  /// read through off.view(h, block) (pinned by the offload state's begin_attend).
  template <class Hook, class Offload>
  [[nodiscard]] kernels::HeadSegments segments(int li, int h, const Hook& hook, const Offload& off,
                                               std::vector<kernels::BlockRef>& refs) const {
    const Layer& L = layer(li);
    const std::int64_t stride = static_cast<std::int64_t>(row_floats());
    const std::int64_t hoff = static_cast<std::int64_t>(h) * shape_.head_dim;
    const std::int64_t chunk_start = L.total - L.chunk_tokens;
    const int B = layout_.tokens;
    const HeadStore& H = L.heads[static_cast<std::size_t>(h)];
    kernels::HeadSegments seg = cache_detail::exact_segments(L, stride, hoff);
    refs.clear();
    if constexpr (Evicts) {
      const std::int64_t n_slots = H.slots();
      const std::size_t w = HeadStore::words_per_block(B);
      for (std::size_t b = 0; b < H.blocks.size(); ++b) {
        const std::int64_t count =
            hook.block_visible(*this, li, h, b) ? std::min<std::int64_t>(B, n_slots - static_cast<std::int64_t>(b) * B) : 0;
        refs.push_back({H.blocks[b].data.get(), 0, static_cast<int>(count), H.valid.data() + b * w});  // 0: unread
      }
    } else {
      for (const Block& b : H.blocks) {
        const std::int64_t first = L.sinks_held + static_cast<std::int64_t>(refs.size()) * B;
        const std::int64_t count = std::min<std::int64_t>(b.header.count, chunk_start - first);
        if (count <= 0) break;
        const std::byte* data = b.data ? b.data.get() : off.view(h, refs.size());
        refs.push_back({data, first, static_cast<int>(count), nullptr, b.header.flags});
      }
    }
    seg.blocks = refs;
    return seg;
  }

  /// Key ordinals of `seg` (the length of an AttendArgs::key_mass array for it).
  [[nodiscard]] std::int64_t ordinals(const kernels::HeadSegments& seg) const noexcept {
    return seg.sinks.count + static_cast<std::int64_t>(seg.blocks.size()) * layout_.tokens + seg.pending.count +
           seg.chunk.count;
  }

  /// Zeroes every byte held and releases the layers.
  void wipe() noexcept {
    for (Layer& L : layers_) {
      for (HeadStore& H : L.heads) H.zero_blocks();
      L.block_pos.wipe();
      for (auto* v : {&L.sink_k, &L.sink_v, &L.chunk_k, &L.chunk_v}) detail::wipe_vector(*v);
      detail::wipe_vector(L.sink_pos);
      detail::wipe_vector(L.chunk_pos);
      L.pend.wipe();
    }
    layers_.clear();
    stage_.wipe();
    if constexpr (Tier::enabled) tier_.wipe();
  }

 private:
  // Non-evicting commit: encodes n (whole commit units) rows k/v/pos ([n][kv_heads][D], row
  // stride row_floats) into the next slots of every KV head, opening blocks as they fill
  // (reserved by reserve_append); without slot positions, their positions go to L.block_pos.
  void encode_units(Layer& L, const float* k, const float* v, const std::int32_t* pos, std::int64_t n) {
    constexpr std::int64_t unit = Codec::commit_unit;
    if (layout_.pos_bytes == 0) L.block_pos.push(pos, n);  // runs reserved: allocates nothing
    const int B = layout_.tokens;
    const auto stride = static_cast<std::ptrdiff_t>(row_floats());
    for (std::int64_t t0 = 0; t0 < n; t0 += unit) {
      const std::int64_t slot = L.committed;
      for (int h = 0; h < shape_.kv_heads; ++h) {
        HeadStore& H = L.heads[static_cast<std::size_t>(h)];
        if (slot % B == 0) H.blocks.push_back(H.new_block(layout_, proto_));
        Block& b = H.blocks[static_cast<std::size_t>(slot / B)];
        const auto off = static_cast<std::size_t>(slot % B);
        const std::ptrdiff_t at = t0 * stride + static_cast<std::ptrdiff_t>(h) * shape_.head_dim;
        Codec::encode(layout_, b, off, k + at, v + at, stride, pos + t0);
        if constexpr (Codec::interval_blocks) fit_payload(b, layout_.at(b.header.flags).bytes);  // its modes' size
        b.header.count = static_cast<std::uint16_t>(std::max<std::size_t>(b.header.count, off + static_cast<std::size_t>(unit)));
        ++b.header.version;
      }
      L.committed += unit;
    }
  }

  ModelShape shape_;
  BlockLayout layout_;
  BlockHeader proto_;
  std::vector<Layer> layers_;
  [[no_unique_address]] Tier tier_;  // the low-precision tier of demoted tokens (empty without Demote<>)
  ChunkStage stage_;                  // the append in progress, checked (stage_chunk)
};

}  // namespace kvpack
