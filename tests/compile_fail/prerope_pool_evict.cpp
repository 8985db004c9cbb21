// expect: Offload<> and PreRope<> with eviction are not supported on the page pool yet
// The evicting pool's slots reuse pages without the position runs a PreRope<> kernel reads.
#include <kvpack/kvpack.hpp>
#include <kvpack/pool/paged_cache.hpp>
using Bad = kvpack::PagedCache<kvpack::Keys<kvpack::Int8<>>, kvpack::Values<kvpack::Int8<>>, kvpack::SinkWindow<4, 60>,
                               kvpack::PreRope<>>;
int main() { return Bad::create({}).has_value() ? 0 : 1; }
