// Issues a copy-engine plan with CUDA driver calls: no kernels, only copies, stream memory
// operations on local flags and events.
#pragma once

#include <cuda.h>

#include <vector>

#include "ce_plan.h"
#include "comm_state.h"

namespace zc {

// Issues `plan` with kUser mapped to `user_stream`. Returns CUDA_SUCCESS or the first error
// (the caller then poisons the communicator: peers may already depend on what was issued).
// `streams`/`events` are the eager or the capture set of the comm.
CUresult issue_plan(const CudaDriver& cu, const CUstream streams[3], const CUevent events[3],
                    CUstream user_stream, const std::vector<PlanOp>& plan);

}  // namespace zc
