#include "ce_allgather.h"

#include <sched.h>
#include <unistd.h>

#include <cstdio>
#include <memory>
#include <optional>

#include "ce_exec.h"
#include "comm_order.h"
#include "deferred_pushes.h"
#include "fd_headroom.h"
#include "local_aliases.h"
#include "log.h"
#include "monotonic_clock.h"
#include "pair_wait.h"
#include "parked_routes.h"
#include "peer_reach.h"
#include "route_setup.h"
#include "routed_op.h"
#include "spin_backoff.h"
#include "stats.h"

namespace zc {
namespace {

constexpr const char* kName = "zero-copy all-gather";
// Every this many ops, exports of allocations the application freed are withdrawn, and (offset
// by half) the peers are asked which of the allocations imported from them they still export:
// the pace of a busy loop; between ops (and in idle phases) the housekeeping thread does the
// same every period (housekeeping.h).
constexpr uint64_t kSweepEvery = 64;
// Whether a later rank leaves its pushes into earlier ranks of other processes to the push
// issuer as well (claim_as_later): it would take the copy's issue and the peer's reach off the
// caller's thread (most of a later rank's call under FSDP2, 2xH200), but what it costs the
// copies has not been measured on GPUs yet, so it is off; -DZC_LATER_PUSHES_BY_ISSUER=1 at build
// time turns it on to measure it (zerocta-bench and run_fsdp2.sh with
// both builds). No setting.
#ifndef ZC_LATER_PUSHES_BY_ISSUER
#define ZC_LATER_PUSHES_BY_ISSUER 0
#endif
constexpr bool kLaterPushesByIssuer = ZC_LATER_PUSHES_BY_ISSUER != 0;
// Room for the reason of a mismatch with its numbers (the WARN line's; longer is cut).
constexpr size_t kMismatchDetailChars = 256;

// [addr, addr + bytes) described for the peers in other processes, and reached by those in
// this process through a second mapping of its cuMem allocations open to their GPUs (memory
// whose owner granted them no access: PyTorch's expandable segments without peer access). Not
// for a captured op: its graph would outlive the mapping's bookkeeping.
bool described_with_alias(const CudaDriver& cu, uint64_t addr, uint64_t bytes,
                          const ReachNeeds& needs, bool capturing, OpBuffer* out) {
  if (!needs.by_pointer || capturing || needs.npeer_devices == 0) return false;
  ReachNeeds extents_only = needs;
  extents_only.by_pointer = false;
  return describe_buffer(cu, addr, bytes, extents_only, out) &&
         local_alias(cu, addr, bytes, needs.peer_devices, needs.npeer_devices, &out->local_addr);
}

// Fills my post for op `seq`, `chain` the communicator's call chain before it. reach stays 0
// where a peer that needs my buffers could not reach them.
void post_for(CommState& st, const void* send, void* recv, size_t count, ncclDataType_t type,
              uint64_t chunk, bool capturing, ChainPoint chain, OpPost* p) {
  CeComm& ce = *st.ce;
  p->clear();
  p->seq = ce.seq;
  p->mode = capturing ? OpMode::kCaptured : OpMode::kEager;
  p->count = count;
  p->datatype = type;
  p->pid = static_cast<int32_t>(getpid());
  p->calls = chain.calls;
  p->chain = chain.hash;
  const CudaDriver& cu = *cuda_driver();
  const uint64_t total = chunk * static_cast<uint64_t>(st.nranks);
  // The receive buffer first: an in-place op's send chunk lies in it (FSDP2's all-gathers),
  // and is described from its extents without querying each allocation again.
  const uint64_t r = reinterpret_cast<uint64_t>(recv), s = reinterpret_cast<uint64_t>(send);
  // Near its descriptor limit a rank posts its buffers as unreachable before exporting anything
  // (fd_headroom.h): the first rank to arrive then sends the op to NCCL on every rank, and a
  // later one takes part needing imports only, which the reserve left is enough for.
  const bool fds = !ce.needs.by_extents || fd_room_for_op();
  bool ok = fds && (describe_buffer(cu, r, total, ce.needs, &p->recv) ||
                    described_with_alias(cu, r, total, ce.needs, capturing, &p->recv));
  if (ok && p->recv.local_addr && s >= r && s - r <= total - chunk) {
    ReachNeeds extents_only = ce.needs;
    extents_only.by_pointer = false;
    ok = describe_inside(cu, s, chunk, extents_only, p->recv, &p->send);
    p->send.local_addr = p->recv.local_addr + (s - r);
  } else if (ok) {
    ok = describe_inside(cu, s, chunk, ce.needs, p->recv, &p->send) ||
         described_with_alias(cu, s, chunk, ce.needs, capturing, &p->send);
  }
  if (ok) p->reach = (ce.needs.by_pointer ? uint32_t{kReachPointer} : 0u) | kReachExtents;
  // A captured op needs a flag block; without one (the driver cannot capture, or every block is
  // held) this rank's post sends the op to NCCL if it is the first to arrive.
  if (capturing && !(cu.capture_ok && ce.ops->blocks().claim(static_cast<uint32_t>(st.rank),
                                                              &p->block)))
    p->reach = 0;
}

// How long a later rank waits for an earlier one to publish its stage. That rank is inside the
// op already, doing host work only (an allocation the first time, an export): a wait this long
// means it died or hangs, and the op fails rather than waits on.
constexpr int64_t kStageWaitUs = 10 * 1000 * 1000;

// This rank's buffers cannot be reached and ranks arrive after it: makes it reachable through
// its stage for op `seq` (grown if needed, stage_buffer.h) and publishes the stage. A captured
// op (`hold`) gets a stage of its own, which lives as long as its graph.
bool stage_mine(CommState& st, uint64_t seq, uint64_t chunk, GraphHold* hold, uint64_t* stage,
                const char** why) {
  CeComm& ce = *st.ce;
  const CudaDriver& cu = *cuda_driver();
  const uint32_t me = static_cast<uint32_t>(st.rank);
  const uint64_t total = chunk * static_cast<uint64_t>(st.nranks);
  std::unique_ptr<StageBuffer>& buf = hold ? hold->stage : ce.stage;
  if (!buf) buf.reset(new StageBuffer(st.device));
  // An outgrown stage was last used by the op before this one, all of whose work on this rank
  // precedes this op's ready flag on the push stream.
  const DoneMark outgrown =
      hold ? DoneMark{} : DoneMark{ce.ops->ready_flag(me, seq), static_cast<uint32_t>(seq)};
  if (!buf->ensure(cu, total, ce.needs, outgrown, why)) return false;
  OpStage published;
  published.addr = buf->addr();
  published.bytes = total;
  std::unique_ptr<OpBuffer> described(new OpBuffer);  // 16 KiB: off the stack
  if (!describe_buffer(cu, published.addr, total, ce.needs, described.get()) ||
      described->nextents > 1) {
    *why = "its stage cannot be reached by its peers";
    return false;
  }
  if (described->nextents == 1) published.extent = described->extents[0];
  ce.ops->publish_stage(me, seq, published);
  stats_op_staged();
  *stage = published.addr;
  return true;
}

// Earlier rank p's post for op `seq` names buffers no peer can reach: replaces its buffers with
// its stage, waiting for p to publish it.
bool use_stage_of(CommState& st, int p, uint64_t seq, uint64_t chunk, OpPost* post,
                  const char** why) {
  OpStage s;
  const int64_t deadline = monotonic_us() + kStageWaitUs;
  for (uint32_t spins = 0; !st.ce->ops->read_stage(static_cast<uint32_t>(p), seq, &s); ++spins) {
    if (peer_failed(st) || monotonic_us() > deadline) {
      *why = "an earlier rank whose buffers cannot be reached did not publish its stage";
      return false;
    }
    backoff_pause(spins);
  }
  const bool local = post->pid == static_cast<int32_t>(getpid());
  post->reach = local ? kReachPointer : kReachExtents;
  post->recv.addr = s.addr;
  post->recv.bytes = s.bytes;
  post->recv.local_addr = 0;  // a stage is open to every GPU of its process
  post->recv.nextents = local ? 0 : 1;
  post->recv.extents[0] = s.extent;
  post->send = post->recv;
  post->send.addr = s.addr + static_cast<uint64_t>(p) * chunk;
  post->send.bytes = chunk;
  return true;
}

// A captured op (`hold`) keeps a reference to peer p's flag block `block` (ce.peer_blocks),
// or marks itself broken where the peer's graph is gone already: it can never pair.
void refer_to_block(CommState& st, int p, CaptureRef block, GraphHold* hold) {
  if (!hold) return;
  const uint32_t owner = static_cast<uint32_t>(p);
  if (st.ce->ops->blocks().hold(owner, block)) {
    hold->peers.emplace_back(owner, block);
    st.ce->peer_blocks[static_cast<size_t>(p)] = block;
  } else {
    hold->broken = true;
  }
}

// This rank's parts as the later rank of its pairs for op `a.seq`: settled at once, each pair's
// buffers reached. Waits for no peer (beyond an earlier unreachable rank's stage, which that rank
// publishes before it claims or waits itself). `hold`: a captured op's, which takes a reference
// to the block of every peer whose post it reads (ce.peer_blocks) and pins the views it uses.
// `defer`: a push into a peer in another process that settled "each pushes" is left to the
// push issuer too (deferred_pushes.h): issuing a copy into a view of a peer's many
// allocations, and reaching it, took most of such a call's host time (2xH200, FSDP2).
bool claim_as_later(CommState& st, const Arrival& a, const OpPost& mine, uint64_t chunk,
                    GraphHold* hold, bool defer, const char** why) {
  CeComm& ce = *st.ce;
  OpExchange& ops = *ce.ops;
  const uint32_t me = static_cast<uint32_t>(st.rank);
  const uint64_t my_slot_in_peer = static_cast<uint64_t>(st.rank) * chunk;
  for (int p = 0; p < st.nranks; ++p) {
    ce.view.peers[p] = PeerPart{};
    ce.peer_blocks[static_cast<size_t>(p)] = CaptureRef{};
  }
  for (int p = 0; p < st.nranks; ++p) {
    if (p == st.rank || !(a.before >> p & 1)) continue;
    PeerPart& part = ce.view.peers[p];
    OpPost& e = ce.peer_posts[static_cast<size_t>(p)];
    const bool staged = e.reach == 0;  // its post is replaced by its stage's below
    if (staged && !use_stage_of(st, p, a.seq, chunk, &e, why)) return false;
    // Each pushes wherever my buffers can be reached: across processes one GPU's copies to and
    // from another process's memory take turns (docs/PERFORMANCE.md); in this process the
    // earlier rank, which never waits for the claim, may have settled "later does both" first.
    const bool each = mine.reach != 0;
    const PairMode m = ops.settle_pair(static_cast<uint32_t>(p), me, a.seq,
                                       each ? PairMode::kEachPushes : PairMode::kLaterDoesBoth);
    stats_pair_settled(m == PairMode::kEachPushes);
    if (defer && m == PairMode::kEachPushes && !staged && !same_process(st, p)) {
      part.deferred = part.peer_copies = true;
      continue;
    }
    part.push = true;
    part.pull = m == PairMode::kLaterDoesBoth;
    part.peer_copies = m == PairMode::kEachPushes;
    refer_to_block(st, p, e.block, hold);
    if (!reach(st, p, a.seq, e, e.recv, e.recv.addr + my_slot_in_peer, chunk, hold, &part.to, why) ||
        (part.pull && !reach(st, p, a.seq, e, e.send, e.send.addr, chunk, hold, &part.from, why)))
      return false;
  }
  return true;
}

// This rank's parts as the earlier rank of its pairs for op `a.seq`. With `defer`, its pairs
// with later ranks in other processes are left to the push issuer (deferred_pushes.h), which
// settles them as they claim; else it waits for those ranks to claim "each pushes" (as
// PairWait says, the time added to *pair_wait_us_spent) and reaches their buffers. The rest it
// settles as "later does both". `stage`: this rank's, where the later ranks reach it (0: they
// reach its buffers).
bool settle_as_earlier(CommState& st, const Arrival& a, const OpPost& mine, uint64_t chunk,
                       uint64_t stage, CUstream stream, GraphHold* hold, bool defer,
                       int64_t* pair_wait_us_spent, const char** why) {
  CeComm& ce = *st.ce;
  OpExchange& ops = *ce.ops;
  const uint32_t me = static_cast<uint32_t>(st.rank);
  const uint64_t my_slot_in_peer = static_cast<uint64_t>(st.rank) * chunk;
  // A captured op's stream is never asked whether it drained (a capturing stream cannot be).
  // Nor is the legacy stream: querying it while any stream of the context is in a capture is an
  // error that invalidates that capture. Our push stream, which holds this communicator's
  // previous routed op, answers for it.
  const CUstream asked = stream == nullptr || stream == CU_STREAM_LEGACY
                             ? ce.streams[static_cast<int>(DirectStream::kPush)]
                             : stream;
  PairWait wait(monotonic_us(), chunk, st.nranks - 1, hold != nullptr,
                [asked] { return cuda_driver()->cuStreamQuery(asked) != CUDA_ERROR_NOT_READY; });
  for (int p = 0; p < st.nranks; ++p) {
    if (p == st.rank || a.before >> p & 1) continue;
    PeerPart& part = ce.view.peers[p];
    const uint32_t q = static_cast<uint32_t>(p);
    // A later rank that claimed already is pushed to at once, as before the issuer (no
    // hand-over to wait for); one that has not yet is left to the issuer.
    if (defer && !same_process(st, p) && !ops.pair_settled(me, q, a.seq)) {
      part.peer_copies = part.deferred = true;
      part.staged = stage != 0;
      continue;
    }
    if (!same_process(st, p)) {  // give a later rank elsewhere a moment
      const int64_t waited_from = monotonic_us();
      for (uint32_t spins = 0; !ops.pair_settled(me, q, a.seq) && wait.more(monotonic_us()); ++spins) {
        if (spins > kSpinsBeforeYield) sched_yield();  // the wait is bounded: no sleep
        if ((spins & 255) == 255 && peer_failed(st)) break;
      }
      *pair_wait_us_spent += monotonic_us() - waited_from;
    }
    part.peer_copies = true;
    part.staged = stage != 0;
    if (ops.settle_pair(me, q, a.seq, PairMode::kLaterDoesBoth) == PairMode::kLaterDoesBoth)
      continue;
    OpPost& l = ce.peer_posts[q];  // q arrived after me: its entry is free for this op
    if (!ops.read_post(q, a.seq, &l)) {
      *why = "a peer settled a pair without its post";
      return false;
    }
    if (l.mode != mine.mode || l.count != mine.count || l.datatype != mine.datatype) {
      *why = "a later rank issued another op at the same position";
      return false;
    }
    part.push = true;
    refer_to_block(st, p, l.block, hold);
    if (!reach(st, p, a.seq, l, l.recv, l.recv.addr + my_slot_in_peer, chunk, hold, &part.to, why))
      return false;
  }
  return true;
}

// A captured op's flags: the words of its blocks (capture_blocks.h). An op that can never pair
// (`broken`) keeps only its own copy and the started mark, and orphans every block it holds,
// which releases whatever a peer waits on.
void captured_flags(CommState& st, const OpPost& mine, GraphHold& hold) {
  CeComm& ce = *st.ce;
  DirectOpView& v = ce.view;
  CaptureBlocks& b = ce.ops->blocks();
  const uint32_t me = static_cast<uint32_t>(st.rank);
  v.captured = true;
  v.started = ce.dev(b.started(me, mine.block));
  if (hold.broken) {
    for (int p = 0; p < st.nranks; ++p) v.peers[p] = PeerPart{};
    b.orphan(me, mine.block);
    for (const auto& [owner, ref] : hold.peers) b.orphan(owner, ref);
    return;
  }
  for (uint32_t p = 0; p < static_cast<uint32_t>(st.nranks); ++p) {
    if (p == me) continue;
    v.ready_push_out[p] = ce.dev(b.ready_push(me, mine.block, p));
    v.ready_pull_out[p] = ce.dev(b.ready_pull(me, mine.block, p));
    v.done_from[p] = ce.dev(b.done_from(me, mine.block, p));
    const CaptureRef theirs = ce.peer_blocks[p];
    if (!theirs.valid()) continue;  // a pair in which I only wait on my own block
    v.ready_push_in[p] = ce.dev(b.ready_push(p, theirs, me));
    v.ready_pull_in[p] = ce.dev(b.ready_pull(p, theirs, me));
    v.done_to[p] = ce.dev(b.done_from(p, theirs, me));
  }
}

// The op's pushes to peers marked deferred, to the push issuer.
void hand_over_pushes(std::shared_ptr<CommState> st, const Arrival& a, const OpPost& mine) {
  const DirectOpView& v = st->ce->view;
  bool any = false;
  for (int p = 0; p < v.nranks; ++p) any |= p != v.rank && v.peers[p].deferred;
  if (!any) return;
  st->ce->posts_read.job_coming(a.seq);
  defer_pushes(std::move(st), a.seq, a.before, mine, v);
}

void build_view(CommState& st, const Arrival& a, const void* send, void* recv, uint64_t chunk,
                uint64_t stage) {
  CeComm& ce = *st.ce;
  DirectOpView& v = ce.view;
  v.rank = st.rank;
  v.nranks = st.nranks;
  v.chunk = chunk;
  v.send = reinterpret_cast<uint64_t>(send);
  v.recv = reinterpret_cast<uint64_t>(recv);
  v.stage = stage;
  v.captured = false;
  set_ring_flags(ce, st.rank, st.nranks, a.seq, &v);
}

// Housekeeping after a routed op: mappings of peers' allocations that their owners freed, or
// beyond the budget, go once the ops that used them have finished. The owners are asked half a
// sweep period after they sweep their exports, so a freed allocation is seen within about two
// periods.
void tidy(CommState& st) {
  CeComm& ce = *st.ce;
  ce.imports->tidy(*cuda_driver(), ce.seq % kSweepEvery == kSweepEvery / 2, kPeerHeldBudget);
  if (ce.stage) ce.stage->tidy(*cuda_driver());
  // Second mappings of buffers the application freed, as often as its exports are swept.
  if (ce.needs.by_pointer && ce.seq % kSweepEvery == 0) tidy_local_aliases(*cuda_driver());
}

ncclResult_t fail(CommState& st, ncclResult_t code, const char* what, const char* why) {
  return routed_op_fail(st, kName, code, what, why);
}

}  // namespace

struct RoutedAllGather::State {
  State(CommState& s, const void* send, void* recv, size_t count, ncclDataType_t type,
        uint64_t bytes_per_rank, CUstream strm, bool capt, ChainPoint at)
      : st(s), sendbuff(send), recvbuff(recv), sendcount(count), datatype(type),
        chunk(bytes_per_rank), stream(strm), capturing(capt), chain(at) {}
  ~State() {
    if (hold) graph_gone(hold.release());  // an op that fails before its graph holds it never runs
  }
  void lap(int64_t* into) {
    const int64_t t = monotonic_us();
    *into += t - mark;
    mark = t;
  }
  // The steps of begin(), in order.
  bool refused(ncclResult_t* result);
  bool post_and_arrive(ncclResult_t* result);
  bool hold_for_graph(ncclResult_t* result);
  bool stage_and_claim(ncclResult_t* result);
  // complete()'s last step.
  ncclResult_t issue();

  CommState& st;
  const void* sendbuff;
  void* recvbuff;
  size_t sendcount;
  ncclDataType_t datatype;
  uint64_t chunk;
  CUstream stream;
  bool capturing;
  ChainPoint chain;
  // Held from begin() to the end: the communicator's ops are issued one at a time.
  std::unique_lock<std::mutex> lock;
  bool to_nccl = false;
  HostTimes host;
  int64_t mark = 0;
  OpPost mine;
  Arrival a;
  std::optional<BlockClaim> claim;
  std::optional<FinishPosts> finish;
  std::unique_ptr<GraphHold> hold;
  uint64_t stage = 0;
  // Pushes into other processes go to the push issuer (decided in begin(), for both steps).
  bool defer = false;
  std::shared_ptr<CommState> self;  // the communicator, for the issuer's job
};

RoutedAllGather::RoutedAllGather(CommState& st, const void* sendbuff, void* recvbuff,
                                 size_t sendcount, ncclDataType_t datatype, uint64_t bytes_per_rank,
                                 CUstream stream, bool capturing, ChainPoint chain)
    : s_(new State(st, sendbuff, recvbuff, sendcount, datatype, bytes_per_rank, stream, capturing,
                   chain)) {}

RoutedAllGather::~RoutedAllGather() = default;

bool RoutedAllGather::to_nccl() const { return s_->to_nccl; }

// Whether the op cannot start on the route (routed_op_refused, *result holds the error), or
// every rank is in this process (to_nccl). Before the op reaches any peer.
bool RoutedAllGather::State::refused(ncclResult_t* result) {
  if (routed_op_refused(st, capturing, kName, result)) return true;
  CeComm* ce = st.ce.get();
  // Every rank in this process, ops coming one by one (not as one thread's group over all of
  // them, local_group_allgather.h): NCCL's. Measured with this exchange: nccl-tests -t 2 (a
  // thread per GPU) ran at 172.6 / 191.1 / 196.7 GB/s in place at 64 MiB / 256 MiB / 1 GiB on
  // 2 H200s, below NCCL's kernel path, the later rank's two copies taking turns; and on 4
  // H200s in one process its plans stalled (docs/RELIABILITY.md), not understood yet. Every
  // rank of such a communicator is here and decides alike, without the exchange.
  if (ce->all_local()) {
    if (!ce->told_one_by_one) {
      ce->told_one_by_one = true;
      ZC_INFO("zero-copy all-gather on rank %d/%d: every rank is in this process and its "
              "all-gathers come one by one, not in one group of this thread over every rank: "
              "they go to NCCL (docs/PERFORMANCE.md)",
              st.rank, st.nranks);
    }
    to_nccl = true;
    return true;
  }
  return false;
}

// Numbers the op, posts it and arrives; false when it is over (an error in *result, or the
// verdict sent it to NCCL: to_nccl).
bool RoutedAllGather::State::post_and_arrive(ncclResult_t* result) {
  const CudaDriver* cu = cuda_driver();
  CeComm* ce = st.ce.get();
  ++ce->seq;
  // Exports of allocations the application freed are withdrawn now and then, whatever route
  // the ops take (an export keeps its allocation alive); never during a capture.
  if (!capturing && ce->seq % kSweepEvery == 0) sweep_exports(*cu);
  // Peers' memory their owners freed goes while none of this rank's copies run (peer_memory.h).
  if (!capturing) ce->imports->release_while_idle(*cu, kPeerHeldBudget);
  post_for(st, sendbuff, recvbuff, sendcount, datatype, chunk, capturing, chain, &mine);
  lap(&host.post);
  const uint32_t me = static_cast<uint32_t>(st.rank);
  auto give_up = [&](uint32_t spins) {
    backoff_pause(spins);
    return peer_failed(st);
  };
  claim.emplace(ce->ops->blocks(), me, mine.block);
  if (!ce->ops->arrive(me, mine, &a, ce->peer_posts.data(), give_up)) {
    *result = fail(st, ncclRemoteError, "waiting for room in the op ring", "a peer failed");
    return false;
  }
  finish.emplace(*ce, me, a.seq);
  lap(&host.arrive);
  if (*a.mismatch) {
    char detail[kMismatchDetailChars];
    *result = fail(st, ncclInvalidUsage, "ranks disagree on the op",
                   mismatch_detail(a, mine, ce->peer_posts.data(), detail, sizeof detail));
    return false;
  }
  if (a.verdict == OpVerdict::kNccl) {
    to_nccl = true;
    return false;
  }
  return true;
}

// A captured op's hold on what its graph replays (captured_ops.h); false with *result when no
// flag block could be had.
bool RoutedAllGather::State::hold_for_graph(ncclResult_t* result) {
  const char* why = "";
  hold = new_graph_hold(st, a.seq, *claim, &why);
  if (!hold) *result = fail(st, ncclSystemError, "capturing an all-gather", why);
  return hold != nullptr;
}

// Stages this rank's buffers where later peers cannot reach them, and settles its pairs with
// the earlier ranks; false with *result on a failure.
bool RoutedAllGather::State::stage_and_claim(ncclResult_t* result) {
  const uint32_t me = static_cast<uint32_t>(st.rank);
  const uint64_t all = st.nranks >= 64 ? ~uint64_t{0} : (uint64_t{1} << st.nranks) - 1;
  const bool peers_need_mine = (a.before | uint64_t{1} << me) != all;
  const char* why = "";
  if (peers_need_mine && mine.reach == 0 && !stage_mine(st, a.seq, chunk, hold.get(), &stage, &why)) {
    *result = fail(st, ncclSystemError, "staging buffers its later peers cannot reach", why);
    return false;
  }
  // An eager op leaves its pushes into ranks of other processes to the push issuer: this call
  // then waits for no peer and issues no copy into a peer (push_issuer.h).
  if (!capturing && can_defer_pushes(st)) {
    self = st.weak_from_this().lock();
    defer = self != nullptr;
  }
  if (!claim_as_later(st, a, mine, chunk, hold.get(), defer && kLaterPushesByIssuer, &why)) {
    *result = fail(st, peer_failed(st) ? ncclRemoteError : ncclSystemError,
                   "reaching a peer's buffers", why);
    return false;
  }
  return true;
}

bool RoutedAllGather::begin(ncclResult_t* result) {
  State& x = *s_;
  *result = ncclSuccess;
  x.lock = std::unique_lock<std::mutex>(x.st.issue_mu);
  if (x.refused(result)) return false;
  ScopedDevice dev(x.st.device);
  if (!dev.ok()) {
    *result = fail(x.st, ncclUnhandledCudaError, "set-up", "no device context");
    return false;
  }
  // Imports, mappings and streams made during an application's capture: PyTorch captures in
  // global mode, where they would invalidate it.
  RelaxedCapture relaxed(x.capturing);
  x.mark = monotonic_us();
  if (!x.post_and_arrive(result) || (x.capturing && !x.hold_for_graph(result)) ||
      !x.stage_and_claim(result))
    return false;
  x.lap(&x.host.reach);
  ZC_DEBUG("zero-copy all-gather on rank %d: op %llu posted and its pairs with earlier ranks "
           "claimed",
           x.st.rank, static_cast<unsigned long long>(x.a.seq));
  return true;
}

// Issues the op's plan (built in st.ce->plan): on the route's streams in NCCL's order among
// the communicator's ops, or into the application's capture; then what keeps the buffers'
// second mappings and a captured op's graph hold.
ncclResult_t RoutedAllGather::State::issue() {
  CeComm* ce = st.ce.get();
  const CudaDriver* cu = cuda_driver();
  const char* why = "";
  const CUstream* streams = ce->streams;
  const CUevent* events = ce->events;
  CUgraph graph = nullptr;
  if (hold) {
    // An application's capture its own earlier operation invalidated: the op fails here as
    // NCCL's would, and goes as a graph never replayed (its blocks orphaned for a peer that
    // captured it) — no poison: a framework falls back to eager after a failed capture.
    if (!(graph = capturing_graph(stream))) return ncclUnhandledCudaError;
    if (!make_capture_streams(*cu, ce))
      return fail(st, ncclUnhandledCudaError, "capturing", "cannot create the capture streams");
    streams = ce->capture_streams;
    events = ce->capture_events;
  }
  // NCCL's order among the communicator's ops (comm_order.h); a captured op's graph orders it.
  if (!hold)
    if (CUresult r = order_routed_op(st, streams); r != CUDA_SUCCESS)
      return fail(st, ncclUnhandledCudaError, "ordering it after NCCL's ops", cuda_error_string(r));
  if (CUresult r = issue_plan(*cu, streams, events, stream, ce->plan, !hold); r != CUDA_SUCCESS)
    return fail(st, ncclUnhandledCudaError, "issuing its copies", cuda_error_string(r));
  // Again once issued: the context may have failed during the op's host work.
  if (!hold)
    if (CUresult r = route_context_error(*ce); r != CUDA_SUCCESS)
      return fail(st, ncclUnhandledCudaError, "issuing its copies", cuda_error_string(r));
  if (!hold) routed_op_issued(st);
  // My peers in this process write into (and may read from) my buffers through their second
  // mappings; my push stream passes this point only after every such peer said done, so an
  // event there keeps the mappings until their copies have finished.
  for (const OpBuffer* b : {&mine.recv, &mine.send})
    if (b->local_addr &&
        !local_alias_used(*cu, b->local_addr, st.device,
                          ce->streams[static_cast<int>(DirectStream::kPush)]))
      return fail(st, ncclUnhandledCudaError, "keeping a second mapping", "cuEventRecord failed");
  if (hold && !attach_to_graph(std::move(hold), graph, &why))
    return fail(st, ncclUnhandledCudaError, "capturing", why);
  return ncclSuccess;
}

ncclResult_t RoutedAllGather::complete() {
  State& x = *s_;
  CommState& st = x.st;
  CeComm* ce = st.ce.get();
  ScopedDevice dev(st.device);
  if (!dev.ok()) return fail(st, ncclUnhandledCudaError, "set-up", "no device context");
  RelaxedCapture relaxed(x.capturing);
  x.mark = monotonic_us();  // the time since begin() went to other ranks' ops of this thread
  ZC_DEBUG("zero-copy all-gather on rank %d: op %llu settles its pairs with later ranks",
           st.rank, static_cast<unsigned long long>(x.a.seq));
  const char* why = "";
  int64_t waited = 0, reached = 0;
  if (!settle_as_earlier(st, x.a, x.mine, x.chunk, x.stage, x.stream, x.hold.get(), x.defer,
                         &waited, &why))
    return fail(st, peer_failed(st) ? ncclRemoteError : ncclSystemError,
                "reaching a peer's buffers", why);
  x.lap(&reached);
  x.host.pair_wait += waited;
  x.host.reach += reached - waited;  // settle_as_earlier both waits for claims and reaches
  build_view(st, x.a, x.sendbuff, x.recvbuff, x.chunk, x.stage);
  if (x.hold) captured_flags(st, x.mine, *x.hold);
  ce->plan.clear();
  build_direct_plan(ce->view, &ce->plan);
  // Handed over before the plan is issued: what the job issues waits on the GPU for this plan's
  // ready, and this plan for the job's pushed (a driver that ran streams in the calling thread,
  // as the tests' fake does, would otherwise wait for a job not handed over yet).
  if (x.defer) hand_over_pushes(std::move(x.self), x.a, x.mine);
  if (ncclResult_t r = x.issue(); r != ncclSuccess) return r;
  if (!x.capturing) tidy(st);
  x.lap(&x.host.issue);
  stats_op_host_times(x.host);
  return ncclSuccess;
}

ncclResult_t ce_allgather(CommState& st, const void* sendbuff, void* recvbuff, size_t sendcount,
                          ncclDataType_t datatype, uint64_t chunk, CUstream stream, bool capturing,
                          ChainPoint chain, bool* to_nccl) {
  RoutedAllGather op(st, sendbuff, recvbuff, sendcount, datatype, chunk, stream, capturing, chain);
  ncclResult_t r;
  if (op.begin(&r)) r = op.complete();
  *to_nccl = op.to_nccl();
  return r;
}

void set_ring_flags(const CeComm& ce, int me, int nranks, uint64_t seq, DirectOpView* v) {
  v->seq = static_cast<uint32_t>(seq);
  const uint32_t um = static_cast<uint32_t>(me);
  for (uint32_t r = 0; r < static_cast<uint32_t>(nranks); ++r) {
    v->ready[r] = ce.dev(ce.ops->ready_flag(r, seq));
    v->done_to[r] = ce.dev(ce.ops->done_flag(r, um, seq));
    v->done_from[r] = ce.dev(ce.ops->done_flag(um, r, seq));
  }
  v->pushed = ce.dev(ce.ops->pushed_flag(um, seq));
}

}  // namespace zc
