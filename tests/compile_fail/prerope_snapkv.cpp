// expect: kvpack::KVCache<...>: PreRope<CacheRelative> with SnapKV
// SnapKV scores the prompt at the tokens' original positions (PreRope<OriginalPositions> works:
// tests/test_eviction_snapkv_pre_rope.cpp); ranks among held tokens are not defined for it.
#include <kvpack/kvpack.hpp>
using Bad = kvpack::KVCache<kvpack::Keys<kvpack::Int8<>>, kvpack::Values<kvpack::Int8<>>, kvpack::SnapKV<64, 16>,
                            kvpack::PreRope<kvpack::CacheRelative>>;
int main() { return Bad::create({}).has_value() ? 0 : 1; }
