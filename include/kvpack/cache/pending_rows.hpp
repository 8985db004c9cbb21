// PendingRows: the full-precision tokens of one layer that are not yet quantized (the residual
// window, an incomplete commit unit, SnapKV's observation window), with their positions and one
// eviction score per (token, KV head).
//
// Committing consumes rows from the front. Instead of moving the remaining rows down on every
// decode step, the front is an index (`head_`): consumed rows are zeroed in place and skipped,
// and the live rows are moved to the start only once the consumed prefix is at least as long as
// they are, so each row is moved O(1) times on average (a decode step with an R-token residual
// window used to move R rows; now it moves R rows once every R steps).
#pragma once

#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <new>
#include <vector>

#include "kvpack/cache/alloc_guard.hpp"
#include "kvpack/detail/secure_zero.hpp"

namespace kvpack {

/// Full-precision rows [n][row_floats] of K and V, their positions [n] and scores [n][heads].
/// Live rows are contiguous: row i of the live range is at k() + i * row_floats.
class PendingRows {
 public:
  /// Sets the row width in floats (kv_heads * head_dim) and the scores per row (KV heads; 0 when
  /// no eviction policy scores tokens). Only on an empty object.
  void configure(std::size_t row_floats, std::size_t score_heads) noexcept {
    row_ = row_floats;
    heads_ = score_heads;
  }
  /// Live rows.
  [[nodiscard]] std::int64_t size() const noexcept { return static_cast<std::int64_t>(pos_.size() - head_); }
  [[nodiscard]] bool empty() const noexcept { return size() == 0; }
  /// K / V of live row 0 ([size()][row_floats]); nullptr when empty.
  [[nodiscard]] const float* k() const noexcept { return empty() ? nullptr : k_.data() + head_ * row_; }
  [[nodiscard]] const float* v() const noexcept { return empty() ? nullptr : v_.data() + head_ * row_; }
  /// Positions of the live rows ([size()]); nullptr when empty.
  [[nodiscard]] const std::int32_t* positions() const noexcept { return empty() ? nullptr : pos_.data() + head_; }
  /// Position of live row i.
  [[nodiscard]] std::int32_t position(std::int64_t i) const noexcept { return pos_[head_ + static_cast<std::size_t>(i)]; }
  /// Score of live row i for KV head h (read / write).
  [[nodiscard]] float& score(std::int64_t i, int h) noexcept {
    return score_[(head_ + static_cast<std::size_t>(i)) * heads_ + static_cast<std::size_t>(h)];
  }
  [[nodiscard]] float score(std::int64_t i, int h) const noexcept {
    return score_[(head_ + static_cast<std::size_t>(i)) * heads_ + static_cast<std::size_t>(h)];
  }
  /// Sets every live score of KV head h to zero.
  void clear_scores(int h) noexcept {
    for (std::int64_t i = 0; i < size(); ++i) score(i, h) = 0.f;
  }

  /// Makes room for n more rows, so that push(.., n) allocates nothing (may throw std::bad_alloc;
  /// the rows held are unchanged either way).
  void reserve(std::size_t n) {
    reserve_zeroing(k_, k_.size() + n * row_), reserve_zeroing(v_, v_.size() + n * row_);
    reserve_geometric(pos_, pos_.size() + n), reserve_geometric(score_, (pos_.size() + n) * heads_);
  }

  /// Appends n rows (k, v: [n][row_floats]; pos: [n]) with zero scores.
  void push(const float* k, const float* v, const std::int32_t* pos, std::size_t n) {
    k_.insert(k_.end(), k, k + n * row_);
    v_.insert(v_.end(), v, v + n * row_);
    pos_.insert(pos_.end(), pos, pos + n);
    score_.resize(pos_.size() * heads_, 0.f);
  }

  /// Before n more rows arrive: when the buffers are oversized (oversized_buffer) for the live
  /// rows plus n, e.g. a prefill chunk's once decoding runs, moves the live rows into buffers of
  /// that size and zeroes and frees the old ones. If that allocation fails the old buffers stay;
  /// the rows held are unchanged either way.
  void shrink_for(std::size_t n) noexcept {
    const std::size_t live = pos_.size() - head_, rows = live + n;
    if (!oversized_buffer(k_.capacity(), rows * row_)) return;
    try {
      PendingRows fresh;
      fresh.configure(row_, heads_);
      fresh.reserve(rows);
      if (live > 0) fresh.push(k(), v(), positions(), live);
      std::copy(score_.begin() + static_cast<std::ptrdiff_t>(head_ * heads_), score_.end(), fresh.score_.begin());
      wipe();
      *this = std::move(fresh);
    } catch (const std::bad_alloc&) {
      // keep the large buffers
    }
  }

  /// Drops the n oldest live rows (n <= size()), zeroing what they occupied.
  void drop_front(std::int64_t n) noexcept {
    const auto nz = static_cast<std::size_t>(n);
    detail::secure_zero(k_.data() + head_ * row_, nz * row_ * sizeof(float));
    detail::secure_zero(v_.data() + head_ * row_, nz * row_ * sizeof(float));
    head_ += nz;
    const std::size_t live = pos_.size() - head_;
    if (head_ >= live) compact();
  }

  /// Zeroes and releases everything.
  void wipe() noexcept {
    detail::wipe_vector(k_);
    detail::wipe_vector(v_);
    detail::wipe_vector(pos_);
    detail::wipe_vector(score_);
    head_ = 0;
  }

  /// Bytes allocated (capacities of every buffer).
  [[nodiscard]] std::size_t allocated_bytes() const noexcept {
    return (k_.capacity() + v_.capacity() + score_.capacity()) * sizeof(float) + pos_.capacity() * sizeof(std::int32_t);
  }

 private:
  // Moves the live rows to the start, zeroing the stale copies they leave behind.
  void compact() noexcept {
    const std::size_t live = pos_.size() - head_;
    if (live > 0) {
      std::memmove(k_.data(), k_.data() + head_ * row_, live * row_ * sizeof(float));
      std::memmove(v_.data(), v_.data() + head_ * row_, live * row_ * sizeof(float));
      std::memmove(pos_.data(), pos_.data() + head_, live * sizeof(std::int32_t));
      if (heads_ > 0) std::memmove(score_.data(), score_.data() + head_ * heads_, live * heads_ * sizeof(float));
      detail::secure_zero(k_.data() + live * row_, head_ * row_ * sizeof(float));
      detail::secure_zero(v_.data() + live * row_, head_ * row_ * sizeof(float));
    }
    k_.resize(live * row_);
    v_.resize(live * row_);
    pos_.resize(live);
    score_.resize(live * heads_);
    head_ = 0;
  }

  std::vector<float> k_, v_;
  std::vector<std::int32_t> pos_;
  std::vector<float> score_;
  std::size_t head_ = 0;  // index of the first live row
  std::size_t row_ = 0, heads_ = 0;
};

}  // namespace kvpack
