// KVCache<Policy...>: the compressed key-value cache of one sequence, all layers.
#pragma once

#include <algorithm>
#include <bit>
#include <cmath>
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <deque>
#include <limits>
#include <memory>
#include <span>
#include <string>
#include <type_traits>
#include <utility>
#include <vector>

#include "kvpack/cache/block.hpp"
#include "kvpack/cache/offload_hooks.hpp"
#include "kvpack/detail/secure_zero.hpp"
#include "kvpack/executor.hpp"
#include "kvpack/eviction/block_sparse.hpp"
#include "kvpack/eviction/policies.hpp"
#include "kvpack/eviction/snapkv_select.hpp"
#include "kvpack/policy.hpp"
#include "kvpack/result.hpp"
#include "dispatch.hpp"
#include "scalar/keyframe_attention.hpp"
#include "split_k.hpp"

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
  std::vector<std::int64_t> indices;  ///< cache index (order of arrival) of each row
};

/// The KV cache of one sequence, composed from policies (order-free; missing roles get defaults):
///  * Keys<Codec, PerToken|PerChannel>  (default Keys<Fp32>)
///  * Values<Codec>                     (default Values<Fp32>)
///  * Sinks<N>      first N tokens kept in fp32 for ever (default 0)
///  * Residual<R>   most recent R tokens kept in fp32 (default 0)
///  * Blocks<B>     tokens per storage block (default 64, or the per-channel key group if larger)
///  * Backend<Tag>  kernel choice (default Auto)
///  * offload::Offload<Tiers..., Prefetch<N>>  move full blocks to host/file tiers within a
///                  resident budget (default NoOffload; include/kvpack/offload/cache_offload.hpp)
///
/// Keyframe<Interval, ...> codecs (codec/keyframe.hpp) for K and/or V: blocks hold exactly one
/// interval (Blocks<> defaults to Interval; another size is a compile error), tokens are committed
/// a whole interval at a time (up to Interval - 1 newest tokens wait in fp32, as KIVI's key group),
/// and attention runs the scalar keyframe kernel (kernels/scalar/keyframe_attention.hpp) on every
/// backend. Not combinable with eviction policies.
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
                "Sinks<>, Residual<>, Blocks<>, Backend<> or an eviction policy");
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
  static_assert(detail::role_count_v<role::eviction, Policies...> <= 1,
                "kvpack::KVCache<...>: more than one eviction policy (NoEviction, SinkWindow, H2O, SnapKV, BlockSparse)");
  static_assert(detail::role_count_v<role::offload, Policies...> <= 1,
                "kvpack::KVCache<...>: more than one Offload<> policy");

  using KeysP = detail::find_role_t<role::keys, Keys<Fp32>, Policies...>;
  using ValuesP = detail::find_role_t<role::values, Values<Fp32>, Policies...>;
  using EvictP = detail::find_role_t<role::eviction, NoEviction, Policies...>;
  using OffloadP = detail::find_role_t<role::offload, NoOffload, Policies...>;

 public:
  using key_codec = typename KeysP::codec;
  using value_codec = typename ValuesP::codec;
  /// Attention kernel backend: the Backend<> policy's tag (default Auto) resolved at compile time
  /// by kernels/dispatch.hpp to Avx2, Neon or Scalar; an unavailable forced backend fails here.
  using backend_tag =
      kernels::resolved_backend_t<typename detail::find_role_t<role::backend, Backend<Auto>, Policies...>::tag>;
  static constexpr bool keys_per_channel = KeysP::per_channel;
  /// Whether K / V use a Keyframe<...> codec, and the keyframe interval (0 when neither does).
  static constexpr bool keys_keyframe = is_keyframe_codec_v<key_codec>;
  static constexpr bool values_keyframe = is_keyframe_codec_v<value_codec>;
  static constexpr bool any_keyframe = keys_keyframe || values_keyframe;
  static constexpr int keyframe_interval = [] {
    if constexpr (keys_keyframe) return key_codec::interval;
    else if constexpr (values_keyframe) return value_codec::interval;
    else return 0;
  }();
  static constexpr int sink_tokens = detail::find_role_t<role::sinks, Sinks<0>, Policies...>::count;
  static constexpr int residual_tokens = detail::find_role_t<role::residual, Residual<0>, Policies...>::tokens;
  static constexpr bool is_block_sparse = detail::is_block_sparse_v<EvictP>;
  static constexpr int block_tokens = detail::find_role_t<
      role::blocks,
      Blocks<(any_keyframe      ? keyframe_interval
              : is_block_sparse ? detail::block_tokens_of_v<EvictP>
                                : (keys_per_channel && key_codec::group_size > 64 ? key_codec::group_size : 64))>,
      Policies...>::tokens;
  /// Bits per stored value, metadata included (full-precision sinks/residual not included).
  static constexpr double key_bits_per_value = key_codec::bits_per_value;
  static constexpr double value_bits_per_value = value_codec::bits_per_value;

  using eviction_policy = EvictP;
  static constexpr bool evicts = EvictP::evicts;
  static constexpr bool is_h2o = detail::is_h2o_v<EvictP>;
  static constexpr bool is_snapkv = detail::is_snapkv_v<EvictP>;
  static constexpr bool is_sink_window = detail::is_sink_window_v<EvictP>;

  /// Offload<...> present: full blocks may live in an offload store (blocks() then shows them
  /// with a null `data`); attend() fetches them (see include/kvpack/offload/cache_offload.hpp).
  static constexpr bool offloads = OffloadP::enabled;
  /// Runtime options of the offload policy (an empty struct without one).
  using offload_options = typename OffloadP::options;
  static_assert(!offloads || !evicts,
                "kvpack::KVCache<...>: Offload<> moves full, immutable blocks; it cannot be combined with an "
                "eviction policy, which rewrites blocks in place");
  static_assert(!evicts || !keys_per_channel,
                "kvpack::KVCache<...>: token-level eviction (SinkWindow, H2O, SnapKV) needs per-token keys; "
                "per-channel key groups cannot lose single tokens");
  static_assert(!any_keyframe || block_tokens == keyframe_interval,
                "kvpack::KVCache<...>: with a Keyframe<Interval, ...> codec, a block holds exactly one interval: "
                "Blocks<B> must equal Interval (and K and V keyframe intervals must match)");
  static_assert(!(keys_keyframe && values_keyframe) || []() {
    if constexpr (keys_keyframe && values_keyframe) return key_codec::interval == value_codec::interval;
    else return true;
  }(), "kvpack::KVCache<...>: Keys<Keyframe<I1,...>> and Values<Keyframe<I2,...>> need I1 == I2");
  static_assert(!keys_per_channel || !any_keyframe,
                "kvpack::KVCache<...>: Keys<Codec, PerChannel> cannot be combined with a Keyframe<...> value codec");
  static_assert(!evicts || !any_keyframe,
                "kvpack::KVCache<...>: eviction policies cannot remove single tokens from a Keyframe<...> interval");
  static_assert(!is_block_sparse || block_tokens == detail::block_tokens_of_v<EvictP>,
                "kvpack::KVCache<...>: BlockSparse<Budget, B> sets the storage block size; a Blocks<> policy with "
                "another size contradicts it (drop Blocks<> or make it Blocks<B>)");
  static_assert(!keys_per_channel || block_tokens % key_codec::group_size == 0,
                "kvpack::KVCache<...>: with Keys<Codec, PerChannel>, Blocks<B> must be a multiple of the key group "
                "size (a block holds whole groups of tokens)");

  /// Creates an empty cache for `shape`. Errors (Errc::invalid_argument): non-positive sizes,
  /// q_heads not a multiple of kv_heads, head_dim odd, above 65535 or not a multiple of a per-token group size,
  /// max_tokens above 2^31 - 1. With an Offload<> policy, `offload` sets the resident budget,
  /// placement and tiers; its errors (bad options, libsodium unavailable) are returned too.
  [[nodiscard]] static Result<KVCache> create(const ModelShape& shape, const offload_options& offload = {}) {
    auto bad = [](std::string m) { return fail(Errc::invalid_argument, "KVCache::create: " + std::move(m)); };
    if (shape.layers <= 0 || shape.q_heads <= 0 || shape.kv_heads <= 0 || shape.head_dim <= 0 || shape.max_tokens <= 0)
      return bad("layers, q_heads, kv_heads, head_dim and max_tokens must all be positive");
    if (shape.q_heads % shape.kv_heads != 0)
      return bad("q_heads (" + std::to_string(shape.q_heads) + ") must be a multiple of kv_heads (" +
                 std::to_string(shape.kv_heads) + ")");
    if (shape.head_dim % 2 != 0) return bad("head_dim must be even");
    if (shape.head_dim > 65535) return bad("head_dim exceeds 65535 (the 16-bit head_dim of BlockHeader)");
    if (!keys_per_channel && (key_codec::grouped || keys_keyframe) && shape.head_dim % key_codec::group_size != 0)
      return bad("head_dim " + std::to_string(shape.head_dim) + " is not a multiple of the key group size " +
                 std::to_string(key_codec::group_size));
    if ((value_codec::grouped || values_keyframe) && shape.head_dim % value_codec::group_size != 0)
      return bad("head_dim " + std::to_string(shape.head_dim) + " is not a multiple of the value group size " +
                 std::to_string(value_codec::group_size));
    if (shape.max_tokens > std::numeric_limits<std::int32_t>::max()) return bad("max_tokens exceeds 2^31 - 1");
    if (!(shape.attn_scale >= 0.f) || std::isinf(shape.attn_scale)) return bad("attn_scale must be finite and >= 0");
    if constexpr (is_block_sparse) {
      const std::int64_t b = EvictP::budget_type::resolve(shape.max_tokens);
      if (b < EvictP::protected_tokens)
        return bad("BlockSparse budget of " + std::to_string(b) + " tokens (from max_tokens " +
                   std::to_string(shape.max_tokens) + ") is below the " + std::to_string(EvictP::protected_tokens) +
                   " tokens of its sink, recent and open blocks");
    }
    if constexpr (is_sink_window || is_h2o) {  // budget-typed forms resolve here (the int forms always pass)
      const std::int64_t b = EvictP::resolve_budget(shape.max_tokens);
      if (b < EvictP::min_budget)
        return bad("eviction budget of " + std::to_string(b) + " tokens (from max_tokens " +
                   std::to_string(shape.max_tokens) + ") is below the " + std::to_string(EvictP::min_budget) +
                   " tokens its sinks and a one-token recent window need");
    }
    if constexpr (offloads) {
      KVCache c(shape);
      if (Status s = c.off_.init(c, offload); !s) return s.error();
      return c;
    } else {
      (void)offload;
      return KVCache(shape);
    }
  }

  /// Moves a cache. The moved-from cache is left empty with zero layers: every call on it then
  /// fails cleanly (layer out of range) instead of reading storage that moved away.
  KVCache(KVCache&& o) noexcept
      : shape_(o.shape_),
        layout_(o.layout_),
        budget_(o.budget_),
        recent_(o.recent_),
        layers_(std::move(o.layers_)),
        scratch_(std::move(o.scratch_)),
        refs_(std::move(o.refs_)),
        mass_(std::move(o.mass_)),
        head_mass_(std::move(o.head_mass_)),
        par_(std::move(o.par_)),
        off_(std::move(o.off_)) {
    o.layers_.clear();
    o.shape_.layers = 0;
  }
  KVCache& operator=(KVCache&& o) noexcept {
    if (this != &o) {
      wipe();
      shape_ = o.shape_;
      layout_ = o.layout_;
      budget_ = o.budget_;
      recent_ = o.recent_;
      layers_ = std::move(o.layers_);
      scratch_ = std::move(o.scratch_);
      refs_ = std::move(o.refs_);
      mass_ = std::move(o.mass_);
      head_mass_ = std::move(o.head_mass_);
      par_ = std::move(o.par_);
      off_ = std::move(o.off_);
      o.layers_.clear();
      o.shape_.layers = 0;
    }
    return *this;
  }
  KVCache(const KVCache&) = delete;
  KVCache& operator=(const KVCache&) = delete;
  ~KVCache() { wipe(); }

  /// Appends n = positions.size() tokens to `layer`: a prefill chunk or one decode token.
  /// k, v: [n][kv_heads][head_dim] float32, row-major (keys post-RoPE); positions: [n].
  /// Errors, with nothing written: layer out of range, wrong sizes (Errc::invalid_argument), more
  /// than max_tokens tokens (Errc::capacity_exceeded; with an eviction policy, max_tokens bounds
  /// the tokens held after this append's eviction, not the tokens seen: SinkWindow<S, W> runs for
  /// ever with max_tokens = S + W when fed one token at a time; more than 2^31 - 1 tokens seen is
  /// Errc::capacity_exceeded too, cache indices being int32), a negative position
  /// (Errc::invalid_argument), NaN/Inf in k or v (Errc::non_finite, naming layer, KV head, token
  /// and channel). Positions need not increase (they are stored as given and never used to order
  /// tokens: attention order and causality follow arrival order). n = 0 is a no-op.
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
    if (held_after(L, n) > shape_.max_tokens)
      return fail(Errc::capacity_exceeded, "append: layer " + std::to_string(layer) + " holds " +
                                               std::to_string(held(L)) + " tokens; " + std::to_string(n) +
                                               " more (up to " + std::to_string(held_after(L, n)) +
                                               " held after eviction) exceed max_tokens = " +
                                               std::to_string(shape_.max_tokens));
    if (L.total + n > std::numeric_limits<std::int32_t>::max())
      return fail(Errc::capacity_exceeded, "append: layer " + std::to_string(layer) + " has seen " +
                                               std::to_string(L.total) + " tokens; cache indices are int32");
    for (std::int64_t t = 0; t < n; ++t)
      if (positions[static_cast<std::size_t>(t)] < 0)
        return fail(Errc::invalid_argument, "append: layer " + std::to_string(layer) + ": negative position " +
                                                std::to_string(positions[static_cast<std::size_t>(t)]) +
                                                " at token " + std::to_string(t) + " of the chunk");
    if (Status s = check_finite(layer, L.total, k, "K"); !s) return s;
    if (Status s = check_finite(layer, L.total, v, "V"); !s) return s;

    if constexpr (evicts) {
      // Eviction caches commit lazily: the previous append's tokens are committed (and may be
      // evicted) now, so blocks only ever hold tokens older than the current chunk.
      if constexpr (is_snapkv) {
        if (compresses_on(L, n)) compress_layer(L);
      }
      commit(L);
    }
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
      if constexpr (evicts)
        for (Head& H : L.heads) H.pend_score.resize(L.pend_pos.size(), 0.f);
    }
    L.total += n;
    if constexpr (evicts) {
      enforce_budget(L);
    } else {
      commit(L);
    }
    return {};
  }

  /// Runs attend() in parallel through `executor` (include/kvpack/executor.hpp; e.g.
  /// kvpack::thread_executor(2) or an engine's pool): every KV head is a task, and each head's
  /// context is cut into up to `splits` chunks of whole blocks whose partial softmax states are
  /// combined exactly (split-K, kernels/split_k.hpp; outputs equal the serial ones up to fp32
  /// rounding). H2O/BlockSparse heads are not split (their scores need the whole context) but run
  /// in parallel. An empty executor (the default) attends serially on the calling thread.
  /// splits < 1 counts as 1.
  void set_executor(Executor executor, int splits = 1) {
    par_.exec = std::move(executor);
    par_.splits = std::max(1, splits);
  }

  /// Attention of the last n_q tokens appended to `layer` over everything the layer holds.
  /// q, out: [n_q][q_heads][head_dim] float32 (q post-RoPE). Query i sits at cache index
  /// tokens(layer) - n_q + i and sees every token up to and including itself (causal prefill;
  /// n_q = 1 is decode). GQA: query head h reads KV head h / (q_heads / kv_heads).
  /// Errors (Errc::invalid_argument): layer out of range; q not a whole number of tokens;
  /// n_q = 0 or larger than the latest append; out.size() != q.size(). Errc::non_finite: NaN/Inf
  /// in q (checked first), or a non-finite output: a logit |q.k| * scale beyond 3.4e38 (fp32),
  /// or K/V values themselves so large that the output is. The kernels keep the value accumulation
  /// normalized (weights that sum to 1), so finite K/V whose exact output is finite (e.g. every
  /// value 1e37) give that output, never an overflow. On any error the cache is unchanged (H2O/BlockSparse
  /// scores and SnapKV's observation window included); `out` is unspecified after a non-finite
  /// output error and untouched after the others.
  Status attend(int layer, std::span<const float> q, std::span<float> out) {
    if (layer < 0 || layer >= shape_.layers)
      return fail(Errc::invalid_argument, "attend: layer " + std::to_string(layer) + " out of range [0, " +
                                              std::to_string(shape_.layers) + ")");
    const std::size_t qrow = static_cast<std::size_t>(shape_.q_heads) * static_cast<std::size_t>(shape_.head_dim);
    if (q.empty() || q.size() % qrow != 0 || out.size() != q.size())
      return fail(Errc::invalid_argument, "attend: q has " + std::to_string(q.size()) + " floats and out " +
                                              std::to_string(out.size()) +
                                              "; both must be n_q * q_heads * head_dim with n_q >= 1");
    Layer& L = layers_[static_cast<std::size_t>(layer)];
    const auto n_q = static_cast<std::int64_t>(q.size() / qrow);
    if (n_q > L.chunk_tokens)
      return fail(Errc::invalid_argument, "attend: layer " + std::to_string(layer) + ": " + std::to_string(n_q) +
                                              " queries but the latest append held " +
                                              std::to_string(L.chunk_tokens) + " tokens");
    for (std::size_t i = 0; i < q.size(); ++i)
      if (!std::isfinite(q[i]))
        return fail(Errc::non_finite, "attend: non-finite q value " + std::to_string(q[i]) + " at layer " +
                                          std::to_string(layer) + ", query " + std::to_string(i / qrow) +
                                          ", q head " + std::to_string((i % qrow) / static_cast<std::size_t>(shape_.head_dim)) +
                                          ", channel " + std::to_string(i % static_cast<std::size_t>(shape_.head_dim)));
    const int group = shape_.q_heads / shape_.kv_heads;
    if constexpr (offloads) {  // prefetch the next layers, pin this layer's offloaded blocks (or fail naming one)
      if (Status s = off_.begin_attend(layer); !s) return s;
    }
    if constexpr (is_h2o || is_block_sparse) head_mass_.resize(static_cast<std::size_t>(shape_.kv_heads));
    if (par_.exec) {  // every KV head a job, split into chunks over the executor (kernels/split_k.hpp)
      const auto H = static_cast<std::size_t>(shape_.kv_heads);
      par_.refs.resize(H);
      par_.jobs.resize(H);
      for (int h = 0; h < shape_.kv_heads; ++h) {
        const auto hz = static_cast<std::size_t>(h);
        par_.jobs[hz] = {args_for(L, h, q.data() + static_cast<std::int64_t>(h) * group * shape_.head_dim,
                                  out.data() + static_cast<std::int64_t>(h) * group * shape_.head_dim, n_q, group),
                         segments(L, h, par_.refs[hz])};
        if constexpr (is_h2o || is_block_sparse) {
          head_mass_[hz].assign(static_cast<std::size_t>(ordinals(par_.jobs[hz].seg)), 0.f);
          par_.jobs[hz].args.key_mass = head_mass_[hz].data();
        }
      }
      kernels::attend_parallel(std::span<const kernels::HeadJob>(par_.jobs), par_.splits, par_.exec, par_.scratch,
                               [this](const kernels::AttendArgs& a, const kernels::HeadSegments& seg,
                                      kernels::Scratch& s) { run_kernel(a, seg, s); });
    }
    for (int h = 0; h < shape_.kv_heads && !par_.exec; ++h) {
      kernels::AttendArgs a = args_for(L, h, q.data() + static_cast<std::int64_t>(h) * group * shape_.head_dim,
                                       out.data() + static_cast<std::int64_t>(h) * group * shape_.head_dim, n_q, group);
      const kernels::HeadSegments seg = segments(L, h);
      if constexpr (is_h2o || is_block_sparse) {  // both rank by the mass the kernel gathers
        std::vector<float>& m = head_mass_[static_cast<std::size_t>(h)];
        m.assign(static_cast<std::size_t>(ordinals(seg)), 0.f);
        a.key_mass = m.data();
        run_kernel(a, seg);
      } else {
        run_kernel(a, seg);
      }
    }
    if constexpr (offloads) off_.end_attend();
    // Overflow (finite inputs whose products or sums exceed fp32) must not pass silently, nor
    // poison eviction scores: scores are credited only once every head's output is finite.
    for (std::size_t i = 0; i < out.size(); ++i)
      if (!std::isfinite(out[i]))
        return fail(Errc::non_finite, "attend: layer " + std::to_string(layer) + ": attention output " +
                                          std::to_string(out[i]) + " at query " + std::to_string(i / qrow) +
                                          ", q head " + std::to_string((i % qrow) / static_cast<std::size_t>(shape_.head_dim)) +
                                          " is not finite (a logit q.k * scale overflowed fp32, or K/V too large); scores not updated");
    if constexpr (is_h2o || is_block_sparse) {
      for (int h = 0; h < shape_.kv_heads; ++h) credit_mass(L, h, segments(L, h), head_mass_[static_cast<std::size_t>(h)]);
    }
    if constexpr (is_snapkv) {
      if (!L.compressed) remember_queries(L, q, n_q);
    }
    return {};
  }

  /// SnapKV only: compresses `layer`'s prompt now (normally done by the first decode append).
  /// Errc::invalid_argument when the layer was already compressed or holds no recorded queries.
  Status compress_prompt(int layer)
    requires(is_snapkv)
  {
    if (layer < 0 || layer >= shape_.layers) return fail(Errc::invalid_argument, "compress_prompt: layer out of range");
    Layer& L = layers_[static_cast<std::size_t>(layer)];
    if (L.compressed || L.obs_q.empty())
      return fail(Errc::invalid_argument, "compress_prompt: layer " + std::to_string(layer) +
                                              " is already compressed or has no observation-window queries");
    compress_layer(L);
    return {};
  }

  /// BlockSparse only: compacts every KV head of `layer` now (normally done when at least half of a
  /// head's blocks are masked out): live tokens are rewritten densely, in cache-index order, into
  /// fresh blocks; masked-out blocks are zeroed and freed. Attention output is unchanged.
  /// Errc::invalid_argument for a layer out of range.
  Status compact_blocks(int layer)
    requires(is_block_sparse)
  {
    if (layer < 0 || layer >= shape_.layers) return fail(Errc::invalid_argument, "compact_blocks: layer out of range");
    for (Head& H : layers_[static_cast<std::size_t>(layer)].heads) compact(H);
    return {};
  }

  /// Empties the cache; every byte it releases is zeroed first. Capacity and shape are kept
  /// (SnapKVBudget<Fraction<>>: eviction_budget() returns to 0 until the next compression).
  void reset() {
    if constexpr (offloads) off_.reset();
    if constexpr (is_snapkv) budget_ = EvictP::fixed_budget;  // a Fraction is resolved again at the next compression
    wipe();
    layers_.clear();
    layers_.resize(static_cast<std::size_t>(shape_.layers));
    for (Layer& L : layers_) L.heads.resize(static_cast<std::size_t>(shape_.kv_heads));
  }

  /// Bytes of KV data held now, all layers: used bytes of quantized tokens (codes, scales,
  /// zero-points, positions) plus one 16-byte BlockHeader per block, plus full-precision rows
  /// (sinks, pending/residual tokens: 8 bytes per channel for K and V, 4 bytes of position per
  /// token). Eviction caches add their bookkeeping: per block one validity bit per slot (in
  /// 64-bit words), per slot its token index and score (8 bytes), per pending token and KV head
  /// its score (4 bytes). BlockSparse counts the payload of every allocated slot (masked-out blocks
  /// hold memory until compaction) plus its block bitmask. Transient working copies (the latest chunk, kernel scratch) are not
  /// included.
  [[nodiscard]] std::size_t memory_bytes() const noexcept {
    std::size_t total = 0;
    const std::size_t fp_row = row_floats() * 2 * sizeof(float) + sizeof(std::int32_t);
    for (const Layer& L : layers_) {
      for (const Head& H : L.heads) {
        if constexpr (evicts) {
          // BlockSparse: masked-out blocks occupy memory until compaction, so count every slot.
          const std::size_t payload_slots = is_block_sparse ? H.slot_token.size() : static_cast<std::size_t>(H.live);
          total += payload_slots * layout_.used_bytes(1) +
                   H.blocks.size() * (sizeof(BlockHeader) + words_per_block * sizeof(std::uint64_t)) +
                   H.slot_token.size() * (sizeof(std::int32_t) + sizeof(float)) + H.pend_score.size() * sizeof(float) +
                   H.block_live.size() * sizeof(std::uint64_t);
        } else {
          for (const Block& b : H.blocks) total += layout_.used_bytes(b.header.count) + sizeof(BlockHeader);
        }
      }
      total += static_cast<std::size_t>(L.sinks_held) * fp_row + L.pend_pos.size() * fp_row;
    }
    return total;
  }

  /// Bytes allocated for KV data (whole blocks, vector capacities, the latest chunk's copy).
  [[nodiscard]] std::size_t allocated_bytes() const noexcept {
    std::size_t total = 0;
    for (const Layer& L : layers_) {
      for (const Head& H : L.heads)
        total += H.blocks.size() * sizeof(BlockHeader) +
                 static_cast<std::size_t>(std::count_if(H.blocks.begin(), H.blocks.end(), [](const Block& b) { return b.data != nullptr; })) *
                     layout_.bytes +
                 H.valid.capacity() * sizeof(std::uint64_t) +
                 (H.slot_token.capacity() + H.slot_score.capacity() + H.pend_score.capacity()) * 4;
      total += (L.sink_k.capacity() + L.sink_v.capacity() + L.pend_k.capacity() + L.pend_v.capacity() +
                L.chunk_k.capacity() + L.chunk_v.capacity() + L.obs_q.capacity()) * sizeof(float) +
               (L.sink_pos.capacity() + L.pend_pos.capacity()) * sizeof(std::int32_t);
    }
    return total;
  }

  /// Tokens appended to `layer` so far, evicted ones included (0 for an out-of-range layer).
  [[nodiscard]] std::int64_t tokens(int layer) const noexcept {
    return layer >= 0 && layer < shape_.layers ? layers_[static_cast<std::size_t>(layer)].total : 0;
  }
  /// Tokens of `layer` currently held by KV head `kv_head` (after eviction).
  [[nodiscard]] std::int64_t held_tokens(int layer, int kv_head = 0) const noexcept {
    if (layer < 0 || layer >= shape_.layers || kv_head < 0 || kv_head >= shape_.kv_heads) return 0;
    const Layer& L = layers_[static_cast<std::size_t>(layer)];
    const Head& H = L.heads[static_cast<std::size_t>(kv_head)];
    return L.sinks_held + (evicts ? H.live : L.committed) + static_cast<std::int64_t>(L.pend_pos.size());
  }
  /// Tokens of `layer` stored quantized in blocks (the rest are full precision); KV head 0.
  [[nodiscard]] std::int64_t quantized_tokens(int layer) const noexcept {
    if (layer < 0 || layer >= shape_.layers) return 0;
    const Layer& L = layers_[static_cast<std::size_t>(layer)];
    return evicts ? L.heads[0].live : L.committed;
  }
  [[nodiscard]] const ModelShape& shape() const noexcept { return shape_; }
  /// Offload<> only: the offload state: prefetch(layer) hint for the engine, metrics(),
  /// flush(), store() (include/kvpack/offload/cache_offload.hpp).
  [[nodiscard]] auto& offload() noexcept
    requires(offloads)
  {
    return off_;
  }
  [[nodiscard]] const auto& offload() const noexcept
    requires(offloads)
  {
    return off_;
  }
  [[nodiscard]] const BlockLayout& block_layout() const noexcept { return layout_; }

  /// The quantized blocks of (layer, kv_head), oldest first. Without eviction, block b holds cache
  /// indices [sinks + b * block_tokens, ...); with eviction, slots are reused (see read_back for
  /// the tokens they hold). With Offload<>, a block held by the offload store has a null `data`
  /// (its header stays here). Empty span for out-of-range arguments.
  [[nodiscard]] std::span<const Block> blocks(int layer, int kv_head) const noexcept {
    if (layer < 0 || layer >= shape_.layers || kv_head < 0 || kv_head >= shape_.kv_heads) return {};
    return layers_[static_cast<std::size_t>(layer)].heads[static_cast<std::size_t>(kv_head)].blocks;
  }

  /// BlockSparse only: the block bitmask of (layer, kv_head), one bit per block of blocks()
  /// (bit b % 64 of word b / 64; set = live, cleared = masked out, never read by attention).
  /// Empty span for out-of-range arguments.
  [[nodiscard]] std::span<const std::uint64_t> block_mask(int layer, int kv_head) const noexcept
    requires(is_block_sparse)
  {
    if (layer < 0 || layer >= shape_.layers || kv_head < 0 || kv_head >= shape_.kv_heads) return {};
    return layers_[static_cast<std::size_t>(layer)].heads[static_cast<std::size_t>(kv_head)].block_live;
  }

  /// Eviction budget in tokens per (layer, KV head), resolved at create() (Fraction<> budgets
  /// against ModelShape::max_tokens); 0 without eviction. SnapKV<Budget, Window>: Budget + Window;
  /// SnapKVBudget<Tokens<N>>: N; SnapKVBudget<Fraction<>>: 0 until a layer is compressed, then
  /// the tokens per KV head the latest compression kept room for (a fraction of that prompt).
  [[nodiscard]] std::int64_t eviction_budget() const noexcept { return budget_; }

  /// Decodes everything (layer, kv_head) holds as attention reads it (except that attention reads
  /// the latest chunk exactly), sorted by cache index; `indices` gives each row's cache index.
  /// Errc::invalid_argument for bad indices; with Offload<>, the fetch errors of attend().
  [[nodiscard]] Result<HeadContents> read_back(int layer, int kv_head) const {
    if (layer < 0 || layer >= shape_.layers || kv_head < 0 || kv_head >= shape_.kv_heads)
      return fail(Errc::invalid_argument, "read_back: layer or kv_head out of range");
    const Layer& L = layers_[static_cast<std::size_t>(layer)];
    const Head& H = L.heads[static_cast<std::size_t>(kv_head)];
    const std::size_t D = static_cast<std::size_t>(shape_.head_dim);
    const std::size_t stride = row_floats();
    const std::size_t hoff = static_cast<std::size_t>(kv_head) * D;
    HeadContents c;
    auto exact = [&](const std::vector<float>& ks, const std::vector<float>& vs, const std::vector<std::int32_t>& pos,
                     std::int64_t first) {
      for (std::size_t t = 0; t < pos.size(); ++t) {
        c.k.insert(c.k.end(), ks.begin() + static_cast<std::ptrdiff_t>(t * stride + hoff),
                   ks.begin() + static_cast<std::ptrdiff_t>(t * stride + hoff + D));
        c.v.insert(c.v.end(), vs.begin() + static_cast<std::ptrdiff_t>(t * stride + hoff),
                   vs.begin() + static_cast<std::ptrdiff_t>(t * stride + hoff + D));
        c.positions.push_back(pos[t]);
        c.indices.push_back(first + static_cast<std::int64_t>(t));
      }
    };
    exact(L.sink_k, L.sink_v, L.sink_pos, 0);
    kernels::Scratch s;
    s.ensure(1, shape_.head_dim, block_tokens);
    std::vector<std::pair<std::int64_t, std::size_t>> order;  // (cache index, row in tmp) for eviction caches
    std::vector<float> tk, tv;
    std::vector<std::int32_t> tp;
    for (std::size_t bi = 0; bi < H.blocks.size(); ++bi) {
      const Block& b = H.blocks[bi];
      const std::byte* data = b.data.get();
      [[maybe_unused]] typename OffloadP::state::handle hold{};  // keeps an offloaded block's bytes alive below
      if constexpr (offloads) {
        if (!data) {
          auto r = off_.hold(layer, kv_head, static_cast<std::int64_t>(bi));
          if (!r) return r.error();
          hold = std::move(r).value();
          data = hold.bytes().data();
        }
      }
      if constexpr (any_keyframe)
        kernels::keyframe_detail::decode_block<key_codec, value_codec>(layout_, data, b.header.flags,
                                                                       b.header.count, s.k_tile.data(), s.v_tile.data());
      else
        kernels::scalar_detail::dequantize_block<key_codec, value_codec, keys_per_channel>(
            layout_, kernels::BlockRef{data, 0, b.header.count, nullptr}, s);
      const auto* pos = reinterpret_cast<const std::int32_t*>(data + layout_.positions);
      for (std::size_t t = 0; t < b.header.count; ++t) {
        const std::size_t slot = bi * static_cast<std::size_t>(block_tokens) + t;
        std::int64_t index = L.sinks_held + static_cast<std::int64_t>(slot);
        if constexpr (evicts) {
          if (H.slot_token[slot] < 0) continue;
          index = H.slot_token[slot];
        }
        order.emplace_back(index, tp.size());
        tk.insert(tk.end(), s.k_tile.begin() + static_cast<std::ptrdiff_t>(t * D), s.k_tile.begin() + static_cast<std::ptrdiff_t>((t + 1) * D));
        tv.insert(tv.end(), s.v_tile.begin() + static_cast<std::ptrdiff_t>(t * D), s.v_tile.begin() + static_cast<std::ptrdiff_t>((t + 1) * D));
        tp.push_back(pos[t]);
      }
    }
    std::sort(order.begin(), order.end());
    for (const auto& [index, r] : order) {
      c.k.insert(c.k.end(), tk.begin() + static_cast<std::ptrdiff_t>(r * D), tk.begin() + static_cast<std::ptrdiff_t>((r + 1) * D));
      c.v.insert(c.v.end(), tv.begin() + static_cast<std::ptrdiff_t>(r * D), tv.begin() + static_cast<std::ptrdiff_t>((r + 1) * D));
      c.positions.push_back(tp[r]);
      c.indices.push_back(index);
    }
    exact(L.pend_k, L.pend_v, L.pend_pos, L.total - static_cast<std::int64_t>(L.pend_pos.size()));
    return c;
  }

 private:
  static constexpr std::size_t words_per_block = (static_cast<std::size_t>(block_tokens) + 63) / 64;

  struct Head {
    std::vector<Block> blocks;
    // Eviction caches only: slot bookkeeping (slot = block * block_tokens + offset).
    std::vector<std::uint64_t> valid;       // words_per_block words per block; bit set = live slot
    std::vector<std::int32_t> slot_token;   // cache index held by each slot, -1 when free
    std::vector<float> slot_score;          // cumulative attention mass (H2O) / SnapKV scores
    std::vector<std::int32_t> free_slots;   // reusable slots
    std::deque<std::int32_t> fifo;          // SinkWindow: evictable slots, oldest first
    std::vector<float> pend_score;          // score of each pending token (parallel to pend_pos)
    std::vector<std::uint64_t> block_live;  // BlockSparse: one bit per block, set = live (not masked)
    std::int64_t live = 0;                  // live slots

    Head() = default;
    Head(Head&&) noexcept = default;  // vector<Head> must move, never copy, its blocks
    Head& operator=(Head&&) noexcept = default;
  };

  struct Layer {
    std::vector<float> sink_k, sink_v;          // [sinks_held][kv_heads][D]
    std::vector<std::int32_t> sink_pos;
    std::vector<float> pend_k, pend_v;          // [pending][kv_heads][D], oldest first
    std::vector<std::int32_t> pend_pos;
    std::vector<float> chunk_k, chunk_v;        // exact copy of the latest append
    std::vector<Head> heads;                    // [kv_head]
    std::vector<float> obs_q;                   // SnapKV: last queries, [n][q_heads][D]
    std::int64_t obs_first = 0;                 // cache index of obs_q's first row
    std::int64_t sinks_held = 0, committed = 0, total = 0, chunk_tokens = 0;
    bool compressed = false;                    // SnapKV: prompt already compressed
  };

  explicit KVCache(const ModelShape& shape)
      : shape_(shape), layout_(make_block_layout<key_codec, value_codec, keys_per_channel>(block_tokens, shape.head_dim)) {
    if constexpr (is_block_sparse) {
      budget_ = EvictP::budget_type::resolve(shape.max_tokens);
    } else if constexpr (is_snapkv) {
      budget_ = EvictP::fixed_budget;
    } else if constexpr (is_sink_window || is_h2o) {
      budget_ = EvictP::resolve_budget(shape.max_tokens);
      recent_ = EvictP::recent_for(budget_);
    }
    reset();
  }

  [[nodiscard]] std::size_t row_floats() const noexcept {
    return static_cast<std::size_t>(shape_.kv_heads) * static_cast<std::size_t>(shape_.head_dim);
  }
  // Tokens held by the layer (the largest over KV heads).
  [[nodiscard]] std::int64_t held(const Layer& L) const noexcept {
    if constexpr (evicts) {
      std::int64_t live = 0;
      for (const Head& H : L.heads) live = std::max(live, H.live);
      return L.sinks_held + live + static_cast<std::int64_t>(L.pend_pos.size());
    } else {
      return L.total;
    }
  }

  // Upper bound on the tokens `layer` holds once an append of n tokens (and the eviction it
  // triggers) is done. Without eviction, and for SnapKV/BlockSparse outside the cases below: held + n.
  // SinkWindow/H2O evict until sinks + live + pending <= budget, or until only protected tokens are
  // left: sinks (the first max(Sinks<N>, policy S) tokens: both name the same first tokens),
  // pending tokens (<= residual + n after the lazy commit) and committed tokens among the Recent
  // newest (<= Recent - pending).
  // SnapKV: a single-token append that triggers compression leaves <= sinks + kept + residual + 1,
  // kept = the tokens per KV head the compression keeps (window included).
  // SnapKV: whether appending n tokens to L compresses its prompt first (the first single-token
  // append after a prompt longer than what compression keeps).
  [[nodiscard]] static bool compresses_on(const Layer& L, std::int64_t n) noexcept {
    return !L.compressed && n == 1 && L.total > EvictP::held_after_compression(L.total);
  }

  [[nodiscard]] std::int64_t held_after(const Layer& L, std::int64_t n) const noexcept {
    const std::int64_t plain = held(L) + n;
    if constexpr (is_sink_window || is_h2o) {
      const std::int64_t floor = std::max<std::int64_t>(sink_tokens, EvictP::sink_tokens) +
                                 std::max<std::int64_t>(recent_, std::int64_t{residual_tokens} + n);
      return std::min(plain, std::max<std::int64_t>(budget_, floor));
    } else if constexpr (is_snapkv) {
      if (compresses_on(L, n))  // kept: Budget + Window, or a fraction of the prompt
        return std::min(plain, std::int64_t{sink_tokens} + EvictP::held_after_compression(L.total) + residual_tokens + 1);
      return plain;
    } else {
      return plain;
    }
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

  // ---- attention plumbing ----------------------------------------------------------------------

  kernels::AttendArgs args_for(const Layer& L, int h, const float* q, float* out, std::int64_t n_q, int group) const {
    (void)h;
    kernels::AttendArgs a;
    a.head_dim = shape_.head_dim;
    a.group = group;
    a.n_q = static_cast<int>(n_q);
    a.q_first = L.total - n_q;
    a.scale = shape_.attn_scale > 0.f ? shape_.attn_scale : 1.f / std::sqrt(static_cast<float>(shape_.head_dim));
    a.q = q;
    a.q_stride = static_cast<std::int64_t>(shape_.q_heads) * shape_.head_dim;
    a.out = out;
    a.out_stride = a.q_stride;
    return a;
  }

  // Segments of KV head h: sinks, blocks (masked for eviction caches), pending before the latest
  // chunk, and the latest chunk (exact). Fills refs (refs_ unless given: one vector per head when
  // the heads run in parallel).
  kernels::HeadSegments segments(const Layer& L, int h) { return segments(L, h, refs_); }
  kernels::HeadSegments segments(const Layer& L, int h, std::vector<kernels::BlockRef>& refs) {
    const int D = shape_.head_dim;
    const std::int64_t stride = static_cast<std::int64_t>(row_floats());
    const std::int64_t hoff = static_cast<std::int64_t>(h) * D;
    const std::int64_t chunk_start = L.total - L.chunk_tokens;
    const Head& H = L.heads[static_cast<std::size_t>(h)];
    kernels::HeadSegments seg;
    // Rows of head h inside a [tokens][kv_heads][D] buffer; an empty buffer gives no rows (and no
    // pointer arithmetic on its null data()).
    auto rows = [&](const std::vector<float>& buf, std::int64_t first_row) -> const float* {
      return buf.empty() ? nullptr : buf.data() + first_row * stride + hoff;
    };
    seg.sinks = {rows(L.sink_k, 0), rows(L.sink_v, 0), stride, 0, L.sinks_held};
    refs.clear();
    const auto pend_n = static_cast<std::int64_t>(L.pend_pos.size());
    const std::int64_t pend_first = L.total - pend_n;
    if constexpr (evicts) {
      const auto n_slots = static_cast<std::int64_t>(H.slot_token.size());
      for (std::size_t b = 0; b < H.blocks.size(); ++b) {
        const std::uint64_t* w = H.valid.data() + b * words_per_block;
        bool any = false;
        if constexpr (is_block_sparse) {
          any = ((H.block_live[b / 64] >> (b % 64)) & 1u) != 0;  // a masked-out block: count 0, never read
        } else {
          for (std::size_t i = 0; i < words_per_block; ++i) any |= w[i] != 0;
        }
        const std::int64_t count =
            any ? std::min<std::int64_t>(block_tokens, n_slots - static_cast<std::int64_t>(b) * block_tokens) : 0;
        refs.push_back({H.blocks[b].data.get(), 0, static_cast<int>(count), w});  // count 0: skipped unread
      }
    } else {
      for (const Block& b : H.blocks) {
        const std::int64_t first = L.sinks_held + static_cast<std::int64_t>(refs.size()) * block_tokens;
        const std::int64_t count = std::min<std::int64_t>(b.header.count, chunk_start - first);
        if (count <= 0) break;
        const std::byte* data = b.data.get();
        if constexpr (offloads) {
          if (!data) data = off_.view(h, refs.size());  // pinned by begin_attend
        }
        refs.push_back({data, first, static_cast<int>(count), nullptr, b.header.flags});
      }
    }
    seg.blocks = refs;
    const std::int64_t pend_count = std::max<std::int64_t>(0, chunk_start - pend_first);
    seg.pending = {rows(L.pend_k, 0), rows(L.pend_v, 0), stride, pend_first, std::min(pend_count, pend_n)};
    const std::int64_t chunk_first = std::max<std::int64_t>(chunk_start, L.sinks_held);
    const std::int64_t skip = chunk_first - chunk_start;
    seg.chunk = {rows(L.chunk_k, skip), rows(L.chunk_v, skip), stride, chunk_first, L.total - chunk_first};
    return seg;
  }

  [[nodiscard]] static std::int64_t ordinals(const kernels::HeadSegments& seg) noexcept {
    return seg.sinks.count + static_cast<std::int64_t>(seg.blocks.size()) * block_tokens + seg.pending.count +
           seg.chunk.count;
  }

  void run_kernel(const kernels::AttendArgs& a, const kernels::HeadSegments& seg) { run_kernel(a, seg, scratch_); }
  void run_kernel(const kernels::AttendArgs& a, const kernels::HeadSegments& seg, kernels::Scratch& s) const {
    if constexpr (any_keyframe)
      kernels::attend_keyframe<key_codec, value_codec>(a, seg, layout_, s);
    else
      kernels::attend<backend_tag, key_codec, value_codec, keys_per_channel>(a, seg, layout_, s);
  }

  // Adds `mass` (ordinal layout of AttendArgs::key_mass) to slot and pending scores of head h.
  void credit_mass(Layer& L, int h, const kernels::HeadSegments& seg, std::span<const float> mass) {
    Head& H = L.heads[static_cast<std::size_t>(h)];
    std::int64_t o = seg.sinks.count;
    const auto n_slots = static_cast<std::int64_t>(H.slot_score.size());
    for (std::size_t b = 0; b < seg.blocks.size(); ++b, o += block_tokens)
      for (std::int64_t t = 0; t < seg.blocks[b].count; ++t) {
        const std::int64_t slot = static_cast<std::int64_t>(b) * block_tokens + t;
        if (slot < n_slots) H.slot_score[static_cast<std::size_t>(slot)] += mass[static_cast<std::size_t>(o + t)];
      }
    // Pending rows then chunk rows are consecutive pending tokens (the chunk is the pending tail).
    const std::int64_t pend_first_ord = seg.sinks.count + static_cast<std::int64_t>(seg.blocks.size()) * block_tokens;
    const std::int64_t pend_first_index = L.total - static_cast<std::int64_t>(L.pend_pos.size());
    auto credit = [&](const kernels::ExactRows& r, std::int64_t ord) {
      for (std::int64_t t = 0; t < r.count; ++t) {
        const std::int64_t p = r.first + t - pend_first_index;
        if (p >= 0 && p < static_cast<std::int64_t>(H.pend_score.size()))
          H.pend_score[static_cast<std::size_t>(p)] += mass[static_cast<std::size_t>(ord + t)];
      }
    };
    credit(seg.pending, pend_first_ord);
    credit(seg.chunk, pend_first_ord + seg.pending.count);
  }

  // ---- commit and eviction -----------------------------------------------------------------------

  // Quantizes the oldest pending tokens beyond the residual window into blocks, in whole commit
  // units (1 token, or one key group of tokens for per-channel keys).
  void commit(Layer& L) {
    constexpr std::int64_t unit = any_keyframe ? keyframe_interval : keys_per_channel ? key_codec::group_size : 1;
    const auto pending = static_cast<std::int64_t>(L.pend_pos.size());
    std::int64_t keep = residual_tokens;
    if constexpr (is_snapkv)  // until compression, the observation window stays exact (causal scoring)
      if (!L.compressed) keep = std::max<std::int64_t>(keep, EvictP::window);
    const std::int64_t n_commit = (pending - keep) / unit * unit;
    if (n_commit <= 0) return;
    const std::size_t D = static_cast<std::size_t>(shape_.head_dim);
    const std::size_t stride = row_floats();
    const BlockLayout& BL = layout_;
    const std::int64_t first_index = L.total - pending;
    for (std::int64_t t0 = 0; t0 < n_commit; t0 += unit) {
      for (int h = 0; h < shape_.kv_heads; ++h) {
        Head& H = L.heads[static_cast<std::size_t>(h)];
        const std::size_t hoff = static_cast<std::size_t>(h) * D;
        std::int64_t slot;
        if constexpr (evicts) {
          slot = take_slot(H);
          const auto su = static_cast<std::size_t>(slot);
          H.valid[su / block_tokens * words_per_block + (su % block_tokens) / 64] |= std::uint64_t{1} << ((su % block_tokens) % 64);
          H.slot_token[su] = static_cast<std::int32_t>(first_index + t0);
          H.slot_score[su] = H.pend_score[static_cast<std::size_t>(t0)];
          if constexpr (is_sink_window)  // only SinkWindow consumes the FIFO (others would grow it for ever)
            if (first_index + t0 >= EvictP::sink_tokens) H.fifo.push_back(static_cast<std::int32_t>(slot));
          ++H.live;
        } else {
          slot = L.committed;
          if (slot % block_tokens == 0) H.blocks.push_back(new_block());
        }
        Block& b = H.blocks[static_cast<std::size_t>(slot / block_tokens)];
        const auto off = static_cast<std::size_t>(slot % block_tokens);
        std::byte* d = b.data.get();
        if constexpr (keys_keyframe) {
          const bool delta = key_codec::encode_interval(L.pend_k.data() + static_cast<std::size_t>(t0) * stride + hoff,
                                                        static_cast<std::ptrdiff_t>(stride), static_cast<int>(unit),
                                                        static_cast<int>(D), d + BL.k_codes);
          b.header.flags = static_cast<std::uint8_t>((b.header.flags & ~2u) | (delta ? 2u : 0u));
        }
        if constexpr (values_keyframe) {
          const bool delta = value_codec::encode_interval(L.pend_v.data() + static_cast<std::size_t>(t0) * stride + hoff,
                                                          static_cast<std::ptrdiff_t>(stride), static_cast<int>(unit),
                                                          static_cast<int>(D), d + BL.v_codes);
          b.header.flags = static_cast<std::uint8_t>((b.header.flags & ~4u) | (delta ? 4u : 0u));
        }
        if constexpr (keys_per_channel) {
          encode_channels<key_codec>(L.pend_k.data() + static_cast<std::size_t>(t0) * stride + hoff,
                                     static_cast<std::ptrdiff_t>(stride), static_cast<int>(D),
                                     d + BL.k_codes + off * BL.k_row, BL.k_row,
                                     d + BL.k_meta + off / static_cast<std::size_t>(unit) * BL.k_meta_group);
        }
        for (std::int64_t u = 0; u < unit; ++u) {
          const auto t = static_cast<std::size_t>(t0 + u);
          const auto s = off + static_cast<std::size_t>(u);
          if constexpr (!keys_per_channel && !keys_keyframe)
            encode_row<key_codec>(L.pend_k.data() + t * stride + hoff, static_cast<int>(D), d + BL.k_codes + s * BL.k_row,
                                  d + BL.k_meta + s * BL.k_meta_token);
          if constexpr (!values_keyframe)
            encode_row<value_codec>(L.pend_v.data() + t * stride + hoff, static_cast<int>(D), d + BL.v_codes + s * BL.v_row,
                                    d + BL.v_meta + s * BL.v_meta_token);
          std::memcpy(d + BL.positions + s * sizeof(std::int32_t), &L.pend_pos[t], sizeof(std::int32_t));
        }
        if (!evicts || off + static_cast<std::size_t>(unit) > b.header.count)
          b.header.count = static_cast<std::uint16_t>(std::max<std::size_t>(b.header.count, off + static_cast<std::size_t>(unit)));
        ++b.header.version;
        // Evict as we go, so a long prefill reuses slots instead of growing the pool past the budget.
        if constexpr (evicts) enforce_budget(L, H, pending - (t0 + unit));
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
    if constexpr (evicts)
      for (Head& H : L.heads) H.pend_score.erase(H.pend_score.begin(), H.pend_score.begin() + n_commit);
    if constexpr (offloads) {  // hand blocks that became full (and old enough) to the offload store
      const auto li = static_cast<int>(&L - layers_.data());
      for (int h = 0; h < shape_.kv_heads; ++h) off_.hand_over(li, h, L.heads[static_cast<std::size_t>(h)].blocks);
    }
  }

  // A free slot (reused first), growing the slot pool by one block when needed.
  std::int64_t take_slot(Head& H) {
    if (!H.free_slots.empty()) {
      const std::int32_t s = H.free_slots.back();
      H.free_slots.pop_back();
      return s;
    }
    const auto s = static_cast<std::int64_t>(H.slot_token.size());
    if (s % block_tokens == 0) {
      H.blocks.push_back(new_block());
      H.valid.resize(H.valid.size() + words_per_block, 0);
      if constexpr (is_block_sparse) {
        const std::size_t b = H.blocks.size() - 1;
        if (b / 64 >= H.block_live.size()) H.block_live.push_back(0);
        H.block_live[b / 64] |= std::uint64_t{1} << (b % 64);
      }
    }
    H.slot_token.push_back(-1);
    H.slot_score.push_back(0.f);
    return s;
  }

  void evict_slot(Head& H, std::int64_t slot) {
    const auto su = static_cast<std::size_t>(slot);
    H.valid[su / block_tokens * words_per_block + (su % block_tokens) / 64] &= ~(std::uint64_t{1} << ((su % block_tokens) % 64));
    std::byte* d = H.blocks[su / block_tokens].data.get();
    const std::size_t off = su % block_tokens;
    detail::secure_zero(d + layout_.k_codes + off * layout_.k_row, layout_.k_row);
    detail::secure_zero(d + layout_.k_meta + off * layout_.k_meta_token, layout_.k_meta_token);
    detail::secure_zero(d + layout_.v_codes + off * layout_.v_row, layout_.v_row);
    detail::secure_zero(d + layout_.v_meta + off * layout_.v_meta_token, layout_.v_meta_token);
    detail::secure_zero(d + layout_.positions + off * sizeof(std::int32_t), sizeof(std::int32_t));
    ++H.blocks[su / block_tokens].header.version;
    H.slot_token[su] = -1;
    H.slot_score[su] = 0.f;
    H.free_slots.push_back(static_cast<std::int32_t>(slot));
    --H.live;
  }

  // SinkWindow / H2O: evict committed tokens until the layer holds at most the budget.
  void enforce_budget(Layer& L) {
    for (Head& H : L.heads) enforce_budget(L, H, static_cast<std::int64_t>(L.pend_pos.size()));
  }

  // Evicts from head H until sinks + live slots + `pend` pending tokens fit the budget (or only
  // sinks, recent and pending tokens are left).
  void enforce_budget(Layer& L, Head& H, std::int64_t pend) {
    if constexpr (is_sink_window || is_h2o) {
      const std::int64_t recent_from = L.total - recent_;  // tokens at or after: recent
      while (L.sinks_held + H.live + pend > budget_) {
        std::int64_t victim = -1;
        if constexpr (is_sink_window) {
          while (!H.fifo.empty() && H.slot_token[static_cast<std::size_t>(H.fifo.front())] < 0) H.fifo.pop_front();
          if (!H.fifo.empty() && H.slot_token[static_cast<std::size_t>(H.fifo.front())] < recent_from) {
            victim = H.fifo.front();
            H.fifo.pop_front();
          }
        } else {
          for (std::size_t s = 0; s < H.slot_token.size(); ++s) {
            const std::int32_t tok = H.slot_token[s];
            if (tok < EvictP::sink_tokens || tok >= recent_from) continue;  // free, sink or recent
            if (victim < 0 || H.slot_score[s] < H.slot_score[static_cast<std::size_t>(victim)] ||
                (H.slot_score[s] == H.slot_score[static_cast<std::size_t>(victim)] &&
                 tok < H.slot_token[static_cast<std::size_t>(victim)]))
              victim = static_cast<std::int64_t>(s);
          }
        }
        if (victim < 0) break;
        evict_slot(H, victim);
      }
    } else if constexpr (is_block_sparse) {
      enforce_block_budget(L, H, pend);
    } else {
      (void)L, (void)H, (void)pend;
    }
  }

  [[nodiscard]] static bool block_is_live(const Head& H, std::size_t b) noexcept {
    return ((H.block_live[b / 64] >> (b % 64)) & 1u) != 0;
  }

  // BlockSparse: evicts whole blocks (lowest summed mass first, oldest on ties; never the first
  // sink_blocks, the open block or the recent_blocks before it) until the head fits the budget,
  // then compacts when at least half of the allocated blocks are masked out.
  void enforce_block_budget(Layer& L, Head& H, std::int64_t pend) {
    if constexpr (is_block_sparse) {
      constexpr auto B = static_cast<std::size_t>(block_tokens);
      while (L.sinks_held + H.live + pend > budget_) {
        const std::size_t nb = H.blocks.size();
        const std::size_t protected_tail = static_cast<std::size_t>(EvictP::recent_blocks) + 1;
        if (nb <= protected_tail) break;
        std::int64_t victim = -1;
        double best = 0;
        for (std::size_t b = static_cast<std::size_t>(EvictP::sink_blocks); b < nb - protected_tail; ++b) {
          if (!block_is_live(H, b)) continue;
          double score = 0;
          for (std::size_t t = 0; t < B; ++t) score += H.slot_score[b * B + t];
          if (victim < 0 || score < best) victim = static_cast<std::int64_t>(b), best = score;
        }
        if (victim < 0) break;
        evict_block(H, static_cast<std::size_t>(victim));
      }
      std::size_t live_blocks = 0;
      for (std::uint64_t w : H.block_live) live_blocks += static_cast<std::size_t>(std::popcount(w));
      if (live_blocks < H.blocks.size() && H.blocks.size() - live_blocks >= live_blocks) compact(H);
    } else {
      (void)L, (void)H, (void)pend;
    }
  }

  // BlockSparse: masks out block b of H (bit cleared, slots forgotten). The block bit alone hides
  // the block from attention (its slot validity words are left as they were); the payload is
  // zeroed and freed by the next compaction.
  void evict_block(Head& H, std::size_t b) {
    H.block_live[b / 64] &= ~(std::uint64_t{1} << (b % 64));
    for (std::size_t t = 0; t < static_cast<std::size_t>(block_tokens); ++t) {
      const std::size_t su = b * static_cast<std::size_t>(block_tokens) + t;
      if (H.slot_token[su] >= 0) --H.live;
      H.slot_token[su] = -1;
      H.slot_score[su] = 0.f;
    }
    ++H.blocks[b].header.version;
  }

  // SnapKV: remembers the latest queries (up to the observation window) of a layer.
  void remember_queries(Layer& L, std::span<const float> q, std::int64_t n_q) {
    const std::size_t qrow = static_cast<std::size_t>(shape_.q_heads) * static_cast<std::size_t>(shape_.head_dim);
    const std::int64_t first = L.total - n_q;
    const auto have = static_cast<std::int64_t>(L.obs_q.size() / qrow);
    if (have == 0 || L.obs_first + have != first) {  // not contiguous with what we had: restart
      L.obs_q.clear();
      L.obs_first = first;
    }
    L.obs_q.insert(L.obs_q.end(), q.begin(), q.end());
    const auto rows = static_cast<std::int64_t>(L.obs_q.size() / qrow);
    if (rows > EvictP::window) {
      const auto drop = static_cast<std::size_t>(rows - EvictP::window) * qrow;
      L.obs_q.erase(L.obs_q.begin(), L.obs_q.begin() + static_cast<std::ptrdiff_t>(drop));
      L.obs_first += rows - EvictP::window;
    }
  }

  // SnapKV: score the prompt with the remembered observation-window queries, keep the top budget
  // per KV head plus the window, and compact the survivors into dense blocks.
  void compress_layer(Layer& L) {
    if constexpr (is_snapkv) {
      const int group = shape_.q_heads / shape_.kv_heads;
      const std::size_t qrow = static_cast<std::size_t>(shape_.q_heads) * static_cast<std::size_t>(shape_.head_dim);
      const auto n_obs = static_cast<std::int64_t>(L.obs_q.size() / qrow);
      std::vector<std::vector<float>> head_mass(static_cast<std::size_t>(shape_.kv_heads));
      std::vector<float> out(static_cast<std::size_t>(n_obs) * qrow);
      // The queries sit at cache indices obs_first..; their keys are all exact rows (commit() holds
      // the window back until compression: pending, then the latest chunk), which the kernel masks
      // causally by cache index, so no window query sees a later token.
      for (int h = 0; h < shape_.kv_heads && n_obs > 0; ++h) {
        const kernels::HeadSegments seg = segments(L, h);
        std::vector<float>& agg = head_mass[static_cast<std::size_t>(h)];
        agg.assign(static_cast<std::size_t>(ordinals(seg)), 0.f);
        for (int j = 0; j < group; ++j) {  // one query head at a time: mean or max over the group
          const std::int64_t qoff = (static_cast<std::int64_t>(h) * group + j) * shape_.head_dim;
          kernels::AttendArgs a = args_for(L, h, L.obs_q.data() + qoff, out.data() + qoff, n_obs, 1);
          a.q_first = L.obs_first;
          mass_.assign(agg.size(), 0.f);
          a.key_mass = mass_.data();
          run_kernel(a, seg);
          for (std::size_t o = 0; o < agg.size(); ++o)
            agg[o] = EvictP::aggregate == GroupAggregate::max ? std::max(agg[o], mass_[o]) : agg[o] + mass_[o] / group;
        }
        for (float& x : L.heads[static_cast<std::size_t>(h)].slot_score) x = 0.f;
        for (float& x : L.heads[static_cast<std::size_t>(h)].pend_score) x = 0.f;
        credit_mass(L, h, seg, agg);
      }
      // Tokens per KV head kept: the window plus the top (kept - window); L.total is the prompt.
      const std::int64_t kept_total = EvictP::held_after_compression(L.total);
      budget_ = kept_total;
      L.compressed = true;  // set first: commit() then no longer holds the window back
      commit(L);  // the prompt's pending tokens take slots (carrying their scores) before selection
      const std::int64_t window_from = L.total - EvictP::window;
      for (Head& H : L.heads) {
        std::vector<std::pair<std::int32_t, std::int32_t>> cand;  // (token, slot) outside the window
        for (std::size_t s = 0; s < H.slot_token.size(); ++s)
          if (H.slot_token[s] >= 0 && H.slot_token[s] < window_from)
            cand.emplace_back(H.slot_token[s], static_cast<std::int32_t>(s));
        std::sort(cand.begin(), cand.end());
        std::vector<float> raw(cand.size());
        for (std::size_t i = 0; i < cand.size(); ++i) raw[i] = H.slot_score[static_cast<std::size_t>(cand[i].second)];
        const auto keep = ::kvpack::eviction::snapkv_select(raw, EvictP::kernel, kept_total - EvictP::window);
        std::vector<char> kept(cand.size(), 0);
        for (std::int64_t i : keep) kept[static_cast<std::size_t>(i)] = 1;
        for (std::size_t i = 0; i < cand.size(); ++i)
          if (!kept[i]) evict_slot(H, cand[i].second);
        compact(H);
      }
      L.compressed = true;
      detail::wipe_vector(L.obs_q);
    }
  }

  // Rewrites the live slots of H densely, in cache-index order, into fresh blocks; frees the rest.
  void compact(Head& H) {
    std::vector<std::pair<std::int32_t, std::int32_t>> live;  // (token, slot)
    for (std::size_t s = 0; s < H.slot_token.size(); ++s)
      if (H.slot_token[s] >= 0) live.emplace_back(H.slot_token[s], static_cast<std::int32_t>(s));
    std::sort(live.begin(), live.end());
    Head fresh;
    const BlockLayout& BL = layout_;
    for (const auto& [tok, slot] : live) {
      const std::int64_t ns = take_slot(fresh);
      const auto src_off = static_cast<std::size_t>(slot % block_tokens), dst_off = static_cast<std::size_t>(ns % block_tokens);
      const std::byte* src = H.blocks[static_cast<std::size_t>(slot / block_tokens)].data.get();
      Block& db = fresh.blocks[static_cast<std::size_t>(ns / block_tokens)];
      std::byte* dst = db.data.get();
      std::memcpy(dst + BL.k_codes + dst_off * BL.k_row, src + BL.k_codes + src_off * BL.k_row, BL.k_row);
      std::memcpy(dst + BL.k_meta + dst_off * BL.k_meta_token, src + BL.k_meta + src_off * BL.k_meta_token, BL.k_meta_token);
      std::memcpy(dst + BL.v_codes + dst_off * BL.v_row, src + BL.v_codes + src_off * BL.v_row, BL.v_row);
      std::memcpy(dst + BL.v_meta + dst_off * BL.v_meta_token, src + BL.v_meta + src_off * BL.v_meta_token, BL.v_meta_token);
      std::memcpy(dst + BL.positions + dst_off * 4, src + BL.positions + src_off * 4, 4);
      db.header.count = static_cast<std::uint16_t>(dst_off + 1);
      const auto su = static_cast<std::size_t>(ns);
      fresh.valid[su / block_tokens * words_per_block + (su % block_tokens) / 64] |= std::uint64_t{1} << ((su % block_tokens) % 64);
      fresh.slot_token[su] = tok;
      fresh.slot_score[su] = H.slot_score[static_cast<std::size_t>(slot)];
      if constexpr (is_sink_window)
        if (tok >= EvictP::sink_tokens) fresh.fifo.push_back(static_cast<std::int32_t>(ns));
      ++fresh.live;
    }
    for (Block& b : H.blocks) detail::secure_zero(b.data.get(), layout_.bytes);
    fresh.pend_score = std::move(H.pend_score);
    H = std::move(fresh);
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
      for (Head& H : L.heads)
        for (Block& b : H.blocks)
          if (b.data) detail::secure_zero(b.data.get(), layout_.bytes);
      detail::wipe_vector(L.sink_k);
      detail::wipe_vector(L.sink_v);
      detail::wipe_vector(L.pend_k);
      detail::wipe_vector(L.pend_v);
      detail::wipe_vector(L.chunk_k);
      detail::wipe_vector(L.chunk_v);
      detail::wipe_vector(L.obs_q);
      detail::wipe_vector(L.sink_pos);
      detail::wipe_vector(L.pend_pos);
    }
    layers_.clear();
  }

  ModelShape shape_;
  BlockLayout layout_;
  std::int64_t budget_ = 0;  // eviction budget in tokens per (layer, KV head); 0 without eviction
  std::int64_t recent_ = 0;  // SinkWindow / H2O: recent tokens never evicted (resolved with budget_)
  std::vector<Layer> layers_;
  kernels::Scratch scratch_;
  std::vector<kernels::BlockRef> refs_;
  std::vector<float> mass_;
  std::vector<std::vector<float>> head_mass_;  // H2O/BlockSparse: each KV head's mass of the current attend
  struct Parallel {  // set_executor(): attend's executor, chunks per head and their working memory
    Executor exec;
    int splits = 1;
    kernels::ParallelScratch scratch;
    std::vector<std::vector<kernels::BlockRef>> refs;
    std::vector<kernels::HeadJob> jobs;
  } par_;
  typename OffloadP::state off_;  // offload store and attend-time handles (empty without Offload<>)
};

}  // namespace kvpack
