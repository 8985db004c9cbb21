// Demotion instead of deletion (issue 24; MiKV, "No Token Left Behind: Reliable KV Cache
// Compression via Importance-Aware Mixed Precision Quantization", Yang et al. 2024,
// arXiv:2402.18096): a token an eviction policy drops from the high-precision blocks is re-coded
// into a low-precision tier of the same cache instead of being deleted, and attention reads both.
//
// DemotionTier<High, Low> holds, per (layer, KV head), blocks of the low codec pair (its own
// BlockLayout, the cache's block size B), filled row by row in demotion order:
//     low block payload: [B][low K codes + meta], [B][low V codes + meta], [B] int32 positions
// (BlockLayout of Low). A demoted row is decoded from its high block exactly as the kernel reads
// it (High::decode, as read_back does), then encoded by the low codecs (per token: each row on its
// own, so codes do not depend on which tokens were demoted with it). Low rows are never scored.
// A cap (set_cap: the Demote<> budget, cache/demotion_budget.hpp) bounds the live low rows per
// (layer, KV head): past it the OLDEST demoted row is deleted first (FIFO: its bytes zeroed, its
// valid bit cleared; a front block whose rows are all gone is zeroed and reused). All low rows are
// older than any query, so the kernel reads them without a causal mask (the front block through
// its valid mask). NoDemotionTier is the default: it holds nothing and every call compiles away.
#pragma once

#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <vector>

#include "kvpack/cache/block.hpp"
#include "kvpack/cache/demotion_budget.hpp"
#include "kvpack/cache/head_store.hpp"
#include "kvpack/cache/shape.hpp"
#include "kvpack/detail/secure_zero.hpp"
#include "kvpack/kernels/dispatch.hpp"

namespace kvpack {

/// The default: no low tier (an evicted token is deleted).
struct NoDemotionTier {
  static constexpr bool enabled = false;
};

/// Low-precision tier of a cache whose high blocks are coded by CodecHook `High`, demoted rows by
/// CodecHook `Low` (per-token V; K per token, or per channel in groups of G = Low::commit_unit
/// demoted rows: KIVI's axis, the G rows staged in fp32 as the high tier decoded them, and
/// attended so, until the group is full and coded at once).
template <class High, class Low, LowTierBudget Budget = Unbounded>
class DemotionTier {
  static_assert(!Low::interval_blocks, "kvpack::Demote<Keys<LK>, Values<LV>>: no Keyframe<...> low codec");

 public:
  static constexpr bool enabled = true;
  using low_hook = Low;
  /// Demoted rows coded together (1: per-token keys; the key group size with PerChannel keys).
  static constexpr int group = Low::commit_unit;
  /// One (layer, KV head): low blocks (row r at blocks[r / B], slot r % B, in demotion order) and
  /// each row's cache index; the first `dropped` rows of blocks[0] were deleted by the cap.
  struct LowHead {
    std::vector<Block> blocks;
    std::vector<std::int32_t> tokens;  ///< cache index of each row of `blocks` (deleted ones included)
    std::vector<Block> spare;          ///< zeroed low blocks allocated ahead (reserve), used first
    std::int64_t dropped = 0;          ///< rows deleted at the front of blocks[0] (< B)
    std::vector<std::uint64_t> front_valid;  ///< blocks[0]'s slot mask while dropped > 0
    std::vector<float> stage_k, stage_v;     ///< per-channel keys: the newest (< G) rows, fp32 [row][D]
    std::vector<std::int32_t> stage_pos, stage_tok;  ///< their positions and cache indices
    /// Live (attended) low rows, staged ones included.
    [[nodiscard]] std::int64_t rows() const noexcept {
      return static_cast<std::int64_t>(tokens.size() + stage_tok.size()) - dropped;
    }
  };

  DemotionTier() = default;
  /// A tier for `shape` with low blocks of B tokens (the cache's block size).
  DemotionTier(const ModelShape& shape, int B)
      : shape_(shape),
        layout_(make_block_layout<typename Low::key_codec, typename Low::value_codec, Low::keys_per_channel>(
            (B + group - 1) / group * group, shape.head_dim)),  // whole key groups per low block
        one_(make_block_layout<typename High::key_codec, typename High::value_codec, false>(1, shape.head_dim)),
        proto_(Low::header(shape.head_dim)),
        budget_(resolve_low_cap<Budget>(shape.max_tokens, shape.head_dim,
                                        make_block_layout<typename High::key_codec, typename High::value_codec,
                                                          High::keys_per_channel>(B, shape.head_dim),
                                        layout_)),
        cap_(budget_.fixed) {
    reset();
  }
  DemotionTier(DemotionTier&&) noexcept = default;
  DemotionTier& operator=(DemotionTier&& o) noexcept {
    if (this != &o) {
      wipe();
      shape_ = o.shape_, layout_ = o.layout_, one_ = o.one_, proto_ = o.proto_, heads_ = std::move(o.heads_);
      budget_ = o.budget_, cap_ = o.cap_;
      one_block_ = std::move(o.one_block_), s_ = std::move(o.s_);
    }
    return *this;
  }
  ~DemotionTier() { wipe(); }

  [[nodiscard]] const BlockLayout& layout() const noexcept { return layout_; }
  [[nodiscard]] const LowHead& head(int li, int h) const noexcept { return heads_[index(li, h)]; }
  /// Most live low rows per (layer, KV head) (cache/demotion_budget.hpp), as of the latest
  /// demotion for a byte budget; -1: no cap (the default). 0: demotion is deletion.
  [[nodiscard]] std::int64_t cap() const noexcept { return cap_; }

  /// Empties the tier (zeroing first) and sizes it for the shape.
  void reset() {
    wipe();
    heads_.resize(static_cast<std::size_t>(shape_.layers) * static_cast<std::size_t>(shape_.kv_heads));
  }

  /// Allocates ahead room for `rows` more demoted rows of (li, h) (vector capacities, zeroed
  /// blocks), so demote() allocates nothing up to there. May throw std::bad_alloc.
  void reserve(int li, int h, std::int64_t rows) {
    LowHead& H = heads_[index(li, h)];
    const auto B = static_cast<std::size_t>(layout_.tokens);
    std::size_t after = H.tokens.size() + static_cast<std::size_t>(rows);  // physical rows, deleted ones included
    if (cap_ >= 0) after = std::min(after, static_cast<std::size_t>(cap_) + B);  // the cap recycles the rest
    reserve_geometric(H.tokens, after);
    const std::size_t blocks_after = (after + B - 1) / B;
    reserve_geometric(H.blocks, blocks_after);
    reserve_geometric(H.spare, blocks_after + 1);  // + a recycled front block
    if (cap_ >= 0) reserve_geometric(H.front_valid, static_cast<std::size_t>(words()));
    if constexpr (group > 1) {
      const auto rows_d = static_cast<std::size_t>(group) * static_cast<std::size_t>(shape_.head_dim);
      reserve_geometric(H.stage_k, rows_d), reserve_geometric(H.stage_v, rows_d);
      reserve_geometric(H.stage_pos, static_cast<std::size_t>(group)), reserve_geometric(H.stage_tok, static_cast<std::size_t>(group));
    }
    while (H.spare.size() + H.blocks.size() < blocks_after) H.spare.push_back(make_block(layout_, proto_));
    ready_row();
  }

  /// Demotes live `slot` of high head `Hs` (layer li, KV head h, high layout HL): decodes its K/V
  /// row as the kernel reads it, re-encodes it into the next low row with its position and cache
  /// index; at the cap, the oldest low rows are deleted first. `high_budget`: the evicting policy's
  /// budget in tokens (a byte budget's share of the high tier; <= 0: unknown, the high rows held
  /// now count). The caller evicts the slot afterwards. Allocates only past reserve() (may then
  /// throw std::bad_alloc, leaving the tier as it was).
  void demote(const BlockLayout& HL, const HeadStore& Hs, std::int64_t slot, int li, int h, std::int64_t high_budget) {
    const auto su = static_cast<std::size_t>(slot), B = static_cast<std::size_t>(HL.tokens);
    if (Hs.slot_token[su] < 0) return;  // a free slot holds no token
    if (budget_.budget_bytes >= 0) cap_ = budget_.for_high(high_budget > 0 ? high_budget : Hs.live);
    LowHead& H = heads_[index(li, h)];
    if (cap_ >= 0)
      while (H.rows() > 0 && H.rows() >= cap_) drop_oldest(H);
    if (cap_ == 0) return;  // no room for low rows: deletion
    ready_row();
    const auto r = H.tokens.size(), LB = static_cast<std::size_t>(layout_.tokens);
    H.tokens.reserve(r + static_cast<std::size_t>(group));
    if (r % LB == 0 && H.stage_tok.size() + 1 == static_cast<std::size_t>(group)) {
      if (H.spare.empty()) H.spare.push_back(make_block(layout_, proto_));
      H.blocks.reserve(H.blocks.size() + 1);
      H.blocks.push_back(std::move(H.spare.back()));
      H.spare.pop_back();
    }
    const std::byte* src = Hs.blocks[su / B].data.get();
    const std::size_t off = su % B;
    std::byte* one = one_block_.data.get();  // copy the row into a one-token block of the high layout
    std::memcpy(one + one_.k_codes, src + HL.k_codes + off * HL.k_row, HL.k_row);
    std::memcpy(one + one_.k_meta, src + HL.k_meta + off * HL.k_meta_token, HL.k_meta_token);
    std::memcpy(one + one_.v_codes, src + HL.v_codes + off * HL.v_row, HL.v_row);
    std::memcpy(one + one_.v_meta, src + HL.v_meta + off * HL.v_meta_token, HL.v_meta_token);
    std::int32_t pos;
    std::memcpy(&pos, src + HL.positions + off * sizeof pos, sizeof pos);
    High::decode(one_, one, 0, 1, s_);
    if constexpr (group == 1) {
      Block& b = H.blocks.back();
      Low::encode(layout_, b, r % LB, s_.k_tile.data(), s_.v_tile.data(), shape_.head_dim, &pos);
      b.header.count = static_cast<std::uint16_t>(r % LB + 1);
      ++b.header.version;
      H.tokens.push_back(Hs.slot_token[su]);
    } else {  // stage the row; a full group of G rows is coded at once (per-channel key groups)
      const auto D = static_cast<std::ptrdiff_t>(shape_.head_dim);
      H.stage_k.insert(H.stage_k.end(), s_.k_tile.begin(), s_.k_tile.begin() + D);
      H.stage_v.insert(H.stage_v.end(), s_.v_tile.begin(), s_.v_tile.begin() + D);
      H.stage_pos.push_back(pos), H.stage_tok.push_back(Hs.slot_token[su]);
      if (H.stage_tok.size() == static_cast<std::size_t>(group)) {
        Block& b = H.blocks.back();
        Low::encode(layout_, b, r % LB, H.stage_k.data(), H.stage_v.data(), D, H.stage_pos.data());
        b.header.count = static_cast<std::uint16_t>(r % LB + static_cast<std::size_t>(group));
        ++b.header.version;
        H.tokens.insert(H.tokens.end(), H.stage_tok.begin(), H.stage_tok.end());
        clear_stage(H);
      }
    }
    detail::secure_zero(one, one_.bytes);
    detail::secure_zero(s_.k_tile.data(), s_.k_tile.size() * sizeof(float));
    detail::secure_zero(s_.v_tile.data(), s_.v_tile.size() * sizeof(float));
  }

  /// Block refs of the low tier of (li, h) for the attention kernel: every row visible (all are
  /// older than any query); the front block through its valid mask once the cap deleted rows
  /// from it. Written to `refs` (cleared first).
  void refs(int li, int h, std::vector<kernels::BlockRef>& refs) const {
    refs.clear();
    const LowHead& H = heads_[index(li, h)];
    for (const Block& b : H.blocks)  // the front block through its mask once rows were deleted
      refs.push_back({b.data.get(), 0, b.header.count, refs.empty() && H.dropped > 0 ? H.front_valid.data() : nullptr,
                      b.header.flags});
  }

  /// The staged fp32 rows of (li, h) (per-channel keys: fewer than G demoted rows not yet coded)
  /// as exact rows the kernel reads unmasked (every one is older than any query).
  [[nodiscard]] kernels::ExactRows staged(int li, int h) const noexcept {
    const LowHead& H = heads_[index(li, h)];
    return {H.stage_k.data(), H.stage_v.data(), shape_.head_dim, std::int64_t{-(std::int64_t{1} << 40)},
            static_cast<std::int64_t>(H.stage_tok.size())};
  }

  /// Bytes held: per low block its used bytes (codes, metadata, positions) and header, plus 4
  /// bytes of cache index per row; staged rows at fp32 (K, V, position, cache index).
  [[nodiscard]] std::size_t held_bytes() const noexcept {
    std::size_t t = 0;
    for (const LowHead& H : heads_) {
      for (const Block& b : H.blocks) t += layout_.used_bytes(b.header.count) + sizeof(BlockHeader);
      t += H.tokens.size() * sizeof(std::int32_t) + (H.dropped > 0 ? H.front_valid.size() * sizeof(std::uint64_t) : 0) +
           (H.stage_k.size() + H.stage_v.size()) * sizeof(float) + H.stage_tok.size() * 2 * sizeof(std::int32_t);
    }
    return t;
  }
  /// Bytes allocated (low blocks and spares, row bookkeeping, the decode row).
  [[nodiscard]] std::size_t allocated_bytes() const noexcept {
    std::size_t t = one_block_.bytes;
    for (const LowHead& H : heads_)
      t += (H.blocks.size() + H.spare.size()) * layout_.bytes + H.blocks.size() * sizeof(BlockHeader) + H.tokens.capacity() * 4 +
           H.front_valid.capacity() * sizeof(std::uint64_t) + (H.stage_k.capacity() + H.stage_v.capacity()) * sizeof(float) +
           (H.stage_pos.capacity() + H.stage_tok.capacity()) * sizeof(std::int32_t);
    return t;
  }
  /// Low rows of every layer and KV head.
  [[nodiscard]] std::int64_t rows() const noexcept {
    std::int64_t n = 0;
    for (const LowHead& H : heads_) n += H.rows();
    return n;
  }

  /// Zeroes every byte held and releases the rows (the shape is kept).
  void wipe() noexcept {
    for (LowHead& H : heads_) {
      for (Block& b : H.blocks)
        if (b.data) detail::secure_zero(b.data.get(), b.bytes);
      detail::wipe_vector(H.tokens);
      clear_stage(H);
      H.dropped = 0;
    }
    heads_.clear();
  }

 private:
  [[nodiscard]] std::int64_t words() const noexcept { return (layout_.tokens + 63) / 64; }
  // Zeroes and empties the staged rows of H (capacity kept).
  static void clear_stage(LowHead& H) noexcept {
    for (auto* v : {&H.stage_k, &H.stage_v}) {
      detail::secure_zero(v->data(), v->size() * sizeof(float));
      v->clear();
    }
    H.stage_pos.clear(), H.stage_tok.clear();
  }
  // Deletes the oldest live row of H (the cap is reached): zeroes its codes, metadata and position,
  // clears its bit in blocks[0]'s mask; a front block left with no row is zeroed and kept as a
  // spare (its rows' cache indices leave `tokens`). Allocates nothing after reserve().
  void drop_oldest(LowHead& H) {
    const auto LB = static_cast<std::size_t>(layout_.tokens), t = static_cast<std::size_t>(H.dropped);
    if (H.tokens.size() == t) {  // every coded row is gone: the oldest live row is staged
      const auto D = static_cast<std::ptrdiff_t>(shape_.head_dim);
      detail::secure_zero(H.stage_k.data(), static_cast<std::size_t>(D) * sizeof(float));
      detail::secure_zero(H.stage_v.data(), static_cast<std::size_t>(D) * sizeof(float));
      H.stage_k.erase(H.stage_k.begin(), H.stage_k.begin() + D), H.stage_v.erase(H.stage_v.begin(), H.stage_v.begin() + D);
      H.stage_pos.erase(H.stage_pos.begin()), H.stage_tok.erase(H.stage_tok.begin());
      return;
    }
    if (H.dropped == 0) {
      H.front_valid.assign(static_cast<std::size_t>(words()), ~std::uint64_t{0});
    }
    zero_slots(layout_, H.blocks.front().data.get(), t, t + 1);  // per-channel key metadata: kept with its group
    H.front_valid[t / 64] &= ~(std::uint64_t{1} << (t % 64));
    if (++H.dropped < static_cast<std::int64_t>(LB)) return;
    Block b = std::move(H.blocks.front());  // every row of the front block is gone: reuse it
    detail::secure_zero(b.data.get(), b.bytes);
    b.header = proto_;
    H.blocks.erase(H.blocks.begin());
    H.spare.push_back(std::move(b));  // capacity reserved: no allocation
    detail::secure_zero(H.tokens.data(), LB * sizeof(std::int32_t));
    H.tokens.erase(H.tokens.begin(), H.tokens.begin() + static_cast<std::ptrdiff_t>(LB));
    H.dropped = 0;
  }

  // Sizes the decode scratch of one row (once).
  void ready_row() {
    if (one_block_.data) return;
    s_.ensure(1, shape_.head_dim, 1);
    one_block_ = make_block(one_, BlockHeader{});
  }
  [[nodiscard]] std::size_t index(int li, int h) const noexcept {
    return static_cast<std::size_t>(li) * static_cast<std::size_t>(shape_.kv_heads) + static_cast<std::size_t>(h);
  }

  ModelShape shape_;
  BlockLayout layout_;   // low blocks of B tokens
  BlockLayout one_;      // a one-token block of the high codecs (the decode of one row)
  BlockHeader proto_;    // low block header
  std::vector<LowHead> heads_;  // [layer * kv_heads + h]
  Block one_block_;             // the row being demoted, zeroed after use
  kernels::Scratch s_;              // decode tiles of one row, zeroed after use
  LowTierCap budget_;               // the resolved Demote<> budget
  std::int64_t cap_ = -1;           // most live low rows per (layer, KV head); -1: none
};

}  // namespace kvpack
