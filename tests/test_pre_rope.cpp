// PreRope<> caches (policy.hpp, kernels/rope.hpp): keys and queries arrive before RoPE and the
// kernels rotate them at the stored positions (OriginalPositions) or at each held token's rank
// (CacheRelative). Every attend is checked against a float64 reference that rotates the cache's
// own dequantized pre-RoPE keys (read_back) and the queries in double precision, then attends
// causally: odd chunk sizes (1, 31, 33, 95), GQA, both pairings, partial rotary dims, sinks and
// residual windows, per-channel keys, eviction (positions kept after eviction, ranks renumbered),
// split-K over two threads, the scalar and SIMD kernels, and values-only Hadamard rotation.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <map>
#include <vector>

#include "kvpack/executor.hpp"
#include "kvpack/kvpack.hpp"
#include "support/reference.hpp"
#include "support/rope_ref.hpp"

namespace {

using namespace kvpack;  // NOLINT: test file

/// Drives a PreRope cache beside the float64 reference.
template <class Cache>
class RopeHarness {
 public:
  explicit RopeHarness(const ModelShape& s) : s_(s), cache_(std::move(Cache::create(s)).value()) {}
  Cache& cache() { return cache_; }
  [[nodiscard]] size_t row() const { return static_cast<size_t>(s_.kv_heads) * s_.head_dim; }
  [[nodiscard]] size_t qrow() const { return static_cast<size_t>(s_.q_heads) * s_.head_dim; }

  /// Appends n random tokens at positions pos (remembering the exact rows by cache index).
  void append(int layer, const std::vector<int32_t>& pos, uint32_t seed) {
    const size_t n = pos.size();
    const auto k = kvtest::normal(n * row(), seed), v = kvtest::normal(n * row(), seed + 7777);
    ASSERT_TRUE(cache_.append(layer, k, v, pos));
    for (size_t t = 0; t < n; ++t) {
      exact_k_[total_ + static_cast<int64_t>(t)].assign(k.begin() + t * row(), k.begin() + (t + 1) * row());
      exact_v_[total_ + static_cast<int64_t>(t)].assign(v.begin() + t * row(), v.begin() + (t + 1) * row());
      pos_[total_ + static_cast<int64_t>(t)] = pos[t];
    }
    last_pos_ = pos;
    chunk_first_ = total_;
    total_ += static_cast<int64_t>(n);
  }

  /// Attends the newest n_q tokens; returns the max relative error against the reference.
  double attend_error(int layer, int n_q, uint32_t seed) {
    const auto q = kvtest::normal(static_cast<size_t>(n_q) * qrow(), seed);
    std::vector<float> out(q.size());
    const auto st = cache_.attend(layer, q, out);
    EXPECT_TRUE(st) << (st ? "" : st.error().message);
    const int D = s_.head_dim, G = s_.q_heads / s_.kv_heads;
    std::vector<double> ref(out.size());
    for (int h = 0; h < s_.kv_heads; ++h) {
      auto c = cache_.read_back(layer, h);
      EXPECT_TRUE(c);
      // Rotated in double, then attended by the float64 reference over explicit cache indices.
      const size_t n = c->indices.size();
      std::vector<float> K(n * D), V(n * D), Q(static_cast<size_t>(n_q) * G * D);
      std::vector<double> row(static_cast<size_t>(D));
      for (size_t r = 0; r < n; ++r) {
        const int64_t idx = c->indices[r];
        const bool exact = idx >= chunk_first_;  // the latest chunk is read exactly
        for (int d = 0; d < D; ++d) {
          row[static_cast<size_t>(d)] = exact ? exact_k_[idx][static_cast<size_t>(h * D + d)] : c->k[r * D + static_cast<size_t>(d)];
          V[r * D + d] = exact ? exact_v_[idx][static_cast<size_t>(h * D + d)] : c->v[r * D + static_cast<size_t>(d)];
        }
        // Original positions as appended (not read_back's, which come from the same bookkeeping).
        EXPECT_EQ(c->positions[r], pos_[idx]) << "cache index " << idx;
        kvtest::rope_rotate64(row.data(), s_, Cache::rope_cache_relative ? static_cast<double>(r) : pos_[idx]);
        std::copy(row.begin(), row.end(), K.begin() + static_cast<std::ptrdiff_t>(r * D));
      }
      for (int i = 0; i < n_q; ++i) {
        const double q_pos = Cache::rope_cache_relative ? static_cast<double>(n) - n_q + i
                                                        : last_pos_[last_pos_.size() - static_cast<size_t>(n_q - i)];
        for (int j = 0; j < G; ++j) {
          const size_t at = (static_cast<size_t>(i) * s_.q_heads + static_cast<size_t>(h * G + j)) * D;
          std::copy_n(q.begin() + static_cast<std::ptrdiff_t>(at), D, row.begin());
          kvtest::rope_rotate64(row.data(), s_, q_pos);
          std::copy(row.begin(), row.end(), Q.begin() + static_cast<std::ptrdiff_t>((static_cast<size_t>(i) * G + j) * D));
        }
      }
      const auto o = kvtest::attention_ref64_indexed(K, V, c->indices, Q.data(), n_q, G, static_cast<int64_t>(G) * D, D,
                                                     1.0 / std::sqrt(static_cast<double>(D)), total_ - n_q);
      for (int i = 0; i < n_q; ++i)
        for (int j = 0; j < G; ++j)
          std::copy_n(o.begin() + static_cast<std::ptrdiff_t>((static_cast<size_t>(i) * G + j) * D), D,
                      ref.begin() + static_cast<std::ptrdiff_t>((static_cast<size_t>(i) * s_.q_heads + h * G + j) * D));
    }
    return kvtest::max_rel_error(out, ref, D);
  }

 private:
  ModelShape s_;
  Cache cache_;
  std::map<int64_t, std::vector<float>> exact_k_, exact_v_;
  std::map<int64_t, int32_t> pos_;
  std::vector<int32_t> last_pos_;
  int64_t chunk_first_ = 0, total_ = 0;
};

/// Positions 5 + 3t for tokens [first, first + n): not the cache indices, so a kernel that used
/// the index instead of the stored position fails.
std::vector<int32_t> prerope_spaced(int64_t first, int64_t n) {
  std::vector<int32_t> p(static_cast<size_t>(n));
  for (int64_t t = 0; t < n; ++t) p[static_cast<size_t>(t)] = static_cast<int32_t>(5 + 3 * (first + t));
  return p;
}

template <class Cache>
class PreRopeVsRef64 : public ::testing::Test {};

using I4 = Int4<Group<32>>;
using Caches = ::testing::Types<
    KVCache<PreRope<>>, KVCache<Keys<Int8<>>, Values<Int8<>>, PreRope<>>,
    KVCache<Keys<I4>, Values<I4>, PreRope<>>, KVCache<Keys<I4>, Values<I4>, PreRope<>, Backend<Scalar>>,
    KVCache<Keys<I4>, Values<I4>, PreRope<CacheRelative>>, KVCache<Keys<Fp8E4M3<>>, Values<Int4<>>, PreRope<>>,
    KVCache<Keys<I4, PerChannel>, Values<I4>, Residual<16>, PreRope<>>,
    KVCache<Keys<I4, PerChannel>, Values<I4>, Residual<16>, PreRope<>, Backend<Scalar>>,
    KVCache<Keys<I4, PerChannel>, Values<I4>, Sinks<4>, PreRope<>>,
    KVCache<Keys<Int8<>>, Values<Int4<>>, Sinks<3>, Residual<5>, Blocks<16>, PreRope<CacheRelative>>,
    KVCache<Keys<I4>, Values<I4>, SinkWindow<4, 60>, PreRope<CacheRelative>>,
    KVCache<Keys<I4>, Values<I4>, SinkWindow<4, 60>, PreRope<CacheRelative>, Backend<Scalar>>,
    KVCache<Keys<I4>, Values<I4>, SinkWindow<4, 60>, PreRope<>>,
    KVCache<Keys<Int8<>>, Values<Int8<>>, H2O<32, 28, 4>, PreRope<CacheRelative>>,
    KVCache<Keys<Int8<>>, Values<Int8<>>, H2O<32, 28, 4>, PreRope<>>,
    KVCache<Keys<Int8<>>, Values<Int8<>>, SnapKV<48, 8>, PreRope<>>>;  // compresses at the first decode append
TYPED_TEST_SUITE(PreRopeVsRef64, Caches);

// Odd prefill chunks, then decode past every eviction budget; both pairings, full and partial
// rotary dims; every attend checked.
TYPED_TEST(PreRopeVsRef64, OddChunksThenDecode) {
  for (const bool neox : {false, true})
    for (const int dims : {0, 32}) {
      ModelShape s{.layers = 2, .q_heads = 6, .kv_heads = 2, .head_dim = 64, .max_tokens = 4096};
      s.rope_base = 10000.f, s.rope_dims = dims, s.rope_neox = neox;
      RopeHarness<TypeParam> h(s);
      uint32_t seed = 11;
      int64_t total = 0;
      for (const int n : {1, 31, 33, 95, 1, 1, 1}) {
        h.append(1, prerope_spaced(total, n), seed++);
        total += n;
        EXPECT_LE(h.attend_error(1, std::min(n, 7), seed++), 1e-5) << "neox " << neox << " dims " << dims << " tokens " << total;
      }
    }
}

// Positions in runs (PreRope caches without eviction keep them per layer, a base per block): long
// consecutive runs, a jump inside a block, a jump back, then decode; every attend checked.
TYPED_TEST(PreRopeVsRef64, RunsWithJumps) {
  ModelShape s{.layers = 1, .q_heads = 4, .kv_heads = 2, .head_dim = 64, .max_tokens = 4096};
  s.rope_base = 10000.f;
  RopeHarness<TypeParam> h(s);
  uint32_t seed = 5;
  int32_t next = 0;
  for (const auto& [n, jump] : {std::pair<int, int32_t>{95, 0}, {33, 700}, {31, -600}, {1, 0}, {1, 3}, {64, 0}, {1, 0}}) {
    std::vector<int32_t> pos(static_cast<size_t>(n));
    next += jump;
    for (auto& p : pos) p = next++;
    h.append(0, pos, seed++);
    EXPECT_LE(h.attend_error(0, std::min(n, 5), seed++), 1e-5) << "chunk " << n << " after a jump of " << jump;
  }
}

// Split-K over two threads runs the same rotations (ranks and positions per chunk of blocks).
TYPED_TEST(PreRopeVsRef64, SplitKOverTwoThreads) {
  ModelShape s{.layers = 1, .q_heads = 9, .kv_heads = 3, .head_dim = 64, .max_tokens = 4096};
  s.rope_base = 100000.f;
  RopeHarness<TypeParam> h(s);
  h.cache().set_executor(thread_executor(2), 2);
  h.append(0, prerope_spaced(0, 300), 3);
  EXPECT_LE(h.attend_error(0, 8, 7), 1e-5) << "prompt";  // also SnapKV's observation window
  for (int t = 0; t < 3; ++t) {
    h.append(0, prerope_spaced(300 + t, 1), 40 + static_cast<uint32_t>(t));
    EXPECT_LE(h.attend_error(0, 1, 90 + static_cast<uint32_t>(t)), 1e-5) << "step " << t;
  }
}

// Values-only Hadamard rotation (Rotate<R, true, false>) over a PreRope cache: keys stay before
// RoPE and unrotated, values are stored rotated and the output rotated back; the float64
// reference on read_back (values in the caller's basis) holds as for the plain caches. Both
// position modes, sinks and per-channel keys (the <= 4.5-bit configuration of issue 20).
template <class Cache>
void values_rotated_prerope() {
  for (const bool neox : {false, true}) {
    ModelShape s{.layers = 1, .q_heads = 6, .kv_heads = 2, .head_dim = 64, .max_tokens = 4096};
    s.rope_base = 10000.f, s.rope_neox = neox;
    RopeHarness<Cache> h(s);
    uint32_t seed = 21;
    int64_t total = 0;
    for (const int n : {1, 31, 33, 95, 1, 1}) {
      h.append(0, prerope_spaced(total, n), seed++);
      total += n;
      EXPECT_LE(h.attend_error(0, std::min(n, 7), seed++), 1e-5) << "neox " << neox << " tokens " << total;
    }
    ASSERT_GT(h.cache().quantized_tokens(0), 0);
  }
}

// An engine asks takes_pre_rope_v whether to hand keys before RoPE: the adaptor must say so.
static_assert(takes_pre_rope_v<Rotated<KVCache<PreRope<>>, Rotate<Hadamard, true, false>>>);
static_assert(!takes_pre_rope_v<Rotated<KVCache<>, Rotate<Hadamard, true, false>>>);

TEST(PreRope, ValuesOnlyRotationOriginalPositions) {
  values_rotated_prerope<Rotated<KVCache<Keys<I4, PerChannel>, Values<Int4<Symmetric, Group<32>>>, Sinks<4>, PreRope<>>,
                                 Rotate<Hadamard, true, false>>>();
}
TEST(PreRope, ValuesOnlyRotationCacheRelative) {
  values_rotated_prerope<Rotated<KVCache<Keys<I4>, Values<I4>, SinkWindow<4, 60>, PreRope<CacheRelative>>,
                                 Rotate<SignedHadamard, true, false>>>();
}

// PreRope with original positions is the post-RoPE cache with the rotation moved inside: an fp32
// cache fed keys and queries rotated outside (in float, as a model runner does) gives the same output.
TEST(PreRope, Fp32EqualsPostRopeCache) {
  ModelShape s{.layers = 1, .q_heads = 4, .kv_heads = 2, .head_dim = 64, .max_tokens = 512};
  s.rope_base = 100000.f;
  auto pre = KVCache<PreRope<>>::create(s);
  auto post = KVCache<>::create(s);
  ASSERT_TRUE(pre && post);
  const auto pos = prerope_spaced(0, 95);
  auto k = kvtest::normal(95 * 128, 1), v = kvtest::normal(95 * 128, 2), q = kvtest::normal(4 * 64, 3);
  ASSERT_TRUE(pre->append(0, k, v, pos));
  auto rot = [&](std::vector<float>& x, size_t rows_per_token, const int32_t* p, size_t n) {
    for (size_t t = 0; t < n; ++t)
      for (size_t r = 0; r < rows_per_token; ++r) {
        std::vector<double> d(x.begin() + static_cast<std::ptrdiff_t>((t * rows_per_token + r) * 64),
                              x.begin() + static_cast<std::ptrdiff_t>((t * rows_per_token + r + 1) * 64));
        kvtest::rope_rotate64(d.data(), s, p[t]);
        std::copy(d.begin(), d.end(), x.begin() + static_cast<std::ptrdiff_t>((t * rows_per_token + r) * 64));
      }
  };
  std::vector<float> out_pre(q.size()), out_post(q.size());
  ASSERT_TRUE(pre->attend(0, q, out_pre));
  rot(k, 2, pos.data(), 95);
  rot(q, 4, pos.data() + 94, 1);
  ASSERT_TRUE(post->append(0, k, v, pos));
  ASSERT_TRUE(post->attend(0, q, out_post));
  for (size_t i = 0; i < q.size(); ++i) EXPECT_NEAR(out_pre[i], out_post[i], 2e-5f * (1.f + std::abs(out_post[i])));
}

// Cache-relative positions renumber the survivors of eviction: after a sink window slides, the
// held tokens sit at ranks 0..63 whatever their original positions, so appending the same keys
// at positions 2t or 3t changes nothing; with original positions (distances differ) it does.
TEST(PreRope, CacheRelativeIgnoresAbsolutePositions) {
  ModelShape s{.layers = 1, .q_heads = 2, .kv_heads = 1, .head_dim = 64, .max_tokens = 64};
  using Rel = KVCache<Keys<Int8<>>, Values<Int8<>>, SinkWindow<4, 60>, PreRope<CacheRelative>>;
  using Abs = KVCache<Keys<Int8<>>, Values<Int8<>>, SinkWindow<4, 60>, PreRope<>>;
  auto run = [&](auto tag, int32_t stride) {
    auto c = decltype(tag)::type::create(s);
    EXPECT_TRUE(c);
    for (int t = 0; t < 150; ++t)
      EXPECT_TRUE(c->append(0, kvtest::normal(64, 100 + static_cast<uint32_t>(t)), kvtest::normal(64, 900 + static_cast<uint32_t>(t)),
                            std::vector<int32_t>{stride * t}));
    std::vector<float> out(128);
    EXPECT_TRUE(c->attend(0, kvtest::normal(128, 5), out));
    return out;
  };
  auto diff = [](const std::vector<float>& a, const std::vector<float>& b) {
    float m = 0;
    for (size_t i = 0; i < a.size(); ++i) m = std::max(m, std::abs(a[i] - b[i]));
    return m;
  };
  EXPECT_LE(diff(run(std::type_identity<Rel>{}, 2), run(std::type_identity<Rel>{}, 3)), 1e-6f);
  EXPECT_GT(diff(run(std::type_identity<Abs>{}, 2), run(std::type_identity<Abs>{}, 3)), 1e-3f);
}

// CASES C7 with pre-RoPE keys: 4 sinks and a window of 8, head_dim 64, theta 10000, tokens at
// positions 0..20 one at a time. The held keys keep positions {0..3, 13..20} (original) and are
// rotated there, or at ranks 0..11 (cache-relative); keys stay unrotated in the cache, so
// renumbering every step cannot drift (each attend checked against the float64 reference).
template <class Cache>
void prerope_case_c7() {
  ModelShape s{.layers = 1, .q_heads = 2, .kv_heads = 1, .head_dim = 64, .max_tokens = 12};
  s.rope_base = 10000.f;
  RopeHarness<Cache> h(s);
  for (int t = 0; t <= 20; ++t) {
    h.append(0, {t}, 300 + static_cast<uint32_t>(t));
    EXPECT_LE(h.attend_error(0, 1, 700 + static_cast<uint32_t>(t)), 1e-5) << "token " << t;
  }
  auto c = h.cache().read_back(0, 0);
  ASSERT_TRUE(c);
  EXPECT_EQ(c->positions, (std::vector<int32_t>{0, 1, 2, 3, 13, 14, 15, 16, 17, 18, 19, 20}));
}
TEST(PreRope, CaseC7OriginalPositions) { prerope_case_c7<KVCache<SinkWindow<4, 8>, PreRope<>>>(); }
TEST(PreRope, CaseC7CacheRelative) { prerope_case_c7<KVCache<Keys<Int8<>>, Values<Int8<>>, SinkWindow<4, 8>, PreRope<CacheRelative>>>(); }

// Bad RoPE fields are refused at create; the table grows with the largest position appended.
TEST(PreRope, CreateChecksAndTableGrowth) {
  ModelShape s{.layers = 1, .q_heads = 2, .kv_heads = 1, .head_dim = 64, .max_tokens = 64};
  for (const float base : {0.f, -1.f, INFINITY, NAN}) {
    ModelShape b = s;
    b.rope_base = base;
    EXPECT_FALSE(KVCache<PreRope<>>::create(b)) << base;
  }
  for (const int dims : {-2, 3, 66}) {
    ModelShape b = s;
    b.rope_dims = dims;
    auto c = KVCache<PreRope<>>::create(b);
    ASSERT_FALSE(c) << dims;
    EXPECT_EQ(c.error().code, Errc::invalid_argument);
  }
  auto c = KVCache<PreRope<>>::create(s);
  ASSERT_TRUE(c);
  const size_t before = c->allocated_bytes();
  ASSERT_TRUE(c->append(0, kvtest::normal(64, 1), kvtest::normal(64, 2), std::vector<int32_t>{100000}));
  EXPECT_GE(c->allocated_bytes() - before, size_t{100001} * 64 * sizeof(float));  // 32 (cos, sin) pairs per position

  // A position near 2^31 would need a table beyond physical memory: a clear error, nothing changed.
  const size_t held = c->memory_bytes();
  const auto far = c->append(0, kvtest::normal(64, 5), kvtest::normal(64, 6), std::vector<int32_t>{2147483000});
  ASSERT_FALSE(far);
  EXPECT_EQ(far.error().code, Errc::out_of_memory);
  EXPECT_EQ(c->tokens(0), 1);
  EXPECT_EQ(c->memory_bytes(), held);

  // Cache-relative: ranks stay below the budget, so a sliding window's table stops growing.
  auto w = KVCache<SinkWindow<4, 60>, PreRope<CacheRelative>>::create(s);
  ASSERT_TRUE(w);
  size_t at_200 = 0;
  for (int t = 0; t < 2000; ++t) {
    ASSERT_TRUE(w->append(0, kvtest::normal(64, 3), kvtest::normal(64, 4), std::vector<int32_t>{t}));
    if (t == 199) at_200 = w->allocated_bytes();
  }
  EXPECT_EQ(w->allocated_bytes(), at_200);
  EXPECT_LT(at_200, size_t{1} << 20);
}

}  // namespace
