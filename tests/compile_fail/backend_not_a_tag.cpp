// expect: kvpack::Backend<Tag>: Tag must be kvpack::Auto, kvpack::Scalar, kvpack::Avx2, kvpack::Neon or kvpack::Cuda
#include <kvpack/kvpack.hpp>
struct MyKernel {};
using Bad = kvpack::KVCache<kvpack::Keys<kvpack::Int4<>>, kvpack::Backend<MyKernel>>;
int main() { return Bad::create({}).has_value() ? 0 : 1; }
