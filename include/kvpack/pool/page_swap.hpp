// Where a paged pool puts the pages of a swapped-out sequence (PagedCache::swap_out / swap_in):
// the PageSwapTarget interface, and HostSwapTarget, which keeps them in process memory outside
// the pool's arena. An encrypted file or host-RAM tier behind an offload::OffloadStore is
// offload/pool_swap_target.hpp (needs libsodium).
//
// Swapping is vLLM's preemption by swapping (its "swap space"): when the page arena runs short,
// the engine moves a waiting sequence's pages out, serves others with the freed pages, and
// brings the sequence back before its next step, bit-identical to never having moved it.
#pragma once

#include <cstddef>
#include <cstdint>
#include <cstring>
#include <map>
#include <mutex>
#include <new>
#include <span>
#include <string>
#include <tuple>
#include <vector>

#include "kvpack/cache/block.hpp"
#include "kvpack/detail/secure_zero.hpp"
#include "kvpack/pool/pool_types.hpp"
#include "kvpack/result.hpp"

namespace kvpack {

/// Names one swapped page: the sequence (its SeqId), the layer, the KV head and the page's index
/// in that (layer, KV head)'s page table (page k holds tokens [k B, (k + 1) B) of the sequence).
struct SwapPageKey {
  SeqId seq;
  std::int32_t layer = 0;
  std::int32_t kv_head = 0;
  std::int64_t page = 0;
  friend constexpr bool operator==(const SwapPageKey&, const SwapPageKey&) = default;
};

/// "page 3 of (layer 1, kv_head 0) of sequence {2, 5}": how swap errors name a page.
[[nodiscard]] inline std::string describe(const SwapPageKey& k) {
  return "page " + std::to_string(k.page) + " of (layer " + std::to_string(k.layer) + ", kv_head " +
         std::to_string(k.kv_head) + ") of sequence {" + std::to_string(k.seq.index) + ", " +
         std::to_string(k.seq.generation) + "}";
}

/// Storage for swapped-out pages. A pool calls store() for every page it swaps out, load() for
/// every page it swaps back in, and erase() once a page is back or its sequence is freed. A
/// target serves ONE pool (keys name the sequence by its SeqId, not the pool), and must outlive
/// every sequence swapped into it: declare it before the pool. Calls for different sequences may
/// come from several threads at once.
class PageSwapTarget {
 public:
  virtual ~PageSwapTarget() = default;
  /// Keeps a copy of one page: its header (count = tokens in the page) and payload
  /// (BlockLayout::bytes: codes and metadata). An error makes swap_out erase the pages it already
  /// stored and leave the sequence resident.
  [[nodiscard]] virtual Status store(const SwapPageKey& key, const BlockHeader& header, std::span<const std::byte> payload) = 0;
  /// Writes page `key`'s header and payload (payload.size() as stored) back, exactly as stored,
  /// or returns an error: Errc::not_present (never stored or erased), io_error, corrupt_data,
  /// auth_failed (a tampered record), out_of_memory. After an error swap_in zeroes and frees the
  /// page, and the sequence stays swapped out.
  [[nodiscard]] virtual Status load(const SwapPageKey& key, BlockHeader& header, std::span<std::byte> payload) = 0;
  /// Forgets page `key`, wiping whatever copy the target holds. Absent keys are ignored.
  virtual void erase(const SwapPageKey& key) noexcept = 0;
};

/// Swapped pages in process memory (heap allocations outside the pool's arena), each a header and
/// payload copy; erased copies are zeroed before they are freed. Thread-safe.
class HostSwapTarget final : public PageSwapTarget {
 public:
  /// Errc::out_of_memory when the copy cannot be allocated (nothing kept).
  [[nodiscard]] Status store(const SwapPageKey& key, const BlockHeader& header, std::span<const std::byte> payload) override {
    std::lock_guard<std::mutex> g(mu_);
    auto it = pages_.end();
    bool added = false;
    try {
      std::tie(it, added) = pages_.try_emplace(tie(key));
      std::vector<std::byte> rec(sizeof(BlockHeader) + payload.size());  // before the page bytes go in: nothing to wipe if it throws
      std::memcpy(rec.data(), &header, sizeof(BlockHeader));
      if (!payload.empty()) std::memcpy(rec.data() + sizeof(BlockHeader), payload.data(), payload.size());
      if (!added) {  // a second store of one key replaces the copy
        bytes_ -= it->second.size();
        detail::wipe_vector(it->second);
      }
      bytes_ += rec.size();
      it->second = std::move(rec);
      return {};
    } catch (const std::bad_alloc&) {
      if (added) pages_.erase(it);
      return fail(Errc::out_of_memory, "HostSwapTarget: cannot keep " + describe(key));
    }
  }
  /// Errc::not_present for an unknown key; Errc::corrupt_data when `payload` is not the stored size.
  [[nodiscard]] Status load(const SwapPageKey& key, BlockHeader& header, std::span<std::byte> payload) override {
    std::lock_guard<std::mutex> g(mu_);
    const auto it = pages_.find(tie(key));
    if (it == pages_.end()) return fail(Errc::not_present, "HostSwapTarget: no copy of " + describe(key));
    const std::vector<std::byte>& rec = it->second;
    if (rec.size() != sizeof(BlockHeader) + payload.size())
      return fail(Errc::corrupt_data, "HostSwapTarget: " + describe(key) + " holds " + std::to_string(rec.size() - sizeof(BlockHeader)) +
                                          " payload bytes, asked for " + std::to_string(payload.size()));
    std::memcpy(&header, rec.data(), sizeof(BlockHeader));
    if (!payload.empty()) std::memcpy(payload.data(), rec.data() + sizeof(BlockHeader), payload.size());
    return {};
  }
  void erase(const SwapPageKey& key) noexcept override {
    std::lock_guard<std::mutex> g(mu_);
    const auto it = pages_.find(tie(key));
    if (it == pages_.end()) return;
    bytes_ -= it->second.size();
    detail::wipe_vector(it->second);
    pages_.erase(it);
  }
  /// Pages held now.
  [[nodiscard]] std::size_t pages() const {
    std::lock_guard<std::mutex> g(mu_);
    return pages_.size();
  }
  /// Bytes held now (per page: 16-byte header + payload).
  [[nodiscard]] std::size_t bytes() const {
    std::lock_guard<std::mutex> g(mu_);
    return bytes_;
  }
  /// Test hook: flips one bit of page `key`'s stored payload byte `at` (a corrupted copy that a
  /// plain host target cannot detect; an encrypted target would). False when absent.
  bool corrupt_for_test(const SwapPageKey& key, std::size_t at) {
    std::lock_guard<std::mutex> g(mu_);
    const auto it = pages_.find(tie(key));
    if (it == pages_.end() || sizeof(BlockHeader) + at >= it->second.size()) return false;
    it->second[sizeof(BlockHeader) + at] ^= std::byte{1};
    return true;
  }

 private:
  using Key = std::tuple<std::uint32_t, std::uint32_t, std::int32_t, std::int32_t, std::int64_t>;
  static Key tie(const SwapPageKey& k) noexcept { return {k.seq.index, k.seq.generation, k.layer, k.kv_head, k.page}; }
  mutable std::mutex mu_;
  std::map<Key, std::vector<std::byte>> pages_;
  std::size_t bytes_ = 0;
};

}  // namespace kvpack
