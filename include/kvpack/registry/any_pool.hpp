// AnyPool: a PagedCache<Policy...> (pool/paged_cache.hpp) behind a virtual interface, so an
// engine (or the C ABI, include/kvpack/c/kvpack.h) can choose the policy by name at run time
// (registry/registry.hpp: make_pool). Every call forwards to the concrete PagedCache unchanged:
// same pages, codes, kernels and errors; one virtual call per append/attend/batch.
#pragma once

#include <cstddef>
#include <cstdint>
#include <memory>
#include <span>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "kvpack/pool/paged_cache.hpp"
#include "kvpack/registry/any_cache.hpp"

namespace kvpack::registry {

/// Many sequences in one page pool, of a policy chosen at run time. Each member forwards to the
/// PagedCache member of the same name (see it for shapes, layout and errors); thread safety as
/// PagedCache: different sequences from different threads, one sequence from one thread.
class AnyPool {
 public:
  virtual ~AnyPool() = default;
  AnyPool() = default;
  AnyPool(const AnyPool&) = delete;
  AnyPool& operator=(const AnyPool&) = delete;

  /// The registry name the pool was made from.
  [[nodiscard]] virtual std::string_view policy() const noexcept = 0;
  [[nodiscard]] virtual const PoolConfig& config() const noexcept = 0;
  [[nodiscard]] virtual const ModelShape& shape() const noexcept = 0;
  [[nodiscard]] virtual const BlockLayout& block_layout() const noexcept = 0;
  /// Stored bits per key / value element of the codecs (metadata included, fp32 rows excluded).
  [[nodiscard]] virtual double key_bits_per_value() const noexcept = 0;
  [[nodiscard]] virtual double value_bits_per_value() const noexcept = 0;
  /// Tokens per page (Blocks<B>), fp32 sink tokens and residual window of the policy.
  [[nodiscard]] virtual int block_tokens() const noexcept = 0;
  /// What the attention kernel does (backend, quantized query, integer P·V): kernels::KernelInfo.
  [[nodiscard]] virtual kernels::KernelInfo kernel() const noexcept = 0;
  /// The codec format id of its pages and the header a fresh page carries (codec_hook::
  /// format_id(), codec_hook::header(head_dim)): what offload::swap_layout_for needs.
  [[nodiscard]] virtual std::uint32_t codec_format() const noexcept = 0;
  [[nodiscard]] virtual BlockHeader page_header() const noexcept = 0;

  [[nodiscard]] virtual Result<SeqId> create_sequence() = 0;
  [[nodiscard]] virtual Result<SeqId> fork(SeqId parent) = 0;
  virtual Status free_sequence(SeqId id) = 0;
  [[nodiscard]] virtual bool valid(SeqId id) const noexcept = 0;
  [[nodiscard]] virtual Result<std::int64_t> length(SeqId id) const = 0;
  virtual Status truncate(SeqId id, std::int64_t new_length) = 0;
  /// k, v [n][kv_heads][head_dim] float32, positions [n].
  virtual Status append(SeqId id, int layer, std::span<const float> k, std::span<const float> v,
                        std::span<const std::int32_t> positions) = 0;
  /// q, out [n_q][q_heads][head_dim]; scratch in `ws` (one per thread). With an evicting policy
  /// attend and attend_batch update the sequences' scores (EvictingPagedCache): calls on the same
  /// sequence must not overlap then, attend included.
  virtual Status attend(SeqId id, int layer, std::span<const float> q, std::span<float> out, Workspace& ws) const = 0;
  /// q, out [N][q_heads][head_dim], one decode query per sequence of `seqs`.
  virtual Status attend_batch(int layer, std::span<const SeqId> seqs, std::span<const float> q, std::span<float> out,
                              const Executor& exec, std::span<Workspace> workspaces) const = 0;
  /// The same with per-sequence additive masks (BatchMask: ragged, one float per token of each
  /// sequence in the layer, added to the scaled scores of every query head).
  virtual Status attend_batch(int layer, std::span<const SeqId> seqs, std::span<const float> q, const BatchMask& masks,
                              std::span<float> out, const Executor& exec, std::span<Workspace> workspaces) const = 0;
  virtual Result<std::int64_t> publish_prefix(SeqId id, std::string_view model_id, std::span<const std::int32_t> tokens) = 0;
  virtual Result<std::int64_t> attach_prefix(SeqId id, std::string_view model_id, std::span<const std::int32_t> prompt) = 0;
  virtual void clear_prefix_cache() = 0;
  /// Swap a sequence's pages out to `target` and back (PagedCache::swap_out / swap_in /
  /// swapped_out; EvictingPagedCache's for an eviction policy).
  virtual Result<std::size_t> swap_out(SeqId id, PageSwapTarget& target) = 0;
  virtual Result<std::size_t> swap_in(SeqId id) = 0;
  [[nodiscard]] virtual Result<bool> swapped_out(SeqId id) const = 0;
  [[nodiscard]] virtual Result<std::vector<PageView>> pages(SeqId id, int layer, int kv_head) const = 0;
  /// Decoded contents of one KV head of a sequence, as KVCache::read_back (float64 references,
  /// comparing two sequences).
  [[nodiscard]] virtual Result<HeadContents> read_back(SeqId id, int layer, int kv_head) const = 0;
  [[nodiscard]] virtual PoolStats stats() const = 0;
  [[nodiscard]] virtual std::size_t memory_bytes() const = 0;

  /// A fresh single-sequence KVCache of the same policies as this pool (for `shape`), behind
  /// AnyCache: the "solo" twin an engine compares a pooled sequence with. Errors of KVCache::create.
  [[nodiscard]] virtual Result<std::unique_ptr<AnyCache>> make_single(const ModelShape& shape) const = 0;
};

/// AnyPool over PagedCache<Policies...>.
template <class... Policies>
class PoolAdapter final : public AnyPool {
  using Pool = PagedCache<Policies...>;

 public:
  PoolAdapter(Pool pool, std::string name) : pool_(std::move(pool)), name_(std::move(name)) {}

  [[nodiscard]] std::string_view policy() const noexcept override { return name_; }
  [[nodiscard]] const PoolConfig& config() const noexcept override { return pool_.config(); }
  [[nodiscard]] const ModelShape& shape() const noexcept override { return pool_.shape(); }
  [[nodiscard]] const BlockLayout& block_layout() const noexcept override { return pool_.block_layout(); }
  [[nodiscard]] double key_bits_per_value() const noexcept override { return Pool::key_bits_per_value; }
  [[nodiscard]] double value_bits_per_value() const noexcept override { return Pool::value_bits_per_value; }
  [[nodiscard]] int block_tokens() const noexcept override { return Pool::block_tokens; }
  [[nodiscard]] kernels::KernelInfo kernel() const noexcept override { return Pool::codec_hook::kernel; }
  [[nodiscard]] std::uint32_t codec_format() const noexcept override { return Pool::codec_hook::format_id(); }
  [[nodiscard]] BlockHeader page_header() const noexcept override { return Pool::codec_hook::header(pool_.shape().head_dim); }

  [[nodiscard]] Result<SeqId> create_sequence() override { return pool_.create_sequence(); }
  [[nodiscard]] Result<SeqId> fork(SeqId parent) override { return pool_.fork(parent); }
  Status free_sequence(SeqId id) override { return pool_.free_sequence(id); }
  [[nodiscard]] bool valid(SeqId id) const noexcept override { return pool_.valid(id); }
  [[nodiscard]] Result<std::int64_t> length(SeqId id) const override { return pool_.length(id); }
  Status truncate(SeqId id, std::int64_t new_length) override { return pool_.truncate(id, new_length); }
  Status append(SeqId id, int layer, std::span<const float> k, std::span<const float> v,
                std::span<const std::int32_t> positions) override {
    return pool_.append(id, layer, k, v, positions);
  }
  Status attend(SeqId id, int layer, std::span<const float> q, std::span<float> out, Workspace& ws) const override {
    return pool_.attend(id, layer, q, out, ws);
  }
  Status attend_batch(int layer, std::span<const SeqId> seqs, std::span<const float> q, std::span<float> out,
                      const Executor& exec, std::span<Workspace> workspaces) const override {
    return pool_.attend_batch(layer, seqs, q, out, exec, workspaces);
  }
  Status attend_batch(int layer, std::span<const SeqId> seqs, std::span<const float> q, const BatchMask& masks,
                      std::span<float> out, const Executor& exec, std::span<Workspace> workspaces) const override {
    return pool_.attend_batch(layer, seqs, q, masks, out, exec, workspaces);
  }
  Result<std::int64_t> publish_prefix(SeqId id, std::string_view model_id, std::span<const std::int32_t> tokens) override {
    if constexpr (evicting) return no_eviction("publish_prefix", id, model_id, tokens);
    else return pool_.publish_prefix(id, model_id, tokens);
  }
  Result<std::int64_t> attach_prefix(SeqId id, std::string_view model_id, std::span<const std::int32_t> prompt) override {
    if constexpr (evicting) return no_eviction("attach_prefix", id, model_id, prompt);
    else return pool_.attach_prefix(id, model_id, prompt);
  }
  void clear_prefix_cache() override {
    if constexpr (!evicting) pool_.clear_prefix_cache();  // an evicting pool has no prefix cache
  }
  Result<std::size_t> swap_out(SeqId id, PageSwapTarget& target) override { return pool_.swap_out(id, target); }
  Result<std::size_t> swap_in(SeqId id) override { return pool_.swap_in(id); }
  [[nodiscard]] Result<bool> swapped_out(SeqId id) const override { return pool_.swapped_out(id); }
  [[nodiscard]] Result<std::vector<PageView>> pages(SeqId id, int layer, int kv_head) const override {
    return pool_.pages(id, layer, kv_head);
  }
  [[nodiscard]] Result<HeadContents> read_back(SeqId id, int layer, int kv_head) const override {
    return pool_.read_back(id, layer, kv_head);
  }
  [[nodiscard]] PoolStats stats() const override { return pool_.stats(); }
  [[nodiscard]] std::size_t memory_bytes() const override { return pool_.memory_bytes(); }
  [[nodiscard]] Result<std::unique_ptr<AnyCache>> make_single(const ModelShape& shape) const override {
    return erase_cache<KVCache<Policies...>>(shape, name_);
  }

  /// The concrete pool (for code that knows the type).
  [[nodiscard]] Pool& get() noexcept { return pool_; }

 private:
  static constexpr bool evicting = KVCache<Policies...>::evicts;
  template <class... A>
  static Error no_eviction(const char* what, const A&...) {
    return fail(Errc::unsupported, std::string(what) + ": not available on a pool with an eviction policy");
  }
  // mutable: an evicting pool's attend updates scores (AnyPool::attend stays const for the others).
  mutable Pool pool_;
  std::string name_;
};

}  // namespace kvpack::registry
