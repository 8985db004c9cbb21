// expect: the budget N must be at least (SinkBlocks + RecentBlocks + 1) * B tokens
#include <kvpack/kvpack.hpp>
using Bad = kvpack::KVCache<kvpack::BlockSparse<kvpack::Tokens<128>, 64>>;
int main() { return Bad::create({}).has_value() ? 0 : 1; }
