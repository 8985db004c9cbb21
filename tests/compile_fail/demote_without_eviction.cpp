// expect: Demote<> re-codes the tokens an eviction policy drops
// A low-precision tier with nothing to demote: Demote<> needs an eviction policy.
#include <kvpack/kvpack.hpp>

using Bad = kvpack::KVCache<kvpack::Keys<kvpack::Int4<>>, kvpack::Values<kvpack::Int4<>>,
                            kvpack::Demote<kvpack::Keys<kvpack::Int2<>>, kvpack::Values<kvpack::Int2<>>>>;
static_assert(Bad::demotes);
int main() { return 0; }
