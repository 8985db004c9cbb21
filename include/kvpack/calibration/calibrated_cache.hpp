// Calibrated<Cache, Calibrate<Axis, HeadroomLog2>>: an FP8 KV cache whose scales are chosen once
// per (layer, KV head) or per (layer, KV head, channel) from observed ranges (issue 20), so the
// blocks hold 8-bit codes and nothing else: 8.0 bits per value plus a few bytes per head, where
// the grouped Fp8E4M3<Group<32>> stores an fp16 scale per 32 values (8.5 bits).
//
// The scheme is vLLM's static fp8 KV cache (k_scale / v_scale from calibration, or computed from
// the first batch) at a finer grain. The inner cache's key and/or value codec must be
// Fp8E4M3Unscaled or Fp8E5M2Unscaled (codec/fp8_unscaled.hpp); those roles are scaled, the other
// role (any codec) passes through unchanged.
//
// How scales are chosen: the first append to a layer calibrates it (typically the prompt's first
// chunk): a = the largest |x| of the chunk per KV head (PerHeadScale) or per channel
// (PerChannelScale, floored at the head's a / 16 so a channel that was quiet in calibration keeps
// some range), and scale = a * 2^HeadroomLog2 / format max, so later values up to 2^HeadroomLog2 times
// the calibrated maximum still encode without saturation. A head whose scale would not be a
// normal float (all zeros, or below ~1e-36) keeps scale 1 for good: its values encode as they
// are. Engines with offline statistics call set_scales() before a layer's first append instead.
// Values beyond the range saturate to ±max * scale, as in every fp8 KV cache; saturated_values()
// counts them. Not over Rotated<> (compile error): rotate outside, Rotated<Calibrated<...>>.
//
// How attention stays exact (S = diag(scales), positive): keys are stored as S⁻¹k and queries
// scaled to S q, so (S q)·(S⁻¹k) = q·k; values are stored as S⁻¹v and the output Σ p S⁻¹v is
// scaled back by S. Per append O(n·D) divisions, per attend O(n_q·D) multiplies: no pass over
// the cache, every backend and eviction policy unchanged. read_back returns rows in the caller's
// scale. A PreRope<> cache takes PerHeadScale only (a per-head factor commutes with RoPE; a
// per-channel one does not, RoPE mixes channel pairs).
//
// Errors: the inner cache's (wrong sizes, NaN/Inf, capacity), passed through; a failed append
// changes nothing (its calibration is not kept). Bad set_scales arguments: invalid_argument /
// non_finite. Allocation failure: out_of_memory, nothing changed. Not thread-safe across calls.
#pragma once

#include <algorithm>
#include <cmath>
#include <cstddef>
#include <cstdint>
#include <limits>
#include <span>
#include <string>
#include <type_traits>
#include <utility>
#include <vector>

#include "kvpack/cache/alloc_guard.hpp"
#include "kvpack/cache/cache_adaptor.hpp"
#include "kvpack/cache/rope_state.hpp"
#include "kvpack/cache/shape.hpp"
#include "kvpack/codec/fp8_unscaled.hpp"
#include "kvpack/result.hpp"

namespace kvpack {

/// Scale axis of Calibrated<>: one scale per (layer, KV head), shared by its head_dim channels.
struct PerHeadScale {
  static constexpr bool per_channel = false;
};
/// Scale axis of Calibrated<>: one scale per (layer, KV head, channel).
struct PerChannelScale {
  static constexpr bool per_channel = true;
};

/// Calibration choice for Calibrated<>: the scale axis (PerHeadScale default) and the headroom:
/// calibration maps the observed max to format max / 2^HeadroomLog2 (default 2: 4x room).
template <class Axis = PerHeadScale, int HeadroomLog2 = 2>
struct Calibrate {
  static_assert(std::is_same_v<Axis, PerHeadScale> || std::is_same_v<Axis, PerChannelScale>,
                "kvpack::Calibrate<Axis, ...>: Axis must be kvpack::PerHeadScale or kvpack::PerChannelScale");
  static_assert(HeadroomLog2 >= 0 && HeadroomLog2 <= 8, "kvpack::Calibrate<..., HeadroomLog2>: headroom must be in [0, 8]");
  static constexpr bool per_channel = Axis::per_channel;
  static constexpr int headroom_log2 = HeadroomLog2;
};

namespace detail {
template <class T>
inline constexpr bool is_calibrate_v = false;
template <class A, int H>
inline constexpr bool is_calibrate_v<Calibrate<A, H>> = true;
}  // namespace detail

/// A KV cache (any kvpack::KVCache<...>; rotate outside it: Rotated<Calibrated<...>>) whose FP8-unscaled roles are stored
/// divided by calibrated scales: see the file comment. Same interface as the inner cache for
/// create / append / attend / read_back / reset / clear and the size queries; inner() reaches the
/// rest (holding scaled rows).
template <class Cache, class Cal = Calibrate<>>
class Calibrated : public CacheAdaptor<Cache> {
  using Base = CacheAdaptor<Cache>;
  using Base::inner_;
  static_assert(detail::is_calibrate_v<Cal>, "kvpack::Calibrated<Cache, Cal>: Cal must be kvpack::Calibrate<Axis, HeadroomLog2>");
  static constexpr bool kScaleKeys = detail::is_fp8_unscaled_v<typename Cache::key_codec>;
  static constexpr bool kScaleValues = detail::is_fp8_unscaled_v<typename Cache::value_codec>;
  static_assert(kScaleKeys || kScaleValues,
                "kvpack::Calibrated<Cache, ...>: the cache's key or value codec must be Fp8E4M3Unscaled or "
                "Fp8E5M2Unscaled (grouped codecs store their own scales)");
  static_assert(!requires { typename Cache::rotation; },
                "kvpack::Calibrated<Rotated<...>>: scales chosen on unrotated rows do not fit the rotated rows the codec "
                "stores; rotate outside the scaling: Rotated<Calibrated<KVCache<...>>>");
  static_assert(!(Cal::per_channel && takes_pre_rope_v<Cache>),
                "kvpack::Calibrated<Cache, Calibrate<PerChannelScale>>: RoPE mixes channel pairs, so per-channel scales "
                "do not commute with a PreRope<> cache's rotation; use PerHeadScale");

 public:
  using typename Base::key_codec;
  using typename Base::value_codec;
  static constexpr bool pre_rope = takes_pre_rope_v<Cache>;
  static constexpr bool rope_cache_relative = rope_cache_relative_v<Cache>;
  static constexpr bool scales_keys = kScaleKeys;
  static constexpr bool scales_values = kScaleValues;
  static constexpr bool per_channel_scales = Cal::per_channel;

  /// Creates the inner cache (its errors returned as they are); extra arguments go to its create.
  /// Every layer starts uncalibrated (scales 1).
  template <class... A>
  [[nodiscard]] static Result<Calibrated> create(const ModelShape& shape, A&&... a) {
    auto c = Cache::create(shape, std::forward<A>(a)...);
    if (!c) return c.error();
    const std::size_t n = static_cast<std::size_t>(shape.layers) * static_cast<std::size_t>(shape.kv_heads) *
                          static_cast<std::size_t>(Cal::per_channel ? shape.head_dim : 1);
    return catch_alloc("Calibrated::create", n * 8, [&]() -> Result<Calibrated> { return Calibrated(std::move(c).value(), n); });
  }

  /// Appends like Cache::append. The scaled roles are divided by their layer's scales first;
  /// the first successful append to an uncalibrated layer also sets them from its rows.
  /// Sizes that are not whole rows, bad layers and non-finite input go to the inner cache as
  /// they are, which rejects them.
  Status append(int layer, std::span<const float> k, std::span<const float> v, std::span<const std::int32_t> positions) {
    const auto row = row_floats();
    if (!valid_layer(layer) || row == 0 || k.size() % row != 0 || v.size() != k.size() || !all_finite(k) || !all_finite(v))
      return inner_.append(layer, k, v, positions);
    return catch_alloc("Calibrated::append", 2 * k.size() * sizeof(float), [&]() -> Status {
      const bool calibrate = state_[static_cast<std::size_t>(layer)] == kUncalibrated && !k.empty();
      std::int64_t saturated = 0;
      if constexpr (kScaleKeys) {
        if (calibrate) derive<key_codec>(k, cand_k_);
        saturated += divided<key_codec>(k, calibrate ? std::span<const float>(cand_k_) : layer_scales(k_scale_, layer), kbuf_);
      }
      if constexpr (kScaleValues) {
        if (calibrate) derive<value_codec>(v, cand_v_);
        saturated += divided<value_codec>(v, calibrate ? std::span<const float>(cand_v_) : layer_scales(v_scale_, layer), vbuf_);
      }
      const std::span<const float> ks = kScaleKeys ? std::span<const float>(kbuf_) : k;
      const std::span<const float> vs = kScaleValues ? std::span<const float>(vbuf_) : v;
      Status s = inner_.append(layer, ks, vs, positions);
      if (!s) return s;
      if (calibrate) {  // nothing below allocates: the scales are kept only with the rows they encoded
        if constexpr (kScaleKeys) std::copy(cand_k_.begin(), cand_k_.end(), layer_begin(k_scale_, layer));
        if constexpr (kScaleValues) std::copy(cand_v_.begin(), cand_v_.end(), layer_begin(v_scale_, layer));
        state_[static_cast<std::size_t>(layer)] = kFromData;
      }
      saturated_ += saturated;
      return {};
    });
  }

  /// Attends like Cache::attend: queries are scaled by the key scales of their KV head (GQA:
  /// query head h reads KV head h / (q_heads / kv_heads)), the output by the value scales.
  Status attend(int layer, std::span<const float> q, std::span<float> out) {
    const auto D = static_cast<std::size_t>(inner_.shape().head_dim);
    if (!valid_layer(layer) || D == 0 || q.size() % D != 0) return inner_.attend(layer, q, out);
    return catch_alloc("Calibrated::attend", q.size() * sizeof(float), [&]() -> Status {
      std::span<const float> qs = q;
      if constexpr (kScaleKeys) {
        qbuf_.assign(q.begin(), q.end());
        scale_heads(qbuf_, layer_scales(k_scale_, layer), inner_.shape().q_heads);
        qs = qbuf_;
      }
      Status s = inner_.attend(layer, qs, out);
      if constexpr (kScaleValues) {
        if (s && out.size() == q.size()) scale_heads(out, layer_scales(v_scale_, layer), inner_.shape().q_heads);
      }
      return s;
    });
  }

  /// K and V as attention reads them (Cache::read_back), multiplied back to the caller's scale.
  [[nodiscard]] Result<HeadContents> read_back(int layer, int kv_head) const {
    auto c = inner_.read_back(layer, kv_head);
    if (!c) return c;
    const auto D = static_cast<std::size_t>(inner_.shape().head_dim);
    const std::size_t at = static_cast<std::size_t>(kv_head) * per_head();
    if constexpr (kScaleKeys) rescale_rows(c->k, layer_scales(k_scale_, layer).subspan(at, per_head()), D);
    if constexpr (kScaleValues) rescale_rows(c->v, layer_scales(v_scale_, layer).subspan(at, per_head()), D);
    return c;
  }

  /// Sets layer `layer`'s scales (offline calibration), before its first append (or after
  /// reset/clear): k_scales / v_scales hold kv_heads x (head_dim if per-channel, else 1) scales,
  /// [kv_head][channel], finite and > 0; a role this cache does not scale takes an empty span.
  /// Scales set here survive reset() and clear(). Errors: invalid_argument (layer, sizes, a layer
  /// that holds tokens, a scale outside [FLT_MIN, FLT_MAX / format max]: a denormal scale would
  /// overflow the division, a larger one the scaled query), non_finite; nothing changes on error.
  Status set_scales(int layer, std::span<const float> k_scales, std::span<const float> v_scales) {
    if (!valid_layer(layer)) return fail(Errc::invalid_argument, "Calibrated::set_scales: layer " + std::to_string(layer) + " out of range");
    if (inner_.tokens(layer) != 0)
      return fail(Errc::invalid_argument, "Calibrated::set_scales: layer " + std::to_string(layer) +
                                              " holds tokens encoded with its current scales; set scales before its first append");
    const std::size_t n = static_cast<std::size_t>(inner_.shape().kv_heads) * per_head();
    if (k_scales.size() != (kScaleKeys ? n : 0) || v_scales.size() != (kScaleValues ? n : 0))
      return fail(Errc::invalid_argument, "Calibrated::set_scales: expected " + std::to_string(kScaleKeys ? n : 0) + " key and " +
                                              std::to_string(kScaleValues ? n : 0) + " value scales ([kv_head][" +
                                              (Cal::per_channel ? "head_dim" : "1") + "])");
    for (const auto sp : {k_scales, v_scales})
      for (const float s : sp) {
        if (!std::isfinite(s)) return fail(Errc::non_finite, "Calibrated::set_scales: a scale is NaN or Inf");
        if (!(s >= kMinScale && s <= kMaxScale))
          return fail(Errc::invalid_argument, "Calibrated::set_scales: scale " + std::to_string(s) + " outside [" +
                                                  std::to_string(kMinScale) + ", " + std::to_string(kMaxScale) + "]");
      }
    if constexpr (kScaleKeys) std::copy(k_scales.begin(), k_scales.end(), layer_begin(k_scale_, layer));
    if constexpr (kScaleValues) std::copy(v_scales.begin(), v_scales.end(), layer_begin(v_scale_, layer));
    state_[static_cast<std::size_t>(layer)] = kFromCaller;
    return {};
  }

  /// Layer `layer`'s key scales, [kv_head][head_dim or 1] (all 1 while uncalibrated; empty when keys are not scaled).
  [[nodiscard]] std::span<const float> key_scales(int layer) const noexcept {
    return kScaleKeys && valid_layer(layer) ? layer_scales(k_scale_, layer) : std::span<const float>{};
  }
  /// Layer `layer`'s value scales, as key_scales.
  [[nodiscard]] std::span<const float> value_scales(int layer) const noexcept {
    return kScaleValues && valid_layer(layer) ? layer_scales(v_scale_, layer) : std::span<const float>{};
  }
  /// Whether layer `layer` has scales (from its first append or set_scales).
  [[nodiscard]] bool calibrated(int layer) const noexcept {
    return valid_layer(layer) && state_[static_cast<std::size_t>(layer)] != kUncalibrated;
  }
  /// Values stored since create/reset whose scaled magnitude exceeded the format's max (they were
  /// saturated to ±max * scale): a sign that calibration saw a range too small.
  [[nodiscard]] std::int64_t saturated_values() const noexcept { return saturated_; }

  /// SnapKV caches: Cache::compress_prompt (logits are unchanged by the scaling).
  Status compress_prompt(int layer)
    requires requires(Cache& c) { c.compress_prompt(0); }
  {
    return inner_.compress_prompt(layer);
  }

  /// Cache::reset; layers calibrated from data forget their scales (the next append calibrates
  /// again), scales from set_scales stay.
  void reset() {
    inner_.reset();
    forget_data_scales();
  }
  /// Cache::clear (keeps allocations), then as reset() for the scales.
  void clear()
    requires requires(Cache& c) { c.clear(); }
  {
    inner_.clear();
    forget_data_scales();
  }

  /// The inner cache's bytes plus the scales (4 bytes each, per scaled role; allocated at create,
  /// so counted after reset() and clear() too).
  [[nodiscard]] std::size_t memory_bytes() const noexcept { return inner_.memory_bytes() + scale_bytes(); }
  /// allocated_bytes: also the scaled copies of the largest append and query (kept for reuse).
  [[nodiscard]] std::size_t allocated_bytes() const noexcept {
    return inner_.allocated_bytes() + scale_bytes() +
           (kbuf_.capacity() + vbuf_.capacity() + qbuf_.capacity() + cand_k_.capacity() + cand_v_.capacity()) * sizeof(float);
  }
  // Forwarded unchanged (CacheAdaptor): tokens, held_tokens, quantized_tokens, eviction_budget,
  // demoted_tokens, shape, inner (holding scaled rows).

 private:
  static constexpr std::uint8_t kUncalibrated = 0, kFromData = 1, kFromCaller = 2;
  // Scales accepted: normal floats, small enough that a query of the format's range stays finite.
  static constexpr float kMinScale = std::numeric_limits<float>::min();
  static constexpr float kMaxScale = std::numeric_limits<float>::max() / kE5M2Max;

  Calibrated(Cache c, std::size_t n)
      : Base(std::move(c)), k_scale_(kScaleKeys ? n : 0, 1.f), v_scale_(kScaleValues ? n : 0, 1.f),
        state_(static_cast<std::size_t>(inner_.shape().layers), kUncalibrated) {}

  [[nodiscard]] bool valid_layer(int layer) const noexcept { return layer >= 0 && layer < inner_.shape().layers; }
  [[nodiscard]] std::size_t per_head() const noexcept {
    return Cal::per_channel ? static_cast<std::size_t>(inner_.shape().head_dim) : 1;
  }
  [[nodiscard]] std::size_t row_floats() const noexcept {
    return static_cast<std::size_t>(inner_.shape().kv_heads) * static_cast<std::size_t>(inner_.shape().head_dim);
  }
  [[nodiscard]] std::size_t scale_bytes() const noexcept { return (k_scale_.size() + v_scale_.size()) * sizeof(float); }
  [[nodiscard]] std::span<const float> layer_scales(const std::vector<float>& all, int layer) const noexcept {
    const std::size_t n = static_cast<std::size_t>(inner_.shape().kv_heads) * per_head();
    return std::span<const float>(all).subspan(static_cast<std::size_t>(layer) * n, n);
  }
  [[nodiscard]] std::vector<float>::iterator layer_begin(std::vector<float>& all, int layer) noexcept {
    const std::size_t n = static_cast<std::size_t>(inner_.shape().kv_heads) * per_head();
    return all.begin() + static_cast<std::ptrdiff_t>(static_cast<std::size_t>(layer) * n);
  }
  [[nodiscard]] static bool all_finite(std::span<const float> x) noexcept {
    return std::all_of(x.begin(), x.end(), [](float f) { return std::isfinite(f); });
  }

  /// Scales of a chunk x ([n][kv_heads][D], finite) for a role of codec C: see the file comment.
  template <class C>
  void derive(std::span<const float> x, std::vector<float>& out) const {
    const std::size_t H = static_cast<std::size_t>(inner_.shape().kv_heads), D = static_cast<std::size_t>(inner_.shape().head_dim);
    const std::size_t n = x.size() / (H * D);
    std::vector<float> amax(H * D, 0.f);
    for (std::size_t t = 0; t < n; ++t)
      for (std::size_t i = 0; i < H * D; ++i) amax[i] = std::max(amax[i], std::abs(x[t * H * D + i]));
    constexpr double room = static_cast<double>(1u << Cal::headroom_log2) / C::format::max;
    out.assign(H * per_head(), 1.f);
    for (std::size_t h = 0; h < H; ++h) {
      const float head = *std::max_element(amax.begin() + static_cast<std::ptrdiff_t>(h * D),
                                           amax.begin() + static_cast<std::ptrdiff_t>((h + 1) * D));
      // An all-zero (or all-denormal-scale) head keeps scale 1: its values encode as they are.
      if (static_cast<double>(head) / 16 * room < kMinScale) continue;
      for (std::size_t c = 0; c < per_head(); ++c) {
        const float a = Cal::per_channel ? std::max(amax[h * D + c], head / 16.f) : head;
        out[h * per_head() + c] = static_cast<float>(std::min<double>(a * room, kMaxScale));
      }
    }
  }

  /// buf = x with every element divided by its (KV head, channel) scale; returns how many lie
  /// beyond the max of codec C's format (the codec saturates them).
  template <class C>
  std::int64_t divided(std::span<const float> x, std::span<const float> scales, std::vector<float>& buf) {
    const std::size_t H = static_cast<std::size_t>(inner_.shape().kv_heads), D = static_cast<std::size_t>(inner_.shape().head_dim);
    buf.resize(x.size());
    std::int64_t over = 0;
    for (std::size_t i = 0; i < x.size(); ++i) {
      const std::size_t h = (i / D) % H, c = Cal::per_channel ? i % D : 0;
      const float y = x[i] / scales[h * per_head() + c];
      over += std::abs(y) > C::format::max ? 1 : 0;
      // A finite beyond-range y stays (the latest chunk is read exactly; the codec saturates it
      // when it quantizes); one that overflowed to Inf becomes what the codec would store.
      buf[i] = std::isfinite(y) ? y : std::copysign(C::format::max, y);
    }
    return over;
  }

  /// x ([n][q_heads][D]) with every query head's row multiplied by its KV head's scales.
  void scale_heads(std::span<float> x, std::span<const float> scales, int q_heads) const noexcept {
    const std::size_t D = static_cast<std::size_t>(inner_.shape().head_dim), Hq = static_cast<std::size_t>(q_heads);
    const std::size_t group = Hq / static_cast<std::size_t>(inner_.shape().kv_heads);
    for (std::size_t i = 0; i < x.size(); ++i) {
      const std::size_t kvh = ((i / D) % Hq) / group, c = Cal::per_channel ? i % D : 0;
      x[i] *= scales[kvh * per_head() + c];
    }
  }
  /// Rows of D values multiplied by one KV head's scales.
  void rescale_rows(std::vector<float>& rows, std::span<const float> scales, std::size_t D) const noexcept {
    for (std::size_t i = 0; i < rows.size(); ++i) rows[i] *= scales[Cal::per_channel ? i % D : 0];
  }

  void forget_data_scales() {
    const std::size_t n = static_cast<std::size_t>(inner_.shape().kv_heads) * per_head();
    for (std::size_t l = 0; l < state_.size(); ++l) {
      if (state_[l] != kFromData) continue;
      std::fill_n(k_scale_.begin() + static_cast<std::ptrdiff_t>(kScaleKeys ? l * n : 0), kScaleKeys ? n : 0, 1.f);
      std::fill_n(v_scale_.begin() + static_cast<std::ptrdiff_t>(kScaleValues ? l * n : 0), kScaleValues ? n : 0, 1.f);
      state_[l] = kUncalibrated;
    }
    saturated_ = 0;
  }

  std::vector<float> k_scale_, v_scale_;  // [layers][kv_heads][per_head()], scaled roles only
  std::vector<std::uint8_t> state_;       // per layer: kUncalibrated, kFromData, kFromCaller
  std::int64_t saturated_ = 0;
  std::vector<float> kbuf_, vbuf_, qbuf_, cand_k_, cand_v_;
};

}  // namespace kvpack
