// A reusable barrier for the threads of one process (C++17 has no std::barrier) that also
// returns the max of a value over the threads, like Channel::agree_max does across processes.
#pragma once

#include <condition_variable>
#include <cstdint>
#include <mutex>

namespace zcb {

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

}  // namespace zcb
