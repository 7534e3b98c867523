// A rank's stage: where the peers that arrive after it at an op reach it when they cannot reach
// its own buffers (cudaMalloc memory across processes, host, managed or stream-ordered memory).
//
// The first rank to arrive decides every op's route from its own buffers (op_exchange.h); a
// rank arriving later with buffers nobody else can reach must still take part, or the ranks
// after it would wait for copies nobody issues. It copies its own chunk into its stage before
// it announces itself ready; a later rank pulls that chunk from there and pushes its own chunk
// into the stage's slot for it, and once that rank is done the stage's rank copies the slot out
// into its receive buffer. The two extra copies are same-GPU copies on this rank only; its
// pairs with earlier ranks are unaffected (it does both copies of each).
//
// One allocation per communicator, exportable as a POSIX fd and opened for the devices of the
// peers in this process, grown to the largest op that needed it; allocated the first time it
// is needed, never otherwise. A stage outgrown is released once the first op that no longer
// uses it has started on this rank's streams (which follow every op that used it).
#pragma once

#include <cstdint>
#include <vector>

#include "cuda_driver.h"
#include "peer_memory.h"
#include "route_memory.h"

namespace zc {

class StageBuffer {
 public:
  explicit StageBuffer(int device) : device_(device) {}
  ~StageBuffer();  // releases every allocation: the caller made sure no stream uses them
  StageBuffer(const StageBuffer&) = delete;
  StageBuffer& operator=(const StageBuffer&) = delete;

  // Makes the stage at least `bytes`, opened for `needs`' devices. A smaller one is retired
  // until `retire_after` has passed. False with *why when it cannot be allocated.
  bool ensure(const CudaDriver& cu, uint64_t bytes, const ReachNeeds& needs, DoneMark retire_after,
              const char** why);
  uint64_t addr() const { return current_.va; }
  // Releases the retired stages whose last op has finished.
  void tidy(const CudaDriver& cu);

 private:
  struct Retired {
    MappedAllocation mapping;
    DoneMark after;
  };
  void release(const CudaDriver& cu, MappedAllocation* m);
  int device_;
  MappedAllocation current_;
  std::vector<Retired> retired_;
};

}  // namespace zc
