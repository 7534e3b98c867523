// Issues a zero-copy all-gather plan (direct_plan.h) with CUDA driver calls: no kernels, only
// copies, stream memory operations on host-mapped flags, and events.
#pragma once

#include <cuda.h>

#include <vector>

#include "cuda_driver.h"
#include "direct_plan.h"

namespace zc {

// Issues `plan` with kUser mapped to `user_stream`; `batch_pushes` (not for a capture: the batch
// API cannot be captured) issues the push stream's consecutive copies in one call where the
// driver has it. Returns CUDA_SUCCESS or the first error (the caller then poisons the
// communicator: peers may already depend on what was issued).
CUresult issue_plan(const CudaDriver& cu, const CUstream streams[kDirectStreams],
                    const CUevent events[kDirectEvents], CUstream user_stream,
                    const std::vector<DirectOp>& plan, bool batch_pushes);

}  // namespace zc
