// Helpers of the RemotePoolPrefixShare tests (test_remote_pool_prefix.cpp and
// test_remote_pool_prefix_faults.cpp, one executable): the pool types, a key and a tier per test
// server, pools fed with synthetic K/V, page and decode comparison between two sequences, and
// `consume` (pool B attaches a prompt from the tier, appends the rest and must equal pool A's
// sequence that appended it itself). Anonymous namespace: each test file gets its own copy.
#pragma once

#include <gtest/gtest.h>

#include <algorithm>
#include <array>
#include <chrono>
#include <cmath>
#include <cstring>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include <kvpack/offload/crypto.hpp>
#include <kvpack/offload/remote_pool_prefix.hpp>

#include "redis_server_process.hpp"
#include "synthetic_prefix.hpp"

namespace {

namespace ko = kvpack::offload;
using kvpack::SeqId;
using kvpack_remote_test::RedisServerProcess;
using namespace kvpack;  // NOLINT: test file (policy names)

using PoolInt8 = PagedCache<Keys<Int8<Group<32>>>, Values<Int8<Group<32>>>, Blocks<32>>;
using PoolInt4 = PagedCache<Keys<Int4<Group<32>>>, Values<Int4<Group<32>>>, Blocks<32>>;  // = SynthCache's policies
using PoolKivi = PagedCache<Keys<Int4<Group<32>>, PerChannel>, Values<Int4<>>, Residual<16>, Blocks<64>>;
using PoolSinks = PagedCache<Keys<Int4<Group<32>>>, Values<Int4<Group<32>>>, Sinks<4>, Blocks<32>>;
const char* const kModel = "synthetic-model";

ko::StaticKeyProvider test_key(unsigned char salt = 1) {
  std::array<std::byte, 32> k{};
  for (std::size_t i = 0; i < k.size(); ++i) k[i] = std::byte(static_cast<unsigned char>(i * 7 + salt));
  return ko::StaticKeyProvider::create(k).value();
}

std::unique_ptr<ko::RemoteTier> tier_for(const std::string& url) {
  ko::RemoteConfig c;
  c.url = url;
  c.connect_timeout = std::chrono::milliseconds(300);
  c.command_timeout = std::chrono::milliseconds(300);
  c.retry_after = std::chrono::milliseconds(0);
  c.password_env = "KVPACK_TEST_REMOTE_NO_PASSWORD";
  return ko::RemoteTier::create(c).value();
}

// A redis-server for this test (unix socket in a temp folder); the test skips when it cannot start.
std::optional<RedisServerProcess> start_server(std::string* why) { return RedisServerProcess::start({}, why); }
#define START_SERVER_OR_SKIP(var) \
  std::string why_##var;          \
  auto var = start_server(&why_##var); \
  if (!var) GTEST_SKIP() << "redis-server not available: " << why_##var

template <class Pool>
Pool make_pool(std::size_t budget = std::size_t{1} << 24) {
  return Pool::create({.shape = kvpack_remote_test::synth_shape(), .byte_budget = budget, .max_sequences = 4}).value();
}

// A pool sequence seen as a single cache by synth_append (K/V from token, position, layer).
template <class Pool>
struct SeqView {
  Pool& pool;
  SeqId id;
  const ModelShape& shape() const { return pool.shape(); }
  Status append(int l, std::span<const float> k, std::span<const float> v, std::span<const std::int32_t> pos) {
    return pool.append(id, l, k, v, pos);
  }
};
template <class Pool>
void feed(Pool& pool, SeqId id, const std::vector<int32_t>& prompt, int64_t from, int64_t to) {
  SeqView<Pool> s{pool, id};
  ASSERT_TRUE(kvpack_remote_test::synth_append(s, prompt, from, to));
}

// Pages of (every layer, KV head) of two sequences: same counts, same bytes.
template <class PA, class PB>
::testing::AssertionResult same_pages(const PA& a, SeqId ia, const PB& b, SeqId ib) {
  for (int l = 0; l < a.shape().layers; ++l)
    for (int h = 0; h < a.shape().kv_heads; ++h) {
      auto pa = a.pages(ia, l, h), pb = b.pages(ib, l, h);
      if (!pa || !pb || pa->size() != pb->size()) return ::testing::AssertionFailure() << "page tables differ at " << l << "/" << h;
      for (std::size_t i = 0; i < pa->size(); ++i)
        if ((*pa)[i].header.count != (*pb)[i].header.count ||
            std::memcmp((*pa)[i].data, (*pb)[i].data, a.block_layout().bytes) != 0)
          return ::testing::AssertionFailure() << "layer " << l << " head " << h << " page " << i << " differs";
    }
  return ::testing::AssertionSuccess();
}

// Appends the same decode tokens to both sequences and compares every layer's attention bits.
template <class Pool>
::testing::AssertionResult same_decode(Pool& a, SeqId ia, Pool& b, SeqId ib, const std::vector<int32_t>& prompt) {
  const auto n = static_cast<int64_t>(prompt.size());
  auto ext = prompt;
  for (int i = 0; i < 3; ++i) ext.push_back(1000 + i);
  const std::size_t qn = static_cast<std::size_t>(a.shape().q_heads * a.shape().head_dim);
  Workspace ws;
  for (int64_t t = n; t < n + 3; ++t) {
    feed(a, ia, ext, t, t + 1);
    feed(b, ib, ext, t, t + 1);
    for (int l = 0; l < a.shape().layers; ++l) {
      std::vector<float> q(qn), oa(qn), ob(qn);
      for (std::size_t i = 0; i < qn; ++i) q[i] = static_cast<float>(std::sin(0.37 * static_cast<double>(i + 7 * t + l)));
      if (!a.attend(ia, l, q, oa, ws) || !b.attend(ib, l, q, ob, ws)) return ::testing::AssertionFailure() << "attend failed";
      if (std::memcmp(oa.data(), ob.data(), qn * sizeof(float)) != 0)
        return ::testing::AssertionFailure() << "decode differs at token " << t << " layer " << l;
    }
  }
  return ::testing::AssertionSuccess();
}

// Tokens appending the whole prompt commits, in whole pages: what attach may take.
template <class Pool>
int64_t attachable(int64_t n) {
  return pool_detail::commit_count(n, Pool::residual_tokens, Pool::commit_unit) / Pool::block_tokens * Pool::block_tokens;
}

// Pool B attaches `prompt` from the tier, appends the rest; its pages and decode must equal a
// sequence of pool A that appended the prompt itself. Returns tokens attached.
template <class Pool>
int64_t consume(ko::RemotePoolPrefixShare<Pool>& share, Pool& a, const std::vector<int32_t>& prompt, int batch = 8) {
  const SeqId ref = a.create_sequence().value();
  feed(a, ref, prompt, 0, static_cast<int64_t>(prompt.size()));
  Pool b = make_pool<Pool>();
  const SeqId id = b.create_sequence().value();
  auto got = share.attach(b, id, prompt, batch);
  EXPECT_TRUE(got) << got.error().message;
  const int64_t m = got ? *got : -1;
  EXPECT_EQ(b.length(id).value(), std::max<int64_t>(m, 0));
  feed(b, id, prompt, std::max<int64_t>(m, 0), static_cast<int64_t>(prompt.size()));
  EXPECT_TRUE(same_pages(a, ref, b, id));
  EXPECT_TRUE(same_decode(a, ref, b, id, prompt));
  EXPECT_TRUE(a.free_sequence(ref));
  return m;
}

}  // namespace
