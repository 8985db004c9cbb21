// QualityMonitor: entropy against float64, threshold calibration, the fallback state machine
// and its switch log.
#include <algorithm>
#include <cmath>
#include <random>
#include <vector>

#include <gtest/gtest.h>

#include <kvpack/plan/monitor.hpp>

namespace {

using namespace kvpack::plan;  // NOLINT: test file

TEST(Monitor, EntropyMatchesFloat64) {
  std::vector<float> u(33, 1.5f);
  EXPECT_NEAR(entropy_of_logits(u), std::log(33.0), 1e-12);
  std::vector<float> peak(31, -1000.f);
  peak[7] = 0.f;
  EXPECT_NEAR(entropy_of_logits(peak), 0.0, 1e-12);
  std::mt19937 rng(1);
  std::normal_distribution<float> nd(0.f, 3.f);
  for (int n : {1, 2, 95, 49152}) {
    std::vector<float> x(static_cast<size_t>(n));
    for (auto& v : x) v = nd(rng);
    double z = 0;
    for (float v : x) z += std::exp(double(v));
    double h = 0;
    for (float v : x) {
      const double p = std::exp(double(v)) / z;
      h -= p * std::log(p);
    }
    EXPECT_NEAR(entropy_of_logits(x), h, 1e-9 * std::max(1.0, h)) << n;
  }
  EXPECT_EQ(entropy_of_logits({}), 0.0);
}

TEST(Monitor, Calibration) {
  const std::vector<double> e{1, 2, 3, 4}, n{10, 10, 10, 14};
  auto t = calibrate(e, n, 2.0);
  ASSERT_TRUE(t);
  EXPECT_DOUBLE_EQ(t->entropy, 2.5 + 2.0 * std::sqrt(1.25));
  EXPECT_DOUBLE_EQ(t->attn_norm, 11.0 + 2.0 * std::sqrt(3.0));
  EXPECT_FALSE(calibrate(std::vector<double>{1}, n));
  EXPECT_FALSE(calibrate(e, n, -1));
  EXPECT_EQ(calibrate(std::vector<double>{1, NAN}, n).error().code, kvpack::Errc::non_finite);
}

TEST(Monitor, SwitchesOnSpikesAndRecoversAfterCalmSteps) {
  QualityMonitor m({2.0, 10.0}, 3);
  // step: 0..4 quiet, 5 entropy spike, 6 quiet, 7 norm spike (resets calm), 8,9,10 quiet -> off at 10,
  // 11 norm spike -> on (attn_norm trigger), 12 both spike (no new event).
  const std::vector<std::pair<double, double>> sig{{1, 5}, {1, 5}, {1.5, 9}, {2.0, 10}, {1, 5}, {2.5, 5}, {1, 5},
                                                   {1, 11}, {1, 5}, {1, 5}, {1, 5}, {1, 12}, {3, 12}};
  std::vector<int> switched;
  for (size_t i = 0; i < sig.size(); ++i)
    if (m.observe(sig[i].first, sig[i].second)) switched.push_back(int(i));
  EXPECT_EQ(switched, (std::vector<int>{5, 10, 11}));
  ASSERT_EQ(m.log().size(), 3u);
  EXPECT_EQ(m.log()[0].trigger, Trigger::entropy_spike);
  EXPECT_EQ(m.log()[0].value, 2.5);
  EXPECT_EQ(m.log()[0].threshold, 2.0);
  EXPECT_TRUE(m.log()[0].fallback);
  EXPECT_EQ(m.log()[1].trigger, Trigger::recovered);
  EXPECT_FALSE(m.log()[1].fallback);
  EXPECT_EQ(m.log()[2].trigger, Trigger::attn_norm_spike);
  EXPECT_EQ(m.log()[2].value, 11 + 1);
  EXPECT_TRUE(m.in_fallback());
  EXPECT_EQ(m.fallbacks(), 2);
  EXPECT_STREQ(trigger_name(Trigger::attn_norm_spike), "attn_norm_spike");
}

// The attention-output norm grows slowly with position. A threshold calibrated once on the first
// tokens fires permanently once the drift passes it; a running baseline follows the drift, still
// catches a real spike, and recovers after it.
TEST(Monitor, RunningNormBaselineFollowsDriftAndCatchesSpikes) {
  const int n = 2001, spike_at = 1500, spike_len = 5;
  std::vector<double> norm(n);
  for (int i = 0; i < n; ++i) {
    norm[size_t(i)] = 5.0 + 5.0 * i / (n - 1) + 0.05 * std::sin(0.7 * i);  // drift 5 -> 10, small ripple
    if (i >= spike_at && i < spike_at + spike_len) norm[size_t(i)] *= 1.5;
  }
  // Fixed: mean + 4 std of the first 128 steps.
  std::vector<double> e(128, 1.0), cal(norm.begin(), norm.begin() + 128);
  auto thr = calibrate(e, cal, 4.0);
  ASSERT_TRUE(thr.has_value());
  QualityMonitor fixed(*thr, 16);
  QualityMonitor running(*thr, NormBaseline{1.0 / 32, 4.0, 0.01, 16}, 16);
  // float64 reference of the running baseline (same recurrence, written out here).
  double mean = 0, var = 0;
  int seen = 0;
  for (int i = 0; i < n; ++i) {
    if (i == 1000) {  // mid-drift: the monitor's threshold equals the reference
      const double ref = mean + 4.0 * std::max(std::sqrt(var), 0.01 * mean);
      EXPECT_NEAR(running.norm_threshold(), ref, 1e-12 * ref);
      EXPECT_LT(running.norm_threshold(), norm[size_t(i)] * 1.05);  // follows the drift
      EXPECT_GT(running.norm_threshold(), norm[size_t(i)]);
    }
    const double thr_now = running.norm_threshold();
    (void)fixed.observe(1.0, norm[size_t(i)]);
    (void)running.observe(1.0, norm[size_t(i)]);
    if (norm[size_t(i)] <= thr_now) {
      const double a = seen == 0 ? 1.0 : (seen < 16 ? 1.0 / (seen + 1) : 1.0 / 32), d = norm[size_t(i)] - mean;
      if (seen == 0) {
        mean = norm[size_t(i)];
      } else {
        mean += a * d;
        var = (1 - a) * (var + a * d * d);
      }
      ++seen;
    }
  }
  // Fixed threshold: switched on during the drift and never back.
  ASSERT_EQ(fixed.log().size(), 1u);
  EXPECT_LT(fixed.log()[0].step, spike_at);
  EXPECT_TRUE(fixed.in_fallback());
  // Running baseline: exactly the spike, then recovered after 16 calm steps.
  ASSERT_EQ(running.log().size(), 2u);
  EXPECT_EQ(running.log()[0].step, spike_at);
  EXPECT_EQ(running.log()[0].trigger, Trigger::attn_norm_spike);
  EXPECT_DOUBLE_EQ(running.log()[0].value, norm[spike_at]);
  EXPECT_LT(running.log()[0].threshold, running.log()[0].value);
  EXPECT_EQ(running.log()[1].trigger, Trigger::recovered);
  EXPECT_EQ(running.log()[1].step, spike_at + spike_len + 15);
  EXPECT_FALSE(running.in_fallback());
}

TEST(Monitor, RunningBaselineWarmupNeverSpikes) {
  QualityMonitor m({100.0, 0.0}, NormBaseline{0.5, 1.0, 0.0, 4}, 2);
  EXPECT_TRUE(std::isinf(m.norm_threshold()));
  for (double x : {1.0, 50.0, 1.0, 1.0}) EXPECT_FALSE(m.observe(0.0, x).has_value());  // warm-up
  EXPECT_FALSE(std::isinf(m.norm_threshold()));
  EXPECT_TRUE(m.observe(0.0, 1000.0).has_value());
}

TEST(Monitor, RaisedPlan) {
  // candidates: 0 fp32, 1 fp16, 2 int8, 3 int4 -> one step up each.
  const std::vector<int> raise{0, 0, 1, 2};
  EXPECT_EQ(raised_plan(std::vector<int>{3, 2, 0, 1}, raise), (std::vector<int>{2, 1, 0, 0}));
}

}  // namespace
