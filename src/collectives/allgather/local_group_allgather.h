// The ops deferred to a group's end (group_state.h), and among them the all-gathers one thread
// issues for every rank of a communicator at once: nccl-tests -g N, or any program that drives
// all of a communicator's GPUs from one thread, in one group. Such a set goes together, without
// the op exchange (local_group_plan.h): every GPU pushes its own chunk, and the ranks hand
// over through the ring's flags of their op number.
//
// A set is the i-th routed all-gather of every rank of the communicator in the group (every
// rank has as many), alike in count and datatype; it qualifies when none of its ops is
// captured, every rank is prepared, unpoisoned and at the same op number, every receive buffer
// is reachable by address from the other GPUs (cudaMalloc memory with peer access; cuMem memory
// whose access the application granted them, or else a second mapping of it, local_aliases.h)
// and every send buffer is device memory of its own GPU; if one set of a communicator does not,
// none of its sets goes so and each op goes its own way (ce_allgather.h). Sets go in the order of
// their last ops, so each rank's ops keep their order on its stream. Either way the choice is this
// thread's alone and covers every rank of the communicator, so no rank takes another path than its
// peers. The sets' ops are the only ones that number a local communicator's ops, so the ranks'
// numbers stay in step; the exchange's posts are never used there.
#pragma once

#include <nccl.h>

#include <vector>

#include "group_state.h"

namespace zc {

// Runs `ops` in their order (a qualifying set where the last of its ops stood) and returns
// the first error, or ncclSuccess.
ncclResult_t run_group_ops(std::vector<PendingOp>& ops);

}  // namespace zc
