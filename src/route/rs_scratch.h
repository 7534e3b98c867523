// The reduce-scatter's scratch of one rank of one communicator, and its mappings of its peers'
// scratch (reduce_scatter_plan.h says what goes in it).
//
// Made when the rank joins its communicator's channel, before NCCL's init is forwarded, and
// described in the rank's published facts (membership.h): by the time any rank's init
// completes, every peer's scratch is known, so a routed op never waits to learn where to push.
// Exported as a POSIX file descriptor kept in this process's fd service (fd_exchange.h); open to
// every GPU of this process that can reach this one, so that peers in this process push into it
// by address. A peer in another process imports it once, at the first routed reduce-scatter.
// Either way a peer keeps it until its own scratch goes: its own mapping of the import, or a
// reference to the allocation in this process — after an abort or a poison released its waits,
// or in a graph that outlives this rank's communicator, a peer's queued pushes may still land in
// it after its owner let it go.
// Bounded (ZEROCTA_RS_SCRATCH), counted in the stats' pool_bytes, never grown: an op larger
// than its slices goes in several.
#pragma once

#include <cstdint>
#include <memory>

#include "cuda_driver.h"
#include "direct_plan.h"
#include "membership.h"
#include "route_memory.h"

namespace zc {

class RsScratch {
 public:
  RsScratch() = default;
  ~RsScratch();  // lets its own and the peers' go: with no copy of its own still running
  RsScratch(const RsScratch&) = delete;
  RsScratch& operator=(const RsScratch&) = delete;

  // Allocates at least `bytes` on `device`, open to the other GPUs of this process that can
  // reach it, and exports it. False with *why (nothing held).
  bool create(const CudaDriver& cu, int device, uint64_t bytes, const char** why);
  ScratchFacts facts() const { return facts_; }

  // Peer `peer`'s scratch as this rank's streams on `device` address it: its address where it
  // lives in this process (`same_process`), else imported from the fd service at `fd_address`
  // of process `pid` and mapped here. False with *why.
  bool map_peer(const CudaDriver& cu, int peer, const ScratchFacts& f, bool same_process,
                const char* fd_address, int pid, int device, const char** why);
  uint64_t peer_addr(int peer) const { return peer_addr_[peer]; }

 private:
  std::shared_ptr<MappedAllocation> own_;
  ScratchFacts facts_;
  uint64_t peer_addr_[kMaxRanks] = {};
  MappedAllocation imported_[kMaxRanks];
  std::shared_ptr<MappedAllocation> local_peer_[kMaxRanks];  // peers' in this process
};

}  // namespace zc
