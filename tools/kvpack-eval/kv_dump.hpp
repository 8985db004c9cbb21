// kvpack-eval --dump-kv: K (pre- and post-RoPE) and V of chosen layers of the fp32 run of the
// first window, written as NumPy .npy files for the research tools (kvpack-keyframe-study).
#pragma once

#include <algorithm>
#include <filesystem>
#include <fstream>
#include <map>
#include <span>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "options.hpp"

namespace kvpack_eval {

/// Collects K (pre- and post-RoPE) and V of chosen layers during one run, then writes .npy files.
struct KvDump {
  std::vector<int> layers;
  std::map<int, std::vector<float>> k_pre, k_post, v;
  int kv_heads = 0, head_dim = 0;

  kl::KvTap tap() {
    return [this](int layer, std::span<const float> kp, std::span<const float> k, std::span<const float> vv) {
      if (std::find(layers.begin(), layers.end(), layer) == layers.end()) return;
      k_pre[layer].insert(k_pre[layer].end(), kp.begin(), kp.end());
      k_post[layer].insert(k_post[layer].end(), k.begin(), k.end());
      v[layer].insert(v[layer].end(), vv.begin(), vv.end());
    };
  }
  // NumPy .npy v1.0: magic, header dict padded with spaces to a multiple of 64 bytes, raw data.
  static bool write_npy(const std::filesystem::path& p, const std::vector<float>& data, int64_t a, int64_t b, int64_t c) {
    std::string h = "{'descr': '<f4', 'fortran_order': False, 'shape': (" + std::to_string(a) + ", " +
                    std::to_string(b) + ", " + std::to_string(c) + "), }";
    h += std::string(64 - (10 + h.size() + 1) % 64, ' ') + "\n";
    std::ofstream f(p, std::ios::binary);
    const unsigned char pre[8] = {0x93, 'N', 'U', 'M', 'P', 'Y', 1, 0};
    f.write(reinterpret_cast<const char*>(pre), 8);
    const uint16_t hl = static_cast<uint16_t>(h.size());
    const char len[2] = {static_cast<char>(hl & 0xff), static_cast<char>(hl >> 8)};
    f.write(len, 2);
    f.write(h.data(), static_cast<std::streamsize>(h.size()));
    f.write(reinterpret_cast<const char*>(data.data()), static_cast<std::streamsize>(data.size() * sizeof(float)));
    return static_cast<bool>(f);
  }
  kvpack::Status write(const std::string& dir, const std::vector<int32_t>& tokens, const kl::ModelConfig& cfg,
                       const std::string& model) {
    std::error_code ec;
    std::filesystem::create_directories(dir, ec);
    if (ec) return kvpack::fail(kvpack::Errc::io_error, "--dump-kv: cannot create " + dir + ": " + ec.message());
    const int64_t row = int64_t(kv_heads) * head_dim;
    for (int l : layers) {
      char stem[32];
      std::snprintf(stem, sizeof stem, "layer%02d_", l);
      const int64_t n = static_cast<int64_t>(v[l].size()) / row;
      for (auto [name, buf] : {std::pair{"k_prerope", &k_pre[l]}, std::pair{"k", &k_post[l]}, std::pair{"v", &v[l]}})
        if (!write_npy(std::filesystem::path(dir) / (std::string(stem) + name + ".npy"), *buf, n, kv_heads, head_dim))
          return kvpack::fail(kvpack::Errc::io_error, "--dump-kv: cannot write into " + dir);
    }
    nlohmann::json meta = {{"model", model},
                           {"layout", "[tokens][kv_heads][head_dim] float32, token t at position t"},
                           {"files", "layerLL_k_prerope.npy (K before RoPE), layerLL_k.npy (K after RoPE), layerLL_v.npy"},
                           {"rope", "adjacent pairs (2i, 2i+1) rotated by pos * freq_base^(-2i/head_dim)"},
                           {"rope_freq_base", cfg.rope_base},
                           {"layers", layers},
                           {"kv_heads", kv_heads},
                           {"head_dim", head_dim},
                           {"tokens", tokens}};
    std::ofstream(std::filesystem::path(dir) / "meta.json") << meta.dump(1) << "\n";
    return {};
  }
};

}  // namespace kvpack_eval
