#include "ce_exec.h"

namespace zc {

namespace {

CUresult copy_on_engine(const CudaDriver& cu, CUdeviceptr dst, CUdeviceptr src, size_t bytes,
                        CUstream s) {
  CUmemcpyAttributes attr{};
  attr.srcAccessOrder = CU_MEMCPY_SRC_ACCESS_ORDER_STREAM;
  attr.flags = CU_MEMCPY_FLAG_PREFER_OVERLAP_WITH_COMPUTE;
  size_t attr_index = 0;
  return cu.cuMemcpyBatchAsync(&dst, &src, &bytes, 1, &attr, &attr_index, 1, s);
}

}  // namespace

CUresult issue_plan(const CudaDriver& cu, const CUstream streams[kPlanStreams],
                    const CUevent events[kPlanEvents], CUstream user_stream,
                    const std::vector<PlanOp>& plan, bool batch_copies) {
  const bool batch = batch_copies && cu.cuMemcpyBatchAsync != nullptr;
  for (const PlanOp& op : plan) {
    CUstream s =
        op.stream == PlanStream::kUser ? user_stream : streams[static_cast<int>(op.stream)];
    CUresult r = CUDA_SUCCESS;
    switch (op.kind) {
      case PlanOpKind::kWaitEq1:
        r = cu.cuStreamWaitValue32(s, op.dst, 1, CU_STREAM_WAIT_VALUE_EQ);
        break;
      case PlanOpKind::kWrite0:
        r = cu.cuStreamWriteValue32(s, op.dst, 0, CU_STREAM_WRITE_VALUE_DEFAULT);
        break;
      case PlanOpKind::kCopy:
      case PlanOpKind::kSignal:
        // Peer flags are written by a 4-byte copy, not cuStreamWriteValue32: remote stream
        // memory writes are gone from CUDA 13.1 drivers.
        r = batch ? copy_on_engine(cu, op.dst, op.src, op.bytes, s)
                  : cu.cuMemcpyAsync(op.dst, op.src, op.bytes, s);
        break;
      case PlanOpKind::kRecord:
        r = cu.cuEventRecord(events[op.event], s);
        break;
      case PlanOpKind::kWaitEvent:
        r = cu.cuStreamWaitEvent(s, events[op.event], 0);
        break;
    }
    if (r != CUDA_SUCCESS) return r;
  }
  return CUDA_SUCCESS;
}

}  // namespace zc
