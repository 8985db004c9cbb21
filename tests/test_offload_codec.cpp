// Offload of real encoded blocks from KVCache: CASES C2's offload round trip (constant groups
// exact before and after), C11 with a real INT4 block, and the codec identity in headers.
#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <random>
#include <vector>

#include "kvpack/kvpack.hpp"
#include "kvpack/offload.hpp"
#include "kvpack/offload/cache_layout.hpp"
#include "support/offload_fixtures.hpp"

namespace ko = kvpack::offload;
using kvpack::Errc;
using ko::testing::TempDir;

namespace {

// Decodes one block payload (kvpack::BlockLayout offsets, codecs' own row decoders) into
// K and V rows [count][head_dim] and positions [count] (zeros when the payload stores none:
// L.pos_bytes 0, KVCache::slot_positions).
template <class Cache>
void decode_payload(const kvpack::BlockLayout& L, std::span<const std::byte> d, int count, std::vector<float>& k,
                    std::vector<float>& v, std::vector<int32_t>& pos) {
  using KC = typename Cache::key_codec;
  using VC = typename Cache::value_codec;
  const int D = L.head_dim;
  k.assign(static_cast<std::size_t>(count * D), 0.f);
  v.assign(static_cast<std::size_t>(count * D), 0.f);
  pos.assign(static_cast<std::size_t>(count), 0);
  for (int t = 0; t < count; ++t) {
    const auto ts = static_cast<std::size_t>(t);
    if constexpr (Cache::keys_per_channel) {
      kvpack::decode_row_channels<KC>(d.data() + L.k_codes + ts * L.k_row,
                                      d.data() + L.k_meta + (ts / static_cast<std::size_t>(L.k_group)) * L.k_meta_group,
                                      D, k.data() + ts * static_cast<std::size_t>(D));
    } else {
      kvpack::decode_row<KC>(d.data() + L.k_codes + ts * L.k_row, d.data() + L.k_meta + ts * L.k_meta_token, D,
                             k.data() + ts * static_cast<std::size_t>(D));
    }
    kvpack::decode_row<VC>(d.data() + L.v_codes + ts * L.v_row, d.data() + L.v_meta + ts * L.v_meta_token, D,
                           v.data() + ts * static_cast<std::size_t>(D));
    if (L.pos_bytes) std::memcpy(&pos[ts], d.data() + L.positions + ts * sizeof(int32_t), sizeof(int32_t));
  }
}

ko::StoreConfig everything_out(const ko::RecordLayout& layout, const std::string& dir) {
  ko::StoreConfig c;
  c.layout = layout;
  c.resident_budget_bytes = 0;  // every block leaves the hot tier as soon as it is put
  c.background = false;
  c.host = ko::HostTier{.capacity_bytes = 3 * ko::record_bytes(layout.max_payload_bytes)};
  c.file = ko::FileTier{.directory = dir};
  return c;
}

}  // namespace

// ---- C2: constant groups, before and after an offload round trip --------------------------------

template <class Cache>
class OffloadC2 : public ::testing::Test {};

using C2Caches = ::testing::Types<
    kvpack::KVCache<kvpack::Keys<kvpack::Int8<kvpack::Symmetric>>, kvpack::Values<kvpack::Int8<kvpack::Symmetric>>>,
    kvpack::KVCache<kvpack::Keys<kvpack::Int8<kvpack::Asymmetric>>, kvpack::Values<kvpack::Int8<kvpack::Asymmetric>>>,
    kvpack::KVCache<kvpack::Keys<kvpack::Int4<kvpack::Symmetric>>, kvpack::Values<kvpack::Int4<kvpack::Symmetric>>>,
    kvpack::KVCache<kvpack::Keys<kvpack::Int4<kvpack::Asymmetric>>, kvpack::Values<kvpack::Int4<kvpack::Asymmetric>>>,
    kvpack::KVCache<kvpack::Keys<kvpack::Int4<>, kvpack::PerChannel>, kvpack::Values<kvpack::Int4<kvpack::Symmetric>>>,
    kvpack::KVCache<kvpack::Keys<kvpack::Int8<kvpack::MetaF32>, kvpack::PerChannel>,
                    kvpack::Values<kvpack::Int8<kvpack::Asymmetric, kvpack::MetaF32>>>>;
TYPED_TEST_SUITE(OffloadC2, C2Caches);

// head_dim 128, group 32: every group of 32 values is 100.0, 0.0 or -3.5 (per channel along
// tokens as well, so per-channel keys see constant groups too). Reconstruction error 0 from the
// cache, and 0 again from the block restored out of the encrypted host/file tiers.
TYPED_TEST(OffloadC2, ConstantGroupsExactBeforeAndAfterOffload) {
  using Cache = TypeParam;
  constexpr int kLayers = 2, kHeads = 2, D = 128, T = 64;
  static constexpr float kConst[3] = {100.0f, 0.0f, -3.5f};
  auto expect_k = [](int l, int h, int c) { return kConst[(c / 32 + h + l) % 3]; };
  auto expect_v = [](int l, int h, int c) { return kConst[(c / 32 + 2 * h + l + 1) % 3]; };
  auto cache = Cache::create({.layers = kLayers, .q_heads = kHeads, .kv_heads = kHeads, .head_dim = D, .max_tokens = T}).value();
  for (int l = 0; l < kLayers; ++l) {
    std::vector<float> k(T * kHeads * D), v(k.size());
    std::vector<int32_t> pos(T);
    for (int t = 0; t < T; ++t) {
      pos[static_cast<std::size_t>(t)] = t;
      for (int h = 0; h < kHeads; ++h)
        for (int c = 0; c < D; ++c) {
          k[static_cast<std::size_t>((t * kHeads + h) * D + c)] = expect_k(l, h, c);
          v[static_cast<std::size_t>((t * kHeads + h) * D + c)] = expect_v(l, h, c);
        }
    }
    ASSERT_TRUE(cache.append(l, k, v, pos));
  }
  const auto& BL = cache.block_layout();
  const auto layout = ko::layout_for(cache);
  TempDir dir;
  auto store = ko::OffloadStore::create(everything_out(layout, dir.path())).value();
  for (int l = 0; l < kLayers; ++l)
    for (int h = 0; h < kHeads; ++h) {
      // Before: the cache's own read-back is exact.
      auto before = cache.read_back(l, h).value();
      ASSERT_EQ(before.k.size(), static_cast<std::size_t>(T * D));
      for (int t = 0; t < T; ++t)
        for (int c = 0; c < D; ++c) {
          ASSERT_EQ(before.k[static_cast<std::size_t>(t * D + c)], expect_k(l, h, c));
          ASSERT_EQ(before.v[static_cast<std::size_t>(t * D + c)], expect_v(l, h, c));
        }
      const auto blocks = cache.blocks(l, h);
      ASSERT_EQ(blocks.size(), 1u);
      ASSERT_EQ(blocks[0].header.count, T);
      ASSERT_TRUE(store->put({l, h, 0}, blocks[0].header.count, std::span(blocks[0].data.get(), BL.bytes)));
      EXPECT_FALSE(store->is_resident({l, h, 0}));
    }
  EXPECT_EQ(store->metrics().offloaded_blocks, static_cast<uint64_t>(kLayers * kHeads));
  EXPECT_GT(store->metrics().file_tier_bytes, 0u);  // the host tier holds 3, the 4th went to the file
  for (int l = 0; l < kLayers; ++l)
    for (int h = 0; h < kHeads; ++h) {
      auto got = store->acquire({l, h, 0});
      ASSERT_TRUE(got) << got.error().message;
      const auto& orig = cache.blocks(l, h)[0];
      ASSERT_TRUE(std::equal(got->bytes().begin(), got->bytes().end(), orig.data.get()));
      std::vector<float> k, v;
      std::vector<int32_t> pos;
      decode_payload<Cache>(BL, got->bytes(), got->token_count(), k, v, pos);
      for (int t = 0; t < T; ++t) {
        const std::int32_t want_pos = BL.pos_bytes ? t : 0;
        ASSERT_EQ(pos[static_cast<std::size_t>(t)], want_pos);
        if constexpr (!Cache::slot_positions) {
          ASSERT_EQ(cache.block_positions(l).at(t), t);
        }
        for (int c = 0; c < D; ++c) {
          ASSERT_EQ(k[static_cast<std::size_t>(t * D + c)], expect_k(l, h, c)) << "t " << t << " c " << c;
          ASSERT_EQ(v[static_cast<std::size_t>(t * D + c)], expect_v(l, h, c)) << "t " << t << " c " << c;
        }
      }
    }
}

// ---- C11 with a real INT4 block ----------------------------------------------------------------

// 64 tokens x 8 KV heads x head_dim 128, INT4 asymmetric, group 32, fp16 scale + zero: one block
// per (layer, kv_head) of exactly the size the byte-level tests use; each one offloaded
// (encrypted, host then file) and restored decodes to exactly what the cache read back.
TEST(OffloadC11Real, Int4BlocksRoundTripThroughTiers) {
  using Cache = kvpack::KVCache<kvpack::Keys<kvpack::Int4<>>, kvpack::Values<kvpack::Int4<>>>;
  constexpr int H = ko::testing::kC11KvHeads, D = ko::testing::kC11HeadDim, T = ko::testing::kC11Tokens;
  auto cache = Cache::create({.layers = 1, .q_heads = H, .kv_heads = H, .head_dim = D, .max_tokens = T}).value();
  std::mt19937 rng(11);
  std::normal_distribution<float> n01;
  std::vector<float> k(T * H * D), v(k.size());
  for (auto& x : k) x = n01(rng);
  for (auto& x : v) x = n01(rng);
  std::vector<int32_t> pos(T);
  for (int t = 0; t < T; ++t) pos[static_cast<std::size_t>(t)] = 1000 + t;
  ASSERT_TRUE(cache.append(0, k, v, pos));
  ASSERT_EQ(cache.block_layout().bytes, ko::testing::kC11PayloadBytes);

  const auto layout = ko::layout_for(cache);
  EXPECT_EQ(layout, ko::testing::c11_layout());  // the byte-level tests use this very layout
  TempDir dir;
  auto store = ko::OffloadStore::create(everything_out(layout, dir.path())).value();
  for (int h = 0; h < H; ++h) {
    const auto& b = cache.blocks(0, h)[0];
    ASSERT_TRUE(store->put({0, h, 0}, b.header.count, std::span(b.data.get(), cache.block_layout().bytes)));
  }
  for (int h = 0; h < H; ++h) {
    auto got = store->acquire({0, h, 0});
    ASSERT_TRUE(got) << got.error().message;
    ASSERT_TRUE(std::equal(got->bytes().begin(), got->bytes().end(), cache.blocks(0, h)[0].data.get()));
    std::vector<float> rk, rv;
    std::vector<int32_t> rpos;
    decode_payload<Cache>(cache.block_layout(), got->bytes(), got->token_count(), rk, rv, rpos);
    const auto ref = cache.read_back(0, h).value();
    EXPECT_EQ(rk, ref.k);
    EXPECT_EQ(rv, ref.v);
    EXPECT_EQ(cache.block_layout().pos_bytes, 0u);  // positions stay with the cache, not the record
    EXPECT_EQ(rpos, std::vector<int32_t>(T, 0));
    EXPECT_EQ(ref.positions, pos);  // 1000, 1001, ...: from the cache's runs
  }
}

// ---- codec identity ----------------------------------------------------------------------------

TEST(OffloadCodecIdentity, EqualBitsDifferentCodecsGetDifferentIds) {
  using namespace kvpack;
  const uint32_t ids[] = {
      ko::codec_format_id<Int8<Symmetric>, Int8<Symmetric>>(),
      ko::codec_format_id<Int8<Asymmetric>, Int8<Symmetric>>(),
      ko::codec_format_id<Int8<Symmetric, MetaF32>, Int8<Symmetric>>(),
      ko::codec_format_id<Fp8E4M3<>, Int8<Symmetric>>(),
      ko::codec_format_id<Fp8E5M2<>, Int8<Symmetric>>(),
      ko::codec_format_id<Int8<Symmetric>, Fp8E4M3<>>(),
      ko::codec_format_id<Fp16, Fp16>(),
      ko::codec_format_id<Fp32, Fp32>(),
  };
  for (std::size_t i = 0; i < std::size(ids); ++i)
    for (std::size_t j = i + 1; j < std::size(ids); ++j) EXPECT_NE(ids[i], ids[j]) << i << " vs " << j;
  // Known answers: INT4 asymmetric fp16 = family 2 | asym 1<<4 | meta 2<<5 | bits 4<<8 = 0x452.
  EXPECT_EQ(ko::codec_descriptor<Int4<>>(), 0x452);
  EXPECT_EQ(ko::codec_descriptor<Fp8E5M2<MetaF32>>(), 0x884);
  EXPECT_EQ(ko::codec_descriptor<Fp32>(), 0x2001);
  EXPECT_EQ((ko::codec_format_id<Int4<>, Int8<>>()), 0x0842'0452u);  // value codec in the high half
}

// A record sealed for one cache layout is refused under another codec with identical sizes
// (FP8 E4M3 vs E5M2 keys): the codec id in the header tells them apart.
TEST(OffloadCodecIdentity, RecordOfAnotherCodecIsRejected) {
  using namespace kvpack;
  using A = KVCache<Keys<Fp8E4M3<>>, Values<Int8<>>>;
  using B = KVCache<Keys<Fp8E5M2<>>, Values<Int8<>>>;
  const ModelShape shape{.layers = 1, .q_heads = 1, .kv_heads = 1, .head_dim = 64, .max_tokens = 64};
  auto a = A::create(shape).value();
  auto b = B::create(shape).value();
  const auto la = ko::layout_for(a), lb = ko::layout_for(b);
  ASSERT_EQ(la.max_payload_bytes, lb.max_payload_bytes);
  auto key = ko::SecretBytes::random(32).value();
  auto cipher = ko::RecordCipher::create(ko::Aead::xchacha20poly1305, key).value();
  const ko::BlockId id{{}, {0, 0, 0}, 1};
  const std::size_t n = la.max_payload_bytes;
  const auto payload = ko::testing::random_payload(n, 3);
  std::vector<std::byte> rec(ko::record_bytes(n)), out(n);
  ASSERT_TRUE(ko::seal_record(cipher, la, id, 64, payload, rec));
  auto r = ko::open_record(cipher, lb, id, rec, out);
  ASSERT_FALSE(r);
  EXPECT_EQ(r.error().code, Errc::corrupt_data);
  EXPECT_NE(r.error().message.find("codec_format"), std::string::npos);
  EXPECT_TRUE(ko::open_record(cipher, la, id, rec, out));
}
