// expect: kvpack::PagedCache<...>: Offload<> and PreRope<> are not supported on the page pool yet
// The page pool's kernels take post-RoPE keys only.
#include <kvpack/kvpack.hpp>
#include <kvpack/pool/paged_cache.hpp>
using Bad = kvpack::PagedCache<kvpack::Keys<kvpack::Int8<>>, kvpack::Values<kvpack::Int8<>>, kvpack::PreRope<>>;
int main() { return Bad::create({}).has_value() ? 0 : 1; }
