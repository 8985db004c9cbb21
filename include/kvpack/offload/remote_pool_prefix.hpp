// The paged pool's prefix cache feeding the shared remote tier: a serving engine's PagedCache
// publishes a sequence's full pages to a RemoteTier (Redis/Valkey), and another process's pool
// attaches a new sequence from the leading pages the tier holds, then appends only the rest of
// the prompt. This is RemotePrefixShare (remote_prefix.hpp) for PagedCache<Policies...>:
//
//   auto share = RemotePoolPrefixShare<Pool>::create(pool, **tier, EnvKeyProvider("KVPACK_REMOTE_KEY"), model_id);
//   // process A, after prefilling `prompt` into sequence a:
//   share->publish(pool, a, prompt);
//   // process B, new sequence b:
//   auto local = pool.attach_prefix(b, model_id, prompt);      // optional: the local prefix cache first
//   auto got = share->attach(pool, b, prompt);                 // then the tier from there on
//   model.forward(pool, b, prompt.subspan(*got), *got, ...);   // only the rest is computed
//   pool.publish_prefix(b, model_id, prompt);                  // optional: now shared locally too
//
// Records and keys are exactly RemotePrefixShare's: prefix digests and page keys of
// remote_page_key.hpp (BLAKE2b over model id, layer, KV head, KV heads, page index, the record
// layout of prefix_layout_for(pool) = codec format, bits, groups, key axis, head_dim, Blocks<B>,
// payload bytes (a page's codes and metadata + an int32 position per slot); and the token ids of
// the whole prefix up to the page's end), values sealed by PageSealer
// (remote_page_codec.hpp: a block record, XChaCha20-Poly1305 under a key derived from the shared
// secret, bound to its key). A pool page holds the same bytes as the block of a KVCache of the
// same policies fed the same tokens (pool/paged_cache.hpp), and prefix_layout_for() of both is the same
// RecordLayout, so a page published by RemotePrefixShare<KVCache<P...>> is found and imported by
// RemotePoolPrefixShare<PagedCache<P...>> and vice versa (tests/remote/test_remote_pool_prefix.cpp).
// Pools of another codec, group size, head layout or block size compute other keys and never see
// each other's pages (a value planted under a foreign key fails to open and is a miss).
//
// Robustness: a page enters the sequence only when the values of all its (layer, KV head) pairs
// were fetched and verified, and import stops at the first page that is not complete, so the
// sequence holds a contiguous prefix; a down or slow server, a miss, an eviction, a tampered or
// wrong-key record only shortens the import. The verified pages are then imported in ONE pool
// call (PagedCache::import_pages: all or nothing), so pool exhaustion is an error that leaves the
// sequence as it was and the pool unchanged.
//
// Exactness: imported pages are the publisher's bytes, and attach() takes at most the pages that
// appending the whole prompt would commit (as PagedCache::attach_prefix), so decoding afterwards is
// bit-identical to a sequence that appended the whole prompt itself. Caveat (as attach_prefix):
// prefill queries of the rest of the prompt read the attached prefix quantized, where a single
// append of the whole prompt would have read its latest chunk exactly.
//
// Sinks<N> pools: publish() and attach() return Errc::unsupported (sink rows are not paged), as
// PagedCache::publish_prefix does. Positions must be token indices (the prompt starts at 0).
// Pages store no positions: publish() writes each record's from the sequence's position runs
// (PagedCache::block_positions; the record format is KVCache's and unchanged, PrefixPages skips
// pages whose positions differ), attach() checks them (it stops at such a page) and drops them.
#pragma once

#include <sodium.h>

#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <span>
#include <string>
#include <vector>

#include "kvpack/offload/cache_layout.hpp"
#include "kvpack/offload/remote_page_codec.hpp"
#include "kvpack/offload/remote_page_key.hpp"
#include "kvpack/offload/remote_prefix.hpp"
#include "kvpack/offload/remote_tier.hpp"
#include "kvpack/pool/paged_cache.hpp"
#include "kvpack/result.hpp"

namespace kvpack::offload {

/// Publishes and attaches the prefix pages of sequences of PagedCache type `Pool` through one
/// RemoteTier. Holds no sequence state: one object may serve any pool of the same type and
/// shape. Calls may run from several threads (the sealer is thread-safe, the tier serializes its
/// connection); the pool's rule applies to the sequence: no other call on the same sequence may
/// overlap publish() or attach() (publish reads the sequence's pages while it seals them).
template <class Pool>
class RemotePoolPrefixShare {
 public:
  /// Tokens per page (Blocks<B>).
  static constexpr int page_tokens = Pool::block_tokens;

  /// `pool` gives the layout and shape (any pool of the same type and shape may be used later);
  /// `tier` must outlive this object; `keys` gives the secret shared by all processes (read
  /// once); `model_id` names the model weights (part of every page address); `encrypt` false:
  /// records authenticated only (Aead::none; such pools only share with each other). Errors: the
  /// key provider's, Errc::invalid_argument for an empty model id or an invalid layout.
  [[nodiscard]] static Result<RemotePoolPrefixShare> create(const Pool& pool, RemoteTier& tier, const KeyProvider& keys,
                                                            std::string model_id, bool encrypt = true) {
    if (model_id.empty()) return fail(Errc::invalid_argument, "RemotePoolPrefixShare: empty model id");
    auto sealer = PageSealer::create(keys, prefix_layout_for(pool), encrypt);
    if (!sealer) return sealer.error();
    return RemotePoolPrefixShare(tier, std::move(sealer).value(), std::move(model_id), pool.shape(),
                                 pool.block_layout().bytes);  // pages hold codes and metadata: the record's positions follow
  }

  /// Bytes of one sealed page value (page payload + 4 bytes of position per slot + 72).
  [[nodiscard]] std::size_t value_bytes() const noexcept { return pages_.sealer().record_size(); }
  /// The tier (stats, ping).
  [[nodiscard]] RemoteTier& tier() const noexcept { return pages_.tier(); }
  /// The model id every address includes.
  [[nodiscard]] const std::string& model_id() const noexcept { return pages_.model_id(); }

  /// Publishes every full page of sequence `id` that covers `tokens` (the token ids the
  /// sequence was fed, oldest first, positions 0, 1, ...): page p when (p + 1) * B <= tokens.size()
  /// and every (layer, KV head) of the sequence holds page p full (a trailing partial page or
  /// tokens still pending are never published), `pages_per_batch` pages per pipelined round
  /// trip. Pages attached from the prefix cache or imported are published like the others.
  /// What the server does not store stays local only (counted in the report and the tier's
  /// stats): never an error. Errors: stale handle (Errc::invalid_argument); Sinks<N>
  /// (Errc::unsupported, as PagedCache::publish_prefix).
  Result<PrefixPublishReport> publish(const Pool& pool, SeqId id, std::span<const int32_t> tokens, int pages_per_batch = 8) {
    if (Pool::sink_tokens > 0)
      return fail(Errc::unsupported, "RemotePoolPrefixShare::publish: not available with Sinks<N> (sink rows are not paged)");
    // Page tables [layer][kv_head]; a page is full when its header counts B tokens.
    std::vector<std::vector<PageView>> tables;
    const auto digests = prefix_page_digests(pages_.model_id(), tokens, page_tokens);
    int64_t pages = static_cast<int64_t>(digests.size());
    for (int l = 0; l < shape_.layers; ++l)
      for (int h = 0; h < shape_.kv_heads; ++h) {
        auto t = pool.pages(id, l, h);
        if (!t) return fail(t.error().code, "RemotePoolPrefixShare::publish: " + t.error().message);
        int64_t full = 0;
        while (full < static_cast<int64_t>(t->size()) && (*t)[static_cast<std::size_t>(full)].header.count == page_tokens) ++full;
        pages = std::min(pages, full);
        tables.push_back(std::move(t).value());
      }
    std::vector<const PositionRuns*> runs;  // pages hold no positions: records carry them (from the runs)
    for (int l = 0; l < shape_.layers; ++l) {
      auto r = pool.block_positions(id, l);
      if (!r) return fail(r.error().code, "RemotePoolPrefixShare::publish: " + r.error().message);
      runs.push_back(*r);
    }
    const std::size_t at = pool.block_layout().bytes;  // codes and metadata; the record's positions follow
    std::vector<std::byte> record(pages_.payload());
    const WipeOnExit wipe_record{record};
    return pages_.publish(digests, pages, pages_per_batch, [&](int64_t p, int l, int h) -> const std::byte* {
      std::memcpy(record.data(), tables[static_cast<std::size_t>(l * shape_.kv_heads + h)][static_cast<std::size_t>(p)].data, at);
      for (int t = 0; t < page_tokens; ++t) {
        const int32_t pos = runs[static_cast<std::size_t>(l)]->at(p * page_tokens + t);
        std::memcpy(record.data() + at + static_cast<std::size_t>(t) * sizeof pos, &pos, sizeof pos);
      }
      return record.data();
    });
  }

  /// Attaches to sequence `id`, about to receive `prompt` (all of it, positions 0, 1, ...), the
  /// leading pages of `prompt` the tier holds complete and verified, starting at the page the
  /// sequence holds now (an empty sequence, or one PagedCache::attach_prefix just filled: whole
  /// committed pages only) and stopping at the first page not complete, or at the pages that
  /// appending the whole prompt would commit (m * B <= commit_count(prompt.size()), as
  /// attach_prefix), fetching `pages_per_batch` pages per round trip. Returns the sequence's
  /// length afterwards (a multiple of B, at most prompt.size()): the caller appends
  /// prompt[result, end). A miss, a down or slow server, a tampered, wrong-key, foreign-codec or
  /// foreign-layout record only shortens the import (rejected records are counted in the tier's
  /// stats). Memory: the verified payloads are held in one buffer (pages * layers * kv_heads *
  /// record payload bytes), zeroed however attach returns. Errors, with the sequence and the pool unchanged: stale
  /// handle, a sequence holding pending or uncommitted tokens (Errc::invalid_argument); the pool
  /// short of free pages or max_tokens exceeded (Errc::capacity_exceeded, from
  /// PagedCache::import_pages; the message names pages needed and free); Sinks<N>
  /// (Errc::unsupported).
  [[nodiscard]] Result<int64_t> attach(Pool& pool, SeqId id, std::span<const int32_t> prompt, int pages_per_batch = 8) {
    if (Pool::sink_tokens > 0)
      return fail(Errc::unsupported, "RemotePoolPrefixShare::attach: not available with Sinks<N> (sink rows are not paged)");
    const auto len = pool.length(id);
    if (!len) return fail(len.error().code, "RemotePoolPrefixShare::attach: " + len.error().message);
    const int64_t have = *len;
    for (int l = 0; l < shape_.layers; ++l) {
      auto t = pool.pages(id, l, 0);
      if (pool.tokens(id, l).value() != have || !t || static_cast<int64_t>(t->size()) * page_tokens != have ||
          (!t->empty() && t->back().header.count != page_tokens))
        return fail(Errc::invalid_argument, "RemotePoolPrefixShare::attach: the sequence must hold whole committed pages "
                                            "only, the same in every layer (layer " + std::to_string(l) + ")");
    }
    const int64_t m_max = pool_detail::commit_count(static_cast<int64_t>(prompt.size()), Pool::residual_tokens,
                                                    Pool::commit_unit) / page_tokens;
    const auto digests = prefix_page_digests(pages_.model_id(), prompt.first(static_cast<std::size_t>(m_max * page_tokens)),
                                             page_tokens);
    const int64_t pages = static_cast<int64_t>(digests.size());
    const std::size_t payload = pages_.payload(), per_page = pages_.per_page();
    const int64_t step = std::max(1, pages_per_batch);
    std::vector<PageDigest> digs;
    std::vector<std::byte> plain;  // verified payloads, [page][layer][kv_head]
    const WipeOnExit wipe_plain{plain};
    std::size_t verified = 0;      // pages in `plain`
    bool complete = true;
    for (int64_t p0 = have / page_tokens; complete && p0 < pages; p0 += step) {
      const int64_t p1 = std::min(pages, p0 + step);
      const std::vector<RemoteValue> got = pages_.fetch(digests, p0, p1, digs);
      grow(plain, static_cast<std::size_t>(verified + static_cast<std::size_t>(p1 - p0)) * per_page * payload);
      for (int64_t p = p0; complete && p < p1; ++p) {
        complete = pages_.open_page(got, digs, static_cast<std::size_t>(p - p0) * per_page, p,
                                    plain.data() + verified * per_page * payload, true);
        if (complete) ++verified;
      }
    }
    // Records carry positions (checked: the token indices); the pool's pages hold codes and metadata only.
    const std::size_t block = pool.block_layout().bytes;
    for (std::size_t i = 0; i < verified * per_page; ++i) std::memmove(plain.data() + i * block, plain.data() + i * payload, block);
    Result<int64_t> r = pool.import_pages(id, std::span<const std::byte>(plain.data(), verified * per_page * block));
    sodium_memzero(plain.data(), plain.size());
    if (!r) return fail(r.error().code, "RemotePoolPrefixShare::attach: " + r.error().message);
    return r;
  }

 private:
  RemotePoolPrefixShare(RemoteTier& tier, PageSealer sealer, std::string model_id, const ModelShape& shape,
                        std::size_t positions_offset)
      : pages_(tier, std::move(sealer), std::move(model_id), shape, positions_offset, page_tokens), shape_(shape) {}

  // Zeroes a plaintext buffer however its scope is left (an exception included).
  struct WipeOnExit {
    std::vector<std::byte>& v;
    ~WipeOnExit() { sodium_memzero(v.data(), v.size()); }
  };

  // Resizes the plaintext buffer without leaving a copy of verified payloads behind.
  static void grow(std::vector<std::byte>& v, std::size_t n) {
    if (n <= v.capacity()) {
      v.resize(n);
      return;
    }
    std::vector<std::byte> w(n);
    if (!v.empty()) {
      std::memcpy(w.data(), v.data(), v.size());
      sodium_memzero(v.data(), v.size());
    }
    v.swap(w);
  }

  detail::PrefixPages pages_;
  ModelShape shape_;
};

}  // namespace kvpack::offload
