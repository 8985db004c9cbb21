// expect: Blocks<B> must equal Interval
// A Keyframe<64, ...> codec with 32-token blocks: a block must hold exactly one interval.
#include <kvpack/kvpack.hpp>

using Bad = kvpack::KVCache<kvpack::Keys<kvpack::Keyframe<64, kvpack::Int4<>>>, kvpack::Blocks<32>>;
static_assert(Bad::block_tokens == 32);
int main() { return 0; }
