// One rank of an NCCL path: device, communicator and buffers set up the way that path's
// application would. nccl-kernel and the zerocta paths run the very same code (cudaMalloc
// buffers, ncclCommInitRank); only the process environment (LD_PRELOAD) differs. nccl-policy
// is the application that sets the zero-CTA policy in its config itself; nccl-ce the one that
// also moved its buffers into symmetric windows for NCCL's copy-engine all-gather.
#pragma once

#include <cuda_runtime_api.h>
#include <nccl.h>

#include <cstddef>
#include <vector>

#include "channel.h"
#include "options.h"
#include "shim_stats.h"

namespace zcb {

class NcclRank {
 public:
  // Makes device `rank` current, says hello to the parent, checks that the shim is loaded
  // exactly when the path wants it, exchanges the unique id and creates the communicator
  // (timed: every rank enters it right after a barrier, with its CUDA context already made).
  NcclRank(PathId path, int rank, int nranks, Channel* ch);
  ~NcclRank();
  NcclRank(const NcclRank&) = delete;
  NcclRank& operator=(const NcclRank&) = delete;

  // Device memory as the path allocates it: cudaMalloc, or (nccl-ce) ncclMemAlloc plus a
  // symmetric window. Collective on nccl-ce: every rank calls it with the same sizes in order.
  void* alloc(size_t bytes);

  void allgather(const void* send, void* recv, size_t count, ncclDataType_t type,
                 cudaStream_t stream);
  // One collective with nccl-tests' arguments: count as CollShape::count, ncclSum for the
  // reductions, root kBroadcastRoot for the broadcast.
  void collective(CollOp op, const void* send, void* recv, size_t count, ncclDataType_t type,
                  cudaStream_t stream);
  // fatal() if the communicator reports an asynchronous error.
  void check_async_error();

  int rank() const { return rank_; }
  int nranks() const { return nranks_; }
  PathId path() const { return path_; }
  // Wall time of this rank's ncclCommInitRank / ncclCommInitRankConfig call.
  double init_ms() const { return init_ms_; }
  const ShimProbe& shim() const { return shim_; }

 private:
  struct Buffer {
    void* ptr;
    ncclWindow_t win;
  };
  PathId path_;
  int rank_;
  int nranks_;
  ncclComm_t comm_ = nullptr;
  double init_ms_ = 0;
  ShimProbe shim_;
  std::vector<Buffer> buffers_;
};

// Sends this process's shim totals of collective `op` to the parent (no-op without the shim).
void send_shim_totals(Channel* ch, int rank, zerocta_op_t op);

}  // namespace zcb
