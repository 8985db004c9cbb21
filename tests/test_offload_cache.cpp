// KVCache with an Offload<...> policy: attention through an offloaded cache is bit-identical
// to the same cache fully resident (odd chunk sizes, several codecs and tiers), placement
// rules (resident layers, recent blocks, budget), a tampered record rejected with the block
// named and nothing written, metrics, and the background prefetch path (run under TSan by
// the `tsan` stage: the executable name matches KVPACK_TSAN_TEST_REGEX).
#include <gtest/gtest.h>

#include <atomic>
#include <cmath>
#include <memory>
#include <string>
#include <vector>

#include "kvpack/kvpack.hpp"
#include "kvpack/offload.hpp"
#include "support/offload_cache_harness.hpp"
#include "support/offload_fixtures.hpp"

namespace ko = kvpack::offload;
using kvpack::Errc;
using namespace kvpack;  // NOLINT: test file
using ko::testing::offload_shape;
using ko::testing::odd_chunks;
using ko::testing::run_loop;
using ko::testing::same_bits;
using ko::testing::TempDir;

namespace {

using Resident4 = KVCache<Keys<Int4<Group<32>>>, Values<Int4<Group<32>>>, Blocks<16>>;
using File4 = KVCache<Keys<Int4<Group<32>>>, Values<Int4<Group<32>>>, Blocks<16>,
                      ko::Offload<ko::DeviceTier, ko::FileTier, ko::Prefetch<1>>>;
using Host4 = KVCache<Keys<Int4<Group<32>>>, Values<Int4<Group<32>>>, Blocks<16>, ko::Offload<ko::HostTier>>;
using HostFile4 = KVCache<ko::Offload<ko::Prefetch<1>, ko::FileTier, ko::HostTier>, Blocks<16>,
                          Values<Int4<Group<32>>>, Keys<Int4<Group<32>>>>;
// KIVI-style: per-channel INT4 keys, a residual window, 32-token blocks.
using ResidentKivi = KVCache<Keys<Int4<Group<32>>, PerChannel>, Values<Int4<Group<32>>>, Residual<8>, Blocks<32>>;
using FileKivi = KVCache<Keys<Int4<Group<32>>, PerChannel>, Values<Int4<Group<32>>>, Residual<8>, Blocks<32>,
                         ko::Offload<ko::FileTier, ko::Prefetch<2>>>;
// INT8 keys, FP8 values, sinks.
using ResidentK8 = KVCache<Keys<Int8<Group<32>>>, Values<Fp8E4M3<Group<32>>>, Sinks<4>, Blocks<16>>;
using FileK8 = KVCache<Keys<Int8<Group<32>>>, Values<Fp8E4M3<Group<32>>>, Sinks<4>, Blocks<16>,
                       ko::Offload<ko::FileTier, ko::HostTier, ko::Prefetch<1>>>;

template <class Cache>
Cache make(const ko::OffloadOptions& o, std::int64_t max_tokens = 512) {
  auto c = Cache::create(offload_shape(max_tokens), o);
  EXPECT_TRUE(c) << (c ? "" : c.error().message);
  return std::move(c).value();
}
template <class Cache>
Cache make_resident(std::int64_t max_tokens = 512) {
  return std::move(Cache::create(offload_shape(max_tokens))).value();
}

ko::OffloadOptions file_options(const TempDir& dir, uint64_t budget, bool background) {
  ko::OffloadOptions o;
  o.resident_budget_bytes = budget;
  o.file.directory = dir.path();
  o.background = background;
  return o;
}

// Runs the loop on `Off` (offloaded) and `Res` (resident), expects every output bit-identical
// and read_back identical at the end; returns the offloaded cache's metrics.
template <class Res, class Off>
ko::CacheOffloadMetrics expect_identical(const ko::OffloadOptions& o, const std::vector<int>& chunks) {
  Res res = make_resident<Res>();
  Off off = make<Off>(o);
  const auto a = run_loop(res, chunks);
  const auto b = run_loop(off, chunks);
  EXPECT_EQ(a.size(), b.size());
  for (std::size_t i = 0; i < a.size() && i < b.size(); ++i) {
    EXPECT_TRUE(a[i].status) << a[i].status.error().message;
    EXPECT_TRUE(b[i].status) << "chunk " << b[i].chunk << " layer " << b[i].layer << ": " << b[i].status.error().message;
    EXPECT_TRUE(same_bits(a[i].out, b[i].out)) << "chunk " << b[i].chunk << " (" << chunks[static_cast<std::size_t>(b[i].chunk)]
                                               << " tokens), layer " << b[i].layer;
  }
  for (int l = 0; l < res.shape().layers; ++l)
    for (int h = 0; h < res.shape().kv_heads; ++h) {
      auto x = res.read_back(l, h);
      auto y = off.read_back(l, h);
      EXPECT_TRUE(x && y);
      if (x && y) {
        EXPECT_TRUE(same_bits(x->k, y->k) && same_bits(x->v, y->v) && x->positions == y->positions)
            << "layer " << l << " kv_head " << h;
      }
    }
  EXPECT_EQ(res.memory_bytes(), off.memory_bytes());  // logical KV bytes, wherever they live
  EXPECT_TRUE(off.offload().flush());
  return off.offload().metrics();
}

TEST(OffloadCache, FileTierBudgetZeroIsBitIdentical) {
  TempDir dir;
  const auto m = expect_identical<Resident4, File4>(file_options(dir, 0, false), odd_chunks());
  EXPECT_GT(m.store.offloads, 0u);
  EXPECT_GT(m.store.fetches, 0u);
  EXPECT_GT(m.offloaded_bytes, 0u);
  EXPECT_EQ(m.store.offload_failures, 0u);
  EXPECT_EQ(m.store.fetch_failures, 0u);
}

TEST(OffloadCache, FileTierQuarterBudgetBackgroundIsBitIdentical) {
  TempDir dir;
  // ~25 % of the final block bytes: 5 layers x 3 heads x 14 blocks of 16 tokens.
  const std::size_t block = kvpack::make_block_layout<Int4<Group<32>>, Int4<Group<32>>, false>(16, 32, false).bytes;  // no eviction: no slot positions
  const uint64_t budget = 5 * 3 * 14 * block / 4;
  const auto m = expect_identical<Resident4, File4>(file_options(dir, budget, true), odd_chunks(40));
  EXPECT_GT(m.store.offloads, 0u);
  EXPECT_GT(m.store.fetches, 0u);
}

TEST(OffloadCache, HostTierOnlyIsBitIdenticalAndWritesNoFile) {
  TempDir dir;
  ko::OffloadOptions o;
  o.resident_budget_bytes = 0;
  o.background = false;
  o.file.directory = dir.path();  // ignored: the policy has no FileTier
  const auto m = expect_identical<Resident4, Host4>(o, odd_chunks());
  EXPECT_GT(m.store.host_tier_bytes, 0u);
  EXPECT_EQ(m.store.file_tier_bytes, 0u);
  EXPECT_EQ(dir.entries(), 0u);
}

TEST(OffloadCache, HostThenFileSpillIsBitIdentical) {
  TempDir dir;
  ko::OffloadOptions o = file_options(dir, 0, true);
  o.host.capacity_bytes = 20000;  // a few records, the rest spill to the file
  const auto m = expect_identical<Resident4, HostFile4>(o, odd_chunks(30));
  EXPECT_GT(m.store.host_tier_bytes, 0u);
  EXPECT_GT(m.store.file_tier_bytes, 0u);
}

TEST(OffloadCache, PerChannelKeysWithResidualAreBitIdentical) {
  TempDir dir;
  const auto m = expect_identical<ResidentKivi, FileKivi>(file_options(dir, 0, true), odd_chunks(40));
  EXPECT_GT(m.store.offloads, 0u);
}

TEST(OffloadCache, Int8KeysFp8ValuesSinksAreBitIdentical) {
  TempDir dir;
  ko::OffloadOptions o = file_options(dir, 3000, false);
  o.host.encrypt = false;  // authenticated-only host tier
  o.host.capacity_bytes = 10000;
  const auto m = expect_identical<ResidentK8, FileK8>(o, odd_chunks());
  EXPECT_GT(m.store.offloads, 0u);
}

// Keyframe blocks: a block's size follows its interval modes (interval 2 on noise: both modes
// occur). Each is handed over at its own size, every record is that payload + 72 bytes, and
// attention and read_back come back bit-identical.
using KfK = Keyframe<2, Int4<Group<32>>, Fp16, Chained>;
using KfV = Keyframe<2, Int4<Group<32>>, Fp16, Anchor>;
using ResidentKf = KVCache<Keys<KfK>, Values<KfV>>;
using FileKf = KVCache<Keys<KfK>, Values<KfV>, ko::Offload<ko::FileTier>>;

TEST(OffloadCache, KeyframeBlocksRoundTripAtTheSizeTheirModesSay) {
  TempDir dir;
  const auto first = expect_identical<ResidentKf, FileKf>(file_options(dir, 0, false), odd_chunks());
  EXPECT_GT(first.store.offloads, 0u);
  FileKf c = make<FileKf>(file_options(dir, 0, false));
  for (const auto& s : run_loop(c, odd_chunks())) ASSERT_TRUE(s.status) << s.status.error().message;
  c.offload().clear_prefetch_window();
  ASSERT_TRUE(c.offload().flush());
  uint64_t payload = 0, handed = 0, k_delta = 0;
  for (int l = 0; l < 5; ++l)
    for (int h = 0; h < 3; ++h)
      for (const Block& b : c.blocks(l, h))
        if (!b.data) {
          payload += c.block_layout().at(b.header.flags).bytes;
          ++handed, k_delta += (b.header.flags & 2u) != 0;
        }
  EXPECT_GT(k_delta, 0u);
  EXPECT_LT(k_delta, handed) << "both key modes, so blocks of two sizes";
  const auto m = c.offload().metrics();
  EXPECT_EQ(m.handed_blocks, handed);
  EXPECT_EQ(m.store.bytes_written, payload + 72 * handed);
}

TEST(OffloadCache, PlacementResidentLayersAndRecentBlocks) {
  TempDir dir;
  ko::OffloadOptions o = file_options(dir, 0, false);
  o.resident_layers = {1};
  o.keep_recent_blocks = 2;
  File4 c = make<File4>(o);
  for (const auto& s : run_loop(c, odd_chunks(0))) ASSERT_TRUE(s.status) << s.status.error().message;
  c.offload().clear_prefetch_window();
  // 177 tokens: 11 full blocks of 16 and one of 1 token.
  for (int h = 0; h < 3; ++h) {
    EXPECT_EQ(c.offload().handed(0, h), 11 - 2);
    EXPECT_EQ(c.offload().handed(1, h), 0);  // resident layer
    for (int l : {0, 2, 3, 4}) EXPECT_EQ(c.offload().handed(l, h), 11 - 2);
    const auto blocks = c.blocks(0, h);
    ASSERT_EQ(blocks.size(), 12u);
    for (std::size_t b = 0; b < blocks.size(); ++b) EXPECT_EQ(blocks[b].data == nullptr, b < 9) << b;
    for (const Block& b : c.blocks(1, h)) EXPECT_NE(b.data, nullptr);
  }
  ASSERT_TRUE(c.offload().flush());
  const auto m = c.offload().metrics();
  const std::size_t block = c.block_layout().bytes;
  EXPECT_EQ(m.cache_held_bytes, (4 * 3 * (12 - 9) + 3 * 12) * block);
  EXPECT_EQ(m.handed_blocks, 4u * 3u * 9u);
  // Budget 0: after a flush every handed block is offloaded, none in the hot tier.
  EXPECT_EQ(m.store.resident_bytes, 0u);
  EXPECT_EQ(m.offloaded_bytes, m.handed_blocks * block);
  EXPECT_EQ(m.resident_bytes, m.cache_held_bytes);
  // The file holds one sealed record (payload + 72 bytes) per offloaded block.
  EXPECT_EQ(m.store.bytes_written, m.handed_blocks * (block + 72));
}

TEST(OffloadCache, BudgetIsKeptAfterFlush) {
  TempDir dir;
  const std::size_t block = kvpack::make_block_layout<Int4<Group<32>>, Int4<Group<32>>, false>(16, 32, false).bytes;  // no eviction: no slot positions
  for (uint64_t budget_blocks : {0u, 15u, 30u, 80u}) {
    ko::OffloadOptions o = file_options(dir, budget_blocks * block, false);
    File4 c = make<File4>(o);
    for (const auto& s : run_loop(c, odd_chunks(3))) ASSERT_TRUE(s.status) << s.status.error().message;
    c.offload().clear_prefetch_window();
    ASSERT_TRUE(c.offload().flush());
    const auto m = c.offload().metrics();
    // The 15 partial last blocks always stay; beyond them the budget holds.
    EXPECT_LE(m.resident_bytes, std::max<uint64_t>(budget_blocks, 15) * block) << budget_blocks;
    EXPECT_EQ(m.cache_held_bytes, 15 * block);
    EXPECT_EQ(m.store.resident_bytes + m.offloaded_bytes, m.handed_blocks * block);
  }
}

// Flips one byte of the next record read while armed.
class FlipOnRead final : public ko::FileBackend {
 public:
  std::atomic<bool> armed{false};
  std::atomic<int> flips{0};
  ko::SysResult open(const std::string& p, int f, unsigned m) override { return in_->open(p, f, m); }
  ko::SysResult pread(int fd, std::span<std::byte> buf, uint64_t off) override {
    const ko::SysResult r = in_->pread(fd, buf, off);
    if (r.ok() && r.value > 64 && armed.exchange(false)) {
      buf[static_cast<std::size_t>(r.value) / 2] ^= std::byte{0x10};
      ++flips;
    }
    return r;
  }
  ko::SysResult pwrite(int fd, std::span<const std::byte> buf, uint64_t off) override { return in_->pwrite(fd, buf, off); }
  ko::SysResult fsync(int fd) override { return in_->fsync(fd); }
  ko::SysResult ftruncate(int fd, uint64_t n) override { return in_->ftruncate(fd, n); }
  ko::SysResult close(int fd) override { return in_->close(fd); }
  ko::SysResult unlink(const std::string& p) override { return in_->unlink(p); }

 private:
  std::shared_ptr<ko::FileBackend> in_ = ko::PosixFileBackend::shared();
};

TEST(OffloadCache, TamperedBlockIsRejectedNamingItAndNothingIsWritten) {
  TempDir dir;
  auto be = std::make_shared<FlipOnRead>();
  ko::OffloadOptions o = file_options(dir, 0, false);
  o.file.backend = be;
  File4 c = make<File4>(o);
  Resident4 r = make_resident<Resident4>();
  const auto chunks = odd_chunks(0);
  (void)run_loop(r, chunks);
  for (const auto& s : run_loop(c, chunks)) ASSERT_TRUE(s.status) << s.status.error().message;
  c.offload().clear_prefetch_window();  // end the last attend's protection window
  ASSERT_TRUE(c.offload().flush());
  ASSERT_GT(c.offload().metrics().offloaded_bytes, 0u);
  // Attend layer 0 again (its latest chunk is the last one appended).
  const auto d = ko::testing::make_chunk(c.shape(), 0, 177 - 17, 17);
  std::vector<float> out(d.q.size(), 12345.f), ref(d.q.size());
  ASSERT_TRUE(r.attend(0, d.q, ref));
  be->armed = true;
  const Status s = c.attend(0, d.q, out);
  ASSERT_FALSE(s);
  EXPECT_EQ(be->flips.load(), 1);
  EXPECT_EQ(s.error().code, Errc::auth_failed) << s.error().message;
  EXPECT_NE(s.error().message.find("block (layer 0, kv_head 0, block 0)"), std::string::npos) << s.error().message;
  for (float x : out) ASSERT_EQ(x, 12345.f);  // no partial output
  // The record is kept: the next attend reads it intact and matches the resident cache.
  ASSERT_TRUE(c.attend(0, d.q, out));
  EXPECT_TRUE(same_bits(out, ref));
  EXPECT_EQ(c.offload().metrics().store.fetch_failures, 1u);
}

TEST(OffloadCache, NoWaitModeReportsTheMissingBlock) {
  TempDir dir;
  ko::OffloadOptions o = file_options(dir, 0, false);
  o.wait_for_blocks = false;
  File4 c = make<File4>(o);
  const auto d = ko::testing::make_chunk(c.shape(), 0, 0, 40);
  ASSERT_TRUE(c.append(0, d.k, d.v, d.pos));
  ASSERT_TRUE(c.offload().flush());
  std::vector<float> out(d.q.size(), 7.f);
  const Status s = c.attend(0, d.q, out);
  ASSERT_FALSE(s);
  EXPECT_EQ(s.error().code, Errc::not_present);
  EXPECT_NE(s.error().message.find("block (layer 0, kv_head 0, block 0)"), std::string::npos) << s.error().message;
  for (float x : out) ASSERT_EQ(x, 7.f);
}

TEST(OffloadCache, PrefetchHintIsCountedAsHits) {
  TempDir dir;
  File4 c = make<File4>(file_options(dir, 0, true));
  for (const auto& s : run_loop(c, odd_chunks(0))) ASSERT_TRUE(s.status) << s.status.error().message;
  c.offload().clear_prefetch_window();  // end the last attend's protection window
  ASSERT_TRUE(c.offload().flush());
  const auto before = c.offload().metrics();
  ASSERT_EQ(before.store.resident_bytes, 0u);
  c.offload().prefetch(0);       // engine hint: layers 0 and 1 (Prefetch<1>)
  ASSERT_TRUE(c.offload().flush());  // wait for the worker (the window stays protected)
  const auto d = ko::testing::make_chunk(c.shape(), 0, 177 - 17, 17);
  std::vector<float> out(d.q.size());
  ASSERT_TRUE(c.attend(0, d.q, out));
  const auto m = c.offload().metrics();
  EXPECT_EQ(m.store.prefetch_hits - before.store.prefetch_hits, 3u * 11u);  // every block of layer 0
  EXPECT_GT(m.store.prefetch_hit_rate, 0.0);
  EXPECT_GT(m.store.prefetch_hidden_ns, 0u);
  EXPECT_GT(m.store.fetch_p50_us, 0.0);
  EXPECT_GE(m.store.fetch_p99_us, m.store.fetch_p50_us);
  EXPECT_EQ(m.bytes_moved, m.store.bytes_written + m.store.bytes_read);
  EXPECT_GT(m.store.bytes_read, 0u);
}

TEST(OffloadCache, AsyncDecodeUnderPrefetchIsBitIdentical) {
  // The worker writes behind and prefetches while attend pins and reads: the TSan stage runs it.
  TempDir dir;
  const std::size_t block = kvpack::make_block_layout<Int4<Group<32>>, Int4<Group<32>>, false>(16, 32, false).bytes;  // no eviction: no slot positions
  ko::OffloadOptions o = file_options(dir, 40 * block, true);
  o.queue_capacity = 4;
  const auto m = expect_identical<Resident4, HostFile4>(o, odd_chunks(120));
  EXPECT_GT(m.store.fetches, 0u);
  EXPECT_GT(m.store.prefetch_hits + m.store.prefetch_misses, 0u);
  EXPECT_GE(m.store.prefetch_hit_rate, 0.0);
  EXPECT_LE(m.store.prefetch_hit_rate, 1.0);
}

TEST(OffloadCache, ResetErasesOffloadedBlocksAndStaysUsable) {
  TempDir dir;
  File4 c = make<File4>(file_options(dir, 0, true));
  for (const auto& s : run_loop(c, odd_chunks(0))) ASSERT_TRUE(s.status);
  ASSERT_TRUE(c.offload().flush());
  c.reset();
  auto m = c.offload().metrics();
  EXPECT_EQ(m.handed_blocks, 0u);
  EXPECT_EQ(m.store.offloaded_blocks + m.store.resident_blocks, 0u);
  EXPECT_EQ(m.store.file_tier_bytes, 0u);
  // Same data again after reset: identical to a fresh resident cache.
  Resident4 r = make_resident<Resident4>();
  const auto a = run_loop(r, odd_chunks(5));
  const auto b = run_loop(c, odd_chunks(5));
  for (std::size_t i = 0; i < a.size(); ++i) EXPECT_TRUE(b[i].status && same_bits(a[i].out, b[i].out)) << i;
}

TEST(OffloadCache, CreateRejectsBadOptions) {
  ko::OffloadOptions o;
  o.resident_layers = {5};
  auto c = File4::create(offload_shape(), o);
  ASSERT_FALSE(c);
  EXPECT_EQ(c.error().code, Errc::invalid_argument);
  EXPECT_NE(c.error().message.find("resident layer 5"), std::string::npos);
  o.resident_layers = {};
  o.keep_recent_blocks = -1;
  EXPECT_FALSE(File4::create(offload_shape(), o));
}

TEST(OffloadCache, CacheWithoutOffloadHasNoOffloadState) {
  static_assert(!Resident4::offloads && File4::offloads && HostFile4::offloads);
  static_assert(std::is_empty_v<NoOffload::state>);
  SUCCEED();
}

}  // namespace
