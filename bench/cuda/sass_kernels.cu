// The decode kernels whose registers, spills and hot-loop instructions bench/cuda/sass_budget.py
// reports (compiled to a cubin for sm_90, never run): K and V the same codec as kvpack's defaults
// (Int4<> = asymmetric g32 fp16, Int8<> = symmetric g32 fp16, Fp8E4M3<>, Fp8E5M2<>), Blocks<64>,
// head_dim 128, 4 query heads per CTA (GQA group 4). Also linked by the bench/cuda/*.cu glob
// (kvpack_cuda_all), which checks that it builds; running it does nothing.
#include "kvpack/kernels/cuda/decode_kernel.cuh"
#include "kvpack/kvpack.hpp"

namespace kc = kvpack::cuda;
template __global__ void kc::decode_split_kernel<kvpack::Int4<>, kvpack::Int4<>, 64, 128, 4>(const kc::DecodeArgs);
template __global__ void kc::decode_split_kernel<kvpack::Int8<>, kvpack::Int8<>, 64, 128, 4>(const kc::DecodeArgs);
template __global__ void kc::decode_split_kernel<kvpack::Fp8E4M3<>, kvpack::Fp8E4M3<>, 64, 128, 4>(const kc::DecodeArgs);
template __global__ void kc::decode_split_kernel<kvpack::Fp8E5M2<>, kvpack::Fp8E5M2<>, 64, 128, 4>(const kc::DecodeArgs);

// bench/CMakeLists.txt links every bench/cuda/*.cu as an executable; this one only exists to be
// disassembled, so its main does nothing.
int main() { return 0; }
