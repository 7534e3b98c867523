#include "rs_exec.h"

#include "capture_blocks.h"
#include "ce_exec.h"

namespace zc {
namespace {

bool is_flag_op(RsOpKind k) {
  return k == RsOpKind::kWaitGeq || k == RsOpKind::kWrite || k == RsOpKind::kWaitToken;
}

CUstreamBatchMemOpParams flag_op(const RsOp& f) {
  if (f.kind == RsOpKind::kWrite) return flag_write_op(f.dst, f.value);
  if (f.kind == RsOpKind::kWaitGeq) return flag_wait_op(f.dst, f.value);
  // A token (capture_blocks.h): its state in the low half, or the release in the high one.
  return word_wait_any_op(f.dst, CaptureBlocks::kReleaseBit | f.value);
}

CUresult launch_sum(const CudaDriver& cu, const RsOp& op, const RsSum& sum, CUstream s) {
  if (!sum.kernels || op.nsrc > kChunkSumMaxSources || op.bytes % sum.elem != 0)
    return CUDA_ERROR_INVALID_VALUE;
  ChunkSumArgs a;
  a.src[0] = reinterpret_cast<const void*>(op.src);
  for (int k = 1; k < op.nsrc; ++k)
    a.src[k] = reinterpret_cast<const void*>(op.aux + static_cast<uint64_t>(k - 1) * op.stride);
  a.dst = reinterpret_cast<void*>(op.dst);
  a.count = op.bytes / sum.elem;
  a.nsrc = op.nsrc;
  a.premul = sum.premul;
  a.scale_bits = sum.scale_bits;
  if (op.scalars != 0) {
    a.scale_at[0] = reinterpret_cast<const void*>(sum.own_scale_at);  // null: scale_bits
    for (int k = 1; k < op.nsrc; ++k)
      a.scale_at[k] = reinterpret_cast<const void*>(op.scalars + static_cast<uint64_t>(k - 1) *
                                                                     kRsScalarWordBytes);
  }
  return sum.kernels->launch(cu, sum.type, a, sum.ctas, s);
}

}  // namespace

CUresult issue_rs_plan(const CudaDriver& cu, const CUstream streams[kRsStreams],
                       const CUevent events[kRsEvents], CUstream user_stream,
                       const std::vector<RsOp>& plan, const RsSum& sum, bool batch_copies) {
  batch_copies = batch_copies && cu.cuMemcpyBatchAsync;
  CUstreamBatchMemOpParams batch[kMaxMemOps];
  for (size_t i = 0; i < plan.size(); ++i) {
    const RsOp& op = plan[i];
    const CUstream s =
        op.stream == RsStream::kUser ? user_stream : streams[static_cast<int>(op.stream)];
    CUresult r = CUDA_SUCCESS;
    switch (op.kind) {
      case RsOpKind::kWaitGeq:
      case RsOpKind::kWaitToken:
      case RsOpKind::kWrite: {
        unsigned n = 0;
        while (n < kMaxMemOps && i + n < plan.size() && is_flag_op(plan[i + n].kind) &&
               plan[i + n].stream == op.stream) {
          batch[n] = flag_op(plan[i + n]);
          ++n;
        }
        r = cu.cuStreamBatchMemOp(s, n, batch, 0);
        i += n - 1;
        break;
      }
      case RsOpKind::kCopy:
        r = batch_copies ? issue_copy_run(cu, plan, i, RsOpKind::kCopy, s, &i)
                         : cu.cuMemcpyAsync(op.dst, op.src, op.bytes, s);
        break;
      case RsOpKind::kSum:
        r = launch_sum(cu, op, sum, s);
        break;
      case RsOpKind::kRecord:
        r = cu.cuEventRecord(events[op.event], s);
        break;
      case RsOpKind::kWaitEvent:
        r = cu.cuStreamWaitEvent(s, events[op.event], 0);
        break;
    }
    if (r != CUDA_SUCCESS) return r;
  }
  return CUDA_SUCCESS;
}

}  // namespace zc
