// Shared helpers of the offload tests: the CASES C11 block layout, random payloads, a
// private temporary directory.
#pragma once

#include <sys/stat.h>
#include <unistd.h>

#include <cstddef>
#include <cstdint>
#include <cstdlib>
#include <filesystem>
#include <random>
#include <string>
#include <vector>

#include "kvpack/offload/block_header.hpp"

namespace kvpack::offload::testing {

// CASES C11: an INT4 block of 64 tokens, head_dim 128, groups of 32 values with an fp16 scale
// and an fp16 zero-point per group, for one (layer, kv_head); the case's 8 KV heads are 8 such
// blocks. Payload of one block:
//   K codes   64 tokens * 128 values * 4 bits / 8      = 4096 bytes
//   K meta    64 * 128 / 32 groups * (2 + 2) bytes     = 1024 bytes
//   V codes   (same as K)                              = 4096 bytes
//   V meta                                             = 1024 bytes
//                                                        10240 bytes
// (no positions: a cache without eviction keeps them per layer, KVCache::slot_positions;
// before issue 20 the payload ended with 64 int32 positions, 10496 bytes).
inline constexpr int kC11Tokens = 64;
inline constexpr int kC11HeadDim = 128;
inline constexpr int kC11Group = 32;
inline constexpr int kC11Bits = 4;
inline constexpr int kC11KvHeads = 8;
inline constexpr std::size_t kC11CodeBytes = kC11Tokens * kC11HeadDim * kC11Bits / 8;
inline constexpr std::size_t kC11MetaBytes = kC11Tokens * kC11HeadDim / kC11Group * (2 + 2);
inline constexpr std::size_t kC11PayloadBytes = 2 * (kC11CodeBytes + kC11MetaBytes);
static_assert(kC11PayloadBytes == 10240);
/// Codec format id of INT4 asymmetric fp16-metadata keys and values:
/// codec_format_id<Int4<>, Int4<>>() (test_offload_codec.cpp checks the two agree).
inline constexpr uint32_t kC11CodecFormat = 0x0452'0452;

/// The C11 layout.
[[nodiscard]] inline RecordLayout c11_layout() {
  RecordLayout l;
  l.codec_format = kC11CodecFormat;
  l.k_bits = l.v_bits = kC11Bits;
  l.k_group = l.v_group = kC11Group;
  l.head_dim = kC11HeadDim;
  l.block_tokens = kC11Tokens;
  l.max_payload_bytes = static_cast<uint32_t>(kC11PayloadBytes);
  return l;
}

/// `n` pseudo-random bytes from `seed` (stand-in for an encoded block until the codecs land).
[[nodiscard]] inline std::vector<std::byte> random_payload(std::size_t n, uint64_t seed) {
  std::mt19937_64 rng(seed);
  std::vector<std::byte> v(n);
  for (auto& b : v) b = static_cast<std::byte>(rng() & 0xFF);
  return v;
}

/// A fresh private directory under $TMPDIR (or /tmp), removed with everything in it at scope end.
class TempDir {
 public:
  TempDir() {
    const char* t = std::getenv("TMPDIR");
    std::string tmpl = std::string((t && *t) ? t : "/tmp") + "/kvpack-offload-test-XXXXXX";
    std::vector<char> buf(tmpl.begin(), tmpl.end());
    buf.push_back('\0');
    if (!::mkdtemp(buf.data())) std::abort();
    path_ = buf.data();
  }
  ~TempDir() {
    std::error_code ec;
    std::filesystem::remove_all(path_, ec);
  }
  TempDir(const TempDir&) = delete;
  TempDir& operator=(const TempDir&) = delete;
  [[nodiscard]] const std::string& path() const { return path_; }
  /// Number of directory entries (files the code under test left behind).
  [[nodiscard]] std::size_t entries() const {
    std::size_t n = 0;
    for ([[maybe_unused]] const auto& e : std::filesystem::directory_iterator(path_)) ++n;
    return n;
  }

 private:
  std::string path_;
};

}  // namespace kvpack::offload::testing
