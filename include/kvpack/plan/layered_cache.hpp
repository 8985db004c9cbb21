// kvpack::plan::LayeredCache: one KV-cache configuration per layer, chosen at run time from a
// small closed set of compiled KVCache types, and re-plannable while the sequence grows.
#pragma once

#include <algorithm>
#include <cmath>
#include <cstddef>
#include <cstdint>
#include <memory>
#include <span>
#include <string>
#include <utility>
#include <variant>
#include <vector>

#include "kvpack/kv_cache.hpp"
#include "kvpack/result.hpp"

namespace kvpack::plan {

template <class... Caches>
class FallbackLayer;  // fallback_layer.hpp (included at the end of this header)
struct SwitchEvent;

/// A per-layer KV cache. Layer l is a one-layer `KVCache` of the candidate type choice[l], held in
/// a `std::variant<Caches...>`; every append/attend does one `std::visit` and then runs that
/// type's monomorphic code (the same kernels a uniform `KVCache<...>` of that type runs, bit for
/// bit). The interface is KVCache's (append, attend, reset, memory_bytes, tokens, read_back), so
/// engine code generic over the cache type runs unchanged.
///
/// Re-plan (`replan`): the configuration of a layer can change mid-sequence. New tokens then go
/// to the new configuration. The layer's existing tokens are recompressed lazily, at the layer's
/// next `append` (or at once with `migrate`): they are decoded as attention reads them
/// (`read_back`: quantized tokens dequantized, full-precision ones exact) and appended, with their
/// original positions, to a fresh cache of the new type, which quantizes them by its own rules
/// (sinks, residual window, groups). No token is lost; a token's error becomes that of the old
/// codec followed by the new one (raising precision does not recover what the old codec lost).
/// Until migrated, the layer keeps the old cache and attention reads it as before.
///
/// Candidates must not evict (re-planning carries every token across), and must share nothing
/// but the ModelShape. At most 255 candidates. Thread safety: none (one sequence).
template <class... Caches>
class LayeredCache {
  static_assert(sizeof...(Caches) >= 1 && sizeof...(Caches) <= 255, "kvpack::plan::LayeredCache: 1..255 candidate caches");
  static_assert((!Caches::evicts && ...),
                "kvpack::plan::LayeredCache: candidates must not evict (a re-plan migrates every token of a layer)");

 public:
  /// The per-layer storage: one of the candidate cache types.
  using variant_type = std::variant<Caches...>;
  /// Number of candidate configurations.
  static constexpr int candidates = static_cast<int>(sizeof...(Caches));

  /// Creates an empty cache for `shape` with configuration choice[l] for layer l.
  /// choice: [shape.layers] candidate indices in 0..candidates-1.
  /// Errors (Errc::invalid_argument): choice size or an index out of range, or what a candidate's
  /// KVCache::create rejects for this shape (e.g. head_dim not a multiple of its group size).
  [[nodiscard]] static Result<LayeredCache> create(const ModelShape& shape, std::span<const int> choice) {
    if (shape.layers <= 0 || choice.size() != static_cast<std::size_t>(shape.layers))
      return fail(Errc::invalid_argument, "LayeredCache::create: need one candidate index per layer (" +
                                              std::to_string(shape.layers) + "), got " + std::to_string(choice.size()));
    LayeredCache c(shape);
    for (int l = 0; l < shape.layers; ++l) {
      auto v = make(choice[static_cast<std::size_t>(l)], c.one_);
      if (!v) return v.error();
      c.layers_.push_back(std::move(*v));
      c.target_.push_back(choice[static_cast<std::size_t>(l)]);
    }
    return c;
  }

  /// Appends n tokens to `layer` (KVCache::append's layout and errors). Migrates the layer first
  /// when a re-plan changed its configuration (errors of the migration are returned, with the
  /// layer left on its old configuration and nothing appended).
  Status append(int layer, std::span<const float> k, std::span<const float> v, std::span<const std::int32_t> positions) {
    if (layer < 0 || layer >= one_layers()) return fail(Errc::invalid_argument, "LayeredCache::append: layer out of range");
    if (auto& f = fb_[static_cast<std::size_t>(layer)]) return f->append(k, v, positions);
    if (auto s = migrate(layer); !s) return s;
    return std::visit([&](auto& c) { return c.append(0, k, v, positions); }, layers_[static_cast<std::size_t>(layer)]);
  }

  /// Attention of the last n_q appended tokens of `layer` (KVCache::attend's layout and errors).
  /// Also records each query token's attention-output L2 norm (all query heads), for a quality
  /// monitor: last_attn_norms(layer).
  Status attend(int layer, std::span<const float> q, std::span<float> out) {
    if (layer < 0 || layer >= one_layers()) return fail(Errc::invalid_argument, "LayeredCache::attend: layer out of range");
    auto& f = fb_[static_cast<std::size_t>(layer)];
    auto s = f ? f->attend(q, out) : std::visit([&](auto& c) { return c.attend(0, q, out); }, layers_[static_cast<std::size_t>(layer)]);
    if (!s) return s;
    const auto row = static_cast<std::size_t>(one_.q_heads) * static_cast<std::size_t>(one_.head_dim);
    auto& norms = norms_[static_cast<std::size_t>(layer)];
    norms.assign(out.size() / row, 0.f);
    for (std::size_t t = 0; t < norms.size(); ++t) {
      double acc = 0;
      for (std::size_t i = 0; i < row; ++i) acc += double(out[t * row + i]) * double(out[t * row + i]);
      norms[t] = static_cast<float>(std::sqrt(acc));
    }
    return {};
  }

  /// L2 norms of the attention outputs of `layer`'s last attend, one per query token ([n_q]);
  /// empty before the first attend or for an out-of-range layer.
  [[nodiscard]] std::span<const float> last_attn_norms(int layer) const noexcept {
    if (layer < 0 || layer >= one_layers()) return {};
    return norms_[static_cast<std::size_t>(layer)];
  }

  /// Sets a new configuration per layer (choice: [layers] candidate indices). Cheap: layers whose
  /// configuration changes are migrated at their next append (see the class comment). A layer
  /// set back to the configuration it still stores cancels its pending migration.
  /// Errors (Errc::invalid_argument, nothing changed): wrong size or an index out of range.
  Status replan(std::span<const int> choice) {
    if (std::any_of(fb_.begin(), fb_.end(), [](const auto& f) { return f != nullptr; }))
      return fail(Errc::invalid_argument, "LayeredCache::replan: layers are in segment mode (switch_new_tokens)");
    if (choice.size() != layers_.size())
      return fail(Errc::invalid_argument, "LayeredCache::replan: need one candidate index per layer (" +
                                              std::to_string(layers_.size()) + "), got " + std::to_string(choice.size()));
    for (int c : choice)
      if (c < 0 || c >= candidates)
        return fail(Errc::invalid_argument, "LayeredCache::replan: candidate index " + std::to_string(c) + " out of range");
    target_.assign(choice.begin(), choice.end());
    ++replans_;
    return {};
  }

  /// Quality-fallback switch without migration: from now on layer l's new tokens go to
  /// choice[l], while the tokens it stores stay as they are; ev.fallback true also keeps the last
  /// `window` tokens of every layer in fp32 (read exactly by attention) until a switch with
  /// ev.fallback false drops them. The first call puts every layer in segment mode
  /// (FallbackLayer: reference-speed attention over the decoded segments) for the rest of the
  /// sequence (until reset); replan() is then refused. Each switch is logged per layer
  /// (fallback_log(l)). Errors (Errc::invalid_argument): sizes or indices, window < 0.
  Status switch_new_tokens(std::span<const int> choice, const SwitchEvent& ev, std::int64_t window) {
    if (choice.size() != layers_.size() || window < 0)
      return fail(Errc::invalid_argument, "LayeredCache::switch_new_tokens: one candidate per layer and window >= 0");
    for (int c : choice)
      if (c < 0 || c >= candidates) return fail(Errc::invalid_argument, "LayeredCache::switch_new_tokens: index out of range");
    for (std::size_t l = 0; l < layers_.size(); ++l) {
      if (!fb_[l]) {
        auto f = FallbackLayer<Caches...>::adopt(one_, std::move(layers_[l]), window);
        if (!f) return f.error();
        fb_[l] = std::make_unique<FallbackLayer<Caches...>>(std::move(*f));
      }
      if (auto s = fb_[l]->switch_to(choice[l], ev); !s) return s;
      target_[l] = choice[l];
    }
    return {};
  }
  /// The switch log of `layer` in segment mode (empty otherwise).
  [[nodiscard]] std::size_t fallback_switches(int layer) const noexcept {
    return layer >= 0 && layer < one_layers() && fb_[static_cast<std::size_t>(layer)] ? fb_[static_cast<std::size_t>(layer)]->log().size() : 0;
  }
  /// Tokens `layer` holds in fp32 for an active fallback (0 outside segment mode).
  [[nodiscard]] std::int64_t exact_tokens(int layer) const noexcept {
    return layer >= 0 && layer < one_layers() && fb_[static_cast<std::size_t>(layer)] ? fb_[static_cast<std::size_t>(layer)]->exact_tokens() : 0;
  }

  /// Migrates `layer` to its planned configuration now (no-op when it already holds it): its
  /// tokens are read back and re-appended to a fresh cache of the new type, positions kept.
  /// Errors: layer out of range (Errc::invalid_argument) or those of the new cache's create/append
  /// (the layer then stays on its old configuration, unchanged).
  Status migrate(int layer) {
    if (layer < 0 || layer >= one_layers()) return fail(Errc::invalid_argument, "LayeredCache::migrate: layer out of range");
    const auto L = static_cast<std::size_t>(layer);
    if (fb_[L]) return {};  // segment mode: nothing is migrated
    if (static_cast<int>(layers_[L].index()) == target_[L]) return {};
    auto fresh = make(target_[L], one_);
    if (!fresh) return fresh.error();
    const std::int64_t n = tokens(layer);
    if (n > 0) {
      const auto H = static_cast<std::size_t>(one_.kv_heads), D = static_cast<std::size_t>(one_.head_dim);
      std::vector<float> k(static_cast<std::size_t>(n) * H * D), v(k.size());
      std::vector<std::int32_t> pos(static_cast<std::size_t>(n));
      for (std::size_t h = 0; h < H; ++h) {
        auto hc = read_back(layer, static_cast<int>(h));
        if (!hc) return hc.error();
        if (hc->positions.size() != static_cast<std::size_t>(n))
          return fail(Errc::corrupt_data, "LayeredCache::migrate: layer " + std::to_string(layer) + " KV head " +
                                              std::to_string(h) + " holds " + std::to_string(hc->positions.size()) +
                                              " tokens, expected " + std::to_string(n));
        for (std::size_t t = 0; t < static_cast<std::size_t>(n); ++t) {
          std::copy_n(hc->k.begin() + static_cast<std::ptrdiff_t>(t * D), D, k.begin() + static_cast<std::ptrdiff_t>((t * H + h) * D));
          std::copy_n(hc->v.begin() + static_cast<std::ptrdiff_t>(t * D), D, v.begin() + static_cast<std::ptrdiff_t>((t * H + h) * D));
          pos[t] = hc->positions[t];
        }
      }
      auto s = std::visit([&](auto& c) { return c.append(0, k, v, pos); }, *fresh);
      if (!s) return s;
      recompressed_ += n;
    }
    layers_[L] = std::move(*fresh);
    ++migrations_;
    return {};
  }

  /// Empties every layer (bytes released are zeroed by KVCache); each layer restarts on its
  /// planned configuration (pending migrations become moot). Counters are kept.
  void reset() {
    for (std::size_t l = 0; l < layers_.size(); ++l) {
      if (fb_[l] || static_cast<int>(layers_[l].index()) != target_[l]) {
        fb_[l].reset();
        auto v = make(target_[l], one_);  // cannot fail: the shape was accepted by create()
        if (v) {
          layers_[l] = std::move(*v);
          continue;
        }
      }
      std::visit([](auto& c) { c.reset(); }, layers_[l]);
    }
  }

  /// Bytes of KV data held now, all layers (KVCache::memory_bytes of each layer's cache).
  [[nodiscard]] std::size_t memory_bytes() const noexcept {
    std::size_t s = 0;
    for (int l = 0; l < one_layers(); ++l) s += memory_bytes(l);
    return s;
  }
  /// Bytes of KV data held now by `layer` (0 when out of range).
  [[nodiscard]] std::size_t memory_bytes(int layer) const noexcept {
    if (layer < 0 || layer >= one_layers()) return 0;
    if (const auto& f = fb_[static_cast<std::size_t>(layer)]) return f->memory_bytes();
    return std::visit([](const auto& x) { return x.memory_bytes(); }, layers_[static_cast<std::size_t>(layer)]);
  }
  /// Tokens appended to `layer` so far (0 for an out-of-range layer).
  [[nodiscard]] std::int64_t tokens(int layer) const noexcept {
    if (layer < 0 || layer >= one_layers()) return 0;
    if (const auto& f = fb_[static_cast<std::size_t>(layer)]) return f->tokens();
    return std::visit([](const auto& x) { return x.tokens(0); }, layers_[static_cast<std::size_t>(layer)]);
  }
  /// Decoded contents of (layer, kv_head), as KVCache::read_back. Errc::invalid_argument for bad indices.
  [[nodiscard]] Result<HeadContents> read_back(int layer, int kv_head) const {
    if (layer < 0 || layer >= one_layers()) return fail(Errc::invalid_argument, "LayeredCache::read_back: layer out of range");
    if (const auto& f = fb_[static_cast<std::size_t>(layer)]) return f->read_back_all(kv_head);
    return std::visit([&](const auto& x) { return x.read_back(0, kv_head); }, layers_[static_cast<std::size_t>(layer)]);
  }

  /// Configuration new tokens of `layer` go to (the last plan); -1 when out of range.
  [[nodiscard]] int planned(int layer) const noexcept {
    return layer >= 0 && layer < one_layers() ? target_[static_cast<std::size_t>(layer)] : -1;
  }
  /// Configuration `layer`'s tokens are stored in now (differs from planned() until migrated).
  [[nodiscard]] int stored(int layer) const noexcept {
    if (layer < 0 || layer >= one_layers()) return -1;
    if (const auto& f = fb_[static_cast<std::size_t>(layer)]) return f->current();
    return static_cast<int>(layers_[static_cast<std::size_t>(layer)].index());
  }
  /// The whole-model shape this cache was created with.
  [[nodiscard]] ModelShape shape() const noexcept {
    ModelShape s = one_;
    s.layers = one_layers();
    return s;
  }
  /// Number of replan() calls accepted.
  [[nodiscard]] std::int64_t replans() const noexcept { return replans_; }
  /// Number of layer migrations done, and tokens recompressed by them.
  [[nodiscard]] std::int64_t migrations() const noexcept { return migrations_; }
  [[nodiscard]] std::int64_t recompressed_tokens() const noexcept { return recompressed_; }

  /// Calls f(cache) with layer's current KVCache (one layer, index 0). Preconditions: layer in
  /// range, not in segment mode (switch_new_tokens).
  template <class F>
  decltype(auto) visit(int layer, F&& f) {
    return std::visit(std::forward<F>(f), layers_[static_cast<std::size_t>(layer)]);
  }

  /// Constructs an empty cache of candidate `index` for the one-layer `shape`.
  [[nodiscard]] static Result<variant_type> make(int index, const ModelShape& shape) {
    if (index < 0 || index >= candidates)
      return fail(Errc::invalid_argument, "LayeredCache: candidate index " + std::to_string(index) + " out of range");
    return make_at(index, shape, std::make_index_sequence<sizeof...(Caches)>{});
  }

 private:
  explicit LayeredCache(const ModelShape& shape) : one_(shape), layers_count_(shape.layers) {
    one_.layers = 1;
    layers_.reserve(static_cast<std::size_t>(shape.layers));
    norms_.resize(static_cast<std::size_t>(shape.layers));
    fb_.resize(static_cast<std::size_t>(shape.layers));
  }
  [[nodiscard]] int one_layers() const noexcept { return layers_count_; }

  template <std::size_t I>
  static Result<variant_type> make_one(const ModelShape& s) {
    using C = std::variant_alternative_t<I, variant_type>;
    auto c = C::create(s);
    if (!c) return c.error();
    return variant_type(std::in_place_index<I>, std::move(*c));
  }
  template <std::size_t... I>
  static Result<variant_type> make_at(int index, const ModelShape& s, std::index_sequence<I...>) {
    Result<variant_type> (*const table[])(const ModelShape&) = {&make_one<I>...};
    return table[index](s);
  }

  ModelShape one_;
  int layers_count_ = 0;
  std::vector<variant_type> layers_;
  std::vector<int> target_;
  std::vector<std::vector<float>> norms_;  // [layers][n_q of the last attend]
  std::vector<std::unique_ptr<FallbackLayer<Caches...>>> fb_;  // segment mode per layer (switch_new_tokens)
  std::int64_t replans_ = 0, migrations_ = 0, recompressed_ = 0;
};

}  // namespace kvpack::plan

#include "kvpack/plan/fallback_layer.hpp"  // NOLINT: completes FallbackLayer, used by LayeredCache
