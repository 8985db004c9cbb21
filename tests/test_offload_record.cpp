// Block header, block ids and sealed records (CASES C11 at the byte level). Key handling
// (SecretBytes, key providers, data-key wrapping): test_offload_keys.cpp.
#include <gtest/gtest.h>

#include <algorithm>
#include <optional>
#include <string>
#include <vector>

#include "kvpack/kvpack.hpp"
#include "kvpack/offload/block_header.hpp"
#include "kvpack/offload/cache_layout.hpp"
#include "kvpack/offload/remote_page_key.hpp"
#include "kvpack/offload/block_record.hpp"
#include "kvpack/offload/crypto.hpp"
#include "support/offload_crypto_fixtures.hpp"
#include "support/offload_fixtures.hpp"
#include "support/sweep.hpp"

namespace ko = kvpack::offload;
using kvpack::Errc;
using ko::testing::c11_layout;
using ko::testing::cache_id;
using ko::testing::kC11PayloadBytes;
using ko::testing::random_key;
using ko::testing::random_payload;

namespace test_offload_record {  // own scope: compiled in one unity file with other tests
namespace {

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
  const auto h = ko::RecordHeader::make(c11_layout(), ko::Aead::xchacha20poly1305, 33, 10240).serialize();
  // 'KVPB', version 1, aead 1, flags 0, codec 0x04520452, k_bits 4, v_bits 4, k_group 32,
  // v_group 32, head_dim 128, tokens 64, count 33, payload 10240 = 0x2800, 4 reserved zero bytes.
  const std::vector<int> want{'K', 'V', 'P', 'B', 1, 0, 1, 0, 0x52, 0x04, 0x52, 0x04, 4, 4, 32, 0,
                              32,  0,   128, 0,   64, 0, 33, 0, 0, 0x28, 0, 0, 0, 0, 0, 0};
  ASSERT_EQ(h.size(), want.size());
  for (std::size_t i = 0; i < want.size(); ++i) EXPECT_EQ(std::to_integer<int>(h[i]), want[i]) << "byte " << i;
}

TEST(OffloadHeader, RoundTripAndParseErrors) {
  const auto hdr = ko::RecordHeader::make(c11_layout(), ko::Aead::aes256gcm, 64, 10240);
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
  l.flags = 3;  // per-channel keys, before RoPE
  EXPECT_TRUE(l.validate());
  l.flags = 4;
  EXPECT_FALSE(l.validate());
  l = c11_layout();
  l.max_payload_bytes = 0;
  EXPECT_FALSE(l.validate());
}

// Keys stored before RoPE are another basis: a PreRope cache's records carry flag bit 1, so a
// shared prefix page of one kind has another address than the other's, and its header does not
// check against the other's layout.
TEST(OffloadHeader, PreRopeRecordsAreAnotherLayout) {
  using I4 = kvpack::Int4<kvpack::Group<32>>;
  using Post = kvpack::KVCache<kvpack::Keys<I4>, kvpack::Values<I4>, kvpack::Blocks<32>>;
  using Pre = kvpack::KVCache<kvpack::Keys<I4>, kvpack::Values<I4>, kvpack::Blocks<32>, kvpack::PreRope<>>;
  const kvpack::ModelShape s{.layers = 1, .q_heads = 4, .kv_heads = 2, .head_dim = 64, .max_tokens = 256};
  const auto post = Post::create(s).value();
  const auto pre = Pre::create(s).value();
  const ko::RecordLayout lp = ko::prefix_layout_for(post), lr = ko::prefix_layout_for(pre);
  EXPECT_EQ(lr.flags, lp.flags | 2);
  EXPECT_TRUE(lr.validate());
  EXPECT_NE(lp, lr);
  const std::vector<int32_t> prompt(32, 7);
  const auto d = ko::prefix_page_digests("model", prompt, 32)[0];
  const ko::PageCoord at{0, 1, 2, 0};
  EXPECT_NE(ko::page_key(d, at, lp, ko::Aead::xchacha20poly1305), ko::page_key(d, at, lr, ko::Aead::xchacha20poly1305));
  const auto h = ko::RecordHeader::make(lp, ko::Aead::xchacha20poly1305, 32, lp.max_payload_bytes);
  EXPECT_TRUE(h.check(lp, ko::Aead::xchacha20poly1305));
  EXPECT_EQ(h.check(lr, ko::Aead::xchacha20poly1305).error().code, Errc::corrupt_data);
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

}  // namespace test_offload_record
