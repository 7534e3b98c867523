// Non-blocking communicators (ncclConfig_t.blocking = 0, PyTorch's
// TORCH_NCCL_USE_COMM_NONBLOCKING=1) on the shim's pooled routes.
//
// Each rank creates a non-blocking communicator and polls ncclCommGetAsyncError until it is
// ready, as NCCL requires, while a second thread polls it all the time the way PyTorch's
// watchdog does. It then splits it (the child inherits non-blocking mode) and, on both
// communicators, runs all-gathers of many sizes (odd ones included), in-place and
// out-of-place, on a user stream and on the legacy default stream, single and grouped. Every
// result is compared bitwise with the known inputs and with pncclAllGather (NCCL's own path,
// which the shim does not export) into a second buffer; outputs are poisoned first.
//
// Under LD_PRELOAD with ZEROCTA_ALLGATHER=zerocta every all-gather must be counted on the
// copy-engine route: the pool was set up although creation returned ncclInProgress. Without
// the shim the test checks NCCL alone.
#include <cuda_runtime.h>
#include <nccl.h>

#include <atomic>
#include <chrono>
#include <cstdlib>
#include <cstring>
#include <string>
#include <thread>
#include <vector>

#include "gpu_gtest.h"
#include "mp_harness.h"
#include "rank_util.h"
#include "test_data.h"

namespace zgpu {
namespace {

// NCCL's rule for non-blocking comms: after ncclInProgress, poll until the comm is ready.
void wait_ready(ncclComm_t comm, ncclResult_t r, const std::string& what) {
  if (r != ncclSuccess && r != ncclInProgress) fail(what + " returned " + ncclGetErrorString(r));
  const auto deadline =
      std::chrono::steady_clock::now() + std::chrono::duration<double>(op_timeout_s());
  for (;;) {
    ncclResult_t state = ncclSuccess;
    ZG_NCCL(ncclCommGetAsyncError(comm, &state));
    if (state == ncclSuccess) return;
    if (state != ncclInProgress) fail(what + ": communicator error " + ncclGetErrorString(state));
    if (std::chrono::steady_clock::now() > deadline) fail(what + ": still in progress (hang?)");
    std::this_thread::yield();
  }
}

// The route the shim was asked to take, or -1 when the test checks no route.
int expected_route() {
  const char* mode = getenv("ZEROCTA_ALLGATHER");
  if (shim_get_stats() == nullptr || mode == nullptr) return -1;
  if (strcmp(mode, "zerocta") == 0) return zerocta_route_ce;
  return -1;
}

uint64_t route_calls(int route) {
  zerocta_stats_t s{};
  GetStatsFn get = shim_get_stats();
  if (route < 0 || get == nullptr || get(&s) != 0) return 0;
  return s.counters[zerocta_op_allgather][route].calls;
}

struct Op {
  size_t per_rank;
  bool in_place;
  bool legacy;
};

// Runs `ops` on `comm` (grouped when `grouped`), then checks each against the inputs and
// NCCL's own result. Returns how many all-gathers went through the shim.
int run_ops(ncclComm_t comm, int rank, int n, const std::vector<Op>& ops, bool grouped,
            cudaStream_t stream, uint64_t salt, const std::string& what) {
  struct Bufs {
    uint8_t *send = nullptr, *recv = nullptr, *ref = nullptr;
    std::vector<std::vector<uint8_t>> inputs;
  };
  std::vector<Bufs> bufs(ops.size());
  for (size_t i = 0; i < ops.size(); ++i) {
    const Op& op = ops[i];
    Bufs& b = bufs[i];
    // Rounded up: NCCL's LL kernel reads whole 4-byte words, past the end of a 1-byte buffer
    // (compute-sanitizer memcheck reports it; cudaMalloc's granularity hides it otherwise).
    auto rounded = [](size_t bytes) { return (bytes + 255) / 256 * 256; };
    ZG_CUDA(cudaMalloc(&b.recv, rounded(op.per_rank * n)));
    ZG_CUDA(cudaMalloc(&b.ref, rounded(op.per_rank * n)));
    if (!op.in_place) ZG_CUDA(cudaMalloc(&b.send, rounded(op.per_rank)));
    for (int q = 0; q < n; ++q)
      b.inputs.push_back(make_input(ncclUint8, op.per_rank, seed_of({salt, i, uint64_t(q)})));
    ZG_CUDA(cudaMemset(b.recv, kPoison, op.per_rank * n));
    ZG_CUDA(cudaMemset(b.ref, kPoison, op.per_rank * n));
    uint8_t* mine = op.in_place ? b.recv + rank * op.per_rank : b.send;
    ZG_CUDA(cudaMemcpy(mine, b.inputs[rank].data(), op.per_rank, cudaMemcpyHostToDevice));
  }
  ZG_CUDA(cudaDeviceSynchronize());
  if (grouped) ZG_NCCL(ncclGroupStart());
  for (size_t i = 0; i < ops.size(); ++i) {
    const Op& op = ops[i];
    uint8_t* send = op.in_place ? bufs[i].recv + rank * op.per_rank : bufs[i].send;
    // Grouped calls share the group's stream; the legacy stream is tried on single calls.
    cudaStream_t s = op.legacy && !grouped ? cudaStreamLegacy : stream;
    ncclResult_t r = ncclAllGather(send, bufs[i].recv, op.per_rank, ncclUint8, comm, s);
    if (grouped) {
      if (r != ncclSuccess) fail(what + ": grouped ncclAllGather returned " + std::to_string(r));
    } else {
      wait_ready(comm, r, what + ": ncclAllGather");
    }
  }
  if (grouped) wait_ready(comm, ncclGroupEnd(), what + ": ncclGroupEnd");
  ZG_CUDA(cudaDeviceSynchronize());
  for (size_t i = 0; i < ops.size(); ++i) {
    const Op& op = ops[i];
    const uint8_t* send = op.in_place ? bufs[i].ref + rank * op.per_rank : bufs[i].send;
    if (op.in_place)
      ZG_CUDA(cudaMemcpy(bufs[i].ref + rank * op.per_rank, bufs[i].inputs[rank].data(), op.per_rank,
                         cudaMemcpyHostToDevice));
    wait_ready(comm, pncclAllGather(send, bufs[i].ref, op.per_rank, ncclUint8, comm, stream),
               what + ": pncclAllGather");
    wait_stream(stream, what + ": reference");
    std::vector<uint8_t> got(op.per_rank * n), ref(op.per_rank * n);
    ZG_CUDA(cudaMemcpy(got.data(), bufs[i].recv, got.size(), cudaMemcpyDeviceToHost));
    ZG_CUDA(cudaMemcpy(ref.data(), bufs[i].ref, ref.size(), cudaMemcpyDeviceToHost));
    const std::string name =
        what + " op " + std::to_string(i) + " (" + std::to_string(op.per_rank) + " B/rank" +
        (op.in_place ? ", in-place" : "") + (op.legacy ? ", legacy" : "") + ")";
    for (int q = 0; q < n; ++q) {
      size_t d =
          first_difference(got.data() + q * op.per_rank, bufs[i].inputs[q].data(), op.per_rank);
      if (d != SIZE_MAX)
        fail(name + ": wrong data from rank " + std::to_string(q) + " at byte " +
             std::to_string(d));
    }
    if (size_t d = first_difference(got.data(), ref.data(), got.size()); d != SIZE_MAX)
      fail(name + ": differs from NCCL's result at byte " + std::to_string(d));
    cudaFree(bufs[i].send);
    cudaFree(bufs[i].recv);
    cudaFree(bufs[i].ref);
  }
  heartbeat();
  return static_cast<int>(ops.size());
}

int nonblocking_rank(const RankContext& ctx) {
  const int rank = ctx.rank, n = ctx.nranks;
  ncclConfig_t config = NCCL_CONFIG_INITIALIZER;
  config.blocking = 0;
  ncclComm_t comm = nullptr;
  std::atomic<bool> watchdog_on{false}, stop{false};
  std::atomic<long> polls{0};
  std::thread watchdog;
  // A failure throws out of this function: the thread must be stopped before it is destroyed.
  struct StopOnExit {
    std::atomic<bool>& stop;
    std::thread& thread;
    ~StopOnExit() {
      stop = true;
      if (thread.joinable()) thread.join();
    }
  } stop_on_exit{stop, watchdog};
  ncclResult_t r = ncclCommInitRankConfig(&comm, n, ctx.ids[0], rank, &config);
  if (comm == nullptr) fail("non-blocking init returned no communicator");
  // PyTorch's watchdog: another thread polling the comm all the time, from creation on.
  watchdog = std::thread([&] {
    watchdog_on = true;
    while (!stop) {
      ncclResult_t state = ncclSuccess;
      ncclCommGetAsyncError(comm, &state);
      ++polls;
      std::this_thread::sleep_for(std::chrono::microseconds(200));
    }
  });
  printf("nonblocking rank=%d init returned %s\n", rank, ncclGetErrorString(r));
  wait_ready(comm, r, "ncclCommInitRankConfig(blocking=0)");
  ncclComm_t child = nullptr;
  wait_ready(comm, ncclCommSplit(comm, 0, n - 1 - rank, &child, nullptr), "ncclCommSplit");
  if (child == nullptr) fail("split returned no communicator");
  wait_ready(child, ncclSuccess, "split child");
  int child_rank = -1;
  ZG_NCCL(ncclCommUserRank(child, &child_rank));

  cudaStream_t stream;
  ZG_CUDA(cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking));
  const int route = expected_route();
  const uint64_t before = route_calls(route);
  const size_t kMiB = size_t{1} << 20;
  std::vector<Op> singles = {{1, false, false},
                             {4099, true, false},
                             {kMiB + 3, false, true},
                             {kMiB + 5, true, true},
                             {48 * kMiB + 1, false, false},
                             {64 * kMiB, true, false},
                             {200 * kMiB + 7, false, true}};
  std::vector<Op> group = {{3 * kMiB + 1, false, false}, {5 * kMiB, true, false}};
  int issued = 0;
  issued += run_ops(comm, rank, n, singles, false, stream, 1, "parent");
  issued += run_ops(comm, rank, n, group, true, stream, 2, "parent group");
  issued += run_ops(child, child_rank, n, singles, false, stream, 3, "child");
  const uint64_t routed = route_calls(route) - before;
  printf("nonblocking rank=%d all-gathers=%d on-route=%llu watchdog-polls=%ld\n", rank, issued,
         static_cast<unsigned long long>(routed), polls.load());
  if (route >= 0 && routed != static_cast<uint64_t>(issued))
    fail(std::to_string(routed) + " of " + std::to_string(issued) +
         " all-gathers took the expected route on a non-blocking communicator");
  stop = true;
  watchdog.join();
  if (!watchdog_on) fail("the watchdog thread never ran");
  ZG_CUDA(cudaStreamDestroy(stream));
  for (ncclComm_t c : {child, comm}) {
    wait_ready(c, ncclCommFinalize(c), "ncclCommFinalize");
    ZG_NCCL(ncclCommDestroy(c));
  }
  return 0;
}

TEST(NonBlockingComm, AllGathersBitwiseOnTheShimRoute) {
  ZG_REQUIRE_GPUS(2);
  const int nranks = static_cast<int>(env_long("ZCTEST_NB_RANKS", 2));
  RunResult result = run_ranks(nranks, nonblocking_rank, default_run_options(300));
  EXPECT_TRUE(result.ok()) << result.summary();
}

}  // namespace
}  // namespace zgpu
