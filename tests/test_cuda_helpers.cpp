// The __host__ __device__ helpers of the CUDA kernels (kernels/cuda/helpers.cuh), compiled as
// plain C++ by g++ and clang++ and checked on the host, where no GPU is needed:
//  * unpacking and dequantization of every byte value of every supported codec (INT8 and INT4,
//    symmetric and asymmetric, FP8 E4M3FN and E5M2; fp16 and fp32 metadata) against a float64
//    reference and the host codecs;
//  * the device quantizer (quantize_group / quantize_row) against the host encode_row<C>, bit for
//    bit, on CASES C4's ties and clamps, its nibble-order known answer, 4096 values k + 0.5, and
//    random rows with C1 outliers, C2 constant groups and tiny magnitudes;
//  * the online-softmax merge and the split-K combine against a float64 softmax, for odd key
//    counts split into odd pieces (1, 31, 33, 95 keys), partials that saw no key, and large logits.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <random>
#include <string>
#include <vector>

#include "kvpack/kernels/cuda/helpers.cuh"
#include "kvpack/kvpack.hpp"

namespace {

using namespace kvpack;  // NOLINT: test file
namespace kc = kvpack::cuda;

// Codecs the device kernels cannot decode stay on the host: a 4-bit codebook (NF4) must not pass
// for INT4, nor INT3/INT2 for a wider integer code.
static_assert(!kc::DeviceCodec<Nf4<>>::supported && !kc::DeviceCodec<Nf4<Group<64>, MetaF32>>::supported);
static_assert(!kc::DeviceCodec<Int3<>>::supported && !kc::DeviceCodec<Int2<>>::supported);
static_assert(kc::DeviceCodec<Int4<Symmetric>>::supported);

template <class C>
class DeviceCodecBytes : public ::testing::Test {};
using ByteCodecs = ::testing::Types<Int8<Symmetric>, Int8<Asymmetric>, Int8<Asymmetric, MetaF32>, Int4<Symmetric>,
                                    Int4<Asymmetric>, Int4<Symmetric, MetaF32, Group<8>>, Int4<Asymmetric, MetaF32>,
                                    Fp8E4M3<>, Fp8E4M3<MetaF32, Group<64>>, Fp8E5M2<>, Fp8E5M2<MetaF32>>;
TYPED_TEST_SUITE(DeviceCodecBytes, ByteCodecs);

/// float64 value of a stored code: the codec's rule written out.
template <class C>
double ref_decode(unsigned u, GroupParams p) {
  if constexpr (requires { typename C::format; }) {
    const auto b = static_cast<std::uint8_t>(u);
    const double f = std::is_same_v<typename C::format, E4M3> ? e4m3_to_float(b) : e5m2_to_float(b);
    return f * p.scale;
  } else {
    int q;
    if constexpr (C::bits == 4) q = static_cast<int>(u) + C::qmin;
    else if constexpr (C::asymmetric) q = static_cast<int>(u);
    else q = static_cast<std::int8_t>(static_cast<std::uint8_t>(u));
    return static_cast<double>(p.zero) + static_cast<double>(p.scale) * q;
  }
}

// Every byte value 0x00..0xFF (INT4: its two nibbles) through unpack_int4, load_chunk and
// dequantize_chunk, under several parameter sets as the codec stores them (metadata bytes read by
// load_group_params): equal to the host codec and within half an ulp-ish of float64.
TYPED_TEST(DeviceCodecBytes, EveryByteDecodesLikeTheHostCodec) {
  using C = TypeParam;
  using DC = kc::DeviceCodec<C>;
  static_assert(DC::supported);
  std::vector<std::uint8_t> bytes(256 + 8);
  for (int i = 0; i < 256; ++i) bytes[static_cast<std::size_t>(i)] = static_cast<std::uint8_t>(i);
  const GroupParams given[] = {{1.f, 0.f}, {0.75f, -2.5f}, {0.0999755859375f, 3.25f}, {1024.f, -65504.f},
                               {6.1035156e-05f, 0.5f}};
  for (const GroupParams& g : given) {
    std::vector<std::byte> meta(static_cast<std::size_t>(C::meta_bytes_per_group));
    C::store_params(g, meta.data());
    const GroupParams p = kc::load_group_params<DC>(reinterpret_cast<const std::uint8_t*>(meta.data()));
    const GroupParams hp = C::load_params(meta.data());
    ASSERT_EQ(p.scale, hp.scale);
    ASSERT_EQ(p.zero, hp.zero);
    const int values = C::bits == 4 ? 512 : 256;
    const int bytes_per_chunk = kc::kChunk * C::bits / 8;
    for (int e0 = 0; e0 < values; e0 += kc::kChunk) {
      const kc::ChunkCodes chunk = kc::load_chunk<C::bits>(bytes.data() + e0 / kc::kChunk * bytes_per_chunk);
      float got[kc::kChunk];
      kc::dequantize_chunk<DC>(chunk, p, got);
      for (int e = 0; e < kc::kChunk; ++e) {
        const auto i = static_cast<std::size_t>(e0 + e);
        const unsigned u = C::load_code(reinterpret_cast<const std::byte*>(bytes.data()), i);
        ASSERT_EQ(kc::chunk_code<C::bits>(chunk, e), u) << "element " << i;
        const float host = C::decode_value(u, p);
        const double ref = ref_decode<C>(u, p);
        if (std::isnan(ref)) {
          EXPECT_TRUE(std::isnan(got[e])) << "code " << u;
          continue;
        }
        if (std::isinf(ref)) {  // E5M2 Inf codes
          EXPECT_EQ(got[e], host) << "code " << u;
          continue;
        }
        EXPECT_EQ(got[e], host) << "code " << u << " scale " << p.scale << " zero " << p.zero;
        // One fp32 rounding (or two for zero + scale * q): within 1 ulp of the float64 value.
        EXPECT_LE(std::abs(got[e] - ref), std::abs(ref) * 0x1p-23 + std::abs(p.zero) * 0x1p-24 + 1e-45)
            << "code " << u;
      }
    }
  }
}

TEST(DeviceCodecBytes, Int4NibbleOrderKnownAnswer) {
  // CASES C4: codes [1, 2, 3, 4] stored as q + 8, element 2i in the low nibble -> 0xA9, 0xCB.
  EXPECT_EQ(kc::pack_int4(1 + 8, 2 + 8), 0xA9);
  EXPECT_EQ(kc::pack_int4(3 + 8, 4 + 8), 0xCB);
  for (unsigned b = 0; b < 256; ++b) {
    const kc::Nibbles n = kc::unpack_int4(static_cast<std::uint8_t>(b));
    EXPECT_EQ(n.lo, b % 16);
    EXPECT_EQ(n.hi, b / 16);
    EXPECT_EQ(kc::pack_int4(n.lo, n.hi), b);
  }
}

// ------------------------------------------------------------------------------------------------
// Quantizer
// ------------------------------------------------------------------------------------------------

TEST(DeviceQuantizer, C4TiesAndClampsWithScaleOne) {
  using DC = kc::DeviceCodec<Int4<Symmetric>>;
  const GroupParams one{1.f, 0.f};
  const float x[] = {0.5f, 1.5f, 2.5f, -0.5f, -1.5f, -2.5f, 6.5f, 9.7f, -12.f};
  const int want[] = {0, 2, 2, 0, -2, -2, 6, 7, -8};
  for (int i = 0; i < 9; ++i) EXPECT_EQ(kc::level_of<DC>(kc::quantize<DC>(x[i], one)), want[i]) << x[i];
  using D8 = kc::DeviceCodec<Int8<Symmetric>>;
  EXPECT_EQ(kc::level_of<D8>(kc::quantize<D8>(300.f, one)), 127);
  EXPECT_EQ(kc::level_of<D8>(kc::quantize<D8>(-300.f, one)), -128);
  EXPECT_EQ(kc::level_of<D8>(kc::quantize<D8>(-127.5f, one)), -128);
  EXPECT_EQ(kc::level_of<D8>(kc::quantize<D8>(126.5f, one)), 126);
}

template <class C>
class DeviceQuantizerCodecs : public ::testing::Test {};
using QuantCodecs = ::testing::Types<Int4<Symmetric>, Int4<Asymmetric>, Int8<Symmetric>, Int8<Asymmetric>,
                                     Int4<Symmetric, MetaF32, Group<8>>, Int8<Asymmetric, MetaF32, Group<128>>,
                                     Int4<Asymmetric, Group<64>>, Fp8E4M3<>, Fp8E5M2<MetaF32, Group<16>>>;
TYPED_TEST_SUITE(DeviceQuantizerCodecs, QuantCodecs);

// CASES C4: 4096 values (k + 0.5) * scale + zero with k from qmin - 2 to qmax + 1 (exact ties,
// and values beyond both ends), quantized under fixed parameters: the device rule equals the
// host codec, and (integers) round half to even then clamp in float64.
TYPED_TEST(DeviceQuantizerCodecs, FixedParams4096ValuesBitIdentical) {
  using C = TypeParam;
  using DC = kc::DeviceCodec<C>;
  constexpr int kN = 4096, kG = 32;
  const float scales[] = {1.f, 0.25f, 3.f, 0.0078125f, 1.5f, 96.f, 0.0999755859375f, 1000.f};
  const float zeros[] = {0.f, -3.f, 2.5f, -64.f};
  const int qmin = DC::is_fp8 ? -20 : DC::qmin, qmax = DC::is_fp8 ? 20 : DC::qmax;
  const int span = qmax - qmin + 4;
  int checked_ties = 0;
  for (int j = 0; j < kN; ++j) {
    const int g = j / kG;
    const float s = scales[g % 8];
    const float z = DC::asymmetric ? zeros[(g / 8) % 4] * s : 0.f;
    const int k = qmin - 2 + (j * 7 + g) % span;
    const double t = k + 0.5;
    const auto x = static_cast<float>(z + t * s);
    const GroupParams p{s, z};
    const unsigned got = kc::quantize<DC>(x, p);
    ASSERT_EQ(got, C::encode_value(x, p)) << "x=" << x << " scale " << s << " zero " << z;
    if constexpr (!DC::is_fp8) {
      double q = std::nearbyint(t);
      q = std::min<double>(std::max<double>(q, qmin), qmax);
      ASSERT_EQ(kc::level_of<DC>(got), static_cast<int>(q)) << "x=" << x;
      ++checked_ties;
    }
  }
  EXPECT_EQ(checked_ties, DC::is_fp8 ? 0 : kN);
}

// Random rows (odd group counts, magnitudes 2^-30..2^27) with C1 outliers (-125000), C2 constant
// groups (100, 0, -3.5), alternating 100 / 100 + 2^-10 and 1e-6 N(0,1): quantize_row writes the
// same code and metadata bytes as the host encode_row<C>.
TYPED_TEST(DeviceQuantizerCodecs, RowsBitIdenticalToHostEncodeRow) {
  using C = TypeParam;
  using DC = kc::DeviceCodec<C>;
  constexpr int G = C::group_size;
  std::mt19937 rng(7);
  std::normal_distribution<float> nd(0.f, 1.f);
  int rows = 0;
  for (int groups : {1, 3, 5}) {
    const int n = groups * G;
    for (int trial = 0; trial < 60; ++trial) {
      std::vector<float> x(static_cast<std::size_t>(n));
      const float mag = std::ldexp(1.f, trial % 20 * 3 - 30);
      for (float& v : x) v = nd(rng) * mag;
      if (trial % 7 == 1) x[static_cast<std::size_t>(trial) % x.size()] = -125000.f;
      if (trial % 7 == 2) std::fill_n(x.begin(), G, 100.f);
      if (trial % 7 == 3) std::fill_n(x.begin(), G, 0.f);
      if (trial % 7 == 4) std::fill_n(x.begin(), G, -3.5f);
      if (trial % 7 == 5) {
        for (int i = 0; i < G; ++i) x[static_cast<std::size_t>(i)] = i % 2 ? 100.f + 0x1p-10f : 100.f;
      }
      if (trial % 7 == 6) {
        for (float& v : x) v = 1e-6f * nd(rng);
      }
      if (trial == 13) x[0] = 1e30f;  // far beyond fp16 and any fp8 scale range
      std::vector<std::byte> c1(C::code_bytes(x.size())), m1(row_meta_bytes<C>(x.size()));
      std::vector<std::uint8_t> c2(c1.size(), 0xA5), m2(m1.size(), 0xA5);
      kvpack::encode_row<C>(x.data(), n, c1.data(), m1.data());
      kc::quantize_row<DC>(x.data(), n, c2.data(), m2.data());
      ASSERT_EQ(0, std::memcmp(c1.data(), c2.data(), c1.size())) << "codes, n=" << n << " trial " << trial;
      ASSERT_EQ(0, std::memcmp(m1.data(), m2.data(), m1.size())) << "metadata, n=" << n << " trial " << trial;
      ++rows;
    }
  }
  EXPECT_EQ(rows, 180);
}

TEST(DeviceQuantizer, DirectedRoundingMatchesHostMetaRounding) {
  std::mt19937_64 rng(11);
  std::uniform_real_distribution<double> e(-40, 40);
  for (int i = 0; i < 20000; ++i) {
    const double d = (i % 2 ? -1 : 1) * std::exp2(e(rng)) * (1 + 1e-9 * (i % 13));
    EXPECT_EQ(kc::f32_round_up(d), detail::f32_round_up(d)) << d;
    EXPECT_EQ(kc::f32_round_down(d), detail::f32_round_down(d)) << d;
    EXPECT_EQ(kc::meta_round_up<true>(d), detail::meta_round_up<MetaF16>(d)) << d;
    EXPECT_EQ(kc::meta_round_down<true>(d), detail::meta_round_down<MetaF16>(d)) << d;
  }
  EXPECT_EQ(kc::f32_round_up(1e300), detail::f32_round_up(1e300));
  EXPECT_EQ(kc::f32_round_down(-1e300), detail::f32_round_down(-1e300));
  EXPECT_EQ(kc::next_up(0.f), std::nextafter(0.f, 1.f));
  EXPECT_EQ(kc::next_up(-0.f), std::nextafter(-0.f, 1.f));
  EXPECT_EQ(kc::next_down(1.f), std::nextafter(1.f, 0.f));
  EXPECT_EQ(kc::next_up(-1.f), std::nextafter(-1.f, 0.f));
}

// ------------------------------------------------------------------------------------------------
// Softmax merge and split-K combine
// ------------------------------------------------------------------------------------------------

/// float64 softmax(s) v for one channel.
double ref_attention(const std::vector<float>& s, const std::vector<float>& v) {
  double mx = -INFINITY;
  for (float x : s) mx = std::max(mx, static_cast<double>(x));
  if (mx == -INFINITY) return 0;
  double num = 0, den = 0;
  for (std::size_t i = 0; i < s.size(); ++i) {
    const double w = std::exp(static_cast<double>(s[i]) - mx);
    num += w * v[i];
    den += w;
  }
  return num / den;
}

/// fp32 partial over keys [a, b): (m, l, acc) computed in one pass with merge_into, key by key.
struct Partial {
  float m, l, acc;
};
Partial partial(const std::vector<float>& s, const std::vector<float>& v, std::size_t a, std::size_t b) {
  kc::SoftmaxState st;
  float acc = 0.f;
  for (std::size_t i = a; i < b; ++i) {
    if (s[i] == kc::kNegInf) continue;
    const kc::MergeWeights w = kc::merge_into(st, kc::SoftmaxState{s[i], 1.f});
    acc = acc * w.wa + v[i] * w.wb;
  }
  return {st.m, st.l, acc};
}

TEST(DeviceSoftmax, SplitKCombineMatchesFloat64) {
  std::mt19937 rng(3);
  std::normal_distribution<float> nd(0.f, 1.f);
  int cases = 0;
  for (int n : {1, 31, 33, 95, 1000}) {
    for (float logit_sigma : {1.f, 8.f, 60.f}) {
      for (int splits : {1, 2, 3, 7, 31}) {
        std::vector<float> s(static_cast<std::size_t>(n)), v(s.size());
        for (float& x : s) x = nd(rng) * logit_sigma;
        for (float& x : v) x = nd(rng);
        if (n > 40) std::fill(s.begin() + 5, s.begin() + 37, kc::kNegInf);  // masked keys: an empty split
        std::vector<float> m, l, acc;
        const int per = (n + splits - 1) / splits;
        for (int sp = 0; sp < splits; ++sp) {  // trailing splits may be empty (m = -inf)
          const auto a = static_cast<std::size_t>(std::min(n, sp * per));
          const auto b = static_cast<std::size_t>(std::min(n, (sp + 1) * per));
          const Partial p = partial(s, v, a, b);
          m.push_back(p.m);
          l.push_back(p.l);
          acc.push_back(p.acc);
        }
        const float got = kc::combine_channel(m.data(), l.data(), acc.data(), splits, 1);
        const double want = ref_attention(s, v);
        double vmax = 0;
        for (float x : v) vmax = std::max(vmax, static_cast<double>(std::abs(x)));
        EXPECT_LE(std::abs(got - want), 1e-5 * vmax) << "n=" << n << " sigma " << logit_sigma << " splits " << splits;
        ++cases;
      }
    }
  }
  EXPECT_EQ(cases, 75);
}

TEST(DeviceSoftmax, EmptyPartialsGiveZeroAndWeightZero) {
  const float m[] = {kc::kNegInf, kc::kNegInf}, l[] = {0.f, 0.f}, acc[] = {0.f, 0.f};
  EXPECT_EQ(kc::combine_channel(m, l, acc, 2, 1), 0.f);
  const kc::MergeWeights w = kc::merge_weights(kc::kNegInf, 2.f);
  EXPECT_EQ(w.m, 2.f);
  EXPECT_EQ(w.wa, 0.f);
  EXPECT_EQ(w.wb, 1.f);
  const kc::MergeWeights none = kc::merge_weights(kc::kNegInf, kc::kNegInf);
  EXPECT_EQ(none.wa, 0.f);
  EXPECT_EQ(none.wb, 0.f);
  EXPECT_TRUE(std::isinf(kc::kNegInf) && kc::kNegInf < 0);
  // Large logits (1e4 apart) do not overflow: the smaller partial's weight underflows to 0.
  const float m2[] = {1e4f, 0.f}, l2[] = {1.f, 5.f}, acc2[] = {3.f, 100.f};
  EXPECT_EQ(kc::combine_channel(m2, l2, acc2, 2, 1), 3.f);
}

}  // namespace
