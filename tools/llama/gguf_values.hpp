// Reading GGUF metadata values (gguf.hpp's parser): strings, scalars and nested arrays, each
// length and count bounds-checked against the bytes left before anything is allocated.
#pragma once

#include <kvpack/result.hpp>

#include <cstddef>
#include <cstdint>
#include <string>
#include <utility>
#include <vector>

#include "gguf_io.hpp"
#include "gguf_types.hpp"

namespace kvpack::llama::detail {

/// Largest accepted nesting of arrays in metadata (arrays of arrays of ...).
inline constexpr int kGgufMaxArrayDepth = 8;

/// " at offset N": where the cursor stands, for error messages.
inline std::string gguf_at(const Cursor& c) { return " at offset " + std::to_string(c.pos()); }


/// Smallest encoded size of one value of type `t` (used to reject absurd counts early).
constexpr uint64_t min_encoded_size(GgufValueType t) noexcept {
  switch (t) {
    case GgufValueType::uint8: case GgufValueType::int8: case GgufValueType::boolean: return 1;
    case GgufValueType::uint16: case GgufValueType::int16: return 2;
    case GgufValueType::uint32: case GgufValueType::int32: case GgufValueType::float32: return 4;
    case GgufValueType::uint64: case GgufValueType::int64: case GgufValueType::float64: return 8;
    case GgufValueType::string: return 8;   // u64 length
    case GgufValueType::array: return 12;   // u32 type + u64 count
  }
  return 1;
}

inline Status read_string(Cursor& c, std::string& out, const std::string& what) {
  const size_t start = c.pos();
  const auto len = c.read_uint<uint64_t>();
  if (!len) return fail(Errc::corrupt_data, "file ends inside the length of " + what + gguf_at(c));
  const auto bytes = c.read_bytes(*len);
  if (!bytes) {
    return fail(Errc::corrupt_data, what + ": string length " + std::to_string(*len) + " at offset " +
                                        std::to_string(start) + " exceeds the " +
                                        std::to_string(c.remaining()) + " bytes left in the file");
  }
  out.assign(reinterpret_cast<const char*>(bytes->data()), bytes->size());
  return {};
}

inline Status read_value(Cursor& c, GgufValueType type, GgufValue& out, int depth,
                         const std::string& what) {
  out.type = type;
  const auto truncated = [&]() {
    return fail(Errc::corrupt_data, "file ends inside " + what + " (" + to_string(type) + ")" + gguf_at(c));
  };
  switch (type) {
    case GgufValueType::uint8: {
      const auto v = c.read_uint<uint8_t>();
      if (!v) return truncated();
      out.value = uint64_t{*v};
      return {};
    }
    case GgufValueType::int8: {
      const auto v = c.read_uint<uint8_t>();
      if (!v) return truncated();
      out.value = int64_t{static_cast<int8_t>(*v)};
      return {};
    }
    case GgufValueType::uint16: {
      const auto v = c.read_uint<uint16_t>();
      if (!v) return truncated();
      out.value = uint64_t{*v};
      return {};
    }
    case GgufValueType::int16: {
      const auto v = c.read_uint<uint16_t>();
      if (!v) return truncated();
      out.value = int64_t{static_cast<int16_t>(*v)};
      return {};
    }
    case GgufValueType::uint32: {
      const auto v = c.read_uint<uint32_t>();
      if (!v) return truncated();
      out.value = uint64_t{*v};
      return {};
    }
    case GgufValueType::int32: {
      const auto v = c.read_uint<uint32_t>();
      if (!v) return truncated();
      out.value = int64_t{static_cast<int32_t>(*v)};
      return {};
    }
    case GgufValueType::uint64: {
      const auto v = c.read_uint<uint64_t>();
      if (!v) return truncated();
      out.value = uint64_t{*v};
      return {};
    }
    case GgufValueType::int64: {
      const auto v = c.read_uint<uint64_t>();
      if (!v) return truncated();
      out.value = static_cast<int64_t>(*v);
      return {};
    }
    case GgufValueType::float32: {
      const auto v = c.read_uint<uint32_t>();
      if (!v) return truncated();
      out.value = double{std::bit_cast<float>(*v)};
      return {};
    }
    case GgufValueType::float64: {
      const auto v = c.read_uint<uint64_t>();
      if (!v) return truncated();
      out.value = std::bit_cast<double>(*v);
      return {};
    }
    case GgufValueType::boolean: {
      const auto v = c.read_uint<uint8_t>();
      if (!v) return truncated();
      if (*v > 1) {
        return fail(Errc::corrupt_data, what + ": bool byte " + std::to_string(*v) + " is neither 0 nor 1" + gguf_at(c));
      }
      out.value = *v == 1;
      return {};
    }
    case GgufValueType::string: {
      std::string s;
      if (auto st = read_string(c, s, what); !st) return st;
      out.value = std::move(s);
      return {};
    }
    case GgufValueType::array: {
      if (depth >= kGgufMaxArrayDepth) {
        return fail(Errc::corrupt_data, what + ": arrays nested deeper than " + std::to_string(kGgufMaxArrayDepth) + gguf_at(c));
      }
      const auto et = c.read_uint<uint32_t>();
      if (!et) return truncated();
      if (*et > static_cast<uint32_t>(GgufValueType::float64)) {
        return fail(Errc::unsupported, what + ": unknown array element type " + std::to_string(*et) + gguf_at(c));
      }
      out.elem_type = static_cast<GgufValueType>(*et);
      const auto n = c.read_uint<uint64_t>();
      if (!n) return truncated();
      if (*n > c.remaining() / min_encoded_size(out.elem_type)) {
        return fail(Errc::corrupt_data, what + ": array count " + std::to_string(*n) + " of " +
                                            to_string(out.elem_type) + " cannot fit in the " +
                                            std::to_string(c.remaining()) + " bytes left" + gguf_at(c));
      }
      std::vector<GgufValue> items(static_cast<size_t>(*n));
      for (size_t i = 0; i < items.size(); ++i) {
        if (auto st = read_value(c, out.elem_type, items[i], depth + 1, what + "[" + std::to_string(i) + "]"); !st) {
          return st;
        }
      }
      out.value = std::move(items);
      return {};
    }
  }
  return fail(Errc::unsupported, what + ": unknown value type " + std::to_string(static_cast<uint32_t>(type)));
}

}  // namespace kvpack::llama::detail
