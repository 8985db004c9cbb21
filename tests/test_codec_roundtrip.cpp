// Round-trip bounds of every grouped codec (issue 2, "Must show"): INT8/INT4 (and INT3/INT2, issue
// 20) x symmetric/asymmetric
// x fp16/fp32 metadata x group 32/64/128, and FP8 E4M3/E5M2 x metadata x group, on N(0,1) and
// Student-t (3 degrees of freedom) data, head_dim 64, 96, 128, 256 and 1, 31, 33, 95, 1000 tokens.
//
//  * per-token rows (encode_row / decode_row, groups along head_dim; group sizes that do not
//    divide head_dim are skipped);
//  * per-channel token groups (encode_channels / decode_row_channels, KIVI keys), at head_dim 96
//    and 128 (channels are independent groups, see kChannelHeadDims): the complete
//    groups of G tokens inside each token count (33 and 95 tokens -> 1 and 2 groups of 32; 1000
//    tokens -> 31, 15 or 7 groups); an incomplete group stays full precision in the cache, so it
//    is not a codec input.
//
// For every group: the stored metadata equals the float64 reference exactly (scale rounded up,
// zero-point rounded down on the metadata grid), and every value meets the codec's bound
// (support/codec_bounds.hpp): integer |x̂ - x| <= step/2 (+ fp32 slack), E4M3 relative error
// <= 2^-4 and E5M2 <= 2^-3 where x/step is in the format's normal range.
#include <gtest/gtest.h>

#include <cstddef>
#include <cstdint>
#include <map>
#include <random>
#include <string>
#include <tuple>
#include <vector>

#include "kvpack/codec/fp8_codec.hpp"
#include "kvpack/codec/int_codec.hpp"
#include "kvpack/codec/int_lowbit.hpp"
#include "kvpack/codec/rows.hpp"
#include "support/codec_bounds.hpp"

namespace {

using namespace kvpack;  // NOLINT: test file
namespace ref = kvpack::codec_ref;

constexpr int kHeadDims[] = {64, 96, 128, 256};
constexpr int kTokenCounts[] = {1, 31, 33, 95, 1000};
enum class Dist { normal, student_t3 };
constexpr Dist kDists[] = {Dist::normal, Dist::student_t3};

const char* dist_name(Dist d) { return d == Dist::normal ? "N(0,1)" : "t(3)"; }

/// [tokens][head_dim] test data, generated once per (distribution, tokens, head_dim) with a fixed
/// seed and shared by all codecs.
const std::vector<float>& data(Dist d, int tokens, int head_dim) {
  static std::map<std::tuple<Dist, int, int>, std::vector<float>> cache;
  auto [it, fresh] = cache.try_emplace({d, tokens, head_dim});
  if (fresh) {
    std::mt19937_64 rng(0x6b7670ULL + 1000003ULL * static_cast<std::uint64_t>(tokens) +
                        7919ULL * static_cast<std::uint64_t>(head_dim) + (d == Dist::normal ? 0 : 17));
    std::normal_distribution<double> normal(0.0, 1.0);
    std::student_t_distribution<double> student(3.0);
    it->second.resize(static_cast<std::size_t>(tokens) * static_cast<std::size_t>(head_dim));
    for (float& v : it->second) v = static_cast<float>(d == Dist::normal ? normal(rng) : student(rng));
  }
  return it->second;
}

std::string where(Dist d, int head_dim, int tokens, int token, int first) {
  return std::string(dist_name(d)) + " head_dim " + std::to_string(head_dim) + " tokens " + std::to_string(tokens) +
         " token " + std::to_string(token) + " from channel/token " + std::to_string(first);
}

/// Per-token rows: every row of every (distribution, head_dim, token count) configuration.
template <class C>
void per_token_rows(ref::Report& rep) {
  constexpr int G = C::group_size;
  for (Dist d : kDists)
    for (int D : kHeadDims) {
      if (D % G != 0) continue;
      for (int T : kTokenCounts) {
        const std::vector<float>& x = data(d, T, D);
        std::vector<std::byte> codes(C::code_bytes(static_cast<std::size_t>(D)));
        std::vector<std::byte> meta(row_meta_bytes<C>(static_cast<std::size_t>(D)));
        std::vector<float> xh(static_cast<std::size_t>(D));
        for (int t = 0; t < T; ++t) {
          const float* row = x.data() + static_cast<std::ptrdiff_t>(t) * D;
          encode_row<C>(row, D, codes.data(), meta.data());
          decode_row<C>(codes.data(), meta.data(), D, xh.data());
          for (int g = 0; g < D / G; ++g)
            ref::check_group<C>(row + g * G, xh.data() + g * G, 1, G,
                                C::load_params(meta.data() + g * C::meta_bytes_per_group), [&] { return where(d, D, T, t, g * G); },
                                rep);
        }
      }
    }
}

/// Per-channel token groups: `groups` groups of G tokens taken from the start of x ([T][D]).
template <class C>
void per_channel_groups(Dist d, int D, int T, int groups, ref::Report& rep) {
  constexpr int G = C::group_size;
  const std::vector<float>& x = data(d, T, D);
  const std::size_t row_bytes = C::code_bytes(static_cast<std::size_t>(D));
  std::vector<std::byte> codes(row_bytes * G);
  std::vector<std::byte> meta(static_cast<std::size_t>(D) * C::meta_bytes_per_group);
  std::vector<float> xh(static_cast<std::size_t>(G) * static_cast<std::size_t>(D));
  for (int k = 0; k < groups; ++k) {
    const float* x0 = x.data() + static_cast<std::ptrdiff_t>(k) * G * D;
    encode_channels<C>(x0, D, D, codes.data(), row_bytes, meta.data());
    for (int r = 0; r < G; ++r)
      decode_row_channels<C>(codes.data() + r * row_bytes, meta.data(), D, xh.data() + static_cast<std::ptrdiff_t>(r) * D);
    for (int c = 0; c < D; ++c)
      ref::check_group<C>(x0 + c, xh.data() + c, D, G, C::load_params(meta.data() + c * C::meta_bytes_per_group),
                          [&] { return where(d, D, T, k * G, c) + " (per-channel)"; }, rep);
  }
}

// Per-channel groups run along tokens: head_dim only sets how many independent channel groups
// there are and the row stride, so two head_dims (one not a power of two) cover it at half the
// runtime of all four.
constexpr int kChannelHeadDims[] = {96, 128};

template <class C>
void per_channel_all(ref::Report& rep) {
  constexpr int G = C::group_size;
  for (Dist d : kDists)
    for (int D : kChannelHeadDims) {
      for (int T : kTokenCounts)
        if (T >= G) per_channel_groups<C>(d, D, T, T / G, rep);
    }
}

struct CodecNames {
  template <class C>
  static std::string GetName(int) {
    return ref::codec_name<C>();
  }
};

template <class C>
class IntRoundTrip : public ::testing::Test {};
using IntCodecs = ::testing::Types<
    Int8<Symmetric, MetaF16, Group<32>>, Int8<Symmetric, MetaF16, Group<64>>, Int8<Symmetric, MetaF16, Group<128>>,
    Int8<Symmetric, MetaF32, Group<32>>, Int8<Symmetric, MetaF32, Group<64>>, Int8<Symmetric, MetaF32, Group<128>>,
    Int8<Asymmetric, MetaF16, Group<32>>, Int8<Asymmetric, MetaF16, Group<64>>, Int8<Asymmetric, MetaF16, Group<128>>,
    Int8<Asymmetric, MetaF32, Group<32>>, Int8<Asymmetric, MetaF32, Group<64>>, Int8<Asymmetric, MetaF32, Group<128>>,
    Int4<Symmetric, MetaF16, Group<32>>, Int4<Symmetric, MetaF16, Group<64>>, Int4<Symmetric, MetaF16, Group<128>>,
    Int4<Symmetric, MetaF32, Group<32>>, Int4<Symmetric, MetaF32, Group<64>>, Int4<Symmetric, MetaF32, Group<128>>,
    Int4<Asymmetric, MetaF16, Group<32>>, Int4<Asymmetric, MetaF16, Group<64>>, Int4<Asymmetric, MetaF16, Group<128>>,
    Int4<Asymmetric, MetaF32, Group<32>>, Int4<Asymmetric, MetaF32, Group<64>>, Int4<Asymmetric, MetaF32, Group<128>>,
    Int3<Asymmetric, MetaF16, Group<32>>, Int3<Asymmetric, MetaF32, Group<64>>, Int3<Symmetric, MetaF16, Group<128>>,
    Int2<Asymmetric, MetaF16, Group<32>>, Int2<Asymmetric, MetaF16, Group<128>>, Int2<Symmetric, MetaF32, Group<64>>>;
TYPED_TEST_SUITE(IntRoundTrip, IntCodecs, CodecNames);

template <class C>
class Fp8RoundTrip : public ::testing::Test {};
using Fp8Codecs = ::testing::Types<Fp8E4M3<MetaF16, Group<32>>, Fp8E4M3<MetaF16, Group<64>>, Fp8E4M3<MetaF16, Group<128>>,
                                   Fp8E4M3<MetaF32, Group<32>>, Fp8E4M3<MetaF32, Group<64>>, Fp8E4M3<MetaF32, Group<128>>,
                                   Fp8E5M2<MetaF16, Group<32>>, Fp8E5M2<MetaF16, Group<64>>, Fp8E5M2<MetaF16, Group<128>>,
                                   Fp8E5M2<MetaF32, Group<32>>, Fp8E5M2<MetaF32, Group<64>>, Fp8E5M2<MetaF32, Group<128>>>;
TYPED_TEST_SUITE(Fp8RoundTrip, Fp8Codecs, CodecNames);

// Number of per-token groups the loops above must visit, so a loop that silently skips
// configurations fails: sum over head_dims divisible by G of (D / G) * (sum of token counts) * 2.
template <class C>
long expected_row_groups() {
  long n = 0;
  for (int D : kHeadDims)
    if (D % C::group_size == 0) n += static_cast<long>(D / C::group_size) * (1 + 31 + 33 + 95 + 1000) * 2;
  return n;
}

// Per-channel groups visited: one per channel per complete group of G tokens.
template <class C>
long expected_channel_groups() {
  long n = 0;
  for (int D : kChannelHeadDims)
    for (int T : kTokenCounts) n += static_cast<long>(T / C::group_size) * D * 2;
  return n;
}

TYPED_TEST(IntRoundTrip, PerTokenRowsWithinHalfStep) {
  ref::Report rep;
  per_token_rows<TypeParam>(rep);
  EXPECT_EQ(rep.groups, expected_row_groups<TypeParam>());
  EXPECT_EQ(rep.failures, 0) << rep.values << " values checked; first failures:\n" << rep.first.str();
}

TYPED_TEST(IntRoundTrip, PerChannelGroupsWithinHalfStep) {
  ref::Report rep;
  per_channel_all<TypeParam>(rep);
  EXPECT_EQ(rep.groups, expected_channel_groups<TypeParam>());
  EXPECT_EQ(rep.failures, 0) << rep.values << " values checked; first failures:\n" << rep.first.str();
}

TYPED_TEST(Fp8RoundTrip, PerTokenRowsWithinRelativeBound) {
  ref::Report rep;
  per_token_rows<TypeParam>(rep);
  EXPECT_EQ(rep.groups, expected_row_groups<TypeParam>());
  EXPECT_EQ(rep.failures, 0) << rep.values << " values checked; first failures:\n" << rep.first.str();
}

TYPED_TEST(Fp8RoundTrip, PerChannelGroupsWithinRelativeBound) {
  ref::Report rep;
  per_channel_all<TypeParam>(rep);
  EXPECT_EQ(rep.groups, expected_channel_groups<TypeParam>());
  EXPECT_EQ(rep.failures, 0) << rep.values << " values checked; first failures:\n" << rep.first.str();
}

}  // namespace
