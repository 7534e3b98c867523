// A communicator's life: creation by ncclCommInitRank* (the CTA policy, and the route's join
// before NCCL's init can complete), readiness (ncclCommGetAsyncError: the freeze of a
// non-blocking comm, peers' poison), the application's windows, and the teardown paths.
#include <unistd.h>

#include <mutex>
#include <vector>

#include "routed_op.h"
#include "comm_children.h"
#include "comm_create.h"
#include "comm_state.h"
#include "cuda_driver.h"
#include "group_state.h"
#include "log.h"
#include "parked_routes.h"
#include "route_setup.h"
#include "shim_entry.h"
#include "stats.h"

namespace zc {
namespace {

// How long an abort waits for a thread issuing on the same communicator: that thread's route
// work sees the poison within microseconds, so a second means it is held in a driver call.
constexpr int kAbortLockWaitMs = 1000;

// Takes `lock` if it comes free within `ms`, polling (a std::mutex has no timed wait).
bool lock_within(std::unique_lock<std::mutex>& lock, int ms) {
  for (int waited_us = 0; waited_us < ms * 1000; waited_us += 200) {
    if (lock.try_lock()) return true;
    usleep(200);
  }
  return lock.try_lock();
}

// A communicator made from unique ids. Its rank and size are the call's arguments (NCCL fills
// its own fields in only when the init completes, at a group's end); its device is the
// current one. In the route mode every rank counts the ids, so that the key names the same
// instance everywhere, and joins its channel when the route could engage on this size.
template <typename Forward>
ncclResult_t init_comm(const char* fn, ncclComm_t* out, int nranks, int rank,
                       const ncclUniqueId* ids, int nids, const ncclConfig_t* caller,
                       Forward forward) {
  std::vector<unsigned char> storage;
  PolicyResult p = policy_for(caller, NullConfig::kFresh, &storage, fn);
  auto st = new_comm_state(p.policy, nonblocking_config(p.config, false));
  st->rank = rank;
  st->nranks = nranks;
  if (route_mode() && out != nullptr && ids != nullptr && nids > 0) {
    st->key = key_for_init(ids, nids, rank);
    st->device = current_device();
    if (route_wanted(nranks) && rank >= 0 && rank < nranks && st->device >= 0)
      schedule_join(st, JoinPlan{st->key, static_cast<uint32_t>(nranks),
                                 static_cast<uint32_t>(rank), rank, st->device});
    else
      route_not_joining(*st, nranks);
  }
  ncclResult_t r = forward(p.config);
  finish_create(st, out ? *out : nullptr, r);
  return r;
}

// Finalize and Destroy, once NCCL accepted the call (NCCL refuses it on a non-blocking comm
// still in progress, which then lives on): our work drains, then what is ours is freed. None
// of it depends on NCCL's communicator.
void end_route_of(ncclComm_t comm, bool remove, ncclResult_t r) {
  stats_write_now();  // torchrun's SIGTERM and os._exit skip the exit report
  if (r != ncclSuccess && r != ncclInProgress) return;
  auto st = remove ? comm_remove(comm) : comm_lookup(comm);
  if (remove) forget_children(comm);
  if (!st) return;
  std::lock_guard<std::mutex> lock(st->issue_mu);
  route_teardown(*st);
}

}  // namespace
}  // namespace zc

using namespace zc;

ZC_EXPORT ncclResult_t ncclCommInitRankConfig(ncclComm_t* comm, int nranks, ncclUniqueId commId,
                                              int rank, ncclConfig_t* config) {
  ZC_PROLOGUE(e, ncclCommInitRankConfig, (comm, nranks, commId, rank, config));
  return init_comm("ncclCommInitRankConfig", comm, nranks, rank, &commId, 1, config,
                   [&](ncclConfig_t* c) {
                     return e.real->ncclCommInitRankConfig(comm, nranks, commId, rank, c);
                   });
}

// InitRank passes no config; with a policy to apply it becomes InitRankConfig with a fresh one.
ZC_EXPORT ncclResult_t ncclCommInitRank(ncclComm_t* comm, int nranks, ncclUniqueId commId,
                                        int rank) {
  ZC_PROLOGUE(e, ncclCommInitRank, (comm, nranks, commId, rank));
  if (policy_applies() && !e.real->ncclCommInitRankConfig) {
    warn_missing_function("ncclCommInitRankConfig");
    return ncclInternalError;
  }
  return init_comm("ncclCommInitRank", comm, nranks, rank, &commId, 1, nullptr,
                   [&](ncclConfig_t* c) {
                     return c ? e.real->ncclCommInitRankConfig(comm, nranks, commId, rank, c)
                              : e.real->ncclCommInitRank(comm, nranks, commId, rank);
                   });
}

ZC_EXPORT ncclResult_t ncclCommInitRankScalable(ncclComm_t* newcomm, int nranks, int myrank,
                                                int nId, ncclUniqueId* commIds,
                                                ncclConfig_t* config) {
  ZC_PROLOGUE(e, ncclCommInitRankScalable, (newcomm, nranks, myrank, nId, commIds, config));
  return init_comm("ncclCommInitRankScalable", newcomm, nranks, myrank, commIds, nId, config,
                   [&](ncclConfig_t* c) {
                     return e.real->ncclCommInitRankScalable(newcomm, nranks, myrank, nId, commIds,
                                                             c);
                   });
}

ZC_EXPORT ncclResult_t ncclCommFinalize(ncclComm_t comm) {
  ZC_PROLOGUE(e, ncclCommFinalize, (comm));
  const ncclResult_t r = e.real->ncclCommFinalize(comm);
  end_route_of(comm, /*remove=*/false, r);
  return r;
}

ZC_EXPORT ncclResult_t ncclCommDestroy(ncclComm_t comm) {
  ZC_PROLOGUE(e, ncclCommDestroy, (comm));
  const ncclResult_t r = e.real->ncclCommDestroy(comm);
  end_route_of(comm, /*remove=*/true, r);
  return r;
}

// Abort must never wait on our work: release our device-side waits, let NCCL abort, then
// free what is ours — or what no stream of ours still uses (route_teardown never waits).
ZC_EXPORT ncclResult_t ncclCommAbort(ncclComm_t comm) {
  ZC_PROLOGUE(e, ncclCommAbort, (comm));
  auto st = comm_remove(comm);
  forget_children(comm);
  if (st) route_leave(*st);  // releases every wait, ours and the peers'
  ncclResult_t r = e.real->ncclCommAbort(comm);
  if (st) {
    // Poisoned, an op another thread is issuing ends at its next check; one held in a driver
    // call may not: its state is then left as it is (the process's to reclaim at exit) rather
    // than freed under it or waited for.
    std::unique_lock<std::mutex> issuing(st->issue_mu, std::defer_lock);
    if (lock_within(issuing, kAbortLockWaitMs))
      route_teardown(*st);
    else
      ZC_INFO("route: rank %d: aborted while another thread issues on it; its route's memory "
              "stays until exit",
              st->rank);
  }
  return r;
}

ZC_EXPORT ncclResult_t ncclCommRevoke(ncclComm_t comm, int revokeFlags) {
  ZC_PROLOGUE(e, ncclCommRevoke, (comm, revokeFlags));
  if (auto st = comm_lookup(comm)) route_leave(*st);  // releases every wait
  return e.real->ncclCommRevoke(comm, revokeFlags);
}

// NCCL 2.29.7's flag of ncclCommSuspend (not in the 2.28 header this library builds with).
constexpr int kSuspendMem = 0x01;

// Releases the route's memory with NCCL's: the peers' allocations this rank imported (which
// keep that memory alive) and its stage come back on demand at the next routed op.
ZC_EXPORT ncclResult_t ncclCommSuspend(ncclComm_t comm, int flags) {
  ZC_PROLOGUE(e, ncclCommSuspend, (comm, flags));
  const ncclResult_t r = e.real->ncclCommSuspend(comm, flags);
  auto st = comm_lookup(comm);
  if (r != ncclSuccess || !(flags & kSuspendMem) || !st) return r;
  GroupState& g = group_state();
  if (g.depth > 0)  // inside an application group: once the group has run
    g.after_end.push_back([st] { route_suspend_memory(*st); });
  else
    route_suspend_memory(*st);
  return r;
}

namespace {
void remember_window(CommState& st, uintptr_t base, size_t size, ncclWindow_t win) {
  std::lock_guard<std::mutex> lock(st.windows_mu);
  st.app_windows.push_back({base, size, win});
  st.has_app_windows.store(true);
}

// A window NCCL has not handed out yet: now (its handle written), once a poll sees the
// non-blocking comm ready, or never (a blocking comm leaves it NULL only on failure).
void remember_window_when_written(CommState& st, void* buff, size_t size, ncclWindow_t* win) {
  const auto base = reinterpret_cast<uintptr_t>(buff);
  if (ncclWindow_t w = __atomic_load_n(win, __ATOMIC_ACQUIRE)) {
    remember_window(st, base, size, w);
  } else if (st.nonblocking) {
    std::lock_guard<std::mutex> lock(st.windows_mu);
    st.pending_windows.push_back({base, size, win});
  }
}

// The pending windows NCCL has written by now (called when a poll saw the comm ready).
void settle_pending_windows(CommState& st) {
  std::lock_guard<std::mutex> lock(st.windows_mu);
  for (auto it = st.pending_windows.begin(); it != st.pending_windows.end();) {
    ncclWindow_t w = __atomic_load_n(it->win, __ATOMIC_ACQUIRE);
    if (!w) {
      ++it;
      continue;
    }
    st.app_windows.push_back({it->base, it->size, w});
    st.has_app_windows.store(true);
    it = st.pending_windows.erase(it);
  }
}
}  // namespace

// PyTorch's watchdog polls this from its own thread: only host work here. The call that first
// sees a joined comm ready freezes its membership (route_setup.h); a poisoned comm, or one a
// peer poisoned through the channel, answers with its error.
ZC_EXPORT ncclResult_t ncclCommGetAsyncError(ncclComm_t comm, ncclResult_t* asyncError) {
  ZC_PROLOGUE(e, ncclCommGetAsyncError, (comm, asyncError));
  ncclResult_t r = e.real->ncclCommGetAsyncError(comm, asyncError);
  if (r != ncclSuccess || asyncError == nullptr || *asyncError != ncclSuccess) return r;
  adopt_children(comm, comm);
  release_parked_flags();
  if (auto st = comm_lookup(comm)) {
    freeze_when_ready(*st, /*on_app_thread=*/false);
    settle_pending_windows(*st);
    check_captured_replays(*st);
    route_adopt_peer_poison(*st);
    // A peer that left (aborted) while this rank's routed ops still needed it.
    if (route_peer_left(*st)) {
      int none = ncclSuccess;
      st->poisoned.compare_exchange_strong(none, ncclRemoteError);
    }
    if (int p = st->poisoned.load(std::memory_order_relaxed)) {
      *asyncError = static_cast<ncclResult_t>(p);
      // Again at every poll: a stream's queued write of an older op number may have overwritten
      // the release (host stores only, as this may be the watchdog's thread).
      route_release_waits(*st);
    }
  }
  return r;
}

ZC_EXPORT ncclResult_t ncclCommWindowRegister(ncclComm_t comm, void* buff, size_t size,
                                              ncclWindow_t* win, int winFlags) {
  ZC_PROLOGUE(e, ncclCommWindowRegister, (comm, buff, size, win, winFlags));
  ncclResult_t r = e.real->ncclCommWindowRegister(comm, buff, size, win, winFlags);
  if ((r != ncclSuccess && r != ncclInProgress) || !win || !(winFlags & NCCL_WIN_COLL_SYMMETRIC))
    return r;
  auto st = comm_lookup(comm);
  if (!st) return r;
  // NCCL writes *win only at the end of the application's group (2.28), and on a non-blocking
  // comm only once its job is done (ncclInProgress here): the caller's pointer stays valid
  // until then, NCCL's contract.
  if (group_state().depth > 0)
    group_state().after_end.push_back(
        [st, buff, size, win] { remember_window_when_written(*st, buff, size, win); });
  else
    remember_window_when_written(*st, buff, size, win);
  return r;
}

ZC_EXPORT ncclResult_t ncclCommWindowDeregister(ncclComm_t comm, ncclWindow_t win) {
  ZC_PROLOGUE(e, ncclCommWindowDeregister, (comm, win));
  if (auto st = comm_lookup(comm)) {
    std::lock_guard<std::mutex> lock(st->windows_mu);
    auto& v = st->app_windows;
    for (auto it = v.begin(); it != v.end(); ++it)
      if (it->win == win) {
        v.erase(it);
        break;
      }
    st->has_app_windows.store(!v.empty());
  }
  return e.real->ncclCommWindowDeregister(comm, win);
}
