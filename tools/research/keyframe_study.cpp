// kvpack-keyframe-study: measures delta / keyframe coding (kvpack::Keyframe) against plain INT4 on
// real K/V dumped by `kvpack-eval --dump-kv DIR --dump-layers ...`.
//
// Input: DIR/layerLL_{k,k_prerope,v}.npy, float32 [tokens][kv_heads][head_dim] (C order), the
// layers given on the command line (default: every layerLL_v.npy found, LL = 00..99).
// For each tensor kind (K post-RoPE, K pre-RoPE, V), every layer and KV head is cut into
// intervals of 64 consecutive tokens (a trailing partial interval is ignored) and coded with:
//   int4-g32            Int4<Group<32>> per token, no keyframe (5.000 bits/value)
//   int4-g32 per-channel  the same codec grouped over 32 tokens per channel (KIVI keys; 5.000)
//   kf64 plain          Keyframe<64, Int4<Group<32>>, Fp16> forced plain mode   (5.000)
//   kf64 anchor         ... forced delta mode, Anchor reference                (5.172)
//   kf64 chained        ... forced delta mode, Chained reference               (5.172)
//   kf64 anchor+NE      ... never-expand rule (the codec's choice), Anchor      (5.000 to 5.172)
//   kf64 chained+NE     ... never-expand rule, Chained                          (5.000 to 5.172)
// and the same five keyframe rows at interval 16 (delta mode 5.688 bits/value). A plain interval
// is stored as the plain codec's rows (no keyframe), so keyframe rows report the bits/value they
// measured (bytes actually coded), not a fixed figure.
// Output: a Markdown table per tensor kind: bits/value, MSE, MSE relative to the mean square of the
// values, max |error|, share of intervals coded as deltas; plus per-layer relative MSE of the
// never-expand variants vs plain (how many layers improve).
//
// Usage: kvpack-keyframe-study DIR [layer ...]
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <iostream>
#include <sstream>
#include <string>
#include <vector>

#include <kvpack/codec/int_codec.hpp>
#include <kvpack/codec/keyframe.hpp>
#include <kvpack/codec/rows.hpp>

namespace {

/// A float32 C-order .npy array of rank 3.
struct Npy {
  std::vector<float> data;
  std::int64_t n0 = 0, n1 = 0, n2 = 0;
};

/// Reads a little-endian float32 C-order 3-D .npy (format versions 1 and 2). Empty on error.
bool read_npy(const std::filesystem::path& p, Npy& out, std::string& err) {
  std::ifstream f(p, std::ios::binary);
  if (!f) return err = "cannot open " + p.string(), false;
  char magic[8];
  f.read(magic, 8);
  if (!f || std::memcmp(magic, "\x93NUMPY", 6) != 0) return err = p.string() + ": not a .npy file", false;
  std::uint32_t hl = 0;
  if (magic[6] == 1) {
    unsigned char b[2];
    f.read(reinterpret_cast<char*>(b), 2);
    hl = b[0] | (b[1] << 8);
  } else {
    unsigned char b[4];
    f.read(reinterpret_cast<char*>(b), 4);
    hl = b[0] | (b[1] << 8) | (b[2] << 16) | (static_cast<std::uint32_t>(b[3]) << 24);
  }
  std::string h(hl, '\0');
  f.read(h.data(), hl);
  if (h.find("'<f4'") == std::string::npos || h.find("'fortran_order': False") == std::string::npos)
    return err = p.string() + ": need little-endian float32 in C order", false;
  const auto s = h.find("'shape': (");
  if (s == std::string::npos) return err = p.string() + ": no shape", false;
  std::int64_t dims[3] = {0, 0, 0};
  if (std::sscanf(h.c_str() + s + 10, "%ld, %ld, %ld", &dims[0], &dims[1], &dims[2]) != 3)
    return err = p.string() + ": need a 3-D array", false;
  out.n0 = dims[0], out.n1 = dims[1], out.n2 = dims[2];
  out.data.resize(static_cast<std::size_t>(dims[0] * dims[1] * dims[2]));
  f.read(reinterpret_cast<char*>(out.data.data()), static_cast<std::streamsize>(out.data.size() * sizeof(float)));
  if (!f) return err = p.string() + ": truncated data", false;
  return true;
}

struct Stats {
  double se = 0, sq = 0, maxe = 0;
  std::int64_t n = 0, intervals = 0, delta_intervals = 0, bytes = 0;  // bytes: coded by keyframe variants
  void add(const float* x, const float* r, std::int64_t count, std::int64_t stride, int D) {
    for (std::int64_t t = 0; t < count; ++t)
      for (int d = 0; d < D; ++d) {
        const double e = static_cast<double>(r[t * D + d]) - x[t * stride + d];
        se += e * e;
        sq += static_cast<double>(x[t * stride + d]) * x[t * stride + d];
        maxe = std::max(maxe, std::abs(e));
      }
    n += count * D;
  }
  [[nodiscard]] double mse() const { return n ? se / static_cast<double>(n) : 0; }
  [[nodiscard]] double rel() const { return sq > 0 ? se / sq : 0; }
};

using Int4g32 = kvpack::Int4<kvpack::Group<32>>;

template <int I, class Ref>
using Kf = kvpack::Keyframe<I, Int4g32, kvpack::Fp16, Ref>;

// One interval [count][D] of rows at x + t * stride through keyframe codec K with choice c.
template <class K>
void run_kf(const float* x, std::int64_t stride, int D, typename K::Choice c, Stats& st, std::vector<std::byte>& buf,
            std::vector<float>& rec) {
  buf.resize(K::max_used_bytes(K::interval, static_cast<std::size_t>(D)));
  rec.resize(static_cast<std::size_t>(K::interval) * static_cast<std::size_t>(D));
  const bool delta = K::encode_interval(x, stride, K::interval, D, buf.data(), c);
  K::decode_interval(buf.data(), delta, K::interval, D, rec.data());
  st.add(x, rec.data(), K::interval, stride, D);
  ++st.intervals;
  st.delta_intervals += delta;
  st.bytes += static_cast<std::int64_t>(K::used_bytes(K::interval, static_cast<std::size_t>(D), delta));
}

constexpr int kVariants = 12;
const char* const kNames[kVariants] = {"int4-g32 (no keyframe)", "kf64 plain",      "kf64 anchor",  "kf64 chained",
                                       "kf64 anchor + never-expand", "kf64 chained + never-expand", "kf16 plain",
                                       "kf16 anchor", "kf16 chained", "kf16 anchor + never-expand",
                                       "kf16 chained + never-expand", "int4-g32 per-channel (KIVI), no keyframe"};
const double kBits[kVariants] = {Int4g32::bits_per_value,
                                 Kf<64, kvpack::Anchor>::bits_per_value, Kf<64, kvpack::Anchor>::bits_per_value,
                                 Kf<64, kvpack::Anchor>::bits_per_value, Kf<64, kvpack::Anchor>::bits_per_value,
                                 Kf<64, kvpack::Anchor>::bits_per_value, Kf<16, kvpack::Anchor>::bits_per_value,
                                 Kf<16, kvpack::Anchor>::bits_per_value, Kf<16, kvpack::Anchor>::bits_per_value,
                                 Kf<16, kvpack::Anchor>::bits_per_value, Kf<16, kvpack::Anchor>::bits_per_value,
                                 Int4g32::bits_per_value};

template <int I>
void run_family(const float* x, std::int64_t stride, int D, Stats* st, std::vector<std::byte>& buf, std::vector<float>& rec) {
  using A = Kf<I, kvpack::Anchor>;
  using C = Kf<I, kvpack::Chained>;
  run_kf<A>(x, stride, D, A::Choice::force_plain, st[0], buf, rec);
  run_kf<A>(x, stride, D, A::Choice::force_delta, st[1], buf, rec);
  run_kf<C>(x, stride, D, C::Choice::force_delta, st[2], buf, rec);
  run_kf<A>(x, stride, D, A::Choice::best, st[3], buf, rec);
  run_kf<C>(x, stride, D, C::Choice::best, st[4], buf, rec);
}

// Codes one layer's tensor [T][H][D] with every variant; adds into `st` (kVariants entries).
void code_tensor(const Npy& a, Stats* st) {
  const int H = static_cast<int>(a.n1), D = static_cast<int>(a.n2);
  const std::int64_t stride = a.n1 * a.n2;
  std::vector<std::byte> codes(Int4g32::code_bytes(static_cast<std::size_t>(D))),
      meta(kvpack::row_meta_bytes<Int4g32>(static_cast<std::size_t>(D))), buf;
  std::vector<float> rec, row(static_cast<std::size_t>(D));
  const std::int64_t T = a.n0 / 64 * 64;
  for (int h = 0; h < H; ++h)
    for (std::int64_t t0 = 0; t0 < T; t0 += 64) {
      const float* x = a.data.data() + t0 * stride + h * D;
      for (int t = 0; t < 64; ++t) {  // plain INT4, no keyframe
        kvpack::encode_row<Int4g32>(x + t * stride, D, codes.data(), meta.data());
        kvpack::decode_row<Int4g32>(codes.data(), meta.data(), D, row.data());
        st[0].add(x + t * stride, row.data(), 1, stride, D);
      }
      run_family<64>(x, stride, D, st + 1, buf, rec);
      // Per-channel INT4 (KIVI): one scale/zero per channel per 32 tokens.
      std::vector<std::byte> pc_codes(32 * codes.size()), pc_meta(static_cast<std::size_t>(D) * Int4g32::meta_bytes_per_group);
      for (int s = 0; s < 64; s += 32) {
        kvpack::encode_channels<Int4g32>(x + s * stride, stride, D, pc_codes.data(), codes.size(), pc_meta.data());
        for (int t = 0; t < 32; ++t) {
          kvpack::decode_row_channels<Int4g32>(pc_codes.data() + static_cast<std::size_t>(t) * codes.size(), pc_meta.data(), D,
                                               row.data());
          st[11].add(x + (s + t) * stride, row.data(), 1, stride, D);
        }
      }
      for (int s = 0; s < 64; s += 16) run_family<16>(x + s * stride, stride, D, st + 6, buf, rec);
    }
}

}  // namespace

int main(int argc, char** argv) {
  if (argc < 2) {
    std::cerr << "usage: kvpack-keyframe-study DIR [layer ...]\n";
    return 2;
  }
  const std::filesystem::path dir = argv[1];
  std::vector<int> layers;
  for (int i = 2; i < argc; ++i) layers.push_back(std::atoi(argv[i]));
  if (layers.empty())
    for (int l = 0; l < 100; ++l) {
      char name[32];
      std::snprintf(name, sizeof name, "layer%02d_v.npy", l);
      if (std::filesystem::exists(dir / name)) layers.push_back(l);
    }
  if (layers.empty()) {
    std::cerr << "kvpack-keyframe-study: no layerLL_v.npy in " << dir << "\n";
    return 1;
  }
  const char* kinds[3] = {"k", "k_prerope", "v"};
  const char* titles[3] = {"K post-RoPE", "K pre-RoPE", "V"};
  Npy a;
  std::string err;
  std::int64_t tokens = 0, heads = 0, hd = 0;
  for (int k = 0; k < 3; ++k) {
    Stats total[kVariants];
    int better_a = 0, better_c = 0;  // layers where never-expand beats kf64 plain by > 1 %
    std::ostringstream per_layer;
    for (int l : layers) {
      char name[40];
      std::snprintf(name, sizeof name, "layer%02d_%s.npy", l, kinds[k]);
      if (!read_npy(dir / name, a, err)) {
        std::cerr << "kvpack-keyframe-study: " << err << "\n";
        return 1;
      }
      tokens = a.n0, heads = a.n1, hd = a.n2;
      Stats st[kVariants];
      code_tensor(a, st);
      for (int v = 0; v < kVariants; ++v) {
        total[v].se += st[v].se, total[v].sq += st[v].sq, total[v].n += st[v].n;
        total[v].maxe = std::max(total[v].maxe, st[v].maxe);
        total[v].intervals += st[v].intervals, total[v].delta_intervals += st[v].delta_intervals;
        total[v].bytes += st[v].bytes;
      }
      better_a += st[4].se < 0.99 * st[1].se;
      better_c += st[5].se < 0.99 * st[1].se;
      char line[256];
      std::snprintf(line, sizeof line, "| %d | %.3e | %.3e | %.3e | %.3e | %.0f / %.0f |\n", l, st[0].rel(), st[1].rel(),
                    st[4].rel(), st[5].rel(), 100.0 * st[4].delta_intervals / std::max<std::int64_t>(1, st[4].intervals),
                    100.0 * st[5].delta_intervals / std::max<std::int64_t>(1, st[5].intervals));
      per_layer << line;
    }
    std::printf("\n### %s (%zu layers, %ld tokens, %ld KV heads, head_dim %ld; intervals of 64 tokens)\n\n", titles[k],
                layers.size(), static_cast<long>(tokens), static_cast<long>(heads), static_cast<long>(hd));
    std::printf("| variant | bits/value | MSE | MSE / mean x^2 | max abs error | intervals coded as deltas |\n");
    std::printf("|---|--:|--:|--:|--:|--:|\n");
    for (int v = 0; v < kVariants; ++v) {
      const bool has_choice = v >= 1 && v <= 10;
      char share[32] = "-";
      if (has_choice)
        std::snprintf(share, sizeof share, "%.1f %%",
                      100.0 * total[v].delta_intervals / std::max<std::int64_t>(1, total[v].intervals));
      const double bits = has_choice && total[v].n ? 8.0 * static_cast<double>(total[v].bytes) / static_cast<double>(total[v].n) : kBits[v];
      std::printf("| %s | %.3f | %.4e | %.4e | %.4f | %s |\n", kNames[v], bits, total[v].mse(), total[v].rel(),
                  total[v].maxe, share);
    }
    std::printf("\nLayers where never-expand beats kf64 plain by more than 1 %% of MSE: anchor %d / %zu, chained %d / %zu.\n",
                better_a, layers.size(), better_c, layers.size());
    std::printf("\n<details><summary>per layer: MSE / mean x^2 (int4-g32, kf64 plain, kf64 anchor+NE, kf64 chained+NE), "
                "%% intervals as deltas (anchor / chained)</summary>\n\n| layer | int4-g32 | kf64 plain | anchor+NE | "
                "chained+NE | delta %% |\n|--:|--:|--:|--:|--:|--:|\n%s\n</details>\n",
                per_layer.str().c_str());
  }
  return 0;
}
