// PositionRuns: the positions of a non-evicting store's quantized tokens, one list per layer,
// run-length coded. Without eviction every KV head holds the same tokens in the same slots, and an
// engine appends consecutive positions, so the int32 per token slot and KV head that a block
// payload would carry (0.25 bits per value at head_dim 64, issue 20) collapses to one run per
// layer: 8 bytes, plus one run per jump in the caller's positions (none are refused; positions
// that jump at every token cost 8 bytes per token and layer, against 4 per token and KV head).
#pragma once

#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <span>
#include <vector>

#include "kvpack/detail/secure_zero.hpp"

namespace kvpack {

/// Positions of tokens 0, 1, ... of a sequence of quantized tokens (a layer's committed tokens,
/// in commit order), as runs of consecutive positions.
class PositionRuns {
 public:
  /// Tokens [first, next run's first) hold positions position, position + 1, ... (token indices
  /// stay below max_tokens <= 2^31 - 1).
  struct Run {
    std::int32_t first = 0;
    std::int32_t position = 0;
  };

  /// Tokens covered.
  [[nodiscard]] std::int64_t size() const noexcept { return size_; }
  /// The runs, oldest first.
  [[nodiscard]] std::span<const Run> runs() const noexcept { return runs_; }

  /// Position of token i (0 <= i < size()).
  [[nodiscard]] std::int32_t at(std::int64_t i) const noexcept {
    const auto it = std::upper_bound(runs_.begin(), runs_.end(), i, [](std::int64_t x, const Run& r) { return x < r.first; });
    const Run& r = *(it - 1);
    return static_cast<std::int32_t>(r.position + (i - r.first));
  }

  /// Runs that appending the positions `a`, then `b`, would add.
  [[nodiscard]] std::size_t runs_added(std::span<const std::int32_t> a, std::span<const std::int32_t> b = {}) const noexcept {
    std::size_t added = 0;
    bool have = size_ > 0;
    std::int64_t next = have ? std::int64_t{last_position()} + 1 : 0;
    for (const auto part : {a, b})
      for (const std::int32_t p : part) {
        if (!have || p != next) ++added;
        have = true;
        next = std::int64_t{p} + 1;
      }
    return added;
  }

  /// Makes room for `runs` more runs, so that pushes adding at most that many allocate nothing.
  /// May throw std::bad_alloc (nothing changed).
  void reserve_runs(std::size_t runs) {
    if (runs_.size() + runs > runs_.capacity()) runs_.reserve(std::max(runs_.size() + runs, 2 * runs_.capacity()));
  }

  /// Appends the positions of n tokens. Allocates when the new runs exceed the reserve (may throw
  /// std::bad_alloc, nothing changed).
  void push(const std::int32_t* pos, std::int64_t n) {
    reserve_runs(runs_added(std::span<const std::int32_t>(pos, static_cast<std::size_t>(n))));
    for (std::int64_t t = 0; t < n; ++t, ++size_)
      if (runs_.empty() || std::int64_t{pos[t]} != std::int64_t{last_position()} + 1)
        runs_.push_back({static_cast<std::int32_t>(size_), pos[t]});
  }

  /// Appends n tokens at positions first, first + 1, ... (first + n - 1 <= INT32_MAX). Allocates
  /// when it starts a run beyond the reserve (may throw std::bad_alloc, nothing changed).
  void push_consecutive(std::int32_t first, std::int64_t n) {
    if (n <= 0) return;
    if (runs_.empty() || std::int64_t{first} != std::int64_t{last_position()} + 1) {
      reserve_runs(1);
      runs_.push_back({static_cast<std::int32_t>(size_), first});
    }
    size_ += n;
  }

  /// Keeps the first n tokens (n <= size()), forgetting the positions of the others (rollback).
  /// Allocates nothing.
  void truncate(std::int64_t n) noexcept {
    while (!runs_.empty() && runs_.back().first >= n) runs_.pop_back();
    size_ = std::min(size_, n);
  }

  /// Tokens from the start whose positions equal their indices (0, 1, ...): the prefix a prompt
  /// fed from position 0 stores, the part of a sequence a prefix cache may share.
  [[nodiscard]] std::int64_t leading_indices() const noexcept {
    if (runs_.empty() || runs_.front().position != 0) return 0;
    return runs_.size() > 1 ? runs_[1].first : size_;
  }

  /// Bytes of the runs held / allocated.
  [[nodiscard]] std::size_t held_bytes() const noexcept { return runs_.size() * sizeof(Run); }
  [[nodiscard]] std::size_t allocated_bytes() const noexcept { return runs_.capacity() * sizeof(Run); }

  /// Zeroes and releases every run.
  void wipe() noexcept {
    detail::wipe_vector(runs_);
    size_ = 0;
  }

 private:
  [[nodiscard]] std::int32_t last_position() const noexcept {
    const Run& r = runs_.back();
    return static_cast<std::int32_t>(r.position + (size_ - 1 - r.first));
  }

  std::vector<Run> runs_;
  std::int64_t size_ = 0;
};

}  // namespace kvpack
