// The NCCL ranks one worker process drives, set up the way that path's application would:
// one rank (the default, a process per rank), or with --one-process every rank from one
// thread, nccl-tests -g N style (ncclGroupStart; per GPU cudaSetDevice + the call;
// ncclGroupEnd). nccl-kernel and the zerocta paths run the very same code (ncclCommInitRank,
// buffers from --alloc); only the process environment (LD_PRELOAD) differs. nccl-policy is the
// application that sets the zero-CTA policy in its config itself; nccl-ce the one that also
// moved its buffers into symmetric windows for NCCL's copy-engine all-gather.
#pragma once

#include <cuda_runtime_api.h>
#include <nccl.h>

#include <cstddef>
#include <memory>
#include <vector>

#include "channel.h"
#include "coll_op.h"
#include "cumem_buffer.h"
#include "options.h"
#include "premul_op.h"
#include "shim_stats.h"

namespace zcb {

class NcclRanks {
 public:
  // The ranks of worker process `worker_rank` (-1 with --one-process: every rank). Makes each
  // device current once, says hello to the parent per rank, checks that the shim is loaded
  // exactly when the path wants it, exchanges the unique id (through the parent unless this
  // process holds every rank) and creates the communicators (timed: every process enters the
  // creation right after a barrier, with its CUDA contexts already made).
  NcclRanks(const Options& o, PathId path, int worker_rank, int nranks, Channel* ch);
  ~NcclRanks();
  NcclRanks(const NcclRanks&) = delete;
  NcclRanks& operator=(const NcclRanks&) = delete;

  int size() const { return static_cast<int>(ranks_.size()); }  // ranks of this process
  int rank(int i) const { return ranks_[i].rank; }              // device = rank
  int nranks() const { return nranks_; }
  void set_device(int i) const;

  // One buffer of `bytes` per local rank, as the path allocates it: ncclMemAlloc with the
  // rank's GPU current, then a symmetric window over it (nccl-ce; collective: every process
  // calls it with the same sizes in the same order), else --alloc (cudaMalloc or cumem).
  std::vector<char*> alloc(size_t bytes);
  // Frees every buffer alloc() made, newest first, once each local device is idle (nccl-ce:
  // the windows deregistered in one group first; collective like alloc()).
  void free_buffers();

  // One collective on every local rank, nccl-tests' arguments (count as CollShape::count,
  // root kBroadcastRoot, `redop` for the reductions: Options::reduction(), a pre-multiplied sum
  // made and destroyed around each rank's call, premul_op.h); place[i] and streams[i] belong
  // to local rank i.
  void collective(CollOp op, const std::vector<Placement>& place, size_t count, ncclDataType_t type,
                  const std::vector<cudaStream_t>& streams, RedOp redop = RedOp::kSum);
  // fatal() if a communicator reports an asynchronous error.
  void check_async_error();

  PathId path() const { return path_; }
  // nccl-ce: the wall time of the window registrations since the last call (alloc() registers
  // each buffer; every process enters each registration together), then 0 again.
  double take_windows_ms();
  // Wall time of the communicator creation (with several local ranks: the whole group).
  double init_ms() const { return init_ms_; }

 private:
  struct Buffer {
    void* ptr = nullptr;
    ncclWindow_t win = nullptr;
    std::unique_ptr<CumemBuffer> cumem;
    bool nccl_mem = false;  // from ncclMemAlloc
  };
  struct Rank {
    int rank = 0;
    ncclComm_t comm = nullptr;
    std::vector<Buffer> buffers;
  };
  void create_comms(const ncclUniqueId& id);
  void register_windows(size_t bytes);  // nccl-ce: a window over each rank's newest buffer

  const Options& o_;
  PathId path_;
  int nranks_;
  std::vector<Rank> ranks_;
  double init_ms_ = 0;
  double windows_ms_ = 0;
  Channel* ch_;
  ShimProbe shim_;
  std::unique_ptr<DeviceScalars> scalars_;  // --redop premul-dev's, one per local rank
};

// The NCCL calls of a window registration, as a table so that the self-test can stand in for
// NCCL's grouped behaviour without a GPU.
struct WindowCalls {
  ncclResult_t (*group_start)();
  ncclResult_t (*window_register)(ncclComm_t, void*, size_t, ncclWindow_t*, int);
  ncclResult_t (*group_end)();
};
extern const WindowCalls kNcclWindowCalls;

// One NCCL_WIN_COLL_SYMMETRIC window of `bytes` per communicator, over ptrs[i]. Several go in
// one group: each registration waits in a barrier for its peers, so one thread cannot make them
// one after another. Inside a group NCCL only queues the request and writes the window through
// the caller's pointer in ncclGroupEnd, so every pointer handed over is a slot of the result,
// which outlives the group. fatal() on a failing call; a null window is the caller's to judge.
std::vector<ncclWindow_t> register_windows(const WindowCalls& nccl,
                                           const std::vector<ncclComm_t>& comms,
                                           const std::vector<void*>& ptrs, size_t bytes);

// Sends this process's shim totals of collective `op` to the parent (no-op without the shim).
// With several local ranks the totals are the whole process's, sent once.
void send_shim_totals(Channel* ch, int rank, zerocta_op_t op);

}  // namespace zcb
