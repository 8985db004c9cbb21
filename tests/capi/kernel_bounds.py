"""Output-error bounds of kvpack's opt-in AVX2 integer paths, as kvpack_pool_kernel reports them
(include/kvpack/c/kvpack.h kvpack_kernel_info; the C++ tests use the same bounds:
tests/support/cache_harness.hpp, reference.hpp). Used by test_capi.py and test_capi_masks.py."""
import numpy as np


def query_error_bound(K, V, Q, q_first, q_heads, kv_heads, ref, group, qerr):
    """Output error a quantized query allows (kvpack_kernel_info; C++: tests/support/cache_harness.hpp):
    each element of query group g is off by at most max|q_g| * qerr, so a logit by
    e = scale * max_t sum_g max|q_g| * qerr * sum|k_tg|, each probability by a factor within e^{+-2e}
    and each output channel by (e^{2e} - 1) * max_t |v_td - out_d|. 0 when the scores are fp32."""
    if group <= 0:
        return 0.0
    n, _, D = K.shape
    g = q_heads // kv_heads
    scale = 1.0 / np.sqrt(D)
    worst = 0.0
    for i in range(Q.shape[0]):
        vis = min(n, q_first + i + 1)
        for h in range(q_heads):
            kh = h // g
            qmax = np.abs(Q[i, h, :].astype(np.float64)).reshape(-1, group).max(axis=1)
            ksum = np.abs(K[:vis, kh, :]).reshape(vis, -1, group).sum(axis=2)
            e = scale * (ksum @ (qmax * qerr)).max()
            spread = np.abs(V[:vis, kh, :] - ref[i, h, :]).max()
            worst = max(worst, (np.exp(2 * e) - 1) * spread)
    return worst


def value_error_bound(K, V, Q, q_first, q_heads, kv_heads, group, verr, vasym):
    """Output error of integer P.V (kvpack_kernel_info; C++: tests/support/reference.hpp
    int4_value_error_bound): each weight p_t * scale_t is off by at most verr times the largest
    weight of its tile of 16 tokens, a centered INT4 code is at most 8, so an output channel moves by
    8 * verr * sum_t max_{|t'-t| < 16} p_t' scale_t' (every row counted as coded: an upper bound;
    scale_t the largest INT4 group scale of the dequantized row, (max - min) / 15 or max|v| / 7)."""
    if group <= 0:
        return 0.0
    n, _, D = K.shape
    g = q_heads // kv_heads
    Vg = V.reshape(n, kv_heads, D // group, group)
    scales = ((Vg.max(axis=3) - Vg.min(axis=3)) / 15.0 if vasym else np.abs(Vg).max(axis=3) / 7.0).max(axis=2)
    worst = 0.0
    for i in range(Q.shape[0]):
        vis = min(n, q_first + i + 1)
        for h in range(q_heads):
            kh = h // g
            s = K[:vis, kh, :] @ Q[i, h, :].astype(np.float64) / np.sqrt(D)
            w = np.exp(s - s.max())
            w = w / w.sum() * scales[:vis, kh]
            tile_max = np.array([w[max(0, t - 15):t + 16].max() for t in range(vis)])
            worst = max(worst, 1.05 * 8.0 * verr * tile_max.sum())
    return worst
