// kvpack::plan::QualityMonitor: watches two cheap per-step signals of a compressed-cache run,
// the entropy of the next-token distribution and the attention-output norm, and switches a
// fallback on when either spikes above a threshold calibrated on a reference run (the profile's
// fp32 run), off again after `calm_steps` quiet steps. Every switch is logged with its trigger.
#pragma once

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <limits>
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

/// Running baseline of the attention-output norm, for a spike test that follows the norm's slow
/// drift with position (a fixed calibrated threshold measures context length more than damage).
/// Exponential moving mean and variance with weight `alpha` per step (alpha = 1/32: a memory of
/// about 32 tokens); a step spikes when norm > mean + k * max(std, min_rel_std * mean) of the
/// baseline *before* that step. Spiking steps do not update the baseline (a real spike is not
/// absorbed); the first `warmup` steps only seed it and never spike.
struct NormBaseline {
  double alpha = 1.0 / 32;    ///< EMA weight of a new step, in (0, 1]
  double k = 4.0;             ///< spike at mean + k * std
  double min_rel_std = 0.01;  ///< std floor relative to the mean (a flat signal still has a finite threshold)
  int warmup = 16;            ///< steps that only seed the baseline
};

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
  /// As above, but the attention-norm test uses a running baseline (`b`) instead of the fixed
  /// thresholds.attn_norm; the entropy test keeps thresholds.entropy.
  QualityMonitor(MonitorThresholds t, NormBaseline b, int calm_steps = 16)
      : t_(t), calm_(std::max(1, calm_steps)), base_(b) {
    base_->alpha = std::clamp(base_->alpha, 1e-6, 1.0);
  }

  /// The attention-norm threshold the next step is tested against (the fixed one, or the running
  /// baseline's mean + k * std; +infinity while the baseline warms up).
  [[nodiscard]] double norm_threshold() const noexcept {
    if (!base_) return t_.attn_norm;
    if (seen_ < base_->warmup || seen_ == 0) return std::numeric_limits<double>::infinity();
    return mean_ + base_->k * std::max(std::sqrt(std::max(var_, 0.0)), base_->min_rel_std * std::abs(mean_));
  }

  /// Observes one step; returns the switch it caused, if any (also appended to log()).
  std::optional<SwitchEvent> observe(double entropy, double attn_norm) {
    const std::int64_t step = step_++;
    const double n_thr = norm_threshold();
    const bool e_spike = entropy > t_.entropy, n_spike = attn_norm > n_thr;
    if (base_ && !n_spike && std::isfinite(attn_norm)) {  // update the running baseline
      if (seen_ == 0) {
        mean_ = attn_norm;
        var_ = 0;
      } else {
        const double a = seen_ < base_->warmup ? 1.0 / double(seen_ + 1) : base_->alpha, d = attn_norm - mean_;
        mean_ += a * d;
        var_ = (1 - a) * (var_ + a * d * d);
      }
      ++seen_;
    }
    if (!on_) {
      if (!e_spike && !n_spike) return std::nullopt;
      on_ = true;
      quiet_ = 0;
      ++fallbacks_;
      SwitchEvent ev{step, e_spike ? Trigger::entropy_spike : Trigger::attn_norm_spike, e_spike ? entropy : attn_norm,
                     e_spike ? t_.entropy : n_thr, true};
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
  std::optional<NormBaseline> base_;
  double mean_ = 0, var_ = 0;  // running baseline of the attention norm
  int seen_ = 0;               // steps that updated it
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
