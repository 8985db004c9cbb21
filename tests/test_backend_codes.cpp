// The SIMD code paths of this build (kernels/avx2/codes.hpp or kernels/neon/codes.hpp) against
// the scalar reference (kvpack/codec/rows.hpp and the codecs' value functions), bit for bit:
//  * the unpacker/dequantizer on all 256 byte values of every 8-bit-or-less codec (INT8, INT4,
//    INT3 and INT2, symmetric and asymmetric; FP8 E4M3FN and E5M2 including their NaN/Inf codes), on all
//    65536 fp16 codes, with fp16 and fp32 metadata, per-token rows and per-channel groups;
//  * per-token rows of random codes with different metadata in every group, and per-channel rows
//    of odd lengths (the wide decoders' tails);
//  * the quantizer (CASES C4): 4096 values of the form (k + 0.5) * scale + zero, ties broken to
//    even, clamped at both ends, and random rows (outliers, constant groups) through encode_row:
//    codes and metadata bytes equal encode_row's.
#include <gtest/gtest.h>

#include <bit>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <random>
#include <string>
#include <vector>

#include "kvpack/kvpack.hpp"
#include "support/backends.hpp"

namespace {

using namespace kvpack;  // NOLINT: test file
using Simd = kvtest::SimdKernel;

/// Bitwise equality, any NaN equal to any NaN (payloads may differ between conversion units).
::testing::AssertionResult same_float(float a, float b) {
  if (std::isnan(a) && std::isnan(b)) return ::testing::AssertionSuccess();
  if (std::bit_cast<std::uint32_t>(a) == std::bit_cast<std::uint32_t>(b)) return ::testing::AssertionSuccess();
  return ::testing::AssertionFailure() << a << " != " << b;
}

/// Equal up to the rounding of one fused multiply-add: code * scale + zero is one fma in the SIMD
/// decoders, and one in the scalar codec only where the compiler contracts it (g++ does at -O2,
/// clang++ at -O0 does not), so the two may differ in the last bits. `zero_bound` bounds |zero|.
/// A wrong element order or group parameter is off by at least one code step times the scale,
/// far above this bound.
::testing::AssertionResult same_up_to_fma(float a, float b, float zero_bound) {
  if (same_float(a, b)) return ::testing::AssertionSuccess();
  if (std::isnan(a) || std::isnan(b)) return ::testing::AssertionFailure() << a << " != " << b;
  const float tol = std::ldexp(std::abs(b) + zero_bound, -22);
  if (std::abs(a - b) <= tol) return ::testing::AssertionSuccess();
  return ::testing::AssertionFailure() << a << " != " << b << " (more than two roundings apart, " << tol << ")";
}

#if KVPACK_HAS_AVX2 || KVPACK_HAS_NEON
namespace sc = kvtest::simd_codes;

template <class C>
class AllBytes : public ::testing::Test {};
using ByteCodecs = ::testing::Types<Int8<Symmetric>, Int8<Asymmetric>, Int8<Asymmetric, MetaF32>, Int4<Symmetric>,
                                    Int4<Asymmetric>, Int4<Symmetric, MetaF32, Group<8>>, Int3<Symmetric>,
                                    Int3<Asymmetric, MetaF32>, Int2<Asymmetric>, Int2<Symmetric, MetaF32, Group<8>>, Fp8E4M3<>,
                                    Fp8E4M3<MetaF32, Group<64>>, Fp8E5M2<>, Fp8E5M2<MetaF32>>;
TYPED_TEST_SUITE(AllBytes, ByteCodecs);

// Every byte value 0x00..0xFF as codes (INT4: 512 nibbles; INT3: the first 240 bytes as 640
// codes; INT2: 1024 codes), under several group parameters,
// through decode_codes, decode_row (metadata as stored) and the per-channel decoder.
TYPED_TEST(AllBytes, UnpackerAgreesWithScalarOnEveryByte) {
  KVTEST_REQUIRE_BACKEND(Simd);
  using C = TypeParam;
  const std::size_t n = 2048 / C::bits / 64 * 64;  // whole groups of up to 64 codes in 256 bytes
  std::vector<std::byte> bytes(256);
  for (int i = 0; i < 256; ++i) bytes[static_cast<std::size_t>(i)] = static_cast<std::byte>(i);
  const GroupParams params[] = {{1.f, 0.f}, {0.75f, -2.5f}, {0.0999755859375f, 3.25f}, {1024.f, -65504.f},
                                {6.1035156e-05f, 0.5f}};
  for (const GroupParams& given : params) {
    // Parameters as the codec stores them (fp16 metadata rounds 0.1 etc.).
    std::vector<std::byte> one(static_cast<std::size_t>(C::meta_bytes_per_group));
    C::store_params(given, one.data());
    const GroupParams p = C::load_params(one.data());
    std::vector<float> want(n), got(n, -1.f), got_row(n, -1.f), got_ch(n, -1.f);
    for (std::size_t e = 0; e < n; ++e) want[e] = C::decode_value(C::load_code(bytes.data(), e), p);
    sc::decode_codes<C>(bytes.data(), n, p, got.data());
    std::vector<std::byte> meta(row_meta_bytes<C>(n));
    for (std::size_t g = 0; g < n / C::group_size; ++g)
      std::memcpy(meta.data() + g * C::meta_bytes_per_group, one.data(), one.size());
    std::vector<float> tmp(2 * n + 8);
    sc::decode_row<C>(bytes.data(), meta.data(), static_cast<int>(n), got_row.data(), tmp.data());
    std::vector<std::byte> ch_meta(n * static_cast<std::size_t>(C::meta_bytes_per_group));
    for (std::size_t c = 0; c < n; ++c)
      std::memcpy(ch_meta.data() + c * C::meta_bytes_per_group, one.data(), one.size());
    std::vector<float> cs(n), cz(n);
    sc::load_channel_params<C>(ch_meta.data(), static_cast<int>(n), cs.data(), cz.data(), tmp.data());
    sc::decode_row_channels<C>(bytes.data(), cs.data(), cz.data(), static_cast<int>(n), got_ch.data());
    for (std::size_t e = 0; e < n; ++e) {
      ASSERT_TRUE(same_float(got[e], want[e])) << "decode_codes element " << e << " scale " << p.scale;
      ASSERT_TRUE(same_float(got_row[e], want[e])) << "decode_row element " << e << " scale " << p.scale;
      ASSERT_TRUE(same_float(got_ch[e], want[e])) << "decode_row_channels element " << e << " scale " << p.scale;
    }
  }
}

template <class C>
class RandomRows : public ::testing::Test {};
using RowCodecs = ::testing::Types<Int8<Symmetric>, Int8<Asymmetric, MetaF32, Group<64>>, Int8<Symmetric, Group<8>>,
                                   Int4<Asymmetric>, Int4<Symmetric, Group<64>>, Int4<Asymmetric, MetaF32, Group<16>>,
                                   Fp8E4M3<>, Fp8E4M3<MetaF32, Group<16>>, Fp8E4M3<Group<8>>, Fp8E5M2<Group<128>>,
                                   Int3<Asymmetric>, Int2<Symmetric, Group<64>>>;
TYPED_TEST_SUITE(RandomRows, RowCodecs);

// Per-token rows of random code bytes (FP8 NaN codes included) whose groups each carry their own
// scale and zero-point, at several row lengths: the wide decoders (32 INT4 or 16 FP8 codes per
// load) must keep element order and pick each group's parameters.
TYPED_TEST(RandomRows, DecodeRowMatchesScalar) {
  KVTEST_REQUIRE_BACKEND(Simd);
  using C = TypeParam;
  constexpr int G = C::group_size;
  std::mt19937 rng(11);
  std::uniform_int_distribution<int> byte_of(0, 255);
  std::uniform_real_distribution<float> scale_of(0.01f, 4.f), zero_of(-8.f, 8.f);
  for (int n : {G, 2 * G, 3 * G, 64, 128, 320}) {
    if (n % G != 0) continue;
    const auto nz = static_cast<std::size_t>(n);
    std::vector<std::byte> codes(C::code_bytes(nz)), meta(row_meta_bytes<C>(nz));
    for (std::byte& b : codes) b = static_cast<std::byte>(byte_of(rng));
    for (int g = 0; g < n / G; ++g)
      C::store_params(GroupParams{scale_of(rng), zero_of(rng)}, meta.data() + g * C::meta_bytes_per_group);
    std::vector<float> want(nz), got(nz, -1.f), tmp(2 * nz + 8);
    kvpack::decode_row<C>(codes.data(), meta.data(), n, want.data());
    sc::decode_row<C>(codes.data(), meta.data(), n, got.data(), tmp.data());
    for (std::size_t e = 0; e < nz; ++e)
      ASSERT_TRUE(same_up_to_fma(got[e], want[e], 8.f)) << "n " << n << " element " << e;
  }
}

TEST(AllFp16Codes, DecodeRowMatchesScalar) {
  KVTEST_REQUIRE_BACKEND(Simd);
  std::vector<std::byte> codes(65536 * 2);
  for (std::uint32_t c = 0; c < 65536; ++c) {
    const auto h = static_cast<std::uint16_t>(c);
    std::memcpy(codes.data() + 2 * c, &h, 2);
  }
  std::vector<float> got(65536), tmp(16);
  sc::decode_row<Fp16>(codes.data(), nullptr, 65536, got.data(), tmp.data());
  for (std::uint32_t c = 0; c < 65536; ++c)
    ASSERT_TRUE(same_float(got[c], fp16_to_float(static_cast<std::uint16_t>(c)))) << "code " << c;
}

// Per-channel metadata of many channels, each with its own parameters.
template <class C>
void per_channel_random(int n, std::uint32_t seed) {
  std::mt19937 rng(seed);
  std::normal_distribution<float> nd(0.f, 3.f);
  constexpr int G = C::group_size;
  std::vector<float> x(static_cast<std::size_t>(G * n));
  for (float& v : x) v = nd(rng);
  const std::size_t row = C::code_bytes(static_cast<std::size_t>(n));
  std::vector<std::byte> codes(row * G), meta(static_cast<std::size_t>(n * C::meta_bytes_per_group));
  encode_channels<C>(x.data(), n, n, codes.data(), row, meta.data());
  std::vector<float> cs(static_cast<std::size_t>(n)), cz(static_cast<std::size_t>(n)),
      tmp(2 * static_cast<std::size_t>(n) + 8);
  sc::load_channel_params<C>(meta.data(), n, cs.data(), cz.data(), tmp.data());
  std::vector<float> want(static_cast<std::size_t>(n)), got(static_cast<std::size_t>(n));
  for (int r = 0; r < G; ++r) {
    decode_row_channels<C>(codes.data() + static_cast<std::size_t>(r) * row, meta.data(), n, want.data());
    sc::decode_row_channels<C>(codes.data() + static_cast<std::size_t>(r) * row, cs.data(), cz.data(), n, got.data());
    for (int c = 0; c < n; ++c)
      ASSERT_TRUE(same_float(got[static_cast<std::size_t>(c)], want[static_cast<std::size_t>(c)]))
          << "row " << r << " channel " << c;
  }
}

TEST(PerChannel, RandomGroupsMatchScalar) {
  KVTEST_REQUIRE_BACKEND(Simd);
  for (int n : {8, 36, 72, 96, 128, 130, 200}) {
    SCOPED_TRACE("channels " + std::to_string(n));
    per_channel_random<Int4<>>(n, 1);
    per_channel_random<Int4<Symmetric, MetaF32, Group<16>>>(n, 2);
    per_channel_random<Int8<Asymmetric, Group<64>>>(n, 3);
    per_channel_random<Int8<Symmetric, MetaF32>>(n, 4);
    per_channel_random<Fp8E4M3<>>(n, 5);
    per_channel_random<Fp8E5M2<MetaF32, Group<8>>>(n, 6);
    per_channel_random<Int3<>>(n, 7);
    per_channel_random<Int2<Symmetric, MetaF32, Group<16>>>(n, 8);
    per_channel_random<Int2<>>(n, 9);
  }
}

template <class C>
class Quantizer : public ::testing::Test {};
using IntCodecs = ::testing::Types<Int4<Symmetric>, Int4<Asymmetric>, Int8<Symmetric>, Int8<Asymmetric>,
                                   Int4<Symmetric, MetaF32, Group<8>>, Int8<Asymmetric, MetaF32, Group<128>>,
                                   Int4<Asymmetric, Group<256>>, Int3<Asymmetric>, Int3<Symmetric, Group<8>>,
                                   Int2<Asymmetric>, Int2<Symmetric, MetaF32, Group<64>>>;
TYPED_TEST_SUITE(Quantizer, IntCodecs);

// CASES C4: 4096 values (k + 0.5) * scale + zero, k from qmin - 2 to qmax + 1: exact ties inside
// the range (to even) and beyond both ends (clamped); the SIMD codes equal the scalar codes and
// the float64 rule.
TYPED_TEST(Quantizer, TiesBitIdenticalToScalarOn4096Values) {
  KVTEST_REQUIRE_BACKEND(Simd);
  using C = TypeParam;
  constexpr int kN = 4096, kG = 32;
  const float scales[] = {1.f, 0.25f, 3.f, 0.0078125f, 1.5f, 96.f, 0.0999755859375f, 1000.f};
  const float zeros[] = {0.f, -3.f, 2.5f, -64.f};
  const int span = C::qmax - C::qmin + 4;
  std::vector<float> x(kN);
  std::vector<std::byte> want(C::code_bytes(kN)), got(C::code_bytes(kN), std::byte{0x5A});
  int up = 0, down = 0;
  for (int g = 0; g < kN / kG; ++g) {
    const float s = scales[g % 8];
    const float z = C::asymmetric ? zeros[(g / 8) % 4] * s : 0.f;
    for (int i = 0; i < kG; ++i) {
      const int j = g * kG + i;
      const int k = C::qmin - 2 + (j * 7 + g) % span;
      const double t = k + 0.5;
      x[static_cast<std::size_t>(j)] = static_cast<float>(z + t * s);
      ASSERT_EQ(static_cast<double>(x[static_cast<std::size_t>(j)]) - z, t * s) << "test input not exact";
      // float64 rule: round half to even, then clamp.
      double q = std::nearbyint(t);  // default rounding mode: to nearest, ties to even
      q = std::min<double>(std::max<double>(q, C::qmin), C::qmax);
      if (t > C::qmin && t < C::qmax) (q > t ? up : down)++;
      C::store_code(want.data(), static_cast<std::size_t>(j), C::to_stored(static_cast<int>(q)));
    }
    sc::encode_codes<C>(x.data() + g * kG, kG, GroupParams{s, z},
                        got.data() + C::code_bytes(static_cast<std::size_t>(g * kG)));
  }
  EXPECT_EQ(got, want);
  EXPECT_GT(up, 100);
  EXPECT_GT(down, 100);
  // And the scalar codec agrees with the same float64 rule.
  std::vector<std::byte> scalar(C::code_bytes(kN));
  for (int g = 0; g < kN / kG; ++g) {
    const float s = scales[g % 8];
    const GroupParams p{s, C::asymmetric ? zeros[(g / 8) % 4] * s : 0.f};
    for (int i = 0; i < kG; ++i)
      C::store_code(scalar.data(), static_cast<std::size_t>(g * kG + i),
                    C::encode_value(x[static_cast<std::size_t>(g * kG + i)], p));
  }
  EXPECT_EQ(scalar, want);
}

// Random rows with outliers, constant and all-zero groups, huge and tiny magnitudes: encode_row's
// codes and metadata bytes, bit for bit.
TYPED_TEST(Quantizer, EncodeRowBitIdenticalToScalar) {
  KVTEST_REQUIRE_BACKEND(Simd);
  using C = TypeParam;
  constexpr int G = C::group_size;
  std::mt19937 rng(42);
  std::normal_distribution<float> nd(0.f, 1.f);
  for (int n : {G, 2 * G, 512}) {
    if (n % G != 0) continue;
    for (int trial = 0; trial < 40; ++trial) {
      std::vector<float> x(static_cast<std::size_t>(n));
      const float mag = std::ldexp(1.f, trial % 20 * 3 - 30);
      for (float& v : x) v = nd(rng) * mag;
      if (trial % 5 == 1) x[static_cast<std::size_t>(trial) % x.size()] = -125000.f;  // beyond fp16 (C1)
      if (trial % 5 == 2) std::fill_n(x.begin(), G, 100.f);                         // constant group (C2)
      if (trial % 5 == 3) std::fill_n(x.begin(), G, 0.f);                           // all-zero group
      if (trial % 5 == 4) std::fill_n(x.begin(), G, -3.5f);
      std::vector<std::byte> c1(C::code_bytes(x.size())), c2(c1.size(), std::byte{0xA5});
      std::vector<std::byte> m1(row_meta_bytes<C>(x.size())), m2(m1.size(), std::byte{0xA5});
      kvpack::encode_row<C>(x.data(), n, c1.data(), m1.data());
      sc::encode_row<C>(x.data(), n, c2.data(), m2.data());
      ASSERT_EQ(c2, c1) << "codes, n=" << n << " trial " << trial;
      ASSERT_EQ(m2, m1) << "metadata, n=" << n << " trial " << trial;
    }
  }
}
#endif  // KVPACK_HAS_AVX2 || KVPACK_HAS_NEON

TEST(BackendCodes, SimdCodesCompiledWhereExpected) {
#if defined(KVPACK_TEST_EXPECT_AVX2) || defined(KVPACK_EXPECTED_SIMD_AVX2)
  EXPECT_TRUE(KVPACK_HAS_AVX2) << "this test build was configured for AVX2 but the AVX2 codes are not compiled in";
#elif defined(__aarch64__)
  EXPECT_TRUE(KVPACK_HAS_NEON) << "AArch64 build without the NEON codes";
#else
  GTEST_SKIP() << "no SIMD backend expected for this build (" << Simd::name << ")";
#endif
}

}  // namespace
