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
// So, on a communicator whose route is committed and prepared, outside groups and captures:
//   - an operation forwarded to NCCL first makes its stream wait for the communicator's last
//     routed all-gather (the event its push stream records at the op's end), and records an
//     event on its stream after NCCL enqueued it;
//   - a routed all-gather's own streams first wait for that event of the last operation
//     forwarded since the previous routed one.
// Only events, on the application's stream too (it waits for nothing else): the dependencies
// are those NCCL's own kernel path has between the same operations, so no program that NCCL
// completes can hang on them. Inside a group NCCL launches at the group's end, on streams we
// do not see then: grouped operations keep no order with the route (as before).
#pragma once

#include <cuda.h>
#include <nccl.h>

#include "comm_state.h"

namespace zc {

// Around an operation forwarded to NCCL on `stream` (any but a routed all-gather).
void order_before_nccl_op(CommState* st, cudaStream_t stream);
void order_after_nccl_op(CommState* st, cudaStream_t stream);

// Before a routed all-gather's plan is issued on `streams` (kDirectStreams, index 0 unused):
// they wait for the communicator's last forwarded operation, if one came since the previous
// routed op. Called with st.issue_mu held. CUDA_SUCCESS or the driver's error.
CUresult order_routed_op(CommState& st, const CUstream* streams);
// The routed all-gather was issued (its push stream recorded its end event).
void routed_op_issued(CommState& st);

// Forwards `call` to NCCL in the communicator's order (the two calls above around it).
template <typename Call>
ncclResult_t in_comm_order(CommState* st, cudaStream_t stream, Call call) {
  order_before_nccl_op(st, stream);
  const ncclResult_t r = call();
  if (r == ncclSuccess || r == ncclInProgress) order_after_nccl_op(st, stream);
  return r;
}

}  // namespace zc
