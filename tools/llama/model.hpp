// kvpack::llama::Model: a compact LLaMA-architecture forward pass (RMSNorm, RoPE, GQA, SwiGLU,
// tied or separate output head) whose KV cache is any type with kvpack::KVCache's interface.
#pragma once

#include <Eigen/Core>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <functional>
#include <span>
#include <string>
#include <vector>

#ifdef _OPENMP
#include <omp.h>
#endif

#include <kvpack/kv_cache.hpp>  // kvpack::ModelShape
#include <kvpack/result.hpp>

#include "dequant.hpp"
#include "gguf.hpp"
#include "model_config.hpp"

namespace kvpack::llama {

/// Row-major float32 matrix; activations are [tokens][features], weights [out][in].
using RowMat = Eigen::Matrix<float, Eigen::Dynamic, Eigen::Dynamic, Eigen::RowMajor>;

/// Weights of one transformer block, dequantized to float32 at load. Matrices are [out][in].
struct LayerWeights {
  Eigen::VectorXf attn_norm, ffn_norm;  // [d_model]
  RowMat wq, wk, wv, wo;                // [q_heads*hd][d], [kv_heads*hd][d] x2, [d][q_heads*hd]
  RowMat w_gate, w_up, w_down;          // [ffn][d], [ffn][d], [d][ffn]
};

/// Observer of each layer's K before RoPE, K after RoPE and V, each [n][kv_heads][head_dim].
using KvTap = std::function<void(int layer, std::span<const float> k_pre_rope,
                                 std::span<const float> k, std::span<const float> v)>;

/// Y = X * W^T, Y [n][out], X [n][in], W [out][in]; output features split across OpenMP threads
/// (Eigen parallelises neither small GEMMs nor GEMVs, and decode is all GEMVs).
/// batch_invariant: a row's result does not depend on how many rows X has. Eigen computes one
/// row as a GEMV and several as a GEMM, with other summation orders; so one row is computed as
/// a two-row GEMM (the row twice), whose rows equal those of any larger GEMM (checked for every
/// SmolLM2 shape and 1-40 rows). A serving engine needs this to decode a request in a batch
/// exactly as alone; it costs single-token decode some speed.
inline void linear(const RowMat& X, const RowMat& W, RowMat& Y, bool batch_invariant = false) {
  if (batch_invariant && X.rows() == 1) {
    RowMat X2(2, X.cols()), Y2;
    X2.row(0) = X.row(0);
    X2.row(1) = X.row(0);
    linear(X2, W, Y2);
    Y = Y2.topRows(1);
    return;
  }
  Y.resize(X.rows(), W.rows());
  const Eigen::Index out = W.rows();
#pragma omp parallel
  {
    Eigen::Index t = 0, nt = 1;
#ifdef _OPENMP
    t = omp_get_thread_num();
    nt = omp_get_num_threads();
#endif
    const Eigen::Index b = (out * t / nt) & ~Eigen::Index{15};
    const Eigen::Index e = t + 1 == nt ? out : (out * (t + 1) / nt) & ~Eigen::Index{15};
    if (e > b) Y.middleCols(b, e - b).noalias() = X * W.middleRows(b, e - b).transpose();
  }
}

/// LLaMA-architecture model with float32 weights. The KV cache is passed to forward(), so one
/// loaded model serves any number of caches and policies.
class Model {
 public:
  ModelConfig cfg;
  Eigen::VectorXf out_norm;  // [d_model]
  RowMat tok_embd;           // [vocab][d_model]
  RowMat output;             // [vocab][d_model]; empty when the head is tied to tok_embd
  std::vector<LayerWeights> layers;
  /// Dense layers give each token the same result whatever the batch (see linear()); off by
  /// default (single-token decode is faster without it).
  bool batch_invariant = false;

  /// Loads a GGUF file of architecture "llama": metadata, then every weight dequantized to fp32.
  /// Errors: unreadable/corrupt file, other architecture, missing tensor, shape mismatch.
  [[nodiscard]] static Result<Model> load(const std::string& path) {
    auto file = GgufFile::open(path);
    if (!file) return file.error();
    return from_gguf(*file, path);
  }

  /// As load(), from an opened GGUF file; `path` only labels error messages.
  [[nodiscard]] static Result<Model> from_gguf(const GgufFile& f, const std::string& path) {
    // Keys, their agreement and every tensor shape are checked first (model_config.hpp).
    auto cfg = read_model_config(f, path);
    if (!cfg) return cfg.error();
    Model m;
    ModelConfig& c = m.cfg;
    c = *cfg;

    // Loads tensor `name` as a [rows][cols] matrix (GGUF dims: dims[0] = cols, fastest);
    // rows < 0 accepts any row count.
    auto load = [&](const std::string& name, int64_t rows, int64_t cols, RowMat& dst) -> Status {
      const TensorInfo* t = f.tensor(name);
      if (!t) return fail(Errc::corrupt_data, path + ": tensor " + name + " is missing");
      const int64_t d1 = t->dims.size() > 1 ? t->dims[1] : 1;
      if (t->dims.size() > 2 || t->dims[0] != cols || (rows >= 0 && d1 != rows))
        return fail(Errc::corrupt_data, path + ": tensor " + name + " has an unexpected shape");
      auto data = dequantize(*t);
      if (!data) return data.error();
      dst = Eigen::Map<const RowMat>(data->data(), d1, cols);
      return {};
    };
    auto load_vec = [&](const std::string& name, int64_t n, Eigen::VectorXf& dst) -> Status {
      RowMat tmp;
      if (auto st = load(name, 1, n, tmp); !st) return st;
      dst = tmp.row(0).transpose();
      return {};
    };
    const int64_t d = c.d_model, hd = c.head_dim, qd = c.q_heads * hd, kvd = c.kv_heads * hd;
    if (auto st = load("token_embd.weight", -1, d, m.tok_embd); !st) return st.error();
    c.vocab = static_cast<int>(m.tok_embd.rows());
    if (auto st = load_vec("output_norm.weight", d, m.out_norm); !st) return st.error();
    if (f.tensor("output.weight") != nullptr)
      if (auto st = load("output.weight", c.vocab, d, m.output); !st) return st.error();
    m.layers.resize(static_cast<size_t>(c.layers));
    for (int l = 0; l < c.layers; ++l) {
      const std::string p = "blk." + std::to_string(l) + ".";
      LayerWeights& w = m.layers[static_cast<size_t>(l)];
      for (auto st : {load_vec(p + "attn_norm.weight", d, w.attn_norm), load_vec(p + "ffn_norm.weight", d, w.ffn_norm),
                      load(p + "attn_q.weight", qd, d, w.wq), load(p + "attn_k.weight", kvd, d, w.wk),
                      load(p + "attn_v.weight", kvd, d, w.wv), load(p + "attn_output.weight", d, qd, w.wo),
                      load(p + "ffn_gate.weight", c.ffn, d, w.w_gate), load(p + "ffn_up.weight", c.ffn, d, w.w_up),
                      load(p + "ffn_down.weight", d, c.ffn, w.w_down)})
        if (!st) return st.error();
    }
    return m;
  }

  /// Cache shape for this model holding up to `max_tokens` tokens per layer.
  [[nodiscard]] ModelShape cache_shape(int64_t max_tokens) const {
    ModelShape s;
    s.layers = cfg.layers;
    s.q_heads = cfg.q_heads;
    s.kv_heads = cfg.kv_heads;
    s.head_dim = cfg.head_dim;
    s.max_tokens = max_tokens;
    s.rope_base = cfg.rope_base;  // read by PreRope<> caches, which rotate keys themselves
    s.rope_dims = cfg.head_dim;
    return s;
  }

  /// Runs tokens at positions pos0, pos0+1, ... through every layer, appending their K/V to
  /// `cache` and attending through it (a prefill chunk, or one decode token when size 1).
  /// On success `logits` holds [tokens.size() - logits_from][vocab] raw logits for the tokens
  /// from index `logits_from` on (pass tokens.size() to skip the output head).
  /// Errors: token id out of range, or any error of the cache (capacity, shape).
  template <class Cache>
  Status forward(Cache&& cache, std::span<const int32_t> tokens, int32_t pos0, int64_t logits_from,
                 RowMat& logits, const KvTap& tap = {}) const {
    std::vector<int32_t> pos(tokens.size());
    for (size_t t = 0; t < pos.size(); ++t) pos[t] = pos0 + static_cast<int32_t>(t);
    return forward_at(cache, tokens, pos, logits_from, logits, tap);
  }

  /// forward() with a position per token instead of consecutive ones: row t of every matrix is
  /// token t at position positions[t]. A batch of decode tokens from different sequences goes
  /// through the dense layers together this way; the cache adapter routes row t's K/V and query
  /// to its own sequence. Errors as forward(), and positions.size() != tokens.size().
  template <class Cache>
  Status forward_at(Cache&& cache, std::span<const int32_t> tokens, std::span<const int32_t> positions,
                    int64_t logits_from, RowMat& logits, const KvTap& tap = {}) const {
    const auto n = static_cast<Eigen::Index>(tokens.size());
    const int hd = cfg.head_dim, half = hd / 2;
    if (n == 0 || logits_from < 0 || logits_from > n)
      return fail(Errc::invalid_argument, "forward: empty chunk or bad logits_from");
    if (positions.size() != tokens.size()) return fail(Errc::invalid_argument, "forward: one position per token");
    RowMat x(n, cfg.d_model);
    for (Eigen::Index i = 0; i < n; ++i) {
      if (tokens[size_t(i)] < 0 || tokens[size_t(i)] >= cfg.vocab)
        return fail(Errc::invalid_argument, "forward: token id out of range");
      x.row(i) = tok_embd.row(tokens[size_t(i)]);
    }
    // RoPE tables [n][hd/2]: adjacent pairs (2i, 2i+1) rotate by pos * base^(-2i/hd). llama.cpp's
    // converter permutes Q/K rows so that GGUF llama models use this "normal" pairing.
    RowMat cos_t(n, half), sin_t(n, half);
    for (Eigen::Index t = 0; t < n; ++t)
      for (int i = 0; i < half; ++i) {
        const double ang = double(positions[size_t(t)]) * std::pow(double(cfg.rope_base), -2.0 * i / hd);
        cos_t(t, i) = static_cast<float>(std::cos(ang));
        sin_t(t, i) = static_cast<float>(std::sin(ang));
      }
    auto rope = [&](RowMat& m, int heads) {
      for (Eigen::Index t = 0; t < n; ++t)
        for (int h = 0; h < heads; ++h) {
          float* r = m.row(t).data() + h * hd;
          for (int i = 0; i < half; ++i) {
            const float a = r[2 * i], b = r[2 * i + 1], c = cos_t(t, i), s = sin_t(t, i);
            r[2 * i] = a * c - b * s;
            r[2 * i + 1] = a * s + b * c;
          }
        }
    };

    RowMat h, q, k, v, att(n, cfg.q_heads * hd), tmp, gate, up;
    for (int l = 0; l < cfg.layers; ++l) {
      const LayerWeights& w = layers[static_cast<size_t>(l)];
      rms_norm(x, w.attn_norm, h);
      linear(h, w.wq, q, batch_invariant);
      linear(h, w.wk, k, batch_invariant);
      linear(h, w.wv, v, batch_invariant);
      RowMat k_pre;
      if (tap) k_pre = k;
      if constexpr (!takes_pre_rope_v<std::remove_cvref_t<Cache>>) {  // PreRope<> caches rotate in attention
        rope(q, cfg.q_heads);
        rope(k, cfg.kv_heads);
        if (tap) tap(l, span_of(k_pre), span_of(k), span_of(v));
      } else if (tap) {
        RowMat k_post = k;
        rope(k_post, cfg.kv_heads);
        tap(l, span_of(k_pre), span_of(k_post), span_of(v));
      }
      if (auto st = cache.append(l, span_of(k), span_of(v), positions); !st) return st;
      if (auto st = cache.attend(l, span_of(q), std::span<float>(att.data(), size_t(att.size()))); !st) return st;
      linear(att, w.wo, tmp, batch_invariant);
      x += tmp;
      rms_norm(x, w.ffn_norm, h);
      linear(h, w.w_gate, gate, batch_invariant);
      linear(h, w.w_up, up, batch_invariant);
      gate = (gate.array() / (1.f + (-gate.array()).exp()) * up.array()).matrix();  // SiLU(g) * u
      linear(gate, w.w_down, tmp, batch_invariant);
      x += tmp;
    }
    const Eigen::Index m = n - logits_from;
    if (m == 0) {
      logits.resize(0, cfg.vocab);
      return {};
    }
    RowMat xs = x.bottomRows(m);
    rms_norm(xs, out_norm, h);
    linear(h, output.size() ? output : tok_embd, logits, batch_invariant);
    return {};
  }

 private:
  static std::span<const float> span_of(const RowMat& m) { return {m.data(), static_cast<size_t>(m.size())}; }
  void rms_norm(const RowMat& x, const Eigen::VectorXf& w, RowMat& y) const {
    y.resize(x.rows(), x.cols());
    for (Eigen::Index t = 0; t < x.rows(); ++t) {
      const float ms = x.row(t).squaredNorm() / static_cast<float>(x.cols());
      y.row(t) = x.row(t).cwiseProduct(w.transpose()) / std::sqrt(ms + cfg.rms_eps);
    }
  }
};

}  // namespace kvpack::llama
