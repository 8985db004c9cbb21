#!/usr/bin/env python3
"""kvpress_eval.py - NVIDIA's kvpress eviction presses on kvpack-eval's model, tokens and protocol.

Runs kvpress (transformers + torch, float32, CPU) on exactly the token windows that kvpack-eval
scores, and writes kvpack-eval's JSON fields, so that its rows sit in the same table as kvpack's.
Not part of CI or ctest.

Setup and run (from the repository root):
    bash bench/peers/kvpress_setup.sh                      # venv in ~/.cache/kvpack/kvpress-venv
    build-peer/tools/kvpack-eval --text ../shared/data/wikitext-2-raw/wiki.test.raw \
        --ctx 2048 --windows 16 --dump-tokens /tmp/wt2-2048x16.json
    ~/.cache/kvpack/kvpress-venv/bin/python bench/peers/kvpress_eval.py \
        --tokens /tmp/wt2-2048x16.json --windows 4 --json out.json --markdown out.md

Protocol (kvpack-eval's): windows of --ctx tokens (token 0 is BOS); the first half is the prompt,
the second half is scored: logits at positions ctx/2 .. ctx-2 predict tokens ctx/2+1 .. ctx-1
(ctx/2 - 1 scored tokens per window). PPL = exp(mean NLL over all scored tokens); KL(full cache ||
press) in nats per scored token (mean, p99) and top-1 agreement, against this script's own
full-cache run ("kvpress-full", protocol "none") on the same window.

  prompt-once   the press compresses the ctx/2-token prompt once (prefill inside `with press(model)`,
                kvpress's own hook); then the second half runs in one forward over the compressed
                cache, with position_ids = its ORIGINAL positions ctx/2 .. ctx-1 (as kvpress's
                pipeline does; cache_position is left to transformers, i.e. counted from the shorter
                cache, so the causal mask stays right). The cache grows by ctx/2 tokens.
  fixed-budget  DecodingPress(base, compression_interval=1, target_size=B) with B = ratio * ctx
                (B = 1024 of 2048 at 50 %): the prompt is prefilled whole (B tokens), then the
                second half is decoded one token at a time and after each token every layer's
                cache is cut back to B tokens.
                THE FIX: kvpress 0.5.5's ScorerPress.compress keeps `scores.topk(n).indices` in
                topk order, i.e. by score, not by position, so after DecodingPress's first cut the
                cache is no longer in position order; StreamingLLMPress (and any press that reads
                an index as an age) then evicts the wrong tokens at the next step (for StreamingLLM:
                random recent tokens instead of the oldest non-sink one). PositionOrderedDecodingPress
                below overrides DecodingPress.compress to take the same scores and the same number
                of kept tokens, but SORTS the kept indices ascending before the gather, so the
                cache stays in position order. Nothing else of DecodingPress changes.

Memory columns: tokens_after_prompt / tokens_at_end are the mean tokens held per layer and KV head
(for AdaKV, whose cache physically keeps every token and masks the evicted ones, the tokens not
masked); kv_bytes = tokens_at_end x layers x kv_heads x head_dim x 2 (K and V) x 2 B (fp16), and
kv_fraction_of_fp16 is that over an fp16 cache of all ctx tokens.
"""
import argparse
import json
import math
import os
import sys
import time

import numpy as np
import torch
import torch.nn.functional as F

# Targets: an earlier run of the same protocol (16 windows; windows 0-3 for fixed-budget).
TARGETS = {
    "kvpress-snapkv-50-prompt": 7.03, "kvpress-snapkv-25-prompt": 12.63,
    "kvpress-snapkv-adakv-50-prompt": 7.75, "kvpress-snapkv-adakv-25-prompt": 12.81,
    "kvpress-streaming-50-prompt": 7.05, "kvpress-streaming-25-prompt": 13.15,
    "kvpress-tova-50-prompt": 7.35, "kvpress-tova-25-prompt": 13.73,
    "kvpress-knorm-50-prompt": 10.91, "kvpress-knorm-25-prompt": 17.93,
    "kvpress-observed-50-prompt": 4.09, "kvpress-observed-25-prompt": 8.00,
    "kvpress-expected-50-prompt": 4.35, "kvpress-expected-25-prompt": 9.42,
    "kvpress-streaming-50-fixed": 2.46,
}
PRESS_KEYS = ["snapkv", "snapkv-adakv", "streaming", "tova", "knorm", "observed", "expected"]


def make_press(key, ratio):
    """A kvpress press by short name; ratio = fraction of the tokens REMOVED (kvpress's compression_ratio)."""
    import kvpress as kp
    if key == "snapkv":
        return kp.SnapKVPress(compression_ratio=ratio, window_size=32, kernel_size=5), "sdpa"
    if key == "snapkv-adakv":
        return kp.AdaKVPress(kp.SnapKVPress(compression_ratio=ratio, window_size=32, kernel_size=5)), "sdpa"
    if key == "streaming":
        return kp.StreamingLLMPress(compression_ratio=ratio, n_sink=4), "sdpa"
    if key == "tova":
        return kp.TOVAPress(compression_ratio=ratio), "sdpa"
    if key == "knorm":
        return kp.KnormPress(compression_ratio=ratio), "sdpa"
    if key == "observed":
        return kp.ObservedAttentionPress(compression_ratio=ratio), "eager"
    if key == "expected":
        return kp.ExpectedAttentionPress(compression_ratio=ratio), "sdpa"
    raise ValueError(f"unknown press '{key}' (known: {', '.join(PRESS_KEYS)})")


def position_ordered_decoding_press():
    """DecodingPress whose cuts keep the surviving tokens in position order (see the docstring)."""
    from kvpress import AdaKVPress, DecodingPress

    class PositionOrderedDecodingPress(DecodingPress):
        def compress(self, module, hidden_states, keys, values, attentions, kwargs):
            k_len = keys.shape[2]
            n_kept = min(self.target_size, k_len)
            if n_kept == k_len:
                return keys, values
            if isinstance(self.base_press, AdaKVPress):
                raise ValueError("AdaKV is not supported under fixed-budget here")
            # The base press's scores read the whole cache; a press that needs its compression ratio
            # while scoring (StreamingLLM) gets the one that leaves n_kept tokens.
            saved = self.base_press.compression_ratio
            self.base_press.compression_ratio = self._find_target_compression_ratio(k_len, n_kept)
            try:
                scores = self.base_press.score(module, hidden_states, keys, values, attentions, kwargs)
            finally:
                self.base_press.compression_ratio = saved
            idx = scores.topk(n_kept, dim=-1).indices.sort(dim=-1).values  # the fix: position order
            idx = idx.unsqueeze(-1).expand(-1, -1, -1, keys.shape[-1])
            return keys.gather(2, idx).contiguous(), values.gather(2, idx).contiguous()

    return PositionOrderedDecodingPress


def set_attn(model, impl):
    if getattr(model.config, "_attn_implementation", None) == impl:
        return
    if hasattr(model, "set_attn_implementation"):
        model.set_attn_implementation(impl)
    else:
        model.config._attn_implementation = impl


def clear_masks(model):
    for layer in model.model.layers:  # AdaKV leaves its masked indices on the attention modules
        layer.self_attn.masked_key_indices = None


def held_tokens(model, cache):
    """Mean tokens per layer and KV head held by the cache, less AdaKV's masked ones."""
    n_layers = len(model.model.layers)
    kv_heads = model.config.num_key_value_heads
    total = 0.0
    for i in range(n_layers):
        total += cache.layers[i].keys.shape[2] * kv_heads
        m = getattr(model.model.layers[i].self_attn, "masked_key_indices", None)
        if m is not None:
            total -= len(m[0])
    return total / (n_layers * kv_heads)


def run_full(model, ids, half):
    """Full cache: logits at positions half .. ctx-2 (one forward)."""
    from transformers import DynamicCache
    set_attn(model, "sdpa")
    clear_masks(model)
    out = model(input_ids=ids, past_key_values=DynamicCache(), use_cache=True)
    return out.logits[0, half:-1].float(), float(half), float(ids.shape[1])


def run_prompt_once(model, ids, half, press, impl):
    from transformers import DynamicCache
    set_attn(model, impl)
    clear_masks(model)
    cache = DynamicCache()
    with press(model):
        model.model(input_ids=ids[:, :half], past_key_values=cache, use_cache=True)
    after = held_tokens(model, cache)
    pos = torch.arange(half, ids.shape[1]).unsqueeze(0)
    out = model(input_ids=ids[:, half:], past_key_values=cache, position_ids=pos, use_cache=True)
    end = held_tokens(model, cache)
    return out.logits[0, :-1].float(), after, end


def run_fixed(model, ids, half, base, budget, impl):
    from transformers import DynamicCache
    set_attn(model, impl)
    clear_masks(model)
    cls = position_ordered_decoding_press()
    press = cls(base_press=base, compression_interval=1, target_size=budget, hidden_states_buffer_size=256)
    cache = DynamicCache()
    ctx = ids.shape[1]
    rows = []
    with press(model):
        model.model(input_ids=ids[:, :half], past_key_values=cache, use_cache=True)  # prefill: no cut
        after = held_tokens(model, cache)
        for p in range(half, ctx - 1):  # token p's logits predict token p+1
            out = model(input_ids=ids[:, p:p + 1], past_key_values=cache,
                        position_ids=torch.tensor([[p]]), use_cache=True)
            rows.append(out.logits[0, -1].float())
            if (p - half) % 256 == 255:
                print(f"  fixed-budget: {p - half + 1} of {ctx - 1 - half} tokens decoded", file=sys.stderr, flush=True)
    return torch.stack(rows), after, held_tokens(model, cache)


class Acc:
    """Per-policy sums over scored tokens."""

    def __init__(self, name, protocol):
        self.name, self.protocol = name, protocol
        self.nll, self.kl, self.top1 = [], [], []
        self.after, self.end, self.secs = [], [], 0.0

    def add(self, logits, targets, ref_logp, after, end, secs):
        logp = F.log_softmax(logits, dim=-1)
        self.nll.append(-logp.gather(1, targets.unsqueeze(1)).squeeze(1).double().numpy())
        kl = (ref_logp.exp() * (ref_logp - logp)).sum(-1).clamp_min(0)
        self.kl.append(kl.double().numpy())
        self.top1.append((logp.argmax(-1) == ref_logp.argmax(-1)).double().numpy())
        self.after.append(after)
        self.end.append(end)
        self.secs += secs

    def row(self, base_ppl, geom, ctx):
        nll, kl, top1 = (np.concatenate(x) for x in (self.nll, self.kl, self.top1))
        ppl = math.exp(nll.mean())
        end = float(np.mean(self.end))
        per_token = geom["layers"] * geom["kv_heads"] * geom["head_dim"] * 2 * 2
        return {
            "name": self.name, "protocol": self.protocol, "ppl": ppl,
            "delta_ppl_percent": 100.0 * (ppl / base_ppl - 1.0) if base_ppl else 0.0,
            "kl_mean": float(kl.mean()), "kl_p99": float(np.percentile(kl, 99)),
            "top1_agreement": float(top1.mean()), "scored_tokens": int(nll.size),
            "tokens_after_prompt": float(np.mean(self.after)), "tokens_at_end": end,
            "kv_bytes": int(round(end * per_token)), "kv_bytes_at_tokens": ctx,
            "kv_fraction_of_fp16": end / ctx, "key_bits_per_value": 16.0, "value_bits_per_value": 16.0,
            "windows_done": len(self.after), "seconds": self.secs,
            # per window, so that runs over disjoint windows can be pooled exactly (same token count each)
            "window_nll_mean": [float(x.mean()) for x in self.nll],
            "window_kl_mean": [float(x.mean()) for x in self.kl],
            "window_top1": [float(x.mean()) for x in self.top1],
        }


def markdown(report):
    lines = [f"{report['source']} on {os.path.basename(report['model'])}, {report['text']}, "
             f"ctx {report['ctx']}, windows {report['window_ids']}; fp32 CPU; base = this script's full cache",
             "", "| policy | protocol | PPL | ΔPPL % | target ΔPPL % | KL mean | KL p99 | top-1 | "
             "tokens after prompt | tokens at end | KV / fp16 | windows |",
             "|---|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|"]
    for r in report["policies"]:
        t = TARGETS.get(r["name"])
        lines.append(f"| {r['name']} | {r['protocol']} | {r['ppl']:.3f} | {r['delta_ppl_percent']:+.2f} | "
                     f"{'' if t is None else f'{t:+.2f}'} | {r['kl_mean']:.4f} | {r['kl_p99']:.3f} | "
                     f"{r['top1_agreement']:.3f} | {r['tokens_after_prompt']:.0f} | {r['tokens_at_end']:.0f} | "
                     f"{r['kv_fraction_of_fp16']:.3f} | {r['windows_done']} |")
    return "\n".join(lines) + "\n"


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0],
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--tokens", required=True, help="kvpack-eval --dump-tokens JSON")
    ap.add_argument("--model", default=os.path.expanduser("~/.cache/kvpack/models/SmolLM2-135M-Instruct.Q4_1.gguf"))
    ap.add_argument("--windows", type=int, default=16, help="windows 0 .. N-1 of the dump (or --window-ids)")
    ap.add_argument("--window-ids", default="", help="comma-separated window indices of the dump")
    ap.add_argument("--presses", default=",".join(PRESS_KEYS), help="prompt-once presses: " + ",".join(PRESS_KEYS))
    ap.add_argument("--ratios", default="50,25", help="percent of the prompt KEPT (50 -> compression_ratio 0.5)")
    ap.add_argument("--fixed", default="streaming:50",
                    help="fixed-budget runs press:percent-of-ctx-kept, comma-separated ('' for none)")
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--json", default="")
    ap.add_argument("--markdown", default="")
    args = ap.parse_args()

    torch.set_num_threads(args.threads)
    torch.manual_seed(0)
    import importlib.metadata as md
    import kvpress  # noqa: F401  (patches transformers' attention functions for AdaKV)
    from transformers import AutoModelForCausalLM

    dump = json.load(open(args.tokens))
    ctx, half = int(dump["ctx"]), int(dump["first_row"])
    wids = [int(w) for w in args.window_ids.split(",")] if args.window_ids else list(range(args.windows))
    wids = [w for w in wids if w < len(dump["windows"])]
    t0 = time.time()
    model = AutoModelForCausalLM.from_pretrained(os.path.dirname(args.model), gguf_file=os.path.basename(args.model),
                                                 torch_dtype=torch.float32, attn_implementation="sdpa")
    model.eval()
    cfg = model.config
    geom = {"layers": cfg.num_hidden_layers, "kv_heads": cfg.num_key_value_heads,
            "head_dim": getattr(cfg, "head_dim", None) or cfg.hidden_size // cfg.num_attention_heads}
    print(f"model loaded in {time.time() - t0:.1f} s: {geom}", file=sys.stderr)

    configs = [("kvpress-full", "none", None, None)]
    for r in [int(x) for x in args.ratios.split(",") if x]:
        for k in [x for x in args.presses.split(",") if x]:
            configs.append((f"kvpress-{k}-{r}-prompt", "prompt-once", k, r))
    for spec in [x for x in args.fixed.split(",") if x]:
        k, r = spec.split(":")
        configs.append((f"kvpress-{k}-{int(r)}-fixed", "fixed-budget", k, int(r)))
    accs = {name: Acc(name, proto) for name, proto, _, _ in configs}

    versions = {p: md.version(p) for p in ("kvpress", "torch", "transformers", "gguf", "numpy")}
    report = {"model": args.model, "text": dump.get("text", ""), "ctx": ctx, "windows": 0, "window_ids": [],
              "chunk": half, "scored_tokens": ctx - half - 1, "source": f"kvpress {versions['kvpress']}",
              "versions": versions, "threads": args.threads,
              "kl": "KL(kvpress full cache || press), nats per scored token", "policies": []}

    with torch.no_grad():
        for wi, w in enumerate(wids):
            ids = torch.tensor(dump["windows"][w], dtype=torch.long).unsqueeze(0)
            targets = ids[0, half + 1:]
            ref_logp = None
            for name, proto, key, r in configs:
                t = time.time()
                if proto == "none":
                    logits, after, end = run_full(model, ids, half)
                    ref_logp = F.log_softmax(logits, dim=-1)
                elif proto == "prompt-once":
                    press, impl = make_press(key, 1.0 - r / 100.0)
                    logits, after, end = run_prompt_once(model, ids, half, press, impl)
                else:
                    base, impl = make_press(key, 0.0)
                    logits, after, end = run_fixed(model, ids, half, base, int(round(ctx * r / 100.0)), impl)
                secs = time.time() - t
                accs[name].add(logits, targets, ref_logp, after, end, secs)
                nll = accs[name].nll[-1].mean()
                print(f"[window {w} ({wi + 1}/{len(wids)})] {name}: window ppl {math.exp(nll):.3f}, "
                      f"held {after:.0f} -> {end:.0f}, {secs:.1f} s", file=sys.stderr, flush=True)
            # Rewrite the report after every window, so a cut-short run still leaves its rows.
            base_ppl = math.exp(np.concatenate(accs["kvpress-full"].nll).mean())
            report["windows"], report["window_ids"] = wi + 1, wids[:wi + 1]
            report["policies"] = [accs[n].row(base_ppl, geom, ctx) for n, *_ in configs]
            report["seconds"] = time.time() - t0
            if args.json:
                with open(args.json, "w") as f:
                    json.dump(report, f, indent=1)
            if args.markdown:
                with open(args.markdown, "w") as f:
                    f.write(markdown(report))
    print(markdown(report))


if __name__ == "__main__":
    main()
