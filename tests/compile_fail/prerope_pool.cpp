// expect: PreRope<CacheRelative> is not supported on the page pool
// A pool without eviction takes PreRope<OriginalPositions> (tests/test_pool_pre_rope.cpp); ranks
// among held tokens would only repeat cache indices there.
#include <kvpack/kvpack.hpp>
#include <kvpack/pool/paged_cache.hpp>
using Bad = kvpack::PagedCache<kvpack::Keys<kvpack::Int8<>>, kvpack::Values<kvpack::Int8<>>, kvpack::PreRope<kvpack::CacheRelative>>;
int main() { return Bad::create({}).has_value() ? 0 : 1; }
