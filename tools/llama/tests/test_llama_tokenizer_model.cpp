// Byte-level BPE tokenizer on the real SmolLM2 vocabulary: ids of tricky strings against an HF
// `tokenizers` reference (tests/data/tokenizer_reference.txt), the head of WikiText-2 test against
// the same reference, and a round trip with a reference checksum over the whole file (the
// repository's ../shared/data/wikitext-2-raw/wiki.test.raw). Skips, saying why, without the model.
#include "gguf_builder.hpp"
#include "tokenizer.hpp"

#include <gtest/gtest.h>

#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <sstream>
#include <string>
#include <vector>

namespace {

using kvpack::llama::GgufFile;
using kvpack::llama::TokenType;
using kvpack::llama::Tokenizer;
using Ids = std::vector<int32_t>;
namespace uc = kvpack::llama::unicode;

// ---- the SmolLM2 vocabulary ----

std::string data_dir() { return KVPACK_LLAMA_TEST_DATA_DIR; }

std::string wikitext_path() {
  if (const char* p = std::getenv("KVPACK_WIKITEXT_PATH"); p != nullptr && *p != '\0') {
    return std::filesystem::exists(p) ? std::string(p) : std::string();
  }
  const std::filesystem::path root = KVPACK_SOURCE_DIR;  // the repository's copy first (data/)
  for (const auto& cand : {root, root / ".." / "shared", root / ".." / ".." / "shared"}) {
    const auto p = cand / "data" / "wikitext-2-raw" / "wiki.test.raw";
    if (std::filesystem::exists(p)) return p.string();
  }
  return {};
}

std::string read_binary(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  std::ostringstream ss;
  ss << in.rdbuf();
  return ss.str();
}

std::string unhex(std::string_view h) {
  std::string out;
  for (size_t i = 0; i + 1 < h.size(); i += 2) out.push_back(static_cast<char>(std::stoi(std::string(h.substr(i, 2)), nullptr, 16)));
  return out;
}

struct ReferenceCase {
  bool parse_special = false;
  std::string text;
  Ids ids;
};
struct Reference {
  std::vector<ReferenceCase> cases;
  size_t wiki_head_bytes = 0;
  Ids wiki_head_ids;
  size_t wiki_full_bytes = 0;
  size_t wiki_full_tokens = 0;
  uint64_t wiki_full_fnv = 0;
};

Reference load_reference() {
  Reference r;
  std::ifstream in(data_dir() + "/tokenizer_reference.txt");
  EXPECT_TRUE(in) << "missing " << data_dir() << "/tokenizer_reference.txt";
  std::string line;
  while (std::getline(in, line)) {
    if (line.empty() || line[0] == '#') continue;
    std::istringstream ls(line);
    std::string kind;
    ls >> kind;
    const auto read_ids = [&](Ids& ids) {
      std::string colon;
      ls >> colon;
      EXPECT_EQ(colon, ":");
      int32_t id = 0;
      while (ls >> id) ids.push_back(id);
    };
    if (kind == "case") {
      ReferenceCase c;
      int ps = 0;
      std::string hex;
      ls >> ps >> hex;
      c.parse_special = ps != 0;
      c.text = unhex(std::string_view(hex).substr(1));
      read_ids(c.ids);
      r.cases.push_back(std::move(c));
    } else if (kind == "wikitext") {
      std::string sha;
      ls >> r.wiki_head_bytes >> sha;
      read_ids(r.wiki_head_ids);
    } else if (kind == "wikitext_full") {
      std::string fnv;
      ls >> r.wiki_full_bytes >> r.wiki_full_tokens >> fnv;
      r.wiki_full_fnv = std::stoull(fnv, nullptr, 16);
    }
  }
  return r;
}

uint64_t fnv1a(const Ids& ids) {
  uint64_t h = 0xCBF29CE484222325ull;
  for (const int32_t id : ids) {
    const auto u = static_cast<uint32_t>(id);
    for (int k = 0; k < 4; ++k) h = (h ^ ((u >> (8 * k)) & 0xFF)) * 0x100000001B3ull;
  }
  return h;
}

class LlamaTokenizerModel : public ::testing::Test {
 protected:
  static void SetUpTestSuite() {
    const std::string path = kvpack::llama::test::model_path();
    if (!std::filesystem::exists(path)) return;
    auto f = GgufFile::open(path);
    ASSERT_TRUE(f) << f.error().message;
    auto t = Tokenizer::from_gguf(*f);
    ASSERT_TRUE(t) << t.error().message;
    tok_ = new Tokenizer(std::move(t).value());
  }
  static void TearDownTestSuite() {
    delete tok_;
    tok_ = nullptr;
  }
  void SetUp() override {
    if (tok_ == nullptr) {
      GTEST_SKIP() << "model file not found at " << kvpack::llama::test::model_path()
                   << " (set KVPACK_MODEL_PATH or run tools/fetch_model.sh)";
    }
  }
  static inline Tokenizer* tok_ = nullptr;
};

TEST_F(LlamaTokenizerModel, Vocabulary) {
  const Tokenizer& t = *tok_;
  EXPECT_EQ(t.vocab_size(), 49152u);
  EXPECT_EQ(t.bos(), 1);
  EXPECT_EQ(t.eos(), 2);
  EXPECT_FALSE(t.add_bos());
  EXPECT_EQ(t.pre_tokenizer(), "smollm");
  EXPECT_EQ(t.token_text(0), "<|endoftext|>");
  EXPECT_EQ(t.token_text(1), "<|im_start|>");
  EXPECT_EQ(t.token_text(2), "<|im_end|>");
  EXPECT_EQ(t.token_type(1), TokenType::control);
  EXPECT_EQ(t.token_type(17), TokenType::normal);
  EXPECT_EQ(t.token_text(17), "!");
  EXPECT_EQ(t.decode(t.encode("Hello world")), "Hello world");
  EXPECT_EQ(t.encode("<|im_start|>", true), (Ids{1}));
}

TEST_F(LlamaTokenizerModel, MatchesReferenceOnTrickyStrings) {
  const Reference ref = load_reference();
  ASSERT_GT(ref.cases.size(), 50u);
  for (const auto& c : ref.cases) {
    SCOPED_TRACE("text '" + c.text + "' parse_special=" + std::to_string(c.parse_special));
    EXPECT_EQ(tok_->encode(c.text, c.parse_special), c.ids);
    // Bytes without a byte-level token (SmolLM2 lacks 21, e.g. 0x04 and 0x1D) are dropped.
    bool drops_bytes = false;
    for (const char ch : c.text) {
      std::string sym;
      uc::append_utf8(sym, uc::byte_to_codepoint_table()[static_cast<uint8_t>(ch)]);
      drops_bytes = drops_bytes || tok_->token_id(sym) < 0;
    }
    if (!drops_bytes) {
      EXPECT_EQ(tok_->decode(c.ids), c.text);
    }
  }
}

class LlamaTokenizerWikiText : public LlamaTokenizerModel {
 protected:
  void SetUp() override {
    LlamaTokenizerModel::SetUp();
    if (IsSkipped()) return;
    path_ = wikitext_path();
    if (path_.empty()) {
      GTEST_SKIP() << "wiki.test.raw not found (set KVPACK_WIKITEXT_PATH or place it at "
                      "<project>/../shared/data/wikitext-2-raw/wiki.test.raw)";
    }
    text_ = read_binary(path_);
  }
  std::string path_;
  std::string text_;
};

TEST_F(LlamaTokenizerWikiText, HeadMatchesReference) {
  const Reference ref = load_reference();
  ASSERT_GT(ref.wiki_head_bytes, 10000u);
  ASSERT_GE(text_.size(), ref.wiki_head_bytes);
  const Ids ids = tok_->encode(std::string_view(text_).substr(0, ref.wiki_head_bytes));
  ASSERT_EQ(ids.size(), ref.wiki_head_ids.size());
  for (size_t i = 0; i < ids.size(); ++i) ASSERT_EQ(ids[i], ref.wiki_head_ids[i]) << "token " << i;
}

TEST_F(LlamaTokenizerWikiText, WholeFileRoundTripAndReferenceChecksum) {
  const Reference ref = load_reference();
  ASSERT_EQ(text_.size(), ref.wiki_full_bytes) << "wiki.test.raw must be byte-exact (CRLF kept)";
  const auto t0 = std::chrono::steady_clock::now();
  const Ids ids = tok_->encode(text_);
  const auto t1 = std::chrono::steady_clock::now();
  const std::string back = tok_->decode(ids);
  const double secs = std::chrono::duration<double>(t1 - t0).count();
  std::printf("[          ] encode of %zu bytes: %zu tokens in %.3f s\n", text_.size(), ids.size(), secs);
  RecordProperty("encode_seconds", std::to_string(secs));
  RecordProperty("tokens", std::to_string(ids.size()));
  EXPECT_EQ(back, text_);
  EXPECT_EQ(ids.size(), ref.wiki_full_tokens);
  EXPECT_EQ(fnv1a(ids), ref.wiki_full_fnv);
  EXPECT_LT(secs, 20.0);  // a few seconds on a slow debug build; ~0.15 s optimized
}

}  // namespace
