// CASES C4: rounding, clamping and nibble order of the integer codecs.
//
//  * round half to even at scale exactly 1 (INT4 symmetric);
//  * out-of-range values clamp to the code range, never wrap (INT4 and INT8, both modes);
//  * known-answer tests of the packed byte layout (INT4: element 2i in the LOW nibble of byte i,
//    stored as q + 8 symmetric / q asymmetric; INT8: two's complement / unsigned), through
//    store_code and through encode_row (metadata bytes included);
//  * 4096 values of the form (k + 0.5) * scale: codes equal a float64 round-half-even reference;
//  * the unpacker agrees with a float64 reference on all 256 byte values.
//
// Backends: every test is typed over `Backends`: the scalar reference (the row functions of
// kvpack/codec/rows.hpp and the codecs' value functions) and the SIMD codes of this build
// (kvtest::SimdCodes: the AVX2 or NEON quantizer and unpacker), from which every test below
// demands bit-identical codes. CUDA adds its own struct when its host-callable paths exist.
#include <gtest/gtest.h>

#include <array>
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <string>
#include <vector>

#include "kvpack/codec/int_codec.hpp"
#include "kvpack/codec/rows.hpp"
#include "support/backends.hpp"
#include "support/codec_ref.hpp"

namespace {

using namespace kvpack;  // NOLINT: test file
namespace ref = kvpack::codec_ref;

/// Scalar reference backend.
///  encode: n values -> packed codes, all under the one GroupParams p (no derivation);
///  decode: packed codes -> n values under p;
///  encode_row / decode_row: per-token rows with derived, stored metadata.
struct ScalarBackend {
  static constexpr const char* name = "scalar";
  template <class C>
  static void encode(const float* x, std::size_t n, GroupParams p, std::byte* codes) {
    for (std::size_t i = 0; i < n; ++i) C::store_code(codes, i, C::encode_value(x[i], p));
  }
  template <class C>
  static void decode(const std::byte* codes, std::size_t n, GroupParams p, float* out) {
    for (std::size_t i = 0; i < n; ++i) out[i] = C::decode_value(C::load_code(codes, i), p);
  }
  template <class C>
  static void encode_row(const float* x, int n, std::byte* codes, std::byte* meta) {
    kvpack::encode_row<C>(x, n, codes, meta);
  }
  template <class C>
  static void decode_row(const std::byte* codes, const std::byte* meta, int n, float* out) {
    kvpack::decode_row<C>(codes, meta, n, out);
  }
};

// The SIMD backend of this build (AVX2 or NEON codes, tests/support/backends.hpp), if any.
#if KVPACK_HAS_AVX2 || KVPACK_HAS_NEON
using Backends = ::testing::Types<ScalarBackend, kvtest::SimdCodes>;
#else
using Backends = ::testing::Types<ScalarBackend>;
#endif
struct BackendNames {
  template <class B>
  static std::string GetName(int) {
    return B::name;
  }
};

template <class B>
class C4Rounding : public ::testing::Test {};
TYPED_TEST_SUITE(C4Rounding, Backends, BackendNames);

using I4S = Int4<Symmetric>;
using I4A = Int4<Asymmetric>;
using I8S = Int8<Symmetric>;
using I8A = Int8<Asymmetric>;

// --- float64 references ------------------------------------------------------------------------

/// Integer level of x under (scale, zero) for a codec with range [qmin, qmax]: float64 division,
/// round half to even, clamp.
int ref_level(double x, double scale, double zero, int qmin, int qmax) {
  const double q = ref::rne((x - zero) / scale);
  return static_cast<int>(q < qmin ? qmin : (q > qmax ? qmax : q));
}
/// Stored form of a level, written from the layout description (not from the codec).
template <class C>
unsigned ref_stored(int q) {
  if (C::bits == 4) return static_cast<unsigned>(C::asymmetric ? q : q + 8);
  return static_cast<unsigned>(q) & 0xFFu;  // INT8: two's complement (sym) or unsigned (asym)
}
/// Level of a stored code, written from the layout description.
template <class C>
int ref_level_of_stored(unsigned u) {
  if (C::bits == 4) return C::asymmetric ? static_cast<int>(u) : static_cast<int>(u) - 8;
  return C::asymmetric ? static_cast<int>(u) : (u < 128 ? static_cast<int>(u) : static_cast<int>(u) - 256);
}
/// Packs stored codes: INT4 element 2i in the low nibble of byte i, 2i + 1 in the high nibble.
template <class C>
std::vector<std::uint8_t> ref_pack(const std::vector<unsigned>& u) {
  if (C::bits == 8) return {u.begin(), u.end()};
  std::vector<std::uint8_t> b(u.size() / 2);
  for (std::size_t i = 0; i < b.size(); ++i) b[i] = static_cast<std::uint8_t>(u[2 * i] | (u[2 * i + 1] << 4));
  return b;
}

std::vector<std::uint8_t> bytes_of(const std::vector<std::byte>& v) {
  std::vector<std::uint8_t> o(v.size());
  std::memcpy(o.data(), v.data(), v.size());
  return o;
}

/// Levels of x under p through the backend's packed codes (INT4: x.size() even, codes pack in pairs).
template <class B, class C>
std::vector<int> levels(const std::vector<float>& x, GroupParams p) {
  EXPECT_TRUE(C::bits == 8 || x.size() % 2 == 0) << "INT4 test input needs an even count";
  std::vector<std::byte> codes(C::code_bytes(x.size()));
  B::template encode<C>(x.data(), x.size(), p, codes.data());
  std::vector<int> q(x.size());
  for (std::size_t i = 0; i < x.size(); ++i) q[i] = C::from_stored(C::load_code(codes.data(), i));
  return q;
}

// --- round half to even ------------------------------------------------------------------------

TYPED_TEST(C4Rounding, Int4SymmetricScaleOneRoundsHalfToEven) {
  const std::vector<float> x = {0.5f, 1.5f, 2.5f, -0.5f, -1.5f, -2.5f, 6.5f, 3.5f, -3.5f, -7.5f};
  const std::vector<int> want = {0, 2, 2, 0, -2, -2, 6, 4, -4, -8};
  const GroupParams one{1.f, 0.f};
  // The codec's own level function, and the backend's packed codes.
  for (std::size_t i = 0; i < x.size(); ++i) EXPECT_EQ(I4S::quantize(x[i], one), want[i]) << "x = " << x[i];
  EXPECT_EQ((levels<TypeParam, I4S>(x, one)), want);
  // Non-ties next to the ties round to nearest (no truncation, no round-half-up).
  const std::vector<float> near = {0.49f, 0.51f, 1.49f, -1.51f, 2.51f, -0.51f};
  EXPECT_EQ((levels<TypeParam, I4S>(near, one)), (std::vector<int>{0, 1, 1, -2, 3, -1}));
}

TYPED_TEST(C4Rounding, Int8AndAsymmetricRoundHalfToEven) {
  const GroupParams one{1.f, 0.f};
  EXPECT_EQ((levels<TypeParam, I8S>({0.5f, 1.5f, 2.5f, -0.5f, -1.5f, -2.5f, 126.5f, -127.5f}, one)),
            (std::vector<int>{0, 2, 2, 0, -2, -2, 126, -128}));
  // Asymmetric: the tie is in (x - zero) / scale.
  const GroupParams z{1.f, -10.f};
  EXPECT_EQ((levels<TypeParam, I4A>({-9.5f, -8.5f, -7.5f, 4.5f}, z)), (std::vector<int>{0, 2, 2, 14}));
  EXPECT_EQ((levels<TypeParam, I8A>({-9.5f, -8.5f, 243.5f, 244.5f}, z)), (std::vector<int>{0, 2, 254, 254}));
}

// --- clamping ----------------------------------------------------------------------------------

TYPED_TEST(C4Rounding, OutOfRangeClampsNeverWraps) {
  const GroupParams one{1.f, 0.f};
  EXPECT_EQ((levels<TypeParam, I4S>({9.7f, -12.f, 7.5f, 8.f, -8.5f, 1e30f, -1e30f, 16.f, -17.f, -9.f}, one)),
            (std::vector<int>{7, -8, 7, 7, -8, 7, -8, 7, -8, -8}));
  EXPECT_EQ((levels<TypeParam, I8S>({300.f, -300.f, 127.5f, 128.f, -128.5f, -129.f, 1e30f, -1e30f, 256.f, -257.f}, one)),
            (std::vector<int>{127, -128, 127, 127, -128, -128, 127, -128, 127, -128}));
  EXPECT_EQ((levels<TypeParam, I4A>({20.f, -3.f, 15.5f, 16.f, -0.5f, 1e30f, -1e30f, 100.f}, one)),
            (std::vector<int>{15, 0, 15, 15, 0, 15, 0, 15}));
  EXPECT_EQ((levels<TypeParam, I8A>({300.f, -3.f, 255.5f, 256.f, -0.5f, 1e30f, -1e30f}, one)),
            (std::vector<int>{255, 0, 255, 255, 0, 255, 0}));
  // A fixed scale other than 1: 9.7 / 0.5 = 19.4 -> 7; -12 / 0.5 = -24 -> -8.
  EXPECT_EQ((levels<TypeParam, I4S>({9.7f, -12.f}, GroupParams{0.5f, 0.f})), (std::vector<int>{7, -8}));
  // Stored codes of the clamped extremes are the end codes: no wrap into the other end.
  std::vector<std::byte> c(1);
  const std::vector<float> ends = {9.7f, -12.f};
  TypeParam::template encode<I4S>(ends.data(), 2, one, c.data());
  EXPECT_EQ(std::to_integer<unsigned>(c[0]), 0x0Fu);  // 7 + 8 = 0xF low, -8 + 8 = 0 high
  std::vector<std::byte> c8(2);
  const std::vector<float> ends8 = {300.f, -300.f};
  TypeParam::template encode<I8S>(ends8.data(), 2, one, c8.data());
  EXPECT_EQ(bytes_of(c8), (std::vector<std::uint8_t>{0x7F, 0x80}));
}

// --- packed byte layout ------------------------------------------------------------------------

TEST(C4Packing, Int4StoreCodeKnownAnswer) {
  // Codes [1, 2, 3, 4] stored as q + 8 = [9, 10, 11, 12]; even element in the low nibble.
  for (std::uint8_t fill : {std::uint8_t{0x00}, std::uint8_t{0xFF}, std::uint8_t{0x5A}}) {
    std::array<std::byte, 2> b{std::byte{fill}, std::byte{fill}};
    for (int q : {1, 2, 3, 4}) I4S::store_code(b.data(), static_cast<std::size_t>(q - 1), I4S::to_stored(q));
    EXPECT_EQ(std::to_integer<unsigned>(b[0]), 0xA9u) << "fill " << int{fill};
    EXPECT_EQ(std::to_integer<unsigned>(b[1]), 0xCBu) << "fill " << int{fill};
    // Storing in reverse order gives the same bytes (each store replaces only its own nibble).
    std::array<std::byte, 2> r{std::byte{fill}, std::byte{fill}};
    for (int q : {4, 3, 2, 1}) I4S::store_code(r.data(), static_cast<std::size_t>(q - 1), I4S::to_stored(q));
    EXPECT_EQ(r, b);
    for (int q : {1, 2, 3, 4}) EXPECT_EQ(I4S::from_stored(I4S::load_code(b.data(), static_cast<std::size_t>(q - 1))), q);
  }
}

TYPED_TEST(C4Rounding, EncodeRowKnownAnswerBytes) {
  // INT4 symmetric, fp16 metadata: amax 7 -> scale 7 / 7 = 1 exactly (fp16 0x3C00).
  {
    std::vector<float> x(32, 0.f);
    x[0] = 1, x[1] = 2, x[2] = 3, x[3] = 4, x[4] = 7, x[5] = -7, x[6] = -1;
    std::vector<std::byte> codes(16), meta(2);
    TypeParam::template encode_row<I4S>(x.data(), 32, codes.data(), meta.data());
    std::vector<std::uint8_t> want(16, 0x88);  // 0 -> stored 8 in both nibbles
    want[0] = 0xA9, want[1] = 0xCB, want[2] = 0x1F, want[3] = 0x87;  // (7+8, -7+8), (-1+8, 0+8)
    EXPECT_EQ(bytes_of(codes), want);
    EXPECT_EQ(bytes_of(meta), (std::vector<std::uint8_t>{0x00, 0x3C}));
  }
  // INT4 asymmetric, fp32 metadata: min 0, max 15 -> zero 0, scale 1; stored q, no offset.
  {
    std::vector<float> x(32, 0.f);
    x[0] = 1, x[1] = 2, x[2] = 3, x[3] = 4, x[4] = 15;
    std::vector<std::byte> codes(16), meta(8);
    TypeParam::template encode_row<Int4<Asymmetric, MetaF32>>(x.data(), 32, codes.data(), meta.data());
    std::vector<std::uint8_t> want(16, 0x00);
    want[0] = 0x21, want[1] = 0x43, want[2] = 0x0F;
    EXPECT_EQ(bytes_of(codes), want);
    // scale 1.0f = 0x3F800000, zero 0.0f, little-endian.
    EXPECT_EQ(bytes_of(meta), (std::vector<std::uint8_t>{0x00, 0x00, 0x80, 0x3F, 0x00, 0x00, 0x00, 0x00}));
  }
  // INT8 symmetric: two's complement bytes; amax 127 -> scale 1.
  {
    std::vector<float> x(32, 0.f);
    x[0] = 1, x[1] = -1, x[2] = 127, x[3] = -127, x[4] = -2;
    std::vector<std::byte> codes(32), meta(2);
    TypeParam::template encode_row<I8S>(x.data(), 32, codes.data(), meta.data());
    std::vector<std::uint8_t> want(32, 0x00);
    want[0] = 0x01, want[1] = 0xFF, want[2] = 0x7F, want[3] = 0x81, want[4] = 0xFE;
    EXPECT_EQ(bytes_of(codes), want);
    EXPECT_EQ(bytes_of(meta), (std::vector<std::uint8_t>{0x00, 0x3C}));
  }
  // INT8 asymmetric, fp16 metadata: min -10, max 245 -> zero -10 (0xC900), scale 1.
  {
    std::vector<float> x(32, 0.f);
    x[0] = -10, x[1] = 245, x[2] = -9, x[3] = 0;
    std::vector<std::byte> codes(32), meta(4);
    TypeParam::template encode_row<I8A>(x.data(), 32, codes.data(), meta.data());
    std::vector<std::uint8_t> want(32, 10);  // 0 -> level 10
    want[0] = 0, want[1] = 255, want[2] = 1;
    EXPECT_EQ(bytes_of(codes), want);
    EXPECT_EQ(bytes_of(meta), (std::vector<std::uint8_t>{0x00, 0x3C, 0x00, 0xC9}));
  }
}

// --- 4096 ties against the float64 reference ---------------------------------------------------

/// 4096 values (k + 0.5) * scale + zero: k cycles through [qmin - 2, qmax + 1] (ties inside the
/// range and beyond both ends), one (scale, zero) per group of 32 values. Every product and sum is
/// exact in fp32 (scale has <= 11 significant bits, k + 0.5 <= 10), so (x - zero) / scale is
/// exactly the tie k + 0.5 and any correct backend must break it to the even level.
template <class B, class C>
void ties_match_reference() {
  constexpr int kN = 4096, kG = 32;
  const float scales[] = {1.f, 0.25f, 3.f, 0.0078125f, 1.5f, 96.f, 0.099975586f /* fp16(0.1) */, 1000.f};
  const float zeros[] = {0.f, -3.f, 2.5f, -64.f};
  const int span = C::qmax - C::qmin + 4;
  std::vector<float> x(kN);
  std::vector<unsigned> want(kN);
  std::vector<std::byte> codes(C::code_bytes(kN));
  std::vector<std::byte> got_group(C::code_bytes(kG));
  int ties_up = 0, ties_down = 0;
  for (int g = 0; g < kN / kG; ++g) {
    const float s = scales[g % 8];
    const float z = C::asymmetric ? zeros[(g / 8) % 4] * s : 0.f;
    for (int i = 0; i < kG; ++i) {
      const int j = g * kG + i;
      const int k = C::qmin - 2 + (j * 7 + g) % span;
      const double t = k + 0.5;
      x[static_cast<std::size_t>(j)] = static_cast<float>(z + t * s);
      ASSERT_EQ(static_cast<double>(x[static_cast<std::size_t>(j)]) - z, t * s) << "test input not exact";
      const int q = ref_level(x[static_cast<std::size_t>(j)], s, z, C::qmin, C::qmax);
      if (t > C::qmin && t < C::qmax) (q > t ? ties_up : ties_down)++;
      want[static_cast<std::size_t>(j)] = ref_stored<C>(q);
    }
    B::template encode<C>(x.data() + g * kG, kG, GroupParams{s, z}, got_group.data());
    std::memcpy(codes.data() + C::code_bytes(static_cast<std::size_t>(g * kG)), got_group.data(), got_group.size());
  }
  EXPECT_EQ(bytes_of(codes), ref_pack<C>(want));
  // Both tie directions occur (round half to even, not half up / half down / away).
  EXPECT_GT(ties_up, 100);
  EXPECT_GT(ties_down, 100);
}

TYPED_TEST(C4Rounding, TiesMatchFloat64ReferenceInt4Symmetric) { ties_match_reference<TypeParam, I4S>(); }
TYPED_TEST(C4Rounding, TiesMatchFloat64ReferenceInt4Asymmetric) { ties_match_reference<TypeParam, I4A>(); }
TYPED_TEST(C4Rounding, TiesMatchFloat64ReferenceInt8Symmetric) { ties_match_reference<TypeParam, I8S>(); }
TYPED_TEST(C4Rounding, TiesMatchFloat64ReferenceInt8Asymmetric) { ties_match_reference<TypeParam, I8A>(); }

// --- unpacker on all 256 byte values -----------------------------------------------------------

/// Decodes the 256 bytes 0x00..0xFF as codes under (scale 0.75, zero -2.5) through the backend's
/// decode and through decode_row (metadata as stored), and compares with the layout reference.
/// Every reference value is exact in fp32, so equality is exact. Also re-encodes the decoded
/// values and expects the original bytes back.
template <class B, class C>
void unpacker_matches_reference() {
  std::vector<std::byte> bytes(256);
  for (int i = 0; i < 256; ++i) bytes[static_cast<std::size_t>(i)] = static_cast<std::byte>(i);
  const std::size_t n = C::bits == 4 ? 512 : 256;
  const GroupParams p{0.75f, C::asymmetric ? -2.5f : 0.f};
  std::vector<float> want(n);
  for (std::size_t e = 0; e < n; ++e) {
    const unsigned b = static_cast<unsigned>(e / (C::bits == 4 ? 2 : 1));
    const unsigned u = C::bits == 4 ? (e % 2 == 0 ? (b & 0xFu) : (b >> 4)) : b;
    want[e] = static_cast<float>(p.zero + 0.75 * ref_level_of_stored<C>(u));
  }
  std::vector<float> got(n);
  B::template decode<C>(bytes.data(), n, p, got.data());
  EXPECT_EQ(got, want);

  std::vector<std::byte> meta(row_meta_bytes<C>(n));
  for (std::size_t g = 0; g < n / C::group_size; ++g) C::store_params(p, meta.data() + g * C::meta_bytes_per_group);
  std::vector<float> got_row(n);
  B::template decode_row<C>(bytes.data(), meta.data(), static_cast<int>(n), got_row.data());
  EXPECT_EQ(got_row, want);

  std::vector<std::byte> again(256);
  B::template encode<C>(got.data(), n, p, again.data());
  EXPECT_EQ(bytes_of(again), bytes_of(bytes));
}

TYPED_TEST(C4Rounding, UnpackerAll256BytesInt4Symmetric) { unpacker_matches_reference<TypeParam, I4S>(); }
TYPED_TEST(C4Rounding, UnpackerAll256BytesInt4Asymmetric) { unpacker_matches_reference<TypeParam, I4A>(); }
TYPED_TEST(C4Rounding, UnpackerAll256BytesInt8Symmetric) { unpacker_matches_reference<TypeParam, I8S>(); }
TYPED_TEST(C4Rounding, UnpackerAll256BytesInt8Asymmetric) { unpacker_matches_reference<TypeParam, I8A>(); }

}  // namespace
