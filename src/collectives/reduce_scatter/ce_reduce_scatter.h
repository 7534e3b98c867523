// zerocta's copy-engine reduce-scatter: one op, on the application's thread, never waiting for
// a peer (reduce_scatter_plan.h says who moves which bytes and how they are summed).
#pragma once

#include <cuda.h>
#include <nccl.h>

#include "call_chain.h"
#include "comm_state.h"
#include "premul_sums.h"

namespace zc {

// One reduce-scatter as the application called it. `op`: the reduction as resolved at the call
// (a pre-multiplied sum with this rank's scalar); `slice`: the op's slice (rs_slice_bytes), from
// what every rank knows alike.
struct RsCall {
  const void* send = nullptr;
  void* recv = nullptr;
  size_t recvcount = 0;
  ncclDataType_t datatype = ncclFloat32;
  ResolvedRedOp op;
  uint64_t slice = 0;
  CUstream stream = nullptr;
};

// Posts the op (its collective, count, datatype, reduction and the communicator's call chain
// before it, `chain`), arrives, and either issues it behind the call's stream — pushes into the
// peers' scratch on the copy engines, sums on this GPU — or, when the first rank to arrive
// decided so, sets *to_nccl: the caller then forwards the op to NCCL, as every rank does. A
// captured op (`capturing`) is issued into the application's capture, over flags of its own
// (reduce_scatter_plan.h); a rank capturing where another runs eagerly is an error (as NCCL's
// would hang). Any failure after the post poisons the communicator and returns the error.
ncclResult_t ce_reduce_scatter(CommState& st, const RsCall& call, bool capturing, ChainPoint chain,
                               bool* to_nccl);

}  // namespace zc
