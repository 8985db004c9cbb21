// expect: kvpack::KVCache<...>: PreRope<> with SnapKV
// SnapKV scores its saved queries against the stored keys outside the kernels: with pre-RoPE
// keys and queries it would compare them unrotated.
#include <kvpack/kvpack.hpp>
using Bad = kvpack::KVCache<kvpack::Keys<kvpack::Int8<>>, kvpack::Values<kvpack::Int8<>>, kvpack::SnapKV<64, 16>,
                            kvpack::PreRope<>>;
int main() { return Bad::create({}).has_value() ? 0 : 1; }
