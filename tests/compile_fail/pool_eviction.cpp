// expect: kvpack::PagedCache<...>: BlockSparse is not supported on the page pool
// BlockSparse keeps block masks and compacts private blocks: not on the page pool.
#include <kvpack/kvpack.hpp>
#include <kvpack/pool/paged_cache.hpp>
using Bad = kvpack::PagedCache<kvpack::Keys<kvpack::Int8<>>, kvpack::Values<kvpack::Int8<>>, kvpack::BlockSparse<kvpack::Tokens<256>>>;
int main() { return Bad::create({}).has_value() ? 0 : 1; }
