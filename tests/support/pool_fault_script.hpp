// The call script of tests/test_alloc_fault_pool.cpp: a paged pool's life (create sequence,
// prefill, attend, fork, decode on both sides, batched decode, truncate, prefix publish and
// attach, free) as a list of Ops run one call at a time, and a Snapshot of everything a failed
// call must leave as it was (pool statistics, every live sequence's tokens, page bytes and
// counts, read_back where the pool has it, held tokens and slot order of evicting pools, and the
// attention of a probe: a fork of each sequence, attended then freed, made without faults).
#pragma once

#include <gtest/gtest.h>

#include <cstdint>
#include <cstring>
#include <string>
#include <vector>

#include "kvpack/pool/paged_cache.hpp"
#include "support/alloc_fault.hpp"  // Arm (and the operator new replacements: one TU per executable)
#include "support/reference.hpp"

namespace kvtest_pool_fault {

using namespace kvpack;  // NOLINT: test helper

const ModelShape kShape{.layers = 2, .q_heads = 6, .kv_heads = 2, .head_dim = 32, .max_tokens = 256};
constexpr std::size_t kRow = 2 * 32, kQRow = 6 * 32;
constexpr int kSeqs = 3;  // handles the script uses: 0 parent, 1 its fork, 2 attached from the prefix cache

enum class Kind { create, append, attend, fork, batch, truncate, publish, attach, free, swap_out, swap_in };
inline const char* name(Kind k) {
  constexpr const char* n[] = {"create_sequence", "append",        "attend",        "fork",     "attend_batch", "truncate",
                               "publish_prefix",  "attach_prefix", "free_sequence", "swap_out", "swap_in"};
  return n[static_cast<int>(k)];
}

/// One call. append: n tokens of `stream` to `layer` of `seq` (from its current length: token t
/// of a stream has the same K/V in every sequence); attend: the last n tokens; batch: one query
/// per sequence of `batch`; truncate: drop n tokens; attach: a prompt of n tokens.
struct Op {
  Kind kind;
  int seq = 0, layer = 0, n = 0;
  std::uint32_t stream = 0;
  std::vector<int> batch{};
};

/// The script. `truncates`: the pool supports truncate (else it must answer unsupported);
/// `prefix`: publish_prefix / attach_prefix are available (no Sinks<N>).
inline std::vector<Op> script(bool truncates, bool prefix) {
  std::vector<Op> ops{{Kind::create, 0}};
  for (int l = 0; l < 2; ++l) ops.push_back({Kind::append, 0, l, 33, 0});
  for (int l = 0; l < 2; ++l) ops.push_back({Kind::attend, 0, l, 3});
  ops.push_back({Kind::fork, 0});  // seq 1 = fork of seq 0
  for (int step = 0; step < 3; ++step) {
    for (int l = 0; l < 2; ++l) ops.push_back({Kind::append, 1, l, 1, 1});
    for (int l = 0; l < 2; ++l) ops.push_back({Kind::append, 0, l, 1, 2});
    for (int l = 0; l < 2; ++l) ops.push_back({Kind::batch, 0, l, 1, 0, {1, 0}});
  }
  ops.push_back({Kind::truncate, 1, 0, 2});  // evicting pools: Errc::unsupported, always
  if (truncates) {
    for (int l = 0; l < 2; ++l) ops.push_back({Kind::append, 1, l, 2, 3});
    for (int l = 0; l < 2; ++l) ops.push_back({Kind::batch, 0, l, 1, 0, {1, 0}});
  }
  ops.push_back({Kind::swap_out, 1});  // the fork holds its copied open pages alone
  for (int l = 0; l < 2; ++l) ops.push_back({Kind::append, 0, l, 1, 4});  // the parent goes on meanwhile
  ops.push_back({Kind::swap_in, 1});
  for (int l = 0; l < 2; ++l) ops.push_back({Kind::batch, 0, l, 1, 0, {1, 0}});
  if (prefix) {
    ops.push_back({Kind::publish, 0});
    ops.push_back({Kind::create, 2});
    ops.push_back({Kind::attach, 2, 0, 33});
    for (int l = 0; l < 2; ++l) ops.push_back({Kind::append, 2, l, -1, 0});  // n = -1: the rest of the 33-token prompt
    for (int l = 0; l < 2; ++l) ops.push_back({Kind::batch, 0, l, 1, 0, {2, 1, 0}});
  }
  ops.push_back({Kind::free, 1});
  ops.push_back({Kind::free, 0});
  if (prefix) ops.push_back({Kind::free, 2});
  return ops;
}

/// The swap space of the script's swap_out / swap_in (process memory; one for every pool of a
/// test: swapped sequences are back, or freed, before the next pool swaps).
inline HostSwapTarget& swap_space() {
  static HostSwapTarget target;
  return target;
}

/// K or V rows of tokens [first, first + n) of a stream ([n][kv_heads][head_dim]).
inline std::vector<float> rows(std::uint32_t stream, std::int64_t first, int n, int which) {
  std::vector<float> x;
  for (std::int64_t t = first; t < first + n; ++t) {
    const auto r = kvtest::normal(kRow, static_cast<std::uint32_t>(stream * 100003 + t * 2 + which));
    x.insert(x.end(), r.begin(), r.end());
  }
  return x;
}
inline std::vector<float> query(std::size_t floats, std::uint32_t seed) { return kvtest::normal(floats, seed, 0.5f); }

/// What a failed call must not change: a byte string of everything observable (see the file comment).
template <class Pool>
std::string snapshot(Pool& pool, const std::vector<SeqId>& ids) {
  std::string s;
  auto put = [&](const void* p, std::size_t n) { s.append(static_cast<const char*>(p), n); };
  auto num = [&](std::int64_t v) { put(&v, sizeof v); };
  const PoolStats st = pool.stats();
  const std::size_t counts[] = {st.pages_total, st.pages_used,  st.pages_free,        st.pages_shared,     st.prefix_pages,
                                st.prefix_entries, st.exact_bytes, st.bytes_if_unshared, st.sequences.size()};
  for (const std::size_t v : counts) num(static_cast<std::int64_t>(v));
  num(static_cast<std::int64_t>(swap_space().pages())), num(static_cast<std::int64_t>(swap_space().bytes()));  // no copy leaked
  for (const SequenceStats& q : st.sequences)
    num(q.tokens), num(static_cast<std::int64_t>(q.pages)), num(static_cast<std::int64_t>(q.exact_bytes));
  const std::size_t bytes = pool.block_layout().bytes;
  for (const SeqId id : ids) {
    if (!pool.valid(id)) {
      num(-1);
      continue;
    }
    if (*pool.swapped_out(id)) {  // its pages are in the swap space: what stays in the pool
      num(-2), num(*pool.length(id));
      continue;
    }
    for (int l = 0; l < kShape.layers; ++l) {
      num(*pool.tokens(id, l));
      for (int h = 0; h < kShape.kv_heads; ++h) {
        const auto pages = pool.pages(id, l, h);
        for (const PageView& p : *pages) num(p.header.count), num(p.refs > 1), put(p.data, bytes);
        if constexpr (requires { pool.read_back(id, l, h); }) {
          const HeadContents c = *pool.read_back(id, l, h);
          put(c.k.data(), c.k.size() * 4), put(c.v.data(), c.v.size() * 4), put(c.positions.data(), c.positions.size() * 4);
        } else {
          num(*pool.held_tokens(id, l, h));
          const auto slots = *pool.slot_tokens(id, l, h);
          put(slots.data(), slots.size() * 4);
        }
      }
    }
    // The probe: attention of one query per layer, on a fork (an evicting attend changes scores).
    const SeqId f = *pool.fork(id);
    Workspace ws;
    for (int l = 0; l < kShape.layers; ++l) {
      const auto q = query(kQRow, 777 + static_cast<std::uint32_t>(l));
      std::vector<float> out(q.size());
      const Status a = pool.attend(f, l, q, out, ws);
      num(a ? 0 : static_cast<int>(a.error().code) + 1);
      if (a) put(out.data(), out.size() * 4);
    }
    EXPECT_TRUE(pool.free_sequence(f));
  }
  return s;
}

/// Runs op `i` (inputs made before arming, so only the pool's allocations count; a fresh
/// Workspace per call, so its scratch grows inside the call). out: attention outputs or the
/// returned count. Returns the call's status.
template <class Pool>
Status run(Pool& pool, std::vector<SeqId>& ids, const Op& op, std::size_t i, std::vector<float>& out, bool arm) {
  out.clear();
  const SeqId id = ids[static_cast<std::size_t>(op.seq)];
  switch (op.kind) {
    case Kind::create:
    case Kind::fork: {
      Result<SeqId> r = [&] {
        Arm a(arm);
        return op.kind == Kind::create ? pool.create_sequence() : pool.fork(id);
      }();
      if (!r) return r.error();
      ids[op.kind == Kind::create ? static_cast<std::size_t>(op.seq) : 1] = *r;
      return {};
    }
    case Kind::append: {
      const std::int64_t first = *pool.tokens(id, op.layer);
      const int n = op.n >= 0 ? op.n : static_cast<int>(33 - first);
      const auto k = rows(op.stream, first, n, 0), v = rows(op.stream, first, n, 1);
      const auto pos = kvtest::iota_positions(first, n);
      Arm a(arm);
      return pool.append(id, op.layer, k, v, pos);
    }
    case Kind::attend: {
      const auto q = query(static_cast<std::size_t>(op.n) * kQRow, static_cast<std::uint32_t>(i));
      out.assign(q.size(), 0.f);
      Workspace ws;
      Arm a(arm);
      return pool.attend(id, op.layer, q, out, ws);
    }
    case Kind::batch: {
      std::vector<SeqId> seqs;
      for (const int b : op.batch) seqs.push_back(ids[static_cast<std::size_t>(b)]);
      const auto q = query(seqs.size() * kQRow, static_cast<std::uint32_t>(i));
      out.assign(q.size(), 0.f);
      std::vector<Workspace> ws(1);
      Arm a(arm);
      return pool.attend_batch(op.layer, seqs, q, out, {}, ws);
    }
    case Kind::truncate: {
      const std::int64_t to = *pool.length(id) - op.n;
      Arm a(arm);
      return pool.truncate(id, to);
    }
    case Kind::free: {
      Arm a(arm);
      return pool.free_sequence(id);
    }
    case Kind::swap_out:
    case Kind::swap_in: {
      Result<std::size_t> r = [&] {
        Arm a(arm);
        return op.kind == Kind::swap_out ? pool.swap_out(id, swap_space()) : pool.swap_in(id);
      }();
      if (!r) return r.error();
      out.push_back(static_cast<float>(*r));
      return {};
    }
    case Kind::publish:
    case Kind::attach: {
      if constexpr (requires { pool.publish_prefix(id, "m", std::span<const std::int32_t>{}); }) {
        const auto tokens = kvtest::iota_positions(0, op.kind == Kind::attach ? op.n : *pool.length(id));
        Result<std::int64_t> r = [&] {
          Arm a(arm);
          return op.kind == Kind::attach ? pool.attach_prefix(id, "model", tokens) : pool.publish_prefix(id, "model", tokens);
        }();
        if (!r) return r.error();
        out.push_back(static_cast<float>(*r));
        return {};
      } else {
        return fail(Errc::unsupported, "no prefix cache");
      }
    }
  }
  return {};
}

}  // namespace kvtest_pool_fault
