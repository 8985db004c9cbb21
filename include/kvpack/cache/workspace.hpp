// Workspace: the scratch memory of attention and eviction scoring, kept apart from what a
// sequence holds (SequenceStore) so one workspace can serve any sequence it is handed.
#pragma once

#include <vector>

#include "kvpack/kernels/dispatch.hpp"
#include "kvpack/executor.hpp"
#include "kvpack/kernels/split_k.hpp"

namespace kvpack {

/// Scratch of the low tier's attention in a Demote<> cache (cache/demoted_attend.hpp).
struct TierScratch {
  kernels::Scratch scratch;             ///< the low codecs' kernel working memory
  std::vector<kernels::BlockRef> refs;  ///< low-tier blocks of the KV head being attended
  std::vector<float> out, m, l;         ///< low-tier output [n_states][D]; the high run's max and sum
};

/// Reusable scratch (grown on demand, never shrunk): kernel tiles, block refs of one KV head,
/// key-mass arrays. Holds no token data between calls.
struct Workspace {
  kernels::Scratch scratch;                  ///< the attention kernel's working memory
  std::vector<kernels::BlockRef> refs;       ///< block refs of the KV head being attended
  std::vector<float> mass;                   ///< key mass of one query head (SnapKV scoring)
  std::vector<std::vector<float>> head_mass; ///< key mass of each KV head of the current attend
  /// Key masses of the sequences one task of an evicting pool's attend_batch ran, kept until the
  /// batch credits them: [j-th sequence of the task][kv_head][ordinal] (capacity reused per call).
  std::vector<std::vector<std::vector<float>>> batch_mass;
  Executor exec;                             ///< KVCache::set_executor (empty: serial attend)
  int splits = 1;                            ///< split-K chunks per KV head (kernels/split_k.hpp)
  kernels::ParallelScratch parallel;         ///< working memory of kernels::attend_parallel
  std::vector<std::vector<kernels::BlockRef>> head_refs;  ///< block refs of every KV head (parallel attend)
  std::vector<kernels::HeadJob> jobs;        ///< one kernel job per KV head (parallel attend)
  TierScratch tier;                          ///< the low tier's attention (Demote<> caches only)
  /// PreRope<> caches: the RoPE table and pairing (no positions) for attention an eviction hook
  /// runs itself (SnapKV's scoring); set by KVCache right before it calls the hook, else null.
  const kernels::RopeArgs* rope = nullptr;
  std::vector<std::int32_t> rope_spill;      ///< a PreRope<> pool's positions of pages spanning a jump
};

}  // namespace kvpack
