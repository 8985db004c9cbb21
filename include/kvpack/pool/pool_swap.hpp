// Swap-out and swap-in of one sequence of a PagedCache or EvictingPagedCache (swap_out /
// swap_in; the target interface is pool/page_swap.hpp). A swapped-out sequence keeps its slot, its fp32 rows
// (pending, rollback copies, sinks, latest chunk) and position runs in memory; the pages it holds
// alone go to the target and back to the free list; pages it shares (fork, prefix cache) stay,
// since copying them out would free nothing. Its page-table entries for the pages that left hold
// kSwappedPage until swap_in puts fresh pages there with the same bytes and headers.
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>
#include <vector>

#include "kvpack/pool/page_pool.hpp"
#include "kvpack/pool/page_swap.hpp"
#include "kvpack/result.hpp"

namespace kvpack::pool_detail {

/// Page-table entry of a page that is swapped out (no page id of any arena: ids stop at 2^32 - 2).
inline constexpr std::uint32_t kSwappedPage = 0xFFFFFFFFu;

/// Swap state of a sequence slot (a base of SeqSlot).
struct SwapState {
  PageSwapTarget* swapped_to = nullptr;  ///< the target holding its pages while swapped out
  std::size_t swapped_pages = 0;         ///< page-table entries that are kSwappedPage
};

/// A sequence's page tables: n layers, layer l's `pages` ([kv_head][page] ids) at(l).
template <class At>
struct PageTables {
  int n = 0;
  At at;
};
template <class At>
PageTables(int, At) -> PageTables<At>;

/// Calls f(layer, kv_head, page index, page-table entry&) for every entry of the tables.
template <class At, class F>
void for_each_page(PageTables<At>& t, F&& f) {
  for (int l = 0; l < t.n; ++l) {
    auto& pages = t.at(l).pages;
    for (std::size_t h = 0; h < pages.size(); ++h) {
      auto& table = pages[h];
      for (std::size_t k = 0; k < table.size(); ++k)
        f(static_cast<std::int32_t>(l), static_cast<std::int32_t>(h), static_cast<std::int64_t>(k), table[k]);
    }
  }
}

/// Moves the pages `layers` (sequence `id`, swap state `sw`) holds alone to `target`, then
/// releases them: all or nothing (a failed store, or a std::bad_alloc from the target, erases the
/// copies made and changes nothing). Returns the pages moved. Errc::not_present when swapped out
/// already.
template <class At>
Result<std::size_t> swap_out(PagePool& pool, const BlockLayout& layout, PageTables<At> layers, SwapState& sw, SeqId id,
                             PageSwapTarget& target) {
  if (sw.swapped_to != nullptr) return fail(Errc::not_present, "swap_out: the sequence is swapped out already");
  // The pages it holds alone, found before anything is stored (the only allocation). The set is
  // stable: only calls on this sequence could share one of them, and they do not overlap this
  // one; a page another sequence lets go of meanwhile just stays resident.
  struct Alone {
    SwapPageKey key;
    std::uint32_t* entry;
  };
  std::vector<Alone> alone;
  for_each_page(layers, [&](std::int32_t l, std::int32_t h, std::int64_t k, std::uint32_t& p) {
    if (pool.refs(p) == 1) alone.push_back({SwapPageKey{id, l, h, k}, &p});  // shared pages stay: a copy frees nothing
  });
  std::size_t n = 0;  // pages stored; page n is in flight
  auto erase_made = [&] {  // the copies made, and the one in flight (erase ignores absent keys)
    for (std::size_t j = 0; j <= n && j < alone.size(); ++j) target.erase(alone[j].key);
  };
  try {
    for (; n < alone.size(); ++n) {
      const Alone& a = alone[n];
      if (Status s = target.store(a.key, pool.header(*a.entry), {pool.data(*a.entry), layout.bytes}); !s) {
        erase_made();
        return fail(s.error().code, "swap_out: " + describe(a.key) + ": " + s.error().message);
      }
    }
  } catch (...) {  // a target's std::bad_alloc: no copy may outlive the failed call
    erase_made();
    throw;
  }
  for (const Alone& a : alone) {  // stored everything: now the pages go
    pool.release(*a.entry);
    *a.entry = kSwappedPage;
  }
  sw.swapped_to = &target;
  sw.swapped_pages = alone.size();
  return alone.size();
}

/// Brings a swapped-out sequence's pages back from its target into fresh pages: all or nothing
/// (Errc::capacity_exceeded when the pool is short of pages, or the target's load error: the
/// pages taken are zeroed and freed, the sequence stays swapped out and its copies are kept).
/// A loaded header whose bits, groups, key axis (flags bit 0), head_dim or count (1..B) differ
/// from this pool's is Errc::corrupt_data (the header cannot tell two codecs of equal widths
/// apart: a target serves one pool). On success the copies are erased. May throw std::bad_alloc before any
/// page is taken.
template <class At>
Result<std::size_t> swap_in(PagePool& pool, const BlockLayout& layout, const BlockHeader& proto, PageTables<At> layers,
                            SwapState& sw, SeqId id) {
  if (sw.swapped_to == nullptr) return fail(Errc::invalid_argument, "swap_in: the sequence is not swapped out");
  PageSwapTarget& target = *sw.swapped_to;
  SparePages fresh(pool);
  if (Status t = pool.take(sw.swapped_pages, fresh.pages, "swap_in"); !t) return t.error();
  std::size_t i = 0;
  Status failed;
  for_each_page(layers, [&](std::int32_t l, std::int32_t h, std::int64_t k, std::uint32_t& p) {
    if (!failed || p != kSwappedPage) return;
    const SwapPageKey key{id, l, h, k};
    const std::uint32_t pg = fresh.pages[i++];
    BlockHeader hd;
    if (Status s = target.load(key, hd, {pool.data(pg), layout.bytes}); !s) {
      failed = fail(s.error().code, "swap_in: " + describe(key) + ": " + s.error().message);
      return;
    }
    if (hd.format != proto.format || hd.k_bits != proto.k_bits || hd.v_bits != proto.v_bits || hd.k_group != proto.k_group ||
        hd.v_group != proto.v_group || (hd.flags & 1u) != (proto.flags & 1u) || hd.head_dim != proto.head_dim ||
        hd.count == 0 || hd.count > static_cast<std::uint16_t>(layout.tokens)) {
      failed = fail(Errc::corrupt_data, "swap_in: " + describe(key) +
                                            ": the loaded header is not a page of this pool (bits, groups, key axis, head_dim or count)");
      return;
    }
    pool.header(pg) = hd;
  });
  if (!failed) return failed.error();  // `fresh` zeroes and frees every page taken
  i = 0;
  for_each_page(layers, [&](std::int32_t l, std::int32_t h, std::int64_t k, std::uint32_t& p) {
    if (p != kSwappedPage) return;
    p = fresh.pages[i++];
    target.erase(SwapPageKey{id, l, h, k});
  });
  fresh.pages.clear();  // now held by the page tables
  const std::size_t n = sw.swapped_pages;
  sw = SwapState{};
  return n;
}

/// Closing the slot of a swapped-out sequence: erases its copies and removes the kSwappedPage
/// entries from its page tables (so that releasing the tables releases real pages only).
/// Allocates nothing.
template <class At>
void drop_swapped(PageTables<At> layers, SwapState& sw, SeqId id) noexcept {
  if (sw.swapped_to == nullptr) return;
  for_each_page(layers, [&](std::int32_t l, std::int32_t h, std::int64_t k, std::uint32_t& p) {
    if (p == kSwappedPage) sw.swapped_to->erase(SwapPageKey{id, l, h, k});
  });
  for (int l = 0; l < layers.n; ++l)
    for (auto& table : layers.at(l).pages) std::erase(table, kSwappedPage);
  sw = SwapState{};
}

}  // namespace kvpack::pool_detail
