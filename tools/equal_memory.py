#!/usr/bin/env python3
"""Equal-memory table and plot (issue 24 item 3): quality against the bytes a cache holds.

    python3 tools/equal_memory.py KVPACK_JSON [PEER_JSON ...] --markdown OUT.md --plot OUT.png

A JSON argument may be A.json+B.json: runs of one source over disjoint windows, pooled (pooled()),
and A.json@LO-HI: only windows LO..HI of a run that kept per-window figures (window_subset()).

KVPACK_JSON is kvpack-eval's --json output (e.g. `--policies equal-memory`); PEER_JSONs are rows
in the same format from other libraries (bench/peers/: kvpress presses, llama.cpp KV types).
Each row's memory is `kv_fraction_of_fp16`: the bytes held at the end of scoring over an fp16
cache of every token of the window (K and V, 2 bytes per value), so deletion, demotion,
quantization and their mixes share one axis. ΔPPL is against each source's own full-precision
base (kvpack: its fp32 cache; kvpress: its full cache; llama.cpp: its f16 cache), since the
runners differ. The table lists every row sorted by memory, then names the best ΔPPL at each
memory level (rows at or below 100 %, 50 %, 25 %, 12.5 %, 6.25 % of fp16). The plot (gnuplot,
pngcairo) puts ΔPPL (log scale) against memory, one point style per source, each label beside
its point; labels are nudged apart so they do not overlap. Of a peer's rows at one memory size
the plot shows the best and SnapKV (the table lists all). Without gnuplot, --plot is skipped
with a note.
"""
import argparse
import json
import math
import os
import shutil
import subprocess
import sys
import tempfile

LEVELS = [1.0, 0.5, 0.25, 0.125, 0.0625]
FLOOR = 0.01  # ΔPPL % drawn at this value or above (log axis)


def rebased(doc):
    """doc with every row's ΔPPL recomputed against its base (the row whose ΔPPL was 0)."""
    base = next(r for r in doc["policies"] if abs(r["delta_ppl_percent"]) < 1e-12)
    for r in doc["policies"]:
        r["delta_ppl_percent"] = 100 * (r["ppl"] / base["ppl"] - 1)
    return doc


def window_subset(path, lo, hi):
    """Rows of one run restricted to its windows lo..hi (by window id), from the per-window means
    a run keeps (window_nll_mean, window_kl_mean, window_top1: bench/peers/kvpress_eval.py)."""
    with open(path) as f:
        doc = json.load(f)
    ids = doc["window_ids"]
    sel = [i for i, w in enumerate(ids) if lo <= w <= hi]
    if not sel:
        sys.exit(f"equal_memory.py: {path} has no window in {lo}-{hi} (it has {ids})")
    out = dict(doc, windows=len(sel), window_ids=[ids[i] for i in sel], policies=[])
    for p in doc["policies"]:  # every window scores the same number of tokens
        mean = lambda key: sum(p[key][i] for i in sel) / len(sel)
        out["policies"].append(dict(p, ppl=math.exp(mean("window_nll_mean")), kl_mean=mean("window_kl_mean"),
                                    top1_agreement=mean("window_top1"), kl_p99=None,
                                    scored_tokens=p["scored_tokens"] / len(ids) * len(sel)))
    return rebased(out)


def read_run(path):
    """A run's JSON; PATH@LO-HI keeps windows LO..HI only (window_subset)."""
    if "@" in path:
        path, rng = path.split("@")
        lo, hi = (int(x) for x in rng.split("-"))
        return window_subset(path, lo, hi)
    with open(path) as f:
        return json.load(f)


def pooled(paths):
    """Rows of several runs over disjoint windows of one source, pooled: a row present in every
    run gets PPL = exp(token-weighted mean of log PPL), ΔPPL against the pooled base (the row
    whose ΔPPL is 0), KL mean and top-1 token-weighted; KL p99 is dropped (not poolable)."""
    docs = [read_run(p) for p in paths]
    names = [set(p["name"] for p in d["policies"]) for d in docs]
    common = set.intersection(*names)
    out = dict(docs[0], windows=sum(int(d.get("windows") or 0) for d in docs), policies=[])
    for p0 in docs[0]["policies"]:
        if p0["name"] not in common:
            continue
        parts = [next(p for p in d["policies"] if p["name"] == p0["name"]) for d in docs]
        n = [float(p.get("scored_tokens") or 1) for p in parts]
        w = lambda key: sum(x * float(p[key]) for x, p in zip(n, parts)) / sum(n)
        row = dict(p0, ppl=math.exp(sum(x * math.log(p["ppl"]) for x, p in zip(n, parts)) / sum(n)),
                   kl_mean=w("kl_mean"), top1_agreement=w("top1_agreement"), kl_p99=None, scored_tokens=sum(n))
        out["policies"].append(row)
    return rebased(out)


def load(path):
    doc = pooled(path.split("+")) if "+" in path else read_run(path)  # A+B: disjoint windows, pooled
    src = doc.get("source_library") or ("kvpack" if "kvpress" not in str(doc.get("source", "")) and
                                        "llama" not in str(doc.get("source", "")) else doc["source"])
    rows = []
    for p in doc["policies"]:
        if p.get("kv_fraction_of_fp16") is None or p.get("delta_ppl_percent") is None:
            continue
        rows.append({"source": src, "name": p["name"], "protocol": p.get("protocol", "none"),
                     "mem": float(p["kv_fraction_of_fp16"]), "dppl": float(p["delta_ppl_percent"]),
                     "kl": p.get("kl_mean"), "top1": p.get("top1_agreement"),
                     "after": p.get("tokens_after_prompt"), "end": p.get("tokens_at_end")})
    meta = {k: doc.get(k) for k in ("model", "text", "ctx", "windows", "source")}
    return src, rows, meta


def fmt(x, spec):
    return "" if x is None else format(x, spec)


def markdown(rows, metas):
    out = []
    for src, m in metas:
        out.append(f"- {src}: {m.get('source') or 'kvpack-eval'}, ctx {m.get('ctx')}, {m.get('windows')} windows, "
                   f"text {os.path.basename(str(m.get('text')))}")
    out += ["", "| source | policy | protocol | tokens after prompt | tokens at end | memory / fp16 | ΔPPL % | KL mean | top-1 % |",
            "|---|---|---|--:|--:|--:|--:|--:|--:|"]
    for r in sorted(rows, key=lambda r: (-r["mem"], r["dppl"])):
        top1 = None if r["top1"] is None else 100 * r["top1"]
        out.append(f"| {r['source']} | {r['name']} | {r['protocol']} | {fmt(r['after'], '.0f')} | {fmt(r['end'], '.0f')} | "
                   f"{100 * r['mem']:.1f} % | {r['dppl']:+.2f} | {fmt(r['kl'], '.4f')} | {fmt(top1, '.1f')} |")
    out += ["", "Best ΔPPL at each memory level (rows holding at most that share of an fp16 cache):", "",
            "| memory ≤ | best row | its memory | ΔPPL % | best deletion-only row | ΔPPL % |", "|--:|---|--:|--:|---|--:|"]
    for lv in LEVELS:
        fit = [r for r in rows if r["mem"] <= lv + 1e-9 and not is_base(r)]
        dele = [r for r in fit if is_deletion(r)]
        best = min(fit, key=lambda r: r["dppl"], default=None)
        bd = min(dele, key=lambda r: r["dppl"], default=None)
        bm = "" if best is None else f"{100 * best['mem']:.1f} %"
        bp = "" if best is None else f"{best['dppl']:+.2f}"
        dp = "" if bd is None else f"{bd['dppl']:+.2f}"
        out.append(f"| {100 * lv:g} % | {label(best)} | {bm} | {bp} | {label(bd)} | {dp} |")
    return "\n".join(out) + "\n"


def is_base(r):
    """A source's own full-precision base (its ΔPPL is 0 by definition)."""
    return r["name"] == "fp32" or r["dppl"] == 0.0


def is_deletion(r):
    """Eviction that deletes tokens (a protocol row without demotion)."""
    return r["protocol"] != "none" and "demote" not in r["name"]


def label(r):
    return "none" if r is None else f"{r['name']} ({r['source']})" if r["source"] != "kvpack" else r["name"]


def plot(rows, path):
    if not shutil.which("gnuplot"):
        print("equal_memory.py: gnuplot not found, no plot", file=sys.stderr)
        return
    pts = [r for r in rows if not is_base(r)]
    # A peer's rows at one memory size are a vertical stack (every press keeps the same tokens):
    # the plot shows its best one and its SnapKV there, the table all of them.
    peers = {}
    for r in pts:
        if r["source"] != "kvpack":
            peers.setdefault((r["source"], round(r["mem"], 4)), []).append(r)
    keep = set()
    for group in peers.values():
        keep.add(id(min(group, key=lambda r: r["dppl"])))
        keep.update(id(r) for r in group if "snapkv-" in r["name"] and "adakv" not in r["name"])
    pts = [r for r in pts if r["source"] == "kvpack" or id(r) in keep]
    # Label placement: in log-log plot space, push labels down the page until none is within
    # a label's height of another one at overlapping x (a simple greedy pass is enough here).
    # Boxes in log10 units: ~0.0085 decade of x per character, ~0.07 decade of y per line.
    # ΔPPL at or below FLOOR (fp16, k8v4 can be slightly negative) is drawn at FLOOR, the value
    # written into its label.
    for r in pts:
        r["_y"] = max(r["dppl"], FLOOR)
        r["_label"] = r["name"] + (f" ({r['dppl']:+.3f} %)" if r["dppl"] <= FLOOR else "")
    placed = [(math.log10(r["mem"]) - 0.01, math.log10(r["mem"]) + 0.01, math.log10(r["_y"])) for r in pts]  # the points
    for r in sorted(pts, key=lambda r: (r["mem"], -r["dppl"])):
        x, y = math.log10(r["mem"]), math.log10(r["_y"])
        w = 0.0085 * len(r["_label"]) + 0.02
        ly = y
        while any(abs(ly - py) < 0.07 and x + 0.012 < px1 and px0 < x + w for px0, px1, py in placed):
            ly -= 0.07
        placed.append((x, x + w, ly))
        r["_ly"] = 10 ** ly
    with tempfile.TemporaryDirectory() as d:
        sources = sorted({r["source"] for r in pts}, key=lambda s: (s != "kvpack", s))
        for i, s in enumerate(sources):
            with open(os.path.join(d, f"s{i}.dat"), "w") as f:
                for r in pts:
                    if r["source"] == s:
                        f.write(f"{r['mem']} {r['_y']}\n")
        gp = [f"set terminal pngcairo size 1500,1000 font 'sans,9'", f"set output '{path}'",
              "set logscale xy", "set xlabel 'KV bytes held at the end of scoring / fp16 cache of every token'",
              "set ylabel 'ΔPPL % vs own full-precision base (log)'", "set grid", "set key top left",
              "set format x '%g'", "set xrange [0.03:2.4]", f"set yrange [{FLOOR / 2}:200]"]
        for r in pts:
            txt = r["_label"].replace("_", "\\\\_")
            gp.append(f"set label \"{txt}\" at {r['mem'] * 1.04},{r['_ly']} left font 'sans,8'")
            if abs(r["_ly"] - r["_y"]) > 1e-9:
                gp.append(f"set arrow from {r['mem'] * 1.035},{r['_ly']} to {r['mem']},{r['_y']} nohead lw 0.5 lc rgb 'gray'")
        for lv in LEVELS:
            gp.append(f"set arrow from {lv},graph 0 to {lv},graph 1 nohead dt 3 lc rgb 'gray'")
        styles = ["pt 7 ps 1.3 lc rgb '#1f77b4'", "pt 5 ps 1.3 lc rgb '#d62728'", "pt 9 ps 1.5 lc rgb '#2ca02c'"]
        gp.append("plot " + ", ".join(f"'{os.path.join(d, f's{i}.dat')}' using 1:2 with points {styles[i % 3]} title '{s}'"
                                      for i, s in enumerate(sources)))
        script = os.path.join(d, "plot.gp")
        with open(script, "w") as f:
            f.write("\n".join(gp) + "\n")
        subprocess.run(["gnuplot", script], check=True)


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("kvpack_json")
    ap.add_argument("peer_json", nargs="*")
    ap.add_argument("--markdown")
    ap.add_argument("--plot")
    a = ap.parse_args()
    rows, metas, seen = [], [], {}
    for p in [a.kvpack_json] + a.peer_json:
        src, r, meta = load(p)
        for row in r:  # a row in two inputs of one source (each run's base, say) is listed once
            key = (row["source"], row["name"])
            if key in seen:
                if abs(seen[key]["dppl"] - row["dppl"]) > 0.005:
                    print(f"equal_memory.py: {key[1]} ({key[0]}) is in two inputs with ΔPPL "
                          f"{seen[key]['dppl']:+.2f} and {row['dppl']:+.2f}; the first is kept", file=sys.stderr)
                continue
            seen[key] = row
            rows.append(row)
        if (src, meta) not in metas:
            metas.append((src, meta))
    md = markdown(rows, metas)
    if a.markdown:
        with open(a.markdown, "w") as f:
            f.write(md)
    print(md)
    if a.plot:
        plot(rows, a.plot)


if __name__ == "__main__":
    main()
