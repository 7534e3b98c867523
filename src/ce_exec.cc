#include "ce_exec.h"

#include <optional>

#include "capture_blocks.h"
#include "stream_phase_times.h"

namespace zc {
namespace {

// A batch holds fewer than 256 operations (cuda.h).
constexpr unsigned kMaxMemOps = 255;

bool is_mem_op(DirectOpKind k) {
  return k == DirectOpKind::kWaitGeq || k == DirectOpKind::kWaitSignal || k == DirectOpKind::kWrite;
}

// The flags are host memory every member registered (op_exchange.h): stream memory operations
// on them are local ones, which CUDA 13.1 drivers still allow.
CUstreamBatchMemOpParams mem_op(const DirectOp& op) {
  CUstreamBatchMemOpParams p{};
  switch (op.kind) {
    case DirectOpKind::kWaitGeq:
      p.waitValue.operation = CU_STREAM_MEM_OP_WAIT_VALUE_32;
      p.waitValue.address = op.dst;
      p.waitValue.value = op.value;
      p.waitValue.flags = CU_STREAM_WAIT_VALUE_GEQ;
      break;
    case DirectOpKind::kWaitSignal:  // a captured op's word (capture_blocks.h): signal or release
      p.waitValue.operation = CU_STREAM_MEM_OP_WAIT_VALUE_64;
      p.waitValue.address = op.dst;
      p.waitValue.value64 = kCaptureWaitMask;
      p.waitValue.flags = CU_STREAM_WAIT_VALUE_AND;
      break;
    default:  // kWrite
      p.writeValue.operation = CU_STREAM_MEM_OP_WRITE_VALUE_32;
      p.writeValue.address = op.dst;
      p.writeValue.value = op.value;
      p.writeValue.flags = CU_STREAM_WRITE_VALUE_DEFAULT;
      break;
  }
  return p;
}

// A copy, an event record or an event wait on `s`; `event` is the one the op names.
// One cuMemcpyAsync per copy, not a cuMemcpyBatchAsync: measured on H200 (driver 580), a
// batch's copies and those of a batch on another stream of the same GPU run one after the
// other, so the push and the pull of a pair took twice as long (190 GB/s busbw at 256 MiB in
// place, against 380 for two plain copies on two streams); and a stream's pushes to its 3
// peers as one batch ran no faster than 3 copies (4 H200s, 380 GB/s busbw at 1 GiB either
// way). A batch cannot be captured either.
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

CUresult issue_plan(const CudaDriver& cu, const CUstream streams[kDirectStreams],
                    const CUevent events[kDirectEvents], CUstream user_stream,
                    const std::vector<DirectOp>& plan) {
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

CUresult issue_local_group_plan(const CudaDriver& cu, const LocalGroupRankIssue* ranks,
                                const std::vector<LocalGroupStep>& plan) {
  std::optional<ScopedDevice> dev;
  int current = -1;
  for (const LocalGroupStep& step : plan) {
    const LocalGroupRankIssue& r = ranks[step.rank];
    if (step.rank != current) {
      dev.reset();  // back to the caller's context first: each scope restores what it found
      dev.emplace(r.device);
      if (!dev->ok()) return CUDA_ERROR_INVALID_CONTEXT;
      current = step.rank;
    }
    const DirectOp& op = step.op;
    CUstream s = op.stream == DirectStream::kUser ? r.user : r.streams[static_cast<int>(op.stream)];
    // No flags in it: stream_op refuses them.
    if (CUresult res = stream_op(cu, op, s, ranks[step.event_rank].events[op.event]);
        res != CUDA_SUCCESS)
      return res;
  }
  return CUDA_SUCCESS;
}

}  // namespace zc
