#!/usr/bin/env python3
"""Render kvpack_bench's Google Benchmark JSON as compact Markdown tables and a gnuplot PNG.

Usage: render_table.py RESULTS.json [--md OUT.md] [--png OUT.png] [--clock wall|cpu]

Reads the case names written by bench/bench_*.cpp (<kind>/<config>/<backend>/<shape>/<n>[/...])
and the counters described there. Ratios are formed side by side from the same run:
  roofline  achieved GB/s of compressed KV read / same-process probe GB/s (same thread count)
  x fp16    time of the plain fp16 baseline / time of the case (> 1: faster than the baseline)
--clock cpu replaces wall time by CPU time per benchmark thread (and rescales the rate counters
likewise): an estimate of the idle-machine figures when other work shared the cores (the probe is
still the wall-clock one). Default: wall, the figures as measured.
Standard library only.
"""
import argparse
import json
import os
import shutil
import subprocess
import sys
import tempfile

TO_US = {"ns": 1e-3, "us": 1.0, "ms": 1e3, "s": 1e6}
SHAPE_LABEL = {"smollm2-135m": "SmolLM2-135M (9 q / 3 kv heads, head_dim 64)",
               "8b-class": "8B-class (32 q / 8 kv heads, head_dim 128)"}
BASELINES = ("plain-fp32", "plain-fp16", "memcpy-fp32")


def load(path, clock="wall"):
    with open(path) as f:
        data = json.load(f)
    # With --benchmark_repetitions=N, use the median aggregate of each case.
    picked = {}
    for b in data.get("benchmarks", []):
        key = b.get("run_name", b["name"])
        if b.get("run_type") == "aggregate":
            if b.get("aggregate_name") == "median":
                picked[key] = b
        elif key not in picked or picked[key].get("run_type") != "aggregate":
            picked[key] = b
    rows = []
    for key, b in picked.items():
        parts = key.split("/")
        # Tables are made of <kind>/<config>/<backend>/<shape>/<n> cases; others (pool-batch,
        # pool-append: no backend field) stay in the JSON only.
        if len(parts) < 5 or not parts[4].isdigit():
            continue
        r = dict(b)
        r.update(kind=parts[0], config=parts[1], backend=parts[2], shape=parts[3], n=int(parts[4]),
                 threads=int(b.get("threads", 1)))
        # decode-seq rows: one sequence on W workers (kvpack split-K executor, ggml threadpool).
        for extra in parts[5:]:
            if extra.startswith("workers:"):
                r["threads"] = int(extra.split(":")[1])
        r["us"] = b["real_time"] * TO_US[b.get("time_unit", "ns")] if "real_time" in b else None
        r["error"] = b.get("error_message") if b.get("error_occurred") else None
        # Share of a core each benchmark thread got: Google Benchmark sums CPU time over threads
        # and averages wall time; well below 1 means the machine was busy with other work.
        if "cpu_time" in b and b.get("real_time") and r["kind"] != "decode-seq":
            r["cpu_share"] = b["cpu_time"] / (b["real_time"] * r["threads"])
            if clock == "cpu" and r["cpu_share"] > 0:
                r["us"] *= r["cpu_share"]
                for k in ("roofline", "GB/s", "tok/s"):
                    if k in r:
                        r[k] /= r["cpu_share"]
        rows.append(r)
    return data.get("context", {}), rows


def ordered(values):
    seen = []
    for v in values:
        if v not in seen:
            seen.append(v)
    return seen


def fmt_time(us):
    if us is None:
        return "-"
    if us >= 1e5:
        return f"{us / 1e3:.0f} ms"
    if us >= 1e3:
        return f"{us / 1e3:.1f} ms"
    return f"{us:.1f} µs" if us < 100 else f"{us:.0f} µs"


def fmt_pct(x):
    if x is None:
        return "-"
    return f"{100 * x:.1f} %" if x >= 0.01 else f"{100 * x:.2f} %"


def fmt_ratio(x):
    return "-" if x is None else f"{x:.2f}×"


def fmt_rate(x):
    if x is None:
        return "-"
    for div, unit in ((1e6, "M"), (1e3, "k")):
        if x >= div:
            return f"{x / div:.2f} {unit}"
    return f"{x:.0f}"


def table(header, body):
    out = ["| " + " | ".join(header) + " |", "|" + "|".join("---" if i == 0 else "--:" for i in range(len(header))) + "|"]
    out += ["| " + " | ".join(str(c) for c in row) + " |" for row in body]
    return "\n".join(out)


class Index:
    def __init__(self, rows):
        self.by = {}
        for r in rows:
            self.by[(r["kind"], r["config"], r["backend"], r["shape"], r["n"], r["threads"])] = r

    def get(self, kind, config, backend, shape, n, threads):
        return self.by.get((kind, config, backend, shape, n, threads))


def render(context, rows, clock="wall"):
    ix = Index(rows)
    md = []
    threads = sorted(ordered(r["threads"] for r in rows))
    shapes = ordered(r["shape"] for r in rows)
    backends = ordered(r["backend"] for r in rows if r["config"] not in BASELINES and r["backend"] != "baseline")
    configs = ordered(r["config"] for r in rows if r["kind"] == "decode" and r["config"] not in BASELINES)
    if not configs:
        configs = ordered(r["config"] for r in rows if r["config"] not in BASELINES)

    caches = ", ".join(f"L{c['level']} {c['size'] // 1024} KiB" for c in context.get("caches", []) if c.get("type") != "Instruction")
    probes = ", ".join(f"{t} thread{'s' if t > 1 else ''}: {float(context[k]):.2f} GB/s"
                       for t in threads for k in [f"probe_gbps_threads_{t}"] if k in context)
    md.append(f"Machine: {context.get('host_name', '?')}, {context.get('num_cpus', '?')} CPUs at "
              f"{context.get('mhz_per_cpu', '?')} MHz, {caches}; load average at start "
              f"{', '.join(f'{x:.2f}' for x in context.get('load_avg', []))}.")
    md.append(f"Build: {context.get('kvpack_bench_build_flags', '?')}. Run: {context.get('date', '?')}.")
    md.append(f"Bandwidth probe (streaming read, {int(context.get('probe_buffer_bytes', 0)) >> 20} MiB, same process): {probes}.")
    if clock == "cpu":
        md.append("**Clock: CPU time per benchmark thread** (render_table.py --clock cpu): an idle-machine "
                  "estimate; the measured wall-clock figures are the default rendering.")
    what = "wall" if clock == "wall" else "CPU-per-thread"
    md.append(f"Every case is ONE layer. Time = {what} time per token per layer (with T threads, T layers run "
              f"concurrently, one per thread, and the time is {what} time / tokens of all threads). "
              "roofline = (bytes of KV read per token / time) / probe bandwidth; "
              "× fp16 = plain fp16 baseline time / case time (> 1 is faster); "
              "CPU share = CPU time / wall time per benchmark thread (well below 100 % = the machine was busy).")
    shares = sorted(r["cpu_share"] for r in rows if "cpu_share" in r and r["kind"] in ("decode", "prefill"))
    if shares:
        md.append(f"CPU share over all attention cases: median {100 * shares[len(shares) // 2]:.0f} %, "
                  f"min {100 * shares[0]:.0f} %.")

    def bytes_per_token(shape, config):
        m = None
        for be in backends:
            m = m or ix.get("memory", config, be, shape, 4096, 1)
        return m

    # Headline: the largest context, every thread count of the decode cases (a filtered run may
    # hold other kinds only for some backends or thread counts: those get no decode table).
    decode = [r for r in rows if r["kind"] == "decode"]
    dthreads = sorted(ordered(r["threads"] for r in decode))
    dbackends = [be for be in backends if any(r["backend"] == be for r in decode)]
    for be in dbackends:
        for shape in shapes:
            ctxs = sorted(ordered(r["n"] for r in decode if r["shape"] == shape))
            if not ctxs:
                continue
            top = ctxs[-1]
            header = ["config", "K/V bits/value", "KV bytes/token/layer"]
            for t in dthreads:
                header += [f"{t}T time/token", f"{t}T roofline", f"{t}T × fp16", f"{t}T CPU share"]
            body = []
            for cfg in list(BASELINES) + configs:
                backend = "baseline" if cfg in BASELINES else be
                first = ix.get("decode", cfg, backend, shape, top, dthreads[0])
                if first is None:
                    continue
                m = bytes_per_token(shape, cfg) if cfg not in BASELINES else None
                bits = f"{m['k_bits']:g} / {m['v_bits']:g}" if m and not m["error"] else ("32 / 32" if cfg == "plain-fp32" else "16 / 16" if cfg == "plain-fp16" else "-")
                row = [f"**{cfg}**" if cfg in BASELINES else cfg, bits, f"{first['kv_bytes'] / top:.1f}"]
                for t in dthreads:
                    r = ix.get("decode", cfg, backend, shape, top, t)
                    base = ix.get("decode", "plain-fp16", "baseline", shape, top, t)
                    if r is None or r["error"]:
                        row += ["error: " + (r["error"] if r else "missing"), "", "", ""]
                        continue
                    row += [fmt_time(r["us"]), fmt_pct(r.get("roofline")),
                            fmt_ratio(base["us"] / r["us"] if base and base["us"] else None),
                            f"{100 * r['cpu_share']:.0f} %" if "cpu_share" in r else "-"]
                body.append(row)
            md.append(f"\n### Decode attention, {top // 1024}k context, {SHAPE_LABEL.get(shape, shape)}, backend {be}\n")
            md.append(table(header, body))

    md += render_seq(rows)

    # Detail: every context, per shape and thread count.
    for be in dbackends:
        for shape in shapes:
            ctxs = sorted(ordered(r["n"] for r in decode if r["shape"] == shape))
            if len(ctxs) < 2:
                continue
            for t in dthreads:
                header = ["config"] + [f"{c // 1024}k: time · roofline · × fp16" for c in ctxs]
                body = []
                for cfg in list(BASELINES) + configs:
                    backend = "baseline" if cfg in BASELINES else be
                    row = [cfg]
                    for c in ctxs:
                        r = ix.get("decode", cfg, backend, shape, c, t)
                        base = ix.get("decode", "plain-fp16", "baseline", shape, c, t)
                        if r is None or r["error"]:
                            row.append("-" if r is None else "error")
                            continue
                        row.append(f"{fmt_time(r['us'])} · {fmt_pct(r.get('roofline'))} · "
                                   f"{fmt_ratio(base['us'] / r['us'] if base else None)}")
                    body.append(row)
                md.append(f"\n#### Decode by context: {shape}, {t} thread{'s' if t > 1 else ''}, backend {be}\n")
                md.append(table(header, body))

    # Prefill.
    prefill = [r for r in rows if r["kind"] == "prefill"]
    for be in backends:
        for shape in ordered(r["shape"] for r in prefill):
            n = prefill[0]["n"]
            header = ["config"] + [f"{t}T query tok/s · × fp16" for t in threads]
            body = []
            for cfg in ["plain-fp16"] + configs:
                backend = "baseline" if cfg in BASELINES else be
                row = [cfg]
                for t in threads:
                    r = ix.get("prefill", cfg, backend, shape, n, t)
                    base = ix.get("prefill", "plain-fp16", "baseline", shape, n, t)
                    if r is None or r["error"]:
                        row.append("-" if r is None else "error")
                        continue
                    row.append(f"{fmt_rate(r.get('tok/s'))} · {fmt_ratio(base['us'] / r['us'] if base else None)}")
                body.append(row)
            md.append(f"\n### Prefill: 512-query chunk over {n // 1024}k tokens, {shape}, backend {be}\n")
            md.append(table(header, body))

    # Append: one table per shape.
    append = [r for r in rows if r["kind"] == "append"]
    for be in [b for b in backends if any(r["backend"] == b for r in append)]:
        for shape in ordered(r["shape"] for r in append):
            ns = sorted(ordered(r["n"] for r in append if r["shape"] == shape))
            header = ["config"] + [f"n={n} {t}T: tok/s · GB/s · × memcpy" for n in ns for t in threads]
            body = []
            for cfg in ["memcpy-fp32"] + configs:
                backend = "baseline" if cfg in BASELINES else be
                row = [cfg]
                for n in ns:
                    for t in threads:
                        r = ix.get("append", cfg, backend, shape, n, t)
                        base = ix.get("append", "memcpy-fp32", "baseline", shape, n, t)
                        ratio = r.get("GB/s", 0) / base["GB/s"] if r and base and not base["error"] and base.get("GB/s") else None
                        row.append("-" if r is None else "error" if r["error"] else
                                   f"{fmt_rate(r.get('tok/s'))} · {r.get('GB/s', 0):.2f} · {fmt_ratio(ratio)}")
                if any(c != "-" for c in row[1:]):
                    body.append(row)
            md.append(f"\n### Append (quantize + store), {shape}, n tokens per call; GB/s of fp32 K+V input; "
                      f"× memcpy = that rate / memcpy-fp32's (the same input copied, same run; issue 17: ≥ 0.5×); "
                      f"backend {be}\n")
            md.append(table(header, body))

    # Memory.
    mem = [r for r in rows if r["kind"] == "memory"]
    if mem:
        header = ["config", "shape", "K bits", "V bits", "analytic payload B/token", "measured payload B/token",
                  "positions+headers B/token", "total B/token @4k", "check"]
        body = []
        for r in mem:
            if r["error"]:
                body.append([r["config"], r["shape"], "", "", "", "", "", "", "FAIL: " + r["error"]])
                continue
            body.append([r["config"], r["shape"], f"{r['k_bits']:g}", f"{r['v_bits']:g}", f"{r['analytic_B']:g}",
                         f"{r['payload_B']:g}", f"{r['overhead_B']:g}", f"{r['total_B']:.2f}",
                         "equal" + (f" ({int(r['fp_tokens'])} fp32 tokens)" if r.get("fp_tokens") else "")])
        md.append("\n### Memory per token per layer (bytes; payload = codes + scales/zero-points)\n")
        md.append(table(header, body))
    return "\n".join(md) + "\n"


# Issue 17's targets, from one run: (label, shape, ctx, workers, case, reference case, op, threshold).
TODAY_MS = {("8b-class", 32768): 19.1, ("smollm2-135m", 32768): 2.47}  # int4-g32, AVX2, 1 thread, before issue 17


def render_seq(rows):
    """Side-by-side decode of ONE sequence: kvpack (split-K over W workers) beside llama.cpp's ggml
    flash attention (threadpool of W) and the probe, per shape and context; then the targets."""
    seq = [r for r in rows if r["kind"] == "decode-seq"]
    if not seq:
        return []
    ix = Index(seq)
    md = []
    workers = sorted(ordered(r["threads"] for r in seq))
    for shape in ordered(r["shape"] for r in seq):
        for ctx in sorted(ordered(r["n"] for r in seq if r["shape"] == shape), reverse=True):
            cases = ordered((r["config"], r["backend"]) for r in seq if r["shape"] == shape and r["n"] == ctx)
            cases.sort(key=lambda c: (c[1] != "ggml", c[1], c[0]))
            header = ["case", "bytes/token"]
            for w in workers:
                header += [f"{w}W time", f"{w}W GB/s", f"{w}W roofline", f"{w}W × llama.cpp f16"]
            body = []
            for cfg, be in cases:
                first = next((ix.get("decode-seq", cfg, be, shape, ctx, w) for w in workers
                              if ix.get("decode-seq", cfg, be, shape, ctx, w)), None)
                if first is None:
                    continue
                name = f"llama.cpp {cfg[len('llamacpp-'):]}" if be == "ggml" else f"kvpack {cfg} ({be})"
                row = [name, f"{first.get('kv_bytes', 0) / ctx:.1f}"]
                for w in workers:
                    r = ix.get("decode-seq", cfg, be, shape, ctx, w)
                    base = ix.get("decode-seq", "llamacpp-f16", "ggml", shape, ctx, w)
                    if r is None or r["error"]:
                        row += ["-" if r is None else "error", "", "", ""]
                        continue
                    row += [fmt_time(r["us"]), f"{r.get('GB/s', 0):.1f}", fmt_pct(r.get("roofline")),
                            fmt_ratio(base["us"] / r["us"] if base and not base["error"] and base["us"] else None)]
                body.append(row)
            probes = ", ".join(f"{w}W {ix.get('decode-seq', *cases[0], shape, ctx, w).get('probe_GB/s', 0):.1f} GB/s"
                               for w in workers if ix.get("decode-seq", *cases[0], shape, ctx, w))
            md.append(f"\n### One sequence, {ctx // 1024}k context, {SHAPE_LABEL.get(shape, shape)}: kvpack vs llama.cpp "
                      f"(probe {probes})\n")
            md.append(table(header, body))

    def t(cfg, be, shape, ctx, w):
        r = ix.get("decode-seq", cfg, be, shape, ctx, w)
        return None if r is None or r["error"] else r

    simd = next((b for b in ("avx2", "neon") if any(r["backend"] == b for r in seq)), "scalar")
    lines = []
    for shape in ordered(r["shape"] for r in seq):
        ctx = 32768
        i4, f16k = t("int4-g32", simd, shape, ctx, 1), t("fp16", simd, shape, ctx, 1)
        lf16, lq8 = t("llamacpp-f16", "ggml", shape, ctx, 1), t("llamacpp-q8_0", "ggml", shape, ctx, 1)
        i4w = t("int4-g32", simd, shape, ctx, max(workers))
        if i4 is None:
            continue
        today = TODAY_MS.get((shape, ctx))
        def chk(x, ok):
            return "-" if x is None else f"{x:.2f} ({'met' if ok(x) else 'missed'})"
        lines.append([shape, chk(today * 1e3 / i4["us"] if today else None, lambda x: x >= 4),
                      chk(lf16["us"] / i4["us"] if lf16 else None, lambda x: x >= 4),
                      chk(i4w.get("roofline") if i4w else None, lambda x: x >= 0.45),
                      chk(i4["us"] / f16k["us"] if f16k else None, lambda x: x <= 0.45),
                      chk(lq8["us"] / t("int8", simd, shape, ctx, 1)["us"] if lq8 and t("int8", simd, shape, ctx, 1) else None,
                          lambda x: x >= 3),
                      chk(lq8["us"] / t("k8v4", simd, shape, ctx, 1)["us"] if lq8 and t("k8v4", simd, shape, ctx, 1) else None,
                          lambda x: x >= 3)])
    if lines:
        md.append(f"\n### Issue 17 targets (32k, int4-g32, backend {simd}, ratios from this run)\n")
        md.append(table(["shape", "1W speed-up vs before (≥ 4)", "1W × llama.cpp f16 (≥ 4)",
                         f"{max(workers)}W split-K roofline (≥ 0.45)", "int4 / own fp16 time (≤ 0.45)",
                         "int8 × llama.cpp q8_0 (≥ 3)", "k8v4 × llama.cpp q8_0 (≥ 3)"], lines))
        md.append("\n'before' = the issue's AVX2 int4-g32 figure on this machine (19.1 ms 8B, 2.47 ms SmolLM2, 1 thread).")
    return md


def plot(rows, png):
    gnuplot = shutil.which("gnuplot")
    if gnuplot is None:
        print("render_table.py: gnuplot not found, no plot", file=sys.stderr)
        return False
    decode = [r for r in rows if r["kind"] == "decode" and r["threads"] == 1 and not r["error"]]
    shapes = ordered(r["shape"] for r in decode)
    if not shapes:
        return False
    tmp = tempfile.mkdtemp(prefix="kvpack-plot-")
    script = ["set terminal pngcairo size 1800,640 font ',10' noenhanced", f"set output '{png}'",
              f"set multiplot layout 1,{len(shapes)} title 'kvpack decode attention, one layer, 1 thread'",
              "set logscale xy", "set xlabel 'context length (tokens)'", "set ylabel 'time per token per layer (ms)'",
              "set format y '%g'",
              "set key outside right top font ',8'", "set grid"]  # outside: 20+ series hide the lines
    for shape in shapes:
        series = ordered((r["config"], r["backend"]) for r in decode if r["shape"] == shape)
        ctxs = sorted(ordered(r["n"] for r in decode if r["shape"] == shape))
        plots = []
        for i, (cfg, be) in enumerate(series):
            path = os.path.join(tmp, f"{shape}-{i}.dat")
            with open(path, "w") as f:
                for c in ctxs:
                    r = next((x for x in decode if x["shape"] == shape and x["config"] == cfg and x["backend"] == be
                              and x["n"] == c), None)
                    if r:
                        f.write(f"{c} {r['us'] / 1e3}\n")
            label = cfg if be == "baseline" else f"{cfg} ({be})"
            style = "dashtype 2 lw 2" if be == "baseline" else "lw 1.5"
            plots.append(f"'{path}' using 1:2 with linespoints {style} title '{label}'")
        script.append(f"set title '{SHAPE_LABEL.get(shape, shape)}'")
        script.append(f"set xtics ({', '.join(str(c) for c in ctxs)})")
        script.append(f"set xrange [{ctxs[0] / 1.4}:{ctxs[-1] * 1.4}]")
        script.append("plot " + ", ".join(plots))
    script.append("unset multiplot")
    gp = os.path.join(tmp, "plot.gp")
    with open(gp, "w") as f:
        f.write("\n".join(script) + "\n")
    res = subprocess.run([gnuplot, gp], capture_output=True, text=True)
    shutil.rmtree(tmp, ignore_errors=True)
    if res.returncode != 0:
        print("render_table.py: gnuplot failed:\n" + res.stderr, file=sys.stderr)
        return False
    return True


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("json")
    ap.add_argument("--md", help="also write the Markdown here")
    ap.add_argument("--png", help="write the time-per-token plot here (gnuplot)")
    ap.add_argument("--clock", choices=("wall", "cpu"), default="wall",
                    help="wall (as measured, default) or cpu (CPU time per thread: idle-machine estimate)")
    a = ap.parse_args()
    context, rows = load(a.json, a.clock)
    md = render(context, rows, a.clock)
    sys.stdout.write(md)
    if a.md:
        with open(a.md, "w") as f:
            f.write(md)
    if a.png and plot(rows, a.png):
        print(f"\nPlot: {a.png}")
    failed = [r for r in rows if r["error"]]
    for r in failed:
        print(f"FAILED: {r['name']}: {r['error']}", file=sys.stderr)
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
