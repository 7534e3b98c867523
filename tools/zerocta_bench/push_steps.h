// Keeps the bare pushes of 3+ GPUs in step: GPU g's op i starts only after every GPU's op i-1
// has finished. Unsynchronized, the GPUs of back-to-back ops drift apart and several write into
// one GPU at once: on 4 H200s 203-360 GB/s in place from 64 MiB, below the route that the
// ceiling is meant to bound; in step 333.5 / 375.7 / 388.4 at 64 MiB / 256 MiB / 1 GiB
// (docs/plots/ceiling-in-step-4xH200/). An all-gather needs that wait anyway before it
// may rewrite its buffers, and events are the cheapest hand-over between GPUs of one process
// (8.4 us a round trip, host flags 13.3). Two GPUs cannot collide (each is written by the other
// alone), so their pushes stay unsynchronized, the higher bound.
#pragma once

#include <cuda_runtime_api.h>

#include <cstdint>
#include <vector>

namespace zcb {

class PushSteps {
 public:
  // Creates each GPU's events on that GPU; leaves GPU ngpus-1 current.
  explicit PushSteps(int ngpus);
  ~PushSteps();
  PushSteps(const PushSteps&) = delete;
  PushSteps& operator=(const PushSteps&) = delete;

  bool in_step() const { return !events_.empty(); }

  // Around GPU g's pushes of op `op` (numbered from 0 per GPU, the same sequence on every GPU),
  // with g current: `before` makes the stream wait for every peer's op-1, `after` records g's.
  // Every GPU's `after(op)` must be called before any GPU's `before(op + 1)`, and every GPU's
  // `before(op + 1)` before any GPU's `after(op + 2)` (an event slot is reused every other op):
  // one thread issuing every GPU's op in turn, or a barrier of the GPUs' threads after `after`.
  void before(int g, uint64_t op, cudaStream_t stream) const;
  void after(int g, uint64_t op, cudaStream_t stream) const;

 private:
  cudaEvent_t event(int g, uint64_t op) const { return events_[2 * g + op % 2]; }
  int ngpus_;
  std::vector<cudaEvent_t> events_;  // two slots per GPU; none when the GPUs need no step
};

}  // namespace zcb
