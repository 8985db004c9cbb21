// Issue 23 item 3: allocation failure. KVCache::create with layers = 1 << 30 used to abort the
// process with an uncaught std::bad_alloc; now every allocation reachable from create, append and
// attend that fails gives Errc::out_of_memory, and a failed call leaves the cache as it was.
//
// Fault injection: this file replaces global operator new (tests/support/alloc_fault.hpp, so it
// has an executable of its own: KVPACK_SOLO_TEST_REGEX in tests/CMakeLists.txt). Armed with N, the N-th allocation throws
// std::bad_alloc, once. For N = 1, 2, ... (1, 3, ... in short sweeps) a create + prefill + attend + decode + chunk sequence
// runs with the fault armed; each call must succeed or return Errc::out_of_memory with the cache
// unchanged (read_back of every head, tokens, memory_bytes), the failed call then succeeds when
// repeated, and at the end every attention output and the cache contents equal a run without
// faults, bit for bit. The sweep ends at the first N that the whole sequence never reaches.
// Caches: quantized with sinks and a residual window, H2O eviction (alone and with a Demote<> low
// tier), keyframe intervals, BlockSparse (masks and in-place compaction); each on the scalar
// kernel and the build's SIMD kernel (Backend<Auto>: AVX2, NEON); Protocol<H2O, FixedBudget>; and
// Rotated<> adaptors (keys and values; values only over a PreRope cache).
// AllocFaultShrink: the optional allocations that release prefill-sized buffers.
#include <gtest/gtest.h>

#include <cstdlib>
#include <new>
#include <string>
#include <vector>

#include "kvpack/kvpack.hpp"
#include "support/alloc_fault.hpp"  // the operator new / delete replacements, g_countdown, g_fired, Arm
#include "support/reference.hpp"
#include "support/sweep.hpp"

namespace {

using namespace kvpack;  // NOLINT: test file

const ModelShape kShape{.layers = 2, .q_heads = 4, .kv_heads = 2, .head_dim = 32, .max_tokens = 256};

struct Snapshot {
  std::vector<HeadContents> heads;
  std::vector<int64_t> tokens;
  size_t bytes = 0;
  bool operator==(const Snapshot& o) const {
    if (tokens != o.tokens || bytes != o.bytes || heads.size() != o.heads.size()) return false;
    for (size_t i = 0; i < heads.size(); ++i)
      if (heads[i].k != o.heads[i].k || heads[i].v != o.heads[i].v || heads[i].positions != o.heads[i].positions ||
          heads[i].indices != o.heads[i].indices)
        return false;
    return true;
  }
};

template <class Cache>
Snapshot snapshot(const Cache& c) {
  Snapshot s;
  for (int l = 0; l < kShape.layers; ++l) {
    s.tokens.push_back(c.tokens(l));
    for (int h = 0; h < kShape.kv_heads; ++h) s.heads.push_back(c.read_back(l, h).value());
  }
  s.bytes = c.memory_bytes();
  return s;
}

// One call of the sequence: an append of n tokens, or an attend of the last n_q, on one layer.
struct Op {
  bool append;
  int layer, n;
  uint32_t seed;
};
std::vector<Op> sequence() {
  std::vector<Op> ops;
  uint32_t seed = 1;
  for (int l = 0; l < kShape.layers; ++l) ops.push_back({true, l, 37, seed++}), ops.push_back({false, l, 37, seed++});
  for (int step = 0; step < 5; ++step)
    for (int l = 0; l < kShape.layers; ++l) ops.push_back({true, l, 1, seed++}), ops.push_back({false, l, 1, seed++});
  for (int l = 0; l < kShape.layers; ++l) ops.push_back({true, l, 20, seed++}), ops.push_back({false, l, 3, seed++});
  return ops;
}

// Runs one op (inputs made before arming, so only kvpack's allocations count).
template <class Cache>
Status run_op(Cache& c, const Op& op, std::vector<float>& out, bool arm) {
  const size_t row = static_cast<size_t>(kShape.kv_heads) * kShape.head_dim, qrow = static_cast<size_t>(kShape.q_heads) * kShape.head_dim;
  if (op.append) {
    const auto k = kvtest::normal(static_cast<size_t>(op.n) * row, op.seed), v = kvtest::normal(k.size(), op.seed + 1000);
    // Positions jump at every append and halfway through it, so that caches keeping positions
    // as runs (KVCache::slot_positions false) grow their run lists inside the append too.
    auto pos = kvtest::iota_positions(3 * c.tokens(op.layer), op.n);
    for (size_t i = pos.size() / 2; i < pos.size(); ++i) pos[i] += 1000;
    Arm a(arm);
    return c.append(op.layer, k, v, pos);
  }
  const auto q = kvtest::normal(static_cast<size_t>(op.n) * qrow, op.seed, 0.5f);
  out.assign(q.size(), 0.f);
  Arm a(arm);
  return c.attend(op.layer, q, out);
}

template <class Cache>
class AllocFault : public ::testing::Test {};
using FaultCaches =
    ::testing::Types<KVCache<Keys<Int8<>>, Values<Int4<>>, Sinks<2>, Residual<5>, Blocks<16>, Backend<Scalar>>,
                     KVCache<Keys<Int8<>>, Values<Int4<>>, Sinks<2>, Residual<5>, Blocks<16>, Backend<Auto>>,
                     KVCache<Keys<Int8<>>, Values<Int8<>>, H2O<12, 8, 2>, Blocks<16>, Backend<Scalar>>,
                     KVCache<Keys<Int8<>>, Values<Int8<>>, H2O<12, 8, 2>, Blocks<16>, Backend<Auto>>,
                     KVCache<Keys<Int8<>>, Values<Int8<>>, H2O<12, 8, 2>, Blocks<16>, Backend<Scalar>,
                             Demote<Keys<Int2<>>, Values<Int2<>>>>,
                     KVCache<Keys<Int8<>>, Values<Int8<>>, H2O<12, 8, 2>, Blocks<16>, Backend<Auto>,
                             Demote<Keys<Int4<>>, Values<Int2<>>>>,
                     KVCache<Keys<Keyframe<8, Int4<>, Fp16>>, Values<Fp16>, Backend<Scalar>>,
                     KVCache<Keys<Keyframe<8, Int4<>, Fp16>>, Values<Fp16>, Backend<Auto>>,
                     // BlockSparse masks blocks out and compacts in place; a Protocol's prompt end
                     // commits the whole prompt before it evicts.
                     KVCache<Keys<Int8<>>, Values<Int4<>>, Blocks<8>, BlockSparse<Tokens<24>, 8, 1, 1>, Backend<Scalar>>,
                     KVCache<Keys<Int8<>>, Values<Int4<>>, Blocks<8>, BlockSparse<Tokens<24>, 8, 1, 1>, Backend<Auto>>,
                     KVCache<Keys<Int8<>>, Values<Int4<>>, Blocks<16>, Protocol<H2OBudget<Fraction<1, 2>, 2>, FixedBudget>, Backend<Auto>>,
                     // Rotated<> copies chunks and queries into rotated buffers; over PreRope the
                     // jumping positions make every attend copy block positions (RopeState).
                     Rotated<KVCache<Keys<Int4<>>, Values<Int4<>>, Blocks<16>>>,
                     Rotated<KVCache<Keys<Int8<>>, Values<Int4<>>, Sinks<2>, Blocks<16>, PreRope<>>, Rotate<Hadamard, true, false>>>;
TYPED_TEST_SUITE(AllocFault, FaultCaches);

TYPED_TEST(AllocFault, EveryFailedAllocationIsAnErrorAndChangesNothing) {
  const auto ops = sequence();
  // The run without faults.
  // Until its fault fires, a faulted run makes the same calls on the same data, so the cache
  // before op i is the fault-free run's after op i - 1 (one snapshot per op, not one per op and
  // fault point: the sweep is quadratic in the ops).
  auto clean = TypeParam::create(kShape).value();
  std::vector<std::vector<float>> want;
  std::vector<Snapshot> clean_before{snapshot(clean)};  // [i]: before op i; back(): at the end
  for (const Op& op : ops) {
    std::vector<float> out;
    ASSERT_TRUE(run_op(clean, op, out, false));
    want.push_back(out);
    clean_before.push_back(snapshot(clean));
  }
  const Snapshot& want_end = clean_before.back();

  int injected = 0;
  const long step = kvtest::fault_step();  // 2 in the sanitizer stage's short sweeps
  for (long n = 1;; n += step) {
    g_countdown = n;
    g_fired = false;
    Result<TypeParam> made = [&] {
      Arm a(true);
      return TypeParam::create(kShape);
    }();
    if (!made) {
      ASSERT_TRUE(g_fired) << made.error().message;
      EXPECT_EQ(made.error().code, Errc::out_of_memory) << made.error().message;
      ++injected;
      continue;
    }
    TypeParam c = std::move(made).value();
    for (size_t i = 0; i < ops.size(); ++i) {
      const bool fired_before = g_fired;
      std::vector<float> out;
      Status st = run_op(c, ops[i], out, true);
      if (!st) {
        ASSERT_TRUE(g_fired && !fired_before) << "op " << i << " failed without a fault: " << st.error().message;
        ASSERT_EQ(st.error().code, Errc::out_of_memory) << "op " << i << ": " << st.error().message;
        EXPECT_TRUE(snapshot(c) == clean_before[i]) << "op " << i << " (fault at allocation " << n << ") changed the cache";
        st = run_op(c, ops[i], out, false);  // the same call again, no fault
        ASSERT_TRUE(st) << "op " << i << " after a failed attempt: " << st.error().message;
        ++injected;
      }
      if (!ops[i].append) {
        ASSERT_EQ(out, want[i]) << "op " << i << " (fault at allocation " << n << ")";
      }
    }
    EXPECT_TRUE(snapshot(c) == want_end) << "fault at allocation " << n;
    if (!g_fired) break;  // the sequence needs fewer than n allocations: every point was tried
  }
  EXPECT_GT(injected, 10 / step) << "the sweep must hit create, append and attend";
}

// After a prefill, the first decode appends release the prefill-sized pending rows and chunk
// copies (PendingRows::shrink_for, ChunkStage): moving the live rows into smaller buffers
// allocates, but optionally. A fault there is swallowed (the append succeeds, keeping the large
// buffers); a fault anywhere else is Errc::out_of_memory with nothing changed. Either way every
// attention output equals the fault-free run bit for bit.
TEST(AllocFaultShrink, ReleasingPrefillBuffersNeverFailsAnAppend) {
  // H2O commits each append's rows at the next one, so the prefill's 100 rows sit in the
  // pending rows until the first decode step and are shrunk at the second.
  using Cache = KVCache<Keys<Int8<>>, Values<Int4<>>, H2O<40, 20, 2>, Blocks<16>>;
  const ModelShape shape{.layers = 1, .q_heads = 4, .kv_heads = 4, .head_dim = 128, .max_tokens = 512};
  const size_t row = 4 * 128, qrow = 4 * 128;
  const int sizes[] = {100, 1, 1, 1};  // 100 rows of 512 floats: over the 16384-float threshold
  auto run = [&](Cache& c, int i, std::vector<float>& out, bool arm) -> Status {
    const auto k = kvtest::normal(static_cast<size_t>(sizes[i]) * row, 70 + i), v = kvtest::normal(k.size(), 80 + i);
    const auto pos = kvtest::iota_positions(c.tokens(0), sizes[i]);
    const auto q = kvtest::normal(qrow, 90 + i, 0.5f);
    out.assign(q.size(), 0.f);
    {
      Arm a(arm);
      if (Status s = c.append(0, k, v, pos); !s) return s;
    }
    Arm a(arm);
    return c.attend(0, q, out);
  };
  auto clean = Cache::create(shape).value();
  std::vector<std::vector<float>> want(4);
  for (int i = 0; i < 4; ++i) ASSERT_TRUE(run(clean, i, want[i], false));
  int swallowed = 0;
  for (long n = 1;; ++n) {
    auto c = Cache::create(shape).value();
    g_countdown = n;
    g_fired = false;
    for (int i = 0; i < 4; ++i) {
      const bool fired_before = g_fired;
      const std::int64_t tokens = c.tokens(0);
      std::vector<float> out;
      Status st = run(c, i, out, true);
      if (!st) {
        ASSERT_EQ(st.error().code, Errc::out_of_memory) << st.error().message;
        if (c.tokens(0) == tokens) {  // the append failed: nothing changed, repeat it
          st = run(c, i, out, false);
        } else {  // the attend failed: repeat it alone
          const auto q = kvtest::normal(qrow, 90 + i, 0.5f);
          out.assign(q.size(), 0.f);
          st = c.attend(0, q, out);
        }
        ASSERT_TRUE(st) << st.error().message;
      } else if (g_fired && !fired_before && i > 0) {
        ++swallowed;  // a decode step's optional shrink took the fault
      }
      ASSERT_EQ(out, want[static_cast<size_t>(i)]) << "step " << i << ", fault at allocation " << n;
    }
    if (!g_fired) break;
  }
  EXPECT_GT(swallowed, 0) << "the shrink's allocation was never reached";
}

TEST(AllocFaultCreate, AbsurdLayerCountIsAnErrorNamingTheBytes) {
  using Cache = KVCache<Keys<Int8<>>, Values<Int4<>>>;
  ModelShape s = kShape;
  s.layers = 1 << 30;
  auto r = Cache::create(s);
  ASSERT_FALSE(r);
  EXPECT_EQ(r.error().code, Errc::out_of_memory);
  EXPECT_NE(r.error().message.find("bytes requested"), std::string::npos) << r.error().message;
  // The process goes on; a sane cache still works.
  EXPECT_TRUE(Cache::create(kShape));
}

}  // namespace
