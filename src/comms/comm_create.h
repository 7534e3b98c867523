// What every communicator-creation wrapper shares: the CTA policy put into a copy of the
// caller's config, the record of the new communicator, and when its route phases run
// (route_setup.h): the join before NCCL can complete the init, the freeze once it has.
#pragma once

#include <nccl.h>

#include <memory>
#include <vector>

#include "comm_state.h"
#include "cta_policy.h"
#include "route_setup.h"

namespace zc {

// Whether the CTA policy is to be applied: not with keep, not below NCCL 2.28.
bool policy_applies();

// The config to hand NCCL: the caller's, or a patched copy in `storage`.
PolicyResult policy_for(const ncclConfig_t* caller, NullConfig null_config,
                        std::vector<unsigned char>* storage, const char* fn);

// Whether a communicator created with this config will be non-blocking (NULL: inherited, or
// NCCL_COMM_BLOCKING). Reads only what the struct's own `size` covers, as NCCL does.
bool nonblocking_config(const ncclConfig_t* c, bool inherit_nonblocking);

// Whether this process's settings ask for the route at all: only then are communicator keys
// counted and channels joined (the default mode does neither).
bool route_mode();

// A new communicator's record, not yet registered under a handle.
std::shared_ptr<CommState> new_comm_state(int policy, bool nonblocking);

// The join phase for `st`: now, or at the outermost ncclGroupEnd inside a group.
void schedule_join(const std::shared_ptr<CommState>& st, const JoinPlan& plan);

// After NCCL returned from the creation call: registers the comm under its handle, or, when
// NCCL failed, drops what the join made. A blocking comm is frozen now, or at the outermost
// ncclGroupEnd inside a group; a non-blocking one when it is seen ready.
void finish_create(const std::shared_ptr<CommState>& st, ncclComm_t comm, ncclResult_t r);

// Host-only: freezes a joined comm whose init NCCL reports complete (a child's rank and size
// are asked of NCCL first). `on_app_thread` as in route_freeze.
void freeze_when_ready(CommState& st, bool on_app_thread);

// Before an operation on `st` on the application's thread outside any group: a comm not frozen
// yet is frozen if NCCL reports it ready; a pass-through comm's registration is released.
void settle_before_use(CommState* st);

}  // namespace zc
