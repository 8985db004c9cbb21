// PagedCache::attend_batch with per-sequence additive masks (BatchMask): one decode query per
// sequence over sequences of lengths 1, 31, 33, 95 and 200 (GQA: 4 query heads on 2 KV heads),
// codecs INT8, INT4 g32 and per-channel INT4 keys, on Backend<Scalar> and the build's best
// backend (Backend<Auto>):
//  - random and ALiBi-like linear masks against the float64 reference over what the pages hold
//    (tolerance 1e-5 relative beyond the documented integer-path bounds, as the other pool tests),
//    serially and on threads; the unmasked reference is far outside it (the mask is seen);
//  - -inf entries equal attention over the kept tokens alone;
//  - an all-zero mask is bit-identical to the unmasked call and to attend() of each sequence;
//  - bad masks (offsets, lengths, NaN, +inf, all -inf) are errors with `out` untouched.
#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <cmath>
#include <limits>
#include <tuple>
#include <vector>

#include "support/masked_reference.hpp"
#include "support/pool_twin.hpp"

namespace pool_masks_test {

using namespace kvpack;  // NOLINT: test file

using Int8Cfg = std::tuple<Keys<Int8<>>, Values<Int8<>>, Residual<8>, Blocks<32>>;
using Int4Cfg = std::tuple<Keys<Int4<Group<32>>>, Values<Int4<Group<32>>>, Residual<8>, Blocks<32>>;
using KiviCfg = std::tuple<Keys<Int4<Group<32>>, PerChannel>, Values<Int4<>>, Residual<16>, Blocks<64>>;

template <class Cfg, class Tag>
struct Config;
template <class... P, class Tag>
struct Config<std::tuple<P...>, Tag> {
  using Pool = PagedCache<P..., Backend<Tag>>;
  using Hook = typename Pool::codec_hook;
  using KC = typename Hook::key_codec;
  using VC = typename Hook::value_codec;
  /// The integer paths Backend<Tag> runs for these codecs (kernels/dispatch.hpp).
  static kvtest::IntPaths paths() { return kvtest::int_paths<Tag, Hook>(); }
};

const ModelShape kShape{.layers = 2, .q_heads = 4, .kv_heads = 2, .head_dim = 64, .max_tokens = 4096};
constexpr int kD = 64;
const std::size_t kRow = 2 * 64, kQRow = 4 * 64;
const std::vector<int> kLengths{1, 31, 33, 95, 200};
constexpr float kNegInf = -std::numeric_limits<float>::infinity();

/// Ragged masks of a batch (BatchMask's layout), owning their storage.
struct Masks {
  std::vector<float> values;
  std::vector<std::int64_t> offsets{0};
  void add(const std::vector<float>& m) {
    values.insert(values.end(), m.begin(), m.end());
    offsets.push_back(static_cast<std::int64_t>(values.size()));
  }
  [[nodiscard]] BatchMask view() const { return {values, offsets}; }
  [[nodiscard]] const float* of(std::size_t i) const { return values.data() + offsets[i]; }
};

enum class Kind { random, alibi, drop, zero };

/// The mask of a sequence of n tokens: random N(0, 2) with a quarter of the tokens -inf (random),
/// -slope * distance to the query (alibi), 0 or -inf (drop: the first 10 tokens and every third),
/// all 0 (zero). The query's own token (the last) is never dropped.
std::vector<float> make_mask(Kind kind, int n, std::uint32_t seed) {
  std::vector<float> m(static_cast<std::size_t>(n), 0.f);
  const auto r = kvtest::normal(static_cast<std::size_t>(n), seed, 2.f);
  for (int t = 0; t + 1 < n; ++t) {
    auto& x = m[static_cast<std::size_t>(t)];
    if (kind == Kind::random) x = (t * 7 + static_cast<int>(seed)) % 4 == 0 ? kNegInf : r[static_cast<std::size_t>(t)];
    if (kind == Kind::alibi) x = -0.125f * static_cast<float>(n - 1 - t);
    if (kind == Kind::drop) x = (t < 10 || t % 3 == 0) ? kNegInf : 0.f;
  }
  if (kind == Kind::random) m.back() = r.back();
  return m;
}

template <class Pool>
struct Batch {
  Pool pool = Pool::create({.shape = kShape, .byte_budget = 1 << 24, .max_sequences = 8}).value();
  std::vector<SeqId> seqs;
  std::vector<float> q = kvtest::normal(kLengths.size() * kQRow, 5);

  Batch() {
    std::uint32_t seed = 1;
    for (int len : kLengths) {
      seqs.push_back(pool.create_sequence().value());
      const int chunks[2][2] = {{0, len - 1}, {len - 1, 1}};  // the prompt, then the decode token
      for (const auto& [first, n] : chunks)
        for (int l = 0; n > 0 && l < kShape.layers; ++l, seed += 2)
          EXPECT_TRUE(pool.append(seqs.back(), l, kvtest::normal(static_cast<std::size_t>(n) * kRow, seed),
                                  kvtest::normal(static_cast<std::size_t>(n) * kRow, seed + 1), kvtest::iota_positions(first, n)));
    }
  }
  Masks masks(Kind kind, std::uint32_t seed) const {
    Masks m;
    for (int len : kLengths) m.add(make_mask(kind, len, seed++));
    return m;
  }
  std::vector<float> run(int layer, const Masks* m, int workers = 1) const {
    std::vector<Workspace> ws(static_cast<std::size_t>(workers));
    std::vector<float> out(q.size(), -1.f);
    const Executor ex = workers > 1 ? thread_executor(workers) : Executor{};
    auto st = m ? pool.attend_batch(layer, seqs, q, m->view(), out, ex, ws) : pool.attend_batch(layer, seqs, q, out, ex, ws);
    EXPECT_TRUE(st) << st.error().message;
    return out;
  }
  /// Reference of sequence i at `layer` with mask `bias` (nullptr: none), over the tokens whose
  /// `keep` entry is set (empty: all).
  kvtest::MaskedRef reference(std::size_t i, int layer, const float* bias, kvtest::IntPaths paths,
                              const std::vector<bool>& keep = {}) const {
    std::vector<std::vector<float>> K(2), V(2);
    std::int64_t quantized = 0, kept_quantized = 0;
    const std::vector<PageView> pages = pool.pages(seqs[i], layer, 0).value();
    for (const PageView& p : pages) quantized += p.header.count;
    for (int h = 0; h < kShape.kv_heads; ++h) {
      const HeadContents c = pool.read_back(seqs[i], layer, h).value();
      EXPECT_EQ(c.k.size(), static_cast<std::size_t>(kLengths[i]) * kD);
      kept_quantized = 0;
      for (std::size_t t = 0; t < c.k.size() / kD; ++t) {
        if (!keep.empty() && !keep[t]) continue;
        kept_quantized += static_cast<std::int64_t>(t) < quantized;
        K[static_cast<std::size_t>(h)].insert(K[static_cast<std::size_t>(h)].end(), c.k.begin() + static_cast<std::ptrdiff_t>(t * kD), c.k.begin() + static_cast<std::ptrdiff_t>((t + 1) * kD));
        V[static_cast<std::size_t>(h)].insert(V[static_cast<std::size_t>(h)].end(), c.v.begin() + static_cast<std::ptrdiff_t>(t * kD), c.v.begin() + static_cast<std::ptrdiff_t>((t + 1) * kD));
      }
    }
    return kvtest::masked_decode_ref64(K, V, q.data() + i * kQRow, bias, kShape.q_heads, kD, 1.0 / std::sqrt(double{kD}),
                                       kept_quantized, paths);
  }
};

template <class T>
class PoolMasks : public ::testing::Test {};
using Configs = ::testing::Types<Config<Int8Cfg, Scalar>, Config<Int8Cfg, Auto>, Config<Int4Cfg, Scalar>,
                                 Config<Int4Cfg, Auto>, Config<KiviCfg, Scalar>, Config<KiviCfg, Auto>>;
TYPED_TEST_SUITE(PoolMasks, Configs);

TYPED_TEST(PoolMasks, RandomAndAlibiMasksMatchTheReference) {
  Batch<typename TypeParam::Pool> b;
  for (const Kind kind : {Kind::random, Kind::alibi}) {
    const Masks m = b.masks(kind, kind == Kind::random ? 100 : 200);
    for (int layer = 0; layer < kShape.layers; ++layer) {
      const auto out = b.run(layer, &m);
      EXPECT_TRUE(kvtest::same_bits(b.run(layer, &m, 3), out)) << "threads change the output";
      for (std::size_t i = 0; i < kLengths.size(); ++i) {
        const float* got = out.data() + i * kQRow;
        const auto ref = b.reference(i, layer, m.of(i), TypeParam::paths());
        EXPECT_LE(kvtest::masked_error(got, ref, kD), 1e-5) << "length " << kLengths[i] << " layer " << layer;
        if (kLengths[i] > 1) {  // the mask is seen: the unmasked reference is far away
          EXPECT_GT(kvtest::masked_error(got, b.reference(i, layer, nullptr, TypeParam::paths()), kD), 1e-3)
              << "length " << kLengths[i];
        }
      }
    }
  }
}

TYPED_TEST(PoolMasks, NegativeInfinityEqualsDroppingTheTokens) {
  Batch<typename TypeParam::Pool> b;
  const Masks m = b.masks(Kind::drop, 0);
  for (int layer = 0; layer < kShape.layers; ++layer) {
    const auto out = b.run(layer, &m);
    for (std::size_t i = 0; i < kLengths.size(); ++i) {
      std::vector<bool> keep(static_cast<std::size_t>(kLengths[i]));
      for (std::size_t t = 0; t < keep.size(); ++t) keep[t] = m.of(i)[t] == 0.f;
      const auto ref = b.reference(i, layer, nullptr, TypeParam::paths(), keep);
      EXPECT_LE(kvtest::masked_error(out.data() + i * kQRow, ref, kD), 1e-5) << "length " << kLengths[i];
    }
  }
}

TYPED_TEST(PoolMasks, ZeroMaskIsBitIdenticalToTheUnmaskedCall) {
  Batch<typename TypeParam::Pool> b;
  const Masks m = b.masks(Kind::zero, 0);
  for (int layer = 0; layer < kShape.layers; ++layer) {
    const auto masked = b.run(layer, &m, 2);
    EXPECT_TRUE(kvtest::same_bits(masked, b.run(layer, nullptr))) << "layer " << layer;
    for (std::size_t i = 0; i < kLengths.size(); ++i) {
      const std::vector<float> qi(b.q.begin() + static_cast<std::ptrdiff_t>(i * kQRow), b.q.begin() + static_cast<std::ptrdiff_t>((i + 1) * kQRow));
      const std::vector<float> got(masked.begin() + static_cast<std::ptrdiff_t>(i * kQRow), masked.begin() + static_cast<std::ptrdiff_t>((i + 1) * kQRow));
      EXPECT_TRUE(kvtest::same_bits(got, kvtest::pool_attend(b.pool, b.seqs[i], layer, qi))) << "length " << kLengths[i];
    }
  }
}

TEST(PoolMasksErrors, BadMasksAreErrorsAndLeaveOutUntouched) {
  using Pool = Config<Int8Cfg, Scalar>::Pool;
  auto pool = Pool::create({.shape = kShape, .byte_budget = 1 << 22, .max_sequences = 4}).value();
  const SeqId a = pool.create_sequence().value(), c = pool.create_sequence().value();
  const std::pair<SeqId, int> fill[] = {{a, 33}, {c, 5}};
  for (const auto& [id, n] : fill)
    for (int l = 0; l < kShape.layers; ++l)
      ASSERT_TRUE(pool.append(id, l, kvtest::normal(static_cast<std::size_t>(n) * kRow, 1),
                              kvtest::normal(static_cast<std::size_t>(n) * kRow, 2), kvtest::iota_positions(0, n)));
  const std::vector<SeqId> seqs{a, c};
  std::vector<Workspace> ws(1);
  auto q = kvtest::normal(2 * kQRow, 3);
  std::vector<float> out(q.size(), 7.f), ok(q.size());
  std::vector<float> values(38, 0.5f);
  std::vector<std::int64_t> offsets{0, 33, 38};
  auto check = [&](Errc code, std::vector<std::string> words) {
    auto st = pool.attend_batch(1, seqs, q, BatchMask{values, offsets}, out, {}, ws);
    ASSERT_FALSE(st);
    EXPECT_EQ(st.error().code, code) << st.error().message;
    for (const auto& w : words) EXPECT_THAT(st.error().message, ::testing::HasSubstr(w));
    for (float x : out) ASSERT_EQ(x, 7.f);
  };
  ASSERT_TRUE(pool.attend_batch(1, seqs, q, BatchMask{values, offsets}, ok, {}, ws));
  offsets = {0, 33};
  check(Errc::invalid_argument, {"N + 1 = 3"});
  offsets = {0, 34, 33};
  check(Errc::invalid_argument, {"offset 2 = 33"});
  offsets = {0, 33, 39};
  check(Errc::invalid_argument, {"offset 2 = 39", "38 mask values"});
  offsets = {0, 33, 37};
  check(Errc::invalid_argument, {"sequence 1", "mask of 4 entries", "holds 5 tokens"});
  offsets = {0, 33, 38};
  values[33 + 2] = std::nanf("");
  check(Errc::non_finite, {"sequence 1", "entry 2"});
  values[33 + 2] = std::numeric_limits<float>::infinity();
  check(Errc::non_finite, {"sequence 1", "entry 2"});
  values[33 + 2] = 0.f;
  std::fill_n(values.begin(), 33, kNegInf);
  check(Errc::invalid_argument, {"sequence 0", "-inf"});
  values[32] = 1.f;  // one finite entry is enough
  ASSERT_TRUE(pool.attend_batch(1, seqs, q, BatchMask{values, offsets}, ok, {}, ws));
  // The unmasked call's checks still come first: a stale handle, a non-finite query.
  const SeqId freed = pool.create_sequence().value();
  ASSERT_TRUE(pool.free_sequence(freed));
  const std::vector<SeqId> with_freed{a, freed};
  EXPECT_FALSE(pool.attend_batch(1, with_freed, q, BatchMask{values, offsets}, out, {}, ws));
  q[kQRow + 1] = std::nanf("");
  check(Errc::non_finite, {"non-finite q"});
  for (float x : out) ASSERT_EQ(x, 7.f);
}

}  // namespace pool_masks_test
