// AArch64 Advanced SIMD (NEON) fused dequant-attention kernel: attend_neon, same signature and
// semantics as kernels::attend_scalar (kernels/scalar/attention.hpp), outputs equal to 1e-5
// relative. Same structure as the AVX2 kernel (kernels/simd_common.hpp): tiles of 16 keys
// dequantized once into an L1 tile (kernels/neon/codes.hpp), scores in register blocks of up to
// 4 query states x 2 keys (8 accumulators, reduced by pairwise adds), V accumulated for up to
// 4 states x 16 dims per pass; head_dim 64/128/256 compiled separately, others generic.
// fp32 dequantization, not SDOT on an int8-quantized query: the query's quantization alone moves
// outputs by ~1e-3 relative, outside the 1e-5 contract (see kernels/avx2/attention.hpp).
// Only compiled when KVPACK_HAS_NEON (config.hpp).
#pragma once

#include "kvpack/config.hpp"

#if KVPACK_HAS_NEON

#include <arm_neon.h>

#include <cmath>
#include <cstddef>
#include <cstdint>
#include <limits>

#include "kvpack/kernels/neon/codes.hpp"
#include "kvpack/kernels/scalar/attention.hpp"
#include "kvpack/kernels/simd_common.hpp"

namespace kvpack::kernels {

namespace neon_detail {

/// exp(x) for x <= 0 (x = -inf and x < -87.3 give 0); same reduction and polynomial as the AVX2
/// kernel (Cephes expf), <= 2 ulp against std::exp.
[[nodiscard]] inline float32x4_t exp_nonpos(float32x4_t x) noexcept {
  const uint32x4_t tiny = vcltq_f32(x, vdupq_n_f32(-87.3f));
  x = vmaxq_f32(x, vdupq_n_f32(-87.3f));
  const float32x4_t n = vrndnq_f32(vmulq_f32(x, vdupq_n_f32(1.44269504088896341f)));
  float32x4_t r = vfmsq_f32(x, n, vdupq_n_f32(0.693359375f));
  r = vfmsq_f32(r, n, vdupq_n_f32(-2.12194440e-4f));
  float32x4_t y = vdupq_n_f32(1.9875691500e-4f);
  y = vfmaq_f32(vdupq_n_f32(1.3981999507e-3f), y, r);
  y = vfmaq_f32(vdupq_n_f32(8.3334519073e-3f), y, r);
  y = vfmaq_f32(vdupq_n_f32(4.1665795894e-2f), y, r);
  y = vfmaq_f32(vdupq_n_f32(1.6666665459e-1f), y, r);
  y = vfmaq_f32(vdupq_n_f32(5.0000001201e-1f), y, r);
  y = vfmaq_f32(vaddq_f32(r, vdupq_n_f32(1.f)), y, vmulq_f32(r, r));
  const int32x4_t e = vshlq_n_s32(vaddq_s32(vcvtq_s32_f32(n), vdupq_n_s32(127)), 23);
  const float32x4_t v = vmulq_f32(y, vreinterpretq_f32_s32(e));
  return vreinterpretq_f32_u32(vbicq_u32(vreinterpretq_u32_f32(v), tiny));
}

/// The instruction-set primitives of simd::attend_tiled for NEON.
struct Isa {
  template <class C>
  static constexpr bool int_dot_key = false;  // integer Q·K (sdot): not yet on NEON
  template <class C>
  static constexpr bool int_dot_value = false;  // integer P·V: not yet on NEON
  template <class C>
  static constexpr bool int_block = false;  // whole-block integer path (kernels/avx2/int_block.hpp): not yet on NEON
  template <class C>
  static constexpr bool channel_block = false;  // per-channel block path (kernels/avx2/channel_block.hpp): not yet on NEON
  template <int DT, int JS, int KS>
  static void score(const float* const* q, const float* k, std::int64_t ks, int n, int D, float scale, float* out,
                    std::int64_t os) noexcept {
    static_assert(JS * KS <= 8, "score: at most 8 accumulators");
    const int Dn = DT > 0 ? DT : D;
    const int Dv = Dn & ~3;
    for (int t = 0; t < n; t += KS) {
      const float* kp[KS];
      simd::static_for<KS>([&](auto kk) { kp[kk] = k + std::min(t + kk(), n - 1) * ks; });
      float32x4_t acc[8];
      simd::static_for<8>([&](auto i) { acc[i] = vdupq_n_f32(0.f); });
      for (int c = 0; c < Dv; c += 4) {
        float32x4_t kv[KS];
        simd::static_for<KS>([&](auto kk) { kv[kk] = vld1q_f32(kp[kk] + c); });
        simd::static_for<JS>([&](auto j) {
          const float32x4_t qv = vld1q_f32(q[j] + c);
          simd::static_for<KS>([&](auto kk) { acc[j * KS + kk] = vfmaq_f32(acc[j * KS + kk], qv, kv[kk]); });
        });
      }
      float r[8];
      vst1q_f32(r, vpaddq_f32(vpaddq_f32(acc[0], acc[1]), vpaddq_f32(acc[2], acc[3])));
      vst1q_f32(r + 4, vpaddq_f32(vpaddq_f32(acc[4], acc[5]), vpaddq_f32(acc[6], acc[7])));
      if (Dv < Dn) {
        for (int j = 0; j < JS; ++j)
          for (int kk = 0; kk < KS; ++kk)
            for (int c = Dv; c < Dn; ++c) r[j * KS + kk] += q[j][c] * kp[kk][c];
      }
      for (int j = 0; j < JS; ++j)
        for (int kk = 0; kk < KS && t + kk < n; ++kk) out[j * os + t + kk] = r[j * KS + kk] * scale;
    }
  }

  template <int JS, int DC>
  static void accumulate_block(float* const* acc, const float* const* p, const float* v, std::int64_t vs, int n,
                               std::uint32_t live, int c) noexcept {
    float32x4_t a[JS][DC];
    simd::static_for<JS>([&](auto j) { simd::static_for<DC>([&](auto d) { a[j][d] = vld1q_f32(acc[j] + c + 4 * d); }); });
    for (int t = 0; t < n; ++t) {
      if (!((live >> t) & 1u)) continue;
      const float* vr = v + t * vs + c;
      float32x4_t vv[DC];
      simd::static_for<DC>([&](auto d) { vv[d] = vld1q_f32(vr + 4 * d); });
      simd::static_for<JS>([&](auto j) {
        const float pj = p[j][t];
        simd::static_for<DC>([&](auto d) { a[j][d] = vfmaq_n_f32(a[j][d], vv[d], pj); });
      });
    }
    simd::static_for<JS>([&](auto j) { simd::static_for<DC>([&](auto d) { vst1q_f32(acc[j] + c + 4 * d, a[j][d]); }); });
  }

  template <int DT, int JS>
  static void accumulate(float* const* acc, const float* const* p, const float* v, std::int64_t vs, int n,
                         std::uint32_t live, int D) noexcept {
    constexpr int DC = JS >= 3 ? 4 : 8;
    const int Dn = DT > 0 ? DT : D;
    int c = 0;
    for (; c + 4 * DC <= Dn; c += 4 * DC) accumulate_block<JS, DC>(acc, p, v, vs, n, live, c);
    for (; c + 4 <= Dn; c += 4) accumulate_block<JS, 1>(acc, p, v, vs, n, live, c);
    for (; c < Dn; ++c)
      for (int j = 0; j < JS; ++j)
        for (int t = 0; t < n; ++t)
          if ((live >> t) & 1u) acc[j][c] += p[j][t] * v[t * vs + c];
  }

  static float mask_max(float* row, int visible, std::uint32_t bits) noexcept {
    const float32x4_t ninf = vdupq_n_f32(-std::numeric_limits<float>::infinity());
    const int32x4_t vis = vdupq_n_s32(visible);
    const uint32x4_t b = vdupq_n_u32(bits);
    float32x4_t mx = ninf;
    static constexpr std::int32_t lanes[4] = {0, 1, 2, 3};
    for (int i = 0; i < 16; i += 4) {
      const int32x4_t idx = vaddq_s32(vdupq_n_s32(i), vld1q_s32(lanes));
      const uint32x4_t sel = vshlq_u32(vdupq_n_u32(1), idx);
      const uint32x4_t ok = vandq_u32(vcgtq_s32(vis, idx), vtstq_u32(b, sel));
      const float32x4_t r = vbslq_f32(ok, vld1q_f32(row + i), ninf);
      vst1q_f32(row + i, r);
      mx = vmaxq_f32(mx, r);
    }
    return vmaxvq_f32(mx);
  }

  static float exp_sum(float* row, float m) noexcept {
    const float32x4_t mv = vdupq_n_f32(m);
    float32x4_t sum = vdupq_n_f32(0.f);
    for (int i = 0; i < 16; i += 4) {
      const float32x4_t p = exp_nonpos(vsubq_f32(vld1q_f32(row + i), mv));
      vst1q_f32(row + i, p);
      sum = vaddq_f32(sum, p);
    }
    return vaddvq_f32(sum);
  }

  static void scale(float* x, int D, float c) noexcept {
    int d = 0;
    for (; d + 4 <= D; d += 4) vst1q_f32(x + d, vmulq_n_f32(vld1q_f32(x + d), c));
    for (; d < D; ++d) x[d] *= c;
  }

  static void store_scaled(float* out, const float* acc, int D, float c) noexcept {
    int d = 0;
    for (; d + 4 <= D; d += 4) vst1q_f32(out + d, vmulq_n_f32(vld1q_f32(acc + d), c));
    for (; d < D; ++d) out[d] = acc[d] * c;
  }

  static void add_key_mass(float* km, const float* lg, std::int64_t n, float m, float inv) noexcept {
    const float32x4_t mv = vdupq_n_f32(m);
    std::int64_t o = 0;
    for (; o + 4 <= n; o += 4) {
      const float32x4_t p = vmulq_n_f32(exp_nonpos(vsubq_f32(vld1q_f32(lg + o), mv)), inv);
      vst1q_f32(km + o, vaddq_f32(vld1q_f32(km + o), p));
    }
    for (; o < n; ++o)
      if (lg[o] != -std::numeric_limits<float>::infinity()) km[o] += std::exp(lg[o] - m) * inv;
  }

  template <KvCodec C>
  static void decode_row(const std::byte* codes, const std::byte* meta, int n, float* out, float* tmp) noexcept {
    neon::decode_row<C>(codes, meta, n, out, tmp);
  }
  template <KvCodec C>
  static void load_channel_params(const std::byte* meta, int n, float* scale, float* zero, float* tmp) noexcept {
    neon::load_channel_params<C>(meta, n, scale, zero, tmp);
  }
  template <KvCodec C>
  static void decode_row_channels(const std::byte* codes, const float* scale, const float* zero, int n,
                                  float* out) noexcept {
    neon::decode_row_channels<C>(codes, scale, zero, n, out);
  }
};

}  // namespace neon_detail

/// NEON fused dequant-attention for one KV head and its query group: same contract as
/// attend_scalar (decode, causal prefill, BlockRef::valid slot masks, AttendArgs::key_mass),
/// outputs within 1e-5 relative of it. Scratch must not be shared across threads.
template <KvCodec KC, KvCodec VC, bool KPerChannel>
void attend_neon(const AttendArgs& a, const HeadSegments& seg, const BlockLayout& L, Scratch& s) {
  simd::attend_dispatch_dim<neon_detail::Isa, KC, VC, KPerChannel>(a, seg, L, s);
}

}  // namespace kvpack::kernels

#endif  // KVPACK_HAS_NEON
