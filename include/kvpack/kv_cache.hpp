// KVCache<Policy...>: the compressed key-value cache of one sequence, all layers. A facade: it
// resolves the policies, owns the storage (SequenceStore), and calls hook objects at named points
// of the token lifecycle: the codec hook (commit/encode, attend, decode), the eviction policy's
// hook (append, commit, attend mass and queries, budget) and the offload state (commit, attend,
// read_back, reset). DESIGN.md has the table of hooks and who implements them.
#pragma once

#include <algorithm>
#include <cmath>
#include <cstddef>
#include <cstdint>
#include <limits>
#include <span>
#include <string>
#include <type_traits>
#include <utility>
#include <vector>

#include "kvpack/cache/append_tokens.hpp"
#include "kvpack/cache/block.hpp"
#include "kvpack/cache/block_import.hpp"
#include "kvpack/cache/codec_hook.hpp"
#include "kvpack/cache/demoted_attend.hpp"
#include "kvpack/cache/input_checks.hpp"
#include "kvpack/cache/inspect.hpp"
#include "kvpack/cache/offload_hooks.hpp"
#include "kvpack/cache/policy_checks.hpp"
#include "kvpack/cache/rope_state.hpp"
#include "kvpack/cache/sequence_store.hpp"
#include "kvpack/cache/shape.hpp"
#include "kvpack/cache/workspace.hpp"
#include "kvpack/eviction/policies.hpp"
#include "kvpack/policy.hpp"
#include "kvpack/result.hpp"
#include "kvpack/kernels/dispatch.hpp"

namespace kvpack {

/// The KV cache of one sequence, composed from policies (order-free; missing roles get defaults):
///  * Keys<Codec, PerToken|PerChannel>  (default Keys<Fp32>)
///  * Values<Codec>                     (default Values<Fp32>)
///  * Sinks<N>      first N tokens kept in fp32 for ever (default 0)
///  * Residual<R>   most recent R tokens kept in fp32 (default 0)
///  * Blocks<B>     tokens per storage block (default 64, or the per-channel key group if larger)
///  * Backend<Tag>  kernel choice (default Auto); the SIMD backends also quantize on commit
///  * an eviction policy (eviction/: SinkWindow, H2O, SnapKV, BlockSparse, TOVA, ...; default
///    NoEviction): any type of role::eviction naming its hook (eviction/hook.hpp)
///  * offload::Offload<Tiers..., Prefetch<N>>  move full blocks to host/file tiers within a
///                  resident budget (default NoOffload; include/kvpack/offload/cache_offload.hpp)
///  * Demote<Keys<LK>, Values<LV>>  with an eviction policy: dropped tokens are re-coded into a
///                  low-precision tier and still attended (default NoDemotion; cache/demotion_tier.hpp)
///  * PreRope<OriginalPositions | CacheRelative>  keys and queries arrive before RoPE and the
///                  kernels rotate them (default PostRope; kernels/rope.hpp, ModelShape::rope_*)
///
/// Keyframe<Interval, ...> codecs (codec/keyframe.hpp) for K and/or V: blocks hold exactly one
/// interval (Blocks<> defaults to Interval; another size is a compile error), tokens are committed
/// a whole interval at a time (up to Interval - 1 newest tokens wait in fp32, as KIVI's key group),
/// and attention runs the scalar keyframe kernel on every backend (cache/keyframe_hook.hpp). Not
/// combinable with eviction policies.
///
/// Token lifecycle per layer (cache/sequence_store.hpp): appended tokens fill the sinks first,
/// then a full-precision pending list; at the end of every append, the oldest pending tokens
/// beyond the residual window are quantized into blocks, one commit unit at a time (1 token, a
/// per-channel key group, a keyframe interval), so codes depend only on the tokens, never on how
/// they were chunked (CASES C12). Attention reads sinks and pending tokens exactly, quantized
/// blocks through the fused kernel, and the tokens of the latest append exactly (CASES C5).
///
/// Positions: stored as the engine passes them, never renumbered; keys arrive post-RoPE, or pre-RoPE
/// with PreRope<> (attention rotates them at the stored positions, or at their rank among the held
/// tokens with CacheRelative). Thread safety: none; one cache per sequence, or external locking.
template <class... Policies>
class KVCache {
  static_assert(((!std::is_void_v<detail::role_of_t<Policies>>) && ...),
                "kvpack::KVCache<...>: every template argument must be a kvpack policy: Keys<>, Values<>, "
                "Sinks<>, Residual<>, Blocks<>, Backend<>, Offload<>, Demote<> or an eviction policy");
  static_assert(cache_detail::check_roles<Policies...>());  // at most one policy per role

  using KeysP = detail::find_role_t<role::keys, Keys<Fp32>, Policies...>;
  using ValuesP = detail::find_role_t<role::values, Values<Fp32>, Policies...>;
  using EvictP = detail::find_role_t<role::eviction, NoEviction, Policies...>;
  using OffloadP = detail::find_role_t<role::offload, NoOffload, Policies...>;
  using DemoteP = detail::find_role_t<role::demotion, NoDemotion, Policies...>;
  using RopeP = detail::find_role_t<role::rope, PostRope, Policies...>;

 public:
  using key_codec = typename KeysP::codec;
  using value_codec = typename ValuesP::codec;
  /// Attention kernel backend: the Backend<> policy's tag (default Auto) resolved at compile time
  /// by kernels/dispatch.hpp to Avx2, Neon or Scalar; an unavailable forced backend fails here.
  using backend_tag =
      kernels::resolved_backend_t<typename detail::find_role_t<role::backend, Backend<Auto>, Policies...>::tag>;
  static constexpr bool keys_per_channel = KeysP::per_channel;
  /// The codec hook (cache/codec_hook.hpp) and the eviction policy's hook (eviction/hook.hpp).
  using codec_hook = CodecHook<key_codec, value_codec, keys_per_channel, backend_tag>;
  using eviction_policy = EvictP;
  using eviction_hook = typename EvictP::hook;
  static constexpr bool evicts = EvictP::evicts;
  /// Whether the policy holds at most its budget as tokens arrive (SinkWindow, H2O, BlockSparse,
  /// TOVA; not SnapKV, which compresses once and then grows).
  static constexpr bool evicts_continuously = evicts && eviction_hook::evicts_continuously;
  static constexpr int sink_tokens = detail::find_role_t<role::sinks, Sinks<0>, Policies...>::count;
  static constexpr int residual_tokens = detail::find_role_t<role::residual, Residual<0>, Policies...>::tokens;
  static constexpr int block_tokens = detail::find_role_t<
      role::blocks,
      Blocks<(eviction_hook::required_block_tokens ? eviction_hook::required_block_tokens
              : codec_hook::required_block_tokens  ? codec_hook::required_block_tokens
                                                   : codec_hook::preferred_block_tokens)>,
      Policies...>::tokens;
  /// Bits per stored value, metadata included (full-precision sinks/residual not included); for a
  /// Keyframe<...> codec the bound of its larger mode (stored_bits() measures what is held).
  static constexpr double key_bits_per_value = key_codec::bits_per_value;
  static constexpr double value_bits_per_value = value_codec::bits_per_value;
  /// Offload<> present: full blocks may live in an offload store (blocks() then shows them
  /// with a null `data`); attend() fetches them (see include/kvpack/offload/cache_offload.hpp).
  static constexpr bool offloads = OffloadP::enabled;
  /// Runtime options of the offload policy (an empty struct without one).
  using offload_options = typename OffloadP::options;
  /// Demote<> present: tokens the eviction policy drops go to a low-precision tier that attend()
  /// still reads (cache/demotion_tier.hpp); max_tokens bounds the high tier only.
  static constexpr bool demotes = DemoteP::enabled;
  /// The per-sequence storage (cache/sequence_store.hpp) and its demotion tier (NoDemotionTier: none).
  using tier_type = typename demotion_tier_of<DemoteP, codec_hook, backend_tag>::type;
  using store_type = SequenceStore<codec_hook, sink_tokens, residual_tokens, evicts, tier_type>;
  static constexpr bool pre_rope = RopeP::enabled;  ///< PreRope<>: keys and queries arrive before RoPE
  static constexpr bool rope_cache_relative = RopeP::cache_relative;
  /// Whether block slots store their int32 positions (eviction reuses slots); otherwise each layer
  /// keeps them once, run-length coded (block_positions(); PreRope's kernels get a base per block).
  static constexpr bool slot_positions = evicts;

  static_assert(cache_detail::check_policies<
      offloads, evicts, demotes, keys_per_channel, codec_hook::commit_unit, codec_hook::required_block_tokens,
      eviction_hook::required_block_tokens, block_tokens, key_codec::group_size, pre_rope, pre_rope && rope_cache_relative,
      codec_hook::interval_blocks,
      requires(eviction_hook& e, store_type& s, Workspace& w) { e.compress_prompt(s, w, 0); }>());

  /// Creates an empty cache for `shape`. Errors (Errc::invalid_argument): non-positive sizes,
  /// q_heads not a multiple of kv_heads, head_dim odd, above 65535 or not a multiple of a per-token
  /// group size, max_tokens above 2^31 - 1, an eviction budget the shape cannot hold. With an
  /// Offload<> policy, `offload` sets the resident budget, placement and tiers; its errors (bad
  /// options, libsodium unavailable) are returned too. Errc::out_of_memory (naming the bytes of the
  /// per-layer bookkeeping requested) when an allocation fails, e.g. layers = 1 << 30.
  [[nodiscard]] static Result<KVCache> create(const ModelShape& shape, const offload_options& offload = {}) {
    if (Status s = validate_shape(shape, codec_hook::K::row_group, codec_hook::V::row_group); !s) return s.error();
    if (Status s = eviction_hook::check(shape); !s) return s.error();
    if constexpr (pre_rope)
      if (Status s = validate_rope(shape); !s) return s.error();
    const std::size_t bytes = saturating_bytes(static_cast<std::uint64_t>(shape.layers), sizeof(typename store_type::Layer) +
                                               static_cast<std::size_t>(shape.kv_heads) * sizeof(HeadStore));
    return catch_alloc("KVCache::create", bytes, [&]() -> Result<KVCache> {  // Errc::out_of_memory
      KVCache c(shape);
      if (Status s = c.off_.init(c, offload); !s) return s.error();
      return Result<KVCache>(std::move(c));  // explicit: nvcc does not move into the Result implicitly
    });
  }

  /// Moves a cache. The moved-from cache is left empty with zero layers: every call on it then
  /// fails cleanly (layer out of range) instead of reading storage that moved away.
  KVCache(KVCache&&) noexcept = default;
  KVCache& operator=(KVCache&& o) noexcept {
    if (this != &o) {
      hook_.wipe();  // the store wipes itself on move-assignment
      store_ = std::move(o.store_), hook_ = std::move(o.hook_), ws_ = std::move(o.ws_), off_ = std::move(o.off_);
      rope_ = std::move(o.rope_);
    }
    return *this;
  }
  KVCache(const KVCache&) = delete;
  KVCache& operator=(const KVCache&) = delete;
  ~KVCache() { hook_.wipe(); }

  /// Appends n = positions.size() tokens to `layer`: a prefill chunk or one decode token.
  /// k, v: [n][kv_heads][head_dim] float32, row-major (keys post-RoPE); positions: [n].
  /// Errors, with nothing written: layer out of range, wrong sizes (Errc::invalid_argument), more
  /// than max_tokens tokens (Errc::capacity_exceeded; with an eviction policy, max_tokens bounds
  /// the tokens held after this append's eviction, not the tokens seen: SinkWindow<S, W> runs for
  /// ever with max_tokens = S + W when fed one token at a time; more than 2^31 - 1 tokens seen is
  /// Errc::capacity_exceeded too, cache indices being int32), a negative position
  /// (Errc::invalid_argument), NaN/Inf in k or v (Errc::non_finite, naming layer, KV head, token
  /// and channel). Positions need not increase (they are stored as given and never used to order
  /// tokens: attention order and causality follow arrival order). n = 0 is a no-op. Errc::out_of_memory
  /// when an allocation fails; everything is reserved before anything changes, so the cache is as it was.
  Status append(int layer, std::span<const float> k, std::span<const float> v, std::span<const std::int32_t> positions) {
    if (Status s = check_layer("append", layer); !s) return s;
    const auto n = static_cast<std::int64_t>(positions.size());
    if (Status s = cache_detail::check_append_sizes(shape(), layer, k, v, positions.size()); !s) return s;
    if (n == 0) return {};
    auto& L = store_.layer(layer);
    const std::int64_t bound = hook_.held_after(store_, layer, n);
    if (bound > shape().max_tokens)
      return fail(Errc::capacity_exceeded, "append: layer " + std::to_string(layer) + " holds " +
                                               std::to_string(store_.held(L)) + " tokens; " + std::to_string(n) +
                                               " more (up to " + std::to_string(bound) +
                                               " held after eviction) exceed max_tokens = " + std::to_string(shape().max_tokens));
    if (L.total + n > std::numeric_limits<std::int32_t>::max())
      return fail(Errc::capacity_exceeded, "append: layer " + std::to_string(layer) + " has seen " +
                                               std::to_string(L.total) + " tokens; cache indices are int32");
    if (Status s = cache_detail::check_append_positions(layer, positions); !s) return s;
    return catch_alloc("append", 0, [&] {
      if (Status s = store_.stage_chunk(layer, k, v); !s) return s;  // NaN/Inf, before any reservation
      rope_.reserve(positions, bound, ws_);  // PreRope: the cos/sin table first (and ws_.rope for hooks)
      return append_tokens<evicts>(store_, hook_, ws_, off_, layer, k, v, positions);
    });
  }

  /// Runs attend() through `executor` (include/kvpack/executor.hpp; e.g. thread_executor(2) or an
  /// engine's pool): every KV head is a task, its context cut into up to `splits` chunks of whole
  /// blocks whose partial softmax states are combined exactly (split-K, kernels/split_k.hpp;
  /// outputs equal the serial ones up to fp32 rounding). Heads whose policy gathers key mass
  /// (H2O, BlockSparse, TOVA) are not split but run in parallel. An empty executor (the default)
  /// attends serially on the calling thread; splits < 1 counts as 1. Demote<>: heads run unsplit in
  /// parallel, then each head's low tier on the calling thread (cache/demoted_attend.hpp).
  void set_executor(Executor executor, int splits = 1) {
    ws_.exec = std::move(executor);
    ws_.splits = std::max(1, splits);
  }

  /// Attention of the last n_q tokens appended to `layer` over everything the layer holds.
  /// q, out: [n_q][q_heads][head_dim] float32 (q post-RoPE). Query i sits at cache index
  /// tokens(layer) - n_q + i and sees every token up to and including itself (causal prefill;
  /// n_q = 1 is decode). GQA: query head h reads KV head h / (q_heads / kv_heads).
  /// Errors (Errc::invalid_argument): layer out of range; q not a whole number of tokens;
  /// n_q = 0 or larger than the latest append; out.size() != q.size(). Errc::non_finite: NaN/Inf
  /// in q (checked first), or a non-finite output: a logit |q.k| * scale beyond 3.4e38 (fp32),
  /// or K/V values so large that the output is. The kernels keep the value accumulation
  /// normalized (weights summing to 1), so finite K/V whose exact output is finite (e.g. every
  /// value 1e37) give that output. On any error the cache is unchanged (eviction scores
  /// and SnapKV's observation window included); `out` is unspecified after a non-finite output
  /// error and untouched after the others. Errc::out_of_memory (cache unchanged) when scratch cannot grow.
  Status attend(int layer, std::span<const float> q, std::span<float> out) {
    if (Status s = check_layer("attend", layer); !s) return s;
    const auto& L = store_.layer(layer);
    if (Status s = cache_detail::check_queries(shape(), layer, L.chunk_tokens, q, out, -1); !s) return s;
    const int D = shape().head_dim;
    const std::size_t qrow = static_cast<std::size_t>(shape().q_heads) * static_cast<std::size_t>(D);
    const auto n_q = static_cast<std::int64_t>(q.size() / qrow);
    auto where = [&](std::size_t i) {
      return "query " + std::to_string(i / qrow) + ", q head " + std::to_string((i % qrow) / static_cast<std::size_t>(D));
    };
    const int group = shape().q_heads / shape().kv_heads;
    return catch_alloc("attend", 0, [&]() -> Status {  // std::bad_alloc: Errc::out_of_memory, cache unchanged
      if (Status s = off_.begin_attend(layer); !s) return s;  // prefetch next layers, pin this one's blocks
      struct Unpin { decltype(off_)& o; ~Unpin() { o.end_attend(); } } unpin{off_};  // also when a kernel throws
      ws_.head_mass.resize(static_cast<std::size_t>(shape().kv_heads));
      if (ws_.exec) attend_parallel(layer, q, out, n_q, group);
      for (int h = 0; h < shape().kv_heads && !ws_.exec; ++h) {
        const kernels::HeadJob job = head_job(layer, h, q, out, n_q, group, ws_.refs);
        codec_hook::attend(job.args, job.seg, store_.layout(), ws_.scratch);
        if constexpr (demotes) attend_demoted(store_.tier(), layer, h, job.args, ws_.scratch, ws_.tier);  // + the low tier
      }
      // Overflow (finite inputs whose products or sums exceed fp32) must not pass silently, nor
      // poison eviction scores: scores are credited only once every head's output is finite.
      for (std::size_t i = 0; i < out.size(); ++i)
        if (!std::isfinite(out[i]))
          return fail(Errc::non_finite, "attend: layer " + std::to_string(layer) + ": attention output " +
                                            std::to_string(out[i]) + " at " + where(i) +
                                            " is not finite (a logit q.k * scale overflowed fp32, or K/V too large); scores not updated");
      if constexpr (eviction_hook::wants_mass)
        for (int h = 0; h < shape().kv_heads; ++h)
          hook_.on_mass(store_, layer, h, store_.segments(layer, h, hook_, off_, ws_.refs), ws_.head_mass[static_cast<std::size_t>(h)]);
      hook_.on_queries(store_, layer, q, n_q);
      return {};
    });
  }

  /// Prefix import (include/kvpack/offload/remote_prefix.hpp): appends one full block per KV head
  /// to `layer`, as another cache of this exact type and shape encoded it (blocks(layer, h)[b].data).
  /// payloads: [kv_heads][block_layout().bytes] bytes, KV head 0 first; the block holds tokens
  /// [tokens(layer), tokens(layer) + block_tokens) (without slot_positions, also as positions).
  /// Nothing is quantized again, so attention over imported blocks is bit-identical to attention
  /// in the cache that produced them.
  /// Errc::unsupported for eviction, keyframe, sink or offload caches; Errc::invalid_argument for a
  /// layer out of range, a wrong payload size, a layer holding pending (unquantized) tokens or a
  /// partial block; Errc::capacity_exceeded past max_tokens;
  /// Errc::out_of_memory when a block cannot be allocated. Nothing changes on error.
  Status import_block(int layer, std::span<const std::byte> payloads) {
    if constexpr (evicts || codec_hook::interval_blocks || sink_tokens > 0 || offloads) {
      (void)layer, (void)payloads;
      return fail(Errc::unsupported, "import_block: only caches without eviction, keyframes, sinks or offload");
    } else {
      if (Status s = check_layer("import_block", layer); !s) return s;
      return catch_alloc("import_block", 0, [&]() -> Status { return import_full_block(store_, layer, payloads); });
    }
  }

  /// SnapKV only: compresses `layer`'s prompt now (normally done by the first decode append).
  /// Errc::invalid_argument when the layer is out of range, was already compressed or holds no
  /// recorded queries.
  Status compress_prompt(int layer)
    requires requires(eviction_hook& e, store_type& s, Workspace& w) { e.compress_prompt(s, w, 0); }
  {
    if (Status s = check_layer("compress_prompt", layer); !s) return s;
    return hook_.compress_prompt(store_, rope_.publish(ws_), layer);
  }

  /// BlockSparse only: compacts every KV head of `layer` now (normally done when at least half of a
  /// head's blocks are masked out): live tokens are rewritten densely, in cache-index order, into
  /// fresh blocks; masked-out blocks are zeroed and freed. Attention output is unchanged.
  /// Errc::invalid_argument for a layer out of range.
  Status compact_blocks(int layer)
    requires requires(const eviction_hook& ce) { ce.mask_words(0, 0); }
  {
    if (Status s = check_layer("compact_blocks", layer); !s) return s;
    hook_.compact_layer(store_, layer);
    return {};
  }

  /// Empties the cache; every byte it releases is zeroed first. Capacity and shape are kept
  /// (SnapKVBudget<Fraction<>>: eviction_budget() returns to 0 until the next compression).
  void reset() {
    off_.reset();
    hook_.reset();
    store_.reset();
  }
  /// reset(), but the quantized blocks' allocations stay, zeroed, for the tokens that come next:
  /// an engine serving its next request from this cache allocates no blocks and takes no page
  /// faults for them. memory_bytes() is 0 after it; allocated_bytes() still counts the blocks.
  void clear() {
    off_.reset();
    hook_.reset();
    store_.clear();
  }

  /// Bytes of KV data held now, all layers: used bytes of quantized tokens (codes, scales,
  /// zero-points, positions) plus one 16-byte BlockHeader per block, plus full-precision rows
  /// (sinks, pending/residual tokens: 8 bytes per channel for K and V, 4 bytes of position per
  /// token). Eviction caches add their bookkeeping: per block one validity bit per slot (in
  /// 64-bit words), per slot its token index and score (8 bytes), per pending token and KV head
  /// its score (4 bytes). BlockSparse counts the payload of every allocated slot (masked-out blocks
  /// hold memory until compaction) plus its block bitmask. Demote<> adds its low tier: per low
  /// block its used bytes and header, 4 bytes of cache index per row. Transient working copies
  /// (the latest chunk, kernel scratch) are not included.
  [[nodiscard]] std::size_t memory_bytes() const noexcept { return held_bytes(store_, hook_); }
  /// Bytes allocated for KV data (whole blocks, vector capacities, the latest chunk's copy and
  /// the append's staging copy, cache/chunk_stage.hpp).
  /// PreRope<> adds its cos/sin table (rope_dims floats per position up to the largest used).
  [[nodiscard]] std::size_t allocated_bytes() const noexcept { return allocated_bytes_of(store_, hook_) + rope_.bytes(); }
  /// Measured bits per K / V value in blocks (StoredBits, cache/inspect.hpp; keyframes: per interval mode).
  [[nodiscard]] StoredBits stored_bits() const noexcept { return stored_bits_of(store_); }

  /// Tokens appended to `layer` so far, evicted ones included (0 for an out-of-range layer).
  [[nodiscard]] std::int64_t tokens(int layer) const noexcept { return valid(layer) ? store_.layer(layer).total : 0; }
  /// Tokens of `layer` currently held by KV head `kv_head` (after eviction; Demote<>: the high tier).
  [[nodiscard]] std::int64_t held_tokens(int layer, int kv_head = 0) const noexcept {
    if (!valid(layer, kv_head)) return 0;
    const auto& L = store_.layer(layer);
    return L.sinks_held + (evicts ? L.heads[static_cast<std::size_t>(kv_head)].live : L.committed) + L.pend.size();
  }
  /// Demote<> only: tokens of `layer` that KV head `kv_head` holds in its low-precision tier.
  [[nodiscard]] std::int64_t demoted_tokens(int layer, int kv_head = 0) const noexcept requires(demotes) {
    return valid(layer, kv_head) ? store_.tier().head(layer, kv_head).rows() : 0;
  }
  /// Demote<> only: the low tier itself (its blocks, cap and rows; cache/demotion_tier.hpp), read-only.
  [[nodiscard]] const tier_type& demotion_tier() const noexcept requires(demotes) { return store_.tier(); }
  /// Tokens of `layer` stored quantized in blocks (the rest are full precision); KV head 0.
  [[nodiscard]] std::int64_t quantized_tokens(int layer) const noexcept {
    if (!valid(layer)) return 0;
    return evicts ? store_.layer(layer).heads[0].live : store_.layer(layer).committed;
  }
  [[nodiscard]] const ModelShape& shape() const noexcept { return store_.shape(); }
  /// Offload<> only: the offload state: prefetch(layer), metrics(), flush(), store() (offload/cache_offload.hpp).
  [[nodiscard]] auto& offload() noexcept requires(offloads) { return off_; }
  [[nodiscard]] const auto& offload() const noexcept requires(offloads) { return off_; }
  [[nodiscard]] const BlockLayout& block_layout() const noexcept { return store_.layout(); }
  /// Without slot_positions: positions of `layer`'s quantized tokens (block b, slot t: token
  /// b * block_tokens + t); an empty list for a layer out of range.
  [[nodiscard]] const PositionRuns& block_positions(int layer) const noexcept requires(!slot_positions) {
    static const PositionRuns none;
    return valid(layer) ? store_.layer(layer).block_pos : none;
  }

  /// The quantized blocks of (layer, kv_head), oldest first. Without eviction, block b holds cache
  /// indices [sinks + b * block_tokens, ...); with eviction, slots are reused (see read_back for
  /// the tokens they hold). With Offload<>, a block held by the offload store has a null `data`
  /// (its header stays here). Empty span for out-of-range arguments.
  [[nodiscard]] std::span<const Block> blocks(int layer, int kv_head) const noexcept {
    if (!valid(layer, kv_head)) return {};
    return store_.layer(layer).heads[static_cast<std::size_t>(kv_head)].blocks;
  }

  /// BlockSparse only: the block bitmask of (layer, kv_head), one bit per block of blocks()
  /// (bit b % 64 of word b / 64; set = live, cleared = masked out, never read by attention).
  /// Empty span for out-of-range arguments.
  [[nodiscard]] std::span<const std::uint64_t> block_mask(int layer, int kv_head) const noexcept
    requires requires(const eviction_hook& ce) { ce.mask_words(0, 0); }
  {
    return valid(layer, kv_head) ? hook_.mask_words(layer, kv_head) : std::span<const std::uint64_t>{};
  }

  /// Eviction budget in tokens per (layer, KV head), resolved at create() (Fraction<>: of max_tokens);
  /// 0 without eviction. SnapKV<Budget, Window>: Budget + Window; SnapKVBudget<Tokens<N>>: N;
  /// SnapKVBudget<Fraction<>>: 0 until a layer is compressed, then what the latest compression kept.
  [[nodiscard]] std::int64_t eviction_budget() const noexcept { return hook_.budget(); }

  /// Decodes everything (layer, kv_head) holds as attention reads it (the latest chunk aside, read
  /// exactly), sorted by cache index (`indices`); Demote<>: the low tier's rows too, as decoded.
  /// Errc::invalid_argument for bad indices; with Offload<>, the fetch errors of attend().
  [[nodiscard]] Result<HeadContents> read_back(int layer, int kv_head) const {
    if (!valid(layer, kv_head)) return fail(Errc::invalid_argument, "read_back: layer or kv_head out of range");
    return read_back_head(store_, off_, layer, kv_head);
  }

 private:
  explicit KVCache(const ModelShape& shape) : store_(shape, block_tokens, slot_positions) { hook_.init(shape), rope_.init(shape, slot_positions); }

  // attend() over the executor: one kernel job per KV head, cut into split-K chunks.
  void attend_parallel(int layer, std::span<const float> q, std::span<float> out, std::int64_t n_q, int group) {
    const auto H = static_cast<std::size_t>(shape().kv_heads);
    ws_.head_refs.resize(H), ws_.jobs.resize(H);
    for (std::size_t h = 0; h < H; ++h) ws_.jobs[h] = head_job(layer, static_cast<int>(h), q, out, n_q, group, ws_.head_refs[h]);
    kernels::attend_parallel(std::span<const kernels::HeadJob>(ws_.jobs), demotes ? 1 : ws_.splits, ws_.exec, ws_.parallel,
                             [this](const kernels::AttendArgs& a, const kernels::HeadSegments& seg, kernels::Scratch& s) {
                               codec_hook::attend(a, seg, store_.layout(), s);
                             });
    if constexpr (demotes)  // heads unsplit: part h's scratch keeps head h's softmax state; low tiers follow serially
      for (std::size_t h = 0; h < H; ++h)
        attend_demoted(store_.tier(), layer, static_cast<int>(h), ws_.jobs[h].args, ws_.parallel.scratch[h], ws_.tier);
  }

  // KV head h's kernel job: arguments, segments (in refs), RoPE positions, eviction's mass buffer.
  kernels::HeadJob head_job(int layer, int h, std::span<const float> q, std::span<float> out, std::int64_t n_q, int group,
                            std::vector<kernels::BlockRef>& refs) {
    const auto& L = store_.layer(layer);
    const std::int64_t at = static_cast<std::int64_t>(h) * group * shape().head_dim;
    kernels::HeadJob job{store_.args_for(L, q.data() + at, out.data() + at, n_q, group), store_.segments(layer, h, hook_, off_, refs)};
    rope_.decorate(job.args, job.seg, refs, L, h, slot_tokens(L, h), block_tokens);
    if constexpr (eviction_hook::wants_mass) {
      std::vector<float>& m = ws_.head_mass[static_cast<std::size_t>(h)];
      m.assign(static_cast<std::size_t>(store_.ordinals(job.seg)), 0.f);
      job.args.key_mass = m.data();
    }
    return job;
  }

  // PreRope ranks: the cache index of every slot of head h when slots are reused (eviction).
  static const std::vector<std::int32_t>* slot_tokens(const typename store_type::Layer& L, int h) noexcept {
    return evicts ? &L.heads[static_cast<std::size_t>(h)].slot_token : nullptr;
  }
  [[nodiscard]] bool valid(int layer, int kv_head = 0) const noexcept {
    return layer >= 0 && layer < shape().layers && kv_head >= 0 && kv_head < shape().kv_heads;
  }
  [[nodiscard]] Status check_layer(const char* what, int layer) const { return cache_detail::check_layer(shape(), what, layer); }

  store_type store_;               // per-sequence tokens and blocks
  eviction_hook hook_;            // the eviction policy's budget and per-layer state
  Workspace ws_;                  // scratch of attention and scoring (no token data between calls)
  typename OffloadP::state off_;  // offload store and attend-time handles (no-ops without Offload<>)
  RopeState<RopeP> rope_;         // PreRope<>: the cos/sin table and per-head positions (else empty)
};

}  // namespace kvpack
