// Offload costs: sealing/opening records (encryption GB/s) and fetch latency of one block from
// the host and file tiers. Block = CASES C11's INT4 block (64 tokens, head_dim 128, group 32,
// fp16 scale + zero-point: 10496 bytes); 1 MiB payloads show the cipher's peak.
// Run: ./bench_offload --benchmark_counters_tabular=true
#include <benchmark/benchmark.h>

#include <string>
#include <vector>

#include "kvpack/offload.hpp"
#include "support/offload_fixtures.hpp"

namespace ko = kvpack::offload;

namespace {

ko::BlockLayout layout_of(std::size_t payload) {
  auto l = ko::testing::c11_layout();
  l.max_payload_bytes = static_cast<uint32_t>(payload);
  return l;
}

void seal(benchmark::State& state, ko::Aead aead) {
  const auto n = static_cast<std::size_t>(state.range(0));
  if (aead == ko::Aead::aes256gcm && !ko::aes256gcm_available()) {
    state.SkipWithError("AES-256-GCM not available on this CPU");
    return;
  }
  auto cipher = ko::RecordCipher::create(aead, ko::SecretBytes::random(32).value()).value();
  const auto layout = layout_of(n);
  const auto payload = ko::testing::random_payload(n, 1);
  std::vector<std::byte> rec(ko::record_bytes(n));
  ko::BlockId id{{}, {0, 0, 0}, 1};
  for (auto _ : state) {
    ++id.version;
    if (!ko::seal_record(cipher, layout, id, 64, payload, rec)) state.SkipWithError("seal failed");
    benchmark::DoNotOptimize(rec.data());
  }
  state.SetBytesProcessed(static_cast<int64_t>(state.iterations()) * static_cast<int64_t>(n));
}

void open(benchmark::State& state, ko::Aead aead) {
  const auto n = static_cast<std::size_t>(state.range(0));
  if (aead == ko::Aead::aes256gcm && !ko::aes256gcm_available()) {
    state.SkipWithError("AES-256-GCM not available on this CPU");
    return;
  }
  auto cipher = ko::RecordCipher::create(aead, ko::SecretBytes::random(32).value()).value();
  const auto layout = layout_of(n);
  const auto payload = ko::testing::random_payload(n, 1);
  std::vector<std::byte> rec(ko::record_bytes(n)), out(n);
  const ko::BlockId id{{}, {0, 0, 0}, 1};
  if (!ko::seal_record(cipher, layout, id, 64, payload, rec)) state.SkipWithError("seal failed");
  for (auto _ : state) {
    if (!ko::open_record(cipher, layout, id, rec, out)) state.SkipWithError("open failed");
    benchmark::DoNotOptimize(out.data());
  }
  state.SetBytesProcessed(static_cast<int64_t>(state.iterations()) * static_cast<int64_t>(n));
}

// Fetch latency: a block with a valid record is dropped from the hot tier (no I/O) and acquired
// again (read + verify + decrypt + publish). File: the page cache serves the reads.
void fetch(benchmark::State& state, bool file) {
  ko::testing::TempDir dir;
  ko::StoreConfig c;
  c.layout = ko::testing::c11_layout();
  c.resident_budget_bytes = UINT64_MAX;
  c.background = false;
  if (file)
    c.file = ko::FileTier{.directory = dir.path()};
  else
    c.host = ko::HostTier{};
  auto store = ko::OffloadStore::create(c).value();
  constexpr int kBlocks = 64;
  for (int b = 0; b < kBlocks; ++b) {
    if (!store->put({0, 0, b}, 64, ko::testing::random_payload(ko::testing::kC11PayloadBytes, static_cast<uint64_t>(b))) ||
        !store->offload({0, 0, b}))
      state.SkipWithError("setup failed");
  }
  int b = 0;
  for (auto _ : state) {
    const ko::BlockKey k{0, 0, b};
    b = (b + 1) % kBlocks;
    state.PauseTiming();
    (void)store->offload(k);  // clean: drops the hot copy only
    state.ResumeTiming();
    auto h = store->acquire(k);
    if (!h) state.SkipWithError("fetch failed");
    benchmark::DoNotOptimize(h->bytes().data());
  }
  const auto m = store->metrics();
  state.counters["p50_us"] = m.fetch_p50_us;
  state.counters["p99_us"] = m.fetch_p99_us;
  state.SetBytesProcessed(static_cast<int64_t>(state.iterations()) * static_cast<int64_t>(ko::testing::kC11PayloadBytes));
  state.SetLabel(std::string(ko::to_string(store->aead())));
}

// Write-behind cost of one dirty block: seal + write (+ wipe of the hot copy).
void offload_write(benchmark::State& state, bool file) {
  ko::testing::TempDir dir;
  ko::StoreConfig c;
  c.layout = ko::testing::c11_layout();
  c.background = false;
  if (file)
    c.file = ko::FileTier{.directory = dir.path()};
  else
    c.host = ko::HostTier{};
  auto store = ko::OffloadStore::create(c).value();
  const auto payload = ko::testing::random_payload(ko::testing::kC11PayloadBytes, 9);
  int b = 0;
  for (auto _ : state) {
    const ko::BlockKey k{0, 0, b};
    b = (b + 1) % 256;
    state.PauseTiming();
    if (!store->put(k, 64, payload)) state.SkipWithError("put failed");
    state.ResumeTiming();
    if (!store->offload(k)) state.SkipWithError("offload failed");
  }
  state.SetBytesProcessed(static_cast<int64_t>(state.iterations()) * static_cast<int64_t>(ko::testing::kC11PayloadBytes));
}

}  // namespace

BENCHMARK_CAPTURE(seal, xchacha20poly1305, ko::Aead::xchacha20poly1305)->Arg(10496)->Arg(1 << 20);
BENCHMARK_CAPTURE(seal, aes256gcm, ko::Aead::aes256gcm)->Arg(10496)->Arg(1 << 20);
BENCHMARK_CAPTURE(seal, mac_only, ko::Aead::none)->Arg(10496)->Arg(1 << 20);
BENCHMARK_CAPTURE(open, xchacha20poly1305, ko::Aead::xchacha20poly1305)->Arg(10496)->Arg(1 << 20);
BENCHMARK_CAPTURE(open, aes256gcm, ko::Aead::aes256gcm)->Arg(10496)->Arg(1 << 20);
BENCHMARK_CAPTURE(open, mac_only, ko::Aead::none)->Arg(10496)->Arg(1 << 20);
BENCHMARK_CAPTURE(fetch, host, false);
BENCHMARK_CAPTURE(fetch, file, true);
BENCHMARK_CAPTURE(offload_write, host, false);
BENCHMARK_CAPTURE(offload_write, file, true);
