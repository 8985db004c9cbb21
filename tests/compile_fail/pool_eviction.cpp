// expect: kvpack::PagedCache<...>: eviction policies (SinkWindow, H2O, SnapKV, BlockSparse, TOVA) are not supported on the page pool yet
#include <kvpack/kvpack.hpp>
#include <kvpack/pool/paged_cache.hpp>
using Bad = kvpack::PagedCache<kvpack::Keys<kvpack::Int8<>>, kvpack::Values<kvpack::Int8<>>, kvpack::SinkWindow<4, 60>>;
int main() { return Bad::create({}).has_value() ? 0 : 1; }
