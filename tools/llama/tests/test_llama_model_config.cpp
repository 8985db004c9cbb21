// Issue 23 item 8: the model loader's hyper-parameter checks (read_model_config, called first by
// Model::from_gguf). Small llama GGUF files are built in memory; each broken variant must be
// refused with an error naming the key, both values and the file. The loader used to accept a
// llama.vocab_size or llama.rope.dimension_count that disagreed with the tensors (it read neither).
#include "gguf.hpp"
#include "gguf_builder.hpp"
#include "model_config.hpp"

#include <gtest/gtest.h>

#include <cstdint>
#include <filesystem>
#include <functional>
#include <optional>
#include <string>
#include <vector>

namespace {

using kvpack::Errc;
using kvpack::llama::GgmlType;
using kvpack::llama::GgufFile;
using kvpack::llama::read_model_config;
using kvpack::llama::test::ByteWriter;
using kvpack::llama::test::GgufBuilder;

// A consistent tiny llama: 2 blocks, d_model 8, 2 query heads and 1 KV head of head_dim 4, ffn 12,
// vocab 10. Every field can be changed before build().
struct Tiny {
  uint32_t layers = 2, d = 8, heads = 2, kv_heads = 1, ffn = 12, ctx = 64;
  int64_t vocab_rows = 10;
  std::optional<uint32_t> vocab_key = 10, rope_dims = 4, key_length, tokens;
  std::optional<float> rms_eps;
  int tensor_blocks = 2;  // blocks of tensors written
  std::function<void(std::vector<uint64_t>&, const std::string&)> edit_dims = [](auto&, const auto&) {};

  [[nodiscard]] std::vector<std::byte> build() const {
    GgufBuilder b;
    b.kv_str("general.architecture", "llama")
        .kv_u32("llama.block_count", layers)
        .kv_u32("llama.embedding_length", d)
        .kv_u32("llama.attention.head_count", heads)
        .kv_u32("llama.attention.head_count_kv", kv_heads)
        .kv_u32("llama.feed_forward_length", ffn)
        .kv_u32("llama.context_length", ctx);
    if (vocab_key) b.kv_u32("llama.vocab_size", *vocab_key);
    if (rope_dims) b.kv_u32("llama.rope.dimension_count", *rope_dims);
    if (key_length) b.kv_u32("llama.attention.key_length", *key_length);
    if (rms_eps) b.kv("llama.attention.layer_norm_rms_epsilon", [e = *rms_eps](ByteWriter& w) { w.u32(6); w.f32(e); });
    if (tokens)
      b.kv("tokenizer.ggml.tokens", [n = *tokens](ByteWriter& w) {
        w.u32(9); w.u32(8); w.u64(n);
        for (uint32_t i = 0; i < n; ++i) w.str("t" + std::to_string(i));
      });
    auto t = [&](const std::string& name, std::vector<uint64_t> dims) {
      edit_dims(dims, name);
      uint64_t n = 1;
      for (uint64_t x : dims) n *= x;
      b.tensor(name, dims, GgmlType::F32, std::vector<std::byte>(n * 4));
    };
    const uint64_t hd = d / heads, qd = heads * hd, kvd = kv_heads * hd;
    t("token_embd.weight", {d, static_cast<uint64_t>(vocab_rows)});
    t("output_norm.weight", {d});
    for (int l = 0; l < tensor_blocks; ++l) {
      const std::string p = "blk." + std::to_string(l) + ".";
      t(p + "attn_norm.weight", {d});
      t(p + "ffn_norm.weight", {d});
      t(p + "attn_q.weight", {d, qd});
      t(p + "attn_k.weight", {d, kvd});
      t(p + "attn_v.weight", {d, kvd});
      t(p + "attn_output.weight", {qd, d});
      t(p + "ffn_gate.weight", {d, ffn});
      t(p + "ffn_up.weight", {d, ffn});
      t(p + "ffn_down.weight", {ffn, d});
    }
    return b.build();
  }
};

kvpack::Result<kvpack::llama::ModelConfig> read(const Tiny& m) {
  auto f = GgufFile::from_bytes(m.build());
  EXPECT_TRUE(f) << f.error().message;
  return read_model_config(*f, "tiny.gguf");
}

// The error names the file and every fragment given.
void expect_error(const Tiny& m, Errc code, const std::vector<std::string>& fragments) {
  auto r = read(m);
  ASSERT_FALSE(r) << "accepted";
  EXPECT_EQ(r.error().code, code) << r.error().message;
  EXPECT_NE(r.error().message.find("tiny.gguf"), std::string::npos) << r.error().message;
  for (const auto& s : fragments) EXPECT_NE(r.error().message.find(s), std::string::npos) << "no '" << s << "' in: " << r.error().message;
}

TEST(LlamaModelConfig, ConsistentFileIsRead) {
  Tiny m;
  m.tokens = 10;
  m.key_length = 4;
  auto r = read(m);
  ASSERT_TRUE(r) << r.error().message;
  EXPECT_EQ(r->layers, 2);
  EXPECT_EQ(r->head_dim, 4);
  EXPECT_EQ(r->vocab, 10);
  EXPECT_EQ(r->rope_base, 10000.f);
}

TEST(LlamaModelConfig, VocabSizeMustMatchEmbeddingRows) {
  Tiny m;
  m.vocab_key = 12;
  expect_error(m, Errc::corrupt_data, {"llama.vocab_size = 12", "10 rows of token_embd.weight"});
  m.vocab_key.reset();
  m.tokens = 9;
  expect_error(m, Errc::corrupt_data, {"tokenizer.ggml.tokens holds 9", "10 rows"});
}

TEST(LlamaModelConfig, RopeDimensionCountMustMatchHeadDim) {
  Tiny m;
  m.rope_dims = 2;  // partial RoPE: not implemented, said so
  expect_error(m, Errc::unsupported, {"llama.rope.dimension_count = 2", "head_dim", "= 4", "partial RoPE"});
  m.rope_dims = 8;
  expect_error(m, Errc::corrupt_data, {"llama.rope.dimension_count = 8", "= 4"});
  m.rope_dims = 4;
  m.key_length = 6;
  expect_error(m, Errc::corrupt_data, {"llama.attention.key_length = 6", "= 4"});
}

TEST(LlamaModelConfig, TensorShapesMustFollowTheKeys) {
  Tiny m;
  m.edit_dims = [](std::vector<uint64_t>& d, const std::string& n) {
    if (n == "blk.1.attn_k.weight") d[1] = 8;  // 2 KV heads' worth, but head_count_kv = 1
  };
  expect_error(m, Errc::corrupt_data, {"blk.1.attn_k.weight", "[8, 8]", "[8, 4]", "llama.attention.head_count_kv = 1"});
  m.edit_dims = [](std::vector<uint64_t>& d, const std::string& n) {
    if (n == "blk.0.ffn_down.weight") d[0] = 16;
  };
  expect_error(m, Errc::corrupt_data, {"blk.0.ffn_down.weight", "[16, 8]", "llama.feed_forward_length = 12"});
  m.edit_dims = [](std::vector<uint64_t>& d, const std::string& n) {
    if (n == "output_norm.weight") d[0] = 7;
  };
  expect_error(m, Errc::corrupt_data, {"output_norm.weight", "llama.embedding_length = 8"});
}

TEST(LlamaModelConfig, BlockCountMustMatchTheTensors) {
  Tiny m;
  m.tensor_blocks = 3;  // a third block the runner would silently ignore
  expect_error(m, Errc::corrupt_data, {"llama.block_count = 2", "blk.2."});
  m.tensor_blocks = 1;
  expect_error(m, Errc::corrupt_data, {"blk.1.attn_norm.weight is missing"});
}

TEST(LlamaModelConfig, ScalarsMustBeUsable) {
  Tiny m;
  m.heads = 3;
  expect_error(m, Errc::corrupt_data, {"llama.embedding_length = 8", "llama.attention.head_count = 3"});
  m = Tiny{};
  m.rms_eps = -1.f;
  expect_error(m, Errc::corrupt_data, {"layer_norm_rms_epsilon = -1"});
  m = Tiny{};
  m.layers = 0;
  expect_error(m, Errc::corrupt_data, {"llama.block_count = 0"});
}

TEST(LlamaModelConfig, RealModelPasses) {
  const std::string path = kvpack::llama::test::model_path();
  if (!std::filesystem::exists(path)) GTEST_SKIP() << "model file not found at " << path;
  auto f = GgufFile::open(path);
  ASSERT_TRUE(f) << f.error().message;
  auto r = read_model_config(*f, path);
  ASSERT_TRUE(r) << r.error().message;
  EXPECT_EQ(r->layers, 30);
  EXPECT_EQ(r->head_dim, 64);
  EXPECT_EQ(r->vocab, 49152);
}

}  // namespace
