#!/usr/bin/env python3
"""Independent float64 numpy forward pass of a GGUF LLaMA model (the oracle for model.hpp).

Reads weights with the `gguf` package (its own dequantizer, not ours), runs the whole
sequence at once with exact causal attention, and prints, for the given token ids,
the top-5 next tokens and the log-softmax of chosen tokens at every position.
Used to produce the golden numbers in test_real_model.cpp.

    python3 reference_forward.py MODEL.gguf 504 3575 282 4649 314
"""
import sys
import numpy as np
import gguf


def field(r, key):
    f = r.fields[key]
    v = f.parts[f.data[0]]
    return v[0] if len(v) == 1 else v


def main():
    path, ids = sys.argv[1], [int(t) for t in sys.argv[2:]]
    r = gguf.GGUFReader(path)
    W = {}
    for t in r.tensors:
        a = gguf.quants.dequantize(t.data, t.tensor_type).astype(np.float64)
        # numpy shape is reversed GGUF dims: [out][in] for matrices.
        W[t.name] = a.reshape([int(d) for d in reversed(t.shape)]) if len(t.shape) > 1 else a.reshape(-1)
    L = int(field(r, "llama.block_count"))
    nh = int(field(r, "llama.attention.head_count"))
    nkv = int(field(r, "llama.attention.head_count_kv"))
    d = int(field(r, "llama.embedding_length"))
    hd = d // nh
    base = float(field(r, "llama.rope.freq_base"))
    eps = float(field(r, "llama.attention.layer_norm_rms_epsilon"))
    n = len(ids)

    def rms(x, w):
        return x / np.sqrt((x * x).mean(-1, keepdims=True) + eps) * w

    pos = np.arange(n)[:, None]
    inv = base ** (-np.arange(0, hd, 2) / hd)  # [hd/2]
    ang = pos * inv[None, :]
    cos, sin = np.cos(ang), np.sin(ang)

    def rope(x):  # x: [n][heads][hd], adjacent pairs (2i, 2i+1)
        x0, x1 = x[..., 0::2], x[..., 1::2]
        c, s = cos[:, None, :], sin[:, None, :]
        out = np.empty_like(x)
        out[..., 0::2] = x0 * c - x1 * s
        out[..., 1::2] = x0 * s + x1 * c
        return out

    x = W["token_embd.weight"][ids]
    mask = np.triu(np.full((n, n), -np.inf), 1)
    for l in range(L):
        p = f"blk.{l}."
        h = rms(x, W[p + "attn_norm.weight"])
        q = rope((h @ W[p + "attn_q.weight"].T).reshape(n, nh, hd))
        k = rope((h @ W[p + "attn_k.weight"].T).reshape(n, nkv, hd))
        v = (h @ W[p + "attn_v.weight"].T).reshape(n, nkv, hd)
        o = np.empty((n, nh, hd))
        for hh in range(nh):
            g = hh // (nh // nkv)
            s = q[:, hh] @ k[:, g].T / np.sqrt(hd) + mask
            s = np.exp(s - s.max(-1, keepdims=True))
            o[:, hh] = (s / s.sum(-1, keepdims=True)) @ v[:, g]
        x = x + o.reshape(n, d) @ W[p + "attn_output.weight"].T
        h = rms(x, W[p + "ffn_norm.weight"])
        g_ = h @ W[p + "ffn_gate.weight"].T
        u = h @ W[p + "ffn_up.weight"].T
        x = x + (g_ / (1 + np.exp(-g_)) * u) @ W[p + "ffn_down.weight"].T
    x = rms(x, W["output_norm.weight"])
    logits = x @ W["token_embd.weight"].T
    lsm = logits - logits.max(-1, keepdims=True)
    lsm = lsm - np.log(np.exp(lsm).sum(-1, keepdims=True))
    nll = -np.mean([lsm[i, ids[i + 1]] for i in range(n - 1)]) if n > 1 else float("nan")
    for i in range(n):
        top = np.argsort(-logits[i])[:5]
        print(f"pos {i} top5 " + " ".join(f"{t}:{logits[i, t]:.5f}" for t in top)
              + (f"  logp(next={ids[i + 1]})={lsm[i, ids[i + 1]]:.5f}" if i + 1 < n else ""))
    print(f"mean nll {nll:.6f} ppl {np.exp(nll):.4f}")


if __name__ == "__main__":
    main()
