// RemotePoolPrefixShare (offload/remote_pool_prefix.hpp) against a real redis-server that each
// test starts itself (unix socket in a temp folder; skipped when redis-server cannot start). Two
// PagedCache pools in this process stand for two serving processes (separate pools, the same
// secret): pool A prefills and publishes, pool B attaches a new sequence from the tier and appends
// the rest. Checked: B's pages are A's bytes and B decodes bit-identically to A's sequence that
// appended the prompt itself (prompt lengths 1, 31, 33, 95, 200 with 32- and 64-token pages: partial
// pages are never published; INT8 g32, INT4 g32, per-channel INT4 keys with Residual<16>); pages
// are exchanged with a single-sequence KVCache of the same policies both ways; the tier continues
// after the local prefix cache; Sinks<N> is Errc::unsupported. Faults (tampered, wrong secret,
// foreign codec, evicted page, server slow or killed, pool exhaustion):
// test_remote_pool_prefix_faults.cpp. Helpers: pool_prefix_support.hpp.
#include <gtest/gtest.h>
#include <hiredis/hiredis.h>

#include <cstring>
#include <string>
#include <vector>

#include "pool_prefix_support.hpp"

namespace {

// The error code of a result, or "no error" (as a string, so a success fails the EXPECT readably).
template <class R>
std::string code_of(const R& r) { return r ? "no error" : std::to_string(static_cast<int>(r.error().code)); }
std::string code_of(Errc c) { return std::to_string(static_cast<int>(c)); }

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
  EXPECT_EQ(ko::prefix_layout_for(a).max_payload_bytes, ko::prefix_layout_for(single).max_payload_bytes);
  // KVCache publishes, the pool attaches: its pages are the KVCache's blocks.
  EXPECT_EQ(cshare.publish(single, prompt).stored, 5u * 4 * 2);
  const SeqId id = a.create_sequence().value();
  ASSERT_EQ(pshare.attach(a, id, prompt).value(), 5 * 32);
  for (int l = 0; l < 4; ++l)
    for (int h = 0; h < 2; ++h) {
      const auto pages = a.pages(id, l, h).value();
      const auto blocks = single.blocks(l, h);
      ASSERT_EQ(pages.size(), 5u);
      // Codes and metadata byte for byte; neither stores positions in its blocks (no eviction):
      // both keep them per layer as runs, here the token indices.
      ASSERT_EQ(single.block_layout().bytes, a.block_layout().bytes);
      for (std::size_t p = 0; p < 5; ++p)
        EXPECT_EQ(std::memcmp(pages[p].data, blocks[p].data.get(), a.block_layout().bytes), 0) << l << "/" << h << "/" << p;
      const kvpack::PositionRuns& runs = *a.block_positions(id, l).value();
      ASSERT_EQ(runs.size(), 5 * 32);
      for (int64_t t = 0; t < 5 * 32; ++t) EXPECT_EQ(runs.at(t), t);
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
