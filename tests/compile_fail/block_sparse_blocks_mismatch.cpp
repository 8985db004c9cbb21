// expect: BlockSparse<Budget, B> sets the storage block size
#include <kvpack/kvpack.hpp>
using Bad = kvpack::KVCache<kvpack::BlockSparse<kvpack::Tokens<1024>, 64>, kvpack::Blocks<32>>;
int main() { return Bad::create({}).has_value() ? 0 : 1; }
