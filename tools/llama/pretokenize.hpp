// Unicode helpers and the GPT-2 pre-tokenizer of the byte-level BPE tokenizer (tokenizer.hpp):
// code point classes from unicode_tables.hpp, UTF-8 decoding/encoding, the GPT-2 byte-to-unicode
// alphabet, and the split of text into words by the GPT-2 pattern (step 2 of tokenizer.hpp's
// pipeline), matched by hand-written code instead of a regex engine.
#pragma once

#include "unicode_tables.hpp"

#include <array>
#include <cstddef>
#include <cstdint>
#include <span>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

namespace kvpack::llama {

/// Unicode helpers of the pre-tokenizer.
namespace unicode {

/// The classes the GPT-2 pattern distinguishes.
enum class CpClass : uint8_t {
  letter,      ///< \p{L}
  number,      ///< \p{N}
  whitespace,  ///< \s (White_Space)
  other,       ///< everything else, including bytes of invalid UTF-8
};

namespace detail {
[[nodiscard]] constexpr bool in_ranges(std::span<const unicode_data::CodepointRange> rs, uint32_t cp) noexcept {
  size_t lo = 0, hi = rs.size();
  while (lo < hi) {
    const size_t mid = (lo + hi) / 2;
    if (rs[mid].last < cp) {
      lo = mid + 1;
    } else if (rs[mid].first > cp) {
      hi = mid;
    } else {
      return true;
    }
  }
  return false;
}
[[nodiscard]] constexpr CpClass classify_slow(uint32_t cp) noexcept {
  if (in_ranges(unicode_data::kLetter, cp)) return CpClass::letter;
  if (in_ranges(unicode_data::kNumber, cp)) return CpClass::number;
  if (in_ranges(unicode_data::kWhiteSpace, cp)) return CpClass::whitespace;
  return CpClass::other;
}
inline constexpr auto kAsciiClass = [] {
  std::array<CpClass, 128> t{};
  for (uint32_t c = 0; c < 128; ++c) t[c] = classify_slow(c);
  return t;
}();
}  // namespace detail

/// Class of code point `cp`.
[[nodiscard]] constexpr CpClass classify(uint32_t cp) noexcept {
  return cp < 128 ? detail::kAsciiClass[cp] : detail::classify_slow(cp);
}

/// Decodes one UTF-8 sequence at s[i]. Returns {code point, length in bytes}; an invalid or
/// truncated sequence (overlong forms, surrogates and values above U+10FFFF included) yields
/// {0xFFFFFFFF, 1}, i.e. one byte of class `other`.
[[nodiscard]] constexpr std::pair<uint32_t, size_t> decode_utf8(std::string_view s, size_t i) noexcept {
  constexpr std::pair<uint32_t, size_t> kInvalid{0xFFFFFFFFu, 1};
  const auto b0 = static_cast<uint8_t>(s[i]);
  if (b0 < 0x80) return {b0, 1};
  size_t len = 0;
  uint32_t cp = 0;
  if ((b0 & 0xE0) == 0xC0) {
    len = 2;
    cp = b0 & 0x1Fu;
  } else if ((b0 & 0xF0) == 0xE0) {
    len = 3;
    cp = b0 & 0x0Fu;
  } else if ((b0 & 0xF8) == 0xF0) {
    len = 4;
    cp = b0 & 0x07u;
  } else {
    return kInvalid;
  }
  if (i + len > s.size()) return kInvalid;
  for (size_t k = 1; k < len; ++k) {
    const auto b = static_cast<uint8_t>(s[i + k]);
    if ((b & 0xC0) != 0x80) return kInvalid;
    cp = (cp << 6) | (b & 0x3Fu);
  }
  constexpr uint32_t kMin[5] = {0, 0, 0x80, 0x800, 0x10000};
  if (cp < kMin[len] || cp > 0x10FFFF || (cp >= 0xD800 && cp <= 0xDFFF)) return kInvalid;
  return {cp, len};
}

/// Appends the UTF-8 encoding of `cp` (< 0x110000) to `out`.
inline void append_utf8(std::string& out, uint32_t cp) {
  if (cp < 0x80) {
    out.push_back(static_cast<char>(cp));
  } else if (cp < 0x800) {
    out.push_back(static_cast<char>(0xC0 | (cp >> 6)));
    out.push_back(static_cast<char>(0x80 | (cp & 0x3F)));
  } else if (cp < 0x10000) {
    out.push_back(static_cast<char>(0xE0 | (cp >> 12)));
    out.push_back(static_cast<char>(0x80 | ((cp >> 6) & 0x3F)));
    out.push_back(static_cast<char>(0x80 | (cp & 0x3F)));
  } else {
    out.push_back(static_cast<char>(0xF0 | (cp >> 18)));
    out.push_back(static_cast<char>(0x80 | ((cp >> 12) & 0x3F)));
    out.push_back(static_cast<char>(0x80 | ((cp >> 6) & 0x3F)));
    out.push_back(static_cast<char>(0x80 | (cp & 0x3F)));
  }
}

/// GPT-2 byte-to-unicode alphabet: the code point that stands for byte b in token texts.
/// Bytes '!'..'~', 0xA1..0xAC and 0xAE..0xFF map to themselves; the remaining 68 bytes map to
/// U+0100, U+0101, ... in increasing byte order.
[[nodiscard]] constexpr std::array<uint32_t, 256> byte_to_codepoint_table() noexcept {
  std::array<uint32_t, 256> t{};
  uint32_t next = 256;
  for (uint32_t b = 0; b < 256; ++b) {
    const bool printable = (b >= 0x21 && b <= 0x7E) || (b >= 0xA1 && b <= 0xAC) || (b >= 0xAE);
    t[b] = printable ? b : next++;
  }
  return t;
}

/// Splits `text` into pre-tokenizer words with the GPT-2 pattern (see the file comment).
/// `split_digits`: first isolate every \p{N} code point (the "smollm" pre-tokenizer).
/// Calls `emit(std::string_view word)` for each word in order; the words concatenate to `text`.
template <class Emit>
void pre_tokenize(std::string_view text, bool split_digits, Emit&& emit) {
  struct Cp {
    uint32_t cp;
    CpClass cls;
    uint32_t offset;  // byte offset of the code point in `text`
  };
  std::vector<Cp> cps;
  cps.reserve(text.size() + 1);
  for (size_t i = 0; i < text.size();) {
    const auto [cp, len] = decode_utf8(text, i);
    cps.push_back({cp, cp == 0xFFFFFFFFu ? CpClass::other : classify(cp), static_cast<uint32_t>(i)});
    i += len;
  }
  const size_t n = cps.size();
  cps.push_back({0, CpClass::other, static_cast<uint32_t>(text.size())});  // sentinel: end offset
  const auto word = [&](size_t a, size_t b) { emit(text.substr(cps[a].offset, cps[b].offset - cps[a].offset)); };
  const auto is = [&](size_t i, size_t end, CpClass c) { return i < end && cps[i].cls == c; };
  const auto run = [&](size_t i, size_t end, CpClass c) {
    while (i < end && cps[i].cls == c) ++i;
    return i;
  };
  // The GPT-2 pattern on code points [begin, end): every position starts a match.
  const auto split = [&](size_t begin, size_t end) {
    size_t i = begin;
    while (i < end) {
      const uint32_t c = cps[i].cp;
      size_t j = i;
      // 's|'t|'re|'ve|'m|'ll|'d
      if (c == '\'' && i + 1 < end) {
        const uint32_t c1 = cps[i + 1].cp;
        const uint32_t c2 = i + 2 < end ? cps[i + 2].cp : 0;
        if (c1 == 's' || c1 == 't' || c1 == 'm' || c1 == 'd') {
          j = i + 2;
        } else if ((c1 == 'r' && c2 == 'e') || (c1 == 'v' && c2 == 'e') || (c1 == 'l' && c2 == 'l')) {
          j = i + 3;
        }
      }
      if (j == i) {
        const size_t k = (c == ' ') ? i + 1 : i;  // optional leading space of the next three
        if (is(k, end, CpClass::letter)) {                    // ' ?\p{L}+'
          j = run(k, end, CpClass::letter);
        } else if (is(k, end, CpClass::number)) {            // ' ?\p{N}+'
          j = run(k, end, CpClass::number);
        } else if (is(k, end, CpClass::other)) {             // ' ?[^\s\p{L}\p{N}]+'
          j = run(k, end, CpClass::other);
        } else {                                             // '\s+(?!\S)|\s+'
          const size_t r = run(i, end, CpClass::whitespace);
          j = (r == end || r - i == 1) ? r : r - 1;
        }
      }
      word(i, j);
      i = j;
    }
  };
  if (!split_digits) {
    split(0, n);
    return;
  }
  size_t start = 0;
  for (size_t i = 0; i < n; ++i) {
    if (cps[i].cls == CpClass::number) {
      split(start, i);
      word(i, i + 1);
      start = i + 1;
    }
  }
  split(start, n);
}

}  // namespace unicode

}  // namespace kvpack::llama
