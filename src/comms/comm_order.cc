#include "comm_order.h"

#include <mutex>

#include "cuda_driver.h"
#include "group_state.h"
#include "log.h"

namespace zc {
namespace {

// Whether an op on `stream` can keep the order with the routed ones: a committed route, not one
// of the ops a group's end runs on the route's behalf (inside an NCCL group of zerocta's own,
// some while holding the issue lock), no capture (a graph's nodes are ordered by the graph).
bool orderable(const CommState* st, cudaStream_t stream) {
  if (!st || st->route.load(std::memory_order_acquire) != RouteState::kCommitted) return false;
  if (group_state().running_deferred) return false;
  return !stream_is_capturing(reinterpret_cast<CUstream>(stream));
}

// Runs fn(ce, cu) once the route is prepared: under the communicator's issue lock, its device
// current. Whether it ran.
template <typename Fn>
bool on_prepared_route(CommState& st, Fn fn) {
  std::lock_guard<std::mutex> lock(st.issue_mu);
  CeComm* ce = st.ce.get();
  const CudaDriver* cu = cuda_driver();
  if (!ce || !ce->prepared || !cu) return false;
  ScopedDevice dev(st.device);
  if (!dev.ok()) return false;
  fn(*ce, *cu);
  return true;
}

// The end of what NCCL enqueued on `stream`, which the next routed op waits for.
void mark_nccl_end(CommState& st, cudaStream_t stream) {
  on_prepared_route(st, [&](CeComm& ce, const CudaDriver& cu) {
    // On failure the next routed op waits for the last end marked, if any.
    if (!ce.nccl_tail ||
        cu.cuEventRecord(ce.nccl_tail, reinterpret_cast<CUstream>(stream)) != CUDA_SUCCESS)
      return;
    ce.nccl_pending = true;
    ZC_DEBUG("comm order on rank %d: an op forwarded to NCCL marks its end", st.rank);
  });
}

// The wait of an op forwarded to NCCL on `stream` for the communicator's last routed op. Whether
// the route is prepared (else there is nothing to order).
bool wait_for_routed_op(CommState& st, cudaStream_t stream) {
  return on_prepared_route(st, [&](CeComm& ce, const CudaDriver& cu) {
    // The end event of the last routed op: re-recorded by every routed op, so this waits for
    // the latest one, as NCCL's launch waits for the communicator's previous kernel.
    if (!ce.routed_pending || cu.cuStreamWaitEvent(reinterpret_cast<CUstream>(stream),
                                                   ce.events[kEvEnd], 0) != CUDA_SUCCESS)
      return;
    ce.routed_pending = false;
    ZC_DEBUG("comm order on rank %d: an op forwarded to NCCL waits for routed all-gather %llu",
             st.rank, static_cast<unsigned long long>(ce.seq));
  });
}

}  // namespace

void order_before_nccl_op(const std::shared_ptr<CommState>& st, cudaStream_t stream) {
  GroupState& g = group_state();
  if (g.depth > 0 && !g.running_deferred) {
    // Grouped: nothing now (no call inside the application's group); the group's end orders
    // it, on the stream of the communicator's last op in the group.
    if (!st || st->route.load(std::memory_order_acquire) != RouteState::kCommitted) return;
    for (auto& [comm, last_stream] : g.ordered_forwards)
      if (comm == st) {
        last_stream = stream;
        return;
      }
    g.ordered_forwards.emplace_back(st, stream);
    return;
  }
  if (orderable(st.get(), stream)) wait_for_routed_op(*st, stream);
}

void order_after_nccl_op(const std::shared_ptr<CommState>& st, cudaStream_t stream) {
  // Grouped, NCCL has enqueued nothing yet: order_after_group_end marks it.
  if (group_state().depth > 0 || !orderable(st.get(), stream)) return;
  mark_nccl_end(*st, stream);
}

void order_before_group_end() {
  GroupState& g = group_state();
  auto grouped = std::move(g.ordered_forwards);
  g.ordered_forwards.clear();
  // NCCL's launch at its end joins every stream of the group: a wait on one of the
  // communicator's streams orders all of its grouped ops.
  for (auto& entry : grouped)
    if (orderable(entry.first.get(), entry.second) &&
        wait_for_routed_op(*entry.first, entry.second))
      g.ordered_forwards.push_back(std::move(entry));
}

void order_after_group_end(ncclResult_t r) {
  GroupState& g = group_state();
  auto grouped = std::move(g.ordered_forwards);
  g.ordered_forwards.clear();
  // In progress (a non-blocking communicator's group), NCCL may launch later than an event
  // recorded now would say: no mark, as on failure.
  if (r != ncclSuccess) return;
  for (auto& [st, stream] : grouped) mark_nccl_end(*st, stream);
}

namespace {

// The previous routed op's end for the streams that start with their own op (see the header).
// Always, not only where the application's stream differs: a stream's handle tells nothing
// once streams are destroyed and made again (a new stream may get a freed one's address), and
// where it is one stream the wait costs the GPU nothing.
CUresult after_previous_routed_op(CommState& st, const CUstream* streams) {
  CeComm& ce = *st.ce;
  if (!ce.routed_before) return CUDA_SUCCESS;
  const CudaDriver& cu = *cuda_driver();
  for (DirectStream k : {DirectStream::kPull, DirectStream::kLocal})
    if (CUresult r = cu.cuStreamWaitEvent(streams[static_cast<int>(k)], ce.events[kEvEnd], 0);
        r != CUDA_SUCCESS)
      return r;
  return CUDA_SUCCESS;
}

}  // namespace

CUresult order_routed_op(CommState& st, const CUstream* streams) {
  CeComm& ce = *st.ce;
  const CudaDriver& cu = *cuda_driver();
  if (CUresult r = after_previous_routed_op(st, streams); r != CUDA_SUCCESS) return r;
  if (!ce.nccl_pending) return CUDA_SUCCESS;
  for (int k = 1; k < kDirectStreams; ++k)
    if (CUresult r = cu.cuStreamWaitEvent(streams[k], ce.nccl_tail, 0); r != CUDA_SUCCESS) return r;
  ce.nccl_pending = false;
  ZC_DEBUG("comm order on rank %d: routed op %llu waits for the op forwarded to NCCL before it",
           st.rank, static_cast<unsigned long long>(ce.seq));
  return CUDA_SUCCESS;
}

void routed_op_issued(CommState& st) {
  st.ce->routed_pending = true;
  st.ce->routed_before = true;
}

}  // namespace zc
