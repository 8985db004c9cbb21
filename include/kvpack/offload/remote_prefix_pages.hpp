// The page traffic both prefix shares run (RemotePrefixShare for a KVCache, RemotePoolPrefixShare
// for a PagedCache): sealing the (page, layer, KV head) payloads of a prefix and storing them in
// pipelined batches, and fetching and opening them page by page. The callers own what differs:
// where a page's payload lives and where verified pages go.
#pragma once

#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <span>
#include <string>
#include <utility>
#include <vector>

#include "kvpack/offload/remote_page_codec.hpp"
#include "kvpack/offload/remote_page_key.hpp"
#include "kvpack/offload/remote_tier.hpp"
#include "kvpack/cache/shape.hpp"

namespace kvpack::offload {

/// What publish() did. Values are (page, layer, KV head) records.
struct PrefixPublishReport {
  int64_t pages = 0;           ///< full pages of the prompt the cache holds (offered)
  uint64_t values = 0;         ///< records sent (pages * layers * kv_heads)
  uint64_t stored = 0;         ///< records the server acknowledged
  uint64_t record_bytes = 0;   ///< bytes of the records sent
};

namespace detail {

/// One tier, sealer, model id and head layout; the page addressing and (de)sealing loops.
class PrefixPages {
 public:
  PrefixPages(RemoteTier& tier, PageSealer sealer, std::string model_id, const ModelShape& shape, std::size_t positions_offset,
              int page_tokens)
      : tier_(&tier), sealer_(std::move(sealer)), model_id_(std::move(model_id)), shape_(shape),
        positions_offset_(positions_offset), page_tokens_(page_tokens) {}

  [[nodiscard]] RemoteTier& tier() const noexcept { return *tier_; }
  [[nodiscard]] const PageSealer& sealer() const noexcept { return sealer_; }
  [[nodiscard]] const std::string& model_id() const noexcept { return model_id_; }
  /// Bytes of one block payload.
  [[nodiscard]] std::size_t payload() const noexcept { return sealer_.layout().max_payload_bytes; }
  /// Values per page: layers * kv_heads, in [layer][kv_head] order.
  [[nodiscard]] std::size_t per_page() const noexcept {
    return static_cast<std::size_t>(shape_.layers) * static_cast<std::size_t>(shape_.kv_heads);
  }

  /// Seals and stores pages [0, pages) of the prefix whose page digests are `digests`;
  /// page_data(p, l, h) gives the payload of (page p, layer l, KV head h), or nullptr to skip it.
  /// A payload whose positions are not its token indices is skipped.
  template <class PageData>
  PrefixPublishReport publish(const std::vector<PageDigest>& digests, int64_t pages, int pages_per_batch, PageData&& page_data) {
    PrefixPublishReport rep;
    rep.pages = pages;
    const std::size_t rec = sealer_.record_size();
    const int64_t step = std::max(1, pages_per_batch);
    std::vector<std::string> keys;
    std::vector<std::byte> buf;
    std::vector<std::span<const std::byte>> values;
    for (int64_t p0 = 0; p0 < pages; p0 += step) {
      const int64_t p1 = std::min(pages, p0 + step);
      keys.clear();
      values.clear();
      buf.assign(static_cast<std::size_t>(p1 - p0) * per_page() * rec, std::byte{0});
      std::size_t at = 0;
      for (int64_t p = p0; p < p1; ++p)
        for (int l = 0; l < shape_.layers; ++l)
          for (int h = 0; h < shape_.kv_heads; ++h) {
            const std::byte* data = page_data(p, l, h);
            if (!data || !positions_are_indices(data, p)) continue;
            const PageCoord c{l, h, shape_.kv_heads, p};
            const PageDigest k = page_key(digests[static_cast<std::size_t>(p)], c, sealer_.layout(), sealer_.aead());
            const std::span<std::byte> out(buf.data() + at * rec, rec);
            if (!sealer_.seal(k, c, std::span<const std::byte>(data, payload()), out)) continue;
            keys.push_back(key_string(k));
            values.push_back(out);
            ++at;
          }
      rep.values += values.size();
      rep.record_bytes += values.size() * rec;
      rep.stored += tier_->set_many(keys, values);
    }
    return rep;
  }

  /// The values of pages [p0, p1), [page][layer][kv_head], one pipelined round trip; `digs`
  /// receives their keys' digests in the same order (for open_page).
  [[nodiscard]] std::vector<RemoteValue> fetch(const std::vector<PageDigest>& digests, int64_t p0, int64_t p1,
                                               std::vector<PageDigest>& digs) {
    std::vector<std::string> keys;
    digs.clear();
    for (int64_t p = p0; p < p1; ++p)
      for (int l = 0; l < shape_.layers; ++l)
        for (int h = 0; h < shape_.kv_heads; ++h) {
          digs.push_back(page_key(digests[static_cast<std::size_t>(p)], PageCoord{l, h, shape_.kv_heads, p},
                                  sealer_.layout(), sealer_.aead()));
          keys.push_back(key_string(digs.back()));
        }
    return tier_->get_many(keys);
  }

  /// Opens the per_page() values of page p (got/digs from index `base`) into out[i * payload()];
  /// true when every one was present and verified (with `check_positions`: and holds positions
  /// p*B .. p*B+B-1). Records that fail to open are counted as rejected in the tier's stats.
  [[nodiscard]] bool open_page(const std::vector<RemoteValue>& got, const std::vector<PageDigest>& digs, std::size_t base,
                               int64_t p, std::byte* out, bool check_positions) {
    const auto heads = static_cast<std::size_t>(shape_.kv_heads);
    uint64_t rejected = 0;
    bool complete = true;
    for (std::size_t i = 0; i < per_page(); ++i) {
      const RemoteValue& v = got[base + i];
      const auto l = static_cast<int32_t>(i / heads), h = static_cast<int32_t>(i % heads);
      const std::span<std::byte> dst(out + i * payload(), payload());
      if (!v) {
        complete = false;
      } else if (!sealer_.open(digs[base + i], PageCoord{l, h, shape_.kv_heads, p}, *v, dst) ||
                 (check_positions && !positions_are_indices(dst.data(), p))) {
        complete = false;
        ++rejected;
      }
    }
    if (rejected) tier_->count_rejected(rejected);
    return complete;
  }

 private:
  [[nodiscard]] std::string key_string(const PageDigest& d) const { return tier_->config().key_prefix + d.hex(); }

  // Page p of a shareable prefix holds positions p*B .. p*B+B-1 (the prompt starts at 0).
  [[nodiscard]] bool positions_are_indices(const std::byte* data, int64_t page) const {
    for (int t = 0; t < page_tokens_; ++t) {
      int32_t pos;
      std::memcpy(&pos, data + positions_offset_ + static_cast<std::size_t>(t) * sizeof pos, sizeof pos);
      if (pos != page * page_tokens_ + t) return false;
    }
    return true;
  }

  RemoteTier* tier_;
  PageSealer sealer_;
  std::string model_id_;
  ModelShape shape_;
  std::size_t positions_offset_;  // byte offset of the int32 positions in a block payload
  int page_tokens_;
};

}  // namespace detail
}  // namespace kvpack::offload
