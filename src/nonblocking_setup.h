// Non-blocking communicators (ncclConfig_t.blocking = 0, PyTorch's
// TORCH_NCCL_USE_COMM_NONBLOCKING=1). Their creation returns ncclInProgress, and NCCL's
// contract is that the application then polls ncclCommGetAsyncError until ncclSuccess before
// it makes any other call on the communicator. That first "ready" is therefore a point every
// rank passes before its first operation, and the pool's (collective) set-up runs there:
// inside the ncclCommGetAsyncError call that first sees the communicator ready. Other threads
// polling meanwhile (PyTorch's watchdog) see ncclInProgress until it is done. A rank whose
// application skips the poll sets up at its first collective outside a group instead, which
// is still before its first operation, so every rank runs the same collectives in the same
// order either way.
#pragma once

#include <nccl.h>

#include <memory>
#include <vector>

#include "comm_state.h"
#include "real_nccl.h"

namespace zc {

// Defers the pool set-up of these comms (created together) to their first "ready". Inside an
// application's group, comms join the group's batch: one thread driving several GPUs must set
// them up with grouped collectives, like their creation.
void defer_nonblocking_setup(const std::vector<std::shared_ptr<CommState>>& comms);

// Runs the deferred set-up of st's batch if it is still pending. `wait` false: returns
// ncclInProgress at once when another thread is running it. Returns ncclSuccess once the
// set-up has run, whatever its verdict (a "no" leaves the comms on pass-through).
ncclResult_t run_pending_setup(CommState& st, bool wait);

// Before a comm's first operation outside a group: runs its pending set-up, if any.
void settle_before_use(CommState* st);

// Unless `r` is an error, polls each comm's ncclCommGetAsyncError until none is in progress
// any more (NCCL's rule before the next call; a blocking comm answers at once). Returns r's
// error, or the first error seen, or ncclSuccess.
ncclResult_t wait_in_progress(const RealNccl& nccl, const std::vector<ncclComm_t>& comms,
                              ncclResult_t r);

// zerocta's own NCCL calls on comms created together: fn(i) makes the call on comms[i], all of
// them inside one NCCL group when there are several (one thread driving several comms must
// group their collectives or deadlock), then waits until NCCL has taken them
// (wait_in_progress). Returns the first error, or ncclSuccess.
template <typename Fn>
ncclResult_t grouped_calls(const RealNccl& nccl,
                           const std::vector<std::shared_ptr<CommState>>& comms, Fn fn) {
  const bool group = comms.size() > 1;
  if (group) nccl.ncclGroupStart();
  ncclResult_t first = ncclSuccess;
  for (size_t i = 0; i < comms.size(); ++i) {
    ncclResult_t r = fn(i);
    if (r != ncclSuccess && first == ncclSuccess) first = r;
  }
  if (group) {
    ncclResult_t r = nccl.ncclGroupEnd();
    if (first == ncclSuccess || first == ncclInProgress) first = r;
  }
  std::vector<ncclComm_t> handles;
  for (auto& c : comms) handles.push_back(c->comm);
  return wait_in_progress(nccl, handles, first);
}

}  // namespace zc
