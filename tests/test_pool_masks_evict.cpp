// Masked batched decode on an evicting pool (EvictingPagedCache::attend_batch with a BatchMask):
// a mask holds one entry per token a sequence has appended (evicted ones included), by cache
// index, and the kernels add the entry of each held slot through BlockRef::slot_index. Sequences
// of 1, 31, 33, 95 and 200 prompt tokens decode past their budgets (H2O, SinkWindow, BlockSparse), Backend
// Scalar and the build's best, one and two workers:
//  - random masks (a quarter -inf) against the float64 reference over what the sequence holds
//    (read_back: held rows and their cache indices), tolerance 1e-5 relative beyond the
//    documented integer-path bounds; the unmasked reference is far outside it;
//  - all-zero masks are bit-identical to the unmasked call at every step, so the scores the
//    policy keeps (and what it evicts next) evolve the same;
//  - a mask whose length is not the sequence's appended tokens is an error, out untouched.
#include <gtest/gtest.h>

#include <cmath>
#include <limits>
#include <tuple>
#include <vector>

#include "support/masked_reference.hpp"
#include "support/pool_twin.hpp"

namespace pool_masks_evict_test {

using namespace kvpack;  // NOLINT: test file

using HHCfg = std::tuple<Keys<Int8<>>, Values<Int4<>>, Sinks<2>, Blocks<16>, H2O<16, 16, 2>>;
using SWCfg = std::tuple<Keys<Int4<Group<32>>>, Values<Int4<Group<32>>>, Residual<4>, Blocks<16>, SinkWindow<4, 40>>;
using BSCfg = std::tuple<Keys<Int8<>>, Values<Int4<>>, Blocks<16>, BlockSparse<Tokens<64>, 16, 1, 1>>;  // whole pages go

template <class Cfg, class Tag>
struct Config;
template <class... P, class Tag>
struct Config<std::tuple<P...>, Tag> {
  using Pool = PagedCache<P..., Backend<Tag>>;
  using Hook = typename Pool::codec_hook;
  static kvtest::IntPaths paths() { return kvtest::int_paths<Tag, Hook>(); }
};

const ModelShape kShape{.layers = 2, .q_heads = 4, .kv_heads = 2, .head_dim = 64, .max_tokens = 4096};
constexpr int kD = 64;
const std::size_t kRow = 2 * 64, kQRow = 4 * 64;
const std::vector<int> kPrompts{1, 31, 33, 95, 200};
constexpr float kNegInf = -std::numeric_limits<float>::infinity();

/// The masks of a batch (BatchMask's layout): random N(0, 2) with a quarter -inf, or all zero;
/// the query's own token (the last) is never dropped.
struct Masks {
  std::vector<float> values;
  std::vector<std::int64_t> offsets{0};
  Masks(const std::vector<std::int64_t>& lengths, bool zero, std::uint32_t seed) {
    for (const std::int64_t n : lengths) {
      const auto r = kvtest::normal(static_cast<std::size_t>(n), seed++, 2.f);
      for (std::int64_t t = 0; t < n; ++t)
        values.push_back(zero ? 0.f : (t + 1 < n && (t * 7 + seed) % 4 == 0) ? kNegInf : r[static_cast<std::size_t>(t)]);
      offsets.push_back(static_cast<std::int64_t>(values.size()));
    }
  }
  [[nodiscard]] BatchMask view() const { return {values, offsets}; }
};

template <class Pool>
struct Batch {
  Pool pool = Pool::create({.shape = kShape, .byte_budget = 1 << 23, .max_sequences = 8}).value();
  std::vector<SeqId> seqs;
  Batch() {
    for (int p : kPrompts) {
      seqs.push_back(pool.create_sequence().value());
      append(seqs.size() - 1, p, static_cast<std::uint32_t>(p) * 10);
    }
  }
  void append(std::size_t i, int n, std::uint32_t seed) {
    const std::int64_t at = pool.tokens(seqs[i], 0).value();
    for (int l = 0; l < kShape.layers; ++l)
      ASSERT_TRUE(pool.append(seqs[i], l, kvtest::normal(static_cast<std::size_t>(n) * kRow, seed + 2 * static_cast<std::uint32_t>(l)),
                              kvtest::normal(static_cast<std::size_t>(n) * kRow, seed + 2 * static_cast<std::uint32_t>(l) + 1),
                              kvtest::iota_positions(at, n)));
  }
  [[nodiscard]] std::vector<std::int64_t> lengths(int layer) const {
    std::vector<std::int64_t> n;
    for (const SeqId id : seqs) n.push_back(pool.tokens(id, layer).value());
    return n;
  }
  std::vector<float> run(int layer, const std::vector<float>& q, const Masks* m, int workers) {
    std::vector<Workspace> ws(static_cast<std::size_t>(workers));
    std::vector<float> out(q.size(), -1.f);
    const Executor ex = workers > 1 ? thread_executor(workers) : Executor{};
    auto st = m ? pool.attend_batch(layer, seqs, q, m->view(), out, ex, ws) : pool.attend_batch(layer, seqs, q, out, ex, ws);
    EXPECT_TRUE(st) << st.error().message;
    return out;
  }
  /// Largest error of sequence i's output `got` [q_heads][D] against the float64 reference with
  /// its mask (nullptr: none) over what it holds now, KV head by KV head (eviction may keep
  /// different tokens in each): masked_error of each head's query group.
  double error(std::size_t i, int layer, const float* q, const float* got, const float* mask, kvtest::IntPaths paths) const {
    const int group = kShape.q_heads / kShape.kv_heads;
    double worst = 0;
    for (int h = 0; h < kShape.kv_heads; ++h) {
      const HeadContents c = pool.read_back(seqs[i], layer, h).value();
      std::vector<float> bias;
      for (const std::int64_t t : c.indices) bias.push_back(mask ? mask[t] : 0.f);
      const auto held = static_cast<std::int64_t>(c.k.size() / kD);
      const kvtest::MaskedRef r = kvtest::masked_decode_ref64({c.k}, {c.v}, q + h * group * kD, mask ? bias.data() : nullptr,
                                                              group, kD, 1.0 / std::sqrt(double{kD}), held, paths);
      worst = std::max(worst, kvtest::masked_error(got + h * group * kD, r, kD));
    }
    return worst;
  }
};

template <class T>
class PoolMasksEvict : public ::testing::Test {};
using Configs = ::testing::Types<Config<HHCfg, Scalar>, Config<HHCfg, Auto>, Config<SWCfg, Scalar>, Config<SWCfg, Auto>,
                                 Config<BSCfg, Scalar>, Config<BSCfg, Auto>>;
TYPED_TEST_SUITE(PoolMasksEvict, Configs);

TYPED_TEST(PoolMasksEvict, RandomMasksMatchTheReferenceAcrossEviction) {
  Batch<typename TypeParam::Pool> b;
  for (int step = 0; step < 12; ++step) {
    for (std::size_t i = 0; i < b.seqs.size(); ++i) b.append(i, 1, 5000 + static_cast<std::uint32_t>(step * 16 + i) * 4);
    const auto q = kvtest::normal(b.seqs.size() * kQRow, 70 + static_cast<std::uint32_t>(step));
    for (int layer = 0; layer < kShape.layers; ++layer) {
      const Masks m(b.lengths(layer), false, 300 + static_cast<std::uint32_t>(step));
      // attend updates the scores, never the held rows: the references may be taken after it.
      const auto out = b.run(layer, q, &m, step % 2 + 1);
      for (std::size_t i = 0; i < b.seqs.size(); ++i) {
        const float* qi = q.data() + i * kQRow;
        const float* got = out.data() + i * kQRow;
        EXPECT_LE(b.error(i, layer, qi, got, m.values.data() + m.offsets[i], TypeParam::paths()), 1e-5)
            << "prompt " << kPrompts[i] << " step " << step;
        EXPECT_GT(b.error(i, layer, qi, got, nullptr, TypeParam::paths()), 1e-3) << "the mask is seen";
      }
    }
  }
}

TYPED_TEST(PoolMasksEvict, ZeroMasksEqualTheUnmaskedCallStepByStep) {
  Batch<typename TypeParam::Pool> masked, plain;
  for (int step = 0; step < 12; ++step) {
    for (std::size_t i = 0; i < masked.seqs.size(); ++i) {
      masked.append(i, 1, 9000 + static_cast<std::uint32_t>(step * 16 + i) * 4);
      plain.append(i, 1, 9000 + static_cast<std::uint32_t>(step * 16 + i) * 4);
    }
    const auto q = kvtest::normal(masked.seqs.size() * kQRow, 90 + static_cast<std::uint32_t>(step));
    for (int layer = 0; layer < kShape.layers; ++layer) {
      const Masks m(masked.lengths(layer), true, 0);
      EXPECT_TRUE(kvtest::same_bits(masked.run(layer, q, &m, 2), plain.run(layer, q, nullptr, 1))) << "step " << step;
    }
  }
  for (std::size_t i = 0; i < masked.seqs.size(); ++i)  // the scores evolved alike: the same tokens held
    EXPECT_EQ(masked.pool.read_back(masked.seqs[i], 1, 1).value().indices, plain.pool.read_back(plain.seqs[i], 1, 1).value().indices);
}

TEST(PoolMasksEvictErrors, AMaskOfHeldInsteadOfAppendedTokensIsRefused) {
  Batch<Config<HHCfg, Scalar>::Pool> b;
  for (int step = 0; step < 2; ++step)  // eviction commits lazily: a decode token or two first
    for (std::size_t i = 0; i < b.seqs.size(); ++i) b.append(i, 1, 77 + static_cast<std::uint32_t>(step * 8 + i) * 4);
  const auto q = kvtest::normal(b.seqs.size() * kQRow, 3);
  std::vector<std::int64_t> held;
  for (const SeqId id : b.seqs) held.push_back(b.pool.held_tokens(id, 0, 0).value());
  ASSERT_LT(held.back(), b.pool.tokens(b.seqs.back(), 0).value()) << "the 200-token prompt holds fewer than it appended";
  const Masks m(held, true, 0);
  std::vector<float> out(q.size(), -1.f);
  std::vector<Workspace> ws(1);
  auto st = b.pool.attend_batch(0, b.seqs, q, m.view(), out, Executor{}, ws);
  ASSERT_FALSE(st);
  EXPECT_EQ(st.error().code, Errc::invalid_argument);
  EXPECT_NE(st.error().message.find("mask of"), std::string::npos) << st.error().message;
  EXPECT_EQ(out, std::vector<float>(q.size(), -1.f));
}

}  // namespace pool_masks_evict_test
