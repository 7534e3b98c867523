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
static_assert(kRsBuffers == CaptureBlocks::kTokenBuffers, "a captured op has a token per buffer");
// Room for the reason of a mismatch with its numbers (the WARN line's; longer is cut).
constexpr size_t kMismatchDetailChars = 256;

ChunkType chunk_type(ncclDataType_t t) {
  return t == ncclFloat16    ? ChunkType::kF16
         : t == ncclBfloat16 ? ChunkType::kBF16
                             : ChunkType::kF32;
}

// My post for the op: no buffer (peers reach only my scratch, known since the join). A captured
// op's names the flag block it claimed (the later ranks' tokens with me are in it); without one
// (the driver cannot capture, or every block is held) it says the op cannot be reached: if it
// decides, the op goes to NCCL on every rank.
void post_for(CommState& st, size_t count, ncclDataType_t type, ncclRedOp_t op, bool capturing,
              ChainPoint chain, OpPost* p) {
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
  p->reach = uint32_t{kReachPointer} | kReachExtents;
  if (capturing && !(cuda_driver()->capture_ok &&
                     st.ce->ops->blocks().claim(static_cast<uint32_t>(st.rank), &p->block)))
    p->reach = 0;
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

// The op's view for its plan: my buffers, and my scratch and the peers' as my streams address
// them, in the region of eager ops or of captured ones (reduce_scatter_plan.h).
void build_view(CommState& st, const RsCall& call, uint64_t chunk, bool captured) {
  CeComm& ce = *st.ce;
  RsOpView& v = ce.rs_view;
  const uint32_t me = static_cast<uint32_t>(st.rank);
  const uint64_t region = captured ? rs_region_bytes(st.nranks, config().rs_scratch_bytes) : 0;
  v.rank = st.rank;
  v.nranks = st.nranks;
  v.first_slice = 0;
  v.chunk = chunk;
  v.slice = call.slice;
  v.send = reinterpret_cast<uint64_t>(call.send);
  v.recv = reinterpret_cast<uint64_t>(call.recv);
  v.scratch = ce.rs_scratch->facts().addr + region;
  for (uint32_t p = 0; p < static_cast<uint32_t>(st.nranks); ++p)
    v.peer_scratch[p] =
        p == me ? v.scratch : ce.rs_scratch->peer_addr(static_cast<int>(p)) + region;
  v.captured = captured;
  v.broken = false;
}

// An eager op's flags: the exchange's counters, its slices numbered from `first_slice` on.
void set_counters(CommState& st, uint64_t first_slice) {
  CeComm& ce = *st.ce;
  RsOpView& v = ce.rs_view;
  const uint32_t me = static_cast<uint32_t>(st.rank);
  v.first_slice = first_slice;
  for (uint32_t p = 0; p < static_cast<uint32_t>(st.nranks); ++p) {
    v.landed_in[p] = ce.dev(ce.ops->landed_flag(me, p));
    v.landed_out[p] = ce.dev(ce.ops->landed_flag(p, me));
    v.freed[p] = ce.dev(ce.ops->freed_flag(p));
  }
}

// A captured op's flags: the tokens of each pair in the block of its earlier rank (mine for
// the ranks after me, theirs, which `hold` keeps, for the ranks before me). A peer whose block
// is gone already (its graph destroyed) makes the op one that can never pair: every block it
// holds is orphaned, which releases whatever a peer waits on, and its plan only marks itself
// started (captured_ops.h).
void set_tokens(CommState& st, const Arrival& a, CaptureRef mine, GraphHold& hold) {
  CeComm& ce = *st.ce;
  RsOpView& v = ce.rs_view;
  CaptureBlocks& blocks = ce.ops->blocks();
  using T = CaptureBlocks::TokenOf;
  const uint32_t me = static_cast<uint32_t>(st.rank);
  v.started = ce.dev(blocks.started(me, mine));
  for (uint32_t p = 0; p < static_cast<uint32_t>(st.nranks); ++p) {
    if (p == me) continue;
    const bool earlier = a.before >> p & 1;
    const CaptureRef theirs = ce.peer_posts[p].block;
    if (earlier && !blocks.hold(p, theirs)) {
      hold.broken = true;
      continue;
    }
    if (earlier) hold.peers.emplace_back(p, theirs);
    for (int b = 0; b < kRsBuffers; ++b) {
      v.token_in[p][b] = ce.dev(earlier ? blocks.rs_token(p, theirs, me, T::kPeersBuffer, b)
                                        : blocks.rs_token(me, mine, p, T::kOwnersBuffer, b));
      v.token_out[p][b] = ce.dev(earlier ? blocks.rs_token(p, theirs, me, T::kOwnersBuffer, b)
                                         : blocks.rs_token(me, mine, p, T::kPeersBuffer, b));
    }
  }
  if (!hold.broken) return;
  v.broken = true;
  blocks.orphan(me, mine);
  for (const auto& [owner, ref] : hold.peers) blocks.orphan(owner, ref);
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

// Issues an eager op: its slices numbered after the communicator's earlier ones, on the route's
// streams, in NCCL's order among the communicator's ops.
ncclResult_t issue_eager(CommState& st, const RsCall& call, uint64_t chunk) {
  CeComm& ce = *st.ce;
  const CudaDriver& cu = *cuda_driver();
  build_view(st, call, chunk, false);
  set_counters(st, ce.ops->take_rs_slices(rs_slices(chunk, call.slice)));
  set_scalar(call.op, nccl_type_size(call.datatype), &ce.rs_view);
  ce.rs_plan.clear();
  build_reduce_scatter_plan(ce.rs_view, &ce.rs_plan);
  // NCCL's order among the communicator's ops (comm_order.h): the route's streams are the
  // all-gather's, so this op follows the routed all-gathers by stream order and the ops
  // forwarded to NCCL by their end event.
  if (CUresult r = order_routed_op(st, ce.streams); r != CUDA_SUCCESS)
    return routed_op_fail(st, kName, ncclUnhandledCudaError, "ordering it after NCCL's ops",
                          cuda_error_string(r));
  if (CUresult r = issue_rs_plan(cu, ce.streams, ce.events, call.stream, ce.rs_plan,
                                 sum_for(ce, call.datatype, call.op, st.nranks), true);
      r != CUDA_SUCCESS)
    return routed_op_fail(st, kName, ncclUnhandledCudaError, "issuing its copies and sums",
                          cuda_error_string(r));
  if (CUresult r = route_context_error(ce); r != CUDA_SUCCESS)
    return routed_op_fail(st, kName, ncclUnhandledCudaError, "issuing its copies and sums",
                          cuda_error_string(r));
  routed_op_issued(st);
  return ncclSuccess;
}

// A hold not handed to its graph goes as a graph never replayed (captured_ops.h).
struct UnattachedHold {
  std::unique_ptr<GraphHold> hold;
  ~UnattachedHold() {
    if (hold) graph_gone(hold.release());
  }
};

// Issues a captured op into the application's capture: its plan over its tokens and the
// captured region, on the capture streams, and a hold on what its graph replays (the blocks;
// through the communicator's CaptureLife, the scratch and its peers' mappings). The graph
// orders it among the communicator's ops.
ncclResult_t issue_captured(CommState& st, const RsCall& call, uint64_t chunk, const Arrival& a,
                            BlockClaim& claim) {
  CeComm& ce = *st.ce;
  const CudaDriver& cu = *cuda_driver();
  const char* why = "";
  UnattachedHold h;
  h.hold = new_graph_hold(st, a.seq, claim, &why);
  if (!h.hold) return routed_op_fail(st, kName, ncclSystemError, "capturing a reduce-scatter", why);
  build_view(st, call, chunk, true);
  set_tokens(st, a, h.hold->mine, *h.hold);
  set_scalar(call.op, nccl_type_size(call.datatype), &ce.rs_view);
  ce.rs_plan.clear();
  build_reduce_scatter_plan(ce.rs_view, &ce.rs_plan);
  // An application's capture its own earlier operation invalidated: the op fails here as
  // NCCL's would, and goes as a graph never replayed — no poison: a framework falls back to
  // eager after a failed capture.
  const CUgraph graph = capturing_graph(call.stream);
  if (!graph) return ncclUnhandledCudaError;
  if (!make_capture_streams(cu, &ce))
    return routed_op_fail(st, kName, ncclUnhandledCudaError, "capturing",
                          "cannot create the capture streams");
  if (CUresult r = issue_rs_plan(cu, ce.capture_streams, ce.capture_events, call.stream, ce.rs_plan,
                                 sum_for(ce, call.datatype, call.op, st.nranks), false);
      r != CUDA_SUCCESS)
    return routed_op_fail(st, kName, ncclUnhandledCudaError, "capturing its copies and sums",
                          cuda_error_string(r));
  if (!attach_to_graph(std::move(h.hold), graph, &why))
    return routed_op_fail(st, kName, ncclUnhandledCudaError, "capturing", why);
  return ncclSuccess;
}

}  // namespace

ncclResult_t ce_reduce_scatter(CommState& st, const RsCall& call, bool capturing, ChainPoint chain,
                               bool* to_nccl) {
  *to_nccl = false;
  std::lock_guard<std::mutex> lock(st.issue_mu);  // the communicator's ops one at a time
  ncclResult_t result = ncclSuccess;
  if (routed_op_refused(st, capturing, kName, &result)) return result;
  CeComm& ce = *st.ce;
  ScopedDevice dev(st.device);
  if (!dev.ok())
    return routed_op_fail(st, kName, ncclUnhandledCudaError, "set-up", "no device context");
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
  post_for(st, call.recvcount, call.datatype, call.op.op, capturing, chain, &mine);
  lap(&host.post);
  const uint32_t me = static_cast<uint32_t>(st.rank);
  BlockClaim claim(ce.ops->blocks(), me, mine.block);
  auto give_up = [&st](uint32_t spins) {
    backoff_pause(spins);
    return peer_failed(st);
  };
  Arrival a;
  if (!ce.ops->arrive(me, mine, &a, ce.peer_posts.data(), give_up))
    return routed_op_fail(st, kName, ncclRemoteError, "waiting for room in the op ring",
                          "a peer failed");
  FinishPosts finish(ce, me, a.seq);
  lap(&host.arrive);
  if (*a.mismatch) {
    char detail[kMismatchDetailChars];
    return routed_op_fail(st, kName, ncclInvalidUsage, "ranks disagree on the op",
                          mismatch_detail(a, mine, ce.peer_posts.data(), detail, sizeof detail));
  }
  if (a.verdict == OpVerdict::kNccl) {
    *to_nccl = true;
    return ncclSuccess;
  }
  const uint64_t chunk = call.recvcount * nccl_type_size(call.datatype);
  const ncclResult_t r =
      capturing ? issue_captured(st, call, chunk, a, claim) : issue_eager(st, call, chunk);
  if (r != ncclSuccess) return r;
  lap(&host.issue);
  stats_op_host_times(host);
  ZC_DEBUG("%s on rank %d: op %llu %s (%llu B a rank, slices of %llu B)", kName, st.rank,
           static_cast<unsigned long long>(a.seq), capturing ? "captured" : "issued",
           static_cast<unsigned long long>(chunk), static_cast<unsigned long long>(call.slice));
  return ncclSuccess;
}

}  // namespace zc
