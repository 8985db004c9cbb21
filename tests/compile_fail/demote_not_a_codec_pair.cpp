// expect: write Demote<Keys<Codec>, Values<Codec>>
// Demote<> takes the low tier's Keys<> and Values<> policies, not bare codecs.
#include <kvpack/kvpack.hpp>

using Bad = kvpack::KVCache<kvpack::Keys<kvpack::Int4<>>, kvpack::Values<kvpack::Int4<>>, kvpack::SinkWindow<4, 60>,
                            kvpack::Demote<kvpack::Int2<>, kvpack::Int2<>>>;
static_assert(Bad::demotes);
int main() { return 0; }
