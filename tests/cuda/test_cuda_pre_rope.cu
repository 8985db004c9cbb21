// DeviceCache over PreRope<OriginalPositions> caches (kernels/cuda/device_rope.cuh,
// rope_decode_kernel.cuh): keys appended and stored before RoPE, the decode kernel rotating each
// dequantized key at its stored position and the query at its own. Checked against a float64
// reference built as tests/test_pre_rope.cpp builds it: the host cache's own dequantized
// pre-RoPE keys (read_back) and the exact rows, rotated in double at their positions, the query
// rotated in double at its position, softmax in double; to 1e-5 relative.
//  * device append of pre-RoPE K/V in chunks 1, 31, 33, 95 (and the rest), blocks bit-identical
//    to the host PreRope cache's (compare()), positions 5 + 3t (not the cache indices);
//  * INT4, INT8 (asymmetric values), FP8 E4M3 keys; blocks of 64, 32, 16;
//  * head_dim 64, 128, 256; 1, 31, 33, 95 tokens; GQA groups 1, 3, 4, 8, 16; both pairings;
//    full and partial rotary dims; rope_base 10^4 and 5 * 10^5; exact rows 0, 1, 7, 40 with their
//    own positions; automatic, 1 and 7 splits; layer 0 and 1;
//  * values-only rotation over PreRope (DeviceRotated, CudaPreRopeRotated): the same checks, V
//    rotated on the device and the output rotated back;
//  * errors: positions outside [0, max_tokens) at append (check(): invalid_argument, nothing
//    appended), at decode (query, exact row: check() reports them), at upload (before anything
//    changes); null query/exact positions; a mismatched host RoPE; invalid rope_dims at create.
// Skipped (exit 77) without a CUDA device.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <random>
#include <string>
#include <vector>

#include "kvpack/kernels/cuda/device_cache.cuh"
#include "kvpack/kernels/cuda/device_rotated.cuh"
#include "cuda/support/device_buffer.hpp"
#include "kvpack/kvpack.hpp"
#include "support/reference.hpp"
#include "support/rope_ref.hpp"

namespace {

using namespace kvpack;  // NOLINT: test file
using kvtest::DeviceVector;

std::vector<float> random_rows(std::size_t n, std::mt19937& rng, int D, float outlier) {
  std::normal_distribution<float> nd(0.f, 1.f);
  std::vector<float> x(n);
  for (std::size_t i = 0; i < n; ++i) x[i] = nd(rng) * (static_cast<int>(i % static_cast<std::size_t>(D)) == 5 ? outlier : 1.f);
  return x;
}

std::int32_t spaced(std::int64_t t) { return static_cast<std::int32_t>(5 + 3 * t); }

struct Case {
  int D = 128, tokens = 95, group = 4, kv_heads = 2, exact = 1, splits = 0, layer = 1, dims = 0;
  bool neox = false;
  float base = 10000.f;
  std::uint32_t seed = 1;
  [[nodiscard]] std::string str() const {
    return "D=" + std::to_string(D) + " tokens=" + std::to_string(tokens) + " group=" + std::to_string(group) +
           " kv_heads=" + std::to_string(kv_heads) + " exact=" + std::to_string(exact) + " splits=" +
           std::to_string(splits) + " layer=" + std::to_string(layer) + " rope_dims=" + std::to_string(dims) +
           (neox ? " neox" : " adjacent") + " base=" + std::to_string(base);
  }
  [[nodiscard]] ModelShape shape() const {
    ModelShape s{2, group * kv_heads, kv_heads, D, 5 + 3 * (tokens + exact + 1) + 1, 0.f};
    s.rope_base = base, s.rope_dims = dims, s.rope_neox = neox;
    return s;
  }
};

template <class Cache, class Dev = cuda::DeviceCache<Cache>>
void run_case(const Case& c) {
  SCOPED_TRACE(c.str());
  const ModelShape shape = c.shape();
  const int q_heads = shape.q_heads, D = c.D;
  const auto row = static_cast<std::size_t>(c.kv_heads) * static_cast<std::size_t>(D);
  auto host = Cache::create(shape);
  ASSERT_TRUE(host) << host.error().message;
  auto dev = Dev::create(shape);
  ASSERT_TRUE(dev) << dev.error().message;
  std::mt19937 rng(c.seed);
  // The other layer first (a kernel reading the wrong layer fails), then this layer in chunks.
  const int other = (c.tokens + 1) / 2;
  const std::vector<float> k2 = random_rows(static_cast<std::size_t>(other) * row, rng, D, 3.f), v2 = random_rows(k2.size(), rng, D, 1.f);
  std::vector<std::int32_t> pos2(static_cast<std::size_t>(other));
  for (int t = 0; t < other; ++t) pos2[static_cast<std::size_t>(t)] = static_cast<std::int32_t>(2 * t);
  const std::vector<float> k = random_rows(static_cast<std::size_t>(c.tokens) * row, rng, D, 6.f), v = random_rows(k.size(), rng, D, 1.f);
  std::vector<std::int32_t> pos(static_cast<std::size_t>(c.tokens));
  for (int t = 0; t < c.tokens; ++t) pos[static_cast<std::size_t>(t)] = spaced(t);
  if (other > 0) ASSERT_TRUE(host->append(1 - c.layer, k2, v2, pos2));
  if (c.tokens > 0) ASSERT_TRUE(host->append(c.layer, k, v, pos));
  {
    DeviceVector<float> dk(k), dv(v), dk2(k2), dv2(v2);
    DeviceVector<std::int32_t> dp(pos), dp2(pos2);
    ASSERT_TRUE(dk.ok() && dv.ok() && dp.ok() && dk2.ok() && dv2.ok() && dp2.ok());
    ASSERT_TRUE(dev->append(1 - c.layer, dk2.get(), dv2.get(), dp2.get(), other));
    int done = 0;
    for (const int chunk : {1, 31, 33, 95, 1 << 20}) {
      const int n = std::min(chunk, c.tokens - done);
      if (n <= 0) break;
      const Status s = dev->append(c.layer, dk.get() + static_cast<std::size_t>(done) * row,
                                   dv.get() + static_cast<std::size_t>(done) * row, dp.get() + done, n);
      ASSERT_TRUE(s) << s.error().message;
      done += n;
    }
    const Status same = dev->compare(*host);  // synchronises: the device buffers may go
    ASSERT_TRUE(same) << same.error().message;
  }
  ASSERT_EQ(dev->tokens(c.layer), c.tokens);

  const std::vector<float> ek = random_rows(static_cast<std::size_t>(c.exact) * row, rng, D, 6.f), ev = random_rows(ek.size(), rng, D, 1.f);
  std::vector<std::int32_t> epos(static_cast<std::size_t>(c.exact));
  for (int r = 0; r < c.exact; ++r) epos[static_cast<std::size_t>(r)] = spaced(c.tokens + r);
  const std::int32_t q_pos = spaced(c.tokens + c.exact);
  const std::vector<float> q = random_rows(static_cast<std::size_t>(q_heads) * D, rng, D, 1.f);
  DeviceVector<float> d_q(q), d_out(q.size()), d_ek(ek), d_ev(ev);
  DeviceVector<std::int32_t> d_epos(epos), d_qpos(std::vector<std::int32_t>{q_pos});
  ASSERT_TRUE(d_q.ok() && d_out.ok() && d_ek.ok() && d_ev.ok() && d_epos.ok() && d_qpos.ok());
  cuda::DeviceRows exact;
  exact.k = d_ek.get(), exact.v = d_ev.get(), exact.count = c.exact, exact.pos = d_epos.get();
  {
    const Status s = dev->decode(c.layer, d_q.get(), d_qpos.get(), d_out.get(), exact, cuda::DecodeOptions{c.splits});
    ASSERT_TRUE(s) << s.error().message;
    const Status sync = dev->synchronize();
    ASSERT_TRUE(sync) << sync.error().message;
  }
  const std::vector<float> got = d_out.to_host();
  ASSERT_TRUE(d_out.ok()) << d_out.message();

  // float64: the host's dequantized pre-RoPE keys and the exact rows, rotated in double (values
  // as the host reads them back: in the caller's basis under a values-only Rotated<>).
  const double scale = 1.0 / std::sqrt(static_cast<double>(D));
  std::vector<double> ref(q.size(), 0.0);
  for (int h = 0; h < c.kv_heads; ++h) {
    auto contents = host->read_back(c.layer, h);
    ASSERT_TRUE(contents);
    ASSERT_EQ(contents->indices.size(), static_cast<std::size_t>(c.tokens));
    std::vector<std::vector<double>> ks;
    std::vector<const float*> vs;
    for (std::size_t r = 0; r < contents->indices.size(); ++r) {
      ks.emplace_back(contents->k.begin() + static_cast<std::ptrdiff_t>(r * D), contents->k.begin() + static_cast<std::ptrdiff_t>((r + 1) * D));
      EXPECT_EQ(contents->positions[r], spaced(static_cast<std::int64_t>(r)));
      kvtest::rope_rotate64(ks.back().data(), shape, contents->positions[r]);
      vs.push_back(contents->v.data() + r * static_cast<std::size_t>(D));
    }
    for (int r = 0; r < c.exact; ++r) {
      const float* src = ek.data() + static_cast<std::size_t>(r) * row + static_cast<std::size_t>(h * D);
      ks.emplace_back(src, src + D);
      kvtest::rope_rotate64(ks.back().data(), shape, epos[static_cast<std::size_t>(r)]);
      vs.push_back(ev.data() + static_cast<std::size_t>(r) * row + static_cast<std::size_t>(h * D));
    }
    for (int j = 0; j < c.group; ++j) {
      const float* qf = q.data() + static_cast<std::size_t>((h * c.group + j) * D);
      std::vector<double> qr(qf, qf + D);
      kvtest::rope_rotate64(qr.data(), shape, q_pos);
      std::vector<double> s(ks.size());
      double mx = -INFINITY;
      for (std::size_t t = 0; t < ks.size(); ++t) {
        double dot = 0;
        for (int d = 0; d < D; ++d) dot += qr[static_cast<std::size_t>(d)] * ks[t][static_cast<std::size_t>(d)];
        s[t] = dot * scale;
        mx = std::max(mx, s[t]);
      }
      double l = 0;
      double* o = ref.data() + static_cast<std::size_t>((h * c.group + j) * D);
      for (std::size_t t = 0; t < ks.size(); ++t) {
        const double p = std::exp(s[t] - mx);
        l += p;
        for (int d = 0; d < D; ++d) o[d] += p * vs[t][d];
      }
      if (l > 0)
        for (int d = 0; d < D; ++d) o[d] /= l;
    }
  }
  EXPECT_LE(kvtest::max_rel_error(got, ref, D), 1e-5) << "CUDA PreRope decode vs float64";
  for (float x : got) ASSERT_TRUE(std::isfinite(x));
}

template <class Cache>
class CudaPreRope : public ::testing::Test {};
using Caches = ::testing::Types<KVCache<Keys<Int4<>>, Values<Int4<>>, PreRope<>>,
                                KVCache<Keys<Int8<>>, Values<Int8<Asymmetric>>, Blocks<32>, PreRope<OriginalPositions>>,
                                KVCache<Keys<Fp8E4M3<>>, Values<Int4<>>, Blocks<16>, PreRope<>>>;
TYPED_TEST_SUITE(CudaPreRope, Caches);

// Odd token counts, every pairing and partial rotary dims, GQA, splits, exact rows, both layers.
TYPED_TEST(CudaPreRope, MatchesFloat64AcrossShapes) {
  const int groups[] = {1, 3, 4, 8, 16};
  const int exacts[] = {0, 1, 7, 40};
  const int splits[] = {0, 1, 7};
  int i = 0;
  for (const int D : {64, 128, 256})
    for (const bool neox : {false, true})
      for (const int tokens : {1, 31, 33, 95}) {
        Case c;
        c.D = D;
        c.neox = neox;
        c.tokens = tokens;
        c.dims = (i % 3 == 0) ? 0 : (i % 3 == 1 ? D / 2 : D - 2);  // full, half, all but one pair
        c.base = i % 2 ? 500000.f : 10000.f;
        c.group = groups[i % 5];
        c.kv_heads = 1 + i % 3;
        c.exact = exacts[(i / 2) % 4];
        c.splits = splits[i % 3];
        c.layer = i % 2;
        c.seed = static_cast<std::uint32_t>(300 + i);
        run_case<TypeParam>(c);
        ++i;
      }
  EXPECT_EQ(i, 24);
}

// Every GQA group size at head_dim 128, NeoX, partial dims (the query CTAs of group 16).
TYPED_TEST(CudaPreRope, EveryGroupSize) {
  for (const int group : {1, 2, 3, 4, 5, 8, 16}) {
    Case c;
    c.group = group;
    c.neox = true;
    c.dims = 64;
    c.seed = static_cast<std::uint32_t>(700 + group);
    run_case<TypeParam>(c);
  }
}

using I4Rope = KVCache<Keys<Int4<>>, Values<Int4<>>, PreRope<>>;

// Values-only Hadamard rotation over PreRope caches (the only rotation they take): DeviceRotated
// rotates V before the device quantizer, passes K, the query and its position to the RoPE decode
// and rotates the output back; blocks equal the host's, output within 1e-5 of float64.
TEST(CudaPreRopeRotated, ValuesOnlyMatchesFloat64) {
  using Vr = Rotated<KVCache<Keys<Int4<>>, Values<Int4<Symmetric, Group<64>>>, PreRope<>>, Rotate<Hadamard, true, false>>;
  using Vr8 = Rotated<KVCache<Keys<Int8<>>, Values<Int4<>>, Blocks<32>, PreRope<>>, Rotate<SignedHadamard, true, false>>;
  int i = 0;
  for (const int D : {64, 128})
    for (const int tokens : {1, 33, 95}) {
      Case c;
      c.D = D;
      c.tokens = tokens;
      c.neox = i % 2 == 1;
      c.group = 1 + 3 * (i % 2);
      c.exact = i % 3 == 0 ? 0 : 7;
      c.splits = i % 2;
      c.seed = static_cast<std::uint32_t>(800 + i);
      if (i % 2) run_case<Vr8, cuda::DeviceRotated<Vr8>>(c);
      else run_case<Vr, cuda::DeviceRotated<Vr>>(c);
      ++i;
    }
  EXPECT_EQ(i, 6);
}

TEST(CudaPreRopeEdges, ExactRowsAloneAndNoKeys) {
  Case exact_only;
  exact_only.tokens = 0;
  exact_only.exact = 33;
  run_case<I4Rope>(exact_only);
  Case none;
  none.tokens = 0;
  none.exact = 0;
  run_case<I4Rope>(none);  // zeros, as float64 (no key)
}

TEST(CudaPreRopeEdges, PositionsOutsideTheTableAreErrors) {
  ModelShape s{1, 4, 2, 64, 100, 0.f};
  auto dev = cuda::DeviceCache<I4Rope>::create(s);
  ASSERT_TRUE(dev) << dev.error().message;
  EXPECT_EQ(dev->rope_table().view().positions, 100);
  const std::vector<float> k(3 * 2 * 64, 0.5f);
  DeviceVector<float> dk(k);
  DeviceVector<std::int32_t> bad(std::vector<std::int32_t>{0, 100, 2}), neg(std::vector<std::int32_t>{-1, 1, 2}),
      good(std::vector<std::int32_t>{0, 1, 99});
  ASSERT_TRUE(dk.ok() && bad.ok() && neg.ok() && good.ok());
  for (DeviceVector<std::int32_t>* p : {&bad, &neg}) {
    ASSERT_TRUE(dev->append(0, dk.get(), dk.get(), p->get(), 3));  // enqueued; found on the device
    const Status st = dev->check();
    ASSERT_FALSE(st);
    EXPECT_EQ(st.error().code, Errc::invalid_argument);
    EXPECT_NE(st.error().message.find("RoPE position"), std::string::npos) << st.error().message;
    EXPECT_EQ(dev->tokens(0), 0);
  }
  ASSERT_TRUE(dev->append(0, dk.get(), dk.get(), good.get(), 3));
  ASSERT_TRUE(dev->check());
  EXPECT_EQ(dev->tokens(0), 3);

  DeviceVector<float> q(std::vector<float>(4 * 64, 1.f)), out(4 * 64);
  DeviceVector<std::int32_t> q_bad(std::vector<std::int32_t>{100}), q_ok(std::vector<std::int32_t>{99});
  ASSERT_TRUE(dev->decode(0, q.get(), q_bad.get(), out.get()));
  const Status st = dev->check();
  ASSERT_FALSE(st);
  EXPECT_EQ(st.error().code, Errc::invalid_argument);
  EXPECT_NE(st.error().message.find("query"), std::string::npos) << st.error().message;
  cuda::DeviceRows rows;
  rows.k = dk.get(), rows.v = dk.get(), rows.count = 3, rows.pos = bad.get();
  ASSERT_TRUE(dev->decode(0, q.get(), q_ok.get(), out.get(), rows));
  const Status st_row = dev->check();
  ASSERT_FALSE(st_row);
  EXPECT_EQ(st_row.error().code, Errc::invalid_argument);
  EXPECT_NE(st_row.error().message.find("exact row 1"), std::string::npos) << st_row.error().message;
  rows.pos = good.get();
  ASSERT_TRUE(dev->decode(0, q.get(), q_ok.get(), out.get(), rows));
  EXPECT_TRUE(dev->check());
  // Returned at once: null positions.
  EXPECT_EQ(dev->decode(0, q.get(), nullptr, out.get()).error().code, Errc::invalid_argument);
  rows.pos = nullptr;
  EXPECT_EQ(dev->decode(0, q.get(), q_ok.get(), out.get(), rows).error().code, Errc::invalid_argument);

  // Upload: a host position beyond the device table, or another RoPE, changes nothing.
  ModelShape hs = s;
  hs.max_tokens = 1000;
  auto host = I4Rope::create(hs);
  ASSERT_TRUE(host);
  const std::vector<std::int32_t> far{0, 1, 500};
  ASSERT_TRUE(host->append(0, k, k, far));
  const Status up = dev->upload(*host);
  ASSERT_FALSE(up);
  EXPECT_EQ(up.error().code, Errc::invalid_argument);
  EXPECT_EQ(dev->tokens(0), 3);
  ModelShape neox = s;
  neox.rope_neox = true;
  auto other = I4Rope::create(neox);
  ASSERT_TRUE(other);
  EXPECT_EQ(dev->upload(*other).error().code, Errc::invalid_argument);

  ModelShape odd = s;
  odd.rope_dims = 31;
  auto refused = cuda::DeviceCache<I4Rope>::create(odd);
  ASSERT_FALSE(refused);
  EXPECT_EQ(refused.error().code, Errc::invalid_argument);
}

// A host PreRope cache uploaded to the device decodes like the device-appended one (same bytes,
// same kernel): the upload path of pre-RoPE blocks.
TEST(CudaPreRopeEdges, UploadedBlocksDecodeLikeAppendedOnes) {
  ModelShape s{1, 8, 2, 128, 200, 0.f};
  s.rope_neox = true;
  s.rope_dims = 96;
  auto host = I4Rope::create(s);
  auto a = cuda::DeviceCache<I4Rope>::create(s), b = cuda::DeviceCache<I4Rope>::create(s);
  ASSERT_TRUE(host && a && b);
  std::mt19937 rng(5);
  const auto k = random_rows(95 * 256, rng, 128, 4.f), v = random_rows(k.size(), rng, 128, 1.f);
  std::vector<std::int32_t> pos(95);
  for (int t = 0; t < 95; ++t) pos[static_cast<std::size_t>(t)] = 2 * t;
  ASSERT_TRUE(host->append(0, k, v, pos));
  DeviceVector<float> dk(k), dv(v), q(random_rows(8 * 128, rng, 128, 1.f)), o1(8 * 128), o2(8 * 128);
  DeviceVector<std::int32_t> dp(pos), qp(std::vector<std::int32_t>{190});
  ASSERT_TRUE(a->append(0, dk.get(), dv.get(), dp.get(), 95));
  ASSERT_TRUE(b->upload(*host));
  ASSERT_TRUE(a->decode(0, q.get(), qp.get(), o1.get()));
  ASSERT_TRUE(b->decode(0, q.get(), qp.get(), o2.get()));
  ASSERT_TRUE(a->check() && b->check());
  const auto x = o1.to_host(), y = o2.to_host();
  ASSERT_EQ(x.size(), y.size());
  for (std::size_t i = 0; i < x.size(); ++i) ASSERT_EQ(x[i], y[i]) << i;
}

}  // namespace
