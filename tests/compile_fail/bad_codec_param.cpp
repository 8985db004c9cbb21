// expect: parameters must be at most one each of Group<G>
#include <kvpack/kvpack.hpp>
using Bad = kvpack::Int4<kvpack::Group<32>, kvpack::Group<64>>;
int main() { return Bad::bits; }
