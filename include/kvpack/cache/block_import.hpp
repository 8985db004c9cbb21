// Importing whole, already-encoded blocks into a SequenceStore (the remote prefix tier,
// include/kvpack/offload/remote_prefix.hpp): nothing is quantized again, so attention over the
// imported blocks is bit-identical to attention in the cache that encoded them.
#pragma once

#include <cstddef>
#include <cstdint>
#include <cstring>
#include <span>
#include <string>
#include <vector>

#include "kvpack/cache/head_store.hpp"
#include "kvpack/detail/secure_zero.hpp"
#include "kvpack/result.hpp"

namespace kvpack {

/// Appends one full block per KV head to layer `li` of `store` (a store without eviction or
/// sinks). payloads: [kv_heads][layout().bytes] bytes, KV head 0 first, as blocks(layer, h)[b].data
/// of a cache of the same type and shape; the block holds cache indices [total, total + B), which
/// become its tokens' positions (what a shared prompt prefix holds; such stores keep positions
/// per layer, not in the payload). Errc::invalid_argument for a wrong payload size or a layer
/// holding pending (unquantized) tokens or a partial block; Errc::capacity_exceeded past max_tokens. Nothing changes on error; allocation happens before
/// any change, so std::bad_alloc (KVCache::import_block: Errc::out_of_memory) changes nothing either.
template <class Store>
[[nodiscard]] Status import_full_block(Store& store, int li, std::span<const std::byte> payloads) {
  static_assert(!Store::evicts && Store::sink_tokens == 0, "import_full_block: dense stores without sinks only");
  // Dense stores keep positions per layer (KVCache::slot_positions is false without eviction).
  if (store.layout().pos_bytes != 0) return fail(Errc::unsupported, "import_block: payloads with slot positions");
  const auto bad = [&](std::string m) {
    return fail(Errc::invalid_argument, "import_block: layer " + std::to_string(li) + ": " + std::move(m));
  };
  const BlockLayout& layout = store.layout();
  const std::size_t bytes = layout.bytes, heads = static_cast<std::size_t>(store.shape().kv_heads);
  const int B = layout.tokens;
  if (payloads.size() != heads * bytes)
    return bad(std::to_string(payloads.size()) + " bytes, expected kv_heads * block bytes = " + std::to_string(heads * bytes));
  auto& L = store.layer(li);
  if (L.pend.size() != 0 || L.committed != L.total || L.committed % B != 0)
    return bad("holds pending tokens or a partial block");
  if (L.total + B > store.shape().max_tokens)
    return fail(Errc::capacity_exceeded, "import_block: layer " + std::to_string(li) + " would exceed max_tokens");
  std::vector<Block> fresh;  // every allocation first: a failure leaves the layer as it was
  fresh.reserve(heads);
  for (std::size_t h = 0; h < heads; ++h) {
    fresh.push_back(make_block(layout, store.proto()));
    reserve_geometric(L.heads[h].blocks, L.heads[h].blocks.size() + 1);
  }
  L.block_pos.reserve_runs(1);
  for (std::size_t h = 0; h < heads; ++h) {  // nothing below allocates
    Block& b = fresh[h];
    std::memcpy(b.data.get(), payloads.data() + h * bytes, bytes);
    b.header.count = static_cast<std::uint16_t>(B);
    b.header.version = 1;
    L.heads[h].blocks.push_back(std::move(b));
  }
  detail::wipe_vector(L.chunk_k);  // the latest append is no longer the newest tokens
  detail::wipe_vector(L.chunk_v);
  L.chunk_tokens = 0;
  L.block_pos.push_consecutive(static_cast<std::int32_t>(L.total), B);  // reserved
  L.committed += B;
  L.total += B;
  return {};
}

}  // namespace kvpack
