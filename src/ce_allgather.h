// zerocta's own copy-engine all-gather on an agreed pool (see ce_plan.h for the protocol).
#pragma once

#include <cuda.h>
#include <nccl.h>

#include "comm_state.h"

namespace zc {

// Issues the all-gather on `stream`. On a CUDA error after the first operation was issued the
// communicator is poisoned (peers may already wait on us) and the error is returned.
// `capturing`: the stream is being captured into a CUDA graph; the op then uses the graph
// slot range and the comm's capture streams, which join the capture through events.
ncclResult_t ce_allgather(CommState& st, const void* sendbuff, void* recvbuff,
                          uint64_t bytes_per_rank, CUstream stream, bool capturing);

// Whether `stream` is being captured into a CUDA graph (false when it cannot be queried).
bool stream_is_capturing(CUstream stream);

}  // namespace zc
