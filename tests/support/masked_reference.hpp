// Float64 reference of one decode query with an additive attention mask (PagedCache::attend_batch
// with a BatchMask), over the K/V a pool sequence holds as attention reads them (read_back), with
// the error bound a backend's integer Q·K / P·V paths are allowed (kernels/dispatch.hpp), as
// support/cache_harness.hpp derives it for the unmasked cache.
#pragma once

#include <algorithm>
#include <cmath>
#include <cstddef>
#include <cstdint>
#include <vector>

#include "kvpack/kernels/dispatch.hpp"
#include "support/reference.hpp"

namespace kvtest {

/// What a backend may do differently from fp32 scores and values: query_group > 0 scores keys
/// read from quantized pages with a quantized query (kernels::query_int_error) of that group size; value_group > 0 accumulates
/// values read from INT4 pages from their codes (groups of value_group channels, asymmetric or not).
struct IntPaths {
  int query_group = 0;
  int value_group = 0;
  bool value_asymmetric = false;
};

/// The integer paths Backend<Tag> runs for the codecs of codec hook Hook (kernels/dispatch.hpp).
template <class Tag, class Hook>
IntPaths int_paths() {
  IntPaths p;
  p.query_group = kvpack::kernels::query_int8_group<Tag, typename Hook::key_codec, Hook::keys_per_channel>;
  if constexpr (kvpack::kernels::value_int_accumulate<Tag, typename Hook::value_codec>)
    p.value_group = Hook::value_codec::group_size, p.value_asymmetric = Hook::value_codec::asymmetric;
  return p;
}

/// Reference output [q_heads][D] of one decode query and, per query head, the output error the
/// backend's integer paths allow (0 when it has none).
struct MaskedRef {
  std::vector<double> out;
  std::vector<double> bound;
};

/// Decode attention in float64 of query q [q_heads][D] over the n keys of each KV head:
/// K[h], V[h] [n][D] (cache-index order, as PagedCache::read_back), logits
/// q.k_t * scale + bias[t] (bias [n]; -inf drops the key; nullptr: no bias). Keys t < quantized
/// were read from pages (the integer-path bounds apply to them only through `paths`).
inline MaskedRef masked_decode_ref64(const std::vector<std::vector<float>>& K, const std::vector<std::vector<float>>& V,
                                     const float* q, const float* bias, int q_heads, int D, double scale,
                                     std::int64_t quantized, IntPaths paths) {
  const int H = static_cast<int>(K.size()), group = q_heads / H;
  const auto n = static_cast<std::int64_t>(K[0].size() / static_cast<std::size_t>(D));
  MaskedRef r{std::vector<double>(static_cast<std::size_t>(q_heads) * D, 0.0), std::vector<double>(static_cast<std::size_t>(q_heads), 0.0)};
  std::vector<double> logit(static_cast<std::size_t>(n));
  for (int qh = 0; qh < q_heads; ++qh) {
    const auto& k = K[static_cast<std::size_t>(qh / group)];
    const auto& v = V[static_cast<std::size_t>(qh / group)];
    const float* qr = q + static_cast<std::ptrdiff_t>(qh) * D;
    double mx = -INFINITY;
    for (std::int64_t t = 0; t < n; ++t) {
      double dot = 0;
      for (int d = 0; d < D; ++d) dot += static_cast<double>(qr[d]) * k[static_cast<std::size_t>(t * D + d)];
      logit[static_cast<std::size_t>(t)] = dot * scale + (bias ? static_cast<double>(bias[t]) : 0.0);
      mx = std::max(mx, logit[static_cast<std::size_t>(t)]);
    }
    double l = 0;
    double* o = r.out.data() + static_cast<std::ptrdiff_t>(qh) * D;
    std::vector<double> p(static_cast<std::size_t>(n));
    for (std::int64_t t = 0; t < n; ++t) {
      p[static_cast<std::size_t>(t)] = std::exp(logit[static_cast<std::size_t>(t)] - mx);
      l += p[static_cast<std::size_t>(t)];
      for (int d = 0; d < D; ++d) o[d] += p[static_cast<std::size_t>(t)] * v[static_cast<std::size_t>(t * D + d)];
    }
    for (int d = 0; d < D; ++d) o[d] /= l;
    for (auto& x : p) x /= l;
    // quantized query (cache_harness.hpp query_error_bound): every logit of a key read from a page moves
    // by at most e; the output by (e^{2e} - 1) * the spread of the keys that count.
    double e = 0, spread = 0;
    for (std::int64_t t = 0; t < n; ++t) {
      if (bias && std::isinf(bias[t])) continue;  // a dropped key counts for nothing
      if (paths.query_group > 0 && t < quantized) {
        double et = 0;
        for (int g = 0; g < D / paths.query_group; ++g) {
          double qmax = 0, ksum = 0;
          for (int d = g * paths.query_group; d < (g + 1) * paths.query_group; ++d) {
            qmax = std::max(qmax, std::abs(static_cast<double>(qr[d])));
            ksum += std::abs(static_cast<double>(k[static_cast<std::size_t>(t * D + d)]));
          }
          et += qmax * kvpack::kernels::query_int_error * ksum;
        }
        e = std::max(e, et * scale);
      }
      for (int d = 0; d < D; ++d) spread = std::max(spread, std::abs(v[static_cast<std::size_t>(t * D + d)] - o[d]));
    }
    double bound = (std::exp(2 * e) - 1) * spread;
    if (paths.value_group > 0) {  // INT4 values from their codes: support/reference.hpp int4_value_error_bound
      std::vector<double> pq, sc;
      for (std::int64_t t = 0; t < std::min(n, quantized); ++t) {
        double smax = 0;
        for (int g = 0; g < D / paths.value_group; ++g) {
          std::vector<double> x(static_cast<std::size_t>(paths.value_group));
          for (int d = 0; d < paths.value_group; ++d) x[static_cast<std::size_t>(d)] = v[static_cast<std::size_t>(t * D + g * paths.value_group + d)];
          smax = std::max(smax, int4_group_scale(x.data(), paths.value_group, paths.value_asymmetric));
        }
        pq.push_back(p[static_cast<std::size_t>(t)]);
        sc.push_back(smax);
      }
      bound += int4_value_error_bound(pq, sc);
    }
    r.bound[static_cast<std::size_t>(qh)] = bound;
  }
  return r;
}

/// Largest relative error of `got` [q_heads][D] against ref after each output row may move toward
/// the reference by its bound (the documented integer-path tolerance), as Harness::attend_error.
/// A non-finite output is an infinite error.
inline double masked_error(const float* got, const MaskedRef& ref, int D) {
  std::vector<float> moved(ref.out.size());
  for (std::size_t i = 0; i < ref.out.size(); ++i) {
    if (!std::isfinite(got[i])) return INFINITY;
    const double diff = static_cast<double>(got[i]) - ref.out[i];
    const double b = ref.bound[i / static_cast<std::size_t>(D)];
    moved[i] = static_cast<float>(ref.out[i] + std::copysign(std::max(0.0, std::abs(diff) - b), diff));
  }
  return max_rel_error(moved, ref.out, D);
}

}  // namespace kvtest
