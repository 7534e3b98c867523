#include "ce_exec.h"

#include "capture_blocks.h"

#include <vector>

namespace zc {

CUresult issue_plan(const CudaDriver& cu, const CUstream streams[kDirectStreams],
                    const CUevent events[kDirectEvents], CUstream user_stream,
                    const std::vector<DirectOp>& plan, bool capturing) {
  (void)capturing;
  for (size_t i = 0; i < plan.size(); ++i) {
    const DirectOp& op = plan[i];
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
      case DirectOpKind::kCopy: {
#ifdef ZC_BATCH_PEER_COPIES
        // Experiment (a build with -DZC_BATCH_PEER_COPIES; no setting): a stream's consecutive
        // copies (a rank's pushes to its peers, in the plan's rotated order) in one batch,
        // which the driver may spread over its copy engines. On 4 H200s in rank order it
        // changed nothing (docs/PERFORMANCE.md, "Three and four GPUs").
        size_t n = 1;
        while (!capturing && cu.cuMemcpyBatchAsync && i + n < plan.size() &&
               plan[i + n].kind == DirectOpKind::kCopy && plan[i + n].stream == op.stream)
          ++n;
        if (n > 1) {
          std::vector<CUdeviceptr> dsts(n), srcs(n);
          std::vector<size_t> sizes(n);
          for (size_t k = 0; k < n; ++k) {
            dsts[k] = plan[i + k].dst;
            srcs[k] = plan[i + k].src;
            sizes[k] = plan[i + k].bytes;
          }
          CUmemcpyAttributes attr{};
          attr.srcAccessOrder = CU_MEMCPY_SRC_ACCESS_ORDER_STREAM;
          size_t attr_index = 0, failed = 0;
          r = cu.cuMemcpyBatchAsync(dsts.data(), srcs.data(), sizes.data(), n, &attr,
                                    &attr_index, 1, &failed, s);
          i += n - 1;
          break;
        }
#endif
        r = cu.cuMemcpyAsync(op.dst, op.src, op.bytes, s);
        break;
      }
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
