// The runner's hyper-parameters, read from a GGUF file's `llama.*` metadata and checked against
// each other and against the shapes of the tensors the runner loads, before any weight is
// dequantized (Model::from_gguf calls this first). No Eigen: tests build small files in memory.
#pragma once

#include <cmath>
#include <cstdint>
#include <limits>
#include <optional>
#include <string>
#include <vector>

#include <kvpack/result.hpp>

#include "gguf.hpp"

namespace kvpack::llama {

/// Hyper-parameters read from the GGUF metadata (`<arch>.*` keys).
struct ModelConfig {
  int layers = 0, d_model = 0, q_heads = 0, kv_heads = 0, head_dim = 0, ffn = 0, vocab = 0;
  int64_t context = 0;      ///< trained context length, tokens
  float rope_base = 10000;  ///< RoPE frequency base theta
  float rms_eps = 1e-5f;    ///< RMSNorm epsilon
};

namespace detail {
inline std::string dims_text(const std::vector<int64_t>& d) {
  std::string s = "[";
  for (std::size_t i = 0; i < d.size(); ++i) s += (i ? ", " : "") + std::to_string(d[i]);
  return s + "]";
}
}  // namespace detail

/// Reads and checks the hyper-parameters of a llama-architecture GGUF file (`path` labels errors).
/// Required keys: llama.block_count, embedding_length, attention.head_count,
/// attention.head_count_kv, feed_forward_length, context_length (each a positive int that fits
/// an int); optional: rope.freq_base (default 10000), attention.layer_norm_rms_epsilon (1e-5),
/// both finite and positive. head_dim = embedding_length / head_count must be even.
/// Checked against each other and the tensors, when present (every mismatch is an error naming
/// the key, both values and the file): llama.vocab_size and the length of tokenizer.ggml.tokens
/// against the rows of token_embd.weight; llama.rope.dimension_count against head_dim (the runner
/// rotates whole heads: partial RoPE, a count below head_dim, is Errc::unsupported);
/// llama.attention.key_length / value_length against head_dim; the shape of every tensor the
/// runner loads (token_embd, output_norm, output if present, and per block attn_norm, ffn_norm,
/// attn_q/k/v/output, ffn_gate/up/down) against the keys it follows from; no tensors of a block
/// at or past block_count. Errors: Errc::unsupported (not llama, partial RoPE), else
/// Errc::corrupt_data.
[[nodiscard]] inline Result<ModelConfig> read_model_config(const GgufFile& f, const std::string& path) {
  const auto arch = f.get_string("general.architecture");
  if (!arch) return fail(Errc::corrupt_data, path + ": no general.architecture");
  if (*arch != "llama") return fail(Errc::unsupported, path + ": architecture '" + *arch + "' is not llama");
  const std::string a = *arch + ".";
  ModelConfig c;
  std::string missing, bad;
  auto geti = [&](const char* key) -> int {
    const auto v = f.get_int(a + key);
    if (!v) missing += std::string(missing.empty() ? "" : ", ") + a + key;
    else if (*v <= 0 || *v > std::numeric_limits<int>::max())
      bad += std::string(bad.empty() ? "" : ", ") + a + key + " = " + std::to_string(*v);
    return v && *v > 0 && *v <= std::numeric_limits<int>::max() ? static_cast<int>(*v) : 0;
  };
  c.layers = geti("block_count");
  c.d_model = geti("embedding_length");
  c.q_heads = geti("attention.head_count");
  c.kv_heads = geti("attention.head_count_kv");
  c.ffn = geti("feed_forward_length");
  c.context = geti("context_length");
  if (!missing.empty()) return fail(Errc::corrupt_data, path + ": missing metadata " + missing);
  if (!bad.empty()) return fail(Errc::corrupt_data, path + ": hyper-parameters must be positive ints: " + bad);
  const double rope_base = f.get_float(a + "rope.freq_base").value_or(10000.0);
  const double rms_eps = f.get_float(a + "attention.layer_norm_rms_epsilon").value_or(1e-5);
  if (!(std::isfinite(rope_base) && rope_base > 0 && rope_base < 3e38))
    return fail(Errc::corrupt_data, path + ": " + a + "rope.freq_base = " + std::to_string(rope_base) + " is not a positive float");
  if (!(std::isfinite(rms_eps) && rms_eps > 0 && rms_eps < 1))
    return fail(Errc::corrupt_data, path + ": " + a + "attention.layer_norm_rms_epsilon = " + std::to_string(rms_eps) +
                                        " is not in (0, 1)");
  c.rope_base = static_cast<float>(rope_base);
  c.rms_eps = static_cast<float>(rms_eps);
  if (c.d_model % c.q_heads != 0)
    return fail(Errc::corrupt_data, path + ": " + a + "embedding_length = " + std::to_string(c.d_model) + " is not a multiple of " +
                                        a + "attention.head_count = " + std::to_string(c.q_heads));
  if (c.q_heads % c.kv_heads != 0)
    return fail(Errc::corrupt_data, path + ": " + a + "attention.head_count = " + std::to_string(c.q_heads) + " is not a multiple of " +
                                        a + "attention.head_count_kv = " + std::to_string(c.kv_heads));
  c.head_dim = c.d_model / c.q_heads;
  if (c.head_dim % 2 != 0)
    return fail(Errc::corrupt_data, path + ": head_dim = " + a + "embedding_length / " + a + "attention.head_count = " +
                                        std::to_string(c.head_dim) + " is odd (RoPE rotates channel pairs)");
  const std::string hd_text = "head_dim (" + a + "embedding_length / " + a + "attention.head_count) = " + std::to_string(c.head_dim);
  auto same = [&](const std::string& key, int64_t expected, const std::string& what) -> Status {
    if (const auto v = f.get_int(key); v && *v != expected)
      return fail(Errc::corrupt_data, path + ": " + key + " = " + std::to_string(*v) + " disagrees with " + what);
    return {};
  };
  if (const auto rd = f.get_int(a + "rope.dimension_count"); rd && *rd != c.head_dim)
    return fail(*rd < c.head_dim && *rd > 0 ? Errc::unsupported : Errc::corrupt_data,
                path + ": " + a + "rope.dimension_count = " + std::to_string(*rd) + " disagrees with " + hd_text +
                    (*rd < c.head_dim && *rd > 0 ? " (partial RoPE is not implemented: the runner rotates whole heads)" : ""));
  if (auto st = same(a + "attention.key_length", c.head_dim, hd_text); !st) return st.error();
  if (auto st = same(a + "attention.value_length", c.head_dim, hd_text); !st) return st.error();

  // Tensor shapes (GGUF dims[0] is the input, fastest axis: a [out][in] matrix has dims {in, out}).
  auto shape = [&](const std::string& name, std::vector<int64_t> want, const std::string& from, bool required = true) -> Status {
    const TensorInfo* t = f.tensor(name);
    if (!t) return required ? fail(Errc::corrupt_data, path + ": tensor " + name + " is missing") : Status{};
    std::vector<int64_t> got = t->dims;
    while (got.size() > want.size() && got.back() == 1) got.pop_back();
    while (got.size() < want.size()) got.push_back(1);
    for (std::size_t i = 0; i < want.size(); ++i)
      if (want[i] >= 0 && got[i] != want[i])
        return fail(Errc::corrupt_data, path + ": tensor " + name + " has dims " + detail::dims_text(t->dims) + "; " + from +
                                            " ask for " + detail::dims_text(want) + " (-1: any)");
    return {};
  };
  const std::string d_text = a + "embedding_length = " + std::to_string(c.d_model);
  if (auto st = shape("token_embd.weight", {c.d_model, -1}, d_text); !st) return st.error();
  const int64_t rows = f.tensor("token_embd.weight")->dims.size() > 1 ? f.tensor("token_embd.weight")->dims[1] : 1;
  if (rows > std::numeric_limits<int>::max())
    return fail(Errc::corrupt_data, path + ": token_embd.weight has " + std::to_string(rows) + " rows");
  c.vocab = static_cast<int>(rows);
  const std::string rows_text = "the " + std::to_string(rows) + " rows of token_embd.weight";
  if (auto st = same(a + "vocab_size", rows, rows_text); !st) return st.error();
  if (const auto toks = f.get_string_array("tokenizer.ggml.tokens"); toks && static_cast<int64_t>(toks->size()) != rows)
    return fail(Errc::corrupt_data, path + ": tokenizer.ggml.tokens holds " + std::to_string(toks->size()) +
                                        " tokens, which disagrees with " + rows_text);
  if (auto st = shape("output_norm.weight", {c.d_model}, d_text); !st) return st.error();
  if (auto st = shape("output.weight", {c.d_model, rows}, d_text + " and " + rows_text, false); !st) return st.error();
  const int64_t qd = int64_t{c.q_heads} * c.head_dim, kvd = int64_t{c.kv_heads} * c.head_dim;
  const std::string kv_text = a + "attention.head_count_kv = " + std::to_string(c.kv_heads) + " and " + hd_text;
  const std::string ffn_text = a + "feed_forward_length = " + std::to_string(c.ffn);
  for (int l = 0; l < c.layers; ++l) {
    const std::string p = "blk." + std::to_string(l) + ".";
    for (Status st : {shape(p + "attn_norm.weight", {c.d_model}, d_text), shape(p + "ffn_norm.weight", {c.d_model}, d_text),
                      shape(p + "attn_q.weight", {c.d_model, qd}, d_text),
                      shape(p + "attn_k.weight", {c.d_model, kvd}, d_text + ", " + kv_text),
                      shape(p + "attn_v.weight", {c.d_model, kvd}, d_text + ", " + kv_text),
                      shape(p + "attn_output.weight", {qd, c.d_model}, d_text),
                      shape(p + "ffn_gate.weight", {c.d_model, c.ffn}, d_text + ", " + ffn_text),
                      shape(p + "ffn_up.weight", {c.d_model, c.ffn}, d_text + ", " + ffn_text),
                      shape(p + "ffn_down.weight", {c.ffn, c.d_model}, d_text + ", " + ffn_text)})
      if (!st) return st.error();
  }
  for (const TensorInfo& t : f.tensors()) {
    if (t.name.rfind("blk.", 0) != 0) continue;
    const std::size_t dot = t.name.find('.', 4);
    const std::string num = t.name.substr(4, dot == std::string::npos ? std::string::npos : dot - 4);
    if (num.empty() || num.size() > 9 || num.find_first_not_of("0123456789") != std::string::npos) continue;
    if (std::stol(num) >= c.layers)
      return fail(Errc::corrupt_data, path + ": " + a + "block_count = " + std::to_string(c.layers) + " but the file holds " +
                                          t.name + " (a block past the count)");
  }
  return c;
}

}  // namespace kvpack::llama
