// Helpers of tests/remote/test_remote_faults.cpp: the fault table (printed once when the test
// program ends), tiers and caches for the cases, a consumer that imports, computes the rest and
// compares with the locally computed cache, and raw server access for tampering. Included by
// that one test file only (anonymous-namespace names carry the remote_ prefix).
#pragma once

#include <gtest/gtest.h>
#include <hiredis/hiredis.h>

#include <array>
#include <cstdio>
#include <cstdlib>
#include <memory>
#include <string>
#include <vector>

#include <kvpack/offload/crypto.hpp>
#include <kvpack/offload/remote_prefix.hpp>

#include "redis_server_process.hpp"
#include "synthetic_prefix.hpp"

namespace {

namespace ko = kvpack::offload;
using kvpack_remote_test::RedisServerOptions;
using kvpack_remote_test::RedisServerProcess;
using kvpack_remote_test::SynthCache;

// ---- the fault table, printed once at the end ----------------------------------------------
struct RemoteFaultRow {
  std::string fault, expected, observed;
  bool ok;
};
std::vector<RemoteFaultRow>& remote_fault_rows() {
  static std::vector<RemoteFaultRow> rows;
  return rows;
}
class RemoteFaultTablePrinter : public ::testing::Environment {
 public:
  void TearDown() override {
    std::printf("\nRemote tier fault table (redis-server %s, each case: nothing lost, answer bit-identical)\n",
                "started by the test");
    std::printf("| %-34s | %-44s | %-62s | %-4s |\n", "fault", "expected", "observed", "ok");
    std::printf("|%s|%s|%s|%s|\n", std::string(36, '-').c_str(), std::string(46, '-').c_str(),
                std::string(64, '-').c_str(), std::string(6, '-').c_str());
    for (const auto& r : remote_fault_rows())
      std::printf("| %-34s | %-44s | %-62s | %-4s |\n", r.fault.c_str(), r.expected.c_str(), r.observed.c_str(),
                  r.ok ? "yes" : "NO");
  }
};
const auto* const remote_fault_env = ::testing::AddGlobalTestEnvironment(new RemoteFaultTablePrinter);

// ---- helpers --------------------------------------------------------------------------------
constexpr int kRemotePages = 8;
constexpr int kRemotePromptTokens = kRemotePages * 32 + 10;  // 8 full pages + a partial one

ko::StaticKeyProvider remote_test_key() {
  std::array<std::byte, 32> k{};
  for (std::size_t i = 0; i < k.size(); ++i) k[i] = std::byte(static_cast<unsigned char>(i * 7 + 1));
  return ko::StaticKeyProvider::create(k).value();
}

std::unique_ptr<ko::RemoteTier> remote_tier_for(const std::string& url, int timeout_ms = 300, int retry_ms = 0,
                                                std::string password_env = "KVPACK_TEST_REMOTE_NO_PASSWORD") {
  ko::RemoteConfig c;
  c.url = url;
  c.connect_timeout = std::chrono::milliseconds(timeout_ms);
  c.command_timeout = std::chrono::milliseconds(timeout_ms);
  c.retry_after = std::chrono::milliseconds(retry_ms);
  c.password_env = std::move(password_env);
  return ko::RemoteTier::create(c).value();
}

RedisServerProcess remote_start(RedisServerOptions o = {}) {
  std::string why;
  auto s = RedisServerProcess::start(std::move(o), &why);
  if (!s) {
    ADD_FAILURE() << "cannot start redis-server: " << why;
    std::abort();
  }
  return std::move(*s);
}

SynthCache remote_fresh() { return SynthCache::create(kvpack_remote_test::synth_shape()).value(); }

// The publisher: a cache holding the whole prompt.
SynthCache remote_full(const std::vector<int32_t>& prompt) {
  SynthCache c = remote_fresh();
  EXPECT_TRUE(kvpack_remote_test::synth_append(c, prompt, 0, static_cast<int64_t>(prompt.size())));
  return c;
}

struct RemoteImportOutcome {
  int64_t imported = 0, computed = 0;
  bool same = false;
  std::string why;
};

// A consumer: fresh cache, import what the tier has, compute the rest, compare with the reference.
RemoteImportOutcome remote_consume(ko::RemotePrefixShare<SynthCache>& share, const std::vector<int32_t>& prompt) {
  RemoteImportOutcome o;
  SynthCache c = remote_fresh();
  auto got = share.import(c, prompt);
  EXPECT_TRUE(got) << got.error().message;
  o.imported = got ? *got : 0;
  EXPECT_TRUE(kvpack_remote_test::synth_append(c, prompt, o.imported, static_cast<int64_t>(prompt.size()), &o.computed));
  const SynthCache ref = remote_full(prompt);
  o.same = kvpack_remote_test::synth_same(ref, c, &o.why);
  return o;
}

std::string remote_outcome_text(const RemoteImportOutcome& o, const ko::RemoteStats& s) {
  return "imported " + std::to_string(o.imported) + " computed " + std::to_string(o.computed) + "; " +
         (o.same ? "identical" : "DIFFERS") + "; hits " + std::to_string(s.hits) + " misses " + std::to_string(s.misses);
}

std::string remote_key_of(const ko::RemotePrefixShare<SynthCache>& share, const std::vector<int32_t>& prompt,
                          const ko::PageCoord& at, const SynthCache& cache, const std::string& model = "synthetic-model") {
  const auto d = ko::prefix_page_digests(model, prompt, 32);
  const auto k = ko::page_key(d[static_cast<std::size_t>(at.page)], at, ko::prefix_layout_for(cache), ko::Aead::xchacha20poly1305);
  return share.tier().config().key_prefix + k.hex();
}

std::vector<std::byte> remote_raw_get(redisContext* c, const std::string& key) {
  auto* r = static_cast<redisReply*>(redisCommand(c, "GET %b", key.data(), key.size()));
  std::vector<std::byte> v;
  if (r && r->type == REDIS_REPLY_STRING)
    v.assign(reinterpret_cast<const std::byte*>(r->str), reinterpret_cast<const std::byte*>(r->str) + r->len);
  if (r) freeReplyObject(r);
  return v;
}
void remote_raw_set(redisContext* c, const std::string& key, std::span<const std::byte> v) {
  auto* r = static_cast<redisReply*>(redisCommand(c, "SET %b %b", key.data(), key.size(), v.data(), v.size()));
  if (r) freeReplyObject(r);
}


}  // namespace
