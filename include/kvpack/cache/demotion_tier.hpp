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
// own, so codes do not depend on which tokens were demoted with it). Low rows are never scored
// nor evicted again (a budget over the low tier is future work); all of them are older than any
// query, so the kernel reads them without a causal mask. NoDemotionTier is the default: it holds
// nothing and every call compiles away.
#pragma once

#include <cstddef>
#include <cstdint>
#include <cstring>
#include <vector>

#include "kvpack/cache/block.hpp"
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
/// CodecHook `Low` (per-token K and V codecs, commit unit 1).
template <class High, class Low>
class DemotionTier {
  static_assert(!Low::keys_per_channel && Low::commit_unit == 1,
                "kvpack::Demote<Keys<LK>, Values<LV>>: the low tier codes one token at a time: per-token keys "
                "(no PerChannel) and no Keyframe<...> codec");

 public:
  static constexpr bool enabled = true;
  using low_hook = Low;
  /// One (layer, KV head): low blocks (rows 0..rows-1 in demotion order) and each row's cache index.
  struct LowHead {
    std::vector<Block> blocks;
    std::vector<std::int32_t> tokens;  ///< cache index of each row
    std::vector<Block> spare;          ///< zeroed low blocks allocated ahead (reserve), used first
    [[nodiscard]] std::int64_t rows() const noexcept { return static_cast<std::int64_t>(tokens.size()); }
  };

  DemotionTier() = default;
  /// A tier for `shape` with low blocks of B tokens (the cache's block size).
  DemotionTier(const ModelShape& shape, int B)
      : shape_(shape),
        layout_(make_block_layout<typename Low::key_codec, typename Low::value_codec, false>(B, shape.head_dim)),
        one_(make_block_layout<typename High::key_codec, typename High::value_codec, false>(1, shape.head_dim)),
        proto_(Low::header(shape.head_dim)) {
    reset();
  }
  DemotionTier(DemotionTier&&) noexcept = default;
  DemotionTier& operator=(DemotionTier&& o) noexcept {
    if (this != &o) {
      wipe();
      shape_ = o.shape_, layout_ = o.layout_, one_ = o.one_, proto_ = o.proto_, heads_ = std::move(o.heads_);
      one_block_ = std::move(o.one_block_), s_ = std::move(o.s_);
    }
    return *this;
  }
  ~DemotionTier() { wipe(); }

  [[nodiscard]] const BlockLayout& layout() const noexcept { return layout_; }
  [[nodiscard]] const LowHead& head(int li, int h) const noexcept { return heads_[index(li, h)]; }

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
    const std::size_t after = static_cast<std::size_t>(H.rows() + rows);
    reserve_geometric(H.tokens, after);
    const std::size_t blocks_after = (after + B - 1) / B;
    reserve_geometric(H.blocks, blocks_after);
    reserve_geometric(H.spare, blocks_after - H.blocks.size());
    while (H.spare.size() + H.blocks.size() < blocks_after) H.spare.push_back(make_block(layout_, proto_));
    ready_row();
  }

  /// Demotes live `slot` of high head `Hs` (layer li, KV head h, high layout HL): decodes its K/V
  /// row as the kernel reads it, re-encodes it into the next low row with its position and cache
  /// index. The caller evicts the slot afterwards. Allocates only past reserve() (may then throw
  /// std::bad_alloc, leaving the tier as it was).
  void demote(const BlockLayout& HL, const HeadStore& Hs, std::int64_t slot, int li, int h) {
    const auto su = static_cast<std::size_t>(slot), B = static_cast<std::size_t>(HL.tokens);
    if (Hs.slot_token[su] < 0) return;  // a free slot holds no token
    ready_row();
    LowHead& H = heads_[index(li, h)];
    const auto r = static_cast<std::size_t>(H.rows()), LB = static_cast<std::size_t>(layout_.tokens);
    H.tokens.reserve(r + 1);
    if (r % LB == 0) {
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
    Block& b = H.blocks.back();
    Low::encode(layout_, b, r % LB, s_.k_tile.data(), s_.v_tile.data(), shape_.head_dim, &pos);
    b.header.count = static_cast<std::uint16_t>(r % LB + 1);
    ++b.header.version;
    H.tokens.push_back(Hs.slot_token[su]);
    detail::secure_zero(one, one_.bytes);
    detail::secure_zero(s_.k_tile.data(), s_.k_tile.size() * sizeof(float));
    detail::secure_zero(s_.v_tile.data(), s_.v_tile.size() * sizeof(float));
  }

  /// Block refs of the low tier of (li, h) for the attention kernel: every row visible (all are
  /// older than any query), no mask. Written to `refs` (cleared first).
  void refs(int li, int h, std::vector<kernels::BlockRef>& refs) const {
    refs.clear();
    for (const Block& b : heads_[index(li, h)].blocks) refs.push_back({b.data.get(), 0, b.header.count, nullptr, b.header.flags});
  }

  /// Bytes held: per low block its used bytes (codes, metadata, positions) and header, plus 4
  /// bytes of cache index per row.
  [[nodiscard]] std::size_t held_bytes() const noexcept {
    std::size_t t = 0;
    for (const LowHead& H : heads_) {
      for (const Block& b : H.blocks) t += layout_.used_bytes(b.header.count) + sizeof(BlockHeader);
      t += H.tokens.size() * sizeof(std::int32_t);
    }
    return t;
  }
  /// Bytes allocated (low blocks and spares, row bookkeeping, the decode row).
  [[nodiscard]] std::size_t allocated_bytes() const noexcept {
    std::size_t t = one_block_.bytes;
    for (const LowHead& H : heads_)
      t += (H.blocks.size() + H.spare.size()) * layout_.bytes + H.blocks.size() * sizeof(BlockHeader) + H.tokens.capacity() * 4;
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
    }
    heads_.clear();
  }

 private:
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
};

}  // namespace kvpack
