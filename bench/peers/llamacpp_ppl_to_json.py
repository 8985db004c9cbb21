#!/usr/bin/env python3
"""Turns llama-perplexity logs into kvpack-eval's results JSON (and a Markdown table).

Used by bench/peers/llamacpp_ppl.sh; can be rerun on its logs (.cache/llamacpp-ppl/*.log):

  llamacpp_ppl_to_json.py --model M --text T --ctx 2048 --windows 16 --threads 2 \
      --source "llama.cpp ..." --out docs/results/llamacpp-ctx2048-16w  f16=F16.log q8_0=Q8.log ...

The first log must be the f16/f16 run (plain perplexity, "Final estimate: PPL"); the others are
--kl-divergence runs against its saved log-probabilities ("Mean PPL(Q)", "Mean KLD", "99.0% KLD",
"Same top p"). delta_ppl_percent is against the f16 run's PPL: llama.cpp's own base, not kvpack's.
Field names follow kvpack-eval's --json output (docs/results/wikitext2-ctx2048-16w.json).
"""
import argparse
import json
import math
import re
import sys

# bits per stored value, block scales included (ggml block layouts, 32 values per block)
BITS = {"f32": 32.0, "f16": 16.0, "bf16": 16.0, "q8_0": 8.5, "q4_0": 4.5, "q4_1": 5.0,
        "q5_0": 5.5, "q5_1": 6.0, "iq4_nl": 4.5}
NUM = r"([-+]?[0-9]*\.?[0-9]+(?:[eE][-+]?[0-9]+)?)"


def find(pattern, text, cast=float, required=True, what=""):
    m = re.search(pattern, text, re.M)
    if not m:
        if required:
            sys.exit(f"llamacpp_ppl_to_json: '{what or pattern}' not found in the log")
        return None
    return cast(m.group(1))


def parse(path):
    text = open(path, encoding="utf-8", errors="replace").read()
    r = {"log": path}
    m = re.search(r"llama_kv_cache: size = +" + NUM + r" MiB \( *(\d+) cells, +(\d+) layers.*?"
                  r"K \((\w+)\): +" + NUM + r" MiB, V \((\w+)\): +" + NUM + r" MiB", text)
    if not m:
        sys.exit(f"llamacpp_ppl_to_json: no llama_kv_cache size line in {path}")
    r["cells"], r["layers"] = int(m.group(2)), int(m.group(3))
    r["k_type"], r["v_type"] = m.group(4), m.group(6)
    r["k_mib"], r["v_mib"] = float(m.group(5)), float(m.group(7))
    r["n_embd_k_gqa"] = find(r"n_embd_k_gqa\s*=\s*(\d+)", text, int, what="n_embd_k_gqa")
    r["n_embd_v_gqa"] = find(r"n_embd_v_gqa\s*=\s*(\d+)", text, int, what="n_embd_v_gqa")
    r["attn_rot_k"] = find(r"attn_rot_k = (\d)", text, int, required=False)
    r["attn_rot_v"] = find(r"attn_rot_v = (\d)", text, int, required=False)
    r["rot_disabled"] = "attention rotation force disabled" in text
    m = re.search(r"(?:computing|calculating perplexity) over (\d+) chunks, n_ctx=(\d+)", text)
    if not m:
        sys.exit(f"llamacpp_ppl_to_json: no chunk count in {path}")
    r["chunks"], r["ctx"] = int(m.group(1)), int(m.group(2))
    r["prefill_tokens_per_s"] = find(r"prompt eval time = .*?,\s*" + NUM + r" tokens per second",
                                     text, required=False)
    r["final_ppl"] = find(r"Final estimate: PPL = " + NUM, text, required=False)
    r["ppl_q"] = find(r"Mean PPL\(Q\)\s*:\s*" + NUM, text, required=False)
    r["ppl_base_kl"] = find(r"Mean PPL\(base\)\s*:\s*" + NUM, text, required=False)
    r["kl_mean"] = find(r"Mean\s+KLD:\s*" + NUM, text, required=False)
    r["kl_p99"] = find(r"99\.0%\s+KLD:\s*" + NUM, text, required=False)
    same = find(r"Same top p:\s*" + NUM, text, required=False)
    r["top1_agreement"] = round(same / 100.0, 7) if same is not None else None
    r["ppl"] = r["final_ppl"] if r["final_ppl"] is not None else r["ppl_q"]
    if r["ppl"] is None:
        sys.exit(f"llamacpp_ppl_to_json: no perplexity in {path} (did the run finish?)")
    return r


def policy_name(r):
    k, v = r["k_type"], r["v_type"]
    name = f"llama.cpp {k}" if k == v else f"llama.cpp K {k} V {v}"
    if r["rot_disabled"] and (BITS.get(k, 16) < 16 or BITS.get(v, 16) < 16):
        name += " no-rot"
    return name


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--model", required=True)
    ap.add_argument("--text", required=True)
    ap.add_argument("--ctx", type=int, required=True)
    ap.add_argument("--windows", type=int, required=True)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--source", required=True)
    ap.add_argument("--out", required=True, help="basename: writes OUT.json and OUT.md")
    ap.add_argument("logs", nargs="+", help="NAME=LOG, the f16/f16 run first")
    a = ap.parse_args()

    runs = [parse(item.split("=", 1)[1]) for item in a.logs]
    base = runs[0]
    if (base["k_type"], base["v_type"]) != ("f16", "f16") or base["final_ppl"] is None:
        sys.exit("llamacpp_ppl_to_json: the first log must be the plain f16/f16 perplexity run")
    scored = a.windows * (a.ctx - 1 - a.ctx // 2)  # perplexity.cpp: logits after first = n_ctx/2
    policies = []
    for r in runs:
        if (r["chunks"], r["ctx"]) != (a.windows, a.ctx):
            sys.exit(f"llamacpp_ppl_to_json: {r['log']} ran {r['chunks']} chunks of {r['ctx']}, "
                     f"not {a.windows} of {a.ctx}")
        kb, vb = BITS[r["k_type"]], BITS[r["v_type"]]
        is_base = r is base
        values = r["cells"] * r["layers"] * (r["n_embd_k_gqa"] + r["n_embd_v_gqa"])
        # ggml rows of n_embd_*_gqa values are whole blocks here (192 = 6 x 32): bytes are exact
        kv_bits = r["cells"] * r["layers"] * (r["n_embd_k_gqa"] * kb + r["n_embd_v_gqa"] * vb)
        kv_bytes = kv_bits / 8
        if abs(kv_bytes / 2**20 - (r["k_mib"] + r["v_mib"])) > 0.02:
            print(f"llamacpp_ppl_to_json: warning: {r['log']}: log says {r['k_mib'] + r['v_mib']:.2f} "
                  f"MiB of KV cache, the block sizes give {kv_bytes / 2**20:.2f}", file=sys.stderr)
        p = {
            "name": policy_name(r),
            "ppl": r["ppl"],
            "delta_ppl_percent": 100.0 * (r["ppl"] / base["ppl"] - 1.0),
            "kl_mean": 0.0 if is_base else r["kl_mean"],
            "kl_p99": 0.0 if is_base else r["kl_p99"],
            "top1_agreement": 1.0 if is_base else r["top1_agreement"],
            "key_bits_per_value": kb,
            "value_bits_per_value": vb,
            "kv_fraction_of_fp16": (kb + vb) / 2 / 16.0,
            "kv_bytes": int(round(kv_bytes)),
            "kv_bytes_at_tokens": r["cells"],
            "measured_bits_per_value": kv_bytes * 8 / values,
            "prefill_tokens_per_s": r["prefill_tokens_per_s"],
            "protocol": "none",
            "scored_tokens": scored,
            "attn_rot_k": bool(r["attn_rot_k"]),
            "attn_rot_v": bool(r["attn_rot_v"]),
        }
        if not is_base and r["ppl_base_kl"] is not None:
            p["ppl_base_from_logits_file"] = r["ppl_base_kl"]
        policies.append(p)

    doc = {
        "ctx": a.ctx,
        "kl": "KL(llama.cpp f16 cache || policy), nats per scored token (llama-perplexity --kl-divergence)",
        "model": a.model,
        "policies": policies,
        "scored_tokens": scored,
        "source": a.source,
        "text": a.text,
        "threads": a.threads,
        "windows": a.windows,
    }
    with open(a.out + ".json", "w", encoding="utf-8") as f:
        json.dump(doc, f, indent=2, sort_keys=True)
        f.write("\n")

    def fmt(x, spec):
        return "n/a" if x is None or (isinstance(x, float) and math.isnan(x)) else format(x, spec)

    model = a.model.rsplit("/", 1)[-1]
    text = a.text.rsplit("/", 1)[-1]
    lines = [
        f"### llama.cpp llama-perplexity: {model}, {text}, ctx {a.ctx} x {a.windows} windows "
        f"(second halves scored), {scored} scored tokens, flash attention on, {a.threads} threads",
        "",
        f"Source: {a.source}. ΔPPL, KL and top-1 agreement are against llama.cpp's own f16 KV cache "
        f"(PPL {base['ppl']:.4f}), not kvpack's fp32 base. rot: llama.cpp's default 64x64 Hadamard "
        "rotation of quantized K/V (attn_rot_k/attn_rot_v); no-rot rows ran with LLAMA_ATTN_ROT_DISABLE=1.",
        "",
        "| policy | K bits | V bits | KV fraction of fp16 | KV MiB @ 2048 tok | rot K/V | PPL | ΔPPL % "
        "| KL mean | KL p99 | top-1 agree % | prefill tok/s |",
        "|---|--:|--:|--:|--:|:-:|--:|--:|--:|--:|--:|--:|",
    ]
    for p in policies:
        mib = p["kv_bytes"] / 2**20 * 2048 / p["kv_bytes_at_tokens"]
        rot = f"{int(p['attn_rot_k'])}/{int(p['attn_rot_v'])}"
        top1 = None if p["top1_agreement"] is None else 100 * p["top1_agreement"]
        lines.append(
            f"| {p['name']} | {p['key_bits_per_value']:.2f} | {p['value_bits_per_value']:.2f} "
            f"| {p['kv_fraction_of_fp16']:.4f} | {mib:.2f} | {rot} | {p['ppl']:.4f} "
            f"| {p['delta_ppl_percent']:+.3f} | {fmt(p['kl_mean'], '.5f')} | {fmt(p['kl_p99'], '.4f')} "
            f"| {fmt(top1, '.2f')} | {fmt(p['prefill_tokens_per_s'], '.1f')} |")
    with open(a.out + ".md", "w", encoding="utf-8") as f:
        f.write("\n".join(lines) + "\n")


if __name__ == "__main__":
    main()
