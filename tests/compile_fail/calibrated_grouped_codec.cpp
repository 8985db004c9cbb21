// expect: the cache's key or value codec must be Fp8E4M3Unscaled or
#include <kvpack/kvpack.hpp>
using Bad = kvpack::Calibrated<kvpack::KVCache<kvpack::Keys<kvpack::Fp8E4M3<>>, kvpack::Values<kvpack::Fp8E4M3<>>>>;
int main() { return Bad::create({}).has_value() ? 0 : 1; }
