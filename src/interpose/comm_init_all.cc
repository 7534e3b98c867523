// ncclCommInitAll: NCCL's own never passes a config through, so with a policy to apply it is
// rebuilt from its parts: one unique id, a group, ncclCommInitRankConfig per device, the
// caller's device restored. The communicators are ordinary ranks of one process; in the route
// mode they join one channel, like ranks of separate processes.
#include <vector>

#include "comm_create.h"
#include "comm_state.h"
#include "cuda_driver.h"
#include "group_calls.h"
#include "log.h"
#include "shim_entry.h"

namespace zc {
namespace {

// NCCL's own check of the list: every device in range, none twice. A list it would refuse is
// forwarded so that NCCL refuses it (a half-built group would wait for missing ranks).
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

}  // namespace
}  // namespace zc

using namespace zc;

ZC_EXPORT ncclResult_t ncclCommInitAll(ncclComm_t* comm, int ndev, const int* devlist) {
  ZC_PROLOGUE(e, ncclCommInitAll, (comm, ndev, devlist));
  const CudaDriver* cu = policy_applies() ? cuda_driver() : nullptr;
  const bool parts = cu && e.real->ncclGetUniqueId && e.real->ncclCommInitRankConfig &&
                     e.real->ncclGroupStart && e.real->ncclGroupEnd && comm && ndev > 0;
  if (!parts || !device_list_ok(*cu, ndev, devlist)) {
    if (policy_applies() && !parts)
      ZC_WARN(
          "ncclCommInitAll forwarded unchanged (no CUDA driver to switch devices): the CTA "
          "policy is not applied to these communicators");
    return e.real->ncclCommInitAll(comm, ndev, devlist);
  }
  ncclUniqueId id;
  ncclResult_t r = e.real->ncclGetUniqueId(&id);
  if (r != ncclSuccess) return r;
  std::vector<unsigned char> storage;
  PolicyResult p = policy_for(nullptr, NullConfig::kFresh, &storage, "ncclCommInitAll");
  const bool nonblocking = nonblocking_config(p.config, false);
  std::vector<std::shared_ptr<CommState>> states;
  ScopedDevice restore(-1);  // only saves and restores the caller's context
  // Our group nests in the caller's, if any: the joins and freezes then wait for its end too.
  group_start(*e.real);
  for (int i = 0; i < ndev && r == ncclSuccess; ++i) {
    const int dev = devlist ? devlist[i] : i;
    ScopedDevice on(dev);
    if (!on.ok()) {
      r = ncclInvalidArgument;
      break;
    }
    auto st = new_comm_state(p.policy, nonblocking);
    st->rank = i;
    st->nranks = ndev;
    st->device = dev;
    if (route_mode()) {
      st->key = key_for_init(&id, 1, i);
      if (route_wanted(ndev))
        schedule_join(
            st, JoinPlan{st->key, static_cast<uint32_t>(ndev), static_cast<uint32_t>(i), i, dev});
      else
        route_not_joining(*st, ndev);
    }
    r = e.real->ncclCommInitRankConfig(&comm[i], ndev, id, i, p.config);
    finish_create(st, r == ncclSuccess || r == ncclInProgress ? comm[i] : nullptr, r);
  }
  ncclResult_t end = group_end(*e.real);
  return r == ncclSuccess ? end : r;
}
