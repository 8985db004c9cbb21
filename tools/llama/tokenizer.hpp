// Byte-level BPE tokenizer built from a GGUF file's tokenizer.ggml.* metadata (GPT-2 style, as
// used by SmolLM2, StarCoder and many LLaMA-architecture models).
//
// Pipeline of encode():
//  1. Special tokens are cut out of the text as whole strings before anything else:
//     USER_DEFINED tokens always, CONTROL (and UNKNOWN) tokens only with parse_special = true
//     (the rule llama.cpp applies). At each position the longest matching token wins.
//  2. Pre-tokenization of the remaining fragments. For tokenizer.ggml.pre = "smollm" (and the
//     pre-tokenizers llama.cpp treats identically: starcoder, refact, command-r, codeshell,
//     exaone, minerva-7b) every \p{N} code point is first split off on its own, then the GPT-2
//     pattern
//         's|'t|'re|'ve|'m|'ll|'d| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)|\s+
//     splits each piece into words (pre = "gpt2": the pattern alone). The pattern is matched by
//     hand-written code over Unicode class tables (unicode_tables.hpp), not by a regex engine.
//  3. Each word's bytes are mapped to the GPT-2 byte-to-unicode alphabet (printable bytes map to
//     themselves, the other 68 to U+0100..U+0143 in byte order), giving one initial symbol per
//     byte, and merged by BPE: repeatedly the adjacent pair with the lowest merge rank (position
//     in tokenizer.ggml.merges; leftmost first on ties) is replaced by its merged token.
// decode() maps tokens back to bytes through the inverse alphabet, so decode(encode(s)) == s
// for every byte string s (invalid UTF-8 included) made of bytes the vocabulary has a token for.
// A vocabulary may lack some of the 256 byte tokens (SmolLM2 lacks 21: 0x04, 0x06, 0x13, 0x14,
// 0x16, 0x1D, 0xC0, 0xC1, 0xF1, 0xF2, 0xF5..0xFF, bytes its training text never had); such bytes
// are dropped before merging, as HF tokenizers' BPE without an unknown token does.
#pragma once

#include "gguf.hpp"
#include "pretokenize.hpp"

#include <kvpack/result.hpp>

#include <algorithm>
#include <array>
#include <cstddef>
#include <cstdint>
#include <limits>
#include <queue>
#include <span>
#include <string>
#include <string_view>
#include <unordered_map>
#include <utility>
#include <vector>

namespace kvpack::llama {

/// GGUF token types (tokenizer.ggml.token_type).
enum class TokenType : int32_t {
  undefined = 0,
  normal = 1,
  unknown = 2,
  control = 3,
  user_defined = 4,
  unused = 5,
  byte = 6,
};

/// Byte-level BPE tokenizer (see the file comment). Immutable after from_gguf(); encode() and
/// decode() are const and safe to call from several threads at once.
class Tokenizer {
 public:
  /// Builds the tokenizer from `tokenizer.ggml.{model,pre,tokens,token_type,merges,
  /// bos_token_id,eos_token_id,add_bos_token}`. The model must be "gpt2" and the pre-tokenizer
  /// one of those listed in the file comment ("default"/absent is treated as "gpt2").
  /// Errors: Errc::unsupported (other tokenizer model or pre-tokenizer), Errc::corrupt_data
  /// (missing or mistyped arrays, size mismatches, malformed merges, special ids out of range).
  /// Merges whose parts or result are not in the vocabulary can never apply and are ignored.
  [[nodiscard]] static Result<Tokenizer> from_gguf(const GgufFile& f) {
    const auto model = f.get_string("tokenizer.ggml.model");
    if (!model) return fail(Errc::corrupt_data, "tokenizer: tokenizer.ggml.model is missing");
    if (*model != "gpt2") {
      return fail(Errc::unsupported, "tokenizer: tokenizer.ggml.model '" + *model + "' is not supported (only gpt2)");
    }
    Tokenizer t;
    const std::string pre = f.get_string("tokenizer.ggml.pre").value_or("default");
    if (pre == "smollm" || pre == "starcoder" || pre == "refact" || pre == "command-r" || pre == "codeshell" ||
        pre == "exaone" || pre == "minerva-7b") {
      t.split_digits_ = true;
    } else if (pre == "gpt2" || pre == "default") {
      t.split_digits_ = false;
    } else {
      return fail(Errc::unsupported, "tokenizer: pre-tokenizer '" + pre + "' is not supported");
    }
    t.pre_ = pre;

    auto tokens = f.get_string_array("tokenizer.ggml.tokens");
    if (!tokens) return fail(Errc::corrupt_data, "tokenizer: tokenizer.ggml.tokens is missing or not a string array");
    if (tokens->empty() || tokens->size() > static_cast<size_t>(std::numeric_limits<int32_t>::max())) {
      return fail(Errc::corrupt_data, "tokenizer: vocabulary size " + std::to_string(tokens->size()) + " is out of range");
    }
    const size_t n = tokens->size();
    t.tokens_ = std::move(*tokens);
    t.types_.assign(n, TokenType::normal);
    if (f.get("tokenizer.ggml.token_type") != nullptr) {
      const auto types = f.get_int_array("tokenizer.ggml.token_type");
      if (!types || types->size() != n) {
        return fail(Errc::corrupt_data, "tokenizer: tokenizer.ggml.token_type must be an integer array of " +
                                            std::to_string(n) + " entries");
      }
      for (size_t i = 0; i < n; ++i) {
        const int64_t v = (*types)[i];
        t.types_[i] = (v >= 0 && v <= 6) ? static_cast<TokenType>(v) : TokenType::undefined;
      }
    }
    t.ids_.reserve(n);
    for (size_t i = 0; i < n; ++i) t.ids_[t.tokens_[i]] = static_cast<int32_t>(i);  // last duplicate wins

    // One initial symbol per byte: the token whose text is the byte's alphabet code point.
    constexpr auto kByteCp = unicode::byte_to_codepoint_table();
    std::unordered_map<uint32_t, uint8_t> cp_to_byte;
    for (uint32_t b = 0; b < 256; ++b) {
      cp_to_byte[kByteCp[b]] = static_cast<uint8_t>(b);
      std::string s;
      unicode::append_utf8(s, kByteCp[b]);
      const auto it = t.ids_.find(s);
      t.byte_token_[b] = it == t.ids_.end() ? -1 : it->second;
    }

    // Decoded bytes of every token.
    t.pieces_.resize(n);
    for (size_t i = 0; i < n; ++i) {
      const std::string& text = t.tokens_[i];
      const TokenType ty = t.types_[i];
      if (ty == TokenType::control || ty == TokenType::user_defined || ty == TokenType::unknown) {
        t.pieces_[i] = text;
        continue;
      }
      std::string& out = t.pieces_[i];
      for (size_t k = 0; k < text.size();) {
        const auto [cp, len] = unicode::decode_utf8(text, k);
        const auto it = cp_to_byte.find(cp);
        if (it != cp_to_byte.end()) {
          out.push_back(static_cast<char>(it->second));
        } else {
          out.append(text, k, len);  // not in the alphabet: keep as is
        }
        k += len;
      }
    }

    // Special tokens matched as whole strings.
    for (size_t i = 0; i < n; ++i) {
      const TokenType ty = t.types_[i];
      if ((ty == TokenType::control || ty == TokenType::user_defined || ty == TokenType::unknown) &&
          !t.tokens_[i].empty()) {
        t.specials_.push_back(static_cast<int32_t>(i));
      }
    }
    std::stable_sort(t.specials_.begin(), t.specials_.end(), [&](int32_t a, int32_t b) {
      return t.tokens_[static_cast<size_t>(a)].size() > t.tokens_[static_cast<size_t>(b)].size();
    });
    for (const int32_t id : t.specials_) t.special_first_byte_[static_cast<uint8_t>(t.tokens_[static_cast<size_t>(id)][0])] = true;

    // Merge ranks keyed by the (left, right) token ids.
    const auto merges = f.get_string_array("tokenizer.ggml.merges");
    if (!merges) return fail(Errc::corrupt_data, "tokenizer: tokenizer.ggml.merges is missing or not a string array");
    t.merges_.reserve(merges->size());
    for (size_t r = 0; r < merges->size(); ++r) {
      const std::string& m = (*merges)[r];
      const size_t sp = m.find(' ', 1);
      if (sp == std::string::npos || sp + 1 >= m.size()) {
        return fail(Errc::corrupt_data, "tokenizer: merge #" + std::to_string(r) + " '" + m +
                                            "' is not two space-separated tokens");
      }
      const auto l = t.ids_.find(std::string_view(m).substr(0, sp));
      const auto rr = t.ids_.find(std::string_view(m).substr(sp + 1));
      std::string merged = m.substr(0, sp) + m.substr(sp + 1);
      const auto mm = t.ids_.find(merged);
      if (l == t.ids_.end() || rr == t.ids_.end() || mm == t.ids_.end()) continue;  // can never apply
      t.merges_.emplace(pair_key(l->second, rr->second), Merge{static_cast<int32_t>(r), mm->second});
    }

    const auto special_id = [&](const char* key, int32_t& out) -> Status {
      const auto v = f.get_int(key);
      if (!v) return {};
      if (*v < 0 || *v >= static_cast<int64_t>(n)) {
        return fail(Errc::corrupt_data, std::string("tokenizer: ") + key + " = " + std::to_string(*v) +
                                            " is outside the vocabulary of " + std::to_string(n));
      }
      out = static_cast<int32_t>(*v);
      return {};
    };
    if (auto st = special_id("tokenizer.ggml.bos_token_id", t.bos_); !st) return st.error();
    if (auto st = special_id("tokenizer.ggml.eos_token_id", t.eos_); !st) return st.error();
    t.add_bos_ = f.get_bool("tokenizer.ggml.add_bos_token").value_or(false);
    return t;
  }

  /// Token ids of `text` (raw bytes, normally UTF-8; any byte string is accepted). No BOS is
  /// added (see add_bos()). With parse_special, CONTROL token texts such as "<|im_start|>" in
  /// the text become their token; otherwise they are tokenized as plain text.
  [[nodiscard]] std::vector<int32_t> encode(std::string_view text, bool parse_special = false) const {
    std::vector<int32_t> out;
    out.reserve(text.size() / 3 + 4);
    std::unordered_map<std::string_view, std::pair<uint32_t, uint32_t>> cache;  // word -> [begin, end) in store
    std::vector<int32_t> store;
    Scratch scratch;
    const auto encode_fragment = [&](std::string_view frag) {
      unicode::pre_tokenize(frag, split_digits_, [&](std::string_view word) {
        const auto [it, fresh] = cache.try_emplace(word, 0u, 0u);
        if (fresh) {
          const auto begin = static_cast<uint32_t>(store.size());
          bpe(word, scratch, store);
          it->second = {begin, static_cast<uint32_t>(store.size())};
        }
        out.insert(out.end(), store.begin() + it->second.first, store.begin() + it->second.second);
      });
    };
    size_t frag_start = 0;
    size_t i = 0;
    while (i < text.size()) {
      const int32_t sp = special_first_byte_[static_cast<uint8_t>(text[i])] ? match_special(text, i, parse_special) : -1;
      if (sp < 0) {
        ++i;
        continue;
      }
      if (i > frag_start) encode_fragment(text.substr(frag_start, i - frag_start));
      out.push_back(sp);
      i += tokens_[static_cast<size_t>(sp)].size();
      frag_start = i;
    }
    if (frag_start < text.size()) encode_fragment(text.substr(frag_start));
    return out;
  }

  /// The bytes `tokens` stand for, concatenated. CONTROL/USER_DEFINED tokens render as their
  /// text (e.g. "<|im_end|>"); ids outside the vocabulary are skipped.
  [[nodiscard]] std::string decode(std::span<const int32_t> tokens) const {
    std::string out;
    for (const int32_t id : tokens) {
      if (id >= 0 && static_cast<size_t>(id) < pieces_.size()) out += pieces_[static_cast<size_t>(id)];
    }
    return out;
  }

  /// Beginning-of-sequence token id (tokenizer.ggml.bos_token_id), -1 if the file has none.
  [[nodiscard]] int32_t bos() const noexcept { return bos_; }
  /// End-of-sequence token id (tokenizer.ggml.eos_token_id), -1 if the file has none.
  [[nodiscard]] int32_t eos() const noexcept { return eos_; }
  /// tokenizer.ggml.add_bos_token (false when absent): whether callers should prepend bos().
  [[nodiscard]] bool add_bos() const noexcept { return add_bos_; }
  /// Number of tokens in the vocabulary.
  [[nodiscard]] size_t vocab_size() const noexcept { return tokens_.size(); }
  /// The vocabulary text of token `id` in the byte-level alphabet (e.g. "Ġthe" for " the");
  /// empty for ids outside the vocabulary.
  [[nodiscard]] std::string_view token_text(int32_t id) const noexcept {
    return valid(id) ? std::string_view(tokens_[static_cast<size_t>(id)]) : std::string_view{};
  }
  /// The bytes token `id` decodes to (e.g. " the"); empty for ids outside the vocabulary.
  [[nodiscard]] std::string_view token_piece(int32_t id) const noexcept {
    return valid(id) ? std::string_view(pieces_[static_cast<size_t>(id)]) : std::string_view{};
  }
  /// Type of token `id` (TokenType::undefined for ids outside the vocabulary).
  [[nodiscard]] TokenType token_type(int32_t id) const noexcept {
    return valid(id) ? types_[static_cast<size_t>(id)] : TokenType::undefined;
  }
  /// Id of the token whose vocabulary text is exactly `text`, or -1.
  [[nodiscard]] int32_t token_id(std::string_view text) const {
    const auto it = ids_.find(text);
    return it == ids_.end() ? -1 : it->second;
  }
  /// The pre-tokenizer name from the file (tokenizer.ggml.pre, "default" when absent).
  [[nodiscard]] const std::string& pre_tokenizer() const noexcept { return pre_; }

 private:
  struct Merge {
    int32_t rank;
    int32_t result;
  };
  struct StringHash {
    using is_transparent = void;
    size_t operator()(std::string_view s) const noexcept { return std::hash<std::string_view>{}(s); }
  };
  /// Working memory of bpe(), reused across words of one encode() call.
  struct Symbol {
    int32_t id;
    int32_t prev;
    int32_t next;
  };
  struct Candidate {
    int32_t rank;
    int32_t left;  // symbol index
    int32_t left_id;
    int32_t right_id;
    int32_t result;  // merged token id
    bool operator>(const Candidate& o) const noexcept {
      return rank != o.rank ? rank > o.rank : left > o.left;
    }
  };
  struct Scratch {
    std::vector<Symbol> syms;
    std::vector<Candidate> heap;
  };

  Tokenizer() = default;

  [[nodiscard]] bool valid(int32_t id) const noexcept { return id >= 0 && static_cast<size_t>(id) < tokens_.size(); }
  [[nodiscard]] static constexpr uint64_t pair_key(int32_t a, int32_t b) noexcept {
    return (static_cast<uint64_t>(static_cast<uint32_t>(a)) << 32) | static_cast<uint32_t>(b);
  }

  /// The longest special token (allowed by parse_special) starting at text[i], or -1.
  [[nodiscard]] int32_t match_special(std::string_view text, size_t i, bool parse_special) const noexcept {
    for (const int32_t id : specials_) {  // longest first
      const TokenType ty = types_[static_cast<size_t>(id)];
      if (!parse_special && ty != TokenType::user_defined) continue;
      const std::string& s = tokens_[static_cast<size_t>(id)];
      if (text.compare(i, s.size(), s) == 0) return id;
    }
    return -1;
  }

  /// Byte-level BPE of one pre-tokenizer word; appends the token ids to `out`.
  void bpe(std::string_view word, Scratch& s, std::vector<int32_t>& out) const {
    auto& syms = s.syms;
    syms.clear();
    for (const char ch : word) {
      const int32_t id = byte_token_[static_cast<uint8_t>(ch)];
      if (id < 0) continue;  // byte without a token in this vocabulary: dropped
      const auto k = static_cast<int32_t>(syms.size());
      syms.push_back({id, k - 1, k + 1});
    }
    if (syms.empty()) return;
    syms.back().next = -1;
    auto& heap = s.heap;
    heap.clear();
    const auto push = [&](int32_t left) {
      if (left < 0) return;
      const int32_t right = syms[static_cast<size_t>(left)].next;
      if (right < 0) return;
      const int32_t a = syms[static_cast<size_t>(left)].id, b = syms[static_cast<size_t>(right)].id;
      const auto it = merges_.find(pair_key(a, b));
      if (it == merges_.end()) return;
      heap.push_back({it->second.rank, left, a, b, it->second.result});
      std::push_heap(heap.begin(), heap.end(), std::greater<>{});
    };
    for (int32_t k = 0; k + 1 < static_cast<int32_t>(syms.size()); ++k) push(k);
    while (!heap.empty()) {
      std::pop_heap(heap.begin(), heap.end(), std::greater<>{});
      const Candidate c = heap.back();
      heap.pop_back();
      Symbol& l = syms[static_cast<size_t>(c.left)];
      // Stale if the left symbol was merged away (id -1) or either side changed since the push.
      if (l.id != c.left_id || l.next < 0 || syms[static_cast<size_t>(l.next)].id != c.right_id) continue;
      const int32_t right = l.next;
      Symbol& r = syms[static_cast<size_t>(right)];
      l.id = c.result;
      l.next = r.next;
      if (r.next >= 0) syms[static_cast<size_t>(r.next)].prev = c.left;
      r.id = -1;
      push(l.prev);
      push(c.left);
    }
    for (int32_t k = 0; k >= 0; k = syms[static_cast<size_t>(k)].next) out.push_back(syms[static_cast<size_t>(k)].id);
  }

  std::string pre_;
  bool split_digits_ = true;
  std::vector<std::string> tokens_;
  std::vector<std::string> pieces_;
  std::vector<TokenType> types_;
  std::unordered_map<std::string, int32_t, StringHash, std::equal_to<>> ids_;
  std::unordered_map<uint64_t, Merge> merges_;
  std::array<int32_t, 256> byte_token_{};
  std::vector<int32_t> specials_;  // longest text first
  std::array<bool, 256> special_first_byte_{};
  int32_t bos_ = -1;
  int32_t eos_ = -1;
  bool add_bos_ = false;
};

}  // namespace kvpack::llama

