// CUDA event timing of n back-to-back operations on one stream: events at 0, every `every`
// operations and at n give the mean ((e[n]-e[0])/n, what one event pair around the whole loop
// gives, as in nccl-tests) and the median of the intervals' per-op times. every = 1 times each
// op; it is not free: a timed event between every two ops of a stream that otherwise only
// waits on and records events (the route's user stream) makes each op 4-6 us longer
// (docs/PERFORMANCE.md, "How the bench times an op"), which one event per run does not.
#pragma once

#include <cuda_runtime_api.h>

#include <cstdint>
#include <vector>

namespace zcb {

class IterTimer {
 public:
  explicit IterTimer(int max_iters, int every = 1);
  ~IterTimer();
  IterTimer(const IterTimer&) = delete;
  IterTimer& operator=(const IterTimer&) = delete;

  // Records event i (0 before the first op, i after op i) on stream where i is 0, a multiple of
  // `every` or max_iters; else nothing.
  void record(int i, cudaStream_t stream);
  cudaEvent_t event(int i) const { return events_[i]; }  // null where i is never recorded

  // After the stream has synchronized: statistics of the max_iters ops, in microseconds.
  double mean_us() const;
  double median_us() const;
  std::vector<double> times_us() const;  // each interval's time per op

 private:
  bool recorded(int i) const { return i % every_ == 0 || i == max_iters_; }
  int max_iters_, every_;
  std::vector<cudaEvent_t> events_;
};

// --iter-times: "# iter-times rank R bytes B in-place|out-of-place PHASE (us): t1 t2 ..." on
// stderr, the intervals of `t` (synchronized).
void print_iter_times(int rank, uint64_t bytes, bool in_place, const char* phase,
                      const IterTimer& t);

// Elapsed milliseconds from a to b (both completed; negative when b came first).
float elapsed_ms(cudaEvent_t a, cudaEvent_t b);

// Median of a vector (copied); 0 for an empty one.
double median_of(std::vector<double> v);

}  // namespace zcb
