#!/usr/bin/env python3
"""Instruction budget of kvpack's CUDA decode kernel, read from ptxas and the SASS (no GPU needed).

Compiles bench/cuda/sass_kernels.cu for sm_90 with `nvcc -cubin -Xptxas -v`, disassembles it with
`cuobjdump -sass` and prints, per codec (K and V the same codec, GQA group 4, Blocks<64>,
head_dim 128): registers, spill bytes, static shared memory, occupancy from registers, and the
hot loop's warp-instructions per token per KV head. Exits 1 when a kernel spills, when the hot
loop is not straight-line or spills, or when a codec exceeds its threshold (--max, default below).
Spills outside the hot loop (the fp32 exact-row path, the final reduction) are reported, not failed.

How it counts
  The split kernel walks the blocks of a KV head in one loop (decode_kernel.cuh `block loop`):
  per block it waits for the staged copy, scores the block's B tokens (a lane per token),
  runs the softmax, and accumulates p * v; every loop inside is unrolled at compile time
  (head_dim, B and the group are template parameters), so the body is straight-line code that each
  of the CTA's kDecodeWarps warps executes once per block. In the SASS the block loop is the
  backward branch (BRA to a lower address) that spans the most instructions. Then
      warp-instructions per token per KV head = (body instructions x warps per CTA) / B.
  Predicated-off instructions and branches around empty blocks are counted as executed (an
  upper bound for full blocks); instructions outside the loop (prologue, epilogue, the fp32
  exact rows) are not counted: they run once per split, not per token. A nested backward
  branch inside the body means the count is NOT per block; the script then fails (the old kernel
  had those: runtime head_dim and group).

Budget (the derivation the threshold comes from)
  Bytes per token per KV head of INT4 g32 fp16 scale+zero, head_dim 128, K and V:
  2 x (128 x 4 / 8 + 4 groups x 4 bytes) = 160 bytes. H200: copy bandwidth ~4.3 TB/s (of 4.8
  peak) -> 26.9 G tokens x KV heads per second. Issue rate: 132 SMs x 4 schedulers x 1 warp-
  instruction per clock x 1.755 GHz (sustained under load; 1.98 boost) = 927 G warp-
  instructions/s. Budget = 927 / 26.9 = ~34 warp-instructions per token per KV head at INT4
  (~25 at 4.8 TB/s and 1.4 GHz, the issue's figure); INT8 and FP8 (288 and 264 bytes/token)
  allow ~60 and ~64. Floor of an fp32 kernel: group x head_dim x 2 FMAs per token = 1024 lane-FMAs
  = 32 warp-instructions at group 4, so fp32 FMAs alone use the INT4 budget; reaching it needs
  packed fp16 math or tensor cores (not done: kvpack's kernels accumulate in fp32).
  Measured (CUDA 13.0, this kernel): INT4 92.5, INT8 92.1, FP8 E4M3 87.2, E5M2 85.2; of which
  36 are FFMAs (32 the fp32 floor above, 4 the per-group scale/zero and p * zero), ~14 the exact
  integer-code unpacking (LOP3/PRMT, HADD2, HADD2.F32 widening), 5 the query loads (broadcast
  LDS.128), the rest softmax, staging, addresses and the accumulators' shared-memory round trip.
  The previous kernel: ~195 by the review's count (a 4-level shuffle per token, software fp16
  metadata, I2F per code); this script's static count of it (its inner loops once) is 67-79.
  Threshold (--max): 100 for every codec, ~8 % above the measured kernel, so a regression fails CI.
"""
from __future__ import annotations

import argparse
import os
import re
import shutil
import subprocess
import sys
import tempfile

WARPS_PER_CTA = 4
BLOCK_TOKENS = 64
# Per codec: mangled-name fragment, budget (derived above), CI threshold.
CODECS = {
    "int4": ("Int4", 34, 100),
    "int8": ("Int8", 60, 100),
    "fp8_e4m3": ("Fp8E4M3", 64, 100),
    "fp8_e5m2": ("Fp8E5M2", 64, 100),
}


def tool(name: str) -> str:
    """Path of a CUDA binary: PATH, /usr/local/cuda/bin, or the PyPI nvidia-cuda-* wheels."""
    found = shutil.which(name) or (f"/usr/local/cuda/bin/{name}" if os.path.exists(f"/usr/local/cuda/bin/{name}") else None)
    if found:
        return found
    try:
        import nvidia  # type: ignore  # namespace package of the nvidia-cuda-* wheels
        for base in nvidia.__path__:
            for sub in ("cu13", "cu12", "cuda_cuobjdump", "cuda_nvdisasm"):
                cand = os.path.join(base, sub, "bin", name)
                if os.path.exists(cand):
                    return cand
    except ImportError:
        pass
    sys.exit(f"sass_budget: {name} not found (pip install nvidia-cuda-cuobjdump nvidia-cuda-nvdisasm)")


def parse_ptxas(text: str) -> dict[str, dict[str, int]]:
    info: dict[str, dict[str, int]] = {}
    current = None
    for line in text.splitlines():
        m = re.search(r"Compiling entry function '(\S+)'", line)
        if m:
            current = m.group(1)
            info[current] = {}
            continue
        if current is None:
            continue
        m = re.search(r"(\d+) bytes spill stores, (\d+) bytes spill loads", line)
        if m:
            info[current]["spill"] = int(m.group(1)) + int(m.group(2))
        m = re.search(r"Used (\d+) registers", line)
        if m:
            info[current]["regs"] = int(m.group(1))
            s = re.search(r"(\d+) bytes smem", line)
            info[current]["smem"] = int(s.group(1)) if s else 0
    return info


def parse_sass(text: str) -> dict[str, list[tuple[int, str]]]:
    funcs: dict[str, list[tuple[int, str]]] = {}
    current = None
    for line in text.splitlines():
        m = re.search(r"Function : (\S+)", line)
        if m:
            current = m.group(1)
            funcs[current] = []
            continue
        m = re.match(r"\s+/\*([0-9a-f]{4,})\*/\s+(.*?)\s*;", line)
        if m and current:
            funcs[current].append((int(m.group(1), 16), m.group(2)))
    return funcs


def hot_loop(ins: list[tuple[int, str]]) -> tuple[int, int, int]:
    """(body instructions, nested backward branches, shuffles, local-memory spill accesses) of the largest loop."""
    # Out-of-line slow paths (expf, division) follow the body's last EXIT and branch back into
    # it: those branches are not loops.
    end = max((a for a, t in ins if re.fullmatch(r"EXIT", t.strip())), default=ins[-1][0] if ins else 0)
    loops = []
    for addr, text in ins:
        if addr > end:
            continue
        m = re.search(r"\bBRA (?:\S+ )?0x([0-9a-f]+)", text)
        if m and int(m.group(1), 16) < addr:
            loops.append((int(m.group(1), 16), addr))
    if not loops:
        return 0, 0, 0, 0
    lo, hi = max(loops, key=lambda l: l[1] - l[0])
    body = [t for a, t in ins if lo <= a <= hi and not t.startswith("NOP")]
    nested = sum(1 for l in loops if l != (lo, hi) and lo <= l[0] and l[1] <= hi)
    spills = sum(1 for t in body if re.search(r"\b(LDL|STL)\b", t))
    return len(body), nested, sum(1 for t in body if "SHFL" in t), spills


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--source", default=os.path.join(os.path.dirname(__file__), "sass_kernels.cu"))
    ap.add_argument("--arch", default="90")
    ap.add_argument("--max", type=float, default=None, help="threshold for every codec (default: per codec)")
    ap.add_argument("--keep", default=None, help="folder for the cubin, ptxas log and SASS")
    args = ap.parse_args()
    root = os.path.abspath(os.path.join(os.path.dirname(__file__), "..", ".."))
    work = args.keep or tempfile.mkdtemp(prefix="kvpack-sass-")
    os.makedirs(work, exist_ok=True)
    cubin = os.path.join(work, "sass_kernels.cubin")
    cmd = [tool("nvcc"), "-std=c++20", "-O3", "-cubin", f"-arch=sm_{args.arch}", "-Xptxas", "-v",
           f"-I{root}/include", f"-I{root}/kernels", args.source, "-o", cubin]
    ptx = subprocess.run(cmd, capture_output=True, text=True)
    if ptx.returncode != 0:
        print(ptx.stdout + ptx.stderr)
        return 1
    sass = subprocess.run([tool("cuobjdump"), "-sass", cubin], capture_output=True, text=True, check=True).stdout
    with open(os.path.join(work, "ptxas.txt"), "w") as f:
        f.write(ptx.stderr)
    with open(os.path.join(work, "sass.txt"), "w") as f:
        f.write(sass)
    regs, funcs = parse_ptxas(ptx.stderr), parse_sass(sass)
    print(f"kvpack CUDA decode, sm_{args.arch}, group 4, Blocks<{BLOCK_TOKENS}>, head_dim 128, {WARPS_PER_CTA} warps/CTA")
    print(f"{'codec':10} {'regs':>5} {'spill B':>8} {'smem B':>7} {'occ %':>6} {'loop ins':>9} {'SHFL':>5} "
          f"{'ins/token/KVh':>14} {'budget':>7} {'max':>5}")
    failed = 0
    for name, (frag, budget, limit) in CODECS.items():
        limit = args.max if args.max is not None else limit
        fn = next((f for f in funcs if "decode" in f and f"{len(frag)}{frag}" in f), None)
        if fn is None:
            print(f"{name:10} kernel not found in the SASS")
            failed = 1
            continue
        r = regs.get(fn, {})
        body, nested, shfl, loop_spills = hot_loop(funcs[fn])
        per_token = body * WARPS_PER_CTA / BLOCK_TOKENS
        # Occupancy from registers alone: 65536 registers per SM, allocated per warp in units of 256.
        warp_regs = (r.get("regs", 255) * 32 + 255) // 256 * 256
        occ = min(64, (65536 // warp_regs) // WARPS_PER_CTA * WARPS_PER_CTA) / 64 * 100
        flag = ""
        if nested:
            flag += f"  FAIL: {nested} nested loops in the hot loop (count is not per block)"
        if loop_spills:
            flag += f"  FAIL: {loop_spills} spill accesses in the hot loop"
        if per_token > limit:
            flag += f"  FAIL: above {limit}"
        failed |= bool(flag)
        print(f"{name:10} {r.get('regs', -1):5d} {r.get('spill', -1):8d} {r.get('smem', -1):7d} {occ:6.1f} {body:9d} "
              f"{shfl:5d} {per_token:14.1f} {budget:7d} {limit:5.0f}{flag}")
    print(f"(files in {work})")
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
