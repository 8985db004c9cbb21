// Key handling of the offload tier: SecretBytes, the key providers (environment, file,
// passphrase, static) and wrapping a data key under a key-encryption key bound to the cache id.
// Block headers and sealed records: test_offload_record.cpp.
#include <gtest/gtest.h>
#include <sys/stat.h>

#include <algorithm>
#include <cstdlib>
#include <fstream>
#include <string>
#include <string_view>
#include <vector>

#include "kvpack/offload/crypto.hpp"
#include "support/offload_crypto_fixtures.hpp"
#include "support/offload_fixtures.hpp"

namespace ko = kvpack::offload;
using kvpack::Errc;
using ko::testing::cache_id;
using ko::testing::random_key;

namespace test_offload_keys {  // own scope: compiled in one unity file with other tests

// ---- keys --------------------------------------------------------------------------------------

TEST(OffloadKeys, SecretBytesRandomAndCopy) {
  auto a = random_key();
  auto b = random_key();
  EXPECT_EQ(a.size(), 32u);
  EXPECT_FALSE(std::equal(a.bytes().begin(), a.bytes().end(), b.bytes().begin()));
  auto c = ko::SecretBytes::copy_of(a.bytes()).value();
  EXPECT_TRUE(std::equal(a.bytes().begin(), a.bytes().end(), c.bytes().begin()));
  ko::SecretBytes moved = std::move(c);
  EXPECT_EQ(moved.size(), 32u);
  EXPECT_EQ(c.size(), 0u);  // NOLINT(bugprone-use-after-move): checking the moved-from state
}

TEST(OffloadKeys, EnvironmentProvider) {
  const std::string hex(64, 'a');
  ASSERT_EQ(::setenv("KVPACK_TEST_KEY", (hex + "\n").c_str(), 1), 0);
  ko::EnvKeyProvider env("KVPACK_TEST_KEY");
  auto k = env.key_encryption_key();
  ASSERT_TRUE(k) << k.error().message;
  for (std::byte b : k->bytes()) EXPECT_EQ(std::to_integer<int>(b), 0xAA);

  ASSERT_EQ(::setenv("KVPACK_TEST_KEY", std::string(63, 'a').c_str(), 1), 0);
  EXPECT_EQ(env.key_encryption_key().error().code, Errc::invalid_argument);
  ASSERT_EQ(::setenv("KVPACK_TEST_KEY", (std::string(62, 'a') + "zz").c_str(), 1), 0);
  EXPECT_EQ(env.key_encryption_key().error().code, Errc::invalid_argument);
  ::unsetenv("KVPACK_TEST_KEY");
  auto missing = env.key_encryption_key();
  ASSERT_FALSE(missing);
  EXPECT_NE(missing.error().message.find("KVPACK_TEST_KEY"), std::string::npos);
}

TEST(OffloadKeys, FileProvider) {
  ko::testing::TempDir dir;
  const std::string raw = dir.path() + "/raw.key", hex = dir.path() + "/hex.key";
  {
    std::ofstream(raw, std::ios::binary) << std::string(32, '\x11');
    std::ofstream(hex) << std::string(64, '2') << "\n";
  }
  ::chmod(raw.c_str(), 0600);
  ::chmod(hex.c_str(), 0400);
  auto a = ko::FileKeyProvider(raw).key_encryption_key();
  ASSERT_TRUE(a) << a.error().message;
  for (std::byte b : a->bytes()) EXPECT_EQ(std::to_integer<int>(b), 0x11);
  auto b = ko::FileKeyProvider(hex).key_encryption_key();
  ASSERT_TRUE(b) << b.error().message;
  for (std::byte x : b->bytes()) EXPECT_EQ(std::to_integer<int>(x), 0x22);

  ::chmod(raw.c_str(), 0644);  // readable by others: refused
  EXPECT_EQ(ko::FileKeyProvider(raw).key_encryption_key().error().code, Errc::invalid_argument);
  EXPECT_EQ(ko::FileKeyProvider(dir.path() + "/missing").key_encryption_key().error().code, Errc::io_error);
  const std::string shortk = dir.path() + "/short.key";
  std::ofstream(shortk, std::ios::binary) << std::string(31, '\x11');
  ::chmod(shortk.c_str(), 0600);
  EXPECT_EQ(ko::FileKeyProvider(shortk).key_encryption_key().error().code, Errc::invalid_argument);
}

TEST(OffloadKeys, PassphraseProviderIsDeterministicPerSalt) {
  const auto salt = ko::PassphraseKeyProvider::random_salt();
  auto other_salt = salt;
  other_salt[0] ^= std::byte{1};
  auto make = [](std::string_view pw, const ko::PassphraseKeyProvider::Salt& s) {
    return ko::PassphraseKeyProvider::create(pw, s, crypto_pwhash_OPSLIMIT_MIN, crypto_pwhash_MEMLIMIT_MIN * 4).value();
  };
  auto k1 = make("correct horse", salt).key_encryption_key().value();
  auto k2 = make("correct horse", salt).key_encryption_key().value();
  auto k3 = make("correct horse", other_salt).key_encryption_key().value();
  auto k4 = make("correct hors3", salt).key_encryption_key().value();
  EXPECT_TRUE(std::equal(k1.bytes().begin(), k1.bytes().end(), k2.bytes().begin()));
  EXPECT_FALSE(std::equal(k1.bytes().begin(), k1.bytes().end(), k3.bytes().begin()));
  EXPECT_FALSE(std::equal(k1.bytes().begin(), k1.bytes().end(), k4.bytes().begin()));
  EXPECT_EQ(ko::PassphraseKeyProvider::create("", salt).error().code, Errc::invalid_argument);
  EXPECT_EQ(ko::PassphraseKeyProvider::create("x", salt, 0).error().code, Errc::invalid_argument);
}

TEST(OffloadKeys, StaticProvider) {
  std::vector<std::byte> key(32, std::byte{0x5A});
  auto p = ko::StaticKeyProvider::create(key).value();
  auto k = p.key_encryption_key().value();
  EXPECT_TRUE(std::equal(key.begin(), key.end(), k.bytes().begin()));
  key.pop_back();
  EXPECT_EQ(ko::StaticKeyProvider::create(key).error().code, Errc::invalid_argument);
}

TEST(OffloadKeys, WrapUnwrapBindsKekAndCache) {
  auto kek = random_key();
  auto data = random_key();
  const auto id = cache_id(9);
  auto w = ko::wrap_data_key(kek, data, id).value();
  auto back = ko::unwrap_data_key(kek, w, id);
  ASSERT_TRUE(back);
  EXPECT_TRUE(std::equal(data.bytes().begin(), data.bytes().end(), back->bytes().begin()));
  EXPECT_EQ(ko::unwrap_data_key(random_key(), w, id).error().code, Errc::auth_failed);
  EXPECT_EQ(ko::unwrap_data_key(kek, w, cache_id(10)).error().code, Errc::auth_failed);
  for (std::size_t bit = 0; bit < w.size() * 8; ++bit) {
    auto t = w;
    t[bit / 8] ^= static_cast<std::byte>(1u << (bit % 8));
    ASSERT_EQ(ko::unwrap_data_key(kek, t, id).error().code, Errc::auth_failed) << "bit " << bit;
  }
}

}  // namespace test_offload_keys
