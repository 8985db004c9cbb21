// Quantize-on-commit through the backend's SIMD quantizer (cache/role_codec.hpp encode_row_on):
// a cache on the build's best backend (AVX2 or NEON where compiled) stores block bytes identical
// to the same cache on Backend<Scalar>, whose encode_row is the oracle, for every integer codec
// and odd token counts (1, 31, 33, 95), with outliers, constant groups and chunked appends.
#include <gtest/gtest.h>

#include <algorithm>
#include <bit>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <vector>

#include "kvpack/kvpack.hpp"
#include "support/reference.hpp"

namespace {

using namespace kvpack;  // NOLINT: test file

constexpr int kSimdEncD = 64;

template <class K, class V, class KeyAxis = PerToken>
struct SimdEncPair {
  using best = KVCache<Keys<K, KeyAxis>, Values<V>, Blocks<32>>;
  using oracle = KVCache<Keys<K, KeyAxis>, Values<V>, Blocks<32>, Backend<Scalar>>;
};

using SimdEncTypes = ::testing::Types<SimdEncPair<Int8<Group<32>>, Int8<Group<32>>>, SimdEncPair<Int4<Group<32>>, Int4<Group<32>>>,
                                      SimdEncPair<Int8<Group<32>>, Int4<Group<32>>>, SimdEncPair<Int4<Group<64>>, Int4<Group<64>>>,
                                      SimdEncPair<Int8<Group<32>, Asymmetric>, Int4<Group<32>, Symmetric>>, SimdEncPair<Fp8E4M3<Group<32>>, Fp16>,
                                      SimdEncPair<Int3<Group<32>>, Int2<Group<32>>>, SimdEncPair<Int2<Group<32>, Symmetric>, Int3<Group<64>>>,
                                      SimdEncPair<Int4<Group<32>>, Int4<Group<32>>, PerChannel>,
                                      SimdEncPair<Int8<Group<32>, Asymmetric>, Int8<Group<32>>, PerChannel>,
                                      SimdEncPair<Int2<Group<32>>, Int3<Group<32>, Symmetric>, PerChannel>,
                                      SimdEncPair<Int3<Group<32>>, Int8<Group<32>, Symmetric>, PerChannel>>;

template <class T>
class CacheSimdEncode : public ::testing::Test {};
TYPED_TEST_SUITE(CacheSimdEncode, SimdEncTypes);

// Rows with outliers, a constant group and an all-zero group mixed into N(0,1) data.
std::vector<float> simd_enc_rows(int tokens, int kv_heads, uint32_t seed) {
  auto x = kvtest::normal(static_cast<size_t>(tokens) * kv_heads * kSimdEncD, seed);
  for (size_t i = 0; i < x.size(); i += 37) x[i] *= 40.f;                                 // outliers
  for (size_t i = 0; i + 32 <= x.size(); i += 32 * 7) std::fill_n(x.begin() + i, 32, 0.75f);  // constant groups
  for (size_t i = 64; i + 32 <= x.size(); i += 32 * 11) std::fill_n(x.begin() + i, 32, 0.f);  // zero groups
  // Groups whose minimum (or maximum) is a signed zero met as -0 before +0 or the reverse: the
  // scalar scan keeps the first, so SIMD min/max must not pick the other one's sign bit.
  for (size_t i = 96, k = 0; i + 32 <= x.size(); i += 32 * 13, ++k) {
    const float sign = k % 2 ? -1.f : 1.f;  // all >= 0 (zero is the minimum) or all <= 0 (the maximum)
    for (size_t j = 0; j < 32; ++j) x[i + j] = sign * std::fabs(x[i + j]);
    x[i + 3 + k % 5] = k % 3 ? -0.f : 0.f;
    x[i + 17] = k % 3 ? 0.f : -0.f;
  }
  // The same down the channels (per-channel key groups run over 32 tokens): channel 5 (mod 16)
  // non-negative and channel 9 non-positive, with -0 and +0 in either order; channel 12
  // constant, channel 14 zero.
  // Head 1 only (rows alternate heads), so head 0 keeps its constant and zero row groups.
  const size_t rows = x.size() / kSimdEncD;
  for (size_t t = 1; t < rows; t += 2) {
    for (size_t c = 0; c < kSimdEncD; c += 16) {
      float* r = x.data() + t * kSimdEncD + c;
      r[5] = std::fabs(r[5]);
      r[9] = -std::fabs(r[9]);
      if (t / 2 % 7 == 3) r[5] = r[9] = t / 14 % 2 ? -0.f : 0.f;
      if (t / 2 % 7 == 5) r[5] = r[9] = t / 14 % 2 ? 0.f : -0.f;
      r[12] = 0.375f;
      r[14] = 0.f;
    }
  }
  return x;
}

TYPED_TEST(CacheSimdEncode, BlockBytesEqualTheScalarOracle) {
  using Best = typename TypeParam::best;
  using Oracle = typename TypeParam::oracle;
#if KVPACK_HAS_AVX2 || KVPACK_HAS_NEON
  static_assert(!std::is_same_v<typename Best::backend_tag, Scalar>, "the SIMD backend must be the one under test");
#endif
  const ModelShape shape{.layers = 1, .q_heads = 2, .kv_heads = 2, .head_dim = kSimdEncD, .max_tokens = 256};
  for (int n : {1, 31, 33, 95}) {
    auto best = Best::create(shape).value();
    auto oracle = Oracle::create(shape).value();
    const auto k = simd_enc_rows(n, 2, 11u + static_cast<uint32_t>(n)), v = simd_enc_rows(n, 2, 77u + static_cast<uint32_t>(n));
    const auto pos = kvtest::iota_positions(0, n);
    // Chunks of 7 (and the rest): codes must not depend on chunking either.
    for (int t0 = 0; t0 < n; t0 += 7) {
      const int m = std::min(7, n - t0);
      const size_t row = 2 * kSimdEncD;
      const std::span<const float> ks(k.data() + t0 * row, m * row), vs(v.data() + t0 * row, m * row);
      const std::span<const int32_t> ps(pos.data() + t0, static_cast<size_t>(m));
      ASSERT_TRUE(best.append(0, ks, vs, ps));
      ASSERT_TRUE(oracle.append(0, ks, vs, ps));
    }
    ASSERT_EQ(best.quantized_tokens(0), oracle.quantized_tokens(0));
    ASSERT_EQ(best.quantized_tokens(0), Best::keys_per_channel ? n / 32 * 32 : n);
    for (int h = 0; h < 2; ++h) {
      const auto a = best.blocks(0, h), b = oracle.blocks(0, h);
      ASSERT_EQ(a.size(), b.size());
      for (size_t i = 0; i < a.size(); ++i) {
        ASSERT_EQ(a[i].header.count, b[i].header.count);
        EXPECT_EQ(std::memcmp(a[i].data.get(), b[i].data.get(), best.block_layout().bytes), 0)
            << "n " << n << " head " << h << " block " << i;
      }
    }
  }
}

#if KVPACK_HAS_AVX2
// Groups whose scale lands just above an fp16 value: amax / qmax (or (hi - zero) / qmax) rounds
// to a float below the exact quotient, so the metadata's round-up must step one float ulp up
// before rounding up to fp16 (meta.hpp f32_round_up); the vectorized metadata of the AVX2
// encoders (derive4) must do the same. Rows and per-channel groups, against the scalar encoders.
// The values x (whole groups of G) as per-channel groups, channel c of G tokens holding group
// c's values (the first multiple of 8 groups): AVX2 and scalar encode_channels bytes equal.
template <class C>
void expect_channels_equal(const std::vector<float>& x) {
  constexpr int G = C::group_size;
  const int groups = static_cast<int>(x.size()) / G, channels = groups - groups % 8;
  std::vector<float> t(static_cast<std::size_t>(G) * channels);
  for (int c = 0; c < channels; ++c)
    for (int r = 0; r < G; ++r) t[r * channels + c] = x[c * G + r];
  const std::size_t row_bytes = C::code_bytes(static_cast<std::size_t>(channels));
  std::vector<std::byte> ca(G * row_bytes + channels * C::meta_bytes_per_group), cb(ca.size());
  kernels::avx2::encode_channels<C>(t.data(), channels, channels, ca.data(), row_bytes, ca.data() + G * row_bytes);
  encode_channels<C>(t.data(), channels, channels, cb.data(), row_bytes, cb.data() + G * row_bytes);
  EXPECT_EQ(ca, cb) << "channels";
}

template <class C>
void check_scale_edges() {
  constexpr int G = C::group_size;
  std::vector<float> x;
  for (std::uint32_t h = 0x0800; h < 0x7000; h += 29) {  // fp16 values 2^-13 .. 2^13
    const float target = C::qmax * fp16_to_float(static_cast<std::uint16_t>(h));
    const float lo = C::asymmetric ? -1.f : -0.25f * target;
    const float hi = C::asymmetric ? kvpack::detail::next_up(target + lo) : kvpack::detail::next_up(target);
    for (int i = 0; i < G; ++i) x.push_back(i == 3 ? hi : i == 7 ? lo : 0.5f * lo + 0.001f * static_cast<float>(i));
  }
  const int groups = static_cast<int>(x.size()) / G;
  const std::size_t code_bytes = C::code_bytes(static_cast<std::size_t>(G));
  std::vector<std::byte> a(groups * (code_bytes + C::meta_bytes_per_group)), b(a.size());
  for (int g = 0; g < groups; ++g) {  // rows of one group each
    const std::size_t at = static_cast<std::size_t>(g) * (code_bytes + C::meta_bytes_per_group);
    kernels::avx2::encode_row<C>(x.data() + g * G, G, a.data() + at, a.data() + at + code_bytes);
    encode_row<C>(x.data() + g * G, G, b.data() + at, b.data() + at + code_bytes);
  }
  EXPECT_EQ(a, b) << "rows";
  // Rows of 5 groups: the encoder reduces four groups' ranges in registers, then the fifth alone.
  const int rows5 = groups / 5;
  const std::size_t row5 = C::code_bytes(static_cast<std::size_t>(5 * G)) + 5 * C::meta_bytes_per_group;
  std::vector<std::byte> a5(rows5 * row5), b5(a5.size());
  for (int r = 0; r < rows5; ++r) {
    std::byte* pa = a5.data() + r * row5;
    std::byte* pb = b5.data() + r * row5;
    const std::size_t cb = C::code_bytes(static_cast<std::size_t>(5 * G));
    kernels::avx2::encode_row<C>(x.data() + r * 5 * G, 5 * G, pa, pa + cb);
    encode_row<C>(x.data() + r * 5 * G, 5 * G, pb, pb + cb);
  }
  EXPECT_EQ(a5, b5) << "rows of 5 groups";
  expect_channels_equal<C>(x);
}

// Rows of 1-9 groups (the AVX2 encoder reduces the ranges of four groups at a time in registers,
// the last 1-3 as a partial quad; signed-zero ends are rescanned): bytes equal the scalar encoder's, with groups whose range ends
// at a signed zero (-0 before +0 or the reverse), constant and all-zero groups in every lane.
template <class C>
void check_long_rows() {
  constexpr int G = C::group_size;
  for (int groups = 1; groups <= 9; ++groups) {
    const int n = groups * G;
    for (std::uint32_t seed = 0; seed < 10; ++seed) {
      auto x = kvtest::normal(static_cast<std::size_t>(n), 1000u + 17u * seed + static_cast<std::uint32_t>(groups));
      const float z1 = seed % 2 ? -0.f : 0.f, z2 = seed % 2 ? 0.f : -0.f;
      for (int g = 0; g < groups; ++g) {
        float* p = x.data() + g * G;
        switch ((static_cast<std::uint32_t>(g) + seed) % 5) {
          case 0:  // minimum at a signed zero
            for (int j = 0; j < G; ++j) p[j] = std::fabs(p[j]) + 0.01f;
            p[1] = z1, p[G - 1] = z2;
            break;
          case 1:  // maximum at a signed zero
            for (int j = 0; j < G; ++j) p[j] = -std::fabs(p[j]) - 0.01f;
            p[G / 2] = z1, p[2] = z2;
            break;
          case 2: std::fill_n(p, G, 0.625f); break;
          case 3: std::fill_n(p, G, z1); break;
          default: p[G / 2] *= 50.f;  // an outlier
        }
      }
      const std::size_t cb = C::code_bytes(static_cast<std::size_t>(n));
      std::vector<std::byte> a(cb + groups * C::meta_bytes_per_group), b(a.size());
      kernels::avx2::encode_row<C>(x.data(), n, a.data(), a.data() + cb);
      encode_row<C>(x.data(), n, b.data(), b.data() + cb);
      EXPECT_EQ(a, b) << groups << " groups, seed " << seed;
    }
  }
}

TEST(CacheSimdEncodeEdges, LongRowsEqualTheScalarEncoder) {
  check_long_rows<Int4<Group<32>>>();
  check_long_rows<Int4<Group<8>, Asymmetric>>();
  check_long_rows<Int8<Group<16>>>();
  check_long_rows<Int8<Group<32>, Asymmetric>>();
  check_long_rows<Int3<Group<32>>>();
  check_long_rows<Int2<Group<64>, Symmetric>>();
}

// Values within a few ulps of a half-integer multiple of their group's scale, z + (k + 0.5) * s
// for every level k, over many scales: where rounding to the nearest level is decided by the
// last bit, a quantizer that does not divide exactly as the scalar one does (a multiplication by
// a rounded reciprocal, tried and measured slower, bench_append) gives other codes. Rows and
// per-channel groups, against the scalar encoders.
template <class C>
void check_half_levels() {
  constexpr int G = C::group_size;
  std::vector<float> x;
  std::uint32_t salt = 0;
  for (float amax = 0.0371f; amax < 900.f; amax *= 1.37f) {
    const float lo = C::asymmetric ? -0.31f * amax : -amax, hi = amax;
    GroupParams p{};
    std::byte meta[16] = {};
    C::store_params(C::from_range({lo, hi}), meta);
    p = C::load_params(meta);
    std::vector<float> group{lo, hi};
    for (int k = C::qmin; k < C::qmax && group.size() < static_cast<std::size_t>(G); ++k) {
      float v = p.zero + (static_cast<float>(k) + 0.5f) * p.scale;
      const int steps = static_cast<int>(salt++ % 5) - 2;  // -2 .. 2 ulps
      for (int i = 0; i < std::abs(steps); ++i) v = std::nextafter(v, steps > 0 ? hi : lo);
      if (v > lo && v < hi) group.push_back(v);
    }
    while (group.size() < static_cast<std::size_t>(G)) group.push_back(0.5f * (lo + hi));
    x.insert(x.end(), group.begin(), group.end());
  }
  const int groups = static_cast<int>(x.size()) / G;
  const std::size_t cb = C::code_bytes(static_cast<std::size_t>(groups * G));
  std::vector<std::byte> a(cb + groups * C::meta_bytes_per_group), b(a.size());
  kernels::avx2::encode_row<C>(x.data(), groups * G, a.data(), a.data() + cb);
  encode_row<C>(x.data(), groups * G, b.data(), b.data() + cb);
  EXPECT_EQ(a, b) << "rows";
  expect_channels_equal<C>(x);
}

TEST(CacheSimdEncodeEdges, HalfLevelsEqualTheScalarDivision) {
  check_half_levels<Int4<Group<32>>>();
  check_half_levels<Int4<Group<32>, Asymmetric>>();
  check_half_levels<Int8<Group<256>>>();
  check_half_levels<Int8<Group<256>, Asymmetric>>();
  check_half_levels<Int3<Group<16>>>();
  check_half_levels<Int2<Group<8>, Asymmetric>>();
}

// AVX2's fp16 rows against the scalar conversion: every 1021st finite fp32 bit pattern (both
// signs; fp16 subnormals, ties, values past 65504 that saturate), in rows of 1-40 values so the
// 8-wide body and the scalar tail both run.
TEST(CacheSimdEncodeEdges, Fp16RowsEqualTheScalarConversion) {
  std::vector<float> x;
  for (std::uint64_t b = 0; b < 0x100000000ull; b += 1021) {
    const float f = std::bit_cast<float>(static_cast<std::uint32_t>(b));
    if (std::isfinite(f)) x.push_back(f);
  }
  for (float f : {65504.f, 65519.f, 65520.f, 65536.f, 0x1p-24f, 0x1p-25f, 0x1.8p-25f, 0x1p-14f})
    for (float sign : {1.f, -1.f}) x.push_back(sign * f);
  std::vector<std::byte> a(2 * x.size()), b(a.size());
  std::size_t at = 0;
  for (int len = 1; at < x.size(); len = len % 40 + 1) {
    const int n = static_cast<int>(std::min<std::size_t>(static_cast<std::size_t>(len), x.size() - at));
    kernels::avx2::encode_row_fp16(x.data() + at, n, a.data() + 2 * at);
    encode_row<Fp16>(x.data() + at, n, b.data() + 2 * at, nullptr);
    at += static_cast<std::size_t>(n);
  }
  EXPECT_EQ(a, b);
}

TEST(CacheSimdEncodeEdges, ScalesJustAboveAnFp16Value) {
  check_scale_edges<Int4<Group<32>, Symmetric>>();
  check_scale_edges<Int8<Group<32>>>();
  check_scale_edges<Int4<Group<32>, Asymmetric>>();
  check_scale_edges<Int8<Group<64>, Asymmetric>>();
  check_scale_edges<Int3<Group<32>>>();
}
#endif

}  // namespace
