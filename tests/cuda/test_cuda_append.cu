// The device quantizer (DeviceCache::append -> append_kernel -> helpers.cuh quantize_group) must
// write blocks bit-identical to the host KVCache's (CASES C4, C12): codes, scales, zero-points,
// positions, and the zero bytes of unused slots; and the device unpacker must decode every byte
// value as the host codecs do.
//  * INT4 (asymmetric fp16, symmetric fp32 group 16), INT8 (symmetric, asymmetric), FP8 E4M3 and
//    E5M2; blocks of 16, 32, 64 tokens; head_dim 64 and 128; 1..3 KV heads;
//  * device chunks 1, 31, 33, 95 and the rest vs one host append (chunking never changes codes);
//  * C4's 4096 values k + 0.5 (exact ties), C1's -125000 outlier, C2's constant groups;
//  * errors: NaN/Inf found on the device, nothing written, reported by check(); capacity; compare()
//    reporting a difference; a non-blocking stream right after create; every device from any
//    current device (per-device shared-memory opt-in);
//  * decode after a device append equals decode after uploading the host blocks, bit for bit.
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

namespace {

using namespace kvpack;  // NOLINT: test file
using kvtest::DeviceVector;

template <class K, class V, int B>
struct Config {
  using KC = K;
  using VC = V;
  using Cache = KVCache<Keys<KC>, Values<VC>, Blocks<B>>;
};

template <class Cfg>
class CudaAppend : public ::testing::Test {};
using Configs = ::testing::Types<Config<Int4<>, Int4<>, 64>, Config<Int8<>, Int8<Asymmetric>, 64>,
                                 Config<Int4<Symmetric, MetaF32, Group<16>>, Int8<>, 32>,
                                 Config<Fp8E4M3<>, Int4<>, 64>, Config<Fp8E5M2<MetaF32>, Fp8E4M3<Group<64>>, 16>>;
TYPED_TEST_SUITE(CudaAppend, Configs);

/// K and V rows [n][kv_heads][D]: normal with an outlier channel, plus the CASES inputs:
/// token 3 holds C4 ties (k + 0.5) * 0.25, token 5 a -125000 outlier (C1), token 6 constant
/// groups of 100, 0 and -3.5 (C2).
std::vector<float> inputs(int n, int kv_heads, int D, std::uint32_t seed) {
  std::mt19937 rng(seed);
  std::normal_distribution<float> nd(0.f, 1.f);
  const auto row = static_cast<std::size_t>(kv_heads * D);
  std::vector<float> x(static_cast<std::size_t>(n) * row);
  for (std::size_t i = 0; i < x.size(); ++i) x[i] = nd(rng) * (i % static_cast<std::size_t>(D) == 7 ? 20.f : 1.f);
  for (std::size_t i = 0; i < row && n > 3; ++i) x[3 * row + i] = (static_cast<float>(static_cast<int>(i % 23) - 11) + 0.5f) * 0.25f;
  if (n > 5) x[5 * row + 2] = -125000.f;
  for (std::size_t i = 0; i < row && n > 6; ++i) x[6 * row + i] = i < 32 ? 100.f : (i < 64 ? 0.f : -3.5f);
  return x;
}

/// Host cache with all n tokens appended at once; device cache with the same tokens appended in
/// chunks 1, 31, 33, 95, rest.
template <class Cfg>
void check_append(int n, int kv_heads, int D, std::uint32_t seed) {
  using Cache = typename Cfg::Cache;
  SCOPED_TRACE("n=" + std::to_string(n) + " kv_heads=" + std::to_string(kv_heads) + " D=" + std::to_string(D));
  const ModelShape shape{2, kv_heads, kv_heads, D, n, 0.f};
  auto host = Cache::create(shape);
  ASSERT_TRUE(host);
  const std::vector<float> k = inputs(n, kv_heads, D, seed), v = inputs(n, kv_heads, D, seed + 1);
  std::vector<std::int32_t> pos(static_cast<std::size_t>(n));
  for (int t = 0; t < n; ++t) pos[static_cast<std::size_t>(t)] = 1000 + 3 * t;  // positions are stored as given
  ASSERT_TRUE(host->append(1, k, v, pos));

  auto dev = cuda::DeviceCache<Cache>::create(shape);
  ASSERT_TRUE(dev) << dev.error().message;
  DeviceVector<float> dk(k), dv(v);
  DeviceVector<std::int32_t> dp(pos);
  ASSERT_TRUE(dk.ok() && dv.ok() && dp.ok()) << dk.message();
  const auto row = static_cast<std::size_t>(kv_heads * D);
  int done = 0;
  for (int chunk : {1, 31, 33, 95, 1 << 30}) {
    const int m = std::min(chunk, n - done);
    if (m <= 0) break;
    const Status s = dev->append(1, dk.get() + static_cast<std::size_t>(done) * row,
                                 dv.get() + static_cast<std::size_t>(done) * row, dp.get() + done, m);
    ASSERT_TRUE(s) << s.error().message;
    done += m;
  }
  EXPECT_EQ(dev->tokens(1), n);
  EXPECT_EQ(dev->tokens(0), 0);
  const Status same = dev->compare(*host);
  EXPECT_TRUE(same) << same.error().message;
}

TYPED_TEST(CudaAppend, BlocksBitIdenticalToHostCache) {
  check_append<TypeParam>(1, 1, 64, 1);
  check_append<TypeParam>(31, 2, 128, 2);
  check_append<TypeParam>(33, 3, 64, 3);
  check_append<TypeParam>(95, 1, 128, 4);
  check_append<TypeParam>(300, 2, 128, 5);
}

// CASES C4: 4096 values k + 0.5 (32 tokens x 128 channels) quantized by the device equal the host.
TYPED_TEST(CudaAppend, C4TiesOn4096Values) {
  using Cache = typename TypeParam::Cache;
  const ModelShape shape{1, 1, 1, 128, 32, 0.f};
  std::vector<float> x(4096);
  for (int i = 0; i < 4096; ++i) x[static_cast<std::size_t>(i)] = static_cast<float>((i * 37) % 40 - 20) + 0.5f;
  std::vector<std::int32_t> pos(32);
  for (int t = 0; t < 32; ++t) pos[static_cast<std::size_t>(t)] = t;
  auto host = Cache::create(shape);
  ASSERT_TRUE(host);
  ASSERT_TRUE(host->append(0, x, x, pos));
  auto dev = cuda::DeviceCache<Cache>::create(shape);
  ASSERT_TRUE(dev) << dev.error().message;
  DeviceVector<float> dx(x);
  DeviceVector<std::int32_t> dp(pos);
  ASSERT_TRUE(dev->append(0, dx.get(), dx.get(), dp.get(), 32));
  const Status same = dev->compare(*host);
  EXPECT_TRUE(same) << same.error().message;
}

TYPED_TEST(CudaAppend, DecodeAfterDeviceAppendEqualsDecodeAfterUpload) {
  using Cache = typename TypeParam::Cache;
  const int n = 200, kvh = 2, D = 128, qh = 8;
  const ModelShape shape{1, qh, kvh, D, n, 0.f};
  const std::vector<float> k = inputs(n, kvh, D, 9), v = inputs(n, kvh, D, 10);
  std::vector<std::int32_t> pos(n);
  for (int t = 0; t < n; ++t) pos[static_cast<std::size_t>(t)] = t;
  auto host = Cache::create(shape);
  ASSERT_TRUE(host);
  ASSERT_TRUE(host->append(0, k, v, pos));
  auto a = cuda::DeviceCache<Cache>::create(shape);
  auto b = cuda::DeviceCache<Cache>::create(shape);
  ASSERT_TRUE(a && b);
  ASSERT_TRUE(a->upload(*host));
  DeviceVector<float> dk(k), dv(v), dq(inputs(1, qh, D, 11)), oa(static_cast<std::size_t>(qh * D)), ob(oa.size());
  DeviceVector<std::int32_t> dp(pos);
  ASSERT_TRUE(b->append(0, dk.get(), dv.get(), dp.get(), n));
  ASSERT_TRUE(a->decode(0, dq.get(), oa.get()));
  ASSERT_TRUE(b->decode(0, dq.get(), ob.get()));
  ASSERT_TRUE(a->synchronize() && b->synchronize());
  const std::vector<float> ra = oa.to_host(), rb = ob.to_host();
  ASSERT_EQ(ra.size(), static_cast<std::size_t>(qh * D));
  EXPECT_EQ(ra, rb);
}

TEST(CudaAppendErrors, NonFiniteRejectedNothingWritten) {
  using Cache = KVCache<Keys<Int4<>>, Values<Int8<>>>;
  const ModelShape shape{1, 2, 2, 64, 100, 0.f};
  auto host = Cache::create(shape);
  auto dev = cuda::DeviceCache<Cache>::create(shape);
  ASSERT_TRUE(host && dev);
  std::vector<float> k = inputs(10, 2, 64, 1), v = inputs(10, 2, 64, 2);
  std::vector<std::int32_t> pos(10, 0);
  ASSERT_TRUE(host->append(0, k, v, pos));
  DeviceVector<float> dk(k), dv(v);
  DeviceVector<std::int32_t> dp(pos);
  ASSERT_TRUE(dev->append(0, dk.get(), dv.get(), dp.get(), 10));
  for (float bad : {NAN, INFINITY, -INFINITY}) {
    std::vector<float> v2 = v;
    v2[3 * 128 + 64 + 17] = bad;  // token 3, kv head 1, channel 17
    DeviceVector<float> dv2(v2);
    // Enqueue only: the error is found on the device and reported by check(), like a CUDA error.
    ASSERT_TRUE(dev->append(0, dk.get(), dv2.get(), dp.get(), 10));
    ASSERT_TRUE(dev->append(0, dk.get(), dv.get(), dp.get(), 5));  // skipped: an error is pending
    const Status s = dev->check();
    ASSERT_FALSE(s);
    EXPECT_EQ(s.error().code, Errc::non_finite);
    EXPECT_NE(s.error().message.find("non-finite V value at kv head 1, token 3 of the chunk, channel 17"),
              std::string::npos)
        << s.error().message;
    EXPECT_NE(s.error().message.find("layer 0, 10 tokens after 10"), std::string::npos) << s.error().message;
    EXPECT_EQ(dev->tokens(0), 10);  // the device's count: neither append wrote anything
    EXPECT_TRUE(dev->check());      // cleared
  }
  EXPECT_TRUE(dev->compare(*host));
  // Capacity: 100 tokens per layer (the host's count catches it before anything is enqueued).
  const Status full = dev->append(0, dk.get(), dv.get(), dp.get(), 91);
  ASSERT_FALSE(full);
  EXPECT_EQ(full.error().code, Errc::capacity_exceeded);
  EXPECT_EQ(dev->append(1, dk.get(), dv.get(), dp.get(), 1).error().code, Errc::invalid_argument);
}

// A cudaStreamNonBlocking stream does not order against the legacy default stream: the cache's
// zeroing must be queued on its own stream (device_alloc), or it may land after the first append
// (a false non-finite error, or blocks zeroed under the appended tokens).
TEST(CudaAppendStreams, NonBlockingStreamSeesZeroedMemoryFirst) {
  using Cache = KVCache<Keys<Int4<>>, Values<Int8<>>>;
  const ModelShape shape{2, 4, 2, 128, 4096, 0.f};
  cudaStream_t stream = nullptr;
  ASSERT_EQ(cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking), cudaSuccess);
  auto host = Cache::create(shape);
  ASSERT_TRUE(host);
  std::vector<float> k = inputs(64, 2, 128, 5), v = inputs(64, 2, 128, 6);
  std::vector<std::int32_t> pos(64);
  for (int t = 0; t < 64; ++t) pos[static_cast<std::size_t>(t)] = t;
  ASSERT_TRUE(host->append(1, k, v, pos));
  DeviceVector<float> dk(k), dv(v);
  DeviceVector<std::int32_t> dp(pos);
  for (int round = 0; round < 8; ++round) {  // a race shows up in some rounds, not every one
    auto dev = cuda::DeviceCache<Cache>::create(shape, stream);
    ASSERT_TRUE(dev) << dev.error().message;
    ASSERT_TRUE(dev->append(1, dk.get(), dv.get(), dp.get(), 64));  // right after create, no sync
    const Status same = dev->compare(*host);
    ASSERT_TRUE(same) << same.error().message;
  }
  ASSERT_EQ(cudaStreamDestroy(stream), cudaSuccess);
}

// Every device: the cache is created, appended to and decoded on the device it was created on,
// from a thread whose current device is another one; the current device is restored; and the
// per-device shared-memory opt-in (Blocks<256> INT8 needs > 48 KiB) is granted on each device.
TEST(CudaAppendStreams, EachDeviceWorksFromAnyCurrentDevice) {
  using Cache = KVCache<Keys<Int8<>>, Values<Int8<>>, Blocks<256>>;
  int devices = 0;
  ASSERT_EQ(cudaGetDeviceCount(&devices), cudaSuccess);
  if (devices < 2) GTEST_SKIP() << "one CUDA device: the cross-device case needs two";
  const ModelShape shape{1, 4, 1, 256, 512, 0.f};
  std::vector<float> k = inputs(300, 1, 256, 7), v = inputs(300, 1, 256, 8), q = inputs(1, 4, 256, 9);
  std::vector<std::int32_t> pos(300, 0);
  std::vector<std::vector<float>> outs;
  for (int d = 0; d < devices; ++d) {
    ASSERT_EQ(cudaSetDevice(d), cudaSuccess);
    DeviceVector<float> dk(k), dv(v), dq(q), dout(q.size());
    DeviceVector<std::int32_t> dp(pos);
    ASSERT_EQ(cudaSetDevice((d + 1) % devices), cudaSuccess);  // someone else's device is current
    auto dev = cuda::DeviceCache<Cache>::create(shape, nullptr, d);
    ASSERT_TRUE(dev) << dev.error().message;
    ASSERT_TRUE(dev->append(0, dk.get(), dv.get(), dp.get(), 300));
    ASSERT_TRUE(dev->decode(0, dq.get(), dout.get()));
    const Status s = dev->check();
    ASSERT_TRUE(s) << s.error().message;
    int current = -1;
    ASSERT_EQ(cudaGetDevice(&current), cudaSuccess);
    EXPECT_EQ(current, (d + 1) % devices);
    ASSERT_EQ(cudaSetDevice(d), cudaSuccess);
    outs.push_back(dout.to_host());
  }
  for (int d = 1; d < devices; ++d) EXPECT_EQ(outs[static_cast<std::size_t>(d)], outs[0]);
}

TEST(CudaAppendErrors, CompareReportsTheFirstDifference) {
  using Cache = KVCache<Keys<Int4<>>, Values<Int4<>>>;
  const ModelShape shape{1, 1, 1, 64, 100, 0.f};
  auto host = Cache::create(shape);
  auto dev = cuda::DeviceCache<Cache>::create(shape);
  ASSERT_TRUE(host && dev);
  std::vector<float> k = inputs(10, 1, 64, 1), v = inputs(10, 1, 64, 2);
  std::vector<std::int32_t> pos(10, 0);
  ASSERT_TRUE(host->append(0, k, v, pos));
  k[5 * 64 + 40] += 3.f;  // token 5, channel 40: another K code and maybe scale
  DeviceVector<float> dk(k), dv(v);
  DeviceVector<std::int32_t> dp(pos);
  ASSERT_TRUE(dev->append(0, dk.get(), dv.get(), dp.get(), 10));
  const Status s = dev->compare(*host);
  ASSERT_FALSE(s);
  EXPECT_EQ(s.error().code, Errc::corrupt_data);
  EXPECT_NE(s.error().message.find("K "), std::string::npos) << s.error().message;
}

// ------------------------------------------------------------------------------------------------
// The device unpacker on every byte value (CASES C4: "its unpacker agrees with the reference on
// all 256 byte values").
// ------------------------------------------------------------------------------------------------

template <class DC>
__global__ void dequantize_all_bytes(const std::uint8_t* bytes, const std::uint8_t* meta, float* out, int values) {
  const int c = static_cast<int>(blockIdx.x * blockDim.x + threadIdx.x);
  if (c * cuda::kChunk >= values) return;
  const cuda::ChunkCodes codes = cuda::load_chunk<DC::bits>(bytes + c * cuda::kChunk * DC::bits / 8);
  cuda::dequantize_chunk<DC>(codes, cuda::load_group_params<DC>(meta), out + c * cuda::kChunk);
}

template <class C>
class CudaUnpack : public ::testing::Test {};
using UnpackCodecs = ::testing::Types<Int8<Symmetric>, Int8<Asymmetric, MetaF32>, Int4<Symmetric>, Int4<Asymmetric>,
                                      Fp8E4M3<>, Fp8E5M2<MetaF32>>;
TYPED_TEST_SUITE(CudaUnpack, UnpackCodecs);

TYPED_TEST(CudaUnpack, EveryByteDecodesLikeTheHost) {
  using C = TypeParam;
  using DC = cuda::DeviceCodec<C>;
  std::vector<std::uint8_t> bytes(256);
  for (int i = 0; i < 256; ++i) bytes[static_cast<std::size_t>(i)] = static_cast<std::uint8_t>(i);
  std::vector<std::byte> meta(static_cast<std::size_t>(C::meta_bytes_per_group));
  C::store_params(GroupParams{0.0999755859375f, -3.25f}, meta.data());
  const GroupParams p = C::load_params(meta.data());
  std::vector<std::uint8_t> meta8(meta.size());
  for (std::size_t i = 0; i < meta.size(); ++i) meta8[i] = static_cast<std::uint8_t>(meta[i]);
  const int values = C::bits == 4 ? 512 : 256;
  DeviceVector<std::uint8_t> db(bytes), dm(meta8);
  DeviceVector<float> dout(static_cast<std::size_t>(values));
  dequantize_all_bytes<DC><<<1, 64>>>(db.get(), dm.get(), dout.get(), values);
  ASSERT_EQ(cudaGetLastError(), cudaSuccess);
  const std::vector<float> got = dout.to_host();
  ASSERT_EQ(got.size(), static_cast<std::size_t>(values));
  for (int e = 0; e < values; ++e) {
    const float want = C::decode_value(C::load_code(reinterpret_cast<const std::byte*>(bytes.data()), static_cast<std::size_t>(e)), p);
    if (std::isnan(want)) {
      EXPECT_TRUE(std::isnan(got[static_cast<std::size_t>(e)])) << e;
    } else if (C::asymmetric) {
      // zero + scale * q may be fused into one FMA on the device: within one rounding of the host.
      EXPECT_LE(std::abs(got[static_cast<std::size_t>(e)] - want), std::abs(want) * 0x1p-23f + 0x1p-20f) << e;
    } else {
      EXPECT_EQ(got[static_cast<std::size_t>(e)], want) << e;
    }
  }
}

}  // namespace
