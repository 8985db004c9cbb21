// kvpack::plan::FallbackLayer: one layer's KV cache for the quality fallback of issue 9. On a
// switch, new tokens go to another configuration while the tokens already stored stay exactly as
// they are (no migration); during a fallback the last `window` tokens are also kept in fp32 and
// attention reads those exact rows instead of their compressed copies; when the fallback ends
// the exact copy is dropped. Every switch is logged with the monitor's trigger.
#pragma once

#include <algorithm>
#include <cmath>
#include <cstddef>
#include <cstdint>
#include <deque>
#include <span>
#include <string>
#include <variant>
#include <vector>

#include "kvpack/kv_cache.hpp"
#include "kvpack/plan/layered_cache.hpp"
#include "kvpack/plan/monitor.hpp"
#include "kvpack/result.hpp"

namespace kvpack::plan {

/// One logged fallback switch of a FallbackLayer.
struct LayerSwitch {
  SwitchEvent event;          ///< the monitor's event (trigger, value, threshold, state after)
  std::int64_t at_token = 0;  ///< tokens held when it switched (the first token of the new segment)
  int from = -1, to = -1;     ///< candidate index of new tokens before and after
};

/// A single layer stored as a list of segments, each a one-layer KVCache of one candidate type
/// (a std::variant over Caches...). Appends go to the last segment. `switch_to` closes it and opens
/// a segment of another candidate for the tokens that follow; earlier segments are never touched
/// again. While `in_fallback()`, the last `window` tokens are also held in fp32 (K and V,
/// [kv_heads][head_dim] per token) and override their compressed rows in attention.
///
/// Attention (`attend`) reads every segment back (`read_back`), replaces rows held exactly (the
/// fp32 window and the latest append, as KVCache does for its own latest append), and runs a
/// causal softmax in double over all of them. This is a reference-speed path (it decodes the
/// whole layer per call), not the fused kernel: correct, for fallback periods and tests.
///
/// Candidates must not evict. Thread safety: none.
template <class... Caches>
class FallbackLayer {
  static_assert((!Caches::evicts && ...), "kvpack::plan::FallbackLayer: candidates must not evict");

 public:
  using variant_type = std::variant<Caches...>;

  /// shape: the model shape with layers = 1 (other values are taken as 1). candidate: index of
  /// the configuration of the first tokens. window: tokens kept in fp32 during a fallback (>= 0).
  /// Errors (Errc::invalid_argument): candidate out of range, window < 0, or what the
  /// candidate's KVCache::create rejects.
  [[nodiscard]] static Result<FallbackLayer> create(ModelShape shape, int candidate, std::int64_t window) {
    if (window < 0) return fail(Errc::invalid_argument, "FallbackLayer::create: window must be >= 0");
    shape.layers = 1;
    auto c = LayeredCache<Caches...>::make(candidate, shape);
    if (!c) return c.error();
    FallbackLayer f(shape, window);
    f.segs_.push_back({std::move(*c), candidate, 0});
    return f;
  }

  /// Takes over an existing one-layer cache `cache` (holding candidate `candidate`'s tokens) as
  /// the first segment; same errors as create for `window`.
  [[nodiscard]] static Result<FallbackLayer> adopt(ModelShape shape, variant_type&& cache, std::int64_t window) {
    if (window < 0) return fail(Errc::invalid_argument, "FallbackLayer::adopt: window must be >= 0");
    shape.layers = 1;
    FallbackLayer f(shape, window);
    const int candidate = static_cast<int>(cache.index());
    f.total_ = std::visit([](const auto& c) { return c.tokens(0); }, cache);
    f.last_first_ = f.total_;
    f.segs_.push_back({std::move(cache), candidate, 0});
    return f;
  }

  /// Appends n tokens (k, v: [n][kv_heads][head_dim] post-RoPE, positions: [n]) to the current
  /// segment; KVCache::append's errors.
  Status append(std::span<const float> k, std::span<const float> v, std::span<const std::int32_t> positions) {
    auto& s = segs_.back();
    auto st = std::visit([&](auto& c) { return c.append(0, k, v, positions); }, s.cache);
    if (!st) return st;
    const std::size_t row = row_floats(), n = positions.size();
    last_k_.assign(k.begin(), k.end());
    last_v_.assign(v.begin(), v.end());
    last_first_ = total_;
    for (std::size_t t = 0; t < n && on_; ++t) {
      exact_.push_back({total_ + std::int64_t(t), std::vector<float>(k.begin() + std::ptrdiff_t(t * row), k.begin() + std::ptrdiff_t((t + 1) * row)),
                        std::vector<float>(v.begin() + std::ptrdiff_t(t * row), v.begin() + std::ptrdiff_t((t + 1) * row))});
      while (std::int64_t(exact_.size()) > window_) exact_.pop_front();
    }
    total_ += std::int64_t(n);
    return {};
  }

  /// Switch for the tokens that follow: they go to a new segment of candidate `to`; stored tokens
  /// stay as they are. ev.fallback true starts the fp32 window (from the next token), false drops
  /// it. Logged with ev. A switch to the current candidate only changes the fallback state.
  /// Errors (Errc::invalid_argument): `to` out of range, or the new cache's create errors.
  Status switch_to(int to, const SwitchEvent& ev) {
    const int from = segs_.back().candidate;
    if (to != from) {
      auto c = LayeredCache<Caches...>::make(to, one_);
      if (!c) return c.error();
      segs_.push_back({std::move(*c), to, total_});
    }
    on_ = ev.fallback;
    if (!on_) exact_.clear();
    log_.push_back({ev, total_, from, to});
    return {};
  }

  /// Attention of the last n_q appended tokens over the whole layer (q, out: [n_q][q_heads][head_dim];
  /// query i sits at token index tokens() - n_q + i and sees tokens 0..itself). GQA as KVCache.
  /// Errors (Errc::invalid_argument): sizes, or n_q larger than the latest append.
  Status attend(std::span<const float> q, std::span<float> out) {
    const std::size_t D = std::size_t(one_.head_dim), H = std::size_t(one_.kv_heads), QH = std::size_t(one_.q_heads);
    if (q.empty() || q.size() % (QH * D) != 0 || out.size() != q.size())
      return fail(Errc::invalid_argument, "FallbackLayer::attend: q/out sizes");
    const std::int64_t nq = std::int64_t(q.size() / (QH * D));
    if (nq > total_ - last_first_) return fail(Errc::invalid_argument, "FallbackLayer::attend: n_q larger than the latest append");
    const double scale = one_.attn_scale > 0.f ? double(one_.attn_scale) : 1.0 / std::sqrt(double(D));
    const std::size_t group = QH / H;
    for (std::size_t h = 0; h < H; ++h) {
      // Rows of KV head h in token order: decoded, then exact where held exactly.
      std::vector<float> K(std::size_t(total_) * D), V(K.size());
      for (const auto& s : segs_) {
        auto hc = std::visit([&](const auto& c) { return c.read_back(0, int(h)); }, s.cache);
        if (!hc) return hc.error();
        for (std::size_t r = 0; r < hc->indices.size(); ++r) {
          const std::size_t g = std::size_t(s.first + hc->indices[r]);
          std::copy_n(hc->k.begin() + std::ptrdiff_t(r * D), D, K.begin() + std::ptrdiff_t(g * D));
          std::copy_n(hc->v.begin() + std::ptrdiff_t(r * D), D, V.begin() + std::ptrdiff_t(g * D));
        }
      }
      for (const auto& e : exact_) {
        std::copy_n(e.k.begin() + std::ptrdiff_t(h * D), D, K.begin() + std::ptrdiff_t(std::size_t(e.index) * D));
        std::copy_n(e.v.begin() + std::ptrdiff_t(h * D), D, V.begin() + std::ptrdiff_t(std::size_t(e.index) * D));
      }
      for (std::int64_t t = last_first_; t < total_; ++t) {
        const std::size_t src = std::size_t(t - last_first_) * H * D + h * D;
        std::copy_n(last_k_.begin() + std::ptrdiff_t(src), D, K.begin() + std::ptrdiff_t(std::size_t(t) * D));
        std::copy_n(last_v_.begin() + std::ptrdiff_t(src), D, V.begin() + std::ptrdiff_t(std::size_t(t) * D));
      }
      std::vector<double> w;
      for (std::int64_t i = 0; i < nq; ++i)
        for (std::size_t qh = h * group; qh < (h + 1) * group; ++qh) {
          const float* qv = q.data() + (std::size_t(i) * QH + qh) * D;
          const std::int64_t see = total_ - nq + i + 1;
          w.assign(std::size_t(see), 0.0);
          double mx = -INFINITY;
          for (std::int64_t t = 0; t < see; ++t) {
            double d = 0;
            for (std::size_t j = 0; j < D; ++j) d += double(qv[j]) * double(K[std::size_t(t) * D + j]);
            w[std::size_t(t)] = d * scale;
            mx = std::max(mx, w[std::size_t(t)]);
          }
          double z = 0;
          for (auto& x : w) z += (x = std::exp(x - mx));
          float* o = out.data() + (std::size_t(i) * QH + qh) * D;
          for (std::size_t j = 0; j < D; ++j) {
            double acc = 0;
            for (std::int64_t t = 0; t < see; ++t) acc += w[std::size_t(t)] * double(V[std::size_t(t) * D + j]);
            o[j] = float(acc / z);
          }
        }
    }
    return {};
  }

  /// Tokens held (all segments).
  [[nodiscard]] std::int64_t tokens() const noexcept { return total_; }
  /// Segments so far (one per configuration period).
  [[nodiscard]] std::size_t segments() const noexcept { return segs_.size(); }
  /// Candidate index of segment i, and the token index its first token has.
  [[nodiscard]] int segment_candidate(std::size_t i) const { return segs_.at(i).candidate; }
  [[nodiscard]] std::int64_t segment_first(std::size_t i) const { return segs_.at(i).first; }
  /// Decoded contents of segment i, KV head h (KVCache::read_back; indices local to the segment).
  [[nodiscard]] Result<HeadContents> read_back(std::size_t i, int h) const {
    if (i >= segs_.size()) return fail(Errc::invalid_argument, "FallbackLayer::read_back: segment out of range");
    return std::visit([&](const auto& c) { return c.read_back(0, h); }, segs_[i].cache);
  }
  /// Decoded contents of KV head h over all segments, in token order (indices global).
  [[nodiscard]] Result<HeadContents> read_back_all(int h) const {
    HeadContents all;
    for (const auto& s : segs_) {
      auto hc = std::visit([&](const auto& c) { return c.read_back(0, h); }, s.cache);
      if (!hc) return hc.error();
      all.k.insert(all.k.end(), hc->k.begin(), hc->k.end());
      all.v.insert(all.v.end(), hc->v.begin(), hc->v.end());
      all.positions.insert(all.positions.end(), hc->positions.begin(), hc->positions.end());
      for (auto i : hc->indices) all.indices.push_back(s.first + i);
    }
    return all;
  }
  /// Candidate index new tokens go to.
  [[nodiscard]] int current() const noexcept { return segs_.back().candidate; }
  /// True between a switch with fallback on and one with fallback off.
  [[nodiscard]] bool in_fallback() const noexcept { return on_; }
  /// Tokens held in the fp32 window now (<= window; 0 outside a fallback).
  [[nodiscard]] std::int64_t exact_tokens() const noexcept { return std::int64_t(exact_.size()); }
  /// Bytes: every segment's KVCache::memory_bytes plus the fp32 window (K and V, 4 B per value).
  [[nodiscard]] std::size_t memory_bytes() const noexcept {
    std::size_t b = exact_.size() * 2 * row_floats() * sizeof(float);
    for (const auto& s : segs_) b += std::visit([](const auto& c) { return c.memory_bytes(); }, s.cache);
    return b;
  }
  /// Every switch so far, in order.
  [[nodiscard]] const std::vector<LayerSwitch>& log() const noexcept { return log_; }

 private:
  struct Segment {
    variant_type cache;
    int candidate;
    std::int64_t first;  // token index of its first token
  };
  struct ExactRow {
    std::int64_t index;
    std::vector<float> k, v;  // [kv_heads][head_dim]
  };
  FallbackLayer(const ModelShape& s, std::int64_t window) : one_(s), window_(window) {}
  [[nodiscard]] std::size_t row_floats() const noexcept { return std::size_t(one_.kv_heads) * std::size_t(one_.head_dim); }

  ModelShape one_;
  std::int64_t window_ = 0, total_ = 0, last_first_ = 0;
  std::vector<Segment> segs_;
  std::deque<ExactRow> exact_;
  std::vector<float> last_k_, last_v_;
  bool on_ = false;
  std::vector<LayerSwitch> log_;
};

}  // namespace kvpack::plan
