// The application's NCCL group nesting on this thread, and the work zerocta defers to the
// outermost ncclGroupEnd: pool set-up of communicators created inside the group (one thread
// driving several GPUs must register all of them together) and copy-engine all-gathers
// issued inside the group (issued in program order after NCCL's part, the same on every rank),
// and the batch that non-blocking comms created in the group join (nonblocking_setup.h).
#pragma once

#include <nccl.h>

#include <functional>
#include <memory>
#include <vector>

#include "comm_state.h"

namespace zc {

struct GroupState {
  int depth = 0;
  std::vector<std::shared_ptr<CommState>> pending_setup;
  std::vector<std::function<ncclResult_t()>> pending_ops;
  // Non-blocking comms created inside the group: their deferred set-up is one batch.
  std::shared_ptr<PendingSetup> nonblocking_batch;
};

GroupState& group_state();  // this thread's

}  // namespace zc
