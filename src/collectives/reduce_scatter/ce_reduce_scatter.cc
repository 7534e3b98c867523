#include "ce_reduce_scatter.h"

#include <unistd.h>

#include <mutex>

#include "comm_order.h"
#include "config.h"
#include "log.h"
#include "monotonic_clock.h"
#include "peer_reach.h"
#include "route.h"
#include "routed_op.h"
#include "rs_exec.h"
#include "spin_backoff.h"
#include "stats.h"

namespace zc {
namespace {

constexpr const char* kName = "copy-engine reduce-scatter";
// Room for the reason of a mismatch with its numbers (the WARN line's; longer is cut).
constexpr size_t kMismatchDetailChars = 256;

ChunkType chunk_type(ncclDataType_t t) {
  return t == ncclFloat16    ? ChunkType::kF16
         : t == ncclBfloat16 ? ChunkType::kBF16
                             : ChunkType::kF32;
}

// My post for the op: no buffer (peers reach only my scratch, known since the join). A captured
// op's post says it cannot be reached: if it decides, the op goes to NCCL on every rank.
void post_for(const CommState& st, size_t count, ncclDataType_t type, ncclRedOp_t op,
              bool capturing, ChainPoint chain, OpPost* p) {
  p->clear();
  p->seq = st.ce->seq;
  p->collective = OpCollective::kReduceScatter;
  p->mode = capturing ? OpMode::kCaptured : OpMode::kEager;
  p->count = count;
  p->datatype = type;
  p->redop = static_cast<int32_t>(agreed_reduction(op));
  p->pid = static_cast<int32_t>(getpid());
  p->calls = chain.calls;
  p->chain = chain.hash;
  p->reach = capturing ? 0u : uint32_t{kReachPointer} | kReachExtents;
}

// A pre-multiplied sum's scalar in the view: where my push stream copies it from to my peers
// (a device-resident one from where it lives, a host-immediate one from my head's word after
// writing it there), or nothing for any other reduction.
void set_scalar(const ResolvedRedOp& op, uint64_t elem, RsOpView* v) {
  v->scalar_src = 0;
  v->write_scalar = false;
  if (op.kind != RsReduce::kPreMulSum) return;
  v->scalar_bytes = static_cast<uint32_t>(elem);
  v->write_scalar = !op.premul.on_device;
  v->scalar_bits = op.premul.host_bits;
  v->scalar_src = op.premul.on_device ? op.premul.device_scalar : rs_own_scalar_word(v->scratch);
}

// The op's view for its plan: my buffers, my scratch and the peers', the flags as my streams
// address them, and the op's slices from `first_slice` on.
void build_view(CommState& st, const void* send, void* recv, uint64_t chunk, uint64_t slice,
                uint64_t first_slice) {
  CeComm& ce = *st.ce;
  RsOpView& v = ce.rs_view;
  const uint32_t me = static_cast<uint32_t>(st.rank);
  v.rank = st.rank;
  v.nranks = st.nranks;
  v.first_slice = first_slice;
  v.chunk = chunk;
  v.slice = slice;
  v.send = reinterpret_cast<uint64_t>(send);
  v.recv = reinterpret_cast<uint64_t>(recv);
  v.scratch = ce.rs_scratch->facts().addr;
  for (uint32_t p = 0; p < static_cast<uint32_t>(st.nranks); ++p) {
    v.peer_scratch[p] = p == me ? v.scratch : ce.rs_scratch->peer_addr(static_cast<int>(p));
    v.landed_in[p] = ce.dev(ce.ops->landed_flag(me, p));
    v.landed_out[p] = ce.dev(ce.ops->landed_flag(p, me));
    v.freed[p] = ce.dev(ce.ops->freed_flag(p));
  }
}

// How the op's slices are summed: ncclAvg is NCCL's pre-multiplied sum by 1/n (chunk_sum.h); a
// pre-multiplied sum of the application's has this rank's scalar, and its peers' where the
// plan put them.
RsSum sum_for(const CeComm& ce, ncclDataType_t type, const ResolvedRedOp& op, int nranks) {
  RsSum s;
  s.kernels = ce.rs_kernels;
  s.type = chunk_type(type);
  s.elem = nccl_type_size(type);
  s.premul = op.kind == RsReduce::kAvg || op.kind == RsReduce::kPreMulSum;
  if (op.kind == RsReduce::kAvg) s.scale_bits = chunk_avg_scale_bits(s.type, nranks);
  if (op.kind == RsReduce::kPreMulSum) {
    s.scale_bits = op.premul.host_bits;
    s.own_scale_at = op.premul.on_device ? op.premul.device_scalar : 0;
  }
  const uint64_t ctas = config().rs_ctas;
  s.ctas = static_cast<unsigned>(ctas != 0 ? ctas : kDefaultRsCtas);
  return s;
}

}  // namespace

ncclResult_t ce_reduce_scatter(CommState& st, const void* sendbuff, void* recvbuff,
                               size_t recvcount, ncclDataType_t datatype, const ResolvedRedOp& op,
                               uint64_t slice, CUstream stream, bool capturing, ChainPoint chain,
                               bool* to_nccl) {
  *to_nccl = false;
  std::lock_guard<std::mutex> lock(st.issue_mu);  // the communicator's ops one at a time
  ncclResult_t result = ncclSuccess;
  if (routed_op_refused(st, capturing, kName, &result)) return result;
  auto fail = [&st](ncclResult_t code, const char* what, const char* why) {
    return routed_op_fail(st, kName, code, what, why);
  };
  const CudaDriver& cu = *cuda_driver();
  CeComm& ce = *st.ce;
  ScopedDevice dev(st.device);
  if (!dev.ok()) return fail(ncclUnhandledCudaError, "set-up", "no device context");
  RelaxedCapture relaxed(capturing);
  HostTimes host;
  int64_t mark = monotonic_us();
  auto lap = [&mark](int64_t* into) {
    const int64_t t = monotonic_us();
    *into += t - mark;
    mark = t;
  };
  ++ce.seq;
  OpPost& mine = ce.rs_post;
  post_for(st, recvcount, datatype, op.op, capturing, chain, &mine);
  lap(&host.post);
  const uint32_t me = static_cast<uint32_t>(st.rank);
  auto give_up = [&st](uint32_t spins) {
    backoff_pause(spins);
    return peer_failed(st);
  };
  Arrival a;
  if (!ce.ops->arrive(me, mine, &a, ce.peer_posts.data(), give_up))
    return fail(ncclRemoteError, "waiting for room in the op ring", "a peer failed");
  FinishPosts finish(ce, me, a.seq);
  lap(&host.arrive);
  if (*a.mismatch) {
    char detail[kMismatchDetailChars];
    return fail(ncclInvalidUsage, "ranks disagree on the op",
                mismatch_detail(a, mine, ce.peer_posts.data(), detail, sizeof detail));
  }
  if (a.verdict == OpVerdict::kNccl) {
    *to_nccl = true;
    return ncclSuccess;
  }
  if (capturing)  // the verdict came from an eager rank: the mismatch said so already
    return fail(ncclInvalidUsage, "ranks disagree on the op", "a captured op was routed");
  const uint64_t chunk = recvcount * nccl_type_size(datatype);
  build_view(st, sendbuff, recvbuff, chunk, slice, ce.ops->take_rs_slices(rs_slices(chunk, slice)));
  set_scalar(op, nccl_type_size(datatype), &ce.rs_view);
  ce.rs_plan.clear();
  build_reduce_scatter_plan(ce.rs_view, &ce.rs_plan);
  // NCCL's order among the communicator's ops (comm_order.h): the route's streams are the
  // all-gather's, so this op follows the routed all-gathers by stream order and the ops
  // forwarded to NCCL by their end event.
  if (CUresult r = order_routed_op(st, ce.streams); r != CUDA_SUCCESS)
    return fail(ncclUnhandledCudaError, "ordering it after NCCL's ops", cuda_error_string(r));
  if (CUresult r = issue_rs_plan(cu, ce.streams, ce.events, stream, ce.rs_plan,
                                 sum_for(ce, datatype, op, st.nranks), true);
      r != CUDA_SUCCESS)
    return fail(ncclUnhandledCudaError, "issuing its copies and sums", cuda_error_string(r));
  if (CUresult r = route_context_error(ce); r != CUDA_SUCCESS)
    return fail(ncclUnhandledCudaError, "issuing its copies and sums", cuda_error_string(r));
  routed_op_issued(st);
  lap(&host.issue);
  stats_op_host_times(host);
  ZC_DEBUG("%s on rank %d: op %llu issued (%llu B a rank, slices of %llu B)", kName, st.rank,
           static_cast<unsigned long long>(a.seq), static_cast<unsigned long long>(chunk),
           static_cast<unsigned long long>(slice));
  return ncclSuccess;
}

}  // namespace zc
