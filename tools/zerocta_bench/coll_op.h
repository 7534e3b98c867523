// The collectives the sweep can measure and nccl-tests' conventions for each: what the "size"
// and "count" columns mean, the per-rank buffer sizes, where the in-place buffers live and the
// bus-bandwidth factor. Pure (no CUDA), so the self-test checks every rule.
#pragma once

#include <cstdint>
#include <string>

#include "zerocta.h"

namespace zcb {

enum class CollOp { kAllGather, kAllReduce, kReduceScatter, kBroadcast };

// nccl-tests spelling without "_perf": "allgather", "allreduce", "reducescatter", "broadcast".
const char* op_name(CollOp op);
bool parse_op(const std::string& name, CollOp* out);
// The NCCL call, for messages: "ncclAllReduce".
const char* op_nccl_call(CollOp op);
// The zerocta counter row of this collective (zerocta_get_stats).
zerocta_op_t op_shim_counter(CollOp op);
// True for the reductions (ncclSum): nccl-tests prints "sum" in the redop column.
bool op_reduces(CollOp op);

// The broadcast root, as in nccl-tests' default.
constexpr int kBroadcastRoot = 0;

// One size of the sweep for one op, nccl-tests style.
struct CollShape {
  uint64_t count = 0;       // the NCCL call's count argument (nccl-tests' "count" column)
  uint64_t bytes = 0;       // nccl-tests' "size" column; algbw = bytes / time
  uint64_t send_bytes = 0;  // per rank
  uint64_t recv_bytes = 0;  // per rank
};
// all-gather: size = total output, count = per-rank elements; all-reduce and broadcast:
// size = the buffer; reduce-scatter: size = total input, count = per-rank output elements.
// Sizes are rounded down to whole elements (and whole per-rank pieces); count 0 = too small.
CollShape coll_shape(CollOp op, uint64_t size_bytes, int nranks, int elem_bytes);

// busbw = algbw * factor: all-gather and reduce-scatter (n-1)/n, all-reduce 2(n-1)/n,
// broadcast 1 (nccl-tests' PERFORMANCE.md).
double bus_factor(CollOp op, int nranks);

// The buffers one placement of one op uses, from the rank's two allocations: `a` (at least
// the largest send_bytes) and `b` (at least the largest recv_bytes). In-place as nccl-tests:
// all-gather sends from its own piece of the output, reduce-scatter receives into its own
// piece of the input, all-reduce and broadcast use one buffer.
struct Placement {
  char* send = nullptr;
  char* recv = nullptr;
};
Placement place_buffers(CollOp op, bool in_place, int rank, const CollShape& s, char* a, char* b);

}  // namespace zcb
