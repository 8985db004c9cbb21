// Fault injection through an offloaded KVCache: every I/O call of the file tier, in turn,
// fails (EIO, ENOSPC), is interrupted (EINTR) or transfers half its bytes, while the engine
// loop appends and attends. Nothing is lost: a failed write leaves the block resident, a failed
// read makes attend fail naming the block (and write nothing) and a retry succeeds; every
// output and the final contents are bit-identical to a fully resident cache.
#include <gtest/gtest.h>

#include <memory>
#include <string>
#include <vector>

#include "kvpack/kvpack.hpp"
#include "kvpack/offload.hpp"
#include "support/offload_cache_harness.hpp"
#include "support/offload_fixtures.hpp"

namespace ko = kvpack::offload;
using kvpack::Errc;
using namespace kvpack;  // NOLINT: test file
using ko::testing::offload_shape;
using ko::testing::run_loop;
using ko::testing::same_bits;
using ko::testing::Step;
using ko::testing::TempDir;

namespace {

using Resident = KVCache<Keys<Int4<Group<32>>>, Values<Int4<Group<32>>>, Blocks<16>>;
using Offloaded = KVCache<Keys<Int4<Group<32>>>, Values<Int4<Group<32>>>, Blocks<16>,
                          ko::Offload<ko::DeviceTier, ko::FileTier, ko::Prefetch<1>>>;

constexpr int kLayers = 2;
const std::vector<int> kChunks{33, 31, 1, 1};  // 66 tokens: 4 full blocks per (layer, kv_head)

struct Reference {
  std::vector<Step> steps;
  std::vector<HeadContents> heads;
};

const Reference& reference() {
  static const Reference r = [] {
    Reference x;
    Resident c = std::move(Resident::create(offload_shape(128, kLayers))).value();
    x.steps = run_loop(c, kChunks);
    for (int l = 0; l < kLayers; ++l)
      for (int h = 0; h < c.shape().kv_heads; ++h) x.heads.push_back(std::move(c.read_back(l, h)).value());
    return x;
  }();
  return r;
}

struct SweepResult {
  uint64_t fired = 0;
  int attend_errors = 0;  ///< attend or read_back calls that failed (and were retried)
};

// One engine loop with the fault `f` at I/O call `index`; checks everything and returns what
// happened.
SweepResult run_with_fault(uint64_t index, ko::Fault f, bool background, const std::string& what) {
  TempDir dir;
  auto be = std::make_shared<ko::FaultInjectingBackend>();
  be->inject(index, f);
  ko::OffloadOptions o;
  o.resident_budget_bytes = 0;
  o.file.directory = dir.path();
  o.file.backend = be;
  o.background = background;
  Offloaded c = std::move(Offloaded::create(offload_shape(128, kLayers), o)).value();
  SweepResult res;
  const auto steps = run_loop(c, kChunks, [&](Offloaded& cache, int layer, std::span<const float> q, std::span<float> out,
                                              const Status& s) -> Status {
    ++res.attend_errors;
    EXPECT_EQ(s.error().code, Errc::io_error) << what << ": " << s.error().message;
    EXPECT_NE(s.error().message.find("block (layer " + std::to_string(layer) + ", kv_head "), std::string::npos)
        << what << ": " << s.error().message;
    for (float x : out) EXPECT_EQ(x, 0.f) << what << ": partial output";
    return cache.attend(layer, q, out);  // the record was kept: the retry reads it
  });
  const Reference& ref = reference();
  EXPECT_EQ(steps.size(), ref.steps.size());
  for (std::size_t i = 0; i < steps.size(); ++i) {
    EXPECT_TRUE(steps[i].status) << what << ": " << steps[i].status.error().message;
    EXPECT_TRUE(same_bits(steps[i].out, ref.steps[i].out)) << what << ": chunk " << steps[i].chunk << " layer " << steps[i].layer;
  }
  c.offload().clear_prefetch_window();
  const Status flushed = c.offload().flush();  // may report the failed write: the block stayed resident
  if (!flushed) {
    EXPECT_NE(flushed.error().message.find("block (layer "), std::string::npos) << flushed.error().message;
  }
  std::size_t i = 0;
  for (int l = 0; l < kLayers; ++l)
    for (int h = 0; h < c.shape().kv_heads; ++h, ++i) {
      auto got = c.read_back(l, h);
      if (!got) {  // a read fault reached read_back: named, and the retry reads the kept record
        ++res.attend_errors;
        EXPECT_NE(got.error().message.find("block (layer " + std::to_string(l) + ", kv_head " + std::to_string(h)),
                  std::string::npos)
            << what << ": " << got.error().message;
        got = c.read_back(l, h);
      }
      EXPECT_TRUE(got) << what << ": " << (got ? "" : got.error().message);
      if (got) {
        EXPECT_TRUE(same_bits(got->k, ref.heads[i].k) && same_bits(got->v, ref.heads[i].v) &&
                    got->positions == ref.heads[i].positions)
            << what << ": layer " << l << " kv_head " << h << " lost data";
      }
    }
  res.fired = be->faults_fired();
  return res;
}

void sweep(ko::Fault f, const char* name, bool background, bool expect_attend_errors) {
  int total_errors = 0;
  uint64_t index = 0;
  for (;; ++index) {
    const SweepResult r = run_with_fault(index, f, background, std::string(name) + " at call " + std::to_string(index));
    total_errors += r.attend_errors;
    if (::testing::Test::HasFailure() || (r.fired == 0 && !background) || index > 2000) break;
    if (background && r.fired == 0 && index > 120) break;
  }
  EXPECT_GT(index, 20u) << name << ": the loop made too few I/O calls to be a test";
  if (background) return;  // the worker may absorb read faults (acquire then fetches again)
  if (expect_attend_errors)
    EXPECT_GT(total_errors, 0) << name << ": no read fault reached attend";
  else
    EXPECT_EQ(total_errors, 0) << name << ": retried transparently";
}

TEST(OffloadCacheFaults, EioAtEveryCall) { sweep(ko::Fault::eio(), "EIO", false, true); }
TEST(OffloadCacheFaults, EnospcAtEveryCall) { sweep(ko::Fault::enospc(), "ENOSPC", false, true); }
TEST(OffloadCacheFaults, ShortTransferAtEveryCallIsRetried) { sweep(ko::Fault::short_transfer(), "short", false, false); }
TEST(OffloadCacheFaults, EintrAtEveryCallIsRetried) { sweep(ko::Fault::eintr(), "EINTR", false, false); }
TEST(OffloadCacheFaults, EioAtEveryCallWithBackgroundWorker) { sweep(ko::Fault::eio(), "EIO (background)", true, true); }

TEST(OffloadCacheFaults, DiskFullFromTheStartKeepsEverythingResident) {
  TempDir dir;
  auto be = std::make_shared<ko::FaultInjectingBackend>();
  be->inject_from(0, ko::Fault::enospc());
  ko::OffloadOptions o;
  o.resident_budget_bytes = 0;
  o.file.directory = dir.path();
  o.file.backend = be;
  o.background = false;
  Offloaded c = std::move(Offloaded::create(offload_shape(128, kLayers), o)).value();
  const auto steps = run_loop(c, kChunks);
  for (std::size_t i = 0; i < steps.size(); ++i) {
    ASSERT_TRUE(steps[i].status) << steps[i].status.error().message;
    EXPECT_TRUE(same_bits(steps[i].out, reference().steps[i].out));
  }
  const Status s = c.offload().flush();
  ASSERT_FALSE(s);
  EXPECT_EQ(s.error().code, Errc::io_error) << s.error().message;
  const auto m = c.offload().metrics();
  EXPECT_GT(m.store.offload_failures, 0u);
  EXPECT_EQ(m.store.offloads, 0u);
  EXPECT_EQ(m.offloaded_bytes, 0u);
  EXPECT_EQ(m.store.resident_blocks, m.handed_blocks);  // over budget, but nothing lost
  EXPECT_GT(be->faults_fired(), 0u);
}

}  // namespace
