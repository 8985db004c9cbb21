// Which attention kernel a KVCache runs, and that KVCache gives the same answers on it as on the
// scalar kernel:
//  * Backend<Auto> resolves to AVX2 in a build with AVX2 + FMA + F16C (the default native test
//    build on such a host: KVPACK_TEST_EXPECT_AVX2, or the presets' KVPACK_EXPECTED_SIMD), to NEON
//    on AArch64, else to the scalar kernel; Backend<Scalar> always to the scalar kernel;
//  * the same appends and queries through Backend<Auto> and Backend<Scalar> caches: outputs
//    within 1e-5 relative, for prefill chunks and decode steps, several codecs and GQA shapes.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <string_view>
#include <type_traits>
#include <vector>

#include "kvpack/kvpack.hpp"
#include "support/backends.hpp"
#include "support/reference.hpp"
#include "support/sweep.hpp"

namespace {

using namespace kvpack;  // NOLINT: test file

using AutoCache = KVCache<Keys<Int4<>>, Values<Int4<>>>;
using ScalarCache = KVCache<Keys<Int4<>>, Values<Int4<>>, Backend<Scalar>>;

static_assert(std::is_same_v<ScalarCache::backend_tag, Scalar>);
static_assert(active_backend_name<ScalarCache>() == "scalar");
#if KVPACK_HAS_AVX2
static_assert(std::is_same_v<AutoCache::backend_tag, Avx2>);
static_assert(active_backend_name<KVCache<Backend<Avx2>>>() == "avx2");
#elif KVPACK_HAS_NEON
static_assert(std::is_same_v<AutoCache::backend_tag, Neon>);
static_assert(active_backend_name<KVCache<Backend<Neon>>>() == "neon");
#else
static_assert(std::is_same_v<AutoCache::backend_tag, Scalar>);
#endif

TEST(ActiveBackend, IsTheOneThisBuildIsFor) {
  const std::string_view name = active_backend_name<AutoCache>();
#if defined(KVPACK_TEST_EXPECT_AVX2) || defined(KVPACK_EXPECTED_SIMD_AVX2)
  EXPECT_EQ(name, "avx2") << "the test build compiles for AVX2, but Backend<Auto> does not run the AVX2 kernel";
#elif defined(KVPACK_EXPECTED_SIMD_NEON) || (defined(__aarch64__) && !defined(KVPACK_DISABLE_SIMD))
  EXPECT_EQ(name, "neon") << "AArch64 build, but Backend<Auto> does not run the NEON kernel";
#elif defined(KVPACK_EXPECTED_SIMD_NONE)
  EXPECT_EQ(name, "scalar");
#else
  // No expectation configured (e.g. -DKVPACK_TEST_AVX2=OFF on x86-64): the macros decide.
  EXPECT_EQ(name, KVPACK_HAS_AVX2 ? "avx2" : (KVPACK_HAS_NEON ? "neon" : "scalar"));
#endif
  EXPECT_EQ(active_backend_name<ScalarCache>(), "scalar");
}

/// Largest |oa - ob| over the allowed difference of an integer Q·K / P·V kernel
/// (kernels::KernelInfo) from the scalar one, per output row: 1e-5 relative, plus for a quantized
/// query (e^{2e} - 1) * max_t |v_t - ob| with e = scale * max_t Σ_g max|q_g| * query_error *
/// Σ_{d in g} |k_td|, plus for integer P·V kvtest::int4_value_error_bound of the row's softmax
/// weights, over the K/V the scalar cache stores (read_back) for the last n_q queries' tokens.
template <class Cache>
double query_bound_error(const Cache& c, const std::vector<float>& q, const std::vector<float>& oa,
                         const std::vector<float>& ob, const ModelShape& s, int n_q, const kernels::KernelInfo& k) {
  const int D = s.head_dim, G = k.query_group, group = s.q_heads / s.kv_heads;
  const double scale = 1.0 / std::sqrt(static_cast<double>(D));
  const std::int64_t n = c.tokens(0);
  double worst = 0;
  for (int h = 0; h < s.kv_heads; ++h) {
    auto kv = c.read_back(0, h);
    if (!kv) return INFINITY;
    for (int i = 0; i < n_q; ++i)
      for (int j = 0; j < group; ++j) {
        const std::size_t row = (static_cast<std::size_t>(i) * s.q_heads + static_cast<std::size_t>(h * group + j)) * D;
        const std::int64_t visible = n - n_q + i + 1;
        double e = 0, spread = 0, err = 0, mag = 1e-6;
        std::vector<double> logit, p, sc;
        for (std::int64_t t = 0; t < visible; ++t) {
          double et = 0, dot = 0;
          for (int d = 0; d < D; ++d) dot += static_cast<double>(q[row + d]) * kv->k[static_cast<std::size_t>(t) * D + d];
          logit.push_back(dot * scale);
          using VC = typename Cache::value_codec;
          if constexpr (kvpack::kernels::simd::IntCodecFamily<VC>) if (k.value_group > 0) {
            double smax = 0;
            for (int g = 0; g < D / VC::group_size; ++g) {
              double x[VC::group_size];
              for (int d = 0; d < VC::group_size; ++d) x[d] = kv->v[static_cast<std::size_t>(t) * D + g * VC::group_size + d];
              smax = std::max(smax, kvtest::int4_group_scale(x, VC::group_size, VC::asymmetric));
            }
            sc.push_back(smax);
          }
          for (int g = 0; G > 0 && g < D / G; ++g) {
            double qmax = 0, ksum = 0;
            for (int d = g * G; d < (g + 1) * G; ++d) {
              qmax = std::max(qmax, std::abs(static_cast<double>(q[row + d])));
              ksum += std::abs(static_cast<double>(kv->k[static_cast<std::size_t>(t) * D + d]));
            }
            et += qmax * k.query_error * ksum;
          }
          e = std::max(e, et * scale);
          for (int d = 0; d < D; ++d)
            spread = std::max(spread, std::abs(kv->v[static_cast<std::size_t>(t) * D + d] - static_cast<double>(ob[row + d])));
        }
        for (int d = 0; d < D; ++d) {
          err = std::max(err, std::abs(static_cast<double>(oa[row + d]) - ob[row + d]));
          mag = std::max(mag, std::abs(static_cast<double>(ob[row + d])));
        }
        double value_bound = 0;
        if (!sc.empty()) {  // every row counted as read from INT4 blocks: an upper bound
          const double mx = *std::max_element(logit.begin(), logit.end());
          double l = 0;
          for (double x : logit) l += std::exp(x - mx);
          for (double x : logit) p.push_back(std::exp(x - mx) / l);
          value_bound = kvtest::int4_value_error_bound(p, sc);
        }
        worst = std::max(worst, err / (1e-5 * mag + (std::exp(2 * e) - 1) * spread + value_bound));
      }
  }
  return worst;
}

template <class Pair>
class CacheAutoVsScalar : public ::testing::Test {};

template <class... Ps>
struct CachePair {
  using simd = KVCache<Ps..., Backend<Auto>>;
  using scalar = KVCache<Ps..., Backend<Scalar>>;
};
using Pairs = ::testing::Types<CachePair<Keys<Int4<>>, Values<Int4<>>>, CachePair<Keys<Int8<>>, Values<Int8<Asymmetric>>>,
                               CachePair<Keys<Fp8E4M3<>>, Values<Fp8E5M2<>>, Sinks<4>, Residual<8>>,
                               CachePair<Keys<Int4<>, PerChannel>, Values<Int4<Symmetric>>, Residual<16>>,
                               CachePair<Keys<Fp16>, Values<Fp16>, Blocks<16>>, CachePair<>>;
TYPED_TEST_SUITE(CacheAutoVsScalar, Pairs);

TYPED_TEST(CacheAutoVsScalar, SameAnswersOnEveryStep) {
  KVTEST_REQUIRE_BACKEND(kvtest::SimdKernel);
  for (const auto& [q_heads, kv_heads, D] : std::vector<std::tuple<int, int, int>>{{8, 2, 128}, {3, 1, 64}, {6, 6, 96}}) {
    const ModelShape shape{.layers = 1, .q_heads = q_heads, .kv_heads = kv_heads, .head_dim = D, .max_tokens = 600};
    auto a = TypeParam::simd::create(shape);
    auto b = TypeParam::scalar::create(shape);
    ASSERT_TRUE(a && b);
    const auto row = static_cast<std::size_t>(kv_heads * D), qrow = static_cast<std::size_t>(q_heads * D);
    std::uint32_t seed = 3;
    for (int n : kvtest::sweep_sizes({95, 1, 33, 1, 1, 200, 1, 31, 1}, 95)) {
      const auto k = kvtest::normal(static_cast<std::size_t>(n) * row, seed++);
      const auto v = kvtest::normal(static_cast<std::size_t>(n) * row, seed++);
      const auto pos = kvtest::iota_positions(a->tokens(0), n);
      ASSERT_TRUE(a->append(0, k, v, pos));
      ASSERT_TRUE(b->append(0, k, v, pos));
      const auto q = kvtest::normal(static_cast<std::size_t>(n) * qrow, seed++);
      std::vector<float> oa(q.size()), ob(q.size());
      ASSERT_TRUE(a->attend(0, q, oa));
      ASSERT_TRUE(b->attend(0, q, ob));
      constexpr kernels::KernelInfo kernel = TypeParam::simd::codec_hook::kernel;
      if constexpr (kernel.query_group == 0 && kernel.value_group == 0) {
        EXPECT_LE(kvtest::max_rel_error(oa, std::vector<double>(ob.begin(), ob.end()), D), 1e-5)
            << "D=" << D << " chunk " << n << " tokens " << a->tokens(0);
      } else {
        // Integer Q·K / P·V: within 1e-5 plus what the quantized query and weights allow.
        const double err = query_bound_error(*b, q, oa, ob, shape, n, kernel);
        EXPECT_LE(err, 1.0) << "D=" << D << " chunk " << n << " tokens " << a->tokens(0);
      }
    }
  }
}

}  // namespace
