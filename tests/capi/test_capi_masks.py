#!/usr/bin/env python3
"""kvpack_attend_batch_masked (include/kvpack/c/kvpack.h) driven through ctypes with numpy.

Usage: test_capi_masks.py PATH/TO/libkvpack_c.so

Batched decode of sequences of 1, 31, 33 and 70 tokens (GQA 4/2) with ragged additive masks
(flat float32 values + int64 indptr of n_seqs + 1 entries) against the float64 reference of
test_capi.py (the codec's documented round trip, the decode token exact) with the bias added to
the scaled scores q.k * scale, at its tolerance 1e-5 * (1 + max|V|) plus the bounds of a quantized
query and integer P.V where kvpack_pool_kernel reports them: random masks with -inf
entries and ALiBi-like linear ones, serially and on 2 threads (bit-identical); the unmasked
reference is more than 10 tolerances away (the mask is seen). A zero mask equals
kvpack_attend_batch bit for bit. Bad masks (NaN, +inf, a wrong length, all -inf, NULL) return
their status, name the sequence and entry or both lengths, and leave out untouched.
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
from test_capi import (CODECS, INVALID, NON_FINITE, OK, POLICIES, SHAPE, Pool, Seq, check, failures, fptr,  # noqa: E402
                       load, rand, roundtrip)


def test_masked_batch(lib, rng, policy):
    """kvpack_attend_batch_masked: ragged masks (random with -inf entries, ALiBi-like) against the
    float64 reference with the bias added to the scaled scores; a zero mask equals the unmasked
    call bit for bit; bad masks are errors with out untouched."""
    L, QH, KH, D, _ = SHAPE
    kc, vc = (CODECS[c] for c in POLICIES[policy])
    pool = Pool(lib, policy, SHAPE)
    st, kinfo = pool.kernel()
    check(st == OK, f"{policy}: pool_kernel")
    lens, seqs, KV = (1, 31, 33, 70), [], []
    for n in lens:
        _, s = pool.seq()
        seqs.append(s)
        k, v = rand(rng, L, n, KH, D) * 2, rand(rng, L, n, KH, D)
        for layer in range(L):
            for a, b in ((0, n - 1), (n - 1, n)):  # the prompt, then the decode token
                if b > a:
                    pool.append(s, layer, k[layer, a:b], v[layer, a:b], np.arange(a, b, dtype=np.int32))
        KV.append([(np.concatenate([roundtrip(k[l, :-1], kc), k[l, -1:]]),
                    np.concatenate([roundtrip(v[l, :-1], vc), v[l, -1:]])) for l in range(L)])
    q = rand(rng, len(seqs), QH, D)
    arr = (Seq * len(seqs))(*seqs)
    indptr = np.concatenate([[0], np.cumsum(lens)]).astype(np.int64)

    def call(mask, ptr=indptr, out=None, workspaces=None, W=1, layer=1):
        out = np.zeros_like(q) if out is None else out
        st = lib.kvpack_attend_batch_masked(pool.h, layer, arr, len(seqs), fptr(q), fptr(mask) if mask is not None else None,
                                            ptr.ctypes.data_as(C.POINTER(C.c_int64)), fptr(out), workspaces, W)
        return st, out

    def ref(i, layer, bias):
        K, V = KV[i][layer]
        out = np.zeros((QH, D))
        for h in range(QH):
            s = K[:, h // (QH // KH), :] @ q[i, h].astype(np.float64) / np.sqrt(D) + bias
            p = np.exp(s - s.max())
            out[h] = (p / p.sum()) @ V[:, h // (QH // KH), :]
        return out

    random_mask = [np.where(rng.random(n) < 0.25, -np.inf, 2 * rng.standard_normal(n)) for n in lens]
    for m in random_mask:
        m[-1] = 0.0  # the decode token always kept
    alibi = [-0.125 * np.arange(n - 1, -1, -1) for n in lens]
    worst = 0.0
    wss = [C.c_void_p() for _ in range(2)]
    for w in wss:
        lib.kvpack_workspace_create(C.byref(w))
    wsa = (C.c_void_p * 2)(*[w.value for w in wss])
    for name, masks in (("zero", [np.zeros(n) for n in lens]), ("random", random_mask), ("alibi", alibi)):
        flat = np.concatenate(masks).astype(np.float32)
        for layer in range(L):
            st, out = call(flat, layer=layer)
            check(st == OK, f"{policy} masked {name}: {st} {lib.kvpack_last_error()}")
            check(np.array_equal(call(flat, workspaces=wsa, W=2, layer=layer)[1], out), f"{policy} masked {name}: threads differ")
            for i, n in enumerate(lens):
                want = ref(i, layer, masks[i].astype(np.float32).astype(np.float64))
                K, V = KV[i][layer]  # a quantized query (kvpack_pool_kernel) may add its bound
                tol = 1e-5 * (1.0 + np.abs(V).max()) + query_error_bound(
                    K, V, q[i:i + 1], n - 1, QH, KH, want[None], kinfo.query_group, kinfo.query_error) + \
                    value_error_bound(K, V, q[i:i + 1], n - 1, QH, KH, kinfo.value_group, kinfo.value_error,
                                      len(vc) > 3 and bool(vc[3]))
                err = np.abs(out[i] - want).max()
                worst = max(worst, err / tol)
                check(err <= tol, f"{policy} masked {name} length {n} layer {layer}: |out - ref64| = {err:.3g} > {tol:.3g}")
                if n > 1 and name != "zero":  # the mask is seen
                    check(np.abs(out[i] - ref(i, layer, 0.0)).max() > 10 * tol, f"{policy} masked {name} length {n}: mask ignored")
    print(f"  {policy:10s} masked batch: max |out - ref64| / tol = {worst:.3f}")
    zero = np.zeros(indptr[-1], np.float32)
    plain = np.zeros_like(q)
    check(lib.kvpack_attend_batch(pool.h, 1, arr, len(seqs), fptr(q), fptr(plain), None, 1) == OK, "unmasked batch")
    check(np.array_equal(call(zero)[1], plain), f"{policy}: zero mask differs from the unmasked call")

    def bad(mask, status, words, ptr=indptr):
        out = np.full_like(q, 7.0)
        st, _ = call(mask, ptr, out)
        msg = lib.kvpack_last_error().decode()
        check(st == status and all(w in msg for w in words), f"{policy} bad mask {words}: {st} '{msg}'")
        check(np.all(out == 7.0), f"{policy} bad mask {words}: out written")

    nan = zero.copy()
    nan[indptr[2] + 3] = np.nan
    bad(nan, NON_FINITE, ["sequence 2", "entry 3"])
    nan[indptr[2] + 3] = np.inf
    bad(nan, NON_FINITE, ["sequence 2", "entry 3"])
    short = indptr.copy()
    short[2:] -= 1  # sequence 1 one entry short
    bad(zero, INVALID, ["mask of 30 entries", "holds 31 tokens"], short)
    dead = zero.copy()
    dead[indptr[1]:indptr[2]] = -np.inf
    bad(dead, INVALID, ["sequence 1", "-inf"])
    bad(None, INVALID, ["NULL"])
    for w in wss:
        lib.kvpack_workspace_destroy(w)
    lib.kvpack_pool_destroy(pool.h)


def main():
    if len(sys.argv) != 2:
        print(__doc__)
        return 2
    lib = load(sys.argv[1])
    rng = np.random.default_rng(11)
    for policy in ("int8", "int4-g32"):
        test_masked_batch(lib, rng, policy)
    print(f"{len(failures)} failure(s)")
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())
