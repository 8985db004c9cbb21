// kvpack::cuda::DeviceRotated<Rotated<Cache, Rotate<R, Values, Keys>>>: the device twin of the
// host kvpack::Rotated cache (rotation/rotated_cache.hpp). What the host rotates is rotated by the
// orthonormal Hadamard R on the device before the device quantizer: keys (with the query before
// decode) unless values-only (Rotate<R, true, false>, the rotation a PreRope<> cache takes),
// values (with the output rotated back) when Values. No pass over the cache: O(rows * D log D)
// per append and per decode, independent of the context length.
//
// Bytes: hadamard_rows_kernel computes the rotation with the butterflies, normalization and
// signs of rotation/hadamard.hpp in the same order and rounding (transform_helpers.cuh,
// host-tested bit for bit), and the device quantizer is the host's, so the device blocks equal the
// host Rotated cache's blocks byte for byte (compare() against host.inner(): CASES C4/C12).
//
// Scratch (allocated by create, so append and decode only enqueue, as DeviceCache): rotated K
// (keys rotated) and V (values rotated) of up to Options::chunk_tokens tokens (longer appends are
// split into such chunks; per-token quantization makes the blocks independent of the split), the
// rotated query, and rotated or packed copies of up to Options::exact_rows exact rows (a row
// not rotated is copied only when given at a stride). Ordering and errors: DeviceCache's
// (device_cache.cuh); with NaN/Inf input the channel check() names is in the rotated basis (a
// non-finite value spreads over its Hadamard block), as on the host.
#pragma once

#if !defined(__CUDACC__)
#error "kernels/cuda/device_rotated.cuh launches CUDA kernels: compile it with nvcc"
#endif

#include <cuda_runtime.h>

#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <string>
#include <utility>

#include "kvpack/kernels/cuda/device_cache.cuh"
#include "kvpack/kernels/cuda/transform_helpers.cuh"
#include "kvpack/rotation/rotated_cache.hpp"

namespace kvpack::cuda {

/// Rotates `rows` head rows of D floats: row r = (t, h) with t = r / heads, h = r % heads, read at
/// src + t * src_stride + h * D and written packed at dst + r * D (dst may equal src when
/// src_stride = heads * D). Forward (inverse = false): signs (SignedHadamard) then the
/// block-diagonal normalized Walsh-Hadamard transform; inverse: transform then signs. A CTA per
/// row (grid-stride), a thread per butterfly, the row in dynamic shared memory (D floats).
template <bool Signed, bool Inverse>
__global__ void hadamard_rows_kernel(const float* src, std::int64_t src_stride, int heads, float* dst, std::int64_t rows,
                                     int D) {
  extern __shared__ float s_row[];
  const int tid = static_cast<int>(threadIdx.x), nt = static_cast<int>(blockDim.x);
  for (std::int64_t r = blockIdx.x; r < rows; r += gridDim.x) {
    const float* in = src + (r / heads) * src_stride + (r % heads) * D;
    for (int c = tid; c < D; c += nt) {
      const float x = in[c];
      s_row[c] = Signed && !Inverse && hadamard_negative(static_cast<std::uint64_t>(c)) ? -x : x;
    }
    __syncthreads();
    for (int first = 0; first < D;) {
      const int m = hadamard_block_of(first, D).size;
      for (int len = 1; len < m; len <<= 1) {
        for (int k = tid; k < m / 2; k += nt) hadamard_butterfly(s_row, first, len, k);
        __syncthreads();
      }
      first += m;
    }
    float* out = dst + r * D;
    for (int c = tid; c < D; c += nt) {
      const HadamardBlock b = hadamard_block_of(c, D);
      float x = b.size > 1 ? mul_rn(s_row[c], hadamard_scale(b.size)) : s_row[c];
      if (Signed && Inverse && hadamard_negative(static_cast<std::uint64_t>(c))) x = -x;
      out[c] = x;
    }
    __syncthreads();  // s_row is reused by the next row
  }
}

template <class RotatedHost>
class DeviceRotated;

/// Device cache of a host Rotated<Cache, Rotate<R, RotateValues, RotateKeys>> (see the file
/// comment); the inner DeviceCache<Cache> holds the rotated blocks. Requirements:
/// DeviceCache<Cache>'s (a PreRope<> inner cache only with values-only rotation, as on the host:
/// RoPE does not commute with a key rotation). Thread safety: as DeviceCache.
template <class Cache, class Rot>
class DeviceRotated<Rotated<Cache, Rot>> {
 public:
  using host_type = Rotated<Cache, Rot>;
  using inner_type = DeviceCache<Cache>;
  using rotation = typename Rot::rotation;
  static constexpr bool rotates_values = Rot::values;
  static constexpr bool rotates_keys = Rot::keys;
  static_assert(!rotates_keys || !inner_type::pre_rope,
                "kvpack::cuda::DeviceRotated: keys rotated before RoPE do not commute with it; use Rotate<R, true, false>");

  /// Scratch sizes fixed at create.
  struct Options {
    int chunk_tokens = 256;  ///< tokens rotated per inner append (longer appends are split); >= 1
    int exact_rows = 256;    ///< most exact rows one decode may pass (DeviceRows::count); >= 0
  };

  /// Creates the inner DeviceCache (its errors as they are) and the scratch buffers on `device`
  /// (-1: current), all work queued on `stream`. Errors: chunk_tokens < 1 or exact_rows < 0
  /// (Errc::invalid_argument), CUDA errors (device_memory.cuh).
  [[nodiscard]] static Result<DeviceRotated> create(const ModelShape& shape, Options opt = {}, cudaStream_t stream = nullptr,
                                                    int device = -1) {
    if (opt.chunk_tokens < 1 || opt.exact_rows < 0)
      return fail(Errc::invalid_argument, "DeviceRotated::create: chunk_tokens must be >= 1 and exact_rows >= 0");
    auto inner = inner_type::create(shape, stream, device);
    if (!inner) return inner.error();
    DeviceRotated d(std::move(*inner), opt);
    KVPACK_CUDA_ON_DEVICE(d.inner_.device());
    const auto row = static_cast<std::size_t>(shape.kv_heads) * static_cast<std::size_t>(shape.head_dim) * sizeof(float);
    auto kbuf = device_alloc(rotates_keys ? static_cast<std::size_t>(opt.chunk_tokens) * row : 0, stream, "DeviceRotated K scratch");
    if (!kbuf) return kbuf.error();
    auto vbuf = device_alloc(rotates_values ? static_cast<std::size_t>(opt.chunk_tokens) * row : 0, stream, "DeviceRotated V scratch");
    if (!vbuf) return vbuf.error();
    auto qbuf = device_alloc(rotates_keys ? static_cast<std::size_t>(shape.q_heads) * static_cast<std::size_t>(shape.head_dim) * sizeof(float) : 0,
                             stream, "DeviceRotated query scratch");
    if (!qbuf) return qbuf.error();
    auto ek = device_alloc(static_cast<std::size_t>(opt.exact_rows) * row, stream, "DeviceRotated exact K scratch");
    if (!ek) return ek.error();
    auto ev = device_alloc(static_cast<std::size_t>(opt.exact_rows) * row, stream, "DeviceRotated exact V scratch");
    if (!ev) return ev.error();
    d.kbuf_ = std::move(*kbuf), d.vbuf_ = std::move(*vbuf), d.qbuf_ = std::move(*qbuf);
    d.ekbuf_ = std::move(*ek), d.evbuf_ = std::move(*ev);
    return Result<DeviceRotated>(std::move(d));
  }

  DeviceRotated(DeviceRotated&&) noexcept = default;
  DeviceRotated& operator=(DeviceRotated&&) noexcept = default;

  /// DeviceCache::append of n tokens given in the caller's basis (d_k, d_v: device
  /// [n][kv_heads][head_dim] fp32; d_positions: device [n] int32): rotated on the device, then
  /// quantized, in chunks of Options::chunk_tokens. Enqueue only. Errors: DeviceCache::append's
  /// (returned, or recorded for check()); a chunk that fails at once stops the append there.
  /// Unlike DeviceCache::append, an append of more than chunk_tokens tokens is not all or
  /// nothing: a chunk whose rows are NaN/Inf or (PreRope<>) whose positions are out of range is
  /// found on the device after the chunks before it were committed (check() reports it).
  Status append(int layer, const float* d_k, const float* d_v, const std::int32_t* d_positions, std::int64_t n) {
    if (n < 0 || (n > 0 && (!d_k || !d_v || !d_positions)))
      return fail(Errc::invalid_argument, "DeviceRotated::append: n must be >= 0 and the buffers non-null");
    const ModelShape& s = inner_.shape();
    const std::int64_t row = static_cast<std::int64_t>(s.kv_heads) * s.head_dim;
    if (layer < 0 || layer >= s.layers || inner_.tokens(layer) + n > s.max_tokens)
      return inner_.append(layer, d_k, d_v, d_positions, n);  // its error, nothing enqueued
    KVPACK_CUDA_ON_DEVICE(inner_.device());
    for (std::int64_t done = 0; done < n;) {
      const std::int64_t m = std::min<std::int64_t>(opt_.chunk_tokens, n - done);
      const float* kb = d_k + done * row;
      if constexpr (rotates_keys) {
        auto* kr = static_cast<float*>(kbuf_.get());
        if (Status r = rotate(kb, row, s.kv_heads, kr, m * s.kv_heads, false); !r) return r;
        kb = kr;
      }
      const float* vb = d_v + done * row;
      if constexpr (rotates_values) {
        auto* vr = static_cast<float*>(vbuf_.get());
        if (Status r = rotate(vb, row, s.kv_heads, vr, m * s.kv_heads, false); !r) return r;
        vb = vr;
      }
      if (Status r = inner_.append(layer, kb, vb, d_positions + done, m); !r) return r;
      done += m;
    }
    return {};
  }

  /// DeviceCache::decode with the query d_q ([q_heads][head_dim], caller's basis) rotated first
  /// (keys rotated) and the exact rows (caller's basis; count <= Options::exact_rows) rotated
  /// into scratch where the host rotates them; with rotated values the output d_out
  /// ([q_heads][head_dim]) is rotated back in place. Enqueue only.
  /// Errors: DeviceCache::decode's; exact.count above exact_rows (Errc::invalid_argument).
  Status decode(int layer, const float* d_q, float* d_out, const DeviceRows& exact = {}, DecodeOptions opt = {})
    requires(!inner_type::pre_rope)
  {
    return decode_rotated(layer, d_q, d_out, exact, [&](const float* q, const DeviceRows& rows) {
      return inner_.decode(layer, q, d_out, rows, opt);
    });
  }

  /// As decode() above, for a PreRope<> inner cache (values-only rotation): d_q_pos is the
  /// query's device position and exact.pos the exact rows' (DeviceCache's PreRope decode).
  Status decode(int layer, const float* d_q, const std::int32_t* d_q_pos, float* d_out, const DeviceRows& exact = {},
                DecodeOptions opt = {})
    requires(inner_type::pre_rope)
  {
    if (!d_q_pos || (exact.count > 0 && !exact.pos))  // the inner decode's error, before any scratch work
      return inner_.decode(layer, d_q, d_q_pos, d_out, exact, opt);
    return decode_rotated(layer, d_q, d_out, exact, [&](const float* q, const DeviceRows& rows) {
      return inner_.decode(layer, q, d_q_pos, d_out, rows, opt);
    });
  }

  /// Uploads the host Rotated cache's blocks (already rotated: host.inner()); DeviceCache::upload.
  Status upload(const host_type& host) { return inner_.upload(host.inner()); }
  /// Byte-wise comparison with the host Rotated cache's blocks; DeviceCache::compare.
  [[nodiscard]] Status compare(const host_type& host) { return inner_.compare(host.inner()); }
  /// DeviceCache::check (device errors, token counts; synchronises).
  Status check() { return inner_.check(); }
  /// Waits for all queued work; = check().
  Status synchronize() { return inner_.check(); }
  /// Tokens of `layer` (DeviceCache::tokens).
  [[nodiscard]] std::int64_t tokens(int layer) const noexcept { return inner_.tokens(layer); }
  [[nodiscard]] const ModelShape& shape() const noexcept { return inner_.shape(); }
  [[nodiscard]] const Options& options() const noexcept { return opt_; }
  /// The inner device cache (rotated blocks).
  [[nodiscard]] inner_type& inner() noexcept { return inner_; }
  [[nodiscard]] const inner_type& inner() const noexcept { return inner_; }

 private:
  DeviceRotated(inner_type inner, Options opt) : inner_(std::move(inner)), opt_(opt) {}

  /// decode()'s work around the inner decode `call(query, rows)`: checks, the query and exact
  /// rows rotated or packed into scratch, the output rotated back (values rotated).
  template <class Call>
  Status decode_rotated(int layer, const float* d_q, float* d_out, const DeviceRows& exact, Call&& call) {
    const ModelShape& s = inner_.shape();
    if (layer < 0 || layer >= s.layers || !d_q || !d_out || exact.count < 0 || (exact.count > 0 && (!exact.k || !exact.v)))
      return call(d_q, exact);  // the inner decode's error, nothing enqueued
    if (exact.count > opt_.exact_rows)
      return fail(Errc::invalid_argument, "DeviceRotated::decode: " + std::to_string(exact.count) +
                                              " exact rows, more than Options::exact_rows = " + std::to_string(opt_.exact_rows));
    KVPACK_CUDA_ON_DEVICE(inner_.device());
    const float* qb = d_q;
    if constexpr (rotates_keys) {
      auto* qr = static_cast<float*>(qbuf_.get());
      if (Status r = rotate(d_q, static_cast<std::int64_t>(s.q_heads) * s.head_dim, s.q_heads, qr, s.q_heads, false); !r) return r;
      qb = qr;
    }
    DeviceRows rows = exact;
    if (exact.count > 0) {
      const std::int64_t packed = static_cast<std::int64_t>(s.kv_heads) * s.head_dim;
      const std::int64_t stride = exact.stride > 0 ? exact.stride : packed;
      const std::int64_t n_rows = static_cast<std::int64_t>(exact.count) * s.kv_heads;
      auto* ek = static_cast<float*>(ekbuf_.get());
      auto* ev = static_cast<float*>(evbuf_.get());
      rows.stride = packed;  // the scratch rows are packed; a row passed through must be too
      // One of K and V is rotated (Rotate<> rotates something), the other rotated or copied packed.
      if constexpr (rotates_keys) {
        if (Status r = rotate(exact.k, stride, s.kv_heads, ek, n_rows, false); !r) return r;
        rows.k = ek;
      } else if (stride != packed) {
        if (Status r = pack_rows(exact.k, stride, ek, exact.count); !r) return r;
        rows.k = ek;
      }
      if constexpr (rotates_values) {
        if (Status r = rotate(exact.v, stride, s.kv_heads, ev, n_rows, false); !r) return r;
        rows.v = ev;
      } else if (stride != packed) {
        if (Status r = pack_rows(exact.v, stride, ev, exact.count); !r) return r;
        rows.v = ev;
      }
    }
    if (Status r = call(qb, rows); !r) return r;
    if constexpr (rotates_values)
      return rotate(d_out, static_cast<std::int64_t>(s.q_heads) * s.head_dim, s.q_heads, d_out, s.q_heads, true);
    return {};
  }

  /// Enqueues a copy of `count` rows of kv_heads * head_dim floats from src (rows `stride` floats
  /// apart) to dst, packed.
  Status pack_rows(const float* src, std::int64_t stride, float* dst, int count) {
    const auto packed = static_cast<std::size_t>(inner_.shape().kv_heads) * static_cast<std::size_t>(inner_.shape().head_dim);
    KVPACK_CUDA_TRY(cudaMemcpy2DAsync(dst, packed * sizeof(float), src, static_cast<std::size_t>(stride) * sizeof(float),
                                      packed * sizeof(float), static_cast<std::size_t>(count), cudaMemcpyDeviceToDevice,
                                      inner_.stream()));
    return {};
  }

  /// Enqueues hadamard_rows_kernel (forward or inverse) over `rows` rows.
  Status rotate(const float* src, std::int64_t src_stride, int heads, float* dst, std::int64_t rows, bool inverse) {
    if (rows <= 0) return {};
    const int D = inner_.shape().head_dim;
    const unsigned grid = static_cast<unsigned>(std::min<std::int64_t>(rows, 65535));
    const unsigned threads = static_cast<unsigned>(std::clamp(D / 2, 32, 256));
    const std::size_t smem = static_cast<std::size_t>(D) * sizeof(float);
    constexpr bool sg = rotation::signed_rows;
    if (inverse) hadamard_rows_kernel<sg, true><<<grid, threads, smem, inner_.stream()>>>(src, src_stride, heads, dst, rows, D);
    else hadamard_rows_kernel<sg, false><<<grid, threads, smem, inner_.stream()>>>(src, src_stride, heads, dst, rows, D);
    KVPACK_CUDA_TRY(cudaGetLastError());
    return {};
  }

  inner_type inner_;
  Options opt_;
  DeviceBuffer kbuf_, vbuf_, qbuf_, ekbuf_, evbuf_;
};

}  // namespace kvpack::cuda
