// kvpack::cuda::DeviceCache<HostCache>: quantized KV blocks of one sequence in device memory,
// with the device quantizer (append), split-K flash-decoding (decode), upload from and byte-wise
// comparison with a host KVCache. Every CUDA call is checked; errors come back as kvpack::Status /
// kvpack::Result (include/kvpack/result.hpp), never as exceptions.
//
// Error mapping (CUDA has no kvpack category of its own):
//   no device / no driver / unsupported architecture  -> Errc::unsupported
//   out of device memory                              -> Errc::capacity_exceeded
//   any other CUDA error                              -> Errc::io_error
// The message names the failing call and cudaGetErrorName / cudaGetErrorString of the error.
//
// Status: compiles with nvcc 13 for sm_80 / sm_90 + PTX, warning-free; tested on the host where
// possible (tests/test_cuda_helpers.cpp); the device tests (tests/cuda/) and the benchmark
// (bench/cuda/) have NOT yet run on a GPU (see README "CUDA").
#pragma once

#if !defined(__CUDACC__)
#error "kernels/cuda/device_cache.cuh launches CUDA kernels: compile it with nvcc"
#endif

#include <cuda_runtime.h>

#include <algorithm>
#include <cmath>
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <memory>
#include <span>
#include <string>
#include <utility>
#include <vector>

#include "cuda/attention.cuh"
#include "kvpack/cache/block.hpp"
#include "kvpack/kv_cache.hpp"
#include "kvpack/result.hpp"

namespace kvpack::cuda {

/// Error for a failed CUDA call `what` (see the mapping above).
[[nodiscard]] inline Error cuda_error(cudaError_t e, const std::string& what) {
  const Errc code = (e == cudaErrorNoDevice || e == cudaErrorInsufficientDriver || e == cudaErrorNoKernelImageForDevice)
                        ? Errc::unsupported
                        : (e == cudaErrorMemoryAllocation ? Errc::capacity_exceeded : Errc::io_error);
  return fail(code, "CUDA: " + what + " failed: " + cudaGetErrorName(e) + " (" + cudaGetErrorString(e) + ")");
}

/// Returns the Status of a CUDA call from the enclosing function when it fails.
#define KVPACK_CUDA_TRY(call)                                                          \
  do {                                                                                 \
    const cudaError_t kvpack_cuda_err_ = (call);                                       \
    if (kvpack_cuda_err_ != cudaSuccess) return ::kvpack::cuda::cuda_error(kvpack_cuda_err_, #call); \
  } while (0)

/// Owning device allocation (cudaFree on destruction; errors there cannot be reported).
struct DeviceFree {
  void operator()(void* p) const noexcept { (void)cudaFree(p); }
};
using DeviceBuffer = std::unique_ptr<void, DeviceFree>;

/// Allocates `bytes` of device memory, zeroed.
[[nodiscard]] inline Result<DeviceBuffer> device_alloc(std::size_t bytes, const std::string& what) {
  void* p = nullptr;
  if (const cudaError_t e = cudaMalloc(&p, bytes == 0 ? 1 : bytes); e != cudaSuccess)
    return cuda_error(e, "cudaMalloc(" + std::to_string(bytes) + " bytes) for " + what);
  DeviceBuffer buf(p);
  if (const cudaError_t e = cudaMemset(p, 0, bytes == 0 ? 1 : bytes); e != cudaSuccess)
    return cuda_error(e, "cudaMemset for " + what);
  return Result<DeviceBuffer>(std::move(buf));
}

/// Options of one decode call.
struct DecodeOptions {
  int splits = 0;  ///< split-K partitions per KV head; 0 = automatic (about 4 CTAs per SM in all)
};

/// Device-resident quantized blocks of one sequence, all layers, in the layout of the host cache
/// type HostCache = KVCache<Policies...> (same key/value codecs, Blocks<B>, head_dim), so blocks
/// move between host and device as plain bytes.
///
/// Memory: per layer and KV head ceil(max_tokens / B) block slots of BlockLayout::bytes (rounded
/// up to 256) plus (B + 63) / 64 validity words each, allocated and zeroed by create().
/// The device cache holds quantized tokens only: every token appended is quantized at once (no
/// sinks or residual window on the device); full-precision rows (sinks, residual window, current
/// token) are passed to decode() as DeviceRows and read exactly.
///
/// Requirements (compile time): grouped codecs for K and V (Int8, Int4, Fp8E4M3, Fp8E5M2),
/// per-token keys. Run time (create): head_dim a multiple of 8 and <= 256; GQA group <= 8.
/// Thread safety: none; all work is queued on one stream (the default stream unless given).
template <class HostCache>
class DeviceCache {
 public:
  using key_codec = typename HostCache::key_codec;
  using value_codec = typename HostCache::value_codec;
  static constexpr int block_tokens = HostCache::block_tokens;
  static_assert(DeviceCodec<key_codec>::supported && DeviceCodec<value_codec>::supported,
                "kvpack::cuda::DeviceCache: the CUDA kernels need grouped codecs for K and V "
                "(Int8<>, Int4<>, Fp8E4M3<>, Fp8E5M2<>); Fp32/Fp16 caches stay on the host");
  static_assert(!HostCache::keys_per_channel,
                "kvpack::cuda::DeviceCache: per-channel keys (Keys<Codec, PerChannel>) are not implemented on the "
                "device; use per-token keys");

  /// Allocates the blocks for `shape` on the current device. Errors: invalid shapes
  /// (Errc::invalid_argument, as KVCache::create, plus head_dim % 8 and <= 256, group <= 8 ->
  /// Errc::unsupported), CUDA errors (see the mapping at the top of this file).
  [[nodiscard]] static Result<DeviceCache> create(const ModelShape& shape, cudaStream_t stream = nullptr) {
    auto host_check = HostCache::create(ModelShape{shape.layers, shape.q_heads, shape.kv_heads, shape.head_dim, 1,
                                                   shape.attn_scale});
    if (!host_check) return host_check.error();
    if (shape.max_tokens <= 0 || shape.max_tokens > 0x7FFFFFFF)
      return fail(Errc::invalid_argument, "DeviceCache::create: max_tokens must be in [1, 2^31 - 1]");
    if (shape.head_dim % kChunk != 0 || shape.head_dim > kMaxHeadDim)
      return fail(Errc::unsupported, "DeviceCache::create: the CUDA kernels need head_dim % 8 == 0 and <= 256, not " +
                                         std::to_string(shape.head_dim));
    if (shape.q_heads / shape.kv_heads > kMaxGroup)
      return fail(Errc::unsupported, "DeviceCache::create: GQA group " + std::to_string(shape.q_heads / shape.kv_heads) +
                                         " exceeds the CUDA kernels' maximum of 8 query heads per KV head");
    DeviceCache c;
    c.shape_ = shape;
    c.stream_ = stream;
    c.layout_ = make_block_layout<key_codec, value_codec, false>(block_tokens, shape.head_dim);
    c.stride_ = static_cast<std::int64_t>((c.layout_.bytes + 255) / 256 * 256);
    c.max_blocks_ = static_cast<int>((shape.max_tokens + block_tokens - 1) / block_tokens);
    c.words_ = (block_tokens + 63) / 64;
    int dev = 0;
    KVPACK_CUDA_TRY(cudaGetDevice(&dev));
    KVPACK_CUDA_TRY(cudaDeviceGetAttribute(&c.sms_, cudaDevAttrMultiProcessorCount, dev));
    const auto slots = static_cast<std::size_t>(shape.layers) * static_cast<std::size_t>(shape.kv_heads) *
                       static_cast<std::size_t>(c.max_blocks_);
    auto data = device_alloc(slots * static_cast<std::size_t>(c.stride_), "DeviceCache blocks");
    if (!data) return data.error();
    auto valid = device_alloc(slots * static_cast<std::size_t>(c.words_) * sizeof(std::uint64_t), "DeviceCache masks");
    if (!valid) return valid.error();
    auto first = device_alloc(sizeof(unsigned long long), "DeviceCache scratch");
    if (!first) return first.error();
    c.data_ = std::move(*data);
    c.valid_ = std::move(*valid);
    c.first_bad_ = std::move(*first);
    c.tokens_.assign(static_cast<std::size_t>(shape.layers), 0);
    return Result<DeviceCache>(std::move(c));
  }

  DeviceCache(DeviceCache&&) noexcept = default;
  DeviceCache& operator=(DeviceCache&&) noexcept = default;
  DeviceCache(const DeviceCache&) = delete;
  DeviceCache& operator=(const DeviceCache&) = delete;
  ~DeviceCache() = default;

  /// Replaces every layer's blocks by the host cache's quantized blocks (bytes copied as they are;
  /// sinks and pending rows of the host cache are not blocks and are not copied). The host cache
  /// must have this shape and no eviction policy (its slot masks are private). Synchronous.
  Status upload(const HostCache& host) {
    static_assert(!HostCache::evicts, "DeviceCache::upload: eviction caches keep private slot masks; use set_valid");
    const ModelShape& hs = host.shape();
    if (hs.layers != shape_.layers || hs.kv_heads != shape_.kv_heads || hs.q_heads != shape_.q_heads ||
        hs.head_dim != shape_.head_dim)
      return fail(Errc::invalid_argument, "DeviceCache::upload: the host cache has another shape");
    std::vector<std::uint64_t> words(static_cast<std::size_t>(shape_.kv_heads) * static_cast<std::size_t>(max_blocks_) *
                                     static_cast<std::size_t>(words_));
    for (int l = 0; l < shape_.layers; ++l) {
      std::fill(words.begin(), words.end(), 0);
      KVPACK_CUDA_TRY(cudaMemsetAsync(layer_data(l), 0, layer_bytes(), stream_));
      std::int64_t n_tokens = 0;
      for (int h = 0; h < shape_.kv_heads; ++h) {
        const std::span<const Block> blocks = host.blocks(l, h);
        if (blocks.size() > static_cast<std::size_t>(max_blocks_))
          return fail(Errc::capacity_exceeded, "DeviceCache::upload: layer " + std::to_string(l) + " holds " +
                                                   std::to_string(blocks.size()) + " blocks, more than " +
                                                   std::to_string(max_blocks_));
        std::int64_t head_tokens = 0;
        for (std::size_t b = 0; b < blocks.size(); ++b) {
          KVPACK_CUDA_TRY(cudaMemcpyAsync(block_ptr(l, h, static_cast<int>(b)), blocks[b].data.get(), layout_.bytes,
                                          cudaMemcpyHostToDevice, stream_));
          const int count = blocks[b].header.count;
          for (int t = 0; t < count; ++t)
            words[(static_cast<std::size_t>(h) * static_cast<std::size_t>(max_blocks_) + b) * static_cast<std::size_t>(words_) +
                  static_cast<std::size_t>(t / 64)] |= std::uint64_t{1} << (t % 64);
          head_tokens = static_cast<std::int64_t>(b) * block_tokens + count;
        }
        n_tokens = std::max(n_tokens, head_tokens);
      }
      KVPACK_CUDA_TRY(cudaMemcpyAsync(layer_valid(l), words.data(), words.size() * sizeof(std::uint64_t),
                                      cudaMemcpyHostToDevice, stream_));
      tokens_[static_cast<std::size_t>(l)] = n_tokens;
    }
    KVPACK_CUDA_TRY(cudaStreamSynchronize(stream_));
    return {};
  }

  /// Quantizes n tokens on the device and appends them to `layer`'s blocks (every KV head).
  /// d_k, d_v: device [n][kv_heads][head_dim] fp32 (keys post-RoPE); d_positions: device [n] int32.
  /// Codes and metadata are bit-identical to the host KVCache's (CASES C4, C12).
  /// Errors, nothing written: layer out of range or null buffers (invalid_argument), more than
  /// max_tokens (capacity_exceeded), NaN/Inf in K or V (non_finite, naming layer, KV head, token
  /// and channel). Synchronises once (to read the finiteness check).
  Status append(int layer, const float* d_k, const float* d_v, const std::int32_t* d_positions, std::int64_t n) {
    if (layer < 0 || layer >= shape_.layers)
      return fail(Errc::invalid_argument, "DeviceCache::append: layer " + std::to_string(layer) + " out of range");
    if (n < 0 || (n > 0 && (!d_k || !d_v || !d_positions)))
      return fail(Errc::invalid_argument, "DeviceCache::append: n must be >= 0 and the buffers non-null");
    if (n == 0) return {};
    const std::int64_t first = tokens_[static_cast<std::size_t>(layer)];
    if (first + n > static_cast<std::int64_t>(max_blocks_) * block_tokens || first + n > shape_.max_tokens)
      return fail(Errc::capacity_exceeded, "DeviceCache::append: layer " + std::to_string(layer) + " holds " +
                                               std::to_string(first) + " tokens; " + std::to_string(n) +
                                               " more exceed max_tokens = " + std::to_string(shape_.max_tokens));
    const std::int64_t floats = n * shape_.kv_heads * shape_.head_dim;
    for (int which = 0; which < 2; ++which) {
      const float* x = which == 0 ? d_k : d_v;
      auto* flag = static_cast<unsigned long long*>(first_bad_.get());
      KVPACK_CUDA_TRY(cudaMemsetAsync(flag, 0xFF, sizeof(unsigned long long), stream_));
      first_non_finite_kernel<><<<grid_for(floats), 256, 0, stream_>>>(x, floats, flag);
      KVPACK_CUDA_TRY(cudaGetLastError());
      unsigned long long bad = 0;
      KVPACK_CUDA_TRY(cudaMemcpyAsync(&bad, flag, sizeof bad, cudaMemcpyDeviceToHost, stream_));
      KVPACK_CUDA_TRY(cudaStreamSynchronize(stream_));
      if (bad != ~0ull) {
        const auto row = static_cast<unsigned long long>(shape_.kv_heads) * static_cast<unsigned long long>(shape_.head_dim);
        const auto D = static_cast<unsigned long long>(shape_.head_dim);
        return fail(Errc::non_finite, std::string("DeviceCache::append: non-finite ") + (which == 0 ? "K" : "V") +
                                          " value at layer " + std::to_string(layer) + ", kv head " +
                                          std::to_string((bad % row) / D) + ", token " + std::to_string(bad / row) +
                                          " of the chunk, channel " + std::to_string(bad % D) +
                                          "; nothing was appended");
      }
    }
    AppendArgs a;
    a.blocks = device_blocks(layer);
    a.k = d_k;
    a.v = d_v;
    a.positions = d_positions;
    a.n = n;
    a.first_slot = first;
    a.kv_heads = shape_.kv_heads;
    a.head_dim = shape_.head_dim;
    const std::int64_t threads =
        n * shape_.kv_heads *
        (shape_.head_dim / DeviceCodec<key_codec>::group + shape_.head_dim / DeviceCodec<value_codec>::group);
    append_kernel<key_codec, value_codec, block_tokens><<<grid_for(threads), 256, 0, stream_>>>(a);
    KVPACK_CUDA_TRY(cudaGetLastError());
    tokens_[static_cast<std::size_t>(layer)] = first + n;
    return {};
  }

  /// Decode attention of one query token over `layer`: the quantized blocks (slots whose validity
  /// bit is set) and then `exact` fp32 rows, all visible to the query. d_q, d_out: device
  /// [q_heads][head_dim] fp32; query head i uses KV head i / (q_heads / kv_heads). Softmax scale:
  /// shape.attn_scale, or 1/sqrt(head_dim) when 0. A query that sees no key gets zeros.
  /// Asynchronous (queued on the stream); launch errors are reported, execution errors by the
  /// next synchronising call (synchronize()).
  Status decode(int layer, const float* d_q, float* d_out, const DeviceRows& exact = {}, DecodeOptions opt = {}) {
    if (layer < 0 || layer >= shape_.layers)
      return fail(Errc::invalid_argument, "DeviceCache::decode: layer " + std::to_string(layer) + " out of range");
    if (!d_q || !d_out || exact.count < 0 || (exact.count > 0 && (!exact.k || !exact.v)))
      return fail(Errc::invalid_argument, "DeviceCache::decode: null buffer or negative exact row count");
    const int group = shape_.q_heads / shape_.kv_heads;
    DecodeArgs a;
    a.blocks = device_blocks(layer);
    a.n_blocks = blocks_in_use(layer);
    a.exact = exact;
    if (a.exact.count > 0 && a.exact.stride == 0) a.exact.stride = static_cast<std::int64_t>(shape_.kv_heads) * shape_.head_dim;
    a.q = d_q;
    a.head_dim = shape_.head_dim;
    a.group = group;
    a.kv_heads = shape_.kv_heads;
    a.scale = shape_.attn_scale > 0.f ? shape_.attn_scale : 1.f / std::sqrt(static_cast<float>(shape_.head_dim));
    const int units = a.n_blocks + (a.exact.count + block_tokens - 1) / block_tokens;
    const int splits = split_count(units, opt.splits);
    a.tiles_per_split = units == 0 ? 0 : (units + splits - 1) / splits;
    a.n_splits = units == 0 ? 1 : (units + a.tiles_per_split - 1) / a.tiles_per_split;
    const auto need = static_cast<std::size_t>(shape_.q_heads) * static_cast<std::size_t>(a.n_splits) *
                      static_cast<std::size_t>(shape_.head_dim + 2);
    if (need > work_floats_) {
      auto w = device_alloc(need * sizeof(float), "DeviceCache decode partials");
      if (!w) return w.error();
      work_ = std::move(*w);
      work_floats_ = need;
    }
    auto* base = static_cast<float*>(work_.get());
    const std::size_t heads_splits = static_cast<std::size_t>(shape_.q_heads) * static_cast<std::size_t>(a.n_splits);
    a.part_m = base;
    a.part_l = base + heads_splits;
    a.part_acc = base + 2 * heads_splits;
    last_splits_ = a.n_splits;
    a.tile_bytes = static_cast<int>((layout_.positions + 15) / 16 * 16);
    const dim3 grid(static_cast<unsigned>(shape_.kv_heads), static_cast<unsigned>(a.n_splits));
    Status launched = group <= 1   ? launch_decode<1>(a, grid)
                      : group <= 2 ? launch_decode<2>(a, grid)
                      : group <= 4 ? launch_decode<4>(a, grid)
                                   : launch_decode<8>(a, grid);
    if (!launched) return launched;
    decode_combine_kernel<><<<static_cast<unsigned>(shape_.q_heads), 128, 0, stream_>>>(
        a.part_m, a.part_l, a.part_acc, a.n_splits, shape_.head_dim, d_out);
    KVPACK_CUDA_TRY(cudaGetLastError());
    return {};
  }

  /// Sets the validity words of one block (eviction masks): slot t is attended iff bit t % 64 of
  /// words[t / 64] is set. words.size() must be (B + 63) / 64. Synchronous.
  Status set_valid(int layer, int kv_head, int block, std::span<const std::uint64_t> words) {
    if (!in_range(layer, kv_head, block) || words.size() != static_cast<std::size_t>(words_))
      return fail(Errc::invalid_argument, "DeviceCache::set_valid: layer, kv_head, block or word count out of range");
    KVPACK_CUDA_TRY(cudaMemcpyAsync(valid_ptr(layer, kv_head, block), words.data(), words.size() * sizeof(std::uint64_t),
                                    cudaMemcpyHostToDevice, stream_));
    KVPACK_CUDA_TRY(cudaStreamSynchronize(stream_));
    return {};
  }

  /// Copy of one block's payload (BlockLayout::bytes bytes). Synchronous.
  [[nodiscard]] Result<std::vector<std::byte>> block_bytes(int layer, int kv_head, int block) const {
    if (!in_range(layer, kv_head, block))
      return fail(Errc::invalid_argument, "DeviceCache::block_bytes: layer, kv_head or block out of range");
    std::vector<std::byte> out(layout_.bytes);
    KVPACK_CUDA_TRY(cudaMemcpyAsync(out.data(), block_ptr(layer, kv_head, block), out.size(), cudaMemcpyDeviceToHost,
                                    stream_));
    KVPACK_CUDA_TRY(cudaStreamSynchronize(stream_));
    return out;
  }

  /// Compares every block with the host cache's, byte for byte (codes, metadata, positions, and
  /// unused slots, which are zero on both sides), and the validity masks with the host's token
  /// counts. OK when identical; Errc::corrupt_data naming the first difference otherwise.
  /// Synchronous.
  [[nodiscard]] Status compare(const HostCache& host) const {
    static_assert(!HostCache::evicts, "DeviceCache::compare: eviction caches keep private slot masks");
    if (Status s = synchronize_const(); !s) return s;
    for (int l = 0; l < shape_.layers; ++l) {
      for (int h = 0; h < shape_.kv_heads; ++h) {
        const std::span<const Block> blocks = host.blocks(l, h);
        if (static_cast<int>(blocks.size()) != blocks_in_use(l))
          return fail(Errc::corrupt_data, "DeviceCache::compare: layer " + std::to_string(l) + " kv head " +
                                              std::to_string(h) + ": host has " + std::to_string(blocks.size()) +
                                              " blocks, device " + std::to_string(blocks_in_use(l)));
        std::vector<std::uint64_t> words(static_cast<std::size_t>(words_));
        for (std::size_t b = 0; b < blocks.size(); ++b) {
          auto bytes = block_bytes(l, h, static_cast<int>(b));
          if (!bytes) return bytes.error();
          for (std::size_t i = 0; i < layout_.bytes; ++i)
            if ((*bytes)[i] != blocks[b].data[i])
              return fail(Errc::corrupt_data, "DeviceCache::compare: layer " + std::to_string(l) + " kv head " +
                                                  std::to_string(h) + " block " + std::to_string(b) + " byte " +
                                                  std::to_string(i) + " (" + section(i) + ") differs: host " +
                                                  std::to_string(static_cast<int>(blocks[b].data[i])) + ", device " +
                                                  std::to_string(static_cast<int>((*bytes)[i])));
          KVPACK_CUDA_TRY(cudaMemcpy(words.data(), valid_ptr(l, h, static_cast<int>(b)),
                                     words.size() * sizeof(std::uint64_t), cudaMemcpyDeviceToHost));
          for (int t = 0; t < block_tokens; ++t) {
            const bool dev = (words[static_cast<std::size_t>(t / 64)] >> (t % 64)) & 1u;
            if (dev != (t < blocks[b].header.count))
              return fail(Errc::corrupt_data, "DeviceCache::compare: layer " + std::to_string(l) + " kv head " +
                                                  std::to_string(h) + " block " + std::to_string(b) + " slot " +
                                                  std::to_string(t) + ": validity bit differs from the host count");
          }
        }
      }
    }
    return {};
  }

  /// Waits for all queued work; reports asynchronous kernel errors.
  Status synchronize() { return synchronize_const(); }

  /// Tokens stored in `layer`'s blocks (0 for an out-of-range layer).
  [[nodiscard]] std::int64_t tokens(int layer) const noexcept {
    return layer >= 0 && layer < shape_.layers ? tokens_[static_cast<std::size_t>(layer)] : 0;
  }
  /// Block slots in use per KV head of `layer`: ceil(tokens / B).
  [[nodiscard]] int blocks_in_use(int layer) const noexcept {
    return static_cast<int>((tokens(layer) + block_tokens - 1) / block_tokens);
  }
  /// Split-K partitions of the last decode call.
  [[nodiscard]] int last_splits() const noexcept { return last_splits_; }
  /// Bytes the decode kernel reads from `layer`'s blocks (codes and metadata of K and V of every
  /// slot in use, all KV heads; positions are not read), for bandwidth figures.
  [[nodiscard]] std::size_t decode_read_bytes(int layer) const noexcept {
    const std::size_t per_token = layout_.k_row + layout_.k_meta_token + layout_.v_row + layout_.v_meta_token;
    return static_cast<std::size_t>(tokens(layer)) * per_token * static_cast<std::size_t>(shape_.kv_heads);
  }
  /// Device bytes allocated for blocks and masks (all layers).
  [[nodiscard]] std::size_t device_bytes() const noexcept {
    return static_cast<std::size_t>(shape_.layers) * (layer_bytes() + layer_words() * sizeof(std::uint64_t));
  }
  [[nodiscard]] const BlockLayout& layout() const noexcept { return layout_; }
  [[nodiscard]] const ModelShape& shape() const noexcept { return shape_; }
  [[nodiscard]] cudaStream_t stream() const noexcept { return stream_; }

 private:
  DeviceCache() = default;

  // Launches the split pass with GMAX >= group; 2 staged blocks of dynamic shared memory (the
  // opt-in above 48 KiB is requested once per kernel instantiation and size).
  template <int GMAX>
  Status launch_decode(const DecodeArgs& a, dim3 grid) {
    auto* kernel = &decode_split_kernel<key_codec, value_codec, block_tokens, GMAX>;
    const auto dyn = static_cast<std::size_t>(2 * a.tile_bytes);
    static std::size_t configured = 0;
    if (dyn > configured) {
      KVPACK_CUDA_TRY(cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, static_cast<int>(dyn)));
      configured = dyn;
    }
    kernel<<<grid, kDecodeThreads, dyn, stream_>>>(a);
    KVPACK_CUDA_TRY(cudaGetLastError());
    return {};
  }

  [[nodiscard]] Status synchronize_const() const {
    KVPACK_CUDA_TRY(cudaStreamSynchronize(stream_));
    KVPACK_CUDA_TRY(cudaGetLastError());
    return {};
  }
  [[nodiscard]] std::size_t layer_bytes() const noexcept {
    return static_cast<std::size_t>(shape_.kv_heads) * static_cast<std::size_t>(max_blocks_) * static_cast<std::size_t>(stride_);
  }
  [[nodiscard]] std::size_t layer_words() const noexcept {
    return static_cast<std::size_t>(shape_.kv_heads) * static_cast<std::size_t>(max_blocks_) * static_cast<std::size_t>(words_);
  }
  [[nodiscard]] std::uint8_t* layer_data(int l) const noexcept {
    return static_cast<std::uint8_t*>(data_.get()) + static_cast<std::size_t>(l) * layer_bytes();
  }
  [[nodiscard]] std::uint64_t* layer_valid(int l) const noexcept {
    return static_cast<std::uint64_t*>(valid_.get()) + static_cast<std::size_t>(l) * layer_words();
  }
  [[nodiscard]] std::uint8_t* block_ptr(int l, int h, int b) const noexcept {
    return layer_data(l) + (static_cast<std::size_t>(h) * static_cast<std::size_t>(max_blocks_) + static_cast<std::size_t>(b)) *
                               static_cast<std::size_t>(stride_);
  }
  [[nodiscard]] std::uint64_t* valid_ptr(int l, int h, int b) const noexcept {
    return layer_valid(l) + (static_cast<std::size_t>(h) * static_cast<std::size_t>(max_blocks_) + static_cast<std::size_t>(b)) *
                                static_cast<std::size_t>(words_);
  }
  [[nodiscard]] bool in_range(int l, int h, int b) const noexcept {
    return l >= 0 && l < shape_.layers && h >= 0 && h < shape_.kv_heads && b >= 0 && b < max_blocks_;
  }
  [[nodiscard]] DeviceBlocks device_blocks(int l) const noexcept {
    DeviceBlocks d;
    d.data = layer_data(l);
    d.valid = layer_valid(l);
    d.block_stride = stride_;
    d.max_blocks = max_blocks_;
    d.words = words_;
    d.k_codes = static_cast<std::int64_t>(layout_.k_codes);
    d.k_meta = static_cast<std::int64_t>(layout_.k_meta);
    d.v_codes = static_cast<std::int64_t>(layout_.v_codes);
    d.v_meta = static_cast<std::int64_t>(layout_.v_meta);
    d.positions = static_cast<std::int64_t>(layout_.positions);
    d.k_row = static_cast<std::int64_t>(layout_.k_row);
    d.v_row = static_cast<std::int64_t>(layout_.v_row);
    d.k_meta_token = static_cast<std::int64_t>(layout_.k_meta_token);
    d.v_meta_token = static_cast<std::int64_t>(layout_.v_meta_token);
    return d;
  }
  [[nodiscard]] int split_count(int units, int requested) const noexcept {
    if (units <= 0) return 1;
    int s = requested > 0 ? requested : (4 * sms_ + shape_.kv_heads - 1) / shape_.kv_heads;
    return std::clamp(s, 1, units);
  }
  [[nodiscard]] static unsigned grid_for(std::int64_t threads) noexcept {
    return static_cast<unsigned>(std::clamp<std::int64_t>((threads + 255) / 256, 1, 65535));
  }
  [[nodiscard]] const char* section(std::size_t i) const noexcept {
    return i < layout_.k_meta ? "K codes"
           : i < layout_.v_codes ? "K metadata"
           : i < layout_.v_meta ? "V codes"
           : i < layout_.positions ? "V metadata"
                                   : "positions";
  }

  ModelShape shape_;
  BlockLayout layout_;
  cudaStream_t stream_ = nullptr;
  std::int64_t stride_ = 0;
  int max_blocks_ = 0, words_ = 0, sms_ = 1, last_splits_ = 0;
  DeviceBuffer data_, valid_, first_bad_, work_;
  std::size_t work_floats_ = 0;
  std::vector<std::int64_t> tokens_;
};

}  // namespace kvpack::cuda
