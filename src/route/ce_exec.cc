#include "ce_exec.h"

#include "capture_blocks.h"
#include "stream_phase_times.h"

namespace zc {
namespace {

bool is_mem_op(DirectOpKind k) {
  return k == DirectOpKind::kWaitGeq || k == DirectOpKind::kWaitSignal || k == DirectOpKind::kWrite;
}

CUstreamBatchMemOpParams mem_op(const DirectOp& op) {
  if (op.kind == DirectOpKind::kWaitGeq) return flag_wait_op(op.dst, op.value);
  if (op.kind == DirectOpKind::kWrite) return flag_write_op(op.dst, op.value);
  // kWaitSignal: a captured op's word (capture_blocks.h), signalled or released.
  return word_wait_any_op(op.dst, kCaptureWaitMask);
}

// A copy, an event record or an event wait on `s`; `event` is the one the op names.
// One cuMemcpyAsync per copy but for an eager op's pushes (push_batch): measured on H200
// (driver 580), a batch's copies and those of a batch on another stream of the same GPU run one
// after the other, so a pair's push and pull as two batches took twice as long (190 GB/s busbw
// at 256 MiB in place, against 380 for two plain copies on two streams). A batch cannot be
// captured either.
CUresult stream_op(const CudaDriver& cu, const DirectOp& op, CUstream s, CUevent event) {
  switch (op.kind) {
    case DirectOpKind::kCopy:
      return cu.cuMemcpyAsync(op.dst, op.src, op.bytes, s);
    case DirectOpKind::kRecord:
      return cu.cuEventRecord(event, s);
    case DirectOpKind::kWaitEvent:
      return cu.cuStreamWaitEvent(s, event, 0);
    default:  // flag operations go in batches (issue_plan)
      return CUDA_ERROR_INVALID_VALUE;
  }
}

}  // namespace

CUstreamBatchMemOpParams flag_wait_op(uint64_t flag, uint32_t value) {
  CUstreamBatchMemOpParams p{};
  p.waitValue.operation = CU_STREAM_MEM_OP_WAIT_VALUE_32;
  p.waitValue.address = flag;
  p.waitValue.value = value;
  p.waitValue.flags = CU_STREAM_WAIT_VALUE_GEQ;
  return p;
}

CUstreamBatchMemOpParams word_wait_any_op(uint64_t word, uint64_t mask) {
  CUstreamBatchMemOpParams p{};
  p.waitValue.operation = CU_STREAM_MEM_OP_WAIT_VALUE_64;
  p.waitValue.address = word;
  p.waitValue.value64 = mask;
  p.waitValue.flags = CU_STREAM_WAIT_VALUE_AND;
  return p;
}

CUstreamBatchMemOpParams flag_write_op(uint64_t flag, uint32_t value) {
  CUstreamBatchMemOpParams p{};
  p.writeValue.operation = CU_STREAM_MEM_OP_WRITE_VALUE_32;
  p.writeValue.address = flag;
  p.writeValue.value = value;
  p.writeValue.flags = CU_STREAM_WRITE_VALUE_DEFAULT;
  return p;
}

CUresult issue_copies(const CudaDriver& cu, CUdeviceptr* dsts, CUdeviceptr* srcs, size_t* sizes,
                      size_t n, CUstream s) {
  if (n == 1) return cu.cuMemcpyAsync(dsts[0], srcs[0], sizes[0], s);
  CUmemcpyAttributes attr{};
  attr.srcAccessOrder = CU_MEMCPY_SRC_ACCESS_ORDER_STREAM;
  attr.flags = CU_MEMCPY_FLAG_PREFER_OVERLAP_WITH_COMPUTE;
  size_t attr_index = 0;
  return cu.cuMemcpyBatchAsync(dsts, srcs, sizes, n, &attr, &attr_index, 1, s);
}

CUresult issue_plan(const CudaDriver& cu, const CUstream streams[kDirectStreams],
                    const CUevent events[kDirectEvents], CUstream user_stream,
                    const std::vector<DirectOp>& plan, bool batch_pushes) {
  batch_pushes = batch_pushes && cu.cuMemcpyBatchAsync;
  CUstreamBatchMemOpParams batch[kMaxMemOps];
  phase_begin(cu, plan);
  for (size_t i = 0; i < plan.size(); ++i) {
    const DirectOp& op = plan[i];
    CUstream s =
        op.stream == DirectStream::kUser ? user_stream : streams[static_cast<int>(op.stream)];
    CUresult r = CUDA_SUCCESS;
    switch (op.kind) {
      // A stream's consecutive flag waits and writes in one call: measured on H200 (driver 580,
      // 4 ranks), one cuStreamWaitValue32 took 9 us of host time and one cuStreamWriteValue32
      // 6 us, most of the time an op spent issuing its plan.
      case DirectOpKind::kWaitGeq:
      case DirectOpKind::kWaitSignal:
      case DirectOpKind::kWrite: {
        unsigned n = 0;
        while (n < kMaxMemOps && i + n < plan.size() && is_mem_op(plan[i + n].kind) &&
               plan[i + n].stream == op.stream) {
          batch[n] = mem_op(plan[i + n]);
          ++n;
        }
        r = cu.cuStreamBatchMemOp(s, n, batch, 0);
        i += n - 1;
        break;
      }
      case DirectOpKind::kCopy:
        if (batch_pushes && op.stream == DirectStream::kPush) {
          r = issue_copy_run(cu, plan, i, DirectOpKind::kCopy, s, &i);
          break;
        }
        [[fallthrough]];
      default:
        r = stream_op(cu, op, s, events[op.event]);
        break;
    }
    if (r != CUDA_SUCCESS) return r;
    phase_after(cu, plan, i, s);
  }
  phase_end();
  return CUDA_SUCCESS;
}

}  // namespace zc
