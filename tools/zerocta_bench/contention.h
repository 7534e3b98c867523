// The contention study's worker side: per placement, a cuBLAS bf16 GEMM loop alone, the
// all-gathers alone, then both overlapped (GEMMs on one stream, all-gathers on another, the
// enqueues interleaved), on every GPU the process drives. In fixed mode every path does the
// same work (--contention-ops all-gathers against --gemm-iters GEMMs); in saturate mode the
// all-gathers run back to back until they cover twice the GEMM loop.
#pragma once

#include <cuda_runtime_api.h>

#include <cstdint>
#include <functional>
#include <vector>

#include "channel.h"
#include "options.h"
#include "protocol.h"

namespace zcb {

struct ContentionGpus {
  const Options* o = nullptr;
  std::vector<int> devices;  // the GPUs (= ranks) this process drives
  uint64_t ag_bytes = 0;     // total output bytes of one all-gather
  // Enqueues one all-gather of the placement on every GPU of `devices`, streams[i] on
  // devices[i] (several GPUs: one group call).
  std::function<void(bool in_place, const std::vector<cudaStream_t>& streams)> enqueue_op;
  Channel* ch = nullptr;  // barriers over every process of the path
};

// Runs the three phases for each placement of --contention-placement and sends one
// ContentionMsg per GPU and placement.
void run_contention(const ContentionGpus& c);

// Worker bodies: the NCCL ranks of one process, or the single-process bare-ce (batched peer
// pushes, one thread for every GPU).
void run_nccl_contention(const Options& o, PathId path, int worker_rank, int nranks, Channel* ch);
void run_bare_ce_contention(const Options& o, int nranks, Channel* ch);

// Saturate mode: how many all-gathers the overlapped run issues (pure, for the self-test).
uint64_t overlap_op_count(int gemm_iters, double gemm_ms, double ag_ms);

}  // namespace zcb
