// The zero-copy all-gather of every rank of a communicator at once, when one thread issues all
// of them in one group (nccl-tests -g N, ncclCommInitAll programs: a group over every local
// GPU). That thread holds every rank's buffers and streams, so it synchronizes the ranks with
// events, where ranks in separate calls need flags in host memory and the exchange of
// op_exchange.h. Pure (addresses are integers), like direct_plan.h; ce_exec.cc issues it.
//
// Every rank writes its own chunk into every peer's receive buffer (each pushes: every GPU's
// copy engines at work); out of place, it also copies its chunk into its own receive buffer,
// on its local stream:
//
//   user r   record kEvStart                                  ... wait kEvEnd of every rank
//                                                                 [wait kEvLocal]
//   push r   wait kEvStart of every rank; my pushes; record kEvEnd
//   local r  (out of place) wait kEvStart; copy my chunk; record kEvLocal
//
// A push waits for every rank's start: its source is written by its own rank's work before the
// op, its destination is read by the peer's work before it. Every user stream waits for every
// rank's end: each writes into its buffer, and its own push reads its send buffer. No flag, no
// exchange: measured on 2 H200s (tests/gpu/probes/flag_latency_probe.cu), a hand-over between
// two GPUs through events takes 8.4 us a round trip where flags in host memory take 13.3 us,
// and both GPUs push instead of the later rank doing both copies.
//
// The steps come in the order they must be issued: every start first (a wait on an event binds
// to its last record issued before it), then each rank's push and local streams, then the user
// streams' waits.
#pragma once

#include <cstdint>
#include <vector>

#include "direct_plan.h"

namespace zc {

struct LocalGroupRank {
  uint64_t send = 0, recv = 0;  // its buffers, as its own GPU addresses them
  // Where the other GPUs write into recv: recv itself, or a second mapping of it open to them
  // (local_aliases.h) where its owner did not grant them access. 0: recv.
  uint64_t recv_for_peers = 0;
};

struct LocalGroupView {
  int nranks = 0;
  uint64_t chunk = 0;  // bytes per rank
  LocalGroupRank ranks[kMaxRanks];
};

// One step: `op` on rank `rank`'s streams; a record or an event wait names event `op.event` of
// rank `event_rank`.
struct LocalGroupStep {
  uint8_t rank = 0, event_rank = 0;
  DirectOp op{};
};

// Appends the plan (clears nothing: the caller reuses one vector).
void build_local_group_plan(const LocalGroupView& v, std::vector<LocalGroupStep>* plan);

}  // namespace zc
