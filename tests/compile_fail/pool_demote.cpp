// expect: kvpack::PagedCache<...>: Demote<> is not supported on the page pool yet
// An evicting pool sequence cannot demote: the low tier would live outside the page arena.
#include <kvpack/kvpack.hpp>
#include <kvpack/pool/paged_cache.hpp>
using Bad = kvpack::PagedCache<kvpack::Keys<kvpack::Int8<>>, kvpack::Values<kvpack::Int8<>>, kvpack::H2O<16, 16, 2>,
                               kvpack::Demote<kvpack::Keys<kvpack::Int4<>>, kvpack::Values<kvpack::Int4<>>>>;
int main() { return Bad::create({}).has_value() ? 0 : 1; }
