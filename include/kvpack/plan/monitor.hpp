// kvpack::plan::QualityMonitor: watches two cheap per-step signals of a compressed-cache run,
// the entropy of the next-token distribution and the attention-output norm, and switches a
// fallback on when either spikes above a threshold calibrated on a reference run (the profile's
// fp32 run), off again after `calm_steps` quiet steps. Every switch is logged with its trigger.
#pragma once

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <optional>
#include <span>
#include <string>
#include <vector>

#include "kvpack/result.hpp"

namespace kvpack::plan {

/// Entropy (nats) of softmax(logits); logits: [vocab] raw next-token logits. Max-subtracted,
/// accumulated in double. Empty input gives 0.
[[nodiscard]] inline double entropy_of_logits(std::span<const float> logits) {
  if (logits.empty()) return 0.0;
  const double mx = *std::max_element(logits.begin(), logits.end());
  double z = 0, s = 0;
  for (float x : logits) {
    const double e = std::exp(double(x) - mx);
    z += e;
    s += e * (double(x) - mx);
  }
  return std::log(z) - s / z;
}

/// Thresholds above which a signal counts as a spike.
struct MonitorThresholds {
  double entropy = 0;    ///< nats
  double attn_norm = 0;  ///< L2 norm of one token's attention output (all query heads), as measured
};

/// Calibrates thresholds on a reference run: mean + k * standard deviation of each signal
/// (population statistics). entropies, norms: one value per reference step.
/// Errors (Errc::invalid_argument): fewer than 2 samples of either signal, k < 0, non-finite input.
[[nodiscard]] inline Result<MonitorThresholds> calibrate(std::span<const double> entropies, std::span<const double> norms,
                                                         double k = 4.0) {
  if (entropies.size() < 2 || norms.size() < 2 || !(k >= 0))
    return fail(Errc::invalid_argument, "calibrate: need >= 2 samples of each signal and k >= 0");
  auto stat = [&](std::span<const double> x) -> std::optional<double> {
    double m = 0, q = 0;
    for (double v : x) {
      if (!std::isfinite(v)) return std::nullopt;
      m += v;
    }
    m /= double(x.size());
    for (double v : x) q += (v - m) * (v - m);
    return m + k * std::sqrt(q / double(x.size()));
  };
  auto e = stat(entropies), n = stat(norms);
  if (!e || !n) return fail(Errc::non_finite, "calibrate: non-finite sample");
  return MonitorThresholds{*e, *n};
}

/// What made the monitor switch.
enum class Trigger { entropy_spike, attn_norm_spike, recovered };

/// Readable name of a trigger: "entropy_spike", "attn_norm_spike", "recovered".
[[nodiscard]] inline const char* trigger_name(Trigger t) {
  switch (t) {
    case Trigger::entropy_spike: return "entropy_spike";
    case Trigger::attn_norm_spike: return "attn_norm_spike";
    case Trigger::recovered: return "recovered";
  }
  return "?";
}

/// One logged switch.
struct SwitchEvent {
  std::int64_t step = 0;   ///< observe() call index (0-based) that switched
  Trigger trigger{};       ///< why
  double value = 0;        ///< the signal's value then (for recovered: the entropy)
  double threshold = 0;    ///< its threshold
  bool fallback = false;   ///< state after the switch
};

/// Fallback state machine over per-step signals. Not thread-safe.
/// Off -> on when entropy > thresholds.entropy (checked first) or attn_norm > thresholds.attn_norm;
/// on -> off after `calm_steps` consecutive steps with both at or below their thresholds.
/// The caller acts on the switch (e.g. LayeredCache::replan to a higher-precision plan for new
/// tokens, and back).
class QualityMonitor {
 public:
  /// calm_steps >= 1 (smaller values are taken as 1).
  explicit QualityMonitor(MonitorThresholds t, int calm_steps = 16) : t_(t), calm_(std::max(1, calm_steps)) {}

  /// Observes one step; returns the switch it caused, if any (also appended to log()).
  std::optional<SwitchEvent> observe(double entropy, double attn_norm) {
    const std::int64_t step = step_++;
    const bool e_spike = entropy > t_.entropy, n_spike = attn_norm > t_.attn_norm;
    if (!on_) {
      if (!e_spike && !n_spike) return std::nullopt;
      on_ = true;
      quiet_ = 0;
      ++fallbacks_;
      SwitchEvent ev{step, e_spike ? Trigger::entropy_spike : Trigger::attn_norm_spike, e_spike ? entropy : attn_norm,
                     e_spike ? t_.entropy : t_.attn_norm, true};
      log_.push_back(ev);
      return ev;
    }
    if (e_spike || n_spike) {
      quiet_ = 0;
      return std::nullopt;
    }
    if (++quiet_ < calm_) return std::nullopt;
    on_ = false;
    SwitchEvent ev{step, Trigger::recovered, entropy, t_.entropy, false};
    log_.push_back(ev);
    return ev;
  }
  /// Observes one step from raw next-token logits ([vocab]) and the attention-output norm.
  std::optional<SwitchEvent> observe_logits(std::span<const float> logits, double attn_norm) {
    return observe(entropy_of_logits(logits), attn_norm);
  }

  [[nodiscard]] bool in_fallback() const noexcept { return on_; }
  [[nodiscard]] std::int64_t fallbacks() const noexcept { return fallbacks_; }
  [[nodiscard]] const std::vector<SwitchEvent>& log() const noexcept { return log_; }
  [[nodiscard]] const MonitorThresholds& thresholds() const noexcept { return t_; }

 private:
  MonitorThresholds t_;
  int calm_;
  bool on_ = false;
  int quiet_ = 0;
  std::int64_t step_ = 0, fallbacks_ = 0;
  std::vector<SwitchEvent> log_;
};

/// One plan step up in precision per layer for the fallback: maps each candidate index through
/// `raise` ([candidates] -> candidate index of higher precision, itself where none).
[[nodiscard]] inline std::vector<int> raised_plan(std::span<const int> plan, std::span<const int> raise) {
  std::vector<int> out(plan.begin(), plan.end());
  for (int& c : out)
    if (c >= 0 && static_cast<std::size_t>(c) < raise.size()) c = raise[static_cast<std::size_t>(c)];
  return out;
}

}  // namespace kvpack::plan
