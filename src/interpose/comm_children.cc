// ncclCommSplit and ncclCommShrink: the policy (a NULL config inherits the parent's), and the
// child's route. A child joins the channel named after its parent's key, the parent's count
// of Split/Shrink calls and its color (or exclude list), hashed under the job's secret (the
// parent's key carries it: comm_key.h), in the slot of its parent rank; its own rank and size
// come from NCCL once it exists.
#include "comm_children.h"

#include <algorithm>
#include <atomic>
#include <mutex>
#include <vector>

#include "comm_create.h"
#include "comm_state.h"
#include "group_state.h"
#include "real_nccl.h"
#include "route_setup.h"
#include "shim_entry.h"

namespace zc {
namespace {

struct WaitingChild {
  ncclComm_t parent;
  ncclComm_t* slot;
  std::shared_ptr<CommState> st;
};
std::mutex g_children_mu;
std::vector<WaitingChild> g_children;
thread_local std::vector<WaitingChild> t_group_children;  // made inside this thread's group
std::atomic<bool> g_have_children{false};                 // lets every other poll skip the lock

// A child's record before NCCL is asked for it: joined now (or at the group's end) when the
// route mode is on and the parent's identity is known.
std::shared_ptr<CommState> child_state(const std::shared_ptr<CommState>& parent, CommKey key,
                                       int64_t order_key, int policy, bool nonblocking) {
  auto st = new_comm_state(policy, nonblocking);
  st->child = true;
  st->key = key;
  st->device = parent ? parent->device : -1;
  if (parent && key.valid() && route_mode() && parent->rank >= 0 && parent->nranks >= 2 &&
      parent->device >= 0)
    schedule_join(st, JoinPlan{key, static_cast<uint32_t>(parent->nranks),
                               static_cast<uint32_t>(parent->rank), order_key, parent->device});
  return st;
}

// A blocking child knows its rank and size as soon as NCCL handed it out (local queries, made
// only when the route mode is on: a grandchild's join needs them).
void learn_rank(CommState& st) {
  if (!route_mode() || st.nranks > 0) return;
  const RealNccl* nccl = real_nccl();
  int rank = -1, nranks = 0;
  if (nccl && nccl->ncclCommUserRank(st.comm, &rank) == ncclSuccess &&
      nccl->ncclCommCount(st.comm, &nranks) == ncclSuccess && nranks > 0) {
    st.rank = rank;
    st.nranks = nranks;
  }
}

void child_created(const std::shared_ptr<CommState>& st, ncclComm_t parent, ncclComm_t* newcomm,
                   ncclResult_t r) {
  ncclComm_t child = newcomm ? __atomic_load_n(newcomm, __ATOMIC_ACQUIRE) : nullptr;
  if (child == nullptr && group_state().depth > 0 && (r == ncclSuccess || r == ncclInProgress)) {
    t_group_children.push_back({parent, newcomm, st});  // NCCL writes it at the group's end
    return;
  }
  // NCCL 2.28's split answers ncclSuccess even when the child's job still runs (the result of
  // its own group end is not returned), so only an error tells that no handle will come.
  if (child != nullptr || !st->nonblocking || (r != ncclSuccess && r != ncclInProgress)) {
    finish_create(st, child, child ? r : ncclInvalidArgument);
    if (child && !st->nonblocking) learn_rank(*st);
    return;
  }
  std::lock_guard<std::mutex> lock(g_children_mu);
  g_children.push_back({parent, newcomm, st});
  g_have_children.store(true, std::memory_order_release);
}

}  // namespace

void adopt_children(ncclComm_t parent, ncclComm_t handle) {
  if (!g_have_children.load(std::memory_order_acquire)) return;
  std::vector<std::pair<ncclComm_t, std::shared_ptr<CommState>>> adopt;
  {
    std::lock_guard<std::mutex> lock(g_children_mu);
    for (auto it = g_children.begin(); it != g_children.end();) {
      const bool mine = parent != nullptr && it->parent == parent;
      ncclComm_t child =
          mine || handle != nullptr ? __atomic_load_n(it->slot, __ATOMIC_ACQUIRE) : nullptr;
      if (child != nullptr && (mine || child == handle)) {
        adopt.emplace_back(child, it->st);
        it = g_children.erase(it);
      } else {
        ++it;
      }
    }
    g_have_children.store(!g_children.empty(), std::memory_order_release);
  }
  for (auto& [child, st] : adopt)
    if (!comm_lookup(child)) finish_create(st, child, ncclInProgress);
}

void children_at_group_end(ncclResult_t r) {
  auto made = std::move(t_group_children);
  t_group_children.clear();
  for (WaitingChild& c : made) child_created(c.st, c.parent, c.slot, r);
}

void forget_children(ncclComm_t parent) {
  std::vector<std::shared_ptr<CommState>> dropped;
  {
    std::lock_guard<std::mutex> lock(g_children_mu);
    for (auto it = g_children.begin(); it != g_children.end();) {
      if (it->parent == parent) {
        dropped.push_back(it->st);
        it = g_children.erase(it);
      } else {
        ++it;
      }
    }
    g_have_children.store(!g_children.empty(), std::memory_order_release);
  }
  for (auto& st : dropped) route_teardown(*st);
}

}  // namespace zc

using namespace zc;

ZC_EXPORT ncclResult_t ncclCommSplit(ncclComm_t comm, int color, int key, ncclComm_t* newcomm,
                                     ncclConfig_t* config) {
  ZC_PROLOGUE(e, ncclCommSplit, (comm, color, key, newcomm, config));
  auto parent = comm_lookup(comm);
  std::vector<unsigned char> storage;
  PolicyResult p = policy_for(config, NullConfig::kInherit, &storage, "ncclCommSplit");
  // Every rank counts every split, NOCOLOR ones too: the count names the child alike everywhere.
  const uint64_t ordinal = parent ? parent->split_ordinal.fetch_add(1) : 0;
  std::shared_ptr<CommState> st;
  if (color != NCCL_SPLIT_NOCOLOR && newcomm != nullptr) {
    const int policy =
        p.config ? p.policy : (parent && parent->zero_policy ? NCCL_CTA_POLICY_ZERO : -1);
    const CommKey child_key =
        parent && parent->key.valid() ? key_for_split(parent->key, ordinal, color) : CommKey{};
    st = child_state(parent, child_key, key, policy,
                     nonblocking_config(p.config, parent && parent->nonblocking));
  }
  ncclResult_t r = e.real->ncclCommSplit(comm, color, key, newcomm, p.config);
  if (st) child_created(st, comm, newcomm, r);
  return r;
}

ZC_EXPORT ncclResult_t ncclCommShrink(ncclComm_t comm, int* excludeRanksList, int excludeRanksCount,
                                      ncclComm_t* newcomm, ncclConfig_t* config, int shrinkFlags) {
  ZC_PROLOGUE(e, ncclCommShrink,
              (comm, excludeRanksList, excludeRanksCount, newcomm, config, shrinkFlags));
  auto parent = comm_lookup(comm);
  if (parent && (shrinkFlags & NCCL_SHRINK_ABORT)) {
    // The parent's operations are being terminated: ours end too, and their waits are released
    // first. No error of the parent's for it: NCCL reports none (PyTorch polls it meanwhile).
    route_leave_without_error(*parent);
  }
  std::vector<unsigned char> storage;
  PolicyResult p = policy_for(config, NullConfig::kInherit, &storage, "ncclCommShrink");
  const uint64_t ordinal = parent ? parent->shrink_ordinal.fetch_add(1) : 0;
  std::shared_ptr<CommState> st;
  if (newcomm != nullptr) {
    const int policy =
        p.config ? p.policy : (parent && parent->zero_policy ? NCCL_CTA_POLICY_ZERO : -1);
    CommKey child_key;
    // The exclude list is read only when it is plausible; NCCL judges the call itself.
    if (parent && parent->key.valid() && excludeRanksCount >= 0 &&
        excludeRanksCount < parent->nranks && (excludeRanksCount == 0 || excludeRanksList))
      child_key =
          key_for_shrink(parent->key, ordinal,
                         std::vector<int>(excludeRanksList, excludeRanksList + excludeRanksCount));
    const bool excluded =
        child_key.valid() && std::find(excludeRanksList, excludeRanksList + excludeRanksCount,
                                       parent->rank) != excludeRanksList + excludeRanksCount;
    st = child_state(excluded ? nullptr : parent, child_key, parent ? parent->rank : 0, policy,
                     nonblocking_config(p.config, parent && parent->nonblocking));
  }
  ncclResult_t r = e.real->ncclCommShrink(comm, excludeRanksList, excludeRanksCount, newcomm,
                                          p.config, shrinkFlags);
  if (st) child_created(st, comm, newcomm, r);
  return r;
}
