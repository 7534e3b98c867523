// The copy-engine route's life on one rank, in phases; no phase makes an NCCL call.
//
//   join     before the init, split or shrink is forwarded to NCCL, on the creating thread
//            (inside an application group: at its outermost ncclGroupEnd, before NCCL's):
//            open the channel, register its per-op region with CUDA, publish the facts, check
//            P2P and the fd service of every member seen. A local failure is a fact too.
//   freeze   when NCCL's init is seen complete (host-only work, so it may run in any thread's
//            ncclCommGetAsyncError): read the frozen membership, agree() (membership.h), unlink
//            the channel's name, log the decision. Commit or pass-through, alike on every rank.
//   prepare  at the first routed all-gather, on the application's thread at group depth 0:
//            peer access to the GPUs of peers in this process, the streams and events. A
//            failure here poisons. (Each op then reaches its peers' buffers: ce_allgather.h.)
//   teardown at Finalize/Destroy, or Abort (releases every device wait first); never waits for a
//            stream (parked_routes.h).
// After commit, a failure poisons the communicator: the channel's poison word tells the peers,
// and ncclCommGetAsyncError answers ncclRemoteError on every rank.
#pragma once

#include <nccl.h>

#include <cstdint>

#include "channel.h"
#include "comm_key.h"
#include "comm_state.h"

namespace zc {

// What a rank knows before it forwards an init, split or shrink.
struct JoinPlan {
  CommKey key;
  uint32_t capacity = 0;    // the communicator's size for an init, the parent's for a child
  uint32_t join_index = 0;  // the rank for an init, the parent rank for a child
  int64_t order_key = 0;    // what NCCL orders the ranks by (a split's key), else join_index
  int device = -1;          // the CUDA device the communicator lives on
};

// Whether this process's settings ask for the route on a communicator of `nranks` ranks
// (0 = not known yet: a child). The default mode never does.
bool route_wanted(int nranks);

// The size of a communicator's channel (channel.h), from the capacity of its join plan and
// this process's settings (the same on every rank that agrees): room in the op exchange only
// for as many ranks as could ever route — in auto mode no more than ZEROCTA_AUTO_MAX_RANKS,
// which a child of a large parent would otherwise reserve shared and pinned memory for.
ChannelShape channel_shape(uint32_t capacity);

// A communicator of this size never joins (route_wanted() said no): records and logs why, as
// the freeze does for those that join.
void route_not_joining(CommState& st, int nranks);

// The join phase. Leaves st.route at kJoined, or kNone (with st.route_why) when this rank
// cannot take part; its peers then see a missing member and pass through.
void route_join(CommState& st, const JoinPlan& plan);

// The freeze phase, for a comm in kJoined whose init NCCL completed (st.rank, st.nranks set).
// `on_app_thread`: false inside another thread's poll, where no CUDA call may be made (the
// registration of a comm that will not route is then released at the next route_settle()).
void route_freeze(CommState& st, bool on_app_thread);

// On the application's thread outside any group: frees what a pass-through comm still holds.
void route_settle(CommState& st);

// The prepare phase (idempotent). ncclSuccess, or the error the comm is now poisoned with.
ncclResult_t route_prepare(CommState& st);
// The same, and the reduce-scatter's part (idempotent): the peers' scratch mapped (one import
// per peer in another process, from its fd service), the summing kernels loaded. Called at the
// first routed reduce-scatter, which every rank routes alike: a failure poisons.
ncclResult_t route_prepare_reduce_scatter(CommState& st);

// Poisons a committed comm with `code` here and, through the channel, for its peers.
void route_poison(CommState& st, int code);

// The poison a peer left in the channel, if any (ncclSuccess otherwise).
int route_peer_poison(const CommState& st);
// The same, taken as this comm's own error where it has none yet; taking it logs a WARN, so that
// every rank's log says why its calls fail (the rank that poisoned it logged the cause).
int route_adopt_peer_poison(CommState& st);

// This rank aborts (or revokes) the communicator: it is over here, every wait on the channel's
// flags is released, and the peers learn that it left — not a poison: NCCL's abort is local,
// and a peer's ops that do not need this rank go on (OpExchange::leave).
void route_leave(CommState& st);
// The same, but the communicator lives on with no error here: a shrink that aborts the
// parent's operations (NCCL_SHRINK_ABORT) leaves the parent's asynchronous error at
// ncclSuccess. A routed all-gather on it afterwards fails (a rank left: none can pair).
void route_leave_without_error(CommState& st);

// Whether a peer left so that this rank's routed ops cannot all be right (OpExchange::peer_left).
bool route_peer_left(CommState& st);

// Releases every device-side wait of ours on this comm (abort, revoke, shrink-abort).
void route_release_waits(CommState& st);

// ncclCommSuspend(NCCL_SUSPEND_MEM) succeeded: drains the route's streams and releases the
// peers' allocations this rank maps (but those a live graph of captured ops uses), its stage
// and the process's exports; later ops make them again.
void route_suspend_memory(CommState& st);

// Frees everything of the route, without waiting for any stream: what work still queued on the
// route's streams addresses is freed once it has run (parked_routes.h). After an abort or a
// poison every wait of that work is released, so it runs unless the application's own stream,
// whose events it waits for, never drains.
void route_teardown(CommState& st);

}  // namespace zc
