// Many threads decode different sequences of one PagedCache at once (append + attend, forks and
// frees of their own sequences, pages taken and released concurrently), each with its own
// Workspace; results equal a serial run bit for bit. Also with eviction (H2O, SinkWindow): each
// sequence's scores and policy state are its own, its pages copied before a shared one changes.
// Every other sequence swaps itself out and back in now and then, through one shared
// HostSwapTarget, while the others take and release pages.
// Run under ThreadSanitizer (label tsan).
#include <gtest/gtest.h>

#include <thread>
#include <vector>

#include "kvpack/pool/page_swap.hpp"
#include "support/pool_twin.hpp"

namespace pool_threads_test {

using namespace kvpack;  // NOLINT: test file

using ResidualPool = PagedCache<Keys<Int4<>>, Values<Int4<>>, Residual<8>, Blocks<32>>;
using H2OPool = PagedCache<Keys<Int8<>>, Values<Int4<>>, H2O<16, 16, 4>, Blocks<32>>;  // holds 36 tokens
using SinkWindowPool = PagedCache<Keys<Int4<>>, Values<Int4<>>, SinkWindow<4, 28>, Blocks<32>>;
const ModelShape kShape{.layers = 2, .q_heads = 4, .kv_heads = 2, .head_dim = 32, .max_tokens = 1024};
const std::size_t kRow = 2 * 32, kQRow = 4 * 32;
constexpr int kThreads = 6, kSteps = 70;

// Sequence s decodes kSteps tokens after a prompt of 20 + 7 s; returns the outputs of every step.
// (The evicting pools hold 32-36 tokens: every sequence evicts, before and after its fork.)
template <class Pool>
std::vector<float> run(Pool& pool, int s, bool fork_midway, HostSwapTarget& swap) {
  std::vector<float> outs;
  Workspace ws;
  SeqId id = pool.create_sequence().value();
  auto feed = [&](int first, int n) {
    for (int l = 0; l < kShape.layers; ++l) {
      const auto k = kvtest::normal(static_cast<size_t>(n) * kRow, static_cast<std::uint32_t>(s * 100000 + first * 4 + l));
      EXPECT_TRUE(pool.append(id, l, k, k, kvtest::iota_positions(first, n)));
    }
  };
  const int prompt = 20 + 7 * s;
  feed(0, prompt);
  for (int t = 0; t < kSteps; ++t) {
    feed(prompt + t, 1);
    if (fork_midway && t == kSteps / 2) {  // continue on a fork, free the original
      const SeqId child = pool.fork(id).value();
      EXPECT_TRUE(pool.free_sequence(id));
      id = child;
    }
    if (t % 10 == 5) {  // preempted and resumed (odd s: right after its fork took over): outputs must not notice
      EXPECT_TRUE(pool.swap_out(id, swap));
      EXPECT_TRUE(pool.swap_in(id));
    }
    const auto q = kvtest::normal(kQRow, static_cast<std::uint32_t>(s * 7 + t));
    std::vector<float> out(kQRow);
    for (int l = 0; l < kShape.layers; ++l) {
      EXPECT_TRUE(pool.attend(id, l, q, out, ws));
      outs.insert(outs.end(), out.begin(), out.end());
    }
  }
  EXPECT_TRUE(pool.free_sequence(id));
  return outs;
}

template <class Pool>
class PoolThreads : public ::testing::Test {};
using Pools = ::testing::Types<ResidualPool, H2OPool, SinkWindowPool>;
TYPED_TEST_SUITE(PoolThreads, Pools);

TYPED_TEST(PoolThreads, ConcurrentDecodeOfDifferentSequencesEqualsSerial) {
  using Pool = TypeParam;
  auto make = [] {
    return Pool::create({.shape = kShape, .byte_budget = 1 << 22, .max_sequences = 2 * kThreads}).value();
  };
  Pool serial = make();
  std::vector<std::vector<float>> want(kThreads), got(kThreads);
  HostSwapTarget swap;
  for (int s = 0; s < kThreads; ++s) want[static_cast<std::size_t>(s)] = run(serial, s, s % 2 == 1, swap);
  Pool shared = make();
  std::vector<std::thread> threads;
  for (int s = 0; s < kThreads; ++s)
    threads.emplace_back([&, s] { got[static_cast<std::size_t>(s)] = run(shared, s, s % 2 == 1, swap); });
  for (auto& t : threads) t.join();
  for (int s = 0; s < kThreads; ++s) EXPECT_TRUE(kvtest::same_bits(got[static_cast<std::size_t>(s)], want[static_cast<std::size_t>(s)])) << s;
  EXPECT_EQ(shared.stats().pages_used, 0u);
  EXPECT_EQ(swap.pages(), 0u);
}

// Attends change no output until the next append (eviction scores only count then), so every
// repeated batch equals the first, evicting or not.
TYPED_TEST(PoolThreads, BatchedDecodeOnThreadsWhileOtherSequencesAppend) {
  using Pool = TypeParam;
  auto pool = Pool::create({.shape = kShape, .byte_budget = 1 << 22, .max_sequences = 16}).value();
  std::vector<SeqId> batch;
  for (int i = 0; i < 8; ++i) {
    batch.push_back(pool.create_sequence().value());
    const auto k = kvtest::normal(static_cast<size_t>(40 + i) * kRow, static_cast<std::uint32_t>(i));
    for (int l = 0; l < kShape.layers; ++l) ASSERT_TRUE(pool.append(batch.back(), l, k, k, kvtest::iota_positions(0, 40 + i)));
  }
  const auto q = kvtest::normal(8 * kQRow, 5);
  std::vector<float> want(q.size()), got(q.size());
  std::vector<Workspace> ws(4);
  ASSERT_TRUE(pool.attend_batch(1, batch, q, want, serial_executor(), ws));
  std::thread writer([&] {  // other sequences grow and go meanwhile
    for (int r = 0; r < 20; ++r) {
      const SeqId id = pool.create_sequence().value();
      const auto k = kvtest::normal(64 * kRow, static_cast<std::uint32_t>(r));
      for (int l = 0; l < kShape.layers; ++l) EXPECT_TRUE(pool.append(id, l, k, k, kvtest::iota_positions(0, 64)));
      EXPECT_TRUE(pool.free_sequence(id));
    }
  });
  for (int r = 0; r < 20; ++r) {
    ASSERT_TRUE(pool.attend_batch(1, batch, q, got, thread_executor(4), ws));
    EXPECT_TRUE(kvtest::same_bits(got, want));
  }
  writer.join();
}

}  // namespace pool_threads_test
