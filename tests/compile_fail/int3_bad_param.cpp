// expect: kvpack::Int3<...>: parameters must be at most one each of Group<G>
#include <kvpack/kvpack.hpp>
using Bad = kvpack::Int3<kvpack::Group<32>, kvpack::Symmetric, kvpack::Group<64>>;
int main() { return Bad::bits; }
