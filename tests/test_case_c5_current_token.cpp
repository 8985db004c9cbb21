// CASES C5: the current token and the sinks are not quantized before attending.
#include <gtest/gtest.h>

#include <cmath>

#include "kvpack/kvpack.hpp"
#include "support/cache_harness.hpp"

namespace {

using namespace kvpack;  // NOLINT: test file

TEST(CaseC5, CurrentTokenAttendsToItsExactKeyAndValue) {
  using Codec = Int4<Group<16>>;
  using Cache = KVCache<Keys<Codec>, Values<Codec>>;
  constexpr int D = 16;
  const ModelShape shape{.layers = 1, .q_heads = 1, .kv_heads = 1, .head_dim = D, .max_tokens = 64};
  kvtest::Harness<Cache> h(shape);
  h.append(0, kvtest::normal(31 * D, 11), kvtest::normal(31 * D, 12));
  ASSERT_EQ(h.cache().quantized_tokens(0), 31);

  std::vector<float> q = kvtest::normal(D, 13);
  double qn = 0;
  for (float x : q) qn += static_cast<double>(x) * x;
  std::vector<float> k(D), v(D, 0.f);
  for (int d = 0; d < D; ++d) k[d] = static_cast<float>(3.0 * q[d] / std::sqrt(qn));
  v[0] = 10.f;
  h.append(0, k, v);  // the current token, position 31

  std::vector<float> out(D);
  ASSERT_TRUE(h.cache().attend(0, q, out));
  EXPECT_LE(h.attend_error(0, q), 1e-5);  // ref64: dequantized past + exact current

  // "Everything quantized": the current token's own K/V through the same codec.
  std::vector<double> K, V;
  h.reference_kv(0, K, V);
  std::vector<std::byte> codes(Codec::code_bytes(D)), meta(row_meta_bytes<Codec>(D));
  std::vector<float> kq(D), vq(D);
  encode_row<Codec>(k.data(), D, codes.data(), meta.data());
  decode_row<Codec>(codes.data(), meta.data(), D, kq.data());
  encode_row<Codec>(v.data(), D, codes.data(), meta.data());
  decode_row<Codec>(codes.data(), meta.data(), D, vq.data());
  for (int d = 0; d < D; ++d) {
    K[31 * D + d] = kq[d];
    V[31 * D + d] = vq[d];
  }
  const auto all_quant = kvtest::attention_ref64(K, V, 32, q, 1, 1, 1, D, 1.0 / std::sqrt(double{D}), 31);
  EXPECT_GT(kvtest::max_rel_error(out, all_quant, D), 1e-2) << "the test input must separate the two behaviours";
}

TEST(CaseC5, ResidualWindowIsBitExactAfterPrefill) {
  using Cache = KVCache<Keys<Int4<>>, Values<Int4<>>, Residual<32>>;
  const ModelShape shape{.layers = 1, .q_heads = 2, .kv_heads = 1, .head_dim = 64, .max_tokens = 128};
  kvtest::Harness<Cache> h(shape);
  const auto k = kvtest::normal(40 * 64, 21), v = kvtest::normal(40 * 64, 22);
  h.append(0, k, v);
  auto c = h.cache().read_back(0, 0);
  ASSERT_TRUE(c);
  EXPECT_EQ(h.cache().quantized_tokens(0), 8);
  for (size_t i = 8 * 64; i < 40 * 64; ++i) {
    ASSERT_EQ(c->k[i], k[i]) << i;
    ASSERT_EQ(c->v[i], v[i]) << i;
  }
  bool any_quantized = false;
  for (size_t i = 0; i < 8 * 64; ++i) any_quantized |= c->k[i] != k[i];
  EXPECT_TRUE(any_quantized) << "tokens older than the residual window must be quantized";
  // One more token: the window slides, exactly one more token is quantized.
  h.append(0, kvtest::normal(64, 23), kvtest::normal(64, 24));
  EXPECT_EQ(h.cache().quantized_tokens(0), 9);
}

TEST(CaseC5, LargeSinksStayBitExactOverAThousandAppends) {
  using Cache = KVCache<Keys<Int4<>>, Values<Int4<>>, Sinks<4>>;
  const ModelShape shape{.layers = 1, .q_heads = 3, .kv_heads = 1, .head_dim = 64, .max_tokens = 1100};
  kvtest::Harness<Cache> h(shape);
  auto sk = kvtest::normal(4 * 64, 31, 50.f), sv = kvtest::normal(4 * 64, 32, 50.f);
  h.append(0, sk, sv);
  for (int t = 0; t < 1000; ++t) h.append(0, kvtest::normal(64, 100 + t), kvtest::normal(64, 5000 + t));
  auto c = h.cache().read_back(0, 0);
  ASSERT_TRUE(c);
  for (size_t i = 0; i < 4 * 64; ++i) {
    ASSERT_EQ(c->k[i], sk[i]);
    ASSERT_EQ(c->v[i], sv[i]);
  }
  for (float x : c->k) ASSERT_TRUE(std::isfinite(x));
  EXPECT_LE(h.attend_error(0, kvtest::normal(3 * 64, 33)), 1e-5);
}

}  // namespace
