// Collectives: counted and NVTX-annotated, folded into the communicator's call chain where the
// route may be taken (call_chain.h); all-gathers routed by choose_allgather_route(),
// reduce-scatters by choose_reduce_scatter_route();
// NCCL-CE-capable ops on app windows moved off the legacy default stream on the NCCL versions
// that fail them there; group ends run what zerocta deferred to them (group_state.h).
#include <cuda.h>

#include <algorithm>

#include "call_chain.h"
#include "ce_allgather.h"
#include "ce_reduce_scatter.h"
#include "comm_create.h"
#include "comm_order.h"
#include "comm_state.h"
#include "config.h"
#include "group_calls.h"
#include "group_state.h"
#include "log.h"
#include "nvtx_ranges.h"
#include "real_nccl.h"
#include "reduce_scatter_plan.h"
#include "route.h"
#include "route_setup.h"
#include "shim_entry.h"
#include "stats.h"

namespace zc {
namespace {

// NCCL 2.28.0 to 2.29.6 fail a CE op on the legacy default stream (fixed in 2.29.7).
bool legacy_stream_bug() {
  const int v = real_nccl_version();
  return v >= 22800 && v < 22907;
}

bool is_legacy_stream(cudaStream_t s) {
  return s == nullptr || reinterpret_cast<CUstream>(s) == CU_STREAM_LEGACY;
}

// The communicator's device, asked of NCCL the first time the detour needs it.
int comm_device(CommState& st) {
  if (st.device < 0)
    if (const RealNccl* nccl = real_nccl()) nccl->ncclCommCuDevice(st.comm, &st.device);
  return st.device;
}

// Runs fn on a side stream ordered after and before the caller's legacy stream.
template <typename Fn>
ncclResult_t on_side_stream(CommState& st, cudaStream_t user, Fn fn) {
  const CudaDriver* cu = cuda_driver();
  if (!cu || !cu->ce_ok) return fn(user);
  std::lock_guard<std::mutex> lock(st.issue_mu);
  ScopedDevice dev(comm_device(st));
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
    route_poison(st, ncclUnhandledCudaError);  // tells the peers too, if the comm routes
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

// Whether NCCL may run this op on its CE path (buffers in the application's windows).
bool nccl_ce_capable(const std::shared_ptr<CommState>& st, const void* buff) {
  return st && st->zero_policy && st->has_app_windows.load() && in_app_window(*st, buff);
}

// Whether the detour applies: NCCL's CE path, the legacy stream, an NCCL with the bug, and
// no group (inside one, NCCL launches the op later on streams zerocta cannot see; a group's end
// runs the deferred ops inside an NCCL group of its own).
bool needs_detour(bool nccl_ce, cudaStream_t stream) {
  const GroupState& g = group_state();
  return nccl_ce && is_legacy_stream(stream) && g.depth == 0 && !g.running_deferred &&
         legacy_stream_bug();
}

// Before any collective: the comm's record, settled (comm_create.h), and its poison, if any
// (a peer's, seen through the channel, included).
std::shared_ptr<CommState> state_for_op(ncclComm_t comm, ncclResult_t* poison) {
  auto st = comm_lookup(comm);
  settle_before_use(st.get());
  if (st && route_adopt_peer_poison(*st) != ncclSuccess) route_poison(*st, ncclRemoteError);
  *poison = static_cast<ncclResult_t>(st ? st->poisoned.load(std::memory_order_relaxed) : 0);
  return st;
}

// Whether the comm keeps a call chain (call_chain.h): where the route may be taken, from the
// creation on — a comm created in the application's group joins only at the group's end, and
// its calls before that count alike on every rank — until it settled on NCCL for good. The
// default mode keeps none.
bool keeps_chain(const std::shared_ptr<CommState>& st) {
  const Config& cfg = config();
  return st && (route_asked(cfg.allgather) || route_asked(cfg.reducescatter)) &&
         st->route.load(std::memory_order_relaxed) != RouteState::kPassthrough;
}

// Folds a call into a comm that keeps a chain; inside a group, first marks where the comm's
// chain stood before the group (a simulated end rewinds it there).
ChainPoint fold_call(const std::shared_ptr<CommState>& st, const ChainLink& link) {
  GroupState& g = group_state();
  if (g.depth > 0 && std::none_of(g.chain_marks.begin(), g.chain_marks.end(),
                                  [&st](const auto& m) { return m.first == st; }))
    g.chain_marks.emplace_back(st, st->chain.now());
  return st->chain.fold(link);
}

// A forwarded call, folded into the comm's chain if NCCL accepted it: the chain follows what
// every rank's NCCL runs, and a call refused for its arguments runs nowhere.
ncclResult_t chained(const std::shared_ptr<CommState>& st, const ChainLink& link, ncclResult_t r) {
  if (link.call != ChainedCall::kNone && (r == ncclSuccess || r == ncclInProgress) &&
      keeps_chain(st))
    fold_call(st, link);
  return r;
}

// A routed all-gather's place in the chain, folded at the call: in program order, whenever a
// group's end issues it.
ChainPoint chain_at_call(const std::shared_ptr<CommState>& st, const ChainLink& link) {
  return keeps_chain(st) ? fold_call(st, link) : ChainPoint{};
}

// The communicator's size, for counting bytes: from the init's arguments; a child's is asked of
// NCCL (a local query) at its first collective, when it exists for sure.
uint64_t nranks_of(const std::shared_ptr<CommState>& st) {
  if (st && st->nranks <= 0 && st->child)
    if (const RealNccl* nccl = real_nccl()) nccl->ncclCommCount(st->comm, &st->nranks);
  return st && st->nranks > 0 ? static_cast<uint64_t>(st->nranks) : 1;
}

// The route of an all-gather, from agreed facts and the op's count and datatype only.
RouteDecision allgather_route(const std::shared_ptr<CommState>& st, size_t sendcount,
                              ncclDataType_t datatype, uint64_t* total_bytes) {
  const Config& cfg = config();
  const uint64_t ts = nccl_type_size(datatype);
  const uint64_t n = nranks_of(st);
  RouteInputs in;
  in.mode = cfg.allgather;
  in.committed = st && st->route.load(std::memory_order_acquire) == RouteState::kCommitted;
  in.why_not = st ? st->route_why : "communicator not created through zerocta";
  in.bytes_valid = ts != 0 && sendcount <= UINT64_MAX / ts / n;
  in.total_bytes = in.bytes_valid ? sendcount * ts * n : 0;
  in.min_bytes = cfg.min_bytes;
  in.nranks = static_cast<int>(n);
  in.auto_max_ranks = cfg.auto_max_ranks;
  *total_bytes = in.total_bytes;
  return choose_allgather_route(in);
}

// A routed collective once prepared: `route(&to_nccl)` in its NVTX range; where the first rank
// to arrive sent the op to NCCL (to_nccl, alike on every rank), `forward()`; else counted on the
// route.
template <typename Route, typename Forward>
ncclResult_t on_route_or_forward(zerocta_op_t op, uint64_t total, Route route, Forward forward) {
  bool to_nccl = false;
  ncclResult_t r;
  {
    NvtxRange range(op, zerocta_route_ce, total);
    r = route(&to_nccl);
  }
  if (r != ncclSuccess) return r;
  if (to_nccl) return forward();
  stats_count(op, zerocta_route_ce, total);
  return ncclSuccess;
}

ncclResult_t forward_allgather(const RealNccl& real, const std::shared_ptr<CommState>& st,
                               const void* sendbuff, void* recvbuff, size_t sendcount,
                               ncclDataType_t datatype, ncclComm_t comm, cudaStream_t stream,
                               bool nccl_ce, uint64_t total) {
  const zerocta_route_t route = nccl_ce ? zerocta_route_nccl_ce : zerocta_route_passthrough;
  stats_count(zerocta_op_allgather, route, total);
  NvtxRange range(zerocta_op_allgather, route, total);
  return in_comm_order(st, stream, [&] {
    if (needs_detour(nccl_ce, stream))
      return on_side_stream(*st, stream, [&](cudaStream_t side) {
        return timed_nccl_call([&] {
          return real.ncclAllGather(sendbuff, recvbuff, sendcount, datatype, comm, side);
        });
      });
    return timed_nccl_call(
        [&] { return real.ncclAllGather(sendbuff, recvbuff, sendcount, datatype, comm, stream); });
  });
}

// The zero-copy all-gather: prepared on first use (route_setup.h), then posted; NCCL runs it
// instead where the first rank to arrive said so (op_exchange.h), on every rank alike.
ncclResult_t issue_ce_allgather(const RealNccl& real, const std::shared_ptr<CommState>& st,
                                const void* sendbuff, void* recvbuff, size_t sendcount,
                                ncclDataType_t datatype, ncclComm_t comm, cudaStream_t stream,
                                bool nccl_ce, uint64_t total, ChainPoint chain) {
  if (ncclResult_t r = route_prepare(*st); r != ncclSuccess) return r;
  CUstream s = reinterpret_cast<CUstream>(stream);
  const uint64_t per_rank = sendcount * nccl_type_size(datatype);
  return on_route_or_forward(
      zerocta_op_allgather, total,
      [&](bool* to_nccl) {
        return ce_allgather(*st, sendbuff, recvbuff, sendcount, datatype, per_rank, s,
                            stream_is_capturing(s), chain, to_nccl);
      },
      [&] {
        return forward_allgather(real, st, sendbuff, recvbuff, sendcount, datatype, comm, stream,
                                 nccl_ce, total);
      });
}

// The route of a reduce-scatter, from agreed facts and the op's count, datatype and reduction
// only; *slice: its slices' bytes (reduce_scatter_plan.h), alike on every rank.
RouteDecision reduce_scatter_route(const std::shared_ptr<CommState>& st, size_t recvcount,
                                   ncclDataType_t datatype, const ResolvedRedOp& op,
                                   uint64_t* total_bytes, uint64_t* slice) {
  const Config& cfg = config();
  const uint64_t ts = nccl_type_size(datatype);
  const uint64_t n = nranks_of(st);
  RsRouteInputs in;
  in.mode = cfg.reducescatter;
  in.committed = st && st->route.load(std::memory_order_acquire) == RouteState::kCommitted;
  in.why_not = st ? st->route_why : "communicator not created through zerocta";
  in.every_scratch = in.committed && st->every_rank_has_rs_scratch;
  in.nranks = static_cast<int>(n);
  in.datatype = datatype;
  in.reduce = op.kind;
  in.scalar_datatype = op.premul.datatype;
  in.bytes_valid = ts != 0 && recvcount <= UINT64_MAX / ts / n;
  in.total_bytes = in.bytes_valid ? recvcount * ts * n : 0;
  in.min_bytes = cfg.min_bytes;
  in.auto_max_ranks = kRsAutoMaxRanks;
  in.slice = rs_slice_bytes(recvcount * ts, ts, in.nranks,
                            rs_region_bytes(in.nranks, cfg.rs_scratch_bytes));
  *total_bytes = in.total_bytes;
  *slice = in.slice;
  return choose_reduce_scatter_route(in);
}

ncclResult_t forward_reduce_scatter(const RealNccl& real, const std::shared_ptr<CommState>& st,
                                    const void* sendbuff, void* recvbuff, size_t recvcount,
                                    ncclDataType_t datatype, ncclRedOp_t op, ncclComm_t comm,
                                    cudaStream_t stream, uint64_t total) {
  stats_count(zerocta_op_reducescatter, zerocta_route_passthrough, total);
  NvtxRange range(zerocta_op_reducescatter, zerocta_route_passthrough, total);
  return in_comm_order(st, stream, [&] {
    return timed_nccl_call([&] {
      return real.ncclReduceScatter(sendbuff, recvbuff, recvcount, datatype, op, comm, stream);
    });
  });
}

// The copy-engine reduce-scatter: prepared on first use (route_setup.h), then posted; NCCL runs
// it instead where the first rank to arrive said so (op_exchange.h), on every rank alike.
ncclResult_t issue_ce_reduce_scatter(const RealNccl& real, const std::shared_ptr<CommState>& st,
                                     const void* sendbuff, void* recvbuff, size_t recvcount,
                                     ncclDataType_t datatype, const ResolvedRedOp& op,
                                     ncclComm_t comm, cudaStream_t stream, uint64_t total,
                                     uint64_t slice, ChainPoint chain) {
  if (ncclResult_t r = route_prepare_reduce_scatter(*st); r != ncclSuccess) return r;
  CUstream s = reinterpret_cast<CUstream>(stream);
  return on_route_or_forward(
      zerocta_op_reducescatter, total,
      [&](bool* to_nccl) {
        RsCall call;
        call.send = sendbuff;
        call.recv = recvbuff;
        call.recvcount = recvcount;
        call.datatype = datatype;
        call.op = op;
        call.slice = slice;
        call.stream = s;
        return ce_reduce_scatter(*st, call, stream_is_capturing(s), chain, to_nccl);
      },
      [&] {
        return forward_reduce_scatter(real, st, sendbuff, recvbuff, recvcount, datatype, op.op,
                                      comm, stream, total);
      });
}

}  // namespace
}  // namespace zc

using namespace zc;

// Every collective wrapper starts so: the prologue, then the comm's state; a poisoned comm
// answers with its error, as NCCL does with an asynchronous one.
#define ZC_COLLECTIVE_HEAD(name, args)   \
  ZC_PROLOGUE(e, name, args);            \
  ncclResult_t poison;                   \
  auto st = state_for_op(comm, &poison); \
  if (poison != ncclSuccess) return poison

// A forwarded collective, counted, in NCCL's order with the routed all-gathers (comm_order.h),
// folded into the call chain as LINK says.
#define ZC_COUNTED_COLLECTIVE(OP, BYTES, LINK, name, params, args)              \
  ZC_EXPORT ncclResult_t name params {                                          \
    ZC_COLLECTIVE_HEAD(name, args);                                             \
    uint64_t bytes = (BYTES);                                                   \
    stats_count(OP, zerocta_route_passthrough, bytes);                          \
    NvtxRange range(OP, zerocta_route_passthrough, bytes);                      \
    return chained(st, LINK, in_comm_order(st, stream, [&] {                    \
                     return timed_nccl_call([&] { return e.real->name args; }); \
                   }));                                                         \
  }

// Ops NCCL may run on copy engines (buffers in symmetric windows, zero policy): moved off the
// legacy default stream where NCCL fails them there.
#define ZC_CE_CAPABLE_COLLECTIVE(OP, BYTES, LINK, name, params, args, stream_arg, args_on_side) \
  ZC_EXPORT ncclResult_t name params {                                                          \
    ZC_COLLECTIVE_HEAD(name, args);                                                             \
    uint64_t bytes = (BYTES);                                                                   \
    const bool nccl_ce = nccl_ce_capable(st, recvbuff);                                         \
    zerocta_route_t route = nccl_ce ? zerocta_route_nccl_ce : zerocta_route_passthrough;        \
    stats_count(OP, route, bytes);                                                              \
    NvtxRange range(OP, route, bytes);                                                          \
    return chained(st, LINK, in_comm_order(st, stream_arg, [&] {                                \
                     if (needs_detour(nccl_ce, stream_arg))                                     \
                       return on_side_stream(*st, stream_arg, [&](cudaStream_t side) {          \
                         return timed_nccl_call([&] { return e.real->name args_on_side; });     \
                       });                                                                      \
                     return timed_nccl_call([&] { return e.real->name args; });                 \
                   }));                                                                         \
  }

ZC_COUNTED_COLLECTIVE(zerocta_op_allreduce, count* nccl_type_size(datatype),
                      (ChainLink{ChainedCall::kAllReduce, count, datatype, kNoRoot, op}),
                      ncclAllReduce,
                      (const void* sendbuff, void* recvbuff, size_t count, ncclDataType_t datatype,
                       ncclRedOp_t op, ncclComm_t comm, cudaStream_t stream),
                      (sendbuff, recvbuff, count, datatype, op, comm, stream))
ZC_COUNTED_COLLECTIVE(zerocta_op_reduce, count* nccl_type_size(datatype),
                      (ChainLink{ChainedCall::kReduce, count, datatype, root, op}), ncclReduce,
                      (const void* sendbuff, void* recvbuff, size_t count, ncclDataType_t datatype,
                       ncclRedOp_t op, int root, ncclComm_t comm, cudaStream_t stream),
                      (sendbuff, recvbuff, count, datatype, op, root, comm, stream))
ZC_COUNTED_COLLECTIVE(zerocta_op_broadcast, count* nccl_type_size(datatype),
                      (ChainLink{ChainedCall::kBroadcast, count, datatype, root}), ncclBroadcast,
                      (const void* sendbuff, void* recvbuff, size_t count, ncclDataType_t datatype,
                       int root, ncclComm_t comm, cudaStream_t stream),
                      (sendbuff, recvbuff, count, datatype, root, comm, stream))
ZC_COUNTED_COLLECTIVE(zerocta_op_broadcast, count* nccl_type_size(datatype),
                      (ChainLink{ChainedCall::kBroadcast, count, datatype, root}), ncclBcast,
                      (void* buff, size_t count, ncclDataType_t datatype, int root, ncclComm_t comm,
                       cudaStream_t stream),
                      (buff, count, datatype, root, comm, stream))
// Not folded: the order of a group's sends and receives may differ between ranks.
ZC_COUNTED_COLLECTIVE(zerocta_op_send, count* nccl_type_size(datatype), ChainLink{}, ncclSend,
                      (const void* sendbuff, size_t count, ncclDataType_t datatype, int peer,
                       ncclComm_t comm, cudaStream_t stream),
                      (sendbuff, count, datatype, peer, comm, stream))
ZC_COUNTED_COLLECTIVE(zerocta_op_recv, count* nccl_type_size(datatype), ChainLink{}, ncclRecv,
                      (void* recvbuff, size_t count, ncclDataType_t datatype, int peer,
                       ncclComm_t comm, cudaStream_t stream),
                      (recvbuff, count, datatype, peer, comm, stream))
ZC_CE_CAPABLE_COLLECTIVE(zerocta_op_alltoall, count* nccl_type_size(datatype) * nranks_of(st),
                         (ChainLink{ChainedCall::kAlltoAll, count, datatype}), ncclAlltoAll,
                         (const void* sendbuff, void* recvbuff, size_t count,
                          ncclDataType_t datatype, ncclComm_t comm, cudaStream_t stream),
                         (sendbuff, recvbuff, count, datatype, comm, stream), stream,
                         (sendbuff, recvbuff, count, datatype, comm, side))
ZC_CE_CAPABLE_COLLECTIVE(zerocta_op_gather, count* nccl_type_size(datatype) * nranks_of(st),
                         (ChainLink{ChainedCall::kGather, count, datatype, root}), ncclGather,
                         (const void* sendbuff, void* recvbuff, size_t count,
                          ncclDataType_t datatype, int root, ncclComm_t comm, cudaStream_t stream),
                         (sendbuff, recvbuff, count, datatype, root, comm, stream), stream,
                         (sendbuff, recvbuff, count, datatype, root, comm, side))
ZC_CE_CAPABLE_COLLECTIVE(zerocta_op_scatter, count* nccl_type_size(datatype),
                         (ChainLink{ChainedCall::kScatter, count, datatype, root}), ncclScatter,
                         (const void* sendbuff, void* recvbuff, size_t count,
                          ncclDataType_t datatype, int root, ncclComm_t comm, cudaStream_t stream),
                         (sendbuff, recvbuff, count, datatype, root, comm, stream), stream,
                         (sendbuff, recvbuff, count, datatype, root, comm, side))

ZC_EXPORT ncclResult_t ncclAllGather(const void* sendbuff, void* recvbuff, size_t sendcount,
                                     ncclDataType_t datatype, ncclComm_t comm,
                                     cudaStream_t stream) {
  ZC_COLLECTIVE_HEAD(ncclAllGather, (sendbuff, recvbuff, sendcount, datatype, comm, stream));
  // Whether NCCL may take its own CE path (the application's windows) only matters for the
  // legacy-stream detour of a forwarded op; it never enters the route (placement is local).
  const bool nccl_ce = nccl_ce_capable(st, sendbuff) && nccl_ce_capable(st, recvbuff);
  const RealNccl& real = *e.real;
  const ChainLink link{ChainedCall::kAllGather, sendcount, datatype};
  GroupState& g = group_state();
  if (g.depth > 0 && st && st->route.load() == RouteState::kJoined) {
    // Created in this same group: its membership freezes at the group's end, and so the route
    // is chosen there, the same way on every rank.
    const ChainPoint chain = chain_at_call(st, link);
    g.pending_ops.push_back(
        {[=, &real]() {
           settle_before_use(st.get());  // freezes it, if NCCL now calls it ready
           uint64_t total = 0;
           if (allgather_route(st, sendcount, datatype, &total).route == RouteKind::kCe)
             return issue_ce_allgather(real, st, sendbuff, recvbuff, sendcount, datatype, comm,
                                       stream, nccl_ce, total, chain);
           return forward_allgather(real, st, sendbuff, recvbuff, sendcount, datatype, comm, stream,
                                    nccl_ce, total);
         },
         std::nullopt, st->key});
    return ncclSuccess;
  }
  uint64_t total = 0;
  const RouteDecision d = allgather_route(st, sendcount, datatype, &total);
  ZC_DEBUG("ncclAllGather %llu B: %s (%s)", static_cast<unsigned long long>(total),
           d.route == RouteKind::kCe ? "copy-engine route" : "NCCL", d.why);
  if (d.route != RouteKind::kCe)
    return chained(st, link,
                   forward_allgather(real, st, sendbuff, recvbuff, sendcount, datatype, comm,
                                     stream, nccl_ce, total));
  const ChainPoint chain = chain_at_call(st, link);
  if (g.depth > 0) {  // issued after NCCL's part of the group, in program order
    g.pending_ops.push_back(
        {[=, &real]() {
           return issue_ce_allgather(real, st, sendbuff, recvbuff, sendcount, datatype, comm,
                                     stream, nccl_ce, total, chain);
         },
         GroupedAllGather{st, sendbuff, recvbuff, sendcount, datatype, stream, total, chain,
                          [=, &real]() {
                            return forward_allgather(real, st, sendbuff, recvbuff, sendcount,
                                                     datatype, comm, stream, nccl_ce, total);
                          }},
         st->key});
    return ncclSuccess;
  }
  return issue_ce_allgather(real, st, sendbuff, recvbuff, sendcount, datatype, comm, stream,
                            nccl_ce, total, chain);
}

ZC_EXPORT ncclResult_t ncclReduceScatter(const void* sendbuff, void* recvbuff, size_t recvcount,
                                         ncclDataType_t datatype, ncclRedOp_t op, ncclComm_t comm,
                                         cudaStream_t stream) {
  ZC_COLLECTIVE_HEAD(ncclReduceScatter,
                     (sendbuff, recvbuff, recvcount, datatype, op, comm, stream));
  const RealNccl& real = *e.real;
  const ChainLink link{ChainedCall::kReduceScatter, recvcount, datatype, kNoRoot, op};
  // Resolved now: the application may destroy a pre-multiplied sum once the call returned, and
  // a group's ops are issued at its end.
  const ResolvedRedOp rop = resolve_red_op(st ? &st->premul_sums : nullptr, op);
  GroupState& g = group_state();
  if (g.depth > 0 && st && st->route.load() == RouteState::kJoined) {
    // Created in this same group: its membership freezes at the group's end, and so the route
    // is chosen there, the same way on every rank.
    const ChainPoint chain = chain_at_call(st, link);
    g.pending_ops.push_back(
        {[=, &real]() {
           settle_before_use(st.get());  // freezes it, if NCCL now calls it ready
           uint64_t total = 0, slice = 0;
           if (reduce_scatter_route(st, recvcount, datatype, rop, &total, &slice).route ==
               RouteKind::kCe)
             return issue_ce_reduce_scatter(real, st, sendbuff, recvbuff, recvcount, datatype, rop,
                                            comm, stream, total, slice, chain);
           return forward_reduce_scatter(real, st, sendbuff, recvbuff, recvcount, datatype, op,
                                         comm, stream, total);
         },
         std::nullopt, st->key});
    return ncclSuccess;
  }
  uint64_t total = 0, slice = 0;
  const RouteDecision d = reduce_scatter_route(st, recvcount, datatype, rop, &total, &slice);
  ZC_DEBUG("ncclReduceScatter %llu B: %s (%s)", static_cast<unsigned long long>(total),
           d.route == RouteKind::kCe ? "copy-engine route" : "NCCL", d.why);
  if (d.route != RouteKind::kCe)
    return chained(st, link,
                   forward_reduce_scatter(real, st, sendbuff, recvbuff, recvcount, datatype, op,
                                          comm, stream, total));
  const ChainPoint chain = chain_at_call(st, link);
  if (g.depth > 0) {  // issued after NCCL's part of the group, in program order
    g.pending_ops.push_back({[=, &real]() {
                               return issue_ce_reduce_scatter(real, st, sendbuff, recvbuff,
                                                              recvcount, datatype, rop, comm,
                                                              stream, total, slice, chain);
                             },
                             std::nullopt, st->key});
    return ncclSuccess;
  }
  return issue_ce_reduce_scatter(real, st, sendbuff, recvbuff, recvcount, datatype, rop, comm,
                                 stream, total, slice, chain);
}

ZC_EXPORT ncclResult_t ncclGroupStart() {
  ZC_PROLOGUE(e, ncclGroupStart, ());
  return group_start(*e.real);
}

ZC_EXPORT ncclResult_t ncclGroupEnd() {
  ZC_PROLOGUE(e, ncclGroupEnd, ());
  GroupState& g = group_state();
  if (g.depth == 1) g.chain_marks.clear();  // launched: the group's calls stay in the chains
  return group_end(*e.real);
}

// Simulation ends the group without launching anything: nothing of ours is issued either.
// The comms created in it stay joined until their first use or teardown.
ZC_EXPORT ncclResult_t ncclGroupSimulateEnd(ncclSimInfo_t* simInfo) {
  ZC_PROLOGUE(e, ncclGroupSimulateEnd, (simInfo));
  GroupState& g = group_state();
  if (g.depth > 0) g.depth--;
  if (g.depth != 0) return e.real->ncclGroupSimulateEnd(simInfo);
  for (auto& [st, before] : g.chain_marks) st->chain.rewind(before);
  g.chain_marks.clear();
  g.pending_ops.clear();
  g.pending_joins.clear();
  g.pending_freezes.clear();
  auto after_end = std::move(g.after_end);
  g.after_end.clear();
  const ncclResult_t r = e.real->ncclGroupSimulateEnd(simInfo);
  for (auto& read : after_end) read();  // what NCCL handed out, if it did
  return r;
}
