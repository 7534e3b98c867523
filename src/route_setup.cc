#include "route_setup.h"

#include <unistd.h>

#include <algorithm>
#include <cstring>
#include <mutex>
#include <set>
#include <string>

#include "config.h"
#include "fd_exchange.h"
#include "log.h"
#include "process_info.h"
#include "real_nccl.h"
#include "stats.h"

namespace zc {
namespace {

// How long the prepare phase waits for a peer's fd service: it answers from its own thread,
// whatever the peer's application does, so only a dead or wedged process takes this long.
constexpr int kFdTimeoutMs = 5000;
constexpr int kProbeTimeoutMs = 1000;

// The arena's layout depends on the settings only, not on the communicator's size, so that a
// child can lay out and initialise its flags before NCCL tells it how many ranks it has. Push
// cuts a slot into one sub-slot per peer (ce_plan.h, push_piece_bytes).
ArenaLayout layout_for(const Config& cfg) {
  uint64_t slot = cfg.chunk_bytes;
  const uint64_t eighth = (cfg.pool_bytes / 8) & ~uint64_t{4095};
  if (eighth > 0) slot = std::min(slot, eighth);
  return ArenaLayout::make(cfg.pool_bytes, slot);
}

uint32_t marker_for(uint32_t join_index, uint64_t fingerprint) {
  return 0x5a000000u ^ join_index ^ static_cast<uint32_t>(fingerprint << 8);
}

int local_ordinal_of(const CudaDriver& cu, const unsigned char uuid[16]) {
  int n = 0;
  cu.cuDeviceGetCount(&n);
  for (int i = 0; i < n; ++i) {
    CUdevice d;
    CUuuid u;
    if (cu.cuDeviceGet(&d, i) == CUDA_SUCCESS && cu.cuDeviceGetUuid(&u, d) == CUDA_SUCCESS &&
        memcmp(u.bytes, uuid, 16) == 0)
      return i;
  }
  return -1;
}

// The flags' initial state (ce_plan.h): ready = 0, done = 1 (every slot free), the constant 1,
// and the marker peers verify their mapping by.
bool init_flags(const CudaDriver& cu, const ArenaMapping& a, const ArenaLayout& layout,
                uint32_t marker) {
  CUstream s = nullptr;
  if (cu.cuStreamCreate(&s, CU_STREAM_NON_BLOCKING) != CUDA_SUCCESS) return false;
  bool ok = cu.cuMemsetD32Async(a.va, 0, layout.flags_bytes / 4, s) == CUDA_SUCCESS;
  for (int slot = 0; slot < layout.nslots && ok; ++slot)
    ok = cu.cuMemsetD32Async(a.va + layout.done_offset(slot, 0), 1, kMaxRanks, s) == CUDA_SUCCESS;
  ok = ok && cu.cuMemsetD32Async(a.va + layout.one_offset(), 1, 1, s) == CUDA_SUCCESS;
  ok = ok && cu.cuMemsetD32Async(a.va + layout.marker_offset(), marker, 1, s) == CUDA_SUCCESS;
  ok = ok && cu.cuStreamSynchronize(s) == CUDA_SUCCESS;
  cu.cuStreamDestroy(s);
  return ok;
}

// Creates this rank's arena and publishes its descriptor. Problems are reported, not hidden:
// they travel in the facts so that every rank passes through.
uint32_t make_arena(const CudaDriver& cu, const Config& cfg, const JoinPlan& plan, CeComm* ce,
                    MemberFacts* f) {
  // The fd service first: its address is published whatever happens next, so that peers
  // probing it learn of this rank's real problem rather than of a missing service.
  FdService* service = fd_service();
  if (service) snprintf(f->fd_address, sizeof f->fd_address, "%s", service->address());
  ScopedDevice on(plan.device);
  if (!on.ok()) return kProblemDevice;
  ce->layout = layout_for(cfg);
  f->pool_bytes = arena_bytes_for(cu, plan.device, ce->layout.arena_bytes());
  if (!arena_create(cu, plan.device, f->pool_bytes, &ce->own)) return kProblemPool;
  stats_pool_bytes_add(static_cast<int64_t>(ce->own.bytes));
  if (!init_flags(cu, ce->own, ce->layout, marker_for(plan.join_index, cfg.fingerprint)))
    return kProblemPool;
  if (!service) return kProblemFdService;
  const int fd = arena_export_fd(cu, ce->own);
  if (fd < 0) return kProblemPool;
  ce->own_token = service->publish(fd);
  close(fd);
  if (ce->own_token == 0) return kProblemFdService;
  f->pool_token = ce->own_token;
  return 0;
}

// What this rank can check of every other member it sees after publishing its own facts: a
// direct P2P path to its GPU and its fd service. Of two ranks, the one that published second
// sees the other, so every pair is checked by at least one of them.
uint32_t check_members(const CudaDriver& cu, const JoinPlan& plan,
                       const std::vector<MemberFacts>& members) {
  uint32_t problems = 0;
  CUdevice me;
  if (cu.cuDeviceGet(&me, plan.device) != CUDA_SUCCESS) return kProblemDevice;
  for (const MemberFacts& m : members) {
    if (m.join_index == plan.join_index) continue;
    const int ord = local_ordinal_of(cu, m.uuid);
    CUdevice peer;
    int can = 0;
    if (ord < 0 || ord == plan.device || cu.cuDeviceGet(&peer, ord) != CUDA_SUCCESS ||
        cu.cuDeviceCanAccessPeer(&can, me, peer) != CUDA_SUCCESS || !can)
      problems |= kProblemP2p;
    if (!fd_probe(m.fd_address, m.pid, kProbeTimeoutMs)) problems |= kProblemFdService;
  }
  return problems;
}

// One WARN per process and reason; every decision is also one INFO line per communicator.
void say_decision(const CommState& st, const Agreement& a) {
  const unsigned long long bytes = st.ce ? st.ce->own.bytes : 0;
  if (a.commit) {
    ZC_INFO("route: rank %d/%d dev %d: copy-engine all-gather engaged (%llu B of route memory)",
            st.rank, st.nranks, st.device, bytes);
    return;
  }
  ZC_INFO("route: rank %d/%d dev %d: copy-engine all-gather not engaged: %s", st.rank, st.nranks,
          st.device, a.why);
  if (!a.warn) return;
  static std::mutex mu;
  static std::set<std::string>* said = new std::set<std::string>;
  std::lock_guard<std::mutex> lock(mu);
  if (said->insert(a.why).second)
    ZC_WARN("copy-engine all-gather off for a communicator: %s", a.why);
}

// A rank that cannot join passes through, and so do its peers (they miss a member): one WARN
// per process and reason, since a foreign segment or a full /dev/shm is the host's problem.
void say_join_failure(const char* why) {
  static std::mutex mu;
  static std::set<std::string>* said = new std::set<std::string>;
  std::lock_guard<std::mutex> lock(mu);
  if (said->insert(why).second)
    ZC_WARN("copy-engine all-gather off: this rank cannot join its communicator's channel: %s",
            why);
}

void release_arena(CommState& st, bool aborting = false) {
  const CudaDriver* cu = cuda_driver();
  if (!st.ce || !cu) return;
  CeComm& ce = *st.ce;
  if (aborting && ce.captured) {
    // A graph replay may still wait on these flags, or copy into this memory, on streams no
    // one can drain from here: keep the memory mapped (until the process ends) rather than
    // fault a replay. Its waits were released (route_release_waits).
    ZC_INFO(
        "route: rank %d keeps %llu B of route memory mapped after the abort (CUDA graphs "
        "captured on this communicator may still replay)",
        st.rank, static_cast<unsigned long long>(ce.own.bytes));
    st.ce.release();
    return;
  }
  if (ce.own_token)
    if (FdService* s = fd_service()) s->withdraw(ce.own_token);
  ce.own_token = 0;
  ScopedDevice on(st.device);
  for (ArenaMapping& p : ce.peers) arena_release(*cu, &p);
  if (ce.own) {
    stats_pool_bytes_add(-static_cast<int64_t>(ce.own.bytes));
    arena_release(*cu, &ce.own);
  }
  st.ce.reset();
}

}  // namespace

bool route_wanted(int nranks) {
  const Config& cfg = config();
  if (cfg.allgather != AllGatherMode::kAuto && cfg.allgather != AllGatherMode::kZerocta)
    return false;
  if (runtime_tier() != RuntimeTier::kFull) return false;
  const CudaDriver* cu = cuda_driver();
  if (!cu || !cu->ce_ok) return false;
  if (nranks == 0) return true;  // a child: its size is known only at the freeze
  if (nranks < 2 || nranks > kMaxRanks) return false;
  return cfg.allgather != AllGatherMode::kAuto || cfg.auto_max_ranks == 0 ||
         static_cast<uint64_t>(nranks) <= cfg.auto_max_ranks;
}

void route_not_joining(CommState& st, int nranks) {
  const Config& cfg = config();
  st.route_why = nranks < 2                              ? "a communicator of one rank"
                 : nranks > kMaxRanks                    ? "more ranks than the route supports (64)"
                 : cfg.allgather == AllGatherMode::kAuto ? "more ranks than ZEROCTA_AUTO_MAX_RANKS"
                                                         : "this rank has no current CUDA device";
  LogDeviceScope tag(st.device);
  ZC_INFO("route: rank %d/%d dev %d: copy-engine all-gather not engaged: %s", st.rank, nranks,
          st.device, st.route_why);
}

void route_join(CommState& st, const JoinPlan& plan) {
  const CudaDriver* cu = cuda_driver();
  const Config& cfg = config();
  std::lock_guard<std::mutex> lock(st.route_mu);
  st.device = plan.device;
  const char* why = nullptr;
  st.channel = Channel::open(cfg.channel_dir, plan.key, plan.capacity, &why);
  if (!st.channel) {
    st.route_why = why;
    say_join_failure(why);
    return;
  }
  MemberFacts f;
  f.join_index = plan.join_index;
  f.order_key = plan.order_key;
  f.pid = static_cast<int32_t>(getpid());
  f.uid = static_cast<uint32_t>(geteuid());
  f.start_time = process_start_time(getpid());
  f.fingerprint = cfg.fingerprint;
  f.nccl_version = real_nccl_version();
  f.device = plan.device;
  CUdevice d;
  CUuuid u{};
  if (cu->cuDeviceGet(&d, plan.device) == CUDA_SUCCESS) cu->cuDeviceGetUuid(&u, d);
  memcpy(f.uuid, u.bytes, sizeof f.uuid);
  cu->cuDeviceGetCount(&st.local_gpus);
  st.ce.reset(new CeComm);
  st.ce->join_index = plan.join_index;
  f.problems = make_arena(*cu, cfg, plan, st.ce.get(), &f);
  st.channel->publish(f);
  if (f.problems == 0)
    st.channel->add_problems(plan.join_index, check_members(*cu, plan, st.channel->members()));
  st.route.store(RouteState::kJoined, std::memory_order_release);
  st.route_why = "membership not frozen yet (NCCL's init has not completed)";
}

void route_freeze(CommState& st, bool on_app_thread) {
  std::lock_guard<std::mutex> lock(st.route_mu);
  LogDeviceScope tag(st.device);
  if (st.route.load() != RouteState::kJoined) return;
  Agreement a = agree(st.channel->members(), st.nranks, st.channel->broken(), st.local_gpus);
  st.channel->unlink_name();  // frozen: nobody may join any more
  const Config& cfg = config();
  if (a.commit && cfg.allgather == AllGatherMode::kAuto && cfg.auto_max_ranks != 0 &&
      static_cast<uint64_t>(st.nranks) > cfg.auto_max_ranks) {
    a.commit = false;  // a child larger than ZEROCTA_AUTO_MAX_RANKS: the same on every rank
    a.why = "more ranks than ZEROCTA_AUTO_MAX_RANKS";
    a.warn = false;
  }
  if (a.commit && st.ce && st.ce->own.bytes < st.ce->layout.arena_bytes()) {
    a.commit = false;  // cannot happen with equal settings (the fingerprint), kept as a guard
    a.why = "the route memory is smaller than its layout";
  }
  say_decision(st, a);
  if (a.commit) {
    st.members = std::move(a.ranks);
    st.route_why = "";
    stats_comm_ce_ready();
    st.route.store(RouteState::kCommitted, std::memory_order_release);
    return;
  }
  st.route_why = a.why;
  st.route.store(RouteState::kPassthrough, std::memory_order_release);
  st.channel.reset();
  if (on_app_thread) release_arena(st);
}

void route_settle(CommState& st) {
  if (st.route.load(std::memory_order_acquire) != RouteState::kPassthrough) return;
  std::lock_guard<std::mutex> lock(st.route_mu);
  release_arena(st);
}

ncclResult_t route_prepare(CommState& st) {
  std::lock_guard<std::mutex> lock(st.route_mu);
  if (int p = st.poisoned.load()) return static_cast<ncclResult_t>(p);
  CeComm* ce = st.ce.get();
  const CudaDriver* cu = cuda_driver();
  if (!ce || !cu || st.route.load() != RouteState::kCommitted) return ncclInternalError;
  if (ce->prepared) return ncclSuccess;
  // PyTorch captures in global mode, where these calls would invalidate the capture.
  CUstreamCaptureMode mode = CU_STREAM_CAPTURE_MODE_RELAXED;
  cu->cuThreadExchangeStreamCaptureMode(&mode);
  ScopedDevice on(st.device);
  const char* why = on.ok() ? nullptr : "cannot make the communicator's device current";
  const uint64_t fingerprint = config().fingerprint;
  ce->view.rank = st.rank;
  ce->view.nranks = st.nranks;
  // NCCL numbered the ranks (a split by key, then parent rank); agree() must have done the same.
  if (st.rank < 0 || st.rank >= static_cast<int>(st.members.size()))
    why = "this rank is not among the agreed members";
  else if (const MemberFacts& me = st.members[static_cast<size_t>(st.rank)];
           !why && (me.join_index != ce->join_index || me.pid != static_cast<int32_t>(getpid())))
    why = "the agreed rank order differs from NCCL's";
  for (int p = 0; p < st.nranks && !why; ++p) {
    const MemberFacts& m = st.members[static_cast<size_t>(p)];
    if (p == st.rank) {
      ce->view.arena[p] = ce->own.va;
      continue;
    }
    std::vector<int> fds;
    if (!fd_fetch(m.fd_address, m.pid, &m.pool_token, 1, &fds, kFdTimeoutMs, &why)) break;
    const bool mapped =
        fds[0] >= 0 && arena_import(*cu, fds[0], m.pool_bytes, st.device, &ce->peers[p]);
    if (fds[0] >= 0) close(fds[0]);
    if (!mapped) {
      why = "could not map a peer's route memory";
      break;
    }
    uint32_t seen = 0;
    if (cu->cuMemcpyDtoH(&seen, ce->peers[p].va + ce->layout.marker_offset(), sizeof seen) !=
            CUDA_SUCCESS ||
        seen != marker_for(m.join_index, fingerprint)) {
      why = "a peer's route memory failed verification";
      break;
    }
    ce->view.arena[p] = ce->peers[p].va;
  }
  for (int k = 1; k < kPlanStreams && !why; ++k)
    if (cu->cuStreamCreate(&ce->streams[k], CU_STREAM_NON_BLOCKING) != CUDA_SUCCESS ||
        cu->cuStreamCreate(&ce->capture_streams[k], CU_STREAM_NON_BLOCKING) != CUDA_SUCCESS)
      why = "could not create the route's streams";
  for (int e = 0; e < kPlanEvents && !why; ++e)
    if (cu->cuEventCreate(&ce->events[e], CU_EVENT_DISABLE_TIMING) != CUDA_SUCCESS ||
        cu->cuEventCreate(&ce->capture_events[e], CU_EVENT_DISABLE_TIMING) != CUDA_SUCCESS)
      why = "could not create the route's events";
  cu->cuThreadExchangeStreamCaptureMode(&mode);
  if (why) {
    ZC_WARN("copy-engine route on rank %d failed to prepare: %s; the communicator is poisoned",
            st.rank, why);
    st.poisoned.store(ncclSystemError);
    if (st.channel) st.channel->poison(ncclSystemError);
    return ncclSystemError;
  }
  ce->prepared = true;
  return ncclSuccess;
}

void route_poison(CommState& st, int code) {
  int none = ncclSuccess;
  st.poisoned.compare_exchange_strong(none, code);
  std::lock_guard<std::mutex> lock(st.route_mu);
  if (st.channel) st.channel->poison(code);
}

int route_peer_poison(const CommState& st) {
  if (st.route.load(std::memory_order_acquire) != RouteState::kCommitted) return ncclSuccess;
  return st.channel && st.channel->poisoned() ? ncclRemoteError : ncclSuccess;
}

void route_release_waits(CommState& st) {
  std::lock_guard<std::mutex> lock(st.route_mu);
  CeComm* ce = st.ce.get();
  if (!ce || !ce->own) return;  // nothing of ours can wait (and no driver call is made)
  const CudaDriver* cu = cuda_driver();
  if (!cu) return;
  ScopedDevice dev(st.device);
  // Set every ready/done flag to 1 from a fresh stream, repeatedly, until nothing of ours waits:
  // each wait then passes, and copies from a dead peer's memory are harmless (our import keeps
  // that memory alive). Our own streams can be asked whether they drained; a graph replay runs
  // on streams nobody can ask, so with captured ops the flags themselves tell: a waiter that
  // passes resets its flag to 0, so flags still all 1 a while after the last setting mean
  // nothing waits any more. Bounded, so abort itself never hangs.
  CUstream s = nullptr;
  if (cu->cuStreamCreate(&s, CU_STREAM_NON_BLOCKING) != CUDA_SUCCESS) return;
  const size_t nflags = ce->layout.one_offset() / 4;
  std::vector<uint32_t> flags(ce->captured ? nflags : 0);
  int quiet = 0;  // consecutive checks that found every flag still set
  for (int round = 0; round < 2000; ++round) {
    cu->cuMemsetD32Async(ce->own.va, 1, nflags, s);
    cu->cuStreamSynchronize(s);
    bool drained = true;
    for (int k = 1; k < kPlanStreams; ++k)
      if (ce->streams[k]) drained = drained && cu->cuStreamQuery(ce->streams[k]) == CUDA_SUCCESS;
    if (ce->captured) {
      usleep(5000);
      const bool untouched =
          cu->cuMemcpyDtoH(flags.data(), ce->own.va, nflags * 4) == CUDA_SUCCESS &&
          std::all_of(flags.begin(), flags.end(), [](uint32_t f) { return f == 1; });
      quiet = untouched ? quiet + 1 : 0;
      drained = drained && quiet >= 10;
    }
    if (drained) break;
    usleep(1000);
  }
  cu->cuStreamDestroy(s);
}

void route_teardown(CommState& st, bool aborting) {
  std::lock_guard<std::mutex> lock(st.route_mu);
  st.channel.reset();
  // The default mode holds nothing here: no driver call is made for it.
  if (!st.ce && !st.side_stream) return;
  const CudaDriver* cu = cuda_driver();
  if (cu && st.side_stream) {  // the legacy-stream detour of NCCL-CE-capable ops (wrappers)
    ScopedDevice dev(st.device);
    if (!aborting) cu->cuStreamSynchronize(st.side_stream);
    cu->cuStreamDestroy(st.side_stream);
    for (CUevent& e : st.side_events)
      if (e) cu->cuEventDestroy(e), e = nullptr;
    st.side_stream = nullptr;
  }
  st.route.store(RouteState::kPassthrough);
  st.route_why = "the communicator is being torn down";
  if (CeComm* ce = st.ce.get(); ce && cu) {
    ScopedDevice dev(st.device);
    for (int k = 1; k < kPlanStreams; ++k) {
      if (ce->streams[k]) {
        if (!aborting) cu->cuStreamSynchronize(ce->streams[k]);
        cu->cuStreamDestroy(ce->streams[k]);
      }
      if (ce->capture_streams[k]) cu->cuStreamDestroy(ce->capture_streams[k]);
    }
    // A replay still running after an abort records and waits on the capture events.
    const bool keep_capture_events = aborting && ce->captured;
    for (int e = 0; e < kPlanEvents; ++e) {
      if (ce->events[e]) cu->cuEventDestroy(ce->events[e]);
      if (ce->capture_events[e] && !keep_capture_events) cu->cuEventDestroy(ce->capture_events[e]);
    }
  }
  release_arena(st, aborting);
}

}  // namespace zc
