// SnapKV: compress the prompt once, when decoding starts, to the tokens the last prompt queries
// (the observation window) attend to most. Its hook remembers the window's queries, holds the
// window back from commit (exact, causal scoring), and at the first decode append scores, selects
// (snapkv_select) and compacts.
#pragma once

#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <span>
#include <string>
#include <type_traits>
#include <utility>
#include <vector>

#include "kvpack/cache/offload_hooks.hpp"
#include "kvpack/cache/rope_state.hpp"
#include "kvpack/detail/secure_zero.hpp"
#include "kvpack/eviction/budget.hpp"
#include "kvpack/eviction/hook.hpp"
#include "kvpack/eviction/protocol_tags.hpp"
#include "kvpack/eviction/snapkv_select.hpp"
#include "kvpack/kernels/rope.hpp"
#include "kvpack/policy.hpp"

namespace kvpack {

/// How SnapKV aggregates the scores of the query heads that share one KV head (GQA).
enum class GroupAggregate { mean, max };

namespace eviction {
/// SnapKV's hook. Per layer: the observation window's queries ([n][q_heads][D], the latest
/// contiguous ones, at most Window) and whether the prompt was compressed. Proto (PromptOnce or
/// FixedBudget, eviction/protocol_tags.hpp) says what happens after the prompt: PromptOnce lets
/// the cache grow (SnapKV's protocol); FixedBudget holds the compressed size through decoding,
/// evicting the lowest score outside the newest Window tokens, where a token's score is its SnapKV
/// score (prompt tokens) plus the attention mass it receives after compression (as H2O's).
template <class P, class Proto = PromptOnce>
class SnapKVHook : public HookDefaults {
 public:
  static constexpr bool fixed = std::is_same_v<Proto, FixedBudget>;
  static constexpr bool wants_mass = fixed;
  static constexpr bool evicts_continuously = fixed;
  void init(const ModelShape& shape) {
    shape_ = shape;
    budget_ = P::fixed_budget;
    layers_.clear();
    layers_.resize(static_cast<std::size_t>(shape.layers));
  }
  /// Forgets every layer's window; a Fraction budget is resolved again at the next compression.
  void reset() {
    wipe();
    init(shape_);
  }
  [[nodiscard]] std::int64_t budget() const noexcept { return budget_; }

  /// Until compression the observation window stays exact (causal scoring).
  template <class St>
  [[nodiscard]] std::int64_t keep_exact(const St&, int li) const noexcept {
    return layer(li).compressed ? 0 : P::window;
  }
  /// A single-token append that triggers compression leaves <= sinks + kept + residual + 1.
  template <class St>
  [[nodiscard]] std::int64_t held_after(const St& st, int li, std::int64_t n) const noexcept {
    const auto& L = st.layer(li);
    const std::int64_t plain = st.held(L) + n;
    if (fixed && layer(li).compressed)
      return std::min(plain, std::max<std::int64_t>(budget_, std::int64_t{St::sink_tokens} +
                                                                 std::max<std::int64_t>(P::window, St::residual_tokens + n)));
    if (!compresses_on(li, L.total, n)) return plain;
    return std::min(plain, std::int64_t{St::sink_tokens} + P::held_after_compression(L.total) + St::residual_tokens + 1);
  }
  /// The first single-token append ends the prompt. A prompt longer than what compression keeps
  /// is compressed now; a prompt that fits is left whole and the layer never compresses later (a
  /// cache that grows past Budget + Window while decoding keeps every token: SnapKV selects from
  /// the prompt's attention only, never mid-decode). Errc::invalid_argument, nothing changed, when
  /// the prompt must be compressed but `attend` never ran on it (no observation-window queries:
  /// every score would be 0 and the selection arbitrary); attend the prompt's last tokens (they
  /// are still the latest append) and append again.
  template <class St>
  [[nodiscard]] Status before_append(St& st, Workspace& ws, int li, std::int64_t n) {
    LayerState& S = layer(li);
    if (S.compressed || n != 1) return {};
    if (!compresses_on(li, st.layer(li).total, n)) {
      S.compressed = true;  // prompt phase over: nothing to compress, the window commits normally
      if (fixed) budget_ = P::held_after_compression(st.layer(li).total);  // held from now on
      detail::wipe_vector(S.obs_q);
      return {};
    }
    if (S.obs_q.empty())
      return fail(Errc::invalid_argument,
                  "append: SnapKV layer " + std::to_string(li) + ": the " + std::to_string(st.layer(li).total) +
                      "-token prompt must be compressed to " + std::to_string(P::held_after_compression(st.layer(li).total)) +
                      " tokens, but it was never attended (no observation-window queries to score it); call attend "
                      "on the prompt's last tokens first");
    compress(st, ws, li);
    return {};
  }
  /// FixedBudget, after the prompt phase: evicts the lowest-scored token older than the newest
  /// Window tokens (the oldest on ties) until sinks + live + pend tokens fit the budget.
  template <class St>
  void enforce(St& st, int li, int h, std::int64_t pend) {
    if constexpr (fixed) {
      if (!layer(li).compressed || selecting_) return;
      auto& L = st.layer(li);
      HeadStore& H = L.heads[static_cast<std::size_t>(h)];
      const std::int64_t recent_from = L.total - P::window;
      while (L.sinks_held + H.live + pend > budget_) {
        std::int64_t victim = -1;
        for (std::size_t s = 0; s < H.slot_token.size(); ++s) {
          const std::int32_t tok = H.slot_token[s];
          if (tok < 0 || tok >= recent_from) continue;
          const auto v = static_cast<std::size_t>(victim);
          if (victim < 0 || H.slot_score[s] < H.slot_score[v] || (H.slot_score[s] == H.slot_score[v] && tok < H.slot_token[v]))
            victim = static_cast<std::int64_t>(s);
        }
        if (victim < 0) break;
        st.drop_slot(li, h, victim, budget_);  // demoted first with Demote<>
      }
    } else {
      (void)st, (void)li, (void)h, (void)pend;
    }
  }
  /// FixedBudget: the attention mass of decoding adds to the SnapKV scores (compress() resets
  /// the scores, so prefill mass never counts).
  template <class St>
  void on_mass(St& st, int li, int h, const kernels::HeadSegments& seg, std::span<const float> mass) {
    if constexpr (fixed) credit_mass(st, li, h, seg, mass, Credit::add);
    else (void)st, (void)li, (void)h, (void)seg, (void)mass;
  }
  template <class St>
  void on_queries(St& st, int li, std::span<const float> q, std::int64_t n_q) {
    if (!layer(li).compressed) remember(layer(li), q, st.layer(li).total - n_q);
  }
  /// KVCache::compress_prompt: Errc::invalid_argument when already compressed, decoding has
  /// started (a single-token append ended the prompt) or no queries.
  template <class St>
  [[nodiscard]] Status compress_prompt(St& st, Workspace& ws, int li) {
    if (layer(li).compressed || layer(li).obs_q.empty())
      return fail(Errc::invalid_argument, "compress_prompt: layer " + std::to_string(li) +
                                              " is already compressed, has started decoding or has no observation-window queries");
    compress(st, ws, li);
    return {};
  }
  /// Whether layer li's prompt phase is over (compressed, or decoding began with a prompt that fit):
  /// no compaction is left to come (a page pool then takes no pages for one).
  [[nodiscard]] bool prompt_compacted(int li) const noexcept { return layer(li).compressed; }
  [[nodiscard]] std::size_t allocated_bytes() const noexcept {
    std::size_t n = 0;
    for (const LayerState& S : layers_) n += S.obs_q.capacity() * sizeof(float);
    return n;
  }
  void wipe() noexcept {
    for (LayerState& S : layers_) detail::wipe_vector(S.obs_q);
  }

 private:
  struct LayerState {
    std::vector<float> obs_q;     // last queries, [n][q_heads][D]
    std::int64_t obs_first = 0;   // cache index of obs_q's first row
    bool compressed = false;      // prompt phase over: compressed, or decoding began with a prompt that fit
  };
  [[nodiscard]] LayerState& layer(int li) noexcept { return layers_[static_cast<std::size_t>(li)]; }
  [[nodiscard]] const LayerState& layer(int li) const noexcept { return layers_[static_cast<std::size_t>(li)]; }
  [[nodiscard]] std::size_t q_row() const noexcept {
    return static_cast<std::size_t>(shape_.q_heads) * static_cast<std::size_t>(shape_.head_dim);
  }

  // Whether appending n tokens to a layer holding `total` compresses its prompt first (the first
  // single-token append, when the prompt is longer than what compression keeps; after the first
  // single-token append `compressed` is set either way, so this never holds mid-decode).
  [[nodiscard]] bool compresses_on(int li, std::int64_t total, std::int64_t n) const noexcept {
    return !layer(li).compressed && n == 1 && total > P::held_after_compression(total);
  }

  // Remembers the latest queries (up to the observation window); first = cache index of q's row 0.
  void remember(LayerState& S, std::span<const float> q, std::int64_t first) {
    const auto have = static_cast<std::int64_t>(S.obs_q.size() / q_row());
    S.obs_q.reserve(S.obs_q.size() + q.size());  // the only allocation, before any change (attend's strong guarantee)
    if (have == 0 || S.obs_first + have != first) {  // not contiguous with what we had: restart
      S.obs_q.clear();
      S.obs_first = first;
    }
    S.obs_q.insert(S.obs_q.end(), q.begin(), q.end());
    const auto rows = static_cast<std::int64_t>(S.obs_q.size() / q_row());
    if (rows > P::window) {
      S.obs_q.erase(S.obs_q.begin(), S.obs_q.begin() + static_cast<std::ptrdiff_t>(static_cast<std::size_t>(rows - P::window) * q_row()));
      S.obs_first += rows - P::window;
    }
  }

  // Scores the prompt with the remembered window queries, keeps the top budget per KV head plus
  // the window, and compacts the survivors into dense blocks.
  template <class St>
  void compress(St& st, Workspace& ws, int li) {
    auto& L = st.layer(li);
    LayerState& S = layer(li);
    const int group = shape_.q_heads / shape_.kv_heads;
    const auto n_obs = static_cast<std::int64_t>(S.obs_q.size() / q_row());
    std::vector<float> out(static_cast<std::size_t>(n_obs) * q_row());
    ws.head_mass.resize(static_cast<std::size_t>(shape_.kv_heads));
    // The queries sit at cache indices obs_first..; their keys are all exact rows (keep_exact holds
    // the window back until compression: pending, then the latest chunk), which the kernel masks
    // causally by cache index, so no window query sees a later token.
    // PreRope<> (ws.rope, published by KVCache): the kernel turns each window query at its token's
    // position (a sink's or a pending row's: the window is held exact) and each key at its own
    // (committed slots: the payload's; exact rows: theirs).
    // (A page pool's evicting store has no PreRope<>: no chunk positions, ws.rope never set.)
    constexpr bool rope_store = requires { L.chunk_pos; };
    kernels::RopeArgs rope;
    std::vector<std::int32_t> obs_pos;
    if (rope_store && ws.rope != nullptr) {
      rope = *ws.rope;
      obs_pos.resize(static_cast<std::size_t>(n_obs));
      const std::int64_t pend_first = L.total - L.pend.size();
      for (std::int64_t i = 0; i < n_obs; ++i) {
        const std::int64_t c = S.obs_first + i;
        obs_pos[static_cast<std::size_t>(i)] =
            c < L.sinks_held ? L.sink_pos[static_cast<std::size_t>(c)] : L.pend.positions()[c - pend_first];
      }
      rope.q_pos = obs_pos.data();
    }
    for (int h = 0; h < shape_.kv_heads && n_obs > 0; ++h) {
      kernels::HeadSegments seg = st.segments(li, h, *this, NoOffload::state{}, ws.refs);
      if constexpr (rope_store)
        if (ws.rope != nullptr) rope_exact_positions(seg, L);
      std::vector<float>& agg = ws.head_mass[static_cast<std::size_t>(h)];
      agg.assign(static_cast<std::size_t>(st.ordinals(seg)), 0.f);
      for (int j = 0; j < group; ++j) {  // one query head at a time: mean or max over the group
        const std::int64_t qoff = (static_cast<std::int64_t>(h) * group + j) * shape_.head_dim;
        kernels::AttendArgs a = st.args_for(L, S.obs_q.data() + qoff, out.data() + qoff, n_obs, 1);
        a.q_first = S.obs_first;
        a.rope = rope_store && ws.rope != nullptr ? &rope : nullptr;
        ws.mass.assign(agg.size(), 0.f);
        a.key_mass = ws.mass.data();
        St::codec::attend(a, seg, st.layout(), ws.scratch);
        for (std::size_t o = 0; o < agg.size(); ++o)
          agg[o] = P::aggregate == GroupAggregate::max ? std::max(agg[o], ws.mass[o]) : agg[o] + ws.mass[o] / group;
      }
      for (float& x : L.heads[static_cast<std::size_t>(h)].slot_score) x = 0.f;
      L.pend.clear_scores(h);
      credit_mass(st, li, h, seg, agg, Credit::add);
    }
    // Tokens per KV head kept: the window plus the top (kept - window); L.total is the prompt.
    const std::int64_t kept_total = P::held_after_compression(L.total);
    budget_ = kept_total;
    S.compressed = true;  // set first: commit() then no longer holds the window back
    selecting_ = true;     // FixedBudget: no eviction while the prompt commits; the selection below decides
    st.commit(li, *this);  // the prompt's pending tokens take slots (carrying their scores) before selection
    selecting_ = false;
    const std::int64_t window_from = L.total - P::window;
    for (HeadStore& H : L.heads) {
      std::vector<std::pair<std::int32_t, std::int32_t>> cand;  // (token, slot) outside the window
      for (std::size_t s = 0; s < H.slot_token.size(); ++s)
        if (H.slot_token[s] >= 0 && H.slot_token[s] < window_from) cand.emplace_back(H.slot_token[s], static_cast<std::int32_t>(s));
      std::sort(cand.begin(), cand.end());
      std::vector<float> raw(cand.size());
      for (std::size_t i = 0; i < cand.size(); ++i) raw[i] = H.slot_score[static_cast<std::size_t>(cand[i].second)];
      const auto keep = snapkv_select(raw, P::kernel, kept_total - P::window);
      std::vector<char> kept(cand.size(), 0);
      for (std::int64_t i : keep) kept[static_cast<std::size_t>(i)] = 1;
      for (std::size_t i = 0; i < cand.size(); ++i)
        if (!kept[i]) st.drop_slot(li, static_cast<int>(&H - L.heads.data()), cand[i].second, kept_total);  // demoted first with Demote<>
      st.compact_head(li, static_cast<int>(&H - L.heads.data()));  // the store's: heap blocks or pool pages
    }
    detail::wipe_vector(S.obs_q);
  }

  ModelShape shape_;
  std::int64_t budget_ = 0;  // Budget + Window, or the latest compression's kept tokens per KV head
  std::vector<LayerState> layers_;
  bool selecting_ = false;  // compress() is committing the prompt before its selection
};
}  // namespace eviction

/// SnapKV (Li et al. 2024, arXiv:2404.14469): when decoding starts (the first single-token
/// append after a prompt longer than Budget + Window, or an explicit compress_prompt()), every
/// prompt token outside the observation window is scored by the attention it receives from the
/// last Window prompt queries (summed over those queries), smoothed by 1-D max pooling of width
/// Kernel, and the top Budget per KV head are kept together with the window; ties prefer the
/// larger raw score, then the older token. Decoding then appends without further eviction. The
/// rule is per prompt, not per running total: a prompt that fits (<= Budget + Window tokens when
/// the first single-token append comes) is never compressed, however far decoding grows the cache.
/// A prompt that must be compressed but was never attended makes that append fail
/// (Errc::invalid_argument, cache unchanged) instead of selecting from all-zero scores.
/// Defaults follow the paper: Window 32, Kernel 5. GQA: per KV head, the per-query-head scores
/// are aggregated by Agg (mean by default). Choosing Kernel: the window's queries tend to attend
/// to the start of a span they will need (e.g. the first digits of a number that is spelled one
/// token per digit); pooling is what keeps the rest of the span. On SmolLM2-135M with a 5-digit
/// pass key (6 tokens) at 25 % of a 4096-token prompt, Kernel 5 lost the 4th digit at every depth
/// (0/3 needles) and Kernel 9 kept 3/3 at no perplexity cost (docs/RESULTS-snapkv-needle.md):
/// widen it for longer spans.
template <int Budget, int Window = 32, int Kernel = 5, GroupAggregate Agg = GroupAggregate::mean>
struct SnapKV {
  static_assert(Budget >= 1 && Window >= 1 && Kernel >= 1 && Kernel % 2 == 1,
                "kvpack::SnapKV<Budget, Window, Kernel>: need Budget >= 1, Window >= 1 and an odd Kernel");
  using kvpack_role = role::eviction;
  static constexpr bool evicts = true;
  using hook = eviction::SnapKVHook<SnapKV>;
  static constexpr int sink_tokens = 0;
  static constexpr int budget = Budget + Window;
  static constexpr int window = Window;
  static constexpr int kernel = Kernel;
  static constexpr GroupAggregate aggregate = Agg;
  /// Tokens per (layer, KV head) held right after compressing a prompt of `prompt` tokens (the
  /// window included): Budget + Window. Compression evicts only when this is below `prompt`.
  [[nodiscard]] static constexpr std::int64_t held_after_compression(std::int64_t /*prompt*/) noexcept { return budget; }
  /// The budget known before any prompt is seen (KVCache::eviction_budget()): Budget + Window.
  static constexpr std::int64_t fixed_budget = budget;
};

/// SnapKV sized by a total budget that includes the observation window. Budget is Tokens<N> (N
/// tokens per layer and KV head after compression) or Fraction<Num, Den> **of the prompt**: the
/// tokens the layer holds when compression runs (KVCache::compress_prompt, or the first decode
/// append). SnapKV compresses the prompt once, so the prompt is the context a fraction refers to
/// (not ModelShape::max_tokens). After compressing a prompt of P tokens each KV head holds
/// K = max(floor(P * Num / Den), Window) tokens (Tokens<N>: K = N): the Window observation-window
/// tokens plus the top K - Window scored prompt tokens (nothing is evicted when K >= P). So
/// SnapKVBudget<Tokens<1024>> equals SnapKV<992>, and SnapKVBudget<Fraction<1, 4>> keeps 512 of a
/// 2048-token prompt (32 window + 480 selected) and 1024 of a 4096-token one. Decoding then
/// appends without further eviction (the cache grows again, as SnapKV). Scoring, pooling, GQA
/// aggregation and tie rules as SnapKV.
/// Errors: Tokens<N> with N <= Window, a Budget that is no budget type, an even Kernel, or
/// Window < 1 fails to compile.
template <class Budget, int Window = 32, int Kernel = 5, GroupAggregate Agg = GroupAggregate::mean>
struct SnapKVBudget {
  static_assert(EvictionBudget<Budget>,
                "kvpack::SnapKVBudget<Budget, Window, Kernel>: Budget must be kvpack::Tokens<N> or "
                "kvpack::Fraction<Num, Den> (of the prompt)");
  static_assert(Window >= 1 && Kernel >= 1 && Kernel % 2 == 1,
                "kvpack::SnapKVBudget<Budget, Window, Kernel>: need Window >= 1 and an odd Kernel");
  static_assert(detail::fixed_budget_v<Budget> < 0 || detail::fixed_budget_v<Budget> > Window,
                "kvpack::SnapKVBudget<Tokens<N>, Window>: the budget N counts the observation window and must "
                "exceed Window");
  using kvpack_role = role::eviction;
  using budget_type = Budget;
  static constexpr bool evicts = true;
  using hook = eviction::SnapKVHook<SnapKVBudget>;
  static constexpr int sink_tokens = 0;
  static constexpr int window = Window;
  static constexpr int kernel = Kernel;
  static constexpr GroupAggregate aggregate = Agg;
  /// Tokens per (layer, KV head) held right after compressing a prompt of `prompt` tokens:
  /// max(Budget resolved against `prompt`, Window) (Tokens<N>: N).
  [[nodiscard]] static constexpr std::int64_t held_after_compression(std::int64_t prompt) noexcept {
    return std::max<std::int64_t>(detail::resolve_budget<Budget>(prompt), Window);
  }
  /// The budget known before any prompt is seen: N for Tokens<N>, 0 for a Fraction (resolved at
  /// compression; KVCache::eviction_budget() then reports it).
  static constexpr std::int64_t fixed_budget = std::max<std::int64_t>(detail::fixed_budget_v<Budget>, 0);
};

}  // namespace kvpack
