// expect: Blocks<B> must be a multiple of the key group
#include <kvpack/kvpack.hpp>
using Bad = kvpack::KVCache<kvpack::Keys<kvpack::Int4<kvpack::Group<64>>, kvpack::PerChannel>, kvpack::Blocks<32>>;
int main() { return Bad::create({}).has_value() ? 0 : 1; }
