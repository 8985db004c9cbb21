// KVCache<Policy...>: the compressed key-value cache of one sequence, all layers.
#pragma once

#include <cmath>
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <limits>
#include <memory>
#include <span>
#include <string>
#include <type_traits>
#include <vector>

#include "kvpack/cache/block.hpp"
#include "kvpack/detail/secure_zero.hpp"
#include "kvpack/policy.hpp"
#include "kvpack/result.hpp"
#include "dispatch.hpp"

namespace kvpack {

/// Shape of the model whose KV cache this is.
struct ModelShape {
  int layers = 0;            ///< transformer layers
  int q_heads = 0;           ///< query heads; a multiple of kv_heads (GQA group = q_heads / kv_heads)
  int kv_heads = 0;          ///< key/value heads
  int head_dim = 0;          ///< channels per head; a multiple of every per-token group size, even
  std::int64_t max_tokens = 0;  ///< capacity per layer, tokens (<= 2^31 - 1)
  float attn_scale = 0.f;    ///< softmax scale; 0 selects 1/sqrt(head_dim)
};

/// What one (layer, kv_head) holds, decoded: K and V as attention reads them ([n][head_dim]
/// row-major, quantized tokens dequantized, full-precision tokens exact) and original positions.
struct HeadContents {
  std::vector<float> k, v;
  std::vector<std::int32_t> positions;
};

/// The KV cache of one sequence, composed from policies (order-free; missing roles get defaults):
///  * Keys<Codec, PerToken|PerChannel>  (default Keys<Fp32>)
///  * Values<Codec>                     (default Values<Fp32>)
///  * Sinks<N>      first N tokens kept in fp32 for ever (default 0)
///  * Residual<R>   most recent R tokens kept in fp32 (default 0)
///  * Blocks<B>     tokens per storage block (default 64, or the per-channel key group if larger)
///  * Backend<Tag>  kernel choice (default Auto)
///
/// Token lifecycle per layer: appended tokens fill the sinks first, then a full-precision pending
/// list; at the end of every append, the oldest pending tokens beyond the residual window are
/// quantized into blocks, one token at a time (per-token codecs) or in aligned groups of
/// group_size tokens (per-channel keys, whose incomplete group waits in fp32). Codes therefore
/// depend only on the tokens, never on how they were chunked (CASES C12).
///
/// Attention (attend) reads sinks and pending tokens exactly, quantized blocks through the fused
/// kernel, and the tokens of the latest append exactly: the current tokens attend to their own
/// exact K/V, never to a quantized copy (CASES C5).
///
/// Positions: the cache stores the positions the engine passes (keys arrive post-RoPE) and never
/// renumbers them.
///
/// Thread safety: none; use one cache per sequence, or external locking.
template <class... Policies>
class KVCache {
  static_assert(((!std::is_void_v<detail::role_of_t<Policies>>) && ...),
                "kvpack::KVCache<...>: every template argument must be a kvpack policy: Keys<>, Values<>, "
                "Sinks<>, Residual<>, Blocks<> or Backend<>");
  static_assert(detail::role_count_v<role::keys, Policies...> <= 1, "kvpack::KVCache<...>: more than one Keys<> policy");
  static_assert(detail::role_count_v<role::values, Policies...> <= 1,
                "kvpack::KVCache<...>: more than one Values<> policy");
  static_assert(detail::role_count_v<role::sinks, Policies...> <= 1, "kvpack::KVCache<...>: more than one Sinks<> policy");
  static_assert(detail::role_count_v<role::residual, Policies...> <= 1,
                "kvpack::KVCache<...>: more than one Residual<> policy");
  static_assert(detail::role_count_v<role::blocks, Policies...> <= 1,
                "kvpack::KVCache<...>: more than one Blocks<> policy");
  static_assert(detail::role_count_v<role::backend, Policies...> <= 1,
                "kvpack::KVCache<...>: more than one Backend<> policy");

  using KeysP = detail::find_role_t<role::keys, Keys<Fp32>, Policies...>;
  using ValuesP = detail::find_role_t<role::values, Values<Fp32>, Policies...>;

 public:
  using key_codec = typename KeysP::codec;
  using value_codec = typename ValuesP::codec;
  /// Attention kernel backend: the Backend<> policy's tag (default Auto) resolved at compile time
  /// by kernels/dispatch.hpp to Avx2, Neon or Scalar; an unavailable forced backend fails here.
  using backend_tag =
      kernels::resolved_backend_t<typename detail::find_role_t<role::backend, Backend<Auto>, Policies...>::tag>;
  static constexpr bool keys_per_channel = KeysP::per_channel;
  static constexpr int sink_tokens = detail::find_role_t<role::sinks, Sinks<0>, Policies...>::count;
  static constexpr int residual_tokens = detail::find_role_t<role::residual, Residual<0>, Policies...>::tokens;
  static constexpr int block_tokens =
      detail::find_role_t<role::blocks, Blocks<(keys_per_channel && key_codec::group_size > 64 ? key_codec::group_size : 64)>,
                          Policies...>::tokens;
  /// Bits per stored value, metadata included (full-precision sinks/residual not included).
  static constexpr double key_bits_per_value = key_codec::bits_per_value;
  static constexpr double value_bits_per_value = value_codec::bits_per_value;

  static_assert(!keys_per_channel || block_tokens % key_codec::group_size == 0,
                "kvpack::KVCache<...>: with Keys<Codec, PerChannel>, Blocks<B> must be a multiple of the key group "
                "size (a block holds whole groups of tokens)");

  /// Creates an empty cache for `shape`. Errors (Errc::invalid_argument): non-positive sizes,
  /// q_heads not a multiple of kv_heads, head_dim odd or not a multiple of a per-token group size,
  /// max_tokens above 2^31 - 1.
  [[nodiscard]] static Result<KVCache> create(const ModelShape& shape) {
    auto bad = [](std::string m) { return fail(Errc::invalid_argument, "KVCache::create: " + std::move(m)); };
    if (shape.layers <= 0 || shape.q_heads <= 0 || shape.kv_heads <= 0 || shape.head_dim <= 0 || shape.max_tokens <= 0)
      return bad("layers, q_heads, kv_heads, head_dim and max_tokens must all be positive");
    if (shape.q_heads % shape.kv_heads != 0)
      return bad("q_heads (" + std::to_string(shape.q_heads) + ") must be a multiple of kv_heads (" +
                 std::to_string(shape.kv_heads) + ")");
    if (shape.head_dim % 2 != 0) return bad("head_dim must be even");
    if (!keys_per_channel && key_codec::grouped && shape.head_dim % key_codec::group_size != 0)
      return bad("head_dim " + std::to_string(shape.head_dim) + " is not a multiple of the key group size " +
                 std::to_string(key_codec::group_size));
    if (value_codec::grouped && shape.head_dim % value_codec::group_size != 0)
      return bad("head_dim " + std::to_string(shape.head_dim) + " is not a multiple of the value group size " +
                 std::to_string(value_codec::group_size));
    if (shape.max_tokens > std::numeric_limits<std::int32_t>::max()) return bad("max_tokens exceeds 2^31 - 1");
    if (!(shape.attn_scale >= 0.f) || std::isinf(shape.attn_scale)) return bad("attn_scale must be finite and >= 0");
    return KVCache(shape);
  }

  KVCache(KVCache&&) noexcept = default;
  KVCache& operator=(KVCache&& o) noexcept {
    if (this != &o) {
      wipe();
      shape_ = o.shape_;
      layout_ = o.layout_;
      layers_ = std::move(o.layers_);
      scratch_ = std::move(o.scratch_);
      refs_ = std::move(o.refs_);
    }
    return *this;
  }
  KVCache(const KVCache&) = delete;
  KVCache& operator=(const KVCache&) = delete;
  ~KVCache() { wipe(); }

  /// Appends n = positions.size() tokens to `layer`: a prefill chunk or one decode token.
  /// k, v: [n][kv_heads][head_dim] float32, row-major (keys post-RoPE); positions: [n].
  /// Errors, with nothing written: layer out of range, wrong sizes (Errc::invalid_argument), more
  /// than max_tokens tokens (Errc::capacity_exceeded), NaN/Inf in k or v (Errc::non_finite, naming
  /// layer, KV head, token and channel). n = 0 is a no-op.
  Status append(int layer, std::span<const float> k, std::span<const float> v, std::span<const std::int32_t> positions) {
    if (layer < 0 || layer >= shape_.layers)
      return fail(Errc::invalid_argument, "append: layer " + std::to_string(layer) + " out of range [0, " +
                                              std::to_string(shape_.layers) + ")");
    const auto n = static_cast<std::int64_t>(positions.size());
    const std::size_t row = row_floats();
    if (k.size() != static_cast<std::size_t>(n) * row || v.size() != k.size())
      return fail(Errc::invalid_argument, "append: layer " + std::to_string(layer) + ": k has " +
                                              std::to_string(k.size()) + " and v " + std::to_string(v.size()) +
                                              " floats; expected n_tokens * kv_heads * head_dim = " +
                                              std::to_string(n) + " * " + std::to_string(shape_.kv_heads) + " * " +
                                              std::to_string(shape_.head_dim));
    if (n == 0) return {};
    Layer& L = layers_[static_cast<std::size_t>(layer)];
    if (L.total + n > shape_.max_tokens)
      return fail(Errc::capacity_exceeded, "append: layer " + std::to_string(layer) + " holds " +
                                               std::to_string(L.total) + " tokens; " + std::to_string(n) +
                                               " more exceed max_tokens = " + std::to_string(shape_.max_tokens));
    if (Status s = check_finite(layer, L.total, k, "K"); !s) return s;
    if (Status s = check_finite(layer, L.total, v, "V"); !s) return s;

    L.chunk_k.assign(k.begin(), k.end());
    L.chunk_v.assign(v.begin(), v.end());
    L.chunk_tokens = n;
    std::int64_t t = 0;
    for (; t < n && L.sinks_held < sink_tokens; ++t) {
      L.sink_k.insert(L.sink_k.end(), k.begin() + t * row, k.begin() + (t + 1) * row);
      L.sink_v.insert(L.sink_v.end(), v.begin() + t * row, v.begin() + (t + 1) * row);
      L.sink_pos.push_back(positions[static_cast<std::size_t>(t)]);
      ++L.sinks_held;
    }
    if (t < n) {
      L.pend_k.insert(L.pend_k.end(), k.begin() + t * row, k.end());
      L.pend_v.insert(L.pend_v.end(), v.begin() + t * row, v.end());
      L.pend_pos.insert(L.pend_pos.end(), positions.begin() + t, positions.end());
    }
    L.total += n;
    commit(L);
    return {};
  }

  /// Attention of the last n_q tokens appended to `layer` over everything the layer holds.
  /// q, out: [n_q][q_heads][head_dim] float32 (q post-RoPE). Query i sits at cache index
  /// tokens(layer) - n_q + i and sees every token up to and including itself (causal prefill;
  /// n_q = 1 is decode). GQA: query head h reads KV head h / (q_heads / kv_heads).
  /// Errors (Errc::invalid_argument): layer out of range; q not a whole number of tokens;
  /// n_q = 0 or larger than the latest append; out.size() != q.size().
  Status attend(int layer, std::span<const float> q, std::span<float> out) {
    if (layer < 0 || layer >= shape_.layers)
      return fail(Errc::invalid_argument, "attend: layer " + std::to_string(layer) + " out of range [0, " +
                                              std::to_string(shape_.layers) + ")");
    const std::size_t qrow = static_cast<std::size_t>(shape_.q_heads) * static_cast<std::size_t>(shape_.head_dim);
    if (q.empty() || q.size() % qrow != 0 || out.size() != q.size())
      return fail(Errc::invalid_argument, "attend: q has " + std::to_string(q.size()) + " floats and out " +
                                              std::to_string(out.size()) +
                                              "; both must be n_q * q_heads * head_dim with n_q >= 1");
    const Layer& L = layers_[static_cast<std::size_t>(layer)];
    const auto n_q = static_cast<std::int64_t>(q.size() / qrow);
    if (n_q > L.chunk_tokens)
      return fail(Errc::invalid_argument, "attend: layer " + std::to_string(layer) + ": " + std::to_string(n_q) +
                                              " queries but the latest append held " +
                                              std::to_string(L.chunk_tokens) + " tokens");
    const int D = shape_.head_dim;
    const int group = shape_.q_heads / shape_.kv_heads;
    const std::int64_t stride = row_floats();
    const std::int64_t chunk_start = L.total - L.chunk_tokens;
    const std::int64_t committed_end = L.sinks_held + L.committed;
    const float scale = shape_.attn_scale > 0.f ? shape_.attn_scale : 1.f / std::sqrt(static_cast<float>(D));

    for (int h = 0; h < shape_.kv_heads; ++h) {
      kernels::HeadSegments seg;
      const std::int64_t hoff = static_cast<std::int64_t>(h) * D;
      seg.sinks = {L.sink_k.data() + hoff, L.sink_v.data() + hoff, stride, 0, L.sinks_held};
      refs_.clear();
      for (const Block& b : L.blocks[static_cast<std::size_t>(h)]) {
        const std::int64_t first = L.sinks_held + static_cast<std::int64_t>(refs_.size()) * block_tokens;
        const std::int64_t count = std::min<std::int64_t>(b.header.count, chunk_start - first);
        if (count <= 0) break;
        refs_.push_back({b.data.get(), first, static_cast<int>(count)});
      }
      seg.blocks = refs_;
      const std::int64_t pend_count = std::max<std::int64_t>(0, chunk_start - committed_end);
      seg.pending = {L.pend_k.data() + hoff, L.pend_v.data() + hoff, stride, committed_end, pend_count};
      const std::int64_t chunk_first = std::max<std::int64_t>(chunk_start, L.sinks_held);
      const std::int64_t skip = chunk_first - chunk_start;
      seg.chunk = {L.chunk_k.data() + skip * stride + hoff, L.chunk_v.data() + skip * stride + hoff, stride,
                   chunk_first, L.total - chunk_first};
      kernels::AttendArgs a;
      a.head_dim = D;
      a.group = group;
      a.n_q = static_cast<int>(n_q);
      a.q_first = L.total - n_q;
      a.scale = scale;
      a.q = q.data() + static_cast<std::int64_t>(h) * group * D;
      a.q_stride = static_cast<std::int64_t>(qrow);
      a.out = out.data() + static_cast<std::int64_t>(h) * group * D;
      a.out_stride = static_cast<std::int64_t>(qrow);
      kernels::attend<backend_tag, key_codec, value_codec, keys_per_channel>(a, seg, layout_, scratch_);
    }
    return {};
  }

  /// Empties the cache; every byte it releases is zeroed first. Capacity and shape are kept.
  void reset() {
    wipe();
    layers_.clear();
    layers_.resize(static_cast<std::size_t>(shape_.layers));
    for (Layer& L : layers_) L.blocks.resize(static_cast<std::size_t>(shape_.kv_heads));
  }

  /// Bytes of KV data held now, all layers: used bytes of quantized blocks (codes, scales,
  /// zero-points, positions) plus one 16-byte BlockHeader per block, plus full-precision rows
  /// (sinks, pending/residual tokens: 8 bytes per channel for K and V, 4 bytes of position per
  /// token). Transient working copies (the latest chunk, kernel scratch) are not included.
  [[nodiscard]] std::size_t memory_bytes() const noexcept {
    std::size_t total = 0;
    const std::size_t fp_row = row_floats() * 2 * sizeof(float) + sizeof(std::int32_t);
    for (const Layer& L : layers_) {
      for (const auto& head : L.blocks)
        for (const Block& b : head) total += layout_.used_bytes(b.header.count) + sizeof(BlockHeader);
      total += static_cast<std::size_t>(L.sinks_held) * fp_row + L.pend_pos.size() * fp_row;
    }
    return total;
  }

  /// Bytes allocated for KV data (whole blocks, vector capacities, the latest chunk's copy).
  [[nodiscard]] std::size_t allocated_bytes() const noexcept {
    std::size_t total = 0;
    for (const Layer& L : layers_) {
      for (const auto& head : L.blocks) total += head.size() * (layout_.bytes + sizeof(BlockHeader));
      total += (L.sink_k.capacity() + L.sink_v.capacity() + L.pend_k.capacity() + L.pend_v.capacity() +
                L.chunk_k.capacity() + L.chunk_v.capacity()) * sizeof(float) +
               (L.sink_pos.capacity() + L.pend_pos.capacity()) * sizeof(std::int32_t);
    }
    return total;
  }

  /// Tokens appended to `layer` so far (0 for an out-of-range layer).
  [[nodiscard]] std::int64_t tokens(int layer) const noexcept {
    return layer >= 0 && layer < shape_.layers ? layers_[static_cast<std::size_t>(layer)].total : 0;
  }
  /// Tokens of `layer` stored quantized in blocks (the rest are full precision).
  [[nodiscard]] std::int64_t quantized_tokens(int layer) const noexcept {
    return layer >= 0 && layer < shape_.layers ? layers_[static_cast<std::size_t>(layer)].committed : 0;
  }
  [[nodiscard]] const ModelShape& shape() const noexcept { return shape_; }
  [[nodiscard]] const BlockLayout& block_layout() const noexcept { return layout_; }

  /// The quantized blocks of (layer, kv_head), oldest first (block b holds cache indices
  /// [sinks + b * block_tokens, ...)). Empty span for out-of-range arguments.
  [[nodiscard]] std::span<const Block> blocks(int layer, int kv_head) const noexcept {
    if (layer < 0 || layer >= shape_.layers || kv_head < 0 || kv_head >= shape_.kv_heads) return {};
    return layers_[static_cast<std::size_t>(layer)].blocks[static_cast<std::size_t>(kv_head)];
  }

  /// Decodes everything (layer, kv_head) holds, in cache order, as attention reads it (except
  /// that attention reads the latest chunk exactly). Errc::invalid_argument for bad indices.
  [[nodiscard]] Result<HeadContents> read_back(int layer, int kv_head) const {
    if (layer < 0 || layer >= shape_.layers || kv_head < 0 || kv_head >= shape_.kv_heads)
      return fail(Errc::invalid_argument, "read_back: layer or kv_head out of range");
    const Layer& L = layers_[static_cast<std::size_t>(layer)];
    const std::size_t D = static_cast<std::size_t>(shape_.head_dim);
    const std::size_t stride = row_floats();
    const std::size_t hoff = static_cast<std::size_t>(kv_head) * D;
    HeadContents c;
    auto exact = [&](const std::vector<float>& ks, const std::vector<float>& vs, std::size_t count) {
      for (std::size_t t = 0; t < count; ++t) {
        c.k.insert(c.k.end(), ks.begin() + static_cast<std::ptrdiff_t>(t * stride + hoff),
                   ks.begin() + static_cast<std::ptrdiff_t>(t * stride + hoff + D));
        c.v.insert(c.v.end(), vs.begin() + static_cast<std::ptrdiff_t>(t * stride + hoff),
                   vs.begin() + static_cast<std::ptrdiff_t>(t * stride + hoff + D));
      }
    };
    exact(L.sink_k, L.sink_v, static_cast<std::size_t>(L.sinks_held));
    c.positions = L.sink_pos;
    kernels::Scratch s;
    s.ensure(1, shape_.head_dim, block_tokens);
    for (const Block& b : L.blocks[static_cast<std::size_t>(kv_head)]) {
      kernels::scalar_detail::dequantize_block<key_codec, value_codec, keys_per_channel>(
          layout_, kernels::BlockRef{b.data.get(), 0, b.header.count}, s);
      c.k.insert(c.k.end(), s.k_tile.begin(), s.k_tile.begin() + static_cast<std::ptrdiff_t>(b.header.count * D));
      c.v.insert(c.v.end(), s.v_tile.begin(), s.v_tile.begin() + static_cast<std::ptrdiff_t>(b.header.count * D));
      const auto* pos = reinterpret_cast<const std::int32_t*>(b.data.get() + layout_.positions);
      c.positions.insert(c.positions.end(), pos, pos + b.header.count);
    }
    exact(L.pend_k, L.pend_v, L.pend_pos.size());
    c.positions.insert(c.positions.end(), L.pend_pos.begin(), L.pend_pos.end());
    return c;
  }

 private:
  struct Layer {
    std::vector<float> sink_k, sink_v;          // [sinks_held][kv_heads][D]
    std::vector<std::int32_t> sink_pos;
    std::vector<float> pend_k, pend_v;          // [pending][kv_heads][D], oldest first
    std::vector<std::int32_t> pend_pos;
    std::vector<float> chunk_k, chunk_v;        // exact copy of the latest append
    std::vector<std::vector<Block>> blocks;     // [kv_head][block]
    std::int64_t sinks_held = 0, committed = 0, total = 0, chunk_tokens = 0;
  };

  explicit KVCache(const ModelShape& shape)
      : shape_(shape), layout_(make_block_layout<key_codec, value_codec, keys_per_channel>(block_tokens, shape.head_dim)) {
    reset();
  }

  [[nodiscard]] std::size_t row_floats() const noexcept {
    return static_cast<std::size_t>(shape_.kv_heads) * static_cast<std::size_t>(shape_.head_dim);
  }

  Status check_finite(int layer, std::int64_t first_index, std::span<const float> x, const char* what) const {
    for (std::size_t i = 0; i < x.size(); ++i) {
      if (!std::isfinite(x[i])) {
        const std::size_t D = static_cast<std::size_t>(shape_.head_dim);
        const std::size_t tok = i / row_floats(), head = (i % row_floats()) / D, ch = i % D;
        return fail(Errc::non_finite, std::string("append: non-finite ") + what + " value " + std::to_string(x[i]) +
                                          " at layer " + std::to_string(layer) + ", kv head " + std::to_string(head) +
                                          ", token " + std::to_string(tok) + " of the chunk (cache index " +
                                          std::to_string(first_index + static_cast<std::int64_t>(tok)) +
                                          "), channel " + std::to_string(ch) + "; nothing was appended");
      }
    }
    return {};
  }

  // Quantizes the oldest pending tokens beyond the residual window into blocks, in whole commit
  // units (1 token, or one key group of tokens for per-channel keys).
  void commit(Layer& L) {
    constexpr std::int64_t unit = keys_per_channel ? key_codec::group_size : 1;
    const auto pending = static_cast<std::int64_t>(L.pend_pos.size());
    const std::int64_t n_commit = (pending - residual_tokens) / unit * unit;
    if (n_commit <= 0) return;
    const std::size_t D = static_cast<std::size_t>(shape_.head_dim);
    const std::size_t stride = row_floats();
    const BlockLayout& BL = layout_;
    for (std::int64_t t0 = 0; t0 < n_commit; t0 += unit) {
      const std::int64_t slot = L.committed % block_tokens;
      for (int h = 0; h < shape_.kv_heads; ++h) {
        auto& head_blocks = L.blocks[static_cast<std::size_t>(h)];
        if (slot == 0) head_blocks.push_back(new_block());
        Block& b = head_blocks.back();
        std::byte* d = b.data.get();
        const std::size_t hoff = static_cast<std::size_t>(h) * D;
        if constexpr (keys_per_channel) {
          encode_channels<key_codec>(L.pend_k.data() + static_cast<std::size_t>(t0) * stride + hoff,
                                     static_cast<std::ptrdiff_t>(stride), static_cast<int>(D),
                                     d + BL.k_codes + static_cast<std::size_t>(slot) * BL.k_row, BL.k_row,
                                     d + BL.k_meta + static_cast<std::size_t>(slot / unit) * BL.k_meta_group);
        }
        for (std::int64_t u = 0; u < unit; ++u) {
          const auto t = static_cast<std::size_t>(t0 + u);
          const auto s = static_cast<std::size_t>(slot + u);
          if constexpr (!keys_per_channel)
            encode_row<key_codec>(L.pend_k.data() + t * stride + hoff, static_cast<int>(D), d + BL.k_codes + s * BL.k_row,
                                  d + BL.k_meta + s * BL.k_meta_token);
          encode_row<value_codec>(L.pend_v.data() + t * stride + hoff, static_cast<int>(D), d + BL.v_codes + s * BL.v_row,
                                  d + BL.v_meta + s * BL.v_meta_token);
          std::memcpy(d + BL.positions + s * sizeof(std::int32_t), &L.pend_pos[t], sizeof(std::int32_t));
        }
        b.header.count = static_cast<std::uint16_t>(b.header.count + unit);
        ++b.header.version;
      }
      L.committed += unit;
    }
    // Drop the committed rows from the pending list, zeroing what they occupied.
    const auto nf = static_cast<std::size_t>(n_commit) * stride;
    std::memmove(L.pend_k.data(), L.pend_k.data() + nf, (L.pend_k.size() - nf) * sizeof(float));
    std::memmove(L.pend_v.data(), L.pend_v.data() + nf, (L.pend_v.size() - nf) * sizeof(float));
    detail::secure_zero(L.pend_k.data() + (L.pend_k.size() - nf), nf * sizeof(float));
    detail::secure_zero(L.pend_v.data() + (L.pend_v.size() - nf), nf * sizeof(float));
    L.pend_k.resize(L.pend_k.size() - nf);
    L.pend_v.resize(L.pend_v.size() - nf);
    L.pend_pos.erase(L.pend_pos.begin(), L.pend_pos.begin() + n_commit);
  }

  [[nodiscard]] Block new_block() const {
    Block b;
    b.data = std::make_unique<std::byte[]>(layout_.bytes);  // value-initialized: zeroed
    b.header.k_bits = static_cast<std::uint8_t>(key_codec::bits);
    b.header.v_bits = static_cast<std::uint8_t>(value_codec::bits);
    b.header.flags = keys_per_channel ? 1 : 0;
    b.header.k_group = static_cast<std::uint16_t>(key_codec::group_size);
    b.header.v_group = static_cast<std::uint16_t>(value_codec::group_size);
    b.header.head_dim = static_cast<std::uint16_t>(shape_.head_dim);
    return b;
  }

  void wipe() noexcept {
    for (Layer& L : layers_) {
      for (auto& head : L.blocks)
        for (Block& b : head)
          if (b.data) detail::secure_zero(b.data.get(), layout_.bytes);
      detail::wipe_vector(L.sink_k);
      detail::wipe_vector(L.sink_v);
      detail::wipe_vector(L.pend_k);
      detail::wipe_vector(L.pend_v);
      detail::wipe_vector(L.chunk_k);
      detail::wipe_vector(L.chunk_v);
      detail::wipe_vector(L.sink_pos);
      detail::wipe_vector(L.pend_pos);
    }
    layers_.clear();
  }

  ModelShape shape_;
  BlockLayout layout_;
  std::vector<Layer> layers_;
  kernels::Scratch scratch_;
  std::vector<kernels::BlockRef> refs_;
};

}  // namespace kvpack
