// expect: kvpack::Rotate<R, ...>: R must be kvpack::Hadamard or kvpack::SignedHadamard
#include <kvpack/kvpack.hpp>
using Bad = kvpack::Rotated<kvpack::KVCache<>, kvpack::Rotate<int>>;
int main() { return sizeof(Bad) > 0 ? 0 : 1; }
