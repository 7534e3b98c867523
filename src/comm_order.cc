#include "comm_order.h"

#include <mutex>

#include "ce_allgather.h"
#include "group_state.h"
#include "log.h"

namespace zc {
namespace {

// Whether the operation on `stream` is ordered with the routed ones: a prepared route, no group
// (NCCL launches grouped operations at the group's end), no capture (a graph's nodes are ordered
// by the graph).
bool ordered(const CommState* st, cudaStream_t stream) {
  if (!st || st->route.load(std::memory_order_acquire) != RouteState::kCommitted) return false;
  const GroupState& g = group_state();
  if (g.depth > 0 || g.running_deferred) return false;
  return !stream_is_capturing(reinterpret_cast<CUstream>(stream));
}

}  // namespace

void order_before_nccl_op(CommState* st, cudaStream_t stream) {
  if (!ordered(st, stream)) return;
  std::lock_guard<std::mutex> lock(st->issue_mu);
  CeComm* ce = st->ce.get();
  const CudaDriver* cu = cuda_driver();
  if (!ce || !ce->prepared || !cu || !ce->routed_pending) return;
  ScopedDevice dev(st->device);
  // The end event of the last routed op: re-recorded by every routed op, so this waits for the
  // latest one, as NCCL's launch waits for the communicator's previous kernel.
  if (dev.ok() && cu->cuStreamWaitEvent(reinterpret_cast<CUstream>(stream), ce->events[kEvEnd],
                                        0) == CUDA_SUCCESS) {
    ce->routed_pending = false;
    ZC_DEBUG("comm order on rank %d: an op forwarded to NCCL waits for routed all-gather %llu",
             st->rank, static_cast<unsigned long long>(ce->seq));
  }
}

void order_after_nccl_op(CommState* st, cudaStream_t stream) {
  if (!ordered(st, stream)) return;
  std::lock_guard<std::mutex> lock(st->issue_mu);
  CeComm* ce = st->ce.get();
  const CudaDriver* cu = cuda_driver();
  if (!ce || !ce->prepared || !cu || !ce->nccl_tail) return;
  ScopedDevice dev(st->device);
  if (!dev.ok() ||
      cu->cuEventRecord(ce->nccl_tail, reinterpret_cast<CUstream>(stream)) != CUDA_SUCCESS)
    return;  // the next routed op waits for the last end marked, if any
  ce->nccl_pending = true;
  ZC_DEBUG("comm order on rank %d: an op forwarded to NCCL marks its end", st->rank);
}

CUresult order_routed_op(CommState& st, const CUstream* streams) {
  CeComm& ce = *st.ce;
  const CudaDriver& cu = *cuda_driver();
  if (!ce.nccl_pending) return CUDA_SUCCESS;
  for (int k = 1; k < kDirectStreams; ++k)
    if (CUresult r = cu.cuStreamWaitEvent(streams[k], ce.nccl_tail, 0); r != CUDA_SUCCESS) return r;
  ce.nccl_pending = false;
  ZC_DEBUG(
      "comm order on rank %d: routed all-gather %llu waits for the op forwarded to NCCL "
      "before it",
      st.rank, static_cast<unsigned long long>(ce.seq));
  return CUDA_SUCCESS;
}

void routed_op_issued(CommState& st) { st.ce->routed_pending = true; }

}  // namespace zc
