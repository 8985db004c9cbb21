// expect: per-channel keys need a grouped codec
#include <kvpack/kvpack.hpp>
using Bad = kvpack::KVCache<kvpack::Keys<kvpack::Fp16, kvpack::PerChannel>>;
int main() { return Bad::create({}).has_value() ? 0 : 1; }
