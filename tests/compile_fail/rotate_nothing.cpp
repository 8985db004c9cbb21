// expect: rotates neither keys nor values
#include <kvpack/kvpack.hpp>
using Bad = kvpack::Rotated<kvpack::KVCache<>, kvpack::Rotate<kvpack::Hadamard, false, false>>;
int main() { return sizeof(Bad) > 0 ? 0 : 1; }
