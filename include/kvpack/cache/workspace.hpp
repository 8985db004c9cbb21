// Workspace: the scratch memory of attention and eviction scoring, kept apart from what a
// sequence holds (SequenceStore) so one workspace can serve any sequence it is handed.
#pragma once

#include <vector>

#include "dispatch.hpp"

namespace kvpack {

/// Reusable scratch (grown on demand, never shrunk): kernel tiles, block refs of one KV head,
/// key-mass arrays. Holds no token data between calls.
struct Workspace {
  kernels::Scratch scratch;                  ///< the attention kernel's working memory
  std::vector<kernels::BlockRef> refs;       ///< block refs of the KV head being attended
  std::vector<float> mass;                   ///< key mass of one query head (SnapKV scoring)
  std::vector<std::vector<float>> head_mass; ///< key mass of each KV head of the current attend
};

}  // namespace kvpack
