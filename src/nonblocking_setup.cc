#include "nonblocking_setup.h"

#include <sched.h>
#include <unistd.h>

#include "ce_setup.h"
#include "group_state.h"
#include "log.h"

namespace zc {

void defer_nonblocking_setup(const std::vector<std::shared_ptr<CommState>>& comms) {
  if (comms.empty()) return;
  GroupState& g = group_state();
  std::shared_ptr<PendingSetup> batch;
  if (g.depth > 0) {
    if (!g.nonblocking_batch) g.nonblocking_batch = std::make_shared<PendingSetup>();
    batch = g.nonblocking_batch;
  } else {
    batch = std::make_shared<PendingSetup>();
  }
  {
    std::lock_guard<std::mutex> lock(batch->mu);
    for (auto& c : comms) batch->comms.push_back(c);
  }
  for (auto& c : comms) {
    {
      std::lock_guard<std::mutex> lock(c->pending_mu);
      c->pending = batch;
    }
    c->ce_missing = "non-blocking communicator not seen ready yet";
    c->setup_pending.store(true, std::memory_order_release);
  }
}

ncclResult_t wait_in_progress(const RealNccl& nccl, const std::vector<ncclComm_t>& comms,
                              ncclResult_t r) {
  // Polled after ncclSuccess too: a non-blocking comm may answer ncclSuccess to the call yet
  // stay in progress for a moment, and NCCL rejects the next call until it is not.
  if (r != ncclSuccess && r != ncclInProgress) return r;
  for (unsigned spin = 0;; ++spin) {
    bool busy = false;
    for (ncclComm_t c : comms) {
      ncclResult_t state = ncclSuccess;
      ncclResult_t q = nccl.ncclCommGetAsyncError(c, &state);
      if (q != ncclSuccess) return q;
      if (state == ncclInProgress)
        busy = true;
      else if (state != ncclSuccess)
        return state;
    }
    if (!busy) return ncclSuccess;
    // NCCL's own threads finish the work; stay out of their way, more so the longer it takes.
    if (spin < 64)
      sched_yield();
    else
      usleep(spin < 1024 ? 50 : 1000);
  }
}

ncclResult_t run_pending_setup(CommState& st, bool wait) {
  if (!st.setup_pending.load(std::memory_order_acquire)) return ncclSuccess;
  std::shared_ptr<PendingSetup> batch;
  {
    std::lock_guard<std::mutex> lock(st.pending_mu);
    batch = st.pending;
  }
  if (!batch) return ncclSuccess;
  std::unique_lock<std::mutex> lock(batch->mu, std::defer_lock);
  if (wait)
    lock.lock();
  else if (!lock.try_lock())
    return ncclInProgress;
  if (batch->done) return ncclSuccess;
  const RealNccl* nccl = real_nccl();
  std::vector<std::shared_ptr<CommState>> comms;
  std::vector<ncclComm_t> handles;
  for (auto& w : batch->comms)
    if (auto c = w.lock()) {
      comms.push_back(c);
      handles.push_back(c->comm);
    }
  // Every comm of the batch must have finished its own initialisation first.
  ncclResult_t r = nccl ? wait_in_progress(*nccl, handles, ncclInProgress) : ncclSystemError;
  std::vector<std::shared_ptr<CommState>> ready;
  for (auto& c : comms) {
    if (r != ncclSuccess || c->poisoned.load() != ncclSuccess) {
      c->ce_missing = "the non-blocking communicator failed or was aborted before set-up";
      continue;
    }
    nccl->ncclCommUserRank(c->comm, &c->rank);
    nccl->ncclCommCount(c->comm, &c->nranks);
    nccl->ncclCommCuDevice(c->comm, &c->device);
    ready.push_back(c);
  }
  // A comm that failed takes its batch with it: the peers of the others are in the same
  // situation (one group, one outcome), and a partial set-up would pair mismatched groups.
  if (ready.size() == comms.size()) {
    ZC_INFO("non-blocking communicator ready: setting up %zu copy-engine pool(s)", ready.size());
    ce_setup(ready);
  }
  batch->done = true;
  for (auto& c : comms) c->setup_pending.store(false, std::memory_order_release);
  return ncclSuccess;
}

void settle_before_use(CommState* st) {
  if (st && st->setup_pending.load(std::memory_order_acquire) && group_state().depth == 0)
    run_pending_setup(*st, /*wait=*/true);
}

}  // namespace zc
