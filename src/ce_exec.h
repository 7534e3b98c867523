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
// `streams`/`events` are the eager or the capture set of the comm. `batch_copies`: issue each
// run of adjacent copies (or signals) of one stream as one cuMemcpyBatchAsync marked "prefer
// overlap with compute", which the driver spreads over several copy engines (not allowed
// during graph capture or on the legacy stream; then one cuMemcpyAsync per copy, in order).
CUresult issue_plan(const CudaDriver& cu, const CUstream streams[kPlanStreams],
                    const CUevent events[kPlanEvents], CUstream user_stream,
                    const std::vector<PlanOp>& plan, bool batch_copies);

}  // namespace zc
