// expect: no Keyframe<...> low codec
// A Keyframe<...> interval cannot take demoted tokens one at a time.
#include <kvpack/kvpack.hpp>

using Bad = kvpack::KVCache<kvpack::Keys<kvpack::Int4<>>, kvpack::Values<kvpack::Int4<>>, kvpack::SinkWindow<4, 60>,
                            kvpack::Demote<kvpack::Keys<kvpack::Int2<>>, kvpack::Values<kvpack::Keyframe<64, kvpack::Int4<>>>>>;
static_assert(sizeof(Bad) > 0);
int main() { return 0; }
