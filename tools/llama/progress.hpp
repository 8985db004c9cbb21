// Progress bar with ETA for the long-running tools (kvpack-eval, kvpack-snapkv-diag).
#pragma once

#include <algorithm>
#include <chrono>
#include <cstdint>
#include <cstdio>
#include <mutex>
#include <string>

#include <unistd.h>

namespace kvpack::llama {

/// Progress bar with ETA on stderr, in work units (tokens). Drawn only when stderr is a terminal
/// (redrawn in place at most 5 times a second) or when `requested` (--progress): then, if stderr
/// is not a terminal, one line per 10 % so logs stay short. Otherwise it prints nothing, so a
/// redirected run's stderr holds only notes and errors. Thread-safe.
class Progress {
 public:
  using Clock = std::chrono::steady_clock;
  explicit Progress(int64_t total, bool requested = false)
      : total_(std::max<int64_t>(total, 1)), tty_(isatty(2) != 0), on_(tty_ || requested), start_(Clock::now()) {}
  void label(std::string l) {
    std::lock_guard lock(mu_);
    label_ = std::move(l);
  }
  /// Counts `units` more done; `label` replaces the current label when given.
  void advance(int64_t units, const std::string* label = nullptr) {
    std::lock_guard lock(mu_);
    if (label) label_ = *label;
    done_ += units;
    if (!on_) return;
    const double t = std::chrono::duration<double>(Clock::now() - start_).count();
    const double frac = std::min(1.0, double(done_) / double(total_));
    const int decile = static_cast<int>(frac * 10);
    if (tty_ ? t - last_ < 0.2 && done_ < total_ : decile == last_decile_) return;
    last_ = t;
    last_decile_ = decile;
    const double eta = frac > 0 ? t * (1 - frac) / frac : 0;
    constexpr int width = 30;
    const int fill = static_cast<int>(frac * width);
    std::fprintf(stderr, "%s[%s%s] %3.0f%%  %s elapsed, ETA %s  %-28s%s", tty_ ? "\r" : "",
                 std::string(size_t(fill), '#').c_str(), std::string(size_t(width - fill), '.').c_str(), frac * 100,
                 fmt_time(t).c_str(), fmt_time(eta).c_str(), label_.c_str(), tty_ ? "" : "\n");
    std::fflush(stderr);
  }
  /// Ends the bar's line (terminal only).
  void finish() {
    if (on_ && tty_) std::fprintf(stderr, "\n");
  }
  /// "MmSSs", e.g. "3m07s".
  static std::string fmt_time(double s) {
    char b[32];
    std::snprintf(b, sizeof b, "%dm%02ds", static_cast<int>(s) / 60, static_cast<int>(s) % 60);
    return b;
  }

 private:
  int64_t total_, done_ = 0;
  bool tty_, on_;
  Clock::time_point start_;
  double last_ = -1;
  int last_decile_ = -1;
  std::string label_;
  std::mutex mu_;
};

}  // namespace kvpack::llama
