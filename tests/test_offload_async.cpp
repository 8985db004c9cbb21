// The background path: bounded queue, prefetcher, write-behind and prefetch racing with the
// cache's reads. Built and run under ThreadSanitizer too (see .ci / the report).
#include <gtest/gtest.h>

#include <atomic>
#include <chrono>
#include <condition_variable>
#include <cstring>
#include <filesystem>
#include <mutex>
#include <random>
#include <thread>
#include <vector>

#include "kvpack/offload.hpp"
#include "support/offload_store_fixtures.hpp"

namespace ko = kvpack::offload;
using kvpack::Errc;
using ko::testing::c11_layout;
using ko::testing::kC11PayloadBytes;
using ko::testing::bytes_of;
using ko::testing::random_payload;
using ko::testing::payload_for;
using ko::testing::TempDir;
using namespace std::chrono_literals;

namespace {

constexpr uint64_t kBlock = kC11PayloadBytes;

// Blocks the next record read or write (offset past the superblock) until release(); a write
// first puts half of its bytes on disk, so a torn record exists while it waits.
class GateBackend final : public ko::FileBackend {
 public:
  void arm_write() { std::lock_guard l(mu_); armed_write_ = true; entered_ = released_ = false; }
  void arm_read() { std::lock_guard l(mu_); armed_read_ = true; entered_ = released_ = false; }
  void wait_entered() { std::unique_lock l(mu_); cv_.wait(l, [&] { return entered_; }); }
  void release() { { std::lock_guard l(mu_); released_ = true; } cv_.notify_all(); }

  ko::SysResult open(const std::string& p, int f, unsigned m) override { return inner_.open(p, f, m); }
  ko::SysResult pread(int fd, std::span<std::byte> b, uint64_t off) override {
    if (off >= 4096 && take(armed_read_)) block();
    return inner_.pread(fd, b, off);
  }
  ko::SysResult pwrite(int fd, std::span<const std::byte> b, uint64_t off) override {
    if (off >= 4096 && take(armed_write_)) {
      auto r = inner_.pwrite(fd, b.first(b.size() / 2), off);
      block();
      return r;
    }
    return inner_.pwrite(fd, b, off);
  }
  ko::SysResult fsync(int fd) override { return inner_.fsync(fd); }
  ko::SysResult ftruncate(int fd, uint64_t s) override { return inner_.ftruncate(fd, s); }
  ko::SysResult close(int fd) override { return inner_.close(fd); }
  ko::SysResult unlink(const std::string& p) override { return inner_.unlink(p); }

 private:
  bool take(bool& flag) {
    std::lock_guard l(mu_);
    return std::exchange(flag, false);
  }
  void block() {
    std::unique_lock l(mu_);
    entered_ = true;
    cv_.notify_all();
    cv_.wait(l, [&] { return released_; });
  }
  ko::PosixFileBackend inner_;
  std::mutex mu_;
  std::condition_variable cv_;
  bool armed_write_ = false, armed_read_ = false, entered_ = false, released_ = false;
};

ko::StoreConfig async_config(uint64_t budget_blocks, const std::string& dir, std::shared_ptr<ko::FileBackend> be = {}) {
  ko::StoreConfig c;
  c.layout = c11_layout();
  c.resident_budget_bytes = budget_blocks * kBlock;
  c.background = true;
  c.file = ko::FileTier{.directory = dir, .backend = std::move(be)};
  return c;
}

}  // namespace

// ---- queue and worker --------------------------------------------------------------------------

TEST(OffloadQueue, ManyProducersAndConsumers) {
  ko::BoundedQueue<int> q(8);
  std::atomic<long> sum{0};
  std::atomic<int> popped{0};
  std::atomic<bool> over_capacity{false};
  std::vector<std::thread> consumers, producers;
  for (int c = 0; c < 2; ++c)
    consumers.emplace_back([&] {
      while (auto v = q.pop()) {
        if (q.size() > q.capacity()) over_capacity = true;
        sum += *v;
        ++popped;
      }
    });
  for (int p = 0; p < 4; ++p)
    producers.emplace_back([&, p] {
      for (int i = 1; i <= 2000; ++i) ASSERT_TRUE(q.push(p * 10000 + i));
    });
  for (auto& t : producers) t.join();
  q.close();
  for (auto& t : consumers) t.join();
  EXPECT_EQ(popped.load(), 8000);
  long want = 0;
  for (int p = 0; p < 4; ++p)
    for (int i = 1; i <= 2000; ++i) want += p * 10000 + i;
  EXPECT_EQ(sum.load(), want);
  EXPECT_FALSE(over_capacity.load());
  EXPECT_FALSE(q.try_push(1));
  EXPECT_FALSE(q.push(1));
  EXPECT_FALSE(q.pop().has_value());
}

TEST(OffloadQueue, CloseDrainsWhatIsLeft) {
  ko::BoundedQueue<int> q(3);
  EXPECT_TRUE(q.try_push(1));
  EXPECT_TRUE(q.try_push(2));
  EXPECT_TRUE(q.try_push(3));
  EXPECT_FALSE(q.try_push(4));  // full
  q.close();
  EXPECT_EQ(q.pop().value(), 1);
  EXPECT_EQ(q.pop().value(), 2);
  EXPECT_EQ(q.pop().value(), 3);
  EXPECT_FALSE(q.pop());
}

TEST(OffloadPrefetcher, DropsWhenFullAndCoalescesRebalance) {
  std::mutex mu;
  std::condition_variable cv;
  bool open = false;
  int entered = 0;
  std::atomic<int> fetches{0}, rebalances{0};
  ko::Prefetcher pf(2, [&](const ko::IoJob& j) {
    std::unique_lock l(mu);
    ++entered;
    cv.notify_all();
    cv.wait(l, [&] { return open; });
    (j.kind == ko::IoJob::Kind::rebalance ? rebalances : fetches)++;
  });
  EXPECT_TRUE(pf.request({0, 0}));
  {
    std::unique_lock l(mu);  // the worker holds job 0: the queue is empty
    cv.wait(l, [&] { return entered == 1; });
  }
  EXPECT_TRUE(pf.request({1, 1}));
  EXPECT_TRUE(pf.request_rebalance());
  EXPECT_TRUE(pf.request_rebalance());  // coalesced with the queued one
  EXPECT_EQ(pf.dropped(), 0u);
  EXPECT_FALSE(pf.request({2, 2}));  // the queue of 2 is full
  EXPECT_EQ(pf.dropped(), 1u);
  {
    std::lock_guard l(mu);
    open = true;
  }
  cv.notify_all();
  pf.drain();
  EXPECT_EQ(rebalances.load(), 1);
  EXPECT_EQ(fetches.load(), 2);
  EXPECT_TRUE(pf.request_rebalance());  // not queued any more: a new one is accepted
  pf.drain();
  EXPECT_EQ(rebalances.load(), 2);
  pf.stop();
  EXPECT_FALSE(pf.request({3, 3}));
}

// ---- C11: restore while an async offload is in flight ------------------------------------------

// The write-behind of block A is stuck halfway (a torn record is on disk). Reading A meanwhile
// returns the complete resident copy, never the torn bytes; replacing A waits for the write.
TEST(OffloadAsync, RestoreDuringOffloadReturnsTheCompleteBlock) {
  TempDir dir;
  auto gate = std::make_shared<GateBackend>();
  auto store = ko::OffloadStore::create(async_config(1, dir.path(), gate)).value();
  const ko::BlockKey a{0, 0, 0}, b{0, 0, 1};
  ASSERT_TRUE(store->put(a, 64, payload_for(a)));
  gate->arm_write();
  ASSERT_TRUE(store->put(b, 64, payload_for(b)));  // over budget: the worker starts writing A
  gate->wait_entered();

  EXPECT_TRUE(store->is_resident(a));
  auto t = store->try_acquire(a);
  ASSERT_TRUE(t) << t.error().message;
  EXPECT_EQ(bytes_of(*t), payload_for(a));
  auto h = store->acquire(a);
  ASSERT_TRUE(h);
  EXPECT_EQ(bytes_of(*h), payload_for(a));

  std::atomic<bool> replaced{false};
  std::thread writer([&] {
    ASSERT_TRUE(store->put(a, 64, payload_for(a, 1)));
    replaced = true;
  });
  std::this_thread::sleep_for(50ms);
  EXPECT_FALSE(replaced.load());  // waits for the in-flight write of A
  gate->release();
  writer.join();
  EXPECT_TRUE(replaced.load());
  EXPECT_EQ(bytes_of(*h), payload_for(a));  // the old view is still complete
  ASSERT_TRUE(store->flush());
  EXPECT_EQ(bytes_of(store->acquire(a).value()), payload_for(a, 1));
  EXPECT_EQ(bytes_of(store->acquire(b).value()), payload_for(b));
}

// A prefetch of A is stuck in its read: try_acquire says not present, acquire waits and then
// gets every byte.
TEST(OffloadAsync, RestoreDuringFetchWaitsOrSaysNotPresent) {
  TempDir dir;
  auto gate = std::make_shared<GateBackend>();
  auto store = ko::OffloadStore::create(async_config(1, dir.path(), gate)).value();
  const ko::BlockKey a{1, 0, 0}, b{2, 0, 1};
  ASSERT_TRUE(store->put(a, 64, payload_for(a)));
  ASSERT_TRUE(store->put(b, 64, payload_for(b)));
  ASSERT_TRUE(store->flush());
  ASSERT_FALSE(store->is_resident(a));

  gate->arm_read();
  EXPECT_TRUE(store->prefetch({1, 1}));
  gate->wait_entered();
  auto t = store->try_acquire(a);
  ASSERT_FALSE(t);
  EXPECT_EQ(t.error().code, Errc::not_present);
  EXPECT_NE(t.error().message.find("being fetched"), std::string::npos) << t.error().message;

  std::atomic<bool> done{false};
  std::vector<std::byte> got;
  std::thread reader([&] {
    auto h = store->acquire(a);
    ASSERT_TRUE(h) << h.error().message;
    got = bytes_of(*h);
    done = true;
  });
  std::this_thread::sleep_for(50ms);
  EXPECT_FALSE(done.load());
  gate->release();
  reader.join();
  EXPECT_EQ(got, payload_for(a));
  EXPECT_EQ(store->metrics().prefetch_misses, 1u);  // it had to wait
  ASSERT_TRUE(store->flush());
}

// Double buffering in a layer-by-layer decode loop: while layer l is read, layer l+1 is
// prefetched and protected. With the fetch finishing before the layer is needed (drained here
// to make it deterministic) every offloaded block is a prefetch hit.
TEST(OffloadAsync, PrefetchHidesFetchesInADecodeLoop) {
  TempDir dir;
  constexpr int kLayers = 4, kHeads = 8;
  auto cfg = async_config(2 * kHeads, dir.path());
  cfg.layers = kLayers;
  auto store = ko::OffloadStore::create(cfg).value();
  for (int l = 0; l < kLayers; ++l)
    for (int h = 0; h < kHeads; ++h) ASSERT_TRUE(store->put({l, h, 0}, 64, payload_for({l, h, 0})));
  ASSERT_TRUE(store->flush());
  EXPECT_LE(store->metrics().resident_bytes, 2 * kHeads * kBlock);
  store->prefetch({0, 0});  // what the previous token's last layer would have asked for
  ASSERT_TRUE(store->flush());
  for (int step = 0; step < 3; ++step) {
    for (int l = 0; l < kLayers; ++l) {
      store->prefetch({l, l + 1});  // protect l until pinned, fetch l+1 (wraps to 0)
      std::vector<ko::BlockHandle> pinned;
      for (int h = 0; h < kHeads; ++h) {
        auto got = store->acquire({l, h, 0});
        ASSERT_TRUE(got) << got.error().message;
        ASSERT_EQ(bytes_of(*got), payload_for({l, h, 0}));
        pinned.push_back(std::move(got).value());
      }
      ASSERT_TRUE(store->flush());  // "compute" of layer l outlasts the prefetch of l+1
    }
  }
  const auto m = store->metrics();
  EXPECT_GT(m.prefetch_hits, 0u);
  EXPECT_EQ(m.prefetch_misses, 0u);
  EXPECT_EQ(m.prefetch_hit_rate, 1.0);
  EXPECT_GT(m.prefetch_hidden_ns, 0u);
  EXPECT_GT(m.fetches, 0u);
  EXPECT_EQ(m.fetch_failures, 0u);
}

// ---- stress (the ThreadSanitizer target) -------------------------------------------------------

namespace {
constexpr uint32_t kSmall = 2048;
std::vector<std::byte> stamped(const ko::BlockKey& k, uint64_t gen) {
  auto p = random_payload(kSmall, (static_cast<uint64_t>(k.layer) << 40) ^ (static_cast<uint64_t>(k.kv_head) << 32) ^
                                      (static_cast<uint64_t>(k.block_index) << 24) ^ gen);
  std::memcpy(p.data(), &gen, sizeof gen);
  return p;
}
bool consistent(const ko::BlockKey& k, std::span<const std::byte> b) {
  if (b.size() != kSmall) return false;
  uint64_t gen;
  std::memcpy(&gen, b.data(), sizeof gen);
  const auto want = stamped(k, gen);
  return std::equal(b.begin(), b.end(), want.begin());
}
}  // namespace

TEST(OffloadAsync, ConcurrentReadersWritersAndWorkerStayConsistent) {
  TempDir dir;
  ko::StoreConfig c;
  c.layout = c11_layout();
  c.layout.max_payload_bytes = kSmall;
  c.resident_budget_bytes = 6 * kSmall;
  c.host = ko::HostTier{.capacity_bytes = 4 * ko::record_bytes(kSmall)};
  c.file = ko::FileTier{.directory = dir.path()};
  c.queue_capacity = 4;
  auto store = ko::OffloadStore::create(c).value();

  std::atomic<uint64_t> gen{1};
  std::atomic<int> bad{0}, unexpected{0}, ok_reads{0};
  auto worker = [&](unsigned seed) {
    std::mt19937 rng(seed);
    for (int i = 0; i < 1500; ++i) {
      const ko::BlockKey k{static_cast<int32_t>(rng() % 4), static_cast<int32_t>(rng() % 2),
                           static_cast<int64_t>(rng() % 4)};
      const unsigned op = rng() % 100;
      if (op < 25) {
        if (!store->put(k, 64, stamped(k, gen++))) ++unexpected;
      } else if (op < 65) {
        auto h = store->acquire(k);
        if (h) {
          ++ok_reads;
          if (!consistent(k, h->bytes())) ++bad;
        } else if (h.error().code != Errc::not_present) {
          ++unexpected;
        }
      } else if (op < 75) {
        auto h = store->try_acquire(k);
        if (h && !consistent(k, h->bytes())) ++bad;
      } else if (op < 82) {
        auto s = store->offload(k);
        if (!s && s.error().code != Errc::not_present) ++unexpected;
      } else if (op < 87) {
        (void)store->erase(k);
      } else if (op < 95) {
        const int32_t l = static_cast<int32_t>(rng() % 4);
        store->prefetch({l, l});
      } else if (op < 98) {
        store->pin_layer(static_cast<int32_t>(rng() % 4), rng() % 2 == 0);
      } else {
        (void)store->metrics();
      }
    }
  };
  std::vector<std::thread> threads;
  for (unsigned t = 0; t < 3; ++t) threads.emplace_back(worker, 1000 + t);
  for (auto& t : threads) t.join();
  for (int l = 0; l < 4; ++l) store->pin_layer(l, false);
  store->prefetch({});
  EXPECT_TRUE(store->flush());
  EXPECT_EQ(bad.load(), 0);
  EXPECT_EQ(unexpected.load(), 0);
  EXPECT_GT(ok_reads.load(), 100);
  for (int l = 0; l < 4; ++l)
    for (int h = 0; h < 2; ++h)
      for (int b = 0; b < 4; ++b) {
        const ko::BlockKey k{l, h, b};
        if (!store->contains(k)) continue;
        auto got = store->acquire(k);
        ASSERT_TRUE(got) << got.error().message;
        EXPECT_TRUE(consistent(k, got->bytes()));
      }
  EXPECT_TRUE(store->flush());  // the reads above pulled blocks in; write-behind settles
  const auto m = store->metrics();
  EXPECT_EQ(m.offload_failures, 0u);
  EXPECT_EQ(m.fetch_failures, 0u);
  EXPECT_LE(m.resident_bytes, c.resident_budget_bytes);
}

TEST(OffloadAsync, DestroyWithWorkPendingIsClean) {
  for (int round = 0; round < 5; ++round) {
    TempDir dir;
    {
      auto store = ko::OffloadStore::create(async_config(1, dir.path())).value();
      for (int b = 0; b < 20; ++b) ASSERT_TRUE(store->put({b % 3, 0, b}, 64, payload_for({b % 3, 0, b})));
      store->prefetch({0, 2});
    }
    EXPECT_EQ(dir.entries(), 0u);
  }
}
