// The shared remote tier against a real redis-server that each test starts itself (unix socket in
// a temp folder, or a free loopback port): round trip, content addressing, and every fault of
// issue 19 (server down, killed mid-publish, restarted, bit flips, forged keys, maxmemory LRU,
// slow server, wrong password). Each fault case checks that nothing is lost (the cache ends up
// with the whole prompt) and the answer is correct (bit-identical to computing it locally).
// The run ends by printing the fault table.
#include <gtest/gtest.h>

#include <atomic>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <string>
#include <thread>
#include <vector>

#include <kvpack/offload/crypto.hpp>
#include <kvpack/offload/remote_prefix.hpp>

#include "redis_server_process.hpp"
#include "synthetic_prefix.hpp"

#include "remote_fault_support.hpp"

namespace {

// ---- no server needed ---------------------------------------------------------------------
TEST(RemoteConfigTest, ParsesUrlsAndRejectsPasswords) {
  auto a = ko::parse_remote_url("redis://127.0.0.1:7000/3");
  ASSERT_TRUE(a);
  EXPECT_EQ(a->host, "127.0.0.1");
  EXPECT_EQ(a->port, 7000);
  EXPECT_EQ(a->db, 3);
  auto b = ko::parse_remote_url("unix:///tmp/r.sock?db=2");
  ASSERT_TRUE(b);
  EXPECT_TRUE(b->unix_socket);
  EXPECT_EQ(b->path, "/tmp/r.sock");
  EXPECT_EQ(b->db, 2);
  EXPECT_EQ(ko::parse_remote_url("redis://[::1]:6380")->host, "::1");
  for (const char* badu : {"http://x", "redis://", "redis://h:0", "redis://h:70000", "unix://rel.sock", "redis://h/x"})
    EXPECT_FALSE(ko::parse_remote_url(badu)) << badu;
  auto pw = ko::parse_remote_url("redis://:hunter2@127.0.0.1");
  ASSERT_FALSE(pw);
  EXPECT_EQ(pw.error().message.find("hunter2"), std::string::npos);
}

TEST(RemoteKeyTest, AddressCoversModelCodecLayoutAndWholePrefix) {
  const auto p = kvpack_remote_test::synth_prompt(128, 1);
  auto q = p;
  q[5] ^= 1;  // an early token differs: every later page differs
  const auto dp = ko::prefix_page_digests("m", p, 32), dq = ko::prefix_page_digests("m", q, 32);
  ASSERT_EQ(dp.size(), 4u);
  for (std::size_t i = 0; i < 4; ++i) EXPECT_NE(dp[i], dq[i]);
  EXPECT_NE(ko::prefix_page_digests("m2", p, 32)[0], dp[0]);
  EXPECT_EQ(ko::prefix_page_digests("m", std::span(p).first(100), 32).size(), 3u);  // partial page: none
  const SynthCache c4 = remote_fresh();
  const auto c8 = kvpack_remote_test::SynthCacheInt8::create(kvpack_remote_test::synth_shape()).value();
  const ko::PageCoord at{1, 0, 2, 0};
  const auto k = ko::page_key(dp[0], at, ko::prefix_layout_for(c4), ko::Aead::xchacha20poly1305);
  EXPECT_NE(k, ko::page_key(dp[0], at, ko::prefix_layout_for(c8), ko::Aead::xchacha20poly1305));
  EXPECT_NE(k, ko::page_key(dp[0], at, ko::prefix_layout_for(c4), ko::Aead::none));
  EXPECT_NE(k, ko::page_key(dp[0], ko::PageCoord{1, 1, 2, 0}, ko::prefix_layout_for(c4), ko::Aead::xchacha20poly1305));
  EXPECT_NE(k, ko::page_key(dp[0], ko::PageCoord{2, 0, 2, 0}, ko::prefix_layout_for(c4), ko::Aead::xchacha20poly1305));
}

// ---- real server ----------------------------------------------------------------------------
TEST(RemoteTierTest, RoundTripOverUnixSocketAndTcp) {
  for (bool tcp : {false, true}) {
    RedisServerOptions o;
    o.tcp = tcp;
    RedisServerProcess srv = remote_start(o);
    auto tier = remote_tier_for(srv.url());
    const auto key = remote_test_key();
    const auto prompt = kvpack_remote_test::synth_prompt(kRemotePromptTokens, 7);
    const SynthCache a = remote_full(prompt);
    auto share = ko::RemotePrefixShare<SynthCache>::create(a, *tier, key, "synthetic-model").value();
    const auto rep = share.publish(a, prompt);
    EXPECT_EQ(rep.pages, kRemotePages);
    EXPECT_EQ(rep.stored, static_cast<uint64_t>(kRemotePages * 4 * 2));
    const auto out = remote_consume(share, prompt);
    EXPECT_EQ(out.imported, kRemotePages * 32);
    EXPECT_EQ(out.computed, 10);
    EXPECT_TRUE(out.same) << out.why;
    const auto s = tier->stats();
    EXPECT_EQ(s.hits, static_cast<uint64_t>(kRemotePages * 8));
    EXPECT_EQ(s.misses, 0u);
    EXPECT_GT(s.bytes_in, 0u);
    EXPECT_GT(s.fetch_p99_us, 0.0);
    remote_fault_rows().push_back({std::string("none (round trip, ") + (tcp ? "tcp" : "unix") + ")",
                                   "all 8 pages imported, 10 tokens computed", remote_outcome_text(out, s),
                                   out.same && out.imported == 256});
  }
}

TEST(RemoteTierTest, ServerDownRecomputes) {
  auto tier = remote_tier_for("unix:///tmp/kvpack-no-such-dir/redis.sock", 100, 10000);
  const auto key = remote_test_key();
  const auto prompt = kvpack_remote_test::synth_prompt(kRemotePromptTokens, 8);
  const SynthCache a = remote_full(prompt);
  auto share = ko::RemotePrefixShare<SynthCache>::create(a, *tier, key, "synthetic-model").value();
  const auto rep = share.publish(a, prompt);
  EXPECT_EQ(rep.stored, 0u);
  const auto out = remote_consume(share, prompt);
  const auto out2 = remote_consume(share, prompt);  // inside retry_after: no I/O at all
  const auto s = tier->stats();
  EXPECT_EQ(out.imported, 0);
  EXPECT_TRUE(out.same && out2.same);
  EXPECT_GE(s.error(ko::RemoteError::connect), 1u);
  EXPECT_GE(s.error(ko::RemoteError::skipped), 1u);
  EXPECT_FALSE(tier->ping());
  remote_fault_rows().push_back({"server down (no socket)", "all misses, prompt computed, no wait per call",
                                 remote_outcome_text(out, s) + "; connect " + std::to_string(s.error(ko::RemoteError::connect)),
                                 out.same && out.imported == 0});
}

TEST(RemoteTierTest, ServerKilledMidPublish) {
  RedisServerProcess srv = remote_start();
  ko::RemoteConfig c;
  c.url = srv.url();
  c.pipeline_depth = 2;  // many round trips, so the kill lands inside a publish
  c.retry_after = std::chrono::milliseconds(0);
  auto tier = ko::RemoteTier::create(c).value();
  const auto key = remote_test_key();
  const auto prompt = kvpack_remote_test::synth_prompt(64 * 32, 9);  // 64 pages, 512 values
  const SynthCache a = remote_full(prompt);
  auto share = ko::RemotePrefixShare<SynthCache>::create(a, *tier, key, "synthetic-model").value();
  std::atomic<bool> done{false};
  ko::PrefixPublishReport rep;
  std::thread pub([&] {
    for (int round = 0; round < 50 && !done; ++round) {  // bounded
      rep = share.publish(a, prompt, 1);
      if (rep.stored < rep.values) break;
    }
    done = true;
  });
  for (int i = 0; i < 400 && tier->stats().published == 0; ++i) std::this_thread::sleep_for(std::chrono::milliseconds(5));
  srv.kill9();
  pub.join();
  EXPECT_LT(rep.stored, rep.values);
  ASSERT_TRUE(srv.restart());
  const auto out = remote_consume(share, prompt);  // the new server is empty: recompute
  EXPECT_TRUE(out.same) << out.why;
  // Publishing again after the restart works (the tier reconnects) and a consumer imports it all.
  const auto rep2 = share.publish(a, prompt);
  EXPECT_EQ(rep2.stored, rep2.values);
  const auto out2 = remote_consume(share, prompt);
  EXPECT_EQ(out2.imported, 64 * 32);
  EXPECT_TRUE(out2.same) << out2.why;
  const auto s = tier->stats();
  EXPECT_GE(s.error(ko::RemoteError::io) + s.error(ko::RemoteError::connect), 1u);
  remote_fault_rows().push_back({"server killed mid-publish", "publish stops, pages stay local, recompute",
                                 "stored " + std::to_string(rep.stored) + "/" + std::to_string(rep.values) +
                                     "; after restart " + remote_outcome_text(out, s) + "; republished, imported " +
                                     std::to_string(out2.imported),
                                 out.same && out2.same && rep.stored < rep.values});
}

TEST(RemoteTierTest, RestartBetweenPublishAndFetch) {
  RedisServerProcess srv = remote_start();
  auto tier = remote_tier_for(srv.url());
  const auto key = remote_test_key();
  const auto prompt = kvpack_remote_test::synth_prompt(kRemotePromptTokens, 10);
  const SynthCache a = remote_full(prompt);
  auto share = ko::RemotePrefixShare<SynthCache>::create(a, *tier, key, "synthetic-model").value();
  EXPECT_EQ(share.publish(a, prompt).stored, 64u);
  ASSERT_TRUE(srv.restart());
  const auto out = remote_consume(share, prompt);
  const auto s = tier->stats();
  EXPECT_EQ(out.imported, 0);
  EXPECT_EQ(out.computed, kRemotePromptTokens);
  EXPECT_TRUE(out.same) << out.why;
  remote_fault_rows().push_back({"restart between publish and fetch", "data gone: all misses, recompute",
                                 remote_outcome_text(out, s), out.same && out.imported == 0});
}

TEST(RemoteTierTest, EveryBitFlipIsDetected) {
  RedisServerProcess srv = remote_start();
  auto tier = remote_tier_for(srv.url());
  const auto key = remote_test_key();
  const auto prompt = kvpack_remote_test::synth_prompt(kRemotePromptTokens, 11);
  const SynthCache a = remote_full(prompt);
  auto share = ko::RemotePrefixShare<SynthCache>::create(a, *tier, key, "synthetic-model").value();
  ASSERT_EQ(share.publish(a, prompt).stored, 64u);
  const ko::PageCoord at{1, 0, 2, 3};  // page 3 of layer 1, KV head 0
  const std::string k = remote_key_of(share, prompt, at, a);
  redisContext* admin = srv.connect();
  ASSERT_NE(admin, nullptr);
  const std::vector<std::byte> good = remote_raw_get(admin, k);
  ASSERT_EQ(good.size(), share.value_bytes());
  // Every single-bit flip of the sample value, through the same verification the import runs.
  const auto sealer = ko::PageSealer::create(key, ko::prefix_layout_for(a)).value();
  const auto digest = ko::page_key(ko::prefix_page_digests("synthetic-model", prompt, 32)[3], at, ko::prefix_layout_for(a),
                                   ko::Aead::xchacha20poly1305);
  std::vector<std::byte> out(ko::prefix_layout_for(a).max_payload_bytes);
  ASSERT_TRUE(sealer.open(digest, at, good, out));
  uint64_t detected = 0;
  const uint64_t bits = good.size() * 8;
  std::vector<std::byte> v = good;
  for (uint64_t b = 0; b < bits; ++b) {
    v[b / 8] ^= std::byte(static_cast<unsigned char>(1u << (b % 8)));
    if (!sealer.open(digest, at, v, out)) ++detected;
    v[b / 8] ^= std::byte(static_cast<unsigned char>(1u << (b % 8)));
  }
  EXPECT_EQ(detected, bits);
  // End to end through the server: flipped (a sample of 24 bits), truncated, extended, empty.
  std::vector<std::vector<std::byte>> bad;
  for (uint64_t b = 0; b < bits; b += bits / 24) {
    bad.push_back(good);
    bad.back()[b / 8] ^= std::byte(static_cast<unsigned char>(1u << (b % 8)));
  }
  bad.emplace_back(good.begin(), good.end() - 1);
  bad.push_back(good);
  bad.back().push_back(std::byte{0});
  bad.emplace_back();
  int wrong = 0;
  RemoteImportOutcome last;
  for (const auto& value : bad) {
    remote_raw_set(admin, k, value);
    last = remote_consume(share, prompt);
    if (last.imported != 3 * 32 || !last.same) ++wrong;
  }
  remote_raw_set(admin, k, good);
  const auto healed = remote_consume(share, prompt);
  redisFree(admin);
  const auto s = tier->stats();
  EXPECT_EQ(wrong, 0);
  EXPECT_EQ(healed.imported, kRemotePages * 32);
  EXPECT_EQ(s.error(ko::RemoteError::rejected), bad.size());
  remote_fault_rows().push_back({"single-bit flips / truncation", "detected, import stops before the page",
                                 std::to_string(detected) + "/" + std::to_string(bits) + " flips detected; " +
                                     std::to_string(bad.size()) + " bad values via server: " + std::to_string(wrong) +
                                     " wrong",
                                 detected == bits && wrong == 0});
}

TEST(RemoteTierTest, ForeignCodecOrModelUnderForgedKey) {
  RedisServerProcess srv = remote_start();
  auto tier = remote_tier_for(srv.url());
  const auto key = remote_test_key();
  const auto prompt = kvpack_remote_test::synth_prompt(kRemotePromptTokens, 12);
  const SynthCache a = remote_full(prompt);
  auto share = ko::RemotePrefixShare<SynthCache>::create(a, *tier, key, "synthetic-model").value();
  // Another codec (INT8) and another model id publish the same prompt.
  auto c8 = kvpack_remote_test::SynthCacheInt8::create(kvpack_remote_test::synth_shape()).value();
  ASSERT_TRUE(kvpack_remote_test::synth_append(c8, prompt, 0, kRemotePromptTokens));
  auto share8 = ko::RemotePrefixShare<kvpack_remote_test::SynthCacheInt8>::create(c8, *tier, key, "synthetic-model").value();
  ASSERT_EQ(share8.publish(c8, prompt).stored, 64u);
  auto other = ko::RemotePrefixShare<SynthCache>::create(a, *tier, key, "other-model").value();
  ASSERT_EQ(other.publish(a, prompt).stored, 64u);
  // Neither is found under the INT4 / synthetic-model keys.
  const auto none = remote_consume(share, prompt);
  EXPECT_EQ(none.imported, 0);
  // Forge: copy their values under this cache's keys for page 0, every (layer, head).
  redisContext* admin = srv.connect();
  ASSERT_NE(admin, nullptr);
  int wrong = 0;
  for (int source = 0; source < 2; ++source) {
    for (int l = 0; l < 4; ++l)
      for (int h = 0; h < 2; ++h) {
        const ko::PageCoord at{l, h, 2, 0};
        const auto d = ko::prefix_page_digests(source == 0 ? "synthetic-model" : "other-model", prompt, 32)[0];
        const auto fk = ko::page_key(d, at, source == 0 ? ko::prefix_layout_for(c8) : ko::prefix_layout_for(a), ko::Aead::xchacha20poly1305);
        const auto v = remote_raw_get(admin, tier->config().key_prefix + fk.hex());
        ASSERT_FALSE(v.empty());
        remote_raw_set(admin, remote_key_of(share, prompt, at, a), v);
      }
    const auto out = remote_consume(share, prompt);
    if (out.imported != 0 || !out.same) ++wrong;
  }
  redisFree(admin);
  const auto s = tier->stats();
  EXPECT_EQ(wrong, 0);
  EXPECT_EQ(s.error(ko::RemoteError::rejected), 16u);
  remote_fault_rows().push_back({"other codec / model under forged key", "rejected (header / AEAD), recompute",
                                 "INT8 and other-model values under INT4 keys: " +
                                     std::to_string(s.error(ko::RemoteError::rejected)) + " rejected, " +
                                     std::to_string(wrong) + " wrong",
                                 wrong == 0});
}

TEST(RemoteTierTest, MaxmemoryLruEvictsPages) {
  RedisServerProcess srv = remote_start({false, "", {"--maxmemory-policy", "allkeys-lru"}});
  redisContext* admin = srv.connect();
  ASSERT_NE(admin, nullptr);
  // Room for about 5 of the 8 prompts (1.5 MB of pages), above the server's own baseline.
  auto* info = static_cast<redisReply*>(redisCommand(admin, "MEMORY STATS"));
  ASSERT_NE(info, nullptr);
  freeReplyObject(info);
  auto* used = static_cast<redisReply*>(redisCommand(admin, "INFO memory"));
  ASSERT_NE(used, nullptr);
  const std::string text(used->str, static_cast<std::size_t>(used->len));
  freeReplyObject(used);
  const auto at = text.find("used_memory:");
  const long long base = std::stoll(text.substr(at + 12));
  const long long limit = base + 1300 * 1024;
  auto* set = static_cast<redisReply*>(redisCommand(admin, "CONFIG SET maxmemory %lld", limit));
  ASSERT_NE(set, nullptr);
  freeReplyObject(set);
  auto tier = remote_tier_for(srv.url());
  const auto key = remote_test_key();
  std::vector<std::vector<int32_t>> prompts;
  for (uint32_t i = 0; i < 8; ++i) prompts.push_back(kvpack_remote_test::synth_prompt(kRemotePromptTokens, 100 + i));
  std::vector<SynthCache> pubs;
  for (const auto& p : prompts) pubs.push_back(remote_full(p));
  auto share = ko::RemotePrefixShare<SynthCache>::create(pubs[0], *tier, key, "synthetic-model").value();
  uint64_t stored = 0;
  for (std::size_t i = 0; i < prompts.size(); ++i) stored += share.publish(pubs[i], prompts[i]).stored;
  int wrong = 0, partial = 0;
  int64_t imported = 0;
  for (const auto& p : prompts) {
    const auto out = remote_consume(share, p);
    imported += out.imported;
    if (!out.same || out.imported % 32 != 0) ++wrong;
    if (out.imported < kRemotePages * 32) ++partial;
  }
  auto* st = static_cast<redisReply*>(redisCommand(admin, "INFO stats"));
  const std::string stats(st->str, static_cast<std::size_t>(st->len));
  freeReplyObject(st);
  redisFree(admin);
  const long long evicted = std::stoll(stats.substr(stats.find("evicted_keys:") + 13));
  EXPECT_EQ(wrong, 0);
  EXPECT_GT(stored, 0u);
  EXPECT_GT(evicted, 0);
  EXPECT_GT(partial, 0);
  remote_fault_rows().push_back({"maxmemory + allkeys-lru eviction", "evicted pages are misses, rest imported",
                                 std::to_string(stored) + " values stored, " + std::to_string(evicted) + " evicted; " + std::to_string(imported) +
                                     " of 2048 tokens imported; " + std::to_string(partial) + "/8 prompts partial; " +
                                     std::to_string(wrong) + " wrong",
                                 wrong == 0 && evicted > 0});
}

TEST(RemoteTierTest, SlowServerPastTheTimeout) {
  RedisServerProcess srv = remote_start();
  auto tier = remote_tier_for(srv.url(), 100, 200);
  const auto key = remote_test_key();
  const auto prompt = kvpack_remote_test::synth_prompt(kRemotePromptTokens, 13);
  const SynthCache a = remote_full(prompt);
  auto share = ko::RemotePrefixShare<SynthCache>::create(a, *tier, key, "synthetic-model").value();
  ASSERT_EQ(share.publish(a, prompt).stored, 64u);
  srv.pause();
  const auto t0 = std::chrono::steady_clock::now();
  const auto out = remote_consume(share, prompt);
  const double waited_ms = std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - t0).count();
  srv.resume();
  std::this_thread::sleep_for(std::chrono::milliseconds(250));  // past retry_after
  const auto back = remote_consume(share, prompt);
  const auto s = tier->stats();
  EXPECT_EQ(out.imported, 0);
  EXPECT_TRUE(out.same);
  EXPECT_LT(waited_ms, 2000.0);
  EXPECT_GE(s.error(ko::RemoteError::timeout), 1u);
  EXPECT_EQ(back.imported, kRemotePages * 32);
  EXPECT_TRUE(back.same);
  remote_fault_rows().push_back({"slow server (SIGSTOP) past timeout", "timeout, recompute; server back: hits",
                                 "timeouts " + std::to_string(s.error(ko::RemoteError::timeout)) + ", consumer took " +
                                     std::to_string(static_cast<int>(waited_ms)) + " ms, imported " +
                                     std::to_string(out.imported) + "; after SIGCONT imported " +
                                     std::to_string(back.imported),
                                 out.same && back.same && back.imported == 256});
}

TEST(RemoteTierTest, WrongPasswordIsAMissAndNeverLogged) {
  RedisServerProcess srv = remote_start({false, "right-horse-battery", {}});
  ::setenv("KVPACK_TEST_REMOTE_PW", "wrong-staple-XYZ", 1);
  auto tier = remote_tier_for(srv.url(), 300, 0, "KVPACK_TEST_REMOTE_PW");
  const auto key = remote_test_key();
  const auto prompt = kvpack_remote_test::synth_prompt(kRemotePromptTokens, 14);
  const SynthCache a = remote_full(prompt);
  auto share = ko::RemotePrefixShare<SynthCache>::create(a, *tier, key, "synthetic-model").value();
  EXPECT_EQ(share.publish(a, prompt).stored, 0u);
  const auto out = remote_consume(share, prompt);
  const auto ping = tier->ping();
  ASSERT_FALSE(ping);
  EXPECT_EQ(ping.error().message.find("wrong-staple"), std::string::npos);
  EXPECT_EQ(tier->last_error().find("wrong-staple"), std::string::npos);
  const auto s = tier->stats();
  EXPECT_GE(s.error(ko::RemoteError::auth), 1u);
  EXPECT_TRUE(out.same);
  // No password at all: NOAUTH on the first command, also an auth error.
  auto anon = remote_tier_for(srv.url(), 300, 0, "KVPACK_TEST_REMOTE_UNSET");
  auto share2 = ko::RemotePrefixShare<SynthCache>::create(a, *anon, key, "synthetic-model").value();
  const auto out2 = remote_consume(share2, prompt);
  EXPECT_GE(anon->stats().error(ko::RemoteError::auth), 1u);
  // The right password works.
  ::setenv("KVPACK_TEST_REMOTE_PW", "right-horse-battery", 1);
  auto good = remote_tier_for(srv.url(), 300, 0, "KVPACK_TEST_REMOTE_PW");
  auto share3 = ko::RemotePrefixShare<SynthCache>::create(a, *good, key, "synthetic-model").value();
  EXPECT_EQ(share3.publish(a, prompt).stored, 64u);
  const auto out3 = remote_consume(share3, prompt);
  ::unsetenv("KVPACK_TEST_REMOTE_PW");
  EXPECT_EQ(out3.imported, kRemotePages * 32);
  remote_fault_rows().push_back({"wrong password / no password", "auth error, misses, password never in messages",
                                 "auth errors " + std::to_string(s.error(ko::RemoteError::auth)) + "+" +
                                     std::to_string(anon->stats().error(ko::RemoteError::auth)) + "; " +
                                     remote_outcome_text(out, s) + "; right password: imported " +
                                     std::to_string(out3.imported),
                                 out.same && out2.same && out3.same && out3.imported == 256});
}

}  // namespace
