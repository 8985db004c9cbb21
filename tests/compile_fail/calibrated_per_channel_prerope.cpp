// expect: per-channel scales do not commute with a PreRope<> cache
#include <kvpack/kvpack.hpp>
using Bad = kvpack::Calibrated<kvpack::KVCache<kvpack::Keys<kvpack::Fp8E4M3Unscaled>, kvpack::Values<kvpack::Fp8E4M3Unscaled>, kvpack::PreRope<>>,
                               kvpack::Calibrate<kvpack::PerChannelScale>>;
int main() { return Bad::create({}).has_value() ? 0 : 1; }
