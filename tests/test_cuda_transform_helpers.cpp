// The __host__ __device__ RoPE and Hadamard helpers of the CUDA kernels
// (kernels/cuda/transform_helpers.cuh), compiled as plain C++ by g++ and clang++ and checked on
// the host, where no GPU is needed, against the host implementations they must reproduce:
//  * rope_row_serial / rope_rotate_pair vs kernels::rope_row over a RopeTable (to 4e-6 on values
//    of scale 3: the host loop may be FMA-contracted by its compiler, the device never is;
//    unrotated channels equal), both pairings, full and partial rotary dims (8, 32, 64 of 64;
//    8, 32, 64, 126 of 128), positions 0..4099 and the clamp at both ends; and vs a float64
//    rotation to 1e-5;
//  * rope_pair: the channel pairs of both conventions;
//  * hadamard_negative vs detail::hadamard_sign_negative for channels 0..4095;
//  * hadamard_block_of: the block decomposition of every D in 1..300;
//  * hadamard_row_serial (the device rotation's butterflies in stage order) vs
//    kvpack::rotate_row / unrotate_row, bit for bit, for Hadamard and SignedHadamard, D in
//    {1, 2, 3, 8, 16, 64, 80, 96, 112, 128, 256}; and its orthonormality against float64.
#include <gtest/gtest.h>

#include <cmath>
#include <cstdint>
#include <cstring>
#include <random>
#include <vector>

#include "kvpack/kernels/cuda/transform_helpers.cuh"
#include "kvpack/kernels/rope.hpp"
#include "kvpack/rotation/hadamard.hpp"

namespace {

using namespace kvpack;  // NOLINT: test file
namespace kc = kvpack::cuda;

std::vector<float> normal_row(std::size_t n, std::uint32_t seed, float scale = 1.f) {
  std::mt19937 rng(seed);
  std::normal_distribution<float> nd(0.f, scale);
  std::vector<float> x(n);
  for (float& v : x) v = nd(rng);
  return x;
}

bool same_bits(const std::vector<float>& a, const std::vector<float>& b) {
  return a.size() == b.size() && std::memcmp(a.data(), b.data(), a.size() * sizeof(float)) == 0;
}

TEST(CudaRopeHelpers, PairsOfBothConventions) {
  EXPECT_EQ(kc::rope_pair(0, 16, false).a, 0);
  EXPECT_EQ(kc::rope_pair(0, 16, false).b, 1);
  EXPECT_EQ(kc::rope_pair(5, 16, false).a, 10);
  EXPECT_EQ(kc::rope_pair(5, 16, false).b, 11);
  EXPECT_EQ(kc::rope_pair(5, 16, true).a, 5);
  EXPECT_EQ(kc::rope_pair(5, 16, true).b, 21);
  EXPECT_EQ(kc::rope_pair(15, 16, true).b, 31);
}

TEST(CudaRopeHelpers, RowMatchesHostRopeRow) {
  int cases = 0;
  for (const int D : {64, 128})
    for (const int dims : {8, 32, 64, 126})
      for (const bool neox : {false, true}) {
        if (dims > D) continue;
        const int pairs = dims / 2;
        for (const double base : {10000.0, 500000.0}) {
          kernels::RopeTable table(base, pairs);
          table.ensure(4100);
          kernels::RopeArgs r;
          r.table = table.data();
          r.positions = table.size();
          r.pairs = pairs;
          r.neox = neox;
          for (const std::int64_t pos : {std::int64_t{0}, std::int64_t{1}, std::int64_t{7}, std::int64_t{31},
                                         std::int64_t{33}, std::int64_t{95}, std::int64_t{4099}, std::int64_t{-5},
                                         std::int64_t{1} << 40}) {
            std::vector<float> host = normal_row(static_cast<std::size_t>(D), static_cast<std::uint32_t>(cases + 1), 3.f);
            std::vector<float> dev = host;
            kernels::rope_row(host.data(), r, pos);
            kc::rope_row_serial(dev.data(), kc::rope_table_row(r.table, r.positions, pairs, pos), pairs, neox);
            // Within 1 ulp of each product: the host's scalar loop may be contracted into FMAs
            // by the compiler (GCC's default for C++), the device never contracts.
            for (int d = 0; d < D; ++d)
              ASSERT_NEAR(dev[static_cast<std::size_t>(d)], host[static_cast<std::size_t>(d)], 4e-6f)
                  << "D " << D << " dims " << dims << " neox " << neox << " pos " << pos << " channel " << d;
            for (int d = dims; d < D; ++d) ASSERT_EQ(dev[static_cast<std::size_t>(d)], host[static_cast<std::size_t>(d)]);
            ++cases;
          }
        }
      }
  EXPECT_EQ(cases, 7 * 2 * 2 * 9);  // (D, dims) pairs x pairings x bases x positions: every combination ran
}

TEST(CudaRopeHelpers, RowMatchesFloat64Rotation) {
  const int D = 128, dims = 96, pairs = dims / 2;
  const double base = 10000.0;
  kernels::RopeTable table(base, pairs);
  table.ensure(5000);
  for (const bool neox : {false, true})
    for (const std::int64_t pos : {std::int64_t{0}, std::int64_t{1}, std::int64_t{33}, std::int64_t{4999}}) {
      std::vector<float> x = normal_row(D, static_cast<std::uint32_t>(pos + 3));
      std::vector<double> ref(x.begin(), x.end());
      for (int i = 0; i < pairs; ++i) {
        const double ang = static_cast<double>(pos) * std::pow(base, -2.0 * i / dims);
        const int a = neox ? i : 2 * i, b = neox ? i + pairs : 2 * i + 1;
        const double xa = ref[static_cast<std::size_t>(a)], xb = ref[static_cast<std::size_t>(b)];
        ref[static_cast<std::size_t>(a)] = xa * std::cos(ang) - xb * std::sin(ang);
        ref[static_cast<std::size_t>(b)] = xa * std::sin(ang) + xb * std::cos(ang);
      }
      kc::rope_row_serial(x.data(), kc::rope_table_row(table.data(), table.size(), pairs, pos), pairs, neox);
      for (int d = 0; d < D; ++d)
        EXPECT_NEAR(x[static_cast<std::size_t>(d)], ref[static_cast<std::size_t>(d)], 1e-5) << "channel " << d << " pos " << pos;
      for (int d = dims; d < D; ++d) EXPECT_EQ(x[static_cast<std::size_t>(d)], static_cast<float>(ref[static_cast<std::size_t>(d)]));
    }
}

TEST(CudaRopeHelpers, TableRowClampsPositions) {
  std::vector<float> t(10 * 2 * 3);
  EXPECT_EQ(kc::rope_table_row(t.data(), 10, 3, -1), t.data());
  EXPECT_EQ(kc::rope_table_row(t.data(), 10, 3, 4), t.data() + 4 * 6);
  EXPECT_EQ(kc::rope_table_row(t.data(), 10, 3, 10), t.data() + 9 * 6);
}

TEST(CudaHadamardHelpers, SignsMatchHost) {
  for (std::uint64_t c = 0; c < 4096; ++c) ASSERT_EQ(kc::hadamard_negative(c), detail::hadamard_sign_negative(c)) << c;
}

TEST(CudaHadamardHelpers, BlockDecomposition) {
  EXPECT_EQ(kc::hadamard_block_of(79, 80).first, 64);
  EXPECT_EQ(kc::hadamard_block_of(79, 80).size, 16);
  EXPECT_EQ(kc::hadamard_block_of(63, 80).size, 64);
  EXPECT_EQ(kc::hadamard_block_of(111, 112).size, 16);
  EXPECT_EQ(kc::hadamard_block_of(90, 112).size, 32);
  EXPECT_EQ(kc::hadamard_block_of(100, 112).first, 96);
  for (int D = 1; D <= 300; ++D) {
    int c = 0, prev = 1 << 30;
    while (c < D) {
      const kc::HadamardBlock b = kc::hadamard_block_of(c, D);
      ASSERT_EQ(b.first, c) << "D " << D;
      ASSERT_GT(b.size, 0);
      ASSERT_EQ(b.size & (b.size - 1), 0) << "D " << D;
      ASSERT_LT(b.size, prev) << "blocks shrink: D " << D;
      for (int j = c; j < c + b.size; ++j) ASSERT_EQ(kc::hadamard_block_of(j, D).first, c);
      prev = b.size;
      c += b.size;
    }
    ASSERT_EQ(c, D);
  }
}

template <class R>
void check_rows_bit_exact(bool signed_rows) {
  for (const int D : {1, 2, 3, 8, 16, 64, 80, 96, 112, 128, 256})
    for (std::uint32_t seed = 1; seed <= 5; ++seed) {
      const std::vector<float> x = normal_row(static_cast<std::size_t>(D), seed * 31u + static_cast<std::uint32_t>(D), 2.f);
      std::vector<float> host = x, dev = x;
      rotate_row<R>(host.data(), D);
      kc::hadamard_row_serial(dev.data(), D, signed_rows, false);
      ASSERT_TRUE(same_bits(host, dev)) << "rotate D " << D;
      unrotate_row<R>(host.data(), D);
      kc::hadamard_row_serial(dev.data(), D, signed_rows, true);
      ASSERT_TRUE(same_bits(host, dev)) << "unrotate D " << D;
      for (int d = 0; d < D; ++d) EXPECT_NEAR(dev[static_cast<std::size_t>(d)], x[static_cast<std::size_t>(d)], 1e-5f);
    }
}

TEST(CudaHadamardHelpers, RowMatchesHostRotationBitForBit) {
  check_rows_bit_exact<Hadamard>(false);
  check_rows_bit_exact<SignedHadamard>(true);
}

// The rotation is orthonormal: against the explicit float64 Sylvester matrix for D = 80
// ([64 | 16] blocks), signs included.
TEST(CudaHadamardHelpers, MatchesFloat64Matrix) {
  const int D = 80;
  const std::vector<float> x = normal_row(D, 9);
  std::vector<float> got = x;
  kc::hadamard_row_serial(got.data(), D, true, false);
  for (int r = 0; r < D; ++r) {
    const kc::HadamardBlock b = kc::hadamard_block_of(r, D);
    double want = 0;
    for (int c = b.first; c < b.first + b.size; ++c) {
      const int parity = __builtin_popcount(static_cast<unsigned>((r - b.first) & (c - b.first))) & 1;
      const double sign = kc::hadamard_negative(static_cast<std::uint64_t>(c)) ? -1.0 : 1.0;
      want += (parity ? -1.0 : 1.0) * sign * x[static_cast<std::size_t>(c)];
    }
    want /= std::sqrt(static_cast<double>(b.size));
    EXPECT_NEAR(got[static_cast<std::size_t>(r)], want, 1e-5) << "row " << r;
  }
}

}  // namespace
