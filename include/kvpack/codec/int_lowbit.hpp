// INT3 and INT2 codecs: kvpack::IntCodec at 3 and 2 bits per code (KIVI-2 and 3-bit rows of
// the quality-per-bit study, issue 20).
//
// Numerics are IntCodec's (codec/int_codec.hpp): asymmetric q = clamp(rne((x - zero) / scale),
// 0, 2^b - 1) with zero = group min rounded down and scale = (max - zero) / (2^b - 1) rounded up
// to the metadata precision, so every value of a group decodes within half a step (scale / 2).
// Symmetric is allowed (q in [-2^(b-1), 2^(b-1) - 1], scale = amax / (2^(b-1) - 1)), but at 2 bits
// it has only one positive level; the default is Asymmetric, as KIVI.
//
// Packed layout (the LSB-first bit stream of IntCodec): stored code u = q - qmin, element i at
// stream bits [b*i, b*i + b), stream bit k = bit k % 8 of byte k / 8.
//   INT2: 4 codes per byte, element 4i + j at bits 2j..2j+1 of byte i;
//   INT3: 8 codes in 3 bytes; with the 24-bit little-endian word w = b0 | b1 << 8 | b2 << 16 of
//         bytes 3i..3i+2, element 8i + j is (w >> 3j) & 7 (elements 2 and 5 straddle bytes).
// A row of n codes takes ceil(n * b / 8) bytes. Metadata per group as IntCodec: scale, then
// zero-point (asymmetric), each fp16 (MetaF16, default) or fp32.
// Bits per value with metadata: INT2 group 32 asymmetric fp16: 2 + 32/32 = 3.0; INT3: 4.0;
// group 64: 2.5 and 3.5; group 128: 2.25 and 3.25.
#pragma once

#include "kvpack/codec/int_codec.hpp"

namespace kvpack {

/// INT3 codec; parameters in any order: Group<G> (default 32), Asymmetric (default) | Symmetric,
/// MetaF16 (default) | MetaF32. Int3<> = asymmetric, group 32, fp16 scale + zero: 4.0 bits/value.
template <class... Ps>
struct Int3 : IntCodec<3, detail::pick_or_t<detail::is_group, Group<32>, Ps...>,
                       detail::pick_or_t<detail::is_mode, Asymmetric, Ps...>,
                       detail::pick_or_t<detail::is_meta, MetaF16, Ps...>> {
  static_assert(detail::valid_int_params_v<Ps...>,
                "kvpack::Int3<...>: parameters must be at most one each of Group<G>, "
                "Symmetric|Asymmetric and MetaF16|MetaF32");
};

/// INT2 codec; parameters in any order: Group<G> (default 32), Asymmetric (default) | Symmetric,
/// MetaF16 (default) | MetaF32. Int2<> = asymmetric, group 32, fp16 scale + zero: 3.0 bits/value.
template <class... Ps>
struct Int2 : IntCodec<2, detail::pick_or_t<detail::is_group, Group<32>, Ps...>,
                       detail::pick_or_t<detail::is_mode, Asymmetric, Ps...>,
                       detail::pick_or_t<detail::is_meta, MetaF16, Ps...>> {
  static_assert(detail::valid_int_params_v<Ps...>,
                "kvpack::Int2<...>: parameters must be at most one each of Group<G>, "
                "Symmetric|Asymmetric and MetaF16|MetaF32");
};

}  // namespace kvpack
