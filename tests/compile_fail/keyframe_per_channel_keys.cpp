// expect: cannot be combined with a Keyframe<...> value codec
// Per-channel (KIVI) keys commit groups of 32 tokens; a keyframe value codec commits whole intervals.
#include <kvpack/kvpack.hpp>

using Bad = kvpack::KVCache<kvpack::Keys<kvpack::Int4<>, kvpack::PerChannel>, kvpack::Values<kvpack::Keyframe<64, kvpack::Int4<>>>>;
static_assert(Bad::block_tokens == 64);
int main() { return 0; }
