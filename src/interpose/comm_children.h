// Children of ncclCommSplit and ncclCommShrink. NCCL writes a non-blocking child's handle into
// the caller's *newcomm only when the child's init job ends, so such a child waits here, held
// by that slot, until its handle is there: when its parent is polled ready, or when the
// application first presents the handle (it may do so only after NCCL wrote it).
#pragma once

#include <nccl.h>

namespace zc {

// Adopts the waiting children of `parent` whose handle has arrived, and the one whose handle
// is `handle`.
void adopt_children(ncclComm_t parent, ncclComm_t handle);

// A parent going away takes its unresolved children's records with it (their slots may die).
void forget_children(ncclComm_t parent);

// At the outermost ncclGroupEnd (after NCCL's, which returned `r`): the children of splits and
// shrinks made inside the group, whose handles NCCL writes only there.
void children_at_group_end(ncclResult_t r);

}  // namespace zc
