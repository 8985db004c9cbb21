// Allocation failure at the API boundary. kvpack throws nothing of its own, but the standard
// containers it fills throw std::bad_alloc (or std::length_error for a size beyond what a vector
// can hold). KVCache::create, append and attend run their work through catch_alloc, which turns
// those into Errc::out_of_memory; append reserves everything it will need before it changes
// anything (SequenceStore::reserve_append), so a failed append leaves the cache as it was.
#pragma once

#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <limits>
#include <new>
#include <stdexcept>
#include <string>
#include <utility>
#include <vector>

#include "kvpack/detail/secure_zero.hpp"
#include "kvpack/result.hpp"

#if __has_include(<unistd.h>)
#include <unistd.h>
#endif

namespace kvpack {

/// Makes v's capacity at least `need`, growing geometrically (as push_back does) so that
/// reserving ahead of every append stays amortized O(1) per element. May throw std::bad_alloc.
template <class T>
void reserve_geometric(std::vector<T>& v, std::size_t need) {
  if (v.capacity() < need) v.reserve(std::max(need, 2 * v.capacity()));
}

/// reserve_geometric for buffers of KV rows: when v must grow, its contents move into the new
/// buffer and the old one is zeroed before it is freed (vector::reserve frees it as it is, and
/// secure zeroing covers every fp32 row kvpack lets go of). May throw std::bad_alloc (v unchanged).
template <class T>
void reserve_zeroing(std::vector<T>& v, std::size_t need) {
  if (v.capacity() >= need) return;
  std::vector<T> grown;
  grown.reserve(std::max(need, 2 * v.capacity()));
  grown.assign(v.begin(), v.end());  // within capacity: no allocation
  detail::wipe_vector(v);
  v.swap(grown);
}

/// Whether a buffer of `capacity` floats is worth replacing by one sized for `need`: more than
/// 4x larger, and over 16384 floats (64 KiB). What it catches: buffers sized for a prefill chunk
/// and kept through decoding (one per layer, and per sequence in a pool).
[[nodiscard]] constexpr bool oversized_buffer(std::size_t capacity, std::size_t need) noexcept {
  return capacity > 16384 && capacity / 4 > need;
}

/// The exact-row part of an append's reservation, shared by SequenceStore, the page pool's
/// PagedLayer and PagedEvictStore (their layers name these members alike): the latest-chunk copy,
/// the rows that still go to the sinks (until `sink_tokens` are held) and the pending rows of an
/// append of n tokens of `row` floats, less `direct` tokens encoded without passing through them
/// (SequenceStore::direct_tokens); pending rows far larger than needed are shrunk first
/// (PendingRows::shrink_for). Returns how many of the n go to the sinks. May throw
/// std::bad_alloc, leaving the contents unchanged (only capacities change).
template <class Layer>
std::size_t reserve_append_rows(Layer& L, std::int64_t n, std::size_t row, std::int64_t sink_tokens,
                                std::int64_t direct = 0) {
  const auto nz = static_cast<std::size_t>(n);
  reserve_zeroing(L.chunk_k, nz * row), reserve_zeroing(L.chunk_v, nz * row);
  const auto to_sinks = static_cast<std::size_t>(std::clamp<std::int64_t>(sink_tokens - L.sinks_held, 0, n));
  reserve_zeroing(L.sink_k, L.sink_k.size() + to_sinks * row), reserve_zeroing(L.sink_v, L.sink_v.size() + to_sinks * row);
  reserve_geometric(L.sink_pos, L.sink_pos.size() + to_sinks);
  const std::size_t to_pending = nz - to_sinks - static_cast<std::size_t>(direct);
  L.pend.shrink_for(to_pending);
  L.pend.reserve(to_pending);
  return to_sinks;
}

/// a * b + c in bytes, saturating at SIZE_MAX (a request that large cannot be allocated).
[[nodiscard]] constexpr std::size_t saturating_bytes(std::uint64_t a, std::uint64_t b, std::uint64_t c = 0) noexcept {
  constexpr auto kMax = std::numeric_limits<std::size_t>::max();
  if (b != 0 && a > kMax / b) return kMax;
  const std::uint64_t ab = a * b;
  return ab > kMax - c ? kMax : static_cast<std::size_t>(ab + c);
}

/// Physical memory of the machine in bytes, or SIZE_MAX where unknown. KVCache::create refuses
/// up front a request larger than this, which an overcommitting kernel might otherwise grant and
/// then kill the process for touching.
[[nodiscard]] inline std::size_t physical_memory_bytes() noexcept {
#if defined(_SC_PHYS_PAGES) && defined(_SC_PAGESIZE)
  const long pages = sysconf(_SC_PHYS_PAGES), page = sysconf(_SC_PAGESIZE);
  if (pages > 0 && page > 0) return saturating_bytes(static_cast<std::uint64_t>(pages), static_cast<std::uint64_t>(page));
#endif
  return std::numeric_limits<std::size_t>::max();
}

/// Calls f() (returning a Status or a Result) and turns std::bad_alloc and std::length_error into
/// Errc::out_of_memory: "<what>: out of memory (<bytes> bytes requested)" when `bytes` is known
/// (non-zero), "<what>: out of memory" otherwise; a known request above physical_memory_bytes()
/// fails without being tried. The caller's strong guarantee (nothing changed
/// on failure) comes from doing every allocation before any change, not from this catch.
template <class F>
[[nodiscard]] auto catch_alloc(const char* what, std::size_t bytes, F&& f) -> decltype(f()) {
  try {
    if (bytes > physical_memory_bytes()) throw std::bad_alloc();
    return std::forward<F>(f)();
  } catch (const std::bad_alloc&) {
  } catch (const std::length_error&) {
  }
  std::string msg = std::string(what) + ": out of memory";
  if (bytes == std::numeric_limits<std::size_t>::max()) msg += " (the request exceeds the address space)";
  else if (bytes != 0) msg += " (" + std::to_string(bytes) + " bytes requested)";
  return fail(Errc::out_of_memory, std::move(msg) + "; nothing changed");
}

}  // namespace kvpack
