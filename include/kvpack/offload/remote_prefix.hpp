// Prefix sharing through a RemoteTier on today's single-sequence KVCache: a process that has run
// a prompt prefix publishes the prefix's full pages; another process, with a fresh cache and the
// same prompt, imports as many leading pages as the tier holds and runs only the rest of the
// prompt through the model.
//
//   auto tier = RemoteTier::create(cfg);                       // redis://... or unix://...
//   auto share = RemotePrefixShare<Cache>::create(cache, **tier, EnvKeyProvider("KVPACK_REMOTE_KEY"),
//                                                 "SmolLM2-135M-Instruct.Q4_1");
//   // process A, after prefilling `prompt`:
//   share->publish(cache, prompt);
//   // process B, fresh cache:
//   auto got = share->import(cache, prompt);                   // tokens now held, a page multiple
//   model.forward(cache, prompt.subspan(*got), *got, ...);     // only the rest is computed
//
// A page is imported only when the values of all (layer, KV head) pairs of that page were fetched
// and verified; import stops at the first page that is not complete, so the cache always holds a
// contiguous prefix [0, k * Blocks<B>) and the caller recomputes the rest: nothing is ever lost,
// whatever the tier does (miss, timeout, restart, eviction, tampering). Imported blocks are the
// publisher's bytes, so attention over them is bit-identical to the publisher's.
//
// The cache type must be plain (no eviction, sinks, keyframe codecs or Offload<>): its block b
// holds exactly tokens [b * B, (b + 1) * B) (KVCache::import_block checks this too). Positions
// must be the token indices (the prompt starts at position 0); publish() skips pages whose
// positions differ. Records hold codes, metadata and an int32 position per slot
// (prefix_layout_for), so KVCaches and PagedCaches of one policy share pages: caches and pools
// whose blocks store no positions (KVCache::slot_positions false, every PagedCache page) add them
// from their position runs when they publish and drop them, checked, when they import.
#pragma once

#include <sodium.h>

#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <span>
#include <string>
#include <vector>

#include "kvpack/kv_cache.hpp"
#include "kvpack/offload/cache_layout.hpp"
#include "kvpack/offload/remote_page_codec.hpp"
#include "kvpack/offload/remote_page_key.hpp"
#include "kvpack/offload/remote_prefix_pages.hpp"
#include "kvpack/offload/remote_tier.hpp"
#include "kvpack/result.hpp"

namespace kvpack::offload {

/// Publishes and imports the prefix pages of caches of type `Cache` through one RemoteTier.
template <class Cache>
class RemotePrefixShare {
  static_assert(!Cache::evicts && !Cache::codec_hook::interval_blocks && Cache::sink_tokens == 0 && !Cache::offloads,
                "kvpack::offload::RemotePrefixShare<Cache>: the cache must have no eviction, keyframe codec, "
                "Sinks<> or Offload<> (block b must hold exactly tokens [b*B, (b+1)*B))");

 public:
  /// `cache` gives the layout and shape (any cache of the same type and shape may be used later);
  /// `tier` must outlive this object; `keys` gives the secret shared by all processes (read once);
  /// `model_id` names the model weights (part of every page address). Errors: the key
  /// provider's, Errc::invalid_argument for an empty model id.
  [[nodiscard]] static Result<RemotePrefixShare> create(const Cache& cache, RemoteTier& tier, const KeyProvider& keys,
                                                        std::string model_id, bool encrypt = true) {
    if (model_id.empty()) return fail(Errc::invalid_argument, "RemotePrefixShare: empty model id");
    auto sealer = PageSealer::create(keys, prefix_layout_for(cache), encrypt);
    if (!sealer) return sealer.error();
    return RemotePrefixShare(tier, std::move(sealer).value(), std::move(model_id), cache.shape(),
                             cache.block_layout().positions);
  }

  /// Tokens per page (Blocks<B>).
  static constexpr int page_tokens = Cache::block_tokens;
  /// Bytes of one sealed page value (payload + 72).
  [[nodiscard]] std::size_t value_bytes() const noexcept { return pages_.sealer().record_size(); }
  /// The tier (stats, ping).
  [[nodiscard]] RemoteTier& tier() const noexcept { return pages_.tier(); }

  /// Publishes every full page of `prompt` that `cache` holds in all layers (a trailing partial
  /// page is never published), `pages_per_batch` pages per pipelined round trip. Never fails:
  /// what the server did not store stays local only (counted in the report and tier stats).
  PrefixPublishReport publish(const Cache& cache, std::span<const int32_t> prompt, int pages_per_batch = 8) {
    const auto digests = prefix_page_digests(pages_.model_id(), prompt, page_tokens);
    int64_t pages = static_cast<int64_t>(digests.size());
    for (int l = 0; l < shape_.layers; ++l) pages = std::min<int64_t>(pages, cache.quantized_tokens(l) / page_tokens);
    std::vector<std::byte> record(pages_.payload());  // a block without positions, completed (sealed at once)
    const WipeOnExit wipe_record{record};
    PrefixPublishReport rep = pages_.publish(digests, pages, pages_per_batch, [&](int64_t p, int l, int h) -> const std::byte* {
      const auto& b = cache.blocks(l, h)[static_cast<std::size_t>(p)];
      if (!b.data || b.header.count != page_tokens) return nullptr;
      if constexpr (Cache::slot_positions) {
        return b.data.get();
      } else {
        const std::size_t at = cache.block_layout().positions;  // after the codes and metadata
        std::memcpy(record.data(), b.data.get(), at);
        const PositionRuns& runs = cache.block_positions(l);
        for (int t = 0; t < page_tokens; ++t) {
          const int32_t pos = runs.at(p * page_tokens + t);
          std::memcpy(record.data() + at + static_cast<std::size_t>(t) * sizeof pos, &pos, sizeof pos);
        }
        return record.data();
      }
    });
    return rep;
  }

  /// Imports the leading pages of `prompt` the tier holds complete and verified into `cache`,
  /// starting at the cache's current page (all layers must hold the same whole number of pages of
  /// this prompt, e.g. a fresh cache), fetching `pages_per_batch` pages per round trip. Returns the
  /// tokens the cache holds afterwards (a multiple of page_tokens, at most prompt.size()): the
  /// caller runs prompt[result, end) through the model. Misses and every tier failure only shorten
  /// the import. Errc::invalid_argument when the cache's layers are not at one page boundary;
  /// KVCache::import_block's errors (never expected after that check).
  [[nodiscard]] Result<int64_t> import(Cache& cache, std::span<const int32_t> prompt, int pages_per_batch = 8) {
    const int64_t have = cache.tokens(0);
    for (int l = 0; l < shape_.layers; ++l)
      if (cache.tokens(l) != have || cache.quantized_tokens(l) != have || have % page_tokens != 0)
        return fail(Errc::invalid_argument, "RemotePrefixShare::import: every layer must hold the same whole number "
                                            "of pages (layer " + std::to_string(l) + " holds " +
                                            std::to_string(cache.tokens(l)) + " tokens)");
    const auto digests = prefix_page_digests(pages_.model_id(), prompt, page_tokens);
    const int64_t pages = static_cast<int64_t>(digests.size());
    const std::size_t payload = pages_.payload(), heads = static_cast<std::size_t>(shape_.kv_heads);
    const std::size_t block = cache.block_layout().bytes;  // payload, or its codes and metadata only
    std::vector<std::byte> blocks(heads * block);          // one layer's blocks, as import_block takes them
    const WipeOnExit wipe_blocks{blocks};
    const int64_t step = std::max(1, pages_per_batch);
    std::vector<PageDigest> digs;
    std::vector<std::byte> plain;
    const WipeOnExit wipe_plain{plain};
    for (int64_t p0 = have / page_tokens; p0 < pages; p0 += step) {
      const int64_t p1 = std::min(pages, p0 + step);
      const std::vector<RemoteValue> got = pages_.fetch(digests, p0, p1, digs);
      // Verify page by page; a page enters the cache only when all its values verified.
      plain.assign(pages_.per_page() * payload, std::byte{0});
      for (int64_t p = p0; p < p1; ++p) {
        // Without slot positions the cache drops the records' positions: they must be the indices.
        if (!pages_.open_page(got, digs, static_cast<std::size_t>(p - p0) * pages_.per_page(), p, plain.data(),
                              !Cache::slot_positions)) {
          return cache.tokens(0);
        }
        for (int l = 0; l < shape_.layers; ++l) {
          for (std::size_t h = 0; h < heads; ++h)
            std::memcpy(blocks.data() + h * block, plain.data() + (static_cast<std::size_t>(l) * heads + h) * payload, block);
          if (Status s = cache.import_block(l, blocks); !s) return s.error();
        }
      }
      sodium_memzero(plain.data(), plain.size());
    }
    return cache.tokens(0);
  }

 private:
  RemotePrefixShare(RemoteTier& tier, PageSealer sealer, std::string model_id, const ModelShape& shape,
                    std::size_t positions_offset)
      : pages_(tier, std::move(sealer), std::move(model_id), shape, positions_offset, page_tokens), shape_(shape) {}

  // Zeroes a plaintext buffer however its scope is left (an exception included).
  struct WipeOnExit {
    std::vector<std::byte>& v;
    ~WipeOnExit() { sodium_memzero(v.data(), v.size()); }
  };

  detail::PrefixPages pages_;
  ModelShape shape_;
};

}  // namespace kvpack::offload
