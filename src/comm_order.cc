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

// Runs fn(ce, cu) for an op on `stream` that keeps the order, once the route is prepared: under
// the communicator's issue lock, its device current.
template <typename Fn>
void on_prepared_route(CommState* st, cudaStream_t stream, Fn fn) {
  if (!ordered(st, stream)) return;
  std::lock_guard<std::mutex> lock(st->issue_mu);
  CeComm* ce = st->ce.get();
  const CudaDriver* cu = cuda_driver();
  if (!ce || !ce->prepared || !cu) return;
  ScopedDevice dev(st->device);
  if (dev.ok()) fn(*ce, *cu);
}

}  // namespace

void order_before_nccl_op(CommState* st, cudaStream_t stream) {
  on_prepared_route(st, stream, [&](CeComm& ce, const CudaDriver& cu) {
    // The end event of the last routed op: re-recorded by every routed op, so this waits for
    // the latest one, as NCCL's launch waits for the communicator's previous kernel.
    if (!ce.routed_pending || cu.cuStreamWaitEvent(reinterpret_cast<CUstream>(stream),
                                                   ce.events[kEvEnd], 0) != CUDA_SUCCESS)
      return;
    ce.routed_pending = false;
    ZC_DEBUG("comm order on rank %d: an op forwarded to NCCL waits for routed all-gather %llu",
             st->rank, static_cast<unsigned long long>(ce.seq));
  });
}

void order_after_nccl_op(CommState* st, cudaStream_t stream) {
  on_prepared_route(st, stream, [&](CeComm& ce, const CudaDriver& cu) {
    // On failure the next routed op waits for the last end marked, if any.
    if (!ce.nccl_tail ||
        cu.cuEventRecord(ce.nccl_tail, reinterpret_cast<CUstream>(stream)) != CUDA_SUCCESS)
      return;
    ce.nccl_pending = true;
    ZC_DEBUG("comm order on rank %d: an op forwarded to NCCL marks its end", st->rank);
  });
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
