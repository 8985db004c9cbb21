// RemoteTier: a shared tier of sealed page records on a Redis or Valkey server (the same RESP
// protocol; tested against Debian's redis-server 7.0), reached with hiredis. Many processes on
// many machines point at one server and find each other's prefix pages by content address
// (remote_page_key.hpp); what they store is sealed (remote_page_codec.hpp), so the server is
// trusted with availability only, never with correctness.
//
// This file is the transport: pipelined GET/SET of opaque values, the connection and its
// failures, and the counters (remote_stats.hpp). Its contract is that it never fails a request:
// every problem (server down, connect timeout, reply timeout, broken connection, server
// restarted, wrong password, OOM under maxmemory, oversized value) turns into misses or
// unpublished values, counted by kind, and the caller recomputes or keeps its pages local.
// Atomicity: a page is one value written by one SET, so a reader sees the whole record or none.
//
// Needs hiredis (Debian libhiredis-dev, pkg-config `hiredis`); CMake target kvpack::remote, which
// exists only where hiredis is found. Thread-safe: one connection guarded by a mutex (use one
// tier per thread for parallel fetches).
#pragma once

#include <hiredis/hiredis.h>
#include <pthread.h>
#include <signal.h>
#include <sys/time.h>

#include <cerrno>
#include <chrono>
#include <cstddef>
#include <cstdint>
#include <cstdlib>
#include <memory>
#include <mutex>
#include <optional>
#include <span>
#include <string>
#include <vector>

#include "kvpack/offload/remote_config.hpp"
#include "kvpack/offload/remote_stats.hpp"
#include "kvpack/result.hpp"

namespace kvpack::offload {

namespace detail {
/// Keeps a write to a connection the server closed (killed, restarted) from killing the process
/// with SIGPIPE, without changing the process-wide disposition: SIGPIPE is blocked in this thread
/// for the scope, a SIGPIPE raised meanwhile is consumed, and the mask is restored.
class SigpipeGuard {
 public:
  SigpipeGuard() {
    sigemptyset(&pipe_);
    sigaddset(&pipe_, SIGPIPE);
    sigset_t pending;
    sigemptyset(&pending);
    sigpending(&pending);
    was_pending_ = sigismember(&pending, SIGPIPE) == 1;
    pthread_sigmask(SIG_BLOCK, &pipe_, &old_);
  }
  SigpipeGuard(const SigpipeGuard&) = delete;
  SigpipeGuard& operator=(const SigpipeGuard&) = delete;
  ~SigpipeGuard() {
    if (!was_pending_) {
      sigset_t pending;
      sigemptyset(&pending);
      sigpending(&pending);
      if (sigismember(&pending, SIGPIPE) == 1) {
        const timespec zero{0, 0};
        while (sigtimedwait(&pipe_, nullptr, &zero) == -1 && errno == EINTR) {
        }
      }
    }
    pthread_sigmask(SIG_SETMASK, &old_, nullptr);
  }

 private:
  sigset_t pipe_{}, old_{};
  bool was_pending_ = false;
};
}  // namespace detail

/// A value fetched from the server (nullopt: a miss of any cause).
using RemoteValue = std::optional<std::vector<std::byte>>;

/// Connection to one Redis/Valkey server holding shared pages; see the top of this file.
class RemoteTier {
 public:
  /// Checks `cfg` (URL, positive timeouts, max_value_bytes and pipeline_depth > 0); does not
  /// connect (the first request does, so a server that is down fails nothing here).
  /// Errc::invalid_argument naming the bad field.
  [[nodiscard]] static Result<std::unique_ptr<RemoteTier>> create(RemoteConfig cfg) {
    auto ep = parse_remote_url(cfg.url);
    if (!ep) return ep.error();
    if (cfg.connect_timeout.count() <= 0 || cfg.command_timeout.count() <= 0)
      return fail(Errc::invalid_argument, "remote tier: connect_timeout and command_timeout must be > 0");
    if (cfg.retry_after.count() < 0 || cfg.ttl.count() < 0)
      return fail(Errc::invalid_argument, "remote tier: retry_after and ttl must be >= 0");
    if (cfg.max_value_bytes == 0 || cfg.pipeline_depth == 0)
      return fail(Errc::invalid_argument, "remote tier: max_value_bytes and pipeline_depth must be > 0");
    return std::unique_ptr<RemoteTier>(new RemoteTier(std::move(cfg), std::move(ep).value()));
  }

  RemoteTier(const RemoteTier&) = delete;
  RemoteTier& operator=(const RemoteTier&) = delete;
  ~RemoteTier() { drop(); }

  /// The parsed server address (no password).
  [[nodiscard]] const RemoteEndpoint& endpoint() const noexcept { return ep_; }
  /// The configuration given to create().
  [[nodiscard]] const RemoteConfig& config() const noexcept { return cfg_; }

  /// Fetches `keys` with pipelined GETs (RemoteConfig::pipeline_depth per round trip). Result i
  /// is the value of keys[i], or nullopt for a miss: absent, expired or evicted key, value above
  /// max_value_bytes, server error, or any connection failure (then every key after it in the
  /// batch is a miss too). Never fails; counts hits (provisionally, see count_rejected), misses,
  /// bytes_in, latency and errors.
  [[nodiscard]] std::vector<RemoteValue> get_many(std::span<const std::string> keys) {
    std::vector<RemoteValue> out(keys.size());
    std::lock_guard lock(mu_);
    const detail::SigpipeGuard no_sigpipe;
    for (std::size_t first = 0; first < keys.size(); first += cfg_.pipeline_depth) {
      const std::size_t n = std::min(cfg_.pipeline_depth, keys.size() - first);
      if (!connected_locked()) {
        stats_.misses += keys.size() - first;
        return out;
      }
      const auto t0 = std::chrono::steady_clock::now();
      for (std::size_t i = 0; i < n; ++i) {
        const std::string& k = keys[first + i];
        redisAppendCommand(ctx_, "GET %b", k.data(), k.size());
        stats_.bytes_out += k.size();
      }
      std::size_t i = 0;
      bool auth_refused = false;
      for (; i < n; ++i) {
        redisReply* r = nullptr;
        if (redisGetReply(ctx_, reinterpret_cast<void**>(&r)) != REDIS_OK || !r) {
          connection_failed_locked();
          break;
        }
        std::unique_ptr<redisReply, decltype(&freeReplyObject)> guard(r, &freeReplyObject);
        if (r->type == REDIS_REPLY_STRING) {
          const auto len = static_cast<std::size_t>(r->len);
          stats_.bytes_in += len;
          if (len > cfg_.max_value_bytes) {
            count_locked(RemoteError::oversized);
            ++stats_.misses;
            continue;
          }
          const auto* p = reinterpret_cast<const std::byte*>(r->str);
          out[first + i].emplace(p, p + len);
          ++stats_.hits;
        } else {
          if (r->type == REDIS_REPLY_ERROR && reply_error_kind(r) == RemoteError::auth) auth_refused = true;
          else if (r->type == REDIS_REPLY_ERROR) count_locked(RemoteError::server);
          ++stats_.misses;
        }
      }
      stats_.misses += n - i;
      if (auth_refused && i == n) {  // NOAUTH: back off like a down server instead of asking again
        mark_down_locked(RemoteError::auth, "the server demands AUTH (no or wrong password in the environment)");
        stats_.misses += keys.size() - first - n;
        return out;
      }
      if (i == n) {
        ++stats_.fetch_batches;
        latency_.add(std::chrono::duration<double, std::micro>(std::chrono::steady_clock::now() - t0).count());
      } else {
        stats_.misses += keys.size() - first - n;
        return out;
      }
    }
    return out;
  }

  /// Stores values[i] under keys[i] with pipelined SETs (PX ttl unless ttl is 0); one SET per
  /// value, so readers never see part of one. Returns how many the server acknowledged; the
  /// others (value above max_value_bytes, server error such as OOM, connection failure) are
  /// counted in publish_failures and errors. Never fails. Sizes of keys and values must match.
  std::size_t set_many(std::span<const std::string> keys, std::span<const std::span<const std::byte>> values) {
    std::lock_guard lock(mu_);
    const detail::SigpipeGuard no_sigpipe;
    const std::size_t total = std::min(keys.size(), values.size());
    std::size_t stored = 0;
    const std::string ttl = std::to_string(cfg_.ttl.count());
    for (std::size_t first = 0; first < total; first += cfg_.pipeline_depth) {
      const std::size_t n = std::min(cfg_.pipeline_depth, total - first);
      if (!connected_locked()) {
        stats_.publish_failures += total - first;
        return stored;
      }
      std::size_t sent = 0;
      std::vector<char> queued(n, 0);
      for (std::size_t i = 0; i < n; ++i) {
        const std::string& k = keys[first + i];
        const auto v = values[first + i];
        if (v.size() > cfg_.max_value_bytes) {
          count_locked(RemoteError::oversized);
          ++stats_.publish_failures;
          continue;
        }
        if (cfg_.ttl.count() > 0)
          redisAppendCommand(ctx_, "SET %b %b PX %s", k.data(), k.size(), v.data(), v.size(), ttl.c_str());
        else
          redisAppendCommand(ctx_, "SET %b %b", k.data(), k.size(), v.data(), v.size());
        stats_.bytes_out += k.size() + v.size();
        queued[i] = 1;
        ++sent;
      }
      std::size_t got = 0;
      bool auth_refused = false;
      for (; got < sent; ++got) {
        redisReply* r = nullptr;
        if (redisGetReply(ctx_, reinterpret_cast<void**>(&r)) != REDIS_OK || !r) {
          connection_failed_locked();
          break;
        }
        std::unique_ptr<redisReply, decltype(&freeReplyObject)> guard(r, &freeReplyObject);
        if (r->type == REDIS_REPLY_STATUS) {
          ++stored;
          ++stats_.published;
        } else {
          if (r->type == REDIS_REPLY_ERROR && reply_error_kind(r) == RemoteError::auth) auth_refused = true;
          else if (r->type == REDIS_REPLY_ERROR) count_locked(RemoteError::server);
          ++stats_.publish_failures;
        }
      }
      if (got < sent) {
        stats_.publish_failures += (sent - got) + (total - first - n);
        return stored;
      }
      if (auth_refused) {
        mark_down_locked(RemoteError::auth, "the server demands AUTH (no or wrong password in the environment)");
        stats_.publish_failures += total - first - n;
        return stored;
      }
    }
    return stored;
  }

  /// Connects now if not connected (PING). Errc::io_error naming the endpoint and the failure
  /// kind (never the password) when the server cannot be reached, refuses AUTH, or does not answer.
  [[nodiscard]] Status ping() {
    std::lock_guard lock(mu_);
    const detail::SigpipeGuard no_sigpipe;
    down_until_ = {};
    if (!connected_locked()) return fail(Errc::io_error, "remote tier " + ep_.describe() + ": " + last_error_);
    redisReply* r = static_cast<redisReply*>(redisCommand(ctx_, "PING"));
    if (!r) {
      connection_failed_locked();
      return fail(Errc::io_error, "remote tier " + ep_.describe() + ": " + last_error_);
    }
    const bool ok = r->type == REDIS_REPLY_STATUS;
    if (!ok) count_locked(reply_error_kind(r));
    freeReplyObject(r);
    if (!ok) return fail(Errc::io_error, "remote tier " + ep_.describe() + ": PING refused");
    return {};
  }

  /// Called by the page layer for fetched values that failed verification: moves them from hits
  /// to misses and counts them as RemoteError::rejected.
  void count_rejected(uint64_t n) {
    std::lock_guard lock(mu_);
    stats_.hits -= std::min(stats_.hits, n);
    stats_.misses += n;
    stats_.errors[static_cast<std::size_t>(RemoteError::rejected)] += n;
  }

  /// Snapshot of the counters.
  [[nodiscard]] RemoteStats stats() const {
    std::lock_guard lock(mu_);
    RemoteStats s = stats_;
    s.fetch_p50_us = latency_.percentile(0.50);
    s.fetch_p99_us = latency_.percentile(0.99);
    return s;
  }

  /// Last connection problem in words ("" when none): endpoint-free, password-free.
  [[nodiscard]] std::string last_error() const {
    std::lock_guard lock(mu_);
    return last_error_;
  }

 private:
  RemoteTier(RemoteConfig cfg, RemoteEndpoint ep) : cfg_(std::move(cfg)), ep_(std::move(ep)) {}

  static timeval to_timeval(std::chrono::milliseconds ms) {
    timeval tv{};
    tv.tv_sec = static_cast<time_t>(ms.count() / 1000);
    tv.tv_usec = static_cast<suseconds_t>((ms.count() % 1000) * 1000);
    return tv;
  }

  static RemoteError reply_error_kind(const redisReply* r) {
    const std::string s(r->str ? r->str : "", r->str ? static_cast<std::size_t>(r->len) : 0);
    if (s.starts_with("NOAUTH") || s.starts_with("WRONGPASS") || s.starts_with("ERR invalid password") ||
        s.starts_with("ERR AUTH") || s.starts_with("ERR Client sent AUTH"))
      return RemoteError::auth;
    return RemoteError::server;
  }

  void count_locked(RemoteError e) { ++stats_.errors[static_cast<std::size_t>(e)]; }

  void drop() {
    if (ctx_) redisFree(ctx_);
    ctx_ = nullptr;
  }

  void mark_down_locked(RemoteError kind, std::string what) {
    count_locked(kind);
    last_error_ = std::move(what);
    drop();
    down_until_ = std::chrono::steady_clock::now() + cfg_.retry_after;
  }

  // The connection broke or a reply timed out: classify, drop it, back off.
  void connection_failed_locked() {
    const bool timed_out = ctx_ && ctx_->err == REDIS_ERR_IO && (errno == EAGAIN || errno == EWOULDBLOCK);
    const std::string why = ctx_ && ctx_->errstr[0] ? ctx_->errstr : "connection lost";
    mark_down_locked(timed_out ? RemoteError::timeout : RemoteError::io,
                     timed_out ? "no reply within command_timeout" : "connection failed: " + why);
  }

  // Runs one setup command (AUTH/SELECT); false (server marked down) when refused.
  bool setup_command_locked(const char* what, redisReply* r) {
    if (!r) {
      connection_failed_locked();
      return false;
    }
    const bool ok = r->type == REDIS_REPLY_STATUS;
    const RemoteError kind = ok ? RemoteError::server : reply_error_kind(r);
    freeReplyObject(r);
    if (!ok) mark_down_locked(kind, std::string(what) + " refused by the server");
    return ok;
  }

  bool connected_locked() {
    if (ctx_) return true;
    if (std::chrono::steady_clock::now() < down_until_) {
      count_locked(RemoteError::skipped);
      return false;
    }
    const timeval ct = to_timeval(cfg_.connect_timeout);
    ctx_ = ep_.unix_socket ? redisConnectUnixWithTimeout(ep_.path.c_str(), ct)
                           : redisConnectWithTimeout(ep_.host.c_str(), ep_.port, ct);
    if (!ctx_ || ctx_->err) {
      mark_down_locked(RemoteError::connect, std::string("cannot connect: ") + (ctx_ ? ctx_->errstr : "out of memory"));
      return false;
    }
    if (redisSetTimeout(ctx_, to_timeval(cfg_.command_timeout)) != REDIS_OK) {
      mark_down_locked(RemoteError::connect, "cannot set the socket timeout");
      return false;
    }
    if (!cfg_.password_env.empty()) {
      const char* pw = std::getenv(cfg_.password_env.c_str());
      if (pw && *pw) {
        auto* r = static_cast<redisReply*>(redisCommand(ctx_, "AUTH %s", pw));
        if (!setup_command_locked("AUTH (password from the environment)", r)) return false;
      }
    }
    if (ep_.db != 0) {
      auto* r = static_cast<redisReply*>(redisCommand(ctx_, "SELECT %d", ep_.db));
      if (!setup_command_locked("SELECT", r)) return false;
    }
    ++stats_.reconnects;
    last_error_.clear();
    return true;
  }

  RemoteConfig cfg_;
  RemoteEndpoint ep_;
  mutable std::mutex mu_;
  redisContext* ctx_ = nullptr;
  std::chrono::steady_clock::time_point down_until_{};
  std::string last_error_;
  RemoteStats stats_;
  detail::LatencyRing latency_;
};

}  // namespace kvpack::offload
