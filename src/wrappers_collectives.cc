// Collectives: counted and NVTX-annotated; all-gathers routed by choose_allgather_route();
// NCCL-CE-capable ops on app windows moved off the legacy default stream (NCCL 2.28 bug).
#include <cuda.h>

#include "ce_allgather.h"
#include "ce_setup.h"
#include "comm_state.h"
#include "config.h"
#include "group_state.h"
#include "log.h"
#include "nonblocking_setup.h"
#include "nvtx_ranges.h"
#include "route.h"
#include "shim_entry.h"
#include "staged_allgather.h"
#include "stats.h"

namespace zc {
namespace {

bool is_legacy_stream(cudaStream_t s) {
  return s == nullptr || reinterpret_cast<CUstream>(s) == CU_STREAM_LEGACY;
}

// Runs fn on a side stream ordered after and before the caller's legacy stream.
template <typename Fn>
ncclResult_t on_side_stream(CommState& st, cudaStream_t user, Fn fn) {
  const CudaDriver* cu = cuda_driver();
  if (!cu || !cu->ce_ok) return fn(user);
  std::lock_guard<std::mutex> lock(st.issue_mu);
  ScopedDevice dev(st.device);
  if (!st.side_stream) {
    if (cu->cuStreamCreate(&st.side_stream, CU_STREAM_NON_BLOCKING) != CUDA_SUCCESS ||
        cu->cuEventCreate(&st.side_events[0], CU_EVENT_DISABLE_TIMING) != CUDA_SUCCESS ||
        cu->cuEventCreate(&st.side_events[1], CU_EVENT_DISABLE_TIMING) != CUDA_SUCCESS) {
      st.side_stream = nullptr;
      return fn(user);  // nothing issued yet: NCCL's own behaviour, no divergence
    }
  }
  CUstream u = reinterpret_cast<CUstream>(user);
  if (cu->cuEventRecord(st.side_events[0], u) != CUDA_SUCCESS ||
      cu->cuStreamWaitEvent(st.side_stream, st.side_events[0], 0) != CUDA_SUCCESS)
    return fn(user);
  ncclResult_t r = fn(reinterpret_cast<cudaStream_t>(st.side_stream));
  if (cu->cuEventRecord(st.side_events[1], st.side_stream) != CUDA_SUCCESS ||
      cu->cuStreamWaitEvent(u, st.side_events[1], 0) != CUDA_SUCCESS) {
    st.poisoned.store(ncclUnhandledCudaError);
    return ncclUnhandledCudaError;
  }
  return r;
}

bool in_app_window(CommState& st, const void* p) {
  auto a = reinterpret_cast<uintptr_t>(p);
  std::lock_guard<std::mutex> lock(st.windows_mu);
  for (const AppWindow& w : st.app_windows)
    if (a >= w.base && a < w.base + w.size) return true;
  return false;
}

int poisoned_code(const std::shared_ptr<CommState>& st) {
  return st ? st->poisoned.load(std::memory_order_relaxed) : ncclSuccess;
}

}  // namespace
}  // namespace zc

using namespace zc;

// A forwarded collective: poisoned comms answer with their error, the rest is counted.
#define ZC_COUNTED_COLLECTIVE(OP, BYTES, name, params, args)                \
  ZC_EXPORT ncclResult_t name params {                                      \
    Entry e = enter(__builtin_return_address(0));                           \
    if (e.gate == Gate::kFail) return e.code;                               \
    if (e.gate != Gate::kActive) ZC_CALL_REAL(ncclResult_t, e, name, args); \
    auto st = comm_lookup(comm);                                            \
    settle_before_use(st.get());                                            \
    if (int p = poisoned_code(st)) return static_cast<ncclResult_t>(p);     \
    uint64_t bytes = (BYTES);                                               \
    stats_count(OP, zerocta_route_passthrough, bytes);                      \
    NvtxRange range(OP, zerocta_route_passthrough, bytes);                  \
    ZC_CALL_REAL(ncclResult_t, e, name, args);                              \
  }

// Ops NCCL 2.28 may run on copy engines (buffers in symmetric windows, zero policy): moved
// off the legacy default stream, where NCCL 2.28.x fails them.
#define ZC_CE_CAPABLE_COLLECTIVE(OP, BYTES, name, params, args, stream_arg, args_on_side)    \
  ZC_EXPORT ncclResult_t name params {                                                       \
    Entry e = enter(__builtin_return_address(0));                                            \
    if (e.gate == Gate::kFail) return e.code;                                                \
    if (e.gate != Gate::kActive) ZC_CALL_REAL(ncclResult_t, e, name, args);                  \
    if (!e.real->name) {                                                                     \
      warn_missing_function(#name);                                                          \
      return ncclInternalError;                                                              \
    }                                                                                        \
    auto st = comm_lookup(comm);                                                             \
    settle_before_use(st.get());                                                             \
    if (int p = poisoned_code(st)) return static_cast<ncclResult_t>(p);                      \
    uint64_t bytes = (BYTES);                                                                \
    bool nccl_ce =                                                                           \
        st && st->zero_policy && st->has_app_windows.load() && in_app_window(*st, recvbuff); \
    zerocta_route_t route = nccl_ce ? zerocta_route_nccl_ce : zerocta_route_passthrough;     \
    stats_count(OP, route, bytes);                                                           \
    NvtxRange range(OP, route, bytes);                                                       \
    if (nccl_ce && is_legacy_stream(stream_arg) && group_state().depth == 0)                 \
      return on_side_stream(*st, stream_arg,                                                 \
                            [&](cudaStream_t side) { return e.real->name args_on_side; });   \
    return e.real->name args;                                                                \
  }

static uint64_t nranks_of(const std::shared_ptr<CommState>& st) {
  return st && st->nranks > 0 ? static_cast<uint64_t>(st->nranks) : 1;
}

ZC_COUNTED_COLLECTIVE(zerocta_op_allreduce, count* nccl_type_size(datatype), ncclAllReduce,
                      (const void* sendbuff, void* recvbuff, size_t count, ncclDataType_t datatype,
                       ncclRedOp_t op, ncclComm_t comm, cudaStream_t stream),
                      (sendbuff, recvbuff, count, datatype, op, comm, stream))
ZC_COUNTED_COLLECTIVE(zerocta_op_reducescatter, recvcount* nccl_type_size(datatype),
                      ncclReduceScatter,
                      (const void* sendbuff, void* recvbuff, size_t recvcount,
                       ncclDataType_t datatype, ncclRedOp_t op, ncclComm_t comm,
                       cudaStream_t stream),
                      (sendbuff, recvbuff, recvcount, datatype, op, comm, stream))
ZC_COUNTED_COLLECTIVE(zerocta_op_reduce, count* nccl_type_size(datatype), ncclReduce,
                      (const void* sendbuff, void* recvbuff, size_t count, ncclDataType_t datatype,
                       ncclRedOp_t op, int root, ncclComm_t comm, cudaStream_t stream),
                      (sendbuff, recvbuff, count, datatype, op, root, comm, stream))
ZC_COUNTED_COLLECTIVE(zerocta_op_broadcast, count* nccl_type_size(datatype), ncclBroadcast,
                      (const void* sendbuff, void* recvbuff, size_t count, ncclDataType_t datatype,
                       int root, ncclComm_t comm, cudaStream_t stream),
                      (sendbuff, recvbuff, count, datatype, root, comm, stream))
ZC_COUNTED_COLLECTIVE(zerocta_op_broadcast, count* nccl_type_size(datatype), ncclBcast,
                      (void* buff, size_t count, ncclDataType_t datatype, int root, ncclComm_t comm,
                       cudaStream_t stream),
                      (buff, count, datatype, root, comm, stream))
ZC_COUNTED_COLLECTIVE(zerocta_op_send, count* nccl_type_size(datatype), ncclSend,
                      (const void* sendbuff, size_t count, ncclDataType_t datatype, int peer,
                       ncclComm_t comm, cudaStream_t stream),
                      (sendbuff, count, datatype, peer, comm, stream))
ZC_COUNTED_COLLECTIVE(zerocta_op_recv, count* nccl_type_size(datatype), ncclRecv,
                      (void* recvbuff, size_t count, ncclDataType_t datatype, int peer,
                       ncclComm_t comm, cudaStream_t stream),
                      (recvbuff, count, datatype, peer, comm, stream))
ZC_CE_CAPABLE_COLLECTIVE(zerocta_op_alltoall, count* nccl_type_size(datatype) * nranks_of(st),
                         ncclAlltoAll,
                         (const void* sendbuff, void* recvbuff, size_t count,
                          ncclDataType_t datatype, ncclComm_t comm, cudaStream_t stream),
                         (sendbuff, recvbuff, count, datatype, comm, stream), stream,
                         (sendbuff, recvbuff, count, datatype, comm, side))
ZC_CE_CAPABLE_COLLECTIVE(zerocta_op_gather, count* nccl_type_size(datatype) * nranks_of(st),
                         ncclGather,
                         (const void* sendbuff, void* recvbuff, size_t count,
                          ncclDataType_t datatype, int root, ncclComm_t comm, cudaStream_t stream),
                         (sendbuff, recvbuff, count, datatype, root, comm, stream), stream,
                         (sendbuff, recvbuff, count, datatype, root, comm, side))
ZC_CE_CAPABLE_COLLECTIVE(zerocta_op_scatter, count* nccl_type_size(datatype), ncclScatter,
                         (const void* sendbuff, void* recvbuff, size_t count,
                          ncclDataType_t datatype, int root, ncclComm_t comm, cudaStream_t stream),
                         (sendbuff, recvbuff, count, datatype, root, comm, stream), stream,
                         (sendbuff, recvbuff, count, datatype, root, comm, side))

ZC_EXPORT ncclResult_t ncclAllGather(const void* sendbuff, void* recvbuff, size_t sendcount,
                                     ncclDataType_t datatype, ncclComm_t comm,
                                     cudaStream_t stream) {
  Entry e = enter(__builtin_return_address(0));
  if (e.gate == Gate::kFail) return e.code;
  if (e.gate != Gate::kActive)
    ZC_CALL_REAL(ncclResult_t, e, ncclAllGather,
                 (sendbuff, recvbuff, sendcount, datatype, comm, stream));
  if (!e.real->ncclAllGather) {
    warn_missing_function("ncclAllGather");
    return ncclInternalError;
  }
  auto st = comm_lookup(comm);
  settle_before_use(st.get());  // a non-blocking comm's pool, before its first operation
  if (int p = poisoned_code(st)) return static_cast<ncclResult_t>(p);
  const Config& cfg = config();
  const uint64_t ts = nccl_type_size(datatype);
  const uint64_t n = nranks_of(st);
  RouteInputs in;
  in.mode = cfg.allgather;
  in.ce_ready = st && st->ce_ready.load(std::memory_order_acquire);
  in.ce_missing = st ? st->ce_missing : "communicator not created through zerocta";
  in.bytes_valid = ts != 0 && sendcount <= UINT64_MAX / ts / n;
  in.total_bytes = in.bytes_valid ? sendcount * ts * n : 0;
  in.min_bytes = cfg.min_bytes;
  in.nranks = n;
  in.auto_max_ranks = cfg.auto_max_ranks;
  in.app_windows = st && st->zero_policy && st->has_app_windows.load() &&
                   in_app_window(*st, sendbuff) && in_app_window(*st, recvbuff);
  RouteDecision d = choose_allgather_route(in);
  // Capture changes only which of our slots and streams the op uses, never the route.
  const bool pooled = d.route == AgRoute::kCe || d.route == AgRoute::kNcclStaged;
  const bool capturing = pooled && stream_is_capturing(reinterpret_cast<CUstream>(stream));
  ZC_DEBUG("ncclAllGather %llu B: route %d (%s)", static_cast<unsigned long long>(in.total_bytes),
           static_cast<int>(d.route), d.why);
  if (pooled) {
    const uint64_t per_rank = sendcount * ts;
    const bool staged = d.route == AgRoute::kNcclStaged;
    auto issue = [st, sendbuff, recvbuff, per_rank, stream, capturing, staged,
                  total = in.total_bytes]() {
      const zerocta_route_t route = staged ? zerocta_route_nccl_staged : zerocta_route_ce;
      stats_count(zerocta_op_allgather, route, total);
      NvtxRange range(zerocta_op_allgather, route, total);
      CUstream s = reinterpret_cast<CUstream>(stream);
      return staged ? staged_allgather(*st, sendbuff, recvbuff, per_rank, s, capturing)
                    : ce_allgather(*st, sendbuff, recvbuff, per_rank, s, capturing);
    };
    GroupState& g = group_state();
    if (g.depth > 0) {
      g.pending_ops.push_back(issue);
      return ncclSuccess;
    }
    return issue();
  }
  zerocta_route_t route =
      d.route == AgRoute::kNcclCe ? zerocta_route_nccl_ce : zerocta_route_passthrough;
  stats_count(zerocta_op_allgather, route, in.total_bytes);
  NvtxRange range(zerocta_op_allgather, route, in.total_bytes);
  if (d.route == AgRoute::kNcclCe && is_legacy_stream(stream) && group_state().depth == 0)
    return on_side_stream(*st, stream, [&](cudaStream_t side) {
      return e.real->ncclAllGather(sendbuff, recvbuff, sendcount, datatype, comm, side);
    });
  return e.real->ncclAllGather(sendbuff, recvbuff, sendcount, datatype, comm, stream);
}

ZC_EXPORT ncclResult_t ncclGroupStart() {
  Entry e = enter(__builtin_return_address(0));
  if (e.gate == Gate::kFail) return e.code;
  if (e.gate == Gate::kActive) group_state().depth++;
  ZC_CALL_REAL(ncclResult_t, e, ncclGroupStart, ());
}

ZC_EXPORT ncclResult_t ncclGroupEnd() {
  Entry e = enter(__builtin_return_address(0));
  if (e.gate == Gate::kFail) return e.code;
  if (e.gate != Gate::kActive) ZC_CALL_REAL(ncclResult_t, e, ncclGroupEnd, ());
  if (!e.real->ncclGroupEnd) {
    warn_missing_function("ncclGroupEnd");
    return ncclInternalError;
  }
  GroupState& g = group_state();
  ncclResult_t r = e.real->ncclGroupEnd();
  if (g.depth > 0) g.depth--;
  if (g.depth > 0) return r;
  // Outermost end: NCCL's part is launched; now ours, in program order.
  g.nonblocking_batch.reset();
  auto setups = std::move(g.pending_setup);
  auto ops = std::move(g.pending_ops);
  g.pending_setup.clear();
  g.pending_ops.clear();
  if (r == ncclSuccess && !setups.empty()) ce_setup(setups);
  for (auto& op : ops) {
    ncclResult_t o = op();
    if (r == ncclSuccess) r = o;
  }
  return r;
}

// Simulation ends the group without launching anything: nothing of ours is issued either.
ZC_EXPORT ncclResult_t ncclGroupSimulateEnd(ncclSimInfo_t* simInfo) {
  Entry e = enter(__builtin_return_address(0));
  if (e.gate == Gate::kFail) return e.code;
  if (e.gate == Gate::kActive) {
    GroupState& g = group_state();
    if (g.depth > 0) g.depth--;
    if (g.depth == 0) {
      g.pending_ops.clear();
      g.pending_setup.clear();
      g.nonblocking_batch.reset();
    }
  }
  ZC_CALL_REAL(ncclResult_t, e, ncclGroupSimulateEnd, (simInfo));
}
