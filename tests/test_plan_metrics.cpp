// Cache metrics: Prometheus text exposition format (0.0.4), compression ratio, sampled
// quantization error against a float64 computation, re-plan counters of a LayeredCache.
#include <cmath>
#include <cstdint>
#include <cstdlib>
#include <map>
#include <random>
#include <regex>
#include <set>
#include <sstream>
#include <string>
#include <vector>

#include <gtest/gtest.h>

#include <kvpack/kvpack.hpp>
#include <kvpack/plan/candidates.hpp>
#include <kvpack/plan/metrics.hpp>

namespace test_plan_metrics {  // own scope: compiled in one unity file with other tests
namespace {

using kvpack::plan::CacheMetrics;

struct Sample {
  std::string name, labels;
  double value;
};

/// Parses an exposition and checks its grammar: every sample's metric has # HELP then # TYPE
/// before it, names are valid, counters end in _total, each metric appears once.
std::vector<Sample> parse(const std::string& text, std::map<std::string, std::string>& types) {
  static const std::regex help(R"(^# HELP ([a-zA-Z_:][a-zA-Z0-9_:]*) (.+)$)");
  static const std::regex type(R"(^# TYPE ([a-zA-Z_:][a-zA-Z0-9_:]*) (counter|gauge|histogram|summary|untyped)$)");
  static const std::regex sample(
      R"(^([a-zA-Z_:][a-zA-Z0-9_:]*)(\{(?:[a-zA-Z_][a-zA-Z0-9_]*="(?:[^"\\\n]|\\[\\"n])*"(?:,[a-zA-Z_][a-zA-Z0-9_]*="(?:[^"\\\n]|\\[\\"n])*")*)?\})? (\S+)$)");
  EXPECT_FALSE(text.empty());
  EXPECT_EQ(text.back(), '\n');
  std::vector<Sample> out;
  std::set<std::string> helped, seen;
  std::istringstream in(text);
  std::string line;
  while (std::getline(in, line)) {
    std::smatch m;
    if (std::regex_match(line, m, help)) {
      EXPECT_TRUE(helped.insert(m[1]).second) << "duplicate HELP " << m[1];
    } else if (std::regex_match(line, m, type)) {
      EXPECT_TRUE(helped.count(m[1])) << "TYPE before HELP: " << line;
      EXPECT_TRUE(types.emplace(m[1], m[2]).second) << "duplicate TYPE " << m[1];
    } else if (std::regex_match(line, m, sample)) {
      const std::string name = m[1];
      EXPECT_TRUE(types.count(name)) << "sample without TYPE: " << line;
      EXPECT_TRUE(seen.insert(name).second) << "duplicate sample " << name;
      if (types[name] == "counter") {
        EXPECT_TRUE(name.size() > 6 && name.substr(name.size() - 6) == "_total") << name;
      }
      char* end = nullptr;
      const std::string v = m[3];
      EXPECT_FALSE(v.empty()) << line;
      const double x = std::strtod(v.c_str(), &end);
      EXPECT_EQ(*end, '\0') << "bad value in " << line;
      out.push_back({name, m[2], x});
    } else {
      ADD_FAILURE() << "line matches no exposition rule: '" << line << "'";
    }
  }
  return out;
}

TEST(Metrics, PrometheusExpositionFormat) {
  CacheMetrics m;
  m.kv_bytes = 1000;
  m.fp32_bytes = 6400;
  m.tokens = 33;
  m.quant_error_rel_rms = 0.0625;
  m.quant_error_samples = 7;
  m.replans = 2;
  m.migrations = 31;
  m.recompressed_tokens = 95;
  m.fallbacks = 1;
  m.evictions = 5;
  const std::string text =
      kvpack::plan::to_prometheus(m, "kvpack", {{"model", "smol\"lm\\2\nq4"}, {"seq", "17"}});
  std::map<std::string, std::string> types;
  const auto s = parse(text, types);
  std::map<std::string, double> v;
  for (const auto& x : s) {
    v[x.name] = x.value;
    EXPECT_EQ(x.labels, R"({model="smol\"lm\\2\nq4",seq="17"})");
  }
  EXPECT_EQ(v.at("kvpack_kv_bytes"), 1000);
  EXPECT_EQ(v.at("kvpack_kv_fp32_bytes"), 6400);
  EXPECT_EQ(v.at("kvpack_compression_ratio"), 6.4);
  EXPECT_EQ(v.at("kvpack_quant_error_rel_rms"), 0.0625);
  EXPECT_EQ(v.at("kvpack_replans_total"), 2);
  EXPECT_EQ(v.at("kvpack_migrations_total"), 31);
  EXPECT_EQ(v.at("kvpack_recompressed_tokens_total"), 95);
  EXPECT_EQ(v.at("kvpack_fallbacks_total"), 1);
  EXPECT_EQ(v.at("kvpack_evictions_total"), 5);
  EXPECT_EQ(v.at("kvpack_offload_enabled"), 0);
  EXPECT_EQ(v.at("kvpack_offload_fetches_total"), 0);
  EXPECT_EQ(types.at("kvpack_replans_total"), "counter");
  EXPECT_EQ(types.at("kvpack_kv_bytes"), "gauge");
  // No labels: bare samples; special values spelled as Prometheus expects.
  CacheMetrics z;
  z.quant_error_rel_rms = std::nan("");
  const std::string t2 = kvpack::plan::to_prometheus(z, "x");
  std::map<std::string, std::string> ty2;
  const auto s2 = parse(t2, ty2);
  EXPECT_EQ(s2.size(), s.size());
  EXPECT_NE(t2.find("\nx_quant_error_rel_rms NaN\n"), std::string::npos);
  EXPECT_NE(t2.find("\nx_compression_ratio 0\n"), std::string::npos);
}

kvpack::ModelShape shape() {
  kvpack::ModelShape s;
  s.layers = 3;
  s.q_heads = 4;
  s.kv_heads = 2;
  s.head_dim = 64;
  s.max_tokens = 512;
  return s;
}

// Sampled error: 0 for fp32, and for INT8 equal to a float64 computation over read_back.
template <class Cache>
std::pair<double, double> fill_and_measure(Cache& c, int every, CacheMetrics& m) {
  const auto sh = shape();
  kvpack::plan::QuantErrorSampler sampler(every);
  std::mt19937 rng(9);
  std::normal_distribution<float> nd;
  std::vector<std::vector<float>> allk(3), allv(3);
  int32_t p = 0;
  for (int n : {31, 33, 1, 95}) {
    for (int l = 0; l < sh.layers; ++l) {
      std::vector<float> k(size_t(n) * 2 * 64), v(k.size());
      for (auto& x : k) x = nd(rng);
      for (auto& x : v) x = nd(rng);
      std::vector<int32_t> pos;
      for (int t = 0; t < n; ++t) pos.push_back(p + t);
      sampler.record(l, c.tokens(l), sh.kv_heads, sh.head_dim, k, v);
      EXPECT_TRUE(c.append(l, k, v, pos));
      allk[size_t(l)].insert(allk[size_t(l)].end(), k.begin(), k.end());
      allv[size_t(l)].insert(allv[size_t(l)].end(), v.begin(), v.end());
    }
    p += n;
  }
  auto r = sampler.measure(c, sh.layers, sh.kv_heads, sh.head_dim);
  EXPECT_TRUE(r);
  // float64 reference over the same rows.
  double num = 0, den = 0;
  for (int l = 0; l < 3; ++l)
    for (int h = 0; h < 2; ++h) {
      auto hc = c.read_back(l, h);
      for (size_t r2 = 0; r2 < hc->indices.size(); ++r2) {
        const int64_t t = hc->indices[r2];
        if (t % every) continue;
        for (size_t d = 0; d < 64; ++d) {
          const double xk = allk[size_t(l)][(size_t(t) * 2 + size_t(h)) * 64 + d];
          const double xv = allv[size_t(l)][(size_t(t) * 2 + size_t(h)) * 64 + d];
          num += std::pow(hc->k[r2 * 64 + d] - xk, 2) + std::pow(hc->v[r2 * 64 + d] - xv, 2);
          den += xk * xk + xv * xv;
        }
      }
    }
  EXPECT_EQ(r->second, uint64_t(3 * 2 * ((160 + every - 1) / every)));
  kvpack::plan::collect(c, m);
  m.quant_error_rel_rms = r->first;
  return {r->first, std::sqrt(num / den)};
}

TEST(Metrics, SampledQuantErrorAndCompressionRatio) {
  CacheMetrics m32, m8;
  auto f = kvpack::plan::Fp32Cache::create(shape());
  auto [e32, r32] = fill_and_measure(*f, 7, m32);
  EXPECT_EQ(e32, 0.0);
  EXPECT_EQ(r32, 0.0);
  auto i8 = kvpack::plan::Int8Cache::create(shape());
  auto [e8, r8] = fill_and_measure(*i8, 5, m8);
  EXPECT_GT(e8, 1e-4);
  EXPECT_LT(e8, 2e-2);
  EXPECT_NEAR(e8, r8, 1e-9 * r8);
  EXPECT_EQ(m8.tokens, 3u * 160u);
  EXPECT_EQ(m8.fp32_bytes, 3u * 160u * 2u * 64u * 8u);
  EXPECT_EQ(m8.kv_bytes, i8->memory_bytes());
  EXPECT_DOUBLE_EQ(m8.compression_ratio(), double(m8.fp32_bytes) / double(i8->memory_bytes()));
  EXPECT_GT(m8.compression_ratio(), 3.0);  // 8.5 bits + positions/headers vs 32 bits
}

TEST(Metrics, LayeredCacheCounters) {
  auto lc = kvpack::plan::StandardLayeredCache::create(shape(), std::vector<int>{0, 0, 0});
  ASSERT_TRUE(lc);
  std::vector<float> k(33 * 2 * 64, 0.25f);
  std::vector<int32_t> pos(33);
  for (int t = 0; t < 33; ++t) pos[size_t(t)] = t;
  for (int l = 0; l < 3; ++l) ASSERT_TRUE(lc->append(l, k, k, pos));
  ASSERT_TRUE(lc->replan(std::vector<int>{5, 0, 2}));
  for (int t = 0; t < 1; ++t)
    for (int l = 0; l < 3; ++l) {
      std::vector<float> k1(2 * 64, 0.5f);
      std::vector<int32_t> p1{33};
      ASSERT_TRUE(lc->append(l, k1, k1, p1));
    }
  CacheMetrics m;
  kvpack::plan::collect(*lc, m);
  EXPECT_EQ(m.replans, 1u);
  EXPECT_EQ(m.migrations, 2u);
  EXPECT_EQ(m.recompressed_tokens, 66u);
  EXPECT_EQ(m.tokens, 3u * 34u);
  EXPECT_EQ(m.kv_bytes, lc->memory_bytes());
}

}  // namespace
}  // namespace test_plan_metrics
