// expect: a PreRope<> cache rotates keys by RoPE after this rotation
#include <kvpack/kvpack.hpp>
using Bad = kvpack::Rotated<kvpack::KVCache<kvpack::PreRope<>>>;
int main() { return sizeof(Bad) > 0 ? 0 : 1; }
