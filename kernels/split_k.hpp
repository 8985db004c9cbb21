// Parallel decode attention over the caller's executor (include/kvpack/executor.hpp): every KV
// head of a layer is one job, and a job's context is cut into up to `splits` chunks of whole
// blocks (split-K, FlashDecoding: Dao, Haziza, Massa, Sizov 2023). Each chunk runs the ordinary
// single-thread kernel into its own scratch and output; the partial softmax states are then
// combined exactly:
//     M = max_p m_p,  w_p = l_p exp(m_p - M),  out = sum_p w_p out_p / sum_p w_p
// where out_p is chunk p's normalized output and (m_p, l_p) its max logit and denominator, left
// in Scratch::m / Scratch::l by every kernel. Exact in real arithmetic; in fp32 it differs from
// the one-chunk kernel by rounding only (~1e-7 relative per combine).
//
// Chunks hold similar numbers of readable tokens: blocks that are skipped unread (block-sparse
// masked blocks, count 0) weigh nothing, so they cost no chunk any time. A job that gathers
// key_mass (H2O, BlockSparse scoring) is not split (its mass needs the final max and sum of the
// whole context), but still runs in parallel with the other heads.
#pragma once

#include <algorithm>
#include <cmath>
#include <cstddef>
#include <cstdint>
#include <limits>
#include <span>
#include <vector>

#include "kvpack/executor.hpp"
#include "kvpack/kernels/scalar/attention.hpp"

namespace kvpack::kernels {

/// One KV head's attention: its arguments and its segments (as for attend_scalar).
struct HeadJob {
  AttendArgs args;
  HeadSegments seg;
};

/// Working memory of attend_parallel (grown on demand, reused across calls).
struct ParallelScratch {
  struct Part {
    int job = 0;
    int index = 0;   // chunk index within the job
    int of = 1;      // chunks of the job
    HeadSegments seg;
    std::size_t out_offset = 0;  // into outs, when of > 1
  };
  std::vector<Scratch> scratch;  // one per part
  std::vector<Part> parts;
  std::vector<float> outs;       // partial outputs [part][n_states][D] of split jobs
};

namespace split_detail {

/// Readable tokens of a block (0 for a block the kernels skip unread).
[[nodiscard]] inline std::int64_t weight(const BlockRef& b) noexcept { return b.count > 0 ? b.count : 0; }

/// Cuts seg into `parts` chunks of whole blocks with similar readable tokens; sinks go to the
/// first chunk, pending rows and the current chunk to the last. Returns the chunk count used.
inline int cut(const HeadSegments& seg, int parts, std::vector<ParallelScratch::Part>& out, int job,
               std::size_t& out_offset, std::size_t part_floats) {
  std::int64_t total = seg.sinks.count + seg.pending.count + seg.chunk.count;
  int nonempty = 0;
  for (const BlockRef& b : seg.blocks) {
    total += weight(b);
    nonempty += b.count > 0;
  }
  parts = std::max(1, std::min(parts, nonempty));
  std::size_t begin = 0;
  std::int64_t done = seg.sinks.count;
  for (int p = 0; p < parts; ++p) {
    std::size_t end = begin;
    if (p == parts - 1) {
      end = seg.blocks.size();
    } else {
      const std::int64_t target = total * (p + 1) / parts;
      while (end < seg.blocks.size() && (done + weight(seg.blocks[end]) <= target || end == begin))
        done += weight(seg.blocks[end++]);
    }
    ParallelScratch::Part part;
    part.job = job;
    part.index = p;
    part.of = parts;
    part.seg.blocks = seg.blocks.subspan(begin, end - begin);
    if (p == 0) part.seg.sinks = seg.sinks;
    if (p == parts - 1) {
      part.seg.pending = seg.pending;
      part.seg.chunk = seg.chunk;
    }
    if (parts > 1) {
      part.out_offset = out_offset;
      out_offset += part_floats;
    }
    out.push_back(part);
    begin = end;
  }
  return parts;
}

}  // namespace split_detail

/// Runs every job (one KV head each) through `kernel(args, segments, scratch)` on `exec`, each
/// job cut into up to `splits` chunks (1 for jobs with key_mass), and writes every job's output
/// to its args.out. kernel is any single-thread attention kernel of this directory (it must leave
/// each state's max logit and denominator in Scratch::m / Scratch::l). Outputs equal the
/// one-chunk kernel's up to fp32 rounding of the combine. `ps` must not be shared between
/// concurrent calls.
template <class Kernel>
void attend_parallel(std::span<const HeadJob> jobs, int splits, const Executor& exec, ParallelScratch& ps,
                     const Kernel& kernel) {
  ps.parts.clear();
  std::size_t out_floats = 0;
  for (std::size_t j = 0; j < jobs.size(); ++j) {
    const AttendArgs& a = jobs[j].args;
    const std::size_t state_floats = static_cast<std::size_t>(a.n_q) * a.group * a.head_dim;
    split_detail::cut(jobs[j].seg, a.key_mass ? 1 : splits, ps.parts, static_cast<int>(j), out_floats, state_floats);
  }
  if (ps.scratch.size() < ps.parts.size()) ps.scratch.resize(ps.parts.size());
  if (ps.outs.size() < out_floats) ps.outs.resize(out_floats);

  exec(static_cast<int>(ps.parts.size()), [&](int i) {
    const auto& part = ps.parts[static_cast<std::size_t>(i)];
    AttendArgs a = jobs[static_cast<std::size_t>(part.job)].args;
    if (part.of > 1) {  // a partial output, contiguous [n_q][group][D]
      a.out = ps.outs.data() + part.out_offset;
      a.out_stride = static_cast<std::int64_t>(a.group) * a.head_dim;
    }
    kernel(a, part.seg, ps.scratch[static_cast<std::size_t>(i)]);
  });

  // Combine the chunks of every split job.
  for (std::size_t i = 0; i < ps.parts.size();) {
    const auto& first = ps.parts[i];
    if (first.of == 1) {
      ++i;
      continue;
    }
    const AttendArgs& a = jobs[static_cast<std::size_t>(first.job)].args;
    const int D = a.head_dim, n_states = a.n_q * a.group;
    for (int st = 0; st < n_states; ++st) {
      const auto s = static_cast<std::size_t>(st);
      float M = -std::numeric_limits<float>::infinity();
      for (int p = 0; p < first.of; ++p) {
        const Scratch& sc = ps.scratch[i + static_cast<std::size_t>(p)];
        if (sc.l[s] > 0.f) M = std::max(M, sc.m[s]);
      }
      float W = 0.f;
      for (int p = 0; p < first.of; ++p) {
        const Scratch& sc = ps.scratch[i + static_cast<std::size_t>(p)];
        if (sc.l[s] > 0.f) W += sc.l[s] * std::exp(sc.m[s] - M);
      }
      float* o = a.out + (st / a.group) * a.out_stride + (st % a.group) * D;
      std::fill_n(o, D, 0.f);
      if (!(W > 0.f)) continue;  // the query saw no key in any chunk: zeros
      for (int p = 0; p < first.of; ++p) {
        const auto& part = ps.parts[i + static_cast<std::size_t>(p)];
        const Scratch& sc = ps.scratch[i + static_cast<std::size_t>(p)];
        if (!(sc.l[s] > 0.f)) continue;
        const float w = sc.l[s] * std::exp(sc.m[s] - M) / W;  // <= 1: no overflow
        const float* po = ps.outs.data() + part.out_offset + s * static_cast<std::size_t>(D);
        for (int d = 0; d < D; ++d) o[d] += w * po[d];
      }
    }
    i += static_cast<std::size_t>(first.of);
  }
}

}  // namespace kvpack::kernels
