// kvpack::cuda::DeviceCache<HostCache>: quantized KV blocks of one sequence in device memory,
// with the device quantizer (append), split-K flash-decoding (decode), upload from and byte-wise
// comparison with a host KVCache. Every CUDA call is checked; errors come back as kvpack::Status /
// kvpack::Result (include/kvpack/result.hpp), never as exceptions (mapping: device_memory.cuh).
//
// Ordering contract (what makes a decode step capturable in a CUDA graph):
//  * create() allocates everything, including the decode scratch for the largest split count the
//    shape allows; append() and decode() then only ENQUEUE work on the cache's stream: no host
//    synchronisation, no allocation, no host-side wait for a result.
//  * Token counts live in device memory: append's kernels read and advance them, decode reads
//    them. Work is ordered by the stream; the caller orders other streams with events.
//  * Errors found on the device (NaN/Inf in K or V, capacity) are recorded in device memory and
//    are sticky, like a CUDA error: the failing append and every later append write nothing
//    until check() reads, reports and clears the error (as cudaGetLastError). Launch errors are
//    returned at once. tokens() is the host's count of what was enqueued; check() replaces it by
//    the device's.
//  * In a captured graph the launch parameters are frozen: pass DecodeOptions::splits (a fixed
//    grid) and the same buffers each replay; the token counts are read on the device.
//  * upload(), set_valid(), block_bytes(), compare() and check() synchronise (host buffers).
//
// Pre-RoPE keys (HostCache with PreRope<OriginalPositions>, policy.hpp): keys are appended and
// stored before RoPE, as on the host; decode takes the query before RoPE with its position (a
// device int32, so the step stays capturable) and the exact rows with theirs (DeviceRows::pos),
// and rope_decode_kernel.cuh rotates each dequantized key at its stored position and the query at
// its own, from a cos/sin table in device memory for positions [0, max_tokens) (device_rope.cuh).
// Positions outside the table are errors (append/upload: invalid_argument; decode: recorded for
// check()). PreRope<CacheRelative> is refused at compile time: its positions are ranks among the
// held tokens after eviction, and the device cache has no eviction.
//
// Status: nvcc 13, sm_80 / sm_90 + PTX, warning-free. Host-side plan, mapping, unpacking, RoPE and
// Hadamard helpers are tested on the host (tests/test_cuda_*helpers.cpp); tests/cuda/ and bench/cuda/
// have NOT yet run on a GPU (README "CUDA"). Rotated caches: device_rotated.cuh (DeviceRotated).
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

#include "kvpack/kernels/cuda/attention.cuh"
#include "kvpack/kernels/cuda/decode_launch.cuh"
#include "kvpack/kernels/cuda/decode_plan.cuh"
#include "kvpack/kernels/cuda/device_memory.cuh"
#include "kvpack/kernels/cuda/device_rope.cuh"
#include "kvpack/cache/block.hpp"
#include "kvpack/kv_cache.hpp"
#include "kvpack/result.hpp"

namespace kvpack::cuda {

template <class HostCache>
class DeviceCache;
/// Byte-wise comparison of a DeviceCache with a host cache (kernels/cuda/device_compare.cuh).
template <class HostCache>
Status compare_device_blocks(const DeviceCache<HostCache>& dev, const HostCache& host);

/// Options of one decode call.
struct DecodeOptions {
  /// Split-K partitions per KV head; 0 = automatic (about 4 CTAs per SM in all). Clamped to
  /// max_splits() (the scratch sized at create). Fix it for CUDA-graph replay.
  int splits = 0;
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
/// Requirements (compile time): grouped codecs for K and V (Int8, Int4, Fp8E4M3, Fp8E5M2), per-token
/// keys, PostRope or PreRope<OriginalPositions> (file comment; rotated caches: DeviceRotated). Run time
/// (create): head_dim 64, 128 or 256; GQA group <= 16; decode_smem_for within the per-block limit.
/// Thread safety: none per object; all work is queued on one stream of one device, both fixed at
/// create(). Objects on different threads or devices are independent.
template <class HostCache>
class DeviceCache {
 public:
  using key_codec = typename HostCache::key_codec;
  using value_codec = typename HostCache::value_codec;
  static constexpr int block_tokens = HostCache::block_tokens;
  static_assert(DeviceCodec<key_codec>::supported && DeviceCodec<value_codec>::supported,
                "kvpack::cuda::DeviceCache: the CUDA kernels need grouped codecs for K and V "
                "(Int8<>, Int4<>, Fp8E4M3<>, Fp8E5M2<>); Fp32/Fp16, INT3/INT2 and NF4 caches stay on the host");
  /// PreRope<OriginalPositions>: keys stored before RoPE, rotated by the decode kernel.
  static constexpr bool pre_rope = takes_pre_rope_v<HostCache>;
  static_assert(!pre_rope || !HostCache::rope_cache_relative,
                "kvpack::cuda::DeviceCache: PreRope<CacheRelative> rotates keys at their rank among the tokens "
                "held after eviction, and the device cache has no eviction; use PreRope<OriginalPositions>");
  /// Device blocks end with an int32 position per slot as the host's do, and always with PreRope
  /// (its decode kernel reads them; upload/compare convert the host's per-layer runs).
  static constexpr bool slot_positions = HostCache::slot_positions || pre_rope;
  static_assert(!HostCache::keys_per_channel,
                "kvpack::cuda::DeviceCache: per-channel keys (Keys<Codec, PerChannel>) are not implemented on the "
                "device; use per-token keys");

  /// Shape checks that need no GPU: invalid shapes (Errc::invalid_argument, as KVCache::create),
  /// head_dim not 64/128/256 or group > 16 (Errc::unsupported), and the decode kernel's shared
  /// memory above `smem_limit` bytes (Errc::unsupported; create() passes the device's
  /// cudaDevAttrMaxSharedMemoryPerBlockOptin).
  /// PreRope caches: also the RoPE fields (validate_rope, Errc::invalid_argument); their decode
  /// kernel (rope_decode_kernel.cuh) uses < 48 KiB of static shared memory, which always fits.
  [[nodiscard]] static Status check_shape(const ModelShape& shape, std::size_t smem_limit) {
    ModelShape one = shape;
    one.max_tokens = 1;
    auto host_check = HostCache::create(one);
    if (!host_check) return host_check.error();
    if (shape.max_tokens <= 0 || shape.max_tokens > 0x7FFFFFFF)
      return fail(Errc::invalid_argument, "DeviceCache::create: max_tokens must be in [1, 2^31 - 1]");
    if (!decode_head_dim_supported(shape.head_dim))
      return fail(Errc::unsupported, "DeviceCache::create: the CUDA kernels are compiled for head_dim 64, 128 and "
                                     "256, not " + std::to_string(shape.head_dim));
    const int group = shape.q_heads / shape.kv_heads;
    if (group > kMaxGroup)
      return fail(Errc::unsupported, "DeviceCache::create: GQA group " + std::to_string(group) +
                                         " exceeds the CUDA kernels' maximum of 16 query heads per KV head");
    if constexpr (pre_rope) return {};
    return check_decode_fits(decode_smem_for<HostCache>(shape.head_dim, group).total, smem_limit, block_tokens);
  }

  /// Allocates the blocks, token counts, error state and decode scratch for `shape` on `device`
  /// (-1: the current one), zeroed on `stream`, where all later work is queued; PreRope caches
  /// also their RoPE table (device_rope.cuh; synchronous). Errors: those of check_shape and
  /// DeviceRopeTable::create, and CUDA errors (see device_memory.cuh).
  [[nodiscard]] static Result<DeviceCache> create(const ModelShape& shape, cudaStream_t stream = nullptr,
                                                  int device = -1) {
    if (device < 0) KVPACK_CUDA_TRY(cudaGetDevice(&device));
    KVPACK_CUDA_ON_DEVICE(device);
    int smem_limit = 0;
    KVPACK_CUDA_TRY(cudaDeviceGetAttribute(&smem_limit, cudaDevAttrMaxSharedMemoryPerBlockOptin, device));
    if (Status s = check_shape(shape, static_cast<std::size_t>(smem_limit)); !s) return s.error();
    DeviceCache c;
    c.shape_ = shape;
    c.stream_ = stream;
    c.device_ = device;
    c.layout_ = make_block_layout<key_codec, value_codec, false>(block_tokens, shape.head_dim, slot_positions);
    c.stride_ = static_cast<std::int64_t>((c.layout_.bytes + 255) / 256 * 256);
    c.max_blocks_ = static_cast<int>((shape.max_tokens + block_tokens - 1) / block_tokens);
    c.words_ = (block_tokens + 63) / 64;
    const int group = shape.q_heads / shape.kv_heads;
    c.heads_per_cta_ = decode_heads_per_cta(group);
    c.head_ctas_ = shape.kv_heads * ((group + c.heads_per_cta_ - 1) / c.heads_per_cta_);
    c.smem_ = decode_smem_for<HostCache>(shape.head_dim, group);
    KVPACK_CUDA_TRY(cudaDeviceGetAttribute(&c.sms_, cudaDevAttrMultiProcessorCount, device));
    // Scratch for the most splits any decode may use: every block slot plus up to 4 CTAs per SM.
    c.max_splits_ = std::max(1, std::min(kMaxSplits, std::max(c.max_blocks_, (4 * c.sms_ + c.head_ctas_ - 1) / c.head_ctas_)));
    const auto slots = static_cast<std::size_t>(shape.layers) * static_cast<std::size_t>(shape.kv_heads) *
                       static_cast<std::size_t>(c.max_blocks_);
    const std::size_t work = static_cast<std::size_t>(shape.q_heads) * static_cast<std::size_t>(c.max_splits_) *
                             static_cast<std::size_t>(shape.head_dim + 2) * sizeof(float);
    auto data = device_alloc(slots * static_cast<std::size_t>(c.stride_), stream, "DeviceCache blocks");
    if (!data) return data.error();
    auto valid = device_alloc(slots * static_cast<std::size_t>(c.words_) * sizeof(std::uint64_t), stream, "DeviceCache masks");
    if (!valid) return valid.error();
    auto counts = device_alloc(static_cast<std::size_t>(shape.layers) * sizeof(std::int64_t), stream, "DeviceCache counts");
    if (!counts) return counts.error();
    auto status = device_alloc(sizeof(DeviceStatus), stream, "DeviceCache status");
    if (!status) return status.error();
    auto scratch = device_alloc(work, stream, "DeviceCache decode partials");
    if (!scratch) return scratch.error();
    c.data_ = std::move(*data);
    c.valid_ = std::move(*valid);
    c.counts_ = std::move(*counts);
    c.status_ = std::move(*status);
    c.work_ = std::move(*scratch);
    if constexpr (pre_rope) {
      auto table = DeviceRopeTable::create(shape, stream);
      if (!table) return table.error();
      c.rope_ = std::move(*table);
    }
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
  /// PreRope: the host's RoPE fields must match and its positions lie in [0, max_tokens)
  /// (Errc::invalid_argument, checked before anything changes). (kernels/cuda/device_compare.cuh)
  Status upload(const HostCache& host);

  /// Quantizes n tokens on the device and appends them to `layer`'s blocks (every KV head).
  /// d_k, d_v: device [n][kv_heads][head_dim] fp32 (keys post-RoPE, or pre-RoPE for PreRope
  /// caches); d_positions: device [n] int32 (PreRope: in [0, max_tokens), else reported by check()
  /// as Errc::invalid_argument and nothing appended).
  /// Codes and metadata are bit-identical to the host KVCache's (CASES C4, C12). Enqueue only
  /// (four operations on the stream: reset, NaN/Inf scan, quantizer, count update).
  /// Errors returned at once, nothing enqueued: layer out of range or null buffers
  /// (invalid_argument), more than max_tokens by the host's count (capacity_exceeded).
  /// Errors found on the device, nothing written, reported by check(): NaN/Inf in K or V
  /// (non_finite, naming layer, KV head, token and channel), capacity.
  Status append(int layer, const float* d_k, const float* d_v, const std::int32_t* d_positions, std::int64_t n) {
    if (layer < 0 || layer >= shape_.layers)
      return fail(Errc::invalid_argument, "DeviceCache::append: layer " + std::to_string(layer) + " out of range");
    if (n < 0 || (n > 0 && (!d_k || !d_v || !d_positions)))
      return fail(Errc::invalid_argument, "DeviceCache::append: n must be >= 0 and the buffers non-null");
    if (n == 0) return {};
    const std::int64_t first = tokens_[static_cast<std::size_t>(layer)];
    if (first + n > capacity())
      return fail(Errc::capacity_exceeded, "DeviceCache::append: layer " + std::to_string(layer) + " holds " +
                                               std::to_string(first) + " tokens; " + std::to_string(n) +
                                               " more exceed max_tokens = " + std::to_string(shape_.max_tokens));
    KVPACK_CUDA_ON_DEVICE(device_);
    auto* st = static_cast<DeviceStatus*>(status_.get());
    const std::int64_t floats = n * shape_.kv_heads * shape_.head_dim;
    KVPACK_CUDA_TRY(cudaMemsetAsync(st->first_bad, 0xFF, sizeof st->first_bad, stream_));
    scan_non_finite_kernel<><<<grid_for(2 * floats), 256, 0, stream_>>>(d_k, d_v, floats, st->first_bad);
    KVPACK_CUDA_TRY(cudaGetLastError());
    if constexpr (pre_rope) {
      scan_positions_kernel<><<<grid_for(n), 256, 0, stream_>>>(d_positions, n, rope_.view().positions, st->first_bad + 2);
      KVPACK_CUDA_TRY(cudaGetLastError());
    }
    AppendArgs a;
    a.blocks = device_blocks(layer);
    a.k = d_k;
    a.v = d_v;
    a.positions = d_positions;
    a.n = n;
    a.tokens = device_count(layer);
    a.status = st;
    a.capacity = capacity();
    a.layer = layer;
    a.kv_heads = shape_.kv_heads;
    a.head_dim = shape_.head_dim;
    const std::int64_t threads =
        n * shape_.kv_heads *
        (shape_.head_dim / DeviceCodec<key_codec>::group + shape_.head_dim / DeviceCodec<value_codec>::group);
    append_kernel<key_codec, value_codec, block_tokens><<<grid_for(threads), 256, 0, stream_>>>(a);
    KVPACK_CUDA_TRY(cudaGetLastError());
    commit_tokens_kernel<><<<1, 1, 0, stream_>>>(device_count(layer), st, n);
    KVPACK_CUDA_TRY(cudaGetLastError());
    tokens_[static_cast<std::size_t>(layer)] = first + n;
    return {};
  }

  /// Reads the device's error state and token counts (synchronises the stream). Returns the
  /// first error recorded since the last check (and clears it), else any asynchronous CUDA error;
  /// tokens() then equals the device's counts.
  Status check();


  /// Decode attention of one query token over `layer`: the quantized blocks (slots whose validity
  /// bit is set; token count read on the device) and then `exact` fp32 rows, all visible to the
  /// query. d_q, d_out: device [q_heads][head_dim] fp32; query head i uses KV head
  /// i / (q_heads / kv_heads). Softmax scale: shape.attn_scale, or 1/sqrt(head_dim) when 0. A
  /// query that sees no key gets zeros. Enqueue only (two kernels); launch errors are returned,
  /// execution errors by check(). Errors: layer out of range, null buffers, negative exact count
  /// (Errc::invalid_argument). (PreRope caches: the overload with the query position.)
  Status decode(int layer, const float* d_q, float* d_out, const DeviceRows& exact = {}, DecodeOptions opt = {})
    requires(!pre_rope)
  {
    if (Status s = check_decode(layer, d_q, d_out, exact); !s) return s;
    KVPACK_CUDA_ON_DEVICE(device_);
    // The host's count bounds the device's (an append that fails on the device adds nothing).
    DecodeArgs a = decode_args(layer, d_q, exact, blocks_in_use(layer) + (exact.count + block_tokens - 1) / block_tokens, opt);
    const dim3 grid(static_cast<unsigned>(head_ctas_), static_cast<unsigned>(a.n_splits));
    Status launched = launch_decode_split<key_codec, value_codec, block_tokens>(a, grid, shape_.head_dim, heads_per_cta_,
                                                                                device_, stream_);
    if (!launched) return launched;
    return combine(a, d_out);
  }

  /// Decode attention of one PRE-RoPE query over `layer` of a PreRope cache (the host
  /// KVCache::attend rotates its queries at the positions of the newest appended tokens; here the
  /// position is explicit): as the overload above, with the query rotated at *d_q_pos (device,
  /// one int32, read by the kernel: CUDA-graph friendly) and every key, quantized or exact, at
  /// its own position (stored in the blocks at append; exact.pos, required when exact.count > 0).
  /// Errors returned: those above, d_q_pos or exact.pos null (Errc::invalid_argument). Recorded
  /// for check(): the query's or an exact row's position outside [0, max_tokens)
  /// (Errc::invalid_argument; that decode's output is unspecified, later appends wait for check()).
  Status decode(int layer, const float* d_q, const std::int32_t* d_q_pos, float* d_out, const DeviceRows& exact = {},
                DecodeOptions opt = {})
    requires(pre_rope)
  {
    if (Status s = check_decode(layer, d_q, d_out, exact); !s) return s;
    if (!d_q_pos || (exact.count > 0 && !exact.pos))
      return fail(Errc::invalid_argument, "DeviceCache::decode: PreRope needs the query position and the exact rows' positions");
    KVPACK_CUDA_ON_DEVICE(device_);
    RopeDecodeArgs r;
    r.d = decode_args(layer, d_q, exact, static_cast<int>((tokens(layer) + kRopeTile - 1) / kRopeTile) +
                                              (exact.count + kRopeTile - 1) / kRopeTile, opt);
    r.rope = rope_.view();
    r.q_pos = d_q_pos;
    r.status = static_cast<DeviceStatus*>(status_.get());
    r.layer = layer;
    const dim3 grid(static_cast<unsigned>(head_ctas_), static_cast<unsigned>(r.d.n_splits));
    Status launched = launch_rope_decode<key_codec, value_codec, block_tokens>(r, grid, shape_.head_dim, heads_per_cta_, stream_);
    if (!launched) return launched;
    return combine(r.d, d_out);
  }

 private:
  [[nodiscard]] Status check_decode(int layer, const float* d_q, const float* d_out, const DeviceRows& exact) const;

  /// Launch arguments of a decode over `units` tiles (split plan, scratch pointers).
  [[nodiscard]] DecodeArgs decode_args(int layer, const float* d_q, const DeviceRows& exact, int units, DecodeOptions opt) {
    DecodeArgs a;
    a.blocks = device_blocks(layer);
    a.tokens = device_count(layer);
    a.exact = exact;
    if (a.exact.count > 0 && a.exact.stride == 0) a.exact.stride = static_cast<std::int64_t>(shape_.kv_heads) * shape_.head_dim;
    a.q = d_q;
    a.group = shape_.q_heads / shape_.kv_heads;
    a.kv_heads = shape_.kv_heads;
    a.scale = shape_.attn_scale > 0.f ? shape_.attn_scale : 1.f / std::sqrt(static_cast<float>(shape_.head_dim));
    const SplitPlan plan = plan_splits(units, opt.splits, sms_, head_ctas_, max_splits_);
    a.n_splits = opt.splits > 0 ? std::min(opt.splits, max_splits_) : plan.splits;
    a.smem = smem_;
    auto* base = static_cast<float*>(work_.get());
    const std::size_t heads_splits = static_cast<std::size_t>(shape_.q_heads) * static_cast<std::size_t>(a.n_splits);
    a.part_m = base;
    a.part_l = base + heads_splits;
    a.part_acc = base + 2 * heads_splits;
    last_splits_ = a.n_splits;
    return a;
  }
  Status combine(const DecodeArgs& a, float* d_out) {
    decode_combine_kernel<><<<static_cast<unsigned>(shape_.q_heads), 128, 0, stream_>>>(
        a.part_m, a.part_l, a.part_acc, a.n_splits, shape_.head_dim, d_out);
    KVPACK_CUDA_TRY(cudaGetLastError());
    return {};
  }

 public:

  /// Sets the validity words of one block (eviction masks): slot t is attended iff bit t % 64 of
  /// words[t / 64] is set. words.size() must be (B + 63) / 64. Synchronous.
  Status set_valid(int layer, int kv_head, int block, std::span<const std::uint64_t> words);


  /// Copy of one block's payload (BlockLayout::bytes bytes). Synchronous.
  [[nodiscard]] Result<std::vector<std::byte>> block_bytes(int layer, int kv_head, int block) const;


  /// Compares every block with the host cache's, byte for byte (codes, metadata, positions, and
  /// unused slots, which are zero on both sides), and the validity masks with the host's token
  /// counts. OK when identical; Errc::corrupt_data naming the first difference otherwise; a
  /// pending device error first (check()). Synchronous. (kernels/cuda/device_compare.cuh)
  [[nodiscard]] Status compare(const HostCache& host) {
    static_assert(!HostCache::evicts, "DeviceCache::compare: eviction caches keep private slot masks");
    if (Status s = check(); !s) return s;
    return compare_device_blocks(*this, host);
  }

  /// Copy of one block's validity words ((B + 63) / 64). Synchronous.
  [[nodiscard]] Result<std::vector<std::uint64_t>> valid_words(int layer, int kv_head, int block) const;

  /// Waits for all queued work; reports device-side and asynchronous errors (= check()).
  Status synchronize() { return check(); }

  /// Tokens enqueued into `layer`'s blocks by the host's count (0 for an out-of-range layer); the
  /// device's count after check().
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
  /// Device bytes allocated for blocks and masks (all layers), and the RoPE table (PreRope).
  [[nodiscard]] std::size_t device_bytes() const noexcept {
    return static_cast<std::size_t>(shape_.layers) * (layer_bytes() + layer_words() * sizeof(std::uint64_t)) + rope_.bytes();
  }
  /// The RoPE table the decode kernel reads (PreRope caches; empty otherwise).
  [[nodiscard]] const DeviceRopeTable& rope_table() const noexcept { return rope_; }
  [[nodiscard]] const BlockLayout& layout() const noexcept { return layout_; }
  [[nodiscard]] const ModelShape& shape() const noexcept { return shape_; }
  [[nodiscard]] cudaStream_t stream() const noexcept { return stream_; }
  [[nodiscard]] int device() const noexcept { return device_; }
  /// Largest split count a decode may use (its scratch is allocated by create()).
  [[nodiscard]] int max_splits() const noexcept { return max_splits_; }
  /// The decode kernel's shared-memory layout (decode_smem_for).
  [[nodiscard]] const DecodeSmem& decode_shared_memory() const noexcept { return smem_; }

 private:
  DeviceCache() = default;
  [[nodiscard]] std::int64_t capacity() const noexcept {
    return std::min<std::int64_t>(shape_.max_tokens, static_cast<std::int64_t>(max_blocks_) * block_tokens);
  }
  [[nodiscard]] std::int64_t* device_count(int layer) const noexcept { return static_cast<std::int64_t*>(counts_.get()) + layer; }
  [[nodiscard]] std::size_t block_index(int h, int b) const noexcept {  // block b of KV head h within its layer
    return static_cast<std::size_t>(h) * static_cast<std::size_t>(max_blocks_) + static_cast<std::size_t>(b);
  }
  [[nodiscard]] std::size_t layer_bytes() const noexcept { return block_index(shape_.kv_heads, 0) * static_cast<std::size_t>(stride_); }
  [[nodiscard]] std::size_t layer_words() const noexcept { return block_index(shape_.kv_heads, 0) * static_cast<std::size_t>(words_); }
  [[nodiscard]] std::uint8_t* layer_data(int l) const noexcept {
    return static_cast<std::uint8_t*>(data_.get()) + static_cast<std::size_t>(l) * layer_bytes();
  }
  [[nodiscard]] std::uint64_t* layer_valid(int l) const noexcept {
    return static_cast<std::uint64_t*>(valid_.get()) + static_cast<std::size_t>(l) * layer_words();
  }
  [[nodiscard]] std::uint8_t* block_ptr(int l, int h, int b) const noexcept {
    return layer_data(l) + block_index(h, b) * static_cast<std::size_t>(stride_);
  }
  [[nodiscard]] std::uint64_t* valid_ptr(int l, int h, int b) const noexcept {
    return layer_valid(l) + block_index(h, b) * static_cast<std::size_t>(words_);
  }
  [[nodiscard]] bool in_range(int l, int h, int b) const noexcept {
    return l >= 0 && l < shape_.layers && h >= 0 && h < shape_.kv_heads && b >= 0 && b < max_blocks_;
  }
  [[nodiscard]] DeviceBlocks device_blocks(int l) const noexcept {
    return make_device_blocks(layout_, layer_data(l), layer_valid(l), stride_, max_blocks_, words_);
  }
  [[nodiscard]] static unsigned grid_for(std::int64_t threads) noexcept {
    return static_cast<unsigned>(std::clamp<std::int64_t>((threads + 255) / 256, 1, 65535));
  }
  ModelShape shape_;
  BlockLayout layout_;
  DecodeSmem smem_;
  cudaStream_t stream_ = nullptr;
  std::int64_t stride_ = 0;
  int device_ = 0, max_blocks_ = 0, words_ = 0, sms_ = 1, last_splits_ = 0, max_splits_ = 1;
  int heads_per_cta_ = 1, head_ctas_ = 1;
  DeviceBuffer data_, valid_, counts_, status_, work_;
  DeviceRopeTable rope_;  // PreRope: cos/sin for positions [0, max_tokens)
  std::vector<std::int64_t> tokens_;
};

}  // namespace kvpack::cuda

#include "kvpack/kernels/cuda/device_compare.cuh"
