// NCCL's order among the operations of one communicator, kept for the routed all-gathers.
//
// NCCL runs the operations of a communicator one after the other, whatever streams they were
// issued on: each launch waits for the communicator's previous one (its internal device stream).
// The route's all-gathers escaped that order: on their own streams they ran beside the
// communicator's other operations, which NCCL would have queued behind them. FSDP2 issues its
// all-gathers and reduce-scatters on two streams of one communicator; beside the copy engines'
// all-gathers NCCL's reduce-scatter kernels took 62-94 ms a step against 56 ms alone (both
// share the links), which ate most of what the faster all-gathers gained (docs/PERFORMANCE.md).
//
// So, on a communicator whose route is committed and prepared, outside captures:
//   - an operation forwarded to NCCL first makes its stream wait for the communicator's last
//     routed all-gather (the event its push stream records at the op's end), and records an
//     event on its stream after NCCL enqueued it;
//   - a routed all-gather's own streams first wait for that event of the last operation
//     forwarded since the previous routed one.
// Inside an application's group NCCL enqueues its kernels only at the outermost ncclGroupEnd:
// there, before NCCL's, the stream of the communicator's last grouped op waits (NCCL's launch
// joins every stream of the group; a wait at the call would also hold the application's own
// work issued after it inside the group), and the event is recorded once NCCL's end returned.
// Nothing is called inside the group. The all-gathers the group's end routes (group_calls.cc)
// then come after the group's NCCL ops.
// Only events, on the application's stream too (it waits for nothing else): the dependencies
// are those NCCL's own kernel path has between the same operations, so no program that NCCL
// completes can hang on them. What the group's end forwards on the route's behalf (an
// all-gather whose verdict sent it to NCCL) and what a non-blocking group leaves in progress
// keep no order with the route.
#pragma once

#include <cuda.h>
#include <nccl.h>

#include <memory>

#include "comm_state.h"

namespace zc {

// Around an operation forwarded to NCCL on `stream` (any but a routed all-gather).
void order_before_nccl_op(const std::shared_ptr<CommState>& st, cudaStream_t stream);
void order_after_nccl_op(const std::shared_ptr<CommState>& st, cudaStream_t stream);
// At the outermost ncclGroupEnd, around NCCL's: before it, the grouped ops forwarded inside the
// group wait for their communicator's last routed op (on one stream per communicator); once
// NCCL's returned `r`, their end is marked (an event per communicator), where NCCL launched
// them (ncclSuccess).
void order_before_group_end();
void order_after_group_end(ncclResult_t r);

// Before a routed op's plan is issued on `streams` (kDirectStreams, index 0 unused): they wait
// for the communicator's last forwarded operation, if one came since the previous routed op;
// and the pull and local streams for the previous routed op's end. The push stream follows
// that op by stream order, but the pull stream (a reduce-scatter's sums) and the local one
// start when their own op starts, which on another application stream may be before the
// previous op ended: NCCL runs a communicator's ops one after the other, and a program may
// read one's output in the next. Called with st.issue_mu held. CUDA_SUCCESS or the driver's
// error.
CUresult order_routed_op(CommState& st, const CUstream* streams);
// The routed op was issued (its push stream recorded its end event).
void routed_op_issued(CommState& st);

// Forwards `call` to NCCL in the communicator's order (the two calls above around it).
template <typename Call>
ncclResult_t in_comm_order(const std::shared_ptr<CommState>& st, cudaStream_t stream, Call call) {
  order_before_nccl_op(st, stream);
  const ncclResult_t r = call();
  if (r == ncclSuccess || r == ncclInProgress) order_after_nccl_op(st, stream);
  return r;
}

}  // namespace zc
