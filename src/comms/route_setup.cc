#include "route_setup.h"

#include <unistd.h>

#include <algorithm>
#include <cstring>
#include <mutex>
#include <set>
#include <string>

#include "chunk_sum.h"
#include "config.h"
#include "fd_exchange.h"
#include "flag_watch.h"
#include "housekeeping.h"
#include "local_aliases.h"
#include "log.h"
#include "nvml_links.h"
#include "parked_routes.h"
#include "process_info.h"
#include "push_issuer.h"
#include "real_nccl.h"
#include "rs_scratch.h"
#include "stats.h"

namespace zc {
namespace {

constexpr int kProbeTimeoutMs = 1000;

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

// Registers the channel's op region with CUDA, so that this rank's streams can wait on and
// write its flags (op_exchange.h). Problems are reported, not hidden: they travel in the facts
// so that every rank passes through.
uint32_t register_flags(const CudaDriver& cu, const JoinPlan& plan, const Channel& channel,
                        CeComm* ce, MemberFacts* f) {
  // The fd service first: its address is published whatever happens next, so that peers
  // probing it learn of this rank's real problem rather than of a missing service.
  FdService* service = fd_service();
  if (service) snprintf(f->fd_address, sizeof f->fd_address, "%s", service->address());
  if (const char* c = getenv("CUDA_DEVICE_MAX_CONNECTIONS"); c && atoi(c) == 1)
    return kProblemOneConnection;
  ScopedDevice on(plan.device);
  if (!on.ok()) return kProblemDevice;
  // Only the part the GPUs touch is pinned: the posts before it grow with kMaxExtents.
  const size_t offset = OpExchange::device_offset(channel.op_region_ranks());
  void* region = static_cast<char*>(channel.op_region()) + offset;
  const size_t bytes = channel.op_region_bytes() - offset;
  if (cu.cuMemHostRegister(region, bytes,
                           CU_MEMHOSTREGISTER_PORTABLE | CU_MEMHOSTREGISTER_DEVICEMAP) !=
      CUDA_SUCCESS)
    return kProblemFlags;
  ce->registered = region;
  ce->registered_bytes = bytes;
  stats_pool_bytes_add(static_cast<int64_t>(bytes));
  if (cu.cuMemHostGetDevicePointer(&ce->registered_dev, region, 0) != CUDA_SUCCESS)
    return kProblemFlags;
  return service ? 0u : uint32_t{kProblemFdService};
}

// The reduce-scatter's scratch, where its setting asks for that route (rs_scratch.h); a rank
// without one is no problem for the all-gathers, and its reduce-scatters go to NCCL on every
// rank (the agreed facts say it has none).
// Its two regions (reduce_scatter_plan.h) are sized for the communicator's capacity: a child's
// are no larger than its parent's.
void make_rs_scratch(const CudaDriver& cu, const JoinPlan& plan, CeComm* ce, MemberFacts* f) {
  if (!route_asked(config().reducescatter)) return;
  const char* why = "this build carries no reduction kernel (nvcc was not found)";
  const uint64_t bytes =
      2 * rs_region_bytes(static_cast<int>(plan.capacity), config().rs_scratch_bytes);
  if (bytes == 0) {
    why = "ZEROCTA_RS_SCRATCH holds no region";
  } else if (chunk_sum_built()) {
    ScopedDevice on(plan.device);
    std::unique_ptr<RsScratch> scratch(new RsScratch);
    if (on.ok() && scratch->create(cu, plan.device, bytes, &why)) {
      f->rs_scratch = scratch->facts();
      ce->rs_scratch = std::move(scratch);
      return;
    }
  }
  ZC_INFO("route: dev %d: copy-engine reduce-scatter off on this communicator: %s", plan.device,
          why);
}

// What this rank can check of every other member it sees after publishing its own facts: a
// direct P2P path to its GPU and its fd service. Of two ranks, the one that published second
// sees the other, so every pair is checked by at least one of them. A GPU this process cannot
// see (CUDA_VISIBLE_DEVICES gives each rank its own) belongs to another process, which the route
// reaches through imports, with no ordinal: there NVML says whether NVLink links the two GPUs.
uint32_t check_members(const CudaDriver& cu, const JoinPlan& plan, const MemberFacts& mine,
                       const std::vector<MemberFacts>& members) {
  uint32_t problems = 0;
  CUdevice me;
  if (cu.cuDeviceGet(&me, plan.device) != CUDA_SUCCESS) return kProblemDevice;
  for (const MemberFacts& m : members) {
    if (m.join_index == plan.join_index) continue;
    const int ord = local_ordinal_of(cu, m.uuid);
    CUdevice peer;
    int can = 0;
    if (ord < 0) {
      if (m.pid == mine.pid || nvlink_between(mine.uuid, m.uuid) != NvlinkAnswer::kLinked)
        problems |= kProblemPeerInvisible;
    } else if (ord == plan.device) {
      if (!kRanksMayShareGpu) problems |= kProblemP2p;  // two ranks on one GPU (membership.h)
    } else if (cu.cuDeviceGet(&peer, ord) != CUDA_SUCCESS ||
               cu.cuDeviceCanAccessPeer(&can, me, peer) != CUDA_SUCCESS || !can) {
      problems |= kProblemP2p;
    }
    if (!fd_probe(m.fd_address, m.pid, kProbeTimeoutMs)) problems |= kProblemFdService;
  }
  return problems;
}

// One WARN per process and reason; every decision is also one INFO line per communicator.
void say_decision(const CommState& st, const Agreement& a) {
  const unsigned long long bytes = st.ce ? st.ce->registered_bytes : 0;
  const unsigned long long scratch =
      st.ce && st.ce->rs_scratch ? st.ce->rs_scratch->facts().bytes : 0;
  if (a.commit) {
    if (scratch == 0)
      ZC_INFO(
          "route: rank %d/%d dev %d: zero-copy all-gather engaged (%llu B of host memory for its "
          "flags; no GPU memory of its own)",
          st.rank, st.nranks, st.device, bytes);
    else
      ZC_INFO(
          "route: rank %d/%d dev %d: zero-copy all-gather engaged (%llu B of host memory for its "
          "flags), and the copy-engine reduce-scatter where every rank has a scratch (%llu MiB "
          "of GPU memory here)",
          st.rank, st.nranks, st.device, bytes, scratch >> 20);
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

// Releases every wait on this communicator's flags for good (it failed, or a rank left it).
// The released done flags no longer say when copies into peers' memory finished, so the
// imports stop unmapping first: a copy queued on a route stream, or one the push issuer had
// resolved but not yet issued, still runs into its view (peer_memory.h, freeze).
void release_flags(CeComm& ce) {
  if (ce.imports) ce.imports->freeze();
  if (ce.ops) ce.ops->release_all(ce.seq);
}

// Communicators of this process with route state (joined, committed or not).
std::atomic<int> g_route_comms{0};

// Frees what the route holds on this rank, or parks it while work queued on its streams may
// still address it (parked_routes.h): nothing here waits for a stream. The process's exports of
// allocations its application freed go too — a communicator may end before its periodic sweep
// ever ran — and all of them with the last communicator. Graphs of captured ops that may outlive
// the communicator keep the channel, the registration and the imports (captured_ops.h): they are
// handed over and freed with the last graph.
void free_route_resources(CommState& st) {
  const CudaDriver* cu = cuda_driver();
  if (!st.ce || !cu) return;
  CeComm& ce = *st.ce;
  // No job of the push issuer touches this communicator from here on.
  push_issuer_forget(&st);
  ScopedDevice on(st.device);
  OpExchange* ops = ce.ops.get();
  // The issuer's stream may still hold pushes into peers' memory the life below keeps mapped:
  // its event, recorded in its own context, is waited for with the route's own.
  CUevent issuer_recorded = nullptr;
  if (ce.issuer_stream) {
    ScopedContext in(ce.issuer_context);
    if (cu->cuEventRecord(ce.issuer_drained, ce.issuer_stream) == CUDA_SUCCESS)
      issuer_recorded = ce.issuer_drained;
    else
      cu->cuEventDestroy(ce.issuer_drained);
    ce.issuer_drained = nullptr;
    cu->cuStreamDestroy(ce.issuer_stream);  // does not wait for its work
    ce.issuer_stream = nullptr;
  }
  // One release path: a communicator never prepared has no graphs, so its life ends here.
  std::shared_ptr<CaptureLife> life =
      ce.life ? std::move(ce.life) : std::make_shared<CaptureLife>(nullptr, nullptr, st.device);
  life->hand_over(std::move(st.channel), ce.registered, ce.registered_bytes, std::move(ce.imports),
                  std::move(ce.ops), std::move(ce.stage), std::move(ce.rs_scratch));
  static_assert(kDirectEvents >= kDirectStreams, "an event of the route's own per stream");
  free_when_drained(std::move(life), ce.streams, ce.events, kDirectStreams, issuer_recorded,
                    st.device, ops, ce.seq);
  // Destroying a stream or an event does not wait for its work.
  for (CUstream* set : {ce.streams, ce.capture_streams})
    for (int k = 1; k < kDirectStreams; ++k)
      if (set[k]) cu->cuStreamDestroy(set[k]), set[k] = nullptr;
  for (CUevent* set : {ce.events, ce.capture_events})
    for (int e = 0; e < kDirectEvents; ++e)
      if (set[e]) cu->cuEventDestroy(set[e]), set[e] = nullptr;
  if (ce.nccl_tail) cu->cuEventDestroy(ce.nccl_tail), ce.nccl_tail = nullptr;
  st.ce.reset();
  if (g_route_comms.fetch_sub(1) == 1) {
    withdraw_all_exports();
    housekeeping_stop();  // nothing left to tend; it is not waited for (housekeeping.h)
  } else {
    sweep_exports(*cu);
  }
}

// Whether `mode` asks for the route on `nranks` ranks (0: a child, not known yet), auto only up
// to `auto_max` (0 = any).
bool mode_wants(RouteMode mode, uint64_t auto_max, int nranks) {
  if (!route_asked(mode)) return false;
  return nranks == 0 || mode != RouteMode::kAuto || auto_max == 0 ||
         static_cast<uint64_t>(nranks) <= auto_max;
}

// Whether either collective's setting asks for the route on `nranks` ranks.
bool any_collective_wants(int nranks) {
  const Config& cfg = config();
  return mode_wants(cfg.allgather, cfg.auto_max_ranks, nranks) ||
         mode_wants(cfg.reducescatter, kRsAutoMaxRanks, nranks);
}

}  // namespace

bool route_wanted(int nranks) {
  const Config& cfg = config();
  if (!route_asked(cfg.allgather) && !route_asked(cfg.reducescatter)) return false;
  if (runtime_tier() != RuntimeTier::kFull) return false;
  const CudaDriver* cu = cuda_driver();
  if (!cu || !cu->ce_ok) return false;
  if (nranks == 0) return true;  // a child: its size is known only at the freeze
  if (nranks < 2 || nranks > kMaxRanks) return false;
  return any_collective_wants(nranks);
}

ChannelShape channel_shape(uint32_t capacity) {
  uint64_t room = std::min<uint64_t>(capacity, kOpRanks);
  // Room only for as many ranks as a setting could route (the larger of the two).
  uint64_t most = 0;
  for (uint64_t n = 2; n <= room; ++n)
    if (any_collective_wants(static_cast<int>(n))) most = n;
  room = std::max<uint64_t>(std::min<uint64_t>(room, most), std::min<uint64_t>(room, 2));
  return ChannelShape{capacity, static_cast<uint32_t>(room)};
}

void route_not_joining(CommState& st, int nranks) {
  st.route_why = nranks < 2                      ? "a communicator of one rank"
                 : nranks > kMaxRanks            ? "more ranks than the route supports (64)"
                 : !any_collective_wants(nranks) ? "more ranks than ZEROCTA_AUTO_MAX_RANKS"
                                                 : "this rank has no current CUDA device";
  LogDeviceScope tag(st.device);
  ZC_INFO("route: rank %d/%d dev %d: copy-engine all-gather not engaged: %s", st.rank, nranks,
          st.device, st.route_why);
}

void route_join(CommState& st, const JoinPlan& plan) {
  const CudaDriver* cu = cuda_driver();
  const Config& cfg = config();
  collect_gone_graphs();  // what graphs of earlier communicators left, at a creation too
  std::lock_guard<std::mutex> lock(st.route_mu);
  st.device = plan.device;
  const char* why = nullptr;
  st.channel = Channel::open(cfg.channel_dir, plan.key, channel_shape(plan.capacity), &why);
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
  g_route_comms.fetch_add(1);
  st.ce->join_index = plan.join_index;
  f.problems = register_flags(*cu, plan, *st.channel, st.ce.get(), &f);
  if (f.problems == 0) make_rs_scratch(*cu, plan, st.ce.get(), &f);
  st.channel->publish(f);
  if (f.problems == 0)
    st.channel->add_problems(plan.join_index, check_members(*cu, plan, f, st.channel->members()));
  st.route.store(RouteState::kJoined, std::memory_order_release);
  st.route_why = "membership not frozen yet (NCCL's init has not completed)";
}

void route_freeze(CommState& st, bool on_app_thread) {
  std::lock_guard<std::mutex> lock(st.route_mu);
  LogDeviceScope tag(st.device);
  if (st.route.load() != RouteState::kJoined) return;
  Agreement a = agree(st.channel->members(), st.nranks, st.channel->broken(), st.local_gpus);
  st.channel->unlink_name();  // frozen: nobody may join any more
  if (a.commit && !any_collective_wants(st.nranks)) {
    a.commit = false;  // a child larger than auto routes: the same on every rank
    a.why = "more ranks than ZEROCTA_AUTO_MAX_RANKS";
    a.warn = false;
  }
  if (a.commit && static_cast<uint32_t>(st.nranks) > st.channel->op_region_ranks()) {
    // Only a child can be larger than its channel's op room (channel_shape), and in auto mode
    // the ZEROCTA_AUTO_MAX_RANKS check above said no first; kept as a guard.
    a.commit = false;
    a.why = "the channel has no room for this many ranks";
  }
  say_decision(st, a);
  if (a.commit) {
    st.members = std::move(a.ranks);
    const uint64_t scratch_needed = 2 * rs_region_bytes(st.nranks, config().rs_scratch_bytes);
    st.every_rank_has_rs_scratch =
        scratch_needed != 0 &&
        std::all_of(st.members.begin(), st.members.end(),
                    [&](const MemberFacts& m) { return m.rs_scratch.bytes >= scratch_needed; });
    st.route_why = "";
    st.ce->ops.reset(new OpExchange(st.channel->op_region(), static_cast<uint32_t>(st.nranks)));
    watch_flags(st.ce->ops.get(), st.rank);
    stats_comm_ce_ready();
    st.route.store(RouteState::kCommitted, std::memory_order_release);
    return;
  }
  st.route_why = a.why;
  st.route.store(RouteState::kPassthrough, std::memory_order_release);
  if (on_app_thread) {
    free_route_resources(st);  // unregisters the region before the channel unmaps it
    st.channel.reset();
  }
}

void route_settle(CommState& st) {
  if (st.route.load(std::memory_order_acquire) != RouteState::kPassthrough) return;
  std::lock_guard<std::mutex> lock(st.route_mu);
  free_route_resources(st);
  st.channel.reset();
}

namespace {

// Who must reach this rank's buffers, and peer access to the GPUs of the peers in this process:
// nullptr, or why not. NCCL numbered the ranks (a split by key, then parent rank); agree() must
// have done the same.
const char* reach_needs(CommState& st, CeComm& ce, const CudaDriver& cu) {
  const int32_t me = static_cast<int32_t>(getpid());
  if (st.rank < 0 || st.rank >= static_cast<int>(st.members.size()))
    return "this rank is not among the agreed members";
  if (const MemberFacts& mine = st.members[static_cast<size_t>(st.rank)];
      mine.join_index != ce.join_index || mine.pid != me)
    return "the agreed rank order differs from NCCL's";
  ce.needs = ReachNeeds{};
  for (int p = 0; p < st.nranks; ++p) {
    const MemberFacts& m = st.members[static_cast<size_t>(p)];
    if (p == st.rank) continue;
    if (m.pid != me) {
      ce.needs.by_extents = true;
      continue;
    }
    const int ord = local_ordinal_of(cu, m.uuid);
    ce.needs.by_pointer = true;
    ce.needs.peer_devices[ce.needs.npeer_devices++] = ord;
    if (ord < 0 || !enable_peer_access(cu, st.device, ord))
      return "could not enable peer access to a GPU of this process";
  }
  return nullptr;
}

// The route's streams and events: nullptr, or why not (what was made goes at the teardown).
const char* make_streams(CeComm& ce, const CudaDriver& cu) {
  for (int k = 1; k < kDirectStreams; ++k)
    if (cu.cuStreamCreate(&ce.streams[k], CU_STREAM_NON_BLOCKING) != CUDA_SUCCESS)
      return "could not create the route's streams";
  for (int e = 0; e < kDirectEvents; ++e)
    if (cu.cuEventCreate(&ce.events[e], CU_EVENT_DISABLE_TIMING) != CUDA_SUCCESS)
      return "could not create the route's events";
  if (cu.cuEventCreate(&ce.nccl_tail, CU_EVENT_DISABLE_TIMING) != CUDA_SUCCESS) {
    ce.nccl_tail = nullptr;
    return "could not create the route's events";
  }
  return nullptr;
}

// The push issuer's stream and event for this communicator, in the issuer's context on its
// GPU (push_issuer.h): where ranks in other processes may arrive after this one. Without them
// (no context of its own could be made) an earlier rank waits for its later ones as before.
void make_issuer_stream(CeComm& ce, const CudaDriver& cu, int device) {
  // The issuer serves the all-gather's deferred pushes only: a process that routes
  // reduce-scatters alone never pays for its context.
  if (!ce.needs.by_extents || !route_asked(config().allgather)) return;
  CUcontext own = push_issuer_context(device);
  if (!own) return;
  ScopedContext in(own);
  if (!in.ok() || cu.cuStreamCreate(&ce.issuer_stream, CU_STREAM_NON_BLOCKING) != CUDA_SUCCESS) {
    ce.issuer_stream = nullptr;
    return;
  }
  if (cu.cuEventCreate(&ce.issuer_drained, CU_EVENT_DISABLE_TIMING) != CUDA_SUCCESS) {
    cu.cuStreamDestroy(ce.issuer_stream);
    ce.issuer_stream = nullptr;
    ce.issuer_drained = nullptr;
    return;
  }
  ce.issuer_context = own;
}

// The prepare phase under st.route_mu, once committed: nullptr, or why it failed.
const char* set_up_route(CommState& st, CeComm& ce, const CudaDriver& cu) {
  // PyTorch captures in global mode, where these calls would invalidate the capture.
  CUstreamCaptureMode mode = CU_STREAM_CAPTURE_MODE_RELAXED;
  cu.cuThreadExchangeStreamCaptureMode(&mode);
  ScopedDevice on(st.device);
  const char* why =
      on.ok() ? reach_needs(st, ce, cu) : "cannot make the communicator's device current";
  if (!why) why = make_streams(ce, cu);
  if (!why) make_issuer_stream(ce, cu, st.device);
  cu.cuThreadExchangeStreamCaptureMode(&mode);
  if (why) return why;
  ce.imports.reset(new PeerImports(st.device));
  ce.life = std::make_shared<CaptureLife>(st.channel.get(), &ce.ops->blocks(), st.device);
  ce.peer_posts.resize(static_cast<size_t>(st.nranks));
  ce.peer_blocks.resize(static_cast<size_t>(st.nranks));
  ce.prepared = true;
  return nullptr;
}

}  // namespace

ncclResult_t route_prepare(CommState& st) {
  const char* why = nullptr;
  {
    std::lock_guard<std::mutex> lock(st.route_mu);
    if (int p = st.poisoned.load()) return static_cast<ncclResult_t>(p);
    CeComm* ce = st.ce.get();
    const CudaDriver* cu = cuda_driver();
    if (!ce || !cu || !ce->ops || st.route.load() != RouteState::kCommitted)
      return ncclInternalError;
    if (ce->prepared) return ncclSuccess;
    why = set_up_route(st, *ce, *cu);
    if (!why) return ncclSuccess;
  }
  // After commit a failure is the communicator's: poisoned here and, through the channel, for
  // the peers, whose waits on this rank are released.
  ZC_WARN("copy-engine route on rank %d failed to prepare: %s; the communicator is poisoned",
          st.rank, why);
  route_poison(st, ncclSystemError);
  return ncclSystemError;
}

namespace {
// The reduce-scatter's part of the prepare: the peers' scratch mapped, the summing kernels.
const char* set_up_reduce_scatter(CommState& st, CeComm& ce, const CudaDriver& cu) {
  if (!ce.rs_scratch) return "this rank has no reduce-scatter scratch";
  ScopedDevice on(st.device);
  if (!on.ok()) return "cannot make the communicator's device current";
  const char* why = nullptr;
  ce.rs_kernels = chunk_sum_on_device(cu, st.device, &why);
  if (!ce.rs_kernels) return why;
  const int me_pid = static_cast<int>(getpid());
  uint64_t mapped = 0;
  for (int p = 0; p < st.nranks; ++p) {
    if (p == st.rank) continue;
    const MemberFacts& m = st.members[static_cast<size_t>(p)];
    if (!ce.rs_scratch->map_peer(cu, p, m.rs_scratch, m.pid == me_pid, m.fd_address, m.pid,
                                 st.device, &why))
      return why;
    mapped += m.rs_scratch.bytes;
  }
  ZC_INFO(
      "route: rank %d/%d dev %d: copy-engine reduce-scatter ready: scratch %llu MiB here, "
      "%llu MiB of its peers' mapped",
      st.rank, st.nranks, st.device,
      static_cast<unsigned long long>(ce.rs_scratch->facts().bytes >> 20),
      static_cast<unsigned long long>(mapped >> 20));
  ce.rs_prepared = true;
  return nullptr;
}
}  // namespace

ncclResult_t route_prepare_reduce_scatter(CommState& st) {
  if (ncclResult_t r = route_prepare(st); r != ncclSuccess) return r;
  const char* why = nullptr;
  {
    std::lock_guard<std::mutex> lock(st.route_mu);
    CeComm* ce = st.ce.get();
    if (ce->rs_prepared) return ncclSuccess;
    CUstreamCaptureMode mode = CU_STREAM_CAPTURE_MODE_RELAXED;
    cuda_driver()->cuThreadExchangeStreamCaptureMode(&mode);
    why = set_up_reduce_scatter(st, *ce, *cuda_driver());
    cuda_driver()->cuThreadExchangeStreamCaptureMode(&mode);
    if (!why) return ncclSuccess;
  }
  ZC_WARN(
      "copy-engine reduce-scatter on rank %d failed to prepare: %s; the communicator is "
      "poisoned",
      st.rank, why);
  route_poison(st, ncclSystemError);
  return ncclSystemError;
}

void route_poison(CommState& st, int code) {
  int none = ncclSuccess;
  st.poisoned.compare_exchange_strong(none, code);
  std::lock_guard<std::mutex> lock(st.route_mu);
  if (st.channel) st.channel->poison(code);
  if (st.ce) release_flags(*st.ce);  // an op whose waits pass now reports the poison, not success
}

namespace {
// Whether the route's own streams have run everything queued on them (and no graph of captured
// ops may still replay one of its ops). Never waits.
bool route_idle(const CeComm& ce) {
  const CudaDriver* cu = cuda_driver();
  if (!cu) return true;
  if (ce.life && ce.life->holds_graphs()) return false;
  for (int k = 1; k < kDirectStreams; ++k)
    if (ce.streams[k] && cu->cuStreamQuery(ce.streams[k]) != CUDA_SUCCESS) return false;
  return true;
}
}  // namespace

void route_leave(CommState& st) {
  int none = ncclSuccess;
  st.poisoned.compare_exchange_strong(none, ncclRemoteError);
  route_leave_without_error(st);
}

void route_leave_without_error(CommState& st) {
  std::lock_guard<std::mutex> lock(st.route_mu);
  if (!st.ce || !st.ce->ops) return;
  ScopedDevice on(st.device);
  st.ce->ops->leave(static_cast<uint32_t>(st.rank), st.ce->seq, route_idle(*st.ce));
  release_flags(*st.ce);
}

bool route_peer_left(CommState& st) {
  if (st.route.load(std::memory_order_acquire) != RouteState::kCommitted) return false;
  std::lock_guard<std::mutex> lock(st.route_mu);
  return st.ce && st.ce->ops && st.ce->ops->peer_left(static_cast<uint32_t>(st.rank));
}

int route_peer_poison(const CommState& st) {
  if (st.route.load(std::memory_order_acquire) != RouteState::kCommitted) return ncclSuccess;
  return st.channel && st.channel->poisoned() ? ncclRemoteError : ncclSuccess;
}

int route_adopt_peer_poison(CommState& st) {
  const int peer = route_peer_poison(st);
  if (peer == ncclSuccess) return peer;
  int none = ncclSuccess;
  if (st.poisoned.compare_exchange_strong(none, peer)) {
    LogDeviceScope tag(st.device);
    ZC_WARN(
        "route: rank %d/%d: a peer poisoned the communicator (a failure there is in that "
        "rank's log); this rank's calls on it fail with ncclRemoteError",
        st.rank, st.nranks);
  }
  route_release_waits(st);  // again: a queued write of an older op number may have undone it
  return peer;
}

void route_release_waits(CommState& st) {
  std::lock_guard<std::mutex> lock(st.route_mu);
  if (st.ce) release_flags(*st.ce);
}

void route_suspend_memory(CommState& st) {
  std::lock_guard<std::mutex> issuing(st.issue_mu);
  std::lock_guard<std::mutex> lock(st.route_mu);
  CeComm* ce = st.ce.get();
  const CudaDriver* cu = cuda_driver();
  if (!ce || !ce->prepared || !cu) return;
  ScopedDevice dev(st.device);
  for (int k = 1; k < kDirectStreams; ++k)
    if (ce->streams[k]) cu->cuStreamSynchronize(ce->streams[k]);
  const uint64_t held = ce->imports ? ce->imports->held_bytes() : 0;
  if (ce->imports) ce->imports->release_idle(*cu);
  ce->stage.reset();
  withdraw_all_exports();
  ZC_INFO(
      "route: rank %d/%d dev %d: suspended: released %llu of %llu B of peers' memory mapped "
      "here (the rest is in live CUDA graphs) and the stage",
      st.rank, st.nranks, st.device,
      static_cast<unsigned long long>(held - (ce->imports ? ce->imports->held_bytes() : 0)),
      static_cast<unsigned long long>(held));
}

void route_teardown(CommState& st) {
  std::lock_guard<std::mutex> lock(st.route_mu);
  // The default mode holds nothing here: no driver call is made for it.
  if (!st.ce && !st.side_stream) {
    st.channel.reset();
    return;
  }
  const CudaDriver* cu = cuda_driver();
  if (cu && st.side_stream) {  // the legacy-stream detour of NCCL-CE-capable ops (wrappers)
    ScopedDevice dev(st.device);
    cu->cuStreamDestroy(st.side_stream);  // its queued NCCL ops run on; they address nothing ours
    for (CUevent& e : st.side_events)
      if (e) cu->cuEventDestroy(e), e = nullptr;
    st.side_stream = nullptr;
  }
  st.route.store(RouteState::kPassthrough);
  st.route_why = "the communicator is being torn down";
  if (CeComm* ce = st.ce.get(); ce && cu) {
    unwatch_flags(ce->ops.get());
    // Second mappings of this process's buffers (local group plans): the idle ones go, so that
    // none outlives the communicators that wrote through it.
    release_idle_local_aliases(*cu);
  }
  free_route_resources(st);
  st.channel.reset();
  collect_gone_graphs();
  collect_drained_routes();
}

}  // namespace zc
