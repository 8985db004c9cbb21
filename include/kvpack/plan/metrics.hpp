// kvpack::plan metrics: what a cache costs and how it behaves, as a struct and as Prometheus
// text exposition (format 0.0.4, https://prometheus.io/docs/instrumenting/exposition_formats/).
#pragma once

#include <cmath>
#include <cstdint>
#include <cstdio>
#include <map>
#include <span>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "kvpack/kv_cache.hpp"
#include "kvpack/result.hpp"

namespace kvpack::plan {

/// Figures of one cache (one sequence). Counters only grow; gauges are values now.
struct CacheMetrics {
  std::uint64_t kv_bytes = 0;               ///< gauge: memory_bytes() now
  std::uint64_t fp32_bytes = 0;             ///< gauge: bytes the same tokens take as fp32 K and V (4 bytes/value)
  std::uint64_t tokens = 0;                 ///< gauge: tokens held, summed over layers
  double quant_error_rel_rms = 0;           ///< gauge: sqrt(sum |x̂ - x|^2 / sum |x|^2) over sampled K and V rows
  std::uint64_t quant_error_samples = 0;    ///< gauge: rows the error was measured on
  std::uint64_t evictions = 0;              ///< counter: tokens evicted
  std::uint64_t replans = 0;                ///< counter: re-plans accepted
  std::uint64_t migrations = 0;             ///< counter: layer migrations done by re-plans
  std::uint64_t recompressed_tokens = 0;    ///< counter: tokens recompressed by migrations
  std::uint64_t fallbacks = 0;              ///< counter: quality fallbacks entered
  // Offload: zero (and offload_enabled false) until offload is wired into the cache.
  bool offload_enabled = false;             ///< gauge (0/1)
  std::uint64_t offload_resident_bytes = 0; ///< gauge: bytes in the hot tier
  std::uint64_t offload_host_bytes = 0;     ///< gauge: bytes in the host RAM tier
  std::uint64_t offload_file_bytes = 0;     ///< gauge: bytes in the file tier
  std::uint64_t offload_fetches = 0;        ///< counter: blocks fetched back
  std::uint64_t offload_writes = 0;         ///< counter: blocks written out

  /// fp32 bytes / bytes held (0 when nothing is held).
  [[nodiscard]] double compression_ratio() const noexcept {
    return kv_bytes ? static_cast<double>(fp32_bytes) / static_cast<double>(kv_bytes) : 0.0;
  }
};

/// Keeps exact copies of every `every`-th token appended to each layer (all KV heads), and
/// measures how far the cache's stored (decoded) rows are from them. Works with any cache that
/// has read_back(layer, kv_head) (KVCache, LayeredCache). Memory: 8 * kv_heads * head_dim bytes per
/// sampled token.
class QuantErrorSampler {
 public:
  /// every >= 1: sample one token in `every` (by cache index within the layer).
  explicit QuantErrorSampler(int every = 64) : every_(every < 1 ? 1 : every) {}

  /// Records the sampled tokens of one append: k, v [n][kv_heads][head_dim] as passed to the cache;
  /// first_index = tokens(layer) before the append.
  void record(int layer, std::int64_t first_index, int kv_heads, int head_dim, std::span<const float> k,
              std::span<const float> v) {
    const std::size_t row = static_cast<std::size_t>(kv_heads) * static_cast<std::size_t>(head_dim);
    if (row == 0) return;
    const std::size_t n = k.size() / row;
    for (std::size_t t = 0; t < n; ++t) {
      const std::int64_t idx = first_index + static_cast<std::int64_t>(t);
      if (idx % every_ != 0) continue;
      Sample& s = samples_[{layer, idx}];
      s.k.assign(k.begin() + static_cast<std::ptrdiff_t>(t * row), k.begin() + static_cast<std::ptrdiff_t>((t + 1) * row));
      s.v.assign(v.begin() + static_cast<std::ptrdiff_t>(t * row), v.begin() + static_cast<std::ptrdiff_t>((t + 1) * row));
    }
  }

  /// Relative RMS error of the stored rows against the recorded ones, and the rows compared (rows
  /// no longer held, e.g. evicted, are skipped). Errors: those of read_back.
  template <class Cache>
  [[nodiscard]] Result<std::pair<double, std::uint64_t>> measure(const Cache& cache, int layers, int kv_heads,
                                                                 int head_dim) const {
    double num = 0, den = 0;
    std::uint64_t rows = 0;
    const auto D = static_cast<std::size_t>(head_dim);
    for (int l = 0; l < layers; ++l) {
      auto first = samples_.lower_bound({l, 0});
      if (first == samples_.end() || first->first.first != l) continue;
      for (int h = 0; h < kv_heads; ++h) {
        auto hc = cache.read_back(l, h);
        if (!hc) return hc.error();
        for (std::size_t r = 0; r < hc->indices.size(); ++r) {
          auto it = samples_.find({l, hc->indices[r]});
          if (it == samples_.end()) continue;
          for (std::size_t d = 0; d < D; ++d) {
            const double xk = it->second.k[static_cast<std::size_t>(h) * D + d], xv = it->second.v[static_cast<std::size_t>(h) * D + d];
            const double ek = hc->k[r * D + d] - xk, ev = hc->v[r * D + d] - xv;
            num += ek * ek + ev * ev;
            den += xk * xk + xv * xv;
          }
          ++rows;
        }
      }
    }
    return std::pair<double, std::uint64_t>{den > 0 ? std::sqrt(num / den) : 0.0, rows};
  }

  /// Forgets every sample (call with the cache's reset()).
  void clear() { samples_.clear(); }

 private:
  struct Sample {
    std::vector<float> k, v;
  };
  int every_;
  std::map<std::pair<int, std::int64_t>, Sample> samples_;
};

namespace detail {
inline std::string prom_escape(std::string_view s) {
  std::string o;
  for (char c : s) {
    if (c == '\\') o += "\\\\";
    else if (c == '"') o += "\\\"";
    else if (c == '\n') o += "\\n";
    else o += c;
  }
  return o;
}
inline std::string prom_number(double v) {
  if (std::isnan(v)) return "NaN";
  if (std::isinf(v)) return v > 0 ? "+Inf" : "-Inf";
  char b[40];
  std::snprintf(b, sizeof b, "%.17g", v);
  return b;
}
}  // namespace detail

/// Prometheus text exposition (version 0.0.4) of `m`: for each metric a `# HELP` and a `# TYPE`
/// line, then one sample `<prefix>_<name>{labels} value`. Counters are named `..._total`. Label
/// values are escaped (backslash, double quote, newline); label names must match
/// [a-zA-Z_][a-zA-Z0-9_]* and the prefix [a-zA-Z_:][a-zA-Z0-9_:]* (not checked: the caller's
/// constants). Ends with a newline.
[[nodiscard]] inline std::string to_prometheus(const CacheMetrics& m, std::string_view prefix = "kvpack",
                                               const std::vector<std::pair<std::string, std::string>>& labels = {}) {
  std::string lab;
  for (const auto& [k, v] : labels) lab += (lab.empty() ? "" : ",") + k + "=\"" + detail::prom_escape(v) + "\"";
  if (!lab.empty()) lab = "{" + lab + "}";
  std::string out;
  auto put = [&](const char* name, const char* type, const char* help, double v) {
    const std::string full = std::string(prefix) + "_" + name;
    out += "# HELP " + full + " " + help + "\n# TYPE " + full + " " + type + "\n" + full + lab + " " +
           detail::prom_number(v) + "\n";
  };
  auto d = [](std::uint64_t x) { return static_cast<double>(x); };
  put("kv_bytes", "gauge", "Bytes of KV data held (codes, metadata, positions, full-precision rows).", d(m.kv_bytes));
  put("kv_fp32_bytes", "gauge", "Bytes the held tokens would take as fp32 K and V.", d(m.fp32_bytes));
  put("kv_tokens", "gauge", "Tokens held, summed over layers.", d(m.tokens));
  put("compression_ratio", "gauge", "fp32 bytes divided by bytes held.", m.compression_ratio());
  put("quant_error_rel_rms", "gauge", "Relative RMS error of sampled stored K/V rows against the exact rows.",
      m.quant_error_rel_rms);
  put("quant_error_sampled_rows", "gauge", "Rows the quantization error was measured on.", d(m.quant_error_samples));
  put("evictions_total", "counter", "Tokens evicted.", d(m.evictions));
  put("replans_total", "counter", "Re-plans accepted.", d(m.replans));
  put("migrations_total", "counter", "Layer migrations done by re-plans.", d(m.migrations));
  put("recompressed_tokens_total", "counter", "Tokens recompressed by migrations.", d(m.recompressed_tokens));
  put("fallbacks_total", "counter", "Quality fallbacks entered.", d(m.fallbacks));
  put("offload_enabled", "gauge", "1 when blocks are offloaded, else 0.", m.offload_enabled ? 1.0 : 0.0);
  put("offload_resident_bytes", "gauge", "Offloaded-block bytes in the hot tier.", d(m.offload_resident_bytes));
  put("offload_host_bytes", "gauge", "Offloaded-block bytes in the host RAM tier.", d(m.offload_host_bytes));
  put("offload_file_bytes", "gauge", "Offloaded-block bytes in the file tier.", d(m.offload_file_bytes));
  put("offload_fetches_total", "counter", "Blocks fetched back from an offload tier.", d(m.offload_fetches));
  put("offload_writes_total", "counter", "Blocks written to an offload tier.", d(m.offload_writes));
  return out;
}

/// Fills the figures every cache exposes: bytes held, fp32-equivalent bytes and tokens (held
/// tokens per layer when the cache reports held_tokens), and re-plan counters for a LayeredCache.
/// Leaves the other fields as they are.
template <class Cache>
void collect(const Cache& cache, CacheMetrics& m) {
  const ModelShape s = cache.shape();
  m.kv_bytes = cache.memory_bytes();
  m.tokens = 0;
  m.fp32_bytes = 0;
  for (int l = 0; l < s.layers; ++l) {
    std::uint64_t t = 0;
    if constexpr (requires { cache.held_tokens(l, 0); }) {
      for (int h = 0; h < s.kv_heads; ++h) t += static_cast<std::uint64_t>(cache.held_tokens(l, h));
      m.fp32_bytes += t * static_cast<std::uint64_t>(s.head_dim) * 8u;
      m.tokens += t / static_cast<std::uint64_t>(s.kv_heads);
    } else {
      t = static_cast<std::uint64_t>(cache.tokens(l));
      m.fp32_bytes += t * static_cast<std::uint64_t>(s.kv_heads) * static_cast<std::uint64_t>(s.head_dim) * 8u;
      m.tokens += t;
    }
  }
  if constexpr (requires { cache.replans(); }) {
    m.replans = static_cast<std::uint64_t>(cache.replans());
    m.migrations = static_cast<std::uint64_t>(cache.migrations());
    m.recompressed_tokens = static_cast<std::uint64_t>(cache.recompressed_tokens());
  }
}

}  // namespace kvpack::plan
