// zerocta's copy-engine reduce-scatter: one op, on the application's thread, never waiting for
// a peer (reduce_scatter_plan.h says who moves which bytes and how they are summed).
#pragma once

#include <cuda.h>
#include <nccl.h>

#include "call_chain.h"
#include "comm_state.h"
#include "premul_sums.h"

namespace zc {

// Posts the op (its collective, count, datatype, reduction and the communicator's call chain
// before it, `chain`), arrives, and either issues it behind `stream` — pushes into the peers'
// scratch on the copy engines, sums on this GPU — or, when the first rank to arrive decided
// so, sets *to_nccl: the caller then forwards the op to NCCL, as every rank does. A captured op
// (`capturing`) is never routed: its post sends the op to NCCL if it decides, and a rank
// capturing where another runs eagerly is an error (as NCCL's would hang). `slice`: the op's
// slice (rs_slice_bytes), from what every rank knows alike. Any failure after the post poisons
// the communicator and returns the error. `op`: the reduction as resolved at the application's
// call (a pre-multiplied sum with this rank's scalar).
ncclResult_t ce_reduce_scatter(CommState& st, const void* sendbuff, void* recvbuff,
                               size_t recvcount, ncclDataType_t datatype, const ResolvedRedOp& op,
                               uint64_t slice, CUstream stream, bool capturing, ChainPoint chain,
                               bool* to_nccl);

}  // namespace zc
