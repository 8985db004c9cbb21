// INT3 and INT2 codecs (codec/int_lowbit.hpp, issue 20):
//  * the packed layout as documented: INT3 = 8 codes in 3 bytes (element j of a triple at bits
//    3j of its 24-bit little-endian word), INT2 = 4 codes per byte, element 4i + j at bits 2j;
//    store_code leaves every other element untouched; code_bytes and bits_per_value;
//  * format descriptors tell INT2, INT3 and INT4 apart (offload record headers);
//  * attention of a whole cache (Backend<Scalar> and the build's best backend; per-token and
//    per-channel keys, KIVI-2 style) against the float64 reference run on the EXACT inputs, at
//    1, 31, 33 and 95 past tokens plus one decode token, within a bound derived from the codec's
//    error: keys and values off by at most half a step (step bounded from each group's range),
//    so every logit moves by at most E = scale * Σ_d |q_d| Δk_d and each output channel by at most
//    max_t Δv_t + (e^{2E} - 1) * max_t |v_t - o| (the softmax weights move by a factor within
//    e^{±2E}). Codes round-trip bounds are in test_codec_roundtrip.cpp, SIMD bit-identity in
//    test_backend_codes.cpp / test_cache_simd_encode.cpp, kernel-vs-float64 on the dequantized
//    K/V in test_backend_kernels.cpp / test_attention_vs_ref64.cpp.
#include <gtest/gtest.h>

#include <algorithm>
#include <cfloat>
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

static_assert(Int3<>::code_bytes(8) == 3 && Int3<>::code_bytes(64) == 24 && Int3<>::code_bytes(3) == 2);
static_assert(Int2<>::code_bytes(4) == 1 && Int2<>::code_bytes(64) == 16 && Int2<>::code_bytes(5) == 2);
static_assert(Int2<>::bits_per_value == 3.0 && Int3<>::bits_per_value == 4.0);
static_assert(Int2<Group<64>>::bits_per_value == 2.5 && Int3<Group<128>>::bits_per_value == 3.25);
static_assert(Int2<>::qmin == 0 && Int2<>::qmax == 3 && Int3<>::qmax == 7);
static_assert(Int2<Symmetric>::qmin == -2 && Int2<Symmetric>::qmax == 1 && Int3<Symmetric>::qmin == -4);

TEST(IntLowbitLayout, Int3PacksEightCodesInThreeBytes) {
  using C = Int3<>;
  std::vector<std::byte> row(C::code_bytes(16), std::byte{0});
  for (unsigned j = 0; j < 8; ++j) C::store_code(row.data(), j, j);        // word 0xFAC688
  for (unsigned j = 0; j < 8; ++j) C::store_code(row.data(), 8 + j, 7 - j);  // reversed
  const std::uint8_t want[6] = {0x88, 0xC6, 0xFA, 0x77, 0x39, 0x05};
  for (int i = 0; i < 6; ++i) EXPECT_EQ(static_cast<unsigned>(row[static_cast<std::size_t>(i)]), want[i]) << "byte " << i;
  for (unsigned j = 0; j < 8; ++j) {
    EXPECT_EQ(C::load_code(row.data(), j), j);
    EXPECT_EQ(C::load_code(row.data(), 8 + j), 7 - j);
  }
}

TEST(IntLowbitLayout, Int2PacksFourCodesPerByte) {
  using C = Int2<>;
  std::vector<std::byte> row(2, std::byte{0});
  for (unsigned j = 0; j < 8; ++j) C::store_code(row.data(), j, j % 4 == 0 ? 3u : j % 4 - 1);
  // elements 0..3 = 3, 0, 1, 2 -> 0b10'01'00'11
  EXPECT_EQ(static_cast<unsigned>(row[0]), 0x93u);
  EXPECT_EQ(static_cast<unsigned>(row[1]), 0x93u);
}

// Overwriting one code (every position, every value) changes that code only, including INT3 codes
// that straddle two bytes.
template <class C>
void store_keeps_neighbours() {
  constexpr unsigned levels = 1u << C::bits;
  const std::size_t n = 48;
  std::vector<unsigned> codes(n);
  std::vector<std::byte> row(C::code_bytes(n) + 1, std::byte{0xA5});  // the byte past the row must stay
  for (std::size_t i = 0; i < n; ++i) {
    codes[i] = static_cast<unsigned>((i * 5 + 3) % levels);
    C::store_code(row.data(), i, codes[i]);
  }
  for (std::size_t i = 0; i < n; ++i)
    for (unsigned u = 0; u < levels; ++u) {
      C::store_code(row.data(), i, u);
      codes[i] = u;
      for (std::size_t k = 0; k < n; ++k) ASSERT_EQ(C::load_code(row.data(), k), codes[k]) << "wrote " << i << " read " << k;
      ASSERT_EQ(row.back(), std::byte{0xA5});
    }
}

TEST(IntLowbitLayout, StoreCodeKeepsNeighbours) {
  store_keeps_neighbours<Int3<>>();
  store_keeps_neighbours<Int2<>>();
  store_keeps_neighbours<Int4<>>();
}

TEST(IntLowbitFormat, DescriptorsDistinguishBitWidths) {
  EXPECT_NE(codec_descriptor<Int2<>>(), codec_descriptor<Int3<>>());
  EXPECT_NE(codec_descriptor<Int3<>>(), codec_descriptor<Int4<>>());
  EXPECT_EQ(codec_descriptor<Int2<>>() >> 8, 2);
  EXPECT_EQ(codec_descriptor<Int3<>>() >> 8, 3);
  EXPECT_NE((codec_format_id<Int2<>, Int2<>>()), (codec_format_id<Int2<>, Int3<>>()));
}

// ---- attention vs float64 on the exact inputs, within the codec's error ----

template <class Cache>
class LowbitAttention : public ::testing::Test {};

using LowbitCaches = ::testing::Types<
    KVCache<Keys<Int2<Group<32>>, PerChannel>, Values<Int2<Group<32>>>, Backend<Scalar>>,
    KVCache<Keys<Int2<Group<32>>, PerChannel>, Values<Int2<Group<32>>>>,
    KVCache<Keys<Int3<Group<32>>, PerChannel>, Values<Int3<Group<32>>>, Residual<8>>,
    KVCache<Keys<Int3<Group<32>>>, Values<Int3<Group<32>>>, Backend<Scalar>>,
    KVCache<Keys<Int3<Group<32>>>, Values<Int2<Group<64>>>>,
    KVCache<Keys<Int2<Group<32>, Symmetric>>, Values<Int3<Group<32>, MetaF32>>, Sinks<2>>>;
TYPED_TEST_SUITE(LowbitAttention, LowbitCaches);

TYPED_TEST(LowbitAttention, DecodeWithinCodecErrorOfExactFloat64) {
  using Cache = TypeParam;
  using KC = typename Cache::key_codec;
  using VC = typename Cache::value_codec;
  constexpr bool kpc = Cache::keys_per_channel;
  for (int D : {64, 128}) {
    for (int n : {1, 31, 33, 95}) {
      SCOPED_TRACE("D=" + std::to_string(D) + " past=" + std::to_string(n));
      const int H = 2, QH = 4;
      const ModelShape shape{.layers = 1, .q_heads = QH, .kv_heads = H, .head_dim = D, .max_tokens = 256};
      kvtest::Harness<Cache> h(shape);
      const auto seed = static_cast<std::uint32_t>(n * 7 + D);
      h.append(0, kvtest::normal(static_cast<std::size_t>(n) * h.row(), seed),
               kvtest::normal(static_cast<std::size_t>(n) * h.row(), seed + 1));
      h.append(0, kvtest::normal(h.row(), seed + 2), kvtest::normal(h.row(), seed + 3));  // decode token
      const std::int64_t T = h.tokens();
      const std::vector<float> q = kvtest::normal(h.qrow(), seed + 4, 0.25f);  // E stays O(1) at 2 bits
      std::vector<float> out(q.size());
      ASSERT_TRUE(h.cache().attend(0, q, out));
      const auto& ek = h.exact_k();
      const auto& ev = h.exact_v();
      const std::vector<double> K(ek.begin(), ek.end()), V(ev.begin(), ev.end());
      const double scale = 1.0 / std::sqrt(static_cast<double>(D));
      const auto ref = kvtest::attention_ref64(K, V, T, q, 1, QH, H, D, scale, T - 1);
      // Per-element error bounds dk[t][h][d], dv[t][h][d] from the groups the codec forms.
      namespace cr = kvpack::codec_ref;
      const auto dk = cr::group_bounds<KC>(K, T, H, D, kpc, [](double lo, double hi) { return cr::int_error_bound<KC>(lo, hi); });
      const auto dv = cr::group_bounds<VC>(V, T, H, D, false, [](double lo, double hi) { return cr::int_error_bound<VC>(lo, hi); });
      auto at = [&](std::int64_t t, int kh, int d) { return (static_cast<std::size_t>(t) * H + kh) * D + d; };
      double worst_err = 0;
      for (int qh = 0; qh < QH; ++qh) {
        const int kh = qh / (QH / H);
        const float* qr = q.data() + static_cast<std::size_t>(qh) * D;
        const double* o = ref.data() + static_cast<std::size_t>(qh) * D;
        double E = 0;
        for (std::int64_t t = 0; t < T; ++t) {
          double e = 0;
          for (int d = 0; d < D; ++d) e += std::abs(static_cast<double>(qr[d])) * dk[at(t, kh, d)];
          E = std::max(E, e * scale);
        }
        for (int d = 0; d < D; ++d) {
          double dvmax = 0, spread = 0, vmax = 0;
          for (std::int64_t t = 0; t < T; ++t) {
            dvmax = std::max(dvmax, dv[at(t, kh, d)]);
            spread = std::max(spread, std::abs(V[at(t, kh, d)] - o[d]));
            vmax = std::max(vmax, std::abs(V[at(t, kh, d)]));
          }
          const double bound = dvmax + (std::exp(2 * E) - 1) * spread + 1e-5 * vmax;
          const double err = std::abs(static_cast<double>(out[static_cast<std::size_t>(qh) * D + d]) - o[d]);
          ASSERT_LE(err, bound) << "query head " << qh << " channel " << d << " (E = " << E << ")";
          worst_err = std::max(worst_err, err);
        }
      }
      // Quantization must show once some tokens are quantized (a cache that kept everything in
      // fp32 would meet the bound trivially); the tight check of the kernels (1e-5 against float64
      // on the dequantized K/V) is test_backend_kernels / test_attention_vs_ref64.
      if (h.cache().quantized_tokens(0) > 0) {
        EXPECT_GT(worst_err, 1e-4);
      }
    }
  }
}

}  // namespace
