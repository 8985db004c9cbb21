// expect: kvpack::Backend<Avx2>: this translation unit is not compiled for AVX2 + FMA + F16C
// Forcing a backend the translation unit is not compiled for fails with a readable message
// (KVPACK_DISABLE_SIMD makes AVX2 unavailable on every host).
#define KVPACK_DISABLE_SIMD 1
#include <kvpack/kvpack.hpp>
using Bad = kvpack::KVCache<kvpack::Keys<kvpack::Int4<>>, kvpack::Backend<kvpack::Avx2>>;
int main() { return Bad::create({}).has_value() ? 0 : 1; }
