// Counters of the shared remote tier (remote_tier.hpp), the remote counterpart of the offload
// store's Metrics (offload_store.hpp): hits, misses, bytes on the wire, fetch latency
// percentiles and errors by kind. Every failure of the tier ends as a miss (the cache recomputes
// or keeps the page local); these counters are where it shows.
#pragma once

#include <algorithm>
#include <array>
#include <cstddef>
#include <cstdint>
#include <string>
#include <vector>

namespace kvpack::offload {

/// Why a remote operation did not deliver. Each kind is counted in RemoteStats::errors.
enum class RemoteError : uint8_t {
  connect = 0,   ///< TCP/unix connect failed or timed out (server down, wrong address)
  timeout = 1,   ///< a reply did not come within RemoteConfig::command_timeout
  io = 2,        ///< the connection broke (server killed or restarted mid-request)
  auth = 3,      ///< AUTH refused (wrong password) or the server demands one (NOAUTH)
  server = 4,    ///< the server answered an error (OOM under maxmemory noeviction, READONLY, ...)
  oversized = 5, ///< a value above RemoteConfig::max_value_bytes (not sent, or not accepted)
  rejected = 6,  ///< a fetched value failed verification (tampered, truncated, foreign, stale)
  skipped = 7,   ///< request answered as a miss without I/O while the server is considered down
};
inline constexpr std::size_t kRemoteErrorKinds = 8;

/// Printable name of a RemoteError.
[[nodiscard]] constexpr const char* to_string(RemoteError e) noexcept {
  switch (e) {
    case RemoteError::connect: return "connect";
    case RemoteError::timeout: return "timeout";
    case RemoteError::io: return "io";
    case RemoteError::auth: return "auth";
    case RemoteError::server: return "server";
    case RemoteError::oversized: return "oversized";
    case RemoteError::rejected: return "rejected";
    case RemoteError::skipped: return "skipped";
  }
  return "unknown";
}

/// Snapshot of a RemoteTier's counters. Bytes are value bytes (sealed records) plus key bytes,
/// as sent to or received from the server; fetch latency is one pipelined batch of GETs, from
/// the first command written to the last reply read, in microseconds.
struct RemoteStats {
  uint64_t hits = 0;          ///< values fetched and verified
  uint64_t misses = 0;        ///< values absent, unreachable, or rejected by verification
  uint64_t published = 0;     ///< values stored (SET acknowledged)
  uint64_t publish_failures = 0;  ///< values not stored (the page stays local)
  uint64_t bytes_in = 0;      ///< bytes of values received
  uint64_t bytes_out = 0;     ///< bytes of keys and values sent
  uint64_t fetch_batches = 0; ///< pipelined GET batches sent
  double fetch_p50_us = 0;    ///< median batch latency over the last 4096 batches
  double fetch_p99_us = 0;    ///< 99th percentile of the same
  uint64_t reconnects = 0;    ///< connections (re)established
  std::array<uint64_t, kRemoteErrorKinds> errors{};  ///< indexed by RemoteError

  /// Count of one error kind.
  [[nodiscard]] uint64_t error(RemoteError e) const noexcept { return errors[static_cast<std::size_t>(e)]; }

  /// One line: "hits 90 misses 0 in 1.2 MB out 0 B p50 812 us p99 950 us errors: timeout 1".
  [[nodiscard]] std::string summary() const {
    std::string s = "hits " + std::to_string(hits) + " misses " + std::to_string(misses) + " published " +
                    std::to_string(published) + " publish_failures " + std::to_string(publish_failures) +
                    " bytes_in " + std::to_string(bytes_in) + " bytes_out " + std::to_string(bytes_out) +
                    " fetch_p50_us " + std::to_string(static_cast<long long>(fetch_p50_us)) + " fetch_p99_us " +
                    std::to_string(static_cast<long long>(fetch_p99_us)) + " errors:";
    bool any = false;
    for (std::size_t i = 0; i < kRemoteErrorKinds; ++i)
      if (errors[i]) {
        s += std::string(" ") + to_string(static_cast<RemoteError>(i)) + " " + std::to_string(errors[i]);
        any = true;
      }
    return any ? s : s + " none";
  }
};

namespace detail {
/// Ring of the last 4096 latencies (microseconds) with nearest-rank percentiles.
class LatencyRing {
 public:
  void add(double us) {
    if (v_.size() < kCap) {
      v_.push_back(us);
    } else {
      v_[next_] = us;
      next_ = (next_ + 1) % kCap;
    }
  }
  /// Nearest-rank percentile q in [0, 1]; 0 when empty.
  [[nodiscard]] double percentile(double q) const {
    if (v_.empty()) return 0;
    std::vector<double> s = v_;
    const auto k = static_cast<std::size_t>(q * static_cast<double>(s.size() - 1) + 0.5);
    std::nth_element(s.begin(), s.begin() + static_cast<std::ptrdiff_t>(k), s.end());
    return s[k];
  }

 private:
  static constexpr std::size_t kCap = 4096;
  std::vector<double> v_;
  std::size_t next_ = 0;
};
}  // namespace detail

}  // namespace kvpack::offload
