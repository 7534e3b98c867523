#include "routed_op.h"

#include <cstdio>

#include "log.h"
#include "parked_routes.h"
#include "peer_reach.h"
#include "route_setup.h"

namespace zc {

bool routed_op_refused(CommState& st, bool capturing, const char* name, ncclResult_t* result) {
  const CudaDriver* cu = cuda_driver();
  if (!capturing) {
    collect_gone_graphs();
    collect_drained_routes();
  }
  check_captured_replays(st);
  // A peer's poison too: its waits may have been released, and this op must not pair with them.
  route_adopt_peer_poison(st);
  // A peer that aborted never posts again: this op cannot pair (NCCL's would wait for ever).
  if (st.ce && st.ce->ops && st.ce->ops->anyone_left()) {
    int none = ncclSuccess;
    if (st.poisoned.compare_exchange_strong(none, ncclRemoteError))
      ZC_WARN("%s on rank %d: a peer aborted the communicator; its ops fail", name, st.rank);
  }
  if (int p = st.poisoned.load(); p != ncclSuccess) {
    *result = static_cast<ncclResult_t>(p);
    return true;
  }
  CeComm* ce = st.ce.get();
  if (!ce || !ce->prepared || !ce->ops || !cu) {
    *result = routed_op_fail(st, name, ncclInternalError, "set-up", "not prepared");
    return true;
  }
  // A rank over a failed context would otherwise hold its peers in the exchange while its own
  // calls fail one by one.
  if (!capturing)
    if (CUresult r = route_context_error(*ce); r != CUDA_SUCCESS) {
      *result = routed_op_fail(st, name, ncclUnhandledCudaError, "starting", cuda_error_string(r));
      return true;
    }
  return false;
}

ncclResult_t routed_op_fail(CommState& st, const char* name, ncclResult_t code, const char* what,
                            const char* why) {
  ZC_WARN("%s on rank %d: %s: %s; the communicator is poisoned", name, st.rank, what, why);
  route_poison(st, code);
  return code;
}

CUresult route_context_error(const CeComm& ce) {
  const CUresult r =
      cuda_driver()->cuStreamQuery(ce.streams[static_cast<int>(DirectStream::kPush)]);
  return r == CUDA_ERROR_NOT_READY ? CUDA_SUCCESS : r;
}

const char* mismatch_detail(const Arrival& a, const OpPost& mine, const OpPost* earlier, char* buf,
                            size_t len) {
  const OpPost& peer = earlier[a.mismatch_rank];
  if (peer.seq != mine.seq || (peer.calls == mine.calls && peer.chain == mine.chain))
    return a.mismatch;
  snprintf(buf, len,
           "%s: collective calls before op %llu: %llu on this rank (chain %016llx), %llu on rank "
           "%u (chain %016llx)",
           a.mismatch, static_cast<unsigned long long>(a.seq),
           static_cast<unsigned long long>(mine.calls), static_cast<unsigned long long>(mine.chain),
           static_cast<unsigned long long>(peer.calls), a.mismatch_rank,
           static_cast<unsigned long long>(peer.chain));
  return buf;
}

void check_captured_replays(CommState& st) {
  if (st.route.load(std::memory_order_acquire) != RouteState::kCommitted ||
      st.poisoned.load() != ncclSuccess)
    return;
  std::shared_ptr<CaptureLife> life;
  {
    std::lock_guard<std::mutex> lock(st.route_mu);
    if (st.ce) life = st.ce->life;
  }
  const char* why = nullptr;
  if (life && life->broken_replay(static_cast<uint32_t>(st.rank), &why))
    routed_op_fail(st, "copy-engine route", ncclRemoteError, "a graph replay", why);
}

bool make_capture_streams(const CudaDriver& cu, CeComm* ce) {
  for (int k = 1; k < kDirectStreams; ++k)
    if (!ce->capture_streams[k] &&
        cu.cuStreamCreate(&ce->capture_streams[k], CU_STREAM_NON_BLOCKING) != CUDA_SUCCESS)
      return false;
  for (int e = 0; e < kDirectEvents; ++e)
    if (!ce->capture_events[e] &&
        cu.cuEventCreate(&ce->capture_events[e], CU_EVENT_DISABLE_TIMING) != CUDA_SUCCESS)
      return false;
  return true;
}

std::unique_ptr<GraphHold> new_graph_hold(const CommState& st, uint64_t seq, BlockClaim& claim,
                                          const char** why) {
  if (!claim.ref().valid()) {
    *why = cuda_driver()->capture_ok ? "every flag block is held by a live graph"
                                     : "this CUDA driver cannot capture the route's operations";
    return nullptr;
  }
  std::unique_ptr<GraphHold> hold(new GraphHold);
  hold->life = st.ce->life;
  hold->rank = static_cast<uint32_t>(st.rank);
  hold->seq = seq;
  hold->mine = claim.ref();
  claim.handed_over();
  return hold;
}

RelaxedCapture::RelaxedCapture(bool on) : on_(on) {
  if (on_) cuda_driver()->cuThreadExchangeStreamCaptureMode(&mode_);
}

RelaxedCapture::~RelaxedCapture() {
  if (on_) cuda_driver()->cuThreadExchangeStreamCaptureMode(&mode_);
}

}  // namespace zc
