// Builds the segments of one KV head (fp32 sinks, quantized blocks with optional slot masks,
// pending rows, the current chunk) straight from random data, for kernel-level tests that call
// attend_* without a KVCache, and the float64 attention over exactly what the kernel must read.
#pragma once

#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstddef>
#include <cstdint>
#include <random>
#include <vector>

#include "kvpack/cache/block.hpp"
#include "kvpack/codec/rows.hpp"
#include "kvpack/kernels/scalar/attention.hpp"
#include "support/reference.hpp"

namespace kvtest {

/// One attention configuration under test: key codec, value codec, key axis, tokens per block.
template <class K, class V, bool PerChannel, int BlockTokens>
struct KernelConfig {
  using KC = K;
  using VC = V;
  static constexpr bool per_channel = PerChannel;
  static constexpr int block = BlockTokens;
  /// The configuration can store head_dim D (per-token groups must divide D).
  static bool fits(int D) {
    if (!PerChannel && KC::grouped && D % KC::group_size != 0) return false;
    if (VC::grouped && D % VC::group_size != 0) return false;
    if (PerChannel && BlockTokens % KC::group_size != 0) return false;
    return D % 2 == 0;
  }
};

/// How many tokens each segment holds.
struct SegmentSizes {
  int sinks = 0;
  int blocks = 0;  ///< tokens in quantized blocks (per-channel keys: rounded down to whole groups)
  int pending = 0;
  int chunk = 0;
};

/// One KV head's data: what the kernel reads (segments, blocks) and what the reference reads
/// (the dequantized keys in ordinal order, with their visibility rule).
template <class Cfg>
class HeadData {
 public:
  using KC = typename Cfg::KC;
  using VC = typename Cfg::VC;

  /// masks: every block carries a slot-validity mask (about 70 % of slots set, one 16-slot tile
  /// of block 1 and the whole of block 2 masked out, when they exist).
  /// outlier: key channel 7 is scaled by it, the last channel by its square root.
  HeadData(int D, SegmentSizes n, bool masks, std::uint32_t seed, float outlier = 4.f)
      : D_(D), outlier_(outlier), rng_(seed) {
    L_ = kvpack::make_block_layout<KC, VC, Cfg::per_channel>(Cfg::block, D);
    if (Cfg::per_channel) {
      const int rem = n.blocks % KC::group_size;
      n.blocks -= rem;
      n.pending += rem;
    }
    sizes_ = n;
    std::int64_t index = 0;
    rows(n.sinks, sink_k_, sink_v_, index, 0);
    seg_.sinks = {sink_k_.data(), sink_v_.data(), D, 0, n.sinks};
    const int nb = (n.blocks + Cfg::block - 1) / Cfg::block;
    blocks_.resize(static_cast<std::size_t>(nb));
    masks_.resize(static_cast<std::size_t>(nb));
    const std::int64_t blocks_ord = n.sinks;
    for (int i = 0; i < nb; ++i) {
      const int count = std::min(Cfg::block, n.blocks - i * Cfg::block);
      auto& data = blocks_[static_cast<std::size_t>(i)];
      data.assign(L_.bytes, std::byte{0});
      std::vector<float> k = random_keys(count), v = normal_rows(count);
      encode_block(data.data(), k, v, count);
      auto& mask = masks_[static_cast<std::size_t>(i)];
      mask.assign(static_cast<std::size_t>((Cfg::block + 63) / 64), 0);
      std::bernoulli_distribution keep(0.7);
      for (int t = 0; t < count; ++t) {
        bool on = !masks || keep(rng_);
        if (masks && i == 1 && t >= 16 && t < 32) on = false;
        if (masks && i == 2) on = false;
        if (on) mask[static_cast<std::size_t>(t / 64)] |= std::uint64_t{1} << (t % 64);
      }
      // The reference reads the scalar decode of the stored bytes.
      std::vector<float> kd(static_cast<std::size_t>(D)), vd(static_cast<std::size_t>(D));
      for (int t = 0; t < count; ++t) {
        if (!((mask[static_cast<std::size_t>(t / 64)] >> (t % 64)) & 1u)) continue;
        decode_slot(data.data(), t, kd.data(), vd.data());
        keys_.push_back({std::vector<double>(kd.begin(), kd.end()), std::vector<double>(vd.begin(), vd.end()),
                         blocks_ord + static_cast<std::int64_t>(i) * Cfg::block + t, index + t, masks});
      }
      refs_.push_back({data.data(), index, count, masks ? mask.data() : nullptr});
      index += count;
    }
    seg_.blocks = refs_;
    const std::int64_t pending_ord = blocks_ord + static_cast<std::int64_t>(nb) * Cfg::block;
    const std::int64_t pending_first = index;
    rows(n.pending, pend_k_, pend_v_, index, pending_ord);
    seg_.pending = {pend_k_.data(), pend_v_.data(), D, pending_first, n.pending};
    const std::int64_t chunk_first = index;
    rows(n.chunk, chunk_k_, chunk_v_, index, pending_ord + n.pending);
    seg_.chunk = {chunk_k_.data(), chunk_v_.data(), D, chunk_first, n.chunk};
    tokens_ = index;
    n_ordinals_ = pending_ord + n.pending + n.chunk;
  }

  HeadData(const HeadData&) = delete;
  HeadData& operator=(const HeadData&) = delete;

  [[nodiscard]] const kvpack::kernels::HeadSegments& segments() const { return seg_; }
  [[nodiscard]] const kvpack::BlockLayout& layout() const { return L_; }
  [[nodiscard]] std::int64_t tokens() const { return tokens_; }
  [[nodiscard]] std::int64_t ordinals() const { return n_ordinals_; }
  [[nodiscard]] const SegmentSizes& sizes() const { return sizes_; }

  /// Float64 attention of n_q queries (q: [n_q][group][D], cache indices q_first + i) over
  /// exactly the keys the kernel must read; adds each key's probability, summed over queries and
  /// group heads, to key_mass[ordinal] when key_mass is non-null.
  std::vector<double> reference(const std::vector<float>& q, int n_q, int group, std::int64_t q_first, double scale,
                                std::vector<double>* key_mass) const {
    const auto Dz = static_cast<std::size_t>(D_);
    std::vector<double> out(static_cast<std::size_t>(n_q * group) * Dz, 0.0);
    std::vector<double> s(keys_.size());
    for (int i = 0; i < n_q; ++i)
      for (int j = 0; j < group; ++j) {
        const float* qv = q.data() + static_cast<std::size_t>(i * group + j) * Dz;
        double mx = -INFINITY;
        for (std::size_t t = 0; t < keys_.size(); ++t) {
          const Key& k = keys_[t];
          if (!k.masked && k.index > q_first + i) {
            s[t] = -INFINITY;
            continue;
          }
          double dot = 0;
          for (std::size_t d = 0; d < Dz; ++d) dot += static_cast<double>(qv[d]) * k.k[d];
          s[t] = dot * scale;
          mx = std::max(mx, s[t]);
        }
        if (mx == -INFINITY) continue;
        double l = 0;
        for (double& x : s) x = x == -INFINITY ? 0.0 : std::exp(x - mx), l += x;
        double* o = out.data() + static_cast<std::size_t>(i * group + j) * Dz;
        for (std::size_t t = 0; t < keys_.size(); ++t) {
          if (s[t] == 0.0) continue;
          for (std::size_t d = 0; d < Dz; ++d) o[d] += s[t] / l * keys_[t].v[d];
          if (key_mass) (*key_mass)[static_cast<std::size_t>(keys_[t].ordinal)] += s[t] / l;
        }
      }
    return out;
  }

  /// Largest logit error a quantized query (two int8 terms) in groups of G channels allows over all keys and query
  /// rows: scale * Σ_g max_{d in g}|q_d| * query_int_error * Σ_{d in g} |k_d| (kernels::query_int8_group).
  double query_logit_error(const std::vector<float>& q, int rows, double scale, int G) const {
    double e = 0;
    for (int r = 0; r < rows; ++r) {
      const float* qv = q.data() + static_cast<std::size_t>(r) * static_cast<std::size_t>(D_);
      for (const Key& k : keys_) {
        double et = 0;
        for (int g = 0; g < D_ / G; ++g) {
          double qmax = 0, ksum = 0;
          for (int d = g * G; d < (g + 1) * G; ++d) {
            qmax = std::max(qmax, std::abs(static_cast<double>(qv[d])));
            ksum += std::abs(k.k[static_cast<std::size_t>(d)]);
          }
          et += qmax * kvpack::kernels::query_int_error * ksum;
        }
        e = std::max(e, et * scale);
      }
    }
    return e;
  }
  /// Largest integer-P·V error bound (kvtest::int4_value_error_bound) over the n_q * group output
  /// rows, for INT4 values in groups of G (asymmetric or not), all keys counted as INT4-stored.
  double int4_value_bound(const std::vector<float>& q, int n_q, int group, std::int64_t q_first, double scale, int G,
                          bool asymmetric) const {
    const auto Dz = static_cast<std::size_t>(D_);
    std::vector<double> sc;
    for (const Key& k : keys_) {
      double m = 0;
      for (int g = 0; g < D_ / G; ++g) m = std::max(m, int4_group_scale(k.v.data() + g * G, G, asymmetric));
      sc.push_back(m);
    }
    double worst = 0;
    for (int i = 0; i < n_q; ++i)
      for (int j = 0; j < group; ++j) {
        const float* qv = q.data() + static_cast<std::size_t>(i * group + j) * Dz;
        std::vector<double> lg(keys_.size(), -INFINITY);
        double mx = -INFINITY, l = 0;
        for (std::size_t t = 0; t < keys_.size(); ++t) {
          if (!keys_[t].masked && keys_[t].index > q_first + i) continue;
          double dot = 0;
          for (std::size_t d = 0; d < Dz; ++d) dot += static_cast<double>(qv[d]) * keys_[t].k[d];
          lg[t] = dot * scale;
          mx = std::max(mx, lg[t]);
        }
        if (mx == -INFINITY) continue;
        for (double x : lg) l += std::exp(x - mx);
        std::vector<double> p;
        for (double x : lg) p.push_back(std::exp(x - mx) / l);
        worst = std::max(worst, int4_value_error_bound(p, sc));
      }
    return worst;
  }

  /// Largest |v_td - ref_rd| over keys, channels and output rows: with logits off by at most e,
  /// an output channel moves by at most (e^{2e} - 1) times this.
  double value_spread(const std::vector<double>& ref) const {
    double m = 0;
    for (std::size_t r = 0; r < ref.size(); r += static_cast<std::size_t>(D_))
      for (const Key& k : keys_)
        for (std::size_t d = 0; d < static_cast<std::size_t>(D_); ++d) m = std::max(m, std::abs(k.v[d] - ref[r + d]));
    return m;
  }

 private:
  struct Key {
    std::vector<double> k, v;
    std::int64_t ordinal;
    std::int64_t index;
    bool masked;  ///< a block slot under a validity mask: visible to every query
  };

  std::vector<float> normal_rows(int n) {
    std::normal_distribution<float> nd(0.f, 1.f);
    std::vector<float> x(static_cast<std::size_t>(n) * static_cast<std::size_t>(D_));
    for (float& v : x) v = nd(rng_);
    return x;
  }
  /// Keys with a few outlier channels, as real keys have.
  std::vector<float> random_keys(int n) {
    std::vector<float> x = normal_rows(n);
    for (int t = 0; t < n; ++t) {
      float* r = x.data() + static_cast<std::size_t>(t) * static_cast<std::size_t>(D_);
      if (D_ > 7) r[7] *= outlier_;
      r[D_ - 1] *= std::sqrt(outlier_);
    }
    return x;
  }
  void rows(int n, std::vector<float>& k, std::vector<float>& v, std::int64_t& index, std::int64_t ordinal) {
    k = random_keys(n);
    v = normal_rows(n);
    for (int t = 0; t < n; ++t) {
      const auto off = static_cast<std::size_t>(t) * static_cast<std::size_t>(D_);
      keys_.push_back({std::vector<double>(k.begin() + static_cast<std::ptrdiff_t>(off),
                                           k.begin() + static_cast<std::ptrdiff_t>(off) + D_),
                       std::vector<double>(v.begin() + static_cast<std::ptrdiff_t>(off),
                                           v.begin() + static_cast<std::ptrdiff_t>(off) + D_),
                       ordinal + t, index + t, false});
    }
    index += n;
  }
  void encode_block(std::byte* data, const std::vector<float>& k, const std::vector<float>& v, int count) {
    const auto Dz = static_cast<std::size_t>(D_);
    for (int t = 0; t < count; ++t) {
      const auto tt = static_cast<std::size_t>(t);
      if constexpr (!Cfg::per_channel)
        kvpack::encode_row<KC>(k.data() + tt * Dz, D_, data + L_.k_codes + tt * L_.k_row,
                               data + L_.k_meta + tt * L_.k_meta_token);
      kvpack::encode_row<VC>(v.data() + tt * Dz, D_, data + L_.v_codes + tt * L_.v_row,
                             data + L_.v_meta + tt * L_.v_meta_token);
    }
    if constexpr (Cfg::per_channel) {
      constexpr int G = KC::group_size;
      for (int g = 0; g < count / G; ++g)
        kvpack::encode_channels<KC>(k.data() + static_cast<std::size_t>(g * G) * Dz, D_, D_,
                                    data + L_.k_codes + static_cast<std::size_t>(g * G) * L_.k_row, L_.k_row,
                                    data + L_.k_meta + static_cast<std::size_t>(g) * L_.k_meta_group);
    }
  }
  void decode_slot(const std::byte* data, int t, float* k, float* v) const {
    const auto tt = static_cast<std::size_t>(t);
    if constexpr (Cfg::per_channel) {
      kvpack::decode_row_channels<KC>(data + L_.k_codes + tt * L_.k_row,
                                      data + L_.k_meta + (tt / KC::group_size) * L_.k_meta_group, D_, k);
    } else {
      kvpack::decode_row<KC>(data + L_.k_codes + tt * L_.k_row, data + L_.k_meta + tt * L_.k_meta_token, D_, k);
    }
    kvpack::decode_row<VC>(data + L_.v_codes + tt * L_.v_row, data + L_.v_meta + tt * L_.v_meta_token, D_, v);
  }

  int D_;
  float outlier_;
  std::mt19937 rng_;
  kvpack::BlockLayout L_;
  SegmentSizes sizes_;
  std::vector<float> sink_k_, sink_v_, pend_k_, pend_v_, chunk_k_, chunk_v_;
  std::vector<std::vector<std::byte>> blocks_;
  std::vector<std::vector<std::uint64_t>> masks_;
  std::vector<kvpack::kernels::BlockRef> refs_;
  kvpack::kernels::HeadSegments seg_;
  std::vector<Key> keys_;
  std::int64_t tokens_ = 0;
  std::int64_t n_ordinals_ = 0;
};

}  // namespace kvtest
