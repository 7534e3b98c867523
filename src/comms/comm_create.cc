#include "comm_create.h"

#include <algorithm>
#include <cstdlib>
#include <cstring>

#include "config.h"
#include "group_state.h"
#include "log.h"
#include "real_nccl.h"
#include "stats.h"

namespace zc {

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

bool route_mode() { return route_wanted(0); }

std::shared_ptr<CommState> new_comm_state(int policy, bool nonblocking) {
  auto st = std::make_shared<CommState>();
  st->zero_policy = policy == NCCL_CTA_POLICY_ZERO;
  st->nonblocking = nonblocking;
  return st;
}

void schedule_join(const std::shared_ptr<CommState>& st, const JoinPlan& plan) {
  GroupState& g = group_state();
  if (g.depth > 0)
    g.pending_joins.emplace_back(st, plan);
  else
    route_join(*st, plan);
}

void finish_create(const std::shared_ptr<CommState>& st, ncclComm_t comm, ncclResult_t r) {
  GroupState& g = group_state();
  if ((r != ncclSuccess && r != ncclInProgress) || comm == nullptr) {
    auto& joins = g.pending_joins;
    joins.erase(
        std::remove_if(joins.begin(), joins.end(), [&st](const auto& j) { return j.first == st; }),
        joins.end());
    route_teardown(*st);  // nothing of ours ran on it
    return;
  }
  if (r == ncclInProgress) st->nonblocking = true;
  comm_insert(comm, st);
  stats_comm_created(st->zero_policy);
  const bool joining = st->route.load() == RouteState::kJoined ||
                       std::any_of(g.pending_joins.begin(), g.pending_joins.end(),
                                   [&st](const auto& j) { return j.first == st; });
  if (!joining || st->nonblocking) return;  // a non-blocking comm: frozen when seen ready
  if (g.depth > 0)
    g.pending_freezes.push_back(st);
  else
    freeze_when_ready(*st, /*on_app_thread=*/true);
}

void freeze_when_ready(CommState& st, bool on_app_thread) {
  if (st.route.load(std::memory_order_acquire) != RouteState::kJoined) return;
  if (st.child && st.nranks == 0) {
    const RealNccl* nccl = real_nccl();
    int rank = -1, nranks = 0;
    if (!nccl || nccl->ncclCommUserRank(st.comm, &rank) != ncclSuccess ||
        nccl->ncclCommCount(st.comm, &nranks) != ncclSuccess || nranks <= 0)
      return;
    st.rank = rank;
    st.nranks = nranks;
  }
  route_freeze(st, on_app_thread);
}

void settle_before_use(CommState* st) {
  if (!st || group_state().depth > 0) return;
  // Not frozen yet: a non-blocking comm nobody polled, or a blocking one of a group whose end
  // answered ncclInProgress (it also held non-blocking inits). NCCL refuses operations on a
  // comm whose init has not completed, so if NCCL calls it ready, every rank's is.
  if (st->route.load(std::memory_order_acquire) == RouteState::kJoined) {
    const RealNccl* nccl = real_nccl();
    ncclResult_t state = ncclInProgress;
    if (nccl && nccl->ncclCommGetAsyncError(st->comm, &state) == ncclSuccess &&
        state == ncclSuccess)
      freeze_when_ready(*st, /*on_app_thread=*/true);
  }
  route_settle(*st);
}

}  // namespace zc
