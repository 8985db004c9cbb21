// PagedCache with PreRope<> (keys and queries handed over before RoPE, turned by the kernels at
// the stored positions; pool/paged_sequence.hpp attend_layer, cache/rope_state.hpp):
//  * a pool sequence equals a KVCache of the same policies bit for bit (page bytes, positions,
//    attention output) at odd lengths (prompts of 1, 31, 33, 95 tokens, then decode steps), with
//    positions that are not the cache indices and jump inside a page;
//  * every attend against a float64 reference that rotates the sequence's dequantized keys (its
//    read_back; the latest chunk exact) and the queries at their positions, both pairings, full and
//    partial rotary dims;
//  * fork, truncate and attend_batch keep that: a forked child and its parent decode as alone;
//    prefix attach, page import, swap out/in and truncate after attach decode as appended;
//  * a position outside the pool's RoPE table ([0, max_tokens), fixed at create) is refused with
//    nothing changed; the remote prefix records of a PreRope<> pool carry the layout's RoPE bit.
#include <gtest/gtest.h>

#include <cmath>
#include <cstdint>
#include <limits>
#include <utility>
#include <vector>

#include "kvpack/offload/cache_layout.hpp"
#include "support/pool_twin.hpp"
#include "support/rope_ref.hpp"

namespace pool_pre_rope_test {

using namespace kvpack;  // NOLINT: test file

using PerToken4 = std::tuple<Keys<Int4<>>, Values<Int4<>>, Residual<8>, Blocks<32>, PreRope<>>;
using Kivi4Sinks = std::tuple<Keys<Int4<Group<32>>, PerChannel>, Values<Int4<Group<32>>>, Sinks<4>, PreRope<>>;
using Int8Neox = std::tuple<Keys<Int8<>>, Values<Int8<Asymmetric>>, Blocks<16>, PreRope<OriginalPositions>>;

template <class T>
using Types = kvtest::PoolTypes<T>;

/// Shape per configuration: NeoX pairing with partial rotary dims for Int8Neox, adjacent and full
/// otherwise; rope base 10^4 or 5 * 10^5.
template <class T>
ModelShape shape_for() {
  ModelShape s{.layers = 2, .q_heads = 6, .kv_heads = 2, .head_dim = 64, .max_tokens = 1024};
  s.rope_base = std::is_same_v<T, Int8Neox> ? 500000.f : 10000.f;
  s.rope_neox = std::is_same_v<T, Int8Neox>;
  s.rope_dims = std::is_same_v<T, Int8Neox> ? 48 : 0;
  return s;
}

/// Max relative error of `got` (attention of the n_q newest tokens of `layer`, queries q at
/// positions q_pos) against float64: keys and values from the pool's read_back for tokens before
/// the latest chunk, the latest chunk's own rows (k, v: [chunk][kv_heads][D]) exactly.
template <class Pool>
double error_vs_float64(const Pool& pool, SeqId id, int layer, const std::vector<float>& k, const std::vector<float>& v,
                        const std::vector<std::int32_t>& chunk_pos, const std::vector<float>& q,
                        const std::vector<std::int32_t>& q_pos, const std::vector<float>& got) {
  const ModelShape& s = pool.shape();
  const int D = s.head_dim, group = s.q_heads / s.kv_heads, n_q = static_cast<int>(q_pos.size());
  const auto chunk = static_cast<std::int64_t>(chunk_pos.size());
  const std::int64_t total = *pool.tokens(id, layer), chunk_start = total - chunk;
  std::vector<double> ref(q.size(), 0.0);
  for (int h = 0; h < s.kv_heads; ++h) {
    auto c = pool.read_back(id, layer, h);
    EXPECT_TRUE(c);
    std::vector<std::vector<double>> ks, vs;
    for (std::size_t r = 0; r < c->indices.size() && c->indices[r] < chunk_start; ++r) {
      ks.emplace_back(c->k.begin() + static_cast<std::ptrdiff_t>(r * D), c->k.begin() + static_cast<std::ptrdiff_t>((r + 1) * D));
      vs.emplace_back(c->v.begin() + static_cast<std::ptrdiff_t>(r * D), c->v.begin() + static_cast<std::ptrdiff_t>((r + 1) * D));
      kvtest::rope_rotate64(ks.back().data(), s, c->positions[r]);
    }
    for (std::int64_t t = 0; t < chunk; ++t) {
      const std::size_t at = (static_cast<std::size_t>(t) * s.kv_heads + h) * D;
      ks.emplace_back(k.begin() + static_cast<std::ptrdiff_t>(at), k.begin() + static_cast<std::ptrdiff_t>(at + D));
      vs.emplace_back(v.begin() + static_cast<std::ptrdiff_t>(at), v.begin() + static_cast<std::ptrdiff_t>(at + D));
      kvtest::rope_rotate64(ks.back().data(), s, chunk_pos[static_cast<std::size_t>(t)]);
    }
    for (int i = 0; i < n_q; ++i) {
      const auto visible = static_cast<std::size_t>(total - n_q + i + 1);  // causal: cache indices <= its own
      for (int j = 0; j < group; ++j) {
        const std::size_t qa = (static_cast<std::size_t>(i) * s.q_heads + h * group + j) * D;
        std::vector<double> qr(q.begin() + static_cast<std::ptrdiff_t>(qa), q.begin() + static_cast<std::ptrdiff_t>(qa + D));
        kvtest::rope_rotate64(qr.data(), s, q_pos[static_cast<std::size_t>(i)]);
        std::vector<double> sc(visible);
        double mx = -INFINITY, l = 0;
        for (std::size_t t = 0; t < visible; ++t) {
          double dot = 0;
          for (int d = 0; d < D; ++d) dot += qr[static_cast<std::size_t>(d)] * ks[t][static_cast<std::size_t>(d)];
          sc[t] = dot / std::sqrt(static_cast<double>(D));
          mx = std::max(mx, sc[t]);
        }
        double* o = ref.data() + qa;
        for (std::size_t t = 0; t < visible; ++t) {
          const double p = std::exp(sc[t] - mx);
          l += p;
          for (int d = 0; d < D; ++d) o[d] += p * vs[t][static_cast<std::size_t>(d)];
        }
        for (int d = 0; d < D; ++d) o[d] /= l;
      }
    }
  }
  return kvtest::max_rel_error(got, ref, D);
}

template <class T>
class PoolPreRope : public ::testing::Test {};
using Configs = ::testing::Types<PerToken4, Kivi4Sinks, Int8Neox>;
TYPED_TEST_SUITE(PoolPreRope, Configs);

/// Positions of a prompt of n tokens then decode steps: 5 + 3t, with a jump of 40 after token 20
/// (inside a page of every configuration).
std::int32_t spaced(std::int64_t t) { return static_cast<std::int32_t>(5 + 3 * t + (t > 20 ? 40 : 0)); }

TYPED_TEST(PoolPreRope, EqualsKVCacheAndFloat64) {
  using Pool = typename Types<TypeParam>::pool;
  using Cache = typename Types<TypeParam>::cache;
  static_assert(Pool::pre_rope && takes_pre_rope_v<Pool>);
  const ModelShape shape = shape_for<TypeParam>();
  const auto row = static_cast<std::size_t>(shape.kv_heads) * shape.head_dim;
  const auto qrow = static_cast<std::size_t>(shape.q_heads) * shape.head_dim;
  for (int prompt : {1, 31, 33, 95}) {
    auto pool = Pool::create({.shape = shape, .byte_budget = std::size_t{1} << 22, .max_sequences = 2});
    auto twin = Cache::create(shape);
    ASSERT_TRUE(pool && twin);
    auto id = pool->create_sequence();
    ASSERT_TRUE(id);
    std::uint32_t seed = static_cast<std::uint32_t>(prompt) * 10;
    std::int64_t held = 0;
    for (int step = 0; step < 4; ++step) {  // the prompt, then 3 decode tokens
      const int n = step == 0 ? prompt : 1;
      std::vector<std::int32_t> pos(static_cast<std::size_t>(n));
      for (int t = 0; t < n; ++t) pos[static_cast<std::size_t>(t)] = spaced(held + t);
      for (int l = 0; l < shape.layers; ++l) {
        const auto k = kvtest::normal(static_cast<std::size_t>(n) * row, ++seed, 2.f);
        const auto v = kvtest::normal(static_cast<std::size_t>(n) * row, ++seed);
        ASSERT_TRUE(pool->append(*id, l, k, v, pos));
        ASSERT_TRUE(twin->append(l, k, v, pos));
        for (int h = 0; h < shape.kv_heads; ++h) kvtest::expect_same_pages(*pool, *id, *twin, l, h);
        const int n_q = std::min(n, 3);
        const auto q = kvtest::normal(static_cast<std::size_t>(n_q) * qrow, ++seed);
        std::vector<float> want(q.size());
        ASSERT_TRUE(twin->attend(l, q, want));
        const auto got = kvtest::pool_attend(*pool, *id, l, q);
        EXPECT_TRUE(kvtest::same_bits(got, want)) << "prompt " << prompt << " step " << step << " layer " << l;
        const std::vector<std::int32_t> q_pos(pos.end() - n_q, pos.end());
        EXPECT_LE(error_vs_float64(*pool, *id, l, k, v, pos, q, q_pos, got), 1e-5)
            << "prompt " << prompt << " step " << step << " layer " << l;
      }
      held += n;
    }
  }
}

TYPED_TEST(PoolPreRope, ForkTruncateAndBatchDecodeAsAlone) {
  using Pool = typename Types<TypeParam>::pool;
  const ModelShape shape = shape_for<TypeParam>();
  const auto row = static_cast<std::size_t>(shape.kv_heads) * shape.head_dim;
  const auto qrow = static_cast<std::size_t>(shape.q_heads) * shape.head_dim;
  auto pool = Pool::create({.shape = shape, .byte_budget = std::size_t{1} << 22, .max_sequences = 4, .max_rollback_tokens = 8});
  ASSERT_TRUE(pool);
  auto a = pool->create_sequence();
  ASSERT_TRUE(a);
  auto feed = [&](SeqId id, std::int64_t first, int n, std::uint32_t seed) {
    std::vector<std::int32_t> pos(static_cast<std::size_t>(n));
    for (int t = 0; t < n; ++t) pos[static_cast<std::size_t>(t)] = spaced(first + t);
    for (int l = 0; l < shape.layers; ++l) {
      const auto k = kvtest::normal(static_cast<std::size_t>(n) * row, seed + 2 * static_cast<std::uint32_t>(l), 2.f);
      const auto v = kvtest::normal(static_cast<std::size_t>(n) * row, seed + 2 * static_cast<std::uint32_t>(l) + 1);
      ASSERT_TRUE(pool->append(id, l, k, v, pos));
    }
  };
  feed(*a, 0, 70, 1);
  auto b = pool->fork(*a);
  ASSERT_TRUE(b);
  const auto q1 = kvtest::normal(qrow, 5);
  EXPECT_TRUE(kvtest::same_bits(kvtest::pool_attend(*pool, *b, 1, q1), kvtest::pool_attend(*pool, *a, 1, q1)))
      << "a child decodes its parent's latest chunk at the parent's positions";
  feed(*a, 70, 1, 100);  // the two sides diverge
  feed(*b, 70, 1, 200);
  const auto q = kvtest::normal(2 * qrow, 7);
  const std::vector<float> qa(q.begin(), q.begin() + static_cast<std::ptrdiff_t>(qrow)), qb(q.begin() + static_cast<std::ptrdiff_t>(qrow), q.end());
  std::vector<float> out(q.size());
  std::vector<Workspace> ws(2);
  const std::vector<SeqId> ids{*a, *b};
  ASSERT_TRUE(pool->attend_batch(1, ids, q, out, Executor{}, ws));
  EXPECT_TRUE(kvtest::same_bits({out.begin(), out.begin() + static_cast<std::ptrdiff_t>(qrow)}, kvtest::pool_attend(*pool, *a, 1, qa)));
  EXPECT_TRUE(kvtest::same_bits({out.begin() + static_cast<std::ptrdiff_t>(qrow), out.end()}, kvtest::pool_attend(*pool, *b, 1, qb)));
  // Rolled back to 66 tokens and fed again, b decodes as a sequence fed the same tokens directly.
  ASSERT_TRUE(pool->truncate(*b, 66));
  feed(*b, 66, 5, 300);
  auto c = pool->create_sequence();
  ASSERT_TRUE(c);
  feed(*c, 0, 70, 1);
  ASSERT_TRUE(pool->truncate(*c, 66));
  feed(*c, 66, 5, 300);
  kvtest::expect_same_pages(*pool, *b, *pool, *c);
  EXPECT_TRUE(kvtest::same_bits(kvtest::pool_attend(*pool, *b, 0, qa), kvtest::pool_attend(*pool, *c, 0, qa)));
}

// Pages that enter a sequence by the prefix cache (attach_prefix) or as payloads (import_pages)
// carry no positions: the sequence gives them their cache indices, which is what a publisher at
// positions 0, 1, ... used. Attached, imported, swapped and truncated PreRope sequences decode
// bit-identically to sequences that appended the same tokens themselves.
TEST(PoolPreRopeEdges, PrefixImportSwapAndTruncateDecodeAsAppended) {
  using Pool = Types<PerToken4>::pool;
  const ModelShape s = shape_for<PerToken4>();
  const auto row = static_cast<std::size_t>(s.kv_heads) * s.head_dim, qrow = static_cast<std::size_t>(s.q_heads) * s.head_dim;
  auto pool = Pool::create({.shape = s, .byte_budget = std::size_t{1} << 22, .max_sequences = 8, .max_rollback_tokens = 8});
  ASSERT_TRUE(pool);
  std::vector<std::vector<float>> ks, vs;  // per layer, 96 tokens
  for (int l = 0; l < s.layers; ++l) {
    ks.push_back(kvtest::normal(96 * row, 11 + 2 * static_cast<std::uint32_t>(l), 2.f));
    vs.push_back(kvtest::normal(96 * row, 12 + 2 * static_cast<std::uint32_t>(l)));
  }
  auto feed = [&](SeqId id, int from, int n) {
    const auto pos = kvtest::iota_positions(from, n);
    for (int l = 0; l < s.layers; ++l) {
      const auto at = static_cast<std::ptrdiff_t>(static_cast<std::size_t>(from) * row);
      const auto end = at + static_cast<std::ptrdiff_t>(static_cast<std::size_t>(n) * row);
      const std::vector<float> k(ks[static_cast<std::size_t>(l)].begin() + at, ks[static_cast<std::size_t>(l)].begin() + end);
      const std::vector<float> v(vs[static_cast<std::size_t>(l)].begin() + at, vs[static_cast<std::size_t>(l)].begin() + end);
      ASSERT_TRUE(pool->append(id, l, k, v, pos));
    }
  };
  const auto q = kvtest::normal(3 * qrow, 99);
  auto same_as = [&](SeqId x, SeqId y, const char* what) {
    for (int l = 0; l < s.layers; ++l)
      EXPECT_TRUE(kvtest::same_bits(kvtest::pool_attend(*pool, x, l, q), kvtest::pool_attend(*pool, y, l, q))) << what << " layer " << l;
  };
  const auto tokens = kvtest::iota_positions(1000, 96);  // token ids
  auto a = pool->create_sequence(), ref = pool->create_sequence();
  ASSERT_TRUE(a && ref);
  feed(*a, 0, 96);
  ASSERT_EQ(*pool->publish_prefix(*a, "m", tokens), 2);  // pages of 32 tokens, 8 held back (Residual<8>)
  feed(*ref, 0, 64);
  feed(*ref, 64, 32);
  auto b = pool->create_sequence();
  ASSERT_TRUE(b);
  ASSERT_EQ(*pool->attach_prefix(*b, "m", tokens), 64);
  feed(*b, 64, 32);
  same_as(*b, *ref, "attached");
  std::vector<std::byte> payload;  // ref's first two pages, [page][layer][kv_head][bytes]
  for (std::size_t page = 0; page < 2; ++page)
    for (int l = 0; l < s.layers; ++l)
      for (int h = 0; h < s.kv_heads; ++h) {
        const auto pages = pool->pages(*ref, l, h);
        ASSERT_TRUE(pages);
        payload.insert(payload.end(), (*pages)[page].data, (*pages)[page].data + pool->block_layout().bytes);
      }
  auto d = pool->create_sequence();
  ASSERT_TRUE(d);
  ASSERT_TRUE(pool->import_pages(*d, payload));
  feed(*d, 64, 32);
  same_as(*d, *ref, "imported");
  const auto before = kvtest::pool_attend(*pool, *ref, 1, q);
  HostSwapTarget target;
  ASSERT_TRUE(pool->swap_out(*ref, target));
  ASSERT_TRUE(pool->swap_in(*ref));
  EXPECT_TRUE(kvtest::same_bits(before, kvtest::pool_attend(*pool, *ref, 1, q))) << "swapped out and in";
  ASSERT_TRUE(pool->truncate(*b, 93));  // inside b's latest chunk
  auto e = pool->create_sequence();
  ASSERT_TRUE(e);
  feed(*e, 0, 64);
  feed(*e, 64, 29);
  same_as(*b, *e, "truncated");
}

TEST(PoolPreRopeEdges, PositionsOutsideTheTableAreRefused) {
  using Pool = Types<PerToken4>::pool;
  ModelShape shape = shape_for<PerToken4>();
  shape.max_tokens = 100;
  auto pool = Pool::create({.shape = shape, .byte_budget = std::size_t{1} << 20, .max_sequences = 1});
  ASSERT_TRUE(pool);
  auto id = pool->create_sequence();
  ASSERT_TRUE(id);
  const auto k = kvtest::normal(3 * static_cast<std::size_t>(shape.kv_heads) * shape.head_dim, 3);
  const Status st = pool->append(*id, 0, k, k, std::vector<std::int32_t>{0, 100, 2});
  ASSERT_FALSE(st);
  EXPECT_EQ(st.error().code, Errc::invalid_argument);
  EXPECT_NE(st.error().message.find("RoPE table"), std::string::npos) << st.error().message;
  EXPECT_EQ(*pool->length(*id), 0);
  ASSERT_TRUE(pool->append(*id, 0, k, k, std::vector<std::int32_t>{0, 1, 99}));
  EXPECT_EQ(*pool->length(*id), 3);
}

TEST(PoolPreRopeEdges, CreateChecksTheRopeFields) {
  using Pool = Types<PerToken4>::pool;
  for (const auto& [dims, base] : {std::pair{128, 10000.f}, {63, 10000.f}, {-2, 10000.f}, {0, -1.f}, {0, std::nanf("")}}) {
    ModelShape s = shape_for<PerToken4>();
    s.rope_dims = dims, s.rope_base = base;
    auto pool = Pool::create({.shape = s, .byte_budget = std::size_t{1} << 20, .max_sequences = 1});
    ASSERT_FALSE(pool) << "rope_dims " << dims << " rope_base " << base;
    EXPECT_EQ(pool.error().code, Errc::invalid_argument);
    EXPECT_NE(pool.error().message.find("PagedCache::create: PreRope<>"), std::string::npos) << pool.error().message;
  }
  ModelShape huge = shape_for<PerToken4>();  // a table beyond physical memory: refused, not allocated
  huge.max_tokens = std::numeric_limits<std::int32_t>::max();
  auto pool = Pool::create({.shape = huge, .byte_budget = std::size_t{1} << 20, .max_sequences = 1});
  ASSERT_FALSE(pool);
  EXPECT_EQ(pool.error().code, Errc::out_of_memory) << pool.error().message;
}

TEST(PoolPreRopeEdges, PrefixRecordsCarryTheRopeBit) {
  const ModelShape shape = shape_for<PerToken4>();
  auto rope = Types<PerToken4>::pool::create({.shape = shape, .byte_budget = std::size_t{1} << 20, .max_sequences = 1});
  auto post = PagedCache<Keys<Int4<>>, Values<Int4<>>, Residual<8>, Blocks<32>>::create(
      {.shape = shape, .byte_budget = std::size_t{1} << 20, .max_sequences = 1});
  ASSERT_TRUE(rope && post);
  EXPECT_EQ(offload::prefix_layout_for(*rope).flags & 2, 2);
  EXPECT_EQ(offload::prefix_layout_for(*post).flags & 2, 0);
  EXPECT_FALSE(offload::prefix_layout_for(*rope) == offload::prefix_layout_for(*post));
  // The RoPE table (max_tokens positions x 32 pairs x cos, sin) is counted in the pool's memory.
  EXPECT_EQ(rope->stats().pages_total, post->stats().pages_total);
  EXPECT_GE(rope->stats().overhead_bytes - post->stats().overhead_bytes,
            static_cast<std::size_t>(shape.max_tokens) * 32 * 2 * sizeof(float));
  EXPECT_EQ(rope->memory_bytes(), rope->stats().pages_total * rope->stats().page_bytes + rope->stats().overhead_bytes +
                                      rope->stats().exact_bytes);
}

}  // namespace pool_pre_rope_test
