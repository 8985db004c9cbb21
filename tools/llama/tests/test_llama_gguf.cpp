// GGUF reader: metadata of every type, tensor layout, alignment, error handling on corrupt files,
// a short mutation fuzz, and (when present) the real SmolLM2 model file.
#include "gguf.hpp"
#include "gguf_builder.hpp"

#include <gtest/gtest.h>

#include <cstdio>
#include <filesystem>
#include <fstream>
#include <limits>
#include <map>
#include <random>
#include <string>
#include <vector>

namespace {

using kvpack::Errc;
using kvpack::llama::GgmlType;
using kvpack::llama::GgufFile;
using kvpack::llama::GgufValueType;
using kvpack::llama::test::ByteWriter;
using kvpack::llama::test::GgufBuilder;
using kvpack::llama::test::iota_bytes;

/// A builder with one key of every metadata type, a nested array, and three tensors.
GgufBuilder full_builder(uint32_t version = 3) {
  GgufBuilder b(version);
  b.kv("u8", [](ByteWriter& w) { w.u32(0); w.u8(200); })
      .kv("i8", [](ByteWriter& w) { w.u32(1); w.u8(0xF6); })  // -10
      .kv("u16", [](ByteWriter& w) { w.u32(2); w.u16(65000); })
      .kv("i16", [](ByteWriter& w) { w.u32(3); w.u16(0x8000); })  // -32768
      .kv("u32", [](ByteWriter& w) { w.u32(4); w.u32(4000000000u); })
      .kv("i32", [](ByteWriter& w) { w.u32(5); w.u32(0xFFFFFFFFu); })  // -1
      .kv("f32", [](ByteWriter& w) { w.u32(6); w.f32(1.5f); })
      .kv("bool", [](ByteWriter& w) { w.u32(7); w.u8(1); })
      .kv("str", [](ByteWriter& w) { w.u32(8); w.str("h\xC3\xA9llo"); })
      .kv("u64", [](ByteWriter& w) { w.u32(10); w.u64(std::numeric_limits<uint64_t>::max()); })
      .kv("i64", [](ByteWriter& w) { w.u32(11); w.u64(static_cast<uint64_t>(int64_t{-5000000000})); })
      .kv("f64", [](ByteWriter& w) { w.u32(12); w.f64(-2.25); })
      .kv("arr.str", [](ByteWriter& w) { w.u32(9); w.u32(8); w.u64(3); w.str("a"); w.str(""); w.str("c c"); })
      .kv("arr.i32", [](ByteWriter& w) { w.u32(9); w.u32(5); w.u64(3); w.u32(7); w.u32(0xFFFFFFFEu); w.u32(9); })
      .kv("arr.u8", [](ByteWriter& w) { w.u32(9); w.u32(0); w.u64(2); w.u8(1); w.u8(255); })
      .kv("arr.f32", [](ByteWriter& w) { w.u32(9); w.u32(6); w.u64(2); w.f32(0.5f); w.f32(-4.0f); })
      .kv("arr.empty", [](ByteWriter& w) { w.u32(9); w.u32(4); w.u64(0); })
      .kv("arr.nested", [](ByteWriter& w) {  // [[1, 2], [3]] of uint16
        w.u32(9); w.u32(9); w.u64(2);
        w.u32(2); w.u64(2); w.u16(1); w.u16(2);
        w.u32(2); w.u64(1); w.u16(3);
      })
      .kv_str("general.architecture", "llama");
  b.tensor("a.f32", {3, 2}, GgmlType::F32, iota_bytes(24))
      .tensor("b.q4_1", {64}, GgmlType::Q4_1, iota_bytes(40, 100))
      .tensor("c.f16", {1, 1, 1, 5}, GgmlType::F16, iota_bytes(10, 7));
  return b;
}

TEST(LlamaGguf, ParsesEveryMetadataTypeV3) {
  auto f = GgufFile::from_bytes(full_builder().build());
  ASSERT_TRUE(f) << f.error().message;
  EXPECT_EQ(f->version(), 3u);
  EXPECT_EQ(f->alignment(), 32u);
  EXPECT_EQ(f->get_int("u8"), 200);
  EXPECT_EQ(f->get_int("i8"), -10);
  EXPECT_EQ(f->get_int("u16"), 65000);
  EXPECT_EQ(f->get_int("i16"), -32768);
  EXPECT_EQ(f->get_int("u32"), 4000000000LL);
  EXPECT_EQ(f->get_int("i32"), -1);
  EXPECT_EQ(f->get_int("i64"), -5000000000LL);
  EXPECT_EQ(f->get_int("u64"), std::nullopt);  // above INT64_MAX
  ASSERT_NE(f->get("u64"), nullptr);
  EXPECT_EQ(std::get<uint64_t>(f->get("u64")->value), std::numeric_limits<uint64_t>::max());
  EXPECT_EQ(f->get_float("f32"), 1.5);
  EXPECT_EQ(f->get_float("f64"), -2.25);
  EXPECT_EQ(f->get_bool("bool"), true);
  EXPECT_EQ(f->get_string("str"), "h\xC3\xA9llo");
  EXPECT_EQ(f->get_string("general.architecture"), "llama");
  EXPECT_EQ(f->get_string_array("arr.str"), (std::vector<std::string>{"a", "", "c c"}));
  EXPECT_EQ(f->get_int_array("arr.i32"), (std::vector<int64_t>{7, -2, 9}));
  EXPECT_EQ(f->get_int_array("arr.u8"), (std::vector<int64_t>{1, 255}));
  EXPECT_EQ(f->get_float_array("arr.f32"), (std::vector<double>{0.5, -4.0}));
  EXPECT_EQ(f->get_int_array("arr.empty"), (std::vector<int64_t>{}));

  const auto* nested = f->get("arr.nested");
  ASSERT_NE(nested, nullptr);
  EXPECT_EQ(nested->type, GgufValueType::array);
  EXPECT_EQ(nested->elem_type, GgufValueType::array);
  const auto& outer = std::get<std::vector<kvpack::llama::GgufValue>>(nested->value);
  ASSERT_EQ(outer.size(), 2u);
  const auto& inner0 = std::get<std::vector<kvpack::llama::GgufValue>>(outer[0].value);
  ASSERT_EQ(inner0.size(), 2u);
  EXPECT_EQ(inner0[1].as_int(), 2);
  EXPECT_EQ(std::get<std::vector<kvpack::llama::GgufValue>>(outer[1].value)[0].as_int(), 3);
  EXPECT_EQ(f->get_int_array("arr.nested"), std::nullopt);

  // Wrong-type and absent lookups.
  EXPECT_EQ(f->get_int("f32"), std::nullopt);
  EXPECT_EQ(f->get_float("u32"), std::nullopt);
  EXPECT_EQ(f->get_bool("u8"), std::nullopt);
  EXPECT_EQ(f->get_string("arr.str"), std::nullopt);
  EXPECT_EQ(f->get_string_array("arr.i32"), std::nullopt);
  EXPECT_EQ(f->get_float_array("arr.i32"), std::nullopt);
  EXPECT_EQ(f->get_int("missing"), std::nullopt);
  EXPECT_EQ(f->get_string_array("missing"), std::nullopt);
  EXPECT_EQ(f->metadata().size(), 19u);
  EXPECT_EQ(f->metadata()[0].key, "u8");
}

TEST(LlamaGguf, TensorsLayoutAndData) {
  auto b = full_builder(2);
  auto f = GgufFile::from_bytes(b.build());
  ASSERT_TRUE(f) << f.error().message;
  EXPECT_EQ(f->version(), 2u);
  ASSERT_EQ(f->tensors().size(), 3u);
  EXPECT_EQ(f->tensor("nope"), nullptr);

  const auto* a = f->tensor("a.f32");
  ASSERT_NE(a, nullptr);
  EXPECT_EQ(a->dims, (std::vector<int64_t>{3, 2}));
  EXPECT_EQ(a->type, GgmlType::F32);
  EXPECT_EQ(a->elements(), 6);
  EXPECT_EQ(a->offset, 0u);
  ASSERT_EQ(a->data.size(), 24u);
  EXPECT_EQ(a->data[5], std::byte{5});
  EXPECT_EQ(f->data_offset() % 32, 0u);

  const auto* q = f->tensor("b.q4_1");
  ASSERT_NE(q, nullptr);
  EXPECT_EQ(q->elements(), 64);
  EXPECT_EQ(q->offset, 32u);  // 24 bytes of a.f32 padded to 32
  ASSERT_EQ(q->data.size(), 40u);
  EXPECT_EQ(q->data[0], std::byte{100});
  EXPECT_EQ(q->data[39], std::byte{139});
  EXPECT_EQ(q->data.data(), a->data.data() + 32);

  const auto* c = f->tensor("c.f16");
  ASSERT_NE(c, nullptr);
  EXPECT_EQ(c->dims, (std::vector<int64_t>{1, 1, 1, 5}));
  EXPECT_EQ(c->elements(), 5);
  ASSERT_EQ(c->data.size(), 10u);
  EXPECT_EQ(c->data[9], std::byte{16});
  EXPECT_EQ(&f->tensors()[2], c);
}

TEST(LlamaGguf, CustomAlignment) {
  GgufBuilder b;
  b.alignment(64).tensor("x", {4}, GgmlType::F32, iota_bytes(16)).tensor("y", {8}, GgmlType::F32, iota_bytes(32, 50));
  auto f = GgufFile::from_bytes(b.build());
  ASSERT_TRUE(f) << f.error().message;
  EXPECT_EQ(f->alignment(), 64u);
  EXPECT_EQ(f->data_offset() % 64, 0u);
  EXPECT_EQ(f->tensor("y")->offset, 64u);
  EXPECT_EQ(f->tensor("y")->data[0], std::byte{50});
}

TEST(LlamaGguf, MoveKeepsTensorDataValid) {
  auto r = GgufFile::from_bytes(full_builder().build());
  ASSERT_TRUE(r);
  GgufFile f = std::move(r).value();
  GgufFile g = std::move(f);
  const auto* q = g.tensor("b.q4_1");
  ASSERT_NE(q, nullptr);
  EXPECT_EQ(q->data[1], std::byte{101});
  EXPECT_EQ(g.get_string("str"), "h\xC3\xA9llo");
}

// ---- files on disk ----

class TempFile {
 public:
  explicit TempFile(const std::vector<std::byte>& bytes) {
    path_ = (std::filesystem::temp_directory_path() /
             ("kvpack_gguf_test_" + std::to_string(::getpid()) + "_" + std::to_string(counter_++) + ".gguf"))
                .string();
    std::ofstream out(path_, std::ios::binary);
    out.write(reinterpret_cast<const char*>(bytes.data()), static_cast<std::streamsize>(bytes.size()));
  }
  ~TempFile() { std::remove(path_.c_str()); }
  TempFile(const TempFile&) = delete;
  TempFile& operator=(const TempFile&) = delete;
  [[nodiscard]] const std::string& path() const { return path_; }

 private:
  static inline int counter_ = 0;
  std::string path_;
};

TEST(LlamaGguf, OpenFromDiskMemoryMaps) {
  TempFile tmp(full_builder().build());
  auto f = GgufFile::open(tmp.path());
  ASSERT_TRUE(f) << f.error().message;
  EXPECT_EQ(f->tensors().size(), 3u);
  EXPECT_EQ(f->tensor("b.q4_1")->data[2], std::byte{102});
}

TEST(LlamaGguf, OpenErrors) {
  auto missing = GgufFile::open("/nonexistent/dir/model.gguf");
  ASSERT_FALSE(missing);
  EXPECT_EQ(missing.error().code, Errc::io_error);
  EXPECT_NE(missing.error().message.find("/nonexistent/dir/model.gguf"), std::string::npos);

  auto dir = GgufFile::open(std::filesystem::temp_directory_path().string());
  ASSERT_FALSE(dir);
  EXPECT_EQ(dir.error().code, Errc::io_error);

  TempFile empty(std::vector<std::byte>{});
  auto e = GgufFile::open(empty.path());
  ASSERT_FALSE(e);
  EXPECT_EQ(e.error().code, Errc::corrupt_data);
  EXPECT_NE(e.error().message.find(empty.path()), std::string::npos);
}

// ---- corrupt and unsupported files ----

void expect_error(std::vector<std::byte> bytes, Errc code, const std::string& needle) {
  auto f = GgufFile::from_bytes(std::move(bytes));
  ASSERT_FALSE(f) << "expected an error mentioning '" << needle << "'";
  EXPECT_EQ(f.error().code, code) << f.error().message;
  EXPECT_NE(f.error().message.find(needle), std::string::npos) << f.error().message;
}

void put_u32(std::vector<std::byte>& b, size_t pos, uint32_t v) {
  for (int i = 0; i < 4; ++i) b[pos + static_cast<size_t>(i)] = static_cast<std::byte>(v >> (8 * i));
}
void put_u64(std::vector<std::byte>& b, size_t pos, uint64_t v) {
  for (int i = 0; i < 8; ++i) b[pos + static_cast<size_t>(i)] = static_cast<std::byte>(v >> (8 * i));
}

TEST(LlamaGgufCorrupt, HeaderErrors) {
  auto good = full_builder().build();
  auto bad_magic = good;
  bad_magic[0] = std::byte{'X'};
  expect_error(bad_magic, Errc::corrupt_data, "magic");

  auto v1 = good;
  put_u32(v1, 4, 1);
  expect_error(v1, Errc::unsupported, "version 1");
  auto v4 = good;
  put_u32(v4, 4, 4);
  expect_error(v4, Errc::unsupported, "version 4");
  auto big_endian = good;
  put_u32(big_endian, 4, 0x03000000u);
  expect_error(big_endian, Errc::unsupported, "big-endian");

  auto many_tensors = good;
  put_u64(many_tensors, 8, uint64_t{1} << 60);
  expect_error(many_tensors, Errc::corrupt_data, "tensor count");
  auto many_kv = good;
  put_u64(many_kv, 16, ~uint64_t{0});
  expect_error(many_kv, Errc::corrupt_data, "key/value count");

  expect_error(std::vector<std::byte>(good.begin(), good.begin() + 3), Errc::corrupt_data, "magic");
  expect_error(std::vector<std::byte>(good.begin(), good.begin() + 10), Errc::corrupt_data, "header");
}

TEST(LlamaGgufCorrupt, EveryTruncationFails) {
  const auto good = full_builder().build();
  // The last tensor's data ends before the final padding; cutting inside the padding is harmless.
  auto ok = GgufFile::from_bytes(good);
  ASSERT_TRUE(ok);
  const auto* last = ok->tensor("c.f16");
  const size_t end_of_data = static_cast<size_t>(ok->data_offset() + last->offset + last->data.size());
  for (size_t n = 0; n < end_of_data; ++n) {
    auto f = GgufFile::from_bytes(std::vector<std::byte>(good.begin(), good.begin() + static_cast<std::ptrdiff_t>(n)));
    ASSERT_FALSE(f) << "truncated to " << n << " bytes";
    EXPECT_EQ(f.error().code, Errc::corrupt_data) << n << ": " << f.error().message;
  }
  EXPECT_TRUE(GgufFile::from_bytes(std::vector<std::byte>(good.begin(), good.begin() + static_cast<std::ptrdiff_t>(end_of_data))));
}

TEST(LlamaGgufCorrupt, MetadataErrors) {
  expect_error(GgufBuilder().kv("s", [](ByteWriter& w) { w.u32(8); w.u64(uint64_t{1} << 62); }).build(),
               Errc::corrupt_data, "string length");
  expect_error(GgufBuilder().kv("a", [](ByteWriter& w) { w.u32(9); w.u32(4); w.u64(uint64_t{1} << 61); }).build(),
               Errc::corrupt_data, "array count");
  expect_error(GgufBuilder().kv("a", [](ByteWriter& w) { w.u32(9); w.u32(8); w.u64(~uint64_t{0}); }).build(),
               Errc::corrupt_data, "array count");
  expect_error(GgufBuilder().kv("t", [](ByteWriter& w) { w.u32(13); w.u32(0); }).build(), Errc::unsupported,
               "unknown value type 13");
  expect_error(GgufBuilder().kv("a", [](ByteWriter& w) { w.u32(9); w.u32(99); w.u64(0); }).build(),
               Errc::unsupported, "element type 99");
  expect_error(GgufBuilder().kv("b", [](ByteWriter& w) { w.u32(7); w.u8(2); }).build(), Errc::corrupt_data,
               "neither 0 nor 1");
  expect_error(GgufBuilder().kv_u32("k", 1).kv_u32("k", 2).build(), Errc::corrupt_data, "duplicate metadata 'k'");
  expect_error(GgufBuilder().kv_u32("general.alignment", 24).build(), Errc::corrupt_data, "general.alignment");
  expect_error(GgufBuilder().kv_u32("general.alignment", 0).build(), Errc::corrupt_data, "general.alignment");
  expect_error(GgufBuilder().kv_str("general.alignment", "32").build(), Errc::corrupt_data, "general.alignment");
  // Arrays nested deeper than the limit.
  expect_error(GgufBuilder()
                   .kv("deep",
                       [](ByteWriter& w) {
                         w.u32(9);
                         for (int i = 0; i < GgufFile::kMaxArrayDepth + 1; ++i) { w.u32(9); w.u64(1); }
                         w.u32(4); w.u64(0);
                       })
                   .build(),
               Errc::corrupt_data, "nested deeper");
}

TEST(LlamaGgufCorrupt, TensorInfoErrors) {
  expect_error(GgufBuilder().tensor("t", {1, 1, 1, 1, 1}, GgmlType::F32, iota_bytes(4)).build(), Errc::corrupt_data,
               "5 dimensions");
  expect_error(GgufBuilder().tensor("t", {}, GgmlType::F32, {}).build(), Errc::corrupt_data, "0 dimensions");
  expect_error(GgufBuilder().tensor("t", {uint64_t{1} << 32, uint64_t{1} << 32}, GgmlType::F32, {}).build(),
               Errc::corrupt_data, "overflows");
  expect_error(GgufBuilder().tensor("t", {~uint64_t{0}}, GgmlType::F32, {}).build(), Errc::corrupt_data,
               "too large");
  // Elements fit int64 but the byte size does not.
  expect_error(GgufBuilder().tensor("t", {uint64_t{1} << 62}, GgmlType::F32, {}).build(), Errc::corrupt_data,
               "byte size overflows");
  expect_error(GgufBuilder().tensor("t", {33}, GgmlType::Q4_0, iota_bytes(18)).build(), Errc::corrupt_data,
               "not a multiple of the Q4_0 block size 32");
  expect_error(GgufBuilder().tensor("t", {4}, static_cast<GgmlType>(4), iota_bytes(16)).build(), Errc::unsupported,
               "unknown ggml type 4");
  expect_error(GgufBuilder().tensor("t", {4}, static_cast<GgmlType>(1000), iota_bytes(16)).build(),
               Errc::unsupported, "unknown ggml type 1000");
  expect_error(GgufBuilder()
                   .tensor("t", {4}, GgmlType::F32, iota_bytes(16))
                   .tensor("t", {4}, GgmlType::F32, iota_bytes(16))
                   .build(),
               Errc::corrupt_data, "duplicate tensor 't'");
  // Data beyond the end of the file: declare 8 values but store only 4.
  expect_error(GgufBuilder().tensor("t", {64}, GgmlType::F32, iota_bytes(16)).build(), Errc::corrupt_data,
               "beyond the end");

  GgufBuilder b;
  b.tensor("t", {4}, GgmlType::F32, iota_bytes(16)).tensor("u", {4}, GgmlType::F32, iota_bytes(16));
  auto bytes = b.build();
  auto misaligned = bytes;
  put_u64(misaligned, b.offset_field_positions[1], 33);
  expect_error(misaligned, Errc::corrupt_data, "not a multiple of the alignment");
  auto far = bytes;
  put_u64(far, b.offset_field_positions[1], ~uint64_t{0} - 31);  // aligned, would overflow an addition
  expect_error(far, Errc::corrupt_data, "beyond the end");
}

// ---- fuzz: mutations and truncations of a valid image never crash ----

TEST(LlamaGgufFuzz, RandomMutationsNeverCrash) {
  const auto good = full_builder().build();
  std::mt19937_64 rng(12345);
  int parsed = 0, rejected = 0;
  for (int iter = 0; iter < 5000; ++iter) {
    auto b = good;
    const int edits = 1 + static_cast<int>(rng() % 8);
    for (int e = 0; e < edits; ++e) {
      const size_t pos = rng() % b.size();
      switch (rng() % 4) {
        case 0: b[pos] = static_cast<std::byte>(rng()); break;                       // random byte
        case 1: b[pos] ^= static_cast<std::byte>(1u << (rng() % 8)); break;          // bit flip
        case 2: b[pos] = static_cast<std::byte>((rng() % 2) != 0 ? 0xFF : 0x00); break;  // extremes
        default: b.resize(pos); break;                                               // truncate
      }
      if (b.empty()) break;
    }
    auto f = GgufFile::from_bytes(std::move(b));
    if (f) {
      ++parsed;
      // Touch everything a consumer would: all tensor bytes and all metadata.
      for (const auto& t : f->tensors()) {
        unsigned sum = 0;
        for (const std::byte x : t.data) sum += static_cast<unsigned>(x);
        (void)sum;
        EXPECT_GE(t.elements(), 0);
      }
      for (const auto& kv : f->metadata()) (void)f->get_string_array(kv.key);
    } else {
      ++rejected;
      EXPECT_FALSE(f.error().message.empty());
    }
  }
  EXPECT_GT(rejected, 1000);
  EXPECT_GT(parsed, 100);  // mutations inside tensor data leave a valid file
  EXPECT_EQ(parsed + rejected, 5000);
}

// ---- the real model ----

TEST(LlamaGgufModel, SmolLM2Layout) {
  const std::string path = kvpack::llama::test::model_path();
  if (!std::filesystem::exists(path)) {
    GTEST_SKIP() << "model file not found at " << path
                 << " (set KVPACK_MODEL_PATH or run tools/fetch_model.sh)";
  }
  auto f = GgufFile::open(path);
  ASSERT_TRUE(f) << f.error().message;
  EXPECT_EQ(f->version(), 3u);
  EXPECT_EQ(f->tensors().size(), 272u);
  std::map<GgmlType, int> counts;
  for (const auto& t : f->tensors()) ++counts[t.type];
  EXPECT_EQ(counts[GgmlType::Q4_1], 210);
  EXPECT_EQ(counts[GgmlType::F32], 61);
  EXPECT_EQ(counts[GgmlType::Q8_0], 1);
  EXPECT_EQ(f->get_string("general.architecture"), "llama");
  EXPECT_EQ(f->get_int("llama.block_count"), 30);
  EXPECT_EQ(f->get_int("llama.embedding_length"), 576);
  EXPECT_EQ(f->get_int("llama.attention.head_count"), 9);
  EXPECT_EQ(f->get_int("llama.attention.head_count_kv"), 3);
  EXPECT_EQ(f->get_float("llama.rope.freq_base"), 100000.0);
  EXPECT_EQ(f->get_string("tokenizer.ggml.model"), "gpt2");
  EXPECT_EQ(f->get_string("tokenizer.ggml.pre"), "smollm");
  EXPECT_EQ(f->get_bool("tokenizer.ggml.add_bos_token"), false);
  EXPECT_EQ(f->get_int("tokenizer.ggml.bos_token_id"), 1);
  EXPECT_EQ(f->get_int("tokenizer.ggml.eos_token_id"), 2);
  EXPECT_EQ(f->get_string_array("tokenizer.ggml.tokens")->size(), 49152u);
  EXPECT_EQ(f->get_string_array("tokenizer.ggml.merges")->size(), 48900u);
  EXPECT_EQ(f->get_int_array("tokenizer.ggml.token_type")->size(), 49152u);

  const auto* emb = f->tensor("token_embd.weight");
  ASSERT_NE(emb, nullptr);
  EXPECT_EQ(emb->type, GgmlType::Q8_0);
  EXPECT_EQ(emb->dims, (std::vector<int64_t>{576, 49152}));
  EXPECT_EQ(emb->data.size(), 49152u * 18u * 34u);
  EXPECT_EQ(f->data_offset() + emb->offset, 1785664u);  // as reported by gguf-py
  const auto* q = f->tensor("blk.0.attn_q.weight");
  ASSERT_NE(q, nullptr);
  EXPECT_EQ(q->type, GgmlType::Q4_1);
  EXPECT_EQ(q->dims, (std::vector<int64_t>{576, 576}));
}

}  // namespace
