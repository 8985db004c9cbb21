// expect: kvpack::PagedCache<...>: Demote<> is not supported on the page pool yet
// BlockSparse runs on the pool (a victim block is a page, dropped at once), but re-coding its
// tokens into a low tier would need that tier outside the page arena.
#include <kvpack/kvpack.hpp>
#include <kvpack/pool/paged_cache.hpp>
using Bad = kvpack::PagedCache<kvpack::Keys<kvpack::Int8<>>, kvpack::Values<kvpack::Int8<>>, kvpack::BlockSparse<kvpack::Tokens<256>>,
                               kvpack::Demote<kvpack::Keys<kvpack::Int4<>>, kvpack::Values<kvpack::Int4<>>>>;
int main() { return Bad::create({}).has_value() ? 0 : 1; }
