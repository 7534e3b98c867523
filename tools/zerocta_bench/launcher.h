// Parent side of a path run: re-executes this binary (/proc/self/exe) once per worker process
// (one per rank, or one for every rank: path_process_count) in a hidden worker mode, with the
// path's environment, in a process group of its own; forwards the NCCL unique id from rank 0 to the
// others; runs the barriers; hands every other message to the caller; and kills the whole group
// when a rank fails, dies or the path's time runs out.
#pragma once

#include <cstdint>
#include <functional>
#include <string>
#include <vector>

#include "options.h"

namespace zcb {

struct LaunchSpec {
  PathId path = PathId::kNcclKernel;
  CollOp op = CollOp::kAllGather;  // the op the workers run (ZEROCTA_REDUCESCATTER for one)
  std::string mode;  // "sweep" | "contention"
  int nranks = 0;
  bool one_process = false;       // --one-process: one worker for every rank of an NCCL path
  int repeat = -1;                // contention: the repeat this run belongs to (--worker-repeat)
  std::vector<std::string> args;  // the parent's argv[1..], passed through to every worker
  std::string shim_lib;           // LD_PRELOAD for the shim paths
  bool multicast_off = false;     // --multicast-off: kMulticastOffEnv in every worker
  int timeout_s = 60;
};

struct LaunchOutcome {
  bool ok = false;
  bool timed_out = false;
  bool interrupted = false;  // SIGINT/SIGTERM reached the parent
  std::string error;         // first failure, "rank 1: ..." or "timed out after 90 s"
  double seconds = 0;
};

// Called for every worker message the launcher does not handle itself (Hello, Row,
// Contention, ShimTotals).
using MessageHandler = std::function<void(uint32_t type, const std::vector<char>& payload)>;

LaunchOutcome run_path(const LaunchSpec& spec, const MessageHandler& handler);

// The environment of a path's workers, from `base` (NAME=value entries): for a shim path
// LD_PRELOAD=<shim_lib>[:rest] and ZEROCTA_ALLGATHER=<mode>, and for reduce-scatters (`op`)
// also ZEROCTA_REDUCESCATTER=<mode>; for the others every libzerocta entry removed from
// LD_PRELOAD; with multicast_off (--multicast-off) also kMulticastOffEnv.
std::vector<std::string> worker_environment(const std::vector<std::string>& base, PathId path,
                                            const std::string& shim_lib, bool multicast_off,
                                            CollOp op = CollOp::kAllGather);

// Installs SIGINT/SIGTERM handlers that make run_path kill its workers and return, and ignores
// SIGPIPE. Call once in the parent.
void install_parent_signal_handlers();
bool parent_interrupted();

}  // namespace zcb
