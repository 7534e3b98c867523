#include "ce_allgather.h"

#include <sched.h>
#include <time.h>
#include <unistd.h>

#include "ce_exec.h"
#include "log.h"
#include "route_setup.h"
#include "stats.h"

namespace zc {
namespace {

// Imports of peers' buffers a rank keeps mapped before it releases the least recently used: an
// import keeps memory alive that its owner may have freed (peer_memory.h).
constexpr uint64_t kHeldBudget = uint64_t{16} << 30;
// Every this many ops, exports of allocations the application freed are withdrawn, and (offset
// by half) the peers are asked which of the allocations imported from them they still export.
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

// How long an earlier rank waits for a later one in another process to claim "each pushes"
// before it leaves both copies to it (op_exchange.h): a base for ranks that issue in step, plus
// the op's own transfer time at ~400 GB/s, which is what the fallback would add on the device
// (one GPU carrying both directions across processes runs them at half speed). A rank whose
// host runs ahead of its peers' is slowed by this until it is back in step, which lets the
// pairs push both ways again. Measured with FSDP2 (run_fsdp2.sh comm, 2xH100, 805 MB chunks),
// step time against the plain run: a flat 50 us wait, 1.018 (nearly every pair fell back);
// 300 us + half the transfer time, 0.971 (17 % fell back); 1 ms + twice it, 0.966 (2 %).
// (The two constants can be set at build time, -DZC_PAIR_WAIT_BASE_US=... and
// -DZC_PAIR_WAIT_BYTES_PER_US=..., to measure others against them; they are no setting.)
#ifndef ZC_PAIR_WAIT_BASE_US
#define ZC_PAIR_WAIT_BASE_US 300
#endif
#ifndef ZC_PAIR_WAIT_BYTES_PER_US
#define ZC_PAIR_WAIT_BYTES_PER_US 400000
#endif
int64_t pair_wait_us(uint64_t chunk) {
  return ZC_PAIR_WAIT_BASE_US + static_cast<int64_t>(chunk / ZC_PAIR_WAIT_BYTES_PER_US);
}

int64_t now_us() {
  timespec t;
  clock_gettime(CLOCK_MONOTONIC, &t);
  return static_cast<int64_t>(t.tv_sec) * 1000000 + t.tv_nsec / 1000;
}

// A peer's buffer range as this process addresses it: by address in its process, else imported.
bool reach(CommState& st, int p, const OpPost& post, const OpBuffer& buf, uint64_t addr,
           uint64_t bytes, Span* out, const char** why) {
  if (post.reach == 0) {
    *why = "a rank's buffers cannot be reached by its peers (another allocator on that rank?)";
    return false;
  }
  if (post.pid == static_cast<int32_t>(getpid())) {
    *out = Span{addr, bytes};
    return true;
  }
  const MemberFacts& m = st.members[static_cast<size_t>(p)];
  CeComm& ce = *st.ce;
  // My copies that touch p's buffers have finished once my push stream tells p so.
  const DoneMark done{
      ce.ops->done_flag(static_cast<uint32_t>(p), static_cast<uint32_t>(st.rank), ce.seq),
      static_cast<uint32_t>(ce.seq)};
  return ce.imports->resolve(*cuda_driver(), buf, m.pid, m.fd_address, addr, bytes, ce.seq, done,
                             out, why);
}

bool same_process(const CommState& st, int p) {
  return st.members[static_cast<size_t>(p)].pid == static_cast<int32_t>(getpid());
}

bool peer_failed(const CommState& st) {
  return st.poisoned.load() != ncclSuccess || route_peer_poison(st) != ncclSuccess;
}

// How long a later rank waits for an earlier one to publish its stage. That rank is inside the
// op already, doing host work only (an allocation the first time, an export): a wait this long
// means it died or hangs, and the op fails rather than waits on.
constexpr int64_t kStageWaitUs = 10 * 1000 * 1000;

// This rank's buffers cannot be reached and ranks arrive after it: makes it reachable through
// its stage for op `seq` (grown if needed, stage_buffer.h) and publishes the stage.
bool stage_mine(CommState& st, uint64_t seq, uint64_t chunk, uint64_t* stage, const char** why) {
  CeComm& ce = *st.ce;
  const CudaDriver& cu = *cuda_driver();
  const uint32_t me = static_cast<uint32_t>(st.rank);
  const uint64_t total = chunk * static_cast<uint64_t>(st.nranks);
  if (!ce.stage) ce.stage.reset(new StageBuffer(st.device));
  // An outgrown stage was last used by the op before this one, all of whose work on this rank
  // precedes this op's ready flag on the push stream.
  const DoneMark outgrown{ce.ops->ready_flag(me, seq), static_cast<uint32_t>(seq)};
  if (!ce.stage->ensure(cu, total, ce.needs, outgrown, why)) return false;
  OpStage published;
  published.addr = ce.stage->addr();
  published.bytes = total;
  OpBuffer described;
  if (!describe_buffer(cu, published.addr, total, ce.needs, &described) || described.nextents > 1) {
    *why = "its stage cannot be reached by its peers";
    return false;
  }
  if (described.nextents == 1) published.extent = described.extents[0];
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
  const int64_t deadline = now_us() + kStageWaitUs;
  for (uint32_t spins = 0; !st.ce->ops->read_stage(static_cast<uint32_t>(p), seq, &s); ++spins) {
    if (peer_failed(st) || now_us() > deadline) {
      *why = "an earlier rank whose buffers cannot be reached did not publish its stage";
      return false;
    }
    if (spins > 1000)
      usleep(20);
    else if (spins > 64)
      sched_yield();
  }
  const bool local = post->pid == static_cast<int32_t>(getpid());
  post->reach = local ? kReachPointer : kReachExtents;
  post->recv.addr = s.addr;
  post->recv.bytes = s.bytes;
  post->recv.nextents = local ? 0 : 1;
  post->recv.extents[0] = s.extent;
  post->send = post->recv;
  post->send.addr = s.addr + static_cast<uint64_t>(p) * chunk;
  post->send.bytes = chunk;
  return true;
}

// This rank's part with every peer for op `a.seq`: as the later rank of a pair it settles the
// pair at once; as the earlier one it waits for later ranks in other processes to claim "each
// pushes" (pair_wait_us in all, added to *pair_wait_us_spent), then settles the rest as "later
// does both". `stage`: this rank's, where the later ranks reach it (0: they reach its buffers).
bool plan_parts(CommState& st, const Arrival& a, const OpPost& mine, uint64_t chunk, uint64_t stage,
                int64_t* pair_wait_us_spent, const char** why) {
  CeComm& ce = *st.ce;
  OpExchange& ops = *ce.ops;
  const uint32_t me = static_cast<uint32_t>(st.rank);
  const uint64_t my_slot_in_peer = static_cast<uint64_t>(st.rank) * chunk;
  const int64_t deadline = now_us() + pair_wait_us(chunk);
  for (int p = 0; p < st.nranks; ++p) {
    PeerPart& part = ce.view.peers[p];
    part = PeerPart{};
    if (p == st.rank) continue;
    const uint32_t q = static_cast<uint32_t>(p);
    if (a.before >> p & 1) {  // I am the later one
      OpPost& e = ce.earlier[static_cast<size_t>(p)];
      if (e.reach == 0 && !use_stage_of(st, p, a.seq, chunk, &e, why)) return false;
      const bool each = !same_process(st, p) && mine.reach != 0;
      const PairMode m =
          ops.settle_pair(q, me, a.seq, each ? PairMode::kEachPushes : PairMode::kLaterDoesBoth);
      stats_pair_settled(m == PairMode::kEachPushes);
      part.push = true;
      part.pull = m == PairMode::kLaterDoesBoth;
      part.peer_copies = m == PairMode::kEachPushes;
      if (!reach(st, p, e, e.recv, e.recv.addr + my_slot_in_peer, chunk, &part.to, why) ||
          (part.pull && !reach(st, p, e, e.send, e.send.addr, chunk, &part.from, why)))
        return false;
      continue;
    }
    if (!same_process(st, p)) {  // I am the earlier one: give a later rank elsewhere a moment
      const int64_t waited_from = now_us();
      for (uint32_t spins = 0; !ops.pair_settled(me, q, a.seq) && now_us() < deadline; ++spins)
        if (spins > 64) sched_yield();
      *pair_wait_us_spent += now_us() - waited_from;
    }
    part.peer_copies = true;
    part.staged = stage != 0;
    if (ops.settle_pair(me, q, a.seq, PairMode::kLaterDoesBoth) == PairMode::kLaterDoesBoth)
      continue;
    OpPost l;
    if (!ops.read_post(q, a.seq, &l)) {
      *why = "a peer settled a pair without its post";
      return false;
    }
    if (l.mode != mine.mode || l.count != mine.count || l.datatype != mine.datatype) {
      *why = "a later rank issued another op at the same position";
      return false;
    }
    part.push = true;
    if (!reach(st, p, l, l.recv, l.recv.addr + my_slot_in_peer, chunk, &part.to, why)) return false;
  }
  return true;
}

void build_view(CommState& st, const Arrival& a, const void* send, void* recv, uint64_t chunk,
                uint64_t stage) {
  CeComm& ce = *st.ce;
  DirectOpView& v = ce.view;
  const uint32_t me = static_cast<uint32_t>(st.rank);
  v.rank = st.rank;
  v.nranks = st.nranks;
  v.seq = static_cast<uint32_t>(a.seq);
  v.chunk = chunk;
  v.send = reinterpret_cast<uint64_t>(send);
  v.recv = reinterpret_cast<uint64_t>(recv);
  v.stage = stage;
  for (uint32_t r = 0; r < static_cast<uint32_t>(st.nranks); ++r) {
    v.ready[r] = ce.dev(ce.ops->ready_flag(r, a.seq));
    v.done_to[r] = ce.dev(ce.ops->done_flag(r, me, a.seq));
    v.done_from[r] = ce.dev(ce.ops->done_flag(me, r, a.seq));
  }
}

// Housekeeping after a routed op: mappings of peers' allocations that their owners freed, or
// beyond the budget, go once the ops that used them have finished. The owners are asked half a
// sweep period after they sweep their exports, so a freed allocation is seen within about two
// periods.
void tidy(CommState& st) {
  CeComm& ce = *st.ce;
  ce.imports->tidy(*cuda_driver(), ce.seq % kSweepEvery == kSweepEvery / 2, kHeldBudget);
  if (ce.stage) ce.stage->tidy(*cuda_driver());
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
                          ncclDataType_t datatype, uint64_t chunk, CUstream stream, bool capturing,
                          bool* to_nccl) {
  *to_nccl = false;
  const CudaDriver* cu = cuda_driver();
  std::lock_guard<std::mutex> lock(st.issue_mu);
  if (int p = st.poisoned.load(); p != ncclSuccess) return static_cast<ncclResult_t>(p);
  CeComm* ce = st.ce.get();
  if (!ce || !ce->prepared || !ce->ops || !cu)
    return fail(st, ncclInternalError, "set-up", "not prepared");
  ScopedDevice dev(st.device);
  if (!dev.ok()) return fail(st, ncclUnhandledCudaError, "set-up", "no device context");
  HostTimes host;
  int64_t mark = now_us();
  auto lap = [&mark](int64_t* into) {
    const int64_t t = now_us();
    *into += t - mark;
    mark = t;
  };
  ++ce->seq;
  // Exports of allocations the application freed are withdrawn now and then, whatever route
  // the ops take (an export keeps its allocation alive); never during a capture, which makes
  // no driver call of ours.
  if (!capturing && ce->seq % kSweepEvery == 0) sweep_exports(*cu);
  OpPost mine;
  post_for(st, sendbuff, recvbuff, sendcount, datatype, chunk, capturing, &mine);
  lap(&host.post);
  Arrival a;
  const uint32_t me = static_cast<uint32_t>(st.rank);
  auto give_up = [&](uint32_t spins) {
    if (spins > 1000) usleep(spins > 100000 ? 1000 : 20);
    return peer_failed(st);
  };
  if (!ce->ops->arrive(me, mine, &a, ce->earlier.data(), give_up))
    return fail(st, ncclRemoteError, "waiting for room in the op ring", "a peer failed");
  struct Finish {  // this rank is done with op seq's posts, whatever happens next
    OpExchange& ops;
    uint32_t me;
    uint64_t seq;
    ~Finish() { ops.finish(me, seq); }
  } finish{*ce->ops, me, a.seq};
  lap(&host.arrive);
  if (*a.mismatch) return fail(st, ncclInvalidUsage, "ranks disagree on the op", a.mismatch);
  if (a.verdict == OpVerdict::kNccl) {
    *to_nccl = true;
    return ncclSuccess;
  }
  const uint64_t all = st.nranks >= 64 ? ~uint64_t{0} : (uint64_t{1} << st.nranks) - 1;
  const bool peers_need_mine = (a.before | uint64_t{1} << me) != all;
  const char* why = "";
  uint64_t stage = 0;
  if (peers_need_mine && mine.reach == 0 && !stage_mine(st, a.seq, chunk, &stage, &why))
    return fail(st, ncclSystemError, "staging buffers its later peers cannot reach", why);
  if (!plan_parts(st, a, mine, chunk, stage, &host.pair_wait, &why))
    return fail(st, peer_failed(st) ? ncclRemoteError : ncclSystemError,
                "reaching a peer's buffers", why);
  lap(&host.reach);
  host.reach -= host.pair_wait;  // plan_parts both waits for claims and reaches: told apart
  build_view(st, a, sendbuff, recvbuff, chunk, stage);
  ce->plan.clear();
  build_direct_plan(ce->view, &ce->plan);
  if (CUresult r = issue_plan(*cu, ce->streams, ce->events, stream, ce->plan); r != CUDA_SUCCESS)
    return fail(st, ncclUnhandledCudaError, "issuing its copies", cuda_error_string(r));
  tidy(st);
  lap(&host.issue);
  stats_op_host_times(host);
  return ncclSuccess;
}

}  // namespace zc
