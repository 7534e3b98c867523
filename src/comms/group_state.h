// The application's NCCL group nesting on this thread, and what zerocta does at the outermost
// ncclGroupEnd: before forwarding it, the channel joins of communicators created inside the
// group (NCCL starts their init only there, so every join still precedes every init's
// completion); after it, what NCCL filled in only then (windows), the freeze of the blocking
// ones NCCL has now completed, and the copy-engine all-gathers issued inside the group: each
// communicator's in program order, the communicators in the order of their keys, which every
// rank derives alike (NCCL launches a group's communicators in the order of their hashes, so a
// group whose ranks name its communicators in different orders completes).
#pragma once

#include <nccl.h>

#include <functional>
#include <memory>
#include <optional>
#include <utility>
#include <vector>

#include "comm_state.h"
#include "route_setup.h"

namespace zc {

// An all-gather on the copy-engine route, as the application called it.
struct GroupedAllGather {
  std::shared_ptr<CommState> st;
  const void* send = nullptr;
  void* recv = nullptr;
  size_t count = 0;
  ncclDataType_t datatype = ncclInt8;
  cudaStream_t stream = nullptr;
  uint64_t total = 0;  // output bytes
  ChainPoint chain;    // the communicator's call chain before it, at the call (call_chain.h)
  // Hands it to NCCL as called (where the first rank to arrive said so).
  std::function<ncclResult_t()> forward;
};

// An op deferred to the group's end: `run` issues it alone; a routed all-gather also says what
// it is, so that the ones of every rank of a communicator this thread holds go as one
// (local_group_allgather.h). `key`: its communicator instance's, alike on every rank, by which
// the group's end orders the ops of several communicators (in_launch_order()).
struct PendingOp {
  std::function<ncclResult_t()> run;
  std::optional<GroupedAllGather> allgather;
  CommKey key;
};

struct GroupState {
  int depth = 0;
  // The outermost end is running the deferred ops, inside an NCCL group of its own (NCCL
  // launches what they forward at that group's end).
  bool running_deferred = false;
  std::vector<std::pair<std::shared_ptr<CommState>, JoinPlan>> pending_joins;
  std::vector<std::shared_ptr<CommState>> pending_freezes;
  std::vector<PendingOp> pending_ops;
  // What NCCL hands out only at the group's end (a window registered inside the group), read
  // right after it.
  std::vector<std::function<void()>> after_end;
  // Communicators with a committed route whose ops the group forwarded to NCCL, each with the
  // stream of its last one: ordered around NCCL's outermost end (comm_order.h).
  std::vector<std::pair<std::shared_ptr<CommState>, cudaStream_t>> ordered_forwards;
  // Each communicator's call chain before the group's first call on it (call_chain.h): a
  // simulated end launches nothing, and ranks may simulate alone, so it rewinds them.
  std::vector<std::pair<std::shared_ptr<CommState>, ChainPoint>> chain_marks;
};

GroupState& group_state();  // this thread's

}  // namespace zc
