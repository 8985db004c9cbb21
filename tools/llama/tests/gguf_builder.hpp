// Test support: writes small GGUF images in memory (little-endian), so the reader can be tested
// on valid and deliberately broken files without any model on disk.
#pragma once

#include "gguf.hpp"

#include <bit>
#include <cstddef>
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <string>
#include <string_view>
#include <vector>

namespace kvpack::llama::test {

/// Appends GGUF primitives to a byte buffer.
class ByteWriter {
 public:
  void u8(uint8_t v) { buf_.push_back(static_cast<std::byte>(v)); }
  void u16(uint16_t v) { put(v, 2); }
  void u32(uint32_t v) { put(v, 4); }
  void u64(uint64_t v) { put(v, 8); }
  void f32(float v) { u32(std::bit_cast<uint32_t>(v)); }
  void f64(double v) { u64(std::bit_cast<uint64_t>(v)); }
  void str(std::string_view s) {
    u64(s.size());
    for (const char c : s) u8(static_cast<uint8_t>(c));
  }
  void raw(const std::vector<std::byte>& b) { buf_.insert(buf_.end(), b.begin(), b.end()); }
  void pad_to(size_t alignment) {
    while (buf_.size() % alignment != 0) u8(0);
  }
  [[nodiscard]] size_t size() const { return buf_.size(); }
  [[nodiscard]] std::vector<std::byte>& bytes() { return buf_; }

 private:
  void put(uint64_t v, int n) {
    for (int i = 0; i < n; ++i) u8(static_cast<uint8_t>(v >> (8 * i)));
  }
  std::vector<std::byte> buf_;
};

/// Builds a GGUF image: metadata entries are written verbatim by callbacks, tensors are laid out
/// contiguously at multiples of the alignment.
class GgufBuilder {
 public:
  struct Tensor {
    std::string name;
    std::vector<uint64_t> dims;
    uint32_t type;
    std::vector<std::byte> data;
  };

  explicit GgufBuilder(uint32_t version = 3) : version_(version) {}

  /// Adds a key whose value (type tag included) is written by `write_value`.
  template <class F>
  GgufBuilder& kv(std::string key, F write_value) {
    ByteWriter w;
    w.str(key);
    write_value(w);
    kvs_.push_back(std::move(w.bytes()));
    return *this;
  }
  GgufBuilder& kv_u32(std::string key, uint32_t v) {
    return kv(std::move(key), [v](ByteWriter& w) { w.u32(4); w.u32(v); });
  }
  GgufBuilder& kv_str(std::string key, std::string v) {
    return kv(std::move(key), [v](ByteWriter& w) { w.u32(8); w.str(v); });
  }
  GgufBuilder& tensor(std::string name, std::vector<uint64_t> dims, GgmlType type, std::vector<std::byte> data) {
    tensors_.push_back({std::move(name), std::move(dims), static_cast<uint32_t>(type), std::move(data)});
    return *this;
  }
  GgufBuilder& alignment(uint64_t a) {
    alignment_ = a;
    return kv_u32("general.alignment", static_cast<uint32_t>(a));
  }

  /// Offsets of the tensor infos' `offset` fields in the last build() (to corrupt them in tests).
  std::vector<size_t> offset_field_positions;

  [[nodiscard]] std::vector<std::byte> build() {
    ByteWriter w;
    for (const char c : std::string_view("GGUF")) w.u8(static_cast<uint8_t>(c));
    w.u32(version_);
    w.u64(tensors_.size());
    w.u64(kvs_.size());
    for (const auto& k : kvs_) w.raw(k);
    uint64_t off = 0;
    offset_field_positions.clear();
    std::vector<uint64_t> offsets;
    for (const auto& t : tensors_) {
      w.str(t.name);
      w.u32(static_cast<uint32_t>(t.dims.size()));
      for (const uint64_t d : t.dims) w.u64(d);
      w.u32(t.type);
      offset_field_positions.push_back(w.size());
      w.u64(off);
      offsets.push_back(off);
      off += (t.data.size() + alignment_ - 1) / alignment_ * alignment_;
    }
    w.pad_to(alignment_);
    const size_t data_start = w.size();
    for (size_t i = 0; i < tensors_.size(); ++i) {
      while (w.size() < data_start + offsets[i]) w.u8(0);
      w.raw(tensors_[i].data);
    }
    w.pad_to(alignment_);
    return std::move(w.bytes());
  }

 private:
  uint32_t version_;
  uint64_t alignment_ = 32;
  std::vector<std::vector<std::byte>> kvs_;
  std::vector<Tensor> tensors_;
};

/// `n` bytes with values 0, 1, 2, ... (mod 256).
inline std::vector<std::byte> iota_bytes(size_t n, uint8_t start = 0) {
  std::vector<std::byte> b(n);
  for (size_t i = 0; i < n; ++i) b[i] = static_cast<std::byte>(static_cast<uint8_t>(start + i));
  return b;
}

/// Path of the test model: $KVPACK_MODEL_PATH, else
/// $HOME/.cache/kvpack/models/SmolLM2-135M-Instruct.Q4_1.gguf.
inline std::string model_path() {
  if (const char* p = std::getenv("KVPACK_MODEL_PATH"); p != nullptr && *p != '\0') return p;
  const char* home = std::getenv("HOME");
  return std::string(home != nullptr ? home : "") + "/.cache/kvpack/models/SmolLM2-135M-Instruct.Q4_1.gguf";
}

}  // namespace kvpack::llama::test
