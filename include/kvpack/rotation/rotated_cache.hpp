// Rotated<Cache, Rotate<R, Values, Keys>>: a KV cache whose keys and/or values are stored in
// a rotated basis (issue 20, QuaRot / "incoherence processing"): an orthonormal rotation R spreads
// outlier channels over a block before the codec quantizes them, so low-bit groups lose less.
//
// How attention stays exact (R orthonormal, R^T R = I, rotation/hadamard.hpp):
//  * keys:   stored R k; the query is rotated too, so (R q) . (R k) = q . k: logits unchanged;
//  * values: stored R v; the kernel's output is Σ p_t R v_t = R o, rotated back by R^T: o.
// Where the work happens (no pass over the cache): each appended chunk is rotated once, row by
// row, before the inner cache sees it (so sinks, the residual window, the current chunk and the
// quantized blocks all hold rotated rows, and every codec, eviction policy and backend works
// unchanged), each attend rotates its queries and rotates its outputs back: O(n_q * q_heads *
// D log D) per call, independent of the context length. read_back returns un-rotated rows.
// Everything the inner cache counts (bits, bytes, tokens) is unchanged: the rotation stores nothing.
//
// Errors are the inner cache's, plus Errc::out_of_memory when the rotated copy of a chunk or of
// the queries cannot be allocated (nothing changed then); with NaN/Inf input the channel it names is in the rotated basis
// (a non-finite value spreads over its Hadamard block). Not thread-safe across calls (as KVCache).
#pragma once

#include <cstddef>
#include <cstdint>
#include <span>
#include <type_traits>
#include <utility>
#include <vector>

#include "kvpack/cache/alloc_guard.hpp"
#include "kvpack/cache/cache_adaptor.hpp"
#include "kvpack/cache/rope_state.hpp"
#include "kvpack/cache/shape.hpp"
#include "kvpack/result.hpp"
#include "kvpack/rotation/hadamard.hpp"

namespace kvpack {

/// Rotation choice for Rotated<>: R = Hadamard (default) or SignedHadamard; RotateValues: store
/// values rotated (default true); RotateKeys: store keys rotated (default true). Values only
/// (RotateKeys false) is the choice for a PreRope<> cache, whose keys RoPE turns after storage.
template <class R = Hadamard, bool RotateValues = true, bool RotateKeys = true>
struct Rotate {
  static_assert(detail::is_rotation_v<R>, "kvpack::Rotate<R, ...>: R must be kvpack::Hadamard or kvpack::SignedHadamard");
  static_assert(RotateValues || RotateKeys, "kvpack::Rotate<R, RotateValues, RotateKeys>: rotates neither keys nor values");
  using rotation = R;
  static constexpr bool values = RotateValues;
  static constexpr bool keys = RotateKeys;
};

namespace detail {
template <class T>
inline constexpr bool is_rotate_v = false;
template <class R, bool V, bool K>
inline constexpr bool is_rotate_v<Rotate<R, V, K>> = true;
}  // namespace detail

/// A KV cache (any kvpack::KVCache<...>) with rotated keys and/or values: see the file comment.
/// Same interface as the inner cache for create / append / attend / read_back / reset and the
/// size queries; inner() reaches the rest.
template <class Cache, class Rot = Rotate<>>
class Rotated : public CacheAdaptor<Cache> {
  using Base = CacheAdaptor<Cache>;
  using Base::inner_;

  static_assert(detail::is_rotate_v<Rot>, "kvpack::Rotated<Cache, Rot>: Rot must be kvpack::Rotate<R, RotateValues, RotateKeys>");
  static_assert(!takes_pre_rope_v<Cache> || !Rot::keys,
                "kvpack::Rotated<Cache, Rot>: a PreRope<> cache rotates keys by RoPE after "
                "this rotation, and the two do not commute; use a post-RoPE cache or Rotate<R, true, false> (values only)");

 public:
  using rotation = typename Rot::rotation;
  static constexpr bool rotates_values = Rot::values;
  static constexpr bool rotates_keys = Rot::keys;
  /// A PreRope<> inner cache (values-only rotation): the caller hands keys and queries before RoPE.
  static constexpr bool pre_rope = takes_pre_rope_v<Cache>;
  /// ... and whether it rotates keys at their rank among the held tokens (PreRope<CacheRelative>).
  static constexpr bool rope_cache_relative = rope_cache_relative_v<Cache>;

  /// Creates the inner cache (its errors returned as they are); extra arguments go to its create.
  template <class... A>
  [[nodiscard]] static Result<Rotated> create(const ModelShape& shape, A&&... a) {
    auto c = Cache::create(shape, std::forward<A>(a)...);
    if (!c) return c.error();
    return Result<Rotated>(Rotated(std::move(c).value()));
  }

  /// Appends like Cache::append; k and/or v are rotated per head row first. Sizes that are not
  /// whole head rows go to the inner cache unrotated, which rejects them.
  Status append(int layer, std::span<const float> k, std::span<const float> v, std::span<const std::int32_t> positions) {
    const auto D = static_cast<std::size_t>(inner_.shape().head_dim);
    if (D == 0 || k.size() % D != 0 || v.size() % D != 0) return inner_.append(layer, k, v, positions);
    return catch_alloc("Rotated::append", (k.size() + v.size()) * sizeof(float), [&]() -> Status {
      std::span<const float> ks = k, vs = v;
      if constexpr (rotates_keys) ks = rotated(k, kbuf_);
      if constexpr (rotates_values) vs = rotated(v, vbuf_);
      return inner_.append(layer, ks, vs, positions);
    });
  }

  /// Attends like Cache::attend: q is rotated (keys rotated), the output rotated back (values
  /// rotated).
  Status attend(int layer, std::span<const float> q, std::span<float> out) {
    const auto D = static_cast<std::size_t>(inner_.shape().head_dim);
    if (D == 0 || q.size() % D != 0) return inner_.attend(layer, q, out);
    std::span<const float> qs = q;
    if constexpr (rotates_keys) {
      Status r = catch_alloc("Rotated::attend", q.size() * sizeof(float), [&]() -> Status { qs = rotated(q, qbuf_); return {}; });
      if (!r) return r;
    }
    Status s = inner_.attend(layer, qs, out);
    if constexpr (rotates_values) {
      if (s)
        for (std::size_t r = 0; r < out.size() / D; ++r) unrotate_row<rotation>(out.data() + r * D, static_cast<int>(D));
    }
    return s;
  }

  /// K and V as attention reads them (Cache::read_back), rotated back to the caller's basis.
  [[nodiscard]] Result<HeadContents> read_back(int layer, int kv_head) const {
    auto c = inner_.read_back(layer, kv_head);
    if (!c) return c;
    const int D = inner_.shape().head_dim;
    for (std::size_t r = 0; r < c->k.size() / static_cast<std::size_t>(D); ++r) {
      if constexpr (rotates_keys) unrotate_row<rotation>(c->k.data() + r * static_cast<std::size_t>(D), D);
      if constexpr (rotates_values) unrotate_row<rotation>(c->v.data() + r * static_cast<std::size_t>(D), D);
    }
    return c;
  }

  /// SnapKV caches: Cache::compress_prompt (scores are rotation-invariant).
  Status compress_prompt(int layer)
    requires requires(Cache& c) { c.compress_prompt(0); }
  {
    return inner_.compress_prompt(layer);
  }

  void reset() { inner_.reset(); }
  // Forwarded unchanged (CacheAdaptor): memory_bytes, allocated_bytes, tokens, held_tokens,
  // quantized_tokens, eviction_budget, demoted_tokens, shape, inner (holding rotated rows).

 private:
  explicit Rotated(Cache c) : Base(std::move(c)) {}

  /// buf = x with every head row (D consecutive floats) rotated by R; returns buf.
  std::span<const float> rotated(std::span<const float> x, std::vector<float>& buf) {
    const int D = inner_.shape().head_dim;
    buf.assign(x.begin(), x.end());
    for (std::size_t r = 0; r < buf.size() / static_cast<std::size_t>(D); ++r)
      rotate_row<rotation>(buf.data() + r * static_cast<std::size_t>(D), D);
    return buf;
  }

  std::vector<float> kbuf_, vbuf_, qbuf_;
};

}  // namespace kvpack
