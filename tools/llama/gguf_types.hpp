// GGUF/ggml data types for the reader in gguf.hpp: tensor element types with their block
// layout (ggml's ggml_type_traits), tensor infos, and metadata values. Spec: ggml docs/gguf.md.
#pragma once

#include <cstddef>
#include <cstdint>
#include <limits>
#include <map>
#include <optional>
#include <span>
#include <string>
#include <string_view>
#include <variant>
#include <vector>

namespace kvpack::llama {

/// ggml tensor element types as numbered in GGUF files (ggml's `enum ggml_type`).
/// Gaps are types ggml removed (Q4_2, Q4_3, the Q4_0_x_y/IQ4_NL_x_y repacked layouts).
enum class GgmlType : uint32_t {
  F32 = 0,
  F16 = 1,
  Q4_0 = 2,
  Q4_1 = 3,
  Q5_0 = 6,
  Q5_1 = 7,
  Q8_0 = 8,
  Q8_1 = 9,
  Q2_K = 10,
  Q3_K = 11,
  Q4_K = 12,
  Q5_K = 13,
  Q6_K = 14,
  Q8_K = 15,
  IQ2_XXS = 16,
  IQ2_XS = 17,
  IQ3_XXS = 18,
  IQ1_S = 19,
  IQ4_NL = 20,
  IQ3_S = 21,
  IQ2_S = 22,
  IQ4_XS = 23,
  I8 = 24,
  I16 = 25,
  I32 = 26,
  I64 = 27,
  F64 = 28,
  IQ1_M = 29,
  BF16 = 30,
  TQ1_0 = 34,
  TQ2_0 = 35,
  MXFP4 = 39,
};

/// Storage layout of one ggml type: `block_size` values are stored in `type_size` bytes.
/// A row of n values (n a multiple of block_size) takes n / block_size * type_size bytes.
struct GgmlTypeTraits {
  const char* name;    ///< ggml's name, e.g. "Q4_1"
  int64_t block_size;  ///< values per block (1 for plain float/int types, 32 or 256 for quants)
  int64_t type_size;   ///< bytes per block
};

/// Layout of `type`, or std::nullopt for a number that is not a known ggml type.
[[nodiscard]] constexpr std::optional<GgmlTypeTraits> ggml_type_traits(GgmlType type) noexcept {
  switch (type) {
    case GgmlType::F32: return GgmlTypeTraits{"F32", 1, 4};
    case GgmlType::F16: return GgmlTypeTraits{"F16", 1, 2};
    case GgmlType::Q4_0: return GgmlTypeTraits{"Q4_0", 32, 18};    // fp16 d + 16 B nibbles
    case GgmlType::Q4_1: return GgmlTypeTraits{"Q4_1", 32, 20};    // fp16 d, m + 16 B nibbles
    case GgmlType::Q5_0: return GgmlTypeTraits{"Q5_0", 32, 22};    // fp16 d + 4 B high bits + 16 B
    case GgmlType::Q5_1: return GgmlTypeTraits{"Q5_1", 32, 24};    // fp16 d, m + 4 B + 16 B
    case GgmlType::Q8_0: return GgmlTypeTraits{"Q8_0", 32, 34};    // fp16 d + 32 int8
    case GgmlType::Q8_1: return GgmlTypeTraits{"Q8_1", 32, 36};    // fp16 d, s + 32 int8
    case GgmlType::Q2_K: return GgmlTypeTraits{"Q2_K", 256, 84};
    case GgmlType::Q3_K: return GgmlTypeTraits{"Q3_K", 256, 110};
    case GgmlType::Q4_K: return GgmlTypeTraits{"Q4_K", 256, 144};
    case GgmlType::Q5_K: return GgmlTypeTraits{"Q5_K", 256, 176};
    case GgmlType::Q6_K: return GgmlTypeTraits{"Q6_K", 256, 210};
    case GgmlType::Q8_K: return GgmlTypeTraits{"Q8_K", 256, 292};  // f32 d + 256 int8 + 16 int16
    case GgmlType::IQ2_XXS: return GgmlTypeTraits{"IQ2_XXS", 256, 66};
    case GgmlType::IQ2_XS: return GgmlTypeTraits{"IQ2_XS", 256, 74};
    case GgmlType::IQ3_XXS: return GgmlTypeTraits{"IQ3_XXS", 256, 98};
    case GgmlType::IQ1_S: return GgmlTypeTraits{"IQ1_S", 256, 50};
    case GgmlType::IQ4_NL: return GgmlTypeTraits{"IQ4_NL", 32, 18};
    case GgmlType::IQ3_S: return GgmlTypeTraits{"IQ3_S", 256, 110};
    case GgmlType::IQ2_S: return GgmlTypeTraits{"IQ2_S", 256, 82};
    case GgmlType::IQ4_XS: return GgmlTypeTraits{"IQ4_XS", 256, 136};
    case GgmlType::I8: return GgmlTypeTraits{"I8", 1, 1};
    case GgmlType::I16: return GgmlTypeTraits{"I16", 1, 2};
    case GgmlType::I32: return GgmlTypeTraits{"I32", 1, 4};
    case GgmlType::I64: return GgmlTypeTraits{"I64", 1, 8};
    case GgmlType::F64: return GgmlTypeTraits{"F64", 1, 8};
    case GgmlType::IQ1_M: return GgmlTypeTraits{"IQ1_M", 256, 56};
    case GgmlType::BF16: return GgmlTypeTraits{"BF16", 1, 2};
    case GgmlType::TQ1_0: return GgmlTypeTraits{"TQ1_0", 256, 54};
    case GgmlType::TQ2_0: return GgmlTypeTraits{"TQ2_0", 256, 66};
    case GgmlType::MXFP4: return GgmlTypeTraits{"MXFP4", 32, 17};
  }
  return std::nullopt;
}

/// ggml's name of `type` ("Q4_1"), or "unknown" for a number that is not a known type.
[[nodiscard]] constexpr const char* to_string(GgmlType type) noexcept {
  const auto t = ggml_type_traits(type);
  return t ? t->name : "unknown";
}

/// Bytes taken by `n` consecutive values of `type`, or std::nullopt when the type is unknown,
/// n is negative or not a multiple of the block size, or the size overflows int64.
[[nodiscard]] constexpr std::optional<int64_t> ggml_row_bytes(GgmlType type, int64_t n) noexcept {
  const auto t = ggml_type_traits(type);
  if (!t || n < 0 || n % t->block_size != 0) return std::nullopt;
  const int64_t blocks = n / t->block_size;
  if (blocks > std::numeric_limits<int64_t>::max() / t->type_size) return std::nullopt;
  return blocks * t->type_size;
}

/// One tensor of a GGUF file. `data` views the memory-mapped file and stays valid as long as
/// the GgufFile that produced it lives (moving the GgufFile keeps it valid).
struct TensorInfo {
  std::string name;           ///< e.g. "blk.0.attn_q.weight"
  std::vector<int64_t> dims;  ///< 1..4 extents; dims[0] is the fastest-varying (ggml ne[0])
  GgmlType type = GgmlType::F32;
  uint64_t offset = 0;               ///< byte offset of the data from the start of the data section
  std::span<const std::byte> data;   ///< exactly ggml_row_bytes(type, elements()) bytes

  /// Number of values: the product of dims (checked against overflow when the file was read).
  [[nodiscard]] int64_t elements() const noexcept {
    int64_t n = 1;
    for (const int64_t d : dims) n *= d;
    return n;
  }
};

/// Type tags of GGUF metadata values (gguf_metadata_value_type).
enum class GgufValueType : uint32_t {
  uint8 = 0,
  int8 = 1,
  uint16 = 2,
  int16 = 3,
  uint32 = 4,
  int32 = 5,
  float32 = 6,
  boolean = 7,
  string = 8,
  array = 9,
  uint64 = 10,
  int64 = 11,
  float64 = 12,
};

/// Name of a metadata value type ("uint32", "array", ...).
[[nodiscard]] constexpr const char* to_string(GgufValueType t) noexcept {
  switch (t) {
    case GgufValueType::uint8: return "uint8";
    case GgufValueType::int8: return "int8";
    case GgufValueType::uint16: return "uint16";
    case GgufValueType::int16: return "int16";
    case GgufValueType::uint32: return "uint32";
    case GgufValueType::int32: return "int32";
    case GgufValueType::float32: return "float32";
    case GgufValueType::boolean: return "bool";
    case GgufValueType::string: return "string";
    case GgufValueType::array: return "array";
    case GgufValueType::uint64: return "uint64";
    case GgufValueType::int64: return "int64";
    case GgufValueType::float64: return "float64";
  }
  return "unknown";
}

/// One metadata value. Scalars keep their value widened: signed integers as int64_t, unsigned
/// as uint64_t, float32/float64 as double. Arrays keep their element type and the elements
/// (which may themselves be arrays).
struct GgufValue {
  GgufValueType type = GgufValueType::uint8;
  GgufValueType elem_type = GgufValueType::uint8;  ///< meaningful only when type == array
  std::variant<uint64_t, int64_t, double, bool, std::string, std::vector<GgufValue>> value;

  /// True for the eight integer types.
  [[nodiscard]] static constexpr bool is_integer(GgufValueType t) noexcept {
    switch (t) {
      case GgufValueType::uint8: case GgufValueType::int8: case GgufValueType::uint16:
      case GgufValueType::int16: case GgufValueType::uint32: case GgufValueType::int32:
      case GgufValueType::uint64: case GgufValueType::int64:
        return true;
      default:
        return false;
    }
  }
  /// The value of an integer scalar as int64, std::nullopt for other types or a uint64 above
  /// INT64_MAX.
  [[nodiscard]] std::optional<int64_t> as_int() const noexcept {
    if (const auto* i = std::get_if<int64_t>(&value)) return *i;
    if (const auto* u = std::get_if<uint64_t>(&value)) {
      if (*u <= static_cast<uint64_t>(std::numeric_limits<int64_t>::max())) return static_cast<int64_t>(*u);
    }
    return std::nullopt;
  }
};

/// One metadata key/value pair, in file order.
struct GgufKv {
  std::string key;
  GgufValue value;
};

}  // namespace kvpack::llama
