// The CUDA split-K decode kernel (kernels/cuda/decode_kernel.cuh through DeviceCache::decode)
// against the CPU scalar kernel (kernels/scalar/attention.hpp, the spec) and a float64 reference
// over the same dequantized rows, to 1e-5 relative (the kernel's own arithmetic; the codec's error
// is not in it), over blocks uploaded from a host KVCache (so both read the very same bytes):
//  * INT4 (asymmetric fp16, symmetric fp32 group 16), INT8 (symmetric, asymmetric), FP8 E4M3 and
//    E5M2, mixed K/V codecs, blocks of 16, 32 and 64 tokens;
//  * head_dim 64, 128, 256; 1, 31, 33, 95 and 4000 tokens; GQA groups 1-8 and 16; layer 0 and 1;
//  * fp32 exact rows after the blocks (0, 1, 7, 70: the current token, a residual window);
//  * automatic, 1 and 7 splits (the combine step over empty and uneven splits);
//  * validity masks: random slots, a 16-slot run and a whole block masked out (skipped);
//  * no key at all: zeros, as the scalar kernel.
// Skipped (exit 77) without a CUDA device.
#include <gtest/gtest.h>

#include <cmath>
#include <cstdint>
#include <random>
#include <string>
#include <vector>

#include "kvpack/kernels/cuda/device_cache.cuh"
#include "cuda/support/device_buffer.hpp"
#include "kvpack/kvpack.hpp"
#include "kvpack/kernels/scalar/attention.hpp"
#include "support/reference.hpp"

namespace {

using namespace kvpack;  // NOLINT: test file
using kvtest::DeviceVector;

template <class K, class V, int B>
struct Config {
  using KC = K;
  using VC = V;
  static constexpr int block = B;
  using Cache = KVCache<Keys<KC>, Values<VC>, Blocks<B>>;
};

/// One decode case.
struct Case {
  int D = 128;
  int tokens = 100;  ///< quantized tokens (in blocks)
  int group = 4;
  int kv_heads = 2;
  int exact = 0;     ///< fp32 rows after the blocks
  int splits = 0;    ///< 0 = automatic
  int layer = 0;     ///< of a 2-layer cache (the other layer holds other tokens)
  bool masks = false;
  std::uint32_t seed = 1;
  [[nodiscard]] std::string str() const {
    return "D=" + std::to_string(D) + " tokens=" + std::to_string(tokens) + " group=" + std::to_string(group) +
           " kv_heads=" + std::to_string(kv_heads) + " exact=" + std::to_string(exact) +
           " splits=" + std::to_string(splits) + " layer=" + std::to_string(layer) + (masks ? " masks" : "");
  }
};

std::vector<float> random_rows(std::size_t n, std::mt19937& rng, int D, float outlier) {
  std::normal_distribution<float> nd(0.f, 1.f);
  std::vector<float> x(n);
  for (std::size_t i = 0; i < n; ++i) {
    x[i] = nd(rng);
    const auto c = static_cast<int>(i % static_cast<std::size_t>(D));
    if (c == 7) x[i] *= outlier;
    if (c == D - 1) x[i] *= std::sqrt(outlier);
  }
  return x;
}

/// Runs one case: returns false (after reporting) when a CUDA step failed.
template <class Cfg>
void run_case(const Case& c) {
  using Cache = typename Cfg::Cache;
  SCOPED_TRACE(c.str());
  const int B = Cfg::block;
  const int q_heads = c.group * c.kv_heads;
  const ModelShape shape{2, q_heads, c.kv_heads, c.D, c.tokens + 1, 0.f};
  auto host = Cache::create(shape);
  ASSERT_TRUE(host) << host.error().message;
  std::mt19937 rng(c.seed);
  const auto row = static_cast<std::size_t>(c.kv_heads) * static_cast<std::size_t>(c.D);
  if (c.tokens > 0) {
    const std::vector<float> k = random_rows(static_cast<std::size_t>(c.tokens) * row, rng, c.D, 4.f);
    const std::vector<float> v = random_rows(k.size(), rng, c.D, 1.f);
    std::vector<std::int32_t> pos(static_cast<std::size_t>(c.tokens));
    for (int t = 0; t < c.tokens; ++t) pos[static_cast<std::size_t>(t)] = t;
    ASSERT_TRUE(host->append(c.layer, k, v, pos));
    // The other layer: half as many other tokens (a kernel reading the wrong layer fails).
    const int other = (c.tokens + 1) / 2;
    const std::vector<float> k2 = random_rows(static_cast<std::size_t>(other) * row, rng, c.D, 2.f);
    const std::vector<float> v2 = random_rows(k2.size(), rng, c.D, 3.f);
    ASSERT_TRUE(host->append(1 - c.layer, k2, v2, std::vector<std::int32_t>(pos.begin(), pos.begin() + other)));
  }
  ASSERT_EQ(host->quantized_tokens(c.layer), c.tokens);

  auto dev = cuda::DeviceCache<Cache>::create(shape);
  ASSERT_TRUE(dev) << dev.error().message;
  {
    const Status up = dev->upload(*host);
    ASSERT_TRUE(up) << up.error().message;
  }
  ASSERT_EQ(dev->tokens(c.layer), c.tokens);

  // Validity masks (the same words on both sides).
  const int nb = (c.tokens + B - 1) / B;
  const int words = (B + 63) / 64;
  std::vector<std::vector<std::uint64_t>> masks(static_cast<std::size_t>(c.kv_heads * nb));
  std::bernoulli_distribution keep(0.7);
  for (int h = 0; h < c.kv_heads; ++h)
    for (int b = 0; b < nb; ++b) {
      auto& m = masks[static_cast<std::size_t>(h * nb + b)];
      m.assign(static_cast<std::size_t>(words), 0);
      const int count = std::min(B, c.tokens - b * B);
      for (int t = 0; t < count; ++t) {
        bool on = !c.masks || keep(rng);
        if (c.masks && b == 1 && t < 16) on = false;
        if (c.masks && b == 2) on = false;
        if (on) m[static_cast<std::size_t>(t / 64)] |= std::uint64_t{1} << (t % 64);
      }
      if (c.masks) {
        const Status s = dev->set_valid(c.layer, h, b, m);
        ASSERT_TRUE(s) << s.error().message;
      }
    }

  const std::vector<float> ek = random_rows(static_cast<std::size_t>(c.exact) * row, rng, c.D, 4.f);
  const std::vector<float> ev = random_rows(ek.size(), rng, c.D, 1.f);
  const std::vector<float> q = random_rows(static_cast<std::size_t>(q_heads) * static_cast<std::size_t>(c.D), rng, c.D, 1.f);
  DeviceVector<float> d_q(q), d_out(q.size()), d_ek(ek), d_ev(ev);
  ASSERT_TRUE(d_q.ok() && d_out.ok() && d_ek.ok() && d_ev.ok()) << d_q.message();
  cuda::DeviceRows exact;
  exact.k = d_ek.get();
  exact.v = d_ev.get();
  exact.count = c.exact;
  {
    const Status s = dev->decode(c.layer, d_q.get(), d_out.get(), exact, cuda::DecodeOptions{c.splits});
    ASSERT_TRUE(s) << s.error().message;
    const Status sync = dev->synchronize();
    ASSERT_TRUE(sync) << sync.error().message;
  }
  const std::vector<float> got = d_out.to_host();
  ASSERT_TRUE(d_out.ok()) << d_out.message();
  if (c.splits > 0 && nb + c.exact > 0) EXPECT_LE(dev->last_splits(), c.splits);

  // CPU scalar kernel over the host blocks (+ the exact rows as the current chunk), and float64.
  const float scale = 1.f / std::sqrt(static_cast<float>(c.D));
  std::vector<float> want(q.size(), -7.f);
  std::vector<double> ref64(q.size(), 0.0);
  kernels::Scratch scratch;
  for (int h = 0; h < c.kv_heads; ++h) {
    const auto blocks = host->blocks(c.layer, h);
    ASSERT_EQ(static_cast<int>(blocks.size()), nb);
    std::vector<kernels::BlockRef> refs;
    for (int b = 0; b < nb; ++b)
      refs.push_back({blocks[static_cast<std::size_t>(b)].data.get(), static_cast<std::int64_t>(b) * B,
                      blocks[static_cast<std::size_t>(b)].header.count,
                      c.masks ? masks[static_cast<std::size_t>(h * nb + b)].data() : nullptr});
    kernels::HeadSegments seg;
    seg.blocks = refs;
    seg.chunk = {ek.empty() ? nullptr : ek.data() + static_cast<std::size_t>(h) * static_cast<std::size_t>(c.D),
                 ev.empty() ? nullptr : ev.data() + static_cast<std::size_t>(h) * static_cast<std::size_t>(c.D),
                 static_cast<std::int64_t>(row), c.tokens, c.exact};
    kernels::AttendArgs a;
    a.head_dim = c.D;
    a.group = c.group;
    a.n_q = 1;
    a.q_first = c.tokens + c.exact;  // after every key: all visible
    a.scale = scale;
    a.q = q.data() + static_cast<std::size_t>(h * c.group * c.D);
    a.q_stride = q_heads * c.D;
    a.out = want.data() + static_cast<std::size_t>(h * c.group * c.D);
    a.out_stride = a.q_stride;
    kernels::attend_scalar<typename Cfg::KC, typename Cfg::VC, false>(a, seg, host->block_layout(), scratch);

    // float64: the host's own dequantized rows (read_back), masked slots dropped, then exact rows.
    auto contents = host->read_back(c.layer, h);
    ASSERT_TRUE(contents);
    std::vector<const float*> ks, vs;
    for (std::size_t r = 0; r < contents->indices.size(); ++r) {
      const auto t = static_cast<int>(contents->indices[r]);
      const auto& m = masks[static_cast<std::size_t>(h * nb + t / B)];
      if (!((m[static_cast<std::size_t>((t % B) / 64)] >> ((t % B) % 64)) & 1u)) continue;
      ks.push_back(contents->k.data() + r * static_cast<std::size_t>(c.D));
      vs.push_back(contents->v.data() + r * static_cast<std::size_t>(c.D));
    }
    for (int t = 0; t < c.exact; ++t) {
      ks.push_back(ek.data() + static_cast<std::size_t>(t) * row + static_cast<std::size_t>(h * c.D));
      vs.push_back(ev.data() + static_cast<std::size_t>(t) * row + static_cast<std::size_t>(h * c.D));
    }
    for (int j = 0; j < c.group; ++j) {
      const float* qv = q.data() + static_cast<std::size_t>((h * c.group + j) * c.D);
      std::vector<double> s(ks.size());
      double mx = -INFINITY;
      for (std::size_t t = 0; t < ks.size(); ++t) {
        double dot = 0;
        for (int d = 0; d < c.D; ++d) dot += static_cast<double>(qv[d]) * ks[t][d];
        s[t] = dot * static_cast<double>(scale);
        mx = std::max(mx, s[t]);
      }
      double l = 0;
      double* o = ref64.data() + static_cast<std::size_t>((h * c.group + j) * c.D);
      for (std::size_t t = 0; t < ks.size(); ++t) {
        const double p = std::exp(s[t] - mx);
        l += p;
        for (int d = 0; d < c.D; ++d) o[d] += p * vs[t][d];
      }
      if (l > 0)
        for (int d = 0; d < c.D; ++d) o[d] /= l;
    }
  }
  const std::vector<double> want64(want.begin(), want.end());
  EXPECT_LE(kvtest::max_rel_error(got, want64, c.D), 1e-5) << "CUDA vs scalar kernel";
  EXPECT_LE(kvtest::max_rel_error(got, ref64, c.D), 1e-5) << "CUDA vs float64";
  for (float x : got) ASSERT_TRUE(std::isfinite(x));
}

template <class Cfg>
class CudaDecode : public ::testing::Test {};
using Configs = ::testing::Types<Config<Int4<>, Int4<>, 64>, Config<Int8<>, Int8<Asymmetric>, 64>,
                                 Config<Int4<Symmetric, MetaF32, Group<16>>, Int8<>, 32>,
                                 Config<Fp8E4M3<>, Int4<>, 64>, Config<Fp8E5M2<MetaF32>, Fp8E4M3<Group<64>>, 16>>;
TYPED_TEST_SUITE(CudaDecode, Configs);

TYPED_TEST(CudaDecode, MatchesScalarKernelAcrossShapes) {
  const int groups[] = {1, 2, 3, 4, 5, 6, 7, 8, 16};
  const int exacts[] = {0, 1, 7, 70};
  const int splits[] = {0, 1, 7};
  int i = 0;
  for (int D : {64, 128, 256}) {
    if (D % TypeParam::KC::group_size != 0 || D % TypeParam::VC::group_size != 0) continue;
    for (int tokens : {1, 31, 33, 95, 4000}) {
      Case c;
      c.D = D;
      c.tokens = tokens;
      c.group = groups[i % 9];
      c.kv_heads = 1 + i % 3;
      c.exact = exacts[(i / 2) % 4];
      c.splits = splits[i % 3];
      c.layer = i % 2;
      c.seed = static_cast<std::uint32_t>(100 + i);
      run_case<TypeParam>(c);
      ++i;
    }
  }
  EXPECT_GE(i, 10);
}

// Every GQA group 1-8 and 16 at the default shape (each heads-per-CTA instantiation, and 16 =
// two CTAs per KV head).
TYPED_TEST(CudaDecode, EveryGroupSize) {
  for (int group : {1, 2, 3, 4, 5, 6, 7, 8, 16}) {
    Case c;
    c.tokens = 95;
    c.group = group;
    c.exact = 1;
    c.layer = 1;
    c.seed = static_cast<std::uint32_t>(500 + group);
    run_case<TypeParam>(c);
  }
}

TYPED_TEST(CudaDecode, ValidityMasksSkipSlotsAndEmptyBlocks) {
  for (int splits : {0, 1, 5}) {
    Case c;
    c.tokens = 300;
    c.masks = true;
    c.exact = 1;
    c.splits = splits;
    c.seed = static_cast<std::uint32_t>(7 + splits);
    run_case<TypeParam>(c);
  }
}

TEST(CudaDecodeEdges, NoKeysGivesZerosAndExactRowsAlone) {
  using Cfg = Config<Int4<>, Int4<>, 64>;
  Case none;
  none.tokens = 0;
  none.exact = 0;
  run_case<Cfg>(none);  // scalar and float64 both give zeros
  Case exact_only;
  exact_only.tokens = 0;
  exact_only.exact = 33;
  run_case<Cfg>(exact_only);
}

TEST(CudaDecodeEdges, UnsupportedShapesAreRejected) {
  using Cache = KVCache<Keys<Int4<>>, Values<Int4<>>>;
  auto wide_group = cuda::DeviceCache<Cache>::create(ModelShape{1, 34, 1, 128, 64, 0.f});
  ASSERT_FALSE(wide_group);
  EXPECT_EQ(wide_group.error().code, Errc::unsupported);
  auto big_head = cuda::DeviceCache<Cache>::create(ModelShape{1, 8, 8, 512, 64, 0.f});
  ASSERT_FALSE(big_head);
  EXPECT_EQ(big_head.error().code, Errc::unsupported);
  auto odd_head = cuda::DeviceCache<Cache>::create(ModelShape{1, 8, 8, 96, 64, 0.f});
  ASSERT_FALSE(odd_head);
  EXPECT_EQ(odd_head.error().code, Errc::unsupported);
  // Blocks<512> INT8 head_dim 128: three staged blocks need ~400 KiB of shared memory.
  using Big = KVCache<Keys<Int8<>>, Values<Int8<>>, Blocks<512>>;
  auto too_big = cuda::DeviceCache<Big>::create(ModelShape{1, 8, 2, 128, 4096, 0.f});
  ASSERT_FALSE(too_big);
  EXPECT_EQ(too_big.error().code, Errc::unsupported);
  EXPECT_NE(too_big.error().message.find("shared memory"), std::string::npos) << too_big.error().message;
  auto bad = cuda::DeviceCache<Cache>::create(ModelShape{1, 6, 4, 128, 64, 0.f});
  ASSERT_FALSE(bad);
  EXPECT_EQ(bad.error().code, Errc::invalid_argument);
  auto ok = cuda::DeviceCache<Cache>::create(ModelShape{2, 8, 2, 128, 64, 0.f});
  ASSERT_TRUE(ok) << ok.error().message;
  DeviceVector<float> q(std::vector<float>(8 * 128, 1.f)), out(8 * 128);
  EXPECT_EQ(ok->decode(2, q.get(), out.get()).error().code, Errc::invalid_argument);
  EXPECT_EQ(ok->decode(0, nullptr, out.get()).error().code, Errc::invalid_argument);
}

}  // namespace
