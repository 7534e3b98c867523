// Who takes part in a communicator's copy-engine route, decided without any NCCL call.
//
// Every rank that could run the route publishes its facts in the communicator's channel
// (channel.h) *before* it forwards its init, split or shrink to NCCL. NCCL's init cannot
// complete on any rank before every rank has entered it (the bootstrap root waits for all;
// a split all-gathers over the whole parent; a shrink rings over every kept rank), so when a
// rank sees its init complete, every rank that will ever join has joined: the membership is
// frozen, and every rank reads the same set. `agree()` turns that set into the verdict, a pure
// function, so all ranks commit to the route together or all pass through.
//
// Glossary
//   join index  the slot a rank claims: its rank for an init, its parent rank for a child.
//   order key   what NCCL orders a child's ranks by (a split's key); the rank otherwise.
//   member      a joined slot. A rank without zerocta, with ZEROCTA_ENABLE=0, in the default
//               mode, on another host or in another namespace never joins.
#pragma once

#include <cstdint>
#include <vector>

#include "fd_exchange.h"

namespace zc {

// Whether ranks of one communicator may share a GPU: never in the library (NCCL refuses them
// itself); a test build (-DZEROCTA_SHARED_GPU_TEST=ON) lets them, so that the route's driver
// work runs end to end on one GPU (tests/gpu/rs_one_gpu_test.cc).
#ifdef ZC_SHARED_GPU_TEST
constexpr bool kRanksMayShareGpu = true;
#else
constexpr bool kRanksMayShareGpu = false;
#endif

// Local problems a rank found before it joined; any of them means pass-through for all.
enum MemberProblem : uint32_t {
  kProblemFlags = 1u << 0,      // could not register the channel's flags for its GPU
  kProblemP2p = 1u << 1,        // an earlier member's GPU is not reachable by direct P2P
  kProblemFdService = 1u << 2,  // no fd service here, or an earlier member's is unreachable
  kProblemDevice = 1u << 3,     // no current CUDA device
  // CUDA_DEVICE_MAX_CONNECTIONS=1: every stream shares one hardware queue, where a stream's
  // wait on a flag would hold up the work (other ranks' ops included) queued behind it.
  kProblemOneConnection = 1u << 4,
  // A peer's GPU is not visible in this process (CUDA_VISIBLE_DEVICES giving each rank only its
  // own GPU, as SLURM's --gpu-bind and Kubernetes do), and either the peer is in this process
  // (then the route would need its ordinal) or NVML does not confirm an NVLink path to it.
  kProblemPeerInvisible = 1u << 5,
};

// A rank's reduce-scatter scratch (rs_scratch.h) as its peers reach it: its address (for peers
// in its process) and size, and the token of its descriptor in its fd service (for the others).
// Zeros: it has none (its settings do not route reduce-scatters, or it could not make one).
struct ScratchFacts {
  uint64_t addr = 0, bytes = 0;
  uint64_t token = 0;
};

// One rank's published facts: fixed layout, copied in and out of shared memory as bytes.
struct MemberFacts {
  uint32_t join_index = 0;
  uint32_t problems = 0;  // MemberProblem bits
  int64_t order_key = 0;
  int32_t pid = 0;
  uint32_t uid = 0;
  uint64_t start_time = 0;   // the process's start time (clock ticks since boot), with pid
  uint64_t fingerprint = 0;  // ZEROCTA_* protocol settings (config.h)
  int32_t nccl_version = 0;
  int32_t device = -1;  // ordinal in its own process, for logs only
  unsigned char uuid[16] = {};
  char fd_address[kFdAddressMax] = {};
  ScratchFacts rs_scratch;
};

struct Agreement {
  bool commit = false;
  const char* why = "";  // static text: why not (or "" when committed)
  // Whether the reason deserves a WARN (settings differ, a rank failed, a stale channel) rather
  // than an INFO (the communicator spans hosts or has ranks that never asked for the route).
  bool warn = false;
  std::vector<MemberFacts> ranks;  // when committed: the members in communicator-rank order
};

// Pure. `joined`: every member of the frozen channel, any order. `nranks`: the communicator's
// size; `channel_broken`: the channel saw a stale or conflicting segment (channel.h);
// `local_gpus`: the GPUs this process sees (0 = unknown). A missing member is taken for a rank
// on another host (INFO) unless a GPU here is left over for it (WARN: a rank on this host runs
// without zerocta or with other settings).
Agreement agree(std::vector<MemberFacts> joined, int nranks, uint32_t channel_broken,
                int local_gpus);

}  // namespace zc
