#include "ce_exec.h"

#include "capture_blocks.h"

namespace zc {

CUresult issue_plan(const CudaDriver& cu, const CUstream streams[kDirectStreams],
                    const CUevent events[kDirectEvents], CUstream user_stream,
                    const std::vector<DirectOp>& plan) {
  for (const DirectOp& op : plan) {
    CUstream s =
        op.stream == DirectStream::kUser ? user_stream : streams[static_cast<int>(op.stream)];
    CUresult r = CUDA_SUCCESS;
    switch (op.kind) {
      // The flags are host memory every member registered (op_exchange.h): stream memory
      // operations on them are local ones, which CUDA 13.1 drivers still allow.
      case DirectOpKind::kWaitGeq:
        r = cu.cuStreamWaitValue32(s, op.dst, op.value, CU_STREAM_WAIT_VALUE_GEQ);
        break;
      // A captured op's word (capture_blocks.h): its signal or its release.
      case DirectOpKind::kWaitSignal:
        r = cu.cuStreamWaitValue64(s, op.dst, kCaptureWaitMask, CU_STREAM_WAIT_VALUE_AND);
        break;
      case DirectOpKind::kWrite:
        r = cu.cuStreamWriteValue32(s, op.dst, op.value, CU_STREAM_WRITE_VALUE_DEFAULT);
        break;
      // One cuMemcpyAsync per copy, not a cuMemcpyBatchAsync: measured on H200 (driver 580),
      // a batch's copies and those of a batch on another stream of the same GPU run one after
      // the other, so the push and the pull of a pair took twice as long (190 GB/s busbw at
      // 256 MiB in place, against 380 for two plain copies on two streams).
      case DirectOpKind::kCopy:
        r = cu.cuMemcpyAsync(op.dst, op.src, op.bytes, s);
        break;
      case DirectOpKind::kRecord:
        r = cu.cuEventRecord(events[op.event], s);
        break;
      case DirectOpKind::kWaitEvent:
        r = cu.cuStreamWaitEvent(s, events[op.event], 0);
        break;
    }
    if (r != CUDA_SUCCESS) return r;
  }
  return CUDA_SUCCESS;
}

}  // namespace zc
