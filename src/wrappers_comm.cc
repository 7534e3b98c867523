// Communicator life cycle: every creation path gets the CTA policy (and, on NCCL 2.28, the
// copy-engine pool); every teardown path frees our resources before NCCL tears down.
#include <algorithm>
#include <atomic>
#include <cstdlib>
#include <cstring>
#include <vector>

#include "ce_setup.h"
#include "comm_state.h"
#include "config.h"
#include "cta_policy.h"
#include "cuda_driver.h"
#include "group_state.h"
#include "log.h"
#include "nonblocking_setup.h"
#include "shim_entry.h"
#include "stats.h"

namespace zc {
namespace {

// Whether a communicator created with this config will be non-blocking. Reads only what the
// struct's own `size` covers, like NCCL (parseCommConfig copies `size` bytes, nothing more).
bool nonblocking_config(const ncclConfig_t* c, bool inherit_nonblocking) {
  const char* env = getenv("NCCL_COMM_BLOCKING");
  const bool env_nonblocking = env && strcmp(env, "0") == 0;
  if (c == nullptr) return inherit_nonblocking || env_nonblocking;
  size_t size = 0;
  unsigned magic = 0;
  int blocking = NCCL_CONFIG_UNDEF_INT;
  memcpy(&size, c, sizeof size);
  if (size >= 12) memcpy(&magic, reinterpret_cast<const char*>(c) + 8, sizeof magic);
  if (magic == 0xcafebeef && size >= offsetof(ncclConfig_t, blocking) + sizeof(int))
    memcpy(&blocking, reinterpret_cast<const char*>(c) + offsetof(ncclConfig_t, blocking),
           sizeof(int));
  if (blocking == NCCL_CONFIG_UNDEF_INT) return env_nonblocking;
  return blocking == 0;
}

// Whether a new communicator goes through ce_setup. Every enabled rank on NCCL 2.28 does,
// whatever its ZEROCTA_ALLGATHER: the set-up starts with a collective facts exchange, and a
// rank that skipped it because it wants no pool would leave its peers waiting in that
// all-gather (or matched with its next collective). ce_setup stops after the exchange when
// the agreed configuration wants no pool.
bool joins_setup() { return runtime_tier() == RuntimeTier::kFull; }
constexpr const char* kNoSetup = "the copy-engine route needs NCCL 2.28.x";

// Whether the CTA policy is to be applied: not with keep, not below NCCL 2.28.
bool policy_applies() {
  if (config().cta_policy == CtaPolicyMode::kKeep) return false;
  RuntimeTier t = runtime_tier();
  return t == RuntimeTier::kFull || t == RuntimeTier::kPolicyOnly;
}

PolicyResult policy_for(const ncclConfig_t* caller, NullConfig null_config,
                        std::vector<unsigned char>* storage, const char* fn) {
  const Config& c = config();
  if (!policy_applies()) {
    PolicyResult p;
    p.config = const_cast<ncclConfig_t*>(caller);
    return p;
  }
  PolicyResult p = apply_cta_policy(caller, null_config, c.cta_policy, c.cta_policy_force, storage);
  ZC_INFO("%s: CTAPolicy %d (%s)", fn, p.policy, p.why.c_str());
  return p;
}

// Records a new communicator; sets up its pool now, or at the outermost group end.
std::shared_ptr<CommState> after_create(const RealNccl& nccl, ncclComm_t comm, ncclResult_t r,
                                        int policy, bool nonblocking, bool setup_now = true) {
  if ((r != ncclSuccess && r != ncclInProgress) || comm == nullptr) return nullptr;
  auto st = comm_add(comm);
  st->zero_policy = policy == NCCL_CTA_POLICY_ZERO;
  st->nonblocking = nonblocking || r == ncclInProgress;
  stats_comm_created(st->zero_policy);
  if (st->nonblocking) {
    // Not ready yet: rank, size and device are read, and the pool set up, once the
    // application sees it ready (nonblocking_setup.h); with !setup_now the caller batches.
    if (!joins_setup())
      st->ce_missing = kNoSetup;
    else if (setup_now)
      defer_nonblocking_setup({st});
    return st;
  }
  // Size and rank are needed to count all-gather bytes on every route (local queries).
  nccl.ncclCommUserRank(comm, &st->rank);
  nccl.ncclCommCount(comm, &st->nranks);
  if (!joins_setup()) {
    st->ce_missing = kNoSetup;
    return st;
  }
  nccl.ncclCommCuDevice(comm, &st->device);
  if (!setup_now) return st;  // the caller sets up several comms together
  GroupState& g = group_state();
  if (g.depth > 0)
    g.pending_setup.push_back(st);
  else
    ce_setup({st});
  return st;
}

// Children of ncclCommSplit/ncclCommShrink. NCCL writes a non-blocking child's handle into
// the caller's *newcomm only when its initialisation job ends, so such a child is recorded
// by that slot and adopted once the handle is there: when the parent is polled ready, or
// when the application first presents the handle (it may do so only after NCCL wrote it).
struct PendingChild {
  ncclComm_t parent;
  ncclComm_t* slot;
  int policy;
};
std::mutex g_children_mu;
std::vector<PendingChild> g_children;
std::atomic<bool> g_have_children{false};  // lets every other poll skip the lock

// `member`: false for a split with NCCL_SPLIT_NOCOLOR, which never gets a communicator.
void created_child(const RealNccl& nccl, ncclComm_t parent, ncclComm_t* newcomm, ncclResult_t r,
                   int policy, bool nonblocking, bool member = true) {
  if (newcomm == nullptr || !member) return;
  ncclComm_t child = __atomic_load_n(newcomm, __ATOMIC_ACQUIRE);
  // NCCL 2.28's split answers ncclSuccess even when the child's job still runs (the result of
  // its own group end is not returned), so only an error tells that no handle will come.
  if (child != nullptr || !nonblocking || (r != ncclSuccess && r != ncclInProgress)) {
    after_create(nccl, child, r, policy, nonblocking);
    return;
  }
  std::lock_guard<std::mutex> lock(g_children_mu);
  g_children.push_back({parent, newcomm, policy});
  g_have_children.store(true, std::memory_order_release);
}

// Adopts the pending children of `parent` whose handle has arrived (parent != nullptr), or
// the one whose handle is `handle`.
void adopt_children(const RealNccl& nccl, ncclComm_t parent, ncclComm_t handle) {
  if (!g_have_children.load(std::memory_order_acquire)) return;
  std::vector<std::pair<ncclComm_t, int>> adopt;
  {
    std::lock_guard<std::mutex> lock(g_children_mu);
    for (auto it = g_children.begin(); it != g_children.end();) {
      const bool mine = parent != nullptr && it->parent == parent;
      ncclComm_t child =
          mine || handle != nullptr ? __atomic_load_n(it->slot, __ATOMIC_ACQUIRE) : nullptr;
      if (child != nullptr && (mine || child == handle)) {
        adopt.emplace_back(child, it->policy);
        it = g_children.erase(it);
      } else {
        ++it;
      }
    }
    g_have_children.store(!g_children.empty(), std::memory_order_release);
  }
  for (auto& [child, policy] : adopt)
    if (!comm_lookup(child)) after_create(nccl, child, ncclInProgress, policy, true);
}

// A parent going away takes its unresolved children's records with it (their slots may die).
void forget_children(ncclComm_t parent) {
  std::lock_guard<std::mutex> lock(g_children_mu);
  g_children.erase(std::remove_if(g_children.begin(), g_children.end(),
                                  [parent](const PendingChild& c) { return c.parent == parent; }),
                   g_children.end());
  g_have_children.store(!g_children.empty(), std::memory_order_release);
}

// NCCL's own check of ncclCommInitAll's list: every device in range, none twice.
bool device_list_ok(const CudaDriver& cu, int ndev, const int* devlist) {
  if (devlist == nullptr) return true;
  int total = 0;
  if (cu.cuDeviceGetCount(&total) != CUDA_SUCCESS) return false;
  std::vector<bool> seen(static_cast<size_t>(total > 0 ? total : 0), false);
  for (int i = 0; i < ndev; ++i) {
    const int d = devlist[i];
    if (d < 0 || d >= total || seen[static_cast<size_t>(d)]) return false;
    seen[static_cast<size_t>(d)] = true;
  }
  return true;
}

// Teardown shared by Finalize/Destroy: wait for our work, deregister, free.
void release_pool(ncclComm_t comm, bool remove) {
  auto st = comm_lookup(comm);
  // A peer that saw the comm ready has set up its pool and waits for ours: set up first.
  settle_before_use(st.get());
  if (remove) {
    forget_children(comm);
    comm_remove(comm);
  }
  if (!st) return;
  std::lock_guard<std::mutex> lock(st->issue_mu);
  ce_teardown(*st, st->poisoned.load() == ncclRemoteError);
}

}  // namespace
}  // namespace zc

using namespace zc;

ZC_EXPORT ncclResult_t ncclCommInitRankConfig(ncclComm_t* comm, int nranks, ncclUniqueId commId,
                                              int rank, ncclConfig_t* config) {
  Entry e = enter(__builtin_return_address(0));
  if (e.gate == Gate::kFail) return e.code;
  if (e.gate != Gate::kActive)
    ZC_CALL_REAL(ncclResult_t, e, ncclCommInitRankConfig, (comm, nranks, commId, rank, config));
  if (!e.real->ncclCommInitRankConfig) {
    warn_missing_function("ncclCommInitRankConfig");
    return ncclInternalError;
  }
  std::vector<unsigned char> storage;
  PolicyResult p = policy_for(config, NullConfig::kFresh, &storage, "ncclCommInitRankConfig");
  ncclResult_t r = e.real->ncclCommInitRankConfig(comm, nranks, commId, rank, p.config);
  after_create(*e.real, comm ? *comm : nullptr, r, p.policy, nonblocking_config(p.config, false));
  return r;
}

ZC_EXPORT ncclResult_t ncclCommInitRank(ncclComm_t* comm, int nranks, ncclUniqueId commId,
                                        int rank) {
  Entry e = enter(__builtin_return_address(0));
  if (e.gate == Gate::kFail) return e.code;
  if (e.gate != Gate::kActive || !policy_applies()) {
    if (e.gate == Gate::kActive && e.real->ncclCommInitRank) {
      ncclResult_t r = e.real->ncclCommInitRank(comm, nranks, commId, rank);
      after_create(*e.real, comm ? *comm : nullptr, r, -1, nonblocking_config(nullptr, false));
      return r;
    }
    ZC_CALL_REAL(ncclResult_t, e, ncclCommInitRank, (comm, nranks, commId, rank));
  }
  if (!e.real->ncclCommInitRankConfig) {
    warn_missing_function("ncclCommInitRankConfig");
    return ncclInternalError;
  }
  // InitRank passes no config; InitRankConfig with a fresh one is the same call plus our policy.
  std::vector<unsigned char> storage;
  PolicyResult p = policy_for(nullptr, NullConfig::kFresh, &storage, "ncclCommInitRank");
  ncclResult_t r = e.real->ncclCommInitRankConfig(comm, nranks, commId, rank, p.config);
  after_create(*e.real, comm ? *comm : nullptr, r, p.policy, nonblocking_config(p.config, false));
  return r;
}

ZC_EXPORT ncclResult_t ncclCommInitRankScalable(ncclComm_t* newcomm, int nranks, int myrank,
                                                int nId, ncclUniqueId* commIds,
                                                ncclConfig_t* config) {
  Entry e = enter(__builtin_return_address(0));
  if (e.gate == Gate::kFail) return e.code;
  if (e.gate != Gate::kActive)
    ZC_CALL_REAL(ncclResult_t, e, ncclCommInitRankScalable,
                 (newcomm, nranks, myrank, nId, commIds, config));
  if (!e.real->ncclCommInitRankScalable) {
    warn_missing_function("ncclCommInitRankScalable");
    return ncclInternalError;
  }
  std::vector<unsigned char> storage;
  PolicyResult p = policy_for(config, NullConfig::kFresh, &storage, "ncclCommInitRankScalable");
  ncclResult_t r =
      e.real->ncclCommInitRankScalable(newcomm, nranks, myrank, nId, commIds, p.config);
  after_create(*e.real, newcomm ? *newcomm : nullptr, r, p.policy,
               nonblocking_config(p.config, false));
  return r;
}

// NCCL's own InitAll never passes a config through; rebuild it from its parts: one unique
// id, a group, one ncclCommInitRankConfig per device, the caller's device restored.
ZC_EXPORT ncclResult_t ncclCommInitAll(ncclComm_t* comm, int ndev, const int* devlist) {
  Entry e = enter(__builtin_return_address(0));
  if (e.gate == Gate::kFail) return e.code;
  const bool wanted = e.gate == Gate::kActive && policy_applies();
  const CudaDriver* cu = wanted ? cuda_driver() : nullptr;
  bool rebuild =
      wanted && cu && e.real->ncclGetUniqueId && e.real->ncclCommInitRankConfig && comm && ndev > 0;
  // NCCL checks the whole device list before creating anything; a list it would refuse is
  // forwarded so that NCCL refuses it (a half-built group would wait for missing ranks).
  const bool bad_list = rebuild && !device_list_ok(*cu, ndev, devlist);
  if (bad_list) rebuild = false;
  if (wanted && !rebuild && !bad_list)
    ZC_WARN(
        "ncclCommInitAll forwarded unchanged (no CUDA driver to switch devices): the CTA "
        "policy is not applied to these communicators");
  if (!rebuild) {
    if (e.gate != Gate::kActive || !e.real->ncclCommInitAll)
      ZC_CALL_REAL(ncclResult_t, e, ncclCommInitAll, (comm, ndev, devlist));
    ncclResult_t r = e.real->ncclCommInitAll(comm, ndev, devlist);
    std::vector<std::shared_ptr<CommState>> created, nonblocking;
    for (int i = 0; (r == ncclSuccess || r == ncclInProgress) && comm && i < ndev; ++i)
      if (auto st = after_create(*e.real, comm[i], r, -1, nonblocking_config(nullptr, false),
                                 /*setup_now=*/false))
        if (joins_setup()) (st->nonblocking ? nonblocking : created).push_back(st);
    if (group_state().depth == 0)
      ce_setup(created);
    else
      for (auto& st : created) group_state().pending_setup.push_back(st);
    defer_nonblocking_setup(nonblocking);
    return r;
  }
  ncclUniqueId id;
  ncclResult_t r = e.real->ncclGetUniqueId(&id);
  if (r != ncclSuccess) return r;
  std::vector<unsigned char> storage;
  PolicyResult p = policy_for(nullptr, NullConfig::kFresh, &storage, "ncclCommInitAll");
  std::vector<std::shared_ptr<CommState>> created;
  {
    ScopedDevice restore(-1);  // only saves and restores the caller's context
    e.real->ncclGroupStart();
    for (int i = 0; i < ndev && r == ncclSuccess; ++i) {
      int dev = devlist ? devlist[i] : i;
      ScopedDevice on(dev);
      if (!on.ok()) {
        r = ncclInvalidArgument;
        break;
      }
      r = e.real->ncclCommInitRankConfig(&comm[i], ndev, id, i, p.config);
    }
    ncclResult_t end = e.real->ncclGroupEnd();
    if (r == ncclSuccess) r = end;
    std::vector<std::shared_ptr<CommState>> nonblocking;
    if (r == ncclSuccess || r == ncclInProgress)
      for (int i = 0; i < ndev; ++i) {
        auto st = after_create(*e.real, comm[i], r, p.policy, nonblocking_config(p.config, false),
                               /*setup_now=*/false);
        if (st && joins_setup()) (st->nonblocking ? nonblocking : created).push_back(st);
      }
    // NCCL_COMM_BLOCKING=0: one thread drives all of them, so they are set up as one batch.
    defer_nonblocking_setup(nonblocking);
  }
  // Outside any group of the caller's, the pools of all devices are set up together.
  if (group_state().depth == 0)
    ce_setup(created);
  else
    for (auto& st : created) group_state().pending_setup.push_back(st);
  return r;
}

ZC_EXPORT ncclResult_t ncclCommSplit(ncclComm_t comm, int color, int key, ncclComm_t* newcomm,
                                     ncclConfig_t* config) {
  Entry e = enter(__builtin_return_address(0));
  if (e.gate == Gate::kFail) return e.code;
  if (e.gate != Gate::kActive)
    ZC_CALL_REAL(ncclResult_t, e, ncclCommSplit, (comm, color, key, newcomm, config));
  if (!e.real->ncclCommSplit) {
    warn_missing_function("ncclCommSplit");
    return ncclInternalError;
  }
  auto parent = comm_lookup(comm);
  settle_before_use(parent.get());
  std::vector<unsigned char> storage;
  PolicyResult p = policy_for(config, NullConfig::kInherit, &storage, "ncclCommSplit");
  ncclResult_t r = e.real->ncclCommSplit(comm, color, key, newcomm, p.config);
  int policy = p.config ? p.policy : (parent && parent->zero_policy ? NCCL_CTA_POLICY_ZERO : -1);
  created_child(*e.real, comm, newcomm, r, policy,
                nonblocking_config(p.config, parent && parent->nonblocking),
                color != NCCL_SPLIT_NOCOLOR);
  return r;
}

ZC_EXPORT ncclResult_t ncclCommShrink(ncclComm_t comm, int* excludeRanksList, int excludeRanksCount,
                                      ncclComm_t* newcomm, ncclConfig_t* config, int shrinkFlags) {
  Entry e = enter(__builtin_return_address(0));
  if (e.gate == Gate::kFail) return e.code;
  if (e.gate != Gate::kActive)
    ZC_CALL_REAL(ncclResult_t, e, ncclCommShrink,
                 (comm, excludeRanksList, excludeRanksCount, newcomm, config, shrinkFlags));
  if (!e.real->ncclCommShrink) {
    warn_missing_function("ncclCommShrink");
    return ncclInternalError;
  }
  auto parent = comm_lookup(comm);
  if (!(shrinkFlags & NCCL_SHRINK_ABORT)) settle_before_use(parent.get());
  if (parent && (shrinkFlags & NCCL_SHRINK_ABORT)) {
    // The parent's operations are being terminated: release ours first.
    parent->poisoned.store(ncclRemoteError);
    ce_release_waits(*parent);
  }
  std::vector<unsigned char> storage;
  PolicyResult p = policy_for(config, NullConfig::kInherit, &storage, "ncclCommShrink");
  ncclResult_t r = e.real->ncclCommShrink(comm, excludeRanksList, excludeRanksCount, newcomm,
                                          p.config, shrinkFlags);
  int policy = p.config ? p.policy : (parent && parent->zero_policy ? NCCL_CTA_POLICY_ZERO : -1);
  created_child(*e.real, comm, newcomm, r, policy,
                nonblocking_config(p.config, parent && parent->nonblocking));
  return r;
}

ZC_EXPORT ncclResult_t ncclCommFinalize(ncclComm_t comm) {
  Entry e = enter(__builtin_return_address(0));
  if (e.gate == Gate::kFail) return e.code;
  if (e.gate == Gate::kActive) release_pool(comm, /*remove=*/false);
  ZC_CALL_REAL(ncclResult_t, e, ncclCommFinalize, (comm));
}

ZC_EXPORT ncclResult_t ncclCommDestroy(ncclComm_t comm) {
  Entry e = enter(__builtin_return_address(0));
  if (e.gate == Gate::kFail) return e.code;
  if (e.gate == Gate::kActive) release_pool(comm, /*remove=*/true);
  ZC_CALL_REAL(ncclResult_t, e, ncclCommDestroy, (comm));
}

// Abort must never wait on our work: release our device-side waits, let NCCL abort, then
// free what is ours. No lock is taken that an issuing thread could hold.
ZC_EXPORT ncclResult_t ncclCommAbort(ncclComm_t comm) {
  Entry e = enter(__builtin_return_address(0));
  if (e.gate == Gate::kFail) return e.code;
  if (e.gate != Gate::kActive) ZC_CALL_REAL(ncclResult_t, e, ncclCommAbort, (comm));
  auto st = comm_remove(comm);
  forget_children(comm);
  if (st) {
    st->poisoned.store(ncclRemoteError);
    ce_release_waits(*st);
  }
  if (!e.real->ncclCommAbort) {
    warn_missing_function("ncclCommAbort");
    return ncclInternalError;
  }
  ncclResult_t r = e.real->ncclCommAbort(comm);
  if (st) {
    // Our waits are released and the comm is poisoned, so an issuing thread finishes soon;
    // wait for it before freeing what it uses.
    std::lock_guard<std::mutex> lock(st->issue_mu);
    ce_teardown(*st, /*aborting=*/true);
  }
  return r;
}

ZC_EXPORT ncclResult_t ncclCommRevoke(ncclComm_t comm, int revokeFlags) {
  Entry e = enter(__builtin_return_address(0));
  if (e.gate == Gate::kFail) return e.code;
  if (e.gate == Gate::kActive)
    if (auto st = comm_lookup(comm)) {
      st->poisoned.store(ncclRemoteError);
      ce_release_waits(*st);
    }
  ZC_CALL_REAL(ncclResult_t, e, ncclCommRevoke, (comm, revokeFlags));
}

// PyTorch's watchdog polls this from its own thread: no CUDA call, no lock NCCL could hold,
// except once per non-blocking comm: the call that first sees it ready sets up its pool
// (nonblocking_setup.h), and other threads see ncclInProgress meanwhile.
ZC_EXPORT ncclResult_t ncclCommGetAsyncError(ncclComm_t comm, ncclResult_t* asyncError) {
  Entry e = enter(__builtin_return_address(0));
  if (e.gate == Gate::kFail) return e.code;
  if (!e.real->ncclCommGetAsyncError) {
    warn_missing_function("ncclCommGetAsyncError");
    return ncclInternalError;
  }
  ncclResult_t r = e.real->ncclCommGetAsyncError(comm, asyncError);
  if (e.gate == Gate::kActive && r == ncclSuccess && asyncError && *asyncError == ncclSuccess) {
    // A non-blocking split's child: adopted once its parent is ready or its handle shows up.
    adopt_children(*e.real, comm, comm);
    if (auto st = comm_lookup(comm)) {
      if (st->setup_pending.load(std::memory_order_acquire))
        *asyncError = run_pending_setup(*st, /*wait=*/false);
      int p = st->poisoned.load(std::memory_order_relaxed);
      if (p != ncclSuccess) *asyncError = static_cast<ncclResult_t>(p);
    }
  }
  return r;
}

ZC_EXPORT ncclResult_t ncclCommWindowRegister(ncclComm_t comm, void* buff, size_t size,
                                              ncclWindow_t* win, int winFlags) {
  Entry e = enter(__builtin_return_address(0));
  if (e.gate == Gate::kFail) return e.code;
  if (!e.real->ncclCommWindowRegister) {
    warn_missing_function("ncclCommWindowRegister");
    return ncclInternalError;
  }
  ncclResult_t r = e.real->ncclCommWindowRegister(comm, buff, size, win, winFlags);
  if (e.gate == Gate::kActive && r == ncclSuccess && win && *win &&
      (winFlags & NCCL_WIN_COLL_SYMMETRIC))
    if (auto st = comm_lookup(comm)) {
      std::lock_guard<std::mutex> lock(st->windows_mu);
      st->app_windows.push_back({reinterpret_cast<uintptr_t>(buff), size, *win});
      st->has_app_windows.store(true);
    }
  return r;
}

ZC_EXPORT ncclResult_t ncclCommWindowDeregister(ncclComm_t comm, ncclWindow_t win) {
  Entry e = enter(__builtin_return_address(0));
  if (e.gate == Gate::kFail) return e.code;
  if (e.gate == Gate::kActive)
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
  ZC_CALL_REAL(ncclResult_t, e, ncclCommWindowDeregister, (comm, win));
}
