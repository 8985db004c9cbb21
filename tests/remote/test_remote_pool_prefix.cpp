// RemotePoolPrefixShare (offload/remote_pool_prefix.hpp) against a real redis-server that each
// test starts itself (unix socket in a temp folder; skipped when redis-server cannot start). Two
// PagedCache pools in this process stand for two serving processes (separate pools, the same
// secret): pool A prefills and publishes, pool B attaches a new sequence from the tier and appends
// the rest. Checked: B's pages are A's bytes and B decodes bit-identically to A's sequence that
// appended the prompt itself (prompt lengths 1, 31, 33, 95, 200 with 32- and 64-token pages: partial
// pages are never published; INT8 g32, INT4 g32, per-channel INT4 keys with Residual<16>); pages
// are exchanged with a single-sequence KVCache of the same policies both ways; a tampered value,
// a wrong secret, another codec (and its value forged under our key), an evicted page, a server
// that stops answering (timeout), killed before the attach or during it only shorten the import; pool exhaustion on B is an error
// leaving the sequence empty and the pool unchanged; Sinks<N> is Errc::unsupported.
#include <gtest/gtest.h>
#include <hiredis/hiredis.h>

#include <array>
#include <chrono>
#include <cstring>
#include <optional>
#include <string>
#include <thread>
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

// The error code of a result, or "no error" (as a string, so a success fails the EXPECT readably).
template <class R>
std::string code_of(const R& r) { return r ? "no error" : std::to_string(static_cast<int>(r.error().code)); }
std::string code_of(Errc c) { return std::to_string(static_cast<int>(c)); }

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

std::string raw_get(redisContext* c, const std::string& key) {
  auto* r = static_cast<redisReply*>(redisCommand(c, "GET %b", key.data(), key.size()));
  std::string v = r && r->type == REDIS_REPLY_STRING ? std::string(r->str, r->len) : std::string();
  if (r) freeReplyObject(r);
  return v;
}
void raw_cmd(redisContext* c, const char* verb, const std::string& key, const std::string* value = nullptr) {
  auto* r = static_cast<redisReply*>(value ? redisCommand(c, "%s %b %b", verb, key.data(), key.size(), value->data(), value->size())
                                           : redisCommand(c, "%s %b", verb, key.data(), key.size()));
  if (r) freeReplyObject(r);
}
// The tier key of page `page`, (layer, head), of `prompt` for a pool of type Pool.
template <class Pool>
std::string key_of(const Pool& pool, const ko::RemoteTier& tier, const std::vector<int32_t>& prompt, int64_t page, int l, int h) {
  const auto d = ko::prefix_page_digests(kModel, prompt, Pool::block_tokens);
  const ko::PageCoord at{l, h, pool.shape().kv_heads, page};
  return tier.config().key_prefix + ko::page_key(d[static_cast<std::size_t>(page)], at, ko::layout_for(pool), ko::Aead::xchacha20poly1305).hex();
}

// ---- round trip, per codec ------------------------------------------------------------------
template <class Pool>
class PoolRoundTrip : public ::testing::Test {};
using Pools = ::testing::Types<PoolInt8, PoolInt4, PoolKivi>;
TYPED_TEST_SUITE(PoolRoundTrip, Pools);

TYPED_TEST(PoolRoundTrip, AttachedPagesAreThePublishersAndDecodeBitIdentical) {
  using Pool = TypeParam;
  constexpr int B = Pool::block_tokens;
  START_SERVER_OR_SKIP(server);
  auto tier = tier_for(server->url());
  Pool a = make_pool<Pool>();
  auto share = ko::RemotePoolPrefixShare<Pool>::create(a, *tier, test_key(), kModel).value();
  for (int n : {1, 31, 33, 95, 200, 3 * B, 3 * B + 1}) {
    SCOPED_TRACE("prompt of " + std::to_string(n) + " tokens, pages of " + std::to_string(B));
    const auto prompt = kvpack_remote_test::synth_prompt(n, static_cast<uint32_t>(n));
    const SeqId pub = a.create_sequence().value();
    feed(a, pub, prompt, 0, n);
    auto rep = share.publish(a, pub, prompt);
    ASSERT_TRUE(rep) << rep.error().message;
    // Published: the full pages the publisher committed; never a partial page.
    EXPECT_EQ(rep->pages, attachable<Pool>(n) / B);
    EXPECT_EQ(rep->stored, static_cast<uint64_t>(rep->pages) * 4 * 2);
    EXPECT_EQ(consume(share, a, prompt), attachable<Pool>(n));
    // A prompt that is a prefix of the published one attaches only what appending it commits
    // (Residual<16>: fewer pages than it covers); one sharing only the first page, at most that.
    if (n >= 3 * B) {
      const std::vector<int32_t> head(prompt.begin(), prompt.begin() + 2 * B + 12);
      EXPECT_EQ(consume(share, a, head), attachable<Pool>(2 * B + 12));
      auto other = prompt;
      other[static_cast<std::size_t>(B) + 3] ^= 0x55;
      EXPECT_EQ(consume(share, a, other), std::min<int64_t>(B, attachable<Pool>(n)));
    }
    ASSERT_TRUE(a.free_sequence(pub));
  }
  EXPECT_EQ(tier->stats().error(ko::RemoteError::rejected), 0u);
}

// ---- the same records as a single-sequence KVCache of the same policies -----------------------
TEST(RemotePoolPrefix, PagesAreExchangedWithKVCacheBothWays) {
  START_SERVER_OR_SKIP(server);
  auto tier = tier_for(server->url());
  using kvpack_remote_test::SynthCache;
  const auto prompt = kvpack_remote_test::synth_prompt(5 * 32 + 7, 3);
  const auto n = static_cast<int64_t>(prompt.size());
  SynthCache single = SynthCache::create(kvpack_remote_test::synth_shape()).value();
  ASSERT_TRUE(kvpack_remote_test::synth_append(single, prompt, 0, n));
  auto cshare = ko::RemotePrefixShare<SynthCache>::create(single, *tier, test_key(), kModel).value();
  PoolInt4 a = make_pool<PoolInt4>();
  auto pshare = ko::RemotePoolPrefixShare<PoolInt4>::create(a, *tier, test_key(), kModel).value();
  EXPECT_EQ(ko::layout_for(a).max_payload_bytes, ko::layout_for(single).max_payload_bytes);
  // KVCache publishes, the pool attaches: its pages are the KVCache's blocks.
  EXPECT_EQ(cshare.publish(single, prompt).stored, 5u * 4 * 2);
  const SeqId id = a.create_sequence().value();
  ASSERT_EQ(pshare.attach(a, id, prompt).value(), 5 * 32);
  for (int l = 0; l < 4; ++l)
    for (int h = 0; h < 2; ++h) {
      const auto pages = a.pages(id, l, h).value();
      const auto blocks = single.blocks(l, h);
      ASSERT_EQ(pages.size(), 5u);
      for (std::size_t p = 0; p < 5; ++p)
        EXPECT_EQ(std::memcmp(pages[p].data, blocks[p].data.get(), a.block_layout().bytes), 0) << l << "/" << h << "/" << p;
    }
  // The pool publishes (after a flush), a fresh KVCache imports: equal to the one that appended.
  auto* admin = server->connect();
  ASSERT_NE(admin, nullptr);
  freeReplyObject(redisCommand(admin, "FLUSHALL"));
  redisFree(admin);
  const SeqId pub = a.create_sequence().value();
  feed(a, pub, prompt, 0, n);
  EXPECT_EQ(pshare.publish(a, pub, prompt).value().stored, 5u * 4 * 2);
  SynthCache fresh = SynthCache::create(kvpack_remote_test::synth_shape()).value();
  ASSERT_EQ(cshare.import(fresh, prompt).value(), 5 * 32);
  ASSERT_TRUE(kvpack_remote_test::synth_append(fresh, prompt, 5 * 32, n));
  std::string why;
  EXPECT_TRUE(kvpack_remote_test::synth_same(single, fresh, &why)) << why;
}

// ---- the local prefix cache first, the tier from there on ----------------------------------
TEST(RemotePoolPrefix, ContinuesAfterTheLocalPrefixCache) {
  START_SERVER_OR_SKIP(server);
  auto tier = tier_for(server->url());
  const auto prompt = kvpack_remote_test::synth_prompt(6 * 32 + 5, 4);
  const auto n = static_cast<int64_t>(prompt.size());
  PoolInt4 a = make_pool<PoolInt4>(), b = make_pool<PoolInt4>();
  auto share = ko::RemotePoolPrefixShare<PoolInt4>::create(a, *tier, test_key(), kModel).value();
  const SeqId pub = a.create_sequence().value();
  feed(a, pub, prompt, 0, n);
  ASSERT_TRUE(share.publish(a, pub, prompt));
  // B published 2 pages of this prompt locally before.
  const SeqId early = b.create_sequence().value();
  feed(b, early, prompt, 0, 2 * 32 + 1);
  ASSERT_EQ(b.publish_prefix(early, kModel, prompt).value(), 2);
  const SeqId id = b.create_sequence().value();
  ASSERT_EQ(b.attach_prefix(id, kModel, prompt).value(), 64);
  ASSERT_EQ(share.attach(b, id, prompt).value(), 6 * 32);
  feed(b, id, prompt, 6 * 32, n);
  EXPECT_TRUE(same_pages(a, pub, b, id));
  EXPECT_TRUE(same_decode(a, pub, b, id, prompt));
  // A sequence holding uncommitted tokens is refused, unchanged.
  const SeqId mid = b.create_sequence().value();
  feed(b, mid, prompt, 0, 40);
  EXPECT_EQ(code_of(share.attach(b, mid, prompt)), code_of(Errc::invalid_argument));
  EXPECT_EQ(b.length(mid).value(), 40);
}

// ---- faults: each only shortens the import (or fails cleanly) --------------------------------
struct Published {
  std::optional<RedisServerProcess> server;
  std::unique_ptr<ko::RemoteTier> tier;
  PoolInt4 a = make_pool<PoolInt4>();
  SeqId pub;
  std::vector<int32_t> prompt = kvpack_remote_test::synth_prompt(8 * 32 + 9, 5);
};
// Pool A prefills and publishes 8 pages; nullopt when no server.
std::optional<Published> publish_eight(std::string* why) {
  Published p;
  p.server = start_server(why);
  if (!p.server) return std::nullopt;
  p.tier = tier_for(p.server->url());
  auto share = ko::RemotePoolPrefixShare<PoolInt4>::create(p.a, *p.tier, test_key(), kModel).value();
  p.pub = p.a.create_sequence().value();
  feed(p.a, p.pub, p.prompt, 0, static_cast<int64_t>(p.prompt.size()));
  EXPECT_EQ(share.publish(p.a, p.pub, p.prompt).value().stored, 8u * 4 * 2);
  return p;
}
#define PUBLISH_OR_SKIP(var)                   \
  std::string why_##var;                       \
  auto var = publish_eight(&why_##var);        \
  if (!var) GTEST_SKIP() << "redis-server not available: " << why_##var

TEST(RemotePoolPrefixFaults, TamperedValueStopsTheImportAtItsPage) {
  PUBLISH_OR_SKIP(p);
  auto share = ko::RemotePoolPrefixShare<PoolInt4>::create(p->a, *p->tier, test_key(), kModel).value();
  auto* admin = p->server->connect();
  ASSERT_NE(admin, nullptr);
  const std::string key = key_of(p->a, *p->tier, p->prompt, 3, 2, 1);
  std::string v = raw_get(admin, key);
  ASSERT_FALSE(v.empty());
  v[v.size() / 2] = static_cast<char>(v[v.size() / 2] ^ 0x01);  // one bit of the sealed payload
  raw_cmd(admin, "SET", key, &v);
  EXPECT_EQ(consume(share, p->a, p->prompt, 2), 3 * 32);
  EXPECT_EQ(p->tier->stats().error(ko::RemoteError::rejected), 1u);
  // A value copied under another page's key (the key binding) is rejected too.
  const std::string k0 = key_of(p->a, *p->tier, p->prompt, 0, 0, 0), k01 = key_of(p->a, *p->tier, p->prompt, 0, 0, 1);
  const std::string v0 = raw_get(admin, k0), v01 = raw_get(admin, k01);
  raw_cmd(admin, "SET", k01, &v0);
  EXPECT_EQ(consume(share, p->a, p->prompt), 0);
  raw_cmd(admin, "SET", k01, &v01);
  // A value of another prompt's page at the same coordinates (the key digest binding) too.
  auto other = p->prompt;
  other[0] ^= 1;
  raw_cmd(admin, "SET", key_of(p->a, *p->tier, other, 0, 0, 0), &v0);
  for (int l = 0; l < 4; ++l)
    for (int h = 0; h < 2; ++h) {
      if (l == 0 && h == 0) continue;
      const std::string vh = raw_get(admin, key_of(p->a, *p->tier, p->prompt, 0, l, h));
      raw_cmd(admin, "SET", key_of(p->a, *p->tier, other, 0, l, h), &vh);
    }
  const uint64_t rejected = p->tier->stats().error(ko::RemoteError::rejected);
  EXPECT_EQ(consume(share, p->a, other), 0);
  EXPECT_EQ(p->tier->stats().error(ko::RemoteError::rejected), rejected + 4 * 2);
  // An evicted page (deleted key) stops the import there.
  freeReplyObject(redisCommand(admin, "FLUSHALL"));
  redisFree(admin);
  ASSERT_TRUE(share.publish(p->a, p->pub, p->prompt));
  admin = p->server->connect();
  raw_cmd(admin, "DEL", key_of(p->a, *p->tier, p->prompt, 5, 3, 0));
  redisFree(admin);
  EXPECT_EQ(consume(share, p->a, p->prompt, 3), 5 * 32);
}

TEST(RemotePoolPrefixFaults, WrongSecretAndForeignCodecAreMisses) {
  PUBLISH_OR_SKIP(p);
  auto wrong = ko::RemotePoolPrefixShare<PoolInt4>::create(p->a, *p->tier, test_key(9), kModel).value();
  EXPECT_EQ(consume(wrong, p->a, p->prompt), 0);
  EXPECT_EQ(p->tier->stats().error(ko::RemoteError::rejected), 4u * 2) << "every value of page 0 fails to open";
  // An INT8 pool publishes the same prompt: the INT4 pool never sees its pages (other keys) ...
  PoolInt8 a8 = make_pool<PoolInt8>();
  auto share8 = ko::RemotePoolPrefixShare<PoolInt8>::create(a8, *p->tier, test_key(), kModel).value();
  const SeqId s8 = a8.create_sequence().value();
  feed(a8, s8, p->prompt, 0, static_cast<int64_t>(p->prompt.size()));
  ASSERT_TRUE(share8.publish(a8, s8, p->prompt));
  auto* admin = p->server->connect();
  ASSERT_NE(admin, nullptr);
  for (int l = 0; l < 4; ++l)
    for (int h = 0; h < 2; ++h) raw_cmd(admin, "DEL", key_of(p->a, *p->tier, p->prompt, 0, l, h));
  auto share = ko::RemotePoolPrefixShare<PoolInt4>::create(p->a, *p->tier, test_key(), kModel).value();
  EXPECT_EQ(consume(share, p->a, p->prompt), 0);
  // ... and an INT8 value forged under the INT4 key of page 0 is rejected.
  for (int l = 0; l < 4; ++l)
    for (int h = 0; h < 2; ++h) {
      const std::string v8 = raw_get(admin, key_of(a8, *p->tier, p->prompt, 0, l, h));
      ASSERT_FALSE(v8.empty());
      raw_cmd(admin, "SET", key_of(p->a, *p->tier, p->prompt, 0, l, h), &v8);
    }
  redisFree(admin);
  const uint64_t before = p->tier->stats().error(ko::RemoteError::rejected);
  EXPECT_EQ(consume(share, p->a, p->prompt), 0);
  EXPECT_EQ(p->tier->stats().error(ko::RemoteError::rejected), before + 4 * 2);
}

TEST(RemotePoolPrefixFaults, ServerSlowKilledBeforeOrDuringTheAttach) {
  PUBLISH_OR_SKIP(p);
  auto share = ko::RemotePoolPrefixShare<PoolInt4>::create(p->a, *p->tier, test_key(), kModel).value();
  // A server that stops answering (SIGSTOP): the command timeout makes it a miss; back, a hit.
  p->server->pause();
  const auto t0 = std::chrono::steady_clock::now();
  EXPECT_EQ(consume(share, p->a, p->prompt), 0);
  EXPECT_LT(std::chrono::steady_clock::now() - t0, std::chrono::seconds(20));
  p->server->resume();
  EXPECT_EQ(consume(share, p->a, p->prompt), 8 * 32);
  // Killed during the attach (one page per round trip): a thread kills the server once it has
  // answered the first pages; whatever the timing, the import is a whole-page prefix and exact.
  auto* admin = p->server->connect();
  ASSERT_NE(admin, nullptr);
  auto hits = [admin] {  // GETs the server has answered with a value
    auto* r = static_cast<redisReply*>(redisCommand(admin, "INFO stats"));
    const char* at = r && r->type == REDIS_REPLY_STRING ? std::strstr(r->str, "keyspace_hits:") : nullptr;
    const long n = at ? std::atol(at + 14) : -1;
    if (r) freeReplyObject(r);
    return n;
  };
  const long base = hits();
  std::thread killer([&] {
    for (int i = 0; i < 5000 && hits() < base + 2 * 8; ++i) std::this_thread::sleep_for(std::chrono::microseconds(100));
    p->server->kill9();
  });
  const int64_t got = consume(share, p->a, p->prompt, 1);
  killer.join();
  redisFree(admin);
  EXPECT_EQ(got % 32, 0);
  EXPECT_LE(got, 8 * 32);
  std::printf("[ info ] server killed during the attach: %lld of %d tokens attached\n", static_cast<long long>(got), 8 * 32);
  // Down before the attach: nothing attached, no error; publishing to it stores nothing.
  EXPECT_EQ(consume(share, p->a, p->prompt), 0);
  EXPECT_EQ(share.publish(p->a, p->pub, p->prompt).value().stored, 0u);
  // Restarted empty: a miss.
  ASSERT_TRUE(p->server->restart());
  EXPECT_EQ(consume(share, p->a, p->prompt), 0);
}

TEST(RemotePoolPrefixFaults, PoolExhaustionIsAnErrorAndChangesNothing) {
  PUBLISH_OR_SKIP(p);
  auto share = ko::RemotePoolPrefixShare<PoolInt4>::create(p->a, *p->tier, test_key(), kModel).value();
  // B's pool: 64 pages; a resident sequence holds 4 pages * 4 layers * 2 KV heads = 32 of them;
  // the 8 published pages need 8 * 8 = 64.
  const std::size_t page = PagePool::stride_for(p->a.block_layout().bytes);
  PoolInt4 b = make_pool<PoolInt4>(64 * page);
  const SeqId resident = b.create_sequence().value();
  feed(b, resident, p->prompt, 0, 4 * 32);
  const SeqId id = b.create_sequence().value();
  const PoolStats before = b.stats();
  auto got = share.attach(b, id, p->prompt);
  ASSERT_FALSE(got);
  EXPECT_EQ(got.error().code, Errc::capacity_exceeded);
  EXPECT_NE(got.error().message.find("64 pages needed, 32 free"), std::string::npos) << got.error().message;
  EXPECT_EQ(b.length(id).value(), 0);
  EXPECT_EQ(b.stats().pages_free, before.pages_free);
  EXPECT_EQ(b.stats().pages_used, before.pages_used);
  // A shorter prompt (3 pages = 24 pool pages, then 8 for its last token) fits, and is exact.
  const std::vector<int32_t> shortp(p->prompt.begin(), p->prompt.begin() + 3 * 32 + 1);
  ASSERT_EQ(share.attach(b, id, shortp).value(), 3 * 32);
  feed(b, id, shortp, 3 * 32, 3 * 32 + 1);
  const SeqId ref = p->a.create_sequence().value();
  feed(p->a, ref, shortp, 0, 3 * 32 + 1);
  EXPECT_TRUE(same_pages(p->a, ref, b, id));
  EXPECT_TRUE(same_decode(p->a, ref, b, id, shortp));
}

TEST(RemotePoolPrefix, SinksAreUnsupported) {
  START_SERVER_OR_SKIP(server);
  auto tier = tier_for(server->url());
  PoolSinks a = make_pool<PoolSinks>();
  auto share = ko::RemotePoolPrefixShare<PoolSinks>::create(a, *tier, test_key(), kModel).value();
  const auto prompt = kvpack_remote_test::synth_prompt(100, 6);
  const SeqId id = a.create_sequence().value();
  feed(a, id, prompt, 0, 100);
  EXPECT_EQ(code_of(share.publish(a, id, prompt)), code_of(Errc::unsupported));
  const SeqId fresh = a.create_sequence().value();
  EXPECT_EQ(code_of(share.attach(a, fresh, prompt)), code_of(Errc::unsupported));
  EXPECT_EQ(a.length(fresh).value(), 0);
  EXPECT_EQ(tier->stats().fetch_batches, 0u);
}

}  // namespace
