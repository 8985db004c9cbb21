#!/usr/bin/env python3
"""The C ABI (include/kvpack/c/kvpack.h, library kvpack_c) driven through ctypes with numpy.

Usage: test_capi.py PATH/TO/libkvpack_c.so

Attention is compared with float64 softmax attention computed here in numpy over K/V passed
through the codec's documented round trip (DESIGN.md "Numerics": scale rounded UP and zero-point
DOWN to fp16, codes = clamp(round-half-even((x - zero) / scale)) with x - zero and the division in
fp32 as the codec computes them; fp16 = round to nearest even),
with the latest append exact (CASES C5). What remains is fp32 accumulation in the kernel: the
tolerance is 1e-5 * (1 + max|V|), ~10x the fp32 error of sums over <= 65 tokens x 64 channels
(measured: 2-3 % of it), plus, where kvpack_pool_kernel reports a quantized query (AVX2 integer Q.K),
the bound that query allows (query_error_bound), while one quantization step moves outputs by 1e-3 (INT8) to 1e-2 (INT4):
each run also checks that the reference WITHOUT the codec is further away than the tolerance
(the test can tell codecs apart, fp16 included).
Batched decode with additive masks (kvpack_attend_batch_masked): tests/capi/test_capi_masks.py.
Errors checked: bad policy names, an evicting policy, a freed sequence, a destroyed pool, pool
exhaustion (clear status, earlier sequences unharmed), NULL arguments.
Exit 0: pass; 1: fail; 77: skipped (numpy missing and not in CI).
"""
import ctypes as C
import os
import sys

try:
    import numpy as np
except ImportError:
    print("numpy not available", file=sys.stderr)
    sys.exit(1 if os.environ.get("CI") else 77)

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from kernel_bounds import query_error_bound, value_error_bound  # noqa: E402

OK, INVALID, NON_FINITE, CAPACITY, NOT_PRESENT, UNSUPPORTED = 0, 1, 2, 3, 7, 8


class Shape(C.Structure):
    _fields_ = [("layers", C.c_int32), ("q_heads", C.c_int32), ("kv_heads", C.c_int32), ("head_dim", C.c_int32),
                ("max_tokens", C.c_int64), ("attn_scale", C.c_float)]


class PoolConfig(C.Structure):
    _fields_ = [("shape", Shape), ("byte_budget", C.c_uint64), ("max_sequences", C.c_int32),
                ("max_rollback_tokens", C.c_int32)]


class Seq(C.Structure):
    _fields_ = [("index", C.c_uint32), ("generation", C.c_uint32)]


class Stats(C.Structure):
    _fields_ = [(n, C.c_uint64) for n in ("page_bytes", "pages_total", "pages_used", "pages_free", "pages_shared",
                                          "budget_bytes", "bytes_used", "bytes_if_unshared", "overhead_bytes",
                                          "exact_bytes", "memory_bytes")] + \
               [("sequences", C.c_int64), ("block_tokens", C.c_int32), ("key_bits_per_value", C.c_double),
                ("value_bits_per_value", C.c_double)]


class SwapStats(C.Structure):
    _fields_ = [("sequences_swapped", C.c_int64), ("pages_swapped", C.c_uint64), ("swap_bytes", C.c_uint64)]


class KernelInfo(C.Structure):
    _fields_ = [("backend", C.c_char_p), ("query_group", C.c_int32), ("query_error", C.c_double),
                ("value_group", C.c_int32), ("value_error", C.c_double)]


FP = C.POINTER(C.c_float)
IP = C.POINTER(C.c_int32)


def load(path):
    lib = C.CDLL(path)
    sig = {
        "kvpack_abi_version": (C.c_int32, []),
        "kvpack_last_error": (C.c_char_p, []),
        "kvpack_status_name": (C.c_char_p, [C.c_int]),
        "kvpack_policy_count": (C.c_int32, []),
        "kvpack_policy_name": (C.c_char_p, [C.c_int32, IP]),
        "kvpack_policy_evicts": (C.c_int32, [C.c_int32]),
        "kvpack_pool_create": (C.c_int, [C.c_char_p, C.POINTER(PoolConfig), C.POINTER(C.c_void_p)]),
        "kvpack_pool_destroy": (None, [C.c_void_p]),
        "kvpack_workspace_create": (C.c_int, [C.POINTER(C.c_void_p)]),
        "kvpack_workspace_destroy": (None, [C.c_void_p]),
        "kvpack_seq_create": (C.c_int, [C.c_void_p, C.POINTER(Seq)]),
        "kvpack_seq_fork": (C.c_int, [C.c_void_p, Seq, C.POINTER(Seq)]),
        "kvpack_seq_free": (C.c_int, [C.c_void_p, Seq]),
        "kvpack_seq_length": (C.c_int, [C.c_void_p, Seq, C.POINTER(C.c_int64)]),
        "kvpack_seq_truncate": (C.c_int, [C.c_void_p, Seq, C.c_int64]),
        "kvpack_seq_swap_out": (C.c_int, [C.c_void_p, Seq, C.POINTER(C.c_int64)]),
        "kvpack_seq_swap_in": (C.c_int, [C.c_void_p, Seq, C.POINTER(C.c_int64)]),
        "kvpack_append": (C.c_int, [C.c_void_p, Seq, C.c_int32, FP, FP, IP, C.c_int64]),
        "kvpack_attend": (C.c_int, [C.c_void_p, Seq, C.c_int32, FP, C.c_int64, FP, C.c_void_p]),
        "kvpack_attend_batch": (C.c_int, [C.c_void_p, C.c_int32, C.POINTER(Seq), C.c_int64, FP, FP,
                                          C.POINTER(C.c_void_p), C.c_int32]),
        "kvpack_attend_batch_masked": (C.c_int, [C.c_void_p, C.c_int32, C.POINTER(Seq), C.c_int64, FP, FP,
                                                 C.POINTER(C.c_int64), FP, C.POINTER(C.c_void_p), C.c_int32]),
        "kvpack_pool_stats_get": (C.c_int, [C.c_void_p, C.POINTER(Stats)]),
        "kvpack_swap_stats_get": (C.c_int, [C.c_void_p, C.POINTER(SwapStats)]),
        "kvpack_pool_kernel": (C.c_int, [C.c_void_p, C.POINTER(KernelInfo)]),
    }
    for name, (res, args) in sig.items():
        f = getattr(lib, name)
        f.restype, f.argtypes = res, args
    return lib


failures = []


def check(cond, what):
    if not cond:
        failures.append(what)
        print("FAIL:", what, file=sys.stderr)


def fptr(a):
    assert a.dtype == np.float32 and a.flags["C_CONTIGUOUS"]
    return a.ctypes.data_as(FP)


class Pool:
    """A pool handle with numpy-friendly calls; every call returns (status, result)."""

    def __init__(self, lib, policy, shape, budget=8 << 20, max_sequences=8, rollback=0):
        self.lib, self.shape = lib, shape
        cfg = PoolConfig(Shape(*shape, 0.0), budget, max_sequences, rollback)
        self.h = C.c_void_p()
        self.status = lib.kvpack_pool_create(policy.encode(), C.byref(cfg), C.byref(self.h))

    def seq(self):
        s = Seq()
        st = self.lib.kvpack_seq_create(self.h, C.byref(s))
        return st, s

    def fork(self, parent):
        s = Seq()
        return self.lib.kvpack_seq_fork(self.h, parent, C.byref(s)), s

    def append(self, s, layer, k, v, pos):
        return self.lib.kvpack_append(self.h, s, layer, fptr(k), fptr(v), pos.ctypes.data_as(IP), len(pos))

    def attend(self, s, layer, q, ws=None):
        out = np.zeros_like(q)
        st = self.lib.kvpack_attend(self.h, s, layer, fptr(q), q.shape[0], fptr(out), ws)
        return st, out

    def length(self, s):
        n = C.c_int64()
        return self.lib.kvpack_seq_length(self.h, s, C.byref(n)), n.value

    def stats(self):
        r = Stats()
        return self.lib.kvpack_pool_stats_get(self.h, C.byref(r)), r

    def swap_stats(self):
        r = SwapStats()
        return self.lib.kvpack_swap_stats_get(self.h, C.byref(r)), r

    def kernel(self):
        r = KernelInfo()
        return self.lib.kvpack_pool_kernel(self.h, C.byref(r)), r


# ---- float64 reference --------------------------------------------------------------------------

def f16_round(x, direction):
    """x rounded to binary16 toward +inf (direction 1) or -inf (-1), as float64."""
    h = x.astype(np.float16).astype(np.float64)
    if direction > 0:
        bump = h < x
        h[bump] = np.nextafter(x[bump].astype(np.float16), np.float16(np.inf)).astype(np.float64)
    else:
        bump = h > x
        h[bump] = np.nextafter(x[bump].astype(np.float16), np.float16(-np.inf)).astype(np.float64)
    return h


def roundtrip(x, codec):
    """x [..., D] float32 through `codec`; per-token groups along the last axis."""
    kind = codec[0]
    x = x.astype(np.float64)
    if kind == "fp32":
        return x
    if kind == "fp16":
        return x.astype(np.float16).astype(np.float64)
    bits, group, asym = codec[1], codec[2], codec[3]
    g = x.reshape(*x.shape[:-1], x.shape[-1] // group, group)
    if asym:
        lo, hi = g.min(axis=-1, keepdims=True), g.max(axis=-1, keepdims=True)
        zero = f16_round(lo, -1)
        scale = f16_round((hi - zero) / (2 ** bits - 1), 1)
        t = (g.astype(np.float32) - zero.astype(np.float32)) / scale.astype(np.float32)  # in fp32, as the codec
        q = np.clip(np.rint(t), 0, 2 ** bits - 1)
        out = zero + scale * q
    else:
        amax = np.abs(g).max(axis=-1, keepdims=True)
        scale = f16_round(amax / (2 ** (bits - 1) - 1), 1)
        t = g.astype(np.float32) / scale.astype(np.float32)  # in fp32, as the codec
        q = np.clip(np.rint(t), -(2 ** (bits - 1)), 2 ** (bits - 1) - 1)
        out = scale * q
    return out.reshape(x.shape)


CODECS = {"fp32": ("fp32",), "fp16": ("fp16",), "int8": ("int", 8, 32, False), "int4-g32": ("int", 4, 32, True),
          "int4-g64": ("int", 4, 64, True), "q4_0": ("int", 4, 32, False)}
# policy -> (key codec, value codec)
POLICIES = {
    "fp32": ("fp32", "fp32"), "fp16": ("fp16", "fp16"), "int8": ("int8", "int8"), "int4-g32": ("int4-g32", "int4-g32"),
    "int4-g64": ("int4-g64", "int4-g64"), "k8v4": ("int8", "int4-g32"), "q8_0": ("int8", "int8"),
    "q4_0": ("q4_0", "q4_0"), "q4_1": ("int4-g32", "int4-g32"), "q8_0/q4_0": ("int8", "q4_0"), "f16/q4_1": ("fp16", "int4-g32"),
    # KIVI keys: per-channel groups of 32 tokens, but the 128-token fp32 residual window holds all
    # 65 tokens of this test, so both roles are exact here.
    "kivi4": ("fp32", "fp32"),
}


def attention_ref(K, V, Q, q_first, q_heads, kv_heads):
    """K, V [n][kv][D] float64; Q [n_q][q_heads][D]; causal from cache index q_first."""
    n, _, D = K.shape
    group = q_heads // kv_heads
    out = np.zeros(Q.shape, dtype=np.float64)
    scale = 1.0 / np.sqrt(D)
    for i in range(Q.shape[0]):
        vis = min(n, q_first + i + 1)
        for h in range(q_heads):
            kh = h // group
            s = K[:vis, kh, :] @ Q[i, h, :].astype(np.float64) * scale
            p = np.exp(s - s.max())
            p /= p.sum()
            out[i, h, :] = p @ V[:vis, kh, :]
    return out


# ---- tests ----------------------------------------------------------------------------------------

SHAPE = (2, 4, 2, 64, 256)  # layers, q_heads, kv_heads, head_dim, max_tokens
CHUNKS = (31, 33, 1)        # odd sizes across group (32) and page (64 tokens) boundaries


def rand(rng, *shape):
    return rng.standard_normal(shape).astype(np.float32)


def test_attention(lib, policy, rng):
    L, QH, KH, D, _ = SHAPE
    kc, vc = (CODECS[c] for c in POLICIES[policy])
    pool = Pool(lib, policy, SHAPE)
    check(pool.status == OK, f"{policy}: pool_create -> {pool.status} {lib.kvpack_last_error()}")
    if pool.status != OK:
        return
    st, kinfo = pool.kernel()
    check(st == OK and kinfo.backend.decode() in ("avx2", "neon", "scalar"), f"{policy}: pool_kernel")
    check(kinfo.query_group >= 0 and (kinfo.query_group == 0 or D % kinfo.query_group == 0), f"{policy}: query group")
    check(kinfo.value_group == 0 or D % kinfo.value_group == 0, f"{policy}: value group")
    st, s = pool.seq()
    check(st == OK, f"{policy}: seq_create")
    ws = C.c_void_p()
    check(lib.kvpack_workspace_create(C.byref(ws)) == OK, "workspace_create")
    Ks, Vs = [[] for _ in range(L)], [[] for _ in range(L)]
    pos0, worst, codec_gap = 0, 0.0, 0.0
    for n in CHUNKS:
        pos = np.arange(pos0, pos0 + n, dtype=np.int32)
        pos0 += n
        for layer in range(L):
            k, v, q = rand(rng, n, KH, D) * 2, rand(rng, n, KH, D), rand(rng, n, QH, D)
            check(pool.append(s, layer, k, v, pos) == OK, f"{policy}: append {n} {lib.kvpack_last_error()}")
            st, out = pool.attend(s, layer, q, ws if layer == 0 else None)
            check(st == OK, f"{policy}: attend -> {st} {lib.kvpack_last_error()}")
            past_k = np.concatenate(Ks[layer]) if Ks[layer] else np.zeros((0, KH, D), np.float32)
            past_v = np.concatenate(Vs[layer]) if Vs[layer] else np.zeros((0, KH, D), np.float32)
            Kq = np.concatenate([roundtrip(past_k, kc), k.astype(np.float64)])
            Vq = np.concatenate([roundtrip(past_v, vc), v.astype(np.float64)])
            ref = attention_ref(Kq, Vq, q, len(Kq) - n, QH, KH)
            tol = 1e-5 * (1.0 + np.abs(Vq).max()) + query_error_bound(
                Kq, Vq, q, len(Kq) - n, QH, KH, ref, kinfo.query_group, kinfo.query_error) + value_error_bound(
                Kq, Vq, q, len(Kq) - n, QH, KH, kinfo.value_group, kinfo.value_error, len(vc) > 3 and bool(vc[3]))
            err = np.abs(out - ref).max()
            worst = max(worst, err / tol)
            check(err <= tol, f"{policy}: chunk {n} layer {layer}: |out - ref64| = {err:.3g} > tol {tol:.3g}")
            Kx = np.concatenate([past_k, k]).astype(np.float64)
            Vx = np.concatenate([past_v, v]).astype(np.float64)
            codec_gap = max(codec_gap, np.abs(out - attention_ref(Kx, Vx, q, len(Kx) - n, QH, KH)).max() / tol)
            Ks[layer].append(k)
            Vs[layer].append(v)
    st, n = pool.length(s)
    check(st == OK and n == sum(CHUNKS), f"{policy}: length {n}")
    lossy = POLICIES[policy] not in (("fp32", "fp32"),)
    if lossy:  # the codec is visible at this tolerance: a reference without it would fail
        check(codec_gap > 1.0, f"{policy}: output indistinguishable from unquantized attention (gap {codec_gap:.3g} tol)")
    print(f"  {policy:10s} max |out - ref64| / tol = {worst:.3f}; unquantized ref / tol = {codec_gap:.1f}; "
          f"kernel {kinfo.backend.decode()}, query group {kinfo.query_group}")
    lib.kvpack_workspace_destroy(ws)
    lib.kvpack_pool_destroy(pool.h)


def test_batch_fork_truncate(lib, rng):
    L, QH, KH, D, _ = SHAPE
    pool = Pool(lib, "int8", SHAPE, rollback=8)
    seqs, qs = [], []
    for n in (1, 31, 33, 70):
        _, s = pool.seq()
        pos = np.arange(n, dtype=np.int32)
        for layer in range(L):
            check(pool.append(s, layer, rand(rng, n, KH, D), rand(rng, n, KH, D), pos) == OK, "batch append")
        seqs.append(s)
    # batched decode over 1..4 workspaces = per-sequence attend, bit for bit
    q = rand(rng, len(seqs), QH, D)
    single = np.stack([pool.attend(s, 1, q[i:i + 1])[1][0] for i, s in enumerate(seqs)])
    arr = (Seq * len(seqs))(*seqs)
    for W in (0, 1, 3):
        wss = [C.c_void_p() for _ in range(W)]
        for w in wss:
            lib.kvpack_workspace_create(C.byref(w))
        wsa = (C.c_void_p * W)(*[w.value for w in wss]) if W else None
        out = np.zeros_like(q)
        st = lib.kvpack_attend_batch(pool.h, 1, arr, len(seqs), fptr(q), fptr(out), wsa, max(W, 1))
        check(st == OK, f"attend_batch W={W}: {st} {lib.kvpack_last_error()}")
        check(np.array_equal(out, single), f"attend_batch W={W} differs from attend")
        for w in wss:
            lib.kvpack_workspace_destroy(w)

    # fork: the child shares pages; appending to it leaves the parent unchanged
    parent = seqs[3]
    qp = rand(rng, 1, QH, D)
    before = pool.attend(parent, 0, qp)[1]
    st, child = pool.fork(parent)
    check(st == OK, "fork")
    _, stats = pool.stats()
    check(stats.pages_shared > 0 and stats.bytes_if_unshared > stats.bytes_used,
          f"fork shares pages (shared {stats.pages_shared}, {stats.bytes_used} of {stats.bytes_if_unshared} bytes)")
    pos = np.arange(70, 75, dtype=np.int32)
    for layer in range(L):
        check(pool.append(child, layer, rand(rng, 5, KH, D), rand(rng, 5, KH, D), pos) == OK, "child append")
    check(np.array_equal(pool.attend(parent, 0, qp)[1], before), "fork isolated: parent output changed")

    # truncate: the child after dropping its 5 tokens attends like the parent
    check(lib.kvpack_seq_truncate(pool.h, child, 70) == OK, f"truncate: {lib.kvpack_last_error()}")
    check(pool.length(child)[1] == 70, "length after truncate")
    kx, vx = rand(rng, 1, KH, D), rand(rng, 1, KH, D)
    p70 = np.array([70], dtype=np.int32)
    for s in (parent, child):
        for layer in range(L):
            pool.append(s, layer, kx, vx, p70)
    check(np.array_equal(pool.attend(parent, 1, qp)[1], pool.attend(child, 1, qp)[1]),
          "truncate: child differs from a sequence that never had the dropped tokens")
    st = lib.kvpack_seq_truncate(pool.h, child, 100)
    check(st == INVALID, f"truncate past the end -> {st}")
    st = lib.kvpack_seq_truncate(pool.h, child, 10)
    check(st in (INVALID, UNSUPPORTED), f"truncate beyond max_rollback_tokens -> {st}")
    lib.kvpack_pool_destroy(pool.h)


def test_swap(lib, rng):
    """Swap out frees a sequence's pages for others; swap in restores it bit-identical to a twin
    never swapped (another pool fed the same tokens); a swapped sequence is NOT_PRESENT meanwhile."""
    L, QH, KH, D, _ = SHAPE
    pool, twin = Pool(lib, "int4-g32", SHAPE), Pool(lib, "int4-g32", SHAPE)
    (_, s), (_, t) = pool.seq(), twin.seq()
    k, v, pos = rand(rng, 95, KH, D), rand(rng, 95, KH, D), np.arange(95, dtype=np.int32)
    for p, x in ((pool, s), (twin, t)):
        for layer in range(L):
            check(p.append(x, layer, k, v, pos) == OK, f"swap: append {lib.kvpack_last_error()}")
    used = pool.stats()[1].pages_used
    moved = C.c_int64()
    st = lib.kvpack_seq_swap_out(pool.h, s, C.byref(moved))
    check(st == OK and moved.value == used, f"swap_out -> {st}, {moved.value} of {used} pages")
    check(pool.stats()[1].pages_used == 0, "swap_out frees the pages")
    st, sw = pool.swap_stats()
    page_bytes = pool.stats()[1].page_bytes
    check(st == OK and (sw.sequences_swapped, sw.pages_swapped) == (1, used) and sw.swap_bytes >= used * page_bytes,
          f"swap stats while out: {st} {sw.sequences_swapped} {sw.pages_swapped} {sw.swap_bytes}")
    check(lib.kvpack_swap_stats_get(pool.h, None) == INVALID, "swap stats into NULL")
    q = rand(rng, 1, QH, D)
    check(pool.attend(s, 0, q)[0] == NOT_PRESENT, "attend on a swapped-out sequence")
    check(pool.length(s) == (OK, 95), "length of a swapped-out sequence")
    check(lib.kvpack_seq_swap_out(pool.h, s, None) == NOT_PRESENT, "swap_out twice")
    _, other = pool.seq()  # another sequence uses (and writes) the freed pages, then leaves
    for layer in range(L):
        pool.append(other, layer, rand(rng, 95, KH, D), rand(rng, 95, KH, D), pos)
    lib.kvpack_seq_free(pool.h, other)
    st = lib.kvpack_seq_swap_in(pool.h, s, C.byref(moved))
    check(st == OK and moved.value == used, f"swap_in -> {st} {lib.kvpack_last_error()}")
    check(lib.kvpack_seq_swap_in(pool.h, s, None) == INVALID, "swap_in of a resident sequence")
    st, sw = pool.swap_stats()
    check(st == OK and (sw.sequences_swapped, sw.pages_swapped, sw.swap_bytes) == (0, 0, 0),
          f"swap stats after swap_in: {sw.sequences_swapped} {sw.pages_swapped} {sw.swap_bytes}")
    for layer in range(L):
        check(np.array_equal(pool.attend(s, layer, q)[1], twin.attend(t, layer, q)[1]),
              f"swap: layer {layer} differs from the twin never swapped")
    lib.kvpack_pool_destroy(pool.h)
    lib.kvpack_pool_destroy(twin.h)
    ev = Pool(lib, "h2o-25", SHAPE)  # evicting: scores and eviction state stay in memory while out
    _, e = ev.seq()
    for layer in range(L):
        ev.append(e, layer, k, v, pos)
    before = ev.attend(e, 1, q)[1]
    check(lib.kvpack_seq_swap_out(ev.h, e, None) == OK, f"swap_out with eviction: {lib.kvpack_last_error()}")
    check(lib.kvpack_seq_swap_in(ev.h, e, None) == OK, f"swap_in with eviction: {lib.kvpack_last_error()}")
    check(np.array_equal(ev.attend(e, 1, q)[1], before), "evicting sequence: swapped out and back, same output")
    lib.kvpack_pool_destroy(ev.h)


def test_evicting(lib, rng):
    """sink-window-25 / h2o-25 on the pool: past the budget (64 of max_tokens 256), a forked child's
    appends leave its parent equal to a parent fed alone in another pool; truncate is UNSUPPORTED.
    block-sparse-25 the same at max_tokens 1024 (a 256-token budget: its three protected 64-token
    blocks need 192) with a 300-token prompt: whole pages leave the sequence."""
    L, QH, KH, D, _ = SHAPE
    big = SHAPE[:4] + (1024,)
    for policy, shape, prompt in (("sink-window-25", SHAPE, 150), ("h2o-25", SHAPE, 150), ("block-sparse-25", big, 300)):
        pools = [Pool(lib, policy, shape), Pool(lib, policy, shape)]
        check(all(p.status == OK for p in pools), f"{policy}: pool_create -> {lib.kvpack_last_error()}")
        seqs = [p.seq()[1] for p in pools]
        steps = [(rand(rng, prompt if i == 0 else 1, KH, D), rand(rng, prompt if i == 0 else 1, KH, D), rand(rng, 1, QH, D))
                 for i in range(12)]
        pos0 = 0
        for i, (k, v, q) in enumerate(steps):
            pos = np.arange(pos0, pos0 + len(k), dtype=np.int32)
            pos0 += len(k)
            outs = []
            for p, s in zip(pools, seqs):
                for layer in range(L):
                    check(p.append(s, layer, k, v, pos) == OK, f"{policy}: append {lib.kvpack_last_error()}")
                outs.append(p.attend(s, 0, q)[1])
            check(np.array_equal(outs[0], outs[1]), f"{policy}: step {i}: same history, different output")
            if i == 5:  # a child in pool 0 evicts on its own; its parent must not notice
                st, child = pools[0].fork(seqs[0])
                check(st == OK, f"{policy}: fork")
                for j in range(20):
                    for layer in range(L):
                        pools[0].append(child, layer, rand(rng, 1, KH, D), rand(rng, 1, KH, D),
                                        np.array([pos0 + j], dtype=np.int32))
                    pools[0].attend(child, 0, rand(rng, 1, QH, D))
        st = lib.kvpack_seq_truncate(pools[0].h, seqs[0], 10)
        check(st == UNSUPPORTED, f"{policy}: truncate with eviction -> {st}")
        for p in pools:
            lib.kvpack_pool_destroy(p.h)


def test_errors(lib, rng):
    L, QH, KH, D, _ = SHAPE
    bad = Pool(lib, "int3", SHAPE)
    msg = lib.kvpack_last_error().decode()
    check(bad.status == INVALID and "int3" in msg and "known:" in msg, f"bad policy name -> {bad.status} '{msg}'")
    check(lib.kvpack_status_name(bad.status) == b"invalid argument", "status name")
    kf = Pool(lib, "kf64-anchor", SHAPE)  # every eviction name is pool-capable, keyframe codecs are not
    check(kf.status == UNSUPPORTED and "kf64-anchor" in lib.kvpack_last_error().decode(), f"keyframe policy on the pool -> {kf.status}")
    small = Pool(lib, "block-sparse-50", SHAPE)  # 128 tokens of 256 cannot hold 3 protected 64-token blocks
    check(small.status == INVALID and "BlockSparse budget" in lib.kvpack_last_error().decode(),
          f"block-sparse budget below its protected blocks -> {small.status} '{lib.kvpack_last_error()}'")
    bf = Pool(lib, "bf16", SHAPE)
    check(bf.status == UNSUPPORTED and "bf16" in lib.kvpack_last_error().decode(), "bf16 has no kvpack codec")
    check(lib.kvpack_pool_create(None, None, None) == INVALID, "NULL arguments")

    # freed sequence handle
    pool = Pool(lib, "int4-g32", SHAPE, budget=0)
    check(pool.status == INVALID, "budget below one page")
    pool = Pool(lib, "int4-g32", SHAPE, budget=64 << 10, max_sequences=4)
    check(pool.status == OK, "small pool")
    _, s = pool.seq()
    check(lib.kvpack_seq_free(pool.h, s) == OK, "free")
    st = pool.append(s, 0, rand(rng, 1, KH, D), rand(rng, 1, KH, D), np.zeros(1, np.int32))
    check(st == INVALID and "not live" in lib.kvpack_last_error().decode(), f"freed handle append -> {st}")
    check(lib.kvpack_seq_free(pool.h, s) == INVALID, "double free")
    _, s2 = pool.seq()  # reuses the slot with a new generation
    check(s2.index == s.index and s2.generation != s.generation, "slot reuse gets a new generation")
    check(pool.attend(s, 0, rand(rng, 1, QH, D))[0] == INVALID, "stale handle after slot reuse")

    # exhaustion: pages run out; a clear status, the other sequence unharmed
    _, st_ = pool.stats()
    pages = st_.pages_total
    n_ok = 64 * (pages // (L * KH))  # every page of the arena, in a first sequence
    pos = np.arange(n_ok, dtype=np.int32)
    ks, vs = rand(rng, n_ok, KH, D), rand(rng, n_ok, KH, D)
    for layer in range(L):
        check(pool.append(s2, layer, ks, vs, pos) == OK, f"fill: {lib.kvpack_last_error()}")
    q = rand(rng, 1, QH, D)
    before = pool.attend(s2, 1, q)[1]
    _, s3 = pool.seq()
    st = pool.append(s3, 0, rand(rng, 65, KH, D), rand(rng, 65, KH, D), np.arange(65, dtype=np.int32))
    check(st == CAPACITY and "pages" in lib.kvpack_last_error().decode(), f"exhaustion -> {st} {lib.kvpack_last_error()}")
    check(pool.length(s3)[1] == 0, "nothing written on exhaustion")
    check(np.array_equal(pool.attend(s2, 1, q)[1], before), "exhaustion changed another sequence")
    nan = rand(rng, 1, KH, D)
    nan[0, 1, 5] = np.nan
    check(pool.append(s3, 0, nan, nan, np.zeros(1, np.int32)) == NON_FINITE, "NaN rejected")
    # destroyed pool
    lib.kvpack_pool_destroy(pool.h)
    st = pool.seq()[0]
    check(st == INVALID and "destroyed" in lib.kvpack_last_error().decode(), f"destroyed pool -> {st}")
    lib.kvpack_pool_destroy(pool.h)  # twice: a no-op


def main():
    if len(sys.argv) != 2:
        print(__doc__)
        return 2
    lib = load(sys.argv[1])
    check(lib.kvpack_abi_version() == 1, "ABI version")
    names = [lib.kvpack_policy_name(i, None).decode() for i in range(lib.kvpack_policy_count())]
    for n in ("fp32", "fp16", "int8", "int4-g32", "int4-g64", "k8v4", "kivi4", "fp8-e4m3", "sink-window-50", "q8_0", "q4_0"):
        check(n in names, f"policy {n} listed")
    ev = {n: lib.kvpack_policy_evicts(i) for i, n in enumerate(names)} | {"<range>": lib.kvpack_policy_evicts(len(names))}
    for n, want in [(n, 1) for n in ("sink-window-25", "h2o-50", "snapkv-25", "block-sparse-50", "int4-g32+h2o-1k")] + \
            [(n, 0) for n in ("fp32", "int8", "int4-g32", "kivi4", "kf64-anchor", "q8_0", "q4_0")] + [("<range>", -1)]:
        check(ev.get(n) == want, f"kvpack_policy_evicts({n}) -> {ev.get(n)}, want {want}")
    rng = np.random.default_rng(7)
    print("attention vs float64 reference (tolerance 1e-5 * (1 + max|V|)):")
    for policy in POLICIES:
        test_attention(lib, policy, rng)
    test_batch_fork_truncate(lib, rng)
    test_swap(lib, rng)
    test_evicting(lib, rng)
    test_errors(lib, rng)
    print(f"{len(failures)} failure(s)")
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())
