// The C ABI of include/kvpack/c/kvpack.h over kvpack::registry::AnyPool. Every entry point runs
// its body inside guard(): kvpack::Error becomes a status and a thread-local message, and no C++
// exception leaves the library (std::bad_alloc -> KVPACK_ERR_OUT_OF_MEMORY, anything else ->
// KVPACK_ERR_INTERNAL).
#define KVPACK_C_BUILD 1
#include "kvpack/c/kvpack.h"

#include <cstdint>
#include <exception>
#include <memory>
#include <mutex>
#include <new>
#include <span>
#include <string>
#include <vector>

#include "kvpack/executor.hpp"
#include "kvpack/pool/page_swap.hpp"
#include "kvpack/registry/registry.hpp"

// Handle shells. A destroyed handle keeps its shell with `magic` set to kDead, so a later call with
// it is detected instead of reading freed memory: the shells are kept, reachable, in a process-wide
// list (keep_tombstone) and freed only at exit, so leak checkers see no leak.
struct kvpack_pool {
  std::uint64_t magic = 0;
  std::unique_ptr<kvpack::HostSwapTarget> swap;  // swap space; declared first: outlives the pool
  std::unique_ptr<kvpack::registry::AnyPool> pool;
  std::unique_ptr<kvpack::Workspace> own_ws;  // for attend calls with ws == NULL
  std::unique_ptr<std::mutex> own_ws_mutex;
};
struct kvpack_workspace {
  std::uint64_t magic = 0;
  std::unique_ptr<kvpack::Workspace> ws;
};

namespace {

constexpr std::uint64_t kPoolMagic = 0x6b767061636b504fULL;  // "kvpackPO"
constexpr std::uint64_t kWsMagic = 0x6b767061636b5753ULL;    // "kvpackWS"
constexpr std::uint64_t kDead = 0xdeaddeaddeaddeadULL;

thread_local std::string g_last_error;

// Keeps a destroyed handle's shell alive until exit (see the handle shells above).
template <class Shell>
void keep_tombstone(Shell* shell) noexcept {
  static std::mutex mutex;
  static std::vector<std::unique_ptr<Shell>> dead;
  try {
    std::lock_guard lock(mutex);
    if (dead.size() == dead.capacity()) dead.reserve(2 * dead.size() + 8);  // emplace_back cannot throw
    dead.emplace_back(shell);
  } catch (...) {
    // Out of memory: the shell stays allocated and unreachable (a leak of one shell, never a
    // freed one).
  }
}

kvpack_status to_status(kvpack::Errc e) { return static_cast<kvpack_status>(static_cast<int>(e) + 1); }

kvpack_status set_error(kvpack_status s, std::string message) {
  g_last_error = std::move(message);
  return s;
}
kvpack_status set_error(const kvpack::Error& e) { return set_error(to_status(e.code), e.message); }
kvpack_status invalid(std::string message) { return set_error(KVPACK_ERR_INVALID_ARGUMENT, std::move(message)); }

// Runs body() (returning kvpack_status), turning any exception into a status.
template <class F>
kvpack_status guard(const char* fn, F&& body) noexcept {
  try {
    return body();
  } catch (const std::bad_alloc&) {
    return set_error(KVPACK_ERR_OUT_OF_MEMORY, std::string(fn) + ": out of memory");
  } catch (const std::exception& e) {
    return set_error(KVPACK_ERR_INTERNAL, std::string(fn) + ": internal error: " + e.what());
  } catch (...) {
    return set_error(KVPACK_ERR_INTERNAL, std::string(fn) + ": internal error");
  }
}

kvpack_status check_pool(const kvpack_pool* p, const char* fn) {
  if (p == nullptr) return invalid(std::string(fn) + ": pool is NULL");
  if (p->magic == kDead) return invalid(std::string(fn) + ": pool handle was destroyed");
  if (p->magic != kPoolMagic || !p->pool) return invalid(std::string(fn) + ": not a kvpack pool handle");
  return KVPACK_OK;
}

// A read-only query of a pool into *out (the stats and kernel getters): the pool checked, out
// not NULL ("<fn>: out is NULL"), then *out = fill(); any exception a status (guard).
template <class Out, class Fill>
kvpack_status query_pool(const char* fn, const kvpack_pool* pool, Out* out, Fill&& fill) {
  return guard(fn, [&] {
    if (kvpack_status s = check_pool(pool, fn); s != KVPACK_OK) return s;
    if (out == nullptr) return invalid(std::string(fn) + ": out is NULL");
    *out = fill();
    return KVPACK_OK;
  });
}
kvpack_status check_ws(const kvpack_workspace* w, const char* fn) {
  if (w == nullptr) return invalid(std::string(fn) + ": workspace is NULL");
  if (w->magic == kDead) return invalid(std::string(fn) + ": workspace handle was destroyed");
  if (w->magic != kWsMagic || !w->ws) return invalid(std::string(fn) + ": not a kvpack workspace handle");
  return KVPACK_OK;
}

kvpack::SeqId to_id(kvpack_seq s) { return {s.index, s.generation}; }
kvpack_seq to_c(kvpack::SeqId s) { return {s.index, s.generation}; }

std::size_t row_floats(const kvpack::ModelShape& s, bool q) {
  return static_cast<std::size_t>(q ? s.q_heads : s.kv_heads) * static_cast<std::size_t>(s.head_dim);
}

kvpack_status from(const kvpack::Status& s) { return s ? KVPACK_OK : set_error(s.error()); }

const std::vector<kvpack::registry::PolicyInfo>& policy_list() {
  static const std::vector<kvpack::registry::PolicyInfo> list = kvpack::registry::policies();
  return list;
}

// kvpack_attend_batch and kvpack_attend_batch_masked (masks == nullptr: unmasked).
kvpack_status attend_batch(const char* fn, const kvpack_pool* pool, int32_t layer, const kvpack_seq* seqs, int64_t n_seqs,
                           const float* q, const kvpack::BatchMask* masks, float* out, kvpack_workspace* const* workspaces,
                           int32_t n_workspaces) {
  const std::string f = fn;
  if (kvpack_status s = check_pool(pool, fn); s != KVPACK_OK) return s;
  if (n_seqs < 1) return invalid(f + ": n_seqs " + std::to_string(n_seqs) + " < 1");
  if (seqs == nullptr || q == nullptr || out == nullptr) return invalid(f + ": seqs, q and out must not be NULL");
  if (workspaces != nullptr && n_workspaces < 1) return invalid(f + ": n_workspaces " + std::to_string(n_workspaces) + " < 1");
  if (workspaces == nullptr && n_workspaces > 1) return invalid(f + ": n_workspaces > 1 needs that many workspaces");
  const std::size_t N = static_cast<std::size_t>(n_seqs), floats = N * row_floats(pool->pool->shape(), true);
  std::vector<kvpack::SeqId> ids(N);
  for (std::size_t i = 0; i < N; ++i) ids[i] = to_id(seqs[i]);
  const std::span<const float> qs(q, floats);
  const std::span<float> os(out, floats);
  auto run = [&](const kvpack::Executor& ex, std::span<kvpack::Workspace> ws) {
    return masks ? pool->pool->attend_batch(layer, ids, qs, *masks, os, ex, ws)
                 : pool->pool->attend_batch(layer, ids, qs, os, ex, ws);
  };
  if (workspaces == nullptr) {
    std::lock_guard<std::mutex> lock(*pool->own_ws_mutex);
    return from(run(kvpack::Executor{}, std::span<kvpack::Workspace>(pool->own_ws.get(), 1)));
  }
  // The pool takes a contiguous span of workspaces: each thread's is moved in for the call and
  // moved back after (a Workspace is scratch only; moving keeps its allocations).
  const std::size_t W = static_cast<std::size_t>(n_workspaces);
  for (std::size_t w = 0; w < W; ++w)
    if (kvpack_status s = check_ws(workspaces[w], fn); s != KVPACK_OK) return s;
  for (std::size_t a = 0; a < W; ++a)
    for (std::size_t b = a + 1; b < W; ++b)
      if (workspaces[a] == workspaces[b]) return invalid(f + ": the same workspace is given twice");
  std::vector<kvpack::Workspace> span_ws(W);
  for (std::size_t w = 0; w < W; ++w) span_ws[w] = std::move(*workspaces[w]->ws);
  const kvpack::Status st = run(kvpack::thread_executor(n_workspaces), span_ws);
  for (std::size_t w = 0; w < W; ++w) *workspaces[w]->ws = std::move(span_ws[w]);
  return from(st);
}

}  // namespace

extern "C" {

int32_t kvpack_abi_version(void) { return KVPACK_C_ABI_VERSION; }

const char* kvpack_last_error(void) { return g_last_error.c_str(); }

const char* kvpack_status_name(kvpack_status status) {
  switch (status) {
    case KVPACK_OK: return "ok";
    case KVPACK_ERR_OUT_OF_MEMORY: return "out of memory";
    case KVPACK_ERR_INTERNAL: return "internal error";
    default: break;
  }
  const int i = static_cast<int>(status) - 1;
  if (i >= 0 && i <= static_cast<int>(kvpack::Errc::unsupported)) return kvpack::to_string(static_cast<kvpack::Errc>(i));
  return "unknown status";
}

int32_t kvpack_policy_count(void) {
  try {
    return static_cast<int32_t>(policy_list().size());
  } catch (...) {
    return 0;
  }
}

const char* kvpack_policy_name(int32_t i, int32_t* pool_capable) {
  try {
    const auto& list = policy_list();
    if (i < 0 || static_cast<std::size_t>(i) >= list.size()) return nullptr;
    if (pool_capable != nullptr) *pool_capable = list[static_cast<std::size_t>(i)].pool_capable ? 1 : 0;
    return list[static_cast<std::size_t>(i)].name.c_str();
  } catch (...) {
    return nullptr;
  }
}

int32_t kvpack_policy_evicts(int32_t i) {
  try {
    const auto& list = policy_list();
    if (i < 0 || static_cast<std::size_t>(i) >= list.size()) return -1;
    return list[static_cast<std::size_t>(i)].evicts ? 1 : 0;
  } catch (...) {
    return -1;
  }
}

kvpack_status kvpack_pool_create(const char* policy, const kvpack_pool_config* config, kvpack_pool** out) {
  return guard("kvpack_pool_create", [&] {
    if (policy == nullptr || config == nullptr || out == nullptr)
      return invalid("kvpack_pool_create: policy, config and out must not be NULL");
    const kvpack_shape& cs = config->shape;
    kvpack::PoolConfig cfg;
    cfg.shape = {.layers = cs.layers, .q_heads = cs.q_heads, .kv_heads = cs.kv_heads, .head_dim = cs.head_dim,
                 .max_tokens = cs.max_tokens, .attn_scale = cs.attn_scale};
    cfg.byte_budget = static_cast<std::size_t>(config->byte_budget);
    cfg.max_sequences = config->max_sequences;
    cfg.max_rollback_tokens = config->max_rollback_tokens;
    auto pool = kvpack::registry::make_pool(policy, cfg);
    if (!pool) return set_error(pool.error());
    auto h = std::make_unique<kvpack_pool>();
    h->pool = std::move(pool.value());
    h->swap = std::make_unique<kvpack::HostSwapTarget>();
    h->own_ws = std::make_unique<kvpack::Workspace>();
    h->own_ws_mutex = std::make_unique<std::mutex>();
    h->magic = kPoolMagic;
    *out = h.release();
    return KVPACK_OK;
  });
}

void kvpack_pool_destroy(kvpack_pool* pool) {
  if (pool == nullptr || pool->magic != kPoolMagic) return;
  pool->magic = kDead;
  pool->pool.reset();  // PagedCache zeroes its pages and rows, and erases its swapped copies
  pool->swap.reset();
  pool->own_ws.reset();
  pool->own_ws_mutex.reset();
  keep_tombstone(pool);
}

kvpack_status kvpack_workspace_create(kvpack_workspace** out) {
  return guard("kvpack_workspace_create", [&] {
    if (out == nullptr) return invalid("kvpack_workspace_create: out is NULL");
    auto w = std::make_unique<kvpack_workspace>();
    w->ws = std::make_unique<kvpack::Workspace>();
    w->magic = kWsMagic;
    *out = w.release();
    return KVPACK_OK;
  });
}

void kvpack_workspace_destroy(kvpack_workspace* ws) {
  if (ws == nullptr || ws->magic != kWsMagic) return;
  ws->magic = kDead;
  ws->ws.reset();
  keep_tombstone(ws);
}

kvpack_status kvpack_seq_create(kvpack_pool* pool, kvpack_seq* out) {
  return guard("kvpack_seq_create", [&] {
    if (kvpack_status s = check_pool(pool, "kvpack_seq_create"); s != KVPACK_OK) return s;
    if (out == nullptr) return invalid("kvpack_seq_create: out is NULL");
    auto id = pool->pool->create_sequence();
    if (!id) return set_error(id.error());
    *out = to_c(*id);
    return KVPACK_OK;
  });
}

kvpack_status kvpack_seq_fork(kvpack_pool* pool, kvpack_seq parent, kvpack_seq* out) {
  return guard("kvpack_seq_fork", [&] {
    if (kvpack_status s = check_pool(pool, "kvpack_seq_fork"); s != KVPACK_OK) return s;
    if (out == nullptr) return invalid("kvpack_seq_fork: out is NULL");
    auto id = pool->pool->fork(to_id(parent));
    if (!id) return set_error(id.error());
    *out = to_c(*id);
    return KVPACK_OK;
  });
}

kvpack_status kvpack_seq_free(kvpack_pool* pool, kvpack_seq seq) {
  return guard("kvpack_seq_free", [&] {
    if (kvpack_status s = check_pool(pool, "kvpack_seq_free"); s != KVPACK_OK) return s;
    return from(pool->pool->free_sequence(to_id(seq)));
  });
}

kvpack_status kvpack_seq_length(const kvpack_pool* pool, kvpack_seq seq, int64_t* out) {
  return guard("kvpack_seq_length", [&] {
    if (kvpack_status s = check_pool(pool, "kvpack_seq_length"); s != KVPACK_OK) return s;
    if (out == nullptr) return invalid("kvpack_seq_length: out is NULL");
    auto n = pool->pool->length(to_id(seq));
    if (!n) return set_error(n.error());
    *out = *n;
    return KVPACK_OK;
  });
}

kvpack_status kvpack_seq_truncate(kvpack_pool* pool, kvpack_seq seq, int64_t new_length) {
  return guard("kvpack_seq_truncate", [&] {
    if (kvpack_status s = check_pool(pool, "kvpack_seq_truncate"); s != KVPACK_OK) return s;
    return from(pool->pool->truncate(to_id(seq), new_length));
  });
}

kvpack_status kvpack_seq_swap_out(kvpack_pool* pool, kvpack_seq seq, int64_t* pages_moved) {
  return guard("kvpack_seq_swap_out", [&] {
    if (kvpack_status s = check_pool(pool, "kvpack_seq_swap_out"); s != KVPACK_OK) return s;
    auto n = pool->pool->swap_out(to_id(seq), *pool->swap);
    if (!n) return set_error(n.error());
    if (pages_moved != nullptr) *pages_moved = static_cast<int64_t>(*n);
    return KVPACK_OK;
  });
}

kvpack_status kvpack_seq_swap_in(kvpack_pool* pool, kvpack_seq seq, int64_t* pages_moved) {
  return guard("kvpack_seq_swap_in", [&] {
    if (kvpack_status s = check_pool(pool, "kvpack_seq_swap_in"); s != KVPACK_OK) return s;
    auto n = pool->pool->swap_in(to_id(seq));
    if (!n) return set_error(n.error());
    if (pages_moved != nullptr) *pages_moved = static_cast<int64_t>(*n);
    return KVPACK_OK;
  });
}

kvpack_status kvpack_append(kvpack_pool* pool, kvpack_seq seq, int32_t layer, const float* k, const float* v,
                            const int32_t* positions, int64_t n_tokens) {
  return guard("kvpack_append", [&] {
    if (kvpack_status s = check_pool(pool, "kvpack_append"); s != KVPACK_OK) return s;
    if (n_tokens < 0) return invalid("kvpack_append: n_tokens " + std::to_string(n_tokens) + " < 0");
    if (n_tokens > 0 && (k == nullptr || v == nullptr || positions == nullptr))
      return invalid("kvpack_append: k, v and positions must not be NULL");
    const std::size_t n = static_cast<std::size_t>(n_tokens), rows = n * row_floats(pool->pool->shape(), false);
    return from(pool->pool->append(to_id(seq), layer, std::span<const float>(k, k ? rows : 0),
                                   std::span<const float>(v, v ? rows : 0),
                                   std::span<const std::int32_t>(positions, positions ? n : 0)));
  });
}

kvpack_status kvpack_attend(const kvpack_pool* pool, kvpack_seq seq, int32_t layer, const float* q, int64_t n_q,
                            float* out, kvpack_workspace* ws) {
  return guard("kvpack_attend", [&] {
    if (kvpack_status s = check_pool(pool, "kvpack_attend"); s != KVPACK_OK) return s;
    if (ws != nullptr)
      if (kvpack_status s = check_ws(ws, "kvpack_attend"); s != KVPACK_OK) return s;
    if (n_q < 1) return invalid("kvpack_attend: n_q " + std::to_string(n_q) + " < 1");
    if (q == nullptr || out == nullptr) return invalid("kvpack_attend: q and out must not be NULL");
    const std::size_t floats = static_cast<std::size_t>(n_q) * row_floats(pool->pool->shape(), true);
    const std::span<const float> qs(q, floats);
    const std::span<float> os(out, floats);
    if (ws != nullptr) return from(pool->pool->attend(to_id(seq), layer, qs, os, *ws->ws));
    std::lock_guard<std::mutex> lock(*pool->own_ws_mutex);
    return from(pool->pool->attend(to_id(seq), layer, qs, os, *pool->own_ws));
  });
}

kvpack_status kvpack_attend_batch(const kvpack_pool* pool, int32_t layer, const kvpack_seq* seqs, int64_t n_seqs,
                                  const float* q, float* out, kvpack_workspace* const* workspaces, int32_t n_workspaces) {
  return guard("kvpack_attend_batch", [&] {
    return attend_batch("kvpack_attend_batch", pool, layer, seqs, n_seqs, q, nullptr, out, workspaces, n_workspaces);
  });
}

kvpack_status kvpack_attend_batch_masked(const kvpack_pool* pool, int32_t layer, const kvpack_seq* seqs, int64_t n_seqs,
                                         const float* q, const float* mask, const int64_t* mask_indptr, float* out,
                                         kvpack_workspace* const* workspaces, int32_t n_workspaces) {
  return guard("kvpack_attend_batch_masked", [&]() -> kvpack_status {
    const char* fn = "kvpack_attend_batch_masked";
    if (kvpack_status s = check_pool(pool, fn); s != KVPACK_OK) return s;
    if (n_seqs < 1) return invalid(std::string(fn) + ": n_seqs " + std::to_string(n_seqs) + " < 1");
    if (mask == nullptr || mask_indptr == nullptr) return invalid(std::string(fn) + ": mask and mask_indptr must not be NULL");
    const std::size_t N = static_cast<std::size_t>(n_seqs);
    for (std::size_t i = 0; i <= N; ++i)  // before the size of `mask` is taken from mask_indptr[n_seqs]
      if (mask_indptr[i] < (i == 0 ? 0 : mask_indptr[i - 1]))
        return invalid(std::string(fn) + ": mask_indptr[" + std::to_string(i) + "] = " + std::to_string(mask_indptr[i]) +
                       " is negative or below the previous entry");
    const kvpack::BatchMask masks{std::span<const float>(mask, static_cast<std::size_t>(mask_indptr[N])),
                                  std::span<const std::int64_t>(mask_indptr, N + 1)};
    return attend_batch(fn, pool, layer, seqs, n_seqs, q, &masks, out, workspaces, n_workspaces);
  });
}

kvpack_status kvpack_pool_stats_get(const kvpack_pool* pool, kvpack_pool_stats* out) {
  return query_pool("kvpack_pool_stats_get", pool, out, [&] {
    const kvpack::PoolStats s = pool->pool->stats();
    kvpack_pool_stats r{};
    r.page_bytes = s.page_bytes;
    r.pages_total = s.pages_total;
    r.pages_used = s.pages_used;
    r.pages_free = s.pages_free;
    r.pages_shared = s.pages_shared;
    r.budget_bytes = s.budget_bytes;
    r.bytes_used = s.bytes_used;
    r.bytes_if_unshared = s.bytes_if_unshared;
    r.overhead_bytes = s.overhead_bytes;
    r.exact_bytes = s.exact_bytes;
    r.memory_bytes = s.pages_total * s.page_bytes + s.overhead_bytes + s.exact_bytes;
    r.sequences = static_cast<int64_t>(s.sequences.size());
    r.block_tokens = pool->pool->block_tokens();
    r.key_bits_per_value = pool->pool->key_bits_per_value();
    r.value_bits_per_value = pool->pool->value_bits_per_value();
    return r;
  });
}

kvpack_status kvpack_swap_stats_get(const kvpack_pool* pool, kvpack_swap_stats* out) {
  return query_pool("kvpack_swap_stats_get", pool, out, [&] {
    const kvpack::PoolStats s = pool->pool->stats();
    kvpack_swap_stats r{};
    for (const kvpack::SequenceStats& q : s.sequences) {  // (one whose pages are all shared holds none in the swap space)
      auto out_now = pool->pool->swapped_out(q.id);
      r.sequences_swapped += out_now && *out_now ? 1 : 0;
    }
    r.pages_swapped = s.pages_swapped;
    r.swap_bytes = pool->swap->bytes();
    return r;
  });
}

kvpack_status kvpack_pool_kernel(const kvpack_pool* pool, kvpack_kernel_info* out) {
  return query_pool("kvpack_pool_kernel", pool, out, [&] {
    const kvpack::kernels::KernelInfo k = pool->pool->kernel();
    // backend_name's views point at string literals: NUL-terminated, static storage.
    return kvpack_kernel_info{k.backend.data(), k.query_group, k.query_error, k.value_group, k.value_error};
  });
}

}  // extern "C"
