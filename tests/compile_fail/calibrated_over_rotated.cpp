// expect: rotate outside the scaling: Rotated<Calibrated<KVCache<...>>>
#include <kvpack/kvpack.hpp>
using E4 = kvpack::Fp8E4M3Unscaled;
using Bad = kvpack::Calibrated<kvpack::Rotated<kvpack::KVCache<kvpack::Keys<E4>, kvpack::Values<E4>>>>;
int main() { return Bad::create({}).has_value() ? 0 : 1; }
