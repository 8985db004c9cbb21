// Eviction policies: which tokens a KVCache keeps. Every policy keeps original token positions
// (keys arrive post-RoPE and are never re-rotated) and composes with every codec. Each policy
// lives in its own file with the hook (eviction/hook.hpp) that implements it; this header
// includes them all.
//
// Common rules (documented once here, asserted by tests/test_eviction_*.cpp and CASES C7-C10):
//  * Eviction runs at the start of each append, after the previous append's tokens were
//    committed: the tokens of the latest append are always kept until the next append, and
//    queries of one chunk attend causally to the whole chunk (exact) plus whatever was retained
//    before it (eviction at chunk granularity; pure decode is exact token-level eviction).
//  * Budgets count every token the layer holds: fp32 sinks, quantized slots and pending tokens.
//  * Evicted slots are zeroed and reused by later tokens, so memory stays constant once a budget
//    is reached.
//  * GQA: decisions are per KV head; scores are summed over the query heads of its group (the
//    ranking equals the mean's) unless a policy says otherwise.
#pragma once

#include "kvpack/eviction/block_sparse.hpp"
#include "kvpack/eviction/h2o.hpp"
#include "kvpack/eviction/hook.hpp"
#include "kvpack/eviction/protocol.hpp"
#include "kvpack/eviction/sink_window.hpp"
#include "kvpack/eviction/snapkv.hpp"
#include "kvpack/eviction/tova.hpp"
