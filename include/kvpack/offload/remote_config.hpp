// Configuration of the shared remote tier (remote_tier.hpp): where the Redis/Valkey server is,
// how long to wait for it, how long pages live there, and where the password comes from.
//
// URL forms (RFC 3986 style, as redis-cli and most Redis clients accept them):
//   redis://host[:port][/db]        TCP, default port 6379, default database 0
//   unix:///absolute/path.sock[?db=N]  a unix-domain socket
// A password inside the URL (redis://:secret@host) is rejected: URLs end up in logs and
// process listings, so the password is read from an environment variable instead and is
// never written into any message.
#pragma once

#include <chrono>
#include <cstddef>
#include <cstdint>
#include <string>
#include <string_view>

#include "kvpack/result.hpp"

namespace kvpack::offload {

/// Where a RemoteTier connects: a TCP host/port or a unix socket path, plus the database index.
struct RemoteEndpoint {
  bool unix_socket = false;  ///< true: `path` is a unix-domain socket; false: `host`:`port` over TCP
  std::string host;          ///< TCP host name or address (empty for unix sockets)
  int port = 6379;           ///< TCP port, 1..65535
  std::string path;          ///< socket path (empty for TCP)
  int db = 0;                ///< database index selected after connecting (SELECT), >= 0

  /// "127.0.0.1:6379/0" or "unix:/tmp/x.sock/0", for messages (never carries a password).
  [[nodiscard]] std::string describe() const {
    return (unix_socket ? "unix:" + path : host + ":" + std::to_string(port)) + "/" + std::to_string(db);
  }
};

/// Runtime options of a RemoteTier. Times are wall-clock; sizes are bytes.
struct RemoteConfig {
  /// Server URL, see the top of this file.
  std::string url = "redis://127.0.0.1:6379/0";
  /// Longest wait for a TCP/unix connect (and AUTH/SELECT) before the tier counts the server down.
  std::chrono::milliseconds connect_timeout{250};
  /// Longest wait for one reply (socket receive/send timeout). A fetch past it is a miss.
  std::chrono::milliseconds command_timeout{200};
  /// After a failed connect or a broken connection, requests are answered as misses without
  /// touching the network until this much time has passed (a down server costs nothing per token).
  std::chrono::milliseconds retry_after{500};
  /// Time to live of every published page (SET ... PX); 0: no expiry (rely on maxmemory eviction).
  std::chrono::milliseconds ttl{std::chrono::hours(1)};
  /// Values larger than this are neither published nor accepted from the server (a fetched value
  /// above it is counted as an oversized error and treated as a miss).
  std::size_t max_value_bytes = std::size_t{1} << 20;
  /// Environment variable holding the AUTH password; unset or empty variable: no AUTH.
  std::string password_env = "KVPACK_REMOTE_PASSWORD";
  /// Prefix of every key (namespace inside a shared server); the rest is the page digest in hex.
  std::string key_prefix = "kvpack:page:v1:";
  /// Commands sent in one pipeline before reading the replies (bounds client memory per batch).
  std::size_t pipeline_depth = 512;
};

namespace detail {
[[nodiscard]] inline bool parse_uint(std::string_view s, long max, int& out) {
  if (s.empty() || s.size() > 9) return false;
  long v = 0;
  for (char c : s) {
    if (c < '0' || c > '9') return false;
    v = v * 10 + (c - '0');
  }
  if (v > max) return false;
  out = static_cast<int>(v);
  return true;
}
}  // namespace detail

/// Parses a server URL (forms at the top of this file). Errc::invalid_argument, naming the part
/// that is wrong, for an unknown scheme, an empty host, a port outside 1..65535, a bad database
/// index, a relative socket path, or a password in the URL (the message never repeats it).
[[nodiscard]] inline Result<RemoteEndpoint> parse_remote_url(std::string_view url) {
  auto bad = [](const std::string& what) { return fail(Errc::invalid_argument, "remote tier URL: " + what); };
  RemoteEndpoint e;
  constexpr std::string_view tcp = "redis://", unix_scheme = "unix://";
  if (url.starts_with(unix_scheme)) {
    std::string_view rest = url.substr(unix_scheme.size());
    if (const auto q = rest.find('?'); q != std::string_view::npos) {
      const std::string_view query = rest.substr(q + 1);
      rest = rest.substr(0, q);
      if (!query.starts_with("db=") || !detail::parse_uint(query.substr(3), 1 << 20, e.db))
        return bad("unix socket query must be ?db=N");
    }
    if (rest.empty() || rest.front() != '/') return bad("unix socket path must be absolute (unix:///path.sock)");
    e.unix_socket = true;
    e.path = std::string(rest);
    return e;
  }
  if (!url.starts_with(tcp)) return bad("scheme must be redis:// or unix://");
  std::string_view rest = url.substr(tcp.size());
  if (rest.find('@') != std::string_view::npos)
    return bad("credentials in the URL are not accepted; put the password in the environment variable "
               "named by RemoteConfig::password_env");
  std::string_view hostport = rest, db;
  if (const auto s = rest.find('/'); s != std::string_view::npos) {
    hostport = rest.substr(0, s);
    db = rest.substr(s + 1);
  }
  if (!db.empty() && !detail::parse_uint(db, 1 << 20, e.db)) return bad("database must be a non-negative integer");
  std::string_view host = hostport;
  if (hostport.starts_with('[')) {  // [IPv6]:port
    const auto close = hostport.find(']');
    if (close == std::string_view::npos) return bad("unterminated [IPv6] host");
    host = hostport.substr(1, close - 1);
    const std::string_view after = hostport.substr(close + 1);
    if (!after.empty() && (!after.starts_with(':') || !detail::parse_uint(after.substr(1), 65535, e.port)))
      return bad("bad port");
  } else if (const auto c = hostport.rfind(':'); c != std::string_view::npos) {
    host = hostport.substr(0, c);
    if (!detail::parse_uint(hostport.substr(c + 1), 65535, e.port)) return bad("bad port");
  }
  if (host.empty()) return bad("empty host");
  if (e.port == 0) return bad("port must be 1..65535");
  e.host = std::string(host);
  return e;
}

}  // namespace kvpack::offload
