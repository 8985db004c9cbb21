// CASES C6: K and V precisions are independent; per-channel INT4 keys beat per-token INT4 keys
// on keys with an outlier channel.
#include <gtest/gtest.h>

#include <cmath>

#include "kvpack/kvpack.hpp"
#include "support/cache_harness.hpp"

namespace {

using namespace kvpack;  // NOLINT: test file

constexpr int D = 128;
const ModelShape kShape{.layers = 1, .q_heads = 4, .kv_heads = 1, .head_dim = D, .max_tokens = 512};

std::vector<float> outlier_keys(int n, uint32_t seed) {
  auto k = kvtest::normal(static_cast<size_t>(n) * D, seed);
  for (int t = 0; t < n; ++t) k[static_cast<size_t>(t) * D + 7] *= 20.f;
  return k;
}

// Prefill 256 tokens, then 16 decode steps; returns the largest kernel error against ref64 on the
// quantizer's own output, and the mean error against exact (unquantized) attention.
template <class Cache>
std::pair<double, double> run() {
  kvtest::Harness<Cache> h(kShape);
  h.append(0, outlier_keys(256, 1), kvtest::normal(256 * D, 2));
  double kernel_err = 0, quant_err = 0;
  for (int s = 0; s < 16; ++s) {
    h.append(0, outlier_keys(1, 10 + s), kvtest::normal(D, 40 + s));
    const auto q = kvtest::normal(4 * D, 70 + s, 0.3f);
    kernel_err = std::max(kernel_err, h.attend_error(0, q));
    std::vector<float> out(q.size());
    EXPECT_TRUE(h.cache().attend(0, q, out));
    std::vector<double> K(h.exact_k().begin(), h.exact_k().end()), V(h.exact_v().begin(), h.exact_v().end());
    const auto exact = kvtest::attention_ref64(K, V, h.tokens(), q, 1, 4, 1, D, 1.0 / std::sqrt(double{D}), h.tokens() - 1);
    quant_err += kvtest::max_rel_error(out, exact, D) / 16;
  }
  return {kernel_err, quant_err};
}

template <class Cache>
double key_mse() {
  auto c = Cache::create(kShape).value();
  const auto k = outlier_keys(256, 1);
  EXPECT_TRUE(c.append(0, k, k, kvtest::iota_positions(0, 256)));
  const auto rb = c.read_back(0, 0).value();
  double mse = 0;
  for (size_t i = 0; i < k.size(); ++i) mse += (double{rb.k[i]} - k[i]) * (double{rb.k[i]} - k[i]) / double(k.size());
  return mse;
}

// Each side really goes through its own codec: every stored K row is bit-identical to the key
// codec's round trip of that row, every V row to the value codec's (a cache that used one codec
// for both, or swapped them, fails here; the kernel-vs-ref64 check above cannot see that, since
// its reference reads the cache's own dequantized rows).
template <class Cache, class KeyCodec, class ValueCodec>
void expect_each_side_uses_its_codec() {
  auto c = Cache::create(kShape).value();
  const auto k = outlier_keys(70, 3), v = kvtest::normal(70 * D, 4, 3.f);
  ASSERT_TRUE(c.append(0, k, v, kvtest::iota_positions(0, 70)));
  ASSERT_EQ(c.quantized_tokens(0), 70);
  const auto rb = c.read_back(0, 0).value();
  auto round_trip = [](auto codec_tag, const float* x) {
    using Codec = decltype(codec_tag);
    std::vector<std::byte> codes(Codec::code_bytes(D)), meta(row_meta_bytes<Codec>(D));
    std::vector<float> y(D);
    encode_row<Codec>(x, D, codes.data(), meta.data());
    decode_row<Codec>(codes.data(), meta.data(), D, y.data());
    return y;
  };
  bool k_lossy = false, v_lossy = false;
  for (size_t t = 0; t < 70; ++t) {
    const auto kq = round_trip(KeyCodec{}, k.data() + t * D), vq = round_trip(ValueCodec{}, v.data() + t * D);
    ASSERT_EQ(std::vector<float>(rb.k.begin() + static_cast<std::ptrdiff_t>(t * D), rb.k.begin() + static_cast<std::ptrdiff_t>((t + 1) * D)), kq)
        << "K row " << t;
    ASSERT_EQ(std::vector<float>(rb.v.begin() + static_cast<std::ptrdiff_t>(t * D), rb.v.begin() + static_cast<std::ptrdiff_t>((t + 1) * D)), vq)
        << "V row " << t;
    for (int d = 0; d < D; ++d) {
      k_lossy |= kq[static_cast<size_t>(d)] != k[t * D + static_cast<size_t>(d)];
      v_lossy |= vq[static_cast<size_t>(d)] != v[t * D + static_cast<size_t>(d)];
    }
  }
  EXPECT_TRUE(k_lossy && v_lossy) << "the input must be changed by both codecs";
}

TEST(CaseC6, Int8KeysInt4Values) {
  using Cache = KVCache<Keys<Int8<>>, Values<Int4<>>>;
  static_assert(Cache::key_bits_per_value == 8.5 && Cache::value_bits_per_value == 5.0);
  EXPECT_LE(run<Cache>().first, 1e-4);
  expect_each_side_uses_its_codec<Cache, Int8<>, Int4<>>();
}

TEST(CaseC6, Fp8KeysInt4Values) {
  using Cache = KVCache<Keys<Fp8E4M3<>>, Values<Int4<>>>;
  static_assert(Cache::key_bits_per_value == 8.5 && Cache::value_bits_per_value == 5.0);
  EXPECT_LE(run<Cache>().first, 1e-4);
  expect_each_side_uses_its_codec<Cache, Fp8E4M3<>, Int4<>>();
}

TEST(CaseC6, PerChannelInt4KeysBeatPerTokenOnAnOutlierChannel) {
  const auto [k_err_tok, att_err_tok] = run<KVCache<Keys<Int4<>>, Values<Fp32>>>();
  const auto [k_err_ch, att_err_ch] = run<KVCache<Keys<Int4<>, PerChannel>, Values<Fp32>>>();
  EXPECT_LE(k_err_tok, 1e-4);
  EXPECT_LE(k_err_ch, 1e-4);
  EXPECT_LT(att_err_ch, att_err_tok) << "per-channel " << att_err_ch << " vs per-token " << att_err_tok;

  // The same ordering on the keys themselves (mean squared error of the 256 prompt keys).
  using PerChannelCache = KVCache<Keys<Int4<>, PerChannel>>;
  using PerTokenCache = KVCache<Keys<Int4<>>>;
  EXPECT_LT(key_mse<PerChannelCache>(), key_mse<PerTokenCache>());
}

}  // namespace
