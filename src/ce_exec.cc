#include "ce_exec.h"

namespace zc {

namespace {

// Copies to be issued as one cuMemcpyBatchAsync (ce_plan.h: adjacent copies of one stream).
// Bounded so that a batch never allocates; a longer run is split, which only costs time.
struct Batch {
  static constexpr size_t kMax = 2 * kMaxRanks;
  CUdeviceptr dst[kMax], src[kMax];
  size_t bytes[kMax];
  size_t count = 0;
  CUstream stream = nullptr;
  PlanOpKind kind = PlanOpKind::kCopy;
};

CUresult flush(const CudaDriver& cu, Batch* b) {
  if (b->count == 0) return CUDA_SUCCESS;
  CUmemcpyAttributes attr{};
  attr.srcAccessOrder = CU_MEMCPY_SRC_ACCESS_ORDER_STREAM;
  attr.flags = CU_MEMCPY_FLAG_PREFER_OVERLAP_WITH_COMPUTE;
  size_t attr_index = 0;
  const CUresult r =
      cu.cuMemcpyBatchAsync(b->dst, b->src, b->bytes, b->count, &attr, &attr_index, 1, b->stream);
  b->count = 0;
  return r;
}

}  // namespace

CUresult issue_plan(const CudaDriver& cu, const CUstream streams[kPlanStreams],
                    const CUevent events[kPlanEvents], CUstream user_stream,
                    const std::vector<PlanOp>& plan, bool batch_copies) {
  const bool batch = batch_copies && cu.cuMemcpyBatchAsync != nullptr;
  Batch pending;
  for (const PlanOp& op : plan) {
    CUstream s =
        op.stream == PlanStream::kUser ? user_stream : streams[static_cast<int>(op.stream)];
    const bool copy = op.kind == PlanOpKind::kCopy || op.kind == PlanOpKind::kSignal;
    // A run of adjacent copies (or of signals) on one stream becomes one batch; anything else
    // first issues the batch so far, keeping every stream's order.
    if (pending.count > 0 &&
        (!copy || s != pending.stream || op.kind != pending.kind || pending.count == Batch::kMax)) {
      if (CUresult r = flush(cu, &pending); r != CUDA_SUCCESS) return r;
    }
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
        if (batch) {
          pending.dst[pending.count] = op.dst;
          pending.src[pending.count] = op.src;
          pending.bytes[pending.count] = op.bytes;
          pending.stream = s;
          pending.kind = op.kind;
          ++pending.count;
        } else {
          r = cu.cuMemcpyAsync(op.dst, op.src, op.bytes, s);
        }
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
  return flush(cu, &pending);
}

}  // namespace zc
