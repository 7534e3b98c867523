// What zerocta knows about one communicator, and the registry that maps NCCL's handles to it.
#pragma once

#include <nccl.h>

#include <atomic>
#include <cstdint>
#include <memory>
#include <mutex>
#include <vector>

#include "call_chain.h"
#include "captured_ops.h"
#include "channel.h"
#include "comm_key.h"
#include "cuda_driver.h"
#include "membership.h"
#include "premul_sums.h"
#include "op_exchange.h"
#include "chunk_sum.h"
#include "peer_memory.h"
#include "reduce_scatter_plan.h"
#include "rs_scratch.h"
#include "stage_buffer.h"

namespace zc {

// Where a communicator stands with the copy-engine route (route_setup.h).
enum class RouteState : int {
  kNone,         // never joined: the default mode, or a communicator that cannot route
  kJoined,       // published in its channel; membership not frozen yet
  kCommitted,    // every rank joined with equal settings: all-gathers may take the route
  kPassthrough,  // frozen without agreement: everything goes to NCCL
};

// The route's resources on this rank: from the join on, the channel's exchange registered for
// the GPU; once the first routed op prepared them, the peers' imports and the streams and
// events the plans run on (direct_plan.h).
struct CeComm {
  uint32_t join_index = 0;     // this rank's slot in the channel
  // The GPUs' part of the channel's op region (OpExchange::device_offset on), registered with
  // CUDA (host address).
  void* registered = nullptr;
  size_t registered_bytes = 0;
  CUdeviceptr registered_dev = 0;   // the same part as the GPU addresses it
  std::unique_ptr<OpExchange> ops;  // at commit, over the whole op region
  bool prepared = false;
  bool told_local_group = false;  // its INFO line about local group plans was logged
  bool told_one_by_one = false;   // ... and the one about ops of all-local ranks going to NCCL
  bool told_exchange_set = false;  // ... and the one about exchange sets
  uint64_t seq = 0;  // ops posted on this communicator so far
  ReachNeeds needs;  // who must reach this rank's buffers (at prepare)
  // Every rank of the communicator is in this process (an agreed fact: the membership).
  bool all_local() const { return !needs.by_extents; }
  std::unique_ptr<PeerImports> imports;
  std::unique_ptr<StageBuffer> stage;     // only once an op needed one
  // The reduce-scatter route (reduce_scatter_plan.h): this rank's scratch, made at the join
  // where the setting asks for it (null otherwise), the peers' mapped at its first routed op,
  // with the summing kernels of its device (rs_prepared).
  std::unique_ptr<RsScratch> rs_scratch;
  bool rs_prepared = false;
  const ChunkSumKernels* rs_kernels = nullptr;
  OpPost rs_post;  // reused per op (32 KiB: not for the stack)
  RsOpView rs_view;
  std::vector<RsOp> rs_plan;
  CUstream streams[kDirectStreams] = {};  // index 0 unused (the user's stream)
  // The push issuer's stream for this communicator, in its own context (push_issuer.h), and
  // the event that tells its end at the teardown; null where no pushes are deferred.
  CUstream issuer_stream = nullptr;
  CUevent issuer_drained = nullptr;
  CUcontext issuer_context = nullptr;
  // This rank's reading of the op posts, finished in op order (op_exchange.h).
  PostsRead posts_read;
  CUevent events[kDirectEvents] = {};
  // NCCL's order among the communicator's ops (comm_order.h): the event after the last op
  // forwarded to NCCL, whether one came since the last routed op, and whether a routed op came
  // since the last forwarded one. Under the comm's issue_mu.
  CUevent nccl_tail = nullptr;
  bool nccl_pending = false, routed_pending = false;
  // Whether a routed op was issued: the next one's pull and local streams wait for its end
  // (order_routed_op).
  bool routed_before = false;
  // Captured ops (captured_ops.h): what their graphs keep alive, and streams and events of
  // their own (a stream joined to a capture stays in it until the capture ends), created at
  // the first captured op.
  std::shared_ptr<CaptureLife> life;
  CUstream capture_streams[kDirectStreams] = {};
  CUevent capture_events[kDirectEvents] = {};
  // Reused per op.
  // The peers' posts of the current op, by rank: of the ranks that arrived before me (arrive),
  // then of the later ones whose pairs I settle (each OpPost is 32 KiB: not for the stack).
  std::vector<OpPost> peer_posts;
  std::vector<CaptureRef> peer_blocks;  // captured: the block of each peer whose post was read
  DirectOpView view;
  std::vector<DirectOp> plan;
  // The GPU address of a flag in the registered region.
  CUdeviceptr dev(const void* flag) const {
    return registered_dev + static_cast<CUdeviceptr>(reinterpret_cast<const char*>(flag) -
                                                     static_cast<const char*>(registered));
  }
};

struct AppWindow {
  uintptr_t base, size;
  ncclWindow_t win;
};

// Always owned by a shared_ptr (comm_create, comm_registry): work that outlives a call (the push
// issuer's jobs) keeps the communicator alive through shared_from_this.
struct CommState : std::enable_shared_from_this<CommState> {
  ncclComm_t comm = nullptr;
  // From the init call's arguments; for children of Split/Shrink/InitAll, from NCCL once the
  // child exists (until then nranks is 0).
  int rank = -1, nranks = 0, device = -1;
  bool zero_policy = false;  // NCCL_CTA_POLICY_ZERO was requested for it
  bool nonblocking = false;
  bool child = false;  // made by Split/Shrink: rank and size are asked of NCCL

  // Identity, for the channels of its children (comm_key.h), with the job's secret that keys
  // their names (never printed); invalid for Grow children.
  CommKey key;
  // Split and Shrink calls made on it so far, counted apart: a rank a shrink excludes never
  // calls it, and its later splits must still be named like the kept ranks' (comm_key.h).
  std::atomic<uint64_t> split_ordinal{0}, shrink_ordinal{0};

  // The route (route_setup.h). `route_mu` guards every change of the fields below it and is
  // taken by abort too; `route` may be read without it.
  std::atomic<RouteState> route{RouteState::kNone};
  const char* route_why = "ZEROCTA_ALLGATHER does not ask for the copy-engine route";
  std::mutex route_mu;
  std::unique_ptr<Channel> channel;  // from the join; after commit only for its poison word
  std::vector<MemberFacts> members;  // at commit: every rank's facts, in rank order
  // At commit: whether every member published a reduce-scatter scratch (the route's pushes
  // need one at every rank; an agreed fact, read by every reduce-scatter's predicate).
  bool every_rank_has_rs_scratch = false;
  // The pre-multiplied sums made on it, where the reduce-scatter's route may need their scalars.
  PreMulSums premul_sums;
  int local_gpus = 0;                // GPUs this process saw at the join (for the verdict's log)
  std::unique_ptr<CeComm> ce;

  // Serialises issuing on this comm (NCCL forbids concurrent use of one comm anyway; this
  // only protects our own state against misuse) and the teardown.
  std::mutex issue_mu;
  // The collectives NCCL accepted on it, in call order (call_chain.h): kept where the route may
  // be taken, and carried by each routed all-gather's post so that ranks that drifted apart
  // fail instead of pairing different ops.
  CallChain chain;
  // First error after a route was fixed: the communicator is poisoned and every later call
  // returns it, as NCCL does with an asynchronous error.
  std::atomic<int> poisoned{ncclSuccess};
  std::mutex windows_mu;
  std::vector<AppWindow> app_windows;
  std::atomic<bool> has_app_windows{false};
  // Windows of a non-blocking comm that NCCL answered ncclInProgress: it writes the caller's
  // handle when its job is done, which a poll that sees the comm ready tells (under windows_mu).
  struct PendingWindow {
    uintptr_t base;
    size_t size;
    ncclWindow_t* win;  // the caller's, valid until NCCL wrote it (NCCL's contract)
  };
  std::vector<PendingWindow> pending_windows;
  // NCCL 2.28.0-2.29.6 fail CE ops on the legacy default stream; ops that may take NCCL's CE
  // path are moved to this stream, ordered with the caller's by events (created on first need).
  CUstream side_stream = nullptr;
  CUevent side_events[2] = {};
};

std::shared_ptr<CommState> comm_lookup(ncclComm_t comm);
std::shared_ptr<CommState> comm_add(ncclComm_t comm);  // a fresh state, registered
void comm_insert(ncclComm_t comm, std::shared_ptr<CommState> st);
std::shared_ptr<CommState> comm_remove(ncclComm_t comm);

}  // namespace zc
