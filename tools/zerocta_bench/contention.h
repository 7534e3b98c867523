// The contention study: a cuBLAS bf16 GEMM loop on one stream while back-to-back all-gathers
// run on another for the whole GEMM window, with "alone" numbers measured in the same process
// right before. Shows what each all-gather path costs the computation it overlaps.
#pragma once

#include <cuda_runtime_api.h>

#include <cstdint>
#include <functional>

#include "channel.h"
#include "options.h"
#include "protocol.h"

namespace zcb {

struct ContentionRank {
  const Options* o = nullptr;
  int rank = 0;
  uint64_t ag_bytes = 0;                         // total output bytes of one all-gather
  std::function<void(cudaStream_t)> enqueue_op;  // one all-gather on the given stream
  std::function<uint64_t(uint64_t)> agree_max;   // barrier over every rank, max of a value
};

// Runs the three phases on the current device (GEMM alone, all-gather alone, overlapped) and
// returns this rank's numbers. The number of all-gathers of the overlapped phase is agreed
// over the ranks (collectives must match): enough to cover twice the GEMM loop alone.
ContentionMsg run_contention_rank(const ContentionRank& c);

// Worker bodies: one NCCL rank, or the single-process bare-ce (raw peer pulls).
void run_nccl_contention(const Options& o, PathId path, int rank, int nranks, Channel* ch);
void run_bare_ce_contention(const Options& o, int nranks, Channel* ch);

// How many all-gathers the overlapped phase issues (pure, so the self-test can check it).
uint64_t overlap_op_count(int gemm_iters, double gemm_ms, double ag_ms);

}  // namespace zcb
