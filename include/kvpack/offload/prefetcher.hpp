// Background I/O for the offload store: a bounded job queue and one worker std::thread.
//
// The OffloadStore owns one Prefetcher. The cache asks for the blocks of the next layers
// (request(LayerRange)) while it computes the current one; the worker fetches them into the
// hot tier, and also runs write-behind (rebalance jobs move cold blocks down when the
// resident budget is exceeded). Requests are hints: when the queue is full they are dropped
// (counted) rather than stalling the compute thread, and correctness never depends on them:
// OffloadStore::acquire() fetches whatever is still missing and waits for blocks in flight.
#pragma once

#include <condition_variable>
#include <cstddef>
#include <cstdint>
#include <deque>
#include <functional>
#include <mutex>
#include <optional>
#include <thread>
#include <utility>

namespace kvpack::offload {

/// A closed-ended-on-both-sides range of layers [first, last].
struct LayerRange {
  int32_t first = 0;
  int32_t last = -1;
  [[nodiscard]] bool contains(int32_t layer) const noexcept { return layer >= first && layer <= last; }
  [[nodiscard]] bool empty() const noexcept { return last < first; }
};

/// FIFO queue of at most `capacity` items shared by producers and one or more consumers.
/// close() wakes everyone: pushes fail from then on, pops drain what is left, then return
/// nullopt.
template <class T>
class BoundedQueue {
 public:
  explicit BoundedQueue(std::size_t capacity) : capacity_(capacity ? capacity : 1) {}

  /// Adds `v` unless the queue is full or closed. Never blocks.
  [[nodiscard]] bool try_push(T v) {
    {
      std::lock_guard lock(mu_);
      if (closed_ || q_.size() >= capacity_) return false;
      q_.push_back(std::move(v));
    }
    not_empty_.notify_one();
    return true;
  }
  /// Adds `v`, waiting while the queue is full. false if the queue is (or gets) closed.
  [[nodiscard]] bool push(T v) {
    {
      std::unique_lock lock(mu_);
      not_full_.wait(lock, [&] { return closed_ || q_.size() < capacity_; });
      if (closed_) return false;
      q_.push_back(std::move(v));
    }
    not_empty_.notify_one();
    return true;
  }
  /// Takes the oldest item, waiting while the queue is empty; nullopt once closed and empty.
  [[nodiscard]] std::optional<T> pop() {
    std::unique_lock lock(mu_);
    not_empty_.wait(lock, [&] { return closed_ || !q_.empty(); });
    if (q_.empty()) return std::nullopt;
    T v = std::move(q_.front());
    q_.pop_front();
    lock.unlock();
    not_full_.notify_one();
    return v;
  }
  /// Refuses further pushes and wakes all waiters.
  void close() {
    {
      std::lock_guard lock(mu_);
      closed_ = true;
    }
    not_empty_.notify_all();
    not_full_.notify_all();
  }
  [[nodiscard]] std::size_t size() const {
    std::lock_guard lock(mu_);
    return q_.size();
  }
  [[nodiscard]] std::size_t capacity() const noexcept { return capacity_; }

 private:
  const std::size_t capacity_;
  mutable std::mutex mu_;
  std::condition_variable not_empty_, not_full_;
  std::deque<T> q_;
  bool closed_ = false;
};

/// One unit of background work.
struct IoJob {
  enum class Kind { fetch_layers, rebalance };
  Kind kind = Kind::rebalance;
  LayerRange layers{};  ///< for fetch_layers
};

/// A worker thread running IoJobs through a handler, fed by a BoundedQueue.
/// Rebalance requests are coalesced (at most one queued at a time).
class Prefetcher {
 public:
  using Handler = std::function<void(const IoJob&)>;

  /// Starts the worker. `handler` runs on the worker thread, one job at a time.
  Prefetcher(std::size_t queue_capacity, Handler handler)
      : queue_(queue_capacity), handler_(std::move(handler)), thread_([this] { run(); }) {}
  Prefetcher(const Prefetcher&) = delete;
  Prefetcher& operator=(const Prefetcher&) = delete;
  /// Stops taking jobs, finishes the one running, drops the rest, joins.
  ~Prefetcher() { stop(); }

  /// Queues a fetch of every offloaded block of `layers`. false (and counted as dropped)
  /// when the queue is full or stopped.
  bool request(LayerRange layers) { return submit(IoJob{IoJob::Kind::fetch_layers, layers}); }

  /// Queues a rebalance unless one is already queued. false when it could not be queued.
  bool request_rebalance() {
    {
      std::lock_guard lock(mu_);
      if (rebalance_queued_) return true;
      rebalance_queued_ = true;
    }
    if (submit(IoJob{IoJob::Kind::rebalance, {}})) return true;
    std::lock_guard lock(mu_);
    rebalance_queued_ = false;
    return false;
  }

  /// Waits until every queued job has finished.
  void drain() {
    std::unique_lock lock(mu_);
    idle_.wait(lock, [&] { return pending_ == 0; });
  }

  /// Requests dropped because the queue was full.
  [[nodiscard]] uint64_t dropped() const {
    std::lock_guard lock(mu_);
    return dropped_;
  }

  /// Idempotent: closes the queue and joins the worker.
  void stop() {
    {
      std::lock_guard lock(mu_);
      stopping_ = true;
    }
    queue_.close();
    if (thread_.joinable()) thread_.join();
  }

 private:
  bool submit(IoJob job) {
    {
      std::lock_guard lock(mu_);
      if (stopping_) return false;
      ++pending_;
    }
    if (queue_.try_push(job)) return true;
    std::lock_guard lock(mu_);
    --pending_;
    ++dropped_;
    idle_.notify_all();
    return false;
  }

  void run() {
    while (auto job = queue_.pop()) {
      bool skip = false;
      {
        std::lock_guard lock(mu_);
        if (job->kind == IoJob::Kind::rebalance) rebalance_queued_ = false;
        skip = stopping_;
      }
      if (!skip) handler_(*job);
      std::lock_guard lock(mu_);
      --pending_;
      idle_.notify_all();
    }
    std::lock_guard lock(mu_);
    pending_ = 0;
    idle_.notify_all();
  }

  BoundedQueue<IoJob> queue_;
  Handler handler_;
  mutable std::mutex mu_;
  std::condition_variable idle_;
  uint64_t pending_ = 0;
  uint64_t dropped_ = 0;
  bool rebalance_queued_ = false;
  bool stopping_ = false;
  std::thread thread_;  // last: starts after every other member exists
};

}  // namespace kvpack::offload
