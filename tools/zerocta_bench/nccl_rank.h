// One rank of an NCCL path: device, communicator and buffers set up the way that path's
// application would. nccl-kernel and the zerocta paths run the very same code (cudaMalloc
// buffers, ncclCommInitRank); only the process environment (LD_PRELOAD) differs. nccl-ce is
// the application that changed its code for NCCL's copy-engine all-gather.
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
  // exactly when the path wants it, exchanges the unique id and creates the communicator.
  NcclRank(PathId path, int rank, int nranks, Channel* ch);
  ~NcclRank();
  NcclRank(const NcclRank&) = delete;
  NcclRank& operator=(const NcclRank&) = delete;

  // Device memory as the path allocates it: cudaMalloc, or (nccl-ce) ncclMemAlloc plus a
  // symmetric window. Collective on nccl-ce: every rank calls it with the same sizes in order.
  void* alloc(size_t bytes);

  void allgather(const void* send, void* recv, size_t count, ncclDataType_t type,
                 cudaStream_t stream);
  // fatal() if the communicator reports an asynchronous error.
  void check_async_error();

  int rank() const { return rank_; }
  int nranks() const { return nranks_; }
  PathId path() const { return path_; }
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
  ShimProbe shim_;
  std::vector<Buffer> buffers_;
};

// Sends this process's shim totals to the parent (no-op without the shim).
void send_shim_totals(Channel* ch, int rank);

}  // namespace zcb
