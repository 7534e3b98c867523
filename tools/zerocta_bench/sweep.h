// Worker bodies of the bandwidth sweep: one NCCL worker process (its rank, or every rank with
// --one-process) for every path but the ceiling, or the whole single-process ceiling
// (all-gathers only). Every size runs on buffers allocated for it (of its size), freed before
// the next size's, so that the size's first op is the first on its buffers.
#pragma once

#include "channel.h"
#include "options.h"

namespace zcb {

void run_nccl_sweep(const Options& o, PathId path, int worker_rank, int nranks, Channel* ch);
// The single-process floors: the ceiling (all-gathers) and bare-ce (reduce-scatters: the
// pushes alone), one thread per GPU.
void run_ceiling_sweep(const Options& o, int nranks, Channel* ch);
// sum-kernel (reduce-scatters): src/route/chunk_sum.cu's kernel alone on GPU 0, summing
// nranks chunks of the op's output size into one (sum_kernel.cc).
void run_sum_kernel_sweep(const Options& o, int nranks, Channel* ch);

}  // namespace zcb
