// Keyframe<Interval, DeltaCodec, KeyframeCodec, Anchor|Chained> as a codec of one interval:
// random access, per-token error bounds, closed-loop chaining, the never-expand rule, exact sizes
// (a plain interval is exactly the plain codec's rows, a delta interval keyframe + deltas).
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstddef>
#include <random>
#include <vector>

#include "kvpack/codec/keyframe.hpp"
#include "kvpack/codec/int_codec.hpp"
#include "support/reference.hpp"

namespace {

using kvpack::Anchor;
using kvpack::Chained;
using kvpack::Fp16;
using kvpack::Group;
using kvpack::Int4;
using kvpack::Int8;
using kvpack::Keyframe;

constexpr int D = 64;
constexpr int I = 64;
using AnchorKf = Keyframe<I, Int4<Group<32>>, Fp16, Anchor>;
using ChainKf = Keyframe<I, Int4<Group<32>>, Fp16, Chained>;

// Tokens that drift slowly around a large common component: x_t = base + walk_t + noise.
std::vector<float> smooth(int n, unsigned seed, float base_sigma, float step_sigma, float noise_sigma) {
  std::mt19937 rng(seed);
  std::normal_distribution<float> N(0.f, 1.f);
  std::vector<float> base(D), walk(D, 0.f), x(static_cast<size_t>(n) * D);
  for (auto& b : base) b = base_sigma * N(rng);
  for (int t = 0; t < n; ++t)
    for (int d = 0; d < D; ++d) {
      walk[d] += step_sigma * N(rng);
      x[static_cast<size_t>(t) * D + d] = base[d] + walk[d] + noise_sigma * N(rng);
    }
  return x;
}

template <class Kf>
std::vector<std::byte> encode(const std::vector<float>& x, int count, bool& delta,
                              typename Kf::Choice c = Kf::Choice::best, double* err2 = nullptr) {
  // Room for the larger mode, filled with a marker: exactly used_bytes(count, D, mode) are written.
  std::vector<std::byte> buf(Kf::max_used_bytes(static_cast<size_t>(count), D), std::byte{0xA5});
  delta = Kf::encode_interval(x.data(), D, count, D, buf.data(), c, err2);
  const size_t used = Kf::used_bytes(static_cast<size_t>(count), D, delta);
  for (size_t i = used; i < buf.size(); ++i) EXPECT_EQ(buf[i], std::byte{0xA5}) << "byte " << i << " past the used " << used;
  buf.resize(used);
  return buf;
}

TEST(KeyframeCodec, ExactBitsAndBytes) {
  // Delta mode: fp16 keyframe (16 bits) + 63 INT4 g32 rows (4 + 32/32 = 5 bits/value); plain
  // mode: 64 INT4 g32 rows, the plain codec's 5 bits/value. bits_per_value is the larger.
  EXPECT_DOUBLE_EQ(AnchorKf::delta_bits_per_value, (16.0 + 63 * 5.0) / 64);
  EXPECT_DOUBLE_EQ(AnchorKf::plain_bits_per_value, 5.0);
  EXPECT_DOUBLE_EQ(AnchorKf::bits_per_value, AnchorKf::delta_bits_per_value);
  EXPECT_DOUBLE_EQ((Keyframe<16, Int4<Group<32>>, Int8<Group<32>>>::bits_per_value), (8.5 + 15 * 5.0) / 16);
  // A keyframe narrower than a delta row: delta mode is the cheaper one, the bound is plain's.
  using Narrow = Keyframe<8, Int8<Group<32>>, Int4<Group<32>>>;
  EXPECT_DOUBLE_EQ(Narrow::bits_per_value, Narrow::plain_bits_per_value);
  EXPECT_LT(Narrow::used_bytes(8, D, true), Narrow::used_bytes(8, D, false));
  EXPECT_EQ(Narrow::max_used_bytes(8, D), Narrow::used_bytes(8, D, false));
  EXPECT_EQ(AnchorKf::keyframe_bytes(D), 128u);
  EXPECT_EQ(AnchorKf::delta_bytes(D), 32u + 8u);
  EXPECT_EQ(AnchorKf::interval_bytes(D, true), 128u + 63u * 40u);
  EXPECT_EQ(AnchorKf::interval_bytes(D, false), 64u * 40u);
  EXPECT_EQ(AnchorKf::max_used_bytes(I, D), AnchorKf::interval_bytes(D, true));
  EXPECT_DOUBLE_EQ(8.0 * static_cast<double>(AnchorKf::interval_bytes(D, true)) / (I * D), AnchorKf::delta_bits_per_value);
  EXPECT_DOUBLE_EQ(8.0 * static_cast<double>(AnchorKf::interval_bytes(D, false)) / (I * D), AnchorKf::plain_bits_per_value);
  EXPECT_EQ(AnchorKf::offset(0, D, true), 0u);
  EXPECT_EQ(AnchorKf::offset(5, D, true), 128u + 4u * 40u);
  EXPECT_EQ(AnchorKf::offset(5, D, false), 5u * 40u);
}

template <class Kf>
void random_access_equals_full_decode() {
  for (int count : {1, 2, 31, 33, 64}) {
    for (auto choice : {Kf::Choice::best, Kf::Choice::force_delta, Kf::Choice::force_plain}) {
      const auto x = smooth(count, 7u + static_cast<unsigned>(count), 3.f, 0.05f, 0.02f);
      bool delta = false;
      const auto buf = encode<Kf>(x, count, delta, choice);
      std::vector<float> full(static_cast<size_t>(count) * D), one(D);
      Kf::decode_interval(buf.data(), delta, count, D, full.data());
      for (int t = 0; t < count; ++t) {
        Kf::decode_token(buf.data(), delta, t, D, one.data());
        for (int d = 0; d < D; ++d)
          ASSERT_EQ(one[d], full[static_cast<size_t>(t) * D + d]) << "token " << t << " channel " << d;
      }
    }
  }
}
TEST(KeyframeCodec, RandomAccessEqualsFullDecodeAnchor) { random_access_equals_full_decode<AnchorKf>(); }
TEST(KeyframeCodec, RandomAccessEqualsFullDecodeChained) { random_access_equals_full_decode<ChainKf>(); }

// Anchor, delta mode: token t's error is at most half a step of its own delta group (the group of
// x_t - k̂), whatever its offset in the interval. Float64 bound: step = (max - min) / 15 of the
// delta group, rounded up to fp16 (factor 1 + 2^-10), plus the fp32 rounding of the additions.
TEST(KeyframeCodec, AnchorErrorBoundPerTokenIndependentOfOffset) {
  const auto x = smooth(I, 11u, 3.f, 0.05f, 0.02f);
  bool delta = false;
  const auto buf = encode<AnchorKf>(x, I, delta, AnchorKf::Choice::force_delta);
  ASSERT_TRUE(delta);
  std::vector<float> key(D), rec(D);
  AnchorKf::decode_keyframe(buf.data(), D, key.data());
  for (int t = 1; t < I; ++t) {
    AnchorKf::decode_token(buf.data(), true, t, D, rec.data());
    for (int g = 0; g < D / 32; ++g) {
      double lo = INFINITY, hi = -INFINITY;
      for (int d = g * 32; d < (g + 1) * 32; ++d) {
        const double dd = static_cast<double>(x[static_cast<size_t>(t) * D + d]) - key[d];
        lo = std::min(lo, dd), hi = std::max(hi, dd);
      }
      const double step = (hi - lo) / 15 * (1 + 0x1p-10) + 0x1p-24 * std::abs(lo);
      for (int d = g * 32; d < (g + 1) * 32; ++d) {
        const double xv = x[static_cast<size_t>(t) * D + d];
        const double bound = step / 2 + 0x1p-23 * (std::abs(xv) + std::abs(hi - lo)) + 1e-7;
        EXPECT_LE(std::abs(rec[d] - xv), bound) << "token " << t << " channel " << d;
      }
    }
  }
  // Statistically: on stationary tokens (keyframe + i.i.d. noise) late tokens are not worse.
  double early = 0, late = 0;
  for (unsigned s = 0; s < 100; ++s) {
    const auto y = smooth(I, 100u + s, 3.f, 0.f, 0.05f);
    bool dm = false;
    const auto b = encode<AnchorKf>(y, I, dm, AnchorKf::Choice::force_delta);
    std::vector<float> r(static_cast<size_t>(I) * D);
    AnchorKf::decode_interval(b.data(), true, I, D, r.data());
    for (int d = 0; d < D; ++d) {
      early += std::abs(r[1 * D + d] - y[1 * D + d]);
      late += std::abs(r[63 * D + d] - y[63 * D + d]);
    }
  }
  EXPECT_LT(late, 1.25 * early);
  EXPECT_GT(late, 0.8 * early);
}

// Chained closed loop on a random walk: the error at token 63 stays within 2x of token 1 (rms over
// 100 intervals). An open-loop chain (deltas of the ORIGINAL tokens, summed) drifts: the same
// measure computed for it exceeds 2x, so the assertion can fail.
TEST(KeyframeCodec, ChainedClosedLoopDoesNotDrift) {
  double e1 = 0, e63 = 0, o1 = 0, o63 = 0;
  using DC = Int4<Group<32>>;
  for (unsigned s = 0; s < 100; ++s) {
    const auto x = smooth(I, 500u + s, 3.f, 0.1f, 0.f);
    bool delta = false;
    const auto buf = encode<ChainKf>(x, I, delta, ChainKf::Choice::force_delta);
    std::vector<float> r(static_cast<size_t>(I) * D);
    ChainKf::decode_interval(buf.data(), true, I, D, r.data());
    // Open loop: d_t = x_t - x_{t-1}, summed onto the decoded keyframe.
    std::vector<float> acc(r.begin(), r.begin() + D), diff(D), dq(D);
    std::vector<std::byte> codes(DC::code_bytes(D)), meta(kvpack::row_meta_bytes<DC>(D));
    for (int t = 1; t < I; ++t) {
      for (int d = 0; d < D; ++d) diff[d] = x[static_cast<size_t>(t) * D + d] - x[static_cast<size_t>(t - 1) * D + d];
      kvpack::encode_row<DC>(diff.data(), D, codes.data(), meta.data());
      kvpack::decode_row<DC>(codes.data(), meta.data(), D, dq.data());
      for (int d = 0; d < D; ++d) acc[d] += dq[d];
      for (int d = 0; d < D; ++d) {
        const double ec = r[static_cast<size_t>(t) * D + d] - x[static_cast<size_t>(t) * D + d];
        const double eo = acc[d] - x[static_cast<size_t>(t) * D + d];
        if (t == 1) e1 += ec * ec, o1 += eo * eo;
        if (t == 63) e63 += ec * ec, o63 += eo * eo;
      }
    }
  }
  EXPECT_LE(std::sqrt(e63), 2.0 * std::sqrt(e1));
  EXPECT_GT(std::sqrt(o63), 2.0 * std::sqrt(o1)) << "the open-loop control should drift";
}

// Never expand: on i.i.d. noise deltas are wider than values, so the encoder keeps plain mode and
// its error equals plain coding's; on smooth tokens it keeps delta mode. Bytes never expand either:
// a plain interval is exactly Interval plain rows (the plain codec), smaller than keyframe + deltas.
template <class Kf>
void never_expand() {
  for (unsigned s = 0; s < 20; ++s) {
    const auto x = kvtest::normal(static_cast<size_t>(I) * D, 900u + s);
    bool db = true, dp = true, dd = false;
    double eb = 0, ep = 0, ed = 0;
    const auto best = encode<Kf>(x, I, db, Kf::Choice::best, &eb);
    const auto plain = encode<Kf>(x, I, dp, Kf::Choice::force_plain, &ep);
    const auto dlt = encode<Kf>(x, I, dd, Kf::Choice::force_delta, &ed);
    EXPECT_FALSE(db) << "i.i.d. noise must be stored plain";
    EXPECT_EQ(best, plain);
    EXPECT_EQ(best.size(), static_cast<size_t>(I) * Kf::delta_bytes(D));
    EXPECT_EQ(dlt.size(), Kf::keyframe_bytes(D) + static_cast<size_t>(I - 1) * Kf::delta_bytes(D));
    EXPECT_LE(eb, ep);
    EXPECT_LE(eb, ed);
    EXPECT_GT(ed, ep);  // delta really would have expanded the error
  }
  const auto y = smooth(I, 77u, 10.f, 0.01f, 0.01f);
  bool dy = false;
  double ey = 0, epy = 0;
  encode<Kf>(y, I, dy, Kf::Choice::best, &ey);
  bool tmp = false;
  encode<Kf>(y, I, tmp, Kf::Choice::force_plain, &epy);
  EXPECT_TRUE(dy) << "smooth tokens must be stored as deltas";
  EXPECT_LT(ey, epy);
}
TEST(KeyframeCodec, NeverExpandAnchor) { never_expand<AnchorKf>(); }
TEST(KeyframeCodec, NeverExpandChained) { never_expand<ChainKf>(); }

// The keyframe itself is coded by KeyframeCodec: an fp16 keyframe reconstructs to fp16 rounding
// (a lone token is kept as a keyframe: fp16 beats INT4, whatever the bytes).
TEST(KeyframeCodec, KeyframeIsStoredAtKeyframePrecision) {
  const auto x = kvtest::normal(static_cast<size_t>(D), 3u, 5.f);
  bool delta = false;
  const auto buf = encode<AnchorKf>(x, 1, delta);
  ASSERT_TRUE(delta);
  std::vector<float> k(D);
  AnchorKf::decode_keyframe(buf.data(), D, k.data());
  for (int d = 0; d < D; ++d) EXPECT_LE(std::abs(k[d] - x[d]), std::abs(x[d]) * 0x1p-11 + 1e-7);
}

}  // namespace
