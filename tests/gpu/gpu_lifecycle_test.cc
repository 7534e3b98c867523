// The route around the op, on real GPUs and real NCCL: what NCCL completes, the route completes
// too. Two ranks, cuMem buffers (what the route reaches across processes), the route for any
// size (ZEROCTA_ALLGATHER=zerocta when the shim is preloaded; without it the same programs run on
// NCCL alone, as the reference).
//
//   Lifecycle.GroupOverTwoCommsInOppositeOrdersCompletes
//       one group with an all-gather on each of two communicators, both on one stream, rank 0
//       naming A then B, rank 1 B then A: it completes, bitwise (NCCL launches a group's
//       communicators in the order of their hashes; the route orders them by their keys).
//   Lifecycle.AbortOfACommStuckBehindAnotherReturns
//       rank 0's stream holds an all-reduce of communicator B that rank 1 never joins, then a
//       routed all-gather of A; rank 1 issues that all-gather too. NCCL 2.28's own abort of A
//       waits there until B's kernel ends (a watchdog aborts B 5 s in), with or without the
//       library; the route adds nothing to that wait although its streams sit behind B's kernel
//       too, and it releases rank 1: rank 1 sees the poison, aborts A within a second, and its
//       stream drains. NCCL alone prints the reference times.
#include <cuda_runtime.h>
#include <nccl.h>
#include <unistd.h>

#include <chrono>
#include <cstdarg>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <string>
#include <thread>
#include <vector>

#include "cumem_buffer.h"
#include "gpu_gtest.h"
#include "mp_harness.h"
#include "rank_util.h"
#include "test_data.h"

namespace zgpu {
namespace {

constexpr int kRanks = 2;
constexpr uint8_t kPoison = 0xa5;

double seconds_since(std::chrono::steady_clock::time_point t) {
  return std::chrono::duration<double>(std::chrono::steady_clock::now() - t).count();
}

// One all-gather's buffers: exportable cuMem memory, every rank's input known for the check.
struct Gather {
  size_t count = 0, chunk = 0;
  void* send = nullptr;
  void* recv = nullptr;
  std::vector<std::vector<uint8_t>> inputs;
  Gather(size_t bytes, int rank, uint64_t salt) : count(bytes / sizeof(float)) {
    chunk = count * sizeof(float);
    send = cumem_alloc(chunk);
    recv = cumem_alloc(chunk * kRanks);
    for (int q = 0; q < kRanks; ++q)
      inputs.push_back(make_input(ncclFloat32, count, seed_of({salt, static_cast<uint64_t>(q)})));
    ZG_CUDA(cudaMemcpy(send, inputs[rank].data(), chunk, cudaMemcpyHostToDevice));
    ZG_CUDA(cudaMemset(recv, kPoison, chunk * kRanks));
  }
  ~Gather() {
    if (std::uncaught_exceptions() > 0) return;  // the GPU may be hung: leave it to _exit
    cumem_free(send);
    cumem_free(recv);
  }
  ncclResult_t issue(ncclComm_t comm, cudaStream_t stream) {
    return ncclAllGather(send, recv, count, ncclFloat32, comm, stream);
  }
  void expect_gathered(const std::string& what) const {
    std::vector<uint8_t> got(chunk * kRanks);
    ZG_CUDA(cudaMemcpy(got.data(), recv, got.size(), cudaMemcpyDeviceToHost));
    for (int q = 0; q < kRanks; ++q)
      if (size_t d = first_difference(got.data() + q * chunk, inputs[q].data(), chunk);
          d != SIZE_MAX)
        fail(what + ": wrong data from rank " + std::to_string(q) + " at byte " +
             std::to_string(d));
  }
};

int opposite_orders_rank(const RankContext& ctx) {
  ncclComm_t a = init_comm(ctx, InitKind::kInitRankConfig, 0);
  ncclComm_t b = init_comm(ctx, InitKind::kInitRankConfig, 1);
  cudaStream_t stream;
  ZG_CUDA(cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking));
  const size_t bytes = static_cast<size_t>(env_long("ZCTEST_LIFECYCLE_BYTES", 8 << 20));
  for (int round = 0; round < 3; ++round) {
    Gather ga(bytes, ctx.rank, 0x11f0 + round), gb(bytes + 4096, ctx.rank, 0x22f0 + round);
    const auto t0 = std::chrono::steady_clock::now();
    ZG_NCCL(ncclGroupStart());
    if (ctx.rank == 0) {
      ZG_NCCL(ga.issue(a, stream));
      ZG_NCCL(gb.issue(b, stream));
    } else {
      ZG_NCCL(gb.issue(b, stream));
      ZG_NCCL(ga.issue(a, stream));
    }
    ZG_NCCL(ncclGroupEnd());
    wait_stream(stream, "the group over two communicators");
    printf("lifecycle opposite-orders rank=%d round=%d seconds=%.3f\n", ctx.rank, round,
           seconds_since(t0));
    ga.expect_gathered("communicator A");
    gb.expect_gathered("communicator B");
    heartbeat();
  }
  printf("[rank %d] zerocta stats: %s\n", ctx.rank, shim_allgather_stats_line().c_str());
  ZG_CUDA(cudaStreamDestroy(stream));
  ZG_NCCL(ncclCommDestroy(a));
  ZG_NCCL(ncclCommDestroy(b));
  return 0;
}

// Whether `stream` drains within `seconds`.
bool drains_within(cudaStream_t stream, double seconds) {
  const auto t0 = std::chrono::steady_clock::now();
  while (cudaStreamQuery(stream) == cudaErrorNotReady) {
    if (seconds_since(t0) > seconds) return false;
    heartbeat();
    usleep(1000);
  }
  return true;
}

// rank 1 waits until communicator A reports an error (rank 0's abort poisoned it), or 10 s.
bool sees_error_within(ncclComm_t comm, double seconds) {
  const auto t0 = std::chrono::steady_clock::now();
  for (;;) {
    ncclResult_t state = ncclSuccess;
    if (ncclCommGetAsyncError(comm, &state) != ncclSuccess || state != ncclSuccess) return true;
    if (seconds_since(t0) > seconds) return false;
    heartbeat();
    usleep(1000);
  }
}

constexpr double kAbortBoundS = 1.0;   // what an abort may take
constexpr double kDrainBoundS = 10.0;  // a released stream's last copies, on a loaded host
// B's stuck all-reduce ends this long into the test (a watchdog aborts B): what an abort of A
// that waits behind it takes at least.
constexpr int kStuckForMs = 5000;

// A progress line, flushed (a killed rank's buffered output would be lost).
void say(const char* fmt, ...) __attribute__((format(printf, 1, 2)));
void say(const char* fmt, ...) {
  va_list ap;
  va_start(ap, fmt);
  vprintf(fmt, ap);
  va_end(ap);
  fflush(stdout);
}

int stuck_abort_rank(const RankContext& ctx) {
  ncclComm_t a = init_comm(ctx, InitKind::kInitRankConfig, 0);
  ncclComm_t b = init_comm(ctx, InitKind::kInitRankConfig, 1);
  cudaStream_t stream;
  ZG_CUDA(cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking));
  const size_t bytes = 4 << 20;
  Gather warm(bytes, ctx.rank, 0x5eed), stuck(bytes, ctx.rank, 0x5eee);
  ZG_NCCL(warm.issue(a, stream));  // the route prepared on both ranks
  wait_stream(stream, "warm-up all-gather");
  warm.expect_gathered("warm-up");
  float* one = nullptr;
  ZG_CUDA(cudaMalloc(&one, sizeof(float)));
  // B's first op sets up its connections, which needs both ranks: done here, so that rank 0's
  // later all-reduce on B is enqueued and then waits on the device, not in NCCL's host code.
  ZG_NCCL(ncclAllReduce(one, one, 1, ncclFloat32, ncclSum, b, stream));
  wait_stream(stream, "warm-up all-reduce");
  say("lifecycle stuck-abort rank=%d phase=warm\n", ctx.rank);
  barrier();
  const bool shim = shim_get_stats() != nullptr;
  if (ctx.rank == 0) {
    // B's all-reduce waits for rank 1, which never joins it; A's all-gather queues behind it.
    ZG_NCCL(ncclAllReduce(one, one, 1, ncclFloat32, ncclSum, b, stream));
    ZG_NCCL(stuck.issue(a, stream));
    std::thread unstick([b] {
      usleep(kStuckForMs * 1000);
      say("lifecycle stuck-abort rank=0 abort_b=%d\n", ncclCommAbort(b));
    });
    usleep(300 * 1000);
    if (cudaStreamQuery(stream) != cudaErrorNotReady)
      fail("rank 0's stream drained without rank 1's all-reduce: nothing was stuck");
    say("lifecycle stuck-abort rank=0 phase=stuck\n");
    const auto t0 = std::chrono::steady_clock::now();
    const ncclResult_t r = ncclCommAbort(a);
    const double took = seconds_since(t0);
    say("lifecycle stuck-abort rank=0 abort_result=%d abort_seconds=%.3f\n", r, took);
    unstick.join();
    const bool drained = drains_within(stream, kDrainBoundS);
    say("lifecycle stuck-abort rank=0 drained=%d\n", drained);
    barrier();  // rank 1 has aborted A and drained
    // NCCL 2.28's own abort of A waits for B's kernel (alone too: 4.7 s of the 5): the route must
    // add nothing to it.
    if (shim && took > kStuckForMs / 1000.0 + kAbortBoundS)
      fail("ncclCommAbort(A) took " + std::to_string(took) + " s");
    if (!drained) fail("the stream did not drain after both aborts");
  } else {
    ZG_NCCL(stuck.issue(a, stream));
    // Through the route's channel rank 0's abort poisons A here too; NCCL alone tells nothing,
    // and rank 1 aborts after a second.
    const bool told = shim ? sees_error_within(a, 10.0) : (usleep(1000 * 1000), true);
    say("lifecycle stuck-abort rank=1 saw_error=%d\n", told);
    const auto t0 = std::chrono::steady_clock::now();
    ncclCommAbort(a);
    const double took = seconds_since(t0);
    const bool drained = drains_within(stream, kDrainBoundS);
    say("lifecycle stuck-abort rank=1 abort_seconds=%.3f drained=%d\n", took, drained);
    barrier();
    ncclCommAbort(b);
    if (!told) fail("rank 0's abort of A never reached rank 1 as an error");
    if (shim && took > kAbortBoundS) fail("ncclCommAbort(A) took " + std::to_string(took) + " s");
    if (!drained) fail("rank 1's stream was not released by the abort");
  }
  return 0;
}

// The shim's route for any size when it is preloaded; NCCL alone otherwise (the reference).
void route_everything() { setenv("ZEROCTA_ALLGATHER", "zerocta", 1); }

// A run's limit: ZCTEST_LIFECYCLE_TIMEOUT_S (default 120) — a hang is what these tests look for.
RunOptions lifecycle_options() {
  RunOptions options =
      default_run_options(static_cast<int>(env_long("ZCTEST_LIFECYCLE_TIMEOUT_S", 120)));
  options.num_ids = 2;
  return options;
}

TEST(Lifecycle, GroupOverTwoCommsInOppositeOrdersCompletes) {
  ZG_REQUIRE_GPUS(kRanks);
  route_everything();
  RunResult result = run_ranks(kRanks, opposite_orders_rank, lifecycle_options());
  EXPECT_TRUE(result.ok()) << result.summary();
}

TEST(Lifecycle, AbortOfACommStuckBehindAnotherReturns) {
  ZG_REQUIRE_GPUS(kRanks);
  route_everything();
  RunResult result = run_ranks(kRanks, stuck_abort_rank, lifecycle_options());
  EXPECT_TRUE(result.ok()) << result.summary();
}

}  // namespace
}  // namespace zgpu
