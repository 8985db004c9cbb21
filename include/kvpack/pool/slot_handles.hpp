// The handle side of a pool's sequence slots, one piece for PagedCache (pool/pool_state.hpp) and
// EvictingPagedCache (pool/evicting_pool_state.hpp): per slot a live flag and a generation, so a
// freed or stale SeqId is refused even after its slot was reused, and the list of free slots.
#pragma once

#include <atomic>
#include <cstdint>
#include <mutex>
#include <string>
#include <vector>

#include "kvpack/pool/pool_types.hpp"
#include "kvpack/result.hpp"

namespace kvpack::pool_detail {

/// Live flag and generation of one sequence slot (a base of each pool's slot type).
struct SlotHandle {
  std::atomic<std::uint32_t> generation{0};
  std::atomic<bool> is_live{false};

  /// Whether `id` (already known to index this slot) names the sequence living in it now.
  [[nodiscard]] bool names(SeqId id) const noexcept {
    return is_live.load(std::memory_order_acquire) && generation.load(std::memory_order_acquire) == id.generation;
  }
  /// Marks slot `index` live under a new generation (after its contents are ready); its handle.
  SeqId publish(std::uint32_t index) noexcept {
    const std::uint32_t gen = generation.load(std::memory_order_relaxed) + 1;
    generation.store(gen, std::memory_order_release);
    is_live.store(true, std::memory_order_release);
    return SeqId{index, gen};
  }
  /// Makes every handle of the slot stale (before its contents are released).
  void retire() noexcept {
    is_live.store(false, std::memory_order_release);
    generation.fetch_add(1, std::memory_order_acq_rel);
  }
};

/// The free slots of a pool of `n` sequences, lowest index taken first; thread-safe.
class SlotFreeList {
 public:
  /// Every slot 0..n-1 free.
  void fill(int n) {
    std::lock_guard<std::mutex> g(mu_);
    free_.clear();
    for (int i = n - 1; i >= 0; --i) free_.push_back(static_cast<std::uint32_t>(i));
  }
  /// Takes a free slot. Errc::capacity_exceeded (naming `what` and max_sequences) when none is.
  Result<std::uint32_t> take(const char* what, int max_sequences) {
    std::lock_guard<std::mutex> g(mu_);
    if (free_.empty())
      return fail(Errc::capacity_exceeded, std::string(what) + ": max_sequences = " + std::to_string(max_sequences) +
                                               " sequences are live; free one first");
    const std::uint32_t i = free_.back();
    free_.pop_back();
    return i;
  }
  /// Returns slot i to the list (after retire() and releasing its contents).
  void give_back(std::uint32_t i) {
    std::lock_guard<std::mutex> g(mu_);
    free_.push_back(i);
  }

 private:
  std::mutex mu_;
  std::vector<std::uint32_t> free_;
};

}  // namespace kvpack::pool_detail
