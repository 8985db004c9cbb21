// expect: kvpack::KVCache<...>: PreRope<> runs in the scalar/AVX2/NEON tile kernels only
// Keyframe<...> codecs attend through their own kernel, which does not rotate keys.
#include <kvpack/kvpack.hpp>
using Bad = kvpack::KVCache<kvpack::Keys<kvpack::Keyframe<64, kvpack::Int4<>>>, kvpack::Values<kvpack::Int4<>>,
                            kvpack::PreRope<kvpack::CacheRelative>>;
int main() { return Bad::create({}).has_value() ? 0 : 1; }
