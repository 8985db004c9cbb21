/* kvpack C ABI: a paged pool of compressed KV cache for engines written in C, Python (ctypes,
 * cffi), Rust or anything else that can call C. Implemented by the shared library kvpack_c
 * (src/c/), over kvpack::registry::make_pool (include/kvpack/registry/registry.hpp) and
 * kvpack::PagedCache (include/kvpack/pool/paged_cache.hpp).
 *
 * Conventions, for every function below:
 *  - Tensors are row-major float32, C order:
 *      K, V            [n_tokens][kv_heads][head_dim]   (keys already rotated by RoPE)
 *      Q, OUT          [n_q][q_heads][head_dim]
 *      positions       [n_tokens] int32, the token positions the engine used (stored, never renumbered)
 *    Query head h attends with KV head h / (q_heads / kv_heads) (grouped-query attention). The
 *    softmax scale is shape.attn_scale, or 1/sqrt(head_dim) when it is 0. Arrays are read/written
 *    only for the sizes the arguments imply; the caller guarantees they are that large.
 *  - Every function that can fail returns a kvpack_status; KVPACK_OK is 0. On failure nothing was
 *    changed (the pool and sequences are as before the call, outputs untouched unless stated), and
 *    kvpack_last_error() returns a message naming the argument, layer, head, token or sizes.
 *  - Nothing aborts and no C++ exception crosses this boundary: an out-of-memory condition is
 *    KVPACK_ERR_OUT_OF_MEMORY, anything unexpected KVPACK_ERR_INTERNAL.
 *  - NULL handles or pointers are KVPACK_ERR_INVALID_ARGUMENT. A destroyed pool or workspace
 *    handle is detected and rejected (its small handle shell is kept as a tombstone: about 64
 *    bytes per pool or workspace ever destroyed). A freed sequence handle is rejected even after
 *    its slot is reused (handles carry a generation).
 *  - Thread safety: calls on DIFFERENT sequences of a pool may run on different threads at once;
 *    calls on the same sequence must not overlap (attends of it may, except with an evicting
 *    policy, whose attends update the sequence's scores); create/destroy of a pool must
 *    not overlap any other call on it. Each thread passes its own workspace to attend calls, or NULL
 *    to use the pool's built-in one (then attends of that pool are serialized by a mutex).
 */
#ifndef KVPACK_C_KVPACK_H
#define KVPACK_C_KVPACK_H

#include <stddef.h>
#include <stdint.h>

#if defined(_WIN32) && defined(KVPACK_C_BUILD)
#define KVPACK_C_API __declspec(dllexport)
#elif defined(_WIN32)
#define KVPACK_C_API __declspec(dllimport)
#elif defined(__GNUC__)
#define KVPACK_C_API __attribute__((visibility("default")))
#else
#define KVPACK_C_API
#endif

#ifdef __cplusplus
extern "C" {
#endif

/** Version of this ABI; bumped on any incompatible change. */
#define KVPACK_C_ABI_VERSION 1

/** Result of every fallible call. Values 1..8 mirror kvpack::Errc. */
typedef enum kvpack_status {
  KVPACK_OK = 0,
  KVPACK_ERR_INVALID_ARGUMENT = 1,  /**< bad handle, NULL pointer, size, layer, name, configuration */
  KVPACK_ERR_NON_FINITE = 2,        /**< NaN or Inf in K, V or Q (or a non-finite output) */
  KVPACK_ERR_CAPACITY_EXCEEDED = 3, /**< page pool exhausted, max_sequences live, max_tokens reached */
  KVPACK_ERR_IO = 4,                /**< a read or write failed (not used by the pool today) */
  KVPACK_ERR_CORRUPT_DATA = 5,      /**< a header or layout does not match */
  KVPACK_ERR_AUTH_FAILED = 6,       /**< an authentication tag did not verify */
  KVPACK_ERR_NOT_PRESENT = 7,       /**< data not resident */
  KVPACK_ERR_UNSUPPORTED = 8,       /**< operation or policy not supported (e.g. a keyframe policy on the pool) */
  KVPACK_ERR_OUT_OF_MEMORY = 9,     /**< a host allocation failed */
  KVPACK_ERR_INTERNAL = 10          /**< an unexpected failure inside the library (a bug: please report) */
} kvpack_status;

/** A pool of sequences (opaque). */
typedef struct kvpack_pool kvpack_pool;
/** Scratch memory for attention (opaque): one per thread that attends. Holds no token data. */
typedef struct kvpack_workspace kvpack_workspace;

/** Handle of a sequence in a pool: slot index and generation. Copy it freely; it becomes stale
 *  (rejected with KVPACK_ERR_INVALID_ARGUMENT) when the sequence is freed. */
typedef struct kvpack_seq {
  uint32_t index;
  uint32_t generation;
} kvpack_seq;

/** Model shape. */
typedef struct kvpack_shape {
  int32_t layers;     /**< transformer layers, >= 1 */
  int32_t q_heads;    /**< query heads, a multiple of kv_heads */
  int32_t kv_heads;   /**< key/value heads, >= 1 */
  int32_t head_dim;   /**< channels per head: even, a multiple of the policy's group size (32 for most) */
  int64_t max_tokens; /**< tokens ONE sequence may hold per layer, 1 .. 2^31 - 1 */
  float attn_scale;   /**< softmax scale; 0 selects 1/sqrt(head_dim) */
} kvpack_shape;

/** How a pool is sized. */
typedef struct kvpack_pool_config {
  kvpack_shape shape;
  uint64_t byte_budget;        /**< bytes of the page arena (pages of compressed blocks); >= one page */
  int32_t max_sequences;       /**< sequences live at once, >= 1 */
  int32_t max_rollback_tokens; /**< newest tokens kvpack_seq_truncate may drop (0: no rollback) */
} kvpack_pool_config;

/** A snapshot of a pool (kvpack_pool_stats). Bytes are bytes, counts are counts. */
typedef struct kvpack_pool_stats {
  uint64_t page_bytes;        /**< bytes per page: one block of block_tokens tokens of one (layer, KV head) */
  uint64_t pages_total;       /**< pages in the arena */
  uint64_t pages_used;        /**< pages referenced by sequences or the prefix cache */
  uint64_t pages_free;        /**< pages on the free list */
  uint64_t pages_shared;      /**< pages referenced more than once (fork) */
  uint64_t budget_bytes;      /**< the configured byte_budget */
  uint64_t bytes_used;        /**< pages_used * page_bytes: each shared page counted once */
  uint64_t bytes_if_unshared; /**< what the sequences' pages would take if none were shared */
  uint64_t overhead_bytes;    /**< fixed per-page bookkeeping (header, refcount, free-list entry) */
  uint64_t exact_bytes;       /**< fp32 rows of all sequences (sinks, residual window, rollback copies, latest chunk) */
  uint64_t memory_bytes;      /**< arena + overhead + exact_bytes: what the pool holds in total */
  int64_t sequences;          /**< live sequences */
  int32_t block_tokens;       /**< tokens per page */
  double key_bits_per_value;  /**< stored bits per key element (codes + scales), the policy's */
  double value_bits_per_value;
} kvpack_pool_stats;

/** What a pool's attention kernel does (kvpack_pool_kernel), for callers that check its outputs
 *  against their own reference. backend: "avx2", "neon" or "scalar" (constant string). When
 *  query_group > 0 the query is quantized per group of query_group channels for integer Q.K and
 *  each query element may be off by max|q_group| * query_error (a logit by scale * the sum over
 *  groups of max|q_g| * query_error * sum|k_g|); 0: fp32 scores. value_group > 0: INT4 values are
 *  accumulated from their codes in groups of value_group channels, each weight p_t * scale_t off
 *  by at most value_error times the largest weight of its tile of 16 tokens (an output channel by
 *  8 * value_error * the sum over tokens of that largest weight); 0: values dequantized to fp32. */
typedef struct kvpack_kernel_info {
  const char* backend;
  int32_t query_group;
  double query_error;
  int32_t value_group;
  double value_error;
} kvpack_kernel_info;

/** KVPACK_C_ABI_VERSION of the loaded library (check it against the header's). */
KVPACK_C_API int32_t kvpack_abi_version(void);

/** The message of the last failed call on the calling thread ("" if none). The pointer stays valid
 *  until the next failing call on this thread. Never NULL. */
KVPACK_C_API const char* kvpack_last_error(void);

/** A short constant name of a status ("ok", "invalid argument", ...); never NULL. */
KVPACK_C_API const char* kvpack_status_name(kvpack_status status);

/** Number of policy names kvpack_policy_name can return (the registry's table entries, then the
 *  llama.cpp type names f32, f16, q8_0, q4_0, q4_1). */
KVPACK_C_API int32_t kvpack_policy_count(void);

/** The i-th policy name (0 <= i < kvpack_policy_count()), NULL when out of range. *pool_capable
 *  (when not NULL) is set to 1 if kvpack_pool_create accepts it (eviction included: sink-window,
 *  h2o, snapkv and block-sparse names), 0 for keyframe policies (single-sequence only for now). The string lives as long as the library is loaded. */
KVPACK_C_API const char* kvpack_policy_name(int32_t i, int32_t* pool_capable);

/** 1 if the i-th policy (0 <= i < kvpack_policy_count()) evicts tokens (the sink-window, h2o,
 *  snapkv and block-sparse names): its attends update eviction scores, and on its pools
 *  kvpack_seq_truncate returns KVPACK_UNSUPPORTED (evicted tokens cannot come back), as do
 *  prefix publish/attach and read-back; an engine that rolls back speculative tokens must pick a
 *  policy with 0. Returns 0 if it does not evict, -1 when i is out of range (never fails
 *  otherwise; sets no error). */
KVPACK_C_API int32_t kvpack_policy_evicts(int32_t i);

/** Creates a pool of policy `policy`: a registry name ("fp32", "fp16", "int8", "int4-g32",
 *  "int4-g64", "k8v4", "kivi4", "kivi8", "kivi4-r0", "fp8-e4m3") or llama.cpp --cache-type-k /
 *  --cache-type-v names, one for both ("q8_0") or "K/V" ("q8_0/q4_0"): f32, f16, q8_0 (= INT8,
 *  group 32, fp16 scale), q4_0 (= INT4 symmetric, group 32, fp16 scale; kvpack's grid is
 *  [-7, 7] x amax/7, llama.cpp's [-8, 7]), q4_1 (= INT4 asymmetric, group 32, fp16 scale and
 *  minimum); see include/kvpack/registry/llama_cpp_types.hpp for the exact differences.
 *  On success *out is a new pool (free it with kvpack_pool_destroy).
 *  Errors: NULL argument, unknown name, bad shape, byte_budget below one page, max_sequences < 1,
 *  max_rollback_tokens < 0, an eviction budget below what the policy protects (INVALID_ARGUMENT);
 *  a keyframe policy or a llama.cpp type
 *  without a kvpack codec (bf16, q5_0, q5_1, iq4_nl: UNSUPPORTED); the arena cannot be
 *  allocated (CAPACITY_EXCEEDED or OUT_OF_MEMORY). */
KVPACK_C_API kvpack_status kvpack_pool_create(const char* policy, const kvpack_pool_config* config, kvpack_pool** out);

/** Destroys a pool: every sequence and page is freed and zeroed; the handle becomes invalid
 *  (later calls with it fail with INVALID_ARGUMENT). NULL or an already destroyed pool: no-op. */
KVPACK_C_API void kvpack_pool_destroy(kvpack_pool* pool);

/** Creates a workspace for kvpack_attend / kvpack_attend_batch (one per thread). */
KVPACK_C_API kvpack_status kvpack_workspace_create(kvpack_workspace** out);
/** Destroys a workspace (NULL or already destroyed: no-op). */
KVPACK_C_API void kvpack_workspace_destroy(kvpack_workspace* ws);

/** A new empty sequence in *out. Errors: bad pool (INVALID_ARGUMENT); max_sequences live
 *  (CAPACITY_EXCEEDED). */
KVPACK_C_API kvpack_status kvpack_seq_create(kvpack_pool* pool, kvpack_seq* out);

/** A new sequence in *out equal to `parent`, sharing all its pages copy-on-write (a later append
 *  or truncate on either never changes what the other sees). Errors: stale parent
 *  (INVALID_ARGUMENT), max_sequences live (CAPACITY_EXCEEDED). */
KVPACK_C_API kvpack_status kvpack_seq_fork(kvpack_pool* pool, kvpack_seq parent, kvpack_seq* out);

/** Frees a sequence: its pages lose a reference (freed and zeroed with their last one); the
 *  handle becomes stale. Errors: stale handle (INVALID_ARGUMENT). */
KVPACK_C_API kvpack_status kvpack_seq_free(kvpack_pool* pool, kvpack_seq seq);

/** Tokens in the sequence (appended to layer 0) in *out. Errors: stale handle. */
KVPACK_C_API kvpack_status kvpack_seq_length(const kvpack_pool* pool, kvpack_seq seq, int64_t* out);

/** Drops the newest tokens of every layer so `new_length` remain (speculative decoding
 *  rollback): the sequence is then bit-identical to one that never received them.
 *  Errors: stale handle, new_length < 0 or above the length (INVALID_ARGUMENT); more than
 *  max_rollback_tokens dropped, or any truncate with an evicting policy (UNSUPPORTED: evicted
 *  tokens and scores cannot be restored); a shared page must be copied and no page is free
 *  (CAPACITY_EXCEEDED). */
KVPACK_C_API kvpack_status kvpack_seq_truncate(kvpack_pool* pool, kvpack_seq seq, int64_t new_length);

/** Swaps a sequence out of the page arena (preemption by swapping, as vLLM's swap space): the
 *  pages it holds alone are copied to the pool's swap space in process memory, then zeroed and
 *  freed for other sequences; pages it shares (fork) stay; an evicting sequence keeps its scores
 *  and eviction state in memory. Until kvpack_seq_swap_in, calls on it
 *  other than kvpack_seq_length, kvpack_seq_free and kvpack_seq_swap_in return
 *  KVPACK_ERR_NOT_PRESENT. *pages_moved (when not NULL): the pages freed.
 *  Errors, nothing changed: stale handle (INVALID_ARGUMENT); swapped out already (NOT_PRESENT);
 *  the copies cannot be allocated (OUT_OF_MEMORY). */
KVPACK_C_API kvpack_status kvpack_seq_swap_out(kvpack_pool* pool, kvpack_seq seq, int64_t* pages_moved);

/** Brings a swapped-out sequence back into fresh pages: it is then bit-identical to a sequence
 *  never swapped (same codes, same attention outputs). *pages_moved (when not NULL): pages taken.
 *  Errors, the sequence staying swapped out: stale handle or not swapped out (INVALID_ARGUMENT);
 *  too few free pages (CAPACITY_EXCEEDED: free or swap out others first). */
KVPACK_C_API kvpack_status kvpack_seq_swap_in(kvpack_pool* pool, kvpack_seq seq, int64_t* pages_moved);

/** Appends n_tokens tokens to `layer` of a sequence: k, v [n_tokens][kv_heads][head_dim],
 *  positions [n_tokens]. Call it for every layer with the same tokens. n_tokens = 0: no-op.
 *  Errors, nothing written: stale handle, layer out of range, n_tokens < 0, NULL arrays, a
 *  negative position (INVALID_ARGUMENT); pool exhausted or max_tokens reached (CAPACITY_EXCEEDED,
 *  naming pages needed and free); NaN/Inf (NON_FINITE, naming layer, KV head, token, channel). */
KVPACK_C_API kvpack_status kvpack_append(kvpack_pool* pool, kvpack_seq seq, int32_t layer, const float* k,
                                         const float* v, const int32_t* positions, int64_t n_tokens);

/** Causal attention of the last n_q tokens of the latest append to `layer` (1 <= n_q <= that
 *  append's size) over everything the sequence holds: q, out [n_q][q_heads][head_dim].
 *  Tokens of the latest append are read exactly, older ones as stored (compressed).
 *  ws: a workspace of the calling thread, or NULL (the pool's own, serialized).
 *  Errors: stale handle, bad layer or n_q, NULL arrays (INVALID_ARGUMENT); non-finite q or
 *  output (NON_FINITE). */
KVPACK_C_API kvpack_status kvpack_attend(const kvpack_pool* pool, kvpack_seq seq, int32_t layer, const float* q,
                                         int64_t n_q, float* out, kvpack_workspace* ws);

/** Batched decode: for each of n_seqs sequences (any lengths, no repeats needed), the attention of
 *  its latest appended token at `layer`: q, out [n_seqs][q_heads][head_dim]. Runs on
 *  n_workspaces threads (the caller's plus n_workspaces - 1 started for the call), thread w using
 *  workspaces[w]; workspaces = NULL with n_workspaces <= 1 uses the pool's own. Each output is
 *  bit-identical to kvpack_attend of that sequence with n_q = 1.
 *  Errors, checked before anything runs: a stale handle (message names its index), bad layer,
 *  n_seqs < 1, NULL arrays, n_workspaces < 1 with workspaces given (INVALID_ARGUMENT); non-finite
 *  q or output (NON_FINITE). */
KVPACK_C_API kvpack_status kvpack_attend_batch(const kvpack_pool* pool, int32_t layer, const kvpack_seq* seqs,
                                               int64_t n_seqs, const float* q, float* out,
                                               kvpack_workspace* const* workspaces, int32_t n_workspaces);

/** Batched decode with per-sequence additive attention masks: as kvpack_attend_batch, and the
 *  mask of sequence i, mask[mask_indptr[i] .. mask_indptr[i + 1]), is added to its scaled scores
 *  q.k_t * scale before the softmax. Layout (FlashInfer's ragged one): mask is float32, one entry
 *  per token the sequence holds in `layer` (kvpack_seq_length for every layer appended alike),
 *  oldest token first, so entry t belongs to the token at cache index t and the decode token's own
 *  entry is the last; mask_indptr has n_seqs + 1 non-decreasing entries. The same bias applies to
 *  every query head (per-head masks are not supported). -INFINITY drops a token; an all-zero mask
 *  gives outputs bit-identical to kvpack_attend_batch. The bias is applied inside the attention
 *  kernel, on every host backend. With an evicting policy a mask still has one entry per token
 *  appended to the layer (evicted ones included, by cache index); the kernel reads the entries of
 *  the tokens the sequence holds, and the eviction scores count the masked attention.
 *  Errors, checked before anything runs (out untouched): those of kvpack_attend_batch; NULL mask
 *  or mask_indptr, indptr entries negative or decreasing, a mask length other than the sequence's
 *  tokens in the layer (the message names both), a mask of only -INFINITY (INVALID_ARGUMENT);
 *  NaN or +INFINITY in a mask (NON_FINITE, naming the sequence and the entry). After: a
 *  non-finite output (NON_FINITE). */
KVPACK_C_API kvpack_status kvpack_attend_batch_masked(const kvpack_pool* pool, int32_t layer, const kvpack_seq* seqs,
                                                      int64_t n_seqs, const float* q, const float* mask,
                                                      const int64_t* mask_indptr, float* out,
                                                      kvpack_workspace* const* workspaces, int32_t n_workspaces);

/** A snapshot of the pool's pages and bytes in *out. Errors: bad pool or NULL out. */
KVPACK_C_API kvpack_status kvpack_pool_stats_get(const kvpack_pool* pool, kvpack_pool_stats* out);

/** What the pool's swap space holds (kvpack_seq_swap_out), beside kvpack_pool_stats (whose
 *  memory_bytes counts the arena only). Counts are counts, bytes are bytes. */
typedef struct kvpack_swap_stats {
  int64_t sequences_swapped; /**< live sequences swapped out now */
  uint64_t pages_swapped;    /**< their pages held in the swap space (not in the arena) */
  uint64_t swap_bytes;       /**< process memory the swap space holds: headers and payloads */
} kvpack_swap_stats;

/** A snapshot of the pool's swap space in *out. Errors: bad pool or NULL out. Added after
 *  kvpack_pool_stats without changing it: kvpack_abi_version() stays 1. */
KVPACK_C_API kvpack_status kvpack_swap_stats_get(const kvpack_pool* pool, kvpack_swap_stats* out);

/** The pool's attention kernel in *out (kvpack_kernel_info). Errors: bad pool or NULL out. */
KVPACK_C_API kvpack_status kvpack_pool_kernel(const kvpack_pool* pool, kvpack_kernel_info* out);

#ifdef __cplusplus
}
#endif

#endif /* KVPACK_C_KVPACK_H */
