// GGUF reader (versions 2 and 3): header, metadata, tensor infos, memory-mapped tensor data.
//
// Follows the GGUF file format as specified in ggml's docs/gguf.md:
//   magic "GGUF" (4 bytes) | version u32 | tensor_count u64 | metadata_kv_count u64
//   | metadata_kv[metadata_kv_count] | tensor_info[tensor_count] | padding to `general.alignment`
//   | tensor data (each tensor at data_start + offset, offset a multiple of the alignment)
// All integers are little-endian. Strings are u64 length + bytes (no terminator). Arrays are
// element type u32 + count u64 + elements (arrays of arrays allowed).
//
// Every length, count, offset and size read from the file is bounds-checked against the file
// size before it is used; a malformed file yields a kvpack::Error naming what is wrong
// (Errc::corrupt_data for inconsistent content, Errc::io_error for open/stat/mmap failures,
// Errc::unsupported for versions and tensor types this reader does not know).
#pragma once

#include <kvpack/result.hpp>

#include <fcntl.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include <bit>
#include <cerrno>
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <limits>
#include <map>
#include <optional>
#include <span>
#include <string>
#include <string_view>
#include <type_traits>
#include <utility>
#include <variant>
#include <vector>

#include "gguf_io.hpp"
#include "gguf_types.hpp"
#include "gguf_values.hpp"

namespace kvpack::llama {

/// A parsed GGUF file (versions 2 and 3) with its tensor data memory-mapped.
/// Movable, not copyable; TensorInfo::data spans stay valid while the object lives.
class GgufFile {
 public:
  /// Largest accepted nesting of arrays in metadata (arrays of arrays of ...).
  static constexpr int kMaxArrayDepth = detail::kGgufMaxArrayDepth;
  /// ggml's GGML_MAX_DIMS: tensors have 1..4 dimensions.
  static constexpr uint32_t kMaxDims = 4;

  GgufFile(const GgufFile&) = delete;
  GgufFile& operator=(const GgufFile&) = delete;
  GgufFile(GgufFile&&) noexcept = default;
  GgufFile& operator=(GgufFile&&) noexcept = default;
  ~GgufFile() = default;

  /// Memory-maps and parses the file at `path`.
  /// Errors: Errc::io_error (open/stat/mmap), Errc::corrupt_data (bad magic, truncation, absurd
  /// counts or lengths, duplicate keys or tensor names, misaligned or out-of-file tensor data,
  /// dims overflow), Errc::unsupported (GGUF version other than 2/3, big-endian file, unknown
  /// metadata value type or tensor type). The message starts with the path.
  [[nodiscard]] static Result<GgufFile> open(const std::string& path) {
    auto map = detail::MappedFile::open(path);
    if (!map) return map.error();
    GgufFile f;
    f.map_ = std::move(map).value();
    f.bytes_ = f.map_.bytes();
    if (auto st = f.parse(); !st) return fail(st.error().code, path + ": " + st.error().message);
    return f;
  }

  /// Parses a GGUF image held in memory (takes ownership of the bytes). Same checks and errors
  /// as open(); used by tests and for files that are not on disk.
  [[nodiscard]] static Result<GgufFile> from_bytes(std::vector<std::byte> bytes) {
    GgufFile f;
    f.owned_ = std::move(bytes);
    f.bytes_ = std::span<const std::byte>(f.owned_);
    if (auto st = f.parse(); !st) return fail(st.error().code, "<memory>: " + st.error().message);
    return f;
  }

  /// GGUF format version of the file (2 or 3).
  [[nodiscard]] uint32_t version() const noexcept { return version_; }
  /// Alignment of tensor data in bytes (general.alignment, default 32).
  [[nodiscard]] uint64_t alignment() const noexcept { return alignment_; }
  /// Byte offset of the tensor data section from the start of the file.
  [[nodiscard]] uint64_t data_offset() const noexcept { return data_offset_; }
  /// Size of the whole file in bytes.
  [[nodiscard]] uint64_t file_size() const noexcept { return bytes_.size(); }

  /// The tensor called `name`, or nullptr if the file has none.
  [[nodiscard]] const TensorInfo* tensor(std::string_view name) const {
    const auto it = tensor_index_.find(name);
    return it == tensor_index_.end() ? nullptr : &tensors_[it->second];
  }
  /// All tensors in file order.
  [[nodiscard]] std::span<const TensorInfo> tensors() const noexcept { return tensors_; }

  /// All metadata key/value pairs in file order.
  [[nodiscard]] std::span<const GgufKv> metadata() const noexcept { return kvs_; }
  /// The metadata value under `key`, or nullptr.
  [[nodiscard]] const GgufValue* get(std::string_view key) const {
    const auto it = kv_index_.find(key);
    return it == kv_index_.end() ? nullptr : &kvs_[it->second].value;
  }

  /// Integer scalar of any integer type; nullopt if absent, another type, or a uint64 > INT64_MAX.
  [[nodiscard]] std::optional<int64_t> get_int(std::string_view key) const {
    const GgufValue* v = get(key);
    return v ? v->as_int() : std::nullopt;
  }
  /// float32/float64 scalar; nullopt if absent or another type.
  [[nodiscard]] std::optional<double> get_float(std::string_view key) const {
    const GgufValue* v = get(key);
    if (v == nullptr) return std::nullopt;
    if (const auto* d = std::get_if<double>(&v->value)) return *d;
    return std::nullopt;
  }
  /// bool scalar; nullopt if absent or another type.
  [[nodiscard]] std::optional<bool> get_bool(std::string_view key) const {
    const GgufValue* v = get(key);
    if (v == nullptr) return std::nullopt;
    if (const auto* b = std::get_if<bool>(&v->value)) return *b;
    return std::nullopt;
  }
  /// string scalar (raw bytes, normally UTF-8); nullopt if absent or another type.
  [[nodiscard]] std::optional<std::string> get_string(std::string_view key) const {
    const GgufValue* v = get(key);
    if (v == nullptr) return std::nullopt;
    if (const auto* s = std::get_if<std::string>(&v->value)) return *s;
    return std::nullopt;
  }
  /// Array of strings; nullopt if absent or not an array of strings.
  [[nodiscard]] std::optional<std::vector<std::string>> get_string_array(std::string_view key) const {
    const auto* items = array_of(key, [](GgufValueType t) { return t == GgufValueType::string; });
    if (items == nullptr) return std::nullopt;
    std::vector<std::string> out;
    out.reserve(items->size());
    for (const auto& it : *items) out.push_back(std::get<std::string>(it.value));
    return out;
  }
  /// Array of any integer type (all values must fit int64); nullopt if absent or another type.
  [[nodiscard]] std::optional<std::vector<int64_t>> get_int_array(std::string_view key) const {
    const auto* items = array_of(key, GgufValue::is_integer);
    if (items == nullptr) return std::nullopt;
    std::vector<int64_t> out;
    out.reserve(items->size());
    for (const auto& it : *items) {
      const auto i = it.as_int();
      if (!i) return std::nullopt;
      out.push_back(*i);
    }
    return out;
  }
  /// Array of float32/float64; nullopt if absent or another type.
  [[nodiscard]] std::optional<std::vector<double>> get_float_array(std::string_view key) const {
    const auto* items = array_of(key, [](GgufValueType t) {
      return t == GgufValueType::float32 || t == GgufValueType::float64;
    });
    if (items == nullptr) return std::nullopt;
    std::vector<double> out;
    out.reserve(items->size());
    for (const auto& it : *items) out.push_back(std::get<double>(it.value));
    return out;
  }

 private:
  GgufFile() = default;

  template <class Pred>
  [[nodiscard]] const std::vector<GgufValue>* array_of(std::string_view key, Pred elem_ok) const {
    const GgufValue* v = get(key);
    if (v == nullptr || v->type != GgufValueType::array || !elem_ok(v->elem_type)) return nullptr;
    return std::get_if<std::vector<GgufValue>>(&v->value);
  }

  static std::string at(const detail::Cursor& c) { return " at offset " + std::to_string(c.pos()); }

  Status parse() {
    detail::Cursor c(bytes_);
    const auto magic = c.read_bytes(4);
    if (!magic || std::memcmp(magic->data(), "GGUF", 4) != 0) {
      return fail(Errc::corrupt_data, "not a GGUF file (magic is not \"GGUF\")");
    }
    const auto version = c.read_uint<uint32_t>();
    if (!version) return fail(Errc::corrupt_data, "file ends inside the GGUF version");
    if (*version == 1) return fail(Errc::unsupported, "GGUF version 1 is not supported (only 2 and 3)");
    if (*version == 0x02000000u || *version == 0x03000000u) {
      return fail(Errc::unsupported, "big-endian GGUF files are not supported");
    }
    if (*version != 2 && *version != 3) {
      return fail(Errc::unsupported, "GGUF version " + std::to_string(*version) + " is not supported (only 2 and 3)");
    }
    version_ = *version;
    const auto n_tensors = c.read_uint<uint64_t>();
    const auto n_kv = c.read_uint<uint64_t>();
    if (!n_tensors || !n_kv) return fail(Errc::corrupt_data, "file ends inside the GGUF header");
    // A tensor info takes at least 24 bytes (name length, n_dims, type, offset), a key/value at
    // least 13 (key length, type, one byte of value): reject counts the file cannot hold.
    if (*n_tensors > c.remaining() / 24) {
      return fail(Errc::corrupt_data, "tensor count " + std::to_string(*n_tensors) + " cannot fit in a " +
                                          std::to_string(bytes_.size()) + "-byte file");
    }
    if (*n_kv > c.remaining() / 13) {
      return fail(Errc::corrupt_data, "metadata key/value count " + std::to_string(*n_kv) + " cannot fit in a " +
                                          std::to_string(bytes_.size()) + "-byte file");
    }

    kvs_.reserve(static_cast<size_t>(*n_kv));
    for (uint64_t i = 0; i < *n_kv; ++i) {
      GgufKv kv;
      if (auto st = detail::read_string(c, kv.key, "metadata key #" + std::to_string(i)); !st) return st;
      const std::string what = "metadata '" + kv.key + "'";
      if (kv_index_.count(kv.key) != 0) return fail(Errc::corrupt_data, "duplicate " + what + at(c));
      const auto t = c.read_uint<uint32_t>();
      if (!t) return fail(Errc::corrupt_data, "file ends inside the type of " + what);
      if (*t > static_cast<uint32_t>(GgufValueType::float64)) {
        return fail(Errc::unsupported, what + " has unknown value type " + std::to_string(*t) + at(c));
      }
      if (auto st = detail::read_value(c, static_cast<GgufValueType>(*t), kv.value, 0, what); !st) return st;
      kv_index_.emplace(kv.key, kvs_.size());
      kvs_.push_back(std::move(kv));
    }

    if (const GgufValue* a = get("general.alignment")) {
      const auto v = a->as_int();
      if (!v || *v <= 0 || (*v & (*v - 1)) != 0 || *v > (int64_t{1} << 30)) {
        return fail(Errc::corrupt_data, "general.alignment must be a power-of-two integer in [1, 2^30]");
      }
      alignment_ = static_cast<uint64_t>(*v);
    }

    tensors_.reserve(static_cast<size_t>(*n_tensors));
    std::vector<uint64_t> sizes;  // data bytes of each tensor
    sizes.reserve(static_cast<size_t>(*n_tensors));
    for (uint64_t i = 0; i < *n_tensors; ++i) {
      TensorInfo ti;
      if (auto st = detail::read_string(c, ti.name, "name of tensor #" + std::to_string(i)); !st) return st;
      const std::string what = "tensor '" + ti.name + "'";
      if (tensor_index_.count(ti.name) != 0) return fail(Errc::corrupt_data, "duplicate " + what);
      const auto n_dims = c.read_uint<uint32_t>();
      if (!n_dims) return fail(Errc::corrupt_data, "file ends inside " + what);
      if (*n_dims < 1 || *n_dims > kMaxDims) {
        return fail(Errc::corrupt_data, what + " has " + std::to_string(*n_dims) + " dimensions (must be 1.." +
                                            std::to_string(kMaxDims) + ")");
      }
      int64_t elements = 1;
      for (uint32_t d = 0; d < *n_dims; ++d) {
        const auto ne = c.read_uint<uint64_t>();
        if (!ne) return fail(Errc::corrupt_data, "file ends inside the dims of " + what);
        if (*ne > static_cast<uint64_t>(std::numeric_limits<int64_t>::max())) {
          return fail(Errc::corrupt_data, what + " dim " + std::to_string(d) + " = " + std::to_string(*ne) + " is too large");
        }
        const auto ne_s = static_cast<int64_t>(*ne);
        if (ne_s != 0 && elements > std::numeric_limits<int64_t>::max() / ne_s) {
          return fail(Errc::corrupt_data, what + ": the product of its dims overflows int64");
        }
        elements *= ne_s;
        ti.dims.push_back(ne_s);
      }
      const auto type = c.read_uint<uint32_t>();
      const auto offset = c.read_uint<uint64_t>();
      if (!type || !offset) return fail(Errc::corrupt_data, "file ends inside " + what);
      ti.type = static_cast<GgmlType>(*type);
      const auto traits = ggml_type_traits(ti.type);
      if (!traits) return fail(Errc::unsupported, what + " has unknown ggml type " + std::to_string(*type));
      if (ti.dims[0] % traits->block_size != 0) {
        return fail(Errc::corrupt_data, what + ": row length " + std::to_string(ti.dims[0]) +
                                            " is not a multiple of the " + traits->name + " block size " +
                                            std::to_string(traits->block_size));
      }
      const auto row = ggml_row_bytes(ti.type, ti.dims[0]);
      const int64_t rows = ti.dims[0] == 0 ? 0 : elements / ti.dims[0];
      if (!row || (*row != 0 && rows > std::numeric_limits<int64_t>::max() / *row)) {
        return fail(Errc::corrupt_data, what + ": its byte size overflows int64");
      }
      ti.offset = *offset;
      sizes.push_back(static_cast<uint64_t>(rows * *row));
      tensor_index_.emplace(ti.name, tensors_.size());
      tensors_.push_back(std::move(ti));
    }

    // The data section starts at the next multiple of the alignment after the tensor infos.
    const uint64_t end_of_infos = c.pos();
    data_offset_ = (end_of_infos + alignment_ - 1) / alignment_ * alignment_;
    const uint64_t file_size = bytes_.size();
    for (size_t i = 0; i < tensors_.size(); ++i) {
      TensorInfo& ti = tensors_[i];
      const uint64_t size = sizes[i];
      if (ti.offset % alignment_ != 0) {
        return fail(Errc::corrupt_data, "tensor '" + ti.name + "' offset " + std::to_string(ti.offset) +
                                            " is not a multiple of the alignment " + std::to_string(alignment_));
      }
      if (data_offset_ > file_size || ti.offset > file_size - data_offset_ ||
          size > file_size - data_offset_ - ti.offset) {
        return fail(Errc::corrupt_data, "tensor '" + ti.name + "' data (offset " + std::to_string(ti.offset) +
                                            ", " + std::to_string(size) + " bytes after the data section at " +
                                            std::to_string(data_offset_) + ") lies beyond the end of the " +
                                            std::to_string(file_size) + "-byte file");
      }
      ti.data = bytes_.subspan(static_cast<size_t>(data_offset_ + ti.offset), static_cast<size_t>(size));
    }
    return {};
  }

  detail::MappedFile map_;
  std::vector<std::byte> owned_;
  std::span<const std::byte> bytes_;
  uint32_t version_ = 0;
  uint64_t alignment_ = 32;
  uint64_t data_offset_ = 0;
  std::vector<GgufKv> kvs_;
  std::map<std::string, size_t, std::less<>> kv_index_;
  std::vector<TensorInfo> tensors_;
  std::map<std::string, size_t, std::less<>> tensor_index_;
};

}  // namespace kvpack::llama

