// DeviceRotated<Rotated<Cache, Rotate<R, Values, Keys>>> (kernels/cuda/device_rotated.cuh): K
// and/or V rotated on the device before the device quantizer, the query rotated before decode
// (keys rotated) and the output rotated back (values rotated).
//  * blocks: byte for byte the host Rotated cache's (compare() against host.inner()), device
//    appends in chunks 1, 31, 33, 95, rest with Options::chunk_tokens 40 (split inside append);
//  * decode against a float64 reference in the rotated basis: the host's rotated dequantized rows
//    (host.inner().read_back), the query and the exact rows rotated in double by the explicit
//    block-diagonal Hadamard (signs included), softmax in double, the output rotated back in
//    double; to 1e-5 relative;
//  * Hadamard and SignedHadamard, values rotated or not, keys rotated or not (values only);
//    INT4, INT8, FP8 keys; blocks 64/32/16;
//    head_dim 64, 128, 256; 1, 31, 33, 95 tokens; GQA groups 1, 3, 4, 8, 16; exact rows 0, 1, 7,
//    40 (packed and at a stride); splits automatic, 1, 7;
//  * errors: exact rows above Options::exact_rows, bad options, null buffers.
// Skipped (exit 77) without a CUDA device.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <random>
#include <string>
#include <vector>

#include "kvpack/kernels/cuda/device_rotated.cuh"
#include "cuda/support/device_buffer.hpp"
#include "kvpack/kvpack.hpp"
#include "support/reference.hpp"

namespace {

using namespace kvpack;  // NOLINT: test file
using kvtest::DeviceVector;

/// The rotation of rotation/hadamard.hpp in double: forward y = H S x, inverse x = S H y.
std::vector<double> rot64(const double* x, int D, bool signed_rows, bool inverse) {
  std::vector<double> in(x, x + D), out(static_cast<std::size_t>(D), 0.0);
  auto sign = [&](int c) { return signed_rows && cuda::hadamard_negative(static_cast<std::uint64_t>(c)) ? -1.0 : 1.0; };
  if (!inverse)
    for (int c = 0; c < D; ++c) in[static_cast<std::size_t>(c)] *= sign(c);
  for (int r = 0; r < D; ++r) {
    const cuda::HadamardBlock b = cuda::hadamard_block_of(r, D);
    double acc = 0;
    for (int c = b.first; c < b.first + b.size; ++c)
      acc += ((__builtin_popcount(static_cast<unsigned>((r - b.first) & (c - b.first))) & 1) ? -1.0 : 1.0) *
             in[static_cast<std::size_t>(c)];
    out[static_cast<std::size_t>(r)] = acc / std::sqrt(static_cast<double>(b.size));
  }
  if (inverse)
    for (int c = 0; c < D; ++c) out[static_cast<std::size_t>(c)] *= sign(c);
  return out;
}

std::vector<float> random_rows(std::size_t n, std::mt19937& rng, int D, float outlier) {
  std::normal_distribution<float> nd(0.f, 1.f);
  std::vector<float> x(n);
  for (std::size_t i = 0; i < n; ++i) x[i] = nd(rng) * (static_cast<int>(i % static_cast<std::size_t>(D)) == 9 ? outlier : 1.f);
  return x;
}

struct Case {
  int D = 128, tokens = 95, group = 4, kv_heads = 2, exact = 1, splits = 0, layer = 1;
  bool strided = false;  ///< exact rows at a stride of kv_heads * D + 8 floats
  std::uint32_t seed = 1;
  [[nodiscard]] std::string str() const {
    return "D=" + std::to_string(D) + " tokens=" + std::to_string(tokens) + " group=" + std::to_string(group) +
           " kv_heads=" + std::to_string(kv_heads) + " exact=" + std::to_string(exact) + (strided ? " strided" : "") +
           " splits=" + std::to_string(splits) + " layer=" + std::to_string(layer);
  }
};

template <class Host>
void run_case(const Case& c) {
  using Dev = cuda::DeviceRotated<Host>;
  constexpr bool sg = Host::rotation::signed_rows, rv = Host::rotates_values, rk = Host::rotates_keys;
  SCOPED_TRACE(c.str());
  const int D = c.D, q_heads = c.group * c.kv_heads;
  const ModelShape shape{2, q_heads, c.kv_heads, D, c.tokens + 1, 0.f};
  const auto row = static_cast<std::size_t>(c.kv_heads) * static_cast<std::size_t>(D);
  auto host = Host::create(shape);
  ASSERT_TRUE(host) << host.error().message;
  auto dev = Dev::create(shape, typename Dev::Options{40, 64});
  ASSERT_TRUE(dev) << dev.error().message;
  std::mt19937 rng(c.seed);
  const int other = (c.tokens + 1) / 2;
  const auto k2 = random_rows(static_cast<std::size_t>(other) * row, rng, D, 2.f), v2 = random_rows(k2.size(), rng, D, 1.f);
  const auto k = random_rows(static_cast<std::size_t>(c.tokens) * row, rng, D, 8.f), v = random_rows(k.size(), rng, D, 3.f);
  std::vector<std::int32_t> pos(static_cast<std::size_t>(c.tokens));
  for (int t = 0; t < c.tokens; ++t) pos[static_cast<std::size_t>(t)] = t;
  const std::vector<std::int32_t> pos2(pos.begin(), pos.begin() + other);
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
    const Status same = dev->compare(*host);
    ASSERT_TRUE(same) << same.error().message;
  }

  const std::size_t estride = c.strided ? row + 8 : row;
  const auto ek = random_rows(static_cast<std::size_t>(c.exact) * estride, rng, D, 8.f), ev = random_rows(ek.size(), rng, D, 3.f);
  const auto q = random_rows(static_cast<std::size_t>(q_heads) * D, rng, D, 1.f);
  DeviceVector<float> d_q(q), d_out(q.size()), d_ek(ek), d_ev(ev);
  ASSERT_TRUE(d_q.ok() && d_out.ok() && d_ek.ok() && d_ev.ok());
  cuda::DeviceRows exact;
  exact.k = d_ek.get(), exact.v = d_ev.get(), exact.count = c.exact;
  exact.stride = c.strided ? static_cast<std::int64_t>(estride) : 0;
  {
    const Status s = dev->decode(c.layer, d_q.get(), d_out.get(), exact, cuda::DecodeOptions{c.splits});
    ASSERT_TRUE(s) << s.error().message;
    const Status sync = dev->synchronize();
    ASSERT_TRUE(sync) << sync.error().message;
  }
  const std::vector<float> got = d_out.to_host();
  ASSERT_TRUE(d_out.ok());

  // float64 in the rotated basis, then rotated back (values rotated) to the caller's.
  const double scale = 1.0 / std::sqrt(static_cast<double>(D));
  std::vector<double> ref(q.size(), 0.0);
  for (int h = 0; h < c.kv_heads; ++h) {
    auto contents = host->inner().read_back(c.layer, h);  // rotated dequantized rows
    ASSERT_TRUE(contents);
    std::vector<std::vector<double>> ks, vs;
    for (std::size_t r = 0; r < contents->indices.size(); ++r) {
      ks.emplace_back(contents->k.begin() + static_cast<std::ptrdiff_t>(r * D), contents->k.begin() + static_cast<std::ptrdiff_t>((r + 1) * D));
      vs.emplace_back(contents->v.begin() + static_cast<std::ptrdiff_t>(r * D), contents->v.begin() + static_cast<std::ptrdiff_t>((r + 1) * D));
    }
    for (int r = 0; r < c.exact; ++r) {
      const std::vector<double> kr(ek.begin() + static_cast<std::ptrdiff_t>(r * estride + static_cast<std::size_t>(h * D)),
                                   ek.begin() + static_cast<std::ptrdiff_t>(r * estride + static_cast<std::size_t>((h + 1) * D)));
      const std::vector<double> vr(ev.begin() + static_cast<std::ptrdiff_t>(r * estride + static_cast<std::size_t>(h * D)),
                                   ev.begin() + static_cast<std::ptrdiff_t>(r * estride + static_cast<std::size_t>((h + 1) * D)));
      if (rk) ks.push_back(rot64(kr.data(), D, sg, false));
      else ks.push_back(kr);
      // if/else, not ?: copying a vector from either branch: GCC 12 -O3 warns
      // -Wfree-nonheap-object on the conditional copy (a false positive).
      if (rv) vs.push_back(rot64(vr.data(), D, sg, false));
      else vs.push_back(vr);
    }
    for (int j = 0; j < c.group; ++j) {
      const std::vector<double> qd(q.begin() + (h * c.group + j) * D, q.begin() + (h * c.group + j + 1) * D);
      const std::vector<double> qr = rk ? rot64(qd.data(), D, sg, false) : qd;
      std::vector<double> s(ks.size()), o(static_cast<std::size_t>(D), 0.0);
      double mx = -INFINITY, l = 0;
      for (std::size_t t = 0; t < ks.size(); ++t) {
        double dot = 0;
        for (int d = 0; d < D; ++d) dot += qr[static_cast<std::size_t>(d)] * ks[t][static_cast<std::size_t>(d)];
        s[t] = dot * scale;
        mx = std::max(mx, s[t]);
      }
      for (std::size_t t = 0; t < ks.size(); ++t) {
        const double p = std::exp(s[t] - mx);
        l += p;
        for (int d = 0; d < D; ++d) o[static_cast<std::size_t>(d)] += p * vs[t][static_cast<std::size_t>(d)];
      }
      if (l > 0)
        for (double& x : o) x /= l;
      std::vector<double> back = o;
      if (rv && l > 0) back = rot64(o.data(), D, sg, true);
      std::copy(back.begin(), back.end(), ref.begin() + (h * c.group + j) * D);
    }
  }
  EXPECT_LE(kvtest::max_rel_error(got, ref, D), 1e-5) << "CUDA rotated decode vs float64";
  for (float x : got) ASSERT_TRUE(std::isfinite(x));
}

template <class Host>
class CudaRotated : public ::testing::Test {};
using Hosts = ::testing::Types<Rotated<KVCache<Keys<Int4<>>, Values<Int4<>>>>,
                               Rotated<KVCache<Keys<Int8<>>, Values<Int4<>>, Blocks<32>>, Rotate<SignedHadamard, false>>,
                               Rotated<KVCache<Keys<Fp8E4M3<>>, Values<Int8<Asymmetric>>, Blocks<16>>, Rotate<SignedHadamard>>,
                               Rotated<KVCache<Keys<Int4<Symmetric, MetaF32, Group<16>>>, Values<Int8<>>>, Rotate<Hadamard, false>>,
                               Rotated<KVCache<Keys<Int8<>>, Values<Int4<Symmetric, Group<64>>>>, Rotate<Hadamard, true, false>>>;
TYPED_TEST_SUITE(CudaRotated, Hosts);

TYPED_TEST(CudaRotated, BlocksMatchHostAndDecodeMatchesFloat64) {
  const int groups[] = {1, 3, 4, 8, 16};
  const int exacts[] = {0, 1, 7, 40};
  const int splits[] = {0, 1, 7};
  int i = 0;
  for (const int D : {64, 128, 256})
    for (const int tokens : {1, 31, 33, 95}) {
      Case c;
      c.D = D;
      c.tokens = tokens;
      c.group = groups[i % 5];
      c.kv_heads = 1 + i % 3;
      c.exact = exacts[(i / 2) % 4];
      c.strided = i % 4 == 1;
      c.splits = splits[i % 3];
      c.layer = i % 2;
      c.seed = static_cast<std::uint32_t>(900 + i);
      run_case<TypeParam>(c);
      ++i;
    }
  EXPECT_EQ(i, 12);
}

TEST(CudaRotatedEdges, NoKeysAndExactRowsAlone) {
  using Host = Rotated<KVCache<Keys<Int4<>>, Values<Int4<>>>, Rotate<SignedHadamard>>;
  Case none;
  none.tokens = 0;
  none.exact = 0;
  run_case<Host>(none);
  Case exact_only;
  exact_only.tokens = 0;
  exact_only.exact = 33;
  exact_only.strided = true;
  run_case<Host>(exact_only);
}

TEST(CudaRotatedEdges, Errors) {
  using Dev = cuda::DeviceRotated<Rotated<KVCache<Keys<Int4<>>, Values<Int4<>>>>>;
  const ModelShape s{1, 4, 2, 64, 64, 0.f};
  EXPECT_EQ(Dev::create(s, Dev::Options{0, 8}).error().code, Errc::invalid_argument);
  EXPECT_EQ(Dev::create(s, Dev::Options{8, -1}).error().code, Errc::invalid_argument);
  EXPECT_EQ(Dev::create(ModelShape{1, 4, 2, 96, 64, 0.f}).error().code, Errc::unsupported);  // the inner cache's
  auto dev = Dev::create(s, Dev::Options{8, 2});
  ASSERT_TRUE(dev) << dev.error().message;
  DeviceVector<float> x(std::vector<float>(3 * 2 * 64, 1.f)), out(4 * 64);
  DeviceVector<std::int32_t> p(std::vector<std::int32_t>{0, 1, 2});
  cuda::DeviceRows rows;
  rows.k = x.get(), rows.v = x.get(), rows.count = 3;
  EXPECT_EQ(dev->decode(0, x.get(), out.get(), rows).error().code, Errc::invalid_argument);  // 3 > exact_rows 2
  EXPECT_EQ(dev->decode(0, nullptr, out.get()).error().code, Errc::invalid_argument);
  EXPECT_EQ(dev->decode(1, x.get(), out.get()).error().code, Errc::invalid_argument);
  EXPECT_EQ(dev->append(0, nullptr, x.get(), p.get(), 3).error().code, Errc::invalid_argument);
  EXPECT_EQ(dev->append(0, x.get(), x.get(), p.get(), 65).error().code, Errc::capacity_exceeded);
  ASSERT_TRUE(dev->append(0, x.get(), x.get(), p.get(), 3));
  ASSERT_TRUE(dev->check());
  EXPECT_EQ(dev->tokens(0), 3);
}

}  // namespace
