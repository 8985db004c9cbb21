// Byte-level BPE tokenizer: Unicode classes, UTF-8 decoding, the pre-tokenizer split, BPE merge
// order and special tokens on a small synthetic vocabulary (no model needed). The real SmolLM2
// vocabulary is tested in test_llama_tokenizer_model.cpp.
#include "gguf_builder.hpp"
#include "tokenizer.hpp"

#include <gtest/gtest.h>

#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <random>
#include <sstream>
#include <string>
#include <vector>

namespace {

using kvpack::Errc;
using kvpack::llama::GgufFile;
using kvpack::llama::TokenType;
using kvpack::llama::Tokenizer;
using kvpack::llama::test::ByteWriter;
using kvpack::llama::test::GgufBuilder;
namespace uc = kvpack::llama::unicode;

// ---- Unicode classes and UTF-8 ----

TEST(LlamaUnicode, Classes) {
  using C = uc::CpClass;
  EXPECT_EQ(uc::classify('a'), C::letter);
  EXPECT_EQ(uc::classify('Z'), C::letter);
  EXPECT_EQ(uc::classify('7'), C::number);
  EXPECT_EQ(uc::classify(' '), C::whitespace);
  EXPECT_EQ(uc::classify('\r'), C::whitespace);
  EXPECT_EQ(uc::classify(0x0B), C::whitespace);  // vertical tab
  EXPECT_EQ(uc::classify(0x1C), C::other);       // not White_Space (Python's isspace() says yes)
  EXPECT_EQ(uc::classify('\''), C::other);
  EXPECT_EQ(uc::classify('_'), C::other);
  EXPECT_EQ(uc::classify(0x85), C::whitespace);    // NEL
  EXPECT_EQ(uc::classify(0xA0), C::whitespace);    // no-break space
  EXPECT_EQ(uc::classify(0xAA), C::letter);        // feminine ordinal (Lo)
  EXPECT_EQ(uc::classify(0xAD), C::other);         // soft hyphen (Cf)
  EXPECT_EQ(uc::classify(0xB2), C::number);        // superscript two (No)
  EXPECT_EQ(uc::classify(0xBD), C::number);        // one half (No)
  EXPECT_EQ(uc::classify(0xE9), C::letter);        // e acute
  EXPECT_EQ(uc::classify(0x301), C::other);        // combining acute (Mn)
  EXPECT_EQ(uc::classify(0x661), C::number);       // Arabic-Indic one (Nd)
  EXPECT_EQ(uc::classify(0x2028), C::whitespace);  // line separator
  EXPECT_EQ(uc::classify(0x200B), C::other);       // zero width space is not White_Space
  EXPECT_EQ(uc::classify(0x216B), C::number);      // roman numeral twelve (Nl)
  EXPECT_EQ(uc::classify(0x3000), C::whitespace);  // ideographic space
  EXPECT_EQ(uc::classify(0x4E2D), C::letter);      // CJK
  EXPECT_EQ(uc::classify(0xAC00), C::letter);      // Hangul
  EXPECT_EQ(uc::classify(0x1F999), C::other);      // llama emoji
  EXPECT_EQ(uc::classify(0x10FFFF), C::other);
}

TEST(LlamaUnicode, DecodeUtf8) {
  using P = std::pair<uint32_t, size_t>;
  constexpr P kBad{0xFFFFFFFFu, 1};
  EXPECT_EQ(uc::decode_utf8("A", 0), (P{0x41, 1}));
  EXPECT_EQ(uc::decode_utf8("\xC3\xA9", 0), (P{0xE9, 2}));
  EXPECT_EQ(uc::decode_utf8("\xE2\x80\xA8", 0), (P{0x2028, 3}));
  EXPECT_EQ(uc::decode_utf8("\xF0\x9F\xA6\x99", 0), (P{0x1F999, 4}));
  EXPECT_EQ(uc::decode_utf8("\xC0\x80", 0), kBad);          // overlong
  EXPECT_EQ(uc::decode_utf8("\xE0\x80\x80", 0), kBad);      // overlong
  EXPECT_EQ(uc::decode_utf8("\xED\xA0\x80", 0), kBad);      // surrogate
  EXPECT_EQ(uc::decode_utf8("\xF4\x90\x80\x80", 0), kBad);  // above U+10FFFF
  EXPECT_EQ(uc::decode_utf8("\xF0\x9F\xA6", 0), kBad);      // truncated
  EXPECT_EQ(uc::decode_utf8("\x80", 0), kBad);              // stray continuation
  EXPECT_EQ(uc::decode_utf8("\xC3" "A", 0), kBad);          // bad continuation
  EXPECT_EQ(uc::decode_utf8("\xFF", 0), kBad);
}

TEST(LlamaUnicode, ByteAlphabet) {
  constexpr auto t = uc::byte_to_codepoint_table();
  EXPECT_EQ(t['A'], 0x41u);
  EXPECT_EQ(t['~'], 0x7Eu);
  EXPECT_EQ(t[0], 0x100u);
  EXPECT_EQ(t[' '], 0x120u);   // 'Ġ'
  EXPECT_EQ(t['\n'], 0x10Au);  // 'Ċ'
  EXPECT_EQ(t[0x7F], 0x121u);
  EXPECT_EQ(t[0xA0], 0x142u);
  EXPECT_EQ(t[0xA1], 0xA1u);
  EXPECT_EQ(t[0xAD], 0x143u);
  EXPECT_EQ(t[0xFF], 0xFFu);
  std::vector<bool> seen(0x144, false);
  for (const uint32_t cp : t) {
    ASSERT_LT(cp, 0x144u);
    EXPECT_FALSE(seen[cp]) << cp;
    seen[cp] = true;
  }
}

std::vector<std::string> split(std::string_view s, bool digits = true) {
  std::vector<std::string> out;
  uc::pre_tokenize(s, digits, [&](std::string_view w) { out.emplace_back(w); });
  return out;
}
using Words = std::vector<std::string>;

TEST(LlamaPreTokenizer, Gpt2Pattern) {
  EXPECT_EQ(split(""), Words{});
  EXPECT_EQ(split("Hello world"), (Words{"Hello", " world"}));
  EXPECT_EQ(split("a  b"), (Words{"a", " ", " b"}));
  EXPECT_EQ(split("a   b"), (Words{"a", "  ", " b"}));
  EXPECT_EQ(split("hi   "), (Words{"hi", "   "}));
  EXPECT_EQ(split("\n\nHi"), (Words{"\n", "\n", "Hi"}));
  EXPECT_EQ(split(" \nHi"), (Words{" ", "\n", "Hi"}));
  EXPECT_EQ(split("\n Hi"), (Words{"\n", " Hi"}));
  EXPECT_EQ(split("a\r\n\r\nb"), (Words{"a", "\r\n\r", "\n", "b"}));
  EXPECT_EQ(split("don't we'll"), (Words{"don", "'t", " we", "'ll"}));
  EXPECT_EQ(split("DON'T"), (Words{"DON", "'", "T"}));
  EXPECT_EQ(split("'sx"), (Words{"'s", "x"}));
  EXPECT_EQ(split("\"'s"), (Words{"\"'", "s"}));
  EXPECT_EQ(split("!!!abc ?? x"), (Words{"!!!", "abc", " ??", " x"}));
  EXPECT_EQ(split("a\xC2\xA0" "b"), (Words{"a", "\xC2\xA0", "b"}));      // U+00A0 is \s but not ' '
  EXPECT_EQ(split("caf\xC3\xA9 na"), (Words{"caf\xC3\xA9", " na"}));
  EXPECT_EQ(split("a\xFF" "b"), (Words{"a", "\xFF", "b"}));               // invalid byte: other
  EXPECT_EQ(split("e\xCC\x81x"), (Words{"e", "\xCC\x81", "x"}));          // combining mark: other
}

TEST(LlamaPreTokenizer, DigitsSplitIndividually) {
  EXPECT_EQ(split("x 123"), (Words{"x", " ", "1", "2", "3"}));
  EXPECT_EQ(split("x 123", false), (Words{"x", " 123"}));
  EXPECT_EQ(split("a1b"), (Words{"a", "1", "b"}));
  EXPECT_EQ(split("3.14"), (Words{"3", ".", "1", "4"}));
  EXPECT_EQ(split("\xC2\xBD!"), (Words{"\xC2\xBD", "!"}));  // one half is \p{N}
}

TEST(LlamaPreTokenizer, RandomInputsSplitIntoNonEmptyWordsThatConcatenate) {
  std::mt19937 rng(7);
  // Bytes biased towards the interesting classes: ASCII letters/digits/space/punctuation, CR/LF,
  // pieces of multi-byte sequences and invalid bytes.
  const std::string alphabet = "aZ9 '\r\n\t.!sdlmtrve\xC3\xA9\xE2\x80\xA8\xF0\x9F\xA6\x99\xFF\x80\xC2\xA0\xBD";
  for (int iter = 0; iter < 3000; ++iter) {
    std::string s(rng() % 40, ' ');
    for (char& ch : s) ch = alphabet[rng() % alphabet.size()];
    for (const bool digits : {true, false}) {
      std::string joined;
      uc::pre_tokenize(s, digits, [&](std::string_view w) {
        EXPECT_FALSE(w.empty());
        joined += w;
      });
      ASSERT_EQ(joined, s);
    }
  }
}

// ---- a synthetic vocabulary ----

/// Vocabulary: the 256 byte-alphabet tokens in byte order (ids 0..255), then extra tokens, with
/// the given merges (in rank order) and token types.
struct TinyVocab {
  std::vector<std::string> tokens;
  std::vector<int32_t> types;
  std::vector<std::string> merges;
  std::string model = "gpt2";
  std::string pre = "smollm";

  TinyVocab() {
    constexpr auto t = uc::byte_to_codepoint_table();
    for (int b = 0; b < 256; ++b) {
      std::string s;
      uc::append_utf8(s, t[static_cast<size_t>(b)]);
      tokens.push_back(s);
      types.push_back(1);
    }
  }
  int32_t add(std::string text, int32_t type = 1) {
    tokens.push_back(std::move(text));
    types.push_back(type);
    return static_cast<int32_t>(tokens.size() - 1);
  }
  [[nodiscard]] std::vector<std::byte> gguf(bool with_types = true, int64_t bos = 1, int64_t eos = 2) const {
    GgufBuilder b;
    b.kv_str("tokenizer.ggml.model", model).kv_str("tokenizer.ggml.pre", pre);
    const auto toks = tokens;
    b.kv("tokenizer.ggml.tokens", [toks](ByteWriter& w) {
      w.u32(9); w.u32(8); w.u64(toks.size());
      for (const auto& s : toks) w.str(s);
    });
    if (with_types) {
      const auto ty = types;
      b.kv("tokenizer.ggml.token_type", [ty](ByteWriter& w) {
        w.u32(9); w.u32(5); w.u64(ty.size());
        for (const int32_t v : ty) w.u32(static_cast<uint32_t>(v));
      });
    }
    const auto ms = merges;
    b.kv("tokenizer.ggml.merges", [ms](ByteWriter& w) {
      w.u32(9); w.u32(8); w.u64(ms.size());
      for (const auto& s : ms) w.str(s);
    });
    b.kv_u32("tokenizer.ggml.bos_token_id", static_cast<uint32_t>(bos));
    b.kv_u32("tokenizer.ggml.eos_token_id", static_cast<uint32_t>(eos));
    return b.build();
  }
};

Tokenizer make(const TinyVocab& v) {
  auto f = GgufFile::from_bytes(v.gguf());
  EXPECT_TRUE(f) << f.error().message;
  auto t = Tokenizer::from_gguf(*f);
  EXPECT_TRUE(t) << t.error().message;
  return std::move(t).value();
}

using Ids = std::vector<int32_t>;

TEST(LlamaTokenizerTiny, MergesFollowRankOrder) {
  TinyVocab v;
  const int32_t ab = v.add("ab"), abc = v.add("abc"), bc = v.add("bc"), aa = v.add("aa");
  v.merges = {"a b", "ab c", "b c", "a a"};
  const Tokenizer t = make(v);
  EXPECT_EQ(t.vocab_size(), 260u);
  EXPECT_EQ(t.encode("abc"), (Ids{abc}));            // (a,b) rank 0, then (ab,c) rank 1
  EXPECT_EQ(t.encode("bcab"), (Ids{bc, ab}));        // (a,b) first, then (b,c)
  EXPECT_EQ(t.encode("aaa"), (Ids{aa, 'a'}));        // equal ranks: leftmost pair first
  EXPECT_EQ(t.encode("aaaa"), (Ids{aa, aa}));
  EXPECT_EQ(t.encode("x"), (Ids{'x'}));
  EXPECT_EQ(t.encode(""), Ids{});
  EXPECT_EQ(t.encode("ab ab"), (Ids{ab, ' ', ab}));  // no "Ġ a" merge in this vocabulary
  EXPECT_EQ(t.decode(t.encode("bcab aaa\n")), "bcab aaa\n");

  // The same tokens with the ranks of "a b" and "b c" swapped.
  TinyVocab w;
  const int32_t ab2 = w.add("ab"), abc2 = w.add("abc"), bc2 = w.add("bc");
  w.merges = {"b c", "a b", "ab c", "a bc"};
  const Tokenizer t2 = make(w);
  EXPECT_EQ(t2.encode("abc"), (Ids{abc2}));  // (b,c) rank 0, then (a,bc) rank 3
  EXPECT_EQ(t2.encode("abx"), (Ids{ab2, 'x'}));
  EXPECT_EQ(t2.encode("bc"), (Ids{bc2}));
}

TEST(LlamaTokenizerTiny, ByteLevelAlphabetAndDecode) {
  TinyVocab v;
  const int32_t g_the = v.add("\xC4\xA0the");  // "Ġthe"
  v.add("\xC4\xA0t");
  v.add("th");
  v.add("\xC4\xA0th");
  v.merges = {"\xC4\xA0 t", "t h", "\xC4\xA0t h", "\xC4\xA0th e"};
  const Tokenizer t = make(v);
  EXPECT_EQ(t.encode(" the"), (Ids{g_the}));
  EXPECT_EQ(t.token_text(g_the), "\xC4\xA0the");
  EXPECT_EQ(t.token_piece(g_the), " the");
  EXPECT_EQ(t.token_id("\xC4\xA0the"), g_the);
  EXPECT_EQ(t.token_id("nope"), -1);
  EXPECT_EQ(t.token_text(-1), "");
  EXPECT_EQ(t.token_text(100000), "");
  // Every byte string round-trips, invalid UTF-8 and control bytes included.
  std::string all;
  for (int b = 0; b < 256; ++b) all.push_back(static_cast<char>(b));
  EXPECT_EQ(t.decode(t.encode(all)), all);
  EXPECT_EQ(t.encode(std::string(1, '\n')), (Ids{10}));
  EXPECT_EQ(t.decode(Ids{'h', 'i', -5, 99999, '!'}), "hi!");  // unknown ids skipped
}

TEST(LlamaTokenizerTiny, SpecialTokens) {
  TinyVocab v;
  const int32_t ctl = v.add("<|ctl|>", 3), ctl_long = v.add("<|ctl|>x", 3), usr = v.add("<usr>", 4);
  const Tokenizer t = make(v);
  EXPECT_EQ(t.token_type(ctl), TokenType::control);
  EXPECT_EQ(t.token_type(usr), TokenType::user_defined);
  EXPECT_EQ(t.token_type('a'), TokenType::normal);
  // CONTROL tokens only with parse_special; the longest match wins.
  EXPECT_EQ(t.encode("a<|ctl|>b", true), (Ids{'a', ctl, 'b'}));
  EXPECT_EQ(t.encode("<|ctl|>xy", true), (Ids{ctl_long, 'y'}));
  EXPECT_EQ(t.encode("<|ctl|>", false), (Ids{'<', '|', 'c', 't', 'l', '|', '>'}));
  EXPECT_EQ(t.encode("<|ctl|", true), (Ids{'<', '|', 'c', 't', 'l', '|'}));
  // USER_DEFINED tokens are matched in both modes (llama.cpp's rule).
  EXPECT_EQ(t.encode("x<usr>y", false), (Ids{'x', usr, 'y'}));
  EXPECT_EQ(t.encode("<usr><usr>", true), (Ids{usr, usr}));
  // Special tokens split words: the space before them stays a word of its own.
  EXPECT_EQ(t.encode("a <|ctl|> b", true), (Ids{'a', ' ', ctl, ' ', 'b'}));
  EXPECT_EQ(t.decode(Ids{ctl, 'a', usr}), "<|ctl|>a<usr>");
  EXPECT_EQ(t.bos(), 1);
  EXPECT_EQ(t.eos(), 2);
  EXPECT_FALSE(t.add_bos());
}

TEST(LlamaTokenizerTiny, PreTokenizerGpt2KeepsDigitRuns) {
  TinyVocab v;
  v.pre = "gpt2";
  const int32_t d12 = v.add("12");
  v.merges = {"1 2"};
  const Tokenizer t = make(v);
  EXPECT_EQ(t.encode("12"), (Ids{d12}));
  v.pre = "smollm";
  EXPECT_EQ(make(v).encode("12"), (Ids{'1', '2'}));  // digits split before BPE
}

void expect_tokenizer_error(const TinyVocab& v, Errc code, const std::string& needle, bool with_types = true,
                            int64_t bos = 1) {
  auto f = GgufFile::from_bytes(v.gguf(with_types, bos));
  ASSERT_TRUE(f) << f.error().message;
  auto t = Tokenizer::from_gguf(*f);
  ASSERT_FALSE(t) << "expected an error mentioning " << needle;
  EXPECT_EQ(t.error().code, code) << t.error().message;
  EXPECT_NE(t.error().message.find(needle), std::string::npos) << t.error().message;
}

TEST(LlamaTokenizerTiny, Errors) {
  TinyVocab v;
  v.model = "llama";
  expect_tokenizer_error(v, Errc::unsupported, "'llama'");
  v.model = "gpt2";
  v.pre = "qwen2";
  expect_tokenizer_error(v, Errc::unsupported, "'qwen2'");
  v.pre = "smollm";
  v.merges = {"ab"};
  expect_tokenizer_error(v, Errc::corrupt_data, "merge #0");
  v.merges = {"a "};
  expect_tokenizer_error(v, Errc::corrupt_data, "merge #0");
  v.merges = {};
  expect_tokenizer_error(v, Errc::corrupt_data, "bos_token_id", true, 256);
  v.types.pop_back();
  expect_tokenizer_error(v, Errc::corrupt_data, "token_type");
  v.types.push_back(1);

  auto no_tokens = GgufFile::from_bytes(GgufBuilder().kv_str("tokenizer.ggml.model", "gpt2").build());
  ASSERT_TRUE(no_tokens);
  auto t = Tokenizer::from_gguf(*no_tokens);
  ASSERT_FALSE(t);
  EXPECT_EQ(t.error().code, Errc::corrupt_data);
  auto nothing = GgufFile::from_bytes(GgufBuilder().build());
  ASSERT_TRUE(nothing);
  EXPECT_FALSE(Tokenizer::from_gguf(*nothing));

  // Without token types every token is normal; merges with unknown parts are ignored.
  v.merges = {"q z", "a b"};
  auto f = GgufFile::from_bytes(v.gguf(false));
  ASSERT_TRUE(f);
  auto ok = Tokenizer::from_gguf(*f);
  ASSERT_TRUE(ok) << ok.error().message;
  EXPECT_EQ(ok->token_type(5), TokenType::normal);
}

}  // namespace
