// A real redis-server started by a test on a unix socket in a fresh temporary folder (or on a
// free loopback TCP port), stopped and its folder removed at the end. No persistence (save ""),
// so a restart loses every key, as a crashed cache server does. Used by the `remote` tests,
// the load driver and the two-process example; loopback and unix sockets only.
#pragma once

#include <hiredis/hiredis.h>
#include <netinet/in.h>
#include <signal.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <unistd.h>

#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <optional>
#include <string>
#include <thread>
#include <vector>

namespace kvpack_remote_test {

/// How to start the server.
struct RedisServerOptions {
  bool tcp = false;                     ///< true: free 127.0.0.1 port; false: unix socket
  std::string password;                 ///< non-empty: --requirepass
  std::vector<std::string> extra_args;  ///< more "--name value" arguments (maxmemory, ...)
};

/// The redis-server binary: $KVPACK_REDIS_SERVER, else redis-server on PATH.
inline std::string redis_server_binary() {
  if (const char* p = std::getenv("KVPACK_REDIS_SERVER"); p && *p) return p;
  return "redis-server";
}

/// One redis-server child process. Move-only; the destructor stops it (SIGTERM, bounded wait,
/// then SIGKILL) and removes its folder.
class RedisServerProcess {
 public:
  /// Starts the server and waits (at most 10 s) until it answers PING. nullopt, with the reason
  /// in `why`, when it cannot start (binary missing, port taken).
  static std::optional<RedisServerProcess> start(RedisServerOptions o, std::string* why = nullptr) {
    RedisServerProcess s;
    s.opt_ = std::move(o);
    char tmpl[] = "/tmp/kvpack-redis-XXXXXX";
    if (!::mkdtemp(tmpl)) {
      if (why) *why = "mkdtemp failed";
      return std::nullopt;
    }
    s.dir_ = tmpl;
    if (s.opt_.tcp) s.port_ = free_port();
    if (!s.launch(why)) return std::nullopt;
    return s;
  }

  RedisServerProcess(RedisServerProcess&& o) noexcept { *this = std::move(o); }
  RedisServerProcess& operator=(RedisServerProcess&& o) noexcept {
    std::swap(opt_, o.opt_);
    std::swap(dir_, o.dir_);
    std::swap(pid_, o.pid_);
    std::swap(port_, o.port_);
    return *this;
  }
  ~RedisServerProcess() {
    stop();
    if (!dir_.empty()) {
      std::error_code ec;
      std::filesystem::remove_all(dir_, ec);
    }
  }

  /// URL for RemoteConfig::url.
  [[nodiscard]] std::string url() const {
    return opt_.tcp ? "redis://127.0.0.1:" + std::to_string(port_) + "/0" : "unix://" + socket_path();
  }
  [[nodiscard]] std::string socket_path() const { return dir_ + "/redis.sock"; }
  [[nodiscard]] pid_t pid() const noexcept { return pid_; }

  /// SIGKILL, as a crash: no shutdown, every key lost.
  void kill9() { signal_and_reap(SIGKILL); }
  /// Stops (SIGTERM, up to 5 s, then SIGKILL). Idempotent.
  void stop() {
    if (pid_ <= 0) return;
    ::kill(pid_, SIGCONT);
    ::kill(pid_, SIGTERM);
    for (int i = 0; i < 100; ++i) {
      int st = 0;
      if (::waitpid(pid_, &st, WNOHANG) == pid_) {
        pid_ = -1;
        return;
      }
      std::this_thread::sleep_for(std::chrono::milliseconds(50));
    }
    signal_and_reap(SIGKILL);
  }
  /// Kills and starts it again on the same socket/port (an empty server). false when it fails.
  bool restart(std::string* why = nullptr) {
    kill9();
    return launch(why);
  }
  /// SIGSTOP / SIGCONT: a server that stops answering (slow beyond every timeout) and comes back.
  void pause() { ::kill(pid_, SIGSTOP); }
  void resume() { ::kill(pid_, SIGCONT); }

  /// An admin connection (AUTH'ed when a password is set); null when unreachable. Caller frees.
  [[nodiscard]] redisContext* connect() const {
    timeval tv{2, 0};
    redisContext* c = opt_.tcp ? redisConnectWithTimeout("127.0.0.1", port_, tv)
                               : redisConnectUnixWithTimeout(socket_path().c_str(), tv);
    if (!c || c->err) {
      if (c) redisFree(c);
      return nullptr;
    }
    redisSetTimeout(c, tv);
    if (!opt_.password.empty()) {
      auto* r = static_cast<redisReply*>(redisCommand(c, "AUTH %s", opt_.password.c_str()));
      const bool ok = r && r->type == REDIS_REPLY_STATUS;
      if (r) freeReplyObject(r);
      if (!ok) {
        redisFree(c);
        return nullptr;
      }
    }
    return c;
  }

 private:
  RedisServerProcess() = default;

  static int free_port() {
    const int fd = ::socket(AF_INET, SOCK_STREAM, 0);
    sockaddr_in a{};
    a.sin_family = AF_INET;
    a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    a.sin_port = 0;
    socklen_t len = sizeof a;
    int port = 0;
    if (fd >= 0 && ::bind(fd, reinterpret_cast<sockaddr*>(&a), sizeof a) == 0 &&
        ::getsockname(fd, reinterpret_cast<sockaddr*>(&a), &len) == 0)
      port = ntohs(a.sin_port);
    if (fd >= 0) ::close(fd);
    return port;
  }

  void signal_and_reap(int sig) {
    if (pid_ <= 0) return;
    ::kill(pid_, SIGCONT);
    ::kill(pid_, sig);
    int st = 0;
    ::waitpid(pid_, &st, 0);
    pid_ = -1;
  }

  bool launch(std::string* why) {
    std::vector<std::string> args = {redis_server_binary(), "--save", "", "--appendonly", "no", "--dir", dir_,
                                     "--logfile", dir_ + "/redis.log", "--daemonize", "no", "--protected-mode", "yes"};
    if (opt_.tcp) {
      args.insert(args.end(), {"--port", std::to_string(port_), "--bind", "127.0.0.1"});
    } else {
      args.insert(args.end(), {"--port", "0", "--unixsocket", socket_path(), "--unixsocketperm", "700"});
    }
    if (!opt_.password.empty()) args.insert(args.end(), {"--requirepass", opt_.password});
    args.insert(args.end(), opt_.extra_args.begin(), opt_.extra_args.end());
    const pid_t pid = ::fork();
    if (pid < 0) {
      if (why) *why = "fork failed";
      return false;
    }
    if (pid == 0) {
      std::vector<char*> argv;
      for (auto& a : args) argv.push_back(a.data());
      argv.push_back(nullptr);
      ::execvp(argv[0], argv.data());
      std::_Exit(127);
    }
    pid_ = pid;
    for (int i = 0; i < 200; ++i) {  // bounded: 10 s
      int st = 0;
      if (::waitpid(pid_, &st, WNOHANG) == pid_) {
        pid_ = -1;
        if (why) *why = redis_server_binary() + " exited at start (not installed? see " + dir_ + "/redis.log)";
        return false;
      }
      if (redisContext* c = connect()) {
        auto* r = static_cast<redisReply*>(redisCommand(c, "PING"));
        const bool ok = r && r->type == REDIS_REPLY_STATUS;
        if (r) freeReplyObject(r);
        redisFree(c);
        if (ok) return true;
      }
      std::this_thread::sleep_for(std::chrono::milliseconds(50));
    }
    if (why) *why = "redis-server did not answer PING within 10 s";
    signal_and_reap(SIGKILL);
    return false;
  }

  RedisServerOptions opt_;
  std::string dir_;
  pid_t pid_ = -1;
  int port_ = 0;
};

}  // namespace kvpack_remote_test
