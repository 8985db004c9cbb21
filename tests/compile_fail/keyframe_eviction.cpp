// expect: eviction policies cannot remove single tokens from a Keyframe<...> interval
// Token-level eviction with a keyframe codec (deltas depend on their neighbours).
#include <kvpack/kvpack.hpp>

using Bad = kvpack::KVCache<kvpack::Values<kvpack::Keyframe<64, kvpack::Int4<>>>, kvpack::SinkWindow<4, 60>>;
static_assert(Bad::block_tokens == 64);
int main() { return 0; }
