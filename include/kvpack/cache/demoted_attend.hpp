// Attention over the two tiers of a Demote<> cache (cache/demotion_tier.hpp): the high tier runs
// exactly as without demotion (sinks, blocks, pending rows, the latest chunk; the policy's key
// mass gathered there), then the low tier's blocks run through the low codec pair's fused kernel
// into a second output, and the two are merged exactly with the split-K rule (kernels/split_k.hpp):
//     M = max(m_hi, m_lo),  w_p = l_p exp(m_p - M),  out = (w_hi out_hi + w_lo out_lo) / (w_hi + w_lo)
// (m_p, l_p: each run's max logit and softmax denominator per query state, Scratch::m / Scratch::l).
// Both runs read every token once, so the output is attention over the union of both tiers up to
// fp32 rounding of the merge (MiKV, "No Token Left Behind", Yang et al. 2024).
#pragma once

#include <algorithm>
#include <cmath>
#include <cstddef>
#include <limits>
#include <vector>

#include "kvpack/cache/codec_hook.hpp"
#include "kvpack/cache/demotion_tier.hpp"
#include "kvpack/cache/workspace.hpp"
#include "kvpack/kernels/dispatch.hpp"
#include "kvpack/policy.hpp"

namespace kvpack {

/// The SequenceStore tier type of demotion policy D (Demote<> or NoDemotion) for a cache whose
/// codec hook is High and whose kernel backend is BackendTag.
template <class D, class High, class BackendTag, bool = D::enabled>
struct demotion_tier_of {
  using type = NoDemotionTier;
};
template <class D, class High, class BackendTag>
struct demotion_tier_of<D, High, BackendTag, true> {
  using type = DemotionTier<High, CodecHook<typename D::keys::codec, typename D::values::codec, D::keys::per_channel, BackendTag>,
                            typename D::budget>;
};

/// Merges a second partial attention into a first, for n_states query states of head_dim D.
/// State s: first output at out + (s / group) * out_stride + (s % group) * D with softmax state
/// (m1[s], l1[s]); second output at out2 + s * D with (m2[s], l2[s]). A run with l = 0 saw no key
/// and weighs nothing; a state no run saw is left as the first run wrote it (zeros).
inline void merge_attention(float* out, std::int64_t out_stride, int group, int D, int n_states, const float* m1,
                            const float* l1, const float* out2, const float* m2, const float* l2) noexcept {
  for (int s = 0; s < n_states; ++s) {
    const bool has1 = l1[s] > 0.f, has2 = l2[s] > 0.f;
    if (!has2) continue;
    float* o = out + (s / group) * out_stride + static_cast<std::int64_t>(s % group) * D;
    const float* o2 = out2 + static_cast<std::size_t>(s) * static_cast<std::size_t>(D);
    if (!has1) {
      std::copy_n(o2, D, o);
      continue;
    }
    const float M = std::max(m1[s], m2[s]);
    const float w1 = l1[s] * std::exp(m1[s] - M), w2 = l2[s] * std::exp(m2[s] - M);
    const float W = w1 + w2;
    const float a = w1 / W, b = w2 / W;  // each <= 1: no overflow
    for (int d = 0; d < D; ++d) o[d] = a * o[d] + b * o2[d];
  }
}

/// Adds the low tier of (layer li, KV head h) of `tier` to the attention `a` just computed over
/// the high tier (a.out holds its output; `hi` the kernel scratch it ran in, with its m and l).
/// No-op when the head has no demoted rows. Low rows are not scored (a.key_mass is not touched).
/// May throw std::bad_alloc when scratch grows (KVCache::attend turns it into Errc::out_of_memory).
template <class Tier>
void attend_demoted(const Tier& tier, int li, int h, const kernels::AttendArgs& a, const kernels::Scratch& hi,
                    TierScratch& ts) {
  tier.refs(li, h, ts.refs);
  const kernels::ExactRows staged = tier.staged(li, h);  // per-channel keys: rows of an open group
  if (ts.refs.empty() && staged.count == 0) return;
  const int n_states = a.n_q * a.group;
  const auto ns = static_cast<std::size_t>(n_states);
  ts.m.assign(hi.m.begin(), hi.m.begin() + static_cast<std::ptrdiff_t>(ns));
  ts.l.assign(hi.l.begin(), hi.l.begin() + static_cast<std::ptrdiff_t>(ns));
  ts.out.resize(ns * static_cast<std::size_t>(a.head_dim));
  kernels::AttendArgs lo = a;
  lo.out = ts.out.data();
  lo.out_stride = static_cast<std::int64_t>(a.group) * a.head_dim;
  lo.key_mass = nullptr;
  kernels::HeadSegments seg;
  seg.blocks = ts.refs;
  seg.pending = staged;
  Tier::low_hook::attend(lo, seg, tier.layout(), ts.scratch);
  merge_attention(a.out, a.out_stride, a.group, a.head_dim, n_states, ts.m.data(), ts.l.data(), ts.out.data(),
                  ts.scratch.m.data(), ts.scratch.l.data());
}

}  // namespace kvpack
