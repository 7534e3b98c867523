#include "ce_allgather.h"

#include <sched.h>
#include <unistd.h>

#include "ce_exec.h"
#include "log.h"
#include "route_setup.h"
#include "stats.h"

namespace zc {
namespace {

// Imports of peers' buffers a rank keeps mapped before it trims those of past ops: an import
// keeps memory alive that its owner may have freed (peer_memory.h).
constexpr uint64_t kHeldBudget = uint64_t{16} << 30;
// Every this many ops, exports of allocations the application freed are withdrawn.
constexpr uint64_t kSweepEvery = 64;

// Fills my post for op `seq`. reach stays 0 where a peer that needs my buffers could not reach
// them.
void post_for(CommState& st, const void* send, void* recv, size_t count, ncclDataType_t type,
              uint64_t chunk, bool capturing, OpPost* p) {
  CeComm& ce = *st.ce;
  *p = OpPost{};
  p->seq = ce.seq;
  p->mode = capturing ? OpMode::kCaptured : OpMode::kEager;
  p->count = count;
  p->datatype = type;
  p->pid = static_cast<int32_t>(getpid());
  if (capturing) return;  // goes to NCCL: nothing of this rank's memory is needed
  const CudaDriver& cu = *cuda_driver();
  const uint64_t total = chunk * static_cast<uint64_t>(st.nranks);
  const bool ok =
      describe_buffer(cu, reinterpret_cast<uint64_t>(send), chunk, ce.needs, &p->send) &&
      describe_buffer(cu, reinterpret_cast<uint64_t>(recv), total, ce.needs, &p->recv);
  if (ok) p->reach = (ce.needs.by_pointer ? uint32_t{kReachPointer} : 0u) | kReachExtents;
}

// Where an earlier rank's chunk is and where mine goes in its receive buffer, in this process.
bool spans_of(CommState& st, int e, const OpPost& post, uint64_t chunk, const char** why) {
  CeComm& ce = *st.ce;
  const uint64_t src = post.send.addr;
  const uint64_t dst = post.recv.addr + static_cast<uint64_t>(st.rank) * chunk;
  std::vector<Span>& from = ce.view.pull_from[e];
  std::vector<Span>& to = ce.view.push_to[e];
  if (post.reach == 0) {
    *why = "a rank's buffers cannot be reached by its peers (another allocator on that rank?)";
    return false;
  }
  if (post.pid == static_cast<int32_t>(getpid())) {
    from.assign(1, Span{src, chunk});
    to.assign(1, Span{dst, chunk});
    return true;
  }
  const CudaDriver& cu = *cuda_driver();
  const MemberFacts& m = st.members[static_cast<size_t>(e)];
  return ce.imports->resolve(cu, post.send, m.pid, m.fd_address, src, chunk, ce.seq, &from, why) &&
         ce.imports->resolve(cu, post.recv, m.pid, m.fd_address, dst, chunk, ce.seq, &to, why);
}

void build_view(CommState& st, const Arrival& a, const void* send, void* recv, uint64_t chunk) {
  CeComm& ce = *st.ce;
  DirectOpView& v = ce.view;
  const uint32_t me = static_cast<uint32_t>(st.rank);
  v.rank = st.rank;
  v.nranks = st.nranks;
  v.seq = static_cast<uint32_t>(a.seq);
  v.chunk = chunk;
  v.send = reinterpret_cast<uint64_t>(send);
  v.recv = reinterpret_cast<uint64_t>(recv);
  v.before = a.before;
  for (uint32_t r = 0; r < static_cast<uint32_t>(st.nranks); ++r) {
    v.ready[r] = ce.dev(ce.ops->ready_flag(r, a.seq));
    v.done_to[r] = ce.dev(ce.ops->done_flag(r, me, a.seq));
    v.done_from[r] = ce.dev(ce.ops->done_flag(me, r, a.seq));
  }
}

// Housekeeping between ops: exports of freed allocations, and imports beyond the budget once
// nothing of ours runs (a mapping may only go when no copy can touch it any more).
void tidy(CommState& st) {
  CeComm& ce = *st.ce;
  const CudaDriver& cu = *cuda_driver();
  if (ce.seq % kSweepEvery == 0) sweep_exports(cu);
  if (ce.imports->held_bytes() <= kHeldBudget) return;
  for (int k = 1; k < kDirectStreams; ++k)
    if (cu.cuStreamQuery(ce.streams[k]) != CUDA_SUCCESS) return;
  ce.imports->trim(cu, ce.seq);
}

ncclResult_t fail(CommState& st, ncclResult_t code, const char* what, const char* why) {
  ZC_WARN("zero-copy all-gather on rank %d: %s: %s; the communicator is poisoned", st.rank, what,
          why);
  route_poison(st, code);
  return code;
}

}  // namespace

bool stream_is_capturing(CUstream stream) {
  const CudaDriver* cu = cuda_driver();
  if (!cu || !cu->ce_ok) return false;
  CUstreamCaptureStatus status = CU_STREAM_CAPTURE_STATUS_NONE;
  // The legacy stream cannot be captured, and querying it during another thread's global-mode
  // capture is itself an error; it never needs the question.
  if (stream == nullptr || stream == CU_STREAM_LEGACY) return false;
  if (cu->cuStreamIsCapturing(stream, &status) != CUDA_SUCCESS) return true;
  return status != CU_STREAM_CAPTURE_STATUS_NONE;
}

ncclResult_t ce_allgather(CommState& st, const void* sendbuff, void* recvbuff, size_t sendcount,
                          ncclDataType_t datatype, uint64_t chunk, CUstream stream,
                          bool capturing, bool* to_nccl) {
  *to_nccl = false;
  const CudaDriver* cu = cuda_driver();
  std::lock_guard<std::mutex> lock(st.issue_mu);
  if (int p = st.poisoned.load(); p != ncclSuccess) return static_cast<ncclResult_t>(p);
  CeComm* ce = st.ce.get();
  if (!ce || !ce->prepared || !ce->ops || !cu) return fail(st, ncclInternalError, "set-up", "not prepared");
  ScopedDevice dev(st.device);
  if (!dev.ok()) return fail(st, ncclUnhandledCudaError, "set-up", "no device context");
  ++ce->seq;
  OpPost mine;
  post_for(st, sendbuff, recvbuff, sendcount, datatype, chunk, capturing, &mine);
  Arrival a;
  const uint32_t me = static_cast<uint32_t>(st.rank);
  auto give_up = [&](uint32_t spins) {
    if (spins > 1000) usleep(spins > 100000 ? 1000 : 20);
    return st.poisoned.load() != ncclSuccess || route_peer_poison(st) != ncclSuccess;
  };
  if (!ce->ops->arrive(me, mine, &a, ce->earlier.data(), give_up))
    return fail(st, ncclRemoteError, "waiting for room in the op ring", "a peer failed");
  struct Finish {  // this rank is done with op seq's posts, whatever happens next
    OpExchange& ops;
    uint32_t me;
    uint64_t seq;
    ~Finish() { ops.finish(me, seq); }
  } finish{*ce->ops, me, a.seq};
  if (*a.mismatch) return fail(st, ncclInvalidUsage, "ranks disagree on the op", a.mismatch);
  if (a.verdict == OpVerdict::kNccl) {
    *to_nccl = true;
    return ncclSuccess;
  }
  const uint64_t all = st.nranks >= 64 ? ~uint64_t{0} : (uint64_t{1} << st.nranks) - 1;
  const bool peers_need_mine = (a.before | uint64_t{1} << me) != all;
  if (peers_need_mine && mine.reach == 0)
    return fail(st, ncclInvalidUsage, "this rank's buffers cannot be reached by later peers",
                "allocated where no copy engine of a peer reaches them");
  const char* why = "";
  for (int e = 0; e < st.nranks; ++e)
    if ((a.before >> e & 1) && !spans_of(st, e, ce->earlier[static_cast<size_t>(e)], chunk, &why))
      return fail(st, ncclSystemError, "reaching a peer's buffers", why);
  build_view(st, a, sendbuff, recvbuff, chunk);
  ce->plan.clear();
  build_direct_plan(ce->view, &ce->plan);
  if (CUresult r = issue_plan(*cu, ce->streams, ce->events, stream, ce->plan); r != CUDA_SUCCESS)
    return fail(st, ncclUnhandledCudaError, "issuing its copies", cuda_error_string(r));
  tidy(st);
  return ncclSuccess;
}

}  // namespace zc
