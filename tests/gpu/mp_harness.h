// Multi-process test harness for the GPU tests: one process per NCCL rank, no MPI.
//
// The parent (the gtest process) never initialises CUDA: a CUDA context does not survive
// fork(), so every rank is forked first and only the children touch the GPU. Rank 0 makes the
// NCCL unique ids and sends them to the other ranks over pipes. The parent waits with a total
// deadline and an optional idle deadline (no heartbeat), and kills every rank when either
// passes, so a hung collective fails the test instead of sticking a CI job.
#pragma once

#include <nccl.h>

#include <functional>
#include <string>
#include <vector>

namespace zgpu {

// Number of CUDA devices this process would see (CUDA_VISIBLE_DEVICES applies), found by a
// forked child that calls cudaGetDeviceCount. 0 when there is no driver or no device. Cached.
int visible_gpu_count();

// What a rank knows when its function starts. The CUDA device is already current.
struct RankContext {
  int rank = 0;
  int nranks = 0;
  int device = 0;
  std::vector<ncclUniqueId> ids;  // RunOptions::num_ids ids, identical on every rank
};

// A rank's body. Returns 0 on success; a non-zero value or a thrown exception fails the rank.
// Destructors that free GPU resources should do nothing while an exception unwinds
// (std::uncaught_exceptions() > 0): the GPU may be hung, and the rank is about to _exit.
using RankFn = std::function<int(const RankContext&)>;

// Exit status of a rank whose function threw (it leaves with _exit, skipping at-exit work).
constexpr int kRankExceptionExit = 70;

struct RunOptions {
  int total_timeout_s = 300;  // the whole run; every rank is killed after this
  int idle_timeout_s = 0;     // > 0: a live rank that has not called heartbeat() for this long
                              // counts as hung (heartbeat() is called once by the harness)
  int kill_grace_s = 10;      // once a rank failed, the others get this long to finish
  int num_ids = 1;            // NCCL unique ids rank 0 makes and sends to everyone
  std::function<void(int rank)> before_cuda;  // runs in the child before cudaSetDevice
  // false: no GPU and no NCCL at all (the harness's own self-test on CPU-only machines);
  // rank 0 sends made-up bytes as the ids.
  bool use_cuda = true;
};

struct RankOutcome {
  int rank = 0;
  bool exited = false;  // exited normally (exit_code valid) rather than by a signal
  int exit_code = -1;
  int signal = 0;
  std::string killed_because;  // set when the parent killed the rank
  std::string messages;        // everything the rank sent with report()
  bool ok() const { return exited && exit_code == 0 && killed_because.empty(); }
};

struct RunResult {
  std::vector<RankOutcome> ranks;
  bool ok() const;
  std::string summary() const;  // one block per failed rank, with its messages
};

// Forks nranks processes; rank r makes device r % visible_gpu_count() current and runs fn.
// Returns when every rank has exited or been killed.
RunResult run_ranks(int nranks, const RankFn& fn, const RunOptions& options = RunOptions());

// In a rank: sends a failure/diagnostic message to the parent (and prints it on stderr).
void report(const std::string& message);

// In a rank: tells the parent this rank is making progress (see RunOptions::idle_timeout_s).
void heartbeat();

// In a rank: waits until every rank of the run has called barrier() as often (a host-side
// barrier through shared memory, e.g. before an operation that some ranks would otherwise
// start, and time out on, long before the others). Waiting counts as progress.
void barrier();

// A 4 KiB block of memory shared by the parent and rank `rank` of the current/last run; zeroed
// before each run. Ranks leave results there that the parent reads after run_ranks returns.
void* rank_shared_block(int rank);
constexpr size_t kRankSharedBlockBytes = 4096;
constexpr int kMaxRanks = 64;

// Integer value of environment variable `name`, or `fallback` when unset or empty.
long env_long(const char* name, long fallback);

}  // namespace zgpu
