#!/usr/bin/env python3
"""Progress bar for a program that prints one line per finished work item (e.g. Google Benchmark).

    program | python3 tools/progress_lines.py --names FILE [--progress]

Copies stdin to stdout unchanged, line by line. A line whose first word is one of the names in
FILE (one per line, e.g. the output of `kvpack_bench --benchmark_list_tests`) counts as one item
done; the bar (done/total, elapsed, ETA, current item) goes to stderr when stderr is a terminal,
or with --progress / KVPACK_PROGRESS=1 (then one line per 10 %, so logs stay short).
"""
import argparse
import os
import sys
import time


def fmt(s: float) -> str:
    return f"{int(s) // 60}m{int(s) % 60:02d}s"


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--names", required=True, help="file with one item name per line")
    ap.add_argument("--progress", action="store_true", help="draw even when stderr is not a terminal")
    args = ap.parse_args()
    with open(args.names, encoding="utf-8", errors="replace") as f:
        names = {line.split()[0] for line in f if line.strip()}
    total = max(len(names), 1)
    tty = sys.stderr.isatty()
    on = tty or args.progress or os.environ.get("KVPACK_PROGRESS") == "1"
    start, done, last_decile = time.monotonic(), 0, -1
    for line in sys.stdin:
        sys.stdout.write(line)
        sys.stdout.flush()
        words = line.split()
        if not words or words[0] not in names:
            continue
        done = min(done + 1, total)
        if not on:
            continue
        frac, t = done / total, time.monotonic() - start
        decile = int(frac * 10)
        if not tty and decile == last_decile:
            continue
        last_decile = decile
        fill = int(frac * 30)
        eta = t * (1 - frac) / frac if frac > 0 else 0
        bar = f"[{'#' * fill}{'.' * (30 - fill)}] {done}/{total}  {fmt(t)} elapsed, ETA {fmt(eta)}  {words[0][:40]}"
        sys.stderr.write(("\r" + bar + "\x1b[K") if tty else bar + "\n")
        sys.stderr.flush()
    if on and tty:
        sys.stderr.write("\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
