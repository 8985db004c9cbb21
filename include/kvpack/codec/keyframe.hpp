// Keyframe / delta coding along the token axis (the video-codec idea applied to a KV block):
// in delta mode, the first token of every `Interval` tokens is a keyframe stored with KeyframeCodec
// (fp16 or a wider integer code); each following token is stored as a quantized difference
// (DeltaCodec, per-token groups along head_dim) against a reconstructed reference:
//  * Anchor  -- the reconstructed keyframe: x̂_t = k̂ + d̂_t, d_t = x_t - k̂. Every token decodes with
//               one addition (random access). Error bound per value: |x̂_t - x_t| <= step(d_t) / 2
//               (+ the fp32 rounding of the addition), step(d_t) being the stored DeltaCodec step
//               of d_t's group, e.g. its range / 15 for asymmetric INT4. The keyframe's own error
//               does not add up (d_t is taken against k̂), but the step does follow |d_t|: on
//               drifting tokens (a random walk) d_t, hence the error, grows with the distance t
//               from the keyframe (walk step 0.1, D 64, INT4: MSE 6.6e-5 at t = 1, 4.1e-4 at t = 7;
//               tests/test_keyframe_hardening.cpp checks the bound per token). Only on stationary
//               tokens (keyframe + i.i.d. noise) is the error independent of the offset.
//  * Chained -- the previous reconstructed token: x̂_t = x̂_{t-1} + d̂_t, d_t = x_t - x̂_{t-1}.
//               Closed loop: the encoder quantizes against what the decoder will hold, so
//               quantization error does not accumulate along the interval; decoding token t needs
//               the running sum of deltas 1..t.
// Never expand, in error and in bytes: for every interval the encoder also codes the tokens
// plainly (DeltaCodec applied to every x_t, token 0 included: exactly the plain codec's bytes) and
// keeps whichever reconstructs with the smaller sum of squared errors (ties keep plain). A plain
// interval therefore costs Interval DeltaCodec rows, a delta interval one KeyframeCodec row plus
// Interval - 1 DeltaCodec rows: the stored size follows the mode. The choice is one bit per
// interval, recorded by the cache in the block header (BlockHeader::flags bit 1 for keys, bit 2
// for values), which also says the block's size (BlockLayout::at, cache/block.hpp).
//
// Measured verdict: see the doc comment of kvpack::Keyframe below and docs/RESULTS-keyframe.md.
#pragma once

#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <type_traits>
#include <vector>

#include "kvpack/codec/concepts.hpp"
#include "kvpack/codec/float_codec.hpp"
#include "kvpack/codec/rows.hpp"

namespace kvpack {

/// Keyframe reference mode: every delta is taken against the reconstructed keyframe (random access).
struct Anchor {
  static constexpr bool chained = false;
  static constexpr bool plain_only = false;
};
/// Keyframe reference mode: every delta is taken against the previous reconstructed token.
struct Chained {
  static constexpr bool chained = true;
  static constexpr bool plain_only = false;
};
/// Measurement control: the commit rule of Keyframe<...> (whole intervals; up to Interval - 1
/// newest tokens in fp32), but every interval is stored in plain mode (never deltas: the plain
/// codec's rows and bytes). Isolates what delta coding itself contributes.
struct PlainOnly {
  static constexpr bool chained = false;
  static constexpr bool plain_only = true;
};

/// Delta / keyframe codec for a whole interval of tokens of one KV head (usable as the codec of
/// Keys<> (per-token axis only) and Values<>). Interval: any size in [2, 1024], powers of two or
/// not (e.g. 10; tests/test_keyframe_hardening.cpp). Interval must equal the cache's block size
/// (KVCache defaults Blocks<> to it), and the cache commits whole intervals: up to Interval - 1
/// newest tokens wait in fp32 (counted by memory_bytes), like the incomplete group of KIVI keys.
///
/// Byte layout of one interval of head_dim D (little-endian, as the row codecs), by its mode:
///   delta: [keyframe: KeyframeCodec codes code_bytes(D) | metadata row_meta_bytes(D)]
///          [(Interval - 1) x delta row: DeltaCodec codes code_bytes(D) | metadata row_meta_bytes(D)]
///   plain: [Interval x row: DeltaCodec codes | metadata of the token itself] (the plain codec's bytes)
/// Exact bits per value, metadata included: plain intervals DeltaCodec::bits_per_value
/// (plain_bits_per_value), delta intervals
///   (KeyframeCodec::bits_per_value + (Interval - 1) * DeltaCodec::bits_per_value) / Interval
/// (delta_bits_per_value), e.g. Keyframe<64, Int4<Group<32>>, Fp16>: 5.0 plain, (16 + 63 * 5) / 64
/// = 5.171875 delta. bits_per_value is the larger of the two (the worst case, what KVCache's
/// key_bits_per_value reports); KVCache::stored_bits() measures what a cache holds.
///
/// Measured verdict (docs/RESULTS-keyframe.md: SmolLM2-135M, all 30 layers, 2048 WikiText-2
/// tokens, Keyframe<64, Int4<Group<32>>, Fp16> at 5.17 bits/value vs its plain mode; measured when
/// plain intervals still paid the fp16 keyframe, i.e. at equal bytes):
///  * helps KEYS coded per token: MSE / 4.2 (Chained) or / 2.0 (Anchor) on post-RoPE K, / 4.7 and
///    / 3.1 on pre-RoPE K, max error 1.41 -> 0.92; end to end ΔPPL +3.12 % -> +0.76 % (Chained) or
///    +1.15 % (Anchor), KL 0.0190 -> 0.0057 (WikiText-2 ctx 2048, 2 windows).
///  * but per-channel INT4 keys (KIVI, 5.0 bits/value) do as well or better: K MSE 7.4e-3 vs
///    1.04e-2 (Chained), ΔPPL +0.67 % vs +0.76 % (KL 0.0070 vs 0.0057): a delta mainly removes the
///    per-channel offset of the slowly rotating channels, which per-channel scales remove too.
///  * does not help VALUES: forced deltas raise V's MSE by 58 % (Anchor) / 26 % (Chained); the
///    never-expand rule keeps 94 % / 72 % of V intervals plain and gains 0.6 % / 5 % MSE.
///  * Chained beat Anchor on every measure; Anchor's one-addition random access is not needed by
///    the in-order streaming kernel.
template <int Interval, KvCodec DeltaCodec, KvCodec KeyframeCodec = Fp16, class Ref = Anchor>
struct Keyframe {
  static_assert(Interval >= 2 && Interval <= 1024,
                "kvpack::Keyframe<Interval, ...>: Interval must be in [2, 1024] (a block holds one interval; "
                "an interval of 1 would be all keyframes)");
  static_assert(std::is_same_v<Ref, Anchor> || std::is_same_v<Ref, Chained> || std::is_same_v<Ref, PlainOnly>,
                "kvpack::Keyframe<..., Ref>: Ref must be kvpack::Anchor, kvpack::Chained or kvpack::PlainOnly");
  using keyframe_tag = void;  ///< marks keyframe codecs (is_keyframe_codec_v)
  using delta_codec = DeltaCodec;
  using keyframe_codec = KeyframeCodec;
  using reference = Ref;
  static constexpr int interval = Interval;
  static constexpr bool chained = Ref::chained;
  /// Bits of a delta code (reported in BlockHeader::k_bits / v_bits).
  static constexpr int bits = DeltaCodec::bits;
  /// Not a grouped codec in the KVCache sense (no per-channel keys); group_size is the multiple
  /// head_dim must be (the larger of the two codecs' per-token group sizes; both are powers of two).
  static constexpr bool grouped = false;
  static constexpr int group_size = std::max(DeltaCodec::group_size, KeyframeCodec::group_size);
  /// Exact bits per value of an interval stored in plain mode / in delta mode (class comment).
  static constexpr double plain_bits_per_value = DeltaCodec::bits_per_value;
  static constexpr double delta_bits_per_value =
      (KeyframeCodec::bits_per_value + (Interval - 1) * DeltaCodec::bits_per_value) / Interval;
  /// The most an interval costs (the larger mode): a bound, not what a given cache holds.
  static constexpr double bits_per_value = std::max(plain_bits_per_value, delta_bits_per_value);

  /// Bytes of the keyframe row / of one DeltaCodec row (a delta, or a plain token), head_dim D.
  [[nodiscard]] static constexpr std::size_t keyframe_bytes(std::size_t D) noexcept {
    return KeyframeCodec::code_bytes(D) + row_meta_bytes<KeyframeCodec>(D);
  }
  [[nodiscard]] static constexpr std::size_t delta_bytes(std::size_t D) noexcept {
    return DeltaCodec::code_bytes(D) + row_meta_bytes<DeltaCodec>(D);
  }
  /// Bytes used by the first `count` tokens (0 <= count <= Interval) of an interval in delta
  /// mode (`delta_mode`: keyframe + count - 1 deltas) or plain mode (count rows).
  [[nodiscard]] static constexpr std::size_t used_bytes(std::size_t count, std::size_t D, bool delta_mode) noexcept {
    if (count == 0) return 0;
    return delta_mode ? keyframe_bytes(D) + (count - 1) * delta_bytes(D) : count * delta_bytes(D);
  }
  /// The larger of the two modes' used_bytes: what encode_interval's dst must hold.
  [[nodiscard]] static constexpr std::size_t max_used_bytes(std::size_t count, std::size_t D) noexcept {
    return std::max(used_bytes(count, D, true), used_bytes(count, D, false));
  }
  /// Bytes of a whole interval in the given mode.
  [[nodiscard]] static constexpr std::size_t interval_bytes(std::size_t D, bool delta_mode) noexcept {
    return used_bytes(Interval, D, delta_mode);
  }
  /// Byte offset of token t's row inside its interval (delta mode, t = 0: the keyframe).
  [[nodiscard]] static constexpr std::size_t offset(std::size_t t, std::size_t D, bool delta_mode) noexcept {
    return used_bytes(t, D, delta_mode);
  }

  /// Decodes the keyframe row of a delta-mode interval into out[0..D).
  static void decode_keyframe(const std::byte* src, int D, float* out) noexcept {
    const auto Dz = static_cast<std::size_t>(D);
    decode_row<KeyframeCodec>(src, src + KeyframeCodec::code_bytes(Dz), D, out);
  }
  /// Decodes the raw DeltaCodec row of token t into out: a delta (delta mode, t >= 1) or the
  /// token's plain value (plain mode, any t).
  static void decode_row_at(const std::byte* src, bool delta_mode, std::size_t t, int D, float* out) noexcept {
    const auto Dz = static_cast<std::size_t>(D);
    const std::byte* r = src + offset(t, Dz, delta_mode);
    decode_row<DeltaCodec>(r, r + DeltaCodec::code_bytes(Dz), D, out);
  }

  /// Streaming decoder of one interval: call next() for t = 0, 1, 2, ... in order; each call
  /// writes token t's reconstruction into out[0..D) using one addition per value (a running sum
  /// for Chained, the kept keyframe for Anchor; none in plain mode). Its only state is the
  /// caller's D-float `ref` buffer (no copy of the interval, no allocation). This is the
  /// encoder's exact reconstruction rule (bit-identical).
  class Stream {
   public:
    Stream(const std::byte* src, bool delta_mode, int D, float* ref) noexcept
        : src_(src), delta_(delta_mode), D_(D), ref_(ref) {}
    void next(float* out) noexcept {
      if (!delta_) {
        decode_row_at(src_, false, t_, D_, out);
      } else if (t_ == 0) {
        decode_keyframe(src_, D_, ref_);
        std::copy(ref_, ref_ + D_, out);
      } else {
        decode_row_at(src_, true, t_, D_, out);
        for (int d = 0; d < D_; ++d) out[d] = add(ref_[d], out[d]);
        if constexpr (chained) std::copy(out, out + D_, ref_);
      }
      ++t_;
    }

   private:
    const std::byte* src_;
    bool delta_;
    int D_;
    float* ref_;
    std::size_t t_ = 0;
  };

  /// Random access: token t of an interval into out[0..D). Plain: one row decode; Anchor:
  /// keyframe + delta (one addition); Chained: keyframe + running sum of deltas 1..t (O(t) rows read).
  static void decode_token(const std::byte* src, bool delta_mode, int t, int D, float* out) {
    if (!delta_mode) return decode_row_at(src, false, static_cast<std::size_t>(t), D, out);
    if (t == 0) return decode_keyframe(src, D, out);
    if constexpr (!chained) {
      decode_row_at(src, true, static_cast<std::size_t>(t), D, out);
      std::vector<float> k(static_cast<std::size_t>(D));
      decode_keyframe(src, D, k.data());
      for (int d = 0; d < D; ++d) out[d] = add(k[static_cast<std::size_t>(d)], out[d]);
    } else {
      std::vector<float> ref(static_cast<std::size_t>(D));
      Stream s(src, true, D, ref.data());
      for (int i = 0; i <= t; ++i) s.next(out);
    }
  }

  /// Decodes the first `count` tokens of an interval into out ([count][D] row-major).
  static void decode_interval(const std::byte* src, bool delta_mode, int count, int D, float* out) {
    std::vector<float> ref(static_cast<std::size_t>(D));
    Stream s(src, delta_mode, D, ref.data());
    for (int t = 0; t < count; ++t) s.next(out + static_cast<std::size_t>(t) * static_cast<std::size_t>(D));
  }

  /// Grows this thread's encode_interval buffer for head_dim D (4 rows of D floats, a keyframe
  /// row, an interval's delta rows and its plain rows). May throw std::bad_alloc. The cache calls
  /// it before an append changes anything (SequenceStore::reserve_append), so a commit allocates nothing.
  static void reserve_encode(int D) {
    const auto Dz = static_cast<std::size_t>(D);
    const std::size_t need = 4 * Dz * sizeof(float) + keyframe_bytes(Dz) +
                             (2 * static_cast<std::size_t>(Interval) - 1) * delta_bytes(Dz);
    if (encode_scratch().size() < need) encode_scratch().resize(need);
  }

  /// Which mode to store an interval in.
  enum class Choice { best, force_delta, force_plain };

  /// Encodes `count` (1..Interval) tokens x[t * stride + d] (finite) of one interval into dst,
  /// which must hold max_used_bytes(count, D) bytes; exactly used_bytes(count, D, mode) bytes are
  /// written (nothing else). Returns the mode: true for delta, false for plain. With Choice::best
  /// (the never-expand rule) both modes are coded and the one with the smaller total squared
  /// reconstruction error is kept (ties: plain); force_* are for measurements (Ref = PlainOnly
  /// always codes plain). `err2` (optional) receives the kept mode's sum of squared errors.
  /// Its working memory comes from a thread-local buffer (reserve_encode), allocated only when
  /// that buffer is too small: after reserve_encode(D) on the calling thread it allocates nothing.
  static bool encode_interval(const float* x, std::ptrdiff_t stride, int count, int D, std::byte* dst,
                              Choice choice = Choice::best, double* err2 = nullptr) {
    if constexpr (Ref::plain_only) choice = Choice::force_plain;
    const auto Dz = static_cast<std::size_t>(D);
    const auto n = static_cast<std::size_t>(count);
    const std::size_t db = delta_bytes(Dz), kb = keyframe_bytes(Dz);
    reserve_encode(D);
    auto* key = reinterpret_cast<float*>(encode_scratch().data());
    float *ref = key + Dz, *diff = ref + Dz, *rec = diff + Dz;
    // Each mode is coded into scratch: [keyframe][deltas] and [plain rows]; the kept one is copied.
    std::byte* delta_stream = encode_scratch().data() + 4 * Dz * sizeof(float);
    std::byte* plain_rows = delta_stream + kb + static_cast<std::size_t>(Interval - 1) * db;
    double e_delta = 0, e_plain = 0;
    if (choice != Choice::force_plain) {
      encode_row<KeyframeCodec>(x, D, delta_stream, delta_stream + KeyframeCodec::code_bytes(Dz));
      decode_keyframe(delta_stream, D, key);
      for (std::size_t d = 0; d < Dz; ++d) e_delta += sq(static_cast<double>(x[d]) - key[d]);
      std::copy(key, key + Dz, ref);
      for (int t = 1; t < count; ++t) {
        const float* xt = x + t * stride;
        for (std::size_t d = 0; d < Dz; ++d) diff[d] = xt[d] - ref[d];
        std::byte* r = delta_stream + kb + static_cast<std::size_t>(t - 1) * db;
        encode_row<DeltaCodec>(diff, D, r, r + DeltaCodec::code_bytes(Dz));
        decode_row<DeltaCodec>(r, r + DeltaCodec::code_bytes(Dz), D, rec);
        for (std::size_t d = 0; d < Dz; ++d) {
          rec[d] = add(ref[d], rec[d]);
          e_delta += sq(static_cast<double>(xt[d]) - rec[d]);
        }
        if constexpr (chained) std::copy(rec, rec + Dz, ref);
      }
    }
    if (choice != Choice::force_delta) {
      for (int t = 0; t < count; ++t) {
        const float* xt = x + t * stride;
        std::byte* r = plain_rows + static_cast<std::size_t>(t) * db;
        encode_row<DeltaCodec>(xt, D, r, r + DeltaCodec::code_bytes(Dz));
        decode_row<DeltaCodec>(r, r + DeltaCodec::code_bytes(Dz), D, rec);
        for (std::size_t d = 0; d < Dz; ++d) e_plain += sq(static_cast<double>(xt[d]) - rec[d]);
      }
    }
    const bool use_delta = choice == Choice::force_delta || (choice == Choice::best && e_delta < e_plain);
    const std::byte* kept = use_delta ? delta_stream : plain_rows;
    std::copy(kept, kept + used_bytes(n, Dz, use_delta), dst);
    if (err2) *err2 = use_delta ? e_delta : e_plain;
    return use_delta;
  }

 private:
  // encode_interval's working memory, per thread (max_align_t-aligned: new'd storage).
  [[nodiscard]] static std::vector<std::byte>& encode_scratch() {
    thread_local std::vector<std::byte> buf;
    return buf;
  }
  // The reconstruction addition (reference + decoded delta): one rounding, shared by the encoder
  // and every decoder so reconstructions are bit-identical (tests/test_keyframe_codec.cpp).
  [[nodiscard]] static float add(float a, float b) noexcept { return a + b; }
  [[nodiscard]] static double sq(double v) noexcept { return v * v; }
};

/// True for Keyframe<...> codecs.
template <class C>
inline constexpr bool is_keyframe_codec_v = requires { typename C::keyframe_tag; };

/// A codec a KVCache role accepts: a row codec (KvCodec) or a keyframe codec.
template <class C>
concept CacheCodec = KvCodec<C> || is_keyframe_codec_v<C>;

}  // namespace kvpack
