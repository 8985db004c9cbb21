// RemotePoolPrefixShare under faults, against a real redis-server per test (see
// test_remote_pool_prefix.cpp; helpers in pool_prefix_support.hpp): pool A publishes 8 pages, and
// a tampered value, a value under another page's or prompt's key, a wrong secret, another codec
// (and its value forged under our key), an evicted page, a server that stops answering (timeout),
// killed before the attach or during it only shorten pool B's import; pool exhaustion on B is an
// error leaving the sequence empty and the pool unchanged.
#include <gtest/gtest.h>
#include <hiredis/hiredis.h>

#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <optional>
#include <string>
#include <thread>
#include <vector>

#include "pool_prefix_support.hpp"

namespace {

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
  return tier.config().key_prefix + ko::page_key(d[static_cast<std::size_t>(page)], at, ko::prefix_layout_for(pool), ko::Aead::xchacha20poly1305).hex();
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

}  // namespace
