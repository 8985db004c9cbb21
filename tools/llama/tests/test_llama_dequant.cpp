// Dequantization: hand-written blocks with hand-computed values per format, pseudo-random blocks
// against gguf-py's dequantize (recorded in dequant_reference.inc), error paths, and whole-tensor
// checksums of the real model (skipped when the model file is absent).
#include "dequant.hpp"
#include "gguf_builder.hpp"

#include <gtest/gtest.h>

#include <cmath>
#include <filesystem>
#include <initializer_list>
#include <string>
#include <utility>
#include <vector>

namespace {

using kvpack::Errc;
using kvpack::llama::dequantize;
using kvpack::llama::dequantize_row;
using kvpack::llama::GgmlType;

#include "dequant_reference.inc"

std::vector<std::byte> bytes(std::initializer_list<int> v) {
  std::vector<std::byte> b;
  for (const int x : v) b.push_back(static_cast<std::byte>(x));
  return b;
}

std::vector<float> run(GgmlType t, const std::vector<std::byte>& src, size_t n) {
  std::vector<float> out(n, -12345.0f);
  auto st = dequantize_row(t, src, out);
  EXPECT_TRUE(st) << st.error().message;
  return out;
}

void append(std::vector<std::byte>& b, std::initializer_list<int> v) {
  for (const int x : v) b.push_back(static_cast<std::byte>(x));
}

// The 16 nibble bytes used by the 32-value formats: value i (low nibble) = i, value i+16 (high
// nibble) = 15 - i.
constexpr std::initializer_list<int> kRampNibbles = {0xF0, 0xE1, 0xD2, 0xC3, 0xB4, 0xA5, 0x96, 0x87,
                                                     0x78, 0x69, 0x5A, 0x4B, 0x3C, 0x2D, 0x1E, 0x0F};

TEST(LlamaDequant, F32AndF16AndBF16) {
  EXPECT_EQ(run(GgmlType::F32, bytes({0x00, 0x00, 0xC0, 0x3F, 0x00, 0x00, 0x20, 0xC1}), 2),
            (std::vector<float>{1.5f, -10.0f}));
  // F16: 1, -2, smallest subnormal 2^-24, 65504 (max), -0, 0x3555 = 0.333251953125, +inf.
  const auto h = run(GgmlType::F16,
                     bytes({0x00, 0x3C, 0x00, 0xC0, 0x01, 0x00, 0xFF, 0x7B, 0x00, 0x80, 0x55, 0x35, 0x00, 0x7C}), 7);
  EXPECT_EQ(h[0], 1.0f);
  EXPECT_EQ(h[1], -2.0f);
  EXPECT_EQ(h[2], std::ldexp(1.0f, -24));
  EXPECT_EQ(h[3], 65504.0f);
  EXPECT_EQ(h[4], 0.0f);
  EXPECT_TRUE(std::signbit(h[4]));
  EXPECT_EQ(h[5], 0.333251953125f);
  EXPECT_TRUE(std::isinf(h[6]) && h[6] > 0);
  EXPECT_TRUE(std::isnan(run(GgmlType::F16, bytes({0x00, 0x7E}), 1)[0]));
  // BF16: 0x3F80 = 1, 0x4049 = 3.140625, 0xBF80 = -1, 0x0001 = 2^-133 (subnormal).
  const auto bf = run(GgmlType::BF16, bytes({0x80, 0x3F, 0x49, 0x40, 0x80, 0xBF, 0x01, 0x00}), 4);
  EXPECT_EQ(bf[0], 1.0f);
  EXPECT_EQ(bf[1], 3.140625f);
  EXPECT_EQ(bf[2], -1.0f);
  EXPECT_EQ(bf[3], std::ldexp(1.0f, -133));
}

TEST(LlamaDequant, Q4_0HandBlock) {
  auto b = bytes({0x00, 0x38});  // d = 0.5
  append(b, kRampNibbles);
  const auto y = run(GgmlType::Q4_0, b, 32);
  const std::vector<float> want = {-4.0f, -3.5f, -3.0f, -2.5f, -2.0f, -1.5f, -1.0f, -0.5f,  // (i - 8) * 0.5
                                   0.0f,  0.5f,  1.0f,  1.5f,  2.0f,  2.5f,  3.0f,  3.5f,
                                   3.5f,  3.0f,  2.5f,  2.0f,  1.5f,  1.0f,  0.5f,  0.0f,   // (7 - i) * 0.5
                                   -0.5f, -1.0f, -1.5f, -2.0f, -2.5f, -3.0f, -3.5f, -4.0f};
  EXPECT_EQ(y, want);
}

TEST(LlamaDequant, Q4_1HandBlock) {
  auto b = bytes({0x00, 0x34, 0x00, 0xBC});  // d = 0.25, m = -1
  append(b, kRampNibbles);
  const auto y = run(GgmlType::Q4_1, b, 32);
  const std::vector<float> want = {-1.0f,  -0.75f, -0.5f,  -0.25f, 0.0f,   0.25f,  0.5f,   0.75f,  // i/4 - 1
                                   1.0f,   1.25f,  1.5f,   1.75f,  2.0f,   2.25f,  2.5f,   2.75f,
                                   2.75f,  2.5f,   2.25f,  2.0f,   1.75f,  1.5f,   1.25f,  1.0f,   // (15-i)/4 - 1
                                   0.75f,  0.5f,   0.25f,  0.0f,   -0.25f, -0.5f,  -0.75f, -1.0f};
  EXPECT_EQ(y, want);
}

TEST(LlamaDequant, Q5_0HandBlock) {
  auto b = bytes({0x00, 0x3C, 0x01, 0x00, 0x00, 0x80});  // d = 1, qh bits 0 and 31 set
  append(b, kRampNibbles);
  const auto y = run(GgmlType::Q5_0, b, 32);
  // value 0: (0 | 16) - 16 = 0; values 1..15: i - 16; values 16..30: (15-i) - 16; value 31: (0|16)-16.
  const std::vector<float> want = {0,   -15, -14, -13, -12, -11, -10, -9, -8,  -7,  -6,  -5,  -4,  -3,  -2,  -1,
                                   -1,  -2,  -3,  -4,  -5,  -6,  -7,  -8, -9,  -10, -11, -12, -13, -14, -15, 0};
  EXPECT_EQ(y, want);
}

TEST(LlamaDequant, Q5_1HandBlock) {
  // d = 0.5, m = 2, qh bits 1 and 16, every nibble byte 0x21 (low 1, high 2).
  auto b = bytes({0x00, 0x38, 0x00, 0x40, 0x02, 0x00, 0x01, 0x00});
  for (int i = 0; i < 16; ++i) append(b, {0x21});
  const auto y = run(GgmlType::Q5_1, b, 32);
  for (size_t i = 0; i < 16; ++i) EXPECT_EQ(y[i], i == 1 ? 10.5f : 2.5f) << i;        // 17*.5+2 | 1*.5+2
  for (size_t i = 16; i < 32; ++i) EXPECT_EQ(y[i], i == 16 ? 11.0f : 3.0f) << i;      // 18*.5+2 | 2*.5+2
}

TEST(LlamaDequant, Q8_0HandBlock) {
  auto b = bytes({0x00, 0xB0});  // d = -0.125
  append(b, {0x01, 0xFF, 0x7F, 0x80});
  for (int i = 4; i < 32; ++i) append(b, {i});
  const auto y = run(GgmlType::Q8_0, b, 32);
  EXPECT_EQ(y[0], -0.125f);
  EXPECT_EQ(y[1], 0.125f);
  EXPECT_EQ(y[2], -15.875f);
  EXPECT_EQ(y[3], 16.0f);
  EXPECT_EQ(y[4], -0.5f);
  EXPECT_EQ(y[31], -3.875f);
}

TEST(LlamaDequant, Q2_KHandBlock) {
  // scales byte k: scale k (low nibble), min 15 - k (high nibble); every quant byte 0xE4 holds
  // 0,1,2,3 in its four 2-bit fields, so value v has q = its group (v % 128) / 32.
  std::vector<std::byte> b;
  for (int k = 0; k < 16; ++k) append(b, {k | ((15 - k) << 4)});
  for (int k = 0; k < 64; ++k) append(b, {0xE4});
  append(b, {0x00, 0x38, 0x00, 0x34});  // d = 0.5, dmin = 0.25
  ASSERT_EQ(b.size(), 84u);
  const auto y = run(GgmlType::Q2_K, b, 256);
  EXPECT_EQ(y[0], -3.75f);    // 0.5*0*0 - 0.25*15
  EXPECT_EQ(y[40], -2.25f);   // sub 2, q 1: 0.5*2*1 - 0.25*13
  EXPECT_EQ(y[130], -1.75f);  // sub 8, q 0: -0.25*7
  EXPECT_EQ(y[255], 22.5f);   // sub 15, q 3: 0.5*15*3 - 0
  for (size_t v = 0; v < 256; ++v) {
    const auto j = static_cast<float>(v / 16), q = static_cast<float>((v % 128) / 32);
    EXPECT_EQ(y[v], 0.5f * j * q - 0.25f * (15.0f - j)) << v;
  }
}

TEST(LlamaDequant, Q3_KHandBlock) {
  // Stored 6-bit scales S_j = 4j + 2 (actual S_j - 32 = 4j - 30): low nibbles 2,6,A,E repeating,
  // high bit pairs 0 (j 0-3), 1 (j 4-7), 2 (j 8-11), 3 (j 12-15).
  std::vector<std::byte> b;
  for (int l = 0; l < 32; ++l) append(b, {l < 16 ? 0xFF : 0x00});  // hmask: high bit set for l < 16
  for (int k = 0; k < 64; ++k) append(b, {0xE4});                  // 2-bit quant = group
  append(b, {0x22, 0x66, 0xAA, 0xEE, 0x22, 0x66, 0xAA, 0xEE, 0xE4, 0xE4, 0xE4, 0xE4});
  append(b, {0x00, 0x3C});  // d = 1
  ASSERT_EQ(b.size(), 110u);
  const auto y = run(GgmlType::Q3_K, b, 256);
  EXPECT_EQ(y[0], 0.0f);      // scale -30, q 0 - 0
  EXPECT_EQ(y[16], 104.0f);   // scale -26, q 0 - 4
  EXPECT_EQ(y[33], -22.0f);   // scale -22, q 1 - 0
  EXPECT_EQ(y[200], 36.0f);   // scale 18, q 2 - 0
  EXPECT_EQ(y[255], -30.0f);  // scale 30, q 3 - 4
  for (size_t v = 0; v < 256; ++v) {
    const int scale = 4 * static_cast<int>(v / 16) - 30;
    const int q = static_cast<int>((v % 128) / 32) - (v % 32 < 16 ? 0 : 4);
    EXPECT_EQ(y[v], static_cast<float>(scale * q)) << v;
  }
}

// Q4_K / Q5_K: the 12 scale bytes below pack sub-block scales {1,2,3,4,17,33,50,63} and mins
// {0,1,2,3,20,40,63,16} (6 bits each; packing worked out by hand in the comment of each byte).
constexpr int kKScale[8] = {1, 2, 3, 4, 17, 33, 50, 63};
constexpr int kKMin[8] = {0, 1, 2, 3, 20, 40, 63, 16};
constexpr std::initializer_list<int> kKScaleBytes = {
    0x41,  // sc0=1  | (sc4>>4)=1 << 6
    0x82,  // sc1=2  | (sc5>>4)=2 << 6
    0xC3,  // sc2=3  | (sc6>>4)=3 << 6
    0xC4,  // sc3=4  | (sc7>>4)=3 << 6
    0x40,  // m0=0   | (m4>>4)=1 << 6
    0x81,  // m1=1   | (m5>>4)=2 << 6
    0xC2,  // m2=2   | (m6>>4)=3 << 6
    0x43,  // m3=3   | (m7>>4)=1 << 6
    0x41,  // sc4&15=1 | (m4&15)=4 << 4
    0x81,  // sc5&15=1 | (m5&15)=8 << 4
    0xF2,  // sc6&15=2 | (m6&15)=15 << 4
    0x0F,  // sc7&15=15 | (m7&15)=0 << 4
};

TEST(LlamaDequant, Q4_KHandBlock) {
  auto b = bytes({0x00, 0x3C, 0x00, 0x38});  // d = 1, dmin = 0.5
  append(b, kKScaleBytes);
  for (int k = 0; k < 128; ++k) append(b, {(k % 16) | ((15 - k % 16) << 4)});
  ASSERT_EQ(b.size(), 144u);
  const auto y = run(GgmlType::Q4_K, b, 256);
  // Spot values computed by hand: d*sc*q - dmin*m.
  EXPECT_EQ(y[0], 0.0f);      // sub 0: 1*0 - 0
  EXPECT_EQ(y[5], 5.0f);      // sub 0: 1*5 - 0
  EXPECT_EQ(y[32], 29.5f);    // sub 1: 2*15 - 0.5*1
  EXPECT_EQ(y[67], 8.0f);     // sub 2: 3*3 - 0.5*2
  EXPECT_EQ(y[96], 58.5f);    // sub 3: 4*15 - 0.5*3
  EXPECT_EQ(y[129], 7.0f);    // sub 4: 17*1 - 0.5*20
  EXPECT_EQ(y[162], 409.0f);  // sub 5: 33*13 - 0.5*40
  EXPECT_EQ(y[207], 718.5f);  // sub 6: 50*15 - 0.5*63
  EXPECT_EQ(y[255], -8.0f);   // sub 7: 63*0 - 0.5*16
  // Every value: sub-block j = i/32; q = low nibble (i%64 < 32) or high nibble of byte i%32.
  for (size_t i = 0; i < 256; ++i) {
    const size_t j = i / 32;
    const int l = static_cast<int>(i % 32) % 16;
    const int q = (i % 64) < 32 ? l : 15 - l;
    EXPECT_EQ(y[i], static_cast<float>(kKScale[j] * q) - 0.5f * static_cast<float>(kKMin[j])) << i;
  }
}

TEST(LlamaDequant, Q5_KHandBlock) {
  auto b = bytes({0x00, 0x40, 0x00, 0x3C});  // d = 2, dmin = 1
  append(b, kKScaleBytes);
  // qh: byte l < 16 -> 0x55 (fifth bit for the low-nibble values of every chunk),
  //     byte l >= 16 -> 0xAA (fifth bit for the high-nibble values).
  for (int l = 0; l < 32; ++l) append(b, {l < 16 ? 0x55 : 0xAA});
  for (int k = 0; k < 128; ++k) append(b, {0x31});  // low nibble 1, high nibble 3
  ASSERT_EQ(b.size(), 176u);
  const auto y = run(GgmlType::Q5_K, b, 256);
  EXPECT_EQ(y[0], 34.0f);    // sub 0: 2*1*(1+16) - 0
  EXPECT_EQ(y[16], 2.0f);    // sub 0: 2*1*1 - 0
  EXPECT_EQ(y[32], 11.0f);   // sub 1: 2*2*3 - 1
  EXPECT_EQ(y[48], 75.0f);   // sub 1: 2*2*(3+16) - 1
  EXPECT_EQ(y[200], 1637.0f);  // sub 6: 2*50*(1+16) - 63
  for (size_t i = 0; i < 256; ++i) {
    const size_t j = i / 32;
    const bool low = (i % 64) < 32;
    const size_t l = i % 32;
    const int q = (low ? 1 : 3) + (((l < 16) == low) ? 16 : 0);
    EXPECT_EQ(y[i], 2.0f * static_cast<float>(kKScale[j] * q) - static_cast<float>(kKMin[j])) << i;
  }
}

TEST(LlamaDequant, Q6_KHandBlock) {
  // q(v) = (7*v + 3) % 64 for value v, scales sc[k] = k - 8, d = 0.5; bytes packed per the
  // Q6_K layout (value 128h+32g+l: low 4 bits in ql[64h + 32*(g%2) + l] (high nibble if g >= 2),
  // top 2 bits in qh[32h + l] at bit 2g).
  std::vector<uint8_t> ql(128, 0), qh(64, 0);
  const auto q = [](size_t v) { return static_cast<int>((7 * v + 3) % 64); };
  for (size_t v = 0; v < 256; ++v) {
    const size_t h = v / 128, g = (v % 128) / 32, l = v % 32;
    const int val = q(v);
    ql[64 * h + 32 * (g % 2) + l] |= static_cast<uint8_t>((val & 0x0F) << (g >= 2 ? 4 : 0));
    qh[32 * h + l] |= static_cast<uint8_t>((val >> 4) << (2 * g));
  }
  std::vector<std::byte> b;
  for (const uint8_t x : ql) b.push_back(static_cast<std::byte>(x));
  for (const uint8_t x : qh) b.push_back(static_cast<std::byte>(x));
  for (int k = 0; k < 16; ++k) b.push_back(static_cast<std::byte>(static_cast<int8_t>(k - 8)));
  append(b, {0x00, 0x38});  // d = 0.5
  ASSERT_EQ(b.size(), 210u);
  const auto y = run(GgmlType::Q6_K, b, 256);
  EXPECT_EQ(y[0], 116.0f);   // 0.5 * sc0 (-8) * (q 3 - 32)
  EXPECT_EQ(y[1], 88.0f);    // 0.5 * -8 * (10 - 32)
  EXPECT_EQ(y[255], 98.0f);  // 0.5 * sc15 (7) * (q 1788%64=60 - 32)
  for (size_t v = 0; v < 256; ++v) {
    EXPECT_EQ(y[v], 0.5f * static_cast<float>((static_cast<int>(v / 16) - 8) * (q(v) - 32))) << v;
  }
}

TEST(LlamaDequant, RandomBlocksMatchGgufPy) {
  for (const auto& c : random_block_cases()) {
    SCOPED_TRACE(c.type);
    const std::string hex = c.hex;
    std::vector<std::byte> src(hex.size() / 2);
    for (size_t i = 0; i < src.size(); ++i) src[i] = static_cast<std::byte>(std::stoi(hex.substr(2 * i, 2), nullptr, 16));
    std::vector<float> y(c.expected.size());
    auto st = dequantize_row(c.ggml_type, src, y);
    ASSERT_TRUE(st) << st.error().message;
    for (size_t i = 0; i < y.size(); ++i) {
      ASSERT_FLOAT_EQ(y[i], c.expected[i]) << "value " << i;
    }
  }
}

TEST(LlamaDequant, Errors) {
  std::vector<float> y(32), y256(256), y31(31);
  auto unsupported = dequantize_row(GgmlType::IQ4_XS, std::vector<std::byte>(136), y256);
  ASSERT_FALSE(unsupported);
  EXPECT_EQ(unsupported.error().code, Errc::unsupported);
  EXPECT_NE(unsupported.error().message.find("IQ4_XS"), std::string::npos);
  auto iq = dequantize_row(GgmlType::IQ2_XXS, std::vector<std::byte>(66), y256);
  ASSERT_FALSE(iq);
  EXPECT_NE(iq.error().message.find("IQ2_XXS"), std::string::npos);
  auto unknown = dequantize_row(static_cast<GgmlType>(5), std::vector<std::byte>(18), y);
  ASSERT_FALSE(unknown);
  EXPECT_EQ(unknown.error().code, Errc::unsupported);

  auto short_src = dequantize_row(GgmlType::Q4_0, std::vector<std::byte>(17), y);
  ASSERT_FALSE(short_src);
  EXPECT_EQ(short_src.error().code, Errc::invalid_argument);
  auto partial_block = dequantize_row(GgmlType::Q4_0, std::vector<std::byte>(18), y31);
  ASSERT_FALSE(partial_block);
  EXPECT_EQ(partial_block.error().code, Errc::invalid_argument);
  EXPECT_TRUE(dequantize_row(GgmlType::Q8_0, {}, {}));  // zero blocks is fine

  kvpack::llama::TensorInfo t{"w", {256}, GgmlType::Q8_K, 0, {}};
  auto whole = dequantize(t);
  ASSERT_FALSE(whole);
  EXPECT_EQ(whole.error().code, Errc::unsupported);
  EXPECT_NE(whole.error().message.find("'w'"), std::string::npos);
  EXPECT_NE(whole.error().message.find("Q8_K"), std::string::npos);
}

TEST(LlamaDequant, WholeTensorOfABuiltFile) {
  // Two rows of 32 Q8_0 values; dequantize() returns dims[0]-fastest order.
  auto row0 = bytes({0x00, 0x3C});  // d = 1
  for (int i = 0; i < 32; ++i) append(row0, {i});
  auto row1 = bytes({0x00, 0x40});  // d = 2
  for (int i = 0; i < 32; ++i) append(row1, {-i});
  row0.insert(row0.end(), row1.begin(), row1.end());
  kvpack::llama::test::GgufBuilder gb;
  gb.tensor("w", {32, 2}, GgmlType::Q8_0, row0);
  auto f = kvpack::llama::GgufFile::from_bytes(gb.build());
  ASSERT_TRUE(f) << f.error().message;
  auto y = dequantize(*f->tensor("w"));
  ASSERT_TRUE(y) << y.error().message;
  ASSERT_EQ(y->size(), 64u);
  EXPECT_EQ((*y)[5], 5.0f);
  EXPECT_EQ((*y)[32 + 5], -10.0f);
}

TEST(LlamaDequantModel, TensorChecksumsMatchGgufPy) {
  const std::string path = kvpack::llama::test::model_path();
  if (!std::filesystem::exists(path)) {
    GTEST_SKIP() << "model file not found at " << path
                 << " (set KVPACK_MODEL_PATH or run tools/fetch_model.sh)";
  }
  auto f = kvpack::llama::GgufFile::open(path);
  ASSERT_TRUE(f) << f.error().message;
  for (const auto& ref : model_tensor_checksums()) {
    SCOPED_TRACE(ref.name);
    const auto* t = f->tensor(ref.name);
    ASSERT_NE(t, nullptr);
    auto y = dequantize(*t);
    ASSERT_TRUE(y) << y.error().message;
    ASSERT_EQ(static_cast<int64_t>(y->size()), ref.elements);
    double sum = 0, sum_sq = 0;
    for (const float v : *y) {
      sum += v;
      sum_sq += static_cast<double>(v) * v;
    }
    EXPECT_NEAR(sum, ref.sum, 1e-9 * ref.sum_sq + 1e-9);
    EXPECT_NEAR(sum_sq, ref.sum_sq, 1e-9 * ref.sum_sq);
    for (const auto& [i, v] : ref.samples) EXPECT_FLOAT_EQ((*y)[static_cast<size_t>(i)], v) << "index " << i;
  }
  // Every tensor of the file dequantizes (Q4_1, Q8_0 and F32 here).
  for (const auto& t : f->tensors()) EXPECT_TRUE(kvpack::llama::can_dequantize(t.type)) << t.name;
}

}  // namespace
