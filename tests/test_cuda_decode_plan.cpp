// The host-side plan and inner-loop helpers of the CUDA decode kernel, compiled as plain C++ by
// g++ and clang++ and checked without a GPU:
//  * unpack_units + effective_params (kernels/cuda/unpack.cuh: the magic-number int-to-float,
//    fp16 metadata as half2, FP8 via fp16) on every byte value of every codec, against the host
//    codecs' decode_value;
//  * the thread-to-data mapping (decode_plan.cuh DecodeMapping): every (token, channel) scored
//    exactly once, a token's lanes adjacent in one warp, every (token, chunk) accumulated
//    exactly once, the final xor-shuffle only between lanes of the same chunk; B 8-1024, D 64-256;
//  * the shared-memory fit, a pure function of cache type and shape (Blocks<512> INT8 head_dim
//    128 does not fit an H200's 227 KiB: create() refuses it instead of every decode failing);
//  * the per-device, thread-safe shared-memory opt-in (a single process-wide marker would skip
//    device 1 after device 0 and race between threads);
//  * the split-K partition.
#include <gtest/gtest.h>

#include <atomic>
#include <chrono>
#include <cmath>
#include <cstdint>
#include <thread>
#include <vector>

#include "kvpack/kernels/cuda/decode_plan.cuh"
#include "kvpack/kernels/cuda/unpack.cuh"
#include "kvpack/kvpack.hpp"

namespace {

using namespace kvpack;  // NOLINT: test file
namespace kc = kvpack::cuda;

template <class C>
class DecodePlanUnpack : public ::testing::Test {};
using DecodePlanCodecs = ::testing::Types<Int8<Symmetric>, Int8<Asymmetric>, Int8<Asymmetric, MetaF32>, Int4<Symmetric>,
                                          Int4<Asymmetric>, Int4<Symmetric, MetaF32, Group<8>>, Fp8E4M3<>,
                                          Fp8E5M2<MetaF32>>;
TYPED_TEST_SUITE(DecodePlanUnpack, DecodePlanCodecs);

// zero_eff + scale * u (the kernel's reconstruction) equals the host codec's decode_value of every
// stored code, to within rounding of the two expressions (exact for FP8 and asymmetric codes).
TYPED_TEST(DecodePlanUnpack, EveryCodeMatchesTheHostCodec) {
  using C = TypeParam;
  using DC = kc::DeviceCodec<C>;
  const GroupParams params[] = {{1.f, 0.f}, {0.0371f, -1.25f}, {3.5f, 2.f}, {1e-3f, -0.5f}};
  for (const GroupParams& raw : params) {
    GroupParams p = raw;
    if (!DC::asymmetric) p.zero = 0.f;
    std::byte meta[8] = {};
    C::store_params(p, meta);
    const GroupParams stored = C::load_params(meta);
    const GroupParams eff = kc::effective_params<DC>(reinterpret_cast<const std::uint8_t*>(meta));
    for (int first = 0; first < (DC::bits == 4 ? 16 : 256); first += 8) {
      kc::ChunkCodes codes{{0u, 0u}};
      for (int e = 0; e < 8; ++e) {
        const auto u = static_cast<unsigned>(first + e);
        if constexpr (DC::bits == 4) codes.w[0] |= u << (4 * e);
        else codes.w[e / 4] |= u << (8 * (e % 4));
      }
      float units[8];
      kc::unpack_units<DC>(codes, units);
      for (int e = 0; e < 8; ++e) {
        const auto u = static_cast<unsigned>(first + e);
        const float want = C::decode_value(u, stored);
        const float got = eff.zero + eff.scale * units[e];
        if (!std::isfinite(want)) continue;  // FP8 NaN codes are never stored
        const float tol = (DC::is_fp8 || DC::asymmetric) ? 0.f : 2e-7f * (std::fabs(want) + 128.f * stored.scale);
        EXPECT_NEAR(got, want, tol) << "code " << u << " scale " << stored.scale;
      }
    }
  }
}

TEST(DecodePlanUnpack, BytePermKnownAnswers) {
  EXPECT_EQ(kc::byte_perm(0x44332211u, 0x88776655u, 0x3210u), 0x44332211u);
  EXPECT_EQ(kc::byte_perm(0x44332211u, 0x88776655u, 0x7654u), 0x88776655u);
  EXPECT_EQ(kc::byte_perm(0x44332211u, 0u, 0x1404u), 0x22001100u);  // E5M2 bytes 0, 1 -> fp16 high bytes
  EXPECT_EQ(kc::byte_perm(0x000000ABu, 0x64u, 0x4140u), 0x640064ABu);  // byte 0 and 1 under 0x64
  EXPECT_EQ((kc::and_or<0x000F000Fu, 0x64006400u>(0xFFFFFFFFu)), 0x640F640Fu);
}

// Every (token, channel) of a block is scored by exactly one lane; the lanes of a token are
// adjacent, start at channel 0 with the lowest lane and sit in one warp (their xor-shuffle stays
// inside the token); every (token, 8-channel chunk) is accumulated by exactly one lane, and the
// lanes the final xor-shuffle combines own the same chunk.
template <int B, int D>
void decode_plan_check_mapping() {
  using M = kc::DecodeMapping<B, D>;
  SCOPED_TRACE("B=" + std::to_string(B) + " D=" + std::to_string(D));
  std::vector<int> scored(static_cast<std::size_t>(B * D), 0);
  for (int tid = 0; tid < kc::kDecodeThreads; ++tid)
    for (int r = 0; r < M::score_passes; ++r) {
      const auto s = M::score(tid, r);
      const auto first = M::score(tid - tid % M::lanes_per_token, r);
      EXPECT_EQ(first.channel, 0);
      EXPECT_EQ(first.token, s.token);
      EXPECT_EQ(tid / 32, (tid - tid % M::lanes_per_token + M::lanes_per_token - 1) / 32);
      if (s.token >= B) continue;
      for (int c = s.channel; c < s.channel + M::seg; ++c) ++scored[static_cast<std::size_t>(s.token * D + c)];
    }
  for (int n : scored) ASSERT_EQ(n, 1);
  std::vector<int> accumulated(static_cast<std::size_t>(B * M::chunks), 0);
  for (int w = 0; w < kc::kDecodeWarps; ++w)
    for (int lane = 0; lane < 32; ++lane) {
      const auto v0 = M::value(w, lane, 0);
      for (int off = M::chunks; off < 32; off <<= 1) EXPECT_EQ(M::value(w, lane ^ off, 0).chunk, v0.chunk);
      for (int r = 0; r < M::pv_passes; ++r) {
        const auto v = M::value(w, lane, r);
        EXPECT_EQ(v.chunk, v0.chunk);  // a lane keeps its chunk (its accumulators) for every token
        if (v.active && v.token < B) ++accumulated[static_cast<std::size_t>(v.token * M::chunks + v.chunk)];
      }
    }
  for (int n : accumulated) ASSERT_EQ(n, 1);
}

TEST(DecodePlanMapping, EveryTokenChannelOnceForAllShapes) {
  decode_plan_check_mapping<8, 64>();
  decode_plan_check_mapping<8, 256>();
  decode_plan_check_mapping<16, 128>();
  decode_plan_check_mapping<32, 64>();
  decode_plan_check_mapping<64, 64>();
  decode_plan_check_mapping<64, 128>();
  decode_plan_check_mapping<64, 256>();
  decode_plan_check_mapping<128, 128>();
  decode_plan_check_mapping<256, 64>();
  decode_plan_check_mapping<1024, 256>();
  EXPECT_EQ((kc::DecodeMapping<64, 128>::lanes_per_token), 2);  // the SASS-budget shape: a lane pair per token
}

// The fit is a pure function of the cache type and shape, so it is checked on the host.
TEST(DecodePlanSmem, LargeBlocksDoNotFitAndSayWhy) {
  constexpr std::size_t kH200 = 232448, kA100 = 166912;  // cudaDevAttrMaxSharedMemoryPerBlockOptin
  using Big = KVCache<Keys<Int8<>>, Values<Int8<>>, Blocks<512>>;
  const kc::DecodeSmem big = kc::decode_smem_for<Big>(128, 4);
  EXPECT_GT(big.total, kH200);
  const Status s = kc::check_decode_fits(big.total, kH200, 512);
  ASSERT_FALSE(s);
  EXPECT_EQ(s.error().code, Errc::unsupported);
  EXPECT_NE(s.error().message.find("Blocks<512>"), std::string::npos) << s.error().message;
  using Default = KVCache<Keys<Int4<>>, Values<Int4<>>>;
  for (int D : {64, 128, 256})
    for (int group : {1, 2, 4, 8, 16}) {
      const kc::DecodeSmem d = kc::decode_smem_for<Default>(D, group);
      EXPECT_TRUE(kc::check_decode_fits(d.total, kA100, 64)) << D << " " << group << " " << d.total;
      // Regions in order, 16-aligned, the staged blocks before the rest.
      EXPECT_GE(d.q, kc::kDecodeStages * d.tile_bytes);
      EXPECT_LT(d.q, d.qseg);
      EXPECT_LT(d.p, d.stat);
      EXPECT_LT(d.valid, d.acc);
      EXPECT_EQ(d.acc % 16, 0u);
    }
  EXPECT_EQ(kc::decode_heads_per_cta(3), 4);
  EXPECT_EQ(kc::decode_heads_per_cta(16), 8);
}

// Per device: granting device 0 does not grant device 1 (a process-wide marker did), a larger
// size asks again, a failed grant is not remembered; concurrent callers never return before the
// grant they need is done, and it is made once.
TEST(DecodePlanSmem, OptInIsPerDeviceAndRaceFree) {
  kc::SmemOptIn opt;
  std::vector<std::pair<int, std::size_t>> calls;
  int device = 0;
  auto raise = [&](std::size_t bytes) -> Status {
    calls.emplace_back(device, bytes);
    return {};
  };
  ASSERT_TRUE(opt.ensure(0, 100000, raise));
  ASSERT_TRUE(opt.ensure(0, 100000, raise));
  device = 1;
  ASSERT_TRUE(opt.ensure(1, 100000, raise));
  ASSERT_TRUE(opt.ensure(1, 90000, raise));
  device = 0;
  ASSERT_TRUE(opt.ensure(0, 200000, raise));
  ASSERT_EQ(calls.size(), 3u);
  EXPECT_EQ(calls[1], (std::pair<int, std::size_t>{1, 100000}));
  EXPECT_FALSE(opt.ensure(2, 5, [](std::size_t) -> Status { return fail(Errc::io_error, "no"); }));
  int again = 0;
  EXPECT_TRUE(opt.ensure(2, 5, [&](std::size_t) -> Status { return ++again, Status{}; }));
  EXPECT_EQ(again, 1);

  kc::SmemOptIn shared;
  std::atomic<int> grants{0};
  std::atomic<bool> granted[2] = {false, false};
  std::atomic<int> early{0};
  std::vector<std::thread> threads;
  for (int t = 0; t < 8; ++t)
    threads.emplace_back([&, t] {
      const int dev = t % 2;
      for (int i = 0; i < 200; ++i) {
        const Status s = shared.ensure(dev, 65536, [&](std::size_t) -> Status {
          std::this_thread::sleep_for(std::chrono::milliseconds(2));
          granted[dev & 1] = true;  // (& 1: dev is 0 or 1; tells g++ -O3 the index is in bounds)
          ++grants;
          return {};
        });
        if (!s || !granted[dev & 1]) ++early;
      }
    });
  for (auto& th : threads) th.join();
  EXPECT_EQ(grants.load(), 2);
  EXPECT_EQ(early.load(), 0);
}

TEST(DecodePlanSplits, PartitionCoversEveryTileWithinTheScratch) {
  for (int units : {0, 1, 7, 33, 1000, 70000})
    for (int requested : {0, 1, 5, 100000}) {
      const kc::SplitPlan p = kc::plan_splits(units, requested, 132, 8, 4096);
      EXPECT_GE(p.splits, 1);
      EXPECT_LE(p.splits, 4096);
      if (units == 0) continue;
      EXPECT_GE(p.splits * p.tiles_per_split, units);
      EXPECT_LT((p.splits - 1) * p.tiles_per_split, units);  // no empty split
    }
  EXPECT_EQ(kc::plan_splits(1000, 0, 132, 8, 4096).splits, 63);  // ~4 CTAs per SM over 8 KV heads: 66 -> 16 tiles each
}

}  // namespace
