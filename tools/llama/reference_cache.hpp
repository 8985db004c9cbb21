// ReferenceCache: the plain float32 KV cache an engine has without kvpack (the baseline), with the
// same interface as kvpack::KVCache (see include/kvpack/kv_cache.hpp), plus ZeroValues, a
// deliberately destructive adapter that proves the cache lies in the path of every scored token.
#pragma once

#include <Eigen/Core>

#include <cmath>
#include <cstddef>
#include <cstdint>
#include <limits>
#include <span>
#include <string>
#include <vector>

#include <kvpack/kv_cache.hpp>  // kvpack::ModelShape
#include <kvpack/result.hpp>

namespace kvpack::llama {

/// Uncompressed float32 KV cache with exact causal GQA attention (two-pass softmax, Eigen GEMMs).
/// Layout per layer: K and V as [tokens][kv_heads][head_dim] row-major float32, keys post-RoPE.
/// 32 bits per value, no metadata. Interface and error behaviour follow kvpack::KVCache.
class ReferenceCache {
 public:
  static constexpr double key_bits_per_value = 32.0;
  static constexpr double value_bits_per_value = 32.0;

  /// Validates `shape` (positive sizes, q_heads % kv_heads == 0) and reserves max_tokens per layer.
  [[nodiscard]] static Result<ReferenceCache> create(const ModelShape& shape) {
    if (shape.layers <= 0 || shape.q_heads <= 0 || shape.kv_heads <= 0 || shape.head_dim <= 0 ||
        shape.max_tokens <= 0 || shape.q_heads % shape.kv_heads != 0)
      return fail(Errc::invalid_argument, "ReferenceCache: invalid model shape");
    ReferenceCache c;
    c.shape_ = shape;
    c.k_.resize(static_cast<size_t>(shape.layers));
    c.v_.resize(static_cast<size_t>(shape.layers));
    c.reserve();
    return c;
  }

  /// Appends n tokens to `layer`: k, v are [n][kv_heads][head_dim], positions is [n] (unused:
  /// keys arrive post-RoPE). Fails on a bad layer, mismatched sizes or a full cache.
  Status append(int layer, std::span<const float> k, std::span<const float> v,
                std::span<const int32_t> positions) {
    const size_t row = row_floats();
    if (layer < 0 || layer >= shape_.layers) return fail(Errc::invalid_argument, "append: bad layer");
    if (k.size() != v.size() || k.size() != positions.size() * row)
      return fail(Errc::invalid_argument, "append: k, v, positions sizes disagree");
    auto& K = k_[static_cast<size_t>(layer)];
    auto& V = v_[static_cast<size_t>(layer)];
    if (static_cast<int64_t>(K.size() / row + positions.size()) > shape_.max_tokens)
      return fail(Errc::capacity_exceeded, "append: more than max_tokens tokens");
    K.insert(K.end(), k.begin(), k.end());
    V.insert(V.end(), v.begin(), v.end());
    return {};
  }

  /// Causal attention of the last n_q appended tokens of `layer`: q and out are
  /// [n_q][q_heads][head_dim]; query i sees tokens 0 .. tokens(layer) - n_q + i.
  Status attend(int layer, std::span<const float> q, std::span<float> out) const {
    using Mat = Eigen::Matrix<float, Eigen::Dynamic, Eigen::Dynamic, Eigen::RowMajor>;
    using CMap = Eigen::Map<const Mat, 0, Eigen::OuterStride<>>;
    using OMap = Eigen::Map<Mat, 0, Eigen::OuterStride<>>;
    if (layer < 0 || layer >= shape_.layers) return fail(Errc::invalid_argument, "attend: bad layer");
    const int hd = shape_.head_dim, qh = shape_.q_heads, group = qh / shape_.kv_heads;
    const int64_t T = tokens(layer);
    const auto nq = static_cast<int64_t>(q.size() / static_cast<size_t>(qh * hd));
    if (q.size() != out.size() || q.size() != static_cast<size_t>(nq * qh * hd) || nq < 1 || nq > T)
      return fail(Errc::invalid_argument, "attend: q/out size must be n_q*q_heads*head_dim, n_q <= tokens");
    const float scale = shape_.attn_scale > 0.f ? shape_.attn_scale : 1.f / std::sqrt(float(hd));
    const float* K = k_[static_cast<size_t>(layer)].data();
    const float* V = v_[static_cast<size_t>(layer)].data();
    const auto kv_stride = static_cast<Eigen::Index>(row_floats());
#pragma omp parallel for schedule(static)
    for (int h = 0; h < qh; ++h) {
      const int g = h / group;
      CMap Kg(K + g * hd, T, hd, Eigen::OuterStride<>(kv_stride));
      CMap Vg(V + g * hd, T, hd, Eigen::OuterStride<>(kv_stride));
      CMap Qh(q.data() + h * hd, nq, hd, Eigen::OuterStride<>(qh * hd));
      Mat S = (Qh * Kg.transpose()) * scale;  // [n_q][T]
      for (int64_t i = 0; i < nq; ++i) {
        const int64_t last = T - nq + i;  // causal: keys 0..last
        S.row(i).tail(T - 1 - last).setConstant(-std::numeric_limits<float>::infinity());
        S.row(i) = (S.row(i).array() - S.row(i).maxCoeff()).exp();
        S.row(i) /= S.row(i).sum();
      }
      OMap(out.data() + h * hd, nq, hd, Eigen::OuterStride<>(qh * hd)).noalias() = S * Vg;
    }
    return {};
  }

  /// Empties every layer (memory released).
  void reset() {
    for (auto& x : k_) std::vector<float>().swap(x);
    for (auto& x : v_) std::vector<float>().swap(x);
    reserve();
  }
  /// Bytes of K and V held now, all layers.
  [[nodiscard]] size_t memory_bytes() const {
    size_t b = 0;
    for (size_t l = 0; l < k_.size(); ++l) b += (k_[l].size() + v_[l].size()) * sizeof(float);
    return b;
  }
  /// Tokens appended to `layer`.
  [[nodiscard]] int64_t tokens(int layer) const {
    return static_cast<int64_t>(k_[static_cast<size_t>(layer)].size() / row_floats());
  }

 private:
  [[nodiscard]] size_t row_floats() const { return static_cast<size_t>(shape_.kv_heads * shape_.head_dim); }
  void reserve() {
    for (auto& x : k_) x.reserve(static_cast<size_t>(shape_.max_tokens) * row_floats());
    for (auto& x : v_) x.reserve(static_cast<size_t>(shape_.max_tokens) * row_floats());
  }
  ModelShape shape_;
  std::vector<std::vector<float>> k_, v_;
};

/// Destructive adapter for tests: forwards to `Cache` but stores every V as zero, so attention
/// outputs are zero. If perplexity does not collapse with it, the cache is not in the scored path.
template <class Cache>
class ZeroValues {
 public:
  static constexpr double key_bits_per_value = Cache::key_bits_per_value;
  static constexpr double value_bits_per_value = Cache::value_bits_per_value;
  [[nodiscard]] static Result<ZeroValues> create(const ModelShape& shape) {
    auto c = Cache::create(shape);
    if (!c) return c.error();
    return ZeroValues(std::move(c).value());
  }
  Status append(int layer, std::span<const float> k, std::span<const float> v,
                std::span<const int32_t> positions) {
    zeros_.assign(v.size(), 0.f);
    return inner_.append(layer, k, zeros_, positions);
  }
  Status attend(int layer, std::span<const float> q, std::span<float> out) { return inner_.attend(layer, q, out); }
  void reset() { inner_.reset(); }
  [[nodiscard]] size_t memory_bytes() const { return inner_.memory_bytes(); }
  [[nodiscard]] int64_t tokens(int layer) const { return inner_.tokens(layer); }

 private:
  explicit ZeroValues(Cache c) : inner_(std::move(c)) {}
  Cache inner_;
  std::vector<float> zeros_;
};

}  // namespace kvpack::llama
