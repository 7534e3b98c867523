// Worker bodies of the bandwidth sweep: one NCCL rank (nccl-kernel, nccl-ce, zerocta,
// zerocta-auto), or the whole single-process ceiling.
#pragma once

#include "channel.h"
#include "options.h"

namespace zcb {

void run_nccl_sweep(const Options& o, PathId path, int rank, int nranks, Channel* ch);
void run_ceiling_sweep(const Options& o, int nranks, Channel* ch);

// The buffer sizes the sweep needs: the largest total output and per-rank chunk over the sizes.
struct SweepBuffers {
  uint64_t max_total = 0;
  uint64_t max_chunk = 0;
};
SweepBuffers sweep_buffers(const Options& o, int nranks);

}  // namespace zcb
