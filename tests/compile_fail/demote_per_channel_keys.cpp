// expect: per-channel low keys cannot hold single tokens
// Demoted tokens arrive one at a time; a per-channel key group cannot be coded from one token.
#include <kvpack/kvpack.hpp>

using Bad = kvpack::KVCache<kvpack::Keys<kvpack::Int4<>>, kvpack::Values<kvpack::Int4<>>, kvpack::SinkWindow<4, 60>,
                            kvpack::Demote<kvpack::Keys<kvpack::Int2<>, kvpack::PerChannel>, kvpack::Values<kvpack::Int2<>>>>;
static_assert(Bad::demotes);
int main() { return 0; }
