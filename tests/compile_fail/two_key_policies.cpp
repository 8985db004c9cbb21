// expect: more than one Keys<> policy
#include <kvpack/kvpack.hpp>
using Bad = kvpack::KVCache<kvpack::Keys<kvpack::Int4<>>, kvpack::Keys<kvpack::Int8<>>>;
int main() { return Bad::create({}).has_value() ? 0 : 1; }
