// Worker bodies of the bandwidth sweep: one NCCL worker process (its rank, or every rank with
// --one-process) for every path but the ceiling, or the whole single-process ceiling
// (all-gathers only).
#pragma once

#include "channel.h"
#include "options.h"

namespace zcb {

void run_nccl_sweep(const Options& o, PathId path, int worker_rank, int nranks, Channel* ch);
void run_ceiling_sweep(const Options& o, int nranks, Channel* ch);

// The per-rank buffer sizes the sweep needs: the largest send and receive buffer over the
// sizes of the options' op (coll_shape). Both 0 when no size fits nranks ranks.
struct SweepBuffers {
  uint64_t max_send = 0;
  uint64_t max_recv = 0;
};
SweepBuffers sweep_buffers(const Options& o, int nranks);

}  // namespace zcb
