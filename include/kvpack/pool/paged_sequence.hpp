// PagedSequence: what one sequence of a PagedCache holds, per layer, and its token lifecycle over
// pool pages. The lifecycle is the single-sequence cache's (cache/sequence_store.hpp, CASES C12):
// fp32 sinks first, then fp32 pending rows; at the end of every append the oldest pending tokens
// beyond the residual window are quantized, one commit unit at a time, into the open page of each
// KV head. Codes therefore depend only on the tokens, and after n non-sink tokens exactly
// commit_count(n) = max(0, floor((n - R) / unit)) * unit are committed, whatever the chunking:
// this is what makes truncate() exact (the state after n tokens is a function of n).
//
// Rollback copies: `hist` keeps fp32 copies of the newest non-sink tokens (at most
// max_rollback + R + unit - 1), enough to rebuild the pending rows of any length truncate() accepts.
//
// Copy-on-write: a page with more than one reference (fork, prefix cache) is never written; the
// writer first copies it into a page it holds alone (PagedCache reserves those pages up front).
#pragma once

#include <algorithm>
#include <cmath>
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <span>
#include <vector>

#include "kvpack/cache/alloc_guard.hpp"
#include "kvpack/cache/block.hpp"
#include "kvpack/cache/chunk_stage.hpp"
#include "kvpack/cache/exact_segments.hpp"
#include "kvpack/cache/pending_rows.hpp"
#include "kvpack/cache/position_runs.hpp"
#include "kvpack/cache/rope_state.hpp"
#include "kvpack/cache/shape.hpp"
#include "kvpack/detail/secure_zero.hpp"
#include "kvpack/kernels/dispatch.hpp"
#include "kvpack/pool/page_pool.hpp"

namespace kvpack::pool_detail {

/// One layer of one sequence.
struct PagedLayer {
  std::vector<float> sink_k, sink_v;  ///< [sinks_held][kv_heads][D]
  std::vector<std::int32_t> sink_pos;
  PendingRows pend;                   ///< fp32 rows not yet quantized, oldest first
  PendingRows hist;                   ///< fp32 copies of the newest non-sink tokens (rollback)
  std::vector<float> chunk_k, chunk_v;  ///< exact copy of the latest append (CASES C5)
  std::vector<std::int32_t> chunk_pos;  ///< its positions (PreRope<> pools only; else empty)
  std::vector<std::vector<std::uint32_t>> pages;  ///< page table: [kv_head][page], oldest first
  PositionRuns block_pos;             ///< positions of the committed (paged) tokens: pages store none
  std::int64_t sinks_held = 0, committed = 0, total = 0, chunk_tokens = 0;

  /// Bytes of fp32 rows and positions this layer holds (pending, rollback copies, sinks, chunk,
  /// the paged tokens' position runs).
  [[nodiscard]] std::size_t exact_bytes(std::size_t row) const noexcept {
    const auto n = static_cast<std::size_t>(pend.size() + hist.size() + sinks_held + chunk_tokens);
    return n * row * 2 * sizeof(float) + (static_cast<std::size_t>(pend.size() + hist.size() + sinks_held) + chunk_pos.size()) * 4 +
           block_pos.held_bytes();
  }
  /// Zeroes every fp32 row and forgets the pages (the caller releases them first).
  void wipe() noexcept {
    for (auto* v : {&sink_k, &sink_v, &chunk_k, &chunk_v}) detail::wipe_vector(*v);
    detail::wipe_vector(sink_pos);
    detail::wipe_vector(chunk_pos);
    pend.wipe();
    hist.wipe();
    block_pos.wipe();
    for (auto& p : pages) p.clear();
    sinks_held = committed = total = chunk_tokens = 0;
  }
};

/// Tokens committed after n non-sink tokens with residual window R and commit unit U.
[[nodiscard]] constexpr std::int64_t commit_count(std::int64_t n, int R, int U) noexcept {
  return n > R ? (n - R) / U * U : 0;
}

/// Copies a layer's fp32 state (everything but the pages) for fork(); page ids are copied too,
/// the caller retains them.
inline void copy_exact(const PagedLayer& from, PagedLayer& to) {
  to.sink_k = from.sink_k, to.sink_v = from.sink_v, to.sink_pos = from.sink_pos;
  to.chunk_k = from.chunk_k, to.chunk_v = from.chunk_v, to.chunk_pos = from.chunk_pos;
  to.pages = from.pages;
  to.block_pos = from.block_pos;
  to.sinks_held = from.sinks_held, to.committed = from.committed, to.total = from.total;
  to.chunk_tokens = from.chunk_tokens;
  to.pend.wipe();
  to.hist.wipe();
  if (!from.pend.empty())
    to.pend.push(from.pend.k(), from.pend.v(), from.pend.positions(), static_cast<std::size_t>(from.pend.size()));
  if (!from.hist.empty())
    to.hist.push(from.hist.k(), from.hist.v(), from.hist.positions(), static_cast<std::size_t>(from.hist.size()));
}

/// Makes page `slot` of KV head h's table writable: when shared, copies it into one of `spare`
/// (popped) and drops the shared reference.
inline void make_writable(PagePool& pool, std::vector<std::uint32_t>& table, std::size_t slot,
                          std::vector<std::uint32_t>& spare) {
  const std::uint32_t p = table[slot];
  if (pool.refs(p) <= 1) return;
  const std::uint32_t fresh = spare.back();
  spare.pop_back();
  pool.copy(p, fresh);
  table[slot] = fresh;
  pool.release(p);
}

/// Encodes n_commit rows (k, v: row stride kv_heads * head_dim; pos: n_commit positions) into
/// the next slots of every KV head of L, after L.committed, taking new pages and a copy of a
/// shared open page from `spare`; advances L.committed and L.block_pos.
template <class Codec>
void encode_rows(PagedLayer& L, PagePool& pool, const BlockLayout& layout, int kv_heads, const float* k, const float* v,
                 const std::int32_t* pos, std::int64_t n_commit, std::vector<std::uint32_t>& spare) {
  constexpr int U = Codec::commit_unit;
  const std::int64_t B = layout.tokens;
  const auto stride = static_cast<std::ptrdiff_t>(static_cast<std::size_t>(kv_heads) * static_cast<std::size_t>(layout.head_dim));
  for (int h = 0; h < kv_heads; ++h) {
    auto& table = L.pages[static_cast<std::size_t>(h)];
    if (L.committed % B != 0) make_writable(pool, table, table.size() - 1, spare);
    for (std::int64_t t0 = 0; t0 < n_commit; t0 += U) {
      const std::int64_t slot = L.committed + t0;
      if (slot % B == 0) {
        table.push_back(spare.back());
        spare.pop_back();
      }
      const std::uint32_t p = table.back();
      BlockHeader& hd = pool.header(p);
      const auto off = static_cast<std::size_t>(slot % B);
      const std::ptrdiff_t at = t0 * stride + static_cast<std::ptrdiff_t>(h) * layout.head_dim;
      Codec::encode(layout, pool.data(p), hd.flags, off, k + at, v + at, stride, pos + t0);
      hd.count = static_cast<std::uint16_t>(std::max<std::size_t>(hd.count, off + static_cast<std::size_t>(U)));
      ++hd.version;
    }
  }
  L.block_pos.push(pos, n_commit);  // runs reserved by reserve_append: allocates nothing
  L.committed += n_commit;
}

/// Of an n-token append to L, the tokens after those that fill the sinks that commit within the
/// same append while no pending rows wait: whole commit units beyond the residual window R.
/// push() leaves them out of the pending rows and encode_rows takes them from the caller's rows
/// (the codes the pending route would give: commit boundaries depend on token counts only).
[[nodiscard]] inline std::int64_t direct_tokens(const PagedLayer& L, std::int64_t n, int sinks, int R, int U) noexcept {
  if (!L.pend.empty()) return 0;
  const std::int64_t after_sinks = n - std::clamp<std::int64_t>(sinks - L.sinks_held, 0, n);
  return after_sinks > R ? (after_sinks - R) / U * U : 0;
}

/// Quantizes the pending tokens of L beyond commit_count into pages (Codec: a CodecHook). `spare`
/// holds the pages reserved for this commit (new pages and copy-on-write copies).
template <class Codec>
void commit(PagedLayer& L, PagePool& pool, const BlockLayout& layout, int kv_heads, int R,
            std::vector<std::uint32_t>& spare) {
  const std::int64_t target = commit_count(L.total - L.sinks_held, R, Codec::commit_unit);
  if (target <= L.committed) return;
  const std::int64_t n_commit = target - L.committed;
  encode_rows<Codec>(L, pool, layout, kv_heads, L.pend.k(), L.pend.v(), L.pend.positions(), n_commit, spare);
  L.pend.drop_front(n_commit);
}

/// Pages a commit of L after appending n tokens needs: new pages plus copies of shared open pages.
[[nodiscard]] inline std::size_t pages_for_append(const PagedLayer& L, const PagePool& pool, std::int64_t n, int sinks,
                                                  int R, int U, int B) {
  const std::int64_t total = L.total + n;
  const std::int64_t sinks_after = std::min<std::int64_t>(sinks, total);
  const std::int64_t target = commit_count(total - sinks_after, R, U);
  if (target <= L.committed) return 0;
  const auto have = static_cast<std::int64_t>(L.pages.empty() ? 0 : L.pages[0].size());
  const std::int64_t want = (target + B - 1) / B;
  std::size_t need = static_cast<std::size_t>(want - have) * L.pages.size();
  if (L.committed % B != 0)
    for (const auto& t : L.pages) need += pool.refs(t.back()) > 1;
  return need;
}

/// Allocates ahead everything push() and commit() of an append of n tokens to L need: the chunk
/// copy (and its positions: Rope), sink rows, pending rows, rollback copies (hist_cap > 0), the page tables' growth and the
/// codec's encode buffers and the position runs of the tokens it may commit (pos: the append's
/// positions), so that after it those steps allocate nothing (PagedCache::append's strong
/// guarantee). May throw std::bad_alloc, leaving L's contents unchanged (only capacities grow).
template <class Codec, bool Rope = false>
void reserve_append(PagedLayer& L, std::span<const std::int32_t> pos, std::size_t row, int sinks, int R, int B,
                    std::int64_t hist_cap, int head_dim) {
  if constexpr (Rope) L.chunk_pos.reserve(pos.size());  // the latest chunk's positions (push)
  constexpr int U = Codec::commit_unit;
  const auto n = static_cast<std::int64_t>(pos.size());
  // Committed positions are a contiguous part of (pending, new): at most one run more than the whole.
  L.block_pos.reserve_runs(L.block_pos.runs_added({L.pend.positions(), static_cast<std::size_t>(L.pend.size())}, pos) + 1);
  const std::size_t rest =
      static_cast<std::size_t>(n) - reserve_append_rows(L, n, row, sinks, direct_tokens(L, n, sinks, R, U));
  if (hist_cap > 0 && rest > 0) L.hist.reserve(std::min(rest, static_cast<std::size_t>(hist_cap)));
  const std::int64_t total = L.total + n, sinks_after = std::min<std::int64_t>(sinks, total);
  const auto want = static_cast<std::size_t>((commit_count(total - sinks_after, R, U) + B - 1) / B);
  for (auto& table : L.pages) reserve_geometric(table, want);
  Codec::reserve_encode(head_dim);
}

/// Kernel segments of KV head h of L (as SequenceStore::segments without eviction): sinks, pages
/// (cut before the latest chunk), pending rows before the latest chunk, the latest chunk exact.
inline kernels::HeadSegments segments(const PagedLayer& L, const PagePool& pool, const BlockLayout& layout, int kv_heads,
                                      int h, std::vector<kernels::BlockRef>& refs) {
  const std::int64_t stride = static_cast<std::int64_t>(kv_heads) * layout.head_dim;
  const std::int64_t hoff = static_cast<std::int64_t>(h) * layout.head_dim;
  const std::int64_t chunk_start = L.total - L.chunk_tokens;
  kernels::HeadSegments seg = cache_detail::exact_segments(L, stride, hoff);
  refs.clear();
  for (const std::uint32_t p : L.pages[static_cast<std::size_t>(h)]) {
    const std::int64_t first = L.sinks_held + static_cast<std::int64_t>(refs.size()) * layout.tokens;
    const BlockHeader& hd = pool.header(p);
    const std::int64_t count = std::min<std::int64_t>(hd.count, chunk_start - first);
    if (count <= 0) break;
    refs.push_back({pool.data(p), first, static_cast<int>(count), nullptr, hd.flags});
  }
  seg.blocks = refs;
  return seg;
}

/// Attention of the n_q = q.size() / (q_heads * D) newest tokens of L over all it holds, KV head
/// by KV head on the calling thread, with Codec's kernel (as KVCache::attend); bias: an additive
/// mask by cache index (AttendArgs::bias) or nullptr; rope: a PreRope<> pool's table and pairing
/// (the kernels rotate queries and keys at their stored positions, as RopeState does for
/// KVCache; spill: the positions of pages that span a jump in them) or nullptr. q, out:
/// [n_q][q_heads][D]. May throw std::bad_alloc (scratch, refs or spill growth).
template <class Codec>
void attend_layer(const ModelShape& shape, const PagedLayer& L, const PagePool& pool, const BlockLayout& layout,
                  std::span<const float> q, std::span<float> out, kernels::Scratch& scratch,
                  std::vector<kernels::BlockRef>& refs, const float* bias, const kernels::RopeArgs* rope = nullptr,
                  std::vector<std::int32_t>* spill = nullptr) {
  kernels::RopeArgs args;
  const int D = shape.head_dim, group = shape.q_heads / shape.kv_heads;
  const std::size_t qrow = static_cast<std::size_t>(shape.q_heads) * static_cast<std::size_t>(D);
  const auto n_q = static_cast<std::int64_t>(q.size() / qrow);
  for (int h = 0; h < shape.kv_heads; ++h) {
    const std::int64_t at = static_cast<std::int64_t>(h) * group * D;
    kernels::AttendArgs a = cache_detail::attend_args(shape, L.total, q.data() + at, out.data() + at, n_q, group);
    a.bias = bias;
    kernels::HeadSegments seg = segments(L, pool, layout, shape.kv_heads, h, refs);
    if (rope != nullptr) {
      args = *rope;
      rope_original_positions(a, seg, refs, L, layout.tokens, true, args, *spill);
      a.rope = &args;
    }
    Codec::attend(a, seg, layout, scratch);
  }
}

/// Stores n appended tokens (k, v: [n][row], staged in `stage`; pos: [n]) in L: the exact chunk
/// copy (swapped in from the stage), sinks first,
/// then pending rows except the first `direct` non-sink ones (direct_tokens: the caller encodes
/// them with encode_rows), and (hist_cap > 0) rollback copies of the non-sink ones, trimmed to
/// hist_cap. Returns the chunk row of the first non-sink token.
inline std::int64_t push(PagedLayer& L, std::span<const float> k, std::span<const float> v, std::span<const std::int32_t> pos,
                         std::size_t row, int sinks, std::int64_t hist_cap, ChunkStage& stage, std::int64_t direct,
                         bool keep_chunk_pos) {
  const auto n = static_cast<std::int64_t>(pos.size());
  const auto r = static_cast<std::int64_t>(row);
  stage.swap_into(L.chunk_k, L.chunk_v);  // the rows stage.fill copied and checked
  if (keep_chunk_pos) L.chunk_pos.assign(pos.begin(), pos.end());  // capacity reserved
  L.chunk_tokens = n;
  std::int64_t t = 0;
  for (; t < n && L.sinks_held < sinks; ++t, ++L.sinks_held) {
    L.sink_k.insert(L.sink_k.end(), k.begin() + t * r, k.begin() + (t + 1) * r);
    L.sink_v.insert(L.sink_v.end(), v.begin() + t * r, v.begin() + (t + 1) * r);
    L.sink_pos.push_back(pos[static_cast<std::size_t>(t)]);
  }
  const std::int64_t first = t;
  if (t < n) {
    if (t + direct < n)
      L.pend.push(k.data() + (t + direct) * r, v.data() + (t + direct) * r, pos.data() + t + direct,
                  static_cast<std::size_t>(n - t - direct));
    if (hist_cap > 0) {
      const std::int64_t from = std::max(t, n - hist_cap);  // older rows would be trimmed at once
      L.hist.push(k.data() + from * r, v.data() + from * r, pos.data() + from, static_cast<std::size_t>(n - from));
      if (L.hist.size() > hist_cap) L.hist.drop_front(L.hist.size() - hist_cap);
    }
  }
  L.total += n;
  return first;
}

/// The changing half of PagedCache::append (rows staged, everything reserved, `spare` holding
/// the pages pages_for_append counted): push, the tokens committed within this append encoded
/// from the caller's rows (direct_tokens, as KVCache), then the pending rows' commit.
template <class Codec, bool Rope = false>
void store_append(PagedLayer& L, PagePool& pool, const BlockLayout& layout, int kv_heads, std::span<const float> k,
                  std::span<const float> v, std::span<const std::int32_t> pos, int sinks, int R, std::int64_t hist_cap,
                  ChunkStage& stage, std::vector<std::uint32_t>& spare) {
  const auto n = static_cast<std::int64_t>(pos.size());
  const std::size_t row = static_cast<std::size_t>(kv_heads) * static_cast<std::size_t>(layout.head_dim);
  const std::int64_t direct = direct_tokens(L, n, sinks, R, Codec::commit_unit);
  const std::int64_t first = push(L, k, v, pos, row, sinks, hist_cap, stage, direct, Rope);
  const std::size_t at = static_cast<std::size_t>(first) * row;
  if (direct > 0) encode_rows<Codec>(L, pool, layout, kv_heads, k.data() + at, v.data() + at, pos.data() + first, direct, spare);
  commit<Codec>(L, pool, layout, kv_heads, R, spare);
}

/// Whether L's rollback copies hold what truncating it to n_new tokens needs (the pending rows of
/// the shorter state).
[[nodiscard]] inline bool can_truncate(const PagedLayer& L, std::int64_t n_new, int sinks, int R, int U) noexcept {
  const std::int64_t s = std::min<std::int64_t>(sinks, n_new);
  const std::int64_t from = s + commit_count(n_new - s, R, U);
  return n_new == L.total || from >= n_new || from >= L.total - L.hist.size();
}

/// Pages truncating L to n_new tokens needs: a copy of each shared page that must be cut.
[[nodiscard]] inline std::size_t pages_for_truncate(const PagedLayer& L, const PagePool& pool, std::int64_t n_new,
                                                    int sinks, int R, int U, int B) {
  const std::int64_t s = std::min<std::int64_t>(sinks, n_new);
  const std::int64_t c = commit_count(n_new - s, R, U);
  if (c % B == 0 || c >= L.committed) return 0;
  std::size_t need = 0;
  for (const auto& t : L.pages) need += pool.refs(t[static_cast<std::size_t>(c / B)]) > 1;
  return need;
}

/// The pending rows and rollback copies L holds after truncating it to n_new tokens, built (from
/// the rollback copies) before anything changes; zeroed when dropped unused.
struct TruncatedRows {
  PendingRows pend, hist;
  TruncatedRows() = default;
  TruncatedRows(TruncatedRows&&) noexcept = default;
  TruncatedRows& operator=(TruncatedRows&&) noexcept = default;
  ~TruncatedRows() {
    pend.wipe();
    hist.wipe();
  }
};

/// The rows truncate(L, ..., n_new, ...) installs (empty when nothing is dropped). Requires
/// can_truncate. May throw std::bad_alloc; L is only read.
[[nodiscard]] inline TruncatedRows truncated_rows(const PagedLayer& L, std::size_t row, std::int64_t n_new, int sinks,
                                                  int R, int U) {
  TruncatedRows t;
  t.pend.configure(row, 0);
  t.hist.configure(row, 0);
  if (n_new == L.total) return t;
  const std::int64_t s = std::min<std::int64_t>(sinks, n_new);
  const std::int64_t c = commit_count(n_new - s, R, U);
  // Pending rows of the shorter state: tokens [s + c, n_new), all within the rollback copies.
  const std::int64_t hfirst = L.total - L.hist.size(), from = s + c;
  const auto r = static_cast<std::int64_t>(row);
  if (from < n_new) {
    const std::int64_t at = (from - hfirst) * r;
    t.pend.push(L.hist.k() + at, L.hist.v() + at, L.hist.positions() + (from - hfirst), static_cast<std::size_t>(n_new - from));
  }
  if (n_new > hfirst && !L.hist.empty())
    t.hist.push(L.hist.k(), L.hist.v(), L.hist.positions(), static_cast<std::size_t>(n_new - hfirst));
  return t;
}

/// Drops the newest tokens of L so that n_new remain, leaving exactly the state appending only
/// those n_new tokens would have left (codes, page bytes, pending rows, sinks); the latest chunk
/// keeps its surviving tokens. Requires can_truncate, the pages_for_truncate pages in `spare` and
/// `rows` = truncated_rows(L, row, n_new, ...): allocates nothing.
inline void truncate(PagedLayer& L, PagePool& pool, const BlockLayout& layout, std::size_t row, std::int64_t n_new,
                     int sinks, int R, int U, std::vector<std::uint32_t>& spare, TruncatedRows&& rows) {
  if (n_new == L.total) return;  // nothing dropped: the latest chunk and pending rows stay as they are
  const std::int64_t B = layout.tokens, drop = L.total - n_new;
  const std::int64_t s = std::min<std::int64_t>(sinks, n_new);
  const std::int64_t c = commit_count(n_new - s, R, U);
  const auto keep_pages = static_cast<std::size_t>((c + B - 1) / B);
  for (auto& table : L.pages) {
    while (table.size() > keep_pages) {
      pool.release(table.back());
      table.pop_back();
    }
    if (c % B != 0 && c < L.committed) {
      make_writable(pool, table, keep_pages - 1, spare);
      const std::uint32_t p = table.back();
      const auto to = static_cast<std::size_t>(std::min<std::int64_t>(B, L.committed - static_cast<std::int64_t>(keep_pages - 1) * B));
      zero_slots(layout, pool.data(p), static_cast<std::size_t>(c % B), to);
      pool.header(p).count = static_cast<std::uint16_t>(c % B);
      ++pool.header(p).version;
    }
  }
  L.pend.wipe();
  L.hist.wipe();
  L.pend = std::move(rows.pend);
  L.hist = std::move(rows.hist);
  auto cut = [](auto& vec, std::size_t keep) {
    if (vec.size() > keep) detail::secure_zero(vec.data() + keep, (vec.size() - keep) * sizeof(vec[0]));
    vec.resize(std::min(vec.size(), keep));
  };
  cut(L.sink_k, static_cast<std::size_t>(s) * row);
  cut(L.sink_v, static_cast<std::size_t>(s) * row);
  cut(L.sink_pos, static_cast<std::size_t>(s));
  L.chunk_tokens = std::max<std::int64_t>(0, L.chunk_tokens - drop);
  cut(L.chunk_k, static_cast<std::size_t>(L.chunk_tokens) * row);
  cut(L.chunk_v, static_cast<std::size_t>(L.chunk_tokens) * row);
  if (!L.chunk_pos.empty()) cut(L.chunk_pos, static_cast<std::size_t>(L.chunk_tokens));
  L.block_pos.truncate(c);
  L.sinks_held = s;
  L.committed = c;
  L.total = n_new;
}

/// Decodes what KV head h of L holds as attention reads it (the latest chunk aside: it is read
/// exactly by attend), in cache-index order: fp32 sinks, the pages dequantized, fp32 pending rows.
template <class Codec>
[[nodiscard]] HeadContents read_back(const PagedLayer& L, const PagePool& pool, const BlockLayout& layout, int kv_heads, int h) {
  const auto D = static_cast<std::size_t>(layout.head_dim);
  const std::size_t stride = static_cast<std::size_t>(kv_heads) * D, hoff = static_cast<std::size_t>(h) * D;
  HeadContents c;
  auto exact = [&](const float* ks, const float* vs, const std::int32_t* pos, std::int64_t n, std::int64_t first) {
    for (std::int64_t t = 0; t < n; ++t) {
      const std::size_t at = static_cast<std::size_t>(t) * stride + hoff;
      c.k.insert(c.k.end(), ks + at, ks + at + D);
      c.v.insert(c.v.end(), vs + at, vs + at + D);
      c.positions.push_back(pos[t]);
      c.indices.push_back(first + t);
    }
  };
  exact(L.sink_k.data(), L.sink_v.data(), L.sink_pos.data(), L.sinks_held, 0);
  kernels::Scratch s;
  s.ensure(1, layout.head_dim, layout.tokens);
  std::int64_t index = L.sinks_held;
  for (const std::uint32_t p : L.pages[static_cast<std::size_t>(h)]) {
    const BlockHeader& hd = pool.header(p);
    Codec::decode(layout, pool.data(p), hd.flags, hd.count, s);
    for (std::size_t t = 0; t < hd.count; ++t, ++index) {
      c.k.insert(c.k.end(), s.k_tile.begin() + static_cast<std::ptrdiff_t>(t * D), s.k_tile.begin() + static_cast<std::ptrdiff_t>((t + 1) * D));
      c.v.insert(c.v.end(), s.v_tile.begin() + static_cast<std::ptrdiff_t>(t * D), s.v_tile.begin() + static_cast<std::ptrdiff_t>((t + 1) * D));
      c.positions.push_back(L.block_pos.at(index - L.sinks_held));
      c.indices.push_back(index);
    }
  }
  if (!L.pend.empty()) exact(L.pend.k(), L.pend.v(), L.pend.positions(), L.pend.size(), L.total - L.pend.size());
  return c;
}

}  // namespace kvpack::pool_detail
