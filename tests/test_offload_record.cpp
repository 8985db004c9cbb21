// Block header, key handling and sealed records (CASES C11 at the byte level).
#include <gtest/gtest.h>
#include <sys/stat.h>

#include <algorithm>
#include <cstdlib>
#include <fstream>
#include <string>
#include <vector>

#include "kvpack/offload/block_header.hpp"
#include "kvpack/offload/block_record.hpp"
#include "kvpack/offload/crypto.hpp"
#include "support/offload_fixtures.hpp"
#include "support/sweep.hpp"

namespace ko = kvpack::offload;
using kvpack::Errc;
using ko::testing::c11_layout;
using ko::testing::kC11PayloadBytes;
using ko::testing::random_payload;

namespace {

ko::SecretBytes random_key() { return ko::SecretBytes::random(ko::kKeyBytes).value(); }

ko::CacheId cache_id(uint8_t seed) {
  ko::CacheId c;
  for (std::size_t i = 0; i < c.bytes.size(); ++i) c.bytes[i] = static_cast<std::byte>(seed + 7 * i);
  return c;
}

bool all_zero(std::span<const std::byte> s) {
  return std::all_of(s.begin(), s.end(), [](std::byte b) { return b == std::byte{0}; });
}

std::vector<ko::Aead> aeads() {
  std::vector<ko::Aead> v{ko::Aead::xchacha20poly1305, ko::Aead::none};
  if (ko::aes256gcm_available()) v.push_back(ko::Aead::aes256gcm);
  return v;
}

}  // namespace

// ---- header ------------------------------------------------------------------------------------

TEST(OffloadHeader, KnownAnswerBytes) {
  const auto h = ko::RecordHeader::make(c11_layout(), ko::Aead::xchacha20poly1305, 33, 10496).serialize();
  // 'KVPB', version 1, aead 1, flags 0, codec 0x04520452, k_bits 4, v_bits 4, k_group 32,
  // v_group 32, head_dim 128, tokens 64, count 33, payload 10496 = 0x2900, 4 reserved zero bytes.
  const std::vector<int> want{'K', 'V', 'P', 'B', 1, 0, 1, 0, 0x52, 0x04, 0x52, 0x04, 4, 4, 32, 0,
                              32,  0,   128, 0,   64, 0, 33, 0, 0, 0x29, 0, 0, 0, 0, 0, 0};
  ASSERT_EQ(h.size(), want.size());
  for (std::size_t i = 0; i < want.size(); ++i) EXPECT_EQ(std::to_integer<int>(h[i]), want[i]) << "byte " << i;
}

TEST(OffloadHeader, RoundTripAndParseErrors) {
  const auto hdr = ko::RecordHeader::make(c11_layout(), ko::Aead::aes256gcm, 64, 10496);
  auto bytes = hdr.serialize();
  auto back = ko::RecordHeader::parse(bytes);
  ASSERT_TRUE(back);
  EXPECT_EQ(*back, hdr);
  EXPECT_TRUE(back->check(c11_layout(), ko::Aead::aes256gcm));

  EXPECT_EQ(ko::RecordHeader::parse(std::span(bytes).first(31)).error().code, Errc::corrupt_data);
  auto bad = bytes;
  bad[0] = std::byte{'X'};
  EXPECT_EQ(ko::RecordHeader::parse(bad).error().code, Errc::corrupt_data);
  bad = bytes;
  bad[4] = std::byte{2};  // format version 2
  EXPECT_EQ(ko::RecordHeader::parse(bad).error().code, Errc::corrupt_data);
  bad = bytes;
  bad[6] = std::byte{3};  // unknown aead
  EXPECT_EQ(ko::RecordHeader::parse(bad).error().code, Errc::corrupt_data);
  for (std::size_t i = 28; i < 32; ++i) {
    bad = bytes;
    bad[i] = std::byte{1};
    EXPECT_EQ(ko::RecordHeader::parse(bad).error().code, Errc::corrupt_data) << "reserved byte " << i;
  }
}

TEST(OffloadHeader, EveryLayoutFieldIsChecked) {
  const auto layout = c11_layout();
  struct Case {
    const char* field;
    ko::RecordLayout other;
  };
  std::vector<Case> cases;
  auto l = layout;
  l.head_dim = 64;
  cases.push_back({"head_dim", l});
  l = layout;
  l.k_group = 64;
  cases.push_back({"k_group", l});
  l = layout;
  l.v_group = 64;
  cases.push_back({"v_group", l});
  l = layout;
  l.k_bits = 8;
  cases.push_back({"k_bits", l});
  l = layout;
  l.v_bits = 8;
  cases.push_back({"v_bits", l});
  l = layout;
  l.flags = 1;
  cases.push_back({"flags", l});
  l = layout;
  l.codec_format = layout.codec_format + 1;
  cases.push_back({"codec_format", l});
  l = layout;
  l.block_tokens = 32;
  cases.push_back({"block_tokens", l});
  for (const auto& c : cases) {
    const auto h = ko::RecordHeader::make(c.other, ko::Aead::xchacha20poly1305, 16, 100);
    auto s = h.check(layout, ko::Aead::xchacha20poly1305);
    ASSERT_FALSE(s) << c.field;
    EXPECT_EQ(s.error().code, Errc::corrupt_data);
    EXPECT_NE(s.error().message.find(c.field), std::string::npos) << s.error().message;
  }
  const auto h = ko::RecordHeader::make(layout, ko::Aead::xchacha20poly1305, 16, 100);
  EXPECT_EQ(h.check(layout, ko::Aead::aes256gcm).error().code, Errc::corrupt_data);
  auto h2 = h;
  h2.token_count = 65;
  EXPECT_EQ(h2.check(layout, ko::Aead::xchacha20poly1305).error().code, Errc::corrupt_data);
  h2 = h;
  h2.payload_bytes = static_cast<uint32_t>(kC11PayloadBytes + 1);
  EXPECT_EQ(h2.check(layout, ko::Aead::xchacha20poly1305).error().code, Errc::corrupt_data);
}

TEST(OffloadHeader, LayoutValidation) {
  EXPECT_TRUE(c11_layout().validate());
  auto l = c11_layout();
  l.k_bits = 0;
  EXPECT_EQ(l.validate().error().code, Errc::invalid_argument);
  l = c11_layout();
  l.v_bits = 33;
  EXPECT_FALSE(l.validate());
  l = c11_layout();
  l.v_group = 0;
  EXPECT_FALSE(l.validate());
  l = c11_layout();
  l.flags = 2;
  EXPECT_FALSE(l.validate());
  l = c11_layout();
  l.max_payload_bytes = 0;
  EXPECT_FALSE(l.validate());
}

TEST(OffloadBlockId, SerializationIsLittleEndianAndDistinct) {
  ko::BlockId id{cache_id(1), {3, 1, 7}, 0x0102030405060708ull};
  const auto s = id.serialize();
  EXPECT_EQ(std::to_integer<int>(s[16]), 3);
  EXPECT_EQ(std::to_integer<int>(s[20]), 1);
  EXPECT_EQ(std::to_integer<int>(s[24]), 7);
  EXPECT_EQ(std::to_integer<int>(s[32]), 8);
  EXPECT_EQ(std::to_integer<int>(s[39]), 1);
  auto other = id;
  other.key.kv_head = 2;
  EXPECT_NE(other.serialize(), s);
  EXPECT_EQ(ko::describe(id.key), "block (layer 3, kv_head 1, block 7)");
}

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

// ---- records (C11 byte level) ------------------------------------------------------------------

class OffloadRecord : public ::testing::TestWithParam<ko::Aead> {
 protected:
  void SetUp() override {
    data_key_ = random_key();
    cipher_.emplace(ko::RecordCipher::create(GetParam(), data_key_).value());
    id_ = ko::BlockId{cache_id(1), {5, 3, 17}, 42};
    payload_ = random_payload(kC11PayloadBytes, 1234);
    record_.resize(ko::record_bytes(payload_.size()));
    ASSERT_TRUE(ko::seal_record(*cipher_, c11_layout(), id_, 64, payload_, record_));
  }
  kvpack::Result<ko::OpenedRecord> open(const ko::BlockId& id, std::span<const std::byte> rec, std::vector<std::byte>& out,
                                        const ko::RecordLayout& layout = c11_layout()) {
    out.assign(kC11PayloadBytes, std::byte{0xEE});
    return ko::open_record(*cipher_, layout, id, rec, out);
  }
  ko::SecretBytes data_key_;
  std::optional<ko::RecordCipher> cipher_;
  ko::BlockId id_;
  std::vector<std::byte> payload_, record_;
};

TEST_P(OffloadRecord, RoundTripIsBitIdentical) {
  EXPECT_EQ(record_.size(), kC11PayloadBytes + 72);
  std::vector<std::byte> out;
  auto r = open(id_, record_, out);
  ASSERT_TRUE(r) << r.error().message;
  EXPECT_EQ(r->token_count, 64);
  EXPECT_EQ(r->payload_bytes, kC11PayloadBytes);
  EXPECT_EQ(out, payload_);
  const auto body = std::span(record_).subspan(56, kC11PayloadBytes);
  if (GetParam() == ko::Aead::none) {
    EXPECT_TRUE(std::equal(body.begin(), body.end(), payload_.begin()));
  } else {
    // Encrypted: the body is not the payload, and sealing again gives another ciphertext.
    EXPECT_FALSE(std::equal(body.begin(), body.end(), payload_.begin()));
    std::vector<std::byte> again(record_.size());
    ASSERT_TRUE(ko::seal_record(*cipher_, c11_layout(), id_, 64, payload_, again));
    EXPECT_NE(again, record_);
  }
}

TEST_P(OffloadRecord, OddPayloadSizesRoundTrip) {
  for (std::size_t n : {0u, 1u, 31u, 33u, 95u}) {
    auto p = random_payload(n, n);
    std::vector<std::byte> rec(ko::record_bytes(n)), out(n + 3, std::byte{0xEE});
    ASSERT_TRUE(ko::seal_record(*cipher_, c11_layout(), id_, 1, p, rec));
    auto r = ko::open_record(*cipher_, c11_layout(), id_, rec, out);
    ASSERT_TRUE(r) << n << ": " << r.error().message;
    EXPECT_EQ(r->payload_bytes, n);
    EXPECT_TRUE(std::equal(p.begin(), p.end(), out.begin())) << n;
  }
}

// C11: one flipped ciphertext byte -> authentication error, no data.
TEST_P(OffloadRecord, FlippedCiphertextByteIsRejected) {
  auto t = record_;
  t[56 + 5000] ^= std::byte{0x01};
  std::vector<std::byte> out;
  auto r = open(id_, t, out);
  ASSERT_FALSE(r);
  EXPECT_EQ(r.error().code, Errc::auth_failed);
  EXPECT_NE(r.error().message.find("block (layer 5, kv_head 3, block 17)"), std::string::npos) << r.error().message;
  EXPECT_TRUE(all_zero(out));
}

// Every single-bit change anywhere in the record (header, nonce, body, tag) is rejected and
// leaves the output all zero.
// A short sweep (support/sweep.hpp: sanitizer stages) flips one bit of every byte instead of all
// 8: bit i % 8 of byte i.
TEST_P(OffloadRecord, EveryBitFlipIsRejected) {
  std::vector<std::byte> out(kC11PayloadBytes);
  std::size_t auth = 0, corrupt = 0;
  const bool one_per_byte = kvtest::short_sweep();
  for (std::size_t bit = 0; bit < record_.size() * 8; ++bit) {
    if (one_per_byte && bit % 8 != (bit / 8) % 8) continue;
    const auto mask = static_cast<std::byte>(1u << (bit % 8));
    record_[bit / 8] ^= mask;
    std::fill(out.begin(), out.end(), std::byte{0xEE});
    auto r = ko::open_record(*cipher_, c11_layout(), id_, record_, out);
    record_[bit / 8] ^= mask;
    ASSERT_FALSE(r) << "bit " << bit << " accepted";
    ASSERT_TRUE(r.error().code == Errc::auth_failed || r.error().code == Errc::corrupt_data) << "bit " << bit;
    (r.error().code == Errc::auth_failed ? auth : corrupt) += 1;
    ASSERT_TRUE(all_zero(out)) << "bit " << bit << " left data in the output";
  }
  const std::size_t flips_per_byte = one_per_byte ? 1 : 8;
  EXPECT_EQ(auth + corrupt, record_.size() * flips_per_byte);
  EXPECT_GT(auth, kC11PayloadBytes * flips_per_byte);  // every body and tag bit is an authentication failure
  std::vector<std::byte> ok;
  EXPECT_TRUE(open(id_, record_, ok));  // and the untouched record still opens
}

// C11: a record cut by one byte (or grown by one) is an error.
TEST_P(OffloadRecord, TruncatedOrExtendedRecordIsRejected) {
  std::vector<std::byte> out;
  auto r = open(id_, std::span(record_).first(record_.size() - 1), out);
  ASSERT_FALSE(r);
  EXPECT_EQ(r.error().code, Errc::corrupt_data);
  EXPECT_TRUE(all_zero(out));
  auto longer = record_;
  longer.push_back(std::byte{0});
  EXPECT_EQ(open(id_, longer, out).error().code, Errc::corrupt_data);
  EXPECT_EQ(open(id_, std::span(record_).first(10), out).error().code, Errc::corrupt_data);
}

// C11: blocks A and B swapped, an old version replayed, or a record of another cache: the
// associated data binds cache id, layer, head, block index and version.
TEST_P(OffloadRecord, SwappedReplayedAndForeignRecordsAreRejected) {
  std::vector<std::byte> out;
  auto other = id_;
  other.key.block_index += 1;
  EXPECT_EQ(open(other, record_, out).error().code, Errc::auth_failed);
  other = id_;
  other.key.kv_head += 1;
  EXPECT_EQ(open(other, record_, out).error().code, Errc::auth_failed);
  other = id_;
  other.key.layer += 1;
  EXPECT_EQ(open(other, record_, out).error().code, Errc::auth_failed);
  other = id_;
  other.version += 1;  // the record is an old version of the block
  EXPECT_EQ(open(other, record_, out).error().code, Errc::auth_failed);
  other = id_;
  other.cache = cache_id(2);  // same key, another cache id
  EXPECT_EQ(open(other, record_, out).error().code, Errc::auth_failed);
  EXPECT_TRUE(all_zero(out));

  // Same ids, another cache's data key.
  auto foreign = ko::RecordCipher::create(GetParam(), random_key()).value();
  out.assign(kC11PayloadBytes, std::byte{0xEE});
  EXPECT_EQ(ko::open_record(foreign, c11_layout(), id_, record_, out).error().code, Errc::auth_failed);
  EXPECT_TRUE(all_zero(out));
}

// C11: a header with another layout (head_dim, group, bits) is rejected, even when the
// record is authentic (sealed by the same key for the same block).
TEST_P(OffloadRecord, OtherLayoutIsRejected) {
  for (int which = 0; which < 3; ++which) {
    auto l = c11_layout();
    if (which == 0) l.head_dim = 64;
    if (which == 1) l.k_group = 64;
    if (which == 2) l.v_bits = 8;
    std::vector<std::byte> rec(ko::record_bytes(1000));
    ASSERT_TRUE(ko::seal_record(*cipher_, l, id_, 64, std::span(payload_).first(1000), rec));
    std::vector<std::byte> out;
    auto r = open(id_, rec, out);
    ASSERT_FALSE(r);
    EXPECT_EQ(r.error().code, Errc::corrupt_data);
    EXPECT_NE(r.error().message.find(which == 0 ? "head_dim" : which == 1 ? "k_group" : "v_bits"), std::string::npos)
        << r.error().message;
    EXPECT_TRUE(all_zero(out));
    std::vector<std::byte> back(1000);
    EXPECT_TRUE(ko::open_record(*cipher_, l, id_, rec, back));  // fine under its own layout
  }
}

TEST_P(OffloadRecord, ArgumentErrors) {
  std::vector<std::byte> small(100, std::byte{0xEE});
  auto r = ko::open_record(*cipher_, c11_layout(), id_, record_, small);
  EXPECT_EQ(r.error().code, Errc::invalid_argument);
  EXPECT_TRUE(all_zero(small));
  std::vector<std::byte> rec(record_.size() - 1);
  EXPECT_EQ(ko::seal_record(*cipher_, c11_layout(), id_, 64, payload_, rec).error().code, Errc::invalid_argument);
  EXPECT_EQ(ko::seal_record(*cipher_, c11_layout(), id_, 65, payload_, record_).error().code, Errc::invalid_argument);
  auto big = random_payload(kC11PayloadBytes + 1, 1);
  std::vector<std::byte> bigrec(ko::record_bytes(big.size()));
  EXPECT_EQ(ko::seal_record(*cipher_, c11_layout(), id_, 64, big, bigrec).error().code, Errc::invalid_argument);
}

// A record sealed under one protection does not open under another (same data key).
TEST_P(OffloadRecord, ProtectionIsPartOfTheHeader) {
  for (ko::Aead other : aeads()) {
    if (other == GetParam()) continue;
    auto c = ko::RecordCipher::create(other, data_key_).value();
    std::vector<std::byte> out(kC11PayloadBytes);
    EXPECT_EQ(ko::open_record(c, c11_layout(), id_, record_, out).error().code, Errc::corrupt_data);
  }
}

INSTANTIATE_TEST_SUITE_P(Aeads, OffloadRecord, ::testing::ValuesIn(aeads()),
                         [](const ::testing::TestParamInfo<ko::Aead>& i) {
                           return i.param == ko::Aead::none ? std::string("MacOnly")
                                  : i.param == ko::Aead::xchacha20poly1305 ? std::string("XChaCha20Poly1305")
                                                                           : std::string("Aes256Gcm");
                         });

TEST(OffloadCrypto, AesGcmAvailabilityIsReported) {
  auto c = ko::RecordCipher::create(ko::Aead::aes256gcm, random_key());
  if (ko::aes256gcm_available()) {
    EXPECT_TRUE(c);
    EXPECT_EQ(ko::best_available_aead(), ko::Aead::aes256gcm);
  } else {
    EXPECT_EQ(c.error().code, Errc::unsupported);
    EXPECT_EQ(ko::best_available_aead(), ko::Aead::xchacha20poly1305);
  }
}
