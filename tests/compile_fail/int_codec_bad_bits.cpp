// expect: only 2-, 3-, 4- and 8-bit codes are supported
#include <kvpack/kvpack.hpp>
using Bad = kvpack::IntCodec<5, kvpack::Group<32>, kvpack::Asymmetric, kvpack::MetaF16>;
int main() { return Bad::bits; }
