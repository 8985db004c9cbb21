// Executors: how kvpack runs independent tasks on the caller's threads.
//
// kvpack owns no threads. Work that can run in parallel (split-K decode attention: one sequence's
// context cut into chunks whose partial softmax states are combined exactly, FlashDecoding,
// Dao et al. 2023) is handed to an Executor, a callable
//
//     void(int n_tasks, const std::function<void(int)>& task)
//
// that must call task(i) exactly once for every i in [0, n_tasks), in any order and on any
// threads, and return only after all calls have returned. Tasks never throw and never share
// mutable state; an executor that runs them one after the other (serial_executor) is always
// correct. An engine passes its own thread pool here; thread_executor(n) is the plain default
// (std::thread per call, no pool kept).
#pragma once

#include <algorithm>
#include <functional>
#include <thread>
#include <vector>

namespace kvpack {

/// Runs n_tasks tasks (see the file comment for the contract).
using Executor = std::function<void(int n_tasks, const std::function<void(int)>& task)>;

/// An executor that runs every task on the calling thread, in index order.
[[nodiscard]] inline Executor serial_executor() {
  return [](int n, const std::function<void(int)>& task) {
    for (int i = 0; i < n; ++i) task(i);
  };
}

/// An executor over `threads` threads (the caller's plus threads - 1 std::threads started per
/// call and joined before it returns): thread w runs tasks w, w + threads, ... . threads <= 1 is
/// serial_executor(). Starting threads costs tens of microseconds per call; an engine that calls
/// it every decode step should pass a pool-backed Executor instead. If a std::thread cannot be
/// started (std::system_error), its tasks run on the calling thread: never an abort.
[[nodiscard]] inline Executor thread_executor(int threads) {
  if (threads <= 1) return serial_executor();
  return [threads](int n, const std::function<void(int)>& task) {
    const int workers = std::min(threads, n);
    auto share = [&](int w) {
      for (int i = w; i < n; i += workers) task(i);
    };
    std::vector<std::thread> started;
    std::vector<int> unstarted;
    started.reserve(static_cast<std::size_t>(std::max(0, workers - 1)));
    for (int w = 1; w < workers; ++w) {
      try {
        started.emplace_back(share, w);
      } catch (...) {
        unstarted.push_back(w);
      }
    }
    share(0);
    for (int w : unstarted) share(w);
    for (std::thread& t : started) t.join();
  };
}

}  // namespace kvpack
