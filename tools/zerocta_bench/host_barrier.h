// Reusable barriers for the threads of one process (C++17 has no std::barrier).
#pragma once

#include <atomic>
#include <condition_variable>
#include <cstdint>
#include <mutex>
#include <thread>

namespace zcb {

// Sleeps while it waits; also returns the max of a value over the threads, like
// Channel::agree_max does across processes.
class HostBarrier {
 public:
  explicit HostBarrier(int n) : n_(n) {}

  uint64_t arrive_max(uint64_t value) {
    std::unique_lock<std::mutex> lock(mu_);
    const uint64_t gen = generation_;
    if (value > pending_max_) pending_max_ = value;
    if (++arrived_ == n_) {
      result_ = pending_max_;
      pending_max_ = 0;
      arrived_ = 0;
      ++generation_;
      cv_.notify_all();
      return result_;
    }
    cv_.wait(lock, [&] { return generation_ != gen; });
    return result_;
  }
  void wait() { arrive_max(0); }

 private:
  std::mutex mu_;
  std::condition_variable cv_;
  int n_;
  int arrived_ = 0;
  uint64_t generation_ = 0;
  uint64_t pending_max_ = 0;
  uint64_t result_ = 0;
};

// Spins while it waits: for a barrier on every op of a timed loop, where waking a sleeping
// thread (tens of us) would make the host, not the GPUs, set the pace of short ops.
class SpinBarrier {
 public:
  explicit SpinBarrier(int n) : n_(n) {}

  void wait() {
    const uint64_t gen = generation_.load(std::memory_order_acquire);
    if (arrived_.fetch_add(1, std::memory_order_acq_rel) + 1 == n_) {
      arrived_.store(0, std::memory_order_relaxed);  // before anyone can pass and arrive again
      generation_.fetch_add(1, std::memory_order_acq_rel);
      return;
    }
    while (generation_.load(std::memory_order_acquire) == gen) std::this_thread::yield();
  }

 private:
  const int n_;
  std::atomic<int> arrived_{0};
  std::atomic<uint64_t> generation_{0};
};

}  // namespace zcb
