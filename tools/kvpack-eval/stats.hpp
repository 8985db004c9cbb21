// kvpack-eval: what is measured for each policy (quality, bytes, speed, needle, offload).
#pragma once

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <string>
#include <vector>

#include "options.hpp"

namespace kvpack_eval {

/// One needle case's outcome for one policy.
struct NeedleResult {
  int64_t length = 0;
  int depth = 0;
  double logp = 0;  // sum of log-probabilities of the answer tokens, nats
  bool exact = false;
};

/// Everything measured for one policy.
struct PolicyStats {
  std::string name;
  double key_bits = 0, value_bits = 0;  // declared, incl. metadata
  double nll = 0;
  int64_t scored = 0, agree = 0;
  std::vector<float> kl;
  double prefill_s = 0, decode_s = 0;
  int64_t prefill_tokens = 0, decode_tokens = 0;
  size_t kv_bytes = 0;      // memory_bytes() after the first window
  int64_t kv_values = 0;    // K and V values held then
  int64_t kv_tokens = 0;
  std::string protocol;            // eviction protocol (protocol_name)
  double tokens_after_prompt = 0;  // tokens held per (layer, KV head), mean, after the context's end (first window)
  double tokens_at_end = 0;        // the same at the end of scoring (first window)
  std::vector<NeedleResult> needle;
  kl::OffloadReport offload;  // Offload<> policies only
  bool tracks_saturation = false;  // Calibrated<> policies:
  int64_t saturated = 0;           //   stored values beyond the FP8 range, all windows

  [[nodiscard]] double ppl() const { return std::exp(nll / double(std::max<int64_t>(scored, 1))); }
  [[nodiscard]] double bits_per_value() const { return kv_values ? 8.0 * double(kv_bytes) / double(kv_values) : 0; }
  [[nodiscard]] double kl_mean() const {
    double s = 0;
    for (float x : kl) s += x;
    return kl.empty() ? 0 : s / double(kl.size());
  }
  [[nodiscard]] double kl_p99() const {
    if (kl.empty()) return 0;
    std::vector<float> v = kl;
    const auto k = static_cast<size_t>(std::ceil(0.99 * double(v.size()))) - 1;
    std::nth_element(v.begin(), v.begin() + static_cast<std::ptrdiff_t>(k), v.end());
    return v[k];
  }
};

/// State shared across policies for the window being scored: the fp32-cache log-probabilities.
struct Baseline {
  RowMat logprobs;              // [scored rows][vocab]
  std::vector<int32_t> argmax;  // [scored rows]
};

}  // namespace kvpack_eval
