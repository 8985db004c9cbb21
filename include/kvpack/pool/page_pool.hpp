// PagePool: fixed-size pages carved from ONE arena allocated at creation (the byte budget),
// reference-counted, with a free list. A page holds one storage block payload (cache/block.hpp
// layout) plus a BlockHeader kept beside it. Pages are zero when taken: a page is zeroed when its
// last reference goes, and the arena starts zeroed (calloc: untouched pages cost no memory).
//
// Thread safety: take/retain/release may be called from several threads at once (the free list
// is under a mutex, reference counts are atomic). A page's payload and header are written only by
// the holder of its only reference (copy-on-write is the caller's rule: see PagedCache), so
// readers of a shared page never race with a writer.
#pragma once

#include <algorithm>
#include <atomic>
#include <cstddef>
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <memory>
#include <mutex>
#include <span>
#include <string>
#include <vector>

#include "kvpack/cache/block.hpp"
#include "kvpack/detail/secure_zero.hpp"
#include "kvpack/result.hpp"

namespace kvpack {

/// The page arena of a PagedCache.
class PagePool {
 public:
  /// Fixed overhead per page beside its payload: BlockHeader, reference count, free-list entry.
  static constexpr std::size_t overhead_per_page = sizeof(BlockHeader) + 2 * sizeof(std::uint32_t);

  /// Bytes of one page for a payload of `payload_bytes` (rounded up to 64: cache-line aligned).
  [[nodiscard]] static constexpr std::size_t stride_for(std::size_t payload_bytes) noexcept {
    return (payload_bytes + 63) / 64 * 64;
  }

  /// A pool of floor(byte_budget / stride_for(payload_bytes)) pages, every header set to `proto`.
  /// Errc::invalid_argument when not even one page fits or the count exceeds 2^32 - 2;
  /// Errc::capacity_exceeded when the arena cannot be allocated.
  [[nodiscard]] static Result<std::unique_ptr<PagePool>> create(std::size_t payload_bytes, std::size_t byte_budget,
                                                                const BlockHeader& proto) {
    const std::size_t stride = stride_for(payload_bytes);
    const std::size_t n = stride ? byte_budget / stride : 0;
    if (n == 0)
      return fail(Errc::invalid_argument, "PagedCache::create: byte_budget " + std::to_string(byte_budget) +
                                              " holds no page of " + std::to_string(stride) + " bytes");
    if (n >= 0xFFFFFFFFull) return fail(Errc::invalid_argument, "PagedCache::create: more than 2^32 - 2 pages");
    auto p = std::unique_ptr<PagePool>(new PagePool());
    p->stride_ = stride;
    p->payload_ = payload_bytes;
    p->pages_ = n;
    // calloc keeps untouched pages free and zero, but aligns only to 16 bytes (glibc serves a
    // large block from mmap at page start + 16): one line more, and pages start on a 64-byte
    // boundary, so every page's code rows sit on cache lines as a stride of 64 intends.
    p->raw_.reset(static_cast<std::byte*>(std::calloc(n * stride + 64, 1)));
    if (!p->raw_)
      return fail(Errc::capacity_exceeded, "PagedCache::create: cannot allocate the " + std::to_string(n * stride) +
                                               "-byte page arena");
    const auto mis = reinterpret_cast<std::uintptr_t>(p->raw_.get()) % 64;
    p->arena_ = p->raw_.get() + (mis ? 64 - mis : 0);
    p->refs_ = std::make_unique<std::atomic<std::uint32_t>[]>(n);
    p->headers_ = std::make_unique<BlockHeader[]>(n);
    p->free_.resize(n);
    for (std::size_t i = 0; i < n; ++i) {
      p->refs_[i].store(0, std::memory_order_relaxed);
      p->headers_[i] = proto;
      p->free_[i] = static_cast<std::uint32_t>(n - 1 - i);  // page 0 is taken first
    }
    p->proto_ = proto;
    return p;
  }

  PagePool(const PagePool&) = delete;
  PagePool& operator=(const PagePool&) = delete;
  ~PagePool() {
    if (!refs_) return;  // create() failed before the counts existed: no page was ever taken
    for (std::size_t i = 0; i < pages_; ++i)
      if (refs_[i].load(std::memory_order_relaxed) != 0) detail::secure_zero(data(static_cast<std::uint32_t>(i)), payload_);
  }

  [[nodiscard]] std::size_t stride() const noexcept { return stride_; }
  [[nodiscard]] std::size_t pages() const noexcept { return pages_; }
  /// Pages on the free list now.
  [[nodiscard]] std::size_t free_pages() const {
    std::lock_guard<std::mutex> g(mu_);
    return free_.size();
  }
  /// Pages referenced more than once now (a scan; for statistics).
  [[nodiscard]] std::size_t shared_pages() const noexcept {
    std::size_t s = 0;
    for (std::size_t i = 0; i < pages_; ++i) s += refs_[i].load(std::memory_order_acquire) > 1;
    return s;
  }

  /// Takes `n` zeroed pages, each with one reference and a fresh header, appending their ids to
  /// `out`: all or nothing. Errc::capacity_exceeded (naming `what`, the need and what is free)
  /// when fewer than n are free; nothing is taken then. May throw std::bad_alloc growing `out`,
  /// before any page is taken (nothing taken then either).
  [[nodiscard]] Status take(std::size_t n, std::vector<std::uint32_t>& out, const char* what) {
    out.reserve(out.size() + n);  // the only allocation, before the free list changes
    std::lock_guard<std::mutex> g(mu_);
    if (free_.size() < n)
      return fail(Errc::capacity_exceeded, std::string(what) + ": page pool exhausted: " + std::to_string(n) +
                                               " pages needed, " + std::to_string(free_.size()) + " free of " +
                                               std::to_string(pages_) + " (" + std::to_string(stride_) +
                                               " bytes each); free sequences or clear the prefix cache");
    for (std::size_t i = 0; i < n; ++i) {
      const std::uint32_t p = free_.back();
      free_.pop_back();
      refs_[p].store(1, std::memory_order_relaxed);
      headers_[p] = proto_;
      out.push_back(p);
    }
    return {};
  }

  /// Adds a reference to page p.
  void retain(std::uint32_t p) noexcept { refs_[p].fetch_add(1, std::memory_order_relaxed); }

  /// Drops a reference to page p; the last one zeroes the page and returns it to the free list.
  void release(std::uint32_t p) {
    if (refs_[p].fetch_sub(1, std::memory_order_acq_rel) != 1) return;
    detail::secure_zero(data(p), payload_);
    std::lock_guard<std::mutex> g(mu_);
    free_.push_back(p);  // capacity reserved at create: never allocates
  }

  /// References to page p now. A holder seeing 1 is the only holder and may write the page.
  [[nodiscard]] std::uint32_t refs(std::uint32_t p) const noexcept { return refs_[p].load(std::memory_order_acquire); }

  [[nodiscard]] std::byte* data(std::uint32_t p) noexcept { return arena_ + static_cast<std::size_t>(p) * stride_; }
  [[nodiscard]] const std::byte* data(std::uint32_t p) const noexcept {
    return arena_ + static_cast<std::size_t>(p) * stride_;
  }
  [[nodiscard]] BlockHeader& header(std::uint32_t p) noexcept { return headers_[p]; }
  [[nodiscard]] const BlockHeader& header(std::uint32_t p) const noexcept { return headers_[p]; }

  /// Copies page `from` (payload and header) into page `to` (a page the caller holds alone).
  void copy(std::uint32_t from, std::uint32_t to) noexcept {
    std::memcpy(data(to), data(from), payload_);
    headers_[to] = headers_[from];
  }

 private:
  struct FreeDeleter {
    void operator()(std::byte* p) const noexcept { std::free(p); }
  };
  PagePool() = default;

  std::size_t stride_ = 0, payload_ = 0, pages_ = 0;
  std::unique_ptr<std::byte[], FreeDeleter> raw_;  // the allocation (64 bytes beyond the pages)
  std::byte* arena_ = nullptr;                     // page 0: raw_ rounded up to 64 bytes
  std::unique_ptr<std::atomic<std::uint32_t>[]> refs_;
  std::unique_ptr<BlockHeader[]> headers_;
  BlockHeader proto_;
  mutable std::mutex mu_;
  std::vector<std::uint32_t> free_;
};

/// Pages taken for one operation (PagePool::take into `pages`), released when the operation is
/// over: those it did not use on success, and all of them when it leaves by an exception
/// (std::bad_alloc), so a failed call never leaks pages. Release allocates nothing.
struct SparePages {
  PagePool& pool;
  std::vector<std::uint32_t> pages;
  explicit SparePages(PagePool& p) noexcept : pool(p) {}
  SparePages(const SparePages&) = delete;
  SparePages& operator=(const SparePages&) = delete;
  ~SparePages() {
    for (const std::uint32_t p : pages) pool.release(p);
  }
};

}  // namespace kvpack
