// Issues a reduce-scatter plan (reduce_scatter_plan.h) with CUDA driver calls: the pulls as
// copies (a slice's in one batch), flag waits and writes as stream memory operations (a stream's
// consecutive ones in one batch), events, and each slice's sum as one launch of the reduction
// kernel (chunk_sum.h).
#pragma once

#include <cuda.h>

#include <vector>

#include "chunk_sum.h"
#include "cuda_driver.h"
#include "reduce_scatter_plan.h"

namespace zc {

// How an op's slices are summed: the kernels loaded in the op's context, the element type and
// size, a pre-multiplied sum's scale (chunk_sum.h), and the CTAs each launch gets. Where the
// ranks bring scalars of their own (the plan's kSum has `scalars`), this rank's is at
// `own_scale_at` (a device-resident scalar) or `scale_bits` (host-immediate, own_scale_at 0),
// and each peer's where the plan says.
struct RsSum {
  const ChunkSumKernels* kernels = nullptr;
  ChunkType type = ChunkType::kF32;
  uint64_t elem = 4;
  bool premul = false;
  unsigned scale_bits = 0;
  uint64_t own_scale_at = 0;
  unsigned ctas = 0;
};

// Issues `plan` with RsStream::kUser mapped to `user_stream`; `batch_copies` (not for a capture:
// the batch API cannot be captured) issues a stream's consecutive copies in one call where the
// driver has it. Returns CUDA_SUCCESS or the first error (the caller then poisons the
// communicator: peers may already depend on what was issued).
CUresult issue_rs_plan(const CudaDriver& cu, const CUstream streams[kRsStreams],
                       const CUevent events[kRsEvents], CUstream user_stream,
                       const std::vector<RsOp>& plan, const RsSum& sum, bool batch_copies);

}  // namespace zc
