// kvpack-eval: scoring one window with one policy (llama-perplexity protocol, chunked so every
// scored token reads compressed K/V): NLL, KL and top-1 agreement against the fp32 cache, KV
// bytes and a timed decode on the first window, offload exactness against the twin policy.
#pragma once

#include <algorithm>
#include <type_traits>

#include "evaluator.hpp"

namespace kvpack_eval {

/// Tokens (layer l, KV head h) of `c` holds: after eviction where a policy evicts, both tiers
/// with Demote<> (high + demoted), tokens() for caches that do not evict.
template <class Cache>
std::int64_t held_of(const Cache& c, int l, int h) {
  if constexpr (requires { c.demoted_tokens(l, h); }) return c.held_tokens(l, h) + c.demoted_tokens(l, h);
  else if constexpr (requires { c.held_tokens(l, h); }) return c.held_tokens(l, h);
  else return c.tokens(l);
}

/// Tokens held per (layer, KV head) (held_of), the mean over all of them.
template <class Cache>
double mean_held(const Cache& c, int layers, int kv_heads) {
  double sum = 0;
  int cells = 0;
  for (int l = 0; l < layers; ++l)
    for (int h = 0; h < kv_heads; ++h, ++cells) sum += double(held_of(c, l, h));
  return cells ? sum / cells : 0;
}

/// The eviction protocol of `Cache`: Protocol<P, Proto>'s ("prompt-once", "fixed-budget"); for the
/// other policies "prompt-once" (SnapKV, SnapKVBudget), "context-budget" (a budget of the
/// context, ModelShape::max_tokens, held as tokens arrive) or "none".
template <class Cache>
std::string protocol_name() {
  if constexpr (requires { typename Cache::inner_type; }) return protocol_name<typename Cache::inner_type>();  // Rotated<>
  else if constexpr (requires { Cache::eviction_policy::protocol::name; }) return Cache::eviction_policy::protocol::name;
  else if constexpr (requires { requires Cache::evicts_continuously; }) return "context-budget";
  else if constexpr (requires { requires Cache::evicts; }) return "prompt-once";
  else return "none";
}

template <class Cache>
kvpack::Status Evaluator::score(PolicyStats& st, const Window& w, bool baseline, bool first_window, Progress& prog,
                                KvDump* dump) {
  const auto n = static_cast<int64_t>(w.tokens.size());
  auto cache = make_cache<Cache>(m_.cache_shape(capacity<Cache>(n, n + opt_.decode_tokens)), n, &st.offload);
  if (!cache) return cache.error();
  kvpack::Status hook_status;
  const int64_t rows = n - 1 - w.first_row;
  // Exactness check of "X+offload" against "X": X's raw logits are kept for this window.
  const bool keep_twin = twins_.count(st.name) != 0;
  const std::string twin = kl::offload_twin(st.name);
  const RowMat* twin_logits = nullptr;
  if (!twin.empty()) {
    st.offload.twin = twin;
    if (auto it = twin_logits_.find(twin); it != twin_logits_.end() && it->second.rows() == rows) {
      twin_logits = &it->second;
      st.offload.compared = true;
    }
  }
  if (keep_twin) twin_logits_[st.name].resize(rows, m_.cfg.vocab);
  if (baseline) {
    base_.logprobs.resize(rows, m_.cfg.vocab);
    base_.argmax.assign(size_t(rows), 0);
  }
  std::vector<float> kls;
  double scoring_s = 0;
  Eigen::RowVectorXf last;  // logits after the final token, for the decode timing
  auto on_logits = [&](int64_t i0, RowMat& lg) {
    const auto t0 = Clock::now();
    if (i0 + lg.rows() == n) last = lg.row(lg.rows() - 1);
    for (Eigen::Index r = 0; r < lg.rows(); ++r) {
      const int64_t i = i0 + r, row = i - w.first_row;
      if (i + 1 >= n) break;
      if (keep_twin) twin_logits_[st.name].row(row) = lg.row(r);
      if (twin_logits) {
        st.offload.max_abs_dlogit = std::max(
            st.offload.max_abs_dlogit, double((twin_logits->row(row) - lg.row(r)).cwiseAbs().maxCoeff()));
        ++st.offload.compared_rows;
      }
      auto lp = lg.row(r);
      kl::log_softmax(lp);
      st.nll -= lp[w.tokens[size_t(i + 1)]];
      ++st.scored;
      Eigen::Index top = 0;
      lp.maxCoeff(&top);
      if (baseline) {
        base_.logprobs.row(row) = lp;
        base_.argmax[size_t(row)] = static_cast<int32_t>(top);
        kls.push_back(0.f);
        ++st.agree;
      } else {
        const auto p = base_.logprobs.row(row).array();
        kls.push_back(std::max(0.f, (p.exp() * (p - lp.array())).sum()));
        st.agree += top == base_.argmax[size_t(row)];
      }
    }
    if constexpr (std::is_same_v<Cache, PlanCache>)
      if (row_hook) row_hook(*cache, lg);
    scoring_s += seconds_since(t0);
  };
  const auto t0 = Clock::now();
  // Context (tokens before first_row) prefilled, its end signalled to the cache (SnapKV and
  // Protocol<> caches compress the prompt; kl::run_prefill_then_score's steps, with the tokens held
  // in between recorded), then scored.
  auto on_chunk = [&, done = int64_t{0}](int64_t e) mutable {
    prog.advance(e - done);
    done = e;
    if constexpr (std::is_same_v<Cache, PlanCache>)
      if (plan_hook && hook_status) hook_status = plan_hook(*cache, e, n);
  };
  const kl::KvTap tap = dump ? dump->tap() : (std::is_same_v<Cache, PlanCache> && kv_tap ? kv_tap : kl::KvTap{});
  auto s = kl::run_range(m_, *cache, w.tokens, 0, w.first_row, w.first_row, opt_.chunk, on_logits, on_chunk, tap);
  if (s) {
    kl::compress_prompt_if_snapkv(*cache, m_.cfg.layers);
    if (first_window) st.tokens_after_prompt = mean_held(*cache, m_.cfg.layers, m_.cfg.kv_heads);
    s = kl::run_range(m_, *cache, w.tokens, w.first_row, n, w.first_row, opt_.chunk, on_logits, on_chunk, tap);
  }
  if (!s) return s;
  if (!hook_status) return hook_status;
  st.prefill_s += seconds_since(t0) - scoring_s;
  st.prefill_tokens += n;
  st.kl.insert(st.kl.end(), kls.begin(), kls.end());
  if constexpr (requires { cache->saturated_values(); }) {  // Calibrated<>
    st.tracks_saturation = true;
    st.saturated += cache->saturated_values();
  }
  if (!first_window) return kl::collect_offload(*cache, st.offload);
  st.kv_bytes = cache->memory_bytes();
  st.kv_tokens = n;
  st.tokens_at_end = mean_held(*cache, m_.cfg.layers, m_.cfg.kv_heads);
  st.protocol = protocol_name<Cache>();
  st.kv_values = 0;
  for (int l = 0; l < m_.cfg.layers; ++l)
    for (int h = 0; h < m_.cfg.kv_heads; ++h)  // tokens held after eviction (Demote<>: both tiers)
      st.kv_values += held_of(*cache, l, h) * m_.cfg.head_dim * 2;
  // Decode timing: greedy continuation, one token per forward (the output head included).
  RowMat lg;
  Eigen::Index next = 0;
  if (last.size()) last.maxCoeff(&next);
  const auto td = Clock::now();
  for (int i = 0; i < opt_.decode_tokens; ++i) {
    const int32_t t = static_cast<int32_t>(next);
    if (auto e = m_.forward(*cache, std::span(&t, 1), static_cast<int32_t>(n + i), 0, lg); !e) return e;
    lg.row(0).maxCoeff(&next);
    prog.advance(1);
  }
  st.decode_s += seconds_since(td);
  st.decode_tokens += opt_.decode_tokens;
  return kl::collect_offload(*cache, st.offload);
}

}  // namespace kvpack_eval
