// Per-iteration CUDA event timing: events e[0..n] recorded around n back-to-back operations on
// one stream give the mean ((e[n]-e[0])/n, exactly what one event pair around the whole loop
// gives, as in nccl-tests) and, for free, the median of the n intervals.
#pragma once

#include <cuda_runtime_api.h>

#include <cstdint>
#include <vector>

namespace zcb {

class IterTimer {
 public:
  explicit IterTimer(int max_iters);
  ~IterTimer();
  IterTimer(const IterTimer&) = delete;
  IterTimer& operator=(const IterTimer&) = delete;

  // Records event i (0 before the first op, i after op i) on stream.
  void record(int i, cudaStream_t stream);
  cudaEvent_t event(int i) const { return events_[i]; }

  // After the stream has synchronized: statistics of the first n ops, in microseconds.
  double mean_us(int n) const;
  double median_us(int n) const;
  std::vector<double> times_us(int n) const;  // each of the first n ops

 private:
  std::vector<cudaEvent_t> events_;
};

// --iter-times: "# iter-times rank R bytes B in-place|out-of-place PHASE (us): t1 t2 ..." on
// stderr, the first n ops of `t` (synchronized).
void print_iter_times(int rank, uint64_t bytes, bool in_place, const char* phase,
                      const IterTimer& t, int n);

// Elapsed milliseconds from a to b (both completed; negative when b came first).
float elapsed_ms(cudaEvent_t a, cudaEvent_t b);

// Median of a vector (copied); 0 for an empty one.
double median_of(std::vector<double> v);

}  // namespace zcb
