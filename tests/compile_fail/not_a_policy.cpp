// expect: every template argument must be a kvpack policy
#include <kvpack/kvpack.hpp>
using Bad = kvpack::KVCache<kvpack::Int4<>>;  // a codec, not wrapped in Keys<> or Values<>
int main() { return Bad::create({}).has_value() ? 0 : 1; }
