// Which attention kernel a KVCache runs, and that KVCache gives the same answers on it as on the
// scalar kernel:
//  * Backend<Auto> resolves to AVX2 in a build with AVX2 + FMA + F16C (the default native test
//    build on such a host: KVPACK_TEST_EXPECT_AVX2, or the presets' KVPACK_EXPECTED_SIMD), to NEON
//    on AArch64, else to the scalar kernel; Backend<Scalar> always to the scalar kernel;
//  * the same appends and queries through Backend<Auto> and Backend<Scalar> caches: outputs
//    within 1e-5 relative, for prefill chunks and decode steps, several codecs and GQA shapes.
#include <gtest/gtest.h>

#include <string_view>
#include <type_traits>
#include <vector>

#include "kvpack/kvpack.hpp"
#include "support/backends.hpp"
#include "support/reference.hpp"

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
    for (int n : {95, 1, 33, 1, 1, 200, 1, 31, 1}) {
      const auto k = kvtest::normal(static_cast<std::size_t>(n) * row, seed++);
      const auto v = kvtest::normal(static_cast<std::size_t>(n) * row, seed++);
      const auto pos = kvtest::iota_positions(a->tokens(0), n);
      ASSERT_TRUE(a->append(0, k, v, pos));
      ASSERT_TRUE(b->append(0, k, v, pos));
      const auto q = kvtest::normal(static_cast<std::size_t>(n) * qrow, seed++);
      std::vector<float> oa(q.size()), ob(q.size());
      ASSERT_TRUE(a->attend(0, q, oa));
      ASSERT_TRUE(b->attend(0, q, ob));
      EXPECT_LE(kvtest::max_rel_error(oa, std::vector<double>(ob.begin(), ob.end()), D), 1e-5)
          << "D=" << D << " chunk " << n << " tokens " << a->tokens(0);
    }
  }
}

}  // namespace
