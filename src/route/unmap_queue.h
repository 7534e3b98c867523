// Peers' views (runs of imported allocations mapped back to back, peer_memory.h) that are no
// longer used, unmapped a few allocations at a time on the application's thread, or a view at a
// time by the housekeeping thread (housekeeping.h), which takes it out of the queue first.
//
// Each cuMemUnmap costs about 100 us of host time (driver 580), so a view goes over several
// ops. Releasing every freed view at once stalled one op of a loop for 3.4 ms (4xH200,
// zerocta-bench at 256 MiB in place, after the previous size's buffers were freed: 251 GB/s
// against 358 with the releases held back); one view an op still meant ~5 ms on one op's host
// thread for a 1 GiB view of 20 MiB allocations. A few calls an op fit in the host's lead over
// its GPU. (Whatever the pace, unmapping while the rank's copies run slows them: PeerImports
// releases while they are idle, peer_memory.h.)
#pragma once

#include <cuda.h>

#include <cstddef>
#include <cstdint>
#include <deque>
#include <functional>
#include <vector>

#include "cuda_driver.h"

namespace zc {

class UnmapQueue {
 public:
  // A view on its way out: its allocations, in address order, and how far unmapping got.
  struct View {
    CUdeviceptr va = 0;
    std::vector<uint64_t> sizes, blocks;
    int pid = 0;
    size_t unmapped = 0;  // allocations unmapped so far, from the first
    uint64_t offset = 0;  // where the next one starts
  };
  // Called once a view is wholly unmapped and its address range freed: its owner's pid and its
  // allocations' block ids (their imports may go now).
  using Finished = std::function<void(int pid, const std::vector<uint64_t>& blocks)>;

  // A view at `va` whose allocations, in address order, have `sizes` bytes and `blocks` ids.
  // Nothing may use it any more.
  void add(CUdeviceptr va, std::vector<uint64_t> sizes, int pid, std::vector<uint64_t> blocks);
  // Makes at most `max_calls` cuMemUnmap calls (SIZE_MAX: everything at once, when the
  // communicator is going or suspended), oldest view first; frees the range of each view it
  // finishes and reports it to `finished`. Returns the calls made.
  size_t drain(const CudaDriver& cu, size_t max_calls, const Finished& finished);
  // Moves the oldest queued view out (partly unmapped, maybe) into *out; false when none is
  // queued. The caller finishes it (finish) and settles its imports itself.
  bool take_front(View* out);
  // Unmaps what is left of `v`, at most `max_calls` allocations, and frees its range once the
  // last is unmapped; returns the calls made. Whether it is done: v->unmapped == sizes.size().
  static size_t finish(const CudaDriver& cu, View* v, size_t max_calls = SIZE_MAX);
  bool empty() const { return views_.empty(); }
  size_t size() const { return views_.size(); }

 private:
  std::deque<View> views_;
};

}  // namespace zc
