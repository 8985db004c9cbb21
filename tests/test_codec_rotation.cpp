// Hadamard rotation (rotation/hadamard.hpp) and Rotated<Cache> (rotation/rotated_cache.hpp):
//  * the block-diagonal matrix is orthonormal (M^T M = I to 1e-6) for power-of-two and other
//    head_dims (80 = 64 + 16, 96 = 64 + 32, 112 = 64 + 32 + 16, 34), blocks do not mix, and the
//    inverse undoes the rotation (plain and signed);
//  * Rotated fp32 caches give the float64 attention of the EXACT inputs to 1e-5 relative (the
//    rotation changes nothing but rounding), Backend<Scalar> and the build's best backend, keys
//    only or keys and values (with sinks and a residual window), at 1, 31, 33, 95 tokens and head_dims 64, 80, 96, 112;
//  * Rotated quantized caches (INT4, INT3, per-channel INT2): the kernel adds no error of its own
//    (float64 on the cache's read_back, rotated back, plus the exact current chunk, to 1e-5), and
//    every read-back row is within the codec's bound applied in the rotated basis:
//    ||k̂ - k||_2 <= sqrt(Σ_d b_d^2), b_d the half-step bound of the group holding channel d of R k;
//  * values-only rotation (Rotate<R, true, false>, the choice for PreRope<> caches) stores keys
//    bit for bit as the unrotated cache does and values within the bound in the rotated basis;
//  * errors pass through (wrong sizes, NaN) and read_back returns the caller's basis.
#include <gtest/gtest.h>

#include <cmath>
#include <cstdint>
#include <string>
#include <vector>

#include "kvpack/kvpack.hpp"
#include "support/cache_harness.hpp"
#include "support/codec_bounds.hpp"
#include "support/reference.hpp"

namespace {

using namespace kvpack;  // NOLINT: test file

template <class R>
std::vector<double> rotation_matrix(int D) {  // column j = R e_j
  std::vector<double> M(static_cast<std::size_t>(D) * D);
  std::vector<float> e(static_cast<std::size_t>(D));
  for (int j = 0; j < D; ++j) {
    std::fill(e.begin(), e.end(), 0.f);
    e[static_cast<std::size_t>(j)] = 1.f;
    rotate_row<R>(e.data(), D);
    for (int i = 0; i < D; ++i) M[static_cast<std::size_t>(i) * D + j] = e[static_cast<std::size_t>(i)];
  }
  return M;
}

template <class R>
void check_orthonormal(int D) {
  SCOPED_TRACE("D=" + std::to_string(D));
  const auto M = rotation_matrix<R>(D);
  double worst = 0;
  for (int a = 0; a < D; ++a)
    for (int b = 0; b < D; ++b) {
      double dot = 0;
      for (int i = 0; i < D; ++i) dot += M[static_cast<std::size_t>(i) * D + a] * M[static_cast<std::size_t>(i) * D + b];
      worst = std::max(worst, std::abs(dot - (a == b ? 1.0 : 0.0)));
    }
  EXPECT_LE(worst, 1e-6);
  // Block-diagonal: channel j only reaches channels of its own power-of-two block.
  int off = 0;
  for (int bit = 30; bit >= 0; --bit) {
    const int m = 1 << bit;
    if ((D & m) == 0) continue;
    for (int j = off; j < off + m; ++j)
      for (int i = 0; i < D; ++i)
        if (i < off || i >= off + m) {
          ASSERT_EQ(M[static_cast<std::size_t>(i) * D + j], 0.0) << "mixes " << j << " into " << i;
        }
    if (m > 1) {
      EXPECT_NE(M[static_cast<std::size_t>(off + 1) * D + off], 0.0);  // and does mix inside it
    }
    off += m;
  }
  // Inverse: unrotate(rotate(x)) = x.
  auto x = kvtest::normal(static_cast<std::size_t>(D), 5);
  const auto x0 = x;
  rotate_row<R>(x.data(), D);
  EXPECT_NE(x, x0);
  unrotate_row<R>(x.data(), D);
  for (int i = 0; i < D; ++i) EXPECT_NEAR(x[static_cast<std::size_t>(i)], x0[static_cast<std::size_t>(i)], 1e-6);
}

TEST(HadamardRotation, OrthonormalBlockDiagonalAndInvertible) {
  for (int D : {8, 34, 64, 80, 96, 112, 128, 256}) {
    check_orthonormal<Hadamard>(D);
    check_orthonormal<SignedHadamard>(D);
  }
  // A spike spreads evenly over its block (the point of the rotation): |R e_0| = 1/8 at D = 64.
  std::vector<float> e(64, 0.f);
  e[0] = 1.f;
  rotate_row<Hadamard>(e.data(), 64);
  for (float v : e) EXPECT_FLOAT_EQ(std::abs(v), 0.125f);
}

// ---- fp32 caches: exact attention in a rotated basis ----

template <class Cache>
void exact_attention(int D) {
  const ModelShape shape{.layers = 1, .q_heads = 6, .kv_heads = 2, .head_dim = D, .max_tokens = 512};
  kvtest::Harness<Cache> h(shape);
  std::uint32_t seed = static_cast<std::uint32_t>(D);
  for (int n : {1, 31, 33, 95, 1}) {
    SCOPED_TRACE("D=" + std::to_string(D) + " chunk=" + std::to_string(n));
    const auto k = kvtest::normal(static_cast<std::size_t>(n) * h.row(), seed++);
    h.append(0, k, kvtest::normal(static_cast<std::size_t>(n) * h.row(), seed++));
    const auto q = kvtest::normal(static_cast<std::size_t>(n) * h.qrow(), seed++);
    std::vector<float> out(q.size());
    ASSERT_TRUE(h.cache().attend(0, q, out));
    const std::vector<double> K(h.exact_k().begin(), h.exact_k().end()), V(h.exact_v().begin(), h.exact_v().end());
    const auto ref = kvtest::attention_ref64(K, V, h.tokens(), q, n, shape.q_heads, shape.kv_heads, D,
                                             1.0 / std::sqrt(static_cast<double>(D)), h.tokens() - n);
    EXPECT_LE(kvtest::max_rel_error(out, ref, D), 1e-5);
    // read_back is in the caller's basis.
    const auto c = h.cache().read_back(0, 1);
    ASSERT_TRUE(c);
    for (std::int64_t t = 0; t < h.tokens(); ++t)
      for (int d = 0; d < D; ++d)
        ASSERT_NEAR(c->k[static_cast<std::size_t>(t) * D + d], h.exact_k()[(static_cast<std::size_t>(t) * 2 + 1) * D + d], 1e-5);
  }
}

TEST(RotatedCache, Fp32AttentionEqualsExactFloat64) {
  for (int D : {64, 80, 96, 112}) {
    exact_attention<Rotated<KVCache<Backend<Scalar>>>>(D);
    exact_attention<Rotated<KVCache<>>>(D);
    exact_attention<Rotated<KVCache<>, Rotate<SignedHadamard>>>(D);
    exact_attention<Rotated<KVCache<Sinks<2>, Residual<4>>, Rotate<Hadamard, false>>>(D);
    exact_attention<Rotated<KVCache<Sinks<2>, Residual<4>>, Rotate<Hadamard, true, false>>>(D);
  }
}

// ---- quantized caches ----

template <class Cache>
class RotatedQuantized : public ::testing::Test {};
using RotatedCaches = ::testing::Types<
    Rotated<KVCache<Keys<Int4<Group<16>>>, Values<Int4<Group<16>>>, Backend<Scalar>>>,
    Rotated<KVCache<Keys<Int4<Group<16>>>, Values<Int4<Group<16>>>>>,
    Rotated<KVCache<Keys<Int3<Group<16>>>, Values<Int2<Group<16>>>, Sinks<2>>, Rotate<SignedHadamard>>,
    Rotated<KVCache<Keys<Int2<Group<32>>, PerChannel>, Values<Int2<Group<16>>>, Residual<8>>>,
    Rotated<KVCache<Keys<Int2<Group<32>>, PerChannel>, Values<Int4<Group<16>>>, Backend<Scalar>>, Rotate<Hadamard, false>>,
    Rotated<KVCache<Keys<Int4<Group<16>>, PerChannel>, Values<Int4<Symmetric, Group<16>>>, Sinks<2>>, Rotate<Hadamard, true, false>>>;
TYPED_TEST_SUITE(RotatedQuantized, RotatedCaches);

TYPED_TEST(RotatedQuantized, KernelExactOnReadBackAndRowsWithinCodecBound) {
  using Cache = TypeParam;
  for (int D : {64, 80, 96, 112}) {
    const ModelShape shape{.layers = 1, .q_heads = 4, .kv_heads = 2, .head_dim = D, .max_tokens = 512};
    kvtest::Harness<Cache> h(shape);
    std::uint32_t seed = 3u + static_cast<std::uint32_t>(D);
    for (int n : {1, 31, 33, 95, 1, 1}) {
      SCOPED_TRACE("D=" + std::to_string(D) + " chunk=" + std::to_string(n));
      auto k = kvtest::normal(static_cast<std::size_t>(n) * h.row(), seed++);
      for (std::size_t i = 5; i < k.size(); i += static_cast<std::size_t>(D)) k[i] *= 12.f;  // an outlier channel
      h.append(0, k, kvtest::normal(static_cast<std::size_t>(n) * h.row(), seed++));
      EXPECT_LE(h.attend_error(0, kvtest::normal(static_cast<std::size_t>(n) * h.qrow(), seed++)), 1e-5);
    }
    ASSERT_GT(h.cache().quantized_tokens(0), 0);
    if constexpr (!Cache::keys_per_channel) {
      // Quantized key rows within the codec's bound in the rotated basis.
      using KC = typename Cache::key_codec;
      using R = typename Cache::rotation;
      constexpr int G = KC::group_size;
      for (int kh = 0; kh < 2; ++kh) {
        const auto c = h.cache().read_back(0, kh);
        ASSERT_TRUE(c);
        for (std::size_t i = 0; i < c->indices.size(); ++i) {
          const auto t = static_cast<std::size_t>(c->indices[i]);
          std::vector<float> rk(h.exact_k().begin() + static_cast<std::ptrdiff_t>((t * 2 + kh) * D),
                                h.exact_k().begin() + static_cast<std::ptrdiff_t>((t * 2 + kh + 1) * D));
          rotate_row<R>(rk.data(), D);
          double bound2 = 0, err2 = 0, norm2 = 0;
          for (int g = 0; g < D / G; ++g) {
            double lo = INFINITY, hi = -INFINITY;
            for (int d = g * G; d < (g + 1) * G; ++d) lo = std::min<double>(lo, rk[static_cast<std::size_t>(d)]), hi = std::max<double>(hi, rk[static_cast<std::size_t>(d)]);
            const double b = kvpack::codec_ref::int_error_bound<KC>(lo, hi);
            bound2 += b * b * G;
          }
          for (int d = 0; d < D; ++d) {
            const double x = h.exact_k()[(t * 2 + static_cast<std::size_t>(kh)) * D + static_cast<std::size_t>(d)];
            const double e = c->k[i * static_cast<std::size_t>(D) + static_cast<std::size_t>(d)] - x;
            err2 += e * e;
            norm2 += x * x;
          }
          ASSERT_LE(std::sqrt(err2), std::sqrt(bound2) + 1e-6 * std::sqrt(norm2)) << "token " << t << " head " << kh;
        }
      }
    }
  }
}

// Values only (Rotate<R, true, false>): keys are stored exactly as the unrotated twin stores them
// (bit-identical read_back), values are rotated (read_back differs from the twin's, and every
// value row is within the codec's bound applied in the rotated basis).
TEST(RotatedCache, ValuesOnlyLeavesKeysAlone) {
  using Inner = KVCache<Keys<Int4<Group<16>>>, Values<Int4<Symmetric, Group<16>>>>;
  using Codec = Inner::value_codec;
  constexpr int D = 64, G = Codec::group_size;
  const ModelShape shape{.layers = 1, .q_heads = 4, .kv_heads = 2, .head_dim = D, .max_tokens = 256};
  auto rot = Rotated<Inner, Rotate<Hadamard, true, false>>::create(shape).value();
  auto twin = Inner::create(shape).value();
  std::vector<float> k = kvtest::normal(96u * 2 * D, 41), v = kvtest::normal(96u * 2 * D, 42);
  for (std::size_t i = 3; i < v.size(); i += D) v[i] *= 12.f;  // an outlier value channel
  std::vector<std::int32_t> pos(96);
  for (int t = 0; t < 96; ++t) pos[static_cast<std::size_t>(t)] = t;
  for (const auto& [first, n] : {std::pair<std::size_t, std::size_t>{0, 95}, {95, 1}}) {  // a prefill chunk, then a decode token
    const std::span<const float> kc(k.data() + first * 2 * D, n * 2 * D), vc(v.data() + first * 2 * D, n * 2 * D);
    const std::span<const std::int32_t> pc(pos.data() + first, n);
    ASSERT_TRUE(rot.append(0, kc, vc, pc));
    ASSERT_TRUE(twin.append(0, kc, vc, pc));
  }
  ASSERT_GT(rot.quantized_tokens(0), 0);
  for (int kh = 0; kh < 2; ++kh) {
    const auto a = rot.read_back(0, kh), b = twin.read_back(0, kh);
    ASSERT_TRUE(a && b);
    EXPECT_EQ(a->k, b->k);
    EXPECT_NE(a->v, b->v);
    for (std::size_t i = 0; i < a->indices.size(); ++i) {
      const auto t = static_cast<std::size_t>(a->indices[i]);
      if (static_cast<std::int64_t>(t) >= rot.quantized_tokens(0)) continue;
      std::vector<float> rv(v.begin() + static_cast<std::ptrdiff_t>((t * 2 + static_cast<std::size_t>(kh)) * D),
                            v.begin() + static_cast<std::ptrdiff_t>((t * 2 + static_cast<std::size_t>(kh) + 1) * D));
      rotate_row<Hadamard>(rv.data(), D);
      double bound2 = 0, err2 = 0;
      for (int g = 0; g < D / G; ++g) {
        double lo = INFINITY, hi = -INFINITY;
        for (int d = g * G; d < (g + 1) * G; ++d) lo = std::min<double>(lo, rv[static_cast<std::size_t>(d)]), hi = std::max<double>(hi, rv[static_cast<std::size_t>(d)]);
        const double e = kvpack::codec_ref::int_error_bound<Codec>(lo, hi);
        bound2 += e * e * G;
      }
      for (int d = 0; d < D; ++d) {
        const double e = a->v[i * D + static_cast<std::size_t>(d)] - v[(t * 2 + static_cast<std::size_t>(kh)) * D + static_cast<std::size_t>(d)];
        err2 += e * e;
      }
      ASSERT_LE(std::sqrt(err2), std::sqrt(bound2) + 1e-5) << "token " << t << " head " << kh;
    }
  }
}

TEST(RotatedCache, ErrorsPassThrough) {
  auto c = Rotated<KVCache<Keys<Int4<>>, Values<Int4<>>>>::create({1, 2, 1, 64, 16}).value();
  std::vector<float> k(64, 1.f), bad(63, 1.f), q(128, 0.5f), out(128);
  const std::vector<std::int32_t> pos{0};
  EXPECT_EQ(c.append(0, bad, bad, pos).error().code, Errc::invalid_argument);
  EXPECT_EQ(c.append(1, k, k, pos).error().code, Errc::invalid_argument);
  k[7] = NAN;
  EXPECT_EQ(c.append(0, k, k, pos).error().code, Errc::non_finite);
  k[7] = 1.f;
  ASSERT_TRUE(c.append(0, k, k, pos));
  EXPECT_EQ(c.attend(0, std::span<const float>(q.data(), 127), out).error().code, Errc::invalid_argument);
  q[3] = INFINITY;
  EXPECT_EQ(c.attend(0, q, out).error().code, Errc::non_finite);
  q[3] = 0.5f;
  ASSERT_TRUE(c.attend(0, q, out));
  for (float v : out) EXPECT_NEAR(v, 1.f, 1e-5);  // one token of all-ones values
  EXPECT_EQ(c.tokens(0), 1);
  EXPECT_EQ(c.memory_bytes(), c.inner().memory_bytes());
  EXPECT_FALSE(Rotated<KVCache<>>::create({0, 2, 1, 64, 16}));
}

}  // namespace
