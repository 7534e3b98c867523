// NCCL's own reduce-scatter beside a path's, for the #wrong check of --op reducescatter: side
// communicators of the ranks this worker process drives, created and used through the loaded
// libnccl's own symbols (dlopen RTLD_NOLOAD of that object, dlsym in it), so that a shim in
// LD_PRELOAD never sees them: under the zerocta paths too this is NCCL's kernel with its
// default CTA policy (ncclCommInitRank, no config), i.e. nccl-kernel's result on the same
// inputs, computed in the same process right before the checked op.
#pragma once

#include <cuda_runtime_api.h>
#include <nccl.h>

#include <vector>

#include "channel.h"
#include "options.h"
#include "premul_op.h"

namespace zcb {

class NcclReference {
 public:
  // The ranks `ranks` (device = rank) of a job of `nranks`; every process of the path makes
  // one at the same point (rank 0's unique id goes through the parent unless this process
  // holds every rank). `red` and `type`: the reductions to come (premul-dev's scalars are the
  // reference's own). fatal() when libnccl's symbols cannot be found.
  NcclReference(const std::vector<int>& ranks, int nranks, RedOp red, ncclDataType_t type,
                Channel* ch);
  ~NcclReference();
  NcclReference(const NcclReference&) = delete;
  NcclReference& operator=(const NcclReference&) = delete;

  // ncclReduceScatter(send[i], recv[i], count, type, red) on local rank i's stream (several:
  // one group); a pre-multiplied sum made with libnccl's own calls around each (premul_op.h).
  void reduce_scatter(const std::vector<const void*>& send, const std::vector<void*>& recv,
                      size_t count, ncclDataType_t type, RedOp red,
                      const std::vector<cudaStream_t>& streams);

  struct Api;  // the real libnccl's entry points (nccl_reference.cc)

 private:
  const Api* api_;
  std::vector<int> ranks_;
  int nranks_;
  std::vector<ncclComm_t> comms_;
  DeviceScalars scalars_;
};

}  // namespace zcb
