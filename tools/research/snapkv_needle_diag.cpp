// kvpack-snapkv-diag: why does SnapKV at a 25 % budget lose the passkey needle on SmolLM2-135M?
// (docs/RESULTS-snapkv-needle.md). Eval-only diagnostic, not part of the library.
//
// It runs the kvpack-eval needle protocol (4096-token passkey prompt prefilled in chunks of 32,
// compressed at its end, the answer then fed one token at a time, teacher-forced) with its own
// float32 reference cache (DiagCache below) that keeps every prompt token and a per-(layer, KV
// head) keep mask. The prompt is prefilled once per depth with nothing evicted, recording the
// softmax rows of the last 64 prompt queries (every query head); every selection variant
// (SnapKV knobs, Ada-KV, PyramidKV, an answer-attention oracle) is then a keep mask computed from
// those rows, and only the answer is decoded again per variant. Since SnapKV evicts nothing during
// prefill, this reproduces `snapkv-25` of kvpack-eval up to float rounding, at a fraction of the
// CPU time.
//
// Output: one line per (variant, depth) with log p(answer) in nats, exact match, and per answer
// token log p and the greedy token; then a markdown table.
#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <fstream>
#include <numeric>
#include <sstream>
#include <string>
#include <vector>

#include <omp.h>

#include <CLI/CLI.hpp>

#include "llama/eval.hpp"
#include "llama/model.hpp"
#include "llama/needle_prompt.hpp"
#include "llama/progress.hpp"
#include "llama/tokenizer.hpp"

namespace {

namespace kl = kvpack::llama;
using kl::RowMat;
using Stride = Eigen::OuterStride<>;
using CMap = Eigen::Map<const RowMat, 0, Stride>;
using MMap = Eigen::Map<RowMat, 0, Stride>;

/// Float32 causal attention over every appended token, with a keep mask per layer and KV head
/// (masked tokens are invisible to every query). K/V rows [t][kv_heads][head_dim]. Optionally
/// records the softmax row of every query head for queries at cache indices [rec_from, rec_to):
/// rows[layer][(t - rec_from) * q_heads + h] = probabilities over keys 0..t.
struct DiagCache {
  int layers = 0, qh = 0, kvh = 0, hd = 0;
  struct Layer {
    std::vector<float> k, v;
    int64_t n = 0, last = 0;
    std::vector<std::vector<char>> keep;  // [kv head][token]
  };
  std::vector<Layer> L;
  int64_t rec_from = -1, rec_to = -1;
  std::vector<std::vector<std::vector<float>>> rows;

  explicit DiagCache(const kl::ModelConfig& c) : layers(c.layers), qh(c.q_heads), kvh(c.kv_heads), hd(c.head_dim) {
    L.resize(size_t(layers));
    for (auto& l : L) l.keep.resize(size_t(kvh));
  }
  void record(int64_t from, int64_t to) {
    rec_from = from;
    rec_to = to;
    rows.assign(size_t(layers), std::vector<std::vector<float>>(size_t((to - from) * qh)));
  }
  kvpack::Status append(int layer, std::span<const float> k, std::span<const float> v, std::span<const int32_t> pos) {
    Layer& l = L[size_t(layer)];
    l.k.insert(l.k.end(), k.begin(), k.end());
    l.v.insert(l.v.end(), v.begin(), v.end());
    l.last = static_cast<int64_t>(pos.size());
    l.n += l.last;
    for (auto& m : l.keep) m.resize(size_t(l.n), 1);
    return {};
  }
  kvpack::Status attend(int layer, std::span<const float> q, std::span<float> out) {
    Layer& l = L[size_t(layer)];
    const auto nq = static_cast<Eigen::Index>(q.size() / size_t(qh * hd));
    const Eigen::Index n = l.n;
    const int group = qh / kvh;
    const float scale = 1.f / std::sqrt(float(hd));
    RowMat S;
    for (int h = 0; h < qh; ++h) {
      const int g = h / group;
      CMap Q(q.data() + h * hd, nq, hd, Stride(qh * hd));
      CMap K(l.k.data() + g * hd, n, hd, Stride(kvh * hd));
      CMap V(l.v.data() + g * hd, n, hd, Stride(kvh * hd));
      S.noalias() = (Q * K.transpose()) * scale;
      const auto& keep = l.keep[size_t(g)];
      for (Eigen::Index i = 0; i < nq; ++i) {
        const int64_t t = n - nq + i;
        float mx = -INFINITY;
        for (Eigen::Index j = 0; j <= t; ++j)
          if (keep[size_t(j)]) mx = std::max(mx, S(i, j));
        double sum = 0;
        for (Eigen::Index j = 0; j < n; ++j) {
          const float p = (j <= t && keep[size_t(j)]) ? std::exp(S(i, j) - mx) : 0.f;
          S(i, j) = p;
          sum += p;
        }
        S.row(i) *= static_cast<float>(1.0 / sum);
        if (t >= rec_from && t < rec_to)
          rows[size_t(layer)][size_t((t - rec_from) * qh + h)].assign(S.row(i).data(), S.row(i).data() + t + 1);
      }
      MMap O(out.data() + h * hd, nq, hd, Stride(qh * hd));
      O.noalias() = S * V;
    }
    return {};
  }
  /// Drops every token from index p on (the decoded answer) and resets the keep masks to `masks`
  /// ([layer][kv head][p], empty = keep all).
  void restore(int64_t p, const std::vector<std::vector<std::vector<char>>>& masks) {
    for (int li = 0; li < layers; ++li) {
      Layer& l = L[size_t(li)];
      l.k.resize(size_t(p * kvh * hd));
      l.v.resize(size_t(p * kvh * hd));
      l.n = p;
      for (int g = 0; g < kvh; ++g) l.keep[size_t(g)] = masks.empty() ? std::vector<char>(size_t(p), 1) : masks[size_t(li)][size_t(g)];
    }
  }
};

/// One selection rule. Budget per (layer, KV head): `total` tokens including the window and sinks.
struct Variant {
  std::string name;
  int window = 32, kernel = 5;
  bool avg_pool = false, group_max = false;
  int sinks = 0;
  enum Alloc { uniform, adakv, pyramid, oracle, full } alloc = uniform;
  int64_t total = 1024;
  double alpha = 0.2;  // Ada-KV safeguard: each head keeps at least alpha * its uniform share
  int beta = 20;       // PyramidKV: top layer gets budget / beta
};

using Masks = std::vector<std::vector<std::vector<char>>>;

/// Ranks candidates [0, n) by (pooled desc, raw desc, index asc), as eviction::snapkv_select.
std::vector<float> pool(const std::vector<float>& raw, int kernel, bool avg) {
  const auto n = static_cast<int64_t>(raw.size());
  std::vector<float> p(raw.size());
  const int half = kernel / 2;
  for (int64_t i = 0; i < n; ++i) {
    float m = avg ? 0.f : raw[size_t(i)];
    for (int64_t j = std::max<int64_t>(0, i - half); j <= std::min(n - 1, i + half); ++j)
      m = avg ? m + raw[size_t(j)] : std::max(m, raw[size_t(j)]);
    p[size_t(i)] = avg ? m / float(kernel) : m;  // avg: zero padding, count_include_pad (torch)
  }
  return p;
}

std::vector<int64_t> rank(const std::vector<float>& pooled, const std::vector<float>& raw) {
  std::vector<int64_t> o(raw.size());
  std::iota(o.begin(), o.end(), int64_t{0});
  std::stable_sort(o.begin(), o.end(), [&](int64_t a, int64_t b) {
    if (pooled[size_t(a)] != pooled[size_t(b)]) return pooled[size_t(a)] > pooled[size_t(b)];
    if (raw[size_t(a)] != raw[size_t(b)]) return raw[size_t(a)] > raw[size_t(b)];
    return a < b;
  });
  return o;
}

/// Keep masks for variant v from the recorded rows. win_rows: rows of queries [P - 64, P);
/// ans_rows: rows of the answer queries (full-cache run), for the oracle.
Masks select(const Variant& v, const DiagCache& dc, const std::vector<std::vector<std::vector<float>>>& win_rows,
             int64_t win_from, const std::vector<std::vector<std::vector<float>>>& ans_rows, int64_t n_ans, int64_t P) {
  const int qh = dc.qh, kvh = dc.kvh, group = qh / kvh, layers = dc.layers;
  Masks m(size_t(layers), std::vector<std::vector<char>>(size_t(kvh), std::vector<char>(size_t(P), 0)));
  if (v.alloc == Variant::full) {
    for (auto& l : m)
      for (auto& h : l) std::fill(h.begin(), h.end(), 1);
    return m;
  }
  const int64_t W = v.window;
  const int64_t ncand = P - W;  // candidates [0, P - W); window [P - W, P) always kept
  for (int li = 0; li < layers; ++li) {
    int64_t B = v.total - W - v.sinks;  // selected per head, uniform
    if (v.alloc == Variant::pyramid) {
      const double top = double(v.total - W) / v.beta, bottom = 2.0 * double(v.total - W) - top;
      B = static_cast<int64_t>(std::llround(bottom - (bottom - top) * li / double(layers - 1))) - v.sinks;
    }
    std::vector<std::vector<float>> raw(size_t(kvh), std::vector<float>(size_t(ncand), 0.f));
    for (int g = 0; g < kvh; ++g) {
      auto& r = raw[size_t(g)];
      for (int j = 0; j < group; ++j) {
        const int h = g * group + j;
        std::vector<float> s(size_t(ncand), 0.f);
        if (v.alloc == Variant::oracle) {
          for (int64_t a = 0; a < n_ans; ++a) {
            const auto& row = ans_rows[size_t(li)][size_t(a * qh + h)];
            for (int64_t t = 0; t < ncand; ++t) s[size_t(t)] += row[size_t(t)];
          }
        } else {
          for (int64_t t = P - W; t < P; ++t) {
            const auto& row = win_rows[size_t(li)][size_t((t - win_from) * qh + h)];
            for (int64_t c = 0; c < ncand; ++c) s[size_t(c)] += row[size_t(c)];
          }
        }
        for (int64_t c = 0; c < ncand; ++c)
          r[size_t(c)] = v.group_max ? std::max(r[size_t(c)], s[size_t(c)]) : r[size_t(c)] + s[size_t(c)] / float(group);
      }
    }
    for (int g = 0; g < kvh; ++g) {
      for (int64_t t = P - W; t < P; ++t) m[size_t(li)][size_t(g)][size_t(t)] = 1;
      for (int64_t t = 0; t < std::min<int64_t>(v.sinks, ncand); ++t) m[size_t(li)][size_t(g)][size_t(t)] = 1;
    }
    std::vector<std::vector<float>> pooled(static_cast<size_t>(kvh));
    std::vector<std::vector<int64_t>> order(static_cast<size_t>(kvh));
    for (int g = 0; g < kvh; ++g) {
      auto& r = raw[size_t(g)];
      for (int64_t t = 0; t < std::min<int64_t>(v.sinks, ncand); ++t) r[size_t(t)] = -1.f;  // already kept
      pooled[size_t(g)] = v.alloc == Variant::oracle ? r : pool(r, v.kernel, v.avg_pool);
      order[size_t(g)] = rank(pooled[size_t(g)], r);
    }
    if (v.alloc != Variant::adakv) {
      for (int g = 0; g < kvh; ++g)
        for (int64_t i = 0; i < std::min<int64_t>(B, ncand - v.sinks); ++i)
          m[size_t(li)][size_t(g)][size_t(order[size_t(g)][size_t(i)])] = 1;
    } else {
      // Ada-KV (Feng et al. 2024, arXiv:2407.11550): each head keeps its top floor(alpha * B)
      // (safeguard), the rest of the layer's kvh * B goes to the largest pooled scores over all heads.
      const auto floor_b = static_cast<int64_t>(v.alpha * double(B));
      std::vector<std::tuple<float, int, int64_t>> rest;
      for (int g = 0; g < kvh; ++g) {
        const auto& o = order[size_t(g)];
        for (int64_t i = 0; i < static_cast<int64_t>(o.size()); ++i) {
          if (i < floor_b) m[size_t(li)][size_t(g)][size_t(o[size_t(i)])] = 1;
          else rest.emplace_back(pooled[size_t(g)][size_t(o[size_t(i)])], g, o[size_t(i)]);
        }
      }
      const int64_t extra = kvh * B - kvh * floor_b;
      std::partial_sort(rest.begin(), rest.begin() + std::min<int64_t>(extra, int64_t(rest.size())), rest.end(),
                        [](const auto& a, const auto& b) { return std::get<0>(a) > std::get<0>(b); });
      for (int64_t i = 0; i < std::min<int64_t>(extra, int64_t(rest.size())); ++i)
        m[size_t(li)][size_t(std::get<1>(rest[size_t(i)]))][size_t(std::get<2>(rest[size_t(i)]))] = 1;
    }
  }
  return m;
}

struct TokenOut {
  double logp;
  int32_t top;
};

double logp_of(RowMat& lg, Eigen::Index row, int32_t want, int32_t& top) {
  auto r = lg.row(row);
  kl::log_softmax(r);
  Eigen::Index t = 0;
  r.maxCoeff(&t);
  top = static_cast<int32_t>(t);
  return r[want];
}

}  // namespace

int main(int argc, char** argv) {
  CLI::App app{"kvpack-snapkv-diag: SnapKV needle diagnostics on the kvpack-eval passkey protocol"};
  std::string model_path, filler_path = "../shared/data/wikitext-2-raw/wiki.test.raw";
  int threads = 1;
  int64_t len = 4096;
  std::vector<int> depths{10, 50, 90};
  std::string only;
  app.add_option("--model", model_path, "GGUF model (default: the fetch_model.sh cache path)");
  app.add_option("--filler", filler_path, "Needle filler text");
  app.add_option("--threads", threads, "OpenMP threads");
  app.add_option("--length", len, "Needle prompt length in tokens");
  app.add_option("--depths", depths, "Needle depths in percent")->delimiter(',');
  app.add_option("--only", only, "Comma-separated variant names to run, exactly as printed (default: all)");
  bool progress = false;
  app.add_flag("--progress", progress, "Progress bar on stderr even when it is not a terminal");
  CLI11_PARSE(app, argc, argv);
  omp_set_num_threads(threads);
  if (model_path.empty()) model_path = std::string(std::getenv("HOME")) + "/.cache/kvpack/models/SmolLM2-135M-Instruct.Q4_1.gguf";
  auto file = kl::GgufFile::open(model_path);
  if (!file) return std::fprintf(stderr, "cannot open model\n"), 1;
  auto model = kl::Model::from_gguf(*file, model_path);
  auto tok = kl::Tokenizer::from_gguf(*file);
  if (!model || !tok) return std::fprintf(stderr, "cannot load model/tokenizer\n"), 1;
  std::ifstream fin(filler_path, std::ios::binary);
  std::stringstream ss;
  ss << fin.rdbuf();
  const std::string ftext = ss.str();
  if (ftext.empty()) return std::fprintf(stderr, "cannot read filler\n"), 1;
  const auto filler = tok->encode(ftext.substr(0, std::min<size_t>(ftext.size(), 200000)));

  std::vector<Variant> variants;
  auto add = [&](Variant v) { variants.push_back(std::move(v)); };
  add({.name = "full", .alloc = Variant::full});
  add({.name = "snapkv-25 (w32 k5 max mean)"});
  add({.name = "oracle-1024 (answer attention)", .window = 0, .alloc = Variant::oracle});
  add({.name = "oracle-992+w32", .window = 32, .alloc = Variant::oracle});
  for (int w : {16, 64}) add({.name = "w" + std::to_string(w), .window = w});
  for (int k : {1, 7}) add({.name = "k" + std::to_string(k), .kernel = k});
  for (int k : {5, 7}) add({.name = "avgpool k" + std::to_string(k), .kernel = k, .avg_pool = true});
  add({.name = "gqa max", .group_max = true});
  add({.name = "sinks 4", .sinks = 4});
  add({.name = "adakv a0.2", .alloc = Variant::adakv});
  add({.name = "pyramidkv b20", .alloc = Variant::pyramid});
  add({.name = "w16 k1", .window = 16, .kernel = 1});
  add({.name = "w64 avgpool k5", .window = 64, .avg_pool = true});
  add({.name = "adakv avgpool k5", .avg_pool = true, .alloc = Variant::adakv});
  add({.name = "oracle-512 (answer attention)", .window = 0, .alloc = Variant::oracle, .total = 512});
  add({.name = "oracle-256 (answer attention)", .window = 0, .alloc = Variant::oracle, .total = 256});
  // Second round: around kernel 7.
  for (int k : {9, 11}) add({.name = "k" + std::to_string(k), .kernel = k});
  add({.name = "avgpool k9", .kernel = 9, .avg_pool = true});
  add({.name = "k7 w16", .window = 16, .kernel = 7});
  add({.name = "k7 w64", .window = 64, .kernel = 7});
  add({.name = "k7 gqa max", .kernel = 7, .group_max = true});
  add({.name = "k7 sinks 4", .kernel = 7, .sinks = 4});
  add({.name = "k7 adakv a0.2", .kernel = 7, .alloc = Variant::adakv});
  add({.name = "k7 pyramidkv b20", .kernel = 7, .alloc = Variant::pyramid});
  add({.name = "k7 total 512 (12.5 %)", .kernel = 7, .total = 512});
  add({.name = "k5 total 512 (12.5 %)", .total = 512});
  // Third round: smaller budgets with the wider kernel.
  add({.name = "k9 total 512 (12.5 %)", .kernel = 9, .total = 512});
  add({.name = "k9 total 256 (6.25 %)", .kernel = 9, .total = 256});
  add({.name = "k11 total 512 (12.5 %)", .kernel = 11, .total = 512});
  if (!only.empty()) {
    std::vector<Variant> keep;
    std::stringstream os(only);
    for (std::string n; std::getline(os, n, ',');)
      for (const auto& v : variants)
        if (v.name == n) keep.push_back(v);
    variants = keep;
  }

  struct Cell {
    double logp = 0;
    bool exact = true;
    std::string detail;
  };
  std::vector<std::vector<Cell>> cells(variants.size(), std::vector<Cell>(depths.size()));
  // Work units: per depth, the prompt tokens once, then 8 units per (short) answer pass, one per variant + 1.
  kl::Progress prog(int64_t(depths.size()) * (len + int64_t(variants.size() + 1) * 8), progress);
  for (size_t di = 0; di < depths.size(); ++di) {
    // The same case kvpack-eval's needle test builds (llama/needle_prompt.hpp), or a clear error.
    auto made = kl::make_passkey_prompt(*tok, filler, len, depths[di]);
    if (!made) return std::fprintf(stderr, "kvpack-snapkv-diag: %s\n", made.error().message.c_str()), 1;
    const kl::PasskeyPrompt& c = *made;
    const auto P = static_cast<int64_t>(c.prompt.size());
    const auto A = static_cast<int64_t>(c.answer.size());
    std::printf("depth %d: prompt %lld tokens, needle at [%lld, %lld), answer %lld tokens:", depths[di], (long long)P,
                (long long)c.needle_at, (long long)(c.needle_at + c.needle_len), (long long)A);
    for (auto t : c.answer) std::printf(" [%s]", tok->decode(std::span(&t, 1)).c_str());
    std::printf("\n");
    std::fflush(stdout);
    DiagCache dc(model->cfg);
    const int64_t win_from = P - 64;
    dc.record(win_from, P);
    RowMat lg;
    TokenOut first{};
    for (int64_t s = 0; s < P; s += 32) {
      const int64_t e = std::min(P, s + 32);
      auto st = model->forward(dc, std::span(c.prompt).subspan(size_t(s), size_t(e - s)), int32_t(s), e - s - (e == P ? 1 : 0),
                               lg);
      if (!st) return std::fprintf(stderr, "forward failed\n"), 1;
      if (e == P) first.logp = logp_of(lg, 0, c.answer[0], first.top);
      prog.advance(e - s);
    }
    auto win_rows = std::move(dc.rows);
    // Full-cache answer pass, recording the answer queries' rows (oracle).
    dc.record(P, P + A - 1);
    std::vector<std::vector<std::vector<float>>> ans_rows;
    for (size_t vi = 0; vi <= variants.size(); ++vi) {
      // vi == 0: the full-cache pass that records the oracle rows (not reported unless "full").
      Masks m;
      const Variant* v = vi == 0 ? nullptr : &variants[vi - 1];
      if (v) m = select(*v, dc, win_rows, win_from, ans_rows, A - 1, P);
      dc.restore(P, m);
      if (vi == 1) dc.record(-1, -1);
      std::vector<TokenOut> toks{first};
      for (int64_t a = 0; a + 1 < A; ++a) {
        auto st = model->forward(dc, std::span(&c.answer[size_t(a)], 1), int32_t(P + a), 0, lg);
        if (!st) return std::fprintf(stderr, "forward failed\n"), 1;
        TokenOut t{};
        t.logp = logp_of(lg, 0, c.answer[size_t(a + 1)], t.top);
        toks.push_back(t);
      }
      prog.advance(8, v ? &v->name : nullptr);
      if (vi == 0) {
        ans_rows = std::move(dc.rows);
        continue;
      }
      Cell& cell = cells[vi - 1][di];
      std::ostringstream d;
      for (size_t a = 0; a < toks.size(); ++a) {
        cell.logp += toks[a].logp;
        const bool ok = toks[a].top == c.answer[a];
        cell.exact = cell.exact && ok;
        d << " " << (ok ? "" : "!") << std::string(tok->decode(std::span(&toks[a].top, 1))) << ":" << std::fixed;
        d.precision(2);
        d << toks[a].logp;
      }
      // Needle tokens kept: mean over KV heads of layers 0-11 and 12-29.
      double lo = 0, hi = 0;
      int nlo = 0, nhi = 0;
      if (!m.empty())
        for (int li = 0; li < dc.layers; ++li)
          for (int g = 0; g < dc.kvh; ++g) {
            int k = 0;
            for (int64_t t = c.needle_at; t < c.needle_at + c.needle_len; ++t) k += m[size_t(li)][size_t(g)][size_t(t)];
            (li < 12 ? lo : hi) += k;
            ++(li < 12 ? nlo : nhi);
          }
      char buf[128];
      std::snprintf(buf, sizeof buf, " | needle kept L0-11 %.1f, L12-29 %.1f of %lld", nlo ? lo / nlo : double(c.needle_len),
                    nhi ? hi / nhi : double(c.needle_len), (long long)c.needle_len);
      cell.detail = d.str() + buf;
      // Per answer token, per copy of the key in the needle: of the layers x KV heads, how many keep it.
      if (!m.empty()) {
        std::string kept = " | kept of " + std::to_string(dc.layers * dc.kvh) + " (layer, KV head) pairs:";
        for (int64_t t = c.needle_at; t + A <= c.needle_at + c.needle_len; ++t) {
          if (!std::equal(c.answer.begin(), c.answer.end(), c.prompt.begin() + t)) continue;
          kept += " key@" + std::to_string(t) + " [";
          for (int64_t a = 0; a < A; ++a) {
            int k = 0;
            for (int li = 0; li < dc.layers; ++li)
              for (int g = 0; g < dc.kvh; ++g) k += m[size_t(li)][size_t(g)][size_t(t + a)];
            kept += (a ? " " : "") + std::to_string(k);
          }
          kept += "]";
        }
        cell.detail += kept;
      }
      std::printf("  %-34s depth %2d: %s %7.2f |%s\n", v->name.c_str(), depths[di], cell.exact ? "ok " : "MISS", cell.logp,
                  cell.detail.c_str());
      std::fflush(stdout);
    }
  }
  prog.finish();
  std::printf("\n| variant |");
  for (int d : depths) std::printf(" %lld@%d%% |", (long long)len, d);
  std::printf(" exact | mean log p |\n|---|");
  for (size_t i = 0; i < depths.size(); ++i) std::printf("--:|");
  std::printf("--:|--:|\n");
  for (size_t vi = 0; vi < variants.size(); ++vi) {
    std::printf("| %s |", variants[vi].name.c_str());
    int ok = 0;
    double s = 0;
    for (const auto& c : cells[vi]) {
      std::printf(" %s %.2f |", c.exact ? "✓" : "✗", c.logp);
      ok += c.exact;
      s += c.logp;
    }
    std::printf(" %d/%zu | %.3f |\n", ok, depths.size(), s / double(depths.size()));
  }
  return 0;
}
