// Same-process streaming-read bandwidth probe: the roofline every kvpack attention figure is
// compared against.
//
// What it measures: `threads` threads each read their own contiguous slice of one buffer (64-bit
// loads, summed so the reads cannot be elided); the figure is total bytes read / wall time of a
// pass, best of `passes` passes, in GB/s (1 GB = 1e9 bytes). The buffer is max(256 MiB,
// 4 x the last-level cache reported by /sys/devices/system/cpu/cpu0/cache), so the reads come
// from DRAM, not from a cache. Each thread writes its slice first (first touch), so pages live
// where the reading thread runs.
//
// Caching: read_bandwidth(threads) measures once per thread count and process, and returns the
// cached figure afterwards (thread-safe).
#pragma once

#include <algorithm>
#include <chrono>
#include <cstddef>
#include <cstdint>
#include <fstream>
#include <map>
#include <memory>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

namespace kvpack_bench {

/// Result of one probe.
struct BandwidthProbe {
  int threads = 0;                ///< reader threads
  std::size_t buffer_bytes = 0;   ///< total buffer size, bytes
  double gbps = 0;                ///< best pass, GB/s (1e9 bytes/s)
};

/// Size of the largest cache of cpu0 in bytes, from /sys/devices/system/cpu/cpu0/cache/index*/size
/// ("32768K", "1M"); 0 when sysfs does not say.
[[nodiscard]] inline std::size_t last_level_cache_bytes() {
  std::size_t best = 0;
  for (int i = 0; i < 16; ++i) {
    std::ifstream f("/sys/devices/system/cpu/cpu0/cache/index" + std::to_string(i) + "/size");
    if (!f) continue;
    std::string s;
    f >> s;
    if (s.empty()) continue;
    std::size_t mult = 1;
    const char unit = s.back();
    if (unit == 'K') mult = std::size_t{1} << 10;
    if (unit == 'M') mult = std::size_t{1} << 20;
    if (unit == 'G') mult = std::size_t{1} << 30;
    try {
      best = std::max(best, static_cast<std::size_t>(std::stoull(s)) * mult);
    } catch (...) {
    }
  }
  return best;
}

/// Buffer size the probe streams: max(256 MiB, 4 x last-level cache).
[[nodiscard]] inline std::size_t probe_buffer_bytes() {
  return std::max<std::size_t>(std::size_t{256} << 20, 4 * last_level_cache_bytes());
}

namespace probe_detail {
// Sum of n 64-bit words, four independent accumulators (integer adds vectorize at -O3).
[[nodiscard]] inline std::uint64_t read_words(const std::uint64_t* p, std::size_t n) {
  std::uint64_t a = 0, b = 0, c = 0, d = 0;
  std::size_t i = 0;
  for (; i + 4 <= n; i += 4) {
    a += p[i];
    b += p[i + 1];
    c += p[i + 2];
    d += p[i + 3];
  }
  for (; i < n; ++i) a += p[i];
  return a + b + c + d;
}
}  // namespace probe_detail

/// Measures the streaming-read bandwidth of `threads` threads over `bytes` bytes (best of `passes`).
[[nodiscard]] inline BandwidthProbe measure_read_bandwidth(int threads, std::size_t bytes, int passes = 5) {
  threads = std::max(threads, 1);
  const std::size_t words = bytes / sizeof(std::uint64_t);
  const std::size_t per = words / static_cast<std::size_t>(threads);
  std::unique_ptr<std::uint64_t[]> buf(new std::uint64_t[words]);  // uninitialized: first touch below
  auto run = [&](auto&& fn) {
    std::vector<std::thread> pool;
    for (int t = 0; t < threads; ++t) pool.emplace_back(fn, t);
    for (auto& th : pool) th.join();
  };
  run([&](int t) {
    std::uint64_t* p = buf.get() + static_cast<std::size_t>(t) * per;
    for (std::size_t i = 0; i < per; ++i) p[i] = i * 0x9E3779B97F4A7C15ull;
  });
  std::vector<std::uint64_t> sink(static_cast<std::size_t>(threads));
  double best = 0;
  for (int pass = 0; pass < passes; ++pass) {
    const auto t0 = std::chrono::steady_clock::now();
    run([&](int t) { sink[static_cast<std::size_t>(t)] = probe_detail::read_words(buf.get() + static_cast<std::size_t>(t) * per, per); });
    const double s = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
    best = std::max(best, static_cast<double>(per * static_cast<std::size_t>(threads) * sizeof(std::uint64_t)) / s / 1e9);
  }
  volatile std::uint64_t keep = 0;
  for (std::uint64_t s : sink) keep = keep + s;
  (void)keep;
  return {threads, per * static_cast<std::size_t>(threads) * sizeof(std::uint64_t), best};
}

/// The probe for `threads` threads, measured on first use and cached for the process.
[[nodiscard]] inline const BandwidthProbe& read_bandwidth(int threads) {
  static std::mutex mu;
  static std::map<int, BandwidthProbe> cache;
  std::lock_guard<std::mutex> lock(mu);
  auto it = cache.find(threads);
  if (it == cache.end()) it = cache.emplace(threads, measure_read_bandwidth(threads, probe_buffer_bytes())).first;
  return it->second;
}

}  // namespace kvpack_bench
