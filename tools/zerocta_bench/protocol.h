// Messages between the parent and its rank processes. Both ends are the same executable, so
// messages are plain structs behind a {type, length} header. Every message is written with
// one write(2) of less than PIPE_BUF bytes, so threads of one worker never interleave.
#pragma once

#include <nccl.h>

#include <cstdint>

#include "zerocta.h"

namespace zcb {

enum MsgType : uint32_t {
  // worker -> parent
  kMsgHello = 1,   // HelloMsg, once per rank (per GPU for single-process paths)
  kMsgUniqueId,    // UniqueIdMsg from rank 0; the parent forwards it to every other rank
  kMsgAgree,       // AgreeMsg: a barrier that also agrees on the max of a value
  kMsgInitTimes,   // InitTimesMsg, once per rank of a sweep, before its first RowMsg
  kMsgRow,         // RowMsg, one per size per rank
  kMsgContention,  // ContentionMsg, one per rank and placement
  kMsgShimTotals,  // ShimTotalsMsg, once per rank at the end (shim paths)
  kMsgError,       // ErrorMsg, then the worker exits non-zero
  kMsgDone,        // DoneMsg: the worker finished and is about to exit 0
  // parent -> worker
  kMsgUniqueIdFwd,  // UniqueIdMsg
  kMsgAgreed,       // AgreeMsg with the max over every process
};

struct MsgHeader {
  uint32_t type;
  uint32_t len;  // payload bytes after the header
};

struct HelloMsg {
  int32_t rank;
  int32_t device;
  int32_t pid;
  int32_t nccl_version;  // ncclGetVersion in this process (0 for single-process paths)
  int32_t shim_loaded;   // zerocta_version found with dlsym(RTLD_DEFAULT)
  int32_t shim_version;
  char gpu_name[96];
  char bus_id[32];
};

struct UniqueIdMsg {
  char bytes[NCCL_UNIQUE_ID_BYTES];
};

struct AgreeMsg {
  uint64_t value;
};

// What a rank's start cost: its communicator creation (entered together with every other
// rank after a barrier) and its first collective, whose enqueue + synchronize includes NCCL's
// lazy set-up (connections, kernel loading) and the shim's, wall time on steady_clock.
struct InitTimesMsg {
  int32_t rank;
  int32_t pad;
  double init_ms;           // ncclCommInitRank / ncclCommInitRankConfig
  double first_op_ms;       // the first collective, enqueue to the end of its synchronize
  uint64_t first_op_bytes;  // its size (nccl-tests' size column)
};

// One placement (out-of-place or in-place) of one size on one rank.
struct PlaceResult {
  double mean_us;                             // (last event - first event) / iters
  double median_us;                           // median of the per-iteration event intervals
  int64_t wrong;                              // wrong elements found by the check; -1 = not checked
  uint64_t route_calls[zerocta_route_count];  // the op's calls per zerocta route (shim paths)
  // Reduce-scatter: the largest |output - float64 reference| of the checked op (the exact sum,
  // or mean, of every rank's input as stored); -1 = not computed (other ops, unchecked).
  double maxdiff;
};

// The first operation on one size's freshly allocated buffers (out of place, zeroed buffers,
// entered after a barrier, before the check, the warm-ups and the timed loop): the one-time
// costs of new buffers (zerocta across processes: exporting and importing the allocations),
// wall time on steady_clock. With several local ranks, the whole group's.
struct FirstOpResult {
  double call_ms;                             // the call alone (enqueue)
  double ms;                                  // the call to the end of its stream's synchronize
  uint64_t route_calls[zerocta_route_count];  // its route per zerocta route (shim paths)
  // nccl-ce: registering the op's fresh buffers as windows, before it (what that path needs
  // first, as zerocta's first op maps the peers' buffers); 0 on the other paths.
  double windows_ms;
};

struct RowMsg {
  int32_t rank;
  int32_t size_index;
  uint64_t bytes;  // nccl-tests' size column of the op actually run (CollShape::bytes)
  uint64_t count;  // the NCCL call's count argument (CollShape::count)
  FirstOpResult first;
  PlaceResult oop;
  PlaceResult ip;
};

// One rank's contention numbers for one placement of one run (a run measures every
// placement of --contention-placement in turn).
struct ContentionMsg {
  int32_t rank;
  int32_t in_place;        // 1: send = own piece of the output (nccl-tests' in-place)
  int32_t gemm_iters;      // M: GEMMs alone and overlapped
  int32_t ag_ops;          // N: all-gathers alone and overlapped (saturate: agreed over ranks)
  int32_t ag_in_window;    // all-gathers of the overlapped run that ended inside the GEMM window
  int32_t covered;         // the all-gathers ran until the last GEMM finished
  uint64_t ag_bytes;       // total output bytes of one all-gather
  double gemm_alone_ms;    // per GEMM
  double gemm_overlap_ms;  // per GEMM, while all-gathering
  double ag_alone_ms;      // per all-gather
  double ag_overlap_ms;    // per all-gather while overlapped (saturate: inside the GEMM window)
  double makespan_ms;      // overlapped run: first start to last end
  uint64_t route_calls[zerocta_route_count];  // the process's all-gathers per route (first GPU)
};

struct ShimTotalsMsg {
  int32_t rank;
  int32_t pad;
  uint64_t op_calls[zerocta_route_count];  // calls of the run's op per route (contention: AG)
  uint64_t comms_created;
  uint64_t comms_zero_policy;
  uint64_t comms_ce_ready;
};

struct ErrorMsg {
  int32_t rank;
  char text[1000];
};

struct DoneMsg {
  int32_t rank;
};

}  // namespace zcb
