// Issues a zero-copy all-gather plan (direct_plan.h) with CUDA driver calls: no kernels, only
// copies, stream memory operations on host-mapped flags, and events.
#pragma once

#include <cuda.h>

#include <vector>

#include "cuda_driver.h"
#include "direct_plan.h"

namespace zc {

// A batch of stream memory operations holds fewer than 256 (cuda.h).
constexpr unsigned kMaxMemOps = 255;
// A wait until the 32-bit flag at `flag`, as a wrapping counter, is >= `value`, and a write of
// `value` to it, as stream memory operations (the flags are host memory every member registered,
// op_exchange.h: local operations, which CUDA 13.1 drivers still allow).
CUstreamBatchMemOpParams flag_wait_op(uint64_t flag, uint32_t value);
CUstreamBatchMemOpParams flag_write_op(uint64_t flag, uint32_t value);
// A wait until the 64-bit word at `word` has any bit of `mask` set: a captured op's word
// (capture_blocks.h), its state in the low half or its release in the high one.
CUstreamBatchMemOpParams word_wait_any_op(uint64_t word, uint64_t mask);
// `n` copies on `s` in one cuMemcpyBatchAsync (the driver must have it) with the attributes NCCL's
// copy-engine collectives use (stream order, prefer overlap with compute); one cuMemcpyAsync for
// one copy.
CUresult issue_copies(const CudaDriver& cu, CUdeviceptr* dsts, CUdeviceptr* srcs, size_t* sizes,
                      size_t n, CUstream s);

// The run of copies on plan[i]'s stream from plan[i] on (at most kMaxRanks) in one batch
// (issue_copies); *last is set to the run's last index. One driver call a run instead of one a
// peer: measured on 4 H200s, an in-place all-gather 2-4 us shorter at 64 MiB-1 GiB on 4 ranks
// (docs/PERFORMANCE.md). `Op` is a plan's operation (DirectOp, RsOp): kind, stream, dst, src,
// bytes; `copy` its copy kind.
template <typename Op, typename Kind>
CUresult issue_copy_run(const CudaDriver& cu, const std::vector<Op>& plan, size_t i, Kind copy,
                        CUstream s, size_t* last) {
  CUdeviceptr dsts[kMaxRanks], srcs[kMaxRanks];
  size_t sizes[kMaxRanks];
  size_t n = 0;
  while (n < kMaxRanks && i + n < plan.size() && plan[i + n].kind == copy &&
         plan[i + n].stream == plan[i].stream) {
    dsts[n] = plan[i + n].dst;
    srcs[n] = plan[i + n].src;
    sizes[n] = plan[i + n].bytes;
    ++n;
  }
  *last = i + n - 1;
  return issue_copies(cu, dsts, srcs, sizes, n, s);
}

// Issues `plan` with kUser mapped to `user_stream`; `batch_pushes` (not for a capture: the batch
// API cannot be captured) issues the push stream's consecutive copies in one call where the
// driver has it. Returns CUDA_SUCCESS or the first error (the caller then poisons the
// communicator: peers may already depend on what was issued).
CUresult issue_plan(const CudaDriver& cu, const CUstream streams[kDirectStreams],
                    const CUevent events[kDirectEvents], CUstream user_stream,
                    const std::vector<DirectOp>& plan, bool batch_pushes);

}  // namespace zc
